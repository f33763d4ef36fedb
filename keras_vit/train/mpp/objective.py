"""The masked patch prediction objective: which patches are corrupted and
how (:func:`corruption_plan`), what they predict (:func:`patch_targets`)
and the loss over the corrupted ones (:func:`masked_loss`). Everything is
keras.ops, used inside every backend's training step, and every draw is a
stateless function of the run's seed and step."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_vit.base.checks import check_choice
from keras_vit.runtime.backend import name as backend_name
from keras_vit.train import recipes

# Defined beside the recipes, which the command line reads without Keras.
OBJECTIVES, TARGETS = recipes.MPP_OBJECTIVES, recipes.MPP_TARGETS
# Codes of the corruption plan, one per patch.
KEEP, MASK, RANDOM, UNCHANGED = 0, 1, 2, 3
COLOR_BITS = 3
LEVELS = 2 ** COLOR_BITS  # 8 levels per channel: 512 colours for RGB
DOWNSIZED = 4  # the 4x4 target


def _choice(field, value, choices):
    """``value`` with '-' read as '_', or a ValueError naming ``field``."""
    text = str(value).replace("-", "_") if isinstance(value, str) else value
    if text in choices:
        return text
    return check_choice(field, value, choices)


def check_target(target):
    """The canonical name of a target (``"color-4x4"`` is accepted)."""
    return _choice("target", target, TARGETS)


def check_objective(objective):
    """The canonical name of a self-supervised objective."""
    return _choice("objective", objective, OBJECTIVES)


def check_fraction(field, value, low_open=False):
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (0.0 < value if low_open else 0.0 <= value) and value <= 1.0)
    if not ok:
        rng = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{field} must be a number in {rng}; received "
                         f"{field}={value!r}")
    return float(value)


def check_fractions(rate, mask_fraction, random_fraction):
    """The corruption's three fractions, checked: ``corruption_rate`` in
    (0, 1], the [mask] and random-patch fractions of it in [0, 1] and at
    most 1 together."""
    rate = check_fraction("corruption_rate", rate, low_open=True)
    mask_fraction = check_fraction("mask_fraction", mask_fraction)
    random_fraction = check_fraction("random_fraction", random_fraction)
    if mask_fraction + random_fraction > 1.0 + 1e-9:
        raise ValueError(
            "mask_fraction + random_fraction must be at most 1; received "
            f"mask_fraction={mask_fraction}, random_fraction="
            f"{random_fraction}")
    return rate, mask_fraction, random_fraction


def _draws(batch_size, num_patches, seed):
    """Three stateless draws of shape ``(batch_size, num_patches)`` from
    ``seed`` (two integers): which patches, how, and another patch's flat
    index in ``[0, total - 1)``. Keras' random ops take no seed tensor, so
    each backend's stateless generator is called (torch's step is eager)."""
    backend = backend_name()
    total = batch_size * num_patches
    if backend == "tensorflow":
        import tensorflow as tf

        seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
        shape = tf.stack([batch_size, num_patches])
        return (tf.random.stateless_uniform(shape, seeds[0]),
                tf.random.stateless_uniform(shape, seeds[1]),
                tf.random.stateless_uniform(shape, seeds[2], minval=0,
                                            maxval=total - 1,
                                            dtype=tf.int32))
    shape = (batch_size, num_patches)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        key = jax.random.wrap_key_data(
            jnp.asarray(seed).astype(jnp.uint32), impl="threefry2x32")
        pick, kind, other = jax.random.split(key, 3)
        return (jax.random.uniform(pick, shape),
                jax.random.uniform(kind, shape),
                jax.random.randint(other, shape, 0, total - 1, jnp.int32))
    import torch

    first, second = (int(v) for v in ops.convert_to_numpy(seed))
    generator = torch.Generator().manual_seed(
        (first * 1_000_003 + second) & 0x7FFFFFFFFFFFFFFF)
    return tuple(ops.convert_to_tensor(x) for x in (
        torch.rand(shape, generator=generator),
        torch.rand(shape, generator=generator),
        torch.randint(0, total - 1, shape, generator=generator,
                      dtype=torch.int32)))


def corruption_plan(batch_size, num_patches, seed, *, rate=0.5,
                    mask_fraction=0.8, random_fraction=0.1):
    """Which patches to corrupt and how: ``(mode, source)``, both int32
    ``(batch_size, num_patches)``.

    Every patch is chosen independently with probability ``rate``; a chosen
    patch becomes ``MASK`` with probability ``mask_fraction``, ``RANDOM``
    (another patch's embedding) with ``random_fraction``, else
    ``UNCHANGED``; the others are ``KEEP``. ``source``: for every patch,
    the flat index (``b * num_patches + n``) of another patch of the
    batch. ``seed`` is a stateless seed (two integers).

    >>> mode, source = (ops.convert_to_numpy(x)
    ...                 for x in corruption_plan(2, 3, (0, 1)))
    >>> tuple(mode.shape), int(mode.max()) <= UNCHANGED
    ((2, 3), True)
    >>> bool((source != np.arange(6).reshape(2, 3)).all())
    True
    """
    rate, mask_fraction, random_fraction = check_fractions(
        rate, mask_fraction, random_fraction)
    total = batch_size * num_patches
    if isinstance(total, int) and total < 2:
        raise ValueError(
            "the corruption needs at least two patches per batch; received "
            f"batch_size={batch_size}, num_patches={num_patches}")
    pick, kind, other = _draws(batch_size, num_patches, seed)
    how = ops.where(kind < mask_fraction, MASK,
                    ops.where(kind < mask_fraction + random_fraction, RANDOM,
                              UNCHANGED))
    mode = ops.where(pick < rate, how, KEEP)
    # Another patch: uniform over the other total - 1 positions.
    own = ops.reshape(ops.arange(total, dtype="int32"), (-1, num_patches))
    source = other + ops.cast(other >= own, "int32")
    return ops.cast(mode, "int32"), source


def _patches(images, grid):
    """(B, H, W, C) -> (B, rows * cols, H / rows, W / cols, C)."""
    rows, cols = grid
    h, w, c = images.shape[1], images.shape[2], images.shape[3]
    ph, pw = h // rows, w // cols
    x = ops.reshape(images, (-1, rows, ph, cols, pw, c))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return ops.reshape(x, (-1, rows * cols, ph, pw, c))


def _area_weights(size_in, size_out):
    """(size_out, size_in) weights of an area resize: each output pixel
    averages the input pixels it covers, in proportion to the overlap."""
    scale = size_in / size_out
    weights = np.zeros((size_out, size_in), "float32")
    for i in range(size_out):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), min(size_in, int(np.ceil(hi)))):
            weights[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
    return weights


def _downsize(images, grid, size):
    """Each patch reduced to ``size`` x ``size`` by area averaging:
    (B, N, size, size, C)."""
    rows, cols = grid
    ph, pw = images.shape[1] // rows, images.shape[2] // cols
    if ph % size == 0 and pw % size == 0:
        x = _patches(images, grid)
        c = images.shape[3]
        x = ops.reshape(x, (-1, rows * cols, size, ph // size, size,
                            pw // size, c))
        return ops.mean(x, axis=(3, 5))
    # A patch side that is not a multiple (ViT-H/14): area resize the image.
    along_h = _area_weights(images.shape[1], rows * size)
    along_w = _area_weights(images.shape[2], cols * size)
    small = ops.einsum("ih,bhwc,jw->bijc", along_h, images, along_w)
    return _patches(small, grid)


def color_class(pixels):
    """Pixels in [-1, 1], channels last -> their 3-bit colour class:
    ``r * 64 + g * 8 + b`` with each channel in 8 equal bins (512 classes
    for RGB).

    >>> ops.convert_to_numpy(color_class(np.array([[-1.0, 0.0, 1.0]])))
    array([39], dtype=int32)
    """
    pixels = ops.cast(ops.convert_to_tensor(pixels), "float32")
    levels = ops.clip(ops.floor((pixels + 1.0) * (LEVELS / 2.0)),
                      0.0, LEVELS - 1.0)
    channels = pixels.shape[-1]
    weights = ops.convert_to_tensor(
        [float(LEVELS ** (channels - 1 - i)) for i in range(channels)],
        "float32")
    return ops.cast(ops.sum(levels * weights, axis=-1), "int32")


def patch_targets(images, grid, target="mean_color"):
    """What each patch of ``images`` (B, H, W, C) in [-1, 1] is to be
    predicted as, on a ``grid`` of (rows, cols) patches:

    - ``"mean_color"``: int32 (B, N), the class of the patch's mean colour;
    - ``"color_4x4"``: int32 (B, N, 16), classes of the 4x4 downsized patch
      (row-major);
    - ``"l2"``: float32 (B, N, P * P * C), the patch's pixels (row-major,
      channels last).

    >>> x = np.full((1, 8, 8, 3), -1.0, "float32"); x[:, :4, :4] = 1.0
    >>> ops.convert_to_numpy(patch_targets(x, (2, 2))).tolist()
    [[511, 0, 0, 0]]
    """
    target = check_target(target)
    images = ops.cast(ops.convert_to_tensor(images), "float32")
    if target == "mean_color":
        return color_class(ops.mean(_patches(images, grid), (2, 3)))
    if target == "color_4x4":
        small = _downsize(images, grid, DOWNSIZED)
        return ops.reshape(color_class(small),
                           (-1, small.shape[1], DOWNSIZED ** 2))
    x = _patches(images, grid)
    return ops.reshape(x, (-1, x.shape[1], x.shape[2] * x.shape[3]
                           * x.shape[4]))


def masked_loss(predictions, targets, mode, target, channels=3):
    """Per image: the loss averaged over its corrupted patches, and the
    fraction of them predicted right (for ``"l2"``: whose predicted mean
    colour has the target's 3-bit class). Both float32 (B,). ``targets``:
    from :func:`patch_targets`; ``mode``: the corruption plan.
    """
    target = check_target(target)
    predictions = ops.cast(ops.convert_to_tensor(predictions), "float32")
    targets = ops.convert_to_tensor(targets)
    n = predictions.shape[1]
    if target == "l2":
        per_patch = ops.mean(ops.square(predictions - targets), -1)

        def mean_colour(x):
            return ops.mean(ops.reshape(x, (-1, n, x.shape[-1] // channels,
                                            channels)), 2)

        right = ops.cast(ops.equal(color_class(mean_colour(predictions)),
                                   color_class(mean_colour(targets))),
                         "float32")
    else:
        if target == "color_4x4":
            predictions = ops.reshape(predictions,
                                      (-1, n, targets.shape[-1],
                                       predictions.shape[-1]
                                       // targets.shape[-1]))
        targets = ops.cast(targets, "int32")
        log_probs = ops.log_softmax(predictions, axis=-1)
        per_patch = -ops.squeeze(ops.take_along_axis(
            log_probs, ops.expand_dims(targets, -1), axis=-1), -1)
        right = ops.cast(ops.equal(
            ops.cast(ops.argmax(predictions, axis=-1), "int32"), targets),
            "float32")
        if target == "color_4x4":
            per_patch = ops.mean(per_patch, -1)
            right = ops.mean(right, -1)
    weight = ops.cast(ops.not_equal(ops.convert_to_tensor(mode), KEEP),
                      "float32")
    count = ops.maximum(ops.sum(weight, -1), 1.0)
    return (ops.sum(per_patch * weight, -1) / count,
            ops.sum(right * weight, -1) / count)
