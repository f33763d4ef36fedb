"""A ``.keras`` archive read safely: its members bounded before Keras
inflates them, its ``config.json`` checked before Keras builds anything,
its weights checked as Keras writes them.
"""

from __future__ import annotations

import io
import os
import tempfile
import zipfile

from keras_vit.base import options, schema
from keras_vit.base.archives import check_archive
from keras_vit.base.limits import (KERAS_BOMB_FLOOR, KERAS_MAX_EXPANSION,
                              MAX_CONFIG_BYTES as MAX_KERAS_CONFIG_BYTES)
from keras_vit.zoo import checkpoints, formats, h5_files, layouts
from keras_vit.zoo.build import is_keras_vit_model

#: The file a training run directory holds its final model in.
RUN_MODEL_FILE = "model.keras"


def load_keras_file(path, argument="model", *,
                    error=checkpoints.CheckpointError):
    """The model in a ``.keras`` file (``compile=False``), or one error
    (``error``) naming ``argument``."""
    import keras

    # Importing the model classes registers them with Keras.
    from keras_vit.models import (  # noqa: F401
        AxialVisionTransformer, ResNetV2, VisionTransformer)

    check_archive(argument, path, "a .keras model", error=error)
    _check_keras_members(path, argument, error)
    shapes = _keras_weights(path, argument, error)
    check_keras_config(path, shapes, argument)
    try:
        model = keras.saving.load_model(path, compile=False)
    except (ValueError, OSError, KeyError, TypeError, AttributeError,
            zipfile.BadZipFile) as e:
        # Keras' own messages run over several lines: the first says what.
        first = next((line for line in str(e).splitlines() if line.strip()),
                     "")
        raise error(f"cannot load {argument}={path!r} as a Keras model: "
                    f"{type(e).__name__}: {first.strip()}") from e
    except RecursionError:  # a config.json nested thousands deep
        raise error(f"cannot load {argument}={path!r} as a Keras model: its "
                    "config.json is nested too deeply to be a model's "
                    "config") from None
    if (shapes is not None and is_keras_vit_model(model)
            and len(shapes) != len(model.weights)):
        raise error(_unread_weights(model, shapes, path, argument))
    return model


def _check_keras_members(path, argument, error):
    """Refuses a ``.keras`` archive whose members would inflate past what
    its bytes can hold, before Keras reads them into memory."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return  # Keras' own error names what is wrong
    where = f"cannot load {argument}={path!r} as a Keras model: its"
    for info in members:
        size = info.file_size
        if info.filename == "config.json" and size > MAX_KERAS_CONFIG_BYTES:
            raise error(f"{where} config.json is {size} bytes uncompressed "
                        "(a model's is a few KB; at most "
                        f"{MAX_KERAS_CONFIG_BYTES} read)")
        if (size > KERAS_BOMB_FLOOR
                and size > KERAS_MAX_EXPANSION * info.compress_size):
            raise error(f"{where} {info.filename} is {size} bytes "
                        f"uncompressed from {info.compress_size} in the "
                        "file, more than a model's weights deflate (a zip "
                        "bomb?); the .keras files Keras writes store their "
                        "members uncompressed")


KERAS_WEIGHTS_FILE = "model.weights.h5"
KERAS_CONFIG_FILE = "config.json"
# Arrays a ViT block holds in a Keras weights file.
_ARRAYS_PER_BLOCK = 16


def keras_config(path, argument="model"):
    """The ``config.json`` of the ``.keras`` archive ``path`` checked as
    :data:`~keras_vit.zoo.formats.KERAS_FILE_CONFIG` (and
    :data:`~keras_vit.zoo.formats.KERAS_VIT_CONFIG`) describe it; None when
    the archive has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            if KERAS_CONFIG_FILE not in archive.namelist():
                return None
            raw = archive.read(KERAS_CONFIG_FILE)  # bounded by the caller
    except (OSError, zipfile.BadZipFile):
        return None
    where = _where(path, argument)
    outer = formats.check(formats.KERAS_FILE_CONFIG, schema.parse_json(
        raw, where, "Keras model config", error=formats.FormatError), where)
    if outer.get("registered_name") in formats.KERAS_VIT_CLASSES:
        outer["config"] = formats.check(formats.KERAS_VIT_CONFIG,
                                        outer["config"], where, "config")
        _check_options(outer["config"], where)
    return outer


def _check_options(config, where):
    """Refuses a config value of the family's options that its row
    (:mod:`keras_vit.base.options`) refuses, naming the file and field."""
    for name, value in config.items():
        if name in options.ROWS:
            try:
                options.ROWS[name].check(name, value)
            except ValueError as e:
                raise formats.fail(where, f"config.{name}", str(e)) from None


def _where(path, argument, member=KERAS_CONFIG_FILE):
    return f"cannot load {argument}={path!r} as a Keras model: its {member}"


def check_keras_config(path, shapes=None, argument="model"):
    """Refuses a ``.keras`` file whose config does not fit its format, is
    deeper than the weights it holds or is too large for this machine,
    before Keras builds anything. Returns the checked config."""
    from keras_vit.models import memory

    outer = keras_config(path, argument)
    if outer is None or outer.get("registered_name") not in (
            formats.KERAS_VIT_CLASSES):
        return outer
    config = outer["config"]
    where = _where(path, argument)
    memory.check_config(config, where)
    layers = config.get("num_layers")
    if shapes is not None and isinstance(layers, int) and (
            _ARRAYS_PER_BLOCK * layers > len(shapes)):
        raise formats.fail(where, "config.num_layers", f"num_layers={layers}"
                           f" needs {_ARRAYS_PER_BLOCK * layers} arrays; the "
                           f"file's {KERAS_WEIGHTS_FILE} holds {len(shapes)}")
    return outer


def _keras_weights(path, argument, error):
    """``{name: shape}`` of the arrays in a ``.keras`` file's weights (not
    its optimizer's), each checked stored as Keras writes it; None when
    the archive has no such member."""
    import h5py

    where = _where(path, argument, KERAS_WEIGHTS_FILE)
    try:
        with zipfile.ZipFile(path) as archive:
            if KERAS_WEIGHTS_FILE not in archive.namelist():
                return None
            data = archive.read(KERAS_WEIGHTS_FILE)
    except (OSError, zipfile.BadZipFile):
        return None
    try:
        f = h5py.File(io.BytesIO(data), "r")
    except OSError as e:
        raise error(f"{where} is not an HDF5 file "
                    f"({' '.join(str(e).split())[:200]})") from None
    with f:
        try:
            found = h5_files.h5_datasets(f, where)
        except checkpoints.CheckpointError as e:
            raise error(str(e)) from None
        problems = [f"{name}: {problem}" for name, ds in found.items()
                    if (problem := _h5_problem(ds, len(data)))]
        if problems:
            raise error(f"{where} has arrays Keras never writes: "
                        f"{'; '.join(problems[:12])}")
        return {name: tuple(ds.shape) for name, ds in found.items()}


def _h5_problem(ds, file_size):
    """What is wrong with the dataset ``ds`` of a Keras weights file, or
    None (bfloat16 is written as 2-byte opaque values)."""
    if ds.dtype.kind not in "biufV":
        return f"of dtype {ds.dtype} (Keras writes numbers)"
    where = h5_files.h5_storage_problem(ds, file_size)
    return None if where is None else f"stored {where}"


def _unread_weights(model, shapes, path, argument):
    """The error for a ``.keras`` file whose weights hold arrays Keras did
    not read into ``model``, each named."""
    import h5py

    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, KERAS_WEIGHTS_FILE)
        model.save_weights(saved)
        with h5py.File(saved, "r") as f:
            expected = set(h5_files.h5_datasets(f, saved))
    unexpected = sorted(set(shapes) - expected)
    missing = sorted(expected - set(shapes))
    found = [layouts.listed(what, names) for what, names in (
        ("unexpected", unexpected), ("missing", missing)) if names]
    return (f"{_where(path, argument, KERAS_WEIGHTS_FILE)} holds "
            f"{len(shapes)} arrays where model={model.name!r} has "
            f"{len(model.weights)} weights; " + "; ".join(found))

