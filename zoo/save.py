"""``zoo.save_pretrained``: a keras_vit model written in a hub library's
layout, its class names with it.

Each layout's writer is a module of its own; this one checks the arguments
and decides the class names once.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from keras_vit.base import geometry
from keras_vit.base import options as options_table
from keras_vit.base.checks import check_choice

LAYOUTS = ("timm", "transformers", "keras-hub")


def _labels(model, labels):
    """The class names to write: ``labels`` (checked), else the model's."""
    from keras_vit.models.common import check_label_names

    if labels is None:
        labels = (getattr(model, "label_names", None)
                  or getattr(model, "zoo_labels", None))
        if not labels:
            return None
    elif not isinstance(labels, (list, tuple)):
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
                         f"a head of {config.get('num_classes')} classes; "
                         f"received labels={labels!r}"[:300])
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
    pretrained_cfg_overlay=dict(file=...))``.
    ``layout="transformers"``: what Hugging Face transformers'
    ``ViTForImageClassification.from_pretrained(directory)`` loads.
    ``layout="keras-hub"``: a keras-hub preset
    (``keras_hub.models.ViTImageClassifier.from_preset(directory)``).

    ``labels``: the head's class names (default: the model's
    ``label_names``).

    The files are first written into a scratch folder and read back
    (:func:`check_read_back`): a model the library would read as another
    is refused in one line, and ``directory`` is left as it was. They
    replace those of an earlier save of the same ``layout``; a
    ``directory`` holding another model (another layout's files, a run's
    ``model.keras``) is refused.
    """
    import keras

    check_choice("layout", layout, LAYOUTS)
    if not isinstance(model, keras.Model):
        raise TypeError(f"save_pretrained takes a keras.Model; received "
                        f"model={model!r}"[:300])
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path; received "
                        f"directory={directory!r}"[:300])
    if not os.fspath(directory):
        raise ValueError("directory must name a folder; received "
                         "directory=''")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"directory={os.fspath(directory)!r} is a "
                                 "file, not a folder")
    _check_unused(os.fspath(directory), layout)
    labels = _labels(model, labels)
    if layout == "transformers":
        from keras_vit.zoo.transformers.writer import write
    elif layout == "keras-hub":
        from keras_vit.zoo.keras_hub.writer import save_preset as write
    else:
        from keras_vit.zoo.timm.writer import write
    directory = os.fspath(directory)
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent,
                                     prefix=".save_pretrained-") as scratch:
        write(model, scratch, labels)
        check_read_back(model, scratch, layout)
        os.makedirs(directory, exist_ok=True)
        for name in sorted(os.listdir(scratch)):
            source, target = (os.path.join(scratch, name),
                              os.path.join(directory, name))
            if os.path.isdir(source):
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                os.replace(source, target)
    return directory


def _check_unused(directory, layout):
    """Refuses a ``directory`` that holds a model of another kind than
    ``layout`` (a save of the same layout is replaced): both would stay, a
    folder ``zoo.load`` refuses."""
    from keras_vit.zoo import sources

    held = [s.name for s in sources.claims(directory)] if os.path.isdir(
        directory) else []
    if held and held != [layout]:
        raise ValueError(
            f"directory={directory!r} holds the files of a {' and a '.join(held)}"
            f" model; save_pretrained(layout={layout!r}) would leave them beside"
            " its own, a folder zoo.load refuses: pass a new or empty folder, "
            "or remove them first")


# Arguments that do not change what the model computes at its input size.
_IGNORED = ("name", "dtype", "dropout_rate", "attention_dropout_rate",
            "drop_path_rate", "head_bias_init", "remat",
            "dynamic_image_size", "include_preprocessing", "label_names",
            "input_normalization", "trainable")


def _computed(config):
    """The arguments of a builder ``config`` that fix what the model
    computes, with defaults filled in as the model resolves them."""
    from keras_vit.models.encoder import FAMILY_DEFAULTS

    out = dict(FAMILY_DEFAULTS, num_channels=3, layer_norm_epsilon=1e-6,
               gelu="tanh", classifier="token", include_top=True,
               pooling=None, representation_size=None, resnet=None,
               classifier_activation=None, return_attention_scores=False,
               position_embedding="learned_1d",
               position_embedding_placement="stem")
    out.update({k: v for k, v in config.items() if k not in _IGNORED})
    out = options_table.as_written(out)
    out["classifier"] = {"avg": "gap"}.get(out["classifier"],
                                           out["classifier"])
    out["class_token"] = geometry.class_token(out)
    size = out.get("image_size")
    if isinstance(size, (list, tuple)):
        out["image_size"] = (size[0] if len(set(size)) == 1
                             else tuple(size))
    if not out["include_top"]:
        out.pop("num_classes", None)
        out.pop("classifier_activation")
    if out["mlp"] == "swiglu" and (out["classifier"] != "map"
                                   or out["pool_form"] != "map"):
        # The gate is SiLU's whatever the GELU.
        out.pop("gelu")
    return out


def _unit_scales(arrays):
    """True when ``arrays`` (by variable path) hold layer scales, all of
    ones (a model without layer scale, written where the class has one)."""
    import numpy as np

    scales = [k for k in arrays if "/layer_scale_" in k]
    return bool(scales) and all(
        np.all(np.asarray(arrays[k]) == 1) for k in scales)


def check_read_back(model, folder, layout):
    """Reads ``folder`` (what ``layout``'s writer wrote of ``model``) as
    ``zoo.load(folder)`` does; raises one line naming the first argument
    (or array) it reads otherwise, its value and the model's."""
    from keras_vit.zoo import convert, settle, sources

    where = f"save_pretrained(layout={layout!r}) of model={model.name!r}"
    try:
        source, value, _ = sources.find(folder, "auto")
        checkpoint = source.read(value)
        settled = settle.settle(checkpoint, settle.Request())
    except (ValueError, KeyError) as e:
        raise ValueError(f"{where}: keras_vit's reader of {layout}'s files "
                         f"refuses what it would write: "
                         f"{' '.join(str(e).split())}"[:600]) from None
    ours, theirs = (_computed(model.get_config()),
                    _computed(settled.config))
    shapes = {v.path: tuple(v.shape) for v in model.weights}
    layout, arrays = checkpoint.layout, settled.arrays or {}
    if layout is None:
        layout, arrays = convert.OFFICIAL, convert.normalize_keys(arrays)
    foreign, arrays = layout.unknown(arrays), layout.read(arrays, shapes)[0]
    if ours["layer_scale"] is None and _unit_scales(arrays):
        theirs["layer_scale"] = None
    # A layer scale's value is its initialisation: the weights hold it.
    for options in (ours, theirs):
        options["layer_scale"] = options["layer_scale"] is not None
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            raise ValueError(
                f"{where}: what it writes reads back with {key}="
                f"{theirs.get(key)!r}, and the model has {key}="
                f"{ours.get(key)!r}; nothing written"[:600])
    if not arrays:
        return
    extra = {k for k in arrays if "/layer_scale_" in k} if _unit_scales(
        arrays) and not any("/layer_scale_" in k for k in shapes) else set()
    differ = foreign or sorted((set(shapes) ^ set(arrays)) - extra) or sorted(
        k for k in shapes
        if shapes[k] != tuple(getattr(arrays[k], "shape", ())))
    if differ:
        raise ValueError(f"{where}: what it writes reads back without the "
                         f"model's arrays {differ[:6]}; nothing written")
