"""The input normalisation of a model: how [0, 255] pixels become what its
weights expect, decided here for every path (the model's own
``preprocessing`` layer, the training pipeline, ``predict``, the exported
serving graphs, analysis).

A model records its normalisation as the constructor argument
``input_normalization`` (None: the official [-1, 1] of ViT and BiT).

>>> import numpy as np
>>> official = check_normalization("input_normalization", None)
>>> float(official(np.float32(255.0))), float(official(np.float32(0.0)))
(1.0, -1.0)
>>> imagenet = check_normalization("input_normalization", "imagenet")
>>> imagenet.mean
(0.485, 0.456, 0.406)
>>> check_normalization("input_normalization", "bgr")  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: input_normalization must be one of ...; received 'bgr'
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class InputNormalization(NamedTuple):
    """Per-channel ``mean`` and ``std`` of [0, 1] pixels: a model input is
    ``(pixels / 255 - mean) / std``, computed as ``pixels * scale +
    offset`` (one multiply-add, what Keras' ``Rescaling`` does)."""

    mean: tuple
    std: tuple

    @property
    def scale(self):
        """float32 per channel (a float when the channels agree)."""
        return _collapse([1.0 / (255.0 * s) for s in self.std])

    @property
    def offset(self):
        return _collapse([-m / s for m, s in zip(self.mean, self.std)])

    def __call__(self, pixels):
        """``pixels`` (NumPy, TensorFlow or Keras tensors, channels last)
        in [0, 255] -> the model's input range."""
        return pixels * self.scale + self.offset

    def pixels(self, inputs):
        """The inverse map: model inputs -> [0, 255] pixels (what an
        objective defined on the pixels' colours reads back).

        >>> clip = NAMED["clip"]
        >>> [round(float(v), 3) for v in clip.pixels(clip(
        ...     np.float32([0.0, 127.0, 255.0])))]
        [0.0, 127.0, 255.0]
        """
        return (inputs - self.offset) / self.scale

    def layer(self, dtype=None, name="preprocessing"):
        """The same map as a Keras ``Rescaling`` layer."""
        import keras

        return keras.layers.Rescaling(self.scale.tolist(),
                                      offset=self.offset.tolist(),
                                      dtype=dtype, name=name)

    def to_config(self):
        """The JSON form: ``{"mean": [...], "std": [...]}``."""
        return {"mean": list(self.mean), "std": list(self.std)}


def _collapse(values):
    array = np.asarray(values, "float32")
    return np.float32(array[0]) if np.all(array == array[0]) else array


# The normalisations the family's weights were trained with, by name.
NAMED = {
    # The official ViT/BiT code (and timm's "inception" mean/std): [-1, 1].
    "official": InputNormalization((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    # torchvision's ImageNet statistics: DeiT, DeiT-III, DINOv2, BEiT.
    "imagenet": InputNormalization((0.485, 0.456, 0.406),
                                   (0.229, 0.224, 0.225)),
    # OpenAI CLIP's.
    "clip": InputNormalization((0.48145466, 0.4578275, 0.40821073),
                               (0.26862954, 0.26130258, 0.27577711)),
    # DINOv3's satellite weights: the statistics of its SAT-493M images.
    "sat493m": InputNormalization((0.430, 0.411, 0.296),
                                  (0.213, 0.156, 0.143)),
}
OFFICIAL = NAMED["official"]


def config_value(normalization):
    """What a model's ``input_normalization`` argument keeps for
    ``normalization`` (an :class:`InputNormalization`): None when it is the
    official [-1, 1] (to float32 rounding), else its
    ``{"mean": [...], "std": [...]}``.

    >>> config_value(NAMED["official"]) is None
    True
    >>> config_value(InputNormalization((0.5,) * 3, (0.50000003,) * 3))
    >>> config_value(NAMED["imagenet"])["std"]
    [0.229, 0.224, 0.225]
    """
    official = (0.5,) * len(normalization.mean)
    if same(normalization, InputNormalization(official, official)):
        return None
    return normalization.to_config()


def check_normalization(name, value, channels=3):
    """``value`` as an :class:`InputNormalization`: None (the official
    [-1, 1]), a name of :data:`NAMED`, ``{"mean": [...], "std": [...]}``
    or an ``InputNormalization``, with ``channels`` entries each (one
    entry is broadcast), finite means and positive finite stds."""
    if value is None:  # the official [-1, 1], for any number of channels
        value = InputNormalization((0.5,) * channels, (0.5,) * channels)
    elif isinstance(value, str):
        if value not in NAMED:
            raise ValueError(f"{name} must be one of {sorted(NAMED)} or "
                             "{'mean': [...], 'std': [...]}; received "
                             f"{value!r}")
        value = NAMED[value]
    elif isinstance(value, dict):
        if set(value) != {"mean", "std"}:
            raise ValueError(f"{name} must have exactly the keys 'mean' and "
                             f"'std'; received {value!r}")
        value = InputNormalization(value["mean"], value["std"])
    elif not isinstance(value, InputNormalization):
        raise ValueError(f"{name} must be None, a name of {sorted(NAMED)} or "
                         "{'mean': [...], 'std': [...]}; received "
                         f"{value!r}")
    fields = []
    for field, entries in zip(("mean", "std"), value):
        if isinstance(entries, (int, float)) and not isinstance(entries, bool):
            entries = [entries]
        try:
            if isinstance(entries, str) or any(isinstance(v, bool)
                                               for v in entries):
                raise TypeError(entries)
            entries = [float(v) for v in entries]
        except (TypeError, ValueError):
            raise ValueError(f"{name}['{field}'] must be numbers; received "
                             f"{value}") from None
        if len(entries) == 1:
            entries = entries * channels
        if len(entries) != channels or not all(math.isfinite(v)
                                               for v in entries):
            raise ValueError(f"{name}['{field}'] must hold {channels} finite "
                             f"numbers (one per channel); received {entries}")
        if field == "std" and not all(v > 0 for v in entries):
            raise ValueError(f"{name}['std'] must be positive; received "
                             f"{entries}")
        fields.append(tuple(entries))
    result = InputNormalization(*fields)
    with np.errstate(all="ignore"):
        finite = np.all(np.isfinite(result(np.float32([[0.0] * channels,
                                                       [255.0] * channels]))))
    if not finite:  # a std so small (or a mean so large) it overflows
        raise ValueError(f"{name} maps pixels to values float32 cannot hold; "
                         f"received {value}")
    return result


def takes_raw_pixels(model):
    """Whether ``model`` normalises [0, 255] pixels itself (built with
    ``include_preprocessing=True``).

    >>> import keras_vit
    >>> kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
    ...           num_heads=1, mlp_dim=8, num_classes=2)
    >>> takes_raw_pixels(keras_vit.vit(**kw, include_preprocessing=True))
    True
    >>> takes_raw_pixels(keras_vit.vit(**kw))
    False
    """
    config = _config(model)
    if "include_preprocessing" in config:
        return bool(config["include_preprocessing"])
    if isinstance(getattr(model, "include_preprocessing", None), bool):
        return model.include_preprocessing
    # A model of another origin: its first layers tell.
    import keras

    return any(isinstance(layer, keras.layers.Rescaling)
               and layer.name == "preprocessing"
               for layer in getattr(model, "layers", ())[:3])


def of_model(model):
    """The :class:`InputNormalization` ``model``'s weights expect (the
    official [-1, 1] when the model records none)."""
    config = _config(model)
    value = (config["input_normalization"] if "input_normalization" in config
             else getattr(model, "input_normalization", None))
    return check_normalization("input_normalization", value)


def record_inputs(derived, model):
    """Gives ``derived``, a model built over ``model``'s input, ``model``'s
    input convention as attributes that :func:`takes_raw_pixels` and
    :func:`of_model` read; returns ``derived``."""
    derived.include_preprocessing = takes_raw_pixels(model)
    derived.input_normalization = config_value(of_model(model))
    return derived


def model_input(model, pixels):
    """``pixels`` in [0, 255] as ``model`` takes them: unchanged when the
    model normalises them itself, else normalised as its weights expect."""
    return pixels if takes_raw_pixels(model) else of_model(model)(pixels)


def same(a, b):
    """Whether two :class:`InputNormalization` s are one map (to float32
    rounding)."""
    return (len(a.mean) == len(b.mean)
            and np.allclose(a.mean, b.mean, rtol=0, atol=1e-6)
            and np.allclose(a.std, b.std, rtol=0, atol=1e-6))


def describe(normalization):
    """``normalization`` in words, for messages.

    >>> describe(NAMED["official"])
    'the official [-1, 1]'
    >>> describe(NAMED["imagenet"])
    "{'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]}"
    """
    value = config_value(normalization)
    return "the official [-1, 1]" if value is None else str(value)


def pipeline_options(model=None, *, raw_pixels=None,
                     input_normalization=None):
    """``{"raw_pixels": ..., "input_normalization": ...}``: the keywords
    of the training and evaluation pipelines (``keras_vit.train.data``)
    that feed ``model`` what it takes. Without a model, the arguments
    decide (None: the official [-1, 1]); with one, the model decides and
    an argument that says otherwise is refused (wrong inputs train
    without error).

    >>> import keras_vit
    >>> kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
    ...           num_heads=1, mlp_dim=8, num_classes=2)
    >>> deit_like = keras_vit.vit(**kw, input_normalization="imagenet")
    >>> pipeline_options(deit_like)["input_normalization"].mean
    (0.485, 0.456, 0.406)
    >>> pipeline_options()["input_normalization"] == NAMED["official"]
    True
    >>> pipeline_options(deit_like, input_normalization="clip")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: input_normalization='clip' contradicts model='vision_...
    """
    if raw_pixels is not None and not isinstance(raw_pixels,
                                                 (bool, np.bool_)):
        raise ValueError("raw_pixels must be True, False or None (as the "
                         f"model says); received raw_pixels={raw_pixels!r}")
    given = (None if input_normalization is None else check_normalization(
        "input_normalization", input_normalization))
    if model is None:
        return {"raw_pixels": bool(raw_pixels),
                "input_normalization": given or check_normalization(
                    "input_normalization", None)}
    raw, normalization = takes_raw_pixels(model), of_model(model)
    name = getattr(model, "name", type(model).__name__)
    if raw_pixels is not None and bool(raw_pixels) != raw:
        takes = ("[0, 255] pixels (it normalises them itself: "
                 "include_preprocessing=True)" if raw else
                 f"pixels normalised as {describe(normalization)}")
        raise ValueError(f"raw_pixels={raw_pixels!r} contradicts "
                         f"model={name!r}, which takes {takes}; leave "
                         "raw_pixels out and the model decides")
    if given is not None and not same(given, normalization):
        raise ValueError(
            f"input_normalization={_shown(input_normalization)} contradicts "
            f"model={name!r}, whose weights expect "
            f"{describe(normalization)}; leave input_normalization out and "
            "the model decides")
    return {"raw_pixels": raw, "input_normalization": normalization}


def _shown(value):
    return repr(value.to_config() if isinstance(value, InputNormalization)
                else value)


def _config(model):
    try:
        config = model.get_config()
    except (AttributeError, NotImplementedError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}
