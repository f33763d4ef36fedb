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

tf = pytest.importorskip("tensorflow")
Image = pytest.importorskip("PIL.Image")

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
    """The in-graph decode of a batch as the serving signature runs it
    (each element named ``image_bytes[i]``), one image at a time."""
    def one(args):
        data, i = args
        pixels = images.decode(data, tf.strings.format("image_bytes[{}]", i))
        return tf.image.resize(tf.cast(pixels, tf.float32), (8, 8))

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string)])
    def serve(batch):
        index = tf.range(tf.shape(batch)[0])
        return tf.map_fn(one, (batch, index), parallel_iterations=1,
                         fn_output_signature=tf.TensorSpec((8, 8, 3),
                                                           tf.float32))

    return serve


SERVE = _serve_graph()


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
