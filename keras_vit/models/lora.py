"""LoRA fine-tuning of the keras_vit models with Keras' own adapters.

This module picks the layers, freezes everything else, counts what
trains, saves and loads the adapters alone, and merges them into plain
kernels for export. Keras shapes ``A`` (D, heads, rank) for q/k/v, so an
attention adapter costs more than a 2-D one (ViT-B/16, rank 8: 12.5% of a
kernel against 2.1%).

>>> import numpy as np, keras_vit
>>> from keras_vit.models import lora
>>> model = keras_vit.vit(32, 8, 32, 1, 2, 64, 3)
>>> x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
>>> before = np.asarray(model(x))
>>> report = lora.enable_lora(model, rank=4, targets="attention")
>>> report["layers"], report["trainable"] < report["total"]
(4, True)
>>> bool(np.allclose(model(x), before))      # B starts at zero
True
>>> merged = lora.merge(model)               # plain kernels, no adapters
>>> any("lora" in w.path for w in merged.weights)
False
"""

from __future__ import annotations

import os

import keras
import numpy as np

from keras_vit.runtime import compat
from keras_vit.base import atomic
from keras_vit.base.archives import read_npz
from keras_vit.base.checks import check_int

#: The layer names of each target group.
TARGETS = {
    "attention": ("query", "key", "value", "out"),
    "mlp": ("dense_0", "dense_1"),
    "all": ("query", "key", "value", "out", "dense_0", "dense_1"),
}
_ADAPTER_NAMES = ("lora_kernel_a", "lora_kernel_b")
# Trained in full beside the adapters by default: a new head.
_HEAD = ("head",)


def _dense_like(layer):
    return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))


def _names(targets):
    if isinstance(targets, str):
        if targets not in TARGETS:
            raise ValueError(
                f"targets must be one of {sorted(TARGETS)} or a list of "
                f"layer names; received targets={targets!r}")
        return set(TARGETS[targets])
    if not isinstance(targets, (list, tuple, set)) or not targets or not all(
            isinstance(t, str) for t in targets):
        raise ValueError(
            "targets must be 'attention', 'mlp', 'all' or a non-empty list "
            f"of layer names; received targets={targets!r}")
    return set(targets)


def target_layers(model, targets="all"):
    """The ``Dense``/``EinsumDense`` layers of ``model`` named in
    ``targets`` (a group of :data:`TARGETS` or a list of layer names)."""
    names = _names(targets)
    found = [layer for layer in compat.flatten_layers(model, False)
             if _dense_like(layer) and layer.name in names]
    missing = names - {layer.name for layer in found}
    if missing:
        have = sorted({layer.name for layer in compat.flatten_layers(
            model, False) if _dense_like(layer)})
        raise ValueError(
            f"targets name layers that model={model.name!r} does not have: "
            f"{sorted(missing)} (its dense layers: {have}); received "
            f"targets={targets!r}")
    return found


def trainable_report(model):
    """``{"layers": LoRA layers, "trainable": parameters that train,
    "total": all parameters, "fraction": trainable / total}``; the frozen
    base kernels count in the total, the adapters in both."""
    total = sum(int(np.prod(w.shape)) for w in model.weights)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    layers = len(_adapter_layers(model))
    return {"layers": layers, "trainable": trainable, "total": total,
            "fraction": trainable / total if total else 0.0}


def _check_train(train):
    if isinstance(train, str) or not all(isinstance(t, str) for t in train):
        raise ValueError("train must be a list of layer names, e.g. "
                         f"['head']; received train={train!r}")
    return set(train)


def enable_lora(model, rank=8, targets="all", alpha=None, train=_HEAD):
    """Enables Keras' LoRA (``layer.enable_lora(rank, alpha)``) on the
    ``targets`` of ``model`` and freezes every other weight but those of
    the layers named in ``train`` (default: the ``head``). Returns
    :func:`trainable_report`. Call it before ``compile``.
    """
    rank = check_int("rank", rank, low=1)
    train = _check_train(train)
    layers = target_layers(model, targets)
    already = [layer.path for layer in layers if layer.lora_enabled]
    if already:
        raise ValueError(
            f"LoRA is already enabled on {already[:5]}; received "
            f"targets={targets!r}")
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    keep = set()
    for layer in compat.flatten_layers(model, False):
        if getattr(layer, "lora_enabled", False):
            keep.update(id(getattr(layer, n)) for n in _ADAPTER_NAMES)
        elif layer.name in train:
            keep.update(id(w) for w in layer.weights)
    for weight in model.weights:
        weight.trainable = id(weight) in keep
    # A frozen BatchNorm normalises by its running statistics.
    for layer in compat.flatten_layers(model, False):
        if (isinstance(layer, keras.layers.BatchNormalization)
                and layer.name not in train):
            layer.trainable = False
    return trainable_report(model)


def _adapter_layers(model):
    return [layer for layer in compat.flatten_layers(model, False)
            if getattr(layer, "lora_enabled", False)]


def save_adapters(model, path):
    """Writes the adapters and every other trainable weight of ``model``
    to an ``.npz`` (by variable path, with each layer's rank and alpha),
    atomically."""
    layers = _adapter_layers(model)
    if not layers:
        raise ValueError(f"model={model.name!r} has no LoRA adapters; call "
                         "keras_vit.models.lora.enable_lora first")
    arrays = {w.path: keras.ops.convert_to_numpy(w.value)
              for w in model.trainable_weights}
    arrays["lora_config"] = np.array(
        [f"{layer.path}:{layer.lora_rank}:{layer.lora_alpha}"
         for layer in layers])
    path = os.fspath(path)
    with atomic.atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)
    return path


def load_adapters(model, path):
    """Loads what :func:`save_adapters` wrote into ``model``, enabling LoRA
    with the saved rank and alpha where it is not on yet. Every array must
    find its variable and every adapter its array, or nothing changes."""
    arrays = read_npz(os.fspath(path))  # headers bounded, never unpickled
    config = arrays.pop("lora_config", None)
    if config is None:
        raise ValueError(f"path={os.fspath(path)!r} holds no LoRA adapters "
                         "(no lora_config entry)")
    by_path = {layer.path: layer
               for layer in compat.flatten_layers(model, False)}
    wanted = []
    for entry in config.tolist():
        layer_path, rank, alpha = entry.rsplit(":", 2)
        layer = by_path.get(layer_path)
        if layer is None or not _dense_like(layer):
            raise ValueError(
                f"the adapters of path={os.fspath(path)!r} are for a layer "
                f"{layer_path!r} that model={model.name!r} does not have")
        wanted.append((layer, int(rank), float(alpha)))
    for layer, rank, alpha in wanted:
        if not layer.lora_enabled:
            layer.enable_lora(rank, lora_alpha=alpha)
        elif (layer.lora_rank, float(layer.lora_alpha)) != (rank, alpha):
            raise ValueError(
                f"{layer.path} has LoRA rank {layer.lora_rank}, alpha "
                f"{layer.lora_alpha}; the file has rank {rank}, alpha {alpha}")
    variables = {w.path: w for w in model.weights}
    unknown = sorted(set(arrays) - set(variables))
    mis_shaped = [f"{k}: file {arrays[k].shape} vs model "
                  f"{tuple(variables[k].shape)}" for k in arrays
                  if k in variables
                  and tuple(arrays[k].shape) != tuple(variables[k].shape)]
    adapters = {getattr(layer, n).path for layer, _, _ in wanted
                for n in _ADAPTER_NAMES}
    missing = sorted(adapters - set(arrays))
    problems = ([f"unknown: {unknown[:5]}"] if unknown else []) + (
        [f"mis-shaped: {mis_shaped[:5]}"] if mis_shaped else []) + (
        [f"missing: {missing[:5]}"] if missing else [])
    if problems:
        raise ValueError(f"the adapters of path={os.fspath(path)!r} do not "
                         f"fit model={model.name!r}: " + "; ".join(problems))
    for key, value in arrays.items():
        variables[key].assign(value)
    for weight in model.weights:   # what trained then trains now
        weight.trainable = weight.path in arrays
    return trainable_report(model)


def merge(model):
    """A copy of ``model`` without adapters whose kernels are the merged
    ``kernel + (alpha / rank) A @ B``. A quantized model is refused."""
    if any(getattr(layer, "quantization_mode", None)
           for layer in compat.flatten_layers(model, False)):
        raise ValueError(
            f"merge: model={model.name!r} is quantized; merge the adapters "
            "into the float model, then quantize the merged copy")
    merged = model.__class__.from_config(model.get_config())
    layers = {layer.path: layer
              for layer in compat.flatten_layers(model, False)}
    variables = {w.path: w for w in model.weights}
    for var in merged.weights:
        layer_path, name = var.path.rsplit("/", 1)
        layer = layers.get(layer_path)
        if name == "kernel" and getattr(layer, "lora_enabled", False):
            value = layer.kernel   # Keras adds (alpha / rank) A @ B
        else:
            value = variables[var.path]
        var.assign(keras.ops.convert_to_numpy(keras.ops.cast(value,
                                                             var.dtype)))
    return merged
