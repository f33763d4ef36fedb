"""Exporting what Keras' model features made of a model.

A model quantized by Keras (``model.quantize``): a SavedModel carries it
and is verified against the quantized Keras model; TFLite and ONNX refuse
it in one line (the TFLite converter fails on Keras' int8 matmuls,
tf2onnx's graph is ~1% off). A LoRA model: its merged copy exports and
computes what the unmerged Keras model does."""

import sys
from pathlib import Path

import numpy as np
import pytest

import keras
from keras_vit import export
from keras_vit.models import lora

# The tiny models of tests/models/test_keras_features.py, the suite whose
# features these exports carry. pytest puts tests/models/ on sys.path only
# once it collects a file there (after tests/export/, or never when this
# file runs alone), so it is put there first; pytest then finds the module
# already imported from the same file.
_MODELS = str(Path(__file__).resolve().parents[1] / "models")
if _MODELS not in sys.path:
    sys.path.insert(0, _MODELS)
from test_keras_features import build, randomise  # noqa: E402

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


def test_merged_lora_export_equals_the_unmerged_keras_model(tmp_path):
    model = randomise(build("vit"))
    lora.enable_lora(model, rank=4, targets=["query", "value", "dense_0"])
    rng = np.random.default_rng(2)
    for layer in model._flatten_layers():
        if getattr(layer, "lora_enabled", False):
            b = layer.lora_kernel_b
            b.assign((0.1 * rng.standard_normal(b.shape)).astype("float32"))
    x = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype(
        "float32")
    want = keras.ops.convert_to_numpy(model(x, training=False))
    export.to_saved_model(lora.merge(model), tmp_path / "merged")
    artifact = export.saved_model.open_artifact(str(tmp_path / "merged"))
    np.testing.assert_allclose(artifact(x)["logits"], want, atol=1e-5)
