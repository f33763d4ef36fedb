"""Which image shapes a model takes, decided in one place.

A model built for one size takes exactly that (height, width); a
dynamic-size model takes any height and width that are positive multiples
of its patch grid's stride. :class:`ImageSizes` holds that rule and checks
it wherever images enter; :func:`check_image_size` checks the size a model
is built for.

>>> sizes = ImageSizes(size=(32, 32), channels=3)
>>> sizes.describe()
'32x32x3'
>>> sizes.check((2, 32, 32, 3))
>>> sizes.check((2, 0, 32, 3))
Traceback (most recent call last):
ValueError: images must have the shape (batch, 32, 32, 3); received images of shape (2, 0, 32, 3)
>>> dynamic = ImageSizes(multiple=8, channels=3)
>>> dynamic.describe()
'height and width positive multiples of 8'
>>> dynamic.refusal((1, 33, 32, 3)).endswith("received images of shape "
...                                          "(1, 33, 32, 3)")
True
"""

from __future__ import annotations

import math

import json
import sys

from keras_vit.base.checks import check_pair
from keras_vit.base.limits import MAX_IMAGE_SIDE


def check_image_size(value, name="image_size"):
    """``(height, width)`` from an int or a pair of positive ints, each
    side at most :data:`~keras_vit.base.limits.MAX_IMAGE_SIDE`; else a
    one-line ValueError naming ``name``.

    >>> check_image_size(224)
    (224, 224)
    >>> check_image_size((32, 10**6))
    Traceback (most recent call last):
    ValueError: image_size must be at most 4096 pixels a side; received image_size=(32, 1000000)
    """
    pair = check_pair(name, value)
    if max(pair) > MAX_IMAGE_SIDE:
        raise ValueError(f"{name} must be at most {MAX_IMAGE_SIDE} pixels a "
                         f"side; received {name}={value!r}")
    return pair


class ImageSizes:
    """The image shapes a model takes: ``size`` (height, width) exactly,
    or, with ``size=None``, any height and width that are positive
    multiples of ``multiple``; ``channels`` (None: any)."""

    def __init__(self, size=None, multiple=1, channels=None):
        self.size = None if size is None else tuple(int(s) for s in size)
        self.multiple = int(multiple)
        self.channels = None if channels is None else int(channels)

    @property
    def dynamic(self):
        return self.size is None

    def __eq__(self, other):
        return (isinstance(other, ImageSizes)
                and self.to_json() == other.to_json())

    def __repr__(self):
        return f"ImageSizes({self.to_json()})"

    def describe(self):
        """The rule in words: ``"32x32x3"`` or ``"height and width
        positive multiples of 8"``."""
        if not self.dynamic:
            return "x".join(str(s) for s in self.size + (
                (self.channels,) if self.channels is not None else ()))
        return f"height and width positive multiples of {self.multiple}"

    def _expected(self):
        channels = "channels" if self.channels is None else self.channels
        if not self.dynamic:
            return (f"images must have the shape (batch, {self.size[0]}, "
                    f"{self.size[1]}, {channels})")
        return (f"images must have the shape (batch, height, width, "
                f"{channels}) with height and width positive multiples of "
                f"{self.multiple}")

    def refusal(self, shape):
        """Why images of ``shape`` are refused (one line), or None when
        they are taken. Dimensions that are None (not known yet) pass."""
        shape = tuple(shape)
        reason = None
        if len(shape) != 4:
            reason = True
        else:
            height, width, channels = shape[1:]
            known = [s for s in (height, width) if s is not None]
            if self.channels is not None and channels is not None and (
                    channels != self.channels):
                reason = True
            elif not self.dynamic:
                reason = any(s is not None and s != want
                             for s, want in zip((height, width), self.size))
            else:
                reason = any(s < 1 or s % self.multiple for s in known)
        if not reason:
            return None
        shown = tuple(None if s is None else int(s) for s in shape)
        return f"{self._expected()}; received images of shape {shown}"

    def check(self, shape):
        """ValueError (:meth:`refusal`) unless images of ``shape`` are
        taken."""
        reason = self.refusal(shape)
        if reason is not None:
            raise ValueError(reason)

    def check_images(self, images):
        """``images`` after the check: sizes known now are checked here
        (ValueError); on a TensorFlow graph the result also depends on an
        assertion with the same words, evaluated when it runs (a SavedModel
        signature takes other sizes than its static shape, and a VALID
        convolution drops the extra rows without a word)."""
        self.check(tuple(images.shape))
        tf = sys.modules.get("tensorflow")
        if (tf is None or not tf.is_symbolic_tensor(images)
                or len(images.shape) != 4):
            return images
        shape = tf.shape(images)
        height, width = shape[1], shape[2]
        if self.dynamic:
            conditions = [height >= 1, width >= 1,
                          tf.equal(height % self.multiple, 0),
                          tf.equal(width % self.multiple, 0)]
        else:
            conditions = [tf.equal(height, self.size[0]),
                          tf.equal(width, self.size[1])]
        check = tf.debugging.Assert(
            tf.reduce_all(tf.stack(conditions)),
            [f"{self._expected()}; received images of shape", shape])
        with tf.control_dependencies([check]):
            images = tf.identity(images)
        if self.dynamic and self.multiple > 1:
            # The same rule in shape arithmetic, which survives converters
            # that drop assertions (tf2onnx, OpenVINO's frontend).
            m = self.multiple
            cells = tf.stack([shape[0], height // m, m, width // m, m,
                              shape[3]])
            images = tf.reshape(tf.reshape(images, cells), shape)
        return images

    def refused_examples(self):
        """Image (height, width) pairs the rule refuses, for the checks of
        an exported artifact."""
        if self.dynamic:
            m = self.multiple
            pairs = [(0, m), (m, 0)]
            if m > 1:  # every positive size is a multiple of 1
                pairs += [(m + 1, m), (m, 2 * m + 1), (1, 1), (m - 1, m - 1)]
            return pairs
        h, w = self.size
        pairs = [(0, w), (1, 1), (h + 1, w), (2 * h, 2 * w), (h, 2 * w)]
        return [p for p in dict.fromkeys(pairs) if p != self.size]

    def to_json(self):
        """The rule as JSON-able data."""
        data = {"channels": self.channels}
        if self.dynamic:
            data.update(image_size="dynamic", multiple_of=self.multiple)
        else:
            data.update(image_size=list(self.size))
        return data

    def to_text(self):
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data):
        if data.get("image_size") == "dynamic":
            return cls(multiple=data["multiple_of"],
                       channels=data.get("channels"))
        return cls(size=data["image_size"], channels=data.get("channels"))


def image_sizes(model):
    """The :class:`ImageSizes` of ``model`` (one image input): its
    input's height and width when fixed; else positive multiples of the
    strides its layers need (1 for a ResNet)."""
    cached = model.__dict__.get("_keras_vit_image_sizes")
    if cached is not None:
        return cached
    shape = tuple(model.inputs[0].shape)
    channels = shape[-1] if len(shape) == 4 else None
    if len(shape) == 4 and shape[1] is not None and shape[2] is not None:
        sizes = ImageSizes(size=shape[1:3], channels=channels)
    else:
        from keras_vit.runtime import compat

        layers = compat.flatten_layers(model)
        strides = [layer.stride for layer in layers
                   if getattr(layer, "stride", None)
                   and layer.name.startswith("position_embedding")]
        strides += [layer.patch_size for layer in layers
                    if getattr(layer, "patch_size", None)
                    and layer.name.startswith("patch_embedding")]
        strides += [layer.image_multiple for layer in layers
                    if getattr(layer, "image_multiple", None)]
        sizes = ImageSizes(multiple=math.lcm(*strides) if strides else 1,
                           channels=channels)
    model.__dict__["_keras_vit_image_sizes"] = sizes
    return sizes
