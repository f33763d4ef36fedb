"""transformers' SigLIP image towers: ``SiglipVisionModel`` folders
(``model_type`` ``"siglip_vision_model"``) and the image tower of a whole
``SiglipModel`` (``"siglip"``: its ``vision_config`` and its
``vision_model.`` tensors; the text tower is not read), both ways.

A SigLIP tower is the one :class:`~keras_vit.models.VisionTransformer`
with options: no class token, a position table of the patches alone, the
patch embedding with a bias, ``post_layernorm`` as the final norm, the
tanh GELU (``gelu_pytorch_tanh``) and, with ``vision_use_head``, the
attention-pool head (``classifier="map"``,
:class:`~keras_vit.layers.AttentionPoolHead`) whose output is
transformers' ``pooler_output``: the model loads with ``num_classes=0``
and returns that embedding. Without the head it returns the tokens
(``last_hidden_state``). Its inputs are normalised with mean 0.5 and std
0.5, the official ViT's.

The config's sizes and the tensors' names and shapes are checked before
anything is allocated, as for transformers' ViT
(:mod:`keras_vit.zoo.transformers.hub`, which hands these folders here);
``zoo.save_pretrained(model, dir, layout="transformers")`` writes a
keras_vit model of that shape back as a ``SiglipVisionModel``.
"""

from __future__ import annotations

import os
import re

import numpy as np

from keras_vit.base.checks import shown
from keras_vit.zoo import convert, formats, hub_files
from keras_vit.zoo.transformers.layout import (GELU_FORMS, HIDDEN_ACTS,
                                               read_tensors, shown_value)

#: The model types read here.
SIGLIP_TYPES = ("siglip_vision_model", "siglip")
_ARCHITECTURES = {"siglip_vision_model": "SiglipVisionModel",
                  "siglip": "SiglipModel"}
# SiglipVisionConfig's defaults.
_DEFAULTS = dict(hidden_size=768, intermediate_size=3072,
                 num_hidden_layers=12, num_attention_heads=12,
                 num_channels=3, image_size=224, patch_size=16,
                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                 vision_use_head=True)

# transformers' SigLIP names -> the official layout's, with how each
# array changes on the way: "heads" (a query/key/value Linear split into
# heads), "out" (an output Linear from heads), "dense" (a Linear
# transposed), None (as it is).
_ATT = "MultiHeadDotProductAttention_1/"
LAYER_PARAMS = {
    "layer_norm1.weight": ("LayerNorm_0/scale", None),
    "layer_norm1.bias": ("LayerNorm_0/bias", None),
    "layer_norm2.weight": ("LayerNorm_2/scale", None),
    "layer_norm2.bias": ("LayerNorm_2/bias", None),
    "self_attn.out_proj.weight": (_ATT + "out/kernel", "out"),
    "self_attn.out_proj.bias": (_ATT + "out/bias", None),
    "mlp.fc1.weight": ("MlpBlock_3/Dense_0/kernel", "dense"),
    "mlp.fc1.bias": ("MlpBlock_3/Dense_0/bias", None),
    "mlp.fc2.weight": ("MlpBlock_3/Dense_1/kernel", "dense"),
    "mlp.fc2.bias": ("MlpBlock_3/Dense_1/bias", None),
}
for _short, _part in (("q", "query"), ("k", "key"), ("v", "value")):
    LAYER_PARAMS[f"self_attn.{_short}_proj.weight"] = (
        f"{_ATT}{_part}/kernel", "heads")
    LAYER_PARAMS[f"self_attn.{_short}_proj.bias"] = (
        f"{_ATT}{_part}/bias", "heads")
_MAP = convert.MAP_HEAD
_MAP_ATT = _MAP + "MultiHeadDotProductAttention_0/"
TOP_PARAMS = {
    "embeddings.patch_embedding.weight": ("embedding/kernel", "conv"),
    "embeddings.patch_embedding.bias": ("embedding/bias", None),
    "embeddings.position_embedding.weight": (convert.POSEMB_KEY, "table"),
    "post_layernorm.weight": ("Transformer/encoder_norm/scale", None),
    "post_layernorm.bias": ("Transformer/encoder_norm/bias", None),
    "head.probe": (_MAP + "probe", None),
    "head.attention.out_proj.weight": (_MAP_ATT + "out/kernel", "out"),
    "head.attention.out_proj.bias": (_MAP_ATT + "out/bias", None),
    "head.layernorm.weight": (_MAP + "LayerNorm_0/scale", None),
    "head.layernorm.bias": (_MAP + "LayerNorm_0/bias", None),
    "head.mlp.fc1.weight": (_MAP + "MlpBlock_0/Dense_0/kernel", "dense"),
    "head.mlp.fc1.bias": (_MAP + "MlpBlock_0/Dense_0/bias", None),
    "head.mlp.fc2.weight": (_MAP + "MlpBlock_0/Dense_1/kernel", "dense"),
    "head.mlp.fc2.bias": (_MAP + "MlpBlock_0/Dense_1/bias", None),
}
# torch's MultiheadAttention stacks the head's query, key and value.
_IN_PROJ = {"head.attention.in_proj_weight": "kernel",
            "head.attention.in_proj_bias": "bias"}
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")


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
    if model_type == "siglip_vision_model":
        return config, "", ""
    vision = config.get("vision_config") or {}
    vision = formats.check(formats.TRANSFORMERS_CONFIG, vision, path,
                           "vision_config")
    return vision, "vision_config.", "vision_model."


def architecture(config, path):
    """``config`` (a checked transformers config of a SigLIP type) read
    as keras_vit's builder facts: sizes, ``image_size``, ``patch_size``,
    ``num_channels``, ``layer_norm_epsilon``, ``gelu``, ``use_head`` and
    the tensors' ``prefix``; settings keras_vit lacks are refused by
    name."""
    config = formats.check(formats.TRANSFORMERS_CONFIG, config, path)
    vision, field, prefix = _vision_config(config, path)
    value = dict(_DEFAULTS, **vision)
    hidden, heads = value["hidden_size"], value["num_attention_heads"]
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
            "use_head": value["vision_use_head"], "prefix": prefix}


def expected_shapes(arch):
    """transformers' tensor names (with the ``prefix``) and shapes of the
    SigLIP image tower ``arch`` describes."""
    d, m, c, p = (arch["hidden_size"], arch["mlp_dim"], arch["num_channels"],
                  arch["patch_size"])
    tokens = (arch["image_size"] // p) ** 2
    shapes = {"embeddings.patch_embedding.weight": (d, c, p, p),
              "embeddings.patch_embedding.bias": (d,),
              "embeddings.position_embedding.weight": (tokens, d),
              "post_layernorm.weight": (d,), "post_layernorm.bias": (d,)}
    widths = {"fc1.weight": (m, d), "fc1.bias": (m,), "fc2.weight": (d, m),
              "fc2.bias": (d,)}
    layer = {name: (d, d) if name.endswith("proj.weight") else (d,)
             for name in LAYER_PARAMS if not name.startswith("mlp.")}
    layer.update({f"mlp.{k}": v for k, v in widths.items()})
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


def _to_official(value, how, num_heads):
    if how == "heads":  # (H*Dh, D) -> (D, H, Dh); (H*Dh,) -> (H, Dh)
        return (value.T.reshape(value.shape[1], num_heads, -1)
                if value.ndim == 2 else value.reshape(num_heads, -1))
    if how == "out":  # (D, H*Dh) -> (H, Dh, D)
        return value.T.reshape(num_heads, -1, value.shape[0])
    if how == "dense":
        return value.T
    if how == "conv":  # OIHW -> HWIO
        return value.transpose(2, 3, 1, 0)
    if how == "table":  # (N, D) -> (1, N, D)
        return value[None]
    return value


def to_official(state, num_heads, prefix=""):
    """Maps SigLIP image-tower tensors (NumPy, names checked by
    :func:`expected_shapes`) onto the official ``.npz`` layout, the head
    onto big_vision's ``MAPHead_0``."""
    out = {}
    for name, value in state.items():
        value = np.asarray(value, dtype="float32")
        name = name[len(prefix):]
        m = _LAYER.match(name)
        if m:
            key, how = LAYER_PARAMS[m.group(2)]
            out[f"Transformer/encoderblock_{m.group(1)}/{key}"] = (
                _to_official(value, how, num_heads))
        elif name in _IN_PROJ:
            for part, w in zip(("query", "key", "value"),
                               np.split(value, 3, axis=0)):
                out[f"{_MAP_ATT}{part}/{_IN_PROJ[name]}"] = _to_official(
                    w, "heads", num_heads)
        else:
            key, how = TOP_PARAMS[name]
            out[key] = _to_official(value, how, num_heads)
    return out


def from_official(arrays):
    """The inverse of :func:`to_official`: official arrays of a SigLIP
    tower (keras_vit's :func:`~keras_vit.zoo.convert.export_arrays`) as a
    ``SiglipVisionModel``'s tensors (contiguous float32)."""
    top = {key: (name, how) for name, (key, how) in TOP_PARAMS.items()}
    layer = {key: (name, how) for name, (key, how) in LAYER_PARAMS.items()}
    out, stacked = {}, {}
    for key, value in arrays.items():
        value = np.asarray(value, dtype="float32")
        if key.startswith(_MAP_ATT) and key.split("/")[-2] in (
                "query", "key", "value"):
            part, kind = key.split("/")[-2:]
            stacked.setdefault(kind, {})[part] = _from_official(value,
                                                                "heads")
            continue
        m = convert.BLOCK_KEY.match(key)
        if m:
            name, how = layer[m.group(2)]
            name = f"encoder.layers.{m.group(1)}.{name}"
        else:
            name, how = top[key]
        out[name] = _from_official(value, how)
    for kind, parts in stacked.items():
        name = {v: k for k, v in _IN_PROJ.items()}[kind]
        out[name] = np.concatenate([parts[p] for p in ("query", "key",
                                                       "value")], axis=0)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _from_official(value, how):
    if how == "heads":  # (D, H, Dh) -> (H*Dh, D); (H, Dh) -> (H*Dh,)
        return (value.reshape(value.shape[0], -1).T if value.ndim == 3
                else value.reshape(-1))
    if how == "out":  # (H, Dh, D) -> (D, H*Dh)
        return value.reshape(-1, value.shape[-1]).T
    if how == "dense":
        return value.T
    if how == "conv":  # HWIO -> OIHW
        return value.transpose(3, 2, 0, 1)
    if how == "table":  # (1, N, D) -> (N, D)
        return value[0]
    return value


def read_checkpoint(config, config_path, path, header, source, *, name=None,
                    sizes=None, input_normalization=None):
    """The :class:`~keras_vit.zoo.build.Checkpoint` of a SigLIP folder:
    ``config`` its (checked) ``config.json`` at ``config_path``, ``path``
    its ``model.safetensors`` with ``header`` (name -> entry), ``source``
    what the caller named. With the head: a model of ``num_classes=0``
    that returns the pooled embedding (another ``num_classes`` puts a new
    zero head on it); without: the tokens."""
    from keras_vit.zoo import build

    if name is not None or sizes:
        raise ValueError(
            f"name={name!r} gives the sizes of transformers' ViT files; a "
            f"SigLIP folder's config.json fixes its own ({config_path})")
    arch = architecture(config, config_path)
    prefix = arch["prefix"]
    # A whole SiglipModel: its image tower's tensors only.
    found = {k: v for k, v in header.items() if k.startswith(prefix)}
    hub_files.check_names(
        {k: v.get("shape") for k, v in found.items()}, expected_shapes(arch),
        f"{os.fspath(path)}: does not hold the SigLIP image tower its "
        "config describes")
    arrays = to_official(read_tensors(path, sorted(found)),
                         arch["num_heads"], prefix)
    head = arch["use_head"]
    config = {key: arch[key] for key in (
        "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
        "layer_norm_epsilon", "gelu", "num_channels", "image_size")}
    config.update(classifier="map" if head else "gap", class_token=False,
                  representation_size=None, num_classes=0 if head else 1000,
                  input_normalization=input_normalization,
                  name="siglip_vision")
    return build.Checkpoint(
        config, arrays, source_name=repr(os.fspath(path)), head=None,
        include_top=True if head else None,
        tags={"zoo_name": "SigLIP " + hub_files.zoo_name(arch),
              "zoo_weights": None, "zoo_source": os.fspath(source)})


def is_siglip_model(config):
    """True for a keras_vit model config whose pooling is the attention
    pool: the writer's only transformers class for it is SigLIP's."""
    method = (config.get("classifier") if config.get("include_top", True)
              else config.get("pooling"))
    return method == "map"


def unwritable(config):
    """Why a ``SiglipVisionModel`` cannot hold the model of ``config``
    (a keras_vit ViT's ``get_config()`` pooling by attention), or None."""
    from keras_vit.models.encoder import FAMILY_DEFAULTS

    options = dict(FAMILY_DEFAULTS, **{k: config[k] for k in FAMILY_DEFAULTS
                                       if k in config})
    size = config.get("image_size")
    headless = (not config.get("include_top", True)
                or config.get("num_classes") == 0)
    for bad, what in (
            (not headless, f"a classification head (num_classes="
             f"{config.get('num_classes')}; SiglipVisionModel returns the "
             "pooled embedding: build it with num_classes=0)"),
            (options["class_token"] or options["num_registers"]
             or options["distilled"], "class, register or distillation "
             "tokens"),
            (config.get("resnet") is not None, "a ResNet stem (hybrid)"),
            (config.get("representation_size") is not None,
             "a pre_logits layer"),
            (config.get("position_embedding", "learned_1d") != "learned_1d"
             or config.get("position_embedding_placement", "stem") != "stem",
             "a position embedding other than the learned table at the stem"),
            (any(options[k] != FAMILY_DEFAULTS[k] for k in (
                "fc_norm", "final_norm", "pre_norm", "layer_scale", "qk_norm",
                "qkv_bias", "proj_bias", "patch_bias", "norm", "patch_norm")),
             "ViT family options SigLIP lacks (fc_norm, pre_norm, layer "
             "scale, q/k norm, RMSNorm, a patch norm, no final norm or "
             "biases)"),
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
    from keras_vit.data.normalization import of_model

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
    out = {"model_type": "siglip_vision_model",
           "architectures": ["SiglipVisionModel"],
           "hidden_size": int(config["hidden_size"]),
           "intermediate_size": int(config["mlp_dim"]),
           "num_hidden_layers": int(config["num_layers"]),
           "num_attention_heads": int(config["num_heads"]),
           "num_channels": int(config.get("num_channels", 3)),
           "image_size": side, "patch_size": int(config["patch_size"]),
           "hidden_act": HIDDEN_ACTS[config.get("gelu", "tanh")],
           "layer_norm_eps": float(config.get("layer_norm_epsilon", 1e-6)),
           "attention_dropout": 0.0, "vision_use_head": True,
           "torch_dtype": "float32"}
    normalization = of_model(model)
    preprocessor = {
        "image_processor_type": "SiglipImageProcessor", "do_resize": True,
        "resample": 3, "size": {"height": side, "width": side},
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": list(normalization.mean),
        "image_std": list(normalization.std)}
    return out, preprocessor, from_official(convert.export_arrays(model))
