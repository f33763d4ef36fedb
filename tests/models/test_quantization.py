"""``model.quantize`` decides before it changes anything: a refusal leaves
every layer as it was, and a model with LoRA adapters is refused (the
rule of ``lora.merge``, which refuses a quantized model): merge the
adapters first, then quantize."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import lora
from keras_vit.models.quantization import MODES

TINY = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=2,
            num_heads=2, mlp_dim=32, num_classes=3)


def _modes(model):
    return {layer.path: getattr(layer, "quantization_mode", None)
            for layer in model._flatten_layers(include_self=False)}


@pytest.mark.backends
@pytest.mark.parametrize("mode", MODES)
def test_a_refused_quantize_leaves_every_layer_as_it_was(mode):
    model = keras_vit.vit(**TINY)
    # One layer quantized already: quantizing the model again must be
    # refused before any other layer changes.
    head = model.get_layer("head")
    head.quantize(mode)
    before = _modes(model)
    assert list(before.values()).count(mode) == 1
    with pytest.raises(ValueError, match="head"):
        model.quantize(mode)
    assert _modes(model) == before


@pytest.mark.backends
def test_quantizing_a_model_with_lora_adapters_is_refused():
    model = keras_vit.vit(**TINY)
    lora.enable_lora(model, rank=2)
    before = _modes(model)
    for mode in MODES:
        with pytest.raises(ValueError, match="LoRA"):
            model.quantize(mode)
        assert _modes(model) == before
    # Merged, the same model quantizes.
    merged = lora.merge(model)
    merged.quantize("int8")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
    assert keras.ops.convert_to_numpy(merged(x)).shape == (2, 3)


@pytest.mark.backends
def test_an_explicit_compiled_path_stays_within_the_compiled_bound():
    """A compiled path chosen explicitly (``predict_path="xla"``, or
    ``"graph"`` on TensorFlow) for a model whose int8 layers round their
    inputs may flip some roundings, as the SavedModel of it does: it
    agrees with the call within the bound stated for such compiled graphs
    (keras_vit.export TOLERANCES["saved_model/keras_quantized"]), and is
    nearer the quantized call than the float model is."""
    from keras_vit.export.common import TOLERANCES

    bound = TOLERANCES["saved_model/keras_quantized"]["max_abs_diff"]
    model = keras_vit.vit(**dict(TINY, num_layers=6))
    rng = np.random.default_rng(1)
    for v in model.weights:
        v.assign(rng.normal(0, 0.05, tuple(v.shape)).astype("float32"))
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    float_logits = keras.ops.convert_to_numpy(model(x))
    model.quantize("int8")
    want = keras.ops.convert_to_numpy(model(x))
    scale = max(1.0, float(np.max(np.abs(want))))
    paths = ["xla"] + (["graph"] if keras.backend.backend() == "tensorflow"
                       else [])
    for path in paths:
        model.predict_path = path
        got = model.predict(x, verbose=0)
        diff = float(np.max(np.abs(got - want)))
        assert diff <= bound * scale, (path, diff)
        assert diff < float(np.max(np.abs(float_logits - want))), path


@pytest.mark.backends
def test_predict_of_a_quantized_model_computes_what_its_call_does():
    """int8 layers round their inputs: a compiled graph's last-bit float
    differences flip some roundings and add up over the blocks, so
    ``predict`` of a quantized model runs the model's own call."""
    model = keras_vit.vit(**dict(TINY, num_layers=6))
    rng = np.random.default_rng(1)
    for v in model.weights:
        v.assign(rng.normal(0, 0.05, tuple(v.shape)).astype("float32"))
    model.quantize("int8")
    assert model.resolved_predict_path() == "eager"
    x = rng.uniform(-1, 1, (40, 32, 32, 3)).astype("float32")
    want = keras.ops.convert_to_numpy(model(x))
    # Equal up to float rounding (JAX's kernels block a batch of 32 and
    # one of 40 differently); a flipped int8 rounding is ~100x this.
    scale = float(np.ptp(want))
    np.testing.assert_allclose(model.predict(x, verbose=0), want, rtol=0,
                               atol=1e-5 * scale)
