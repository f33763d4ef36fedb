"""The training step's fused spellings against the formulas they replace.

Each element-wise chain a TensorFlow training step runs as an XLA program
(keras_vit.runtime.fused_ops: the GELU of either form, LayerNorm, the softmax)
must give the reference forward and gradient for any shape, scale and
dtype (a property test), and a whole model's training step must give the
same loss and gradients whichever way the machine's plan runs them (a
differential test). The recipes' SGD (keras_vit.train.schedules.SGD, one
fused kernel per variable) must follow Keras' SGD step for step under
every option it accepts.
"""

import dataclasses

import keras
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import keras_vit
from keras_vit import layers as kl
from keras_vit.runtime.kernels import chains_in_xla
from keras_vit.runtime import fused_ops

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the fused spellings are TensorFlow graphs")


def _grads(fn, *tensors, dy):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(list(tensors))
        y = fn(*tensors)
    return y, tape.gradient(y, list(tensors), output_gradients=dy)


def _reference_layer_norm(x, gamma, beta, epsilon):
    import tensorflow as tf

    f = tf.cast(x, "float32")
    mean, var = tf.nn.moments(f, axes=[-1], keepdims=True)
    return (f - mean) * tf.math.rsqrt(var + epsilon) * gamma + beta


# bf16 keeps 8 bits of mantissa: compared against the float32 reference
# of the same (bf16-rounded) inputs, an output may be one bf16 step off.
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2}

shapes = st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(2, 40))


@settings(max_examples=25, deadline=None)
@given(shape=shapes, scale=st.floats(0.01, 30.0),
       dtype=st.sampled_from(["float32", "bfloat16"]),
       form=st.sampled_from(kl.GELU_FORMS), seed=st.integers(0, 2**16))
def test_xla_gelu_is_the_gelu_and_its_gradient(shape, scale, dtype, form,
                                               seed):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    h = tf.cast(rng.normal(0, scale, shape).astype("float32"), dtype)
    dy = tf.cast(rng.normal(0, 1, shape).astype("float32"), dtype)
    y, (dh,) = _grads(lambda t: fused_ops.xla_gelu(t, form), h, dy=dy)
    f32 = tf.cast(h, "float32")
    ref, (ref_dh,) = _grads(lambda t: kl.gelu(t, form), f32,
                            dy=tf.cast(dy, "float32"))
    assert y.dtype == h.dtype and dh.dtype == h.dtype
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(tf.cast(y, "float32"), ref, rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(tf.cast(dh, "float32"), ref_dh, rtol=tol,
                               atol=tol * max(1.0, float(np.abs(dy).max())))


@settings(max_examples=25, deadline=None)
@given(shape=shapes, scale=st.floats(1e-3, 1e3), shift=st.floats(-50, 50),
       dtype=st.sampled_from(["float32", "bfloat16"]),
       epsilon=st.sampled_from([1e-6, 1e-5, 1e-3]), seed=st.integers(0, 2**16))
# Over two values the input's gradient is zero: only rounding is left.
@example(shape=(1, 1, 2), scale=1.0, shift=0.0, dtype="float32",
         epsilon=1e-6, seed=0)
# Values 500 standard deviations from zero: the mean's rounding shows.
@example(shape=(1, 1, 5), scale=0.00390625, shift=2.0, dtype="float32",
         epsilon=1e-6, seed=0)
def test_xla_layer_norm_is_layer_norm_and_its_gradient(shape, scale, shift,
                                                       dtype, epsilon, seed):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    width = shape[-1]
    x = tf.cast(rng.normal(shift, scale, shape).astype("float32"), dtype)
    gamma = tf.constant(rng.normal(1, 0.5, width).astype("float32"))
    beta = tf.constant(rng.normal(0, 0.5, width).astype("float32"))
    dy = tf.cast(rng.normal(0, 1, shape).astype("float32"), dtype)
    y, grads = _grads(
        lambda a, g, b: fused_ops.xla_layer_norm(a, g, b, epsilon), x,
        gamma, beta, dy=dy)
    ref, ref_grads = _grads(
        lambda a, g, b: _reference_layer_norm(a, g, b, epsilon),
        tf.cast(x, "float32"), gamma, beta, dy=tf.cast(dy, "float32"))
    assert y.dtype == x.dtype and grads[0].dtype == x.dtype
    assert grads[1].dtype == grads[2].dtype == tf.float32
    f = tf.cast(x, "float32").numpy()
    rstd = 1 / np.sqrt(f.var(-1) + epsilon)
    # What float32 itself leaves of the normalised values, on both sides:
    # a mean of values far from zero (|x| >> std) is only good to a few
    # of their ulps, and LayerNorm multiplies that by 1/std.
    float32_floor = 8 * 2.0**-23 * float(np.abs(f).max() * rstd.max())
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(
        tf.cast(y, "float32"), ref, rtol=tol,
        atol=tol * 10 + float32_floor * float(np.abs(gamma).max()))
    # Each gradient against its natural size (the input's scales as
    # 1/std; gamma's and beta's as the summed output gradient), not its
    # own: a gradient can vanish in exact arithmetic (a LayerNorm over two
    # values outputs +-1 whatever they are), leaving rounding noise on
    # both sides.
    d = np.abs(tf.cast(dy, "float32").numpy())
    natural = (float(rstd.max() * d.max() * np.abs(gamma).max()),
               float(d.reshape(-1, width).sum(0).max() * np.sqrt(width)),
               float(d.reshape(-1, width).sum(0).max()))
    for got, want, scale_of in zip(grads, ref_grads, natural):
        got = tf.cast(got, "float32").numpy()
        size = max(scale_of, float(np.abs(want).max()))
        np.testing.assert_allclose(got / size, want.numpy() / size,
                                   atol=tol * 10 + float32_floor)


@settings(max_examples=25, deadline=None)
@given(shape=shapes, scale=st.floats(0.01, 60.0),
       dtype=st.sampled_from(["float32", "bfloat16"]),
       factor=st.sampled_from([1.0, 0.125, 1 / 7]),
       seed=st.integers(0, 2**16))
def test_xla_softmax_is_the_softmax_and_its_gradient(shape, scale, dtype,
                                                     factor, seed):
    """``softmax(factor * z)``: the attention's scale folded in."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    z = tf.cast(rng.normal(0, scale, shape).astype("float32"), dtype)
    dy = tf.cast(rng.normal(0, 1, shape).astype("float32"), dtype)
    p, (dz,) = _grads(lambda t: fused_ops.xla_softmax(t, factor), z, dy=dy)
    ref, (ref_dz,) = _grads(lambda t: tf.nn.softmax(t * factor),
                            tf.cast(z, "float32"), dy=tf.cast(dy, "float32"))
    assert p.dtype == z.dtype and dz.dtype == z.dtype
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(tf.cast(p, "float32"), ref, atol=tol)
    np.testing.assert_allclose(tf.cast(dz, "float32"), ref_dz, atol=tol * 4)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("gelu", kl.GELU_FORMS)
def test_a_training_step_is_the_same_either_way_the_plan_runs_it(
        monkeypatch, dtype, gelu):
    """The same model and batch: loss and every gradient with the
    element-wise chains as XLA programs and as graph ops."""
    import tensorflow as tf

    if not chains_in_xla(tf.float32, training=True):
        pytest.skip("this machine's plan runs no XLA programs in the step")
    keras.utils.set_random_seed(3)
    policy = None if dtype == "float32" else dtype
    model = keras_vit.vit(32, 8, 48, 2, 3, 96, 5, dtype=policy, gelu=gelu)
    rng = np.random.default_rng(0)
    # The head starts at zero (the paper's), which would leave every other
    # gradient zero: a random head makes the comparison mean something.
    head = model.get_layer("head").kernel
    head.assign(rng.normal(0, 0.5, head.shape).astype("float32"))
    x = tf.constant(rng.uniform(-1, 1, (4, 32, 32, 3)).astype("float32"))
    y = tf.constant([0, 1, 2, 4])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, tf.cast(logits, "float32")))
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = step()
    # The plan is the one place the layers ask: the same machine's plan
    # with the element-wise chains left to the graph.
    plan = keras_vit.runtime.hardware.plan
    monkeypatch.setattr(
        keras_vit.runtime.hardware, "plan",
        lambda *a, **k: dataclasses.replace(plan(*a, **k),
                                            elementwise="graph"))
    ref_loss, ref_grads = step.python_function()
    # float32: rounding only; mixed: bf16 activations rounded at other
    # points (the graph's softmax and GELU round each op to bf16).
    tol = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(loss, ref_loss, rtol=tol)
    # Relative to the largest gradient: the key bias's gradient is zero
    # in exact arithmetic (a softmax ignores a shift shared by a row), so
    # both sides hold only rounding noise there.
    size = max(float(np.abs(r).max()) for r in ref_grads)
    live = [float(np.abs(r).max()) > 1e-3 * size for r in ref_grads]
    assert np.mean(live) > 0.9, live
    for v, g, r in zip(model.trainable_variables, grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g) / size,
                                   np.asarray(r) / size, atol=tol,
                                   err_msg=v.path)


def _applier(optimizer, variables):
    return lambda grads: optimizer.apply(grads, variables)


sgd_options = st.fixed_dictionaries({}, optional={
    "momentum": st.sampled_from([0.0, 0.5, 0.9]),
    "nesterov": st.booleans(),
    "global_clipnorm": st.sampled_from([0.1, 1.0, 1e4]),
    "weight_decay": st.sampled_from([1e-4, 0.1]),
}).filter(lambda o: not o.get("nesterov") or o.get("momentum"))


@settings(max_examples=20, deadline=None)
@given(options=sgd_options, clip=st.sampled_from([None, "clipnorm",
                                                  "clipvalue"]),
       seed=st.integers(0, 2**16), compiled=st.booleans())
def test_the_recipes_sgd_follows_keras_sgd(options, clip, seed, compiled):
    import tensorflow as tf

    from keras_vit.train.schedules import SGD

    if clip and "global_clipnorm" not in options:
        options = {**options, clip: 0.5}
    rng = np.random.default_rng(seed)
    shapes = [(5, 7), (7,), (3, 3, 2)]
    weights = [rng.normal(size=s).astype("float32") for s in shapes]
    steps = [[rng.normal(0, 3, s).astype("float32") for s in shapes]
             for _ in range(3)]
    results = []
    for cls in (keras.optimizers.SGD, SGD):
        variables = [keras.Variable(w) for w in weights]
        optimizer = cls(0.05, **options)
        optimizer.build(variables)  # its slots made outside any trace

        apply = _applier(optimizer, variables)
        if compiled:
            apply = tf.function(apply)
        for grads in steps:
            apply([tf.constant(g) for g in grads])
        results.append([v.numpy() for v in variables])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_compiled_model_saves_and_loads_the_recipes_sgd(tmp_path):
    import keras_vit.train as kt
    from keras_vit.train.schedules import SGD

    model = keras_vit.vit(32, 8, 32, 1, 2, 64, 3)
    kt.compile_for_finetune(model, total_steps=10, warmup_steps=1,
                            batch_size=2)
    assert isinstance(model.optimizer, SGD)
    x = np.zeros((2, 32, 32, 3), "float32")
    model.train_on_batch(x, np.array([0, 1]))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is SGD
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
