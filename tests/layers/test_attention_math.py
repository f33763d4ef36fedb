"""keras_vit.layers.attention: the self-attention layer's output, maps
and options, and the 1D relative position bias, against the formulas
written out in NumPy with the layer's own weights read back."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers as kl
from numpy_layers import (inputs as _inputs, layer_norm as _layer_norm,
                          rms_norm as _rms_norm, softmax as _softmax,
                          to_numpy as _np)
from testkit import randomise_weights, weights_below

RTOL, ATOL = 1e-5, 1e-5

B, N, D, HEADS = 2, 5, 8, 2
HEAD_DIM = D // HEADS


def _attention(x, w, bias=None, qk_norm=None, eps=1e-6):
    """softmax(q k^T / sqrt(d) + bias) v, then the output projection, in
    float64 per head with plain loops; returns the output and the
    probabilities (B, heads, N, N)."""
    x = x.astype("float64")
    b, n, _ = x.shape
    out = np.zeros((b, n, w["out/kernel"].shape[-1]))
    probs = np.zeros((b, HEADS, n, n))
    for h in range(HEADS):
        def project(name, h=h):
            y = x @ w[f"{name}/kernel"][:, h]
            return y + w[f"{name}/bias"][h] if f"{name}/bias" in w else y

        q, k, v = project("query"), project("key"), project("value")
        if qk_norm == "layer":
            q = _layer_norm(q, w["query_norm/gamma"], w["query_norm/beta"],
                            eps)
            k = _layer_norm(k, w["key_norm/gamma"], w["key_norm/beta"], eps)
        elif qk_norm == "rms":
            q = _rms_norm(q, w["query_norm/gamma"], eps)
            k = _rms_norm(k, w["key_norm/gamma"], eps)
        logits = q @ np.swapaxes(k, 1, 2) / math.sqrt(q.shape[-1])
        if bias is not None:
            logits = logits + np.broadcast_to(bias, (b, HEADS, n, n))[:, h]
        probs[:, h] = _softmax(logits)
        out += probs[:, h] @ v @ w["out/kernel"][h]
    if "out/bias" in w:
        out += w["out/bias"]
    return out, probs


def _built(seed=1, input_shape=(B, N, D), **kwargs):
    layer = kl.MultiHeadSelfAttention(HEADS, **kwargs)
    layer.build(input_shape)
    randomise_weights(layer, seed)
    return layer


# -- relative positions ------------------------------------------------------

@pytest.mark.parametrize("patches, prefix, rows", [
    (4, 0, 7), (4, 1, 8), (9, 5, 18), (1, 0, 1)])
def test_relative_table_rows_are_the_offsets_and_one_prefix_row(
        patches, prefix, rows):
    assert kl.relative_table_rows(patches, prefix) == rows


def test_relative_position_index_puts_each_offset_on_its_row():
    # Three patches, no prefix: offset q - k at row q - k + 2.
    want = np.array([[2, 1, 0],
                     [3, 2, 1],
                     [4, 3, 2]])
    np.testing.assert_array_equal(kl.relative_position_index(3, 5), want)


def test_relative_position_index_sends_every_prefix_pair_to_the_last_row():
    # One class token and three patches: 2 * 3 - 1 offsets plus row 5.
    index = kl.relative_position_index(4, 6)
    want = np.array([[5, 5, 5, 5],
                     [5, 2, 1, 0],
                     [5, 3, 2, 1],
                     [5, 4, 3, 2]])
    np.testing.assert_array_equal(index, want)


@pytest.mark.parametrize("num_tokens, rows", [
    (2, 5),   # fewer tokens than the table's patches
    (4, 5),   # a prefix token but no prefix row
    (3, 6),   # a prefix row but no prefix token
])
def test_relative_position_index_refuses_a_table_that_does_not_fit(
        num_tokens, rows):
    with pytest.raises(ValueError, match=f"num_tokens={num_tokens}"):
        kl.relative_position_index(num_tokens, rows)


def _relative_bias(q, table, index):
    """bias[b, h, i, j] = q[b, i, h] . table[index[i, j], h] / sqrt(d),
    by loops."""
    b, n, heads, d = q.shape
    bias = np.zeros((b, heads, n, n))
    for i in range(n):
        for j in range(n):
            bias[:, :, i, j] = np.einsum(
                "bhk,hk->bh", q[:, i], table[index[i, j]]) / math.sqrt(d)
    return bias


@pytest.mark.parametrize("prefix", [0, 1])
def test_relative_attention_bias_dots_each_query_with_its_offset_row(
        prefix):
    patches = N - prefix
    rows = kl.relative_table_rows(patches, prefix)
    q = _inputs(B, N, HEADS, HEAD_DIM)
    table = _inputs(rows, HEADS, HEAD_DIM, seed=3)
    # The index written out by hand: offsets of the patches, the last row
    # for any pair with a prefix token.
    pos = np.arange(N) - prefix
    index = np.where((pos[:, None] < 0) | (pos[None, :] < 0), rows - 1,
                     pos[:, None] - pos[None, :] + patches - 1)
    got = _np(kl.relative_attention_bias(ops.convert_to_tensor(q),
                                         ops.convert_to_tensor(table)))
    assert got.shape == (B, HEADS, N, N)
    np.testing.assert_allclose(got, _relative_bias(
        q.astype("float64"), table.astype("float64"), index),
        rtol=RTOL, atol=ATOL)


# -- the self-attention layer ------------------------------------------------

@pytest.mark.parametrize("path", ["einsum", "fused"])
def test_attention_is_softmax_of_scaled_dot_products_times_values(
        monkeypatch, path):
    # Both computations the speed plan may choose compute the formula.
    monkeypatch.setenv("KERAS_VIT_ATTENTION", path)
    layer = _built()
    x = _inputs(B, N, D)
    want, _ = _attention(x, weights_below(layer))
    got = _np(layer(x))
    assert got.shape == (B, N, D)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_attention_scores_are_the_softmax_probabilities():
    layer = _built()
    x = _inputs(B, N, D)
    want_out, want_probs = _attention(x, weights_below(layer))
    out, probs = layer(x, return_attention_scores=True)
    assert tuple(probs.shape) == (B, HEADS, N, N)
    np.testing.assert_allclose(_np(out), want_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_np(probs), want_probs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_np(probs).sum(-1), 1.0, rtol=RTOL)


def test_the_training_call_without_dropout_computes_the_same_formula():
    # On a TensorFlow CPU the training call runs its softmax as an XLA
    # program that scales inside its own loop.
    layer = _built()
    x = _inputs(B, N, D)
    want, _ = _attention(x, weights_below(layer))
    np.testing.assert_allclose(_np(layer(x, training=True)), want,
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("training", [None, True])
def test_attention_bias_is_added_to_the_logits_before_the_softmax(
        training):
    layer = _built()
    x = _inputs(B, N, D)
    # A mask-like bias: -1e9 hides the last two keys from every query.
    bias = np.zeros((1, 1, N, N), "float32")
    bias[..., -2:] = -1e9
    bias = bias + _inputs(1, HEADS, N, N, seed=4)
    want, want_probs = _attention(x, weights_below(layer), bias=bias)
    out = layer(x, training=training, attention_bias=bias)
    np.testing.assert_allclose(_np(out), want, rtol=RTOL, atol=ATOL)
    _, probs = layer(x, attention_bias=bias, return_attention_scores=True)
    assert np.all(_np(probs)[..., -2:] == 0.0)
    np.testing.assert_allclose(_np(probs), want_probs, rtol=RTOL, atol=ATOL)


def test_a_relative_embedding_adds_its_logits_with_the_projected_queries():
    layer = _built()
    x = _inputs(B, N, D)
    w = weights_below(layer)
    rows = kl.relative_table_rows(N - 1, 1)
    table = _inputs(rows, HEADS, HEAD_DIM, seed=5)
    # The "original query": the layer's own projection of x.
    q = np.einsum("bnc,chk->bnhk", x.astype("float64"),
                  w["query/kernel"]) + w["query/bias"]
    index = kl.relative_position_index(N, rows)
    extra = _inputs(1, 1, N, N, seed=6)
    bias = _relative_bias(q, table.astype("float64"), index) + extra
    want, _ = _attention(x, w, bias=bias)
    got = _np(layer(x, relative_embedding=table, attention_bias=extra))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("qkv_bias, proj_bias", [
    (False, True), (True, False), (False, False)])
def test_the_bias_options_leave_out_those_biases(qkv_bias, proj_bias):
    layer = _built(qkv_bias=qkv_bias, proj_bias=proj_bias)
    w = weights_below(layer)
    want_names = {f"{p}/kernel" for p in ("query", "key", "value", "out")}
    if qkv_bias:
        want_names |= {f"{p}/bias" for p in ("query", "key", "value")}
    if proj_bias:
        want_names.add("out/bias")
    assert set(w) == want_names
    x = _inputs(B, N, D)
    want, _ = _attention(x, w)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_qk_norm_normalises_each_heads_queries_and_keys(norm):
    layer = _built(qk_norm=True, norm=norm, norm_epsilon=1e-3)
    w = weights_below(layer)
    assert "query_norm/gamma" in w and "key_norm/gamma" in w
    assert w["query_norm/gamma"].shape == (HEAD_DIM,)
    assert ("query_norm/beta" in w) == (norm == "layer")
    x = _inputs(B, N, D)
    want, _ = _attention(x, w, qk_norm=norm, eps=1e-3)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)


def test_attention_dropout_is_off_outside_training():
    layer = _built(attention_dropout_rate=0.9)
    x = _inputs(B, N, D)
    want, _ = _attention(x, weights_below(layer))
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)
    # In training it drops attention weights: not the inference output.
    assert not np.allclose(_np(layer(x, training=True)), want, atol=1e-3)


def test_attention_refuses_a_width_the_heads_do_not_divide():
    layer = kl.MultiHeadSelfAttention(3)
    with pytest.raises(ValueError, match="hidden size 8 .*num_heads=3"):
        layer.build((None, N, 8))


def test_attention_refuses_an_unknown_norm_naming_it():
    with pytest.raises(ValueError, match="norm='batch'"):
        kl.MultiHeadSelfAttention(2, norm="batch")


def test_attention_symbolic_outputs_have_the_tokens_and_maps_shapes():
    layer = kl.MultiHeadSelfAttention(HEADS)
    x = keras.KerasTensor((None, N, D))
    out, scores = layer.compute_output_spec(x, return_attention_scores=True)
    assert tuple(out.shape) == (None, N, D)
    assert tuple(scores.shape) == (None, HEADS, N, N)
    assert layer.compute_output_shape((None, N, D)) == (None, N, D)


def test_attention_config_round_trips_and_rebuilds_the_same_layout():
    layer = kl.MultiHeadSelfAttention(
        HEADS, attention_dropout_rate=0.1, qkv_bias=False, proj_bias=True,
        qk_norm=True, norm_epsilon=1e-5, norm="rms", name="mhsa")
    config = layer.get_config()
    for key, value in {"num_heads": HEADS, "attention_dropout_rate": 0.1,
                       "qkv_bias": False, "proj_bias": True,
                       "qk_norm": True, "norm_epsilon": 1e-5,
                       "norm": "rms"}.items():
        assert config[key] == value, key
    rebuilt = kl.MultiHeadSelfAttention.from_config(config)
    rebuilt.build((B, N, D))
    randomise_weights(rebuilt)
    w = weights_below(rebuilt)
    assert "query/bias" not in w and "query_norm/beta" not in w
    x = _inputs(B, N, D)
    want, _ = _attention(x, w, qk_norm="rms", eps=1e-5)
    np.testing.assert_allclose(_np(rebuilt(x)), want, rtol=RTOL, atol=ATOL)


# -- differential attention --------------------------------------------------

def _differential(x, w, index, kind, bias=None, qk_norm=False, eps=1e-6):
    """timm's DiffAttention written out per head in float64: the halves of
    each head's queries and keys, two softmaxes over the values, their
    difference by lambda, the head's RMS norm times 1 - lambda_init."""
    x = x.astype("float64")
    b, n, _ = x.shape
    half = HEAD_DIM // 2
    start = 0.8 - 0.6 * math.exp(-0.3 * index)
    if kind == "vectors":
        lam = (np.exp(np.sum(w["lambda_q1"] * w["lambda_k1"]))
               - np.exp(np.sum(w["lambda_q2"] * w["lambda_k2"])) + start)
    else:
        lam = np.exp(w["lambda_a"]) - np.exp(w["lambda_b"]) + start
    out = np.zeros((b, n, w["out/kernel"].shape[-1]))
    maps = np.zeros((b, HEADS, n, n))
    for h in range(HEADS):
        def project(name, h=h):
            return x @ w[f"{name}/kernel"][:, h] + w[f"{name}/bias"][h]

        q, k, v = project("query"), project("key"), project("value")
        probs = []
        for part in (slice(0, half), slice(half, HEAD_DIM)):
            qs, ks = q[..., part], k[..., part]
            if qk_norm:
                qs = _layer_norm(qs, w["query_norm/gamma"],
                                 w["query_norm/beta"], eps)
                ks = _layer_norm(ks, w["key_norm/gamma"],
                                 w["key_norm/beta"], eps)
            logits = qs @ np.swapaxes(ks, 1, 2) / math.sqrt(half)
            if bias is not None:
                logits = logits + np.broadcast_to(bias, (b, HEADS, n, n))[:, h]
            probs.append(_softmax(logits))
        maps[:, h] = probs[0] - lam * probs[1]
        context = _rms_norm(maps[:, h] @ v, w["sub_norm/gamma"], 1e-5)
        out += context * (1 - start) @ w["out/kernel"][h]
    return out + w["out/bias"], maps


@pytest.mark.backends
@pytest.mark.parametrize("path", ["einsum", "fused"])
@pytest.mark.parametrize("kind, index, qk_norm", [
    ("vectors", 0, False), ("vectors", 3, True), ("dual", 5, False)])
def test_differential_attention_is_the_difference_of_two_softmaxes(
        monkeypatch, path, kind, index, qk_norm):
    """Each speed path computes timm's differential attention with the
    layer's own weights, at the block's lambda_init, with the maps it
    returns and a padding bias (its keys left out of both softmaxes)."""
    monkeypatch.setenv("KERAS_VIT_ATTENTION", path)
    layer = _built(differential=kind, index=index, qk_norm=qk_norm)
    w = weights_below(layer)
    assert w["sub_norm/gamma"].shape == (HEAD_DIM,)
    x = _inputs(B, N, D)
    want, _ = _differential(x, w, index, kind, qk_norm=qk_norm)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)
    bias = np.zeros((B, 1, 1, N), "float32")
    bias[1, ..., -2:] = -1e9
    want, want_maps = _differential(x, w, index, kind, bias=bias,
                                    qk_norm=qk_norm)
    out, maps = layer(x, return_attention_scores=True, attention_bias=bias)
    np.testing.assert_allclose(_np(out), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_np(maps), want_maps, rtol=RTOL, atol=ATOL)


def test_differential_attention_refuses_an_odd_head_width_naming_it():
    with pytest.raises(ValueError, match="differential='vectors'") as e:
        _built(differential="vectors", input_shape=(B, N, 6))
    assert "= 3 must be even" in str(e.value)


# -- decomposed relative positions (SAM) -------------------------------------

def _decomposed(q, table_h, table_w, rows, cols):
    """bias[b, h, (r, c), (r2, c2)] = q . table_h[r - r2 + rows - 1]
    + q . table_w[c - c2 + cols - 1], pair by pair."""
    b, n, heads, _ = q.shape
    bias = np.zeros((b, heads, n, n))
    for i in range(n):
        for j in range(n):
            (r, c), (r2, c2) = divmod(i, cols), divmod(j, cols)
            bias[:, :, i, j] = (q[:, i] @ table_h[r - r2 + rows - 1]
                                + q[:, i] @ table_w[c - c2 + cols - 1])
    return bias


@pytest.mark.parametrize("rows, cols", [(2, 3), (3, 3), (1, 4)])
def test_decomposed_bias_dots_each_query_with_its_row_and_column_offsets(
        rows, cols):
    rng = np.random.default_rng(rows * cols)
    q = rng.normal(size=(B, rows * cols, HEADS, HEAD_DIM)).astype("float32")
    table_h = rng.normal(size=(2 * rows - 1, HEAD_DIM)).astype("float32")
    table_w = rng.normal(size=(2 * cols - 1, HEAD_DIM)).astype("float32")
    np.testing.assert_allclose(
        _np(kl.decomposed_bias(q, table_h, table_w, (rows, cols))),
        _decomposed(q.astype("float64"), table_h, table_w, rows, cols),
        rtol=RTOL, atol=ATOL)


def test_the_decomposed_tables_add_their_logits_from_the_unscaled_queries():
    """The layer's ``decomposed`` tables: their bias from the queries as
    projected (after the q/k norms), added to the scaled logits."""
    layer = _built(input_shape=(B, 6, D), decomposed=[2, 3], qk_norm=True)
    w = weights_below(layer)
    assert w["rel_pos_h"].shape == (3, HEAD_DIM)
    assert w["rel_pos_w"].shape == (5, HEAD_DIM)
    x = _inputs(B, 6, D)
    q = np.einsum("bnc,chk->bnhk", x, w["query/kernel"]) + w["query/bias"]
    q = _layer_norm(q, w["query_norm/gamma"], w["query_norm/beta"], 1e-6)
    bias = _decomposed(q, w["rel_pos_h"], w["rel_pos_w"], 2, 3)
    want, _ = _attention(x, w, bias, qk_norm="layer")
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)
