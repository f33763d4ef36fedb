"""Writes a keras_vit model of the ViT family as the keras-hub class that
computes it (:data:`keras_vit.zoo.keras_hub.family.MEMBERS`), reached
through :func:`keras_vit.zoo.keras_hub.writer.to_keras_hub`.

The mapping is :mod:`keras_vit.zoo.keras_hub.family`'s table read
backwards: a class's config is made from the model's arguments
(:func:`hub_config`), the reader reads it back, and the class is written
only when what it reads is the model (:func:`problems`). The weights go
where :func:`~keras_vit.zoo.keras_hub.layout.family_rows` says the reader
finds them.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from keras_vit.base import geometry
from keras_vit.base import options as options_table
from keras_vit.base.errors import ConfigError
from keras_vit.data.normalization import of_model
from keras_vit.zoo import h5_files, hub_files, layouts
from keras_vit.zoo.keras_hub.family import MEMBERS, architecture
from keras_vit.zoo.keras_hub.layout import (ACTIVATIONS, family_rows,
                                            task_architecture)

# keras_vit's head activation -> keras-hub's (first name kept).
_ACTIVATION_NAMES = {}
for _hub, _ours in ACTIVATIONS.items():
    _ACTIVATION_NAMES.setdefault(_ours, _hub)
# The arguments of the model's outer shape compared with the reader's.
_SHAPE = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size",
          "num_channels", "image_size", "layer_norm_epsilon", "gelu")


def settings(config):
    """The family options and numerics of a keras_vit model's ``config``,
    as the model resolves them.

    >>> settings({"classifier": "gap"})["class_token"]
    False
    """
    out = {k: config.get(k, v) for k, v in options_table.DEFAULTS.items()}
    out["class_token"] = geometry.class_token(config)
    size = config.get("image_size", 224)
    out.update(
        {k: config.get(k) for k in ("hidden_size", "num_layers", "num_heads",
                                    "mlp_dim", "patch_size")},
        num_channels=config.get("num_channels", 3),
        image_size=tuple(size) if isinstance(size, (list, tuple))
        else (size, size),
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
        gelu=config.get("gelu", "tanh"),
        dropout_rate=config.get("dropout_rate", 0.0),
        attention_dropout_rate=config.get("attention_dropout_rate", 0.0))
    return out


def family_options(config):
    """``["name=value", ...]``: the family options of a keras_vit model's
    ``config`` that keras-hub's ViT lacks (stochastic depth acts in
    training only).

    >>> family_options({"classifier": "token", "layer_scale": 1.0})
    ['layer_scale=1.0']
    """
    ours = settings(config)
    plain = dict(options_table.DEFAULTS, class_token=geometry.class_token(
        dict(config, class_token=None)))
    skip = options_table.unwritten(ours)
    return [f"{k}={ours[k]!r}" for k, v in plain.items()
            if k not in skip and ours[k] != v]


def _targets(targets):
    return (targets,) if isinstance(targets, str) else tuple(targets)


def hub_config(class_name, config):
    """``(config, problems)``: the keras-hub ``class_name``'s config for a
    keras_vit model's ``config`` (the reader's ``fields`` and ``forms``
    inverted), and the model's arguments no value of a field gives (those
    fields left out: keras-hub's defaults).

    >>> hub, _ = hub_config("CLIPVisionEncoder", dict(
    ...     image_size=32, patch_size=8, hidden_size=32, num_layers=1,
    ...     num_heads=2, mlp_dim=64, gelu="quick"))
    >>> hub["intermediate_activation"], hub["image_shape"]
    ('quick_gelu', [32, 32, 3])
    """
    member, ours, problems = MEMBERS[class_name], settings(config), []
    gate_field, gates = member.get("gate", (None, ()))
    rows, cols = ours["image_size"]
    shape = [rows, cols, ours["num_channels"]]
    out = dict(image_shape=shape, patch_size=ours["patch_size"],
               num_layers=ours["num_layers"], num_heads=ours["num_heads"],
               hidden_dim=ours["hidden_size"],
               intermediate_dim=ours["mlp_dim"])
    if "position_embedding_shape" in member["schema"].fields:
        out["position_embedding_shape"] = list(shape)  # read unresized
    for field, targets in member["fields"].items():
        name = _targets(targets)[0]
        value = ours[name]
        if field == gate_field and ours["mlp"] == "swiglu":
            out[field] = gates[0]  # the gated MLP's: SiLU
            continue
        forms = {v: k for k, v in
                 member.get("forms", {}).get(field, {}).items()}
        if forms and value not in forms:
            problems.append(f"{name}={value!r} (it computes {name} in "
                            f"{sorted(forms, key=str)})")
        elif value is None:
            problems.append(f"{name}=None (it computes a {name})")
        else:
            out[field] = forms.get(value, value)
    for row, fields in member.get("biases", {}).items():
        out.update(dict.fromkeys(fields, ours[row]))
    for field, (value, why) in member.get("only", {}).items():
        if field in out and out[field] != value:
            name = _targets(member["fields"].get(field, field))[0]
            problems.append(f"{name}={ours[name]!r} (it computes "
                            f"{name}={value!r}: {why})")
            del out[field]
    if out.get("use_swiglu_ffn") and ours["mlp_dim"]:
        # keras-hub gates two thirds of intermediate_dim, rounded up to 8.
        out["intermediate_dim"] = -(-3 * ours["mlp_dim"] // 2)
    return out, problems


def problems(class_name, config):
    """``(arch, problems)``: what keras-hub's reader reads of
    :func:`hub_config`'s config for ``class_name``, and each argument of
    the keras_vit model's ``config`` it reads otherwise, as ``"name=value
    (it computes ...)"``. No problems: the class computes the model.

    >>> config = dict(image_size=32, patch_size=8, hidden_size=32,
    ...               num_layers=1, num_heads=2, mlp_dim=64, gelu="quick",
    ...               pre_norm=True, patch_bias=False, include_top=False,
    ...               layer_norm_epsilon=1e-5)
    >>> problems("CLIPVisionEncoder", config)[1]
    []
    >>> problems("CLIPVisionEncoder", dict(config, qk_norm=True))[1]
    ['qk_norm=True (it computes qk_norm=False)']
    """
    hub, found = hub_config(class_name, config)
    named = {p.split("=")[0] for p in found}
    try:
        _, arch, _ = architecture(class_name, hub,
                                  f"keras-hub's {class_name} config")
    except ConfigError as e:
        return None, found + [str(e)]
    ours = settings(config)
    # The builder's other arguments the class fixes.
    fixed = {k: v for k, v in arch["options"].items() if k not in ours}
    theirs = dict(options_table.DEFAULTS, **{
        k: v for k, v in arch["options"].items() if k in ours}, **{
        k: arch[k] for k in _SHAPE})
    size = theirs["image_size"]
    theirs["image_size"] = (size, size) if isinstance(size, int) else tuple(
        size)
    if ours["mlp"] == theirs["mlp"] == "swiglu" and config.get(
            "classifier") != "map":
        theirs["gelu"] = ours["gelu"]  # it serves no layer then
    skip = options_table.unwritten(ours)
    found += [f"{k}={ours[k]!r} (it computes {k}={v!r})"
              for k, v in theirs.items() if k not in skip and (
                  k not in named and ours[k] != v)]
    for name, plain in (("resnet", None), ("representation_size", None),
                        ("position_embedding", "learned_1d"),
                        ("position_embedding_placement", "stem"),
                        ("return_attention_scores", False)):
        plain = fixed.get(name, plain)
        if config.get(name, plain) != plain:
            found.append(f"{name}={config[name]!r} (it computes "
                         f"{name}={plain!r})")
    return _head(class_name, config, arch, found)


def _head(class_name, config, arch, found):
    """``arch`` and ``found`` with the model's head checked against what
    the class returns."""
    top = config.get("include_top", True)
    classes = config.get("num_classes")
    task = MEMBERS[class_name].get("task")
    if arch["kind"] == "embedding":
        if not top or classes != 0:
            found.append(f"include_top={top!r}, num_classes={classes!r} (it "
                         "returns its pooled embedding: include_top=True, "
                         "num_classes=0)")
        elif config.get("classifier") != arch["classifier"]:
            found.append(f"classifier={config.get('classifier')!r} (it "
                         f"computes classifier={arch['classifier']!r})")
    elif not top:
        if config.get("pooling") is not None:
            found.append(f"pooling={config['pooling']!r} (it returns every "
                         "token: pooling=None)")
    elif task is None or not classes:
        found.append(f"include_top=True (keras-hub's {class_name} returns "
                     "every token and has no head)")
    elif config.get("classifier") != "token":
        found.append(f"classifier={config.get('classifier')!r} ({task} "
                     "classifies the class token)")
    elif config.get("classifier_activation") not in _ACTIVATION_NAMES:
        found.append(f"classifier_activation="
                     f"{config.get('classifier_activation')!r} (one of "
                     f"{list(_ACTIVATION_NAMES)} converts)")
    else:
        arch = task_architecture(dict(
            num_classes=classes, pooling="token",
            activation=_ACTIVATION_NAMES[config.get("classifier_activation")]),
            arch, f"keras-hub's {task} config")
    return arch, found


def choose(model, vit_lacks):
    """``(class name, hub config, arch)`` of the family member that
    computes ``model``, else a one-line ValueError naming what the closest
    class computes otherwise (keras-hub's ``ViTBackbone`` among them,
    which lacks what ``vit_lacks`` says)."""
    config = model.get_config()
    closest = [("ViTBackbone", list(vit_lacks))]
    for class_name in MEMBERS:
        arch, found = problems(class_name, config)
        if not found:
            return class_name, hub_config(class_name, config)[0], arch
        closest.append((class_name, found))
    class_name, found = min(closest, key=lambda c: len(c[1]))
    shown = "; ".join(found[:3]) + ("; ..." if len(found) > 3 else "")
    raise ValueError(
        f"to_keras_hub: no keras-hub class computes model="
        f"{getattr(model, 'name', model)!r}: the closest, keras-hub's "
        f"{class_name}, differs in {shown}"[:600])


def build(model, class_name, config, arch, keras_hub):
    """``(out, converter)``: the keras-hub ``class_name`` built from
    ``config`` (what :func:`choose` returned) with ``model``'s weights,
    and an image converter of the model's input normalisation. When
    ``arch`` is a classifier, ``out`` is its task, whose preprocessor
    holds the converter (``converter`` None); else the backbone."""
    arrays = layouts.model_arrays(model, "keras-hub")
    config, arch, zeros = _zero_biases_off(class_name, config, arch, arrays)
    backbone = getattr(keras_hub.models, class_name)(
        **config, dtype=dtype_name(model))
    converter = image_converter(
        getattr(keras_hub.layers, MEMBERS[class_name]["converter"]), model,
        config["image_shape"][:2])
    out = backbone
    if arch["kind"] == "classifier":
        task = MEMBERS[class_name]["task"]
        preprocessor = getattr(keras_hub.models, task + "Preprocessor")
        out = getattr(keras_hub.models, task)(
            backbone=backbone, num_classes=arch["num_classes"],
            pooling="token",
            activation=_ACTIVATION_NAMES[arch["classifier_activation"]],
            preprocessor=preprocessor(image_converter=converter))
        converter = None
    where = f"to_keras_hub(model={model.name!r}): keras-hub's {class_name}"
    used = zeros | _fill(backbone, family_rows(class_name, arch), arrays,
                         arch, where, backbone.save_weights,
                         backbone.load_weights)
    if out is not backbone:
        used |= _fill(out, family_rows(class_name, arch, task=True), arrays,
                      arch, where, out.save_task_weights,
                      out.load_task_weights)
    left = sorted(set(arrays) - used)
    if left:
        raise ValueError(f"{where} has no place for the model's weights "
                         f"{left[:6]}{' ...' * (len(left) > 6)}")
    return out, converter


def _zero_biases_off(class_name, config, arch, arrays):
    """``(config, arch, keys)``: ``config`` (and the ``arch`` read of it)
    with each bias field of the class's ``zero_off`` turned off where
    every bias it holds is zeros in ``arrays``, and those biases' keys."""
    keys = set()
    for field in MEMBERS[class_name].get("zero_off", ()):
        if not config.get(field):
            continue
        off = dict(config, **{field: False})
        _, off_arch, _ = architecture(class_name, off, f"keras-hub's "
                                      f"{class_name} config")
        held = {row[0] for row in family_rows(class_name, off_arch).values()}
        dropped = {row[0] for row in family_rows(class_name, arch).values()
                   if row[0] is not None} - held
        if not any(np.any(arrays[k]) for k in dropped if k in arrays):
            config, arch = off, dict(arch, config=off_arch["config"])
            keys |= dropped
    return config, arch, keys


def dtype_name(model):
    """The name of ``model``'s dtype policy, or None: keras-hub's class
    computes in the same."""
    return getattr(getattr(model, "dtype_policy", None), "name", None)


def image_converter(layer, model, image_size):
    """An image converter of the keras-hub class ``layer`` that resizes to
    ``image_size`` and applies ``model``'s input normalisation to [0, 255]
    pixels (as ``x * scale + offset``, per channel)."""
    normalization = of_model(model)
    return layer(image_size=tuple(image_size),
                 scale=np.broadcast_to(normalization.scale, (3,)).tolist(),
                 offset=np.broadcast_to(normalization.offset, (3,)).tolist(),
                 interpolation="bilinear")


def _fill(layer, rows, arrays, arch, where, save, load):
    """Puts the model's ``arrays`` into ``layer`` through a scratch
    ``.weights.h5`` file (``save``, then ``load``), where ``rows`` say the
    reader finds them. Returns the keys used."""
    import h5py

    used = set()
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "model.weights.h5")
        save(path)
        with h5py.File(path, "r+") as f:
            found = {k: tuple(ds.shape) for k, ds in h5_files.h5_datasets(
                f, f"{where}:").items() if k.startswith("layers/")}
            rows = {"layers/" + k: row for k, row in rows.items()}
            hub_files.check_names(found, {k: r[2] for k, r in rows.items()},
                                  f"{where} is not the class keras_vit "
                                  "reads")
            for name, (key, how, shape) in rows.items():
                if key is not None:
                    f[name][...] = _hub_array(key, how, shape, arrays, arch,
                                              where)
                    used.add(key)
        load(path)
    used.discard("position_ids")
    return used


def _hub_array(key, how, shape, arrays, arch, where):
    """The model's array ``key`` as keras-hub stores it (``how``: the
    reader's row, inverted)."""
    if how == "ids":  # the table's rows in order
        return np.arange(int(np.prod(shape))).reshape(shape)
    if key not in arrays:
        raise ValueError(f"{where} holds {key!r}, which the model lacks")
    value = np.asarray(arrays[key], "float32")
    if how == "table":
        value = value[0]
    elif how == "token":
        value = value.reshape(-1)
    elif how is not None and how.startswith("fit:"):  # heads joined
        value = value.reshape(shape) if value.size == np.prod(shape) else value
    elif how in ("gate", "up"):  # one half of the packed Dense
        half = shape[-1]
        value = value[..., :half] if how == "gate" else value[..., half:]
    elif how == "dino" and not arch["options"].get(
            "posemb_includes_prefix", True):
        # The class token already carries the table's class row.
        value = np.concatenate([np.zeros_like(value[:, :1]), value], axis=1)
    if value.shape != tuple(shape):
        raise ValueError(f"{where} keeps {key!r} as {list(shape)}; the "
                         f"model's is {list(value.shape)}")
    return value

