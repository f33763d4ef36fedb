"""One decoder for every path (keras_vit/data/images.py).

What these tests guard:

- the decoder gives the pixels of an independent reader (Pillow's
  ``exif_transpose`` + ``convert("RGB")``, NumPy for 16-bit samples and GIF
  screens) on a corpus of odd files (tests/image_corpus.py: every PIL mode
  each format writes, EXIF orientations 1-8 in both byte orders,
  progressive and CMYK JPEGs, palette/LA/RGBA/16-bit PNGs, BMP and GIF
  variants), and refuses the rest with one line naming the file;
- ``keras-vit predict`` (and the Python API), the training/evaluation
  pipeline and the ``image_bytes`` serving signature give the same pixels,
  the same probabilities and the same refusals on every file of it;
- no path decodes past the pixel budget whatever a header declares (a
  property test over generated headers), and the serving signature's peak
  memory stays under 1 GiB for inputs of at most 10 MB (measured in a
  child process on an exported SavedModel).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorflow as tf
from PIL import Image

import image_corpus  # noqa: E402
from testkit import jpeg as _jpeg  # noqa: E402
from testkit import one_error_line as _one_error_line  # noqa: E402

from keras_vit.data import images  # noqa: E402

EXTENSIONS = {b"\xff\xd8": ".jpg", b"\x89P": ".png", b"GI": ".gif",
              b"BM": ".bmp", b"RI": ".webp"}
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=32, num_classes=5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The cases, each written as ``<folder>/a/<n>.<ext>`` (one class)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PIL on palettes
        cases = image_corpus.build()
    root = tmp_path_factory.mktemp("corpus")
    (root / "a").mkdir()
    for i, case in enumerate(cases):
        ext = EXTENSIONS.get(case.data[:2], ".png")
        case.path = str(root / "a" / f"{i:02d}{ext}")
        with open(case.path, "wb") as f:
            f.write(case.data)
    return root, cases


def test_the_decoder_gives_an_independent_readers_pixels(corpus):
    _, cases = corpus
    assert len(cases) > 50
    for case in cases:
        if case.want is None:
            with pytest.raises(images.ImageError) as error:
                images.decode_bytes(case.data, "x")
            message = str(error.value)
            assert message.startswith("x ") and case.refusal in message, (
                case.name, message)
            assert "\n" not in message
        else:
            got = images.decode_bytes(case.data, case.name)
            assert got.dtype == np.uint8 and got.shape == case.want.shape, (
                case.name, got.shape)
            np.testing.assert_array_equal(got, case.want, err_msg=case.name)


@pytest.mark.parametrize("name", list(image_corpus.translucent_files(
    Image.new("RGBA", (1, 1)))))
def test_alpha_is_dropped_keeping_the_colour_under_it(corpus, name):
    """docs/images.md rule 3: a file with real transparency gives the
    colours stored under its alpha, as Pillow's convert("RGB")."""
    import io

    (case,) = [c for c in corpus[1] if c.name == name]
    with Image.open(io.BytesIO(case.data)) as im:
        assert im.convert("RGBA").getextrema()[3][0] == 0, name  # not opaque
        want = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(images.decode_bytes(case.data, name), want)
    if "lossless" in name or name == "png RGBA translucent":
        np.testing.assert_array_equal(want, image_corpus._photo())


def _model():
    import keras_vit

    model = keras_vit.models.vit(**TINY)
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def test_predict_training_and_serving_agree_on_every_file(corpus):
    """The three paths on each file of the corpus: the same pixels
    (predict vs the training decoder), the same evaluation input (predict +
    zoo.preprocess_input vs the evaluation pipeline), the same
    probabilities (vs the serving signature) and the same refusals."""
    from keras_vit import cli, zoo
    from keras_vit import train as kt
    from keras_vit.cli.options import UserError
    from keras_vit.export.serving import ImageBytesGraph

    root, cases = corpus
    model = _model()
    # Predict (and the Python API, which calls the same reader).
    predicted, refused = {}, {}
    for case in cases:
        try:
            predicted[case.path] = cli._read_image(case.path)
        except UserError as e:
            refused[case.path] = str(e)
            assert str(e).startswith(f"IMAGE={case.path!r} ")
    # Training and evaluation: the folder scan keeps what predict reads.
    with pytest.warns(UserWarning):
        source = kt.load_data(str(root))
    skipped = dict(source.skipped)
    assert set(skipped) == set(refused)
    for path, why in skipped.items():
        assert refused[path] == f"IMAGE={path!r} {why}"
    rows, _ = source.table()
    files = [str(f) for f in source._files]
    decoded = tf.data.Dataset.from_tensor_slices(rows).map(source.decode)
    for path, pixels in zip(files, decoded.as_numpy_iterator()):
        np.testing.assert_array_equal(pixels, predicted[path], err_msg=path)
    batch = np.concatenate([x for x, _ in kt.dataset(
        source, 32, batch_size=16, training=False).as_numpy_iterator()])
    want = np.stack([zoo.preprocess_input(predicted[p], 32) for p in files])
    np.testing.assert_allclose(batch, want, atol=1e-4)
    # Serving: the signature's graph on the same bytes.
    graph = ImageBytesGraph(model, top_k=5)
    serve = tf.function(graph.serve, input_signature=[graph.input_spec()])
    probs = tf.nn.softmax(model(want, training=False)).numpy()
    for i, path in enumerate(files):
        with open(path, "rb") as f:
            out = serve(tf.constant([f.read()]))
        got = tf.nn.softmax(out["logits"]).numpy()[0]
        np.testing.assert_allclose(got, probs[i], atol=1e-3, err_msg=path)
    for path, message in refused.items():
        with open(path, "rb") as f:
            data = f.read()
        reason = message.removeprefix(f"IMAGE={path!r} ")
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            serve(tf.constant([data]))
        assert f"image_bytes[0] {reason}" in str(error.value), path


def test_exif_orientation_maps_as_viewers_show_it():
    """The eight orientations against Pillow's exif_transpose on a photo
    that is not symmetric: a wrong flip or transpose changes pixels."""
    from PIL import Image

    photo = image_corpus._photo(3, (7, 4))
    for orientation in range(1, 9):
        data = image_corpus._save(Image.fromarray(photo), "PNG",
                                  exif=image_corpus._exif(orientation))
        np.testing.assert_array_equal(
            images.decode_bytes(data), image_corpus._pil_reference(data),
            err_msg=str(orientation))


# One fresh Python process for the two tests that need one (starting it
# costs 5 CPU-s, most of it TensorFlow's import): it decodes photos as a
# Python user would, writes a marker line to stderr, then, when the
# serving test runs in this session, measures the exported SavedModel's
# peak memory per request.
CHILD = textwrap.dedent("""
    import json, sys
    import image_corpus
    from PIL import Image
    from keras_vit.data import images
    photo = Image.fromarray(image_corpus._photo(3, (7, 4)))
    for orientation in (1, 6):
        data = image_corpus._save(photo, "JPEG",
                                  exif=image_corpus._exif(orientation))
        print(images.decode_bytes(data).shape, flush=True)
    print(MARKER, file=sys.stderr, flush=True)
    if len(sys.argv) > 1:
        import tensorflow as tf
        path, folder, requests = json.loads(sys.argv[1])
        model = tf.saved_model.load(path)
        serve = model.signatures["serving_default"]
        def kib(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1])
        def call(names):
            batch = [open(folder + "/" + n, "rb").read() for n in names]
            try:
                serve(image_bytes=tf.constant(batch))
                return "ok"
            except tf.errors.InvalidArgumentError as e:
                return " ".join(e.message.split())
        call(["small"])
        out = []
        for names in requests:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak starts again from here
            before = kib("VmRSS:")
            out.append([call(names), (kib("VmHWM:") - before) / 1024])
        print("PEAKS " + json.dumps(out))
    """)
MARKER = "-- photos decoded --"
SERVING_TEST = "test_the_serving_signature_holds_the_budget_in_memory"


@pytest.fixture(scope="module")
def child(request, tmp_path_factory):
    """``(proc, requests)``: the child process run once; ``requests`` the
    serving test's (None when that test does not run here)."""
    import json

    serving = os.access("/proc/self/clear_refs", os.W_OK) and any(
        item.name == SERVING_TEST for item in request.session.items)
    args, requests = [], None
    if serving:
        folder = tmp_path_factory.mktemp("serving")
        requests = _serving_requests(folder)
        args = [json.dumps([str(folder / "vit"), str(folder), requests])]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(__file__) + "/..",
                    env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.replace("MARKER", repr(MARKER)),
         *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, requests


def test_decoding_prints_no_onednn_integer_line(child):
    """A Python user decoding photos (a rotated one among them) in a fresh
    process sees no TensorFlow line: its oneDNN transpose logs "oneDNN
    supports DT_UINT8 only on platforms with AVX-512" for any integer
    tensor, AVX-512 CPUs included."""
    proc, requests = child
    shapes = [line for line in proc.stdout.splitlines()
              if not line.startswith("PEAKS ")]
    assert " ".join(shapes).split() == ["(4,", "7,", "3)", "(7,", "4,",
                                        "3)"], proc.stdout
    # What was printed while decoding: up to the marker.
    decoding, marker, _ = proc.stderr.partition(MARKER + "\n")
    assert marker, proc.stderr[-3000:]
    assert "oneDNN supports DT_" not in decoding, decoding


def test_refusals_are_one_line_and_name_the_element():
    decode = tf.function(lambda data: images.decode(
        data, tf.strings.format("image_bytes[{}]", tf.constant(7))))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"image_bytes\[7\] \(5 bytes\) is not a JPEG"):
        decode(tf.constant(b"hello"))
    with pytest.raises(images.ImageError) as error:
        images.decode_bytes("not bytes")
    assert str(error.value) == (
        "image must be the bytes of an image file; received a str")


def _photo_jpeg(progressive):
    import io

    from PIL import Image

    pixels = np.random.default_rng(3).integers(0, 255, (24, 40, 3), "uint8")
    out = io.BytesIO()
    # With an EXIF block: its thumbnail-sized segment comes before the scan.
    exif = Image.Exif()
    exif[0x0112] = 1
    Image.fromarray(pixels).save(out, "JPEG", progressive=progressive,
                                 exif=exif)
    return out.getvalue()


@settings(max_examples=25, deadline=None)
@given(progressive=st.booleans(), fraction=st.floats(0, 1, exclude_max=True))
def test_a_jpeg_cut_anywhere_is_refused_naming_the_element(progressive,
                                                           fraction):
    """A JPEG cut short, in its header or inside its image data, is
    refused by the module's own reading, naming the element, not by
    TensorFlow's decoder with an error that names no image."""
    data = _photo_jpeg(progressive)
    cut = data[:int(fraction * len(data))]
    with pytest.raises(images.ImageError) as error:
        images.decode_bytes(cut, "image_bytes[4]")
    message = str(error.value)
    assert message.startswith("image_bytes[4] ") and "\n" not in message
    assert ("cut short" in message or "is empty" in message
            or "is not a JPEG" in message), message
    # The whole file, and the file with bytes after its end, decode.
    assert images.decode_bytes(data).shape == (24, 40, 3)
    assert images.decode_bytes(data + b"trailing").shape == (24, 40, 3)


# -- the budget holds whatever the header says ------------------------------

def _declared(fmt, width, height, frame):
    """A file of ``fmt`` whose header declares ``width`` x ``height`` (and
    a first GIF frame of ``frame``) with almost no pixel data."""
    import struct

    if fmt == "PNG":
        return image_corpus.png_header(width, height)
    if fmt == "GIF":
        indices = np.zeros((min(frame[1], 2), min(frame[0], 2)), int)
        data = bytearray(image_corpus.gif((width, height), [(0, 0, indices)],
                                          np.zeros((256, 3))))
        at = data.index(b"\x2c", 13 + 768)
        data[at + 5:at + 9] = struct.pack("<HH", *frame)
        return bytes(data)
    if fmt == "BMP":
        return (b"BM" + struct.pack("<IHHI", 0, 0, 0, 54)
                + struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0,
                              0, 0, 0, 0, 0) + b"\x00" * 64)
    if fmt == "WEBP":
        body = (b"VP8X" + struct.pack("<I", 10) + b"\x00" * 4
                + (width - 1).to_bytes(3, "little")
                + (height - 1).to_bytes(3, "little"))
        return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body
    from PIL import Image  # a real JPEG with its SOF0 size rewritten

    data = bytearray(image_corpus._save(Image.new("RGB", (16, 16)), "JPEG"))
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _over(fmt, width, height, frame, budget):
    """The budget rule, written again from the tracker's words: a JPEG
    over the budget even at 1/8, any other format over it as it is (a GIF's
    screen or first frame)."""
    if fmt == "JPEG":
        return -(-width // 8) * -(-height // 8) > budget
    if fmt == "GIF":
        return width * height > budget or frame[0] * frame[1] > budget
    return width * height > budget


def test_no_path_decodes_past_the_budget_whatever_the_header_says(
        monkeypatch):
    import hypothesis
    st = hypothesis.strategies
    budget = 5000
    monkeypatch.setattr(images, "PIXEL_BUDGET", budget)
    graph = tf.function(lambda data: tf.shape(images.decode(data)),
                        input_signature=[tf.TensorSpec((), tf.string)])
    side = st.integers(1, 65535)

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(st.sampled_from(["JPEG", "PNG", "GIF", "BMP", "WEBP"]),
                      side, side, st.tuples(side, side))
    def check(fmt, width, height, frame):
        data = _declared(fmt, width, height, frame)
        over = _over(fmt, width, height, frame, budget)
        # The Python path (predict, the API) and the graph path (tf.data,
        # the serving signature).
        try:
            shape = images.decode_bytes(data, "x").shape[:2]
            eager = None
        except images.ImageError as e:
            shape, eager = None, str(e)
        try:
            graph_shape = tuple(graph(tf.constant(data)).numpy()[:2])
            graph_error = None
        except tf.errors.InvalidArgumentError as e:
            graph_shape, graph_error = None, str(e)
        if over:
            assert eager is not None and "-pixel budget" in eager, eager
            assert graph_error is not None and eager.removeprefix("x") in (
                graph_error), graph_error
        else:
            assert eager is None or "budget" not in eager, eager
            assert graph_error is None or "budget" not in graph_error
        for got in (shape, graph_shape):
            assert got is None or got[0] * got[1] <= budget, (fmt, got)

    check()


def _gif_blocks(data):
    """``(head, frames)`` of a GIF: the bytes before its first block, and
    each frame's bytes (the extensions before it, its image descriptor,
    local colour table and data sub-blocks); the trailer is left out."""
    flags = data[10]
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    head, frames, start = data[:at], [], at
    while data[at] != 0x3B:
        image = data[at] == 0x2C
        if image:  # descriptor, local table, LZW code size
            local = data[at + 9]
            at += 11 + (3 << ((local & 7) + 1) if local & 0x80 else 0)
        else:  # an extension: introducer and label
            at += 2
        while data[at]:  # sub-blocks, up to the empty one
            at += data[at] + 1
        at += 1
        if image:
            frames.append(data[start:at])
            start = at
    return head, frames


def _many_frames(size, count):
    """A GIF of ``count`` full frames of ``size``, each one colour and
    unlike the one before: Pillow writes eight, and the last seven's
    blocks are repeated (Pillow takes 50 ms a frame at 3000x3000, 15 s
    for 300)."""
    from PIL import Image

    head, frames = _gif_blocks(image_corpus._save(
        Image.new("P", size), "GIF", save_all=True,
        append_images=[Image.new("P", size, i % 7 + 1) for i in range(7)]))
    assert len(frames) == 8
    rest = [frames[1 + i % 7] for i in range(count - 1)]
    return head + b"".join([frames[0]] + rest) + b"\x3b"


def _serving_requests(folder):
    """Exports a SavedModel taking image bytes to ``folder/vit`` and
    writes the hostile files beside it: the requests (lists of file
    names), each at most 10 MB."""
    from PIL import Image

    from keras_vit.export import to_saved_model

    to_saved_model(_model(), str(folder / "vit"), input="image_bytes",
                   verify=False)
    hostile = {
        # The header says 20000x20000 (1.2 GB decoded): refused.
        "png_20000": image_corpus.png_header(20000, 20000),
        # Within the budget: 4000x4000, decoded whole.
        "png_4000": image_corpus._save(Image.new("RGB", (4000, 4000)),
                                       "PNG"),
        # 300 frames of 3000x3000: only the first is decoded.
        "gif_frames": _many_frames((3000, 3000), 300),
        # A JPEG header of 30000x30000: decoded at 1/8.
        "jpeg_30000": _declared("JPEG", 30000, 30000, None),
    }
    for name, data in hostile.items():
        (folder / name).write_bytes(data)
    (folder / "small").write_bytes(
        image_corpus._save(Image.new("RGB", (40, 30)), "PNG"))
    requests = [[name] for name in hostile] + [["png_4000"] * 25]
    for names in requests:
        assert sum(len(hostile[n]) for n in names) <= 10 * 2**20
    return requests


@pytest.mark.slow
def test_the_serving_signature_holds_the_budget_in_memory(child):
    """Inputs of at most 10 MB raise the server's peak memory by at most
    1 GiB: a SavedModel loaded in a child process, the peak resident size
    (VmHWM, reset through /proc/self/clear_refs before each request, since
    loading the model peaks higher than any request) against the resident
    size before it. Measured here: +0.2 MiB for the refused 20000x20000
    PNG, +287 for a 4000x4000 PNG, +289 for a batch of 25 of them (decoded
    one after another), +186 for 300 GIF frames, +254 for a JPEG header of
    30000x30000 (decoded at 1/8); before, 2.1 GB for a 12000x12000 PNG."""
    import json

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak")
    proc, requests = child
    (line,) = [line for line in proc.stdout.splitlines()
               if line.startswith("PEAKS ")]
    out = json.loads(line.removeprefix("PEAKS "))
    results = dict(zip([",".join(n[:1]) + ("x25" if len(n) > 1 else "")
                        for n in requests], out))
    assert "over the 16,000,000-pixel budget" in results["png_20000"][0]
    assert results["png_20000"][1] < 16, results
    for name in ("png_4000", "gif_frames", "jpeg_30000", "png_4000x25"):
        assert results[name][0] == "ok", results[name]
    # Decoded (48 MB) and cast to float32 for the resize (192 MB): the
    # peak is one image's, whatever the batch.
    assert 100 < results["png_4000"][1] < 1024, results
    for name, (_, mib) in results.items():
        assert mib <= 1024, (name, mib)


# -- training crops decode only the crop --------------------------------------

@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    """JPEGs of several sizes and EXIF orientations (the crop window maps
    through each), a 4:4:4 one and a PNG (decoded whole, then cropped)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("photos")
    for c in ("a", "b"):
        (root / c).mkdir()
    for i, (size, orientation, options) in enumerate([
            ((120, 90), 1, {}), ((97, 130), 6, {}), ((150, 70), 3, {}),
            ((88, 88), 8, {}), ((131, 77), 5, {"subsampling": 0}),
            ((64, 100), 7, {})]):
        photo = Image.fromarray(image_corpus._photo(i, size))
        photo.save(root / "ab"[i % 2] / f"{i}.jpg", quality=90,
                   exif=image_corpus._exif(orientation), **options)
    Image.fromarray(image_corpus._photo(9, (70, 50))).save(root / "a" /
                                                           "p.png")
    return root


def _whole_decode(source):
    """``source`` as the pipeline was before crops were decoded alone: its
    decode_crop decodes the whole image and slices it (the base class')."""
    import copy

    from keras_vit.train.data.folders import FolderSource
    from keras_vit.train.data.sources import ImageSource

    class WholeDecode(FolderSource):
        decode_crop = ImageSource.decode_crop

    old = copy.copy(source)
    old.__class__ = WholeDecode
    return old


def test_training_crops_keep_their_boxes_and_pixels(photo_folder):
    """Decoding only the crop draws the same boxes (from the header's
    size) as decoding the whole image and slicing it, through every EXIF
    orientation: with the accurate DCT the pixels are the same but within
    two pixels of the window's edges (libjpeg's chroma upsampling sees
    fewer neighbours there), with or without the branch-free graph of a
    folder of JPEGs; the pipeline's fast DCT stays within 12 levels (8
    measured, 1 on average) and PNGs are exact. The training batches
    match the old pipeline's."""
    from keras_vit import train as kt
    from keras_vit.train.data.pipeline import inception_box

    source = kt.load_data(str(photo_folder))
    rows, _ = source.table()
    seeds = tf.random.experimental.stateless_split([7, 11], 30).numpy()
    pairs = [(r, s) for r in rows for s in seeds]
    files = [str(source._files[r]) for r, _ in pairs]
    facts = source._facts

    def crops(fn, chosen=None):
        chosen = pairs if chosen is None else chosen
        ds = tf.data.Dataset.from_tensor_slices(
            ([p[0] for p in chosen], np.stack([p[1] for p in chosen])))
        return list(ds.map(lambda row, seed: fn(row, lambda shape: (
            inception_box(shape, seed)))).as_numpy_iterator())

    def exact(kind):
        def fn(row, crop):
            path = tf.gather(tf.constant(np.asarray(source._files, str)),
                             row)
            return images.decode_crop(
                tf.io.read_file(path), crop, "x",
                tf.gather(tf.constant(facts[:, :-1]), row),
                tf.gather(tf.constant(facts[:, -1]), row), kind=kind)
        return fn

    old = crops(_whole_decode(source).decode_crop)
    new = crops(source.decode_crop)
    accurate = crops(exact(None))
    jpegs = [p for p, f in zip(pairs, files) if f.endswith(".jpg")]
    static = iter(crops(exact((1, True)), jpegs))
    upright = [p for p in jpegs if facts[p[0], 4] == 1]
    assert upright
    plain = {id(p): x for p, x in zip(upright, crops(exact((1, False)),
                                                     upright))}

    def inside(x, edge=2):
        return x[edge:x.shape[0] - edge, edge:x.shape[1] - edge]

    for pair, path, a, b, c in zip(pairs, files, new, old, accurate):
        assert a.shape == b.shape == c.shape, path
        if path.endswith(".png"):
            np.testing.assert_array_equal(a, b, path)
            continue
        np.testing.assert_array_equal(inside(c), inside(b), path)
        np.testing.assert_array_equal(inside(next(static)), inside(b), path)
        if id(pair) in plain:
            np.testing.assert_array_equal(inside(plain[id(pair)]), inside(b))
        assert np.abs(inside(a) - inside(b)).max() <= 12, path
        assert np.abs(a - b).mean() <= 2, path
    assert len({x.shape for x in new}) > 20  # the boxes vary
    batches = [np.concatenate([x for x, _ in kt.dataset(
        src, 32, batch_size=7, training=True, seed=3, epoch=1,
        flip=True).as_numpy_iterator()]) for src in (source,
                                                     _whole_decode(source))]
    # A box off by a pixel, or a flip of the other seed, moves the mean
    # by several levels.
    assert np.abs(batches[0] - batches[1]).mean() < 1.5 / 127.5


def test_the_crop_distribution_and_the_evaluation_transform_are_pinned(
        photo_folder):
    """Inception crops cover 5% to 100% of the image with an aspect ratio
    in [3/4, 4/3] (the official pipeline's ranges), with the statistics
    measured before crops were decoded alone (2000 boxes of a 500x400
    image: area fraction mean 0.354, std 0.231, quantiles 0.084, 0.306,
    0.692; geometric-mean aspect 1.03); evaluation resizes the whole
    image (or a central crop) as before."""
    from keras_vit import train as kt
    from keras_vit.train.data.pipeline import inception_box

    shape = tf.constant([400, 500, 3])
    seeds = tf.random.experimental.stateless_split([1, 2], 2000)
    boxes = tf.map_fn(lambda s: inception_box(shape, s)[1], seeds)
    h, w = boxes.numpy()[:, 0], boxes.numpy()[:, 1]
    area, aspect = h * w / 200000.0, w / h
    whole = area == 1.0
    assert area.min() >= 0.05 - 0.01
    assert ((aspect >= 0.75 - 0.02) & (aspect <= 4 / 3 + 0.02) | whole).all()
    np.testing.assert_allclose(
        [area.mean(), area.std(), *np.quantile(area, [0.1, 0.5, 0.9])],
        [0.354, 0.231, 0.084, 0.306, 0.692], atol=0.002)
    assert abs(np.exp(np.log(aspect[~whole]).mean()) - 1.03) < 0.002
    # Evaluation: the decoded image, centrally cropped, resized.
    source = kt.load_data(str(photo_folder))
    for crop in (1.0, 0.875):
        got = np.concatenate([x for x, _ in kt.dataset(
            source, 32, batch_size=7, training=False, eval_crop=crop,
            raw_pixels=True).as_numpy_iterator()])
        want = []
        for path in source._files:
            image = images.read(str(path)).astype("float32")
            if crop < 1.0:
                image = tf.image.central_crop(image, crop)
            want.append(tf.image.resize(image, (32, 32)).numpy())
        np.testing.assert_allclose(got, np.stack(want), atol=1e-3)


# -- one pixel budget for every image reader --------------------------------

def test_decode_plan_bounds_what_any_header_can_ask_for():
    from keras_vit.data import images

    budget = images.PIXEL_BUDGET
    # JPEGs: the largest libjpeg scale that fits, whatever the header says.
    for width, height in [(4000, 4000), (4001, 4000), (12000, 9000),
                          (30000, 30000)]:
        plan = images.decode_plan("JPEG", width, height)
        kept = -(-width // plan.scale) * -(-height // plan.scale)
        assert kept <= budget
        smaller = plan.scale // 2
        assert smaller == 0 or (
            -(-width // smaller) * -(-height // smaller) > budget)
    assert images.decode_plan("JPEG", 4000, 4000).scale == 1
    refused = images.decode_plan("JPEG", 40000, 40000)
    assert refused.scale is None and "40000x40000 JPEG" in refused.refusal
    # Other formats decode whole: they must fit the budget as they are.
    assert images.decode_plan("PNG", 4000, 4000).scale == 1
    assert "16,000,000-pixel budget" in images.decode_plan(
        "PNG", 5000, 4000).refusal


def test_training_decodes_large_jpegs_at_a_reduced_scale(tmp_path,
                                                         monkeypatch):
    import tensorflow as tf

    from keras_vit.data import images

    monkeypatch.setattr(images, "PIXEL_BUDGET", 1000)
    decode = tf.function(lambda data: images.decode(data, "x"))
    for size, expected in [((30, 20), (20, 30)), ((64, 48), (24, 32)),
                           ((200, 100), (13, 25))]:
        path = tmp_path / f"{size[0]}.jpg"
        _jpeg(path, size)
        image = decode(tf.io.read_file(str(path)))
        assert tuple(image.shape) == expected + (3,)
        assert image.shape[0] * image.shape[1] <= 1000
        # The rule inside the graph is decode_plan's.
        plan = images.decode_plan("JPEG", *size)
        assert image.shape[1] == -(-size[0] // plan.scale)
    from PIL import Image

    png = tmp_path / "p.png"
    Image.new("RGB", (40, 25)).save(png)  # 1000 pixels: at the budget
    image = decode(tf.io.read_file(str(png)))
    assert tuple(image.shape) == (25, 40, 3)
    Image.new("RGB", (40, 26)).save(png)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="x is a 40x26 PNG, over the 1,000-pixel"):
        decode(tf.io.read_file(str(png)))


def test_predict_reduces_large_jpegs_and_refuses_large_pngs(
        tiny_keras, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from keras_vit import cli
    from keras_vit.data import images

    png, jpeg = tmp_path / "i.png", tmp_path / "i.jpg"
    Image.new("RGB", (100, 100), (200, 10, 10)).save(png)
    Image.new("RGB", (100, 100), (200, 10, 10)).save(jpeg)
    monkeypatch.setattr(images, "PIXEL_BUDGET", 500)  # 16e6 in real life
    assert cli.main(["predict", str(tiny_keras), str(jpeg)]) == 0
    assert str(jpeg) in capsys.readouterr().out
    assert cli.main(["predict", str(tiny_keras), str(png)]) == 2
    assert (f"IMAGE={str(png)!r} is a 100x100 PNG, over the 500-pixel "
            "budget" in _one_error_line(capsys))


def test_predict_refuses_what_it_cannot_decode_within_the_limits(
        tiny_keras, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from keras_vit import cli
    from keras_vit.data import images

    rgba = tmp_path / "alpha.png"
    Image.new("RGBA", (100, 100), (1, 2, 3, 4)).save(rgba)
    photo = tmp_path / "photo.jpg"
    _jpeg(photo, (160, 120))
    monkeypatch.setattr(images, "PIXEL_BUDGET", 2000)
    assert cli.main(["predict", str(tiny_keras), str(rgba)]) == 2
    line = _one_error_line(capsys)
    assert f"IMAGE={str(rgba)!r} is a 100x100 PNG, over the 2,000-pixel" \
        in line
    # A JPEG over the budget is decoded at a reduced scale, not refused.
    pixels = cli._read_image(str(photo))
    assert pixels.shape == (30, 40, 3)
    assert cli.main(["predict", str(tiny_keras), str(photo)]) == 0
