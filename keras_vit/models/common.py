"""The two ends every model class of the package (ViT and its hybrids,
Axial-ViT, BiT) builds the same way: the image input with its optional
rescaling, and the classification head.

The layer names here (``images``, ``preprocessing``, ``pooling``,
``pre_logits``, ``head``, ``predictions``) are those of every checkpoint
written so far: the zoo's converters and saved ``.keras`` files find the
weights by them.
"""

from __future__ import annotations

import keras
from keras import layers


def image_input(image_hw, num_channels, include_preprocessing, dtype):
    """The ``images`` input of shape (height, width, channels); returns
    ``(inputs, x)``, ``x`` rescaled when ``include_preprocessing``."""
    inputs = keras.Input(shape=(*image_hw, num_channels), name="images")
    x = inputs
    if include_preprocessing:
        # uint8 pixels -> [-1, 1], the input range of the official ViT and
        # BiT code, not ImageNet mean/std (timm's BiT configs use
        # mean = std = 0.5 for the same reason).
        x = layers.Rescaling(1.0 / 127.5, offset=-1.0, dtype=dtype,
                             name="preprocessing")(x)
    return inputs, x


def classification_head(x, pooling_layer, include_top, representation_size,
                        num_classes, bias_initializer, classifier_activation,
                        dtype):
    """``pooling_layer`` (or none), the optional ``pre_logits`` Dense +
    tanh, and, with ``include_top``, the zero-initialised ``head`` (its bias
    from ``bias_initializer``) and its activation."""
    if pooling_layer is not None:
        x = pooling_layer(x)
        if representation_size is not None:
            x = layers.Dense(representation_size, activation="tanh",
                             kernel_initializer="lecun_normal",
                             dtype=dtype, name="pre_logits")(x)
    if include_top:
        x = layers.Dense(num_classes, kernel_initializer="zeros",
                         bias_initializer=bias_initializer, dtype=dtype,
                         name="head")(x)
        if classifier_activation is not None:
            # Float32 so that softmax stays exact under mixed precision.
            x = layers.Activation(classifier_activation, dtype="float32",
                                  name="predictions")(x)
    return x
