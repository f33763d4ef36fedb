"""keras-hub's ViT, both ways: a ``keras_hub.models.ViTImageClassifier``
or ``ViTBackbone`` (a live object, or a preset directory its
``save_to_preset`` wrote) into keras_vit, and a keras_vit model out as
one.

Reading: :func:`read` returns the architecture facts and the weights as
a ``{key: array}`` mapping in the official ``.npz`` layout
(:mod:`keras_vit.zoo.convert`); :func:`from_keras_hub` builds the
keras_vit model from them. A preset directory (``config.json``,
``model.weights.h5``, with a task: ``task.json``, ``task.weights.h5``) is
read with ``h5py`` alone, keras-hub need not be installed: the JSON
configs are checked field by field (types, and sizes no ViT comes near,
before anything is allocated), the ``.h5`` files' datasets by name,
shape, dtype and storage (contiguous, inside the file; external and
virtual datasets are refused: they read other files) before their data
is read. Nothing is unpickled and no Keras object is deserialised.

keras-hub's numerics are kept: its LayerNorm epsilon
(``layer_norm_epsilon``, 1e-6 by default) and its GELU, the exact (erf)
form. keras-hub's ``use_*_bias=False`` are zero biases here; its dropout
rates are kept, except the classifier's ``dropout`` before the head,
which keras_vit has no layer for (it acts in training only). What
keras_vit cannot compute the same way is refused by name: pooling the
first patch when there is no class token, the mean over the class token
and the patches, an input range other than the official [-1, 1].

Writing: :func:`to_keras_hub` returns a ``ViTImageClassifier`` (with an
image converter mapping [0, 255] pixels to [-1, 1], so ``predict`` and
``save_to_preset`` work as for keras-hub's own presets), or a
``ViTBackbone`` for a model without a head. keras-hub computes the exact
GELU only, so a model with ``gelu="tanh"`` (the official ``.npz``
numerics) is refused rather than converted with other logits.
"""

from __future__ import annotations

import os
import re

import numpy as np

from keras_vit.errors import ConfigError, require, shown
from keras_vit.limits import (MAX_CHANNELS, MAX_CLASSES, MAX_H5_ENTRIES,
                              MAX_HIDDEN, MAX_IMAGE_SIDE, MAX_LAYERS, MAX_MLP)
from keras_vit.zoo import convert, formats, hub_files, transformers_hub

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
IMAGE_CONVERTER_FILE = "image_converter.json"
METADATA_FILE = "metadata.json"

BACKBONE = "ViTBackbone"
CLASSIFIER = "ViTImageClassifier"


# Every config key keras-hub 0.32 writes; another one may change the
# numbers (a new option), so it is refused rather than ignored.
_BACKBONE_KEYS = {
    "name", "trainable", "dtype", "image_shape", "patch_size", "num_layers",
    "num_heads", "hidden_dim", "mlp_dim", "dropout_rate", "attention_dropout",
    "layer_norm_epsilon", "use_mha_bias", "use_mlp_bias", "use_class_token",
    "use_patch_bias", "data_format"}
_TASK_KEYS = {"name", "trainable", "dtype", "backbone", "preprocessor",
              "num_classes", "pooling", "intermediate_dim", "activation",
              "dropout", "head_dtype"}
_DTYPES = ("float32", "float16", "bfloat16", "float64", "mixed_float16",
           "mixed_bfloat16")
ACTIVATIONS = {None: None, "linear": None, "softmax": "softmax",
                "sigmoid": "sigmoid"}

# keras-hub's variable paths (as a live model names them) -> the official
# layout. Keras' MultiHeadAttention kernels have the official shapes; the
# position table is (N, D) there and (1, N, D) here.
_EMB = "vit_patching_and_embedding/"
TOP = {
    _EMB + "class_token": "cls",
    _EMB + "patch_embedding/kernel": "embedding/kernel",
    _EMB + "patch_embedding/bias": "embedding/bias",
    _EMB + "position_embedding/embeddings": convert.POSEMB_KEY,
    "vit_encoder/ln/gamma": "Transformer/encoder_norm/scale",
    "vit_encoder/ln/beta": "Transformer/encoder_norm/bias",
    "pre_logits/kernel": "pre_logits/kernel",
    "pre_logits/bias": "pre_logits/bias",
    "predictions/kernel": "head/kernel",
    "predictions/bias": "head/bias",
}
_ATT = "MultiHeadDotProductAttention_1/"
BLOCK = {
    "ln_1/gamma": "LayerNorm_0/scale", "ln_1/beta": "LayerNorm_0/bias",
    "mha/query/kernel": _ATT + "query/kernel",
    "mha/query/bias": _ATT + "query/bias",
    "mha/key/kernel": _ATT + "key/kernel", "mha/key/bias": _ATT + "key/bias",
    "mha/value/kernel": _ATT + "value/kernel",
    "mha/value/bias": _ATT + "value/bias",
    "mha/attention_output/kernel": _ATT + "out/kernel",
    "mha/attention_output/bias": _ATT + "out/bias",
    "ln_2/gamma": "LayerNorm_2/scale", "ln_2/beta": "LayerNorm_2/bias",
    "mlp/dense_1/kernel": "MlpBlock_3/Dense_0/kernel",
    "mlp/dense_1/bias": "MlpBlock_3/Dense_0/bias",
    "mlp/dense_2/kernel": "MlpBlock_3/Dense_1/kernel",
    "mlp/dense_2/bias": "MlpBlock_3/Dense_1/bias",
}
_HUB_BLOCK = re.compile(r"^vit_encoder/transformer_block_(\d+)/(.+)$")
# Keras' .weights.h5 names a layer's variables by position (vars/0, ...)
# under the attribute path of the layer, lists by class name: keras-hub
# ViT parameter -> (layer path, variable index).
_H5_BLOCK = {
    "ln_1/gamma": ("layer_norm_1", 0), "ln_1/beta": ("layer_norm_1", 1),
    "ln_2/gamma": ("layer_norm_2", 0), "ln_2/beta": ("layer_norm_2", 1),
    "mlp/dense_1/kernel": ("mlp/dense_1", 0),
    "mlp/dense_1/bias": ("mlp/dense_1", 1),
    "mlp/dense_2/kernel": ("mlp/dense_2", 0),
    "mlp/dense_2/bias": ("mlp/dense_2", 1),
}
for _part, _dense in (("query", "query_dense"), ("key", "key_dense"),
                      ("value", "value_dense"),
                      ("attention_output", "output_dense")):
    _H5_BLOCK[f"mha/{_part}/kernel"] = (f"mha/{_dense}", 0)
    _H5_BLOCK[f"mha/{_part}/bias"] = (f"mha/{_dense}", 1)
_H5_TOP = {
    _EMB + "class_token": ("vi_t_patching_and_embedding", 0),
    _EMB + "patch_embedding/kernel":
        ("vi_t_patching_and_embedding/patch_embedding", 0),
    _EMB + "patch_embedding/bias":
        ("vi_t_patching_and_embedding/patch_embedding", 1),
    _EMB + "position_embedding/embeddings":
        ("vi_t_patching_and_embedding/position_embedding", 0),
    "vit_encoder/ln/gamma": ("vi_t_encoder/layer_norm", 0),
    "vit_encoder/ln/beta": ("vi_t_encoder/layer_norm", 1),
}


# -- recognising a source -----------------------------------------------------

def _class_names(obj):
    return {cls.__name__ for cls in type(obj).__mro__
            if cls.__module__.startswith("keras_hub")}


def is_keras_hub_source(value, *, progress=None):
    """True for what :func:`read` takes: a keras-hub ``ViTBackbone`` or
    ``ViTImageClassifier``, or a directory whose ``config.json`` names a
    keras-hub class (a preset ``save_to_preset`` wrote). ``progress`` is
    unused (nothing is downloaded to tell): the sources' predicates take
    it (:mod:`keras_vit.zoo.sources`).

    >>> is_keras_hub_source("ViT-B/16")
    False
    """
    if _class_names(value) & {BACKBONE, CLASSIFIER}:
        return True
    if not isinstance(value, (str, os.PathLike)):
        return False
    path = os.path.join(os.fspath(value), CONFIG_FILE)
    if not os.path.isfile(path):
        return False
    try:
        config = transformers_hub.read_json(path, "keras-hub config.json")
    except (convert.CheckpointError, OSError):
        return False
    return _is_keras_hub_config(config)


def _is_keras_hub_config(config):
    registered = config.get("registered_name")
    module = config.get("module")
    return (isinstance(registered, str) and registered.startswith(
        "keras_hub>")) or (isinstance(module, str)
                           and module.startswith("keras_hub."))


# -- the configs ----------------------------------------------------------------

def _is_int(value, low, high):
    return (isinstance(value, int) and not isinstance(value, bool)
            and low <= value <= high)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value == value and abs(value) != float("inf"))


def _get(config, path, key, default, ok, expected, prefix=""):
    value = config.get(key, default)
    if not ok(value):
        raise ConfigError(path, prefix + key, f"expected {expected}; "
                          f"received {key}={shown(value)}")
    return value


def _dtype_name(value):
    """A Keras dtype policy as written in a config (a name, or a
    serialised ``DTypePolicy``), as its name; None when unreadable."""
    if value is None or isinstance(value, str):
        return value or "float32"
    if isinstance(value, dict) and isinstance(value.get("config"), dict):
        name = value["config"].get("name")
        return name if isinstance(name, str) else None
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else None


def _known_settings(config, path, known):
    """Refuses a config that is no object, or has settings beyond
    ``known``: a later keras-hub option may change the numbers."""
    if not isinstance(config, dict):
        raise ConfigError(path, "config", "expected a JSON object; received "
                          f"{shown(config)}")
    unknown = sorted(set(config) - known, key=str)
    if unknown:
        raise ConfigError(path, "config", f"has settings keras_vit does not "
                          f"know ({shown(unknown)}); they may change the "
                          "model's numbers, so it is not loaded")


def backbone_architecture(config, path):
    """A keras-hub ``ViTBackbone`` config (``get_config()``, or the
    ``config`` object of a preset's ``config.json``) checked and read as
    keras_vit's facts: ``{"hidden_size", "num_layers", "num_heads",
    "mlp_dim", "image_size", "patch_size", "num_channels",
    "layer_norm_epsilon", "gelu", "dropout_rate", "attention_dropout_rate",
    "class_token", "biases"}``; ``path`` names the source in errors."""
    config = formats.check(formats.KERAS_HUB_BACKBONE, config, path, "config")
    shape = _get(config, path, "image_shape", None, lambda v: isinstance(
        v, (list, tuple)) and len(v) == 3 and all(
            _is_int(s, 1, MAX_IMAGE_SIDE) for s in v[:2])
        and _is_int(v[2], 1, MAX_CHANNELS),
        f"[height, width, channels]: sides in [1, {MAX_IMAGE_SIDE}], "
        f"channels in [1, {MAX_CHANNELS}]")
    data_format = _get(config, path, "data_format", None,
                       lambda v: v in (None, "channels_last",
                                       "channels_first"),
                       "'channels_last' or 'channels_first'")
    if data_format == "channels_first":  # (channels, height, width)
        shape = (shape[1], shape[2], shape[0])
    height, width, channels = (int(s) for s in shape)
    patch = _get(config, path, "patch_size", None, lambda v: _is_int(
        v, 1, MAX_IMAGE_SIDE) or (isinstance(v, (list, tuple)) and len(v) == 2
                                  and all(_is_int(p, 1, MAX_IMAGE_SIDE)
                                          for p in v)),
        "an integer or [height, width] of them")
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    if patch[0] != patch[1]:
        raise ConfigError(path, "patch_size", "keras_vit cuts square "
                          f"patches only; received patch_size={list(patch)}")
    patch = patch[0]
    if height % patch or width % patch:
        raise ConfigError(path, "patch_size", f"expected a divisor of the "
                          f"image sides {[height, width]}; received "
                          f"patch_size={patch}")
    hidden = _get(config, path, "hidden_dim", None,
                  lambda v: _is_int(v, 1, MAX_HIDDEN),
                  f"an integer in [1, {MAX_HIDDEN}]")
    heads = _get(config, path, "num_heads", None,
                 lambda v: _is_int(v, 1, hidden) and hidden % v == 0,
                 f"an integer that divides hidden_dim={hidden}")
    layers = _get(config, path, "num_layers", None,
                  lambda v: _is_int(v, 1, MAX_LAYERS),
                  f"an integer in [1, {MAX_LAYERS}]")
    mlp = _get(config, path, "mlp_dim", None, lambda v: _is_int(v, 1, MAX_MLP),
               f"an integer in [1, {MAX_MLP}]")
    eps = _get(config, path, "layer_norm_epsilon", 1e-6,
               lambda v: _is_number(v) and 0 < v < 1, "a number in (0, 1)")
    rates = [_get(config, path, key, 0.0,
                  lambda v: _is_number(v) and 0 <= v < 1,
                  "a number in [0, 1)")
             for key in ("dropout_rate", "attention_dropout")]
    flags = {key: _get(config, path, key, True, lambda v: isinstance(v, bool),
                       "true or false")
             for key in ("use_mha_bias", "use_mlp_bias", "use_class_token",
                         "use_patch_bias")}
    dtype = _dtype_name(config.get("dtype"))
    if dtype not in _DTYPES:
        raise ConfigError(path, "dtype", f"expected one of {list(_DTYPES)}; "
                          f"received dtype={shown(config.get('dtype'))}")
    return {"hidden_size": hidden, "num_layers": layers, "num_heads": heads,
            "mlp_dim": mlp,
            "image_size": height if height == width else (height, width),
            "patch_size": patch, "num_channels": channels,
            "layer_norm_epsilon": float(eps), "gelu": "exact",
            "dropout_rate": float(rates[0]),
            "attention_dropout_rate": float(rates[1]),
            "class_token": flags["use_class_token"],
            "biases": {"patch": flags["use_patch_bias"],
                       "mha": flags["use_mha_bias"],
                       "mlp": flags["use_mlp_bias"]}}


def task_architecture(config, arch, path):
    """``arch`` (:func:`backbone_architecture`) completed by a keras-hub
    ``ViTImageClassifier`` config: ``kind``, ``classifier``,
    ``num_classes``, ``representation_size``, ``classifier_activation``.
    What keras_vit pools differently is refused by name."""
    config = formats.check(formats.KERAS_HUB_TASK, config, path, "config")
    classes = _get(config, path, "num_classes", None,
                   lambda v: _is_int(v, 1, MAX_CLASSES),
                   f"an integer in [1, {MAX_CLASSES}]")
    pooling = _get(config, path, "pooling", "token",
                   lambda v: v in ("token", "gap"), "'token' or 'gap'")
    if pooling == "token" and not arch["class_token"]:
        raise ConfigError(path, "pooling", "pooling='token' without a class "
                          "token (use_class_token=false) pools the first "
                          "patch, which keras_vit does not do")
    if pooling == "gap" and arch["class_token"]:
        raise ConfigError(path, "pooling", "pooling='gap' with a class token "
                          "averages it with the patches; keras_vit's 'gap' "
                          "models have no class token")
    representation = _get(config, path, "intermediate_dim", None,
                          lambda v: v is None or _is_int(v, 1, MAX_HIDDEN),
                          f"null or an integer in [1, {MAX_HIDDEN}]")
    activation = _get(config, path, "activation", None,
                      lambda v: v in ACTIVATIONS,
                      f"one of {list(ACTIVATIONS)} (the head's activation)")
    _get(config, path, "dropout", 0.0, lambda v: _is_number(v) and 0 <= v < 1,
         "a number in [0, 1)")
    for key in ("dtype", "head_dtype"):
        value = config.get(key)
        if value is not None and _dtype_name(value) not in _DTYPES:
            raise ConfigError(path, key, f"expected one of {list(_DTYPES)}; "
                              f"received {key}={shown(value)}")
    return dict(arch, kind="classifier", num_classes=classes,
                classifier=pooling, representation_size=representation,
                classifier_activation=ACTIVATIONS[activation])


def _backbone_only(arch):
    return dict(arch, kind="backbone", num_classes=None,
                classifier="token" if arch["class_token"] else "gap",
                representation_size=None, classifier_activation=None)


def check_image_converter(config, path):
    """Refuses an image converter that maps pixels other than to the
    official [-1, 1] range (``scale`` 1/127.5, ``offset`` -1, per channel or
    not): keras_vit's ViT takes that range only. keras-hub's ViT presets
    (converted from Google's transformers files: mean 0.5, std 0.5) do."""
    if not isinstance(config, dict):
        raise ConfigError(path, "config", "expected a JSON object; received "
                          f"{shown(config)}")
    problems = []
    for key, want in (("scale", 1 / 127.5), ("offset", -1.0)):
        value = config.get(key)
        values = value if isinstance(value, (list, tuple)) else [value]
        if not (0 < len(values) <= MAX_CHANNELS and all(
                _is_number(v) and abs(v - want) <= 1e-4 * max(1, abs(want))
                for v in values)):
            problems.append(f"{key}={shown(value)}")
    if problems:
        raise ConfigError(
            path, "config", f"the model expects inputs prepared with "
            f"{', '.join(problems)}; keras_vit's ViT takes the official "
            "[-1, 1] range (scale 1/127.5, offset -1) only")


# -- tensors --------------------------------------------------------------------

def expected_shapes(arch):
    """keras-hub's variable paths and shapes for ``arch``."""
    d, m, h = arch["hidden_size"], arch["mlp_dim"], arch["num_heads"]
    p, c = arch["patch_size"], arch["num_channels"]
    size = arch["image_size"]
    rows, cols = (size, size) if isinstance(size, int) else size
    biases = arch["biases"]
    tokens = (rows // p) * (cols // p) + int(arch["class_token"])
    shapes = {_EMB + "patch_embedding/kernel": (p, p, c, d),
              _EMB + "position_embedding/embeddings": (tokens, d),
              "vit_encoder/ln/gamma": (d,), "vit_encoder/ln/beta": (d,)}
    if arch["class_token"]:
        shapes[_EMB + "class_token"] = (1, 1, d)
    if biases["patch"]:
        shapes[_EMB + "patch_embedding/bias"] = (d,)
    block = {"ln_1/gamma": (d,), "ln_1/beta": (d,), "ln_2/gamma": (d,),
             "ln_2/beta": (d,), "mha/attention_output/kernel": (h, d // h, d),
             "mlp/dense_1/kernel": (d, m), "mlp/dense_2/kernel": (m, d)}
    for part in ("query", "key", "value"):
        block[f"mha/{part}/kernel"] = (d, h, d // h)
        if biases["mha"]:
            block[f"mha/{part}/bias"] = (h, d // h)
    if biases["mha"]:
        block["mha/attention_output/bias"] = (d,)
    if biases["mlp"]:
        block.update({"mlp/dense_1/bias": (m,), "mlp/dense_2/bias": (d,)})
    for i in range(arch["num_layers"]):
        shapes.update({f"vit_encoder/transformer_block_{i + 1}/{k}": v
                       for k, v in block.items()})
    if arch["kind"] == "classifier":
        width = arch["representation_size"] or d
        if arch["representation_size"]:
            shapes.update({"pre_logits/kernel": (d, width),
                           "pre_logits/bias": (width,)})
        shapes.update({"predictions/kernel": (width, arch["num_classes"]),
                       "predictions/bias": (arch["num_classes"],)})
    return shapes


def to_official(state, arch):
    """keras-hub's ViT weights (``{variable path: array}``, checked against
    :func:`expected_shapes`) in the official ``.npz`` layout, float32;
    the biases keras-hub was built without are zeros."""
    out = {}
    for name, value in state.items():
        value = np.asarray(value, dtype="float32")
        m = _HUB_BLOCK.match(name)
        if m:
            out[f"Transformer/encoderblock_{int(m.group(1)) - 1}/"
                f"{BLOCK[m.group(2)]}"] = value
        elif name == _EMB + "position_embedding/embeddings":
            out[convert.POSEMB_KEY] = value[None]
        else:
            out[TOP[name]] = value
    d, h = arch["hidden_size"], arch["num_heads"]
    zeros = {"embedding/bias": (d,)}
    for i in range(arch["num_layers"]):
        block = f"Transformer/encoderblock_{i}/"
        for part in ("query", "key", "value"):
            zeros[f"{block}{_ATT}{part}/bias"] = (h, d // h)
        zeros[f"{block}{_ATT}out/bias"] = (d,)
        zeros[f"{block}MlpBlock_3/Dense_0/bias"] = (arch["mlp_dim"],)
        zeros[f"{block}MlpBlock_3/Dense_1/bias"] = (d,)
    for key, shape in zeros.items():
        out.setdefault(key, np.zeros(shape, "float32"))
    return out


def check_names(found, expected, where):
    """One CheckpointError naming ``where`` and listing every missing,
    unexpected and mis-shaped variable (``found``: name -> shape)."""
    transformers_hub.check_names(
        found, expected,
        f"{where}: does not hold the keras-hub ViT its config describes")


# -- a preset directory ---------------------------------------------------------

def _h5_names(arch, task):
    """keras-hub variable path -> the dataset path in a preset's
    ``model.weights.h5`` (``task``: False) or ``task.weights.h5`` (True)."""
    if task:
        if arch["kind"] != "classifier":
            return {}
        layers = (["pre_logits", "predictions"]
                  if arch["representation_size"] else ["predictions"])
        out = {}
        for n, layer in enumerate(layers):  # Keras numbers them in order
            group = "layers/dense" + (f"_{n}" if n else "")
            out[f"{layer}/kernel"] = f"{group}/vars/0"
            out[f"{layer}/bias"] = f"{group}/vars/1"
        return out
    out = {name: f"layers/{layer}/vars/{index}"
           for name, (layer, index) in _H5_TOP.items()}
    for i in range(arch["num_layers"]):
        group = ("layers/vi_t_encoder/encoder_layers/vi_t_encoder_block"
                 + (f"_{i}" if i else ""))
        for param, (layer, index) in _H5_BLOCK.items():
            out[f"vit_encoder/transformer_block_{i + 1}/{param}"] = (
                f"{group}/{layer}/vars/{index}")
    return out


def _read_h5(path, wanted, arch):
    """The datasets of the ``.h5`` file ``path`` named by ``wanted``
    (variable path -> dataset path), checked before any is read: names
    and shapes against the config, dtypes (float16/32/64, bfloat16 as
    Keras marks it), contiguous storage inside the file; external and
    virtual datasets, which read other files, are refused."""
    h5py = require("h5py", purpose="reading a keras-hub preset")
    from keras_vit.errors import special_file

    kind = special_file(path)
    if kind is not None:
        raise convert.CheckpointError(f"{path}: is {kind}, not a regular file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} does not exist; a keras-hub preset "
                                "holds its weights there")
    expected = expected_shapes(arch)
    shapes = {name: expected[name] for name in wanted if name in expected}
    size = os.path.getsize(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise convert.CheckpointError(
            f"{path}: is not an HDF5 file ({' '.join(str(e).split())[:200]})"
        ) from None
    with f:
        found = h5_datasets(f, f"{path}:")
        by_dataset = {v: k for k, v in wanted.items() if k in shapes}
        named = {by_dataset.get(k, k): tuple(ds.shape)
                 for k, ds in found.items()}
        check_names(named, shapes, path)
        problems = []
        for name, key in wanted.items():
            if name not in shapes:
                continue
            ds = found[key]
            dtype = _h5_dtype(ds)
            if dtype is None:
                problems.append(f"{key}: dtype {shown(str(ds.dtype), 40)}")
                continue
            where = h5_storage_problem(ds, size)
            if where:
                problems.append(f"{key}: stored {where}")
        if problems:
            raise convert.CheckpointError(
                f"{path}: has datasets keras_vit does not read: "
                f"{'; '.join(problems[:12])} (Keras writes float arrays, "
                "contiguous, inside the file)")
        return {name: _h5_array(found[key]) for name, key in wanted.items()
                if name in shapes}


def h5_datasets(f, where):
    """``{name: h5py.Dataset}`` of the open HDF5 file ``f`` (a Keras
    weights file), but its optimizer's. Objects only: soft and external
    links are not followed, so a name that is one counts as missing. More
    than :data:`MAX_H5_ENTRIES` entries is a CheckpointError starting with
    ``where``."""
    import h5py

    found, count = {}, [0]

    def visit(name, obj):
        count[0] += 1
        if count[0] > MAX_H5_ENTRIES:
            raise convert.CheckpointError(
                f"{where} has more than {MAX_H5_ENTRIES} entries; a ViT's "
                "weights have a few thousand")
        if isinstance(obj, h5py.Dataset) and not name.startswith(
                "optimizer/"):
            found[name] = obj

    f.visititems(visit)
    return found


def h5_storage_problem(ds, file_size):
    """How ``ds`` is stored when it is not as Keras writes it (contiguous,
    inside the file), else None."""
    if ds.is_virtual:
        return "as a virtual dataset (it reads other files)"
    if ds.external:
        return "in another file"
    if ds.chunks is not None:
        return "in chunks (Keras writes contiguous arrays)"
    offset = ds.id.get_offset()
    nbytes = ds.size * ds.dtype.itemsize
    if nbytes and (offset is None or offset + nbytes > file_size):
        return (f"past the end of the file ({nbytes} bytes at offset "
                f"{offset}, file of {file_size})")
    return None


def _h5_dtype(ds):
    if ds.dtype.kind == "f" and ds.dtype.itemsize in (2, 4, 8):
        return ds.dtype
    if ds.dtype.kind == "V" and ds.dtype.itemsize == 2 and ds.dtype.names \
            is None and ds.attrs.get("dtype") == "bfloat16":
        return "bfloat16"
    return None


def _h5_array(ds):
    if ds.dtype.kind == "V":  # bfloat16: the high half of a float32
        bits = np.frombuffer(ds[()].tobytes(), dtype="<u2")
        return (bits.astype("<u4") << 16).view("<f4").reshape(ds.shape)
    return np.asarray(ds[()], dtype="float32")


def read_preset(directory):
    """``(arch, official arrays)`` of a keras-hub preset directory (see
    :func:`read`)."""
    directory = os.fspath(directory)
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{directory!r} has no {CONFIG_FILE}; a "
                                "keras-hub preset directory has one")
    outer = formats.check(formats.KERAS_HUB_OBJECT, transformers_hub.read_json(
        config_path, "keras-hub config.json"), config_path)
    class_name = outer.get("class_name")
    if class_name != BACKBONE:
        raise ConfigError(
            config_path, "class_name", f"keras_vit reads keras-hub's "
            f"{BACKBONE} (with or without its {CLASSIFIER}); received "
            f"class_name={shown(class_name)}")
    arch = backbone_architecture(outer.get("config"), config_path)
    task_path = os.path.join(directory, TASK_FILE)
    if os.path.isfile(task_path):
        task = formats.check(formats.KERAS_HUB_OBJECT, transformers_hub.read_json(
            task_path, "keras-hub task.json"), task_path)
        if task.get("class_name") != CLASSIFIER:
            raise ConfigError(
                task_path, "class_name", f"keras_vit reads keras-hub's "
                f"{CLASSIFIER}; received class_name="
                f"{shown(task.get('class_name'))} (the backbone alone "
                f"loads without {TASK_FILE})")
        arch = task_architecture(task["config"], arch, task_path)
        # Checked by KERAS_HUB_TASK: objects where they are given.
        pre = task["config"].get("preprocessor") or {}
        converter = pre.get("config", {}).get("image_converter")
        if converter is not None and "config" in converter:
            check_image_converter(converter["config"], task_path)
    else:
        arch = _backbone_only(arch)
    converter_path = os.path.join(directory, IMAGE_CONVERTER_FILE)
    if os.path.isfile(converter_path):
        converter = transformers_hub.read_json(
            converter_path, "keras-hub image_converter.json")
        check_image_converter(converter.get("config"), converter_path)
    state = _read_h5(os.path.join(directory, WEIGHTS_FILE),
                     _h5_names(arch, task=False), arch)
    if arch["kind"] == "classifier":
        state.update(_read_h5(os.path.join(directory, TASK_WEIGHTS_FILE),
                              _h5_names(arch, task=True), arch))
    return arch, to_official(state, arch)


# -- a live keras-hub object ------------------------------------------------------

def read_object(obj):
    """``(arch, official arrays)`` of a keras-hub ``ViTBackbone`` or
    ``ViTImageClassifier`` (see :func:`read`)."""
    import keras

    names = _class_names(obj)
    where = f"{type(obj).__name__} {getattr(obj, 'name', '')!r}"
    if CLASSIFIER in names:
        backbone = obj.backbone
        if BACKBONE not in _class_names(backbone):
            raise ValueError(f"{where}: its backbone is a "
                             f"{type(backbone).__name__}, not a {BACKBONE}")
    elif BACKBONE in names:
        backbone = obj
    else:
        raise ValueError(
            f"from_keras_hub takes a keras-hub {CLASSIFIER} or {BACKBONE}, "
            f"or a preset directory; received {shown(obj)}")
    config = dict(backbone.get_config())
    config["data_format"] = getattr(backbone, "data_format", None)
    arch = backbone_architecture(config, where)
    if backbone is obj:
        arch = _backbone_only(arch)
    else:
        task = {k: v for k, v in obj.get_config().items()
                if k not in ("backbone", "preprocessor")}
        arch = task_architecture(task, arch, where)
        converter = getattr(getattr(obj, "preprocessor", None),
                            "image_converter", None)
        if converter is not None:
            check_image_converter(converter.get_config(), where)
    state = {v.path: keras.ops.convert_to_numpy(
        keras.ops.cast(v.value, "float32")) for v in obj.weights}
    check_names({k: v.shape for k, v in state.items()},
                 expected_shapes(arch), where)
    return arch, to_official(state, arch)


def read(source, *, with_labels=False):
    """``(arch, arrays)`` of a keras-hub ViT: a ``ViTImageClassifier``, a
    ``ViTBackbone`` or a preset directory. ``arch`` holds keras_vit's
    builder facts (``kind``: ``"classifier"`` or ``"backbone"``,
    ``hidden_size``, ``num_layers``, ``num_heads``, ``mlp_dim``,
    ``image_size``, ``patch_size``, ``num_channels``,
    ``layer_norm_epsilon``, ``gelu``, ``classifier``, ``num_classes``,
    ``representation_size``, ``classifier_activation``, the dropout
    rates); ``arrays`` the weights in the official ``.npz`` layout,
    float32. ``with_labels`` adds a third item, the head's class names
    (a preset's ``metadata.json`` ``label_names``, which
    :func:`keras_vit.zoo.save_pretrained` writes there, or a live
    classifier's ``zoo_labels``), or None."""
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isdir(source):
            raise FileNotFoundError(
                f"{os.fspath(source)!r} is not a directory; a keras-hub "
                "preset is one (save_to_preset writes it)")
        arch, arrays = read_preset(source)
        labels = read_labels(source, arch) if with_labels else None
    else:
        arch, arrays = read_object(source)
        labels = getattr(source, "zoo_labels", None)
        labels = list(labels) if labels and arch["kind"] == "classifier" and (
            len(labels) == arch["num_classes"]) else None
    return (arch, arrays, labels) if with_labels else (arch, arrays)


def read_labels(directory, arch):
    """The class names of a preset's head: ``label_names`` in its
    ``metadata.json`` (keras-hub has no field for them; keras-hub ignores
    this one), checked against the head; None when there are none."""
    path = os.path.join(os.fspath(directory), METADATA_FILE)
    if not os.path.isfile(path):
        return None
    metadata = formats.check(formats.KERAS_HUB_METADATA,
                             transformers_hub.read_json(
                                 path, "keras-hub metadata.json"), path)
    labels = metadata.get("label_names")
    if labels is None or arch["kind"] != "classifier":
        return None
    return formats.check_labels(labels, arch["num_classes"], path,
                                "label_names")


# -- building -------------------------------------------------------------------

def checkpoint(arch, arrays, *, source_name=None, tags=None, labels=None):
    """The :class:`~keras_vit.zoo.sources.Checkpoint` of a keras-hub ViT
    (``arch``, ``arrays`` from :func:`read`): a classifier's head and its
    activation, or a backbone's tokens (no head, no pooling: keras-hub's
    backbones return every token); ``labels`` name the head's classes."""
    head = arch["num_classes"] if arch["kind"] == "classifier" else None
    defaults = {"name": "vit_keras_hub",
                "dropout_rate": arch["dropout_rate"],
                "attention_dropout_rate": arch["attention_dropout_rate"]}
    return hub_files.vit_checkpoint(
        arch, arrays, head=head, label_names=labels,
        source_name=source_name, tags=tags,
        head_config={"classifier_activation": arch["classifier_activation"]},
        **defaults)


def _source_name(source):
    return (repr(os.fspath(source)) if isinstance(source, (str, os.PathLike))
            else f"{type(source).__name__} {getattr(source, 'name', '')!r}")


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.sources.Checkpoint` of ``source`` (see
    :func:`read`) that :func:`from_keras_hub` builds. ``name``, a ViT
    name, gives the sizes instead of the config (the weights must then
    fit it); ``progress`` and ``prefer_size`` are unused (nothing is
    downloaded)."""
    arch, arrays, labels = read(source, with_labels=True)
    if name is not None:
        arch = dict(arch, **hub_files.name_sizes(name, "keras-hub's"),
                    **(sizes or {}))
    tags = {}
    if isinstance(source, (str, os.PathLike)):
        tags["zoo_source"] = os.fspath(source)
    return checkpoint(arch, arrays, source_name=_source_name(source),
                      tags=tags, labels=labels)


def from_keras_hub(source, *, image_size=None, num_classes=None, **kwargs):
    """A keras_vit ``VisionTransformer`` computing what the keras-hub ViT
    ``source`` computes: a ``keras_hub.models.ViTImageClassifier`` (its
    logits), a ``ViTBackbone`` (its tokens, ``(batch, tokens, width)``),
    or a preset directory written by ``save_to_preset`` (read without
    keras-hub). The input is the backbone's: [-1, 1] pixels
    (``include_preprocessing=True`` takes [0, 255]). ``image_size``
    resizes the position embeddings; another ``num_classes`` gives a new
    zero head; ``**kwargs`` go to :func:`keras_vit.models.vit`, settled
    as every source's are (:mod:`keras_vit.zoo.settle`). A preset
    directory loads the same way with :func:`keras_vit.zoo.load`.

    Example::

        import keras_hub, keras_vit
        hub = keras_hub.models.ViTImageClassifier.from_preset(preset_dir)
        model = keras_vit.zoo.from_keras_hub(hub)   # or (preset_dir)
    """
    from keras_vit.zoo import settle, sources

    return sources.build_settled(
        read_checkpoint(source), settle.request(
            image_size=image_size, num_classes=num_classes, **kwargs))


def __getattr__(name):
    """The writer's names, reachable here where they were first written
    (:mod:`keras_vit.zoo.keras_hub_writer`)."""
    if name in ("to_keras_hub", "to_hub_names"):
        from keras_vit.zoo import keras_hub_writer

        return getattr(keras_hub_writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
