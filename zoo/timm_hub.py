"""timm's ViT weights, from the Hugging Face Hub or local files, both ways.

Most ViT weights people use today are timm's ``timm/vit_*`` repositories on
the Hub: a ``config.json`` (architecture, num_classes, input size, mean/std,
optionally label names) and a ``model.safetensors`` holding the same AugReg
and original checkpoints as the official ``.npz`` files, plus later
fine-tunes. This module reads them with ``huggingface_hub`` (its cache,
``HF_HUB_OFFLINE``, ``HF_ENDPOINT``, its locks and progress bars) and
``safetensors``' NumPy reader (no torch), maps timm's parameter names onto
the official layout (ViT, the ResNetV2+ViT hybrids and BiT; a hybrid keeps
timm's ResNet numerics: weights standardised with sqrt(var + 1e-8),
GroupNorm epsilon 1e-5), and loads them through the same strict loaders as
the ``.npz`` files. :func:`save_pretrained` writes the reverse, a repository
that ``timm.create_model(..., pretrained=True)`` loads.

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

import numpy as np

from keras_vit.errors import (shown)
from keras_vit import schema, variants
from keras_vit.limits import MAX_CONFIG_BYTES
from keras_vit.models.vit import TIMM_RESNET_NUMERICS
from keras_vit.zoo import convert, download, formats, hub_files
# The Hub files transformers' layout shares (zoo/hub_files.py); every name
# stays importable from here, where it was written first.
from keras_vit.zoo.hub_files import (  # noqa: F401 - also re-exported
    CONFIG_FILE, HUB_FILES, HUB_PREFIX, MAX_SAFETENSORS_HEADER, WEIGHTS_FILE,
    check_safetensors, hub_download, read_safetensors)
# The official input range, x / 127.5 - 1: mean 0.5, std 0.5 of [0, 1].
_OFFICIAL_MEAN_STD = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])

_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
BLOCK_PARAMS = {
    "norm1.weight": "LayerNorm_0/scale", "norm1.bias": "LayerNorm_0/bias",
    "norm2.weight": "LayerNorm_2/scale", "norm2.bias": "LayerNorm_2/bias",
    "mlp.fc1.weight": "MlpBlock_3/Dense_0/kernel",
    "mlp.fc1.bias": "MlpBlock_3/Dense_0/bias",
    "mlp.fc2.weight": "MlpBlock_3/Dense_1/kernel",
    "mlp.fc2.bias": "MlpBlock_3/Dense_1/bias",
    "attn.qkv.weight": None, "attn.qkv.bias": None,  # split into q, k, v
    "attn.proj.weight": "MultiHeadDotProductAttention_1/out/kernel",
    "attn.proj.bias": "MultiHeadDotProductAttention_1/out/bias",
}
TOP_PARAMS = {
    "cls_token": "cls", "pos_embed": convert.POSEMB_KEY,
    "patch_embed.proj.weight": "embedding/kernel",
    "patch_embed.proj.bias": "embedding/bias",
    "norm.weight": "Transformer/encoder_norm/scale",
    "norm.bias": "Transformer/encoder_norm/bias",
    "head.weight": "head/kernel", "head.bias": "head/bias",
}


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
          deadline=download.DEFAULT_DEADLINE):
    """``(config dict, local .safetensors path)`` of ``source``; Hub files
    come through ``huggingface_hub``'s cache (``HF_HUB_OFFLINE=1`` never
    goes online, ``HF_ENDPOINT`` picks another server) within ``timeout``
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


def to_official(state, num_heads):
    """Maps a timm ViT ``state_dict`` (NumPy) onto the official ``.npz``
    layout. timm parameters with no official counterpart (layer scale,
    register tokens, fc_norm, q/k norms, ...) raise a ValueError naming
    them: loading without them would silently compute something else."""
    out, unknown = {}, []
    for name, value in state.items():
        value = np.asarray(value)
        m = _BLOCK_KEY.match(name)
        if m and m.group(2) in BLOCK_PARAMS:
            i, param = m.groups()
            prefix = f"Transformer/encoderblock_{i}/"
            if param.startswith("attn.qkv."):
                att = prefix + "MultiHeadDotProductAttention_1/"
                for part, w in zip(("query", "key", "value"),
                                   np.split(value, 3, axis=0)):
                    if param.endswith("weight"):  # (D_out, D_in)
                        d = w.shape[1]
                        out[att + f"{part}/kernel"] = w.T.reshape(
                            d, num_heads, d // num_heads)
                    else:
                        out[att + f"{part}/bias"] = w.reshape(num_heads, -1)
                continue
            key = prefix + BLOCK_PARAMS[param]
            if param == "attn.proj.weight":
                d = value.shape[0]
                value = value.T.reshape(num_heads, d // num_heads, d)
            elif value.ndim == 2:  # Linear (out, in) -> Dense (in, out)
                value = value.T
            out[key] = value
        elif name in TOP_PARAMS:
            if name == "patch_embed.proj.weight":  # OIHW -> HWIO
                value = value.transpose(2, 3, 1, 0)
            elif name == "head.weight":
                value = value.T
            out[TOP_PARAMS[name]] = value
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"the timm checkpoint has parameters keras_vit's ViT lacks: "
            f"{sorted(unknown)[:12]}{' ...' if len(unknown) > 12 else ''}")
    return out


# timm's ResNetV2 names stage s, block b ``stages.{s}.blocks.{b}.<param>``,
# in BiT and in the hybrids' backbone alike.
_STAGE_UNIT = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.(.+)$")


def _resnet_to_official(state, unit_params, unit_key, top, what, prefix=""):
    """Maps timm ResNetV2 parameters: ``unit_key(stage, block)`` (1-based)
    plus ``unit_params[param]`` for the units, ``top`` for the rest; conv
    kernels OIHW -> HWIO. Unknown names raise a ValueError naming them."""
    out, unknown = {}, []
    for name, value in state.items():
        value = np.asarray(value)
        m = _STAGE_UNIT.match(name)
        if m and m.group(3) in unit_params:
            stage, block, param = m.groups()
            key = unit_key(int(stage) + 1, int(block) + 1) + unit_params[param]
        elif name in top:
            key = top[name]
        else:
            unknown.append(prefix + name)
            continue
        if value.ndim == 4:  # conv OIHW -> HWIO
            value = value.transpose(2, 3, 1, 0)
        out[key] = value
    if unknown:
        raise ValueError(
            f"the timm checkpoint has parameters keras_vit's {what} lacks: "
            f"{sorted(unknown)[:12]}{' ...' if len(unknown) > 12 else ''}")
    return out


_HYBRID_PREFIX = "patch_embed.backbone."
_HYBRID_UNIT_PARAMS = {"downsample.conv.weight": "conv_proj/kernel",
                       "downsample.norm.weight": "gn_proj/scale",
                       "downsample.norm.bias": "gn_proj/bias"}
for _i in (1, 2, 3):
    _HYBRID_UNIT_PARAMS[f"conv{_i}.weight"] = f"conv{_i}/kernel"
    _HYBRID_UNIT_PARAMS[f"norm{_i}.weight"] = f"gn{_i}/scale"
    _HYBRID_UNIT_PARAMS[f"norm{_i}.bias"] = f"gn{_i}/bias"
# The root: "stem." in front when the backbone has stages, none when timm
# builds the root alone (vit_tiny_r_s16_p8_*).
_HYBRID_ROOT = {"conv.weight": "conv_root/kernel",
                "norm.weight": "gn_root/scale", "norm.bias": "gn_root/bias"}
_HYBRID_ROOT.update({f"stem.{k}": v for k, v in _HYBRID_ROOT.items()})


def hybrid_to_official(state, num_heads):
    """Maps a timm ResNet+ViT hybrid ``state_dict`` (``vit_*_r*_s*``) onto
    the official hybrid ``.npz`` layout: timm's
    ``patch_embed.backbone.stages.{s}.blocks.{b}`` is ``block{s+1}/unit{b+1}``
    (norm1 -> gn1, downsample -> conv_proj/gn_proj), the rest as
    :func:`to_official`. Unknown parameters raise a ValueError naming them."""
    n = len(_HYBRID_PREFIX)
    backbone = {k[n:]: v for k, v in state.items()
                if k.startswith(_HYBRID_PREFIX)}
    rest = {k: v for k, v in state.items() if not k.startswith(_HYBRID_PREFIX)}
    return {**to_official(rest, num_heads), **_resnet_to_official(
        backbone, _HYBRID_UNIT_PARAMS, lambda s, b: f"block{s}/unit{b}/",
        _HYBRID_ROOT, "hybrid ResNet", prefix=_HYBRID_PREFIX)}


_BIT_UNIT_PARAMS = {"downsample.conv.weight": "a/proj/standardized_conv2d/kernel"}
for _i, _x in enumerate("abc", 1):
    _BIT_UNIT_PARAMS[f"conv{_i}.weight"] = f"{_x}/standardized_conv2d/kernel"
    _BIT_UNIT_PARAMS[f"norm{_i}.weight"] = f"{_x}/group_norm/gamma"
    _BIT_UNIT_PARAMS[f"norm{_i}.bias"] = f"{_x}/group_norm/beta"
_BIT_TOP = {"stem.conv.weight": "resnet/root_block/standardized_conv2d/kernel",
            "norm.weight": "resnet/group_norm/gamma",
            "norm.bias": "resnet/group_norm/beta",
            "head.fc.weight": "resnet/head/conv2d/kernel",
            "head.fc.bias": "resnet/head/conv2d/bias"}


def bit_to_official(state):
    """Maps a timm ``resnetv2_*_bit`` ``state_dict`` onto the official BiT
    ``.npz`` layout (timm's stage s, block b is ``block{s+1}/unit{b+1:02d}``;
    its norm1/conv1 are the official unit's ``a``, and so on). Parameters
    with no BiT counterpart raise a ValueError naming them."""
    return _resnet_to_official(
        state, _BIT_UNIT_PARAMS, lambda s, b: f"resnet/block{s}/unit{b:02d}/",
        _BIT_TOP, "BiT ResNetV2")


_RESNET_D_HYBRID = re.compile(r"^vit_\w+_resnet\d+d")


def _architecture(config, name):
    arch_name = name or config.get("architecture")
    if not arch_name:
        raise ValueError("the timm weights carry no config.json naming the "
                         "architecture; pass it: zoo.load('ViT-B/16', "
                         "weights='model.safetensors')")
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


def _refuse_unsupported(config, arch, path):
    """The builder arguments timm's ``model_args`` ask for, each one
    keras_vit honours (``img_size``, ``in_chans``, ``num_classes``, the
    architecture's own sizes, dropout rates); any other is refused by
    name, as are inputs normalised another way than the official one."""
    pretrained = config.get("pretrained_cfg") or {}
    mean = [round(float(v), 4) for v in pretrained.get("mean", [0.5] * 3)]
    std = [round(float(v), 4) for v in pretrained.get("std", [0.5] * 3)]
    if (mean, std) != _OFFICIAL_MEAN_STD:
        raise formats.fail(
            path, "pretrained_cfg.mean", f"the weights expect inputs "
            f"normalised with mean={mean}, std={std}; keras_vit's ViT takes "
            "the official [-1, 1] range (mean 0.5, std 0.5) only")
    args = config.get("model_args") or {}
    out = {}
    vit = arch.family in ("vit", "hybrid")
    for key, value in args.items():
        if key in ("img_size", "num_classes", "global_pool"):
            continue  # read with the config's own fields
        if key == "in_chans":
            out["num_channels"] = value
        elif key in ("class_token", "qkv_bias") and value is True:
            continue
        elif key in _TIMM_SIZES and vit:
            out[_TIMM_SIZES[key]] = value
        elif key == "mlp_ratio" and vit:
            continue  # below, once the width is known
        elif key in ("drop_rate", "proj_drop_rate") and _is_rate(value):
            out["dropout_rate"] = float(value)
        elif key == "attn_drop_rate" and _is_rate(value):
            out["attention_dropout_rate"] = float(value)
        else:
            raise formats.fail(
                path, f"model_args.{key}", f"{key}={shown(value, 40)} is a "
                f"timm setting keras_vit's {arch.name} cannot honour (it "
                "honours img_size, in_chans, num_classes, global_pool "
                "'token', class_token true, the ViT's sizes patch_size, "
                "embed_dim, depth, num_heads, mlp_ratio, and dropout rates)")
    if "mlp_ratio" in args and vit:
        width = out.get("hidden_size", arch.config["hidden_size"])
        mlp = args["mlp_ratio"] * width
        if mlp != int(mlp):
            raise formats.fail(path, "model_args.mlp_ratio", f"mlp_ratio="
                               f"{args['mlp_ratio']} times the width {width} "
                               "is not a whole number of units")
        out["mlp_dim"] = int(mlp)
    pool = config.get("global_pool", args.get("global_pool", "token"))
    if pool not in ("token", ""):
        raise formats.fail(path, "global_pool", f"timm global_pool="
                           f"{shown(pool)} is not supported; keras_vit "
                           "pools the class token")
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
    from keras_vit.zoo import settle, sources

    return sources.build_settled(
        read_checkpoint(source, name, progress=progress),
        settle.request(image_size=image_size, num_classes=num_classes,
                       **kwargs))


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.sources.Checkpoint` of the repository
    ``source`` (its ``config.json`` naming the architecture, unless
    ``name`` does, and its ``model.safetensors``). ``prefer_size`` is
    unused (one file per repository)."""
    from keras_vit.zoo import bit_layout, sources

    config, path = fetch(source, progress=progress)
    where = os.path.join(os.path.dirname(os.fspath(path)), CONFIG_FILE)
    arch = _architecture(config, name)
    honoured = _refuse_unsupported(config, arch, where)
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
            build_config["gelu"] = "exact"  # timm's GELU
    except ValueError as e:  # parameters keras_vit lacks: name the file
        raise convert.CheckpointError(f"{os.fspath(path)}: {e}") from None
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
    build_config.update(image_size=image_size,
                        num_classes=config.get("num_classes") or 1000,
                        name=sources.model_name(arch.name))
    return sources.Checkpoint(
        build_config, arrays, source_name=repr(os.fspath(source)),
        family="bit" if is_bit else "vit", head=head, label_names=labels,
        include_top=True,
        tags={"zoo_name": (hub_files.zoo_name(build_config) if honoured
                           and not is_bit and "resnet" not in build_config
                           else arch.name), "zoo_weights": None,
              "zoo_source": os.fspath(source)})


def __getattr__(name):
    """The writer's names, reachable here where they were first written:
    :func:`keras_vit.zoo.save_pretrained` (its timm layout) and the
    inverse mapping live in :mod:`keras_vit.zoo.timm_writer`."""
    if name == "save_pretrained":
        from keras_vit.zoo.save import save_pretrained

        return save_pretrained
    if name == "from_official":
        from keras_vit.zoo.timm_writer import from_official

        return from_official
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
