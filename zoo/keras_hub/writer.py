"""Writes a keras_vit model as the keras-hub class that computes it, live
(:func:`to_keras_hub`) or as a preset directory with the model's class
names (:func:`save_preset`). The reverse of
:mod:`keras_vit.zoo.keras_hub.io`: a model without family options is
keras-hub's ViT (``keras_hub.models.ViTImageClassifier`` or
``ViTBackbone``); one with them is written as the family member
:mod:`keras_vit.zoo.keras_hub.family` reads it from (``DeiTBackbone`` and
its ``DeiTImageClassifier``, ``DINOV2Backbone`` with registers and the
SwiGLU MLP, ``SigLIPVisionEncoder``, ``CLIPVisionEncoder``), by that
module's own table read backwards
(:mod:`keras_vit.zoo.keras_hub.family_writer`).

keras-hub's ViT computes the exact GELU only, so a ViT with
``gelu="tanh"`` (the official ``.npz`` numerics) is refused rather than
converted with other logits; a model with a family option no keras-hub
class computes (``qk_norm``, ``fc_norm``, DeiT's two heads, ...) is
refused in one line naming it and the closest class.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base.checks import require
from keras_vit.data.normalization import of_model
from keras_vit.zoo import hub_files, layouts
from keras_vit.zoo.keras_hub import family_writer as keras_hub_family_writer
from keras_vit.zoo.keras_hub import layout as keras_hub_layout
from keras_vit.zoo.keras_hub.layout import VIT


def _config(model):
    """``model``'s config when it is a keras_vit VisionTransformer, else a
    one-line ValueError naming it."""
    config = model.get_config() if hasattr(model, "get_config") else None
    if not isinstance(config, dict) or "hidden_size" not in config or (
            "num_heads" not in config):
        raise ValueError(f"to_keras_hub: keras-hub's ViT cannot hold model="
                         f"{getattr(model, 'name', model)!r}: "
                         f"{type(model).__name__} is not a keras_vit "
                         "VisionTransformer")
    return config


def _unconvertible(config):
    """Every reason keras-hub's ViT cannot compute what the model of
    ``config`` (without family options) computes; none: it can."""
    include_top = config.get("include_top", True)
    checks = (
        (config.get("resnet") is not None, "a ResNet stem (hybrid)"),
        (config.get("position_embedding", "learned_1d") != "learned_1d"
         or config.get("position_embedding_placement", "stem") != "stem",
         "a position embedding other than the learned 1-D table at the "
         "stem"),
        (config.get("gelu", "tanh") != "exact",
         f"gelu={config.get('gelu', 'tanh')!r}: keras-hub's ViT computes "
         "the exact (erf) GELU only, and the tanh form moves logits by about "
         "1e-4; build the model with gelu='exact' (zoo.load(name, "
         "gelu='exact')) to convert it"),
        (not include_top and config.get("representation_size") is not None,
         "a pre_logits layer without a head (a ViTBackbone has none)"),
        (config.get("classifier") not in ("token", "gap"),
         f"classifier={config.get('classifier')!r}"),
        (include_top and config.get("classifier_activation")
         not in keras_hub_layout.ACTIVATIONS,
         f"classifier_activation={config.get('classifier_activation')!r} "
         f"(one of {list(keras_hub_layout.ACTIVATIONS)} converts)"),
        (config.get("return_attention_scores"),
         "attention scores as an output"),
    )
    return [what for bad, what in checks if bad]


def to_keras_hub(model):
    """``model`` as the keras-hub class that computes it, with the same
    weights and outputs. A model without family options is keras-hub's
    ViT: a ``keras_hub.models.ViTImageClassifier`` for a model with a head
    (with a ``ViTImageClassifierPreprocessor`` whose image converter
    applies the model's input normalisation to [0, 255] pixels, [-1, 1]
    as keras-hub's ViT presets do, so that ``predict`` takes raw pixels
    and ``save_to_preset`` / ``ViTImageClassifier.from_preset`` work), or
    a ``ViTBackbone`` for one without (it returns every token; keras-hub's
    backbones pool nothing). A model with family options is the member
    :mod:`keras_vit.zoo.keras_hub.family` reads (a ``DeiTBackbone``, or a
    ``DeiTImageClassifier`` with its preprocessor for a DeiT with a head;
    a ``DINOV2Backbone``, a ``SigLIPVisionEncoder``, a
    ``CLIPVisionEncoder``), whose ``save_to_preset`` also writes an
    ``image_converter.json`` of the model's input normalisation; what no
    keras-hub class computes is refused naming the option
    (:mod:`keras_vit.zoo.keras_hub.family_writer`).
    The model's label names (``label_names``) go along as a classifier's
    ``zoo_labels``, which :func:`from_keras_hub` reads back;
    keras-hub's presets have no field for them, so the classifier's
    ``save_to_preset`` adds them to the preset's ``metadata.json``, where
    ``zoo.load`` finds them (:func:`_keep_labels`).
    Needs keras-hub (``pip install keras-hub``).

    Example::

        hub = keras_vit.zoo.to_keras_hub(
            keras_vit.zoo.load("ViT-B/16", gelu="exact"))
        hub.save_to_preset("vit_b16_preset")
        dino = keras_vit.zoo.to_keras_hub(keras_vit.zoo.load("dino_preset"))
        dino.save_to_preset("dino_again")   # a DINOV2Backbone preset
    """
    config = _config(model)
    # keras-hub's ViT when it computes the model, else the family member
    # that does (refused, naming the closest class, when none does).
    lacks = [f"{o} (it has no such option)"
             for o in keras_hub_family_writer.family_options(config)]
    family = lacks or _unconvertible(config)
    if family:
        chosen = keras_hub_family_writer.choose(model, family)
    keras_hub = require("keras_hub", package="keras-hub",
                        purpose="to_keras_hub")
    if family:
        out, backbone = keras_hub_family_writer.build(model, *chosen,
                                                      keras_hub)
    else:
        out, backbone = _vit(model, config, keras_hub)
    labels = (getattr(model, "label_names", None)
              or getattr(model, "zoo_labels", None))
    if out is not backbone:
        out.zoo_labels = list(labels) if labels else None
        _keep_labels(out)
    return out


def _vit(model, config, keras_hub):
    """``(out, backbone)``: keras-hub's ViT of ``model`` (a model without
    family options that :func:`_unconvertible` finds nothing against),
    ``out`` its classifier when the model has a head, else the
    backbone."""
    size = config["image_size"]
    rows, cols = (size, size) if isinstance(size, int) else tuple(size)
    token = config.get("classifier", "token") == "token"
    dtype = getattr(getattr(model, "dtype_policy", None), "name", None)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(rows, cols, int(config.get("num_channels", 3))),
        patch_size=int(config["patch_size"]),
        num_layers=int(config["num_layers"]),
        num_heads=int(config["num_heads"]),
        hidden_dim=int(config["hidden_size"]),
        mlp_dim=int(config["mlp_dim"]),
        dropout_rate=float(config.get("dropout_rate", 0.0)),
        attention_dropout=float(config.get("attention_dropout_rate", 0.0)),
        layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-6)),
        use_class_token=token, dtype=dtype)
    out = backbone
    if config.get("include_top", True):
        # The model's own input normalisation, as x * scale + offset.
        normalization = of_model(model)
        converter = keras_hub.layers.ViTImageConverter(
            image_size=(rows, cols),
            scale=np.broadcast_to(normalization.scale, (3,)).tolist(),
            offset=np.broadcast_to(normalization.offset, (3,)).tolist(),
            interpolation="bilinear")
        out = keras_hub.models.ViTImageClassifier(
            backbone=backbone, num_classes=int(config["num_classes"]),
            pooling="token" if token else "gap",
            intermediate_dim=config.get("representation_size"),
            activation=config.get("classifier_activation"),
            preprocessor=keras_hub.models.ViTImageClassifierPreprocessor(
                image_converter=converter))
    state = VIT.write(layouts.model_arrays(model, "keras-hub"))
    targets = {v.path: v for v in out.weights}
    hub_files.check_names({k: v.shape for k, v in state.items()},
                          {k: tuple(v.shape) for k, v in targets.items()},
                          f"to_keras_hub(model={model.name!r}): does not "
                          "hold the keras-hub ViT its config describes")
    for name, variable in targets.items():
        variable.assign(state[name])
    return out, backbone


def _keep_labels(task):
    """Makes the classifier ``task``'s ``save_to_preset`` keep its class
    names: keras-hub's writes no field for them, so the preset came back
    nameless; this one then adds ``task.zoo_labels`` (checked against the
    head first, before anything is written) to the preset's
    ``metadata.json`` (:func:`write_labels`). keras-hub still reads the
    preset as its own."""
    from keras_vit.models.common import check_label_names

    save = task.save_to_preset  # keras-hub's, bound to task

    def save_to_preset(preset_dir, *args, **kwargs):
        labels = getattr(task, "zoo_labels", None)
        try:
            labels = check_label_names(list(labels), task.num_classes,
                                       True) if labels else None
        except ValueError as e:
            raise ValueError(f"save_to_preset: the classifier's zoo_labels "
                             f"are its label_names; {e}") from None
        save(preset_dir, *args, **kwargs)
        if labels:
            write_labels(preset_dir, labels)

    save_to_preset.__doc__ = save.__doc__
    task.save_to_preset = save_to_preset


def write_labels(directory, labels):
    """Adds the class names ``labels`` as ``label_names`` to the
    ``metadata.json`` keras-hub's ``save_to_preset`` wrote in
    ``directory``: keras-hub ignores the field,
    :mod:`keras_vit.zoo.keras_hub.io` reads it back."""
    import json

    from keras_vit.base import atomic

    path = os.path.join(os.fspath(directory), keras_hub_layout.METADATA_FILE)
    with open(path, encoding="utf-8") as f:
        metadata = json.load(f)
    metadata["label_names"] = list(labels)
    atomic.write_json(path, metadata)


def save_preset(model, directory, labels=None):
    """Writes ``model`` as a keras-hub preset directory
    (``to_keras_hub(model).save_to_preset(directory)``: keras-hub's ViT,
    or the family member that computes the model) with a classifier's
    class names ``labels`` (a checked list, or None: none) as
    ``label_names`` in its ``metadata.json`` (:func:`write_labels`).
    Returns the folder; ``keras_hub.models.Backbone.from_preset`` (or the
    task's class) and :func:`keras_vit.zoo.load` read it.

    Example::

        save_preset(keras_vit.zoo.load("dino_preset"), "dino_again")
        keras_hub.models.Backbone.from_preset("dino_again")
    """
    hub = to_keras_hub(model)
    if hasattr(hub, "zoo_labels"):
        hub.zoo_labels = list(labels) if labels else None
    hub.save_to_preset(os.fspath(directory))
    return os.fspath(directory)
