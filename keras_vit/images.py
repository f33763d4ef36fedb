"""How large an image keras_vit decodes: one pixel budget for every reader.

A PNG of a few hundred kilobytes can declare 12000x12000 pixels; decoded
whole and cast to float32 it took 5.9 GB in ``keras-vit predict`` and
several gigabytes in a training folder (issue 24). Every image keras_vit
reads from a user's file goes through :func:`decode_plan` first, from the
header alone (width, height, format, mode), before any pixel is decoded:

* a JPEG is decoded at a reduced scale (1/2, 1/4 or 1/8: libjpeg's DCT
  scaling, ``PIL.Image.draft`` and ``tf.io.decode_jpeg(ratio=)``) until it
  fits :data:`PIXEL_BUDGET`, so its decoded size is bounded whatever the
  header says;
* other formats can only be decoded whole. The command line's ``predict``
  (PIL, one image at a time) decodes them if the whole image takes at most
  :data:`FULL_DECODE_BYTES` and box-reduces the result; a training folder
  (TensorFlow, several images decoded at once and cast to float32) keeps
  them only within :data:`PIXEL_BUDGET` pixels. Larger ones are refused or
  skipped with the reason, which names the size and the limit.

The models take 224 to 518 pixels a side, so nothing the budget removes
reaches them: 16 million pixels is a 4000x4000 image.

>>> from keras_vit import images
>>> images.decode_plan("JPEG", 12000, 9000).scale
4
>>> images.decode_plan("PNG", 3000, 2000).scale
1
>>> plan = images.decode_plan("PNG", 12000, 12000, whole=False)
>>> print(plan.refusal)  # doctest: +ELLIPSIS
12000x12000 pixels, over the 16,000,000-pixel budget for images decoded ...
"""

from __future__ import annotations

import dataclasses

# The budgets live with every other cap (keras_vit/limits.py).
from keras_vit.limits import FULL_DECODE_BYTES, PIXEL_BUDGET

#: PIL's names for JPEG data: "MPO" is what many phone cameras write (a
#: JPEG followed by more pictures; decoders read the first).
JPEG_FORMATS = ("JPEG", "MPO")
#: The reduced scales libjpeg decodes at (1/1, 1/2, 1/4, 1/8).
JPEG_SCALES = (1, 2, 4, 8)

# Bytes per pixel of PIL's modes; unknown modes count as 4.
_MODE_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "La": 2, "PA": 2, "RGB": 3,
               "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBA": 4, "RGBa": 4,
               "RGBX": 4, "CMYK": 4, "I": 4, "F": 4, "I;16": 2}


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """``scale``: decode at 1/scale (JPEG) or whole (1); ``refusal``: why
    the image is not decoded at all (then ``scale`` is None)."""

    scale: int | None
    refusal: str | None = None


def decode_plan(fmt, width, height, mode=None, *, whole=True):
    """How to decode an image of ``width`` x ``height`` pixels in format
    ``fmt`` (PIL's name: ``"JPEG"``, ``"PNG"``, ...) and PIL ``mode``.

    ``whole=True``: the caller decodes one image at a time and may reduce a
    non-JPEG after decoding it whole (up to :data:`FULL_DECODE_BYTES`);
    ``whole=False``: non-JPEGs must fit :data:`PIXEL_BUDGET` as they are.
    """
    width, height = int(width), int(height)
    pixels = width * height
    size = f"{width}x{height} pixels"
    if fmt in JPEG_FORMATS:
        for scale in JPEG_SCALES:
            if -(-width // scale) * -(-height // scale) <= PIXEL_BUDGET:
                return DecodePlan(scale)
        return DecodePlan(None, (
            f"{size}, over the {PIXEL_BUDGET:,}-pixel budget even decoded "
            f"at 1/{JPEG_SCALES[-1]} scale: downscale it"))
    if pixels <= PIXEL_BUDGET:
        return DecodePlan(1)
    if not whole:
        return DecodePlan(None, (
            f"{size}, over the {PIXEL_BUDGET:,}-pixel budget for images "
            "decoded whole (only JPEGs decode at a reduced scale): "
            "downscale it"))
    nbytes = pixels * _MODE_BYTES.get(mode, 4)
    if nbytes > FULL_DECODE_BYTES:
        return DecodePlan(None, (
            f"{size} in mode {mode}, {nbytes / 2**20:,.0f} MiB decoded, over "
            f"the {FULL_DECODE_BYTES // 2**20} MiB limit for a {fmt} (only "
            "JPEGs decode at a reduced scale): downscale it"))
    return DecodePlan(1)
