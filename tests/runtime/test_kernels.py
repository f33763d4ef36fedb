"""keras_vit.runtime.kernels, the seam between the layers' math and each
backend's spelling of it: every spelling the machine's plan may choose
computes the math the layers state (NumPy here), so the layers' own
tests hold whichever the plan picks."""

import dataclasses

import numpy as np
import pytest
from keras import ops

from keras_vit.runtime import hardware, kernels

pytestmark = pytest.mark.backends


def test_flat_einsum_recognises_the_plain_projections_only():
    assert kernels.flat_einsum("abc,cde->abde") == (1, 2)
    assert kernels.flat_einsum("abcd,cde->abe") == (2, 1)
    # A transposed output or a batch axis in the kernel is no one matmul.
    assert kernels.flat_einsum("abc,cde->abed") is None
    assert kernels.flat_einsum("abc,acd->abd") is None


def _np(x):
    return np.asarray(ops.convert_to_numpy(x), "float64")


def _gelu(x, form):
    if form == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                      * (x + 0.044715 * x ** 3)))
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def _attention(q, k, v, bias, scale):
    logits = np.einsum("bqhk,bvhk->bhqv", q, k) * scale
    if bias is not None:
        logits = logits + bias
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqv,bvhk->bqhk", probs, v), probs


@pytest.mark.parametrize("path", ["fused", "einsum"])
@pytest.mark.parametrize("softmax", ["float32", "input"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("need_probs", [False, True])
@pytest.mark.parametrize("training", [None, True])
def test_every_attention_spelling_is_the_math(monkeypatch, path, softmax,
                                              with_bias, need_probs,
                                              training):
    """Fused kernel or einsums, the softmax in float32, the input's dtype
    or an XLA program (training, where the plan runs chains in XLA), a
    logits bias or none, attention maps asked or not: the context (and the
    maps, where formed) are softmax(q k^T * scale + bias) v."""
    chosen = hardware.plan("float32")
    monkeypatch.setattr(hardware, "plan", lambda *a, **k: dataclasses.replace(
        chosen, attention=path, softmax=softmax))
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 5, 3, 4)).astype("float32")
               for _ in range(3))
    bias = (rng.normal(size=(1, 3, 5, 5)).astype("float32")
            if with_bias else None)
    scale = 0.5
    context, probs = kernels.attention(
        *(ops.convert_to_tensor(a) for a in (q, k, v)),
        None if bias is None else ops.convert_to_tensor(bias), scale, None,
        training, need_probs=need_probs)
    want, want_probs = _attention(q, k, v, bias, scale)
    np.testing.assert_allclose(_np(context), want, rtol=1e-5, atol=1e-5)
    if need_probs or path == "einsum":
        np.testing.assert_allclose(_np(probs), want_probs, rtol=1e-5,
                                   atol=1e-6)
    else:
        assert probs is None


@pytest.mark.parametrize("gelu", [None, "tanh", "exact"])
@pytest.mark.parametrize("training", [None, True])
def test_dense_is_the_math_whatever_the_spelling(gelu, training):
    from keras_vit.layers.dense import MLP_GELU

    rng = np.random.default_rng(1)
    x, kernel = (rng.normal(size=s).astype("float32")
                 for s in ((6, 4), (4, 3)))
    bias = rng.normal(size=(3,)).astype("float32")
    got = kernels.dense(*(ops.convert_to_tensor(a) for a in (x, kernel, bias)),
                        MLP_GELU.get(gelu), gelu, training)
    want = x.astype("float64") @ kernel + bias
    if gelu is not None:
        want = _gelu(want, gelu)
    np.testing.assert_allclose(_np(got), want, rtol=1e-5, atol=1e-5)
