"""Keras' quantize and LoRA on models trained on scikit-learn's digits.

int8: one small ViT is trained (20 s on 2 cores); ``model.quantize("int8")``
must keep its top-1 predictions, and its output error must stay within
twice that of keras-hub's ViT holding the same weights and quantized by
the same Keras call.

LoRA: a ViT trained at 32 px is fine-tuned at 48 px (the paper's protocol:
position table resized), once in full and once with rank-8 adapters on the
queries and values (<= 5% of the weights train); LoRA must come within a
point of full fine-tuning (benchmarks/keras_features.py prints the
figures at a larger size).
"""

import gc

import numpy as np
import pytest

import keras
import keras_vit
from keras_vit.cli.demo import load_digits_images
from keras_vit.models import lora

pytestmark = pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")


def _copy(model):
    clone = model.__class__.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    return clone


@pytest.fixture(scope="module")
def digits_model():
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load_digits_images(32)
    # gelu="exact": the GELU keras-hub's ViT computes, so that both
    # models hold the same function.
    model = keras_vit.models.vit(32, 8, 64, 2, 4, 128, 10, gelu="exact")
    model.compile(keras.optimizers.Adam(2e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=64, epochs=10, verbose=0)
    return model, x_test, y_test


def test_int8_keeps_the_top1_of_a_trained_model(digits_model):
    model, x, y = digits_model
    logits = model.predict(x, verbose=0)
    assert np.mean(np.argmax(logits, -1) == y) > 0.85   # it did learn
    quantized = _copy(model)
    quantized.quantize("int8")
    q_logits = quantized.predict(x, verbose=0)
    agreement = np.mean(np.argmax(q_logits, -1) == np.argmax(logits, -1))
    assert agreement >= 0.99, agreement
    assert np.max(np.abs(q_logits - logits)) > 0   # it did quantize


def test_int8_error_within_twice_keras_hub_on_the_same_weights(
        digits_model):
    from keras_vit import zoo

    model, x, _ = digits_model
    x = x[:64]
    hub = zoo.to_keras_hub(model)
    want = keras.ops.convert_to_numpy(model(x, training=False))
    hub_want = keras.ops.convert_to_numpy(hub(x, training=False))
    np.testing.assert_allclose(hub_want, want, atol=1e-4)
    ours = _copy(model)
    ours.quantize("int8")
    # keras-hub's classifier also holds its (unbuilt) preprocessor: its
    # backbone and head are what compute the logits. Keras runs gc.collect()
    # after each float kernel it drops (14 here), each a pass over every
    # object of this test process (~0.3 s apiece, more late in a suite
    # run); the objects made before are frozen out of those passes, as the
    # package's own quantize does.
    gc.freeze()
    try:
        hub.backbone.quantize("int8")
        hub.output_dense.quantize("int8")
    finally:
        gc.unfreeze()
    quantized = [layer for layer in hub._flatten_layers()
                 if getattr(layer, "quantization_mode", None)]
    # Its attention projections too, as ours.
    assert {"query", "key", "value", "attention_output"} <= {
        layer.name for layer in quantized}
    scale = np.max(np.abs(want))
    err = np.max(np.abs(keras.ops.convert_to_numpy(
        ours(x, training=False)) - want)) / scale
    hub_err = np.max(np.abs(keras.ops.convert_to_numpy(
        hub(x, training=False)) - hub_want)) / scale
    assert 0 < err <= 2 * hub_err, (err, hub_err)


def _compiled(model, learning_rate):
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def test_lora_fine_tuning_within_a_point_of_full(tmp_path):
    from keras_vit import zoo

    keras.utils.set_random_seed(0)
    x32, y32, _, _ = load_digits_images(32)
    x48, y48, x_test, y_test = load_digits_images(48)

    def build(size):
        return keras_vit.models.vit(size, 8, 192, 2, 3, 384, 10)

    # Short schedules (6 epochs at 32, 3 at 48): the comparison needs a
    # trained base and two fine-tunes of one budget, not converged ones;
    # the bound below was measured on these.
    base = _compiled(build(32), 2e-3)
    base.fit(x32, y32, batch_size=64, epochs=6, verbose=0)
    zoo.save_npz(base, tmp_path / "base.npz")

    def at_48():
        model = build(48)
        zoo.load_weights(model, tmp_path / "base.npz")   # table resized
        return model

    def accuracy(model):
        logits = model.predict(x_test, verbose=0)
        return float(np.mean(np.argmax(logits, -1) == y_test))

    start = accuracy(at_48())
    full = _compiled(at_48(), 1e-3)
    full.fit(x48, y48, batch_size=64, epochs=3, verbose=0)
    adapted = at_48()
    report = lora.enable_lora(adapted, rank=8, targets=["query", "value"],
                              train=["head", "position_embedding"])
    assert report["fraction"] <= 0.05, report
    _compiled(adapted, 1e-2).fit(x48, y48, batch_size=64, epochs=3,
                                 verbose=0)
    full_acc, lora_acc = accuracy(full), accuracy(adapted)
    assert lora_acc > start + 0.2, (start, lora_acc)   # it adapted
    # Close to full fine-tuning with 4.5% of the weights. In this 3-epoch
    # run the gap moves with the seed and with float32 rounding: over seeds
    # 0-2 (2-core AVX-512 EPYC), LoRA ended 7.1 to 10.0 points above full
    # (n = 450; 5 epochs after 10 at 32 ended 4.7 below to 8.0 above), so
    # the bound is 5 points; the frozen-position-table mistake it guards
    # against (train=["head"]) ended 6.7 to 12.0 below, and 10.9 below in
    # this test as written (docs/keras_features.md has the longer runs).
    assert lora_acc >= full_acc - 0.05, (full_acc, lora_acc)
