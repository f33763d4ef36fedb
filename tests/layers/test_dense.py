"""keras_vit.layers.dense: the GELU forms, SwiGLU, the fused Dense,
EinsumDense, Conv2D and LayerNorm, RMSNorm and the argument checks,
each against its formula written out in NumPy here."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers as kl
from numpy_layers import (GELU as NP_GELU, conv2d as _conv_valid,
                          gelu_exact as _gelu_exact, gelu_tanh as _gelu_tanh,
                          inputs as _inputs, layer_norm as _layer_norm,
                          rms_norm as _rms_norm, to_numpy as _np)
from keras_vit.layers import dense

RTOL, ATOL = 1e-5, 1e-6


def _randomise(layer, seed=1):
    """Every weight of ``layer`` drawn anew, so that a bias, a scale or an
    offset left at its initial zero or one cannot hide a missing term."""
    rng = np.random.default_rng(seed)
    for var in layer.weights:
        var.assign(rng.normal(size=tuple(var.shape)).astype("float32"))


def _weight(layer, name):
    """The value of ``layer``'s weight whose path ends with ``name``."""
    (var,) = [v for v in layer.weights if v.path.endswith("/" + name)]
    return _np(var.value).astype("float64")


# The three activations, from their papers' formulas, in float64.
# Points spanning the GELU's bend and both tails.
X = np.linspace(-6.0, 6.0, 49).astype("float32")


@pytest.mark.parametrize("form", ["tanh", "exact", "quick"])
def test_gelu_computes_the_formula_of_each_form(form):
    got = _np(kl.gelu(ops.convert_to_tensor(X), form))
    np.testing.assert_allclose(got, NP_GELU[form](X.astype("float64")),
                               rtol=RTOL, atol=ATOL)


def test_gelu_defaults_to_the_tanh_form():
    got = _np(kl.gelu(ops.convert_to_tensor(X)))
    np.testing.assert_allclose(got, _gelu_tanh(X.astype("float64")),
                               rtol=RTOL, atol=ATOL)


def test_the_tanh_and_exact_forms_differ_as_documented():
    # The docstring's figures: exact - tanh at -1 and 0.5. The forms
    # must not collapse into one.
    x = ops.convert_to_tensor(np.array([-1.0, 0.5], "float32"))
    diff = _np(kl.gelu(x, "exact")) - _np(kl.gelu(x, "tanh"))
    want = _gelu_exact(np.array([-1.0, 0.5])) - _gelu_tanh(
        np.array([-1.0, 0.5]))
    # A difference of two float32 values near 0.16 keeps about three
    # digits: hence rtol=0.02.
    np.testing.assert_allclose(diff, want, rtol=0.02)
    assert abs(diff[0]) > 1e-4


def test_gelu_tanh_is_the_tanh_formula():
    got = _np(kl.gelu_tanh(ops.convert_to_tensor(X)))
    np.testing.assert_allclose(got, _gelu_tanh(X.astype("float64")),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("form", ["tanh", "exact", "quick"])
def test_each_mlp_activation_computes_its_gelu_form(form):
    got = _np(kl.MLP_GELU[form](ops.convert_to_tensor(X)))
    np.testing.assert_allclose(got, NP_GELU[form](X.astype("float64")),
                               rtol=RTOL, atol=ATOL)


def test_the_mlp_activations_are_the_gelu_forms_and_quick():
    assert kl.GELU_FORMS == ("tanh", "exact")
    assert kl.MLP_ACTIVATIONS == ("tanh", "exact", "quick")
    assert set(kl.MLP_GELU) == set(kl.MLP_ACTIVATIONS)


def test_gated_gates_the_second_half_by_the_activation_of_the_first():
    h = _inputs(3, 8)
    gate, value = h[:, :4].astype("float64"), h[:, 4:].astype("float64")
    want = gate / (1.0 + np.exp(-gate)) * value
    got = _np(dense.gated(ops.convert_to_tensor(h), ops.silu))
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_add_bias_adds_over_the_last_axis():
    h, bias = _inputs(2, 3, 4), _inputs(4, seed=1)
    got = _np(kl.add_bias(ops.convert_to_tensor(h),
                          ops.convert_to_tensor(bias)))
    np.testing.assert_allclose(got, h + bias[None, None], rtol=RTOL,
                               atol=ATOL)


# -- the checks --------------------------------------------------------------

@pytest.mark.parametrize("check, name, good, bad", [
    (kl.check_gelu, "gelu", "quick", "relu"),
    (kl.check_norm, "norm", "rms", "batch"),
    (dense.check_mlp, "mlp", "geglu", "reglu"),
])
def test_each_check_returns_a_choice_and_refuses_naming_the_argument(
        check, name, good, bad):
    assert check(good) == good
    with pytest.raises(ValueError, match=f"{name}={bad!r}"):
        check(bad)


def test_the_norm_kinds_are_layer_and_rms():
    assert kl.NORM_KINDS == ("layer", "rms")


# -- FusedDense --------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 6)])
def test_fused_dense_is_a_matmul_plus_bias(shape):
    layer = kl.FusedDense(4)
    x = _inputs(*shape)
    layer.build(shape)
    _randomise(layer)
    want = x.astype("float64") @ _weight(layer, "kernel") + _weight(
        layer, "bias")
    got = _np(layer(x))
    assert got.shape == shape[:-1] + (4,)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


def test_fused_dense_without_bias_is_the_matmul_alone():
    layer = kl.FusedDense(4, use_bias=False)
    x = _inputs(5, 6)
    layer.build(x.shape)
    _randomise(layer)
    assert [v.path.split("/")[-1] for v in layer.weights] == ["kernel"]
    np.testing.assert_allclose(_np(layer(x)),
                               x.astype("float64") @ _weight(layer, "kernel"),
                               rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("training", [None, True])
@pytest.mark.parametrize("form", ["tanh", "exact", "quick"])
def test_fused_dense_with_gelu_applies_that_form_after_the_bias(
        form, training):
    # training=True takes the fused training spellings (an XLA GELU on a
    # TensorFlow CPU): the same function.
    layer = kl.FusedDense(4, gelu=form)
    x = _inputs(2, 3, 6)
    layer.build(x.shape)
    _randomise(layer)
    pre = x.astype("float64") @ _weight(layer, "kernel") + _weight(
        layer, "bias")
    got = _np(layer(x, training=training))
    np.testing.assert_allclose(got, NP_GELU[form](pre), rtol=RTOL,
                               atol=1e-5)


def test_fused_dense_refuses_gelu_and_activation_together():
    with pytest.raises(ValueError, match="gelu='tanh', activation='relu'"):
        kl.FusedDense(4, gelu="tanh", activation="relu")


def test_fused_dense_refuses_an_unknown_gelu_by_name():
    with pytest.raises(ValueError, match="gelu='erf'"):
        kl.FusedDense(4, gelu="erf")


def test_fused_dense_keeps_its_gelu_by_name_through_its_config():
    layer = kl.FusedDense(4, gelu="exact", name="d")
    config = layer.get_config()
    assert config["gelu"] == "exact" and config["activation"] is None
    rebuilt = kl.FusedDense.from_config(config)
    assert rebuilt.gelu == "exact" and rebuilt.units == 4
    # The rebuilt layer computes the exact GELU, not Keras' default.
    x = _inputs(3, 6)
    rebuilt.build(x.shape)
    _randomise(rebuilt)
    pre = x.astype("float64") @ _weight(rebuilt, "kernel") + _weight(
        rebuilt, "bias")
    np.testing.assert_allclose(_np(rebuilt(x)), _gelu_exact(pre),
                               rtol=RTOL, atol=1e-5)


# -- FusedEinsumDense --------------------------------------------------------

@pytest.mark.parametrize("equation, output_shape, bias_axes, x_shape", [
    # Tokens to heads, heads back: the attention's projections.
    ("abc,cde->abde", (None, 2, 3), "de", (2, 4, 6)),
    ("abcd,cde->abe", (None, 6), "e", (2, 4, 2, 3)),
    # A bias over the last axis only: Keras' own call.
    ("abc,cde->abde", (None, 2, 3), "e", (2, 4, 6)),
    # No bias.
    ("abc,cde->abde", (None, 2, 3), None, (2, 4, 6)),
])
def test_fused_einsum_dense_is_the_einsum_plus_bias(equation, output_shape,
                                                    bias_axes, x_shape):
    layer = kl.FusedEinsumDense(equation, output_shape, bias_axes=bias_axes)
    x = _inputs(*x_shape)
    layer.build(x_shape)
    _randomise(layer)
    want = np.einsum(equation, x.astype("float64"), _weight(layer, "kernel"))
    if bias_axes is not None:
        want = want + _weight(layer, "bias")
    got = _np(layer(x))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


# -- FusedConv2D -------------------------------------------------------------

@pytest.mark.parametrize("training", [None, True])
@pytest.mark.parametrize("size, stride", [(2, 2), (3, 1)])
def test_fused_conv2d_is_the_convolution_plus_bias(size, stride, training):
    layer = kl.FusedConv2D(4, size, strides=stride)
    x = _inputs(2, 6, 6, 3)
    layer.build(x.shape)
    _randomise(layer)
    want = _conv_valid(x.astype("float64"), _weight(layer, "kernel"),
                       stride) + _weight(layer, "bias")
    got = _np(layer(x, training=training))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


# -- the norms ---------------------------------------------------------------

@pytest.mark.parametrize("training", [None, True])
def test_fused_layer_norm_subtracts_the_mean_and_divides_by_the_std(
        training):
    # training=True runs the XLA program on a TensorFlow CPU.
    layer = kl.FusedLayerNormalization(epsilon=1e-6)
    x = _inputs(2, 3, 8) * 3.0 + 2.0
    layer.build(x.shape)
    _randomise(layer)
    want = _layer_norm(x, _weight(layer, "gamma"), _weight(layer, "beta"),
                       1e-6)
    np.testing.assert_allclose(_np(layer(x, training=training)), want,
                               rtol=RTOL, atol=1e-5)


def test_rms_norm_divides_by_the_root_mean_square():
    layer = kl.RMSNormalization(epsilon=1e-6)
    # A mean far from zero: a LayerNorm would subtract it, RMSNorm not.
    x = _inputs(2, 3, 8) + 3.0
    layer.build(x.shape)
    _randomise(layer)
    want = _rms_norm(x, _weight(layer, "gamma"), 1e-6)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)


def test_rms_norm_adds_its_epsilon_inside_the_root():
    # With a large epsilon, inside and outside the root differ widely.
    layer = kl.RMSNormalization(epsilon=0.5)
    x = np.array([[3.0, -4.0, 1.0, 0.0]], "float32")
    want = x / np.sqrt((x.astype("float64") ** 2).mean() + 0.5)
    np.testing.assert_allclose(_np(layer(x)), want, rtol=RTOL, atol=ATOL)


def test_rms_norm_keeps_its_scale_as_a_float32_gamma():
    layer = kl.RMSNormalization(dtype="mixed_bfloat16")
    layer.build((None, 4))
    (var,) = layer.weights
    assert var.path.endswith("/gamma") and var.dtype == "float32"
    assert layer.gamma is layer.scale
    np.testing.assert_array_equal(_np(var.value), np.ones(4))


def test_rms_norm_config_round_trips():
    layer = kl.RMSNormalization(epsilon=1e-5, name="n")
    rebuilt = kl.RMSNormalization.from_config(layer.get_config())
    assert rebuilt.epsilon == 1e-5 and rebuilt.name == "n"
    x = _inputs(1, 4) + 1.0
    np.testing.assert_allclose(_np(rebuilt(x)), _rms_norm(x, 1.0, 1e-5),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind, fused, cls", [
    ("rms", True, kl.RMSNormalization),
    ("layer", True, kl.FusedLayerNormalization),
    ("layer", False, keras.layers.LayerNormalization),
])
def test_make_norm_builds_the_norm_of_its_kind(kind, fused, cls):
    norm = kl.make_norm(kind, 1e-5, None, "n", fused=fused)
    assert type(norm) is cls
    assert norm.epsilon == 1e-5 and norm.name == "n"


def test_make_norm_refuses_an_unknown_kind_naming_norm():
    with pytest.raises(ValueError, match="norm='batch'"):
        kl.make_norm("batch", 1e-6, None, "n")


def test_xavier_flat_draws_within_the_flattened_fans_limit():
    # Flax's DenseGeneral: the limit of a (fan_in, fan_out) matrix,
    # whatever the kernel's own number of axes.
    init = dense.xavier_flat(8, 8)
    keras.utils.set_random_seed(0)
    values = _np(init((8, 2, 4)))
    limit = math.sqrt(6.0 / 16)
    assert np.abs(values).max() <= limit
    assert np.abs(values).max() > 0.8 * limit
