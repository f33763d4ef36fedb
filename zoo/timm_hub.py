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

import json
import os
import re

import numpy as np

from keras_vit import atomic
from keras_vit.errors import (MAX_IMAGE_SIDE, ConfigError, require, shown,
                              special_file)
from keras_vit import variants
from keras_vit.models.vit import TIMM_RESNET_NUMERICS
from keras_vit.zoo import convert, download
# The Hub files transformers' layout shares (zoo/hub_files.py); every name
# stays importable from here, where it was written first.
from keras_vit.zoo.hub_files import (  # noqa: F401 - also re-exported
    CONFIG_FILE, HUB_FILES, HUB_PREFIX, MAX_SAFETENSORS_HEADER, WEIGHTS_FILE,
    check_safetensors, hub_download, read_safetensors)
# The official input range, x / 127.5 - 1: mean 0.5, std 0.5 of [0, 1].
_OFFICIAL_MEAN_STD = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
# model_args a timm config may carry that change nothing here or that
# load() takes from elsewhere.
_KNOWN_MODEL_ARGS = {"img_size", "num_classes", "global_pool", "class_token"}

_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
_BLOCK_PARAMS = {
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
_TOP_PARAMS = {
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


# A timm config.json is a few KB (ImageNet-21k label names: ~0.5 MB).
MAX_CONFIG_BYTES = 16 << 20
MAX_CLASSES = 1_000_000


def _check(path, field, value, ok, expected):
    if not ok:
        raise ConfigError(path, field, f"expected {expected}; received "
                          f"{field}={shown(value)}")
    return value


def _is_int(value, low=1, high=None):
    return (isinstance(value, int) and not isinstance(value, bool)
            and value >= low and (high is None or value <= high))


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value == value and abs(value) != float("inf"))


def _image_size(path, field, value):
    """An image size field as ``(height, width)``: an int, ``[h, w]`` or
    timm's ``[channels, h, w]``."""
    ok = _is_int(value, high=MAX_IMAGE_SIDE) or (
        isinstance(value, list) and len(value) in (2, 3)
        and all(_is_int(v, high=MAX_IMAGE_SIDE) for v in value))
    _check(path, field, value, ok, f"a size in pixels (an integer in [1, "
           f"{MAX_IMAGE_SIDE}], or a list [channels,] height, width of them)")
    return (value, value) if isinstance(value, int) else tuple(value[-2:])


def _section(config, path, key, size_key):
    """``config[key]``, checked to be a JSON object and copied into
    ``config`` with its image size field ``size_key`` as ``(height,
    width)``; None when absent."""
    section = config.get(key)
    if section is None:
        return None
    _check(path, key, section, isinstance(section, dict), "a JSON object")
    section = config[key] = dict(section)
    if section.get(size_key) is not None:
        section[size_key] = _image_size(path, f"{key}.{size_key}",
                                        section[size_key])
    return section


def validate_config(config, path):
    """A timm ``config.json``'s content with every field this module reads
    checked for type and range (:class:`keras_vit.errors.ConfigError`
    naming ``path`` and the field otherwise). Image sizes become
    ``(height, width)`` tuples."""
    if not isinstance(config, dict):
        raise ConfigError(path, None, f"is a JSON {type(config).__name__}, "
                          "not an object of settings")
    config = dict(config)
    for key in ("architecture", "global_pool"):
        if config.get(key) is not None:
            _check(path, key, config[key], isinstance(config[key], str),
                   "a string")
    if config.get("num_classes") is not None:
        _check(path, "num_classes", config["num_classes"],
               _is_int(config["num_classes"], 0, MAX_CLASSES),
               f"an integer in [0, {MAX_CLASSES}]")
    labels = config.get("label_names")
    if labels is not None:
        _check(path, "label_names", labels, isinstance(labels, list) and len(
            labels) <= MAX_CLASSES and all(isinstance(v, str) for v in labels),
               "a list of strings")
    args = _section(config, path, "model_args", "img_size")
    if args is not None:
        if args.get("num_classes") is not None:
            _check(path, "model_args.num_classes", args["num_classes"],
                   _is_int(args["num_classes"], 0, MAX_CLASSES),
                   f"an integer in [0, {MAX_CLASSES}]")
        for key, kind, ok in (("global_pool", "a string", str),
                              ("class_token", "true or false", bool)):
            if args.get(key) is not None:
                _check(path, f"model_args.{key}", args[key],
                       isinstance(args[key], ok), kind)
    pretrained = _section(config, path, "pretrained_cfg", "input_size")
    if pretrained is not None:
        for key in ("mean", "std"):
            if key in pretrained:
                value = pretrained[key]
                _check(path, f"pretrained_cfg.{key}", value,
                       isinstance(value, list) and len(value) in (1, 3)
                       and all(_is_number(v) for v in value),
                       "a list of 3 numbers")
    return config


def read_config(path):
    """A timm ``config.json``, validated (:func:`validate_config`); one
    :class:`keras_vit.errors.ConfigError` naming the file for one that is
    too large, not UTF-8, not JSON or nested too deeply."""
    path = os.fspath(path)
    kind = special_file(path)
    if kind is not None:
        raise ConfigError(path, None, f"is {kind}, not a regular file")
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(path, None, f"is {size} bytes; a timm config.json "
                          f"is a few KB (at most {MAX_CONFIG_BYTES} read)")
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    try:
        config = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"is not UTF-8 text ({e})") from None
    except ValueError as e:
        raise ConfigError(path, None, f"is not valid JSON ({e})") from None
    except RecursionError:
        raise ConfigError(path, None, "is nested too deeply to be a timm "
                          "config") from None
    return validate_config(config, path)


def to_official(state, num_heads):
    """Maps a timm ViT ``state_dict`` (NumPy) onto the official ``.npz``
    layout. timm parameters with no official counterpart (layer scale,
    register tokens, fc_norm, q/k norms, ...) raise a ValueError naming
    them: loading without them would silently compute something else."""
    out, unknown = {}, []
    for name, value in state.items():
        value = np.asarray(value)
        m = _BLOCK_KEY.match(name)
        if m and m.group(2) in _BLOCK_PARAMS:
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
            key = prefix + _BLOCK_PARAMS[param]
            if param == "attn.proj.weight":
                d = value.shape[0]
                value = value.T.reshape(num_heads, d // num_heads, d)
            elif value.ndim == 2:  # Linear (out, in) -> Dense (in, out)
                value = value.T
            out[key] = value
        elif name in _TOP_PARAMS:
            if name == "patch_embed.proj.weight":  # OIHW -> HWIO
                value = value.transpose(2, 3, 1, 0)
            elif name == "head.weight":
                value = value.T
            out[_TOP_PARAMS[name]] = value
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


def from_official(arrays):
    """The inverse of :func:`to_official`: official-layout arrays (from
    :func:`keras_vit.zoo.export_arrays`) as a timm ViT ``state_dict``."""
    arrays = convert.normalize_keys(arrays)
    extra = sorted(k for k in arrays if k.startswith("pre_logits/"))
    if extra:
        raise ValueError(f"timm's ViT has no pre_logits layer; the model has "
                         f"{extra}")
    top = {v: k for k, v in _TOP_PARAMS.items()}
    block = {v: k for k, v in _BLOCK_PARAMS.items() if v}
    state, qkv = {}, {}
    for key, value in arrays.items():
        value = np.asarray(value, dtype="float32")
        if key in top:
            name = top[key]
            if name == "patch_embed.proj.weight":
                value = value.transpose(3, 2, 0, 1)
            elif name == "head.weight":
                value = value.T
            state[name] = value
            continue
        m = re.match(r"^Transformer/encoderblock_(\d+)/(.+)$", key)
        if not m:
            raise ValueError(f"no timm ViT parameter for {key!r}")
        i, rest = m.groups()
        att = "MultiHeadDotProductAttention_1/"
        part = rest[len(att):].split("/")[0] if rest.startswith(att) else None
        if part in ("query", "key", "value"):
            kind = rest.rsplit("/", 1)[1]
            flat = (value.reshape(value.shape[0], -1).T if kind == "kernel"
                    else value.reshape(-1))
            qkv.setdefault((i, kind), {})[part] = flat
            continue
        name = f"blocks.{i}.{block[rest]}"
        if rest == att + "out/kernel":
            value = value.reshape(-1, value.shape[-1]).T
        elif value.ndim == 2:
            value = value.T
        state[name] = value
    for (i, kind), parts in qkv.items():
        suffix = "weight" if kind == "kernel" else "bias"
        state[f"blocks.{i}.attn.qkv.{suffix}"] = np.concatenate(
            [parts["query"], parts["key"], parts["value"]], axis=0)
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


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


def _refuse_unsupported(config):
    pretrained = config.get("pretrained_cfg") or {}
    mean = [round(float(v), 4) for v in pretrained.get("mean", [0.5] * 3)]
    std = [round(float(v), 4) for v in pretrained.get("std", [0.5] * 3)]
    if (mean, std) != _OFFICIAL_MEAN_STD:
        raise ValueError(
            f"the weights expect inputs normalised with mean={mean}, "
            f"std={std}; keras_vit's ViT takes the official [-1, 1] range "
            "(mean 0.5, std 0.5) only")
    args = config.get("model_args") or {}
    unsupported = sorted(set(args) - _KNOWN_MODEL_ARGS)
    if unsupported:
        shown_args = {shown(k, 40): shown(args[k], 40)
                      for k in unsupported[:12]}
        raise ValueError(f"the timm config sets model_args keras_vit's ViT "
                         f"lacks: {shown_args}")
    pool = config.get("global_pool", args.get("global_pool", "token"))
    if pool not in ("token", ""):
        raise ValueError(f"timm global_pool={shown(pool)} is not supported; "
                         "keras_vit pools the class token")


def load(source, name=None, image_size=None, num_classes=None, *,
         gelu="exact", progress=None, **kwargs):
    """A keras_vit model with timm's weights from ``source``.

    The architecture, head size and input size come from the repository's
    ``config.json`` (``name`` overrides the architecture; ``image_size``
    resizes the position embeddings; another ``num_classes`` gives a new
    zero head). ``gelu="exact"`` (default) reproduces timm's forward.
    ``**kwargs`` go to :func:`keras_vit.zoo.load` (``include_top``, ...).
    The model's ``zoo_labels`` holds the repository's label names, if any.

    Example (a repository written by :func:`save_pretrained`):

    >>> import tempfile, numpy as np, keras_vit
    >>> from keras_vit.zoo import timm_hub
    >>> m = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
    ...                        num_classes=3, gelu="exact")
    >>> repo = timm_hub.save_pretrained(m, tempfile.mkdtemp())
    >>> m2 = timm_hub.load(repo)
    >>> x = np.random.rand(1, 32, 32, 3).astype("float32")
    >>> bool(np.allclose(m(x), m2(x), atol=1e-6))
    True
    """
    from keras_vit.zoo import sources

    return sources.build(read_checkpoint(
        source, name, image_size, num_classes, gelu=gelu, progress=progress,
        **kwargs), **kwargs)


def read_checkpoint(source, name=None, image_size=None, num_classes=None, *,
                    gelu="exact", keep_pre_logits=False, progress=None,
                    **kwargs):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.sources.Checkpoint` :func:`load` builds.
    ``keep_pre_logits`` is unused: timm's ViT has no ``pre_logits``."""
    from keras_vit.zoo import bit_layout, sources

    config, path = fetch(source, progress=progress)
    arch = _architecture(config, name)
    _refuse_unsupported(config)
    state = read_safetensors(path)
    is_bit = arch.family == "bit"
    build_config = dict(arch.config)
    try:
        if is_bit:
            arrays = bit_layout.normalize(bit_to_official(state))
            head = bit_layout.HEAD_KERNEL
        else:
            mapping = to_official
            if arch.family == "hybrid":
                mapping = hybrid_to_official
                # timm's ResNet standardises and normalises with other
                # epsilons.
                build_config["resnet"] = dict(arch.config["resnet"],
                                              **TIMM_RESNET_NUMERICS)
            arrays = convert.normalize_keys(
                mapping(state, arch.config["num_heads"]))
            head = "head/kernel"
            build_config["gelu"] = gelu
    except ValueError as e:  # parameters keras_vit lacks: name the file
        raise convert.CheckpointError(f"{os.fspath(path)}: {e}") from None
    if image_size is None:
        # (height, width) after read_config's checks.
        input_size = ((config.get("pretrained_cfg") or {}).get("input_size")
                      or (config.get("model_args") or {}).get("img_size"))
        if input_size:
            height, width = input_size
            image_size = height if height == width else (height, width)
        else:
            image_size = arch.image_size
    if image_size is None:
        image_size = 224
    ckpt_classes = (int(arrays[head].shape[-1]) if head in arrays else None)
    if num_classes is None:
        num_classes = ckpt_classes or config.get("num_classes") or 1000
    labels = config.get("label_names")
    build_config.update(image_size=image_size, num_classes=num_classes,
                        name=sources.model_name(arch.name))
    return sources.Checkpoint(
        build_config, arrays, source_name=repr(os.fspath(source)),
        family="bit" if is_bit else "vit",
        tags={"zoo_name": arch.name, "zoo_weights": None,
              "zoo_labels": (list(labels) if labels
                             and num_classes == ckpt_classes
                             and len(labels) == num_classes else None),
              "zoo_source": os.fspath(source)})


def _timm_architecture(model):
    """timm's name for the model's architecture, e.g.
    ``vit_base_patch16_224``."""
    names = {(192, 12, 3): "tiny", (384, 12, 6): "small",
             (768, 12, 12): "base", (1024, 24, 16): "large",
             (1280, 32, 16): "huge"}
    key = (model.hidden_size, model.num_layers, model.num_heads)
    size = names.get(key)
    if (size is None or getattr(model, "resnet", None) is not None
            or model.mlp_dim != 4 * model.hidden_size
            or model.classifier != "token"):
        raise ValueError(
            f"save_pretrained writes the standard timm ViTs (Ti, S, B, L, H "
            f"with a class token); model={model.name!r} has hidden_size, "
            f"num_layers, num_heads={key}, classifier={model.classifier!r}")
    return f"vit_{size}_patch{model.patch_size}_224"


LAYOUTS = ("timm", "transformers")


def save_pretrained(model, directory, labels=None, *, layout="timm"):
    """Writes ``model`` as a timm Hub repository: ``config.json`` and
    ``model.safetensors``, loadable with ``timm.create_model(arch,
    pretrained=True, pretrained_cfg_overlay=dict(file=...))`` or uploadable
    with ``huggingface_hub.upload_folder``. Returns ``directory``.
    The model should use ``gelu="exact"`` to compute what timm computes.

    ``layout="transformers"`` writes what Hugging Face transformers'
    ``ViTForImageClassification.from_pretrained(directory)`` loads instead
    (:func:`keras_vit.zoo.transformers_hub.save_pretrained`)."""
    from keras_vit.errors import check_choice

    check_choice("layout", layout, LAYOUTS)
    if layout == "transformers":
        from keras_vit.zoo import transformers_hub

        return transformers_hub.save_pretrained(model, directory, labels)
    st = require("safetensors.numpy", package="safetensors",
                 purpose="save_pretrained")
    arch = _timm_architecture(model)
    state = from_official(convert.export_arrays(model))
    size = model.image_size
    size = list(size) if isinstance(size, (tuple, list)) else [size, size]
    config = {
        "architecture": arch,
        "num_classes": int(model.num_classes),
        "num_features": int(model.hidden_size),
        "global_pool": "token",
        "model_args": {"img_size": size[0] if size[0] == size[1] else size},
        "pretrained_cfg": {
            "input_size": [3, *size], "fixed_input_size": True,
            "interpolation": "bilinear", "crop_pct": 1.0,
            "crop_mode": "center", "mean": _OFFICIAL_MEAN_STD[0],
            "std": _OFFICIAL_MEAN_STD[1], "num_classes": int(model.num_classes),
            "first_conv": "patch_embed.proj", "classifier": "head"},
    }
    if labels is not None:
        config["label_names"] = list(labels)
    os.makedirs(directory, exist_ok=True)
    # Each file complete or absent: a reader never sees half of one.
    with atomic.atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp:
        st.save_file(state, tmp, metadata={"format": "pt"})
    atomic.write_json(os.path.join(directory, CONFIG_FILE), config)
    return os.fspath(directory)
