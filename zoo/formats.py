"""Every file format the zoo reads, described once, field by field.

Each description is a :mod:`keras_vit.base.schema` tree the readers check a
file against before they use a value; an error names the file, the field
and the value.

>>> from keras_vit.zoo import formats
>>> try:
...     formats.check(formats.TIMM_CONFIG, {"num_classes": -1}, "config.json")
... except formats.FormatError as e:
...     print(e)
config.json field num_classes: expected an integer in [0, 1000000]; received num_classes=-1
"""

from __future__ import annotations

from keras_vit.base import schema
from keras_vit.base.errors import ConfigError
from keras_vit.base.limits import (MAX_CHANNELS, MAX_CLASSES, MAX_HIDDEN,
                              MAX_IMAGE_SIDE, MAX_LABEL_LENGTH, MAX_LAYERS,
                              MAX_MLP, NPZ_MAX_NDIM)
from keras_vit.base.schema import (Any, Bool, Int, List, Nullable, Number,
                              Object, OneOf, Size, Str)
from keras_vit.zoo.checkpoints import CheckpointError


class FormatError(ConfigError, CheckpointError):
    """A file the zoo reads does not fit its format (``path field f:
    problem``); either ``except`` catches it."""


def check(spec, value, path, field=None):
    """:func:`keras_vit.base.schema.check` raising :class:`FormatError`."""
    return schema.check(spec, value, path, field, error=FormatError)


def read_json(path, what, spec=None):
    """:func:`keras_vit.base.schema.read_json` raising :class:`FormatError`."""
    return schema.read_json(path, what, spec, error=FormatError)


def fail(path, field, problem):
    """The :class:`FormatError` of a check a description cannot state."""
    return FormatError(path, field, problem)


_COUNT = Int(1, MAX_CLASSES)
_LABELS = List(Str(max_len=MAX_LABEL_LENGTH), max_len=MAX_CLASSES,
               expected="a list of strings")
_SIDE = Int(1, MAX_IMAGE_SIDE)
_UNIT_NUMBERS = List(Number(0, 1), lengths={1, 3},
                     expected="a list of 3 numbers in [0, 1]")

# -- safetensors (timm's and transformers' model.safetensors) -------------------

#: The dtypes a tensor may have, and their widths: floats, and (a scalar
#: only) the int64 of a BatchNorm's count of batches seen.
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8}
SAFETENSORS_TENSOR = Object({
    "dtype": Str(sorted(SAFETENSORS_DTYPES)),
    "shape": List(Int(0), max_len=8),
    "data_offsets": List(Int(0), lengths={2}),
}, required=("dtype", "shape", "data_offsets"), extra="refuse",
    what="a tensor entry")
#: The header: tensor name -> entry, and an optional ``__metadata__``.
SAFETENSORS_HEADER = Object(
    {"__metadata__": Object(values=Str(max_len=1 << 16), max_len=1024)},
    values=SAFETENSORS_TENSOR, what="an object of tensors")

# -- timm's config.json ----------------------------------------------------------

#: The ``model_args`` timm records that keras_vit honours.
TIMM_MODEL_ARGS = Object({
    "img_size": Size(MAX_IMAGE_SIDE), "num_classes": Int(0, MAX_CLASSES),
    "global_pool": Str(), "class_token": Bool(),
    "in_chans": Int(1, MAX_CHANNELS), "patch_size": _SIDE,
    "embed_dim": Int(1, MAX_HIDDEN), "depth": Int(1, MAX_LAYERS),
    "num_heads": Int(1, MAX_HIDDEN), "mlp_ratio": Number(0, 64, open=True)})
TIMM_CONFIG = Object({
    "architecture": Str(max_len=256), "num_classes": Int(0, MAX_CLASSES),
    "num_features": Int(1, MAX_HIDDEN), "global_pool": Str(),
    "label_names": _LABELS, "label_descriptions": Any(),
    # keras_vit's own field (timm reads no such key): what the head is.
    "head_type": Str(("classifier", "projection")),
    "model_args": TIMM_MODEL_ARGS,
    "pretrained_cfg": Object({
        "input_size": Size(MAX_IMAGE_SIDE, channels=MAX_CHANNELS),
        "mean": _UNIT_NUMBERS, "std": _UNIT_NUMBERS,
        "num_classes": Int(0, MAX_CLASSES)}),
})

# -- transformers' config.json and preprocessor_config.json ----------------------

TRANSFORMERS_CONFIG = Object({
    "model_type": Str(max_len=256),
    "architectures": List(Str(max_len=256), lengths={1}),
    "hidden_size": Int(1, MAX_HIDDEN),
    "num_attention_heads": Int(1, MAX_HIDDEN),
    "num_hidden_layers": Int(1, MAX_LAYERS),
    "intermediate_size": Int(1, MAX_MLP),
    "image_size": Size(MAX_IMAGE_SIDE), "patch_size": _SIDE,
    "num_channels": Int(1, MAX_CHANNELS),
    "layer_norm_eps": Number(0, 1, open=True),
    "hidden_act": Str(), "qkv_bias": Bool(),
    "head_dim": Nullable(Int(1, MAX_HIDDEN)), "pooler_act": Str(),
    "pooler_output_size": Int(1, MAX_HIDDEN),
    "vision_use_head": Bool(),  # SigLIP's image towers
    "id2label": Object(values=Str(max_len=MAX_LABEL_LENGTH),
                       max_len=MAX_CLASSES,
                       what="an object of index: name pairs"),
    # transformers 5 writes null when only id2label was given.
    "label2id": Nullable(Object(values=Int(0, MAX_CLASSES),
                                max_len=MAX_CLASSES)),
})
TRANSFORMERS_PREPROCESSOR = Object({
    "do_normalize": Bool(), "do_rescale": Bool(),
    "rescale_factor": Number(0, 1, open=True),
    "image_mean": _UNIT_NUMBERS, "image_std": _UNIT_NUMBERS,
})

# -- keras-hub's preset files ----------------------------------------------------

_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "mixed_float16",
                "mixed_bfloat16")
#: A dtype as Keras writes it in a config: a name or a serialised policy.
_DTYPE = Nullable(OneOf(Str(_DTYPE_NAMES), Object({
    "config": Object({"name": Str(_DTYPE_NAMES)}, required=("name",))},
    required=("config",))))
_PATCH = OneOf(_SIDE, List(_SIDE, lengths={2}))
_RATE = Number(0, 1)
KERAS_HUB_BACKBONE = Object({
    "name": Str(), "trainable": Bool(), "dtype": _DTYPE,
    "image_shape": List(Nullable(Int(1, MAX_IMAGE_SIDE)), lengths={3}),
    "patch_size": _PATCH, "num_layers": Int(1, MAX_LAYERS),
    "num_heads": Int(1, MAX_HIDDEN), "hidden_dim": Int(1, MAX_HIDDEN),
    "mlp_dim": Int(1, MAX_MLP), "dropout_rate": _RATE,
    "attention_dropout": _RATE,
    "layer_norm_epsilon": Number(0, 1, open=True),
    "use_mha_bias": Bool(), "use_mlp_bias": Bool(),
    "use_class_token": Bool(), "use_patch_bias": Bool(),
    "data_format": Nullable(Str(("channels_last", "channels_first"))),
}, required=("image_shape", "patch_size", "num_layers", "num_heads",
             "hidden_dim", "mlp_dim"), extra="refuse",
    what="a ViTBackbone config")
#: The outer object of a preset's config.json and task.json.
KERAS_HUB_OBJECT = Object({
    "module": Str(), "class_name": Str(), "registered_name": Str(),
    "config": Object(), "build_config": Any(), "compile_config": Any(),
}, required=("class_name", "config"), what="a serialised keras-hub object")
KERAS_HUB_IMAGE_CONVERTER = Object({
    "scale": OneOf(Number(), List(Number(), lengths={1, 3})),
    "offset": OneOf(Number(), List(Number(), lengths={1, 3})),
}, what="an image converter config")
_CONVERTER = Nullable(Object({"config": KERAS_HUB_IMAGE_CONVERTER},
                             what="a serialised image converter"))
KERAS_HUB_TASK = Object({
    "name": Str(), "trainable": Bool(), "dtype": _DTYPE, "backbone": Any(),
    "preprocessor": Nullable(Object({"config": Object({
        "image_converter": _CONVERTER})}, what="a serialised preprocessor")),
    "num_classes": _COUNT, "pooling": Str(("token", "gap")),
    "intermediate_dim": Nullable(Int(1, MAX_HIDDEN)),
    "activation": Nullable(Str(("linear", "softmax", "sigmoid"))),
    "dropout": Number(0, 1, open=False), "head_dtype": _DTYPE,
}, required=("num_classes",), extra="refuse",
    what="a ViTImageClassifier config")
KERAS_HUB_METADATA = Object({
    "keras_version": Nullable(Str()), "keras_hub_version": Nullable(Str()),
    "parameter_count": Int(0), "date_saved": Str(), "tasks": List(Str()),
    "label_names": Nullable(_LABELS),
}, what="an object of metadata")

# -- a keras_vit .keras archive's config.json ------------------------------------

# A hybrid's ResNet, as keras_vit.models.hybrid.check_resnet takes it
# (num_layers=[]: the root alone).
_RESNET = Nullable(Object({
    "num_layers": List(Int(1, MAX_LAYERS), max_len=8),
    "width_factor": Number(0, 64, open=True), "fold_last_stage": Bool(),
    "standardization": Str(("std", "var")), "std_eps": Number(0, 1),
    "norm_epsilon": Number(0, 1), "variant": Str(("bit", "d"))},
    required=("num_layers",), extra="refuse"))
#: The sizes of a keras_vit model's config (ViT, hybrid, Axial-ViT, BiT).
KERAS_VIT_CONFIG = Object({
    "image_size": Size(MAX_IMAGE_SIDE), "patch_size": Size(MAX_IMAGE_SIDE),
    "hidden_size": Int(1, MAX_HIDDEN), "num_layers": Int(1, MAX_LAYERS),
    "num_heads": Int(1, MAX_HIDDEN), "mlp_dim": Int(1, MAX_MLP),
    "num_classes": Nullable(Int(0, MAX_CLASSES)),
    "num_channels": Int(1, MAX_CHANNELS),
    "representation_size": Nullable(Int(1, MAX_HIDDEN)),
    # The flags the models take (the family's options are checked by
    # their rows, keras_archive._check_options).
    "include_top": Bool(), "include_preprocessing": Bool(),
    "return_attention_scores": Bool(), "dynamic_image_size": Bool(),
    "remat": Bool(), "return_stages": Bool(),
    "label_names": Nullable(_LABELS),
    "resnet": _RESNET, "block_units": List(Int(0, MAX_LAYERS), max_len=8),
    "width_factor": Number(0, 64, open=True),
    "layer_norm_epsilon": Number(0, 1, open=True),
    "head_bias_init": Number(-1e6, 1e6),
}, what="a model config")
KERAS_FILE_CONFIG = Object({
    "module": Str(), "class_name": Str(), "registered_name": Nullable(Str()),
    "config": Any(), "build_config": Any(), "compile_config": Any(),
}, required=("class_name", "config"), what="a serialised Keras model")
#: The keras_vit classes whose config :data:`KERAS_VIT_CONFIG` describes.
KERAS_VIT_CLASSES = ("keras_vit>VisionTransformer",
                     "keras_vit>AxialVisionTransformer",
                     "keras_vit>ResNetV2")

# -- the official .npz -----------------------------------------------------------

#: dtype kinds a weight of an official checkpoint may have: floats.
NPZ_FLOAT_KINDS = "f"


def check_npz(arrays, path):
    """Refuses an official-layout checkpoint ``{key: array}`` holding a
    non-float array or one of absurd rank, naming ``path`` and the key."""
    for key, value in arrays.items():
        dtype = getattr(value, "dtype", None)
        if dtype is not None and dtype.kind not in NPZ_FLOAT_KINDS:
            raise fail(path, key, f"has dtype {dtype.str!r}; an official "
                       "checkpoint holds float weights (an integer array "
                       "would be cast into the model silently)")
        if len(getattr(value, "shape", ())) > NPZ_MAX_NDIM:
            raise fail(path, key, f"has shape {tuple(value.shape)}; no "
                       f"weight has more than {NPZ_MAX_NDIM} axes")
    return arrays


def check_labels(labels, num_classes, path, field):
    """``labels`` (class names from a file) when they name each of
    ``num_classes`` classes once; else a :class:`FormatError`."""
    if labels is None:
        return None
    if num_classes is not None and len(labels) != num_classes:
        raise fail(path, field, f"names {len(labels)} classes for a head of "
                   f"{num_classes}; it must name each class once")
    seen = set()
    for i, name in enumerate(labels):
        if not name.strip() or name in seen:
            raise fail(path, f"{field}[{i}]", f"{name!r} is "
                       f"{'empty' if not name.strip() else 'given twice'}; "
                       "class names are distinct and non-empty")
        seen.add(name)
    return list(labels)

