"""Every row of the family's option table (:mod:`keras_vit.base.options`)
survives every Keras path a model takes: a ``.keras`` file, ``quantize
("int8")`` (and its ``.keras`` file), LoRA, ``remat=True`` and the
``mixed_bfloat16`` policy. The rows' examples (testkit.OPTION_EXAMPLES)
are gathered into a few models (testkit.option_groups: each row joins
the first model it agrees with), each of which runs every path, so a row
added to the table is covered here without a line changed
(tests/models/test_option_rows.py holds every row to have an example,
and proves the rows themselves). Each assertion reads the whole model
(every layer's mode and dtype, every variable's gradient, the logits),
so a row that breaks a path fails its group.

Each model is the tiniest that shows its rows (32 px, patch 8, width
32, two blocks: stochastic depth rises from 0 at the first block, so
only the second drops paths), with random weights of a sensible scale (a
zero head, as built, would hide every error), built once per module and
copied by each test that changes it.
"""

import keras
import numpy as np
import pytest

import keras_vit
import model_gradients
import testkit
from keras_vit.models import lora
from testkit import forward, option_groups, randomise_keras

pytestmark = [pytest.mark.backends,
              # quantize's one warning naming the layers left in float
              # (tests/models/test_keras_features.py checks it).
              pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")]

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=2, mlp_dim=64, num_classes=5)
# The groups by a name of their rows: the first, and how many more.
GROUPS = {f"{rows[0]}+{len(rows) - 1}": (rows, kwargs)
          for rows, kwargs in option_groups(**TINY)}

# The error bounds, relative to the float logits' largest magnitude (their
# spread: the logits of these random models are centred on zero).
# Keras' int8 Dense and EinsumDense round each kernel per output channel
# and each input per token to 127 levels of its largest magnitude, about
# 0.4% of that range per operand, compounded through the projections of
# two blocks and the head (more with an attention pool, a merger or a
# second head). Measured over the groups with this module's weights on
# TensorFlow: 0.008 (the group of twenty rows) to 0.022 (the attention
# pools'); one row per model measured 0.007 to 0.043, up to 0.060 with
# other weight seeds; the ViT's in tests/models/test_keras_features.py is
# 0.031. A kernel read without its scale, or a row's layer skipped by the
# quantized model's call, moves the logits by their whole size (a
# projection left in float is caught by the test's check of every
# layer's mode).
INT8_ERROR = 0.1
# bfloat16 keeps 8 significant bits: each rounded operand is off by up to
# 2 ** -9 (0.2%), and two blocks of rounded matmuls, norms and softmaxes
# compound it: 0.004 to 0.011 over the groups here (one row per model:
# up to 0.027 with other seeds and backends). A model left in float32
# would be off by 0; one that skipped a row's layer under the policy, by
# its whole size.
BF16_ERROR = 0.05


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """Quantize's garbage collections scan only what is new
    (testkit.frozen_heap): two quantizes per row here."""
    with testkit.frozen_heap():
        yield


def build(name, **kwargs):
    """The tiny ViT of group ``name``, its rows at their examples (and
    ``kwargs``)."""
    return keras_vit.vit(**TINY, **GROUPS[name][1], **kwargs)


def test_every_row_is_on_in_a_group():
    from testkit import OPTION_EXAMPLES

    on = {row: kwargs[row] for rows, kwargs in GROUPS.values()
          for row in rows}
    assert on == {row: value for row, (value, _) in OPTION_EXAMPLES.items()}


def images():
    """One batch shape for every test: on JAX each program compiles once."""
    return np.random.default_rng(1).uniform(
        -1, 1, (2, 32, 32, 3)).astype("float32")


@pytest.fixture(scope="module")
def floats():
    """``floats(name)``: row ``name``'s float32 model with random weights
    and its logits, made once for the module's tests (and let go after
    them: every model alive lengthens each garbage collection)."""
    made = {}

    def get(name):
        if name not in made:
            keras.utils.set_random_seed(0)
            model = randomise_keras(build(name))
            made[name] = (model, forward(model, images()))
        return made[name]

    yield get
    made.clear()


def copy_of(model):
    clone = model.__class__.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    return clone


def same_state(model, reference):
    """``model`` (the reference's architecture, built another way) with the
    reference's variables, matched by path: its weights and its seed
    generators' states (stochastic depth then draws the same masks)."""
    assert [w.path for w in model.weights] == [
        w.path for w in reference.weights]
    # The seed generators' own paths carry a counter of the process.
    assert [tuple(v.shape) for v in model.variables] == [
        tuple(v.shape) for v in reference.variables]
    for mine, theirs in zip(model.variables, reference.variables):
        mine.assign(theirs.value)
    return model


def save_and_load(model, path):
    model.save(path)
    return keras.saving.load_model(path)


def relative_error(got, want):
    return float(np.max(np.abs(np.asarray(got, "float32") - want))
                 / np.max(np.abs(want)))


def dense_layers(model):
    return [layer for layer in model._flatten_layers()
            if isinstance(layer, (keras.layers.Dense,
                                  keras.layers.EinsumDense))]


def squared_logits(y):
    return keras.ops.sum(keras.ops.square(keras.ops.cast(y, "float32")))


@pytest.mark.parametrize("name", GROUPS)
def test_a_keras_file_keeps_the_rows(floats, name, tmp_path):
    model, want = floats(name)
    back = save_and_load(model, tmp_path / f"{name}.keras")
    for row in GROUPS[name][0]:
        assert back.get_config()[row] == model.get_config()[row], row
    np.testing.assert_allclose(forward(back, images()), want, atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("name", GROUPS)
def test_int8_keeps_the_rows_and_its_keras_file(floats, name, tmp_path):
    model, want = floats(name)
    quantized = copy_of(model)
    quantized.quantize("int8")
    assert all(layer.quantization_mode == "int8"
               for layer in dense_layers(quantized)), name
    got = forward(quantized, images())
    assert 0 < relative_error(got, want) < INT8_ERROR, (
        name, relative_error(got, want))
    back = save_and_load(quantized, tmp_path / f"{name}_int8.keras")
    assert all(layer.quantization_mode == "int8"
               for layer in dense_layers(back)), name
    np.testing.assert_allclose(forward(back, images()), got, atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("name", GROUPS)
def test_lora_keeps_the_rows_and_trains_only_what_it_leaves_trainable(
        floats, name):
    """keras_vit.models.lora.enable_lora: Keras' ``layer.enable_lora`` on
    every projection (``keras.Model`` has no ``enable_lora`` of its own in
    Keras 3.15), everything else frozen but the head."""
    model, want = floats(name)
    adapted = copy_of(model)
    before = sum(int(np.prod(w.shape)) for w in adapted.trainable_weights)
    report = lora.enable_lora(adapted, rank=2)
    assert report["layers"] > 0
    assert report["trainable"] < before, (name, report, before)
    # B starts at zero: the kernels read exactly what they did.
    x = images()
    np.testing.assert_allclose(forward(adapted, x), want, atol=1e-6, rtol=0)

    old = {w.path: keras.ops.convert_to_numpy(w.value)
           for w in adapted.weights}
    trainable = {w.path for w in adapted.trainable_weights}
    # Sixteen images: stochastic depth drops a branch of one example in
    # ten in the second block, and two images can lose one (its B's
    # gradient then zero) wherever a row adds draws (branches: one a
    # branch).
    grads = model_gradients.gradients(
        adapted, np.random.default_rng(2).uniform(
            -1, 1, (16, 32, 32, 3)).astype("float32"), squared_logits)
    keras.optimizers.SGD(0.1).apply(
        [keras.ops.convert_to_tensor(g, "float32") for g in grads],
        adapted.trainable_variables)
    changed = {w.path for w in adapted.weights if not np.array_equal(
        keras.ops.convert_to_numpy(w.value), old[w.path])}
    assert changed <= trainable, (name, sorted(changed - trainable))
    b = {layer.lora_kernel_b.path
         for layer in dense_layers(adapted) if layer.lora_enabled}
    # A's first gradient is zero (it meets B = 0); B's is not.
    assert b and b <= changed, (name, sorted(b - changed))


@pytest.mark.parametrize("name", GROUPS)
def test_remat_keeps_the_groups_logits_and_gradients(floats, name):
    model, want = floats(name)
    remat = same_state(build(name, remat=True), model)
    assert remat.get_config()["remat"] is True
    x = images()
    np.testing.assert_allclose(forward(remat, x), want, atol=1e-6, rtol=0)
    # In training, from the same seed generators' states: stochastic
    # depth's masks must be recomputed as drawn. Its second block drops a
    # branch of one example in ten: 16 images see drops on every backend
    # (2 images saw none on TensorFlow and PyTorch).
    x = np.random.default_rng(2).uniform(-1, 1, (16, 32, 32, 3)).astype(
        "float32")
    plain_grads = model_gradients.gradients(model, x, squared_logits)
    remat_grads = model_gradients.gradients(remat, x, squared_logits)
    assert len(plain_grads) == len(remat_grads) == len(
        model.trainable_variables)
    scale = max(float(np.abs(g).max()) for g in plain_grads)
    assert scale > 0, name
    for variable, a, b in zip(model.trainable_variables, plain_grads,
                              remat_grads):
        np.testing.assert_allclose(b, a, atol=1e-5 * max(1.0, scale),
                                   rtol=0, err_msg=f"{name}: {variable.path}")


@pytest.mark.parametrize("name", GROUPS)
def test_mixed_bfloat16_keeps_the_rows(floats, name):
    model, want = floats(name)
    mixed = same_state(build(name, dtype="mixed_bfloat16"), model)
    assert {w.dtype for w in mixed.weights} == {"float32"}, name
    assert {layer.compute_dtype for layer in dense_layers(mixed)} == {
        "bfloat16"}, name
    error = relative_error(forward(mixed, images()), want)
    assert 0 < error < BF16_ERROR, (name, error)
