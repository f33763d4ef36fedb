"""The ViT builder: every named variant, layer contracts, saving, options."""

import functools
import inspect
import subprocess
import sys

import keras
import numpy as np
import pytest

import published_counts
from conftest import count_params, tiny_builder_kwargs
from flax_init import check_init as _check_init
from testkit import TINY, bad_calls_test, tiny_vit as _vit

import keras_vit
from keras_vit import layers as vit_layers
from keras_vit.runtime.backend import to_numpy
from keras_vit.base import variants
from keras_vit.models import vit
from keras_vit.models.axial import AxialVisionTransformer
from keras_vit.models.resnet_v2 import ResNetV2
from keras_vit.base.variants import parse

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends

# Official counts (tests/published_counts.py); the rest follow from the
# configuration by the formula in _formula_count, checked against them.
PARAMS_224_1000 = published_counts.of_family("ViT-")
SLOW_NAMES = {"ViT-L/16", "ViT-L/32", "ViT-H/14"}


def _formula_count(c, image=224, classes=1000):
    d, m, p, n = c["hidden_size"], c["mlp_dim"], c["patch_size"], c["num_layers"]
    tokens = (image // p) ** 2 + 1
    block = 2 * 2 * d + 4 * (d * d + d) + (d * m + m) + (m * d + d)
    return (p * p * 3 * d + d) + d + tokens * d + n * block + 2 * d + (
        d * classes + classes)


VIT_NAMES = [n for n in variants.REGISTERED if n.startswith("ViT-")]


def test_every_registered_name_is_pinned():
    assert set(PARAMS_224_1000) == set(VIT_NAMES)
    for name, count in PARAMS_224_1000.items():
        assert _formula_count(parse(name).config) == count, name


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_NAMES else n
    for n in VIT_NAMES])
def test_parameter_count(name):
    # The smallest of the family allocated for real (the stateless count
    # must equal it); the others counted as shapes only.
    build = functools.partial(vit, image_size=224, num_classes=1000,
                              **parse(name).config)
    assert count_params(build, allocate=name == "ViT-Ti/16") == (
        PARAMS_224_1000[name])


@pytest.mark.parametrize("spelling", [
    "ViT-B/16", "ViT-B_16", "vit-b16", "B/16", "vit_base_patch16_224",
    "vit_base_patch16_384.augreg_in21k_ft_in1k", " ViT-B/16 "])
def test_names_are_forgiving(spelling):
    assert parse(spelling).name == "ViT-B/16"
    assert parse(spelling).config["hidden_size"] == 768


def test_any_patch_size_and_resolution_in_name():
    arch = parse("ViT-B/14")
    assert arch.config["patch_size"] == 14 and arch.name == "ViT-B/14"
    assert parse("vit_large_patch32_384").image_size == 384
    assert parse("ViT-L/16-224").image_size == 224


def test_unknown_name_suggests_close_matches():
    with pytest.raises(variants.UnknownModelError) as e:
        parse("ViT-X/16")
    msg = str(e.value)
    assert "'ViT-X/16'" in msg and "Did you mean" in msg and "list_models" in msg


# ---------------------------------------------------------------- layers

def test_gelu_is_the_tanh_form():
    x = np.linspace(-6, 6, 101).astype("float32")
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(
        to_numpy(vit_layers.gelu_tanh(keras.ops.convert_to_tensor(x))), want,
                               atol=1e-6)


def test_layer_norm_epsilon_is_official():
    model = vit(**tiny_builder_kwargs())
    eps = {layer.epsilon for layer in model._flatten_layers()
           if isinstance(layer, keras.layers.LayerNormalization)}
    assert eps == {1e-6}


# ---------------------------------------------------------------- model

def test_model_config_round_trip_and_fresh_head_is_zero():
    model = vit(**tiny_builder_kwargs("gap", representation_size=12))
    clone = keras_vit.VisionTransformer.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert clone.count_params() == model.count_params()
    x = np.ones((2, 32, 32, 3), "float32")
    np.testing.assert_array_equal(to_numpy(model(x)), 0.0)


def test_keras_file_reloads_in_a_new_process(tmp_path):
    model = vit(**tiny_builder_kwargs("token", representation_size=12),
                dropout_rate=0.1, include_preprocessing=True)
    rng = np.random.default_rng(0)
    for w in model.weights:  # make every output depend on every weight
        w.assign(rng.standard_normal(w.shape).astype("float32") * 0.1)
    x = rng.uniform(0, 255, (3, 32, 32, 3)).astype("float32")
    want = to_numpy(model.predict(x, verbose=0))
    path = tmp_path / "m.keras"
    model.save(path)
    np.save(tmp_path / "x.npy", x)
    code = (
        "import numpy as np, keras, keras_vit.models\n"
        f"m = keras.saving.load_model({str(path)!r})\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, m.predict(x, verbose=0))\n"
        "print(type(m).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "VisionTransformer" in out.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_feature_outputs():
    kw = tiny_builder_kwargs("token", representation_size=12)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tokens = vit(**kw, include_top=False)(x)
    assert tuple(tokens.shape) == (2, 17, 32)
    pooled = vit(**kw, include_top=False, pooling="token")(x)
    assert tuple(pooled.shape) == (2, 12)  # pre-logits features
    gap = vit(**tiny_builder_kwargs("gap"), include_top=False, pooling="avg")(x)
    assert tuple(gap.shape) == (2, 32)


def test_attention_scores_output():
    model = vit(**tiny_builder_kwargs(), return_attention_scores=True,
                classifier_activation="softmax")
    out = model(np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)))
    assert tuple(out["attention_scores"].shape) == (2, 2, 4, 17, 17)
    np.testing.assert_allclose(to_numpy(out["attention_scores"]).sum(-1), 1.0,
                               atol=1e-5)
    np.testing.assert_allclose(to_numpy(out["output"]).sum(-1), 1.0, atol=1e-5)


def test_preprocessing_maps_pixels_to_minus_one_one():
    kw = tiny_builder_kwargs()
    raw = vit(**kw, include_preprocessing=True, include_top=False)
    plain = vit(**kw, include_top=False)
    plain.set_weights(raw.get_weights())
    x = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("uint8")
    np.testing.assert_allclose(
        to_numpy(raw(x.astype("float32"))),
        to_numpy(plain((x.astype("float32") - 127.5) / 127.5)), atol=1e-5)


def test_dropout_only_in_training():
    model = vit(**tiny_builder_kwargs(), dropout_rate=0.5, include_top=False)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(model(x)))
    assert np.abs(to_numpy(model(x, training=True)) - to_numpy(model(x))
                  ).max() > 1e-3


@pytest.mark.parametrize("kwargs,needle", [
    (dict(image_size=30), "image_size=30"),
    (dict(image_size=(32, 33)), "image_size=(32, 33)"),
    (dict(patch_size=0), "patch_size=0"),
    (dict(num_heads=3), "num_heads=3"),
    (dict(classifier="cls"), "classifier='cls'"),
    (dict(num_classes=-1), "num_classes=-1"),
    (dict(dropout_rate=1.5), "dropout_rate=1.5"),
    (dict(num_channels=0), "num_channels=0"),
])
def test_bad_arguments_name_the_argument(kwargs, needle):
    kw = tiny_builder_kwargs()
    kw.update(kwargs)
    with pytest.raises(ValueError) as e:
        vit(**kw)
    assert needle in str(e.value)


# Each builder and tiny arguments it builds with.
_BUILDERS = {
    "vit": (keras_vit.VisionTransformer, tiny_builder_kwargs),
    "axial": (AxialVisionTransformer, lambda: dict(
        image_size=16, patch_size=4, hidden_size=16, num_layers=1,
        num_heads=2, mlp_dim=32, num_classes=3)),
    "resnet_v2": (ResNetV2, lambda: dict(
        image_size=32, block_units=(1, 1, 1, 1), width_factor=0.5,
        num_classes=3)),
}
# Every argument of every builder that defaults to True or False, one
# added later included: a string ("false" is truthy) once built with the
# flag on.
_FLAGS = [(builder, name) for builder, (cls, _) in _BUILDERS.items()
          for name, p in inspect.signature(cls.__init__).parameters.items()
          if isinstance(p.default, bool)]


@pytest.mark.parametrize("builder,name", _FLAGS)
def test_every_boolean_argument_refuses_a_string(builder, name):
    cls, kwargs = _BUILDERS[builder]
    with pytest.raises(ValueError) as e:
        cls(**kwargs(), **{name: "false"})
    message = str(e.value)  # one line naming the argument and value
    assert "\n" not in message and f"received {name}='false'" in message


def test_a_resnet_without_stage_depths_is_refused():
    # resnet={} once built a root-only hybrid (num_layers=[]); the root
    # alone is asked for as num_layers=[].
    with pytest.raises(ValueError, match=r"resnet.*num_layers.*received "
                                         r"resnet=\{\}"):
        vit(32, 1, 32, 1, 4, 64, 3, resnet={})
    assert vit(32, 1, 32, 1, 4, 64, 3, resnet=dict(num_layers=[])
               ).resnet["num_layers"] == []


def test_wrong_channel_count_is_reported():
    model = vit(**tiny_builder_kwargs())
    with pytest.raises(ValueError) as e:
        model.predict(np.zeros((1, 32, 32, 1), "float32"), verbose=0)
    assert "(1, 32, 32, 1)" in str(e.value)
    assert "images must have the shape (batch, 32, 32, 3)" in str(e.value)
    gray = vit(**tiny_builder_kwargs(), num_channels=1)
    assert tuple(gray(np.zeros((1, 32, 32, 1), "float32")).shape) == (1, 7)


def test_builds_and_runs_with_a_mixed_bfloat16_dtype():
    model = vit(**tiny_builder_kwargs(), dropout_rate=0.1,
                dtype="mixed_bfloat16")
    y = model(np.ones((2, 32, 32, 3), "float32"), training=True)
    assert "bfloat16" in str(y.dtype) and np.isfinite(
        to_numpy(y).astype("float32")).all()
    assert model.get_layer("head").kernel.dtype == "float32"


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="counts torch's own ops (runs in the torch child)")
def test_torch_adds_every_bias_inside_its_matmul():
    """On torch each dense of an encoder block is one ``addmm``: eager torch
    would run a separate bias add as one more pass over the output."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    block = vit_layers.EncoderBlock(num_heads=2, mlp_dim=32)
    x = keras.ops.ones((2, 5, 16))
    block(x)
    with torch.no_grad(), Count() as count:
        block(x, training=False)
    # query, key, value, out, and the MLP's two: six addmm, no bare matmul.
    assert count.ops.get("aten.addmm") == 6, count.ops
    assert not count.ops.get("aten.mm") and not count.ops.get("aten.bmm"), \
        count.ops


# ---------------------------------------------------------------------------
# Initialisation equals the official one in distribution: what
# vit_jax draws for each variable (tests/flax_init.py).
# ---------------------------------------------------------------------------


def test_vit_init_matches_flax_for_every_parameter_kind():
    keras.utils.set_random_seed(0)
    model = keras_vit.models.vit(
        image_size=32, patch_size=4, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10, representation_size=32)
    kinds = _check_init(model)
    for kind in ("patch_embedding/conv/kernel", "class_token/cls",
                 "position_embedding/pos_embedding", "pre_logits/kernel",
                 "encoder_block/attention/query/kernel",
                 "encoder_block/attention/out/kernel",
                 "encoder_block/mlp/dense/bias", "encoder_norm/gamma",
                 "head/kernel"):
        assert kind in kinds, kind


def test_hybrid_and_axial_init_match_flax():
    keras.utils.set_random_seed(0)
    hybrid = keras_vit.models.vit(
        image_size=32, patch_size=1, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10,
        resnet=dict(num_layers=(1,), width_factor=0.5))
    kinds = _check_init(hybrid)
    assert any(k.endswith("gn3/gamma") for k in kinds)
    assert "resnet_root_conv/kernel" in kinds
    axial = keras_vit.models.vit(
        image_size=32, patch_size=4, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10, classifier="gap",
        attention="axial")
    kinds = _check_init(axial)
    assert "axial_block/column/attention/value/kernel" in kinds


# A correctness bug of the audit: GAP models have no class token to pool.
def test_gap_classifier_refuses_token_pooling():
    with pytest.raises(ValueError, match=r"pooling='token'.*classifier='gap'"):
        keras_vit.vit(**dict(TINY, classifier="gap", include_top=False,
                             pooling="token"))
    model = keras_vit.vit(**dict(TINY, classifier="gap", include_top=False,
                                 pooling="gap"))
    assert tuple(model.output_shape) == (None, 32)


# Bad arguments to the ViT builder, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("vit classifier", lambda: _vit(classifier="tokn"),
     "classifier", "'tokn'", "token"),
    ("vit pooling", lambda: _vit(include_top=False, pooling="tokn"),
     "pooling", "'tokn'", "token"),
    ("vit dtype", lambda: _vit(dtype="flaot32"), "dtype", "'flaot32'",
     "float32"),
    ("vit gelu", lambda: _vit(gelu="tahn"), "gelu", "'tahn'", "tanh"),
    ("vit attention", lambda: _vit(attention="axail"), "attention",
     "'axail'", "axial"),
    ("vit position_embedding", lambda: _vit(position_embedding="learned1d"),
     "position_embedding", "'learned1d'", "learned_1d"),
    ("vit placement", lambda: _vit(position_embedding_placement="every"),
     "position_embedding_placement", "'every'", "every_layer"),
    ("vit num_layers", lambda: _vit(num_layers=-1), "num_layers", "-1",
     "a non-negative integer"),
    ("vit hidden_size", lambda: _vit(hidden_size=2.5), "hidden_size", "2.5",
     "a positive integer"),
    ("vit dropout_rate", lambda: _vit(dropout_rate=1.5), "dropout_rate",
     "1.5", "[0, 1)"),
    ("vit misspelt keyword", lambda: _vit(num_clases=3), "keyword argument",
     "'num_clases'", "num_classes"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
