"""``model.quantize(mode)`` for the keras_vit models: Keras' own, with
the modes it cannot apply to an image model refused in one line and the
layers it leaves in float listed once.

Every projection of the package is a Keras ``Dense`` or ``EinsumDense``,
so Keras quantizes them. The layers with no quantized form get one warning
naming them by class, not one per layer.

>>> import warnings, keras_vit
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     model.quantize("int8")
>>> notes = [str(w.message) for w in caught if w.category is UserWarning]
>>> len(notes), "LayerNormalization" in notes[0]
(1, True)
>>> sorted({layer.quantization_mode for layer in model._flatten_layers()
...         if layer.name in ("query", "dense_0", "head")})
['int8']
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings

import keras

from keras_vit.runtime import compat

#: The modes Keras applies to a keras_vit model.
MODES = ("int8", "int4", "float8")
# Keras' GPTQ and AWQ calibrate on batches converted to int32 token ids.
_TOKEN_CALIBRATED = ("gptq", "awq")


def _keras_modes():
    return compat.quantization_modes(MODES)


def check_mode(mode, config=None, model_name="model"):
    """``mode`` (or ``config.mode``) if Keras can quantize a keras_vit
    model with it, else a one-line ValueError naming it."""
    resolved = mode if mode is not None else getattr(config, "mode", None)
    if resolved in _TOKEN_CALIBRATED:
        raise ValueError(
            f"quantize: mode={resolved!r} is not available for "
            f"{model_name}: Keras' {resolved.upper()} calibrates on token "
            "ids (it converts every calibration batch to int32), which an "
            f"image model does not take; use one of {', '.join(MODES)}")
    if resolved not in MODES:
        raise ValueError(
            f"quantize: unknown mode={resolved!r}; Keras "
            f"{keras.__version__} quantizes keras_vit models with one of "
            f"{', '.join(MODES)} (it knows {', '.join(_keras_modes())})")
    return resolved


def _left_in_float(model):
    """``{class name: [layer names]}`` of the leaf layers with weights
    that are not quantized."""
    left = {}
    for layer in compat.flatten_layers(model, include_self=False):
        if len(list(layer._flatten_layers())) != 1 or not layer.weights:
            continue
        if getattr(layer, "quantization_mode", None) is None:
            left.setdefault(type(layer).__name__, []).append(layer.name)
    return left


def _first_three(names):
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def describe_float_layers(left, mode):
    """One line: how many layers of each class stay in float."""
    parts = [f"{cls} x{len(names)} ({_first_three(sorted(set(names)))})"
             for cls, names in sorted(left.items())]
    return (f"quantize({mode!r}) left {sum(map(len, left.values()))} layers "
            "with weights in float (Keras has no quantized form for them): "
            + "; ".join(parts))


def _check_quantizable(model, layers, mode):
    """A ValueError naming what stops ``model.quantize(mode)`` on
    ``layers``, before any of them changes: LoRA adapters (a pairing a
    saved ``.keras`` file does not restore exactly), or layers quantized
    already."""
    adapted = [layer.path for layer in compat.flatten_layers(
        model, include_self=False) if getattr(layer, "lora_enabled", False)]
    if adapted:
        raise ValueError(
            f"quantize: model={model.name!r} has LoRA adapters "
            f"({_first_three(adapted)}); merge them first "
            "(keras_vit.models.lora.merge) and quantize the merged model")
    done = [layer.path for layer in layers
            if getattr(layer, "quantization_mode", None) is not None]
    if done:
        raise ValueError(
            f"quantize({mode!r}): model={model.name!r} has layers quantized "
            f"already ({_first_three(done)}); nothing was changed. "
            "Quantize a float model (or pass filters= that leave them out)")


class QuantizeMixin:
    """Mixed into the keras_vit model classes, first among their bases
    (its ``get_config`` adds to :class:`ConstructorConfig`'s)."""

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls, *args, **kwargs)
        # Keras' Layer.__new__ wraps quantize with config messages for
        # modes that cannot work on an image model: check before it.
        keras_quantize = obj.quantize

        @functools.wraps(keras_quantize)
        def quantize(mode=None, config=None, **kwargs):
            check_mode(mode, config, repr(obj.name))
            return keras_quantize(mode=mode, config=config, **kwargs)

        obj.quantize = quantize
        return obj

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras' ``Model.quantize`` (``"int8"``, ``"int4"``,
        ``"float8"``) with other modes refused naming the mode, and one
        warning listing the layers that stay in float. A model with LoRA
        adapters or layers quantized already is refused before any
        changes."""
        mode = check_mode(mode, config, repr(self.name))
        type_check = kwargs.pop("type_check", True)
        if kwargs:
            raise ValueError(f"quantize: unknown keyword arguments "
                             f"{sorted(kwargs)}; received {kwargs!r}")
        # Keras' own loop passes over AttributeErrors: here they surface.
        layers = [layer
                  for layer in compat.flatten_layers(self, include_self=False)
                  if len(list(layer._flatten_layers())) == 1
                  and layer.weights
                  and compat.should_quantize_layer(layer, filters)]
        _check_quantizable(self, layers, mode)
        changed = False
        with _one_garbage_collection():
            for layer in layers:
                try:
                    layer.quantize(mode, type_check=type_check,
                                   config=config)
                except NotImplementedError:
                    continue  # no quantized form: listed below
                changed = True
        if changed:
            # What Keras' Model.quantize does after its loop.
            self.train_function = None
            self.test_function = None
            self.predict_function = None
            post = getattr(self, "_post_quantize", None)
            if post is not None:
                post(mode)
        left = _left_in_float(self)
        if left:
            # Past Keras' quantize wrapper and ours: the caller's line.
            warnings.warn(describe_float_layers(left, mode), UserWarning,
                          stacklevel=4)

    # -- saving: ``quantization`` lists the layers to quantize before a
    # quantized model's weights load.

    def get_config(self):
        config = super().get_config()
        quantized = quantized_layers(self)
        if quantized:
            config["quantization"] = quantized
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        quantized = config.pop("quantization", None)
        model = super().from_config(config, custom_objects=custom_objects)
        if quantized:
            requantize(model, quantized)
        return model


def quantized_layers(model):
    """``[[layer path, mode, serialized config or None], ...]`` of the
    quantized layers of ``model``."""
    out = []
    for layer in compat.flatten_layers(model, include_self=False):
        mode = getattr(layer, "quantization_mode", None)
        if mode is None or len(list(layer._flatten_layers())) != 1:
            continue
        config = getattr(layer, "quantization_config", None)
        out.append([layer.path, mode, None if config is None else
                    keras.saving.serialize_keras_object(config)])
    return out


def requantize(model, quantized):
    """Quantizes the layers that :func:`quantized_layers` listed, so that
    the weights of a quantized model load into ``model``."""
    by_path = {layer.path: layer
               for layer in compat.flatten_layers(model, include_self=False)}
    missing = [entry[0] for entry in quantized if entry[0] not in by_path]
    if missing:
        raise ValueError(
            f"quantization lists layers that model={model.name!r} does not "
            f"have: {missing[:5]}")
    with _one_garbage_collection():
        for path, mode, config in quantized:
            if config is not None:
                config = keras.saving.deserialize_keras_object(config)
            by_path[path].quantize(mode, config=config)


@contextlib.contextmanager
def _one_garbage_collection():
    """One full garbage collection instead of one per quantized layer:
    Keras' ``Layer.__delattr__`` collects each time (~0.9 s per layer)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()
