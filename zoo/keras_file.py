"""A ``.keras`` file as a source of :func:`keras_vit.zoo.load`
(:mod:`keras_vit.zoo.sources`): a keras_vit ViT, hybrid or BiT that
``model.save`` wrote, or a fine-tuning run directory holding one
(``model.keras``).

The file is read as :func:`keras_vit.resolve_model` reads it
(:func:`keras_vit.zoo.resolve.load_keras_file`): members that inflate
past what the archive holds and a ``config.json`` past
:data:`~keras_vit.zoo.resolve.MAX_KERAS_CONFIG_BYTES` are refused before
Keras reads them, arrays stored outside the file or in compressed chunks
are refused, Keras deserialises in ``safe_mode`` (no lambdas), the
model's own size checks refuse absurd sizes before any weight exists,
and an array the model has no weight for (which Keras skips) is an
error. Its config gives the builder's arguments and its weights, in the
official layout, go through the zoo's one build step: position
embeddings resized for another ``image_size``, a new zero head for
another ``num_classes``, a strict load.

>>> is_keras_file("run/model.keras"), is_keras_file("ViT-B/16")
(True, False)
"""

from __future__ import annotations

import os

from keras_vit.zoo import bit_layout, convert, resolve, sources


def is_keras_file(value, *, progress=None):
    """True for a path ending in ``.keras`` (it need not exist: the reader
    says so) or a directory holding ``model.keras`` (a fine-tuning run).
    ``progress`` is unused (nothing is downloaded)."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    path = os.fspath(value)
    return isinstance(path, str) and (path.endswith(".keras") or os.path.isfile(
        os.path.join(path, resolve.RUN_MODEL_FILE)))


def read_checkpoint(value, name=None, image_size=None, num_classes=None, *,
                    keep_pre_logits=False, progress=None, **kwargs):
    """This source's reader: the :class:`~keras_vit.zoo.sources.Checkpoint`
    of the model in the ``.keras`` file ``value`` (or a run directory's
    ``model.keras``), the file's config under the caller's ``image_size``
    and ``num_classes`` (None: the file's). ``name``, a zoo name, gives
    the sizes instead (the weights must then fit it). Errors are
    :class:`~keras_vit.zoo.CheckpointError` naming the file."""
    from keras_vit import variants
    from keras_vit.models.resnet_v2 import ResNetV2
    from keras_vit.models.vit import VisionTransformer
    from keras_vit.zoo import transformers_hub

    argument = "name" if name is None else "weights"
    error = convert.CheckpointError
    path = resolve.model_path(value, argument, error=error)
    model = resolve.load_keras_file(path, argument, error=error)
    if isinstance(model, ResNetV2):
        family, arrays = "bit", bit_layout.export_arrays(model)
    elif isinstance(model, VisionTransformer):
        family, arrays = "vit", convert.export_arrays(model)
    else:
        raise error(
            f"{argument}={path!r} holds a {type(model).__name__}; zoo.load "
            "reads the ViT, hybrid and BiT models of keras_vit from .keras "
            f"files (keras_vit.resolve_model({path!r}, image_size=..., "
            "num_classes=...) copies any keras_vit model)")
    config = model.get_config()
    del model
    zoo_name = config.get("name")
    if family == "vit" and not config.get("resnet"):
        zoo_name = transformers_hub.zoo_name(config)
    if name is not None:
        arch = variants.parse(name)
        if (arch.family == "bit") != (family == "bit"):
            raise ValueError(
                f"weights={path!r} holds a {'BiT' if family == 'bit' else 'ViT'}"
                f"; it does not load into name={name!r} ({arch.family})")
        config.update(arch.config, name=sources.model_name(arch.name))
        zoo_name = arch.name
    has_head = config.get("include_top", True)
    include_top = kwargs.get("include_top", has_head or num_classes is not None)
    if num_classes is None:
        num_classes = config["num_classes"]
    head_kept = has_head and include_top and num_classes == config["num_classes"]
    if config.get("representation_size") and include_top and not (
            head_kept or keep_pre_logits):
        config["representation_size"] = None  # a new head on the encoder
    config.update(include_top=include_top, num_classes=num_classes)
    if image_size is not None:
        config["image_size"] = image_size
    return sources.Checkpoint(
        config, arrays, source_name=repr(path), family=family,
        keep_pre_logits=keep_pre_logits,
        tags={"zoo_name": zoo_name, "zoo_weights": None, "zoo_labels": None,
              "zoo_source": os.fspath(value)})
