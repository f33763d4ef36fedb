"""Hugging Face **transformers** ViT weights: ``config.json`` +
``model.safetensors`` as ``transformers.ViTForImageClassification`` and
``ViTModel`` write them (``save_pretrained``; the Hub's
``google/vit-base-patch16-224``, ``google/vit-base-patch16-224-in21k``, ...).

Sources: ``"hf-hub:<owner>/<name>[@revision]"`` whose ``config.json`` has a
``model_type`` (timm's have none), a local folder holding such a
``config.json`` and ``model.safetensors``, or a ``.safetensors`` file with
transformers' parameter names given as ``weights=`` for a ViT name. Hub
files come through :func:`keras_vit.zoo.hub_files.hub_download`
(``huggingface_hub``'s cache, ``HF_HUB_OFFLINE``, ``HF_TOKEN``,
``HF_ENDPOINT``); tensors are read as NumPy arrays, without torch or
transformers, and never unpickled.

transformers' numerics are kept: LayerNorm epsilon from ``layer_norm_eps``
(1e-12 in Google's files, where the official ``.npz`` models use 1e-6) and
the GELU of ``hidden_act`` (``"gelu"`` is the exact, erf form). A
``ViTForImageClassification`` becomes a model with its ``classifier`` as
the head and ``id2label`` as the model's label names (``zoo_labels``, read
by ``decode_predictions`` and ``keras-vit predict``); a ``ViTModel``
becomes a feature model (``include_top=False``, ``pooling="token"``) whose
tanh ``pooler`` is the ``pre_logits`` layer, so that it returns
transformers' ``pooler_output``.

The file's tensor names and shapes are checked against the config before
anything is allocated: missing, unexpected and mis-shaped tensors are
listed together in one error naming the file.

:func:`save_pretrained` writes the reverse (``zoo.save_pretrained(model,
dir, layout="transformers")``): a folder transformers'
``ViTForImageClassification.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from keras_vit.errors import special_file
from keras_vit.zoo import convert, hub_files

HUB_PREFIX = hub_files.HUB_PREFIX
CONFIG_FILE = hub_files.CONFIG_FILE
WEIGHTS_FILE = hub_files.WEIGHTS_FILE
PICKLE_FILE = "pytorch_model.bin"
PREPROCESSOR_FILE = "preprocessor_config.json"

# The architectures keras_vit reproduces, and what each becomes.
ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
# transformers' hidden_act -> keras_vit's gelu form. "gelu" is torch's
# default, erf; "gelu_new" / "gelu_pytorch_tanh" the tanh approximation.
GELU_FORMS = {"gelu": "exact", "gelu_new": "tanh",
              "gelu_pytorch_tanh": "tanh"}
# Google's files: transformers' ViTConfig defaults.
DEFAULT_LAYER_NORM_EPS = 1e-12
DEFAULT_HIDDEN_ACT = "gelu"

# Bounds no ViT checkpoint comes near (ViT-22B: width 6144, 48 layers);
# a config beyond them is refused before anything is allocated.
MAX_CONFIG_BYTES = 16 << 20
MAX_HIDDEN = 16384
MAX_LAYERS = convert.MAX_BLOCKS
MAX_MLP = 65536
MAX_IMAGE_SIDE = 4096
MAX_CHANNELS = 16
MAX_CLASSES = 1_000_000

# Hub model types that are not ViT, with the way out where there is one.
_OTHER_TYPES = {
    "deit": "DeiT (its distillation token and second head have no "
            "counterpart here); the DeiT checkpoints without distillation "
            "that transformers stores as model_type 'vit' "
            "(facebook/deit-*-patch16-224) load",
    "vit_mae": "ViT-MAE (a masked autoencoder); its encoder is not a "
               "classifier keras_vit reproduces",
    "vit_msn": "ViT-MSN",
    "vit_hybrid": "transformers' BiT hybrid; the official R50+ViT-B/16 "
                  "weights load by name: zoo.load('R50+ViT-B/16')",
    "dinov2": "DINOv2 (layer scale, register tokens)",
    "beit": "BEiT (relative position bias, layer scale)",
    "swin": "Swin", "clip_vision_model": "CLIP's vision tower",
}

_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
_ATTN = "MultiHeadDotProductAttention_1/"
# transformers' per-layer names -> the official layout's (kernels are
# transposed, and the attention ones split into heads, by _to_official).
_LAYER_PARAMS = {
    "layernorm_before.weight": "LayerNorm_0/scale",
    "layernorm_before.bias": "LayerNorm_0/bias",
    "attention.attention.query.weight": _ATTN + "query/kernel",
    "attention.attention.query.bias": _ATTN + "query/bias",
    "attention.attention.key.weight": _ATTN + "key/kernel",
    "attention.attention.key.bias": _ATTN + "key/bias",
    "attention.attention.value.weight": _ATTN + "value/kernel",
    "attention.attention.value.bias": _ATTN + "value/bias",
    "attention.output.dense.weight": _ATTN + "out/kernel",
    "attention.output.dense.bias": _ATTN + "out/bias",
    "layernorm_after.weight": "LayerNorm_2/scale",
    "layernorm_after.bias": "LayerNorm_2/bias",
    "intermediate.dense.weight": "MlpBlock_3/Dense_0/kernel",
    "intermediate.dense.bias": "MlpBlock_3/Dense_0/bias",
    "output.dense.weight": "MlpBlock_3/Dense_1/kernel",
    "output.dense.bias": "MlpBlock_3/Dense_1/bias",
}
_TOP_PARAMS = {
    "embeddings.cls_token": "cls",
    "embeddings.position_embeddings": convert.POSEMB_KEY,
    "embeddings.patch_embeddings.projection.weight": "embedding/kernel",
    "embeddings.patch_embeddings.projection.bias": "embedding/bias",
    "layernorm.weight": "Transformer/encoder_norm/scale",
    "layernorm.bias": "Transformer/encoder_norm/bias",
    "pooler.dense.weight": "pre_logits/kernel",
    "pooler.dense.bias": "pre_logits/bias",
}
_HEAD_PARAMS = {"classifier.weight": "head/kernel",
                "classifier.bias": "head/bias"}


# -- recognising a source ---------------------------------------------------

def read_json(path, what):
    """The JSON object in the file ``path`` (a ``what``, for errors): a
    :class:`~keras_vit.zoo.convert.CheckpointError` naming the file for
    one that is not a regular file, too large for a config, not UTF-8 JSON
    or not an object."""
    path = os.fspath(path)
    kind = special_file(path)
    if kind is not None:
        raise convert.CheckpointError(f"{path}: is {kind}, not a regular file")
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise convert.CheckpointError(
            f"{path}: is {size} bytes; a {what} is a few KB (at most "
            f"{MAX_CONFIG_BYTES} bytes are read)")
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise convert.CheckpointError(
            f"{path}: is not a JSON {what} ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]})") from None
    if not isinstance(value, dict):
        raise convert.CheckpointError(
            f"{path}: is a JSON {type(value).__name__}, not an object of "
            "settings")
    return value


def is_transformers_config(config):
    """True for a transformers ``config.json`` (it names a ``model_type``;
    timm's name an ``architecture`` instead)."""
    return isinstance(config, dict) and "model_type" in config


def _sniff(path):
    """True when the ``config.json`` at ``path`` is transformers'. A file
    that is no JSON object is not claimed: the timm route, which reads the
    same file name, reports it."""
    try:
        return is_transformers_config(
            read_json(path, "transformers config.json"))
    except (convert.CheckpointError, OSError):
        return False


def is_transformers_source(value, *, progress=None):
    """True for what :func:`load` reads: a folder whose ``config.json`` is
    transformers' (with ``model.safetensors``, or only the pickled
    ``pytorch_model.bin``, which :func:`load` then refuses), a
    ``.safetensors`` file with transformers' names, or an ``hf-hub:``
    handle whose ``config.json`` is transformers' (it is downloaded, into
    huggingface_hub's cache, to tell).

    >>> is_transformers_source("ViT-B/16")
    False
    """
    if not isinstance(value, (str, os.PathLike)):
        return False
    value = os.fspath(value)
    if value.startswith(HUB_PREFIX):
        repo, revision = _parse_handle(value)
        (config_path,) = hub_files.hub_download(
            repo, revision, files=(CONFIG_FILE,), progress=progress)
        return _sniff(config_path)
    if os.path.isdir(value):
        path = os.path.join(value, CONFIG_FILE)
        return os.path.isfile(path) and _sniff(path)
    if value.endswith(".safetensors") and os.path.isfile(value):
        try:
            return _is_transformers_state(_header(value))
        except (convert.CheckpointError, OSError):
            return False  # the timm route reports a broken file
    return False


def _is_transformers_state(header):
    return any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings."))
               for k in header)


def _parse_handle(value):
    repo, _, revision = value[len(HUB_PREFIX):].partition("@")
    if not repo or repo.count("/") != 1:
        raise ValueError("an hf-hub: handle is hf-hub:<owner>/<name>"
                         f"[@revision]; received {value!r}")
    return repo, revision or None


# -- the config ---------------------------------------------------------------

def _is_int(value, low, high):
    return (isinstance(value, int) and not isinstance(value, bool)
            and low <= value <= high)


def _field(config, path, key, default, ok, expected):
    value = config.get(key, default)
    if not ok(value):
        raise convert.CheckpointError(
            f"{path}: field {key}: expected {expected}; received "
            f"{key}={_shown(value)}")
    return value


def _shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def architecture(config, path, header=None):
    """``config`` checked and read as keras_vit's builder arguments:
    ``{"kind": "classifier" | "model", "hidden_size", "num_layers",
    "num_heads", "mlp_dim", "image_size", "patch_size", "num_channels",
    "layer_norm_epsilon", "gelu", "labels", "representation_size"}``.
    Other model types and architectures, and settings keras_vit lacks, are
    refused by name; sizes beyond any ViT's are refused before anything is
    allocated. ``header`` (tensor name -> entry) tells a config that names
    no architecture which one the file holds."""
    path = os.fspath(path)
    model_type = config.get("model_type")
    if model_type != "vit":
        what = _OTHER_TYPES.get(model_type) if isinstance(
            model_type, str) else None
        raise ValueError(
            f"{path}: model_type={_shown(model_type)} is not supported"
            + (f": {what}" if what else "")
            + ". keras_vit reads transformers' ViT (model_type 'vit': "
            f"{' and '.join(ARCHITECTURES)}); timm's repositories of the "
            "same weights load too (hf-hub:timm/vit_*)")
    names = config.get("architectures")
    if names is not None:
        _field(config, path, "architectures", None,
               lambda v: isinstance(v, list) and len(v) == 1
               and isinstance(v[0], str), "a list of one class name")
        kind = {"ViTForImageClassification": "classifier",
                "ViTModel": "model"}.get(names[0])
        if kind is None:
            raise ValueError(
                f"{path}: architectures={_shown(names)} is not supported; "
                f"keras_vit loads {' and '.join(ARCHITECTURES)} (load the "
                "encoder of another one in transformers and save it as "
                "ViTModel: ViTModel.from_pretrained(...).save_pretrained("
                "dir))")
    else:  # older files: the tensors tell
        kind = "classifier" if any(
            k.startswith("vit.") for k in (header or {})) else "model"
    hidden = _field(config, path, "hidden_size", 768,
                    lambda v: _is_int(v, 1, MAX_HIDDEN),
                    f"an integer in [1, {MAX_HIDDEN}]")
    heads = _field(config, path, "num_attention_heads", 12,
                   lambda v: _is_int(v, 1, hidden) and hidden % v == 0,
                   f"an integer that divides hidden_size={hidden}")
    if config.get("head_dim") not in (None, hidden // heads):
        raise ValueError(f"{path}: head_dim={_shown(config['head_dim'])} "
                         f"other than hidden_size / num_attention_heads = "
                         f"{hidden // heads} is not supported")
    layers = _field(config, path, "num_hidden_layers", 12,
                    lambda v: _is_int(v, 1, MAX_LAYERS),
                    f"an integer in [1, {MAX_LAYERS}]")
    mlp = _field(config, path, "intermediate_size", 3072,
                 lambda v: _is_int(v, 1, MAX_MLP),
                 f"an integer in [1, {MAX_MLP}]")
    size = _field(config, path, "image_size", 224, lambda v: _is_int(
        v, 1, MAX_IMAGE_SIDE) or (isinstance(v, list) and len(v) == 2 and all(
            _is_int(s, 1, MAX_IMAGE_SIDE) for s in v)),
        f"an integer in [1, {MAX_IMAGE_SIDE}] or [height, width] of them")
    size = tuple(size) if isinstance(size, list) else (size, size)
    patch = _field(config, path, "patch_size", 16, lambda v: _is_int(
        v, 1, min(size)) and all(s % v == 0 for s in size),
        f"an integer that divides image_size={list(size)}")
    channels = _field(config, path, "num_channels", 3,
                      lambda v: _is_int(v, 1, MAX_CHANNELS),
                      f"an integer in [1, {MAX_CHANNELS}]")
    eps = _field(config, path, "layer_norm_eps", DEFAULT_LAYER_NORM_EPS,
                 lambda v: isinstance(v, (int, float))
                 and not isinstance(v, bool) and 0 < v < 1,
                 "a number in (0, 1)")
    act = _field(config, path, "hidden_act", DEFAULT_HIDDEN_ACT,
                 lambda v: v in GELU_FORMS,
                 f"one of {sorted(GELU_FORMS)} (keras_vit's GELU forms)")
    _field(config, path, "qkv_bias", True, lambda v: v is True,
           "true (keras_vit's attention has query, key and value biases)")
    out = {"kind": kind, "hidden_size": hidden, "num_layers": layers,
           "num_heads": heads, "mlp_dim": mlp,
           "image_size": size[0] if size[0] == size[1] else size,
           "patch_size": patch, "num_channels": channels,
           "layer_norm_epsilon": float(eps), "gelu": GELU_FORMS[act],
           "labels": _labels(config, path), "representation_size": None}
    if kind == "model":
        _field(config, path, "pooler_act", "tanh", lambda v: v == "tanh",
               "'tanh' (keras_vit's pre_logits)")
        out["representation_size"] = _field(
            config, path, "pooler_output_size", hidden,
            lambda v: _is_int(v, 1, MAX_HIDDEN),
            f"an integer in [1, {MAX_HIDDEN}]")
    return out


def _labels(config, path):
    """``id2label`` as a list ordered by index, or None."""
    id2label = config.get("id2label")
    if id2label is None:
        return None
    _field(config, path, "id2label", None,
           lambda v: isinstance(v, dict) and len(v) <= MAX_CLASSES,
           f"an object of at most {MAX_CLASSES} index: name pairs")
    labels = {}
    for key, name in id2label.items():
        try:
            index = int(key)
        except ValueError:
            index = -1
        if not (0 <= index < len(id2label)) or not isinstance(name, str):
            raise convert.CheckpointError(
                f"{path}: field id2label: expected indices 0..{len(id2label) - 1}"
                f" naming strings; received {_shown(key)}: {_shown(name)}")
        labels[index] = name
    return [labels[i] for i in range(len(labels))] or None


# -- tensors ------------------------------------------------------------------

def _header(path):
    """The ``.safetensors`` header of ``path``: tensor name -> entry,
    checked by :func:`keras_vit.zoo.hub_files.check_safetensors` (bounded
    header, known dtypes, byte ranges inside the file); the data is not
    read."""
    header = dict(hub_files.check_safetensors(os.fspath(path)))
    header.pop("__metadata__", None)
    return header


def expected_shapes(arch, num_labels, prefix):
    """transformers' tensor names and shapes for ``arch`` (see
    :func:`architecture`): ``prefix`` is ``"vit."`` in a
    ``ViTForImageClassification``, ``""`` in a ``ViTModel``."""
    d, m, c, p = (arch["hidden_size"], arch["mlp_dim"], arch["num_channels"],
                  arch["patch_size"])
    size = arch["image_size"]
    h, w = (size, size) if isinstance(size, int) else size
    shapes = {
        "embeddings.cls_token": (1, 1, d),
        "embeddings.position_embeddings": (1, (h // p) * (w // p) + 1, d),
        "embeddings.patch_embeddings.projection.weight": (d, c, p, p),
        "embeddings.patch_embeddings.projection.bias": (d,),
        "layernorm.weight": (d,), "layernorm.bias": (d,),
    }
    layer = {"layernorm_before.weight": (d,), "layernorm_before.bias": (d,),
             "layernorm_after.weight": (d,), "layernorm_after.bias": (d,),
             "attention.output.dense.weight": (d, d),
             "attention.output.dense.bias": (d,),
             "intermediate.dense.weight": (m, d),
             "intermediate.dense.bias": (m,),
             "output.dense.weight": (d, m), "output.dense.bias": (d,)}
    for part in ("query", "key", "value"):
        layer[f"attention.attention.{part}.weight"] = (d, d)
        layer[f"attention.attention.{part}.bias"] = (d,)
    for i in range(arch["num_layers"]):
        shapes.update({f"encoder.layer.{i}.{k}": v for k, v in layer.items()})
    if arch["representation_size"] is not None:
        r = arch["representation_size"]
        shapes.update({"pooler.dense.weight": (r, d), "pooler.dense.bias": (r,)})
    shapes = {prefix + k: v for k, v in shapes.items()}
    if num_labels:
        shapes.update({"classifier.weight": (num_labels, d),
                       "classifier.bias": (num_labels,)})
    return shapes


def check_tensors(header, expected, path):
    """One :class:`~keras_vit.zoo.convert.CheckpointError` naming ``path``
    and listing every missing, unexpected and mis-shaped tensor."""
    check_names({k: v.get("shape") for k, v in header.items()}, expected,
                f"{os.fspath(path)}: does not hold the transformers ViT its "
                "config describes")


def check_names(found, expected, what):
    """One :class:`~keras_vit.zoo.convert.CheckpointError` starting with
    ``what`` and listing every missing, unexpected and mis-shaped name
    (``found``, ``expected``: name -> shape), in natural order (layer.2
    before layer.10), a dozen of each at most."""
    def natural(name):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]

    def listed(shape):
        return list(shape) if isinstance(shape, (list, tuple)) else shape

    missing = [_shown(k, 160) for k in sorted(set(expected) - set(found),
                                              key=natural)]
    extra = [_shown(k, 160) for k in sorted(set(found) - set(expected),
                                            key=natural)]
    wrong = [f"{_shown(k, 120)}: {_shown(listed(found[k]), 40)} "
             f"(expected {list(expected[k])})"
             for k in sorted(set(expected) & set(found), key=natural)
             if listed(found[k]) != list(expected[k])]
    problems = []
    for kind, items in (("missing", missing), ("unexpected", extra),
                        ("mis-shaped", wrong)):
        if items:
            more = f", ... ({len(items)} in all)" if len(items) > 12 else ""
            problems.append(f"{len(items)} {kind}: "
                            f"{', '.join(items[:12])}"
                            f"{more}")
    if problems:
        raise convert.CheckpointError(f"{what}; {'; '.join(problems)}")


def to_official(state, num_heads, prefix=""):
    """Maps transformers ViT tensors (NumPy, names as checked by
    :func:`check_tensors`) onto the official ``.npz`` layout."""
    out = {}
    for name, value in state.items():
        value = np.asarray(value, dtype="float32")
        if name in _HEAD_PARAMS:
            out[_HEAD_PARAMS[name]] = value.T if value.ndim == 2 else value
            continue
        name = name[len(prefix):]
        m = _LAYER.match(name)
        if m:
            i, param = m.groups()
            key = f"Transformer/encoderblock_{i}/{_LAYER_PARAMS[param]}"
            if param.startswith("attention.attention."):
                if value.ndim == 2:  # (H*Dh, D) -> (D, H, Dh)
                    value = value.T.reshape(value.shape[1], num_heads, -1)
                else:
                    value = value.reshape(num_heads, -1)
            elif param == "attention.output.dense.weight":
                value = value.T.reshape(num_heads, -1, value.shape[0])
            elif value.ndim == 2:  # Linear (out, in) -> Dense (in, out)
                value = value.T
            out[key] = value
            continue
        if name == "embeddings.patch_embeddings.projection.weight":
            value = value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif name == "pooler.dense.weight":
            value = value.T
        out[_TOP_PARAMS[name]] = value
    return out


# -- loading ------------------------------------------------------------------

def fetch(source, progress=None):
    """``(config dict or None, config path, local .safetensors path)`` of
    ``source``. A folder or repository with only ``pytorch_model.bin`` is
    refused: keras_vit never unpickles."""
    source = os.fspath(source)
    way_out = (
        "keras_vit never unpickles a checkpoint; write model.safetensors "
        "with transformers: ViTForImageClassification.from_pretrained(src)"
        ".save_pretrained(dir, safe_serialization=True), then "
        "zoo.load(dir)")
    if source.startswith(HUB_PREFIX):
        repo, revision = _parse_handle(source)
        (config_path,) = hub_files.hub_download(
            repo, revision, files=(CONFIG_FILE,), progress=progress)
        try:  # optional: checked below when the repository has one
            hub_files.hub_download(repo, revision, files=(PREPROCESSOR_FILE,),
                                  progress=progress)
        except Exception:  # noqa: BLE001 - absent, or offline and not cached
            pass
        try:
            (path,) = hub_files.hub_download(
                repo, revision, files=(WEIGHTS_FILE,), progress=progress)
        except Exception as e:
            text = str(e)
            if "EntryNotFound" in text and "LocalEntryNotFound" not in text:
                raise type(e)(
                    f"{text}; {source} has no {WEIGHTS_FILE} (a repository "
                    f"with only {PICKLE_FILE}?): {way_out}") from e
            raise
    elif os.path.isdir(source):
        config_path = os.path.join(source, CONFIG_FILE)
        path = os.path.join(source, WEIGHTS_FILE)
        if not os.path.isfile(path):
            found = [n for n in (PICKLE_FILE, "model.safetensors.index.json")
                     if os.path.exists(os.path.join(source, n))]
            raise FileNotFoundError(
                f"{source!r} has no {WEIGHTS_FILE}"
                + (f" (it has {', '.join(found)})" if found else "")
                + f"; {way_out}")
    else:
        if not os.path.isfile(source):
            raise FileNotFoundError(f"No such .safetensors file: {source!r}")
        path = source
        config_path = os.path.join(os.path.dirname(source), CONFIG_FILE)
    check_preprocessor(os.path.join(os.path.dirname(config_path),
                                    PREPROCESSOR_FILE))
    config = None
    if os.path.isfile(config_path):
        config = read_json(config_path, "transformers config.json")
        if not is_transformers_config(config):
            config = None
    return config, config_path, path


def check_preprocessor(path):
    """Refuses weights whose ``preprocessor_config.json`` (when there is
    one at ``path``) normalises inputs other than the official way: mean
    0.5 and std 0.5 on [0, 1] pixels, i.e. x / 127.5 - 1, the only range
    keras_vit's ViT takes (Google's files say so; DeiT-style files in the
    ViT layout expect ImageNet's mean and std and would load silently
    wrong)."""
    if path is None or not os.path.isfile(path):
        return
    config = read_json(path, "transformers preprocessor_config.json")
    problems = []
    if config.get("do_normalize", True) is not True:
        problems.append(f"do_normalize={config.get('do_normalize')!r}")
    if config.get("do_rescale", True) is not True:
        problems.append(f"do_rescale={config.get('do_rescale')!r}")
    scale = config.get("rescale_factor", 1 / 255)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or \
            abs(scale - 1 / 255) > 1e-6:
        problems.append(f"rescale_factor={_shown(scale)}")
    for key in ("image_mean", "image_std"):
        value = config.get(key, [0.5, 0.5, 0.5])
        ok = (isinstance(value, list) and len(value) in (1, 3) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            and abs(v - 0.5) < 1e-4 for v in value))
        if not ok:
            problems.append(f"{key}={_shown(value)}")
    if problems:
        raise convert.CheckpointError(
            f"{path}: the weights expect inputs prepared with "
            f"{', '.join(problems)}; keras_vit's ViT takes the official "
            "[-1, 1] range (x / 127.5 - 1: mean 0.5, std 0.5) only")


def zoo_name(arch):
    """The zoo name of a ViT of ``arch``'s sizes (``hidden_size``,
    ``mlp_dim``, ``num_heads``, ``num_layers``, ``patch_size``), or a
    description of them where no zoo size has them.

    >>> zoo_name(dict(hidden_size=192, mlp_dim=768, num_heads=3,
    ...               num_layers=12, patch_size=16))
    'ViT-Ti/16'
    """
    from keras_vit import variants

    sizes = {k: arch[k] for k in ("hidden_size", "mlp_dim", "num_heads",
                                  "num_layers")}
    for letter, config in variants.VIT_SIZES.items():
        if config == sizes:
            return variants.vit_name(letter, arch["patch_size"])
    return (f"ViT (hidden {arch['hidden_size']}, {arch['num_layers']} "
            f"layers, patch {arch['patch_size']})")


def name_sizes(name, weights):
    """The sizes of the ViT name ``name``, for weights that only a ViT
    takes (``weights`` says whose, in the error for another family).

    >>> name_sizes("ViT-Ti/16", "transformers'")
    {'hidden_size': 192, 'mlp_dim': 768, 'num_heads': 3, 'num_layers': 12, 'patch_size': 16}
    """
    from keras_vit import variants

    parsed = variants.parse(name)
    if parsed.family != "vit":
        raise ValueError(f"{weights} ViT weights load into ViT names only; "
                         f"received name={name!r} ({parsed.family})")
    return {k: parsed.config[k] for k in (
        "hidden_size", "mlp_dim", "num_heads", "num_layers", "patch_size")}


def load(source, name=None, image_size=None, num_classes=None, *,
         keep_pre_logits=False, progress=None, **kwargs):
    """A keras_vit model with transformers' ViT weights from ``source``.

    The architecture comes from the ``config.json`` (``name``, a ViT name
    such as ``"ViT-B/16"``, overrides it: the file's tensors must then fit
    that name); ``image_size`` resizes the position embeddings; another
    ``num_classes`` gives a new zero head. ``**kwargs`` go to
    :func:`keras_vit.models.vit` (``include_top``, ``pooling``, ``gelu``,
    ...). The model's ``zoo_labels`` holds ``id2label`` when the head is
    the checkpoint's.
    """
    from keras_vit.zoo import sources

    return sources.build(read_checkpoint(
        source, name, image_size, num_classes,
        keep_pre_logits=keep_pre_logits, progress=progress, **kwargs),
        **kwargs)


def read_checkpoint(source, name=None, image_size=None, num_classes=None, *,
                    keep_pre_logits=False, progress=None, **kwargs):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.sources.Checkpoint` :func:`load` builds, the
    tensors checked against the config before any is read."""

    config, config_path, path = fetch(source, progress=progress)
    header = _header(path)
    if config is None and not _is_transformers_state(header):
        raise ValueError(
            f"{path}: has no transformers ViT tensor names "
            "(vit.embeddings.*, embeddings.*) and no transformers "
            f"{CONFIG_FILE} beside it")
    if config is None:
        config = {"model_type": "vit"}
    arch = architecture(config, config_path, header)
    if name is not None:
        # The name's sizes; keywords override them, as in zoo.load.
        arch.update({k: kwargs.pop(k, size) for k, size in
                     name_sizes(name, "transformers'").items()})
        arch["kind"] = ("classifier" if any(k.startswith("vit.")
                                            for k in header) else "model")
        if arch["kind"] == "model":
            arch["representation_size"] = (
                header.get("pooler.dense.weight", {}).get("shape") or [None])[0]
        if "embeddings.position_embeddings" in header or (
                "vit.embeddings.position_embeddings" in header):
            posemb = (header.get("vit.embeddings.position_embeddings")
                      or header["embeddings.position_embeddings"])
            shape = posemb.get("shape")
            if isinstance(shape, list) and len(shape) == 3 and all(
                    isinstance(s, int) for s in shape):
                side = int(round((shape[1] - 1) ** 0.5))
                if side * side == shape[1] - 1 and side > 0:
                    arch["image_size"] = side * arch["patch_size"]
    prefix = "vit." if arch["kind"] == "classifier" else ""
    labels = arch["labels"]
    num_labels = 0
    if arch["kind"] == "classifier":
        entry = header.get("classifier.weight")
        shape = entry.get("shape") if entry else None
        num_labels = (len(labels) if labels else shape[0] if isinstance(
            shape, list) and shape and _is_int(shape[0], 1, MAX_CLASSES)
            else 0)
    if arch["kind"] == "model" and arch["representation_size"] is not None \
            and not any(k.endswith("pooler.dense.weight") for k in header):
        arch["representation_size"] = None  # add_pooling_layer=False
    # Names and shapes before anything is allocated.
    check_tensors(header, expected_shapes(arch, num_labels, prefix), path)
    state = hub_files.read_safetensors(path)
    arrays = to_official(state, arch["num_heads"], prefix)
    del state

    defaults = {"name": "vit_transformers"}
    if not num_labels:  # a ViTModel (or a classifier without labels)
        defaults["include_top"] = num_classes is not None
        if arch["representation_size"] is not None or (
                arch["kind"] == "classifier"):  # the pooled class token
            defaults["pooling"] = "token"
    include_top = kwargs.get("include_top", defaults.get("include_top", True))
    if num_classes is None:
        num_classes = num_labels or 1000
    head_kept = include_top and num_labels and num_classes == num_labels
    representation = arch["representation_size"]
    if representation is not None and include_top and not keep_pre_logits:
        representation = None  # a new head on the encoder, as transformers'
    return checkpoint(
        arch, arrays, image_size=image_size, num_classes=num_classes,
        representation_size=representation, keep_pre_logits=keep_pre_logits,
        source_name=repr(os.fspath(path)),
        tags={"zoo_labels": (list(labels) if labels and head_kept
                             and len(labels) == num_classes else None),
              "zoo_source": os.fspath(source)}, **defaults)


def checkpoint(arch, arrays, *, image_size, num_classes, representation_size,
               keep_pre_logits=None, source_name=None, tags=None, **defaults):
    """The :class:`~keras_vit.zoo.sources.Checkpoint` of the keras_vit ViT
    that ``arch`` (the facts a reader returns: sizes, ``image_size``,
    ``patch_size``, ``num_channels``, ``layer_norm_epsilon``, ``gelu``,
    optionally ``classifier``) describes, holding ``arrays`` (official
    layout): ``image_size`` None is the checkpoint's; ``**defaults`` are
    more builder arguments; ``tags`` more attributes for the model
    (``zoo_name`` and ``zoo_weights`` are set)."""
    from keras_vit.zoo import sources

    config = {key: arch[key] for key in (
        "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
        "layer_norm_epsilon", "gelu", "num_channels")}
    config.update(
        image_size=arch["image_size"] if image_size is None else image_size,
        num_classes=num_classes, classifier=arch.get("classifier", "token"),
        representation_size=representation_size, **defaults)
    return sources.Checkpoint(
        config, arrays, source_name=source_name,
        keep_pre_logits=keep_pre_logits,
        tags={"zoo_name": zoo_name(arch), "zoo_weights": None,
              **(tags or {})})


def build(arch, arrays, *, image_size, num_classes, representation_size,
          keep_pre_logits=None, source_name=None, **kwargs):
    """The keras_vit ViT that ``arch`` describes (see :func:`checkpoint`),
    with ``arrays`` (official layout) loaded strictly by
    :func:`keras_vit.zoo.sources.build`: resized position embeddings for
    another ``image_size`` (None: the checkpoint's), a zero head for
    another ``num_classes``. ``**kwargs`` go to
    :func:`keras_vit.models.vit` and win over ``arch``."""
    from keras_vit.zoo import sources

    return sources.build(checkpoint(
        arch, arrays, image_size=image_size, num_classes=num_classes,
        representation_size=representation_size,
        keep_pre_logits=keep_pre_logits, source_name=source_name), **kwargs)


# -- writing ------------------------------------------------------------------

# keras_vit's GELU forms -> transformers' hidden_act.
HIDDEN_ACTS = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}


def _writable(model):
    """``(kind, reason)``: the transformers class that holds ``model``
    (``"classifier"``: ``ViTForImageClassification``; ``"model"``:
    ``ViTModel``, for a model without a head), or None and the reason
    none does."""
    config = model.get_config() if hasattr(model, "get_config") else None
    if not isinstance(config, dict) or "hidden_size" not in config or (
            "num_heads" not in config):
        return None, (f"{type(model).__name__} is not a keras_vit "
                      "VisionTransformer")
    include_top = config.get("include_top", True)
    checks = (
        (config.get("resnet") is not None, "a ResNet stem (hybrid)"),
        (config.get("classifier") != "token",
         f"classifier={config.get('classifier')!r} (transformers pools the "
         "class token)"),
        (include_top and config.get("representation_size") is not None,
         "a pre_logits layer before the head (representation_size="
         f"{config.get('representation_size')}; ViTForImageClassification "
         "has none; without the head, include_top=False, it is ViTModel's "
         "pooler)"),
        (not include_top and config.get("pooling") == "gap",
         "pooling='gap' (ViTModel pools the class token)"),
        (config.get("position_embedding", "learned_1d") != "learned_1d"
         or config.get("position_embedding_placement", "stem") != "stem",
         "a position embedding other than the learned 1-D table at the "
         "stem"),
        (config.get("gelu", "tanh") not in HIDDEN_ACTS,
         f"gelu={config.get('gelu')!r}"),
        (config.get("return_attention_scores"), "attention scores as an "
         "output"),
    )
    for bad, what in checks:
        if bad:
            return None, what
    return ("classifier" if include_top else "model"), None


def save_pretrained(model, directory, labels=None):
    """Writes ``model`` as transformers writes a ``ViTForImageClassification``
    (``config.json``, ``model.safetensors``, ``preprocessor_config.json``),
    so that ``transformers.ViTForImageClassification.from_pretrained(
    directory)`` loads it with the same logits, and ``zoo.load(directory)``
    reads it back. ``labels`` (default: the model's own label names, if it
    has them) become ``id2label``. Each file is written whole or not at all.

    A model without a head (``include_top=False``) is written as a
    ``ViTModel``: its ``pre_logits`` layer, if it has one, is the tanh
    pooler (``pooler_output`` is the model's output); without one the
    folder has no pooler and loads with ``ViTModel.from_pretrained(
    directory, add_pooling_layer=False)`` (``last_hidden_state``).

    Example (transformers itself is not needed to write)::

        import keras_vit
        model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                              num_layers=2, num_heads=4, mlp_dim=64,
                              num_classes=3)
        keras_vit.zoo.save_pretrained(model, "vit-dir", layout="transformers")
    """
    from keras_vit import atomic
    from keras_vit.errors import require

    kind, reason = _writable(model)
    if reason is not None:
        raise ValueError(
            f"save_pretrained(layout='transformers') writes transformers' "
            f"ViTForImageClassification or ViTModel, neither of which can "
            f"hold this model: {reason}"
            + ("" if "VisionTransformer" in reason else
               "; zoo.save_npz writes it"))
    st = require("safetensors.numpy", package="safetensors",
                 purpose="save_pretrained")
    config = model.get_config()
    hidden, heads = int(config["hidden_size"]), int(config["num_heads"])
    size = config["image_size"]
    out = {
        "model_type": "vit",
        "architectures": [ARCHITECTURES[kind == "model"]],
        "hidden_size": hidden,
        "num_hidden_layers": int(config["num_layers"]),
        "num_attention_heads": heads,
        "intermediate_size": int(config["mlp_dim"]),
        "hidden_act": HIDDEN_ACTS[config.get("gelu", "tanh")],
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": float(config.get("layer_norm_epsilon", 1e-6)),
        "image_size": list(size) if isinstance(size, (list, tuple)) else size,
        "patch_size": int(config["patch_size"]),
        "num_channels": int(config.get("num_channels", 3)),
        "qkv_bias": True,
        "torch_dtype": "float32",
    }
    arrays = convert.export_arrays(model)
    if kind == "classifier":
        labels = _label_names(model, labels, int(config["num_classes"]))
        out["id2label"] = {str(i): name for i, name in enumerate(labels)}
        out["label2id"] = {name: i for i, name in enumerate(labels)}
        state = from_official(arrays, heads)
    else:
        if labels is not None:
            raise ValueError(
                "labels name the classes of a head; this model has none "
                f"(include_top=False); received labels={_shown(labels)}")
        if "pre_logits/kernel" in arrays:
            out["pooler_output_size"] = int(arrays["pre_logits/kernel"].shape[1])
            out["pooler_act"] = "tanh"
        state = {k[len("vit."):]: v
                 for k, v in from_official(arrays, heads).items()}
    # The official input: pixels / 255, then (x - 0.5) / 0.5 = [-1, 1].
    side = size if isinstance(size, int) else None
    preprocessor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True, "resample": 2,
        "size": ({"height": side, "width": side} if side else
                 {"height": size[0], "width": size[1]}),
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    os.makedirs(directory, exist_ok=True)
    with atomic.atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp:
        st.save_file(state, tmp, metadata={"format": "pt"})
    atomic.write_json(os.path.join(directory, PREPROCESSOR_FILE),
                      preprocessor)
    # The config last: a folder is a transformers folder once it is there.
    atomic.write_json(os.path.join(directory, CONFIG_FILE), out)
    return os.fspath(directory)


def _label_names(model, labels, num_classes):
    """``labels`` (default: the model's own, else ``LABEL_i``) as a list of
    ``num_classes`` strings."""
    if labels is None:
        labels = getattr(model, "zoo_labels", None)
    if labels is None:
        return [f"LABEL_{i}" for i in range(num_classes)]
    labels = [str(name) for name in labels]
    if len(labels) != num_classes:
        raise ValueError(
            f"labels has {len(labels)} names for a head of "
            f"{num_classes} classes")
    return labels


def from_official(arrays, num_heads):
    """The inverse of :func:`to_official`: official ``.npz`` arrays of a
    class-token ViT with a head -> transformers' ``ViTForImageClassification``
    tensors (contiguous float32)."""
    top = {v: k for k, v in _TOP_PARAMS.items()}
    layer = {v: k for k, v in _LAYER_PARAMS.items()}
    head = {v: k for k, v in _HEAD_PARAMS.items()}
    block = re.compile(r"^Transformer/encoderblock_(\d+)/(.+)$")
    out = {}
    for key, value in arrays.items():
        value = np.asarray(value, dtype="float32")
        if key in head:  # Dense (in, out) -> Linear (out, in); .T of a bias
            out[head[key]] = value.T  # is the bias
            continue
        m = block.match(key)
        if m:
            i, param = m.groups()
            name = layer[param]
            if name.startswith("attention.attention."):
                if value.ndim == 3:  # (D, H, Dh) -> (H*Dh, D)
                    value = value.reshape(value.shape[0], -1).T
                else:  # (H, Dh) -> (H*Dh,)
                    value = value.reshape(-1)
            elif name == "attention.output.dense.weight":
                # (H, Dh, D) -> (D, H*Dh)
                value = value.reshape(-1, value.shape[-1]).T
            elif value.ndim == 2:  # Dense (in, out) -> Linear (out, in)
                value = value.T
            out[f"vit.encoder.layer.{i}.{name}"] = value
            continue
        name = top[key]
        if name == "embeddings.patch_embeddings.projection.weight":
            value = value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
        elif name == "pooler.dense.weight":
            value = value.T
        out["vit." + name] = value
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
