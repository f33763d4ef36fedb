"""The export paths ask the model, never assume: for every input
normalisation a model can carry (the official [-1, 1], ImageNet's and
CLIP's mean and std, a custom one, pixels normalised inside), the
``image_bytes`` serving signature equals the predict path of the command
line, int8 calibration takes the user's data in every form (arrays of
pixels or of model inputs, a folder, a ``tf.data`` dataset) and is
verified on it, and a model without a classification head exports its
embedding by default.

Conversions are the slow part: each artifact is made once per module and
the models are the smallest that still have every piece.
"""

import os

import numpy as np
import pytest

import tensorflow as tf

import keras

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402
from keras_vit.data.normalization import (  # noqa: E402
    model_input, of_model, takes_raw_pixels)
from keras_vit.export import (  # noqa: E402
    ExportError, samples, serving, to_onnx, to_saved_model, to_tflite)
from keras_vit.export.graph import ServingGraph  # noqa: E402

TINY = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32)
# Every normalisation a model can carry, by the arguments that build it.
NORMALIZATIONS = {
    "official": {},
    "imagenet": {"input_normalization": "imagenet"},
    "clip": {"input_normalization": "clip"},
    "mean0_std1": {"input_normalization": {"mean": [0, 0, 0],
                                           "std": [1, 1, 1]}},
    "pixels_inside": {"include_preprocessing": True},
}


def _model(name, num_classes=5, seed=0):
    """A tiny ViT with random non-trivial weights (its head is not zero),
    the same whichever tests ran before in the process (the int8 checks
    compare top-1 agreement on 8 images: another draw is another test)."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.models.vit(**TINY, num_classes=num_classes,
                                 **NORMALIZATIONS[name])
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _pixels(n, seed=3):
    """``n`` uint8 crops of the sample photos at the model's size."""
    return samples.photo_images((32, 32, 3), n, seed=seed)[0]


def _predict_path(model, pixels):
    """What ``keras-vit predict`` feeds the model for decoded pixels."""
    x = np.stack([zoo.preprocess_input(
        p, 32, scale=not takes_raw_pixels(model),
        input_normalization=of_model(model)) for p in pixels])
    return np.asarray(model(x, training=False))


def _folder(root, pixels):
    """``pixels`` as PNG files (lossless) in two class sub-folders, named
    so that their sorted order is the array's."""
    for i, image in enumerate(pixels):
        folder = root / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.png").write_bytes(serving.encode(image, "PNG"))
    return str(root)


def _sorted_as_folder(pixels):
    """The order a folder made by :func:`_folder` is read in."""
    order = sorted(range(len(pixels)), key=lambda i: (i % 2, i))
    return pixels[order]


# ------------------------------------------------------- image_bytes


def _encoded():
    """Encoded photo crops of other sizes than the model's, and the
    pixels the package's decoder reads from them."""
    files, pixels = [], []
    for i, (fmt, shape) in enumerate([("JPEG", (45, 61)), ("PNG", (32, 32)),
                                      ("PNG", (20, 50))]):
        crop = samples.photo_images(shape + (3,), 1, seed=20 + i)[0][0]
        files.append(serving.encode(crop, fmt))
        pixels.append(serving.decode(files[-1]))
    return serving.as_batch(files), pixels


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_the_bytes_signature_and_its_check_are_the_predict_path(name):
    """The signature's computation (the ops a SavedModel stores) and the
    reference its verification compares it with both give the logits of
    the command line's predict path, whatever the model's normalisation;
    the report states the normalisation applied."""
    model = _model(name)
    graph = serving.ImageBytesGraph(model, top_k=2)
    files, pixels = _encoded()
    want = _predict_path(model, pixels)
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    # Run eagerly: the ops the SavedModel stores (traced once in the test
    # below), without tracing them for each model.
    served = graph.serve(tf.constant(files))["logits"].numpy()
    np.testing.assert_allclose(served, want, atol=tol, err_msg=name)
    np.testing.assert_allclose(graph.reference(files)["logits"], want,
                               atol=tol, err_msg=name)
    text = graph.describe()["input"]["preprocessing"]
    if takes_raw_pixels(model):
        assert "std" not in text, text
    else:
        assert str(list(of_model(model).std)) in text, text


def test_an_imagenet_models_bytes_savedmodel_passes_its_check(tmp_path):
    """The SavedModel of a DeiT-like model (ImageNet's mean and std) is
    written, verified, and serves the predict path's logits."""
    model = _model("imagenet")
    path = str(tmp_path / "served")
    report = to_saved_model(model, path, input="image_bytes", top_k=2,
                            batch_sizes=(3,))
    assert report["verified"]
    files, pixels = _encoded()
    loaded = tf.saved_model.load(path)
    got = loaded.signatures["serving_default"](
        image_bytes=tf.constant(files))["logits"].numpy()
    np.testing.assert_allclose(got, _predict_path(model, pixels), atol=1e-4)


# ------------------------------------------------------- calibration


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_calibration_data_in_every_form_is_the_models_input(name, tmp_path):
    """The same photos given as uint8 pixels, float pixels, the model's
    own inputs, a folder of files and a ``tf.data`` dataset of (images,
    labels) batches calibrate on the same model inputs: those the model's
    own normalisation makes of the pixels."""
    model = _model(name)
    graph = ServingGraph(model)
    pixels = _pixels(6)
    floats = pixels.astype("float32")
    labels = np.arange(6) % 2
    forms = {
        "uint8 pixels": (pixels, pixels),
        "float pixels": (floats, pixels),
        "model inputs": (np.asarray(model_input(model, floats)), pixels),
        "folder": (_folder(tmp_path / "photos", pixels),
                   _sorted_as_folder(pixels)),
        "dataset": (tf.data.Dataset.from_tensor_slices(
            (floats, labels)).batch(4), pixels),
    }
    for form, (data, order) in forms.items():
        images, note = samples.calibration_images(graph, data, 10)
        want = np.asarray(model_input(model, order.astype("float32")))
        np.testing.assert_allclose(images, want, atol=1e-5,
                                   err_msg=f"{name}: {form}")
        assert "6 images" in note, (form, note)


def test_uint8_artifacts_calibrate_on_pixels(tmp_path):
    """An artifact that takes uint8 pixels calibrates on pixels, whatever
    normalisation the model runs inside."""
    model = _model("imagenet")
    graph = ServingGraph(model, uint8_input=True)
    pixels = _pixels(4)
    for data in (pixels, pixels.astype("float32"),
                 _folder(tmp_path / "p", pixels)):
        images, _ = samples.calibration_images(graph, data, 10)
        assert images.dtype == np.uint8
        assert sorted(map(bytes, images)) == sorted(map(bytes, pixels))


@pytest.mark.parametrize("data, words", [
    (np.full((2, 32, 32, 3), 300.0, "float32"), "spans [300, 300]"),
    (np.full((2, 32, 32, 3), -40.0, "float32"), "spans [-40, -40]"),
    (np.zeros((2, 16, 16, 3), "uint8"), "shape (32, 32, 3)"),
    (np.full((2, 32, 32, 3), np.nan, "float32"), "not finite"),
    ("no/such/folder", "no/such/folder"),
])
def test_calibration_data_outside_every_reading_is_refused(data, words):
    """Data that is neither [0, 255] pixels nor the model's inputs stops
    the export in one line naming representative_data, what was measured
    and the ranges it takes."""
    graph = ServingGraph(_model("imagenet"))
    with pytest.raises(ValueError) as info:
        samples.calibration_images(graph, data, 10)
    message = str(info.value)
    assert "\n" not in message and "representative_data" in message
    assert words in message, message
    assert "127.5" not in message, message


def test_an_empty_or_damaged_folder_is_refused_naming_it(tmp_path):
    graph = ServingGraph(_model("imagenet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no image files"):
        samples.calibration_images(graph, str(tmp_path / "empty"), 10)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="x.png"):
        samples.calibration_images(graph, str(tmp_path / "bad"), 10)


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    """16 photo crops as files: 8 to calibrate on, 8 held out."""
    pixels = _pixels(16, seed=5)
    return _folder(tmp_path_factory.mktemp("calibration"), pixels), pixels


@pytest.mark.parametrize("exporter, suffix", [(to_onnx, ".onnx"),
                                              (to_tflite, ".tflite")])
def test_int8_calibrates_and_verifies_on_the_users_data(
        exporter, suffix, photo_folder, tmp_path):
    """Full int8 of an ImageNet-normalised model calibrated on a folder
    of the user's images is checked on the images of that folder beyond
    the calibration ones, and its outputs follow Keras on them."""
    folder, pixels = photo_folder
    model = _model("imagenet")
    report = exporter(model, str(tmp_path / f"vit{suffix}"),
                      quantization="int8", representative_data=folder,
                      representative_samples=8, agreement_samples=8)
    assert folder in report["options"]["representative_data"]
    assert "8 images" in report["options"]["representative_data"]
    checked = report["verification"]["data"]
    assert folder in checked and "8 images" in checked, checked
    assert "photo" not in checked, checked
    assert report["rel_rms_error"]["logits"] < 0.5


def test_a_refused_int8_names_the_error_and_a_true_remedy(photo_folder,
                                                          tmp_path):
    """An int8 file calibrated on the user's data that misses the bar is
    refused with the measured error, and the remedy does not tell the
    user to pass the calibration data they passed."""
    folder, _ = photo_folder
    with pytest.raises(ExportError) as info:
        to_onnx(_model("clip"), str(tmp_path / "vit.onnx"),
                quantization="int8", representative_data=folder,
                representative_samples=8, agreement_samples=8,
                tolerance={"rel_rms_error": 1e-9})
    message = str(info.value)
    assert "relative RMS error" in message, message
    assert "pass representative_data" not in message, message
    assert "dynamic_int8" in message, message
    assert not os.path.exists(tmp_path / "vit.onnx")


# ------------------------------------------------------- headless


def test_a_feature_extractor_exports_its_embedding_by_default(tmp_path):
    """``num_classes=0``: the default outputs are the embedding (what
    ``model.predict`` returns), named ``pre_logits``."""
    import onnxruntime

    model = _model("imagenet", num_classes=0)
    path = str(tmp_path / "features.onnx")
    report = to_onnx(model, path)
    assert list(report["outputs"]) == ["pre_logits"]
    x = np.asarray(model_input(model, _pixels(3).astype("float32")))
    session = onnxruntime.InferenceSession(path)
    got = dict(zip([o.name for o in session.get_outputs()],
                   session.run(None, {session.get_inputs()[0].name: x})))
    np.testing.assert_allclose(got["pre_logits"],
                               np.asarray(model(x, training=False)),
                               atol=1e-4)
    with pytest.raises(ValueError, match=r"outputs=\('pre_logits',\)"):
        ServingGraph(model, outputs=("logits", "probabilities"))


def test_a_feature_extractor_serves_its_embedding_from_image_bytes(
        tmp_path):
    """``num_classes=0`` with ``input="image_bytes"``: the SavedModel is
    written, verified, and its one output is the embedding the predict
    path gives, named ``pre_logits`` (no labels, scores or classes); the
    same artifact names a damaged element of a batch by its index."""
    model = _model("clip", num_classes=0)
    path = str(tmp_path / "features")
    report = to_saved_model(model, path, input="image_bytes",
                            batch_sizes=(3,))
    assert report["verified"] and list(report["outputs"]) == ["pre_logits"]
    assert not os.path.exists(os.path.join(path, "assets", "labels.txt"))
    files, pixels = _encoded()
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["serving_default"]
    got = signature(image_bytes=tf.constant(files))
    assert sorted(got) == ["pre_logits"]
    np.testing.assert_allclose(got["pre_logits"].numpy(),
                               _predict_path(model, pixels), atol=1e-4)
    damaged = bytearray(files[1])  # a PNG: its chunk CRC fails
    damaged[len(damaged) // 2:len(damaged) // 2 + 16] = bytes(16)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"image_bytes\[1\] \(\d+ bytes\) is a damaged "
                             "PNG"):
        signature(image_bytes=tf.constant([files[0], bytes(damaged)]))
    with pytest.raises(ValueError, match="top_k=2"):
        serving.ImageBytesGraph(model, top_k=2)


def test_the_command_names_a_feature_extractors_outputs_its_way(
        tmp_path, capsys):
    """On the command line a headless model exports its embedding without
    options, and asking it for logits is refused in the command's own
    syntax."""
    from keras_vit.cli import main

    keras_file = str(tmp_path / "features.keras")
    _model("official", num_classes=0).save(keras_file)
    code = main(["export", keras_file, "-f", "onnx", "-o",
                 str(tmp_path / "bad.onnx"), "--outputs", "logits"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--outputs pre_logits" in err, err
    assert "outputs=(" not in err, err
    assert not os.path.exists(tmp_path / "bad.onnx")
