"""Writes a keras_vit ViT as Hugging Face transformers writes a
``ViTForImageClassification`` (or a ``ViTModel`` for a model without a
head); a model pooled by attention as a ``SiglipVisionModel``
(:mod:`keras_vit.zoo.transformers.siglip`); a model with the ViT family's
options as the DeiT, DINOv2, DINOv3, CLIP or AIMv2 class that holds it
(:func:`family_class`). The reverse of :mod:`keras_vit.zoo.transformers.hub`.
"""

from __future__ import annotations

import os

from keras_vit.base import options as options_table
from keras_vit.base.checks import shown
from keras_vit.zoo import convert, layouts
from keras_vit.zoo.transformers import family as transformers_family
from keras_vit.zoo.transformers import siglip as transformers_siglip
from keras_vit.zoo.transformers import tables as transformers_tables
from keras_vit.zoo.transformers.layout import (ARCHITECTURES, HIDDEN_ACTS,
                                               PREPROCESSOR_FILE,
                                               preprocessor, vit_layout)
from keras_vit.zoo.hub_files import CONFIG_FILE, WEIGHTS_FILE


def _writable(model, config):
    """``(kind, reason)``: the transformers class that holds ``model``
    (``config``: its ``get_config()``), ``"classifier"`` or ``"model"``,
    or None and the reason none does."""
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


def write(model, directory, labels=None):
    """Writes ``model`` as transformers writes a ``ViTForImageClassification``
    (``config.json``, ``model.safetensors``, ``preprocessor_config.json``)
    that transformers loads with the same logits. ``labels`` (a checked
    list of class names, or None: transformers' ``LABEL_i``) become
    ``id2label``.

    A model without a head (``include_top=False``) is written as a
    ``ViTModel``: its ``pre_logits`` layer, if it has one, is the tanh
    pooler; without one the folder has no pooler.

    Example (transformers itself is not needed to write)::

        import keras_vit
        model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                              num_layers=2, num_heads=4, mlp_dim=64,
                              num_classes=3)
        keras_vit.zoo.save_pretrained(model, "vit-dir", layout="transformers")
    """
    config = model.get_config() if hasattr(model, "get_config") else None
    if isinstance(config, dict) and transformers_siglip.is_siglip_model(
            config) and _pooled_by_siglip(config):
        return _write_folder(directory,
                             *transformers_siglip.write_files(model, labels))
    name = family_class(config) if isinstance(config, dict) else None
    if name is not None:  # DeiT, DINOv2, DINOv3 or CLIP
        return _write_folder(directory,
                             *_family_files(model, config, name, labels))
    kind, reason = _writable(model, config)
    if reason is not None:
        raise ValueError(
            f"save_pretrained(layout='transformers') writes transformers' "
            f"ViTForImageClassification or ViTModel, neither of which can "
            f"hold this model: {reason}"
            + ("" if "VisionTransformer" in reason else
               "; zoo.save_npz writes it"
               if convert.official_refusal(model) is None else
               "; model.save('model.keras') keeps it"))
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
    arrays = layouts.model_arrays(model, "transformers")
    if kind == "classifier":
        _label(out, labels, config)
        state = vit_layout("vit.").write(arrays)
    else:
        if labels is not None:
            raise ValueError(
                "labels name the classes of a head; this model has none "
                f"(include_top=False); received labels={shown(labels)}")
        if "pre_logits/kernel" in arrays:
            out["pooler_output_size"] = int(arrays["pre_logits/kernel"].shape[1])
            out["pooler_act"] = "tanh"
        state = vit_layout().write(arrays)
    return _write_folder(directory, out, preprocessor(model, size), state)


def _label(out, labels, config):
    """``out`` with ``id2label`` and ``label2id`` of ``labels`` (None:
    transformers' own names for unnamed classes)."""
    if labels is None:
        labels = [f"LABEL_{i}" for i in range(int(config["num_classes"]))]
    out["id2label"] = {str(i): name for i, name in enumerate(labels)}
    out["label2id"] = {name: i for i, name in enumerate(labels)}


def _pooled_by_siglip(config):
    """Whether the model of ``config``, pooled by attention, is written as
    SigLIP's image tower: where SigLIP's holds it, or holds no fewer of its
    options than the family's classes with an attention pool."""
    if transformers_siglip.unwritable(config) is None:
        return True
    options = transformers_family.model_options(config)
    siglip = transformers_family.differences(None, {"class_token": False},
                                             options)
    pooled = [_mismatch(spec, _top(config), options, _method(config))
              for spec in transformers_tables.ARCHITECTURES.values()
              if spec.get("attention_pool") and "refused" not in spec]
    return not pooled or len(siglip) <= min(len(bad) for bad in pooled)


def _write_folder(directory, config, preprocessor, state):
    """Writes ``state`` (tensors), ``preprocessor`` and ``config`` into
    ``directory``, each file whole or not at all; returns the folder."""
    from keras_vit.base import atomic
    from keras_vit.base.checks import require

    st = require("safetensors.numpy", package="safetensors",
                 purpose="save_pretrained")
    os.makedirs(directory, exist_ok=True)
    with atomic.atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp:
        st.save_file(state, tmp, metadata={"format": "pt"})
    atomic.write_json(os.path.join(directory, PREPROCESSOR_FILE),
                      preprocessor)
    # The config last: a folder is a transformers folder once it is there.
    atomic.write_json(os.path.join(directory, CONFIG_FILE), config)
    return os.fspath(directory)


# -- DeiT, DINOv2, DINOv3 and CLIP's image tower -------------------------------

_HIDDEN_ACTS = dict(HIDDEN_ACTS, quick="quick_gelu")


def _top(config):
    """What ``config``'s model returns: ``"head"`` (a classifier's
    logits), ``"embedding"`` (``num_classes=0``: the pooled embedding) or
    ``"encoder"`` (``include_top=False``)."""
    if not config.get("include_top", True):
        return "encoder"
    return "embedding" if config.get("num_classes") == 0 else "head"


def _method(config):
    """How ``config``'s model pools: its classifier's method, or
    (``include_top=False``) its pooling."""
    return (config.get("classifier", "token") if _top(config) != "encoder"
            else config.get("pooling"))


def _mismatch(spec, top, options, method):
    """``{what: why}`` for each option, the top (a head or not) and the
    head's pooling (``method``) the class ``spec`` holds otherwise than
    the model."""
    out = {k: f"it holds {k}={v!r}, the model {options[k]!r}"
           for k, v in transformers_family.differences(
               spec["type"], spec["options"], options).items()}
    if ("head" in spec) != (top == "head"):
        out["head"] = ("it holds a classification head, the model none"
                       if "head" in spec else "it holds no classification "
                       "head: build the model with num_classes=0")
    pooled = spec["options"].get("classifier")
    if pooled is not None and top == "head" and method != pooled:
        out["classifier"] = (f"its head reads classifier={pooled!r}, the "
                             f"model's {method!r}")
    return out


def family_class(config):
    """The transformers class (DeiT, DINOv2, DINOv3, CLIP, AIMv2) that
    holds the keras_vit ViT of ``config`` (its ``get_config()``), or None
    for a model without the ViT family's options (ViT's classes hold it);
    a ValueError naming the class nearest to holding it and what it holds
    otherwise, where none does.

    >>> family_class({"hidden_size": 32, "num_heads": 2, "layer_scale": 1.0,
    ...               "num_classes": 0})
    'Dinov2Model'
    """
    options = transformers_family.model_options(config)
    changed = {row.name for row in options_table.OPTIONS
               if row.name in options
               and config.get(row.name, row.default) != row.default}
    if not changed:
        return None
    top = _top(config)
    method = _method(config)
    fits = {name: _mismatch(spec, top, options, method)
            for name, spec in transformers_tables.ARCHITECTURES.items()
            if "refused" not in spec}
    # ViT's classes hold the options' defaults (_writable writes them).
    fits.update({name: _mismatch(dict(type=None, options={}, **head), top,
                                 options, method)
                 for head, name in ((dict(head=True), ARCHITECTURES[False]),
                                    ({}, ARCHITECTURES[True]))})
    name = next((name for name, bad in fits.items() if not bad), None)
    if name in ARCHITECTURES:  # ViT's: _writable's
        return None
    prefix = ("save_pretrained(layout='transformers') writes a model with "
              "the ViT family's options as the transformers class that "
              "holds them; ")
    nowhere = sorted(k for k in changed if all(k in bad for bad in
                                               fits.values()))
    if nowhere:
        raise ValueError(
            prefix + "ViT's, DeiT's, DINOv2's, DINOv3's, CLIP's and AIMv2's "
            f"classes cannot hold this model: the options "
            f"{', '.join(nowhere)} ("
            + ", ".join(f"{k}={options[k]!r}" for k in nowhere) + ")")
    if name is None:
        fewest = min(len(bad) for bad in fits.values())
        raise ValueError(prefix + "the nearest classes cannot hold this "
                         "model: " + ", ".join(
                             f"{name} ({'; '.join(bad.values())})"
                             for name, bad in fits.items()
                             if len(bad) == fewest))
    spec = transformers_tables.ARCHITECTURES[name]
    position = spec["options"].get("position_embedding", "learned_1d")
    placement = config.get("position_embedding_placement", "stem")
    pooler = spec["options"].get("classifier") or (
        "map" if spec.get("attention_pool") else "token")
    size = config.get("image_size")
    checks = (
        (method not in (None, pooler),
         f"{'pooling' if top == 'encoder' else 'classifier'}={method!r} "
         + ("(its pooler reads the class token)" if pooler == "token" else
            "(its pooler pools by attention: classifier='map')")),
        (config.get("representation_size") is not None
         and not spec.get("pooler"), "a pre_logits layer"),
        (config.get("resnet") is not None, "a ResNet stem (hybrid)"),
        (config.get("position_embedding", "learned_1d") != position
         or placement != "stem",
         f"position_embedding={config.get('position_embedding')!r}"
         + (f" at {placement!r}" if placement != "stem" else "")
         + f" (it holds {position!r}" + (
             f" beside rope={options['rope']!r})" if spec["options"].get(
                 "rope") else " at the stem)")),
        (config.get("gelu", "tanh") not in _HIDDEN_ACTS,
         f"gelu={config.get('gelu')!r}"),
        (transformers_tables.FAMILIES[spec["type"]].get("square")
         and isinstance(size, (list, tuple)) and len(set(size)) != 1,
         f"non-square images (image_size={shown(size)})"),
        (config.get("return_attention_scores"),
         "attention scores as an output"))
    for bad, why in checks:
        if bad:
            raise ValueError(prefix + f"{name} cannot hold this model: {why}")
    return name


def _family_files(model, config, name, labels):
    """``(config.json, preprocessor_config.json, tensors)`` of ``model``
    (``config`` its ``get_config()``) as transformers writes ``name``."""
    spec = transformers_tables.ARCHITECTURES[name]
    hidden, mlp = int(config["hidden_size"]), int(config["mlp_dim"])
    size = config["image_size"]
    heads = "head" in spec
    if labels is not None and not heads:
        raise ValueError(
            f"labels name the classes of a head; {name} has none; received "
            f"labels={shown(labels)}")
    out = {"model_type": spec["type"], "architectures": [name],
           "hidden_size": hidden,
           "num_hidden_layers": int(config["num_layers"]),
           "num_attention_heads": int(config["num_heads"]),
           "hidden_act": _HIDDEN_ACTS[config.get("gelu", "tanh")],
           "layer_norm_eps": float(config.get("layer_norm_epsilon", 1e-6)),
           "image_size": (list(size) if isinstance(size, (list, tuple))
                          else size),
           "patch_size": int(config["patch_size"]),
           "num_channels": int(config.get("num_channels", 3)),
           "torch_dtype": "float32"}
    # The family options this type's config carries ...
    family = transformers_tables.FAMILIES[spec["type"]]
    fields = family["defaults"]
    theirs = options_table.write_fields("transformers", config, fields)
    biases = family.get("biases", {})
    theirs.update(transformers_tables.bias_fields(biases, {
        row: config.get(row, options_table.DEFAULTS[row])
        for row in biases}))
    out.update(theirs)
    # ... and as the reader will see them.
    options = transformers_tables.with_class_options(
        options_table.read_fields("transformers", theirs, fields), spec)
    options.update(transformers_tables.bias_rows(biases, theirs))
    out[family.get("epsilon", "layer_norm_eps")] = out.pop("layer_norm_eps")
    out.update({k: want for k, (want, _) in family.get("fixed", {}).items()})
    if family.get("square"):
        out["image_size"] = size if isinstance(size, int) else size[0]
    pool = spec.get("attention_pool")
    method = _method(config)
    if pool:
        out[pool[0]] = method == "map"
    if spec["type"] == "clip_vision_model":
        out.update(intermediate_size=mlp)
    if spec["type"] == "deit":
        out.update(intermediate_size=mlp, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
        if config.get("representation_size") is not None:
            out.update(pooler_output_size=int(config["representation_size"]),
                       pooler_act="tanh")
    elif spec["type"].startswith("dinov2"):
        swiglu = options["mlp"] == "swiglu"
        # transformers 5 types mlp_ratio as an int: the smallest ratio
        # that gives mlp_dim.
        ratio = next((r for r in range(1, 64) if transformers_tables.
                      dinov2_mlp_dim(hidden, r, swiglu) == mlp), None)
        if ratio is None:
            raise ValueError(
                "save_pretrained(layout='transformers') writes DINOv2's MLP "
                "width as hidden_size * mlp_ratio, an integer ratio"
                + (" (SwiGLU: two thirds of it, rounded up to a multiple of "
                   "8)" if swiglu else "")
                + f", which cannot give mlp_dim={mlp} at "
                f"hidden_size={hidden}")
        out.update(mlp_ratio=ratio, use_mask_token=True)
    elif spec["type"] == "dinov3_vit":
        # No coordinates moved in training, as keras_vit trains.
        out.update(intermediate_size=mlp, pos_embed_shift=None,
                   pos_embed_jitter=None, pos_embed_rescale=None)
    elif spec["type"].startswith("aimv2"):
        out.update(intermediate_size=mlp, attention_dropout=0.0)
    if options["mlp"] == "swiglu" and family.get("gate"):
        out["hidden_act"] = family["gate"][0]
    if heads:
        _label(out, labels, config)
    arch = {"type": spec["type"], "class": name, "hidden_size": hidden,
            "mlp_dim": mlp, "num_channels": out["num_channels"],
            "patch_size": out["patch_size"], "image_size": size,
            "prefix": spec["prefix"] or "", "options": options,
            "attention_pool": bool(pool) and method == "map"}
    state = transformers_family.write(model, arch)
    out.update(dict.fromkeys(transformers_family.zero_biases(state, arch),
                             False))
    return out, preprocessor(model, size), state
