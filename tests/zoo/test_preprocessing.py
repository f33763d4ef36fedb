"""zoo.preprocess_input / preprocessing_layer / decode_predictions: the
official evaluation transform and top-K names, keras.applications-style."""

import numpy as np
import pytest

import tensorflow as tf
from testkit import bad_calls_test
from keras_vit import zoo


def test_preprocess_input_is_the_official_eval_transform():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (50, 70, 3)).astype("uint8")
    expected = tf.image.resize(image[None].astype("float32"), (32, 32),
                               method="bilinear", antialias=False)
    expected = expected.numpy()[0] / 127.5 - 1.0
    got = zoo.preprocess_input(image, 32)
    assert got.dtype == np.float32 and got.shape == (32, 32, 3)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    batch = zoo.preprocess_input(np.stack([image, image]), (32, 32))
    np.testing.assert_allclose(batch[1], expected, atol=1e-6)
    raw = zoo.preprocess_input(image, 32, scale=False)
    np.testing.assert_allclose(raw / 127.5 - 1.0, expected, atol=1e-5)
    layer = zoo.preprocessing_layer(32)
    np.testing.assert_allclose(np.asarray(layer(image[None].astype("float32")))[0],
                               expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"image_size=0"):
        zoo.preprocess_input(image, 0)
    with pytest.raises(ValueError, match=r"\(50, 70\)"):
        zoo.preprocess_input(image[..., 0], 32)


def test_decode_predictions():
    preds = np.zeros((2, 1000), "float32")
    preds[0, [207, 1, 5]] = [3.0, 2.0, 1.0]
    preds[1, 999] = 1.0
    top = zoo.decode_predictions(preds, top=3)
    assert [r[:2] for r in top[0]] == [("n02099601", "golden retriever"),
                                       ("n01443537", "goldfish, Carassius auratus"),
                                       ("n01496331", "electric ray, crampfish, numbfish, torpedo")]
    assert top[1][0][1].startswith("toilet tissue")
    # Scores are probabilities, as in keras.applications: the softmax of
    # logits ...
    e = np.exp(preds[0].astype("float64"))
    assert [r[2] for r in top[0]] == pytest.approx(
        list(e[[207, 1, 5]] / e.sum()), rel=1e-9)
    # ... and probabilities as they are (a softmax head), never twice;
    # from_logits=True / False says which when it is known.
    everything = zoo.decode_predictions(preds, top=1000)[0]
    assert sum(r[2] for r in everything) == pytest.approx(1.0)
    z = np.exp(preds - preds.max(axis=1, keepdims=True))
    again = zoo.decode_predictions((z / z.sum(axis=1, keepdims=True)), top=3)
    assert [r[:2] for r in again[0]] == [r[:2] for r in top[0]]
    assert [r[2] for r in again[0]] == pytest.approx(
        [r[2] for r in top[0]], rel=1e-6)
    forced = zoo.decode_predictions(np.array([[0.25, 0.75]]),
                                    labels=["a", "b"], from_logits=True)
    assert forced[0][0][2] == pytest.approx(1 / (1 + np.exp(-0.5)))
    with pytest.raises(ValueError, match="from_logits=False.*-1.0"):
        zoo.decode_predictions(np.array([[-1.0, 2.0]]), labels=["a", "b"],
                               from_logits=False)
    named = zoo.decode_predictions(np.array([[0.1, 0.7, 0.2]]), top=2,
                                   labels=["cat", "dog", "fox"])
    assert named == [[(None, "dog", pytest.approx(0.7)),
                      (None, "fox", pytest.approx(0.2))]]
    model = zoo.load("ViT-Ti/16", weights=None, image_size=32, num_classes=3)
    model.zoo_labels = ["a", "b", "c"]
    assert zoo.decode_predictions(np.array([[0.0, 0.0, 1.0]]), top=1,
                                  labels=model)[0][0][1] == "c"
    with pytest.raises(ValueError, match="3 names but preds have 4"):
        zoo.decode_predictions(np.zeros((1, 4)), labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="no label list ships for 4"):
        zoo.decode_predictions(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="top=0"):
        zoo.decode_predictions(preds, top=0)


def test_odd_inputs_to_preprocessing_and_labels():
    from keras_vit import zoo

    with pytest.raises(ValueError, match=r"height and width >= 1; received "
                                         r"images of shape \(0, 8, 3\)"):
        zoo.preprocess_input(np.zeros((0, 8, 3)), 16)
    with pytest.raises(ValueError, match=r"labels has 2 names but preds "
                                         r"have 10 classes; received "
                                         r"labels=\['a', 'b'\]"):
        zoo.decode_predictions(np.zeros((1, 10)), labels=["a", "b"])


# Bad arguments to preprocess_input and decode_predictions, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("preprocess_input image_size", lambda: zoo.preprocess_input(
        np.zeros((8, 8, 3)), 0), "image_size", "0", None),
    ("decode_predictions top", lambda: zoo.decode_predictions(
        np.zeros((1, 10)), top=0), "top", "0", None),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
