"""keras_vit.layers.pooling_head: multihead attention pooling (MAP) from
a learned probe, then the pre-LN residual MLP, against the formula
written out in NumPy with the layer's own weights read back."""

import math

import numpy as np
import pytest

from keras_vit import layers as kl
from numpy_layers import GELU, inputs as _inputs, to_numpy as _np
from testkit import randomise_weights, weights_below

RTOL, ATOL = 1e-5, 1e-5

B, N, D, HEADS, MLP = 2, 5, 8, 2, 16


def _map_head(x, w, heads, gelu="tanh", norm="layer", eps=1e-6, prefix=0):
    """big_vision's MAPHead: the probe's softmax(q k^T / sqrt(d)) v per
    head, the output projection, then y + MLP(norm(y)); per image, by
    loops over the heads."""
    x = x.astype("float64")[:, prefix:]
    probe = w["probe"][0]  # (1, D)
    head_dim = x.shape[-1] // heads
    y = np.zeros((x.shape[0], 1, x.shape[-1]))
    for h in range(heads):
        q = probe @ w["query/kernel"][:, h] + w["query/bias"][h]
        k = x @ w["key/kernel"][:, h] + w["key/bias"][h]
        v = x @ w["value/kernel"][:, h] + w["value/bias"][h]
        logits = np.einsum("qk,bvk->bqv", q, k) / math.sqrt(head_dim)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        probs = e / e.sum(-1, keepdims=True)
        y += probs @ v @ w["out/kernel"][h]
    y += w["out/bias"]
    if norm == "layer":
        mean = y.mean(-1, keepdims=True)
        var = ((y - mean) ** 2).mean(-1, keepdims=True)
        n = (y - mean) / np.sqrt(var + eps) * w["norm/gamma"] + w[
            "norm/beta"]
    else:
        n = y / np.sqrt((y ** 2).mean(-1, keepdims=True) + eps) * w[
            "norm/gamma"]
    h = GELU[gelu](n @ w["mlp/dense_0/kernel"] + w["mlp/dense_0/bias"])
    y = y + h @ w["mlp/dense_1/kernel"] + w["mlp/dense_1/bias"]
    return y[:, 0]


def _built(n=N, heads=HEADS, **kwargs):
    layer = kl.AttentionPoolHead(heads, MLP, **kwargs)
    layer.build((None, n, D))
    randomise_weights(layer)
    return layer


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_attention_pool_is_the_probes_attention_then_a_residual_mlp(heads):
    layer = _built(heads=heads)
    x = _inputs(B, N, D)
    got = _np(layer(x))
    assert got.shape == (B, D)
    np.testing.assert_allclose(got, _map_head(x, weights_below(layer), heads),
                               rtol=RTOL, atol=ATOL)
    assert layer.compute_output_shape((None, N, D)) == (None, D)


@pytest.mark.parametrize("gelu", ["exact", "quick"])
def test_attention_pool_mlp_uses_its_gelu_form(gelu):
    layer = _built(gelu=gelu)
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(layer(x)), _map_head(x, weights_below(layer), HEADS, gelu=gelu),
        rtol=RTOL, atol=ATOL)


def test_attention_pool_with_rms_norm_divides_by_the_root_mean_square():
    layer = _built(norm="rms", layer_norm_epsilon=1e-3)
    w = weights_below(layer)
    assert "norm/gamma" in w and "norm/beta" not in w
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(layer(x)), _map_head(x, w, HEADS, norm="rms", eps=1e-3),
        rtol=RTOL, atol=ATOL)


def test_attention_pool_leaves_the_prefix_tokens_out_of_the_keys():
    layer = _built(n=N, num_prefix_tokens=2)
    x = _inputs(B, N, D)
    w = weights_below(layer)
    want = _map_head(x, w, HEADS, prefix=2)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)
    # The prefix tokens change nothing.
    x2 = x.copy()
    x2[:, :2] = _inputs(B, 2, D, seed=9)
    np.testing.assert_allclose(_np(layer(x2)), want, rtol=RTOL, atol=ATOL)


def test_attention_pool_is_the_same_in_training():
    # No dropout: the training call computes the same function.
    layer = _built()
    x = _inputs(B, N, D)
    np.testing.assert_allclose(_np(layer(x, training=True)),
                               _map_head(x, weights_below(layer), HEADS),
                               rtol=RTOL, atol=ATOL)


def test_attention_pool_pools_any_number_of_tokens():
    layer = kl.AttentionPoolHead(HEADS, MLP)
    layer.build((None, None, D))
    randomise_weights(layer)
    for n in (2, 3, 6):
        x = _inputs(B, n, D, seed=n)
        np.testing.assert_allclose(_np(layer(x)),
                                   _map_head(x, weights_below(layer), HEADS),
                                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kwargs, named", [
    ({"num_heads": 0}, "num_heads=0"),
    ({"mlp_dim": 0}, "mlp_dim=0"),
    ({"num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
    ({"gelu": "relu"}, "gelu='relu'"),
    ({"norm": "batch"}, "norm='batch'"),
])
def test_attention_pool_refuses_bad_arguments_naming_them(kwargs, named):
    arguments = {"num_heads": HEADS, "mlp_dim": MLP, **kwargs}
    with pytest.raises(ValueError, match=named):
        kl.AttentionPoolHead(**arguments)


def test_attention_pool_refuses_a_width_the_heads_do_not_divide():
    layer = kl.AttentionPoolHead(3, MLP)
    with pytest.raises(ValueError, match="hidden size 8 .*num_heads=3"):
        layer.build((None, N, D))


def test_attention_pool_config_round_trips():
    layer = kl.AttentionPoolHead(HEADS, MLP, gelu="exact",
                                 layer_norm_epsilon=1e-5,
                                 num_prefix_tokens=1, norm="rms")
    config = layer.get_config()
    want = {"num_heads": HEADS, "mlp_dim": MLP, "gelu": "exact",
            "layer_norm_epsilon": 1e-5, "num_prefix_tokens": 1,
            "norm": "rms"}
    for key, value in want.items():
        assert config[key] == value, key
    rebuilt = kl.AttentionPoolHead.from_config(config)
    rebuilt.build((None, N, D))
    randomise_weights(rebuilt)
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(rebuilt(x)),
        _map_head(x, weights_below(rebuilt), HEADS, gelu="exact", norm="rms",
                  eps=1e-5, prefix=1),
        rtol=RTOL, atol=ATOL)


def test_sams_neck_is_two_convolutions_each_layer_normed():
    """1 x 1 convolution, LayerNorm (epsilon 1e-6) over the channels,
    3 x 3 convolution with zero padding, LayerNorm; no biases."""
    from numpy_layers import conv2d, layer_norm

    grid, channels = (3, 4), 6
    neck = kl.Neck(grid, channels)
    x = _inputs(2, 12, 8)
    neck(x)
    randomise_weights(neck)
    w = weights_below(neck)
    assert set(w) == {"conv_0/kernel", "conv_1/kernel", "norm_0/gamma",
                      "norm_0/beta", "norm_1/gamma", "norm_1/beta"}
    y = x.reshape(2, 3, 4, 8).astype("float64")
    y = layer_norm(conv2d(y, w["conv_0/kernel"], 1), w["norm_0/gamma"],
                   w["norm_0/beta"], 1e-6)
    y = layer_norm(conv2d(y, w["conv_1/kernel"], 1, "same"),
                   w["norm_1/gamma"], w["norm_1/beta"], 1e-6)
    np.testing.assert_allclose(_np(neck(x)), y.reshape(2, 12, channels),
                               rtol=1e-5, atol=1e-5)


# -- SoftTokenPool -------------------------------------------------------------

@pytest.mark.parametrize("grid, kernel, standardize", [
    ((2, 4), 2, False), ((6, 3), 3, True), ((2, 2), 1, True)])
def test_soft_token_pool_averages_each_cell_times_the_root_width(
        grid, kernel, standardize):
    from keras_vit.layers import SoftTokenPool

    rows, cols = grid
    x = np.random.default_rng(0).normal(
        size=(2, rows * cols, 5)).astype("float32")
    layer = SoftTokenPool(grid, kernel, standardize)
    layer.build(x.shape)
    randomise_weights(layer)
    w = weights_below(layer)
    want = []
    for r in range(0, rows, kernel):  # the cells row by row
        for c in range(0, cols, kernel):
            cell = [x[:, i * cols + j] for i in range(r, r + kernel)
                    for j in range(c, c + kernel)]
            want.append(np.mean(cell, axis=0) * np.sqrt(5))
    want = np.stack(want, axis=1)
    if standardize:
        want = (want - w["std_bias"]) * w["std_scale"]
    np.testing.assert_allclose(_np(layer(x)), want, rtol=1e-5, atol=1e-5)


def test_soft_token_pool_refuses_a_grid_its_cells_do_not_tile():
    from keras_vit.layers import SoftTokenPool

    with pytest.raises(ValueError, match=r"soft_pool=3 .* 4 x 6"):
        SoftTokenPool((4, 6), 3)
