"""Rematerialisation: ``remat=True`` on the builders (every encoder block,
a hybrid's ResNet units, BiT's units, Axial-ViT's row and column blocks)
gives the gradients of the model without it, dropout and the relative
position table included, on every backend; ``keras.RematScope`` works
around a zoo model; ``.keras`` files load either way; inference is
unchanged."""

import keras
import numpy as np
import pytest

import keras_vit
import model_gradients
from keras_vit.runtime.backend import to_numpy
from keras_vit.models import axial_vit, resnet_v2, vit
from testkit import FAMILY_OPTIONS, forward

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=2, mlp_dim=64, num_classes=5)
# One block shows what remat does to a block (masks, the relative table,
# the gradient of the block's input); each block more only lengthens the
# gradient programs' compiles on JAX. vit_family keeps two: its stochastic
# depth rises from 0 at the first block, so only the second drops paths.
ONE_BLOCK = dict(TINY, num_layers=1)
FAMILIES = {
    "vit": lambda **kw: vit(**ONE_BLOCK, **kw),
    # Dropout: the backward pass must recompute the forward's masks.
    "vit_dropout": lambda **kw: vit(**ONE_BLOCK, dropout_rate=0.2,
                                    attention_dropout_rate=0.2, **kw),
    # The relative table reaches the blocks as a call argument.
    "vit_relative": lambda **kw: vit(
        **ONE_BLOCK, position_embedding="relative",
        position_embedding_placement="every_layer_shared", **kw),
    "hybrid": lambda **kw: vit(**dict(ONE_BLOCK, patch_size=1), resnet=dict(
        num_layers=(1,), width_factor=0.5), **kw),
    "bit": lambda **kw: resnet_v2(32, (1, 1, 1, 1), 0.5, num_classes=5, **kw),
    "axial": lambda **kw: axial_vit(32, 8, 32, 1, 2, 64, 5,
                                    dropout_rate=0.1, **kw),
    # The contract model's options (testkit.FAMILY_OPTIONS: the
    # attention-pool head, RMSNorm, the patch norm, a gated MLP, layer
    # scale, q/k norms, registers) with stochastic depth, whose masks must
    # be recomputed too.
    "vit_family": lambda **kw: vit(**TINY, **FAMILY_OPTIONS,
                                   drop_path_rate=0.2, **kw),
}


def gradients(model, x):
    """d sum(logits^2) / d every trainable weight, in a training call."""
    return model_gradients.gradients(
        model, x, lambda y: keras.ops.sum(keras.ops.square(y)))


def _twins(build):
    """The same model with and without remat: same weights, same seeds."""
    models = []
    for remat in (False, True):
        keras.utils.set_random_seed(3)
        model = build(remat=remat)
        rng = np.random.default_rng(0)
        for w in model.weights:
            if w.trainable:
                w.assign(rng.normal(0, 0.1, w.shape).astype(w.dtype))
        models.append(model)
    return models


@pytest.mark.backends
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradients_equal_the_model_without_remat(family):
    plain, remat = _twins(FAMILIES[family])
    assert remat.get_config()["remat"] is True
    x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3))
    x = x.astype("float32")
    want, got = gradients(plain, x), gradients(remat, x)
    assert len(want) == len(got) == len(plain.trainable_variables)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(want, got))
    scale = max(float(np.abs(a).max()) for a in want)
    assert scale > 0
    assert worst <= 1e-6 * max(1.0, scale), (family, worst, scale)
    # Inference is the plain model's (testkit.forward: on JAX one program
    # per model, cheaper than compiling each op of an eager call).
    np.testing.assert_array_equal(forward(remat, x), forward(plain, x))


@pytest.mark.backends
@pytest.mark.parametrize("family", ["vit", "vit_dropout"])
def test_keras_remat_scope_works_around_a_zoo_model(family):
    """keras.RematScope builds a zoo model and keeps its gradients where
    Keras' per-layer remat can (torch; TensorFlow without dropout); where
    it cannot (dropout on TensorFlow draws new masks, JAX traces the
    dropout layers' flag) the model is refused, naming remat=True."""
    x = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3))
    x = x.astype("float32")
    plain, _ = _twins(FAMILIES[family])
    keras.utils.set_random_seed(3)
    backend = keras.backend.backend()
    unsafe = backend == "jax" or (family == "vit_dropout"
                                  and backend == "tensorflow")
    with keras.RematScope(mode="full"):
        if unsafe:
            with pytest.raises(ValueError, match="remat=True"):
                FAMILIES[family](remat=False)
            return
        scoped = FAMILIES[family](remat=False)
    scoped.set_weights(plain.get_weights())
    np.testing.assert_allclose(to_numpy(scoped(x)), to_numpy(plain(x)),
                               atol=1e-6)
    want, got = gradients(plain, x), gradients(scoped, x)
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, got)) < 1e-5


@pytest.mark.backends
def test_keras_files_load_either_way(tmp_path):
    import keras_vit.models  # noqa: F401 - registers the classes

    for remat in (True, False):
        model = vit(**TINY, remat=remat)
        path = tmp_path / f"remat_{remat}.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        assert loaded.remat is remat
        assert all(layer.remat is remat for layer in loaded.layers
                   if layer.name.startswith("encoder_block"))
    loaded = keras_vit.rebuild(loaded, remat=True)
    assert loaded.get_config()["remat"] is True


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_remat_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=f"remat={bad!r}"):
        vit(**TINY, remat=bad)


# ---------------------------------------------------------------------------
# the option on a built model, the Trainer, compile_for_finetune, the CLI


def test_set_remat_switches_every_block_and_the_config():
    from keras_vit.models.common import remat_of, set_remat

    model = FAMILIES["hybrid"](remat=False)
    assert not remat_of(model)
    assert set_remat(model, True) is model
    assert remat_of(model) and model.get_config()["remat"] is True
    assert set_remat(model, None) is model and remat_of(model)
    with pytest.raises(ValueError, match="remat='yes'"):
        set_remat(model, "yes")
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no block"):
        set_remat(plain, True)


def test_the_memory_estimate_counts_remat_and_the_check_names_it():
    from keras_vit.models import memory
    from keras_vit.models.common import set_remat

    model = vit(**dict(TINY, image_size=64, num_layers=6))
    full = memory.step_memory_estimate(model, 8)
    with pytest.raises(ValueError, match=r"set remat=True \(rematerialised"):
        memory.check_step(model, 8, available=full // 3)
    set_remat(model, True)
    kept = memory.step_memory_estimate(model, 8)
    assert kept < full / 3, (kept, full)
    memory.check_step(model, 8, available=full // 3)  # fits now


def _losses(remat):
    import keras_vit.train as kt

    keras.utils.set_random_seed(0)  # the same initial weights each time
    # One block: the Trainer passes remat to every block alike, and each
    # block more only lengthens the two training steps' compiles (JAX).
    run = kt.fine_tune(vit(**dict(TINY, num_classes=10, num_layers=1),
                           dropout_rate=0.1),
                       "digits", None, total_steps=3, warmup_steps=1,
                       batch_size=8, image_size=32, crop_area=None,
                       strategy="default", remat=remat, verbose=False)
    return run


@pytest.mark.backends
def test_the_trainer_trains_the_same_with_remat():
    plain, remat = _losses(None), _losses(True)
    assert remat.model.get_config()["remat"] is True
    assert remat.metrics["train_loss"] == pytest.approx(
        plain.metrics["train_loss"], rel=1e-5)
    for a, b in zip(plain.model.weights, remat.model.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-5)


def test_compile_for_finetune_takes_remat():
    import keras_vit.train as kt

    model = vit(**dict(TINY, num_classes=10))
    recipe = kt.compile_for_finetune(model, total_steps=2, warmup_steps=1,
                                     batch_size=8, remat=True)
    assert model.get_config()["remat"] is True
    ds = kt.dataset("digits", 32, recipe.batch_size, crop_area=None)
    history = model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_fine_tune_on_the_command_line_takes_remat(tmp_path):
    from keras_vit import cli

    out = tmp_path / "run"
    code = cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                     "--weights", "none", "--image-size", "32", "--steps",
                     "2", "--batch-size", "8", "--set", "warmup_steps=1",
                     # One block of ViT-Ti/16's 12: what --remat sets is
                     # the same for any depth.
                     "--model-option", "num_layers=1",
                     "--set", "crop_area=none", "--no-eval", "--remat",
                     "--out", str(out), "--quiet"])
    assert code == 0
    model = keras_vit.zoo.load(str(out))
    assert model.get_config()["remat"] is True
