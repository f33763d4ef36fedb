"""keras-hub's ViT read into keras_vit: a
``keras_hub.models.ViTImageClassifier`` or ``ViTBackbone`` (a live object,
or a preset directory its ``save_to_preset`` wrote), and the family's
other members (:mod:`keras_vit.zoo.keras_hub.family`).

A preset directory is read with ``h5py`` alone (keras-hub need not be
installed): the JSON configs are checked field by field and the ``.h5``
files' datasets by name, shape, dtype and storage before their data is
read. Nothing is unpickled and no Keras object is deserialised.

keras-hub's ``use_*_bias=False`` are zero biases here; the classifier's
``dropout`` before the head acts in training only and is not read. What
keras_vit cannot compute the same way is refused by name. Writing is
:mod:`keras_vit.zoo.keras_hub.writer`.
"""

from __future__ import annotations

import os

from keras_vit.base.checks import shown
from keras_vit.base.errors import ConfigError
from keras_vit.zoo import checkpoints, formats, h5_files, hub_files, layouts
from keras_vit.zoo.keras_hub import family as keras_hub_family
from keras_vit.zoo.keras_hub import layout as keras_hub_layout
from keras_vit.zoo.transformers import hub as transformers_hub
from keras_vit.zoo.keras_hub.layout import (
    METADATA_FILE, VIT, backbone_architecture, check_image_converter,
    expected_shapes, task_architecture, with_zero_biases)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
IMAGE_CONVERTER_FILE = "image_converter.json"

BACKBONE = "ViTBackbone"
CLASSIFIER = "ViTImageClassifier"
#: keras-hub's variable paths of the head.
HEAD_NAMES = [VIT.key_of("head/kernel"), VIT.key_of("head/bias")]
# The family's classifiers': the model's head variables -> the file's.
FAMILY_HEAD_NAMES = {row[0]: f"layers/{hub}" for hub, row
                     in keras_hub_layout.FAMILY_HEAD.items()}


# -- recognising a source -----------------------------------------------------

def _class_names(obj):
    return {cls.__name__ for cls in type(obj).__mro__
            if cls.__module__.startswith("keras_hub")}


def is_keras_hub_source(value, *, progress=None):
    """True for what :func:`read` takes: a keras-hub ``ViTBackbone`` or
    ``ViTImageClassifier`` or a family member
    (:data:`keras_vit.zoo.keras_hub.family.CLASSES`), or a directory whose
    ``config.json`` names a keras-hub class (``progress`` is unused).

    >>> is_keras_hub_source("ViT-B/16")
    False
    """
    if _class_names(value) & {BACKBONE, CLASSIFIER,
                              *keras_hub_family.CLASSES}:
        return True
    if not isinstance(value, (str, os.PathLike)):
        return False
    path = os.path.join(os.fspath(value), CONFIG_FILE)
    if not os.path.isfile(path):
        return False
    try:
        config = transformers_hub.read_json(path, "keras-hub config.json")
    except (checkpoints.CheckpointError, OSError):
        return False
    registered, module = config.get("registered_name"), config.get("module")
    return (isinstance(registered, str) and registered.startswith(
        "keras_hub>")) or (isinstance(module, str)
                           and module.startswith("keras_hub."))


# -- a preset directory -------------------------------------------------------

def read_preset(directory):
    """``(arch, arrays)`` of a keras-hub preset directory (see
    :func:`read`), with a task's head and its image converter's
    normalisation where it has them."""
    directory = os.fspath(directory)
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{directory!r} has no {CONFIG_FILE}; a "
                                "keras-hub preset directory has one")
    outer = formats.check(formats.KERAS_HUB_OBJECT, transformers_hub.read_json(
        config_path, "keras-hub config.json"), config_path)
    class_name = outer.get("class_name")
    family = class_name in keras_hub_family.PRESET_CLASSES
    if family:
        class_name, arch, prefix = keras_hub_family.architecture(
            class_name, outer.get("config"), config_path)
        task_class = keras_hub_family.MEMBERS[class_name].get("task")
    elif class_name == BACKBONE:
        arch = backbone_architecture(outer.get("config"), config_path)
        task_class = CLASSIFIER
    else:
        raise ConfigError(
            config_path, "class_name", f"keras_vit reads keras-hub's "
            f"{BACKBONE} (with or without its {CLASSIFIER}) and "
            f"{', '.join(keras_hub_family.PRESET_CLASSES)}; received "
            f"class_name={shown(class_name)}")
    task_path = os.path.join(directory, TASK_FILE)
    if os.path.isfile(task_path):
        task = formats.check(
            formats.KERAS_HUB_OBJECT, transformers_hub.read_json(
                task_path, "keras-hub task.json"), task_path)
        if task["class_name"] != task_class:
            wanted = f"keras-hub's {task_class}" if task_class else "no task"
            raise ConfigError(
                task_path, "class_name", f"keras_vit reads {wanted} with a "
                f"{class_name}; received class_name="
                f"{shown(task['class_name'])} (the backbone alone loads "
                f"without {TASK_FILE})")
        arch = task_architecture(task["config"], arch, task_path)
        pre = task["config"].get("preprocessor") or {}
        converter = pre.get("config", {}).get("image_converter")
        if converter is not None and "config" in converter:
            arch["input_normalization"] = check_image_converter(
                converter["config"], task_path)
    converter_path = os.path.join(directory, IMAGE_CONVERTER_FILE)
    if os.path.isfile(converter_path):
        converter = transformers_hub.read_json(
            converter_path, "keras-hub image_converter.json")
        arch["input_normalization"] = check_image_converter(
            converter.get("config"), converter_path)
    if family:
        return arch, keras_hub_family.read_weights(directory, class_name,
                                                   arch, prefix)
    state = h5_files.read_h5(os.path.join(directory, WEIGHTS_FILE),
                             keras_hub_layout.h5_names(arch, task=False),
                             expected_shapes(arch))
    if arch["kind"] == "classifier":
        state.update(h5_files.read_h5(
            os.path.join(directory, TASK_WEIGHTS_FILE),
            keras_hub_layout.h5_names(arch, task=True), expected_shapes(arch),
            optional=HEAD_NAMES))
    return arch, with_zero_biases(state, arch)


# -- a live keras-hub object --------------------------------------------------

def read_object(obj):
    """``(arch, arrays)`` of a keras-hub ``ViTBackbone`` or
    ``ViTImageClassifier`` (see :func:`read`)."""
    import keras

    names = _class_names(obj)
    where = f"{type(obj).__name__} {getattr(obj, 'name', '')!r}"
    if names & set(keras_hub_family.CLASSES):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="keras_vit_hub_") as folder:
            obj.save_to_preset(folder)
            return read_preset(folder)
    if CLASSIFIER in names:
        backbone = obj.backbone
        if BACKBONE not in _class_names(backbone):
            raise ValueError(f"{where}: its backbone is a "
                             f"{type(backbone).__name__}, not a {BACKBONE}")
    elif BACKBONE in names:
        backbone = obj
    else:
        raise ValueError(
            f"from_keras_hub takes a keras-hub {CLASSIFIER} or {BACKBONE}, "
            f"or a preset directory; received source={shown(obj)}")
    config = dict(backbone.get_config())
    config["data_format"] = getattr(backbone, "data_format", None)
    arch = backbone_architecture(config, where)
    if backbone is not obj:
        task = {k: v for k, v in obj.get_config().items()
                if k not in ("backbone", "preprocessor")}
        arch = task_architecture(task, arch, where)
        converter = getattr(getattr(obj, "preprocessor", None),
                            "image_converter", None)
        if converter is not None:
            arch["input_normalization"] = check_image_converter(
                converter.get_config(), where)
    state = {v.path: keras.ops.convert_to_numpy(
        keras.ops.cast(v.value, "float32")) for v in obj.weights}
    hub_files.check_names(
        {k: v.shape for k, v in state.items()}, expected_shapes(arch),
        f"{where}: does not hold the keras-hub ViT its config describes")
    return arch, with_zero_biases(state, arch)


def read(source, *, with_labels=False):
    """``(arch, arrays)`` of a keras-hub ViT: a ``ViTImageClassifier``, a
    ``ViTBackbone``, a family member or a preset directory of one.
    ``arch`` holds keras_vit's builder facts; ``arrays`` the weights
    (keras-hub's ViT: by its variable paths; the family: by the model's).
    ``with_labels`` adds a third item, the head's class names (a preset's
    ``metadata.json`` ``label_names``, or a live classifier's
    ``zoo_labels``), or None."""
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isdir(source):
            raise FileNotFoundError(
                f"{os.fspath(source)!r} is not a directory; a keras-hub "
                "preset is one (save_to_preset writes it)")
        arch, arrays = read_preset(source)
        labels = read_labels(source, arch) if with_labels else None
    else:
        arch, arrays = read_object(source)
        labels = getattr(source, "zoo_labels", None)
        labels = list(labels) if labels and arch["kind"] == "classifier" and (
            len(labels) == arch["num_classes"]) else None
    return (arch, arrays, labels) if with_labels else (arch, arrays)


def read_labels(directory, arch):
    """The class names of a preset's head: ``label_names`` in its
    ``metadata.json``, checked against the head; None when there are
    none."""
    path = os.path.join(os.fspath(directory), METADATA_FILE)
    if not os.path.isfile(path):
        return None
    metadata = formats.check(formats.KERAS_HUB_METADATA,
                             transformers_hub.read_json(
                                 path, "keras-hub metadata.json"), path)
    labels = metadata.get("label_names")
    if labels is None or arch["kind"] != "classifier":
        return None
    return formats.check_labels(labels, arch["num_classes"], path,
                                "label_names")


# -- building -----------------------------------------------------------------

def checkpoint(arch, arrays, *, source_name=None, tags=None, labels=None):
    """The :class:`~keras_vit.zoo.build.Checkpoint` of a keras-hub ViT
    (``arch``, ``arrays`` from :func:`read`): a classifier's head, or a
    backbone's tokens; ``labels`` name the head's classes."""
    head = arch["num_classes"] if arch["kind"] == "classifier" else None
    family = arch.get("family")
    defaults = {"name": f"{(family or 'vit').lower()}_keras_hub",
                "dropout_rate": arch["dropout_rate"],
                "attention_dropout_rate": arch["attention_dropout_rate"],
                "input_normalization": arch.get("input_normalization"),
                **arch.get("options", {})}
    tags = dict(tags or {})
    if family:
        tags["zoo_name"] = f"{family} {hub_files.zoo_name(arch)}"
    ckpt = hub_files.vit_checkpoint(
        arch, arrays, head=head, label_names=labels,
        source_name=source_name, tags=tags,
        head_names=FAMILY_HEAD_NAMES if family else None,
        layout=layouts.BY_PATH if family else VIT,
        head_config={"classifier_activation": arch["classifier_activation"]},
        **defaults)
    if arch["kind"] == "embedding":  # SigLIP's: its pooled embedding
        ckpt.config["num_classes"], ckpt.include_top = 0, True
    return ckpt


def _source_name(source):
    return (repr(os.fspath(source)) if isinstance(source, (str, os.PathLike))
            else f"{type(source).__name__} {getattr(source, 'name', '')!r}")


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.build.Checkpoint` of ``source`` (see
    :func:`read`) that :func:`from_keras_hub` builds. ``name``, a ViT
    name, gives the sizes instead of the config."""
    arch, arrays, labels = read(source, with_labels=True)
    if name is not None and arch.get("family"):
        raise ValueError(
            f"name={name!r} gives the sizes of keras-hub's ViT; a "
            f"{arch['family']} preset's config.json fixes its own "
            f"({_source_name(source)})")
    if name is not None:
        arch = dict(arch, **hub_files.name_sizes(name, "keras-hub's"),
                    **{k: v for k, v in (sizes or {}).items()
                       if k != "resnet"})
    tags = {}
    if isinstance(source, (str, os.PathLike)):
        tags["zoo_source"] = os.fspath(source)
    return checkpoint(arch, arrays, source_name=_source_name(source),
                      tags=tags, labels=labels)


def from_keras_hub(source, *, image_size=None, num_classes=None, **kwargs):
    """A keras_vit ``VisionTransformer`` computing what the keras-hub ViT
    ``source`` computes: a ``keras_hub.models.ViTImageClassifier`` (its
    logits), a ``ViTBackbone`` (its tokens), a family member, or a preset
    directory written by ``save_to_preset`` (read without keras-hub). The
    input is the backbone's: what its image converter makes of pixels.
    ``image_size`` resizes the position embeddings; another
    ``num_classes`` gives a new zero head; ``**kwargs`` go to
    :func:`keras_vit.models.vit`.

    Example::

        import keras_hub, keras_vit
        hub = keras_hub.models.ViTImageClassifier.from_preset(preset_dir)
        model = keras_vit.zoo.from_keras_hub(hub)   # or (preset_dir)
    """
    from keras_vit.zoo import build, settle

    return build.build_settled(
        read_checkpoint(source), settle.request(
            image_size=image_size, num_classes=num_classes, **kwargs))
