"""transformers' ViT config read as keras_vit's builder arguments
(:func:`architecture`), its parameter names on the model's variables, both
ways (:func:`vit_layout`), and the names and shapes a config implies.
Shared by the reader (:mod:`keras_vit.zoo.transformers.hub`) and the
writer (:mod:`keras_vit.zoo.transformers.writer`).
"""

from __future__ import annotations

import functools
import os

from keras_vit.base.checks import require
from keras_vit.data.normalization import of_model
from keras_vit.zoo import checkpoints, formats
from keras_vit.zoo.layouts import Layout
from keras_vit.zoo.transformers import tables
from keras_vit.zoo.transformers.tables import VIT

PREPROCESSOR_FILE = "preprocessor_config.json"
ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
# transformers' hidden_act -> keras_vit's gelu form ("gelu" is erf's).
GELU_FORMS = {"gelu": "exact", "gelu_new": "tanh",
              "gelu_pytorch_tanh": "tanh"}
HIDDEN_ACTS = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}
# Google's files: transformers' ViTConfig defaults.
DEFAULT_LAYER_NORM_EPS = 1e-12
DEFAULT_HIDDEN_ACT = "gelu"

# Hub model types keras_vit does not read, with the way out where there
# is one.
_OTHER_TYPES = {
    "vit_mae": "ViT-MAE (a masked autoencoder); its encoder is not a "
               "classifier keras_vit reproduces",
    "vit_msn": "ViT-MSN",
    "vit_hybrid": "transformers' BiT hybrid; the official R50+ViT-B/16 "
                  "weights load by name: zoo.load('R50+ViT-B/16')",
    "beit": "BEiT (relative position bias, layer scale)",
    "swin": "Swin",
}


def read_tensors(path, names):
    """The tensors ``names`` of the ``.safetensors`` file ``path`` as NumPy
    arrays, the others left unread; a CheckpointError naming the file for
    one that cannot be read."""
    require("safetensors.numpy", package="safetensors",
            purpose="transformers' weights")
    from safetensors import safe_open

    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            return {name: f.get_tensor(name) for name in names}
    except Exception as e:  # noqa: BLE001 - SafetensorError and kin
        raise checkpoints.CheckpointError(
            f"{os.fspath(path)}: cannot read it as a .safetensors file: "
            f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e


def shown_value(value, limit=80):
    """``repr(value)`` cut to ``limit`` characters, for errors."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def architecture(config, path, header=None):
    """``config`` checked and read as keras_vit's builder arguments
    (``kind``: ``"classifier"`` or ``"model"``, sizes, ``labels``, ...).
    Other model types and architectures, and settings keras_vit lacks, are
    refused by name. ``header`` (tensor name -> entry) tells a config that
    names no architecture which one the file holds."""
    path = os.fspath(path)
    config = formats.check(formats.TRANSFORMERS_CONFIG, config, path)
    model_type = config.get("model_type")
    if model_type != "vit":
        what = _OTHER_TYPES.get(model_type)
        raise formats.fail(
            path, "model_type", f"model_type={shown_value(model_type)} is not "
            "supported" + (f": {what}" if what else "")
            + ". keras_vit reads transformers' ViT (model_type 'vit': "
            f"{' and '.join(ARCHITECTURES)}), SigLIP's image towers "
            "('siglip_vision_model', 'siglip'), DeiT ('deit'), DINOv2 "
            "('dinov2', 'dinov2_with_registers'), DINOv3's ViT "
            "('dinov3_vit'), CLIP's and MetaCLIP 2's image towers "
            "('clip_vision_model', 'clip', 'metaclip_2_vision_model', "
            "'metaclip_2') and AIMv2's ('aimv2_vision_model', 'aimv2'); "
            "timm's repositories of the "
            "same weights load too (hf-hub:timm/vit_*)")
    names = config.get("architectures")
    if names is not None:
        kind = {"ViTForImageClassification": "classifier",
                "ViTModel": "model"}.get(names[0])
        if kind is None:
            raise formats.fail(
                path, "architectures", f"architectures={shown_value(names)} is not"
                f" supported; keras_vit loads {' and '.join(ARCHITECTURES)} "
                "(load the encoder of another one in transformers and save "
                "it as ViTModel: ViTModel.from_pretrained(...)."
                "save_pretrained(dir))")
    else:  # older files: the tensors tell
        kind = "classifier" if any(
            k.startswith("vit.") for k in (header or {})) else "model"
    hidden = config.get("hidden_size", 768)
    heads = config.get("num_attention_heads", 12)
    size = config.get("image_size", 224)
    size = tuple(size) if isinstance(size, tuple) else (size, size)
    patch = config.get("patch_size", 16)
    for field, ok, expected, value in (
            ("num_attention_heads", hidden % heads == 0,
             f"an integer that divides hidden_size={hidden}", heads),
            ("head_dim", config.get("head_dim") in (None, hidden // heads),
             f"null or hidden_size / num_attention_heads = "
             f"{hidden // heads}", config.get("head_dim")),
            ("patch_size", all(s % patch == 0 for s in size),
             f"an integer that divides image_size={list(size)}", patch),
            ("hidden_act", config.get("hidden_act", DEFAULT_HIDDEN_ACT)
             in GELU_FORMS, f"one of {sorted(GELU_FORMS)} (keras_vit's GELU "
             "forms)", config.get("hidden_act")),
            ("qkv_bias", config.get("qkv_bias", True) is True, "true "
             "(keras_vit's attention has query, key and value biases)",
             config.get("qkv_bias")),
            ("pooler_act", kind != "model" or config.get(
                "pooler_act", "tanh") == "tanh",
             "'tanh' (keras_vit's pre_logits)", config.get("pooler_act"))):
        if not ok:
            raise formats.fail(path, field, f"expected {expected}; received "
                               f"{field}={shown_value(value)}")
    return {"kind": kind, "hidden_size": hidden,
            "num_layers": config.get("num_hidden_layers", 12),
            "num_heads": heads, "mlp_dim": config.get("intermediate_size",
                                                      3072),
            "image_size": size[0] if size[0] == size[1] else size,
            "patch_size": patch, "num_channels": config.get("num_channels", 3),
            "layer_norm_epsilon": float(config.get(
                "layer_norm_eps", DEFAULT_LAYER_NORM_EPS)),
            "gelu": GELU_FORMS[config.get("hidden_act", DEFAULT_HIDDEN_ACT)],
            "labels": id2label_names(config, path),
            "representation_size": (config.get("pooler_output_size", hidden)
                                    if kind == "model" else None)}


def id2label_names(config, path):
    """``id2label`` of the transformers config ``config`` (read from
    ``path``) as a list ordered by index, or None for none or
    transformers' placeholders (``LABEL_0``, ``LABEL_1``, ...)."""
    id2label = config.get("id2label")  # checked by the format
    if id2label is None:
        return None
    labels = {}
    for key, name in id2label.items():
        index = int(key) if key.isdecimal() and len(key) < 8 else -1
        if not 0 <= index < len(id2label) or index in labels:
            raise formats.fail(path, f"id2label.{key}", "expected indices "
                               f"0..{len(id2label) - 1}; received "
                               f"{shown_value(key)}: {shown_value(name)}")
        labels[index] = name
    labels = [labels[i] for i in range(len(labels))]
    if not labels or all(name == f"LABEL_{i}" for i, name in enumerate(labels)):
        return None
    return labels


#: The head's tensors in ``ViTForImageClassification``, by the model's
#: variable: outside the ``vit.`` prefix.
HEAD_PARAMS = {"classifier.weight": "head/kernel",
               "classifier.bias": "head/bias"}


def preprocessor(model, size, processor="ViTImageProcessor", resample=2):
    """The ``preprocessor_config.json`` of ``model`` (input ``size``) for
    transformers' ``processor``: resize to it (``resample``: PIL's
    filter), pixels / 255, then (x - mean) / std."""
    normalization = of_model(model)
    rows, cols = (size, size) if isinstance(size, int) else size
    return {
        "image_processor_type": processor,
        "do_resize": True, "resample": resample,
        "size": {"height": rows, "width": cols},
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": list(normalization.mean),
        "image_std": list(normalization.std),
    }


@functools.lru_cache(maxsize=None)
def vit_layout(prefix=""):
    """transformers' ``ViTModel`` tensors (``prefix=""``), or a
    ``ViTForImageClassification``'s (``prefix="vit."``, the head's
    ``classifier`` outside it), onto the model's variables."""
    return Layout("transformers", tables.rules(
        VIT["layer"], VIT["top"], VIT["head"], prefix, VIT["layers"]))


def expected_shapes(arch, num_labels, prefix):
    """transformers' tensor names and shapes for ``arch``: ``prefix`` is
    ``"vit."`` in a ``ViTForImageClassification``, ``""`` in a
    ``ViTModel``."""
    pooler = arch["representation_size"]
    dims = tables.shape_codes(dict(arch, type="vit", pooler=pooler,
                                   options={"num_registers": 0}), num_labels)
    shapes = {k: dims[code] for k, (_, _, code) in VIT["top"].items()
              if pooler is not None or not k.startswith("pooler.")}
    for i in range(arch["num_layers"]):
        shapes.update({f"{VIT['layers']}{i}.{k}": dims[code]
                       for k, (_, _, code) in VIT["layer"].items()})
    shapes = {prefix + k: v for k, v in shapes.items()}
    if num_labels:
        shapes.update({k: dims[code]
                       for k, (_, _, code) in VIT["head"].items()})
    return shapes
