"""Training augmentations beyond crop and flip, each off unless asked
for (the paper's recipes use none), in the order of DeiT's and DeiT III's
pipelines: 3-Augment, colour jitter, RandAugment, random erasing.

Two stages: per image (:func:`make_augment`), 3-Augment, colour jitter
and RandAugment's draws as stateless TensorFlow ops; per batch, before
the scaling (:func:`make_batch_augment`), RandAugment with Pillow's
operations, then Keras' ``RandomErasing`` (the one with its own random
state).

>>> import numpy as np
>>> augment = make_augment(three_augment=True, color_jitter=0.3)
>>> image = np.full((8, 8, 3), 100.0, "float32")
>>> out = augment(image, (1, 2))
>>> tuple(out.shape), bool(np.all((out.numpy() >= 0) & (out.numpy() <= 255)))
((8, 8, 3), True)
"""

from __future__ import annotations

from keras_vit.base.checks import check_int, check_number
from keras_vit.base.limits import MAX_RANDAUGMENT_OPS

# RandAugment's magnitude scale (timm's and big_vision's level 0-10).
RANDAUGMENT_TOP_LEVEL = 10.0
# DeiT III's Gaussian blur sigma range; the kernel covers 3 sigma.
BLUR_SIGMA = (0.1, 2.0)
_BLUR_RADIUS = 6


def check_randaugment(value, name="randaugment"):
    """``(num_ops, magnitude)`` or ``(num_ops, magnitude, magnitude_std)``
    with ints and floats, or None; else a ValueError naming ``name``.

    >>> check_randaugment((2, 9)), check_randaugment((2, 9, 0.5))
    ((2, 9.0), (2, 9.0, 0.5))
    """
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise ValueError(f"{name} must be None, (num_ops, magnitude) or "
                         f"(num_ops, magnitude, magnitude_std); received "
                         f"{name}={value!r}")
    num_ops = check_int(f"{name} num_ops", value[0], low=1,
                        high=MAX_RANDAUGMENT_OPS)
    magnitude = check_number(f"{name} magnitude", value[1], low=0.0,
                             high=RANDAUGMENT_TOP_LEVEL)
    if len(value) == 2:
        return num_ops, float(magnitude)
    spread = check_number(f"{name} magnitude_std", value[2], low=0.0,
                          high=RANDAUGMENT_TOP_LEVEL)
    return num_ops, float(magnitude), float(spread)


def check_augment(randaugment=None, random_erasing=0.0, three_augment=False,
                  color_jitter=0.0):
    """The augmentation options checked (see :func:`make_augment`), or a
    ValueError naming the first bad one.

    >>> check_augment(randaugment=(2, 9), random_erasing=0.25)
    ((2, 9.0), 0.25, False, 0.0)
    """
    randaugment = check_randaugment(randaugment)
    check_number("random_erasing", random_erasing, low=0.0, high=1.0)
    if not isinstance(three_augment, bool):
        raise ValueError("three_augment must be True or False; received "
                         f"three_augment={three_augment!r}")
    check_number("color_jitter", color_jitter, low=0.0, high=1.0)
    return randaugment, float(random_erasing), three_augment, float(
        color_jitter)


def _gaussian_blur(image, sigma):
    """A separable Gaussian blur of ``sigma`` pixels (a scalar tensor)
    over a fixed 13-tap kernel, edge pixels repeated outside the image."""
    import tensorflow as tf

    taps = tf.range(-_BLUR_RADIUS, _BLUR_RADIUS + 1, dtype=tf.float32)
    kernel = tf.exp(-0.5 * tf.square(taps / sigma))
    kernel = kernel / tf.reduce_sum(kernel)
    shape = tf.shape(image)

    def padded(size):
        return tf.clip_by_value(
            tf.range(-_BLUR_RADIUS, size + _BLUR_RADIUS), 0, size - 1)

    x = tf.gather(tf.gather(image, padded(shape[0]), axis=0),
                  padded(shape[1]), axis=1)[None]
    channels = shape[-1]
    rows = tf.tile(tf.reshape(kernel, (-1, 1, 1, 1)), [1, 1, channels, 1])
    cols = tf.tile(tf.reshape(kernel, (1, -1, 1, 1)), [1, 1, channels, 1])
    x = tf.nn.depthwise_conv2d(x, rows, [1, 1, 1, 1], "VALID")
    x = tf.nn.depthwise_conv2d(x, cols, [1, 1, 1, 1], "VALID")
    return x[0]


def apply_three_augment(image, seed):
    """DeiT III's 3-Augment: one of grayscale, solarisation and Gaussian
    blur, chosen uniformly per image from a stateless ``seed``.

    >>> import numpy as np
    >>> image = np.full((4, 4, 3), 200.0, "float32")
    >>> sorted({round(float(apply_three_augment(image, (s, 0))[0, 0, 0]))
    ...         for s in range(12)})  # blurred or grayscale: 200; solarised: 55
    [55, 200]
    """
    import tensorflow as tf

    pick_seed, sigma_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 2))
    pick = tf.random.stateless_uniform([], pick_seed, 0, 3, dtype=tf.int32)
    sigma = tf.random.stateless_uniform([], sigma_seed, *BLUR_SIGMA)
    return tf.switch_case(pick, [
        lambda: tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image)),
        lambda: tf.where(image >= 128.0, 255.0 - image, image),  # as PIL's
        lambda: _gaussian_blur(image, sigma)])


def jitter_color(image, strength, seed):
    """Brightness, contrast and saturation each scaled by a factor drawn
    in ``[1 - strength, 1 + strength]`` (torchvision's ``ColorJitter(s,
    s, s)`` in a fixed order).

    >>> import numpy as np
    >>> image = np.full((2, 2, 3), 100.0, "float32")
    >>> 70.0 <= float(jitter_color(image, 0.3, (0, 1))[0, 0, 0]) <= 130.0
    True
    """
    import tensorflow as tf

    factors = tf.random.stateless_uniform([3], seed, 1.0 - strength,
                                          1.0 + strength)

    def clip(x):
        return tf.clip_by_value(x, 0.0, 255.0)

    image = clip(image * factors[0])
    mean = tf.reduce_mean(tf.image.rgb_to_grayscale(image))
    image = clip(mean + (image - mean) * factors[1])
    luma = tf.image.rgb_to_grayscale(image)
    return clip(luma + (image - luma) * factors[2])


def make_augment(randaugment=None, three_augment=False, color_jitter=0.0):
    """``augment(image, seed)`` for one [0, 255] image, or None when
    nothing happens per image: the image, or with ``randaugment`` on
    ``(image, draws)`` (a ``(num_ops, 3)`` tensor for
    :func:`make_batch_augment`)."""
    import tensorflow as tf

    from keras_vit.train.data.randaugment import draw_ops

    randaugment, _, three, jitter = check_augment(
        randaugment, 0.0, three_augment, color_jitter)
    if not (randaugment or three or jitter):
        return None

    # No Python control flow on tensors: skip autograph (seconds a trace).
    @tf.autograph.experimental.do_not_convert
    def augment(image, seed):
        image = tf.convert_to_tensor(image, tf.float32)
        seeds = tf.random.experimental.stateless_split(
            tf.cast(tf.convert_to_tensor(seed), tf.int64), 3)
        if three:
            image = apply_three_augment(image, seeds[0])
        if jitter:
            image = jitter_color(image, jitter, seeds[1])
        if randaugment:
            return image, draw_ops(seeds[2], *randaugment)
        return image

    return augment


def make_batch_augment(randaugment=None, random_erasing=0.0, seed=0,
                       fill=(128, 128, 128)):
    """``augment(images, draws) -> images`` for a batch of [0, 255]
    images (``draws``: the per-image stage's RandAugment draws, ``(N,
    num_ops, 3)``; ignored without RandAugment), or None when both are
    off.

    Args:
        randaugment: ``(num_ops, magnitude[, magnitude_std])``: timm's
            RandAugment (:mod:`keras_vit.train.data.randaugment`). None:
            off.
        random_erasing: the chance that Keras' ``RandomErasing`` blanks a
            box of an image with noise in [0, 255]. 0: off.
        seed: seeds Keras' layer.
        fill: the pixel, one value a channel, that RandAugment's
            geometric operations uncover.

    >>> import numpy as np
    >>> augment = make_batch_augment(random_erasing=1.0)
    >>> augment(np.full((2, 8, 8, 3), 100.0, "float32"), None).shape
    TensorShape([2, 8, 8, 3])
    """
    import keras
    import tensorflow as tf

    from keras_vit.train.data.randaugment import rand_augment_batch

    randaugment, random_erasing, _, _ = check_augment(
        randaugment, random_erasing)
    if not (randaugment or random_erasing):
        return None
    check_int("seed", seed, low=0)
    eraser = None
    if random_erasing:
        eraser = keras.layers.RandomErasing(
            factor=(random_erasing, random_erasing), value_range=(0, 255),
            seed=seed + 1)

    @tf.autograph.experimental.do_not_convert
    def augment(images, draws):
        images = tf.convert_to_tensor(images, tf.float32)
        if randaugment:
            images = rand_augment_batch(images, draws, fill)
        if eraser is not None:
            images = tf.clip_by_value(tf.cast(eraser(images), tf.float32),
                                      0.0, 255.0)
        return images

    return augment
