"""A ``.keras`` file as a source of :func:`keras_vit.zoo.load`
(:mod:`keras_vit.zoo.sources`): a keras_vit ViT, hybrid or BiT that
``model.save`` wrote, or a fine-tuning run directory holding one
(``model.keras``).

The file is read as :func:`keras_vit.resolve_model` reads it
(:func:`keras_vit.zoo.keras_archive.load_keras_file`).

>>> is_keras_file("run/model.keras"), is_keras_file("ViT-B/16")
(True, False)
"""

from __future__ import annotations

import os

from keras_vit.base import variants
from keras_vit.zoo import build, hub_files, keras_archive


def is_keras_file(value, *, progress=None):
    """True for a directory holding ``model.keras``, or another path
    ending in ``.keras`` (it need not exist): a folder's name says nothing
    of what it holds."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    path = os.fspath(value)
    if not isinstance(path, str):
        return False
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, keras_archive.RUN_MODEL_FILE))
    return path.endswith(".keras")


def read_checkpoint(value, name=None, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader: the :class:`~keras_vit.zoo.build.Checkpoint`
    of the model in the ``.keras`` file ``value`` (or a run directory's
    ``model.keras``), the model itself among it. ``name``, a zoo name,
    gives the sizes instead. A model that is no keras_vit model comes back
    as it is (``family="foreign"``)."""
    from keras_vit.models.resnet_v2 import ResNetV2

    argument = argument or ("name" if name is None else "weights")
    path = os.fspath(value)
    if os.path.isdir(path):  # a fine-tuning run
        path = os.path.join(path, keras_archive.RUN_MODEL_FILE)
    model = keras_archive.load_keras_file(path, argument)
    tags = {"zoo_weights": None, "zoo_source": os.fspath(value)}
    if not build.is_keras_vit_model(model):
        return build.Checkpoint({}, source_name=repr(path), family="foreign",
                                model=model, tags=tags)
    config = model.get_config()
    family = "bit" if isinstance(model, ResNetV2) else "vit"
    zoo_name = config.get("name")
    if "hidden_size" in config and not config.get("resnet"):
        zoo_name = hub_files.zoo_name(config)
    if name is not None:
        arch = variants.parse(name)
        if (arch.family == "bit") != (family == "bit"):
            raise ValueError(
                f"weights={path!r} holds a {'BiT' if family == 'bit' else 'ViT'}"
                f"; it does not load into name={name!r} ({arch.family})")
        config.update(arch.config, name=build.model_name(arch.name))
        zoo_name = arch.name
    head = config["num_classes"] if config.get("include_top", True) else None
    labels = config.pop("label_names", None)
    return build.Checkpoint(
        config, source_name=repr(path), family=family, head=head,
        label_names=list(labels) if labels else None, model=model,
        tags=dict(tags, zoo_name=zoo_name))
