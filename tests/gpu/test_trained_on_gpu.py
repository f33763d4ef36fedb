"""A model trained on a GPU comes back to the CPU whole: the ``.keras``
file that benchmarks/accelerator.py's ``roundtrip`` part wrote on the
accelerator (a small ViT trained with ``model.fit`` on the JAX backend,
kept beside its probe images and the logits the GPU computed for them in
``trained_on_accelerator/``) loads here on every backend with the GPU's
logits, and exports. A later GPU run's files replace these."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit  # noqa: F401  (registers the model classes)

pytestmark = pytest.mark.backends

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "trained_on_accelerator")


def _returned():
    path = os.path.join(FOLDER, "model.keras")
    if not os.path.exists(path):
        pytest.skip("no file returned by a GPU run yet: run "
                    "benchmarks/accelerator.py on a GPU machine")
    with open(os.path.join(FOLDER, "made_on.json"), encoding="utf-8") as f:
        made_on = json.load(f)
    return (keras.saving.load_model(path, compile=False),
            np.load(os.path.join(FOLDER, "inputs.npy")),
            np.load(os.path.join(FOLDER, "logits.npy")), made_on)


def test_a_model_trained_on_a_gpu_loads_here_with_its_logits():
    model, x, want, made_on = _returned()
    assert made_on["device"] != "cpu", made_on
    got = keras.ops.convert_to_numpy(model.predict_on_batch(x))
    # The GPU ran float32 matmuls as TF32 (10-bit mantissa): its logits
    # are ~0.2% of their spread from the CPU's. A wrong weight or layout
    # moves them by the whole spread.
    spread = float(np.ptp(want, axis=1).max())
    assert spread > 0
    assert float(np.abs(got - want).max()) < 0.02 * spread


@pytest.mark.backend_independent(
    "the file is the same on every backend; tests/export/"
    "test_export_backends.py exports from the jax and torch backends")
def test_a_model_trained_on_a_gpu_exports_here(tmp_path):
    from keras_vit import export

    model, x, want, _ = _returned()
    path = tmp_path / "vit.onnx"
    # Verified against the loaded model in onnxruntime before it is kept.
    export.to_onnx(model, path, isolate=False)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path))
    name = session.get_inputs()[0].name
    logits = session.run(None, {name: x})[0]
    spread = float(np.ptp(want, axis=1).max())
    assert float(np.abs(logits - want).max()) < 0.02 * spread
