"""``zoo.save_pretrained``: a keras_vit model written in a hub library's
layout, its class names with it.

Each layout's writer is a module of its own (:mod:`~keras_vit.zoo.timm_writer`,
:mod:`~keras_vit.zoo.transformers_writer`,
:mod:`~keras_vit.zoo.keras_hub_writer`); this one checks the arguments once
and decides the class names once: the caller's ``labels``, else the
model's own ``label_names``. Each layout stores them where its library
does (timm: ``label_names``; transformers: ``id2label``; a keras-hub
preset, which has no field for them: ``label_names`` in
``metadata.json``), and :func:`keras_vit.zoo.load` reads them back.
"""

from __future__ import annotations

import os

LAYOUTS = ("timm", "transformers", "keras-hub")


def _labels(model, labels):
    """The class names to write: ``labels`` (checked: a list of distinct
    non-empty strings, one per class of the head), else the model's."""
    from keras_vit.models.common import check_label_names

    if labels is None:
        labels = (getattr(model, "label_names", None)
                  or getattr(model, "zoo_labels", None))
        if not labels:
            return None
    elif isinstance(labels, (str, bytes)) or not isinstance(
            labels, (list, tuple)):
        raise ValueError(f"labels must be a list of class names or None; "
                         f"received labels={labels!r}")
    config = model.get_config()
    include_top = config.get("include_top", True)
    if not include_top:
        raise ValueError(
            "labels name the classes of a head; this model has none "
            f"(include_top=False); received labels={labels!r}"[:300])
    if len(labels) != config.get("num_classes"):
        count = len(labels)
        raise ValueError(f"labels has {count} name{'s' * (count != 1)} for "
                         f"a head of "
                         f"{config.get('num_classes')} classes; received "
                         f"labels={labels!r}"[:300])
    try:
        names = check_label_names(list(labels), config.get("num_classes"),
                                  include_top)
    except ValueError as e:
        raise ValueError(str(e).replace("label_names", "labels")) from None
    return list(names)


def save_pretrained(model, directory, labels=None, *, layout="timm"):
    """Writes ``model`` as a Hub repository in ``directory``; returns it.

    ``layout="timm"`` (default): ``config.json`` and ``model.safetensors``,
    loadable with ``timm.create_model(arch, pretrained=True,
    pretrained_cfg_overlay=dict(file=...))`` or uploadable with
    ``huggingface_hub.upload_folder`` (timm's default GELU is the exact
    one; another form is written as ``model_args``' ``act_layer``, which
    timm honours when it builds from the folder's config, or when given
    ``**model_args``).
    ``layout="transformers"``: what Hugging Face transformers'
    ``ViTForImageClassification.from_pretrained(directory)`` loads (a
    headless model pooled by ``"map"``: ``SiglipVisionModel``).
    ``layout="keras-hub"``: a keras-hub preset
    (``keras_hub.models.ViTImageClassifier.from_preset(directory)``; a
    family member as keras-hub's DeiT, DINOV2, SigLIP or CLIP vision
    class, ``keras_hub.models.Backbone.from_preset(directory)``).

    ``labels``: the head's class names (default: the model's
    ``label_names``); every layout keeps them and ``zoo.load`` reads them
    back.
    """
    import keras

    from keras_vit.base.checks import check_choice

    check_choice("layout", layout, LAYOUTS)
    if not isinstance(model, keras.Model):
        raise TypeError(f"save_pretrained takes a keras.Model; received "
                        f"model={model!r}"[:300])
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path; received "
                        f"directory={directory!r}"[:300])
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"directory={os.fspath(directory)!r} is a "
                                 "file, not a folder")
    if layout == "transformers":
        from keras_vit.zoo import transformers_writer

        return transformers_writer.write(model, directory,
                                         _labels(model, labels))
    if layout == "keras-hub":
        from keras_vit.zoo import keras_hub_writer

        return keras_hub_writer.save_preset(model, directory,
                                            _labels(model, labels))
    from keras_vit.zoo import timm_writer

    return timm_writer.write(model, directory, _labels(model, labels))
