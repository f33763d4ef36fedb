"""Exporting a model quantized by Keras (``model.quantize``): a SavedModel
carries it and is verified against the quantized Keras model; TFLite and
ONNX refuse it in one line (the TFLite converter fails on Keras' int8
matmuls, tf2onnx's graph is ~1% off)."""

import pytest

from keras_vit import export
from test_keras_features import build, randomise

pytestmark = pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_saved_model_takes_a_keras_quantized_model_and_verifies_it(
        tmp_path, mode):
    model = randomise(build("vit"))
    model.quantize(mode)
    report = export.to_saved_model(model, tmp_path / "m")
    assert report["verified"] is True
    assert report["top1_agreement"] == 1.0
    assert max(report["rel_rms_error"].values()) < 1e-5


@pytest.mark.parametrize("fmt,ext", [("tflite", ".tflite"), ("onnx", ".onnx")])
def test_tflite_and_onnx_refuse_a_keras_quantized_model(tmp_path, fmt, ext):
    model = randomise(build("bit"))
    model.quantize("int8")
    with pytest.raises(export.ExportError) as caught:
        export.export(model, tmp_path / f"m{ext}")
    message = str(caught.value)
    assert "\n" not in message and f"{fmt}: " in message
    assert "mode=int8" in message and "quantization=" in message
    assert list(tmp_path.iterdir()) == []
