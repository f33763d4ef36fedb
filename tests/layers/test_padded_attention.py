"""The padded attention path (``KERAS_VIT_ATTENTION=padded``): the tokens
padded to a multiple of 64 with a key-length mask, the shape in which
cuDNN's flash kernel trains, compute the unpadded attention's numbers
forward and backward (float32, on the CPU through XLA's implementation).
"""

import keras
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import keras_vit
from keras_vit.runtime import kernels


def _reference(q, k, v, scale):
    import jax

    logits = jax.numpy.einsum("bqhd,bkhd->bhqk", q, k) * scale
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.numpy.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("tokens", [1, 5, 64, 197])
def test_padded_attention_equals_the_unpadded_forward_and_gradients(tokens):
    # Plain JAX functions, whatever Keras' backend.
    import jax

    rng = np.random.default_rng(tokens)
    q, k, v = (rng.normal(size=(2, tokens, 3, 8)).astype("float32")
               for _ in range(3))
    scale = 8 ** -0.5
    got = kernels.padded_attention(q, k, v, scale)
    want = _reference(q, k, v, scale)
    assert got.shape == (2, tokens, 3, 8)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    cotangent = rng.normal(size=want.shape).astype("float32")
    grads = [jax.grad(lambda *a, f=f: (f(*a, scale) * cotangent).sum(),
                      argnums=(0, 1, 2))(q, k, v)
             for f in (kernels.padded_attention, _reference)]
    for g, w in zip(*grads):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(1, 140), heads=st.integers(1, 3),
       width=st.sampled_from([4, 8, 16]), batch=st.integers(1, 3),
       magnitude=st.sampled_from([1.0, 30.0]), multiple=st.sampled_from(
           [8, 64]))
def test_any_shape_and_logit_size_gives_the_unpadded_attention(
        tokens, heads, width, batch, magnitude, multiple):
    # Large logits (magnitude 30: products of order 900 before the
    # scale) must not let a masked key in or turn a padded row into NaN.
    # There float32 attention is ill-conditioned whatever its spelling
    # (a logit's rounding moves its weight by about 1e-4), so the padded
    # path is held to the unpadded float32 one's error against float64.
    rng = np.random.default_rng(tokens * 7 + heads)
    q, k, v = (magnitude * rng.normal(size=(batch, tokens, heads, width))
               .astype("float32") for _ in range(3))
    scale = width ** -0.5
    got = np.asarray(kernels.padded_attention(q, k, v, scale,
                                              multiple=multiple))
    assert got.shape == q.shape and np.isfinite(got).all()
    logits = np.einsum("bqhd,bkhd->bhqk", q.astype("float64"),
                       k.astype("float64")) * scale
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    exact = np.einsum("bhqk,bkhd->bqhd", probs / probs.sum(-1, keepdims=True),
                      v.astype("float64"))
    unpadded = np.abs(np.asarray(_reference(q, k, v, scale)) - exact).max()
    assert np.abs(got - exact).max() <= 4 * unpadded + 1e-6 * magnitude


# The path exists on JAX alone; the other backends take the fused path
# under the same setting.
@pytest.mark.backends("jax")
def test_the_model_under_padded_attention_gives_the_fused_paths_logits(
        monkeypatch):
    if keras.backend.backend() != "jax":
        pytest.skip("the JAX backend's path")
    from testkit import forward  # one compiled call each, not op by op

    model = keras_vit.vit(32, 8, 32, 2, 2, 64, 5)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(
        "float32")
    monkeypatch.setenv("KERAS_VIT_ATTENTION", "fused")
    want = forward(model, x)
    monkeypatch.setenv("KERAS_VIT_ATTENTION", "padded")
    calls = []
    padded = kernels.padded_attention
    monkeypatch.setattr(kernels, "padded_attention",
                        lambda *a: calls.append(1) or padded(*a))
    got = forward(model, x)
    assert len(calls) == 2  # one a block (traced once)
    np.testing.assert_allclose(got, want, rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("dtype, trains_padded", [
    ("mixed_bfloat16", True), ("float16", True), ("float32", False)])
def test_on_a_cudnn_gpu_jax_trains_half_precision_with_padded_tokens(
        monkeypatch, dtype, trains_padded):
    from keras_vit.runtime import hardware

    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "gpu")
    monkeypatch.setattr(hardware, "cudnn_flash_attention", lambda: True)
    plan = hardware.plan(dtype, backend="jax")
    assert plan.attention == "fused"  # inference: cuDNN takes 197 tokens
    assert plan.train_attention == ("padded" if trains_padded else None)
    # Without cuDNN's flash kernel, or when the user names a path, no
    # padding.
    monkeypatch.setattr(hardware, "cudnn_flash_attention", lambda: False)
    assert hardware.plan(dtype, backend="jax").train_attention is None
    monkeypatch.setattr(hardware, "cudnn_flash_attention", lambda: True)
    monkeypatch.setenv("KERAS_VIT_ATTENTION", "fused")
    assert hardware.plan(dtype, backend="jax").train_attention is None


@pytest.mark.backends("jax")
def test_only_training_calls_take_the_padded_path(monkeypatch):
    if keras.backend.backend() != "jax":
        pytest.skip("the JAX backend's path")
    from keras_vit.runtime import hardware

    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "gpu")
    monkeypatch.setattr(hardware, "cudnn_flash_attention", lambda: True)
    calls = []
    padded = kernels.padded_attention
    monkeypatch.setattr(kernels, "padded_attention", lambda *a: calls.append(
        1) or padded(*a, implementation="xla"))
    model = keras_vit.vit(32, 8, 32, 1, 2, 64, 5, dtype="mixed_bfloat16")
    x = np.zeros((2, 32, 32, 3), "float32")
    model(x, training=False)
    assert calls == []
    model(x, training=True)
    assert calls == [1]
