"""What every checkpoint layout shares: the error, the check that a model
is one, the map of a model's variables to a layout's keys, and the
assignment of the arrays to them.
"""

from __future__ import annotations

import itertools
import zipfile

import numpy as np

from keras_vit.base.errors import KerasVitError
from keras_vit.zoo.official import npz as lazy_npz


class CheckpointError(KerasVitError, ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


def as_array(value):
    """``value`` as an array, leaving a lazily read one unread."""
    if isinstance(value, lazy_npz.LazyArray):
        return value
    return np.asarray(value)


# Checkpoints at least this big show a progress bar while they load.
PROGRESS_MIN_BYTES = 256 * 2**20


def assign_all(assignments, source_name, progress=None):
    """Assigns ``[(variable, array or None for zeros)]`` grouped by the
    checkpoint's archive member, reading one array at a time.
    ``progress``: a bar of the bytes assigned (None: for checkpoints of
    ``PROGRESS_MIN_BYTES`` or more, on a terminal)."""
    from tqdm.auto import tqdm

    def source(item):
        return getattr(item[1], "source", "")

    # Nothing half loaded: every member is checked before any assignment.
    try:
        lazy_npz.verify(dict(enumerate(v for _, v in assignments)))
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise CheckpointError(
            f"The checkpoint source={source_name} is corrupt; no weight was "
            f"changed. {type(e).__name__}: {e}") from e
    for var, value in assignments:
        dtype = getattr(value, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind not in (
                lazy_npz.NUMBER_KINDS):
            raise CheckpointError(
                f"{source((var, value)) or var.path!r} of the checkpoint "
                f"source={source_name} has dtype {np.dtype(dtype).str!r}, not "
                "a number type; no weight was changed")
    sizes = [int(np.prod(var.shape)) * _itemsize(var.dtype)
             for var, _ in assignments]
    if progress is None:
        disable = None if sum(sizes) >= PROGRESS_MIN_BYTES else True
    else:
        disable = not progress
    bar = tqdm(total=sum(sizes), unit="B", unit_scale=True,
               unit_divisor=1024, desc=f"loading {source_name}"[:60],
               disable=disable)
    size_of = {id(var): size for (var, _), size in zip(assignments, sizes)}
    with bar:
        for _, group in itertools.groupby(sorted(assignments, key=source),
                                          key=source):
            for var, value in group:
                if value is None:  # a new head
                    value = np.zeros(var.shape, dtype=var.dtype)
                try:
                    var.assign(np.asarray(value, dtype=var.dtype))
                except (zipfile.BadZipFile, EOFError, OSError,
                        ValueError) as e:
                    raise CheckpointError(
                        f"Could not read {source((var, value))!r} of the "
                        f"checkpoint source={source_name} (corrupt file?); "
                        "the model's weights are partly overwritten. "
                        f"{type(e).__name__}: {e}") from e
                bar.update(size_of[id(var)])
            if isinstance(value, lazy_npz.LazyArray):
                value.release()  # every slice of this member is assigned


def _itemsize(dtype):
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # bfloat16, which NumPy does not know by name
        return 2


def check_model(model, argument="model"):
    """``model`` if it is a Keras model, else a TypeError naming
    ``argument``."""
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"{argument} must be a keras.Model; received "
                        f"{argument}={model!r}"[:300])
    return model


def check_plain(model, layout):
    """Refuses a model quantized by Keras or carrying LoRA adapters: the
    checkpoint layouts hold one float kernel per projection."""
    from keras_vit.runtime import compat

    layers = compat.flatten_layers(model)
    modes = sorted({layer.quantization_mode for layer in layers
                    if getattr(layer, "quantization_mode", None)})
    if modes:
        raise CheckpointError(
            f"model={model.name!r} is quantized by Keras (mode="
            f"{'/'.join(modes)}); the {layout} layout holds float weights: "
            "convert the float model, then quantize after loading")
    if any(getattr(layer, "lora_enabled", False) for layer in layers):
        raise CheckpointError(
            f"model={model.name!r} has LoRA adapters; the {layout} layout "
            "holds plain kernels: keras_vit.models.lora.merge(model) returns "
            "the model with the adapters merged into them")

