"""Writes a keras_vit model as the keras-hub class that computes it, live
(:func:`to_keras_hub`) or as a preset directory with the model's class
names (:func:`save_preset`): the reverse of
:mod:`keras_vit.zoo.keras_hub.io`.

keras-hub's ViT computes the exact GELU only, so a ViT with
``gelu="tanh"`` is refused rather than converted with other logits; a
model with a family option no keras-hub class computes is refused in one
line naming it and the closest class.
"""

from __future__ import annotations

import os

from keras_vit.base.checks import require
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
    (with a preprocessor applying the model's input normalisation to
    [0, 255] pixels), or a ``ViTBackbone`` for one without. A model with
    family options is the family member that computes it
    (:mod:`keras_vit.zoo.keras_hub.family_writer`); what no keras-hub
    class computes is refused naming the option. The model's label names
    go along as a classifier's ``zoo_labels``, which its
    ``save_to_preset`` keeps. Needs keras-hub.

    Example::

        hub = keras_vit.zoo.to_keras_hub(
            keras_vit.zoo.load("ViT-B/16", gelu="exact"))
        hub.save_to_preset("vit_b16_preset")
        dino = keras_vit.zoo.to_keras_hub(keras_vit.zoo.load("dino_preset"))
        dino.save_to_preset("dino_again")   # a DINOV2Backbone preset
    """
    config = _config(model)
    lacks = [f"{o} (it has no such option)"
             for o in keras_hub_family_writer.family_options(config)]
    family = lacks or _unconvertible(config)
    if family:
        chosen = keras_hub_family_writer.choose(model, family)
    keras_hub = require("keras_hub", package="keras-hub",
                        purpose="to_keras_hub")
    if family:
        out, converter = keras_hub_family_writer.build(model, *chosen,
                                                       keras_hub)
    else:
        out, converter = _vit(model, config, keras_hub), None
    if isinstance(out, keras_hub.models.Task):
        labels = (getattr(model, "label_names", None)
                  or getattr(model, "zoo_labels", None))
        out.zoo_labels = list(labels) if labels else None
    _keep_on_save(out, converter)
    return out


def _vit(model, config, keras_hub):
    """keras-hub's ViT of ``model`` (a model without family options that
    :func:`_unconvertible` finds nothing against): its classifier when the
    model has a head, else the backbone."""
    ours = keras_hub_family_writer.settings(config)
    rows, cols = ours["image_size"]
    token = ours["class_token"]  # exactly when it pools by it
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(rows, cols, int(ours["num_channels"])),
        patch_size=int(ours["patch_size"]),
        num_layers=int(ours["num_layers"]),
        num_heads=int(ours["num_heads"]),
        hidden_dim=int(ours["hidden_size"]),
        mlp_dim=int(ours["mlp_dim"]),
        dropout_rate=float(ours["dropout_rate"]),
        attention_dropout=float(ours["attention_dropout_rate"]),
        layer_norm_epsilon=float(ours["layer_norm_epsilon"]),
        use_class_token=token,
        dtype=keras_hub_family_writer.dtype_name(model))
    out = backbone
    if config.get("include_top", True):
        converter = keras_hub_family_writer.image_converter(
            keras_hub.layers.ViTImageConverter, model, (rows, cols))
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
    return out


def _keep_on_save(hub, converter=None):
    """Makes ``hub``'s ``save_to_preset`` also keep what keras-hub's writes
    no field for, so that the preset loads back as the model: a
    classifier's class names (``hub.zoo_labels``) as ``label_names`` in
    its ``metadata.json``, a backbone's image ``converter`` as its
    ``image_converter.json`` (a keras-hub backbone carries none)."""
    from keras_vit.models.common import check_label_names

    save = hub.save_to_preset  # keras-hub's, bound to hub

    def save_to_preset(preset_dir, *args, **kwargs):
        labels = getattr(hub, "zoo_labels", None)
        try:
            labels = check_label_names(list(labels), hub.num_classes,
                                       True) if labels else None
        except ValueError as e:
            raise ValueError(f"save_to_preset: the classifier's zoo_labels "
                             f"are its label_names; {e}") from None
        save(preset_dir, *args, **kwargs)
        if converter is not None:
            converter.save_to_preset(preset_dir)
        if labels:
            write_labels(preset_dir, labels)

    save_to_preset.__doc__ = save.__doc__
    hub.save_to_preset = save_to_preset


def write_labels(directory, labels):
    """Adds the class names ``labels`` as ``label_names`` to the
    ``metadata.json`` keras-hub's ``save_to_preset`` wrote in
    ``directory`` (keras-hub ignores the field)."""
    import json

    from keras_vit.base import atomic

    path = os.path.join(os.fspath(directory), keras_hub_layout.METADATA_FILE)
    with open(path, encoding="utf-8") as f:
        metadata = json.load(f)
    metadata["label_names"] = list(labels)
    atomic.write_json(path, metadata)


def save_preset(model, directory, labels=None):
    """Writes ``model`` as a keras-hub preset directory
    (``to_keras_hub(model).save_to_preset(directory)``) with a
    classifier's class names ``labels`` (a checked list, or None) as
    ``label_names`` in its ``metadata.json``. Returns the folder.

    Example::

        save_preset(keras_vit.zoo.load("dino_preset"), "dino_again")
        keras_hub.models.Backbone.from_preset("dino_again")
    """
    hub = to_keras_hub(model)
    if hasattr(hub, "zoo_labels"):
        hub.zoo_labels = list(labels) if labels else None
    hub.save_to_preset(os.fspath(directory))
    return os.fspath(directory)
