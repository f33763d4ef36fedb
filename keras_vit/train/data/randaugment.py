"""RandAugment (Cubuk et al. 2019) as timm defines it and DeiT trains with
it, for the ``tf.data`` pipeline: the draws are stateless TensorFlow ops
on each image's seed, the operations Pillow's, as timm's are, run on a
batch at a time.

Each of ``num_ops`` rounds picks one of :data:`OPS` uniformly and applies
it with probability 0.5 at ``magnitude`` on the 0-10 level scale: timm's
"increasing" set (``rand-m9-...-inc1``, DeiT's), the signed operations
taking a random sign. The pixels are 8-bit between operations, as in timm.

Not Keras' ``RandAugment`` layer: it computes all its operations each
round (13x timm's whole loader) and keeps its own random state. Not
TensorFlow ops: batched, they cost 2.4x Pillow's time an image.

>>> import numpy as np
>>> image = np.random.default_rng(0).integers(0, 256, (16, 16, 3))
>>> out = rand_augment(image.astype("float32"), (0, 1), num_ops=2,
...                    magnitude=9.0)
>>> out.shape, bool(np.all(out.numpy() == np.round(out.numpy())))
(TensorShape([16, 16, 3]), True)
>>> bool(np.all(rand_augment(image, (0, 1)).numpy() == out.numpy()))
True
"""

from __future__ import annotations

import numpy as np

# timm's level scale: magnitude 10 is each operation's strongest setting.
TOP_LEVEL = 10.0
# The chance that a picked operation is applied (timm's default ``p``).
APPLY_PROB = 0.5
# At the top level: rotation in degrees, shear factor, translation as a
# fraction of the side, enhancement factor's distance from 1.
ROTATE_AT_TOP = 30.0
SHEAR_AT_TOP = 0.3
TRANSLATE_AT_TOP = 0.45
ENHANCE_AT_TOP = 0.9
# SolarizeAdd's increment at the top level and the pixels it lifts.
SOLARIZE_ADD_AT_TOP = 110
SOLARIZE_ADD_BELOW = 128

OPS = ("auto_contrast", "equalize", "invert", "rotate", "posterize",
       "solarize", "solarize_add", "color", "contrast", "brightness",
       "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")


def level_to_arg(op, magnitude, sign=1.0):
    """The argument ``op`` (a name of :data:`OPS`) takes at ``magnitude``
    (0-10) with ``sign`` (+1 or -1, used by the signed operations); None
    for the operations that take none.

    >>> level_to_arg("rotate", 9.0, -1.0)
    -27.0
    >>> level_to_arg("posterize", 9.0), level_to_arg("solarize", 9.0)
    (1, 26)
    """
    level = float(magnitude) / TOP_LEVEL
    sign = -1.0 if sign < 0 else 1.0
    if op in ("auto_contrast", "equalize", "invert"):
        return None
    at_top = {"rotate": ROTATE_AT_TOP, "shear_x": SHEAR_AT_TOP,
              "shear_y": SHEAR_AT_TOP, "translate_x": TRANSLATE_AT_TOP,
              "translate_y": TRANSLATE_AT_TOP}.get(op)
    if at_top is not None:  # the signed geometric operations
        return sign * level * at_top
    if op == "posterize":  # 4 bits kept at level 0, none at 10
        return 4 - int(level * 4)
    if op == "solarize":  # nothing inverted at level 0, all at 10
        return 256 - min(256, int(level * 256))
    if op == "solarize_add":
        return min(128, int(level * SOLARIZE_ADD_AT_TOP))
    if op in ("color", "contrast", "brightness", "sharpness"):
        return max(0.1, 1.0 + sign * level * ENHANCE_AT_TOP)
    raise ValueError(f"op must be one of {OPS}; received op={op!r}")


def _bilinear():
    from PIL import Image

    return getattr(Image, "Resampling", Image).BILINEAR


def _apply(img, op, arg, fill):
    """Pillow's operation ``op`` with its argument on an 8-bit RGB image."""
    from PIL import Image, ImageEnhance, ImageOps

    plain = {"auto_contrast": ImageOps.autocontrast,
             "equalize": ImageOps.equalize, "invert": ImageOps.invert}.get(op)
    if plain is not None:
        return plain(img)
    if op == "posterize":
        # Pillow refuses 0 bits (a magnitude of 10): black, by definition.
        if arg >= 8:
            return img
        return (ImageOps.posterize(img, arg) if arg >= 1
                else Image.new(img.mode, img.size))
    if op == "solarize":
        return ImageOps.solarize(img, arg)
    if op == "solarize_add":
        lut = [min(255, i + arg) if i < SOLARIZE_ADD_BELOW else i
               for i in range(256)]
        return img.point(lut * 3)
    enhance = {"color": ImageEnhance.Color, "contrast": ImageEnhance.Contrast,
               "brightness": ImageEnhance.Brightness,
               "sharpness": ImageEnhance.Sharpness}.get(op)
    if enhance is not None:
        return enhance(img).enhance(arg)
    if op == "rotate":  # anticlockwise about the centre
        return img.rotate(arg, resample=_bilinear(), fillcolor=fill)
    width, height = img.size
    # Output pixel (x, y) reads the input at (a x + b y + c, d x + e y + f).
    matrix = {"shear_x": (1, arg, 0, 0, 1, 0),
              "shear_y": (1, 0, 0, arg, 1, 0),
              "translate_x": (1, 0, arg * width, 0, 1, 0),
              "translate_y": (1, 0, 0, 0, 1, arg * height)}[op]
    return img.transform(img.size, Image.AFFINE, matrix,
                         resample=_bilinear(), fillcolor=fill)


def _pixels(images):
    """[0, 255] pixels -> uint8 (rounded), refusing what is not a pixel."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return images.copy()
    if not np.all(np.isfinite(images)):
        raise ValueError("images must be finite pixel values in [0, 255]; "
                         "received a NaN or an infinity")
    return np.clip(np.round(images), 0, 255).astype(np.uint8)


def apply_op(image, op, magnitude, sign=1.0, fill=(128, 128, 128)):
    """Operation ``op`` (a name of :data:`OPS`) at ``magnitude`` with
    ``sign`` on one ``(height, width, 3)`` image in [0, 255] (rounded to
    whole pixel values first); float32 pixels back.

    >>> import numpy as np
    >>> image = np.full((4, 4, 3), 100.0, "float32")
    >>> float(apply_op(image, "brightness", 10.0, -1.0)[0, 0, 0])  # x 0.1
    10.0
    """
    from PIL import Image

    arg = level_to_arg(op, magnitude, sign)
    img = _apply(Image.fromarray(_pixels(image)), op, arg,
                 tuple(int(v) for v in fill))
    return np.asarray(img).astype(np.float32)


def augment_images(images, draws, fill=(128, 128, 128)):
    """RandAugment on a NumPy batch: ``images`` ``(N, H, W, 3)`` in
    [0, 255] (uint8, or rounded to whole pixel values first), ``draws``
    ``(N, num_ops, 3)`` from :func:`draw_ops`, applied round after round;
    uint8 pixels back."""
    out = _pixels(images)
    draws = np.asarray(draws)
    fill = tuple(int(v) for v in fill)
    if out.ndim != 4 or out.shape[-1] != 3 or draws.ndim != 3 or (
            draws.shape[0] != out.shape[0] or draws.shape[-1] != 3):
        raise ValueError(
            "images must be (N, height, width, 3) and draws (N, num_ops, "
            f"3); received images {out.shape} and draws {draws.shape}")
    from PIL import Image

    for i, rows in enumerate(draws):
        if not np.any(rows[:, 0] >= 0):
            continue
        img = Image.fromarray(out[i])
        for op, magnitude, sign in rows:
            if op >= 0:
                name = OPS[int(op)]
                img = _apply(img, name, level_to_arg(name, magnitude, sign),
                             fill)
        out[i] = np.asarray(img)
    return out


def draw_ops(seed, num_ops=2, magnitude=9.0, magnitude_std=0.0):
    """One image's RandAugment draws from its stateless ``seed``: a
    ``(num_ops, 3)`` float32 tensor of rows (operation index or -1 when
    the round applies none, magnitude, sign).

    >>> rows = draw_ops((0, 1), num_ops=2, magnitude=9.0)
    >>> rows.shape, set(rows[:, 1].numpy().tolist())
    (TensorShape([2, 3]), {9.0})
    """
    import tensorflow as tf

    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    rows = []
    for round_seed in tf.unstack(
            tf.random.experimental.stateless_split(seed, num_ops)):
        pick_seed, apply_seed, level_seed, sign_seed = tf.unstack(
            tf.random.experimental.stateless_split(round_seed, 4))
        pick = tf.random.stateless_uniform([], pick_seed, 0, len(OPS),
                                           dtype=tf.int32)
        applied = tf.random.stateless_uniform([], apply_seed) < APPLY_PROB
        level = tf.constant(float(magnitude), tf.float32)
        if magnitude_std:
            level += magnitude_std * tf.random.stateless_normal(
                [], level_seed)
        sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5,
                        1.0, -1.0)
        rows.append(tf.stack([
            tf.cast(tf.where(applied, pick, -1), tf.float32),
            tf.clip_by_value(level, 0.0, TOP_LEVEL), sign]))
    return tf.stack(rows)


def rand_augment_batch(images, draws, fill=(128, 128, 128)):
    """RandAugment on a batch in TensorFlow (a ``tf.data`` map):
    :func:`augment_images` through ``tf.numpy_function``, one call a
    batch.

    >>> import numpy as np
    >>> images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3))
    >>> draws = np.stack([draw_ops((i, 0)) for i in range(2)])
    >>> rand_augment_batch(images, draws).shape
    TensorShape([2, 8, 8, 3])
    """
    import tensorflow as tf

    images = tf.convert_to_tensor(images, tf.float32)
    pixels = tf.cast(tf.clip_by_value(tf.round(tf.debugging.assert_all_finite(
        images, "images must be finite pixel values in [0, 255]")),
        0.0, 255.0), tf.uint8)
    fill = tuple(int(v) for v in fill)
    out = tf.numpy_function(lambda x, d: augment_images(x, d, fill),
                            [pixels, tf.convert_to_tensor(draws,
                                                          tf.float32)],
                            tf.uint8, stateful=False, name="rand_augment")
    return tf.cast(tf.ensure_shape(out, images.shape), tf.float32)


def rand_augment(image, seed, num_ops=2, magnitude=9.0, magnitude_std=0.0,
                 fill=(128, 128, 128)):
    """RandAugment on one [0, 255] image (rounded to whole pixel values
    first), its draws a function of the stateless ``seed``.

    Args:
        image: ``(height, width, 3)`` pixels in [0, 255].
        seed: the image's seed; the same seed, the same result.
        num_ops: operations drawn, each applied with chance 0.5.
        magnitude: their strength on the 0-10 level scale.
        magnitude_std: the spread of a normal draw around ``magnitude``
            (timm's ``mstd``), kept in [0, 10]; 0: fixed.
        fill: the pixel value, one a channel, of what a geometric
            operation uncovers.
    """
    import tensorflow as tf

    image = tf.convert_to_tensor(image, tf.float32)
    draws = draw_ops(seed, num_ops, magnitude, magnitude_std)
    return rand_augment_batch(image[None], draws[None], fill)[0]
