"""A corpus of odd image files and what each should decode to, for the
differential test of the three decoding paths (tests/data/test_images.py) and
the table in docs/images.md (benchmarks/decode_paths.py).

Every file is made here: each PIL mode every format accepts, EXIF
orientations 1-8 (both byte orders), progressive, greyscale and CMYK
JPEGs, palette/LA/RGBA/16-bit PNGs, translucent PNGs, WebPs and GIFs
(alpha dropped), BMP and GIF variants Pillow does not write (top-down
rows, a first frame smaller than the screen, a local colour table), and
files every path must refuse. ``want`` is the expected RGB
pixels from an independent reader (Pillow's ``exif_transpose`` +
``convert("RGB")``, or NumPy where Pillow reads differently: 16-bit
samples, GIF screens), or None with ``refusal`` the words every path's
message must contain.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import zlib

import numpy as np

SIZE = (23, 17)  # width, height: odd, so BMP rows are padded


@dataclasses.dataclass
class Case:
    name: str
    data: bytes
    want: np.ndarray | None = None  # (H, W, 3) uint8
    refusal: str | None = None
    note: str = ""


def _photo(seed=0, size=SIZE):
    """Smooth colours (JPEG-friendly) with some noise."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height,
                     (x + y) * 127 / (width + height)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(
        np.uint8)


def _save(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _pil_reference(data):
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def _chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body)))


def png16(pixels):
    """A 16-bit RGB (H, W, 3) or grey (H, W) PNG, written by hand (Pillow
    writes 16-bit grey only)."""
    pixels = np.asarray(pixels, ">u2")
    grey = pixels.ndim == 2
    height, width = pixels.shape[:2]
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)
    ihdr = struct.pack(">IIBBBBB", width, height, 16, 0 if grey else 2, 0,
                       0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))


def png_header(width, height):
    """A PNG that declares ``width`` x ``height`` and holds one row."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" + b"\x00" * 3 * min(width, 64))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", row) + _chunk(b"IEND", b""))


def lzw(indices, min_size=8):
    """GIF LZW data of 8-bit ``indices``: literal codes only, a clear code
    every 200 so the code size stays 9 bits."""
    clear, stop, size = 1 << min_size, (1 << min_size) + 1, min_size + 1
    acc, nbits, out = 0, 0, bytearray()

    def emit(code):
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += size
        while nbits >= 8:
            out.append(acc & 255)
            acc >>= 8
            nbits -= 8

    emit(clear)
    for k, index in enumerate(np.asarray(indices).ravel()):
        if k and k % 200 == 0:
            emit(clear)
        emit(int(index))
    emit(stop)
    if nbits:
        out.append(acc & 255)
    blocks = bytearray([min_size])
    for start in range(0, len(out), 255):
        part = out[start:start + 255]
        blocks += bytes([len(part)]) + part
    return bytes(blocks + b"\x00")


def gif(screen, frames, palette, background=0, local=False):
    """A GIF of ``frames`` [(left, top, indices (h, w))] on a ``screen``
    (width, height), with a 256-colour global table (or local ones)."""
    width, height = screen
    out = bytearray(b"GIF89a" + struct.pack("<HH", width, height))
    out += bytes([0x00 if local else 0xF7, background, 0])
    table = bytes(np.asarray(palette, np.uint8).ravel())
    if not local:
        out += table
    for left, top, indices in frames:
        h, w = indices.shape
        out += b"\x21\xf9\x04\x00\x0a\x00\x00\x00"  # graphic control
        out += b"\x2c" + struct.pack("<HHHH", left, top, w, h)
        out += bytes([0x87 if local else 0x00]) + (table if local else b"")
        out += lzw(indices)
    return bytes(out + b"\x3b")


def gif_screen(screen, left, top, indices, palette, background):
    """What :func:`gif`'s first frame looks like on its screen."""
    width, height = screen
    out = np.tile(np.asarray(palette[background], np.uint8),
                  (height, width, 1))
    region = np.asarray(palette, np.uint8)[indices][:max(0, height - top),
                                                   :max(0, width - left)]
    out[top:top + region.shape[0], left:left + region.shape[1]] = region
    return out


def _exif(orientation, big_endian=False):
    """An Exif payload (with its "Exif\\0\\0" prefix) whose IFD0 holds
    Make and Orientation."""
    order = ">" if big_endian else "<"
    head = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(
        order + "I", 8)
    entries = [(0x010F, 2, 4, b"cam\x00"),
               (0x0112, 3, 1, struct.pack(order + "H", orientation)
                + b"\x00\x00")]
    body = struct.pack(order + "H", len(entries))
    for tag, kind, count, value in entries:
        body += struct.pack(order + "HHI", tag, kind, count) + value
    return b"Exif\x00\x00" + head + body + b"\x00\x00\x00\x00"


def build():
    """The corpus: a list of :class:`Case`."""
    from PIL import Image

    cases = []
    photo = _photo()
    rgb = Image.fromarray(photo)

    def pil_case(name, data, note=""):
        cases.append(Case(name, data, _pil_reference(data), note=note))

    # Every PIL mode each format writes.
    for fmt, modes in [("PNG", ("1", "L", "LA", "P", "RGB", "RGBA")),
                       ("BMP", ("L", "P", "RGB", "RGBA")),
                       ("GIF", ("L", "P", "RGB")),
                       ("JPEG", ("L", "RGB", "CMYK")),
                       ("WEBP", ("L", "RGB", "RGBA"))]:
        for mode in modes:
            image = rgb.convert(mode)
            if mode == "P":  # a palette with transparency
                image.info["transparency"] = 0
            options = {"quality": 90} if fmt == "JPEG" else {}
            pil_case(f"{fmt.lower()} {mode}", _save(image, fmt, **options))
    # Real transparency (the modes above are opaque but P's index 0):
    # alpha 0, 127 and 254 in turn, in every format that keeps it.
    translucent = rgb.copy()
    translucent.putalpha(Image.fromarray((np.arange(photo[..., 0].size) % 3
                                          * 127).reshape(photo.shape[:2])
                                         .astype(np.uint8)))
    for name, data in translucent_files(translucent).items():
        pil_case(name, data)
    pil_case("png P 4-bit", _save(rgb.quantize(16), "PNG", bits=4))
    pil_case("png P tRNS alpha", _save(
        rgb.convert("RGBA").quantize(64), "PNG"))
    pil_case("jpeg progressive", _save(rgb, "JPEG", progressive=True,
                                       quality=90))
    pil_case("jpeg 4:4:4", _save(rgb, "JPEG", subsampling=0, quality=95))
    pil_case("jpeg MPO (phone)", _save(rgb, "MPO", save_all=True,
                                       append_images=[rgb.rotate(90)]))
    # EXIF orientations, both byte orders, in the three formats that
    # carry EXIF.
    for orientation in range(1, 9):
        exif = _exif(orientation)
        pil_case(f"jpeg EXIF orientation {orientation}",
                 _save(rgb, "JPEG", exif=exif, quality=90))
        pil_case(f"png eXIf orientation {orientation}",
                 _save(rgb, "PNG", exif=exif))
    for orientation in (3, 6, 8):
        pil_case(f"jpeg EXIF orientation {orientation} big-endian",
                 _save(rgb, "JPEG", quality=90,
                       exif=_exif(orientation, big_endian=True)))
        pil_case(f"webp EXIF orientation {orientation}",
                 _save(rgb, "WEBP", lossless=True, exif=_exif(orientation)))
    pil_case("jpeg EXIF after a big APP2", _jpeg_with_segments(
        _save(rgb, "JPEG", quality=90), [(0xE2, b"ICC_PROFILE\x00" + bytes(
            3000)), (0xE1, _exif(6))]))
    # 16-bit PNGs: the high byte of each sample.
    wide = (photo.astype(np.uint16) * 257 + np.arange(photo.size).reshape(
        photo.shape) % 257).astype(np.uint16)
    cases.append(Case("png 16-bit RGB", png16(wide),
                      (wide >> 8).astype(np.uint8)))
    grey = wide[..., 0]
    cases.append(Case("png 16-bit grey", png16(grey),
                      np.repeat((grey >> 8).astype(np.uint8)[..., None], 3,
                                -1),
                      note="Pillow's convert('RGB') clips it to 255"))
    # BMPs Pillow does not write.
    bmp = _save(rgb, "BMP")
    cases.append(Case("bmp 24-bit top-down", _top_down(bmp), photo))
    cases.append(Case("bmp 1-bit", _save(rgb.convert("1"), "BMP"),
                      refusal="is a BMP of 1 bits per pixel"))
    cases.append(Case("bmp RLE8", _save(rgb.convert("P"), "BMP")[:30]
                      + struct.pack("<I", 1)
                      + _save(rgb.convert("P"), "BMP")[34:],
                      refusal="compression 1"))
    # GIFs: the first frame on its screen.
    rng = np.random.default_rng(1)
    palette = rng.integers(0, 256, (256, 3)).astype(np.uint8)
    small = rng.integers(0, 256, (6, 9))
    full = rng.integers(0, 256, (SIZE[1], SIZE[0]))
    for name, screen, frames, local in [
            ("gif first frame smaller than the screen", SIZE,
             [(4, 5, small), (0, 0, full)], False),
            ("gif frame past the screen's edge", (11, 8),
             [(5, 4, small)], False),
            ("gif animated, local colour tables", SIZE,
             [(0, 0, full), (0, 0, full[::-1])], True)]:
        left, top, indices = frames[0]
        cases.append(Case(name, gif(screen, frames, palette, 3, local),
                          gif_screen(screen, left, top, indices, palette,
                                     0 if local else 3)))
    # Refused by every path.
    cases.append(Case("empty file", b"", refusal="is empty"))
    cases.append(Case("text", b"not an image at all",
                      refusal="is not a JPEG, PNG, GIF, BMP or WebP file"))
    cases.append(Case("tiff", _save(rgb, "TIFF"),
                      refusal="is not a JPEG, PNG, GIF, BMP or WebP file"))
    frames = [rgb, rgb.rotate(180)]
    cases.append(Case("webp animated", _save(
        frames[0], "WEBP", save_all=True, append_images=frames[1:]),
        refusal="is an animated WebP"))
    cases.append(Case("png declaring 20000x20000", png_header(20000, 20000),
                      refusal="is a 20000x20000 PNG, over the"))
    plain = gif(SIZE, [(0, 0, full)], palette)
    at = 13 + 768  # after the global colour table
    cases.append(Case("gif behind 2000 comment blocks", plain[:at]
                      + b"\x21\xfe\x01x\x00" * 2000 + plain[at:],
                      refusal="is a GIF with over 1,000 segments"))
    cases.append(Case("gif with no image", plain[:at] + b"\x3b",
                      refusal="is a GIF with no image"))
    cases.append(Case("gif screen 5000x5000", gif(
        (5000, 5000), [(0, 0, small)], palette),
        refusal="is a 5000x5000 GIF, over the"))
    return cases


def translucent_files(image):
    """``{case name: bytes}``: the RGBA ``image`` in each format that keeps
    its alpha (a GIF keeps one transparent index)."""
    return {"png RGBA translucent": _save(image, "PNG"),
            "png LA translucent": _save(image.convert("LA"), "PNG"),
            "webp RGBA translucent": _save(image, "WEBP", quality=90),
            "webp RGBA translucent lossless": _save(image, "WEBP",
                                                    lossless=True, exact=True),
            "gif RGBA transparent index": _save(image, "GIF")}


def _jpeg_with_segments(jpeg, segments):
    """``jpeg`` with ``segments`` [(marker, payload)] after its SOI."""
    out = jpeg[:2]
    for marker, payload in segments:
        out += bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2)
        out += payload
    return out + jpeg[2:]


def _top_down(bmp):
    """A bottom-up 24-bit BMP rewritten with its rows top-down."""
    offset = struct.unpack("<I", bmp[10:14])[0]
    width, height = struct.unpack("<ii", bmp[18:26])
    stride = (width * 3 + 3) // 4 * 4
    rows = [bmp[offset + i * stride:offset + (i + 1) * stride]
            for i in range(height)]
    return (bmp[:22] + struct.pack("<i", -height) + bmp[26:offset]
            + b"".join(rows[::-1]))
