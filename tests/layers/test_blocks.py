"""keras_vit.layers.blocks: stochastic depth, the MLP, the pre-LN
encoder block, token pooling, stacked maps, the weight-standardised
convolution and the hybrids' ResNet unit, each against its formula
written out in NumPy here with the layer's own weights read back."""

import math

import keras
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from keras import ops

from keras_vit import layers as kl
from numpy_layers import (GELU as ACTIVATION, conv2d, inputs as _inputs,
                          norm as apply_norm, softmax as _softmax,
                          to_numpy as _np)
from testkit import randomise_weights, weights_below

RTOL, ATOL = 1e-5, 1e-5

B, N, D, HEADS, MLP = 2, 4, 8, 2, 16


def _sub(w, prefix):
    """The weights of the sublayer ``prefix``, by their path below it."""
    return {k[len(prefix) + 1:]: v for k, v in w.items()
            if k.startswith(prefix + "/")}


# -- the formulas ------------------------------------------------------------

def _mlp(x, w, gelu="tanh", kind="gelu"):
    """Dense -> GELU (or SwiGLU's gate) -> Dense."""
    h = x @ w["dense_0/kernel"] + w.get("dense_0/bias", 0.0)
    if kind == "swiglu":
        gate, value = np.split(h, 2, axis=-1)
        h = gate * 1.0 / (1.0 + np.exp(-gate)) * value
    elif kind == "geglu":
        gate, value = np.split(h, 2, axis=-1)
        h = ACTIVATION[gelu](gate) * value
    else:
        h = ACTIVATION[gelu](h)
    return h @ w["dense_1/kernel"] + w.get("dense_1/bias", 0.0)


def _attention(x, w, value_norm=None):
    """Multi-head softmax(q k^T / sqrt(d)) v and the output projection;
    also the probabilities (B, heads, N, N). ``value_norm``: the kind of
    norm without a scale of each head's values."""
    q, k, v = (np.einsum("bnc,chk->bnhk", x, w[f"{p}/kernel"])
               + w.get(f"{p}/bias", 0.0) for p in ("query", "key", "value"))
    if value_norm == "rms":
        v = v / np.sqrt((v ** 2).mean(-1, keepdims=True) + 1e-6)
    elif value_norm == "layer":
        v = v - v.mean(-1, keepdims=True)
        v = v / np.sqrt((v ** 2).mean(-1, keepdims=True) + 1e-6)
    logits = np.einsum("bqhk,bvhk->bhqv", q, k) / math.sqrt(q.shape[-1])
    probs = _softmax(logits)
    context = np.einsum("bhqv,bvhk->bqhk", probs, v)
    return np.einsum("bqhk,hkd->bqd", context, w["out/kernel"]) + w.get(
        "out/bias", 0.0), probs


def _encoder_block(x, w, norm="layer", mlp="gelu", gelu="tanh",
                   branches=(1.0, 1.0), value_norm=False):
    """x + MSA(LN(x)), then x + MLP(LN(x)); each branch times its layer
    scale (when the block has one) and its factor in ``branches``, and
    normed by its ``post_norm_*`` where the block has them (a sandwich)."""
    def normalise(y, weights):
        return apply_norm(norm, y, weights) if weights else y

    y, probs = _attention(normalise(x, _sub(w, "norm_1")),
                          _sub(w, "attention"), value_norm and norm)
    y = normalise(y, _sub(w, "post_norm_1"))
    x = x + y * w.get("layer_scale_1", 1.0) * branches[0]
    y = _mlp(normalise(x, _sub(w, "norm_2")), _sub(w, "mlp"), gelu, mlp)
    y = normalise(y, _sub(w, "post_norm_2"))
    return x + y * w.get("layer_scale_2", 1.0) * branches[1], probs


# -- DropPath ----------------------------------------------------------------

@pytest.mark.parametrize("training", [None, False])
def test_drop_path_is_the_identity_outside_training(training):
    x = _inputs(3, N, D)
    np.testing.assert_array_equal(
        _np(kl.DropPath(0.5)(x, training=training)), x)


def test_drop_path_of_rate_zero_is_the_identity_in_training():
    x = _inputs(3, N, D)
    np.testing.assert_array_equal(_np(kl.DropPath(0.0)(x, training=True)),
                                  x)


def test_drop_path_drops_whole_examples_and_rescales_the_kept_ones():
    rate, batch = 0.25, 4000
    x = np.ones((batch, 2, 3), "float32")
    y = _np(kl.DropPath(rate, seed=0)(x, training=True))
    per_example = y.reshape(batch, -1)
    # One decision per example: all its values dropped, or all kept and
    # scaled by 1 / (1 - rate).
    kept = np.all(np.isclose(per_example, 1.0 / (1.0 - rate)), axis=1)
    dropped = np.all(per_example == 0.0, axis=1)
    assert np.all(kept | dropped)
    # 4000 draws: the kept fraction within 4 standard deviations (0.027).
    assert abs(kept.mean() - (1.0 - rate)) < 0.03
    # The expectation is kept: mean output about 1.
    assert abs(y.mean() - 1.0) < 0.04


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_drop_path_refuses_a_rate_outside_zero_to_one(rate):
    with pytest.raises(ValueError, match=f"rate={rate!r}"):
        kl.DropPath(rate)


def test_drop_path_config_round_trips():
    config = kl.DropPath(0.3, seed=7, name="dp").get_config()
    assert config["rate"] == 0.3 and config["seed"] == 7
    rebuilt = kl.DropPath.from_config(config)
    assert (rebuilt.rate, rebuilt.seed, rebuilt.name) == (0.3, 7, "dp")


# -- MlpBlock ----------------------------------------------------------------

def _built_mlp(**kwargs):
    layer = kl.MlpBlock(MLP, **kwargs)
    layer.build((B, N, D))
    randomise_weights(layer)
    return layer


@pytest.mark.parametrize("gelu", ["tanh", "exact", "quick"])
def test_mlp_block_is_dense_gelu_dense(gelu):
    layer = _built_mlp(gelu=gelu)
    x = _inputs(B, N, D)
    got = _np(layer(x))
    assert got.shape == (B, N, D)
    np.testing.assert_allclose(
        got, _mlp(x.astype("float64"), weights_below(layer), gelu),
        rtol=RTOL, atol=ATOL)


def test_mlp_block_without_bias_has_kernels_only():
    layer = _built_mlp(use_bias=False)
    w = weights_below(layer)
    assert set(w) == {"dense_0/kernel", "dense_1/kernel"}
    x = _inputs(B, N, D)
    np.testing.assert_allclose(_np(layer(x)), _mlp(x.astype("float64"), w),
                               rtol=RTOL, atol=ATOL)


def test_swiglu_mlp_gates_a_double_width_projection():
    layer = _built_mlp(kind="swiglu")
    w = weights_below(layer)
    assert w["dense_0/kernel"].shape == (D, 2 * MLP)
    assert w["dense_1/kernel"].shape == (MLP, D)
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(layer(x)), _mlp(x.astype("float64"), w, kind="swiglu"),
        rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("gelu", ["tanh", "exact"])
def test_geglu_mlp_gates_a_double_width_projection_through_the_gelu(gelu):
    layer = _built_mlp(kind="geglu", gelu=gelu, use_bias=False)
    w = weights_below(layer)
    assert w["dense_0/kernel"].shape == (D, 2 * MLP)
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(layer(x)), _mlp(x.astype("float64"), w, gelu, kind="geglu"),
        rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", ["gelu", "geglu"])
def test_a_clipped_mlp_clamps_each_projections_input_and_output(kind):
    layer = _built_mlp(kind=kind, clip=True)
    rows = 3 if kind == "geglu" else 2
    rng = np.random.default_rng(2)
    bounds = np.stack([rng.uniform(-1.0, -0.1, rows),
                       rng.uniform(0.1, 1.0, rows),
                       rng.uniform(-1.0, -0.1, rows),
                       rng.uniform(0.1, 1.0, rows)], -1).astype("float32")
    layer.clip_bounds.assign(bounds)
    w = weights_below(layer)
    x = _inputs(B, N, D).astype("float64")

    def linear(y, name, row, cols=slice(None)):
        y = np.clip(y, bounds[row, 0], bounds[row, 1])
        y = y @ w[f"{name}/kernel"][:, cols] + w[f"{name}/bias"][cols]
        return np.clip(y, bounds[row, 2], bounds[row, 3])

    if kind == "geglu":
        h = (ACTIVATION["tanh"](linear(x, "dense_0", 0, slice(0, MLP)))
             * linear(x, "dense_0", 1, slice(MLP, None)))
    else:
        h = ACTIVATION["tanh"](linear(x, "dense_0", 0))
    want = linear(h, "dense_1", rows - 1)
    np.testing.assert_allclose(_np(layer(x.astype("float32"))), want,
                               rtol=RTOL, atol=ATOL)
    assert not layer.clip_bounds.trainable


def test_mlp_block_dropout_acts_in_training_only():
    layer = _built_mlp(dropout_rate=0.5)
    x = _inputs(B, N, D)
    want = _mlp(x.astype("float64"), weights_below(layer))
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)
    assert not np.allclose(_np(layer(x, training=True)), want, atol=1e-3)


@pytest.mark.parametrize("kwargs, named", [
    ({"gelu": "relu"}, "gelu='relu'"), ({"kind": "reglu"}, "mlp='reglu'")])
def test_mlp_block_refuses_unknown_forms_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named):
        kl.MlpBlock(MLP, **kwargs)


def test_mlp_block_config_round_trips():
    layer = kl.MlpBlock(MLP, dropout_rate=0.1, gelu="quick", use_bias=False,
                        kind="swiglu", name="mlp")
    config = layer.get_config()
    for key, value in {"mlp_dim": MLP, "dropout_rate": 0.1, "gelu": "quick",
                       "use_bias": False, "kind": "swiglu"}.items():
        assert config[key] == value, key
    rebuilt = kl.MlpBlock.from_config(config)
    rebuilt.build((B, N, D))
    randomise_weights(rebuilt)
    x = _inputs(B, N, D)
    np.testing.assert_allclose(
        _np(rebuilt(x)),
        _mlp(x.astype("float64"), weights_below(rebuilt), kind="swiglu"),
        rtol=RTOL, atol=ATOL)


# -- EncoderBlock ------------------------------------------------------------

def _built_block(**kwargs):
    layer = kl.EncoderBlock(HEADS, MLP, **kwargs)
    layer.build((B, N, D))
    randomise_weights(layer)
    return layer


@pytest.mark.parametrize("kwargs", [
    {},
    {"gelu": "exact"},
    {"norm": "rms"},
    {"mlp": "swiglu"},
    {"layer_scale": 0.1},
    # Gemma 4's: four norms, the values normed, GeGLU, no biases.
    {"norm": "rms", "sandwich_norm": True, "value_norm": True,
     "mlp": "geglu", "qkv_bias": False, "proj_bias": False},
    {"sandwich_norm": True, "value_norm": True},
])
def test_encoder_block_is_pre_ln_attention_then_mlp(kwargs):
    layer = _built_block(**kwargs)
    x = _inputs(B, N, D)
    want, _ = _encoder_block(
        x.astype("float64"), weights_below(layer), norm=kwargs.get("norm", "layer"),
        mlp=kwargs.get("mlp", "gelu"), gelu=kwargs.get("gelu", "tanh"),
        value_norm=kwargs.get("value_norm", False))
    got = _np(layer(x))
    assert got.shape == (B, N, D)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("count, kwargs", [
    (2, {"layer_scale": 0.1}), (3, {}), (2, {"mlp": "swiglu", "norm": "rms"})])
def test_a_block_of_branches_sums_its_attentions_then_its_mlps(count, kwargs):
    """timm's ParallelThingsBlock: x + sum_b attention_b(norm_1_b(x)), then
    the same for the MLPs, each branch with its own norms and layer
    scales (branch b's weights under ``branch_{b}_``); the scores: every
    branch's heads, the first branch's first."""
    layer = _built_block(branches=count, **kwargs)
    w = weights_below(layer)
    norm = kwargs.get("norm", "layer")

    def branch(b):
        """Branch b's weights by the block's own names."""
        if b == 0:
            return {k: v for k, v in w.items() if not k.startswith("branch_")}
        prefix = f"branch_{b}_"
        return {k[len(prefix):]: v for k, v in w.items()
                if k.startswith(prefix)}

    x = _inputs(B, N, D).astype("float64")
    attentions = [_attention(apply_norm(norm, x, _sub(branch(b), "norm_1")),
                             _sub(branch(b), "attention"))
                  for b in range(count)]
    h = x + sum(y * branch(b).get("layer_scale_1", 1.0)
                for b, (y, _) in enumerate(attentions))
    want = h + sum(
        _mlp(apply_norm(norm, h, _sub(branch(b), "norm_2")),
             _sub(branch(b), "mlp"), kind=kwargs.get("mlp", "gelu"))
        * branch(b).get("layer_scale_2", 1.0) for b in range(count))
    out, scores = layer(_inputs(B, N, D), return_attention_scores=True)
    np.testing.assert_allclose(_np(out), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        _np(scores), np.concatenate([p for _, p in attentions], axis=1),
        rtol=RTOL, atol=ATOL)
    config = layer.get_config()
    assert config["branches"] == count
    assert kl.EncoderBlock.from_config(config).get_config() == config


def test_encoder_block_layer_scales_start_at_their_value():
    layer = kl.EncoderBlock(HEADS, MLP, layer_scale=0.25)
    layer.build((B, N, D))
    w = weights_below(layer)
    np.testing.assert_array_equal(w["layer_scale_1"], np.full(D, 0.25))
    np.testing.assert_array_equal(w["layer_scale_2"], np.full(D, 0.25))
    assert "layer_scale_1" not in weights_below(_built_block())


def test_encoder_block_returns_its_attention_maps():
    layer = _built_block()
    x = _inputs(B, N, D)
    want, want_probs = _encoder_block(x.astype("float64"), weights_below(layer))
    out, scores = layer(x, return_attention_scores=True)
    assert tuple(scores.shape) == (B, HEADS, N, N)
    np.testing.assert_allclose(_np(out), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_np(scores), want_probs, rtol=RTOL,
                               atol=ATOL)


def test_a_rematerialised_block_trains_on_the_same_numbers():
    layer = _built_block(remat=True)
    x = _inputs(B, N, D)
    want, _ = _encoder_block(x.astype("float64"), weights_below(layer))
    np.testing.assert_allclose(_np(layer(x, training=True)), want,
                               rtol=RTOL, atol=ATOL)


def test_encoder_block_drop_path_drops_each_examples_branches():
    rate, batch = 0.5, 16
    layer = kl.EncoderBlock(HEADS, MLP, drop_path_rate=rate)
    layer.build((batch, N, D))
    randomise_weights(layer)
    w = weights_below(layer)
    x = _inputs(batch, N, D).astype("float64")
    np.testing.assert_allclose(_np(layer(x.astype("float32"))),
                               _encoder_block(x, w)[0], rtol=RTOL, atol=ATOL)
    got = _np(layer(x.astype("float32"), training=True))
    # In training each branch of each example is dropped or kept and
    # scaled by 1 / (1 - rate): one of four outputs.
    seen = set()
    for i in range(batch):
        candidates = {
            (a, m): _encoder_block(x[i:i + 1], w, branches=(a, m))[0][0]
            for a in (0.0, 2.0) for m in (0.0, 2.0)}
        match = [key for key, want in candidates.items()
                 if np.allclose(got[i], want, rtol=RTOL, atol=ATOL)]
        assert match, f"example {i} is none of the four outputs"
        seen.update(match)
    # 16 examples: both branches were dropped somewhere and kept elsewhere.
    assert {a for a, _ in seen} == {0.0, 2.0}
    assert {m for _, m in seen} == {0.0, 2.0}


@pytest.mark.parametrize("kwargs, named", [
    ({"remat": 1}, "remat=1"), ({"mlp": "reglu"}, "mlp='reglu'"),
    ({"norm": "batch"}, "norm='batch'"), ({"gelu": "relu"}, "gelu='relu'")])
def test_encoder_block_refuses_bad_arguments_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named):
        kl.EncoderBlock(HEADS, MLP, **kwargs)


def test_check_remat_takes_booleans_only():
    assert kl.check_remat(True) is True and kl.check_remat(False) is False
    with pytest.raises(ValueError, match="remat='yes'"):
        kl.check_remat("yes")


def test_encoder_block_config_round_trips_with_the_mlp_kind():
    layer = kl.EncoderBlock(
        HEADS, MLP, dropout_rate=0.1, attention_dropout_rate=0.2,
        layer_norm_epsilon=1e-5, gelu="exact", remat=True, layer_scale=0.5,
        qk_norm=True, qkv_bias=False, proj_bias=False, drop_path_rate=0.3,
        mlp="swiglu", norm="rms", name="block")
    config = layer.get_config()
    want = {"num_heads": HEADS, "mlp_dim": MLP, "dropout_rate": 0.1,
            "attention_dropout_rate": 0.2, "layer_norm_epsilon": 1e-5,
            "gelu": "exact", "remat": True, "layer_scale": 0.5,
            "qk_norm": True, "qkv_bias": False, "proj_bias": False,
            "drop_path_rate": 0.3, "mlp": "swiglu", "norm": "rms"}
    for key, value in want.items():
        assert config[key] == value, key
    rebuilt = kl.EncoderBlock.from_config(config)
    assert rebuilt.mlp.kind == "swiglu" and rebuilt.mlp_kind == "swiglu"
    assert isinstance(rebuilt.norm_1, kl.RMSNormalization)
    assert rebuilt.attention.qk_norm and not rebuilt.attention.qkv_bias
    assert isinstance(rebuilt.drop_path, kl.DropPath)


# -- TokenPooling and StackScores --------------------------------------------

TOKENS = np.arange(2 * 5 * 3, dtype="float32").reshape(2, 5, 3) ** 1.5 % 7


@pytest.mark.parametrize("method, prefix, index, want", [
    ("token", 0, 0, TOKENS[:, 0]),
    ("token", 2, 1, TOKENS[:, 1]),
    ("gap", 0, 0, TOKENS.mean(1)),
    ("gap", 1, 0, TOKENS[:, 1:].mean(1)),
    ("max", 0, 0, TOKENS.max(1)),
    ("max", 2, 0, TOKENS[:, 2:].max(1)),
    ("avgmax", 1, 0, (TOKENS[:, 1:].mean(1) + TOKENS[:, 1:].max(1)) / 2),
    ("token_gap", 3, 0, np.concatenate([TOKENS[:, 0], TOKENS[:, 3:].mean(1)],
                                       -1)),
])
def test_token_pooling_pools_as_its_method_says(method, prefix, index, want):
    layer = kl.TokenPooling(method, num_prefix_tokens=prefix, index=index)
    got = _np(layer(TOKENS))
    width = 6 if method == "token_gap" else 3
    assert got.shape == (2, width)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert layer.compute_output_shape((None, 5, 3)) == (None, width)


def test_token_pooling_refuses_an_unknown_method_naming_it():
    assert kl.POOLING_METHODS == ("token", "gap", "max", "avgmax",
                                  "token_gap")
    with pytest.raises(ValueError, match="method='mean'"):
        kl.TokenPooling("mean")


def test_token_pooling_config_round_trips():
    config = kl.TokenPooling("avgmax", num_prefix_tokens=2,
                             index=1).get_config()
    assert (config["method"], config["num_prefix_tokens"],
            config["index"]) == ("avgmax", 2, 1)
    rebuilt = kl.TokenPooling.from_config(config)
    np.testing.assert_allclose(
        _np(rebuilt(TOKENS)),
        (TOKENS[:, 2:].mean(1) + TOKENS[:, 2:].max(1)) / 2,
        rtol=RTOL, atol=ATOL)


def test_stack_scores_stacks_the_maps_on_a_layers_axis():
    maps = [_inputs(B, HEADS, N, N, seed=s) for s in range(3)]
    got = _np(kl.StackScores()(maps))
    assert got.shape == (B, 3, HEADS, N, N)
    for i, m in enumerate(maps):
        np.testing.assert_array_equal(got[:, i], m)
    shape = kl.StackScores().compute_output_shape([(None, HEADS, N, N)] * 3)
    assert shape == (None, 3, HEADS, N, N)


# -- StdConv2D and ResidualUnit ----------------------------------------------

def _standardised(kernel, kind, eps):
    mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
    std = kernel.std(axis=(0, 1, 2), keepdims=True)
    if kind == "std":
        return (kernel - mean) / (std + eps)
    return (kernel - mean) / np.sqrt(std ** 2 + eps)


@pytest.mark.parametrize("kind, eps", [
    ("var", 1e-10), ("std", 1e-5), ("var", 0.5), ("std", 0.5)])
def test_std_conv_standardises_its_kernel_per_output_channel(kind, eps):
    # A large epsilon tells (w - mean) / (std + eps) from / sqrt(var + eps).
    layer = kl.StdConv2D(4, 3, standardization=kind, eps=eps)
    layer.build((None, 5, 5, 3))
    kernel = _inputs(3, 3, 3, 4) * 2.0 + 1.0
    want = _standardised(kernel.astype("float64"), kind, eps)
    got = _np(layer.standardized_kernel(ops.convert_to_tensor(kernel)))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [1, 2])
def test_std_conv_convolves_with_the_standardised_kernel(stride):
    layer = kl.StdConv2D(4, 3, strides=stride, padding="same",
                         use_bias=False, standardization="std", eps=1e-5)
    x = _inputs(2, 5, 5, 3)
    layer.build(x.shape)
    randomise_weights(layer)
    kernel = weights_below(layer)["kernel"]
    want = conv2d(x.astype("float64"),
                  _standardised(kernel, "std", 1e-5), stride, "same")
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)


def test_std_conv_refuses_an_unknown_standardization_naming_it():
    with pytest.raises(ValueError, match="standardization='l2'"):
        kl.StdConv2D(4, 3, standardization="l2")


def test_std_conv_config_round_trips():
    layer = kl.StdConv2D(4, 3, standardization="std", eps=1e-5)
    config = layer.get_config()
    assert config["standardization"] == "std" and config["eps"] == 1e-5
    rebuilt = kl.StdConv2D.from_config(config)
    assert (rebuilt.standardization, rebuilt.eps, rebuilt.filters) == (
        "std", 1e-5, 4)


def _group_norm(x, w, groups, eps):
    b, h, wd, c = x.shape
    g = x.reshape(b, h, wd, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(x.shape) * w["gamma"] + w["beta"]


def _residual_unit(x, w, stride, groups, eps=1e-6, std_eps=1e-5):
    """The post-activation bottleneck of vit_jax's hybrid ResNet."""
    def conv(name, y, s):
        kernel = _standardised(w[f"{name}/kernel"], "std", std_eps)
        return conv2d(y, kernel, s, "same")

    def gn(name, y):
        return _group_norm(y, _sub(w, name), groups, eps)

    residual = x
    if "conv_proj/kernel" in w:
        residual = gn("gn_proj", conv("conv_proj", x, stride))
    y = np.maximum(gn("gn1", conv("conv1", x, 1)), 0)
    y = np.maximum(gn("gn2", conv("conv2", y, stride)), 0)
    y = gn("gn3", conv("conv3", y, 1))
    return np.maximum(residual + y, 0)


@pytest.mark.parametrize("channels, stride, projects", [
    (8, 1, False), (3, 1, True), (8, 2, True)])
def test_residual_unit_is_the_post_activation_bottleneck(channels, stride,
                                                         projects):
    layer = kl.ResidualUnit(2, strides=stride, groups=2)
    x = _inputs(2, 4, 4, channels)
    layer.build(x.shape)
    randomise_weights(layer)
    w = weights_below(layer)
    assert ("conv_proj/kernel" in w) == projects
    want = _residual_unit(x.astype("float64"), w, stride, groups=2)
    got = _np(layer(x))
    assert got.shape == (2, 4 // stride, 4 // stride, 8)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_fresh_residual_unit_passes_its_shortcut_through_a_relu():
    # The last GroupNorm's scale starts at zero: the residual branch adds
    # nothing until it is trained.
    keras.utils.set_random_seed(0)
    layer = kl.ResidualUnit(2, groups=2)
    x = _inputs(2, 4, 4, 8)
    np.testing.assert_allclose(_np(layer(x)), np.maximum(x, 0), rtol=RTOL,
                               atol=ATOL)


def test_residual_unit_config_round_trips():
    layer = kl.ResidualUnit(4, strides=2, groups=2, epsilon=1e-5,
                            standardization="var", std_eps=1e-8, remat=True)
    config = layer.get_config()
    want = {"features": 4, "strides": 2, "groups": 2, "epsilon": 1e-5,
            "standardization": "var", "std_eps": 1e-8, "remat": True}
    for key, value in want.items():
        assert config[key] == value, key
    rebuilt = kl.ResidualUnit.from_config(config)
    assert all(getattr(rebuilt, k) == v for k, v in want.items())


@pytest.mark.backends
@pytest.mark.parametrize("form, proj_bias", [
    ("split", True), ("fused", True), ("split", False)])
def test_a_parallel_block_adds_both_branches_of_one_norm(form, proj_bias):
    """x + ls(MSA(LN(x)) + MLP(LN(x))): no second norm, one layer scale;
    the fused form's MLP leaves its output bias to the attention's, and
    the MLP's first bias stays whatever proj_bias says."""
    layer = _built_block(parallel=form, layer_scale=0.1,
                         proj_bias=proj_bias)
    w = weights_below(layer)
    assert not any(k.startswith(("norm_2", "layer_scale_2")) for k in w)
    assert "mlp/dense_0/bias" in w
    assert ("mlp/dense_1/bias" in w) == (proj_bias and form == "split")
    x = _inputs(B, N, D).astype("float64")
    h = apply_norm("layer", x, _sub(w, "norm_1"))
    y = _attention(h, _sub(w, "attention"))[0] + _mlp(h, _sub(w, "mlp"))
    want = x + y * w["layer_scale_1"]
    np.testing.assert_allclose(_np(layer(x.astype("float32"))), want,
                               rtol=RTOL, atol=ATOL)


# -- windows and SAM's neck ----------------------------------------------------

@settings(max_examples=40, deadline=None, derandomize=True)
@given(grid=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       window=st.integers(1, 6))
@example(grid=(4, 4), window=2)
@example(grid=(4, 5), window=3)
@example(grid=(2, 3), window=4)
@example(grid=(3, 3), window=3)
def test_window_partition_tiles_the_padded_map_and_merge_undoes_it(
        grid, window):
    """Any grid, any window (one that divides neither side, one larger
    than the map): window (b, i, j) holds the map's rows i * w .. and
    columns j * w .. row-major, zeros past the map's edge; merging gives
    the map back."""
    rows, cols = grid
    x = _inputs(B, rows * cols, D)
    windows = _np(kl.blocks.window_partition(x, grid, window))
    padded = np.zeros((B, -(-rows // window) * window,
                       -(-cols // window) * window, D), "float32")
    padded[:, :rows, :cols] = x.reshape(B, rows, cols, D)
    across = padded.shape[2] // window
    for n, found in enumerate(windows):
        b, rest = divmod(n, (padded.shape[1] // window) * across)
        i, j = divmod(rest, across)
        want = padded[b, i * window:(i + 1) * window,
                      j * window:(j + 1) * window]
        np.testing.assert_array_equal(found, want.reshape(-1, D))
    np.testing.assert_array_equal(
        _np(kl.blocks.window_merge(windows, grid, window)), x)


def test_a_windowed_block_attends_within_each_padded_window():
    """x + attention over each window of norm_1(x) (zeros padded after
    the norm take part as keys), then the MLP over every token."""
    grid, window = (3, 3), 2
    block = kl.EncoderBlock(HEADS, MLP, window_size=window, grid_size=grid,
                            decomposed_bias=True)
    x = _inputs(B, 9, D)
    block(x)
    randomise_weights(block)
    w = weights_below(block)
    attention = block.attention
    h = apply_norm("layer", x, _sub(w, "norm_1"))
    windows = _np(kl.blocks.window_partition(h, grid, window))
    y = _np(attention(windows))
    # The attention of one window alone is the layer's on that window.
    np.testing.assert_allclose(_np(attention(windows[1:2])), y[1:2],
                               rtol=RTOL, atol=ATOL)
    x1 = x + _np(kl.blocks.window_merge(y, grid, window))
    want = x1 + _mlp(apply_norm("layer", x1, _sub(w, "norm_2")),
                     _sub(w, "mlp"))
    np.testing.assert_allclose(_np(block(x)), want, rtol=RTOL, atol=ATOL)
    assert w["attention/rel_pos_h"].shape == (2 * window - 1, D // HEADS)


def test_a_block_without_its_grid_refuses_windows_naming_it():
    with pytest.raises(ValueError, match="grid_size") as refused:
        kl.EncoderBlock(HEADS, MLP, window_size=2)
    assert "\n" not in str(refused.value)
