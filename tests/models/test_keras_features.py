"""Keras 3's own model features on every zoo family: a feature may change
the numbers only the way it says it does.

The tests share tiny models (32 px, patch 8, width 32) of the four
families (ViT, a hybrid, BiT, Axial-ViT) and of the ViT with the later
family members' options (testkit.FAMILY_OPTIONS: registers, the
attention-pool head, q/k norms, layer scale, the gated MLP, RMSNorm, the
patch norm) with random weights (a zero head
would hide every error), built once per module; each test runs one Keras
feature on copies of them and compares with the float model: quantized
outputs are close and not equal, LoRA with its zero B is exactly the float
model, and every change reaches the next ``predict``.
"""

import warnings

import numpy as np
import pytest

import keras
import keras_vit
from keras_vit.models.resnet_v2 import resnet_v2
import testkit
from testkit import FAMILY_OPTIONS, forward
from testkit import randomise_keras as randomise

pytestmark = [pytest.mark.backends,
              # The one warning per quantize call naming the float layers
              # (checked in its own test).
              pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")]

FAMILIES = ("vit", "hybrid", "bit", "axial", "options")
# Worst output error relative to the float logits' largest magnitude, per
# mode. Measured on these tiny random models (randomise seeds 0-7; this
# module draws seed 0), worst per family, TensorFlow:
#          vit    hybrid  bit    axial  options
#   int8   0.031  0.034   0.017  0.024  0.026
#   int4   0.296  0.322   0.148  0.240  0.438 (seed 0; seeds 1-7 0.08-0.25)
#   float8 0.109  0.142   0.065  0.103  0.130
# Keras 3.15's int4 gives each kernel column 16 levels between its min and
# max: that coarse on a 32-wide random model. The options model's int4
# logits equal (to 1e-6) the float model's with its kernels rounded so in
# NumPy, so the error is the rounding's, not RMSNorm's (its scales stay
# float32 and unchanged); seed 0 draws its smallest logits (max 1.21;
# absolute error 0.53, LayerNorm's 0.42 on the same seed). The bounds are
# about 1.3x the worst: a kernel read without its scale moves the logits
# by more than 100%.
ERROR_BOUNDS = {"int8": 0.045, "int4": 0.55, "float8": 0.2}


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """Quantize's garbage collections scan only what is new
    (testkit.frozen_heap): 20-odd quantizes in this module."""
    with testkit.frozen_heap():
        yield


def build(family, **kwargs):
    common = dict(num_classes=5, **kwargs)
    if family == "vit":
        return keras_vit.models.vit(32, 8, 32, 2, 2, 64, **common)
    if family == "options":
        return keras_vit.models.vit(32, 8, 32, 2, 2, 64,
                                    **FAMILY_OPTIONS, **common)
    if family == "hybrid":
        return keras_vit.models.vit(32, 2, 32, 1, 2, 64, resnet=dict(
            num_layers=(), width_factor=0.5), **common)
    if family == "bit":
        return resnet_v2(32, (1, 1, 1, 1), 0.5, **common)
    return keras_vit.models.axial_vit(32, 8, 32, 1, 2, 64, **common)


def images():
    """The batch every test runs: one shape, so that on JAX each op of a
    model compiles once for the whole module, not once per batch size."""
    return np.random.default_rng(1).uniform(
        -1, 1, (4, 32, 32, 3)).astype("float32")


@pytest.fixture(scope="module")
def floats():
    """One random float model per family and its float logits."""
    out = {}
    for family in FAMILIES:
        model = randomise(build(family))
        out[family] = (model, run(model, images()))
    return out


def run(model, x):
    """The logits of ``model`` for ``x`` (testkit.forward: on JAX one
    jitted program, which is cheaper than a first eager call)."""
    return forward(model, x)


def called(model, x):
    """The logits of the model's own eager call, for comparing with what
    runs the same eager code (a quantized model's predict, its attention
    model): a quantized layer rounds its inputs to integers, and the last
    bits a compiled program changes could flip a rounding."""
    return keras.ops.convert_to_numpy(model(x, training=False))


@pytest.fixture(scope="module")
def quantized(floats):
    """``quantized(mode)``: per family, a quantized copy of the float model,
    its logits and the warnings its ``quantize`` gave. The int8 copies are
    made once and read by every test of an int8 model (the quantize
    checks, the warning, the .keras round trip, the attention maps): each
    ``quantize`` (and each quantized model loaded) ends with a garbage
    collection (of what is not frozen: :func:`frozen_heap`). The other
    modes' copies are not kept: every model alive makes each collection
    longer.
    The ViT's predict is compiled before it is quantized, so that its next
    predict shows whether the compiled function was dropped."""
    x = images()
    kept = {}

    def get(mode):
        if mode in kept:
            return kept[mode]
        made = {}
        for family, (model, _) in floats.items():
            q = copy_of(model)
            if family == "vit":
                q.predict(x, verbose=0)
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                q.quantize(mode)
            made[family] = (q, run(q, x), record)
        if mode == "int8":
            kept[mode] = made
        return made
    return get


def copy_of(model):
    clone = model.__class__.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    return clone


def dense_layers(model):
    return [layer for layer in model._flatten_layers()
            if isinstance(layer, (keras.layers.Dense,
                                  keras.layers.EinsumDense))]


@pytest.fixture(scope="module")
def lora(floats):
    """Per family: a copy of the float model with LoRA (rank 2) on every
    dense layer, its logits with B still zero (as ``enable_lora`` leaves
    it) and its logits once B is drawn (so that LoRA changes the numbers).
    Made once and read by the LoRA checks, the .keras round trip and the
    attention maps. The ViT's predict is compiled before LoRA is enabled,
    so that its next predict shows whether the compiled function was
    dropped."""
    x = images()
    out = {}
    for family, (model, _) in floats.items():
        m = copy_of(model)
        if family == "vit":
            m.predict(x, verbose=0)
        for layer in dense_layers(m):
            layer.enable_lora(2)
        zero_b = run(m, x)
        rng = np.random.default_rng(5)
        for layer in dense_layers(m):
            b = layer.lora_kernel_b
            b.assign(0.05 * rng.standard_normal(b.shape).astype("float32"))
        out[family] = (m, zero_b, run(m, x))
    return out


def relative_error(got, want):
    return float(np.max(np.abs(np.asarray(got) - want))
                 / np.max(np.abs(want)))


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_quantize_covers_every_projection_and_stays_close(floats, quantized,
                                                          mode):
    x = images()
    for family, (q, got, _) in quantized(mode).items():
        denses = dense_layers(q)
        # ViT: q, k, v, out, two MLP denses per block and the head; the
        # attention-pool head has a block's six of its own (its gated MLP
        # packs both halves in its first dense).
        expected = {"vit": 2 * 6 + 1, "hybrid": 6 + 1, "bit": 1,
                    "axial": 2 * 6 + 1, "options": 3 * 6 + 1}[family]
        assert len(denses) == expected, family
        assert all(d.quantization_mode == mode for d in denses), family
        err = relative_error(got, floats[family][1])
        assert 0 < err < ERROR_BOUNDS[mode], (family, err)
        if family == "vit":
            # The next predict computes what the quantized model computes.
            np.testing.assert_allclose(q.predict(x, verbose=0), called(q, x),
                                       atol=1e-4)


def test_quantize_lists_what_it_leaves_in_float_once(quantized):
    record = quantized("int8")["hybrid"][2]
    notes = [str(w.message) for w in record
             if issubclass(w.category, UserWarning)]
    assert len(notes) == 1, notes
    # Named by class, with the convolutions and norms among them.
    assert "StdConv2D" in notes[0] and "LayerNormalization" in notes[0]
    assert "int8" in notes[0]


@pytest.mark.parametrize("mode", ["gptq", "awq", "int3"])
def test_quantize_modes_without_a_recipe_are_refused_naming_the_mode(
        floats, mode):
    model = copy_of(floats["vit"][0])
    with pytest.raises(ValueError, match=f"mode={mode!r}"):
        model.quantize(mode)


def test_lora_with_zero_b_is_the_float_model_and_b_is_live(floats, lora):
    x = images()
    for family, (m, zero_b, got) in lora.items():
        want = floats[family][1]
        np.testing.assert_allclose(zero_b, want, atol=1e-5, err_msg=family)
        assert relative_error(got, want) > 1e-3, family
        if family == "vit":     # one family checks the compiled predict
            np.testing.assert_allclose(m.predict(x, verbose=0), got,
                                       atol=1e-4)


def test_dtype_policy_change_reaches_predict(floats):
    x = images()
    for family, (model, want) in floats.items():
        m = copy_of(model)
        warm = family == "vit"
        if warm:
            np.testing.assert_allclose(m.predict(x, verbose=0), want,
                                       atol=1e-4)
        for layer in m._flatten_layers():
            layer.dtype_policy = "mixed_bfloat16"
        got = run(m, x).astype("float32")
        err = relative_error(got, want)
        assert 0 < err < 0.1, (family, err)
        if warm:
            pred = np.asarray(m.predict(x, verbose=0), "float32")
            np.testing.assert_allclose(pred, got,
                                       atol=0.05 * np.max(np.abs(want)))
            assert relative_error(pred, want) > 0


def test_trainable_flags_change_no_number(floats):
    x = images()
    for family in ("vit", "bit"):
        model, want = floats[family]
        m = copy_of(model)
        m.predict(x, verbose=0)
        total = len(m.trainable_weights)
        for layer in m.layers[: len(m.layers) // 2]:
            layer.trainable = False
        assert 0 < len(m.trainable_weights) < total, family
        np.testing.assert_allclose(m.predict(x, verbose=0), want, atol=1e-4,
                                   err_msg=family)


@pytest.mark.parametrize("feature", ["int8", "lora"])
def test_keras_file_round_trip_keeps_the_feature(floats, quantized, lora,
                                                 feature, tmp_path):
    x = images()
    for family in floats:
        if feature == "int8":
            m, want, _ = quantized("int8")[family]
        else:
            m, _, want = lora[family]
        path = tmp_path / f"{family}_{feature}.keras"
        m.save(path)
        back = keras.saving.load_model(path)
        np.testing.assert_allclose(run(back, x), want,
                                   atol=1e-5, err_msg=family)
        if feature == "int8":
            assert all(d.quantization_mode == "int8"
                       for d in dense_layers(back)), family


def test_remat_scope_full_builds_and_computes_the_same(floats):
    """Built inside ``keras.RematScope(mode="full")``, a model computes what
    it computes without; where the scope would go wrong (JAX, whose remat
    traces the Dropout layers' ``training`` flag) the build is refused and
    names ``remat=True``."""
    x = images()
    for family, (model, want) in floats.items():
        dropout = any(isinstance(layer, keras.layers.Dropout)
                      for layer in model._flatten_layers())
        if keras.backend.backend() == "jax" and dropout:
            with pytest.raises(ValueError, match="remat=True"):
                with keras.RematScope(mode="full"):
                    build(family)
            continue
        with keras.RematScope(mode="full"):
            m = build(family)
        m.set_weights(model.get_weights())
        np.testing.assert_allclose(run(m, x), want, atol=1e-5,
                                   err_msg=family)


def test_keras_remat_of_dropout_still_fails_on_jax():
    """Why the refusal above exists: Keras' own Dense + Dropout under
    RematScope fails on JAX. When Keras fixes it, this fails, and the
    refusal in keras_vit.models.encoder.check_remat_scope can go."""
    if keras.backend.backend() != "jax":
        pytest.skip("the JAX backend's behaviour")
    with keras.RematScope(mode="full"):
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4),
                              keras.layers.Dropout(0.0)])
    with pytest.raises(Exception, match="_error_repr|Tracer"):
        m(np.ones((2, 4), "float32"), training=False)


@pytest.mark.parametrize("feature", ["int8", "lora"])
def test_attention_maps_come_from_the_changed_model(floats, quantized, lora,
                                                    feature):
    from keras_vit.analysis import attention

    x = images()
    m = quantized("int8")["vit"][0] if feature == "int8" else lora["vit"][0]
    want = called(m, x)
    assert relative_error(want, floats["vit"][1]) > 1e-3
    scored = attention.attention_model(m)
    out = scored(x, training=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out["output"]),
                               want, atol=1e-5)
    maps = attention.attention_maps(m, x)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-4)


@pytest.mark.parametrize("equation,out_shape,bias_axes,in_shape", [
    ("abc,cde->abde", (None, 2, 4), "de", (2, 5, 8)),   # tokens to heads
    ("abcd,cde->abe", (None, 8), "e", (2, 5, 2, 4)),    # heads back
    ("abc,cd->abd", (None, 6), None, (2, 5, 8)),        # no bias: Keras'
    ("abc,dc->abd", (None, 6), "d", (2, 5, 8)),         # not flat: Keras'
])
def test_fused_einsum_dense_computes_what_einsum_dense_does(
        equation, out_shape, bias_axes, in_shape):
    from keras_vit.layers import FusedEinsumDense

    x = np.random.default_rng(0).standard_normal(in_shape).astype("float32")
    ours = FusedEinsumDense(equation, out_shape, bias_axes=bias_axes,
                            bias_initializer="random_normal")
    ours.build(in_shape)
    theirs = keras.layers.EinsumDense(equation, out_shape,
                                      bias_axes=bias_axes)
    theirs.build(in_shape)
    theirs.set_weights(ours.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)),
                               keras.ops.convert_to_numpy(theirs(x)),
                               atol=1e-5)
