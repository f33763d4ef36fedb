"""keras_vit.models.lora: Keras' own LoRA on the chosen projections,
adapters saved and loaded alone, merged for export."""

import numpy as np
import pytest

import keras
import keras_vit
from keras_vit.models import lora

pytestmark = pytest.mark.backends


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras_vit.models.vit(32, 8, 32, 2, 2, 64, 5)
    rng = np.random.default_rng(seed)
    for w in model.weights:   # a non-zero head, so every change shows
        w.assign((0.2 * rng.standard_normal(w.shape)).astype(w.dtype))
    return model


def _x(n=3):
    return np.random.default_rng(1).uniform(-1, 1, (n, 32, 32, 3)).astype(
        "float32")


def _run(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def _train_b(model, seed=2):
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if getattr(layer, "lora_enabled", False):
            b = layer.lora_kernel_b
            b.assign((0.1 * rng.standard_normal(b.shape)).astype("float32"))


@pytest.mark.parametrize("targets,names", [
    ("attention", {"query", "key", "value", "out"}),
    ("mlp", {"dense_0", "dense_1"}),
    (["query", "value", "head"], {"query", "value", "head"})])
def test_targets_pick_their_layers_and_freeze_the_rest(targets, names):
    model = _model()
    want = _run(model, _x())
    report = lora.enable_lora(model, rank=2, targets=targets)
    on = [layer for layer in model._flatten_layers()
          if getattr(layer, "lora_enabled", False)]
    assert {layer.name for layer in on} == names
    assert report["layers"] == len(on) == 2 * len(names - {"head"}) + (
        "head" in names)
    adapters = sum(int(np.prod(w.shape)) for layer in on
                   for w in (layer.lora_kernel_a, layer.lora_kernel_b))
    head = 0 if "head" in names else 32 * 5 + 5
    assert report["trainable"] == adapters + head
    assert report["total"] == sum(int(np.prod(w.shape))
                                  for w in model.weights)
    # B starts at zero: the model computes what it did.
    np.testing.assert_allclose(_run(model, _x()), want, atol=1e-6)


def test_bad_targets_are_refused_naming_them():
    model = _model()
    with pytest.raises(ValueError, match="'qurey'"):
        lora.enable_lora(model, targets=["qurey"])
    with pytest.raises(ValueError, match="targets='everything'"):
        lora.enable_lora(model, targets="everything")
    with pytest.raises(ValueError, match="rank"):
        lora.enable_lora(model, rank=0)


def test_adapters_save_and_load_alone(tmp_path):
    model = _model()
    lora.enable_lora(model, rank=2, targets="all")
    _train_b(model)
    want = _run(model, _x())
    path = lora.save_adapters(model, tmp_path / "adapters.npz")
    other = _model()          # the same base weights, no adapters yet
    assert np.abs(_run(other, _x()) - want).max() > 1e-3
    report = lora.load_adapters(other, path)
    assert report["layers"] == 12
    np.testing.assert_allclose(_run(other, _x()), want, atol=1e-5)
    with pytest.raises(ValueError, match="does not have"):
        lora.load_adapters(keras_vit.models.vit(32, 8, 32, 1, 2, 64, 5),
                           path)


def test_merge_equals_the_lora_model():
    model = _model()
    lora.enable_lora(model, rank=4, targets="all")
    _train_b(model)
    merged = lora.merge(model)
    assert not any("lora" in w.path for w in merged.weights)
    np.testing.assert_allclose(_run(merged, _x()), _run(model, _x()),
                               atol=1e-5)
    quantized = _model()
    quantized.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        lora.merge(quantized)


@pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")
def test_official_layout_asks_for_the_plain_model():
    from keras_vit.zoo import checkpoints, convert

    model = _model()
    lora.enable_lora(model, rank=2, targets="mlp")
    with pytest.raises(checkpoints.CheckpointError, match="lora.merge"):
        convert.export_arrays(model)
    assert "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel" in (
        convert.export_arrays(lora.merge(model)))
    quantized = _model()
    quantized.quantize("int8")
    with pytest.raises(checkpoints.CheckpointError, match="quantized by Keras"):
        convert.export_arrays(quantized)
