"""The SavedModel signature that takes encoded images
(``to_saved_model(..., input="image_bytes")``): decoding and preprocessing
as ``zoo.preprocess_input``, top-k labels and scores, a clear error for a
bad element, ``saved_model_cli``, and a verification that refuses a wrong
graph.
"""

import numpy as np
import pytest

import tensorflow as tf

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402
from keras_vit.export import ExportError, serving, to_saved_model  # noqa: E402

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=5)
NAMES = ["cat", "dog", "bird", "fish", "frog"]


def _model(seed=0, **changes):
    """A tiny ViT with random non-trivial weights (its head is not zero)."""
    model = keras_vit.models.vit(**dict(TINY, **changes))
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, 0.2, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _photos():
    """Encoded photos of several formats and sizes, and their pixels."""
    from keras_vit.export import samples

    files, pixels = [], []
    for i, (fmt, mode, shape) in enumerate([
            ("JPEG", "RGB", (45, 61)), ("PNG", "RGBA", (32, 32)),
            ("BMP", "RGB", (17, 40)), ("GIF", "RGB", (70, 28)),
            ("PNG", "L", (33, 90))]):
        crop = samples.photo_images(shape + (3,), 1, seed=10 + i)[0][0]
        files.append(serving.encode(crop, fmt, mode))
        pixels.append(serving.decode(files[-1]))
    return files, pixels


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny model's image-bytes SavedModel, made once for the module
    (on jax in the converter process: the only test there reads it) and
    loaded here. Verified at batch sizes other than the default (4, 1):
    they travel to the converter process too."""
    model = _model()
    path = str(tmp_path_factory.mktemp("serving") / "vit")
    report = to_saved_model(model, path, input="image_bytes", top_k=3,
                            labels=NAMES, batch_sizes=(3, 1))
    loaded = tf.saved_model.load(path)
    return model, path, report, loaded


def test_image_bytes_signature_is_keras_on_preprocessed_photos(exported):
    model, path, report, loaded = exported
    assert report["verified"] and report["verification"]["passed"]
    assert report["verification"]["samples"] == serving.SAMPLES
    assert report["input"]["name"] == "image_bytes"
    assert report["options"]["top_k"] == 3
    assert 0 < report["verification"]["output_scale"]["logits"]
    assert report["max_abs_diff"]["logits"] <= 1e-4
    signature = loaded.signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    assert name == "image_bytes"
    files, pixels = _photos()
    # Keras on the same files, decoded by Pillow, preprocessed by the zoo.
    x = np.stack([zoo.preprocess_input(p, 32) for p in pixels])
    want = np.asarray(model(x, training=False))
    for batch in (files, files[:1]):  # any batch size
        out = {k: v.numpy() for k, v in signature(
            image_bytes=tf.constant(batch)).items()}
        n = len(batch)
        assert out["logits"].shape == (n, 5)
        np.testing.assert_allclose(out["logits"], want[:n], atol=1e-4)
        probs = zoo.preprocessing.softmax(want[:n])
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :3]
        np.testing.assert_array_equal(out["classes"], order)
        np.testing.assert_allclose(
            out["scores"], np.take_along_axis(probs, order, -1), atol=1e-5)
        assert out["scores"].dtype == np.float32
        assert [[s.decode() for s in row] for row in out["labels"]] == [
            [NAMES[c] for c in row] for row in order]
    assert np.ptp(out["logits"]) > 0.1  # a model whose answers differ


def test_bad_elements_fail_the_call_naming_their_index(exported):
    _, _, _, loaded = exported
    signature = loaded.signatures["serving_default"]
    good = _photos()[0][1]
    cases = [([good, b"", b"garbage"], "image_bytes[1] is empty"),
             ([good, good, b"garbage"],
              "image_bytes[2] (7 bytes) is not a JPEG, PNG, GIF, BMP or WebP"),
             ([b"GIF8"], "image_bytes[0] (4 bytes) is not a JPEG")]
    for batch, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=(
                message.replace("[", r"\[").replace("]", r"\]")
                .replace("(", r"\(").replace(")", r"\)"))):
            signature(image_bytes=tf.constant(batch))
    # A valid header over a damaged body fails in the decoder, not the
    # process.
    with pytest.raises(tf.errors.InvalidArgumentError):
        signature(image_bytes=tf.constant([good[:60]]))
    # A JPEG cut short, before its image data or inside it, is named by
    # its index too (TensorFlow's own decoder would name none).
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(
        0, 255, (40, 48, 3), dtype=np.uint8)).save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    scan = jpeg.index(b"\xff\xda")
    for cut, where in ((jpeg[:scan], "before its image data"),
                       (jpeg[:len(jpeg) - 40], "inside its image data")):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"image_bytes\[1\] \({len(cut)} bytes\) "
                                 rf"is a JPEG cut short {where}"):
            signature(image_bytes=tf.constant([jpeg, cut]))
    # ... and the loaded model keeps answering.
    out = signature(image_bytes=tf.constant([good]))
    assert out["labels"].shape == (1, 3)


def test_labels_default_to_the_models_names_else_indices(tmp_path):
    model = _model(seed=1, num_classes=3)
    path = str(tmp_path / "indices")
    report = to_saved_model(model, path, input="image_bytes")
    assert report["options"]["top_k"] == 3  # 5 clipped to 3 classes
    assert report["options"]["labels"] == "class indices"
    assert any("clipped" in note for note in report["notes"])
    run = serving_run(path)
    out = run([_photos()[0][0]])
    assert out["labels"].shape == (1, 3)
    assert [s.decode() for s in out["labels"][0]] == [
        str(c) for c in out["classes"][0]]
    # A Hub model's label_names are used when it carries them.
    model.zoo_labels = ["red", "green", "blue"]
    path = str(tmp_path / "names")
    report = to_saved_model(model, path, input="image_bytes", top_k=1,
                            verify_data="noise")
    assert report["options"]["labels"] == "label_names"
    out = serving_run(path)([_photos()[0][0]])
    assert out["labels"][0, 0].decode() == ["red", "green", "blue"][
        int(out["classes"][0, 0])]


def serving_run(path):
    from keras_vit.export import saved_model

    return saved_model.open_artifact(path)


def test_a_graph_unlike_keras_is_refused(tmp_path, monkeypatch):
    """Verification catches a preprocessing bug (channels swapped) and
    writes nothing."""
    original = serving.ImageBytesGraph._model_input

    def bgr(self, pixels):
        return original(self, pixels)[..., ::-1]

    monkeypatch.setattr(serving.ImageBytesGraph, "_model_input", bgr)
    path = tmp_path / "bad"
    with pytest.raises(ExportError, match="does not match Keras") as info:
        to_saved_model(_model(), str(path), input="image_bytes")
    assert info.value.report["max_abs_diff"]["logits"] > 1e-3
    assert not path.exists()


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(input="foo"), r"input must be one of .*input='foo'"),
    (dict(input="image_byte"), r"Did you mean 'image_bytes'"),
    (dict(input="image_bytes", top_k=0), r"top_k=0"),
    (dict(input="image_bytes", top_k=2.5), r"top_k=2.5"),
    (dict(input="image_bytes", uint8_input=True), r"uint8_input=True"),
    (dict(input="image_bytes", outputs=("logits",)), r"outputs=\('logits',"),
    (dict(input="image_bytes", labels=["a", "b"]),
     r"labels has 2 names but the model has 5 classes"),
    (dict(input="image_bytes", labels="imagenet"),
     r"labels='imagenet' names no label list"),
    (dict(input="image_bytes", verify_data=np.zeros((2, 32, 32, 3))),
     r"verify_data must be 'photos' or 'noise'"),
    (dict(top_k=3), r"top_k and labels are options of input='image_bytes'"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, kwargs, pattern):
    path = tmp_path / "m"
    with pytest.raises(ValueError, match=pattern):
        to_saved_model(_model(), str(path), **kwargs)
    assert not path.exists()


# jax and torch hand their weights to the same TensorFlow converter
# process; each backend's own exports are test_export_backends.py's.
@pytest.mark.backends("tensorflow", "jax")
def test_every_backend_exports_the_bytes_signature(exported):
    """From JAX or PyTorch the signature is built in the TensorFlow
    converter process (the encoded files and the string labels cross
    without pickle) and verified against this backend's own logits. The
    SavedModel is run here, in this process's TensorFlow, against this
    backend's model."""
    model, _, report, loaded = exported
    assert report["verification"]["passed"]
    assert report["verified"] and report["max_abs_diff"]["logits"] <= 1e-4
    assert report["options"]["input"] == "image_bytes"
    assert report["batch_sizes"] == [3, 1]
    assert report["outputs"]["labels"] == [None, 3]
    files, pixels = _photos()
    out = loaded.signatures["serving_default"](
        image_bytes=tf.constant(files))
    served = {k: v.numpy() for k, v in out.items()}
    x = np.stack([zoo.preprocess_input(p, 32) for p in pixels])
    from keras_vit.runtime.backend import to_numpy

    logits = to_numpy(model(x))
    np.testing.assert_allclose(served["logits"], logits, atol=1e-4)
    best = np.argsort(-logits, axis=1)[:, :3]
    assert [[s.decode() for s in row] for row in served["labels"]] == [
        [NAMES[i] for i in row] for row in best]


def test_a_model_without_head_serves_its_embedding():
    """A feature extractor's signature returns its embedding (exported and
    run in tests/export/test_export_follows_the_model.py); class options
    are refused naming them."""
    from keras_vit.export.graph import default_outputs

    model = keras_vit.models.vit(**dict(TINY, include_top=False))
    graph = serving.ImageBytesGraph(model)
    assert graph.outputs == default_outputs(model)
    assert set(graph.describe()["outputs"]) == set(graph.outputs)
    with pytest.raises(ValueError, match=r"labels=\['a'\]"):
        serving.ImageBytesGraph(model, labels=["a"])


def test_saved_model_cli_runs_the_signature(exported, tmp_path):
    """``saved_model_cli run`` (TensorFlow's own tool, a TF1 session) fed a
    .npy of encoded files gets Keras' numbers. (``--input_exprs`` cannot
    carry them: it splits its argument at every ';' byte.)"""
    model, path, _, _ = exported
    files, pixels = _photos()
    batch = np.array(files[1:3], dtype=object)
    np.save(tmp_path / "images.npy", batch, allow_pickle=True)
    outdir = tmp_path / "out"
    # What ``saved_model_cli run --dir PATH --tag_set serve --signature_def
    # serving_default --inputs image_bytes=FILE --outdir OUT`` does, in
    # this process (a second one would import TensorFlow again): the
    # tool's own parsing of --inputs, then its run in a TF1 session of a
    # new graph.
    from tensorflow.python.tools import saved_model_cli

    feed = saved_model_cli.load_inputs_from_input_arg_string(
        f"image_bytes={tmp_path / 'images.npy'}", "", "")
    saved_model_cli.run_saved_model_with_feed_dict(
        path, "serve", "serving_default", feed, str(outdir), False)
    logits = np.load(outdir / "logits.npy")
    x = np.stack([zoo.preprocess_input(p, 32) for p in pixels[1:3]])
    np.testing.assert_allclose(logits, np.asarray(model(x)), atol=1e-4)
    labels = np.load(outdir / "labels.npy", allow_pickle=True)
    assert labels.shape == (2, 3)
    assert {s.decode() for s in labels.ravel()} <= set(NAMES)


def test_the_command_writes_the_bytes_signature(tmp_path, capsys):
    """``keras-vit export --input image_bytes --top-k K --labels FILE``
    writes the signature with the file's names; the option mistakes are
    refused by name and leave nothing behind."""
    from keras_vit.cli import main

    keras_file = str(tmp_path / "tiny.keras")
    model = _model()
    model.save(keras_file)
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n\n",
                                        encoding="utf-8")
    out = str(tmp_path / "served")
    assert main(["export", keras_file, "-f", "saved_model", "-o", out,
                 "--input", "image_bytes", "--top-k", "2", "--labels",
                 str(tmp_path / "names.txt")]) == 0
    assert "| saved_model |" in capsys.readouterr().out
    files, pixels = _photos()
    result = tf.saved_model.load(out).signatures["serving_default"](
        image_bytes=tf.constant(files[:2]))
    x = np.stack([zoo.preprocess_input(p, 32) for p in pixels[:2]])
    best = np.argsort(-np.asarray(model(x)), axis=1)[:, :2]
    assert result["labels"].numpy().tolist() == [
        [NAMES[i].encode() for i in row] for row in best]

    (tmp_path / "three.txt").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "gap.txt").write_text("a\n\nb\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    for extra, message in [
            (["--labels", str(tmp_path / "three.txt")],
             "labels has 3 names but the model has 5 classes"),
            (["--labels", str(tmp_path / "gap.txt")], "line 2 is empty"),
            (["--labels", str(tmp_path / "latin1.txt")], "is not UTF-8"),
            (["--labels", str(tmp_path)], "must be a regular file"),
            (["--labels", "imagenet"], "imagenet2012, imagenet21k"),
            (["--uint8-input"], "--uint8-input and --outputs do not apply")]:
        code = main(["export", keras_file, "-f", "saved_model", "-o",
                     str(tmp_path / "bad"), "--input", "image_bytes",
                     *extra])
        assert code == 2, extra
        assert message in capsys.readouterr().err, extra
    assert not (tmp_path / "bad").exists()


def test_the_command_serves_a_feature_extractors_embedding(tmp_path,
                                                           capsys):
    """``keras-vit export --input image_bytes`` of a feature extractor
    (here CLIP's shape: its head a projection) writes the signature that
    returns its embedding, as ``to_saved_model`` does; ``--top-k``, which
    ranks classes, is refused naming it and why."""
    from keras_vit.cli import main
    from keras_vit.export.graph import default_outputs

    keras_file = str(tmp_path / "tower.keras")
    model = _model(num_classes=6, head_type="projection")
    model.save(keras_file)
    code = main(["export", keras_file, "-f", "saved_model", "-o",
                 str(tmp_path / "bad"), "--input", "image_bytes",
                 "--top-k", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--top-k ranks classes" in err, err
    assert "head_type='projection'" in err, err
    out = str(tmp_path / "served")
    assert main(["export", keras_file, "-f", "saved_model", "-o", out,
                 "--input", "image_bytes"]) == 0
    files, pixels = _photos()
    result = tf.saved_model.load(out).signatures["serving_default"](
        image_bytes=tf.constant(files[:2]))
    name, = default_outputs(model)
    assert set(result) == {name}
    x = np.stack([zoo.preprocess_input(p, 32) for p in pixels[:2]])
    np.testing.assert_allclose(result[name].numpy(), np.asarray(model(x)),
                               atol=1e-4)
