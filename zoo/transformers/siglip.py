"""transformers' SigLIP image towers: ``SiglipVisionModel`` folders
(``model_type`` ``"siglip_vision_model"``) and the image tower of a whole
``SiglipModel`` (``"siglip"``; the text tower is not read), both ways;
and SigLIP2's (``"siglip2_vision_model"``, ``"siglip2"``), NaFlex towers:
the same model with the ``naflex`` option.

A SigLIP tower is the one :class:`~keras_vit.models.VisionTransformer`
with options: no class token, a position table of the patches alone, the
tanh GELU and, with ``vision_use_head``, the attention-pool head
(``classifier="map"``) whose output is transformers' ``pooler_output``:
the model loads with ``num_classes=0``. Without the head it returns the
tokens (``last_hidden_state``).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from keras_vit.base.checks import shown
from keras_vit.zoo import formats, hub_files, layouts
from keras_vit.zoo.layouts import Layout, Rule
from keras_vit.zoo.layouts import torch_module as _linear
from keras_vit.zoo.transformers.tables import FAMILIES, TABLE_RESIZE, rules
from keras_vit.zoo.transformers.layout import (GELU_FORMS, HIDDEN_ACTS,
                                               preprocessor, read_tensors,
                                               shown_value)

#: The model types read here.
SIGLIP_TYPES = ("siglip_vision_model", "siglip", "siglip2_vision_model",
                "siglip2")
#: SigLIP2's: NaFlex towers.
NAFLEX_TYPES = ("siglip2_vision_model", "siglip2")
_ARCHITECTURES = {"siglip_vision_model": "SiglipVisionModel",
                  "siglip": "SiglipModel",
                  "siglip2_vision_model": "Siglip2VisionModel",
                  "siglip2": "Siglip2Model"}
# SiglipVisionConfig's defaults.
_DEFAULTS = dict(hidden_size=768, intermediate_size=3072,
                 num_hidden_layers=12, num_attention_heads=12,
                 num_channels=3, image_size=224, patch_size=16,
                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                 vision_use_head=True)


@functools.lru_cache(maxsize=None)
def layout(prefix="", naflex=False):
    """A SigLIP image tower's tensors (``prefix``: ``"vision_model."`` in
    a whole ``SiglipModel``) on the model's variables. ``naflex``:
    SigLIP2's, whose patch embedding is a Linear over flattened
    patches."""
    h, parts = prefix + "head.", ("query", "key", "value")
    clip = FAMILIES["clip_vision_model"]  # its blocks' names are SigLIP's
    return Layout("transformers", [
        *rules(clip["layer"], {}, {}, prefix, clip["layers"]),
        *_linear("patch_embedding/conv", prefix + "embeddings.patch_embedding",
                 "patch_linear" if naflex else "conv"),
        Rule("position_embedding/pos_embedding",
             prefix + "embeddings.position_embedding.weight", "table"),
        *_linear("encoder_norm", prefix + "post_layernorm", "norm"),
        Rule("pooling/probe", h + "probe"),
        Rule([f"pooling/{p}/kernel" for p in parts],
             h + "attention.in_proj_weight", "linear"),
        Rule([f"pooling/{p}/bias" for p in parts],
             h + "attention.in_proj_bias", "flat"),
        *_linear("pooling/out", h + "attention.out_proj", "linear_out"),
        *_linear("pooling/norm", h + "layernorm", "norm"),
        *_linear("pooling/mlp/dense_0", h + "mlp.fc1"),
        *_linear("pooling/mlp/dense_1", h + "mlp.fc2"),
    ])


def _vision_config(config, path):
    """``(vision settings, field prefix for errors, tensor prefix)`` of a
    SigLIP ``config.json``, the architecture checked."""
    model_type = config["model_type"]
    names = config.get("architectures")
    want = _ARCHITECTURES[model_type]
    if names is not None and names != [want]:
        raise formats.fail(
            path, "architectures", f"architectures={shown_value(names)} is "
            f"not supported for model_type {model_type!r}; keras_vit reads "
            f"{want} (SiglipForImageClassification's mean-pooled classifier "
            "is not read)")
    if model_type in ("siglip_vision_model", "siglip2_vision_model"):
        return config, "", ""
    vision = config.get("vision_config") or {}
    vision = formats.check(formats.TRANSFORMERS_CONFIG, vision, path,
                           "vision_config")
    return vision, "vision_config.", "vision_model."


def architecture(config, path):
    """``config`` (a transformers config of a SigLIP type) read as
    keras_vit's builder facts; settings keras_vit lacks are refused by
    name."""
    config = formats.check(formats.TRANSFORMERS_CONFIG, config, path)
    vision, field, prefix = _vision_config(config, path)
    value = dict(_DEFAULTS, **vision)
    hidden, heads = value["hidden_size"], value["num_attention_heads"]
    naflex = config["model_type"] in NAFLEX_TYPES
    if naflex:  # a square table of num_patches rows
        rows = value.setdefault("num_patches", 256)
        side = int(round(rows ** 0.5)) if isinstance(rows, int) else 0
        if isinstance(rows, bool) or side < 1 or side * side != rows:
            raise formats.fail(
                path, field + "num_patches", "expected a square number (its "
                "table is a square grid); received num_patches="
                f"{shown_value(rows)}")
        value["image_size"] = side * value["patch_size"]
    size, patch = value["image_size"], value["patch_size"]
    if isinstance(size, (list, tuple)):
        size = size[0] if len(set(size)) == 1 else size
    for name, ok, expected in (
            ("num_attention_heads", hidden % heads == 0,
             f"an integer that divides hidden_size={hidden}"),
            ("image_size", isinstance(size, int),
             "one side (SigLIP's images are square)"),
            ("patch_size", isinstance(size, int) and size % patch == 0,
             f"an integer that divides image_size={shown(size)}"),
            ("hidden_act", value["hidden_act"] in GELU_FORMS,
             f"one of {sorted(GELU_FORMS)} (keras_vit's GELU forms)"),
            ("vision_use_head", isinstance(value["vision_use_head"], bool),
             "true or false")):
        if not ok:
            raise formats.fail(path, field + name, f"expected {expected}; "
                               f"received {name}={shown_value(value[name])}")
    return {"hidden_size": hidden, "num_heads": heads,
            "num_layers": value["num_hidden_layers"],
            "mlp_dim": value["intermediate_size"], "image_size": size,
            "patch_size": patch, "num_channels": value["num_channels"],
            "layer_norm_epsilon": float(value["layer_norm_eps"]),
            "gelu": GELU_FORMS[value["hidden_act"]],
            "use_head": value["vision_use_head"], "prefix": prefix,
            "naflex": naflex}


def expected_shapes(arch):
    """transformers' tensor names (with the ``prefix``) and shapes of the
    SigLIP image tower ``arch`` describes."""
    d, m, c, p = (arch["hidden_size"], arch["mlp_dim"], arch["num_channels"],
                  arch["patch_size"])
    tokens = (arch["image_size"] // p) ** 2
    shapes = {"embeddings.patch_embedding.weight": (
        (d, p * p * c) if arch["naflex"] else (d, c, p, p)),
              "embeddings.patch_embedding.bias": (d,),
              "embeddings.position_embedding.weight": (tokens, d),
              "post_layernorm.weight": (d,), "post_layernorm.bias": (d,)}
    dims = {"d": (d,), "m": (m,), "dd": (d, d), "md": (m, d), "dm": (d, m)}
    layer = {k: dims[code] for k, (_, _, code)
             in FAMILIES["clip_vision_model"]["layer"].items()}
    widths = {k[4:]: v for k, v in layer.items() if k.startswith("mlp.")}
    for i in range(arch["num_layers"]):
        shapes.update({f"encoder.layers.{i}.{k}": v
                       for k, v in layer.items()})
    if arch["use_head"]:
        shapes.update({
            "head.probe": (1, 1, d),
            "head.attention.in_proj_weight": (3 * d, d),
            "head.attention.in_proj_bias": (3 * d,),
            "head.attention.out_proj.weight": (d, d),
            "head.attention.out_proj.bias": (d,),
            "head.layernorm.weight": (d,), "head.layernorm.bias": (d,),
            **{f"head.mlp.{k}": v for k, v in widths.items()}})
    return {arch["prefix"] + k: v for k, v in shapes.items()}


def read_checkpoint(config, config_path, path, header, source, *, name=None,
                    sizes=None, input_normalization=None):
    """The :class:`~keras_vit.zoo.build.Checkpoint` of a SigLIP folder:
    ``config`` its ``config.json`` at ``config_path``, ``path`` its
    ``model.safetensors`` with ``header`` (name -> entry), ``source``
    what the caller named."""
    from keras_vit.zoo import build

    if name is not None or sizes:
        raise ValueError(
            f"name={name!r} gives the sizes of transformers' ViT files; a "
            f"SigLIP folder's config.json fixes its own ({config_path})")
    arch = architecture(config, config_path)
    prefix = arch["prefix"]
    found = {k: v for k, v in header.items() if k.startswith(prefix)}
    hub_files.check_names(
        {k: v.get("shape") for k, v in found.items()}, expected_shapes(arch),
        f"{os.fspath(path)}: does not hold the SigLIP image tower its "
        "config describes")
    arrays = read_tensors(path, sorted(found))
    head = arch["use_head"]
    config = {key: arch[key] for key in hub_files.SHAPE_KEYS}
    config.update(classifier="map" if head else "gap", class_token=False,
                  representation_size=None, num_classes=0 if head else 1000,
                  input_normalization=input_normalization,
                  name="siglip2_vision" if arch["naflex"] else "siglip_vision")
    if arch["naflex"]:
        config["naflex"] = True  # and its own resize, SigLIP2's default
    else:
        config["position_resize"] = TABLE_RESIZE
    return build.Checkpoint(
        config, arrays, source_name=repr(os.fspath(path)), head=None,
        layout=layout(prefix, arch["naflex"]),
        include_top=True if head else None,
        tags={"zoo_name": ("SigLIP2 NaFlex " if arch["naflex"] else "SigLIP ")
              + hub_files.zoo_name(arch),
              "zoo_weights": None, "zoo_source": os.fspath(source)})


def is_siglip_model(config):
    """True for a keras_vit model config whose pooling is the attention
    pool."""
    method = (config.get("classifier") if config.get("include_top", True)
              else config.get("pooling"))
    return method == "map"


def unwritable(config):
    """Why a ``SiglipVisionModel`` cannot hold the model of ``config``
    (a keras_vit ViT's ``get_config()`` pooling by attention), or None."""
    from keras_vit.zoo.transformers.family import (differences,
                                                   model_options)

    options = model_options(config)
    # SigLIP's config carries none of the options: it holds the defaults.
    naflex = bool(options.get("naflex"))
    other = differences(None, {"class_token": False, "naflex": naflex, **(
        {"position_resize": "bilinear_aa"} if naflex else {})}, options)
    size = config.get("image_size")
    headless = (not config.get("include_top", True)
                or config.get("num_classes") == 0)
    for bad, what in (
            (not headless, f"a classification head (num_classes="
             f"{config.get('num_classes')}; SiglipVisionModel returns the "
             "pooled embedding: build it with num_classes=0)"),
            (other, "the options " + ", ".join(
                f"{k}={options[k]!r} (SigLIP's: {v!r})"
                for k, v in other.items())),
            (config.get("resnet") is not None, "a ResNet stem (hybrid)"),
            (config.get("representation_size") is not None,
             "a pre_logits layer"),
            (config.get("position_embedding", "learned_1d") != "learned_1d"
             or config.get("position_embedding_placement", "stem") != "stem",
             "a position embedding other than the learned table at the stem"),
            (config.get("gelu", "tanh") not in ("tanh", "exact"),
             f"gelu={config.get('gelu')!r}"),
            (not isinstance(size, int) and len(set(size)) != 1,
             f"non-square images (image_size={shown(size)})"),
            (config.get("return_attention_scores"),
             "attention scores as an output")):
        if bad:
            return what
    return None


def write_files(model, labels=None):
    """``(config.json, preprocessor_config.json, tensors)`` of ``model``
    (a keras_vit ViT :func:`unwritable` accepts) as transformers writes a
    ``SiglipVisionModel``."""
    config = model.get_config()
    reason = unwritable(config)
    if reason is None and labels is not None:
        reason = f"labels name a head's classes (received {shown(labels)})"
    if reason is not None:
        raise ValueError(
            "save_pretrained(layout='transformers') writes a model pooled "
            "by attention as transformers' SiglipVisionModel, which cannot "
            f"hold this model: {reason}")
    size = config["image_size"]
    side = size if isinstance(size, int) else size[0]
    naflex = bool(config.get("naflex"))
    out = {"model_type": "siglip2_vision_model" if naflex
           else "siglip_vision_model",
           "architectures": ["Siglip2VisionModel" if naflex
                             else "SiglipVisionModel"],
           "hidden_size": int(config["hidden_size"]),
           "intermediate_size": int(config["mlp_dim"]),
           "num_hidden_layers": int(config["num_layers"]),
           "num_attention_heads": int(config["num_heads"]),
           "num_channels": int(config.get("num_channels", 3)),
           "patch_size": int(config["patch_size"]),
           **({"num_patches": (side // int(config["patch_size"])) ** 2}
              if naflex else {"image_size": side}),
           "hidden_act": HIDDEN_ACTS[config.get("gelu", "tanh")],
           "layer_norm_eps": float(config.get("layer_norm_epsilon", 1e-6)),
           "attention_dropout": 0.0, "vision_use_head": True,
           "torch_dtype": "float32"}
    processor = preprocessor(model, side, "SiglipImageProcessor", 3)
    if naflex:  # SigLIP2's processor: patches within a budget
        processor = dict(
            processor, image_processor_type="Siglip2ImageProcessor",
            patch_size=int(config["patch_size"]),
            max_num_patches=out["num_patches"], resample=2)
        del processor["size"]
    state = layout(naflex=naflex).write(
        layouts.model_arrays(model, "transformers"))
    return out, processor, {k: np.ascontiguousarray(v, dtype="float32")
                            for k, v in state.items()}
