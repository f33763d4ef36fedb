"""transformers' other ViT-family towers, as tables on one reader: DeiT,
DINOv2 (with registers too), DINOv3's ViT, CLIP's image tower (of a
``"clip_vision_model"`` or a whole ``"clip"`` folder) and AIMv2's. Each is
the one :class:`~keras_vit.models.VisionTransformer` with family options;
what differs is data (:mod:`keras_vit.zoo.transformers.tables`).

DeiT's distillation token is one register token (``num_registers=1``)
where the head reads the class token alone. DINOv2 with registers: the
table row transformers adds to the class token, a constant, is folded into
it. DINOv3's ``pos_embed_shift``, ``pos_embed_jitter`` and
``pos_embed_rescale`` act in training only: not read. AIMv2's
``is_native`` (a sin-cos table of other frequencies) is refused, and so is
``DINOv3ViTBackbone`` (it returns feature maps). A table of another size
is resized as the class's ``interpolate_pos_encoding`` does.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base import geometry
from keras_vit.base import options as options_table
from keras_vit.base.limits import MAX_CLASSES, MAX_HIDDEN
from keras_vit.base.schema import Bool, Int, Number, Object
from keras_vit.zoo import formats, hub_files, layouts
from keras_vit.zoo.transformers.layout import (
    GELU_FORMS, id2label_names, read_tensors, shown_value)
from keras_vit.zoo.transformers.tables import (
    ARCHITECTURES, FAMILIES, TABLE_RESIZE, WHOLE_MODELS, bias_fields,
    bias_rows, block_shapes, dinov2_mlp_dim, expected_shapes, layout,
    rows_of, shape_codes, top_zeros, with_class_options)

#: The model types read here.
FAMILY_TYPES = ("deit", "dinov2", "dinov2_with_registers", "dinov3_vit",
                "clip_vision_model", "clip", "metaclip_2_vision_model",
                "metaclip_2", "aimv2_vision_model", "aimv2")
#: transformers' hidden_act -> keras_vit's gelu (OpenAI CLIP's quick GELU).
GELUS = dict(GELU_FORMS, quick_gelu="quick")

# The settings read beyond transformers' ViT config, typed.
_MORE_FIELDS = Object({
    "mlp_ratio": Number(0, 64, open=True), "layerscale_value": Number(),
    "use_swiglu_ffn": Bool(), "num_register_tokens": Int(0, MAX_HIDDEN),
    "use_gated_mlp": Bool(), "rope_theta": Number(),
    "rms_norm_eps": Number(0, 1, open=True), "use_head": Bool(),
    "is_native": Bool(),
    **dict.fromkeys(("query_bias", "key_bias", "value_bias", "proj_bias",
                     "mlp_bias"), Bool())})


def _classes(model_type, refused=False):
    return [name for name, spec in ARCHITECTURES.items() if spec["type"]
            == model_type and (refused or "refused" not in spec)]


def _architecture_name(config, path, header):
    """The transformers class the folder holds (its ``architectures``,
    else the one whose head the tensors hold, else the headless one),
    refused by name where keras_vit has no counterpart."""
    model_type = config["model_type"]
    names = config.get("architectures")
    if names is None:  # older files: the tensors tell
        classes = _classes(model_type, refused=True)
        names = [next((n for n in classes if set(
            ARCHITECTURES[n].get("head", ())) & set(header)), None) or next(
                n for n in classes if "head" not in ARCHITECTURES[n])]
    spec = ARCHITECTURES.get(names[0], {})
    if spec.get("type") != model_type or "refused" in spec:
        why = spec.get("refused") or ("keras_vit reads " + ", ".join(
            _classes(model_type)))
        raise formats.fail(path, "architectures", f"architectures="
                           f"{shown_value(names)} is not supported for "
                           f"model_type {model_type!r}: {why}")
    return names[0]


def architecture(config, path, header):
    """``config`` (a transformers config of a type in
    :data:`FAMILY_TYPES`) read as keras_vit's builder facts (``class``,
    ``type``, sizes, ``options``, ``labels``, the tensors' ``prefix``,
    ...); settings keras_vit lacks are refused by name. ``header`` (tensor
    name -> entry) tells a config that names no class which one the file
    holds.

    >>> arch = architecture({"model_type": "dinov2", "hidden_size": 32,
    ...     "num_attention_heads": 2, "image_size": 28}, "config.json", {})
    >>> arch["class"], arch["mlp_dim"], arch["patch_size"]
    ('Dinov2Model', 128, 14)
    >>> arch["options"]["layer_scale"], arch["options"]["num_registers"]
    (1.0, 0)
    >>> arch = architecture({"model_type": "dinov2", "hidden_size": 32,
    ...     "num_attention_heads": 2, "image_size": 28,
    ...     "use_swiglu_ffn": True}, "config.json", {})
    >>> arch["options"]["mlp"], arch["mlp_dim"]
    ('swiglu', 88)
    """
    path = os.fspath(path)
    config = formats.check(formats.TRANSFORMERS_CONFIG, config, path)
    vision, field = config, ""
    if config["model_type"] in WHOLE_MODELS:
        vision = formats.check(formats.TRANSFORMERS_CONFIG,
                               config.get("vision_config") or {}, path,
                               "vision_config")
        field = "vision_config."
    formats.check(_MORE_FIELDS, vision, path, field.rstrip(".") or None)
    name = _architecture_name(config, path, header)
    spec = ARCHITECTURES[name]
    family = FAMILIES[spec["type"]]
    defaults = family["defaults"]
    value = dict(defaults, **vision)
    options = with_class_options(options_table.read_fields(
        "transformers", value, defaults), spec)
    biases = family.get("biases", {})
    options.update(bias_rows(biases, value))
    hidden, heads = value["hidden_size"], value["num_attention_heads"]
    size, patch = value["image_size"], value["patch_size"]
    sides = tuple(size) if isinstance(size, tuple) else (size, size)
    dino, clip = spec["type"].startswith("dinov2"), "clip" in spec["type"]
    mlp = value["intermediate_size"]
    swiglu = options["mlp"] == "swiglu"
    if dino:  # DINOv2's MLP: from hidden_size * mlp_ratio
        mlp = dinov2_mlp_dim(hidden, value["mlp_ratio"], swiglu)
    # DINOv2's SwiGLU gates with SiLU whatever hidden_act says.
    gate = family.get("gate") if swiglu else None
    acts = GELUS if not swiglu else gate or (value["hidden_act"],)
    rope = spec["options"].get("rope")
    for key, ok, expected in (
            ("num_attention_heads", hidden % heads == 0,
             f"an integer that divides hidden_size={hidden}"),
            ("head_dim", value.get("head_dim") in (None, hidden // heads),
             f"null or hidden_size / num_attention_heads = "
             f"{hidden // heads}"),
            ("num_attention_heads", not rope or hidden // heads % 4 == 0,
             f"a count that leaves heads of a width divisible by 4 ("
             f"{rope}'s rotary pairs, by rows and columns) at "
             f"hidden_size={hidden}"),
            ("patch_size", all(s % patch == 0 for s in sides),
             f"an integer that divides image_size={list(sides)}"),
            ("image_size", not FAMILIES[spec["type"]].get("square")
             or sides[0] == sides[1],
             f"one side ({name}'s images are square)"),
            ("hidden_act", value["hidden_act"] in acts,
             f"one of {sorted(acts)} (keras_vit's "
             + ("SwiGLU gates with SiLU)" if swiglu else "GELU forms)")),
            ("mlp_ratio", mlp >= 1, "a ratio giving an MLP of at least one "
             f"unit at hidden_size={hidden}"),
            ("qkv_bias", not clip or value.get("qkv_bias", True),
             "true (CLIP's attention has query, key and value biases)"),
            ("layerscale_value", value.get("layerscale_value", 1) > 0,
             "a positive number (the layer scales' initial value)"),
            ("rope_theta", value.get("rope_theta", 1) > 0,
             "a positive number (the rotary embeddings' base period)"),
            ("pooler_act", not spec.get("pooler") or value.get(
                "pooler_act", "tanh") == "tanh",
             "'tanh' (keras_vit's pre_logits)"),
            *((key, value[key] == want, f"{str(want).lower()} ({why})")
              for key, (want, why) in family.get("fixed", {}).items())):
        if not ok:
            raise formats.fail(path, field + key, f"expected {expected}; "
                               f"received {key}={shown_value(value.get(key))}")
    prefix = spec["prefix"]
    if prefix is None:
        prefix = ("vision_model." if any(k.startswith("vision_model.")
                                         for k in header) else "")
    off = sorted({f for row, fields in biases.items() if options[row]
                  for f in fields if not value[f]})
    pool = spec.get("attention_pool")
    return {"class": name, "type": spec["type"], "prefix": prefix,
            "off": off, "attention_pool": bool(pool and value[pool[0]]),
            "hidden_size": hidden, "num_heads": heads, "mlp_dim": mlp,
            "num_layers": value["num_hidden_layers"],
            "image_size": sides[0] if sides[0] == sides[1] else list(sides),
            "patch_size": patch, "num_channels": value["num_channels"],
            "layer_norm_epsilon": float(value[family.get(
                "epsilon", "layer_norm_eps")]),
            "gelu": GELUS.get(value["hidden_act"], "exact"),
            "options": options_table.checked(options),
            "pooler": value.get("pooler_output_size") or hidden,
            "labels": id2label_names(config, path)}


def model_options(config):
    """Every option row's value in ``config`` (a keras_vit ViT's
    ``get_config()``) but those a writer need not hold, ``class_token`` as
    the model has it."""
    options = options_table.as_written(
        {row.name: config.get(row.name, row.default)
         for row in options_table.OPTIONS})
    options["class_token"] = geometry.class_token(config)
    return options


def differences(model_type, fixed, options):
    """The options of ``options`` (:func:`model_options`) that a
    transformers class of ``model_type`` (None: another type) setting the
    builder options ``fixed`` holds at another value, as ``{option: its
    value there}``: what the writer would write, read back.

    >>> options = model_options({"layer_scale": 1.0, "num_registers": 2})
    >>> differences("dinov2", {}, options)
    {'num_registers': 0}
    >>> differences("dinov2_with_registers",
    ...             {"posemb_includes_prefix": False}, options)
    {'posemb_includes_prefix': False}
    """
    family = FAMILIES[model_type] if model_type else {}
    defaults = family.get("defaults", {})
    written = options_table.write_fields("transformers", options, defaults)
    held = dict(options_table.DEFAULTS, class_token=True)
    held.update(options_table.read_fields(
        "transformers", dict(defaults, **written), defaults))
    biases = family.get("biases", {})
    held.update(bias_rows(biases, bias_fields(biases, options)))
    held.update({k: v for k, v in fixed.items() if k in held})
    for row in options_table.OPTIONS:
        field = row.transformers
        name = field and field.named(defaults)
        if (name is not None and written.get(name, 0) is None
                and defaults[name] is not None):
            held[row.name] = field.read(defaults[name])
    return {k: held[k] for k in options if options[k] != held[k]}


def _table_of_patches(arch):
    """Whether ``arch``'s class keeps the patches' table rows only, where
    transformers' table has the class token's row too."""
    return ARCHITECTURES[arch["class"]]["options"].get(
        "posemb_includes_prefix") is False


def _fold_class_row(state, arch):
    """transformers adds a register model's first table row to the class
    token alone (the registers join after): a constant, folded into it
    (``state`` changed in place)."""
    table = arch["prefix"] + "embeddings.position_embeddings"
    cls = arch["prefix"] + "embeddings.cls_token"
    state[cls] = np.asarray(state[cls]) + np.asarray(state[table])[:, :1]
    state[table] = np.asarray(state[table])[:, 1:]


def write(model, arch):
    """The tensors of transformers' ``arch["class"]`` holding ``model``'s
    weights (contiguous float32)."""
    state = layout(arch).write(layouts.model_arrays(model, "transformers"))
    prefix, d = arch["prefix"], arch["hidden_size"]
    if _table_of_patches(arch):  # the class token takes no table row
        table = prefix + "embeddings.position_embeddings"
        state[table] = np.concatenate(
            [np.zeros((1, 1, d), "float32"), state[table]], axis=1)
    for name, (path, _, shape) in rows_of(arch)[1].items():
        if path is None:  # unused in a forward (a mask token): zeros
            state[prefix + name] = np.zeros(shape_codes(arch)[shape],
                                            "float32")
    return {k: np.ascontiguousarray(v, dtype="float32")
            for k, v in state.items()}


def zero_biases(state, arch):
    """The bias fields off in the defaults of ``arch``'s type whose every
    tensor in ``state`` (:func:`write`'s) is zeros, those tensors taken
    out of it: such a field is written off."""
    family = FAMILIES[arch["type"]]
    prefix = arch["prefix"]
    blocks = prefix + family["layers"]
    tensors = {}
    for fields in family.get("biases", {}).values():
        for field, names in fields.items():
            tensors.setdefault(field, set()).update(names)
    off = []
    for field, names in tensors.items():
        keys = [k for k in state for n in names if k == prefix + n
                or (k.startswith(blocks) and k.endswith("." + n))]
        if (keys and family["defaults"][field] is False
                and not any(np.any(state[k]) for k in keys)):
            off.append(field)
            for k in keys:
                del state[k]
    return off


def builder_config(arch, num_labels, has_pooler):
    """The builder arguments of the keras_vit model ``arch`` describes."""
    config = {key: arch[key] for key in hub_files.SHAPE_KEYS}
    config.update(arch["options"])
    config.update(classifier="token", class_token=True,
                  representation_size=None, num_classes=num_labels or 1000,
                  name=arch["type"] + "_transformers",
                  position_resize=FAMILIES[arch["type"]].get(
                      "resize", TABLE_RESIZE))
    config.update(ARCHITECTURES[arch["class"]]["options"])
    if ARCHITECTURES[arch["class"]].get("attention_pool"):
        config.update(dict(classifier="map", num_classes=num_labels or 0)
                      if arch["attention_pool"] else dict(classifier="gap"))
    if ARCHITECTURES[arch["class"]].get("pooler") and has_pooler:
        config.update(representation_size=arch["pooler"], pooling="token")
    return config


def read_checkpoint(config, config_path, path, header, source, *, name=None,
                    sizes=None, input_normalization=None):
    """The :class:`~keras_vit.zoo.build.Checkpoint` of a folder of a type
    in :data:`FAMILY_TYPES`: ``config`` its ``config.json`` at
    ``config_path``, ``path`` its ``model.safetensors`` with ``header``
    (name -> entry), ``source`` what the caller named."""
    from keras_vit.zoo import build

    if name is not None or sizes:
        raise ValueError(
            f"name={name!r} gives the sizes of transformers' ViT files; a "
            f"{config.get('model_type')} folder's config.json fixes its own "
            f"({config_path})")
    arch = architecture(config, config_path, header)
    heads = ARCHITECTURES[arch["class"]].get("head", {})
    num_labels = 0
    if heads:
        entry = header.get(next(iter(heads)))
        shape = entry["shape"] if entry else None
        # Without the head's tensors, the head id2label declares.
        num_labels = (shape[0] if shape and 1 <= shape[0] <= MAX_CLASSES
                      else len(arch["labels"] or config.get("id2label")
                               or ()))
    prefix = arch["prefix"]
    found = header
    if arch["type"] in WHOLE_MODELS:  # a whole model: its image tower only
        found = {k: v for k, v in header.items() if k.startswith(prefix)}
    hub_files.check_names(
        {k: v.get("shape") for k, v in found.items()},
        expected_shapes(arch, header, num_labels),
        f"{os.fspath(path)}: does not hold the transformers {arch['class']} "
        "its config describes", optional=heads)
    labels = (formats.check_labels(arch["labels"], num_labels, config_path,
                                   "id2label") if num_labels else None)
    unused = {prefix + k for k, v in rows_of(arch)[1].items() if v[0] is None}
    arrays = read_tensors(path, sorted(set(found) - unused))
    if _table_of_patches(arch):
        _fold_class_row(arrays, arch)
    blocks = prefix + FAMILIES[arch["type"]]["layers"]
    arrays = layouts.with_zeros(arrays, {
        **{f"{blocks}{i}.{name}": shape for i in range(arch["num_layers"])
           for name, shape in block_shapes(arch)[1].items()},
        **top_zeros(arch)})
    has_pooler = any(k.endswith("pooler.dense.weight") for k in arrays)
    config = builder_config(arch, num_labels, has_pooler)
    config["input_normalization"] = input_normalization
    return build.Checkpoint(
        config, arrays, source_name=repr(os.fspath(path)),
        head=num_labels or None, label_names=labels,
        layout=layout(arch),
        include_top=True if config["num_classes"] == 0 else None,
        tags={"zoo_name": f"{arch['class']} {hub_files.zoo_name(arch)}",
              "zoo_weights": None, "zoo_source": os.fspath(source)})
