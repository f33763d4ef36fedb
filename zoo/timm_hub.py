"""timm's ViT weights, from the Hugging Face Hub or local files, both ways.

Most ViT weights people use today are timm's ``timm/vit_*`` repositories on
the Hub: a ``config.json`` (architecture, num_classes, input size, mean/std,
optionally label names) and a ``model.safetensors`` holding the same AugReg
and original checkpoints as the official ``.npz`` files, plus later
fine-tunes. This module reads them with ``huggingface_hub`` (its cache,
``HF_HUB_OFFLINE``, ``HF_ENDPOINT``, its locks and progress bars) and
``safetensors``' NumPy reader (no torch), maps timm's parameter names onto
the official layout (:mod:`keras_vit.zoo.timm_layout`: ViT, the
ResNetV2+ViT hybrids and BiT; a hybrid keeps
timm's ResNet numerics: weights standardised with sqrt(var + 1e-8),
GroupNorm epsilon 1e-5), and loads them through the same strict loaders as
the ``.npz`` files. :func:`keras_vit.zoo.save_pretrained` writes the
reverse (:mod:`keras_vit.zoo.timm_writer`), a repository that
``timm.create_model(..., pretrained=True)`` loads.

timm runs the exact (erf) GELU, the official code the tanh form, so models
built from timm weights default to ``gelu="exact"``: they reproduce timm's
forward; models from ``.npz`` files keep ``gelu="tanh"``.

Sources: ``"hf-hub:<repo>[@revision]"``, a local repository folder (with
``config.json`` and ``model.safetensors``) or a ``.safetensors`` file (the
``config.json`` beside it is read when there is one).
"""

from __future__ import annotations

import os
import re


from keras_vit.base.checks import shown
from keras_vit.base import schema
from keras_vit.base import variants
from keras_vit.base.limits import MAX_CONFIG_BYTES
from keras_vit.data.normalization import check_normalization, config_value
from keras_vit.models.vit import TIMM_RESNET_NUMERICS
from keras_vit.zoo import checkpoints, convert, formats, http_fetch, hub_files
# timm's names <-> the official layout (zoo/timm_layout.py).
from keras_vit.zoo.timm_layout import (TIMM_ACTIVATIONS, TIMM_OPTIONS,
                                       TIMM_POOLS, bit_to_official, hybrid_to_official,
                                       to_official)
# The Hub files transformers' layout shares (zoo/hub_files.py).
from keras_vit.zoo.hub_files import (CONFIG_FILE, HUB_PREFIX, WEIGHTS_FILE,
                                     hub_download, read_safetensors)
# The official input range, x / 127.5 - 1: mean 0.5, std 0.5 of [0, 1].
def is_timm_source(value, *, progress=None):
    """True for what this module reads: an ``hf-hub:`` handle, a
    ``.safetensors`` file or a folder holding ``model.safetensors``.
    ``progress`` is unused (nothing is downloaded to tell): the sources'
    predicates take it (:mod:`keras_vit.zoo.sources`).

    >>> is_timm_source("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    True
    >>> is_timm_source("ViT-B_16.npz")
    False
    """
    if not isinstance(value, (str, os.PathLike)):
        return False
    value = os.fspath(value)
    return (value.startswith(HUB_PREFIX) or value.endswith(".safetensors")
            or os.path.isfile(os.path.join(value, WEIGHTS_FILE)))


def fetch(source, progress=None, *, timeout=60.0,
          deadline=http_fetch.DEFAULT_DEADLINE):
    """``(config dict, local .safetensors path)`` of ``source``; Hub files
    come through ``huggingface_hub``'s cache (``HF_HUB_OFFLINE=1`` or
    ``KERAS_VIT_OFFLINE=1`` never goes online, ``HF_ENDPOINT`` picks
    another server) within ``timeout``
    per wait and ``deadline`` in all (see :func:`hub_download`)."""
    source = os.fspath(source)
    if source.startswith(HUB_PREFIX):
        repo, _, revision = source[len(HUB_PREFIX):].partition("@")
        if not repo or repo.count("/") != 1:
            raise ValueError("an hf-hub: handle is hf-hub:<owner>/<name>"
                             f"[@revision]; received {source!r}")
        config_path, path = hub_download(
            repo, revision or None, progress=progress, timeout=timeout,
            deadline=deadline)
    elif os.path.isdir(source):
        config_path = os.path.join(source, CONFIG_FILE)
        path = os.path.join(source, WEIGHTS_FILE)
    else:
        if not os.path.isfile(source):
            raise FileNotFoundError(f"No such .safetensors file: {source!r}")
        path = source
        config_path = os.path.join(os.path.dirname(source), CONFIG_FILE)
    config = read_config(config_path) if os.path.isfile(config_path) else {}
    return config, path




def _pair(size):
    """A size as ``(height, width)``: an int, ``[h, w]`` or timm's
    ``[channels, h, w]``."""
    return (size, size) if isinstance(size, int) else tuple(size[-2:])


def validate_config(config, path):
    """A timm ``config.json``'s content checked field by field as
    :data:`keras_vit.zoo.formats.TIMM_CONFIG` describes it (a
    :class:`~keras_vit.zoo.formats.FormatError` naming ``path`` and the
    field otherwise), with image sizes as ``(height, width)`` tuples and
    ``label_names`` checked against the head."""
    config = formats.check(formats.TIMM_CONFIG, config, path)
    for key, size_key in (("model_args", "img_size"),
                          ("pretrained_cfg", "input_size")):
        section = config.get(key)
        if section is not None and section.get(size_key) is not None:
            config[key] = dict(section, **{size_key: _pair(section[size_key])})
    formats.check_labels(config.get("label_names"), config.get("num_classes"),
                         path, "label_names")
    return config


def read_config(path):
    """A timm ``config.json``, validated (:func:`validate_config`); one
    :class:`~keras_vit.zoo.formats.FormatError` naming the file for one
    that is too large, not UTF-8, not JSON, nested too deeply or naming a
    setting twice."""
    path = os.fspath(path)
    return validate_config(schema.read_json(
        path, "timm config.json", max_bytes=MAX_CONFIG_BYTES,
        error=formats.FormatError), path)


_RESNET_D_HYBRID = re.compile(r"^vit_\w+_resnet\d+d")


# timm's ViT sizes by word: (width, depth, heads), the MLP 4x wide.
_TIMM_WIDTHS = {"tiny": (192, 12, 3), "small": (384, 12, 6),
                "medium": (512, 12, 8), "base": (768, 12, 12),
                "large": (1024, 24, 16), "huge": (1280, 32, 16),
                "so400m": (1152, 27, 16), "giantopt": (1536, 40, 16)}
# The sizes whose MLP is not 4x wide (timm's mlp_ratio=3.7362).
_TIMM_MLP = {"so400m": 4304}
_SIZE = "(tiny|small|medium|base|large|huge)"
_SIGLIP_SIZE = "(base|large|so400m|giantopt)"
# SigLIP's image towers: no class token, the attention pool ("map") or,
# in the "_gap" ones, the mean without fc_norm. The SigLIP 2 towers run
# the tanh GELU (timm's architecture sets act_layer='gelu_tanh', which no
# config.json repeats), the others the exact one.
_SIGLIP_TANH = re.compile(
    r"vit_(base_patch32|giantopt_patch16|so400m_patch16)_siglip(_gap)?_\d+"
    r"|vit_large_patch16_siglip(_gap)?_512")
# The ViT family's members in timm that are the one VisionTransformer with
# options (timm's architecture functions, read as data): the name's
# pattern (groups: size word, patch, optional image size) and the options.
_TIMM_FAMILY = (
    (rf"deit_{_SIZE}_patch(\d+)_(\d+)", {}),
    (rf"deit_{_SIZE}_distilled_patch(\d+)_(\d+)", dict(distilled=True)),
    (rf"deit3_{_SIZE}_patch(\d+)_(\d+)",
     dict(posemb_includes_prefix=False, layer_scale=1e-6)),
    (rf"vit_{_SIZE}_patch(\d+)_dinov2()",
     dict(layer_scale=1e-5, image_size=518)),
    (rf"vit_{_SIZE}_patch(\d+)_reg(\d+)_dinov2",
     dict(layer_scale=1e-5, image_size=518, posemb_includes_prefix=False)),
    (rf"vit_{_SIZE}_patch(\d+)_clip_(\d+)",
     dict(pre_norm=True, patch_bias=False, layer_norm_epsilon=1e-5)),
    (rf"vit_{_SIZE}_patch(\d+)_clip_quickgelu_(\d+)",
     dict(pre_norm=True, patch_bias=False, layer_norm_epsilon=1e-5,
          gelu="quick")),
    (rf"vit_{_SIZE}_patch(\d+)_gap_(\d+)",
     dict(class_token=False, classifier="gap", qkv_bias=False,
          layer_scale=1e-6, fc_norm=False)),
    (rf"vit_{_SIGLIP_SIZE}_patch(\d+)_siglip_(\d+)",
     dict(class_token=False, classifier="map")),
    (rf"vit_{_SIGLIP_SIZE}_patch(\d+)_siglip_gap_(\d+)",
     dict(class_token=False, classifier="gap", fc_norm=False)),
)


def _family_architecture(arch_name):
    """``(zoo Arch, options)`` of a timm family member of
    :data:`_TIMM_FAMILY`, or None for any other name."""
    for pattern, options in _TIMM_FAMILY:
        m = re.fullmatch(pattern, arch_name.partition(".")[0])
        if not m:
            continue
        width, depth, heads = _TIMM_WIDTHS[m.group(1)]
        patch, third = int(m.group(2)), m.group(3)
        options = dict(options)
        if _SIGLIP_TANH.fullmatch(m.group(0)):
            options["gelu"] = "tanh"
        if "reg" in pattern:
            options["num_registers"] = int(third)
        elif third and "image_size" not in options:
            options["image_size"] = int(third)
        config = dict(patch_size=patch, hidden_size=width, num_layers=depth,
                      num_heads=heads,
                      mlp_dim=_TIMM_MLP.get(m.group(1), 4 * width),
                      classifier="token", representation_size=None)
        image_size = options.pop("image_size", None)
        config.update(options)
        return variants.Arch(
            name=arch_name.partition(".")[0], family="vit", config=config,
            image_size=image_size, tag=None), options
    return None


def _architecture(config, name):
    arch_name = name or config.get("architecture")
    if not arch_name:
        raise ValueError("the timm weights carry no config.json naming the "
                         "architecture; pass it: zoo.load('ViT-B/16', "
                         "weights='model.safetensors')")
    family = _family_architecture(arch_name)
    if family is not None:
        return family[0]
    if _RESNET_D_HYBRID.match(arch_name.partition(".")[0]):
        raise ValueError(
            f"timm's ResNet-D hybrids ({arch_name}: deep stem, average-pool "
            "downsampling, BatchNorm) are not supported; the ResNetV2 "
            "hybrids (vit_*_r*_s*, e.g. vit_base_r50_s16_384) load")
    arch = variants.parse(arch_name)
    if arch.family not in ("vit", "bit", "hybrid"):
        raise ValueError(
            f"timm weights of the {arch.family} family ({arch_name}) are not "
            "supported: ViT (vit_*_patch*), ResNet+ViT hybrids (vit_*_r*_s*) "
            "and BiT (resnetv2_*_bit) checkpoints load from timm files")
    return arch


# timm's model_args that are a ViT family option of keras_vit, one by one:
# timm's name -> (keras_vit's argument, the value's mapping).


def _bool_arg(value):
    if not isinstance(value, bool):
        raise ValueError("is not true or false")
    return value


def _choice_arg(table):
    def convert(value):
        if value not in table:
            raise ValueError(f"is none of {', '.join(map(repr, table))}")
        return table[value]
    return convert


def _layer_scale_arg(value):
    if value is None:
        return None
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not value > 0):
        raise ValueError("is not a positive number or null")
    return float(value)


def _count_arg(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("is not a count")
    return value


# How each of timm's family arguments (TIMM_OPTIONS) reads: its value's
# check and mapping onto keras_vit's.
_TIMM_VALUES = {
    "class_token": _bool_arg, "reg_tokens": _count_arg,
    "no_embed_class": lambda v: not _bool_arg(v),
    "global_pool": _choice_arg(TIMM_POOLS),
    "fc_norm": lambda v: None if v is None else _bool_arg(v),
    "init_values": _layer_scale_arg, "qk_norm": _bool_arg,
    "qkv_bias": _bool_arg, "proj_bias": _bool_arg, "pre_norm": _bool_arg,
    "final_norm": _bool_arg, "act_layer": _choice_arg(TIMM_ACTIVATIONS),
    "pos_embed": _choice_arg({"learn": "learned_1d", "none": "none"}),
    "drop_path_rate": lambda v: v if _is_rate(v) else _choice_arg({})(v),
}


def input_normalization(config):
    """``{"mean": [...], "std": [...]}`` the weights expect their [0, 1]
    pixels normalised with (``pretrained_cfg``'s; the official 0.5/0.5
    when it names none)."""
    pretrained = config.get("pretrained_cfg") or {}
    return {"mean": [float(v) for v in pretrained.get("mean", [0.5] * 3)],
            "std": [float(v) for v in pretrained.get("std", [0.5] * 3)]}


def _honoured(config, arch, path):
    """The builder arguments timm's config asks for: ``model_args`` (and
    the top-level ``global_pool``) mapped onto keras_vit's arguments
    (``img_size``, ``in_chans``, ``num_classes``, the architecture's sizes,
    dropout rates and the ViT family's options); any other setting is
    refused by name."""
    args = dict(config.get("model_args") or {})
    # The top-level field is the pooling the model was saved with.
    pool = config.get("global_pool", args.get("global_pool", "token"))
    args.pop("global_pool", None)
    if arch.family == "vit" and pool not in ("", "token"):
        args["global_pool"] = pool
    elif pool not in ("token", ""):
        raise formats.fail(path, "global_pool", f"timm global_pool="
                           f"{shown(pool)} is not supported for "
                           f"{arch.name}; it pools the class token")
    out = {}
    vit = arch.family in ("vit", "hybrid")
    for key, value in args.items():
        if key in ("img_size", "num_classes"):
            continue  # read with the config's own fields
        if key == "in_chans":
            out["num_channels"] = value
        elif key in _TIMM_SIZES and vit:
            out[_TIMM_SIZES[key]] = value
        elif key == "mlp_ratio" and vit:
            continue  # below, once the width is known
        elif key in ("drop_rate", "proj_drop_rate") and _is_rate(value):
            out["dropout_rate"] = float(value)
        elif key == "attn_drop_rate" and _is_rate(value):
            out["attention_dropout_rate"] = float(value)
        elif key in TIMM_OPTIONS and arch.family == "vit":
            try:
                out[TIMM_OPTIONS[key]] = _TIMM_VALUES[key](value)
            except ValueError as e:
                raise formats.fail(path, f"model_args.{key}",
                                   f"{key}={shown(value, 40)} {e}") from None
        elif key in ("class_token", "qkv_bias") and value is True:
            continue  # a hybrid's defaults
        else:
            raise formats.fail(
                path, f"model_args.{key}", f"{key}={shown(value, 40)} is a "
                f"timm setting keras_vit's {arch.name} cannot honour (it "
                "honours img_size, in_chans, num_classes, the ViT's sizes "
                "patch_size, embed_dim, depth, num_heads, mlp_ratio, dropout "
                "rates, and for a ViT " + ", ".join(sorted(TIMM_OPTIONS))
                + ")")
    if "mlp_ratio" in args and vit:
        width = out.get("hidden_size", arch.config["hidden_size"])
        mlp = args["mlp_ratio"] * width
        if mlp != int(mlp):
            raise formats.fail(path, "model_args.mlp_ratio", f"mlp_ratio="
                               f"{args['mlp_ratio']} times the width {width} "
                               "is not a whole number of units")
        out["mlp_dim"] = int(mlp)
    options = dict(arch.config, **out)
    if arch.family == "vit":
        # timm's defaults that follow from other settings: the norm after
        # average pooling (fc_norm None), the patch bias off with pre_norm.
        if options.get("fc_norm", None) is None:
            options["fc_norm"] = options.get("classifier", "token") in (
                "gap", "max", "avgmax")
        if "pre_norm" in out:
            options["patch_bias"] = not out["pre_norm"]
        if (options.get("classifier", "token") != "token"
                and "class_token" not in options):
            options["class_token"] = True  # timm keeps it unless told
        out = {k: v for k, v in options.items()
               if k in out or k not in arch.config
               or arch.config[k] != v}
        if not out.get("fc_norm", True):
            out.pop("fc_norm")
    return out


# timm's ViT size arguments -> keras_vit's.
_TIMM_SIZES = {"patch_size": "patch_size", "embed_dim": "hidden_size",
               "depth": "num_layers", "num_heads": "num_heads"}


def _is_rate(value):
    return isinstance(value, (int, float)) and not isinstance(
        value, bool) and 0 <= value < 1


def load(source, name=None, image_size=None, num_classes=None, *,
         progress=None, **kwargs):
    """A keras_vit model with timm's weights from ``source``.

    The architecture, head size and input size come from the repository's
    ``config.json`` (``name`` overrides the architecture; ``image_size``
    resizes the position embeddings; another ``num_classes`` gives a new
    zero head), settled as every source's are
    (:mod:`keras_vit.zoo.settle`). Models default to ``gelu="exact"``,
    timm's forward. ``**kwargs`` go to :func:`keras_vit.zoo.load`
    (``include_top``, ``label_names``, ...). The model's ``label_names``
    hold the repository's label names while its head is kept.

    Example (a repository written by :func:`save_pretrained`):

    >>> import tempfile, numpy as np, keras_vit
    >>> from keras_vit.zoo import timm_hub
    >>> m = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
    ...                        num_classes=3, gelu="exact")
    >>> repo = keras_vit.zoo.save_pretrained(m, tempfile.mkdtemp())
    >>> m2 = timm_hub.load(repo)
    >>> x = np.random.rand(1, 32, 32, 3).astype("float32")
    >>> bool(np.allclose(m(x), m2(x), atol=1e-6))
    True
    """
    from keras_vit.zoo import build, settle

    return build.build_settled(
        read_checkpoint(source, name, progress=progress),
        settle.request(image_size=image_size, num_classes=num_classes,
                       **kwargs))


def _num_classes(config, arrays, head_key):
    """The head's size: the config's ``num_classes`` (0: no head, the
    model returns the pooled embedding, as timm's), else the weights'."""
    value = config.get("num_classes")
    if value == 0 and head_key not in arrays:
        return 0
    return value or 1000


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.build.Checkpoint` of the repository
    ``source`` (its ``config.json`` naming the architecture, unless
    ``name`` does, and its ``model.safetensors``). ``prefer_size`` is
    unused (one file per repository)."""
    from keras_vit.zoo import bit_layout, build

    config, path = fetch(source, progress=progress)
    where = os.path.join(os.path.dirname(os.fspath(path)), CONFIG_FILE)
    arch = _architecture(config, name)
    honoured = _honoured(config, arch, where)
    state = read_safetensors(path)
    is_bit = arch.family == "bit"
    build_config = dict(arch.config, **honoured)
    try:
        if is_bit:
            arrays = bit_layout.normalize(bit_to_official(state))
            head_key = bit_layout.HEAD_KERNEL
        else:
            mapping = to_official
            if arch.family == "hybrid":
                mapping = hybrid_to_official
                # timm's ResNet standardises and normalises with other
                # epsilons.
                build_config["resnet"] = dict(arch.config["resnet"],
                                              **TIMM_RESNET_NUMERICS)
            arrays = convert.normalize_keys(
                mapping(state, build_config["num_heads"]))
            head_key = "head/kernel"
            # timm's GELU, unless the architecture or its act_layer names
            # another (quick GELU: OpenAI's CLIP towers; tanh: SigLIP 2's).
            if "gelu" not in honoured and "gelu" not in arch.config:
                build_config["gelu"] = "exact"
    except ValueError as e:  # parameters keras_vit lacks: name the file
        raise checkpoints.CheckpointError(f"{os.fspath(path)}: {e}") from None
    # (height, width) after read_config's checks.
    input_size = ((config.get("pretrained_cfg") or {}).get("input_size")
                  or (config.get("model_args") or {}).get("img_size"))
    if input_size:
        height, width = input_size
        image_size = height if height == width else (height, width)
    else:
        image_size = arch.image_size or 224
    head = int(arrays[head_key].shape[-1]) if head_key in arrays else None
    labels = formats.check_labels(config.get("label_names"), head, where,
                                  "label_names") if head else None
    # The weights' own input normalisation, from their config: the model
    # records it, and every path that feeds it normalises so.
    normalization = check_normalization("pretrained_cfg mean/std",
                                        input_normalization(config))
    build_config.update(input_normalization=config_value(normalization))
    build_config.update(image_size=image_size,
                        num_classes=_num_classes(config, arrays, head_key),
                        name=build.model_name(arch.name))
    return build.Checkpoint(
        build_config, arrays, source_name=repr(os.fspath(source)),
        family="bit" if is_bit else "vit", head=head, label_names=labels,
        include_top=True,
        tags={"zoo_name": (hub_files.zoo_name(build_config) if honoured
                           and not is_bit and "resnet" not in build_config
                           else arch.name), "zoo_weights": None,
              "zoo_source": os.fspath(source)})
