"""keras-hub's ViT family beyond ViT read into keras_vit, as one table
(:data:`MEMBERS`): a preset directory that ``save_to_preset`` wrote of a
``DeiTBackbone`` (with or without its ``DeiTImageClassifier``), a
``DINOV2Backbone``, a ``DINOV3Backbone``, a ``SigLIPVisionEncoder`` or
``CLIPVisionEncoder`` alone or inside a ``SigLIPBackbone`` /
``CLIPBackbone`` (the text tower is not read). Each is the one
:class:`~keras_vit.models.VisionTransformer` with family options; what
differs is data.

DeiT's distillation token, which keras-hub never reads, rides as one
register token (``num_registers=1``). DINOv2's table is kept by keras-hub
at ``position_embedding_shape`` and resized to ``image_shape`` when it
loads; keras_vit resizes it once here with the same Keras op, so the model
equals keras-hub's at ``image_shape`` on the same backend. A preset's
``image_converter.json`` is read as the model's ``input_normalization``,
else the family's published one. The same table, read backwards, writes a
model back (:mod:`keras_vit.zoo.keras_hub.family_writer`).
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base import options as options_table
from keras_vit.base.checks import shown
from keras_vit.base.errors import ConfigError
from keras_vit.base.limits import MAX_HIDDEN, MAX_IMAGE_SIDE, MAX_MLP
from keras_vit.base.schema import (Any, Bool, Int, List, Nullable, Number,
                                   Object, Str)
from keras_vit.zoo import formats, h5_files, hub_files, layouts
from keras_vit.zoo.keras_hub.layout import (family_rows, family_shapes,
                                            image_grid)
from keras_vit.zoo.transformers.tables import swiglu_width


# -- the table ----------------------------------------------------------------

_FIELDS = formats.KERAS_HUB_BACKBONE.fields
_RATE = Number(0, 1)
_SQUARE_224 = (_FIELDS["image_shape"], [224, 224, 3])
# DINOv3's bias fields: qkv_bias's three, then proj_bias's two.
_DINO3_BIASES = tuple(f"use_{p}_bias" for p in (
    "query", "key", "value", "proj", "mlp"))


def _config(what, **fields):
    """A member's ``schema`` and ``defaults``: the fields keras-hub 0.32
    writes, and no other; ``fields`` its own, as (check, keras-hub's
    default), beside the sizes every member's has."""
    common = {k: _FIELDS[k] for k in (
        "name", "trainable", "dtype", "image_shape", "patch_size",
        "num_layers", "num_heads", "hidden_dim", "data_format")}
    own = {k: spec for k, (spec, _) in fields.items()}
    return dict(schema=Object(
        dict(common, intermediate_dim=Int(1, MAX_MLP), **own),
        required=("patch_size", "num_layers", "num_heads", "hidden_dim",
                  "intermediate_dim"), extra="refuse", what=what),
        defaults={k: default for k, (_, default) in fields.items()})


def _with_option_fields(members):
    """``members`` with the family options each class's config carries
    added to its ``fields`` (and ``forms``): every option row whose
    keras-hub field its ``defaults`` name."""
    for member in members.values():
        for option in options_table.OPTIONS:
            field = option.keras_hub
            name = field and field.named(member["defaults"])
            if name is not None:
                member["fields"][name] = option.name
                if field.forms is not None:
                    member.setdefault("forms", {})[name] = field.forms
    return members


#: keras-hub class -> ``family``; ``schema`` of its config; keras-hub's
#: ``defaults``; ``fields``: keras-hub field -> keras_vit argument(s),
#: through ``forms`` (value -> value) where given; ``only``: field -> (the
#: value keras_vit computes, why); ``options``: keras_vit arguments the
#: class fixes; ``normalization``: the family's published one; ``gate``:
#: (the field of its MLP's activation, the values its gated MLP computes);
#: ``biases``: option row -> the bias fields that hold it; ``zero_off``:
#: the bias fields the writer turns off where their biases are all zeros;
#: ``kind``: "backbone" or "embedding"; ``task``: its classifier's class;
#: ``converter``: the image converter keras-hub pairs with it.
MEMBERS = _with_option_fields({
    "DeiTBackbone": dict(
        family="DeiT", **_config(
            "a DeiTBackbone config", dropout_rate=(_RATE, 0.0),
            attention_dropout=(_RATE, 0.0),
            layer_norm_epsilon=(_FIELDS["layer_norm_epsilon"], 1e-6),
            use_mha_bias=(Bool(), True)),
        fields={"layer_norm_epsilon": "layer_norm_epsilon",
                "dropout_rate": "dropout_rate",
                "attention_dropout": "attention_dropout_rate"},
        options=dict(gelu="exact", class_token=True, num_registers=1),
        normalization="imagenet", kind="backbone",
        task="DeiTImageClassifier", converter="DeiTImageConverter"),
    "DINOV2Backbone": dict(
        family="DINOv2", **_config(
            "a DINOV2Backbone config", image_shape=_SQUARE_224,
            layer_scale_init_value=(Number(0, 1e6, open=True), 1.0),
            num_register_tokens=(Int(0, MAX_HIDDEN), 0),
            use_mask_token=(Bool(), True), use_swiglu_ffn=(Bool(), False),
            dropout_rate=(_RATE, 0.0), drop_path_rate=(_RATE, 0.0),
            position_embedding_shape=(List(Int(1, MAX_IMAGE_SIDE),
                                           lengths={2, 3}), [518, 518, 3]),
            antialias_in_interpolation=(Bool(), False),
            apply_layernorm=(Bool(), False)),
        fields={"dropout_rate": ("dropout_rate", "attention_dropout_rate")},
        options=dict(gelu="exact", class_token=True, layer_norm_epsilon=1e-6),
        normalization="imagenet", kind="backbone",
        converter="DINOV2ImageConverter"),
    "DINOV3Backbone": dict(
        family="DINOv3", **_config(
            "a DINOV3Backbone config",
            image_shape=(_FIELDS["image_shape"], [518, 518, 3]),
            layer_scale_init_value=(Number(0, 1e6, open=True), 1.0),
            num_register_tokens=(Int(0, MAX_HIDDEN), 4),
            use_mask_token=(Bool(), True),
            hidden_activation=(Str(("gelu", "silu", "swish")), "gelu"),
            use_gated_mlp=(Bool(), False),
            **dict.fromkeys(_DINO3_BIASES, (Bool(), True)),
            attention_dropout=(_RATE, 0.0), drop_path_rate=(_RATE, 0.0),
            layer_norm_eps=(_FIELDS["layer_norm_epsilon"], 1e-5),
            rope_theta=(Number(0, 1e9, open=True), 100.0),
            apply_layernorm=(Bool(), False)),
        fields={"layer_norm_eps": "layer_norm_epsilon",
                "attention_dropout": "attention_dropout_rate",
                "hidden_activation": "gelu"},
        forms={"hidden_activation": {"gelu": "exact"}},
        gate=("hidden_activation", ("silu", "swish")),
        biases={"qkv_bias": _DINO3_BIASES[:3], "proj_bias": _DINO3_BIASES[3:]},
        zero_off=("use_key_bias",),  # Meta's DINOv3 has no key bias
        options=dict(class_token=True, rope="dinov3",
                     position_embedding="none", dynamic_image_size=True),
        normalization="imagenet", kind="backbone",
        converter="DINOV3ImageConverter"),
    "SigLIPVisionEncoder": dict(
        family="SigLIP", **_config(
            "a SigLIPVisionEncoder config", image_shape=_SQUARE_224,
            intermediate_activation=(Str(("gelu_approximate", "gelu")),
                                     "gelu_approximate"),
            layer_norm_epsilon=(_FIELDS["layer_norm_epsilon"], 1e-6)),
        fields={"intermediate_activation": "gelu",
                "layer_norm_epsilon": "layer_norm_epsilon"},
        forms={"intermediate_activation": {"gelu_approximate": "tanh",
                                           "gelu": "exact"}},
        only={"layer_norm_epsilon": (1e-6, "keras-hub's final LayerNorm "
                                     "keeps 1e-6 and keras_vit has one "
                                     "epsilon for every norm")},
        options=dict(class_token=False, classifier="map"),
        normalization=None, kind="embedding",
        converter="SigLIPImageConverter"),
    "CLIPVisionEncoder": dict(
        family="CLIP", **_config(
            "a CLIPVisionEncoder config", image_shape=_SQUARE_224,
            intermediate_activation=(Str(("quick_gelu", "gelu")),
                                     "quick_gelu"),
            intermediate_output_index=(Nullable(Int()), None)),
        fields={"intermediate_activation": "gelu"},
        forms={"intermediate_activation": {"quick_gelu": "quick",
                                           "gelu": "exact"}},
        options=dict(class_token=True, pre_norm=True, patch_bias=False,
                     layer_norm_epsilon=1e-5),
        normalization="clip", kind="backbone", converter="CLIPImageConverter"),
})
#: keras-hub classes holding a member: the field of its config and the h5
#: group of its weights.
CONTAINERS = {
    "SigLIPBackbone": ("SigLIPVisionEncoder",
                       "sig_lip_vision_encoder/layers/"),
    "CLIPBackbone": ("CLIPVisionEncoder", "clip_vision_encoder/layers/"),
}
_CONTAINER = Object({
    "name": Str(), "trainable": Bool(), "dtype": _FIELDS["dtype"],
    "vision_encoder": formats.KERAS_HUB_OBJECT, "text_encoder": Any(),
    "projection_dim": Int(1, MAX_HIDDEN)},
    required=("vision_encoder",), extra="refuse",
    what="a config with a vision_encoder")
#: The classes a preset's ``config.json`` may name here, and with the
#: tasks every keras-hub class read here.
PRESET_CLASSES = (*MEMBERS, *CONTAINERS)
CLASSES = (*PRESET_CLASSES, *(m["task"] for m in MEMBERS.values()
                              if "task" in m))


# -- reading a preset ---------------------------------------------------------

def architecture(class_name, config, path):
    """``(member class, arch, h5 prefix)`` of a preset's ``config.json``
    whose ``class_name`` is one of :data:`PRESET_CLASSES` (``config`` its
    ``config`` object): keras_vit's builder facts, with ``family``,
    ``options`` and ``kind``; what keras_vit lacks is refused naming the
    field.

    >>> _, arch, _ = architecture("DINOV2Backbone", dict(
    ...     patch_size=14, num_layers=12, num_heads=6, hidden_dim=384,
    ...     intermediate_dim=1536, num_register_tokens=4), "config.json")
    >>> arch["image_size"], arch["options"]["num_registers"], arch["gelu"]
    (224, 4, 'exact')
    >>> dino3 = dict(patch_size=16, num_layers=12, num_heads=6,
    ...              hidden_dim=384, intermediate_dim=1536,
    ...              image_shape=[224, 224, 3], use_key_bias=False)
    >>> _, arch, _ = architecture("DINOV3Backbone", dino3, "config.json")
    >>> arch["options"]["rope"], arch["options"]["qkv_bias"]
    ('dinov3', True)
    >>> try:
    ...     architecture("DINOV3Backbone", dict(dino3, use_gated_mlp=True),
    ...                  "config.json")
    ... except ConfigError as e:
    ...     print(str(e)[:70])
    config.json field config.hidden_activation: expected one of ['silu', '
    """
    prefix = ""
    if class_name in CONTAINERS:
        class_name, prefix = CONTAINERS[class_name]
        inner = formats.check(_CONTAINER, config, path, "config")
        inner = inner["vision_encoder"]
        if inner.get("class_name") != class_name:
            raise ConfigError(path, "config.vision_encoder.class_name",
                              f"expected {class_name!r}; received "
                              f"{shown(inner.get('class_name'))}")
        config, where = inner["config"], "config.vision_encoder.config"
    else:
        where = "config"
    member = MEMBERS[class_name]
    config = dict(member["defaults"], **formats.check(
        member["schema"], config, path, where))
    for field, (value, why) in member.get("only", {}).items():
        if config[field] != value:
            raise ConfigError(path, f"{where}.{field}", f"expected "
                              f"{field}={value!r} ({why}); received "
                              f"{field}={shown(config[field])}")
    height, width, channels, patch = image_grid(config, path, where)
    if config.get("use_swiglu_ffn") and swiglu_width(
            config["intermediate_dim"]) < 1:
        raise ConfigError(path, f"{where}.intermediate_dim", "expected at "
                          "least 2 (the SwiGLU MLP keeps two thirds of it); "
                          f"received intermediate_dim="
                          f"{config['intermediate_dim']}")
    options = dict(member["options"])
    for field, targets in member["fields"].items():
        value = member.get("forms", {}).get(field, {}).get(
            config[field], config[field])
        for target in (targets,) if isinstance(targets, str) else targets:
            options[target] = value
    for row, fields in member.get("biases", {}).items():
        options[row] = any(config[f] for f in fields)
    if "gate" in member:
        _check_activation(member, config, options, path, where)
    if options.get("rope") and config["hidden_dim"] // config[
            "num_heads"] % 4:
        raise ConfigError(path, f"{where}.num_heads", "expected a count "
                          "that leaves heads of a width divisible by 4 (the "
                          "rotary pairs, by rows and columns) at hidden_dim="
                          f"{config['hidden_dim']}; received num_heads="
                          f"{config['num_heads']}")
    if options.get("num_registers") and class_name == "DINOV2Backbone":
        options["posemb_includes_prefix"] = False  # registers join after
    arch = {"family": member["family"], "class": class_name,
            "kind": member["kind"],
            "hidden_size": config["hidden_dim"],
            "num_layers": config["num_layers"],
            "num_heads": config["num_heads"],
            "mlp_dim": (swiglu_width(config["intermediate_dim"])
                        if config.get("use_swiglu_ffn")
                        else config["intermediate_dim"]),
            "image_size": height if height == width else [height, width],
            "patch_size": patch, "num_channels": channels,
            "layer_norm_epsilon": float(options.pop("layer_norm_epsilon")),
            "gelu": options.pop("gelu"),
            "dropout_rate": float(options.pop("dropout_rate", 0.0)),
            "attention_dropout_rate": float(options.pop(
                "attention_dropout_rate", 0.0)),
            "classifier": options.pop("classifier", "token"),
            "num_classes": None, "representation_size": None,
            "classifier_activation": None, "options": options,
            "input_normalization": member["normalization"],
            "config": config}
    if class_name == "DINOV2Backbone":
        _check_dino_table(arch, path, where)
    return class_name, arch, prefix


def _check_activation(member, config, options, path, where):
    """A member's MLP activation (its ``gate`` field) checked against its
    MLP: SiLU's gate for the gated MLP, a GELU form of ``forms``
    otherwise; else a ConfigError naming the field."""
    field, gates = member["gate"]
    gated = options["mlp"] == "swiglu"
    allowed = list(gates if gated else member["forms"][field])
    if config[field] not in allowed:
        raise ConfigError(path, f"{where}.{field}", f"expected one of "
                          f"{allowed} with the {'gated' if gated else 'plain'}"
                          f" MLP (keras_vit's "
                          f"{'SwiGLU gates with SiLU' if gated else 'GELU'})"
                          f"; received {field}={shown(config[field])}")
    if gated:
        options["gelu"] = "exact"


def _check_dino_table(arch, path, where):
    """DINOv2's table size (``position_embedding_shape``), checked as
    keras-hub reads it: a square grid, for square images."""
    config, p, size = arch["config"], arch["patch_size"], arch["image_size"]
    pe = list(config["position_embedding_shape"])
    pe = pe[1:3] if config.get("data_format") == "channels_first" else pe[:2]
    if not isinstance(size, int) or len(pe) != 2 or (
            pe[0] // p != pe[1] // p) or pe[0] < p:
        raise ConfigError(path, f"{where}.position_embedding_shape",
                          "expected square images and a square table of at "
                          "least one patch (keras-hub reads both so); "
                          f"received position_embedding_shape="
                          f"{shown(config['position_embedding_shape'])}, "
                          f"image_shape={shown(config['image_shape'])}")
    arch["table_shape"] = pe


def read_h5(path, rows, prefix="", optional=False):
    """``{variable path: (array, how)}`` of the weights ``rows``
    (:func:`~keras_vit.zoo.keras_hub.layout.family_rows`) name in the
    ``.h5`` file ``path``, its datasets under ``layers/`` + ``prefix``
    checked first. ``optional``: rows the file may lack (a head)."""
    group = f"layers/{prefix}"
    f = h5_files.open_h5(path)
    with f:
        found = {k: ds for k, ds in h5_files.h5_datasets(
            f, f"{path}:").items() if k.startswith(group)}
        rows = {group + k: row for k, row in rows.items()}
        hub_files.check_names(
            {k: tuple(ds.shape) for k, ds in found.items()},
            {k: row[2] for k, row in rows.items()},
            f"{path}: does not hold the keras-hub model its config describes",
            optional=rows if optional else ())
        rows = {k: row for k, row in rows.items()
                if k in found and row[0] is not None}
        h5_files.check_datasets(
            path, [(name, found[name]) for name in rows], stored="",
            ids={name for name, row in rows.items() if row[1] == "ids"})
        # The halves of one packed Dense joined, gate first.
        out, halves = {}, {}
        for name, (key, how, _) in rows.items():
            if how == "ids":
                out[key] = np.asarray(found[name][()], "int64"), how
            elif how in ("gate", "up"):
                halves.setdefault(key, {})[how] = h5_files.float_array(
                    found[name])
            else:
                out[key] = h5_files.float_array(found[name]), how
        out.update({key: (np.concatenate([pair["gate"], pair["up"]], -1),
                          None) for key, pair in halves.items()})
        return out


def to_model(state, arch):
    """The arrays :func:`read_h5` read in the model's shapes, float32:
    tables and tokens reshaped, a table's rows picked by its position ids,
    DINOv2's table fitted (:func:`_dino_table`), the biases keras-hub was
    built without (of a bias row that is on) as zeros."""
    out, dino, state = {}, None, dict(state)
    shapes = family_shapes(arch)
    ids = state.pop("position_ids", (None,))[0]
    for key, (value, how) in state.items():
        if how == "table":
            value = value[None] if ids is None else value[ids]
        elif how == "token":
            value = value.reshape(1, 1, -1)
        elif how == "dino":
            dino = key, value
            continue
        elif how is not None and how.startswith("fit:"):
            value = value.reshape(shapes[how[4:]])
        out[key] = value
    if dino is not None:
        out[dino[0]] = _dino_table(dino[1], arch, out)
    options = arch["options"]
    biases = {"qkv_bias": {f"attention/{p}/bias": "hd"
                           for p in ("query", "key", "value")},
              "proj_bias": {"attention/out/bias": "d", "mlp/dense_1/bias": "d",
                            "mlp/dense_0/bias": "g" if options.get(
                                "mlp") == "swiglu" else "m"}}
    return layouts.with_zeros(out, {
        f"encoder_block_{i}/{name}": shapes[code]
        for row, names in biases.items() if options.get(row, True)
        for name, code in names.items() for i in range(arch["num_layers"])})


def _dino_table(table, arch, out):
    """DINOv2's stored table as keras-hub computes it when it loads: the
    grid resized to ``image_shape``'s by ``keras.ops.image.resize`` unless
    the shapes are equal. With registers the class row is folded into the
    class token already in ``out`` and the table covers the patches."""
    config, p = arch["config"], arch["patch_size"]
    size = arch["image_size"]
    cls_row, grid = table[:, :1], table[:, 1:]
    if list(arch["table_shape"]) != [size, size]:
        import keras

        side = arch["table_shape"][0] // p
        grid = keras.ops.convert_to_numpy(keras.ops.image.resize(
            grid.reshape(1, side, side, -1), (size // p, size // p),
            interpolation="bicubic",
            antialias=config["antialias_in_interpolation"],
            data_format="channels_last")).reshape(1, -1, table.shape[-1])
    if not arch["options"].get("posemb_includes_prefix", True):
        out["class_token/cls"] = out["class_token/cls"] + cls_row  # float32,
        # as keras-hub adds it
        return np.asarray(grid, "float32")
    return np.concatenate([cls_row, grid], axis=1).astype("float32")


def read_weights(directory, class_name, arch, prefix):
    """The arrays of a preset of ``class_name`` (``arch``, ``prefix``:
    :func:`architecture`'s) in the folder ``directory`` by the model's
    variable paths, a classifier's head from ``task.weights.h5``."""
    state = read_h5(os.path.join(directory, "model.weights.h5"),
                    family_rows(class_name, arch), prefix)
    if arch["kind"] == "classifier":
        state.update(read_h5(os.path.join(directory, "task.weights.h5"),
                             family_rows(class_name, arch, task=True),
                             optional=True))
    return to_model(state, arch)
