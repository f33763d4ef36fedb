"""One answer on every path: a model quantized by Keras (``model.quantize``
with each mode of :data:`keras_vit.models.quantization.MODES`) computes
one way.

Every path a quantized model can take is listed in :data:`OUTCOMES` with
what it does, for every mode: it agrees with ``model(x)`` within a bound
stated once (the exporters' in :data:`keras_vit.export.TOLERANCES`, the
in-process paths' here), or it refuses in one line naming the mode and
the reason, before anything is written. Each agreement is measured here,
on the path's own runtime, not read from a report, on a model whose
quantization moves its logits by far more than any bound (int8: 10%;
see :func:`_tiny`), and the answer must be nearer the quantized call
than the float model's.
"""

import os

import numpy as np
import pytest

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.export import common  # noqa: E402
from keras_vit.models.quantization import MODES  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")

#: The in-process paths compute what the call computes, up to float
#: rounding (JAX's kernels block batches differently); a flipped int8
#: rounding is ~100x this. A fraction of max(1, max|logits|), as the
#: exporters' bounds are.
IN_PROCESS = {"max_abs_diff": 1e-5}

REFUSED = "refused"
#: What Keras' modes do to a layer's inputs (int4 is weight-only: float
#: inputs times dequantized weights), in the words a refusal uses.
ROUNDS_INPUTS = {"int8": "round their inputs to int8",
                 "float8": "cast their inputs to float8", "int4": None}
#: path -> mode -> the bound it agrees with ``model(x)`` within (a dict
#: of TOLERANCES' shape) or REFUSED: a weight-only model takes each
#: format's float bound; one whose layers round their inputs goes only to
#: a SavedModel, whose graph flips some roundings.
OUTCOMES = {
    "predict": {mode: IN_PROCESS for mode in MODES},
    "keras_file": {mode: IN_PROCESS for mode in MODES},
    "saved_model": {
        mode: common.TOLERANCES["saved_model" if ROUNDS_INPUTS[mode] is None
                                else "saved_model/keras_quantized"]
        for mode in MODES},
    **{fmt: {mode: REFUSED if ROUNDS_INPUTS[mode] else
             common.TOLERANCES[kind] for mode in MODES}
       for fmt, kind in (("onnx", "onnx"), ("tflite", "tflite/float32"),
                         ("openvino", "openvino"))},
}
EXPORT_NAMES = {"saved_model": "m", "onnx": "m.onnx", "tflite": "m.tflite",
                "openvino": "m.xml"}


def _tiny():
    """ViT of width 32, two blocks, 32 px, with random weights of a
    sensible scale (a zero head would hide every difference) and, as
    trained ViTs have, outlier channels: the norms scale two of the 32
    channels by 20, so that int8's rounding of a layer's inputs (one
    scale per token) matters. A path that kept the int8 weights but
    dropped that rounding would be 8.6% of the logits off, beyond every
    bound here (without the outliers: 0.7%, within the SavedModel's)."""
    model = keras_vit.vit(32, 8, 32, 2, 2, 64, 5)
    rng = np.random.default_rng(0)
    for var in model.weights:
        shape = tuple(var.shape)
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        value = (rng.standard_normal(shape) / np.sqrt(fan_in) if len(shape) > 1
                 else 1 + 0.1 * rng.standard_normal(shape))
        if var.path.endswith("gamma"):
            value[::16] *= 20
        var.assign(value.astype(var.dtype))
    return model


def _images(n=4, seed=1):
    return np.random.default_rng(seed).uniform(
        -1, 1, (n, 32, 32, 3)).astype("float32")


def _scale(want):
    return max(1.0, float(np.max(np.abs(want))))


@pytest.fixture(scope="module")
def quantized():
    """mode -> (quantized model, its call's logits on :func:`_images`, the
    float model's)."""
    x = _images()
    out = {}
    for mode in MODES:
        model = _tiny()
        float_logits = keras.ops.convert_to_numpy(model(x))
        model.quantize(mode)
        want = keras.ops.convert_to_numpy(model(x))
        # The quantization moves the logits beyond every bound of its mode.
        gap = float(np.max(np.abs(want - float_logits))) / _scale(want)
        bounds = [by_mode[mode]["max_abs_diff"] for by_mode in
                  OUTCOMES.values() if by_mode[mode] != REFUSED]
        assert gap > 2 * max(bounds), (mode, gap)
        out[mode] = model, want, float_logits
    return out


def _run(path, model, tmp_path, x):
    """The logits ``path`` gives for ``x``: run on the path's own runtime
    (a SavedModel loaded by TensorFlow)."""
    if path == "predict":
        return model.predict(x, verbose=0)
    if path == "keras_file":
        file = tmp_path / "m.keras"
        model.save(file)
        back = keras.saving.load_model(file)
        return keras.ops.convert_to_numpy(back(x))
    dest = os.fspath(tmp_path / EXPORT_NAMES[path])
    report = export.export(model, dest, format=path)
    assert report["verified"] is True
    module = getattr(export, path)
    return module.open_artifact(dest)(x)["logits"]


def _cases():
    """Every path and mode; on every backend (tests marked `backends`) the
    ones that need no TensorFlow converter process, and the SavedModel of
    int8, whose TensorFlow graph is compared with the backend's own int8
    roundings (measured on all three: within its bound)."""
    cases = []
    for path in OUTCOMES:
        for mode in MODES:
            everywhere = (path in ("predict", "keras_file")
                          or OUTCOMES[path][mode] == REFUSED
                          or (path, mode) == ("saved_model", "int8"))
            cases.append(pytest.param(
                path, mode, id=f"{path}-{mode}",
                marks=[pytest.mark.backends] if everywhere else []))
    return cases


@pytest.mark.backends
def test_the_table_covers_every_mode_and_every_export_format(quantized):
    assert set(EXPORT_NAMES) == set(export.FORMATS)
    assert set(OUTCOMES) == {"predict", "keras_file", *export.FORMATS}
    for path, by_mode in OUTCOMES.items():
        assert set(by_mode) == set(MODES), path
    # What the table assumes of each mode is what the layers do.
    for mode, (model, _, _) in quantized.items():
        roundings = {common.input_rounding(layer)
                     for layer in model._flatten_layers()
                     if getattr(layer, "quantization_mode", None)}
        want = None if ROUNDS_INPUTS[mode] is None else mode
        assert roundings == {want}, mode


@pytest.mark.parametrize("path,mode", _cases())
def test_every_path_agrees_with_the_call_or_refuses_in_one_line(
        quantized, tmp_path, path, mode):
    model, want, float_logits = quantized[mode]
    outcome = OUTCOMES[path][mode]
    x = _images()
    if outcome == REFUSED:
        with pytest.raises(export.ExportError) as caught:
            export.export(model, tmp_path / EXPORT_NAMES[path], format=path)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: ") and f"mode={mode}" in message
        assert ROUNDS_INPUTS[mode] in message   # the reason
        assert list(tmp_path.iterdir()) == []   # nothing was written
        return
    got = np.asarray(_run(path, model, tmp_path, x))
    assert got.shape == want.shape
    diff = float(np.max(np.abs(got - want)))
    assert diff <= outcome["max_abs_diff"] * _scale(want), (path, mode, diff)
    # The quantized model ran, not the float one.
    assert diff < float(np.max(np.abs(got - float_logits))), (path, mode)
    # The quantized model is what ran: the call again gives the same.
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), want)
