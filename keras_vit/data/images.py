"""How an encoded image becomes pixels: one decoder for every reader.

``keras-vit predict`` and the Python API, the training and evaluation
pipelines and the SavedModel ``image_bytes`` signature all call
:func:`decode` (or :func:`read` / :func:`decode_bytes`, which run the same
function eagerly), so a file gives the same pixels, or the same refusal,
whichever way it reaches a model. It is TensorFlow ops because a
SavedModel can only carry those, and two decoders written to one policy
drift.

The rules, in the order they apply:

1. **Format** from the first bytes: JPEG (and MPO), PNG, GIF, BMP and
   WebP. Anything else, and an empty element, is refused.
2. **Size from the header**, before any pixel is decoded.
3. **Pixel budget** (:data:`PIXEL_BUDGET`): a JPEG is decoded at the
   largest of libjpeg's scales (1/1, 1/2, 1/4, 1/8) that fits the budget;
   any other format must fit it as it is. Larger ones are refused (an
   ``InvalidArgumentError`` in a graph, an :class:`ImageError` in Python).
4. **Decode to 8-bit RGB**: JPEGs with libjpeg's accurate integer DCT (the
   same pixels as Pillow; the fast DCT is off by up to 12 levels);
   greyscale replicated; palettes looked up; alpha dropped (as Pillow's
   ``convert("RGB")``); 16-bit PNG samples keep their high byte.
5. **Animations**: a GIF's first frame, drawn on its logical screen in the
   global table's background colour (black without one). Animated WebPs
   are refused.
6. **Orientation**: the EXIF orientation tag of a JPEG, PNG or WebP is
   applied, as ``PIL.ImageOps.exif_transpose`` does.

A training crop (:func:`decode_crop`) may differ by design: a JPEG
decodes only that window, with libjpeg's fast DCT (a few levels off).
The graphs are traced once per process (:func:`_functions`): tracing all
the formats' ops takes seconds.

>>> import io
>>> from PIL import Image
>>> from keras_vit.data import images
>>> grey16 = Image.frombytes("I;16", (2, 1), bytes([0, 0, 0xFF, 0xFF]))
>>> buffer = io.BytesIO(); grey16.save(buffer, "PNG")
>>> images.decode_bytes(buffer.getvalue()).tolist()
[[[0, 0, 0], [255, 255, 255]]]
>>> images.decode_bytes(b"GIF8", "image_bytes[0]")
Traceback (most recent call last):
...
keras_vit.data.images.ImageError: image_bytes[0] (4 bytes) is not a JPEG, PNG, GIF, BMP or WebP file
>>> images.decode_plan("JPEG", 12000, 9000).scale
4
>>> print(images.decode_plan("PNG", 12000, 12000).refusal)  # doctest: +ELLIPSIS
is a 12000x12000 PNG, over the 16,000,000-pixel budget for images decoded ...
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys

from keras_vit.base.errors import KerasVitError
from keras_vit.base.limits import MAX_IMAGE_SEGMENTS as MAX_SEGMENTS
from keras_vit.base.limits import PIXEL_BUDGET

#: The reduced scales libjpeg decodes at (1/1, 1/2, 1/4, 1/8).
JPEG_SCALES = (1, 2, 4, 8)
#: The formats every path decodes, as the refusal names them.
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")

_JPEG, _PNG, _GIF, _BMP, _WEBP, _UNKNOWN = range(6)
_NOT_AN_IMAGE = "is not a " + ", ".join(FORMATS[:-1]) + f" or {FORMATS[-1]} file"


class ImageError(KerasVitError, ValueError):
    """An image that no path decodes: the message names it and says why
    (one line)."""


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """``scale``: decode at 1/scale (JPEG) or whole (1); ``refusal``: why
    the image is not decoded at all (then ``scale`` is None)."""

    scale: int | None
    refusal: str | None = None


def _over(budget, jpeg=False):
    """The end of a refusal of an image over ``budget``."""
    if jpeg:
        return (f", over the {budget:,}-pixel budget even decoded at "
                f"1/{JPEG_SCALES[-1]} scale: downscale it")
    return (f", over the {budget:,}-pixel budget for images decoded whole "
            "(only JPEGs decode at a reduced scale): downscale it")


def decode_plan(fmt, width, height):
    """The budget rule in Python, for an image of ``width`` x ``height``
    stored pixels in format ``fmt`` (``"JPEG"``, ``"PNG"``, ... or PIL's
    ``"MPO"``): the scale :func:`decode` decodes it at, or its refusal (the
    same words the decoder uses)."""
    width, height = int(width), int(height)
    budget = PIXEL_BUDGET
    if fmt in ("JPEG", "MPO"):
        for scale in JPEG_SCALES:
            if -(-width // scale) * -(-height // scale) <= budget:
                return DecodePlan(scale)
        return DecodePlan(None, f"is a {width}x{height} JPEG" + _over(
            budget, jpeg=True))
    if width * height <= budget:
        return DecodePlan(1)
    name = "WebP" if fmt == "WEBP" else fmt
    return DecodePlan(None, f"is a {width}x{height} {name}" + _over(budget))


def _tf():
    import tensorflow as tf

    return tf


def _raw(data, pos, n):
    """``n`` bytes of ``data`` from ``pos`` (>= 0) as int64 (n,), zeros
    past its end."""
    tf = _tf()
    start = tf.minimum(tf.cast(pos, tf.int64),
                       tf.cast(tf.strings.length(data), tf.int64))
    part = tf.cast(tf.io.decode_raw(tf.strings.substr(
        data, start, tf.cast(n, tf.int64)), tf.uint8), tf.int64)
    part = tf.pad(part, [[0, n - tf.shape(part, out_type=tf.int64)[0]]])
    return tf.reshape(part, [n]) if isinstance(n, int) else part


def _number(values, little):
    """Unsigned integer from a short int64 byte vector (static length)."""
    tf = _tf()
    n = int(values.shape[0])
    weights = tf.constant([256 ** i for i in range(n)], tf.int64)
    return tf.reduce_sum(values * tf.where(little, weights, weights[::-1]))


def _is(values, text):
    """Whether the int64 byte vector ``values`` spells ``text``."""
    tf = _tf()
    want = tf.constant(list(text), tf.int64)
    return tf.reduce_all(tf.equal(values[:len(text)], want))


# (format, signature at byte 0, signature at byte 8).
_MAGIC = ((_JPEG, b"\xff\xd8\xff", b""), (_PNG, b"\x89PNG\r\n\x1a\n", b""),
          (_GIF, b"GIF87a", b""), (_GIF, b"GIF89a", b""), (_BMP, b"BM", b""),
          (_WEBP, b"RIFF", b"WEBP"))


def _sniff(head):
    """The format index (``_JPEG`` ... ``_UNKNOWN``) from the first 12
    bytes (int64 vector)."""
    tf = _tf()
    hits = tf.stack([_is(head, first) & _is(head[8:], second)
                     for _, first, second in _MAGIC])
    formats = tf.constant([f for f, _, _ in _MAGIC] + [_UNKNOWN], tf.int32)
    first = tf.argmax(tf.concat([hits, [True]], 0), output_type=tf.int32)
    return formats[first]


def _prefix_walk(head, start):
    """Whether the PNG chunks in ``head`` (int64) from ``start`` reach the
    image data (IDAT/IEND) before an eXIf chunk or the end of ``head``
    (then the image has no orientation), by pointer jumping, no loop."""
    tf = _tf()
    n = int(head.shape[0])
    padded = tf.pad(head, [[0, 12]])
    b = [padded[i:i + n] for i in range(8)]
    index = tf.range(n, dtype=tf.int64)
    name = b[4] * 2 ** 24 + b[5] * 2 ** 16 + b[6] * 2 ** 8 + b[7]
    nxt = index + 12 + (b[0] * 2 ** 24 + b[1] * 2 ** 16 + b[2] * 2 ** 8
                        + b[3])
    done = (tf.equal(name, int.from_bytes(b"IDAT", "big"))
            | tf.equal(name, int.from_bytes(b"IEND", "big")))
    ordinary = tf.logical_not(done) & tf.not_equal(
        name, int.from_bytes(b"eXIf", "big"))
    jump = tf.where(ordinary & (nxt < n), nxt, index)
    for _ in range(max(1, (n - 1).bit_length())):
        jump = tf.gather(jump, jump)
    return tf.gather(done, jump[start])


#: Entries of IFD0 searched for the orientation tag: tags are sorted and
#: 0x0112 comes after at most a dozen others in any file seen.
_IFD_ENTRIES = 64


def _orientation(data, start, length):
    """The EXIF orientation (1-8; 1 when absent or unreadable) of the Exif
    payload of ``length`` bytes at ``start``: a TIFF header (either byte
    order), optionally after ``Exif\\0\\0``, then IFD0's tag 0x0112."""
    tf = _tf()
    skip = tf.where(_is(_raw(data, start, 6), b"Exif\x00\x00"),
                    tf.constant(6, tf.int64), 0)
    start, length = start + skip, length - skip
    tiff = _raw(data, start, 8)
    little = _is(tiff, b"II*\x00")
    known = little | _is(tiff, b"MM\x00*")
    ifd = _number(tiff[4:8], little)
    block = _raw(data, start + ifd, 2 + 12 * _IFD_ENTRIES)
    count = tf.minimum(_number(block[:2], little), (length - ifd - 2) // 12)
    entries = tf.reshape(block[2:], (_IFD_ENTRIES, 12))
    # Each entry: tag (2 bytes), type (2), count (4), value (4).
    order = tf.where(little, tf.constant([1, 256, 0, 0], tf.int64),
                     tf.constant([256, 1, 0, 0], tf.int64))
    tags = tf.reduce_sum(entries[:, :4] * order, axis=1)
    hit = tf.equal(tags, 0x0112) & (tf.range(_IFD_ENTRIES, dtype=tf.int64)
                                    < count)
    entry = entries[tf.argmax(tf.cast(hit, tf.int32))]
    kind = _number(entry[2:4], little)
    value = tf.where(tf.equal(kind, 4), _number(entry[8:12], little),
                     _number(entry[8:10], little))
    good = (known & tf.reduce_any(hit) & (ifd >= 8)
            & (tf.equal(kind, 3) | tf.equal(kind, 4)) & (value >= 1)
            & (value <= 8))
    return tf.where(good, value, 1)


def _walk(step, pos, *state):
    """``(*state, steps)`` after ``step(pos, *state, steps)`` ran from
    ``pos`` until it returned the position -1 or ran past
    :data:`MAX_SEGMENTS` steps."""
    tf = _tf()
    return tf.while_loop(
        lambda pos, *rest: (pos >= 0) & (rest[-1] <= MAX_SEGMENTS), step,
        (tf.cast(pos, tf.int64), *state, tf.constant(0, tf.int64)))[1:]


def _jpeg_segments(data):
    """One walk over a JPEG's segments, up to its first scan: (exif start,
    exif length, scan start, framed, steps): the first APP1 Exif payload
    (-1 when none); where the first scan's data begins (-1 when there is
    no whole SOS segment); ``framed`` 1 when a SOF came before it."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)
    minus = tf.constant(-1, tf.int64)

    def step(pos, exif, size, scan, framed, steps):
        b = _raw(data, pos, 10)
        marker = b[1]
        seglen = b[2] * 256 + b[3]
        lone = ((marker >= 0xD0) & (marker <= 0xD7)) | tf.equal(marker, 0x01)
        stop = (tf.not_equal(b[0], 0xFF) | tf.equal(marker, 0xD9)
                | (pos + 4 > length))
        go = tf.logical_not(stop)
        is_scan = tf.equal(marker, 0xDA) & go
        frame = ((marker >= 0xC0) & (marker <= 0xCF) & tf.logical_not(
            tf.reduce_any(tf.equal(marker, [0xC4, 0xC8, 0xCC]))))
        hit = (tf.equal(marker, 0xE1) & _is(b[4:], b"Exif\x00\x00") & go
               & (exif < 0))
        new_pos = tf.where(
            stop | is_scan, minus,
            tf.where(tf.equal(marker, 0xFF), pos + 1,
                     tf.where(lone, pos + 2, pos + 2 + seglen)))
        whole = pos + 2 + seglen <= length
        return (new_pos, tf.where(hit, pos + 10, exif),
                tf.where(hit, seglen - 8, size),
                tf.where(is_scan & whole, pos + 2 + seglen, scan),
                tf.where(frame & go, tf.constant(1, tf.int64), framed),
                steps + 1)

    return _walk(step, 2, minus, minus, minus, minus)


def _jpeg_cut_short(data, start, framed, steps):
    """Why libjpeg cannot read the JPEG ``data`` whole
    ("" when it can as far as its markers tell): cut short before or
    inside its image data (no end-of-image marker after the first scan),
    or no frame header. Checked here so the refusal names the image."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)

    def has_end():
        tail = tf.io.decode_raw(
            tf.strings.substr(data, start, length - start), tf.uint8)
        return tf.reduce_any(tf.equal(tail[:-1], 0xFF)
                             & tf.equal(tail[1:], 0xD9))

    ended = tf.cond(start >= 0, has_end, lambda: tf.constant(False))
    reason = tf.where(
        steps > MAX_SEGMENTS, "",  # refused for its segments instead
        tf.where(start < 0, tf.strings.format(
            "({} bytes) is a JPEG cut short before its image data", length),
            tf.where(tf.not_equal(framed, 1),
                     "is a damaged JPEG (no frame header before its image "
                     "data)",
                     tf.where(ended, "", tf.strings.format(
                         "({} bytes) is a JPEG cut short inside its image "
                         "data (no end-of-image marker)", length)))))
    return reason


def _find_chunk(data, start, want, stops, big_endian):
    """(start, length, steps) of the payload of the first chunk named
    ``want`` (PNG: length then name, big-endian; RIFF: name then
    little-endian length, padded to even), stopping at a chunk in
    ``stops``, the end of the data (start -1 when not found) or after
    :data:`MAX_SEGMENTS` steps."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)

    def step(pos, found, size, steps):
        b = _raw(data, pos, 8)
        if big_endian:
            chunk, name = _number(b[:4], False), b[4:]
            new_pos = pos + 12 + chunk
        else:
            chunk, name = _number(b[4:], True), b[:4]
            new_pos = pos + 8 + chunk + chunk % 2
        end = pos + 8 > length
        for stop in stops:
            end |= _is(name, stop)
        hit = _is(name, want) & tf.logical_not(end)
        return (tf.where(end | hit, tf.constant(-1, tf.int64), new_pos),
                tf.where(hit, pos + 8, found), tf.where(hit, chunk, size),
                steps + 1)

    minus = tf.constant(-1, tf.int64)
    return _walk(step, start, minus, minus)


def _gif_chain_ends(data):
    """For each byte position p, where the chain of GIF data sub-blocks
    starting at p ends (its zero-length terminator; the data's length
    when it runs past the end), by pointer jumping: log2(n) gathers
    whatever the sub-block sizes."""
    tf = _tf()
    values = tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int32)
    n = tf.shape(values)[0]
    index = tf.range(n)
    nxt = tf.where(tf.equal(values, 0), index,
                   tf.minimum(index + 1 + values, n))
    nxt = tf.concat([nxt, [n]], 0)  # n: ran off the end (a fixed point)
    rounds = tf.cast(tf.math.ceil(tf.math.log(
        tf.cast(n, tf.float64) + 2.0) / math.log(2.0)), tf.int32)
    return tf.while_loop(lambda i, x: i < rounds,
                         lambda i, x: (i + 1, tf.gather(x, x)),
                         (tf.constant(0), nxt))[1]


def _gif_first_frame(data):
    """``(box, end, steps)`` of the first image of a GIF: ``box`` its
    left, top, width, height and the offset of its descriptor, ``end``
    the byte after its pixel data (-1 when there is no image before the
    trailer or the end of the data; past the data's length when the
    image's data is cut short)."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)
    head = _raw(data, 0, 13)
    flags = head[10]
    table = tf.where(flags >= 128, 3 * 2 ** (flags % 8 + 1), 0)
    ends = _gif_chain_ends(data)

    def chain_end(p):
        return tf.cast(tf.gather(ends, tf.clip_by_value(p, 0, length)),
                       tf.int64)

    def step(pos, box, end, steps):
        b = _raw(data, pos, 10)
        image = tf.equal(b[0], 0x2C)
        extension = tf.equal(b[0], 0x21)
        local = tf.where(b[9] >= 128, 3 * 2 ** (b[9] % 8 + 1), 0)
        # Image: descriptor (10 bytes), local table, LZW code size, data.
        image_end = chain_end(pos + 10 + local + 1) + 1
        extension_end = chain_end(pos + 2) + 1
        new_box = tf.stack([_number(b[1:3], True), _number(b[3:5], True),
                            _number(b[5:7], True), _number(b[7:9], True),
                            pos])
        return (tf.where(extension & (extension_end <= length),
                         extension_end, tf.constant(-1, tf.int64)),
                tf.where(image, new_box, box),
                # Past the length: the frame's data is cut short.
                tf.where(image, image_end, end),
                steps + 1)

    return _walk(step, 13 + table, tf.zeros(5, tf.int64),
                 tf.constant(-1, tf.int64))


def _png_cut_short(data):
    """Why libpng cannot read the PNG ``data`` whole ("" when it has a
    complete IEND): TensorFlow's error for it names no image."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)
    values = tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int64)
    n = tf.shape(values, out_type=tf.int64)[0]
    at = tf.zeros(tf.maximum(n - 3, 0), tf.bool) | True
    for i, byte in enumerate(b"IEND"):
        at &= tf.equal(values[i:n - 3 + i], byte)
    # The name, then its 4-byte CRC: IEND complete within the data.
    ends = tf.boolean_mask(tf.range(n - 3, dtype=tf.int64) + 8, at)
    whole = tf.reduce_any(ends <= length)
    return tf.where(whole, "", tf.strings.format(
        "({} bytes) is a PNG cut short (no complete IEND chunk at its end)",
        length))


def _bmp_cut_short(data, offset, header, width, height, bits, supported):
    """Why the BMP ``data`` does not hold the pixels its header declares
    ("" when it does); TensorFlow refuses a 24- or 32-bit file of any
    other length without naming the image."""
    tf = _tf()
    length = tf.cast(tf.strings.length(data), tf.int64)
    row = (bits * tf.abs(width) + 31) // 32 * 4
    need = tf.maximum(offset + row * height, 14 + header)
    exact = tf.equal(bits, 24) | tf.equal(bits, 32)
    return tf.where(
        supported & (length < need), tf.strings.format(
            "({} bytes) is a BMP cut short ({} bytes needed for its "
            "{}x{} pixels)", (length, need, width, height)),
        tf.where(supported & exact & (length > need), tf.strings.format(
            "({} bytes) is a BMP with {} bytes after its pixels (a damaged "
            "header?)", (length, length - need)), ""))


#: The facts :func:`inspect` reads, in the order of its int64 vector.
FACTS = ("format", "width", "height", "scale", "orientation",
         # GIF: the first frame's left, top, width, height, the offset of
         # its descriptor and the byte after its data; BMP: bits per
         # pixel, palette offset and colours.
         "extra0", "extra1", "extra2", "extra3", "extra4", "extra5")


def _is_a(width, height, name, rest):
    tf = _tf()
    return tf.strings.join([
        tf.strings.format("is a {}x{} ", (width, height)), name, rest])


def _first(*reasons):
    """The first non-empty reason."""
    tf = _tf()
    out = tf.constant("")
    for reason in reversed(reasons):
        out = tf.where(tf.equal(reason, ""), out, reason)
    return out


def _no_pixels(width, height, name):
    return _tf().where((width < 1) | (height < 1),
                       _is_a(width, height, name, ", with no pixels"), "")


def inspect(data, budget=None, fmt=None):
    """``(facts, reason)`` of the encoded image ``data`` (a scalar string
    tensor), read before any pixel is decoded (TensorFlow ops): ``facts``
    is an int64 vector named by :data:`FACTS`, ``reason`` why every path
    refuses the image ("" when none does; a file cut short is refused
    here, a body damaged otherwise fails with TensorFlow's error).
    ``fmt``: the format index when the caller knows it (only that
    format's ops are built)."""
    tf = _tf()
    budget = PIXEL_BUDGET if budget is None else int(budget)
    head = _raw(data, 0, 1024)
    length = tf.cast(tf.strings.length(data), tf.int64)
    known_format = fmt
    fmt = _sniff(head) if fmt is None else tf.constant(fmt, tf.int32)
    zero = tf.constant(0, tf.int64)
    minus = tf.constant(-1, tf.int64)
    none = tf.zeros(6, tf.int64)

    def pack(width, height, scale, extra, reason, exif=(minus, minus, zero)):
        """facts (orientation 1 for now), reason, Exif start, size, steps."""
        values = [tf.cast(v, tf.int64) for v in (fmt, width, height, scale)]
        facts = tf.concat([tf.stack(values), [1], tf.cast(extra, tf.int64)],
                          0)
        return (facts, reason) + tuple(exif)

    def no_exif():
        return minus, minus, zero

    def empty_or_over(width, height, name):
        return _first(_no_pixels(width, height, name), tf.where(
            width * height > budget,
            _is_a(width, height, name, _over(budget)), ""))

    def jpeg():
        # libjpeg's header read fails without naming the image: refuse first.
        exif_start, exif_size, scan, framed, scan_steps = _jpeg_segments(
            data)
        cut = _jpeg_cut_short(data, scan, framed, scan_steps)
        shape = tf.cond(
            tf.equal(cut, "") & (scan_steps <= MAX_SEGMENTS),
            lambda: tf.cast(tf.io.extract_jpeg_shape(data), tf.int64),
            lambda: tf.ones(3, tf.int64))
        height, width = shape[0], shape[1]
        scales = tf.constant(JPEG_SCALES, tf.int64)
        fits = (-(-width // scales)) * (-(-height // scales)) <= budget
        scale = tf.gather(scales, tf.argmax(tf.cast(fits, tf.int32)))
        over = tf.where(tf.reduce_any(fits), "", _is_a(
            width, height, "JPEG", _over(budget, jpeg=True)))
        exif = (exif_start, exif_size, scan_steps)
        return pack(width, height, scale, none, _first(
            cut, _no_pixels(width, height, "JPEG"), over), exif)

    def png():
        width = _number(head[16:20], False)
        height = _number(head[20:24], False)
        exif = tf.cond(_prefix_walk(head, 8), no_exif,
                       lambda: _find_chunk(data, 8, b"eXIf",
                                           (b"IDAT", b"IEND"), True))
        return pack(width, height, 1, none, _first(
            tf.where(_is(head[12:], b"IHDR"), "", "is a damaged PNG (its "
                     "first chunk is not IHDR)"),
            empty_or_over(width, height, "PNG"), _png_cut_short(data)), exif)

    def gif():
        width, height = _number(head[6:8], True), _number(head[8:10], True)
        box, end, steps = _gif_first_frame(data)
        frame = box[2] * box[3]
        found = end >= 0
        walked = steps <= MAX_SEGMENTS  # else refused after the switch
        cut = tf.where(found & (end > length), tf.strings.format(
            "({} bytes) is a GIF cut short inside its first frame", length),
            "")
        end = tf.minimum(end, length)
        return pack(width, height, 1, tf.concat([box, [end]], 0), _first(
            empty_or_over(width, height, "GIF"),
            tf.where(walked & tf.logical_not(found),
                     tf.constant("is a GIF with no image"), ""),
            tf.where(found, _no_pixels(box[2], box[3],
                                       "first frame of a GIF"), ""),
            tf.where(found & (frame > budget), tf.strings.join([
                tf.strings.format("is a GIF whose first frame is {}x{}",
                                  (box[2], box[3])),
                f", over the {budget:,}-pixel budget: downscale it"]), ""),
            cut), (minus, minus, steps))

    def bmp():
        b = head[10:66]
        offset, header = _number(b[0:4], True), _number(b[4:8], True)
        width, height = _number(b[8:12], True), _number(b[12:16], True)
        # Signed 32-bit: a negative height stores the rows top-down.
        width = tf.where(width >= 2 ** 31, width - 2 ** 32, width)
        height = tf.abs(tf.where(height >= 2 ** 31, height - 2 ** 32, height))
        bits, method = _number(b[18:20], True), _number(b[20:24], True)
        colours = _number(b[36:40], True)
        # The masks 0xFF0000, 0xFF00 and 0xFF: red, green, blue.
        standard = _is(b[44:56], bytes.fromhex("0000ff0000ff0000ff000000"))
        plain = tf.equal(method, 0) | (
            tf.equal(method, 3) & tf.equal(bits, 32) & standard)
        supported = (tf.equal(bits, 8) | tf.equal(bits, 24)
                     | tf.equal(bits, 32)) & plain & (header >= 40)
        colours = tf.where(tf.equal(colours, 0), tf.constant(256, tf.int64),
                           colours)
        extra = tf.stack([bits, 14 + header, tf.minimum(colours, 256),
                          offset, zero, zero])
        return pack(width, height, 1, extra, _first(
            tf.where(supported, "", tf.strings.join([tf.strings.format(
                "is a BMP of {} bits per pixel (compression {}, {}-byte header)",
                (bits, method, header)), "; keras_vit reads uncompressed "
                "8-, 24- and 32-bit BMPs: convert it to PNG"])),
            empty_or_over(width, height, "BMP"),
            _bmp_cut_short(data, offset, header, width, height, bits,
                           supported)))

    def webp():
        b = head[12:30]
        kind = b[:4]
        lossy, lossless = _is(kind, b"VP8 "), _is(kind, b"VP8L")
        extended = _is(kind, b"VP8X")
        bits = _number(b[9:13], True)  # VP8L: 14 bits each, minus one
        width = tf.where(lossy, _number(b[14:16], True) % 16384,
                         tf.where(lossless, bits % 16384 + 1,
                                  _number(b[12:15], True) + 1))
        height = tf.where(lossy, _number(b[16:18], True) % 16384,
                          tf.where(lossless, (bits // 16384) % 16384 + 1,
                                   _number(b[15:18], True) + 1))
        flags = b[8]
        animated = extended & tf.equal((flags // 2) % 2, 1)
        exif = tf.cond(extended & tf.equal((flags // 8) % 2, 1),
                       lambda: _find_chunk(data, 12, b"EXIF", (), False),
                       no_exif)
        shown = tf.strings.regex_replace(tf.strings.substr(data, 12, 4),
                                         "[^ -~]", "?")
        riff = _number(head[4:8], True) + 8  # the file's declared length
        cut = tf.where(length < riff, tf.strings.format(
            "({} bytes) is a WebP cut short ({} bytes declared)",
            (length, riff)), "")
        return pack(width, height, 1, none, _first(
            tf.where(lossy | lossless | extended, "", tf.strings.join([
                "is a WebP of an unknown kind '", shown, "'"])),
            tf.where(animated, "is an animated WebP (keras_vit reads still "
                     "images): save its first frame as PNG", ""),
            empty_or_over(width, height, "WebP"), cut), exif)

    def unknown():
        return pack(zero, zero, 1, none, tf.where(
            tf.equal(length, 0), "is empty", tf.strings.join([
                tf.strings.format("({} bytes) ", length), _NOT_AN_IMAGE])))

    branches = [jpeg, png, gif, bmp, webp, unknown]
    facts, reason, start, size, steps = (
        tf.switch_case(fmt, branches) if known_format is None
        else branches[known_format]())
    if known_format in (None, _JPEG, _PNG, _WEBP):
        orientation = tf.cond(start >= 0,
                              lambda: _orientation(data, start, size),
                              lambda: tf.constant(1, tf.int64))
        facts = tf.concat([facts[:4], [orientation], facts[5:]], 0)
    names = tf.constant(list(FORMATS) + [""])
    reason = _first(reason, tf.where(steps > MAX_SEGMENTS, tf.strings.join([
        "is a ", tf.gather(names, fmt), f" with over {MAX_SEGMENTS:,} "
        "segments before its pixels (real files have a few dozen)"]), ""))
    return tf.ensure_shape(facts, (len(FACTS),)), reason


def _orient(pixels, orientation):
    """Applies an EXIF orientation (1-8): flips, then a transpose for
    5-8."""
    tf = _tf()
    o = tf.cast(orientation, tf.int32)
    flip_rows = tf.reduce_any(tf.equal(o, [3, 4, 6, 7]))
    flip_cols = tf.reduce_any(tf.equal(o, [2, 3, 7, 8]))
    axes = tf.boolean_mask(tf.constant([0, 1]), tf.stack([flip_rows,
                                                          flip_cols]))
    flipped = tf.reverse(pixels, axes)
    return tf.cond(o >= 5, lambda: _transposed(flipped), lambda: flipped)


def _transposed(pixels):
    """``pixels`` (H, W, 3) uint8 as (W, H, 3), moved as float32 words:
    oneDNN's integer transpose logs "oneDNN supports DT_UINT8 only on
    platforms with AVX-512" to stderr on every CPU. A top byte 0x40 makes
    each word a normal finite float, so no copy can change its bits."""
    tf = _tf()
    pad = tf.fill(tf.concat([tf.shape(pixels)[:2], [1]], 0),
                  tf.constant(0x40, tf.uint8))
    little = sys.byteorder == "little"
    words = tf.bitcast(tf.concat([pixels, pad] if little else [pad, pixels],
                                 -1), tf.float32)
    moved = tf.bitcast(tf.transpose(words, [1, 0]), tf.uint8)
    return moved[..., :3] if little else moved[..., 1:]


def _pixels(data, facts, fmt=None):
    """The decoder proper: uint8 (H, W, 3) of an image :func:`inspect`
    accepts, from its ``facts`` (``fmt``: as for :func:`inspect`)."""
    tf = _tf()
    width, height, extra = facts[1], facts[2], facts[5:]

    def jpeg(scale):
        return functools.partial(tf.io.decode_jpeg, data, channels=3,
                                 ratio=scale, dct_method="INTEGER_ACCURATE")

    def png():
        return tf.io.decode_png(data, channels=3)

    def gif():
        left, top, _, _, at, end = tf.unstack(extra, num=6)
        zero = tf.constant(0, tf.int64)

        def part(start, stop):
            start = tf.cast(start, tf.int64)
            return tf.strings.substr(data, start, stop - start)

        flags = _raw(data, 10, 2)
        table = tf.where(flags[0] >= 128, 3 * 2 ** (flags[0] % 8 + 1), 0)
        # A GIF of the first frame alone at (0, 0): giflib reads every
        # frame into memory, and TensorFlow decodes a first frame smaller
        # than the screen wrongly (black). Without the extensions before
        # it: a transparent index would decode black, not the palette's
        # colour under it (alpha dropped, as Pillow's convert("RGB")).
        first = tf.strings.join([
            part(zero, 6), part(at + 5, at + 9), part(10, 13 + table),
            "\x2c\x00\x00\x00\x00", part(at + 5, end), "\x3b"])
        frame = tf.io.decode_gif(first)[0]
        shape = tf.shape(frame, out_type=tf.int64)
        # Placed at its offset on the screen, clipped to it.
        top, left = tf.minimum(top, height), tf.minimum(left, width)
        keep_h = tf.minimum(shape[0], height - top)
        keep_w = tf.minimum(shape[1], width - left)
        frame = frame[:keep_h, :keep_w]
        pads = tf.stack([[top, height - top - keep_h],
                         [left, width - left - keep_w], [zero, zero]])
        inside = tf.pad(tf.ones([keep_h, keep_w, 1], tf.bool), pads)
        colour = _raw(data, 13 + 3 * flags[1], 3)
        colour = tf.where(flags[0] >= 128, colour, tf.zeros(3, tf.int64))
        background = tf.cast(colour, tf.uint8)[None, None, :]
        return tf.where(inside, tf.pad(frame, pads), background)

    def bmp():
        bits, palette, colours = extra[0], extra[1], extra[2]
        stored = tf.io.decode_bmp(data, channels=0)

        def indexed():
            table = tf.reshape(_raw(data, palette, 4 * 256), (256, 4))
            # BGRX entries; indices past the palette's size read black.
            table = tf.where(tf.range(256, dtype=tf.int64)[:, None]
                             < colours, table, 0)
            rgb = tf.cast(tf.reverse(table[:, :3], [1]), tf.uint8)
            return tf.gather(rgb, tf.cast(stored[..., 0], tf.int32))

        return tf.cond(tf.equal(bits, 8), indexed, lambda: stored[..., :3])

    def webp():  # RGB, or RGBA: alpha dropped
        return tf.io.decode_webp(data, channels=0)[0][..., :3]

    others = [png, gif, bmp, webp]
    if fmt == _UNKNOWN:  # refused by inspect: nothing to decode
        return tf.zeros((0, 0, 3), tf.uint8)
    if fmt is not None and fmt != _JPEG:
        pixels = others[fmt - 1]()
    else:
        scale_index = tf.argmax(tf.equal(tf.constant(JPEG_SCALES, tf.int64),
                                         facts[3]), output_type=tf.int64)
        branch = tf.where(tf.equal(facts[0], _JPEG), scale_index,
                          len(JPEG_SCALES) - 1 + facts[0])
        pixels = tf.switch_case(
            tf.cast(branch, tf.int32),
            [jpeg(s) for s in JPEG_SCALES] + ([] if fmt == _JPEG else others))
    return _orient(tf.ensure_shape(pixels, (None, None, 3)), facts[4])


#: libjpeg's DCT for ``fast_dct``: the accurate one gives Pillow's pixels;
#: the fast one is off by up to 12 levels and about 10% faster on a crop.
_DCT = {False: "INTEGER_ACCURATE", True: "INTEGER_FAST"}


def _window(data, facts, begin, size, kind=None, fast_dct=False):
    """The window ``begin`` (y, x, 0), ``size`` (h, w, 3) of the oriented
    image as :func:`_pixels` decodes it: a JPEG decodes only that window,
    mapped back through its orientation; other formats are sliced.
    ``kind``: ``(scale, oriented)`` when the caller knows the image is a
    JPEG decoded at ``scale`` (then the graph has no branch)."""
    tf = _tf()
    scale, oriented = kind if kind is not None else (None, True)
    o = facts[4]
    if oriented:
        height = -(-facts[2] // facts[3])  # stored, at the decoded scale
        width = -(-facts[1] // facts[3])
        box = tf.cast(tf.stack([begin[0], begin[1], size[0], size[1]]),
                      tf.int64)
        # Undo the transpose (5-8), then the flips.
        box = tf.where(o >= 5, tf.gather(box, [1, 0, 3, 2]), box)
        flip_rows = tf.reduce_any(tf.equal(o, [3, 4, 6, 7]))
        flip_cols = tf.reduce_any(tf.equal(o, [2, 3, 7, 8]))
        top = tf.where(flip_rows, height - box[0] - box[2], box[0])
        left = tf.where(flip_cols, width - box[1] - box[3], box[1])
        window = tf.cast(tf.stack([top, left, box[2], box[3]]), tf.int32)
    else:
        window = tf.stack([begin[0], begin[1], size[0], size[1]])

    def jpeg(ratio):
        def crop():
            pixels = tf.io.decode_and_crop_jpeg(
                data, window, channels=3, ratio=ratio,
                dct_method=_DCT[fast_dct])
            return _orient(pixels, o) if oriented else pixels
        return crop

    if scale is not None:
        return jpeg(scale)()

    def whole():
        return tf.slice(_pixels(data, facts), begin, size)

    scale_index = tf.argmax(tf.equal(tf.constant(JPEG_SCALES, tf.int64),
                                     facts[3]), output_type=tf.int32)
    branch = tf.where(tf.equal(facts[0], _JPEG), scale_index,
                      len(JPEG_SCALES))
    pixels = tf.switch_case(branch, [jpeg(s) for s in JPEG_SCALES]
                            + [whole])
    return tf.ensure_shape(pixels, (None, None, 3))


@functools.lru_cache(maxsize=32)
def _window_function(fast_dct):
    tf = _tf()
    corner = tf.TensorSpec((3,), tf.int32)
    return tf.function(
        functools.partial(_window, fast_dct=fast_dct),
        input_signature=[tf.TensorSpec((), tf.string),
                         tf.TensorSpec((len(FACTS),), tf.int64), corner,
                         corner], autograph=False)


def oriented_shape(facts, kind=None):
    """(height, width, 3) int32 of the image :func:`decode` returns for
    these :func:`inspect` ``facts`` (``kind``: as for :func:`_window`)."""
    tf = _tf()
    if kind is not None and not kind[1]:
        scale = kind[0]
        return tf.cast(tf.stack([-(-facts[2] // scale),
                                 -(-facts[1] // scale), 3]), tf.int32)
    height = -(-facts[2] // facts[3])
    width = -(-facts[1] // facts[3])
    swap = facts[4] >= 5
    return tf.cast(tf.stack([tf.where(swap, width, height),
                             tf.where(swap, height, width), 3]), tf.int32)


@functools.lru_cache(maxsize=8)
def _functions(budget):
    """``(inspect, pixels)``, ``tf.function``s traced once per process
    and budget (tracing the decoder's ops takes seconds)."""
    tf = _tf()
    spec = tf.TensorSpec((), tf.string)
    facts = tf.TensorSpec((len(FACTS),), tf.int64)
    read = tf.function(lambda data: inspect(data, budget),
                       input_signature=[spec], autograph=False)
    pixels = tf.function(_pixels, input_signature=[spec, facts],
                         autograph=False)
    return read, pixels


def _checked(data, name, facts=None, length=None, budget=PIXEL_BUDGET):
    """``facts`` of ``data`` that every later op waits on: read now and
    refused with ``name`` and the reason, or read earlier (when ``data``
    was ``length`` bytes) and refused if the length changed since."""
    tf = _tf()
    if facts is None:
        facts, reason = _functions(budget)[0](data)
        check = tf.debugging.Assert(tf.equal(reason, ""), [
            tf.strings.join([name, " ", reason])], summarize=1)
    else:
        size = tf.cast(tf.strings.length(data), tf.int64)
        check = tf.debugging.Assert(tf.equal(size, length), [
            tf.strings.join([name, tf.strings.format(
                " changed since it was read ({} bytes, {} then): load the "
                "data again", (size, length))])], summarize=1)
    with tf.control_dependencies([check]):
        return tf.identity(facts)


def decode(data, name="image", budget=None):
    """The uint8 (height, width, 3) RGB pixels of the encoded image
    ``data`` (a scalar string tensor), by the module's rules (TensorFlow
    ops). A refused image fails the call with an ``InvalidArgumentError``
    whose message is ``name`` (a string or a scalar string tensor) and
    the reason (``"image_bytes[2] is empty"``), before anything is decoded.
    """
    budget = PIXEL_BUDGET if budget is None else budget
    return _functions(budget)[1](data, _checked(data, name, budget=budget))


def decode_inspected(data, facts, length, name="image"):
    """:func:`decode` of an image whose header :func:`inspect` already
    read (``facts``) when it was ``length`` bytes long; a file whose
    length changed since fails the call naming it."""
    facts = _checked(data, name, facts, length)
    return _functions(PIXEL_BUDGET)[1](data, facts)


def decode_crop(data, crop, name="image", facts=None, length=None, *,
                kind=None, fast_dct=False):
    """The window ``crop(shape)`` -> ``(begin, size)`` chooses in the image
    :func:`decode` would return (``shape``: its (height, width, 3)),
    decoding only that window of a JPEG. The pixels are those of
    ``decode(data)[window]`` except within two pixels of the window's
    edges (libjpeg's chroma upsampling: up to 15 levels on a noisy 4:2:0
    photo). ``facts``, ``length``: as for :func:`decode_inspected`;
    ``kind``: see :func:`_window`; ``fast_dct``: libjpeg's fast DCT."""
    facts = _checked(data, name, facts, length)
    begin, size = crop(oriented_shape(facts, kind))
    if kind is not None:  # a few ops: inline, not a function call
        return _window(data, facts, begin, size, kind, bool(fast_dct))
    return _window_function(bool(fast_dct))(data, facts, begin, size)


def decode_or_refuse(data, budget=None):
    """``(pixels, facts, reason)`` of ``data``, without failing for a
    refusal: empty (0, 0, 3) pixels and the reason ("" when accepted)."""
    tf = _tf()
    read, pixels = _functions(PIXEL_BUDGET if budget is None else budget)
    facts, reason = read(data)
    out = tf.cond(tf.equal(reason, ""), lambda: pixels(data, facts),
                  lambda: tf.zeros((0, 0, 3), tf.uint8))
    return out, facts, reason


def format_name(data):
    """The name of the format of ``data`` (a scalar string tensor) by its
    first bytes ("" for none of :data:`FORMATS`); no op here fails."""
    tf = _tf()
    return tf.gather(tf.constant(list(FORMATS) + [""]),
                     _sniff(_raw(data, 0, 12)))


def _decode_or_refuse(data, budget, fmt):
    """:func:`decode_or_refuse` built for one known format."""
    tf = _tf()
    facts, reason = inspect(data, budget, fmt)
    pixels = tf.cond(tf.equal(reason, ""), lambda: _pixels(data, facts, fmt),
                     lambda: tf.zeros((0, 0, 3), tf.uint8))
    return pixels, facts, reason


def sniff_bytes(data):
    """The format index of ``data`` (bytes) from its first bytes."""
    for fmt, first, second in _MAGIC:
        if data.startswith(first) and data[8:8 + len(second)] == second:
            return fmt
    return _UNKNOWN


@functools.lru_cache(maxsize=16)
def _eager(budget, fmt):
    # One function per format: tracing every format's ops took seconds.
    tf = _tf()
    return tf.function(
        functools.partial(_decode_or_refuse, budget=budget, fmt=fmt),
        input_signature=[tf.TensorSpec((), tf.string)], autograph=False)


def tf_message(error):
    """TensorFlow's error text on one line, without node names, the op's
    traceback and function prefixes."""
    import re

    text = getattr(error, "message", None) or str(error)
    text = re.split(r"\s*\[\[|\s*\[Op:", text)[0]
    if "Detected at node" in text:  # the op's traceback, then the message
        text = [part for part in text.split("\n\n") if part.strip()][-1]
    text = re.sub(r"\{\{[^}]*\}\}", "", text)
    return " ".join(text.split())


def decode_bytes(data, name="image"):
    """:func:`decode` run eagerly on bytes: uint8 (H, W, 3) NumPy, or an
    :class:`ImageError` whose one line starts with ``name``."""
    import numpy as np

    tf = _tf()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"{name} must be the bytes of an image file; "
                         f"received a {type(data).__name__}")
    data = bytes(data)
    fmt = sniff_bytes(data)
    try:
        pixels, _, reason = _eager(PIXEL_BUDGET, fmt)(tf.constant(data))
    except tf.errors.InvalidArgumentError as e:
        raise ImageError(f"{name} ({len(data)} bytes) is a damaged "
                         f"{FORMATS[fmt]} that the TensorFlow decoder cannot "
                         f"read ({tf_message(e)})") from None
    reason = reason.numpy().decode()
    if reason:
        raise ImageError(f"{name} {reason}")
    return np.asarray(pixels.numpy())


def read(path, name=None):
    """The uint8 (H, W, 3) RGB pixels of the image file ``path``, or an
    :class:`ImageError` naming it (``name``, default ``image {path!r}``).
    The caller checks that ``path`` is a regular file."""
    name = f"image {os.fspath(path)!r}" if name is None else name
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImageError(f"{name} cannot be read ({e.strerror or e})"
                         ) from None
    return decode_bytes(data, name)
