"""The same image shapes, legal and illegal, through every path: Keras'
call, each compiled ``predict`` path and each exported artifact give the
same answers and refuse the same shapes.

Two tiny models (one built for 32x32, one dynamic-size with patch 8) are
exported once per module; every artifact refuses what Keras refuses,
records the rule in its metadata, and its export report says which
refused sizes it was tried on.
"""

import os

import numpy as np
import pytest

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.export import formats  # noqa: E402
from keras_vit.layers.image_sizes import ImageSizes  # noqa: E402

from image_shapes import CASES, TINY  # noqa: E402
from image_shapes import images as _images  # noqa: E402

try:
    FORMATS = ("saved_model", "onnx", "tflite", "openvino")
except ImportError:
    FORMATS = ("saved_model", "onnx", "tflite")
# A dynamic-size model's TFLite file is a fixed-size copy (the converter
# needs static shapes): its own rule is that size, checked below too.


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    fixed = keras_vit.vit(**TINY)
    dynamic = keras_vit.vit(**TINY, dynamic_image_size=True)
    return {"fixed": fixed, "dynamic": dynamic}


@pytest.fixture(scope="module")
def artifacts(models, tmp_path_factory):
    """Each format of each model, exported (and verified) once."""
    folder = tmp_path_factory.mktemp("image_sizes")
    out = {}
    for kind, model in models.items():
        for fmt in FORMATS:
            suffix = {"saved_model": "", "onnx": ".onnx", "tflite": ".tflite",
                      "openvino": ".xml"}[fmt]
            path = os.fspath(folder / f"{kind}{suffix or '_sm'}")
            report = export.export(model, path, format=fmt,
                                   batch_sizes=(2,))
            run = formats.format_module(fmt).open_artifact(path)
            out[kind, fmt] = (path, report, run)
    return out


def _refusal(fn):
    try:
        return None, fn()
    except Exception as e:  # noqa: BLE001 - each runtime raises its own
        return e, None


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind, hw, ok", CASES)
def test_every_artifact_agrees_with_keras(models, artifacts, fmt, kind, hw,
                                          ok):
    path, report, run = artifacts[kind, fmt]
    model = models[kind]
    recorded = export.read_image_sizes(path)
    sizes = model.image_sizes()
    if kind == "dynamic" and fmt == "tflite":
        # The fixed-size copy the TFLite converter needs.
        sizes = ImageSizes(size=(32, 32), channels=3)
        ok = hw == (32, 32)
    assert recorded == sizes
    assert report["options"]["image_sizes"]["image_size"] == (
        sizes.to_json()["image_size"])
    x = _images(hw)
    error, got = _refusal(lambda: run(x))
    if ok:
        assert error is None, error
        want = keras.ops.convert_to_numpy(model(x))
        np.testing.assert_allclose(got["logits"], want, atol=2e-4)
        return
    # Refused by the runtime itself: the SavedModel's assertion, the shape
    # arithmetic of a dynamic-size graph (which tf2onnx and OpenVINO keep),
    # a declared fixed size (onnxruntime, OpenVINO, the TFLite runner).
    assert error is not None, (fmt, kind, hw)


def test_every_artifact_refuses_the_sizes_verification_tries(artifacts):
    """verify runs each artifact on sizes the model refuses and reports
    what it did; every artifact here refuses them all."""
    for (kind, fmt), (path, report, _) in artifacts.items():
        check = report["verification"]["refused_image_sizes"]
        assert check["rule"] == export.read_image_sizes(path).describe()
        assert len(check["refused"]) >= 4, (kind, fmt)
        assert check["taken_though_keras_refuses"] == [], (kind, fmt)


def test_the_report_names_each_refused_size_an_artifact_takes(models):
    """A runtime that checks nothing (here: one that answers every
    input) is reported size by size."""
    from keras_vit.export import verify
    from keras_vit.export.graph import ServingGraph

    graph = ServingGraph(models["dynamic"], outputs=("logits",))
    check = verify.refused_sizes(graph, lambda images: {"logits": 0})
    sizes = models["dynamic"].image_sizes()
    assert check["refused"] == []
    assert check["taken_though_keras_refuses"] == [
        f"{h}x{w}" for h, w in sizes.refused_examples()]
    assert check["rule"] == sizes.describe()


def test_litert_itself_takes_a_size_the_tflite_file_was_not_made_for(
        artifacts):
    """Why the package's TFLite runner checks the shape: LiteRT's own
    signature runner resizes the input and returns numbers for 33x32."""
    from ai_edge_litert.interpreter import Interpreter

    path = artifacts["fixed", "tflite"][0]
    runner = Interpreter(model_path=path).get_signature_runner(
        "serving_default")
    (name,) = runner.get_input_details()
    out = runner(**{name: _images((33, 32))})
    assert out["logits"].shape == (2, 3)
    assert export.read_image_sizes(path).refusal((2, 33, 32, 3))
