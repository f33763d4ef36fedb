"""A damaged image is named by its position and its format, for every
format the decoder accepts, on every path that decodes: the eager reader
(``keras-vit predict`` and the Python API), the training folder scan and
the in-graph decoder the ``image_bytes`` serving signature runs. Once a
JPEG cut short was named and a PNG, GIF, BMP or WebP cut short failed in
TensorFlow's decoder with an error that named no image."""

import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorflow as tf
from PIL import Image

from keras_vit.data import images  # noqa: E402

SIZE = (23, 17)
# (our name, PIL's format, PIL's options, file extension)
KINDS = [("JPEG", "JPEG", {}, ".jpg"), ("PNG", "PNG", {}, ".png"),
         ("GIF", "GIF", {}, ".gif"), ("BMP", "BMP", {}, ".bmp"),
         ("WebP", "WEBP", {"lossless": True}, ".webp"),
         ("WebP", "WEBP", {"quality": 80}, ".webp")]
BATCH = 4


def _file(kind, seed=0):
    _, pil, options, _ = kind
    pixels = np.random.default_rng(seed).integers(
        0, 255, SIZE[::-1] + (3,), "uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, pil, **options)
    return out.getvalue()


GOOD = [_file(kind) for kind in KINDS]


def test_every_format_the_decoder_accepts_is_covered():
    assert {k[0] for k in KINDS} == set(images.FORMATS)
    for kind, data in zip(KINDS, GOOD):
        assert images.decode_bytes(data).shape == SIZE[::-1] + (3,), kind


def _named(message, position, fmt):
    """The message names the element and its format, on one line."""
    assert "\n" not in message, message
    assert position in message, (position, message)
    assert fmt in message, (fmt, message)


def _serve_graph():
    """The serving signature's own graph (the ``tf.function`` a SavedModel
    stores) for a tiny classifier, traced once."""
    import keras_vit
    from keras_vit.export import serving

    graph = serving.ImageBytesGraph(keras_vit.vit(32, 8, 16, 1, 2, 32, 3),
                                    top_k=1)
    return graph, graph.function()


GRAPH, SERVE = _serve_graph()


@settings(max_examples=12, deadline=None)
@given(which=st.integers(0, len(KINDS) - 1),
       fraction=st.floats(0.05, 1, exclude_max=True),
       position=st.integers(0, BATCH - 1))
def test_a_file_cut_short_is_named_by_position_and_format(which, fraction,
                                                          position):
    kind = KINDS[which]
    fmt = kind[0]
    data = GOOD[which]
    cut = data[:max(12, int(fraction * len(data)))]
    if fmt == "GIF" and len(cut) == len(data) - 1:
        cut = cut[:-1]  # only the trailer gone: every reader decodes it
    batch = [GOOD[(which + 1 + i) % len(GOOD)] for i in range(BATCH)]
    batch[position] = cut
    name = f"image_bytes[{position}]"
    # The eager reader, element by element (predict, the Python API).
    for i, element in enumerate(batch):
        if i != position:
            images.decode_bytes(element, f"image_bytes[{i}]")
    with pytest.raises(images.ImageError) as error:
        images.decode_bytes(cut, name)
    eager = str(error.value)
    assert eager.startswith(name + " "), eager
    # A GIF cut before its first image says so, naming it (no size: the
    # header walk found no frame to measure).
    _named(eager, name, "GIF" if fmt == "GIF" else fmt)
    # The serving signature's graph, the whole batch at once.
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        SERVE(tf.constant(batch))
    served = images.tf_message(error.value)
    _named(served, name, fmt)
    assert eager.removeprefix(name) in served, (eager, served)


def test_the_training_scan_names_each_damaged_file_and_its_format(tmp_path):
    """The folder scan skips a damaged file of every format and says
    which and why; its reason is the eager reader's."""
    from keras_vit.train.data.folders import FolderSource

    folder = tmp_path / "data" / "a"
    folder.mkdir(parents=True)
    want = {}
    for i, (kind, data) in enumerate(zip(KINDS, GOOD)):
        (folder / f"good{i}{kind[3]}").write_bytes(data)
        bad = folder / f"cut{i}{kind[3]}"
        bad.write_bytes(data[:len(data) * 2 // 3])
        want[str(bad)] = kind[0]
    garbled = bytearray(GOOD[1])
    garbled[len(garbled) // 2:len(garbled) // 2 + 16] = bytes(16)
    (folder / "garbled.png").write_bytes(bytes(garbled))
    want[str(folder / "garbled.png")] = "PNG"
    with pytest.warns(UserWarning, match="skipped 7 of 13 files"):
        source = FolderSource(str(tmp_path / "data"), verbose=False)
    skipped = dict(source.skipped)
    assert set(skipped) == set(want)
    for path, fmt in want.items():
        _named(skipped[path], fmt, fmt)
        with pytest.raises(images.ImageError) as error:
            images.read(path, name="it")
        assert str(error.value) == f"it {skipped[path]}"


def test_a_garbled_body_is_named_with_its_format_by_the_eager_reader():
    data = bytearray(GOOD[1])  # a PNG: libpng checks each chunk's CRC
    data[len(data) // 2:len(data) // 2 + 16] = bytes(16)
    with pytest.raises(images.ImageError) as error:
        images.decode_bytes(bytes(data), "image_bytes[2]")
    _named(str(error.value), "image_bytes[2]", "PNG")
    assert "damaged PNG" in str(error.value)


def _garbled(kind, data):
    """``data`` (a complete file of ``kind``) with bytes inside it changed
    so that TensorFlow's decoder fails on it, the file's length and its
    header's size unchanged; None for a BMP, whose rows are raw pixels
    (no change of them fails any decoder)."""
    fmt, _, options, _ = kind
    out = bytearray(data)
    if fmt == "JPEG":  # a Huffman table's counts past 256 codes
        at = data.index(b"\xff\xc4")
        out[at + 5:at + 21] = bytes([255] * 16)
    elif fmt == "PNG":  # libpng checks each chunk's CRC
        out[len(out) // 2:len(out) // 2 + 16] = bytes(16)
    elif fmt == "GIF":  # the first frame's LZW data
        at = data.index(b"\x2c", 13 + 3 * 2 ** ((data[10] & 7) + 1))
        flags = data[at + 9]
        start = at + 10 + (3 * 2 ** ((flags & 7) + 1) if flags & 128 else 0)
        out[start + 2:start + 40] = bytes(range(200, 238))
    elif fmt == "WebP" and options.get("lossless"):  # the VP8L bitstream
        out[25:45] = bytes([255] * 20)
    elif fmt == "WebP":  # the VP8 frame's first partition past its end
        out[20:23] = b"\xff\xff\x0f"
    else:
        return None
    return bytes(out)


@pytest.mark.parametrize("which", range(len(KINDS)),
                         ids=[f"{k[0]}-{k[3]}-{i}" for i, k in
                              enumerate(KINDS)])
def test_a_garbled_body_is_named_by_position_and_format_when_served(which):
    """A complete file that TensorFlow's decoder fails on (not cut short:
    its header and length are whole) is named with its position, size
    and format by the eager reader and by the serving signature's graph,
    in the same words; the graph once failed with the decoder's own
    error, naming no element."""
    kind = KINDS[which]
    garbled = _garbled(kind, GOOD[which])
    position = 2
    batch = [GOOD[(which + 1 + i) % len(GOOD)] for i in range(BATCH)]
    name = f"image_bytes[{position}]"
    if garbled is None:  # a BMP: no garbling fails; both paths agree
        garbled = bytearray(GOOD[which])
        garbled[-16:] = bytes(16)
        batch[position] = bytes(garbled)
        served = SERVE(tf.constant(batch))["logits"].numpy()
        np.testing.assert_allclose(served, GRAPH.reference(batch)["logits"],
                                   atol=1e-5)
        return
    batch[position] = garbled
    with pytest.raises(images.ImageError) as error:
        images.decode_bytes(garbled, name)
    eager = str(error.value)
    _named(eager, name, kind[0])
    assert f"({len(garbled)} bytes) is a damaged {kind[0]} " in eager, eager
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        SERVE(tf.constant(batch))
    served = images.tf_message(error.value)
    _named(served, name, kind[0])
    # The graph's words are the eager reader's, less TensorFlow's reason.
    words = eager[:eager.index(" cannot read") + len(" cannot read")]
    assert words in served, (eager, served)


@settings(max_examples=15, deadline=None)
@given(which=st.integers(0, len(KINDS) - 1),
       start=st.floats(0.1, 0.95), values=st.binary(min_size=1, max_size=24),
       position=st.integers(0, BATCH - 1))
def test_any_garbled_file_gives_the_same_answer_on_every_path(
        which, start, values, position):
    """Bytes overwritten anywhere in a file of any format: the eager
    reader and the serving graph both decode it to the same model
    outputs, or both refuse it naming its position and format."""
    data = bytearray(GOOD[which])
    at = int(start * len(data))
    data[at:at + len(values)] = values[:len(data) - at]
    batch = [GOOD[(which + 1 + i) % len(GOOD)] for i in range(BATCH)]
    batch[position] = bytes(data)
    name = f"image_bytes[{position}]"
    try:
        images.decode_bytes(bytes(data), name)
    except images.ImageError as error:
        eager = str(error)
        assert eager.startswith(name + " "), eager
        with pytest.raises(tf.errors.InvalidArgumentError) as served:
            SERVE(tf.constant(batch))
        message = images.tf_message(served.value)
        assert name + " " in message, (eager, message)
        fmt = KINDS[which][0]
        if fmt in message or fmt in eager:  # a header left unrecognised
            _named(message, name, fmt)
        return
    got = SERVE(tf.constant(batch))["logits"].numpy()
    np.testing.assert_allclose(got, GRAPH.reference(batch)["logits"],
                               atol=1e-5)
