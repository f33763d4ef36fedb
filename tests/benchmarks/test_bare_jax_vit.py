"""benchmarks/bare_jax_vit.py, the bare JAX step the GPU check times beside
keras_vit: the same model and the same optimizer, checked on the CPU with
keras_vit's own weights (float32), so that the GPU table compares steps
that compute the same numbers."""

import os

import numpy as np
import pytest

from testkit import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
HEADS, PATCH = 2, 8


@pytest.fixture(scope="module")
def bare():
    return load_script(os.path.join(ROOT, "benchmarks", "bare_jax_vit.py"))


def _model_and_data():
    import keras

    import keras_vit
    from testkit import randomise_weights

    keras.utils.set_random_seed(1)
    model = keras_vit.vit(32, PATCH, 32, 2, HEADS, 64, 5)
    randomise_weights(model, seed=1)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    y = np.array([0, 1, 2, 4], "int32")
    return model, x, y


@pytest.mark.parametrize("attention", ["xla", "padded-xla"])
def test_the_bare_forward_gives_keras_vits_logits(bare, attention):
    import keras

    model, x, _ = _model_and_data()
    want = keras.ops.convert_to_numpy(model(x))
    got = bare.forward(bare.params_from_keras(model), x, HEADS, PATCH,
                       attention=attention)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_one_bare_adamw_step_moves_the_weights_as_keras_does(bare):
    import keras

    model, x, y = _model_and_data()
    params = bare.params_from_keras(model)
    model.compile(optimizer=keras.optimizers.AdamW(**bare.ADAMW),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    loss = model.train_on_batch(x, y)
    step = bare.make_step(HEADS, PATCH, dtype="float32")
    params, state, bare_loss = step(params, bare.adamw_init(params), x, y)
    assert float(state["t"]) == 1.0
    np.testing.assert_allclose(float(bare_loss), loss, rtol=1e-5)
    after = bare.params_from_keras(model)
    import jax

    for got, want in zip(jax.tree_util.tree_leaves(params),
                         jax.tree_util.tree_leaves(after)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                                   rtol=1e-4, atol=1e-6)
