"""The ViT family's options of VisionTransformer (class token, registers,
position table without the prefix, pooling, fc_norm, layer scale, q/k
norm, biases, quick GELU, pre-norm, final norm, stochastic depth, no head,
RMSNorm and the norm after the patch embedding):
what each builds, each refusal naming its argument, and a ``.keras`` round
trip of a tiny model with every option on, on each backend."""

import numpy as np
import pytest

import keras

from keras_vit.models.vit import VisionTransformer
from keras_vit.runtime.backend import to_numpy
from testkit import FAMILY_OPTIONS

pytestmark = pytest.mark.backends

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=2,
            num_heads=2, mlp_dim=16, num_classes=3)
# The contract model's options, pooled by avg+max with fc_norm, a class
# token, stochastic depth, the quick GELU and the plain MLP.
EVERY_OPTION = dict(
    FAMILY_OPTIONS, classifier="avgmax", class_token=True, fc_norm=True,
    drop_path_rate=0.2, gelu="quick", mlp="gelu", patch_norm=False)


def _images(n=2):
    return np.random.default_rng(0).uniform(
        -1, 1, (n, 16, 16, 3)).astype("float32")


def _randomise(model):
    rng = np.random.default_rng(1)
    for w in model.weights:
        w.assign(rng.normal(0, 0.5, w.shape).astype("float32"))
    return model


def test_every_option_round_trips_through_a_keras_file(tmp_path):
    model = _randomise(VisionTransformer(**TINY, **EVERY_OPTION))
    names = {w.path for w in model.weights}
    assert {"register_tokens/registers", "pre_norm/gamma", "fc_norm/gamma",
            "encoder_block_0/layer_scale_1",
            "encoder_block_0/attention/query_norm/gamma"} <= names
    assert not any(n.endswith(("query/bias", "out/bias", "conv/bias",
                               "dense_0/bias")) for n in names)
    assert "encoder_norm/gamma" not in names  # fc_norm replaces it
    x = _images()
    path = tmp_path / "family.keras"
    model.save(path)
    again = keras.saving.load_model(path)
    assert again.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)),
                               atol=1e-6)


def test_stochastic_depth_drops_in_training_only():
    model = _randomise(VisionTransformer(**dict(TINY, num_layers=3),
                                         drop_path_rate=0.5))
    rates = [model.get_layer(f"encoder_block_{i}").drop_path_rate
             for i in range(3)]
    assert rates == [0.0, 0.25, 0.5]  # timm's linear rule
    x = _images(8)
    inference = to_numpy(model(x))
    np.testing.assert_array_equal(to_numpy(model(x, training=False)),
                                  inference)
    assert not np.allclose(to_numpy(model(x, training=True)), inference)


def test_pooling_methods_pool_the_patches_after_the_prefix():
    base = _randomise(VisionTransformer(**TINY, include_top=False,
                                        num_registers=1))
    tokens = to_numpy(base(_images()))
    assert tokens.shape == (2, 2 + 4, 8)
    patches = tokens[:, 2:]
    expected = {"token": tokens[:, 0], "gap": patches.mean(1),
                "max": patches.max(1),
                "avgmax": (patches.mean(1) + patches.max(1)) / 2}
    for method, want in expected.items():
        pooled = VisionTransformer(**TINY, include_top=False,
                                   num_registers=1, pooling=method)
        pooled.set_weights(base.get_weights())
        np.testing.assert_allclose(to_numpy(pooled(_images())), want,
                                   rtol=1e-5, atol=1e-6)


def test_swiglu_mlp_gates_with_silu_and_keeps_through_features(tmp_path):
    """The gated MLP computes silu(x W[:, :m]) * (x W[:, m:]) W2 (biases
    included), survives a .keras round trip and int8 quantization."""
    from keras_vit.layers.blocks import MlpBlock

    layer = MlpBlock(6, kind="swiglu")
    x = np.random.default_rng(2).normal(size=(3, 5, 4)).astype("float32")
    layer.build(x.shape)
    _randomise(layer)
    w0, b0 = to_numpy(layer.dense_0.kernel), to_numpy(layer.dense_0.bias)
    w1, b1 = to_numpy(layer.dense_1.kernel), to_numpy(layer.dense_1.bias)
    assert w0.shape == (4, 12) and w1.shape == (6, 4)
    h = x @ w0 + b0
    gate, value = h[..., :6], h[..., 6:]
    want = (gate / (1 + np.exp(-gate)) * value) @ w1 + b1
    np.testing.assert_allclose(to_numpy(layer(x)), want, rtol=1e-5,
                               atol=1e-5)

    model = _randomise(VisionTransformer(**TINY, mlp="swiglu",
                                         layer_scale=0.5))
    assert model.get_layer("encoder_block_0").get_config()["mlp"] == "swiglu"
    model.save(tmp_path / "swiglu.keras")
    again = keras.saving.load_model(tmp_path / "swiglu.keras")
    assert again.get_config() == model.get_config()
    x = _images()
    floats = to_numpy(model(x))
    np.testing.assert_allclose(to_numpy(again(x)), floats, atol=1e-6)
    again.quantize("int8")
    assert again.get_layer("encoder_block_0").mlp.dense_0 \
        .quantization_mode == "int8"
    error = np.abs(to_numpy(again(x)) - floats).max() / np.abs(floats).max()
    assert 0 < error < 0.05


# -- RMSNorm (norm="rms") and the norm after the patch embedding -------------

def _rms(x, gamma, eps):
    """timm's RmsNorm in NumPy: no mean subtracted, no bias."""
    x = x.astype("float64")
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * gamma


def test_rms_norm_is_timms_formula_with_no_mean_and_no_bias():
    from keras_vit.layers import RMSNormalization

    # Far from zero mean: a LayerNorm (or Keras' rms_scaling, which
    # divides by the standard deviation) gives other numbers.
    x = np.random.default_rng(3).normal(2.0, 1.0, (2, 3, 6)).astype(
        "float32")
    norm = RMSNormalization(epsilon=1e-5, name="rms")
    norm.build(x.shape)
    assert [w.path for w in norm.weights] == ["rms/gamma"]
    gamma = np.linspace(0.5, 1.5, 6).astype("float32")
    norm.gamma.assign(gamma)
    want = _rms(x, gamma, 1e-5)
    np.testing.assert_allclose(to_numpy(norm(x)), want, rtol=1e-5)
    centred = x - x.mean(-1, keepdims=True)
    assert not np.allclose(want, _rms(centred, gamma, 1e-5), atol=1e-2)
    # epsilon inside the root, as timm's: visible on a tiny input.
    tiny = np.full((1, 6), 1e-3, "float32")
    np.testing.assert_allclose(to_numpy(norm(tiny)),
                               _rms(tiny, gamma, 1e-5), rtol=1e-5)


def test_patch_norm_normalises_each_patch_before_the_tokens_join():
    from keras_vit.layers import PatchEmbedding

    layer = PatchEmbedding(8, 8, norm="rms", norm_epsilon=1e-5,
                           name="patch_embedding")
    x = _images()
    layer.build(x.shape)
    _randomise(layer)
    w = {v.path: to_numpy(v) for v in layer.weights}
    assert set(w) == {"patch_embedding/conv/kernel",
                      "patch_embedding/conv/bias",
                      "patch_embedding/norm/gamma"}
    patches = x.reshape(2, 2, 8, 2, 8, 3).transpose(0, 1, 3, 2, 4, 5)
    flat = patches.reshape(2, 4, 192) @ w["patch_embedding/conv/kernel"] \
        .reshape(192, 8) + w["patch_embedding/conv/bias"]
    np.testing.assert_allclose(
        to_numpy(layer(x)), _rms(flat, w["patch_embedding/norm/gamma"],
                                 1e-5), rtol=1e-4, atol=1e-5)
    assert PatchEmbedding.from_config(layer.get_config()).norm == "rms"


def test_rms_norm_reaches_every_norm_and_round_trips(tmp_path):
    options = dict(TINY, classifier="avgmax", class_token=False, fc_norm=True,
                   pre_norm=True, qk_norm=True, norm="rms", patch_norm=True,
                   layer_norm_epsilon=1e-5)
    model = _randomise(VisionTransformer(**options))
    norms = {w.path for w in model.weights if "norm" in w.path}
    assert norms == {
        "patch_embedding/norm/gamma", "pre_norm/gamma", "fc_norm/gamma",
        *(f"encoder_block_{i}/{n}/gamma" for i in range(2)
          for n in ("norm_1", "norm_2", "attention/query_norm",
                    "attention/key_norm"))}
    # The same graph with LayerNorms: other numbers from the same scales.
    layer_norms = VisionTransformer(**dict(options, norm="layer"))
    assert len(layer_norms.weights) == len(model.weights) + len(norms)
    x = _images()
    path = tmp_path / "rms.keras"
    model.save(path)
    again = keras.saving.load_model(path)
    assert again.get_config() == model.get_config()
    assert again.get_config()["norm"] == "rms"
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)),
                               atol=1e-6)


@pytest.mark.parametrize("options", [
    dict(norm="rms", patch_norm=True, qk_norm=True, pre_norm=True),
    dict(norm="rms", classifier="map", class_token=False),
    dict(patch_norm=True, classifier="gap", fc_norm=True),
])
def test_norm_parameter_count_is_the_built_models(options):
    from keras_vit.base import geometry

    model = VisionTransformer(**{**TINY, **options})
    assert geometry.parameter_count(model.get_config()) == \
        model.count_params()


def test_rms_norm_keeps_its_scale_float32_under_mixed_precision():
    """As LayerNormalization: under mixed_bfloat16 the statistics, the
    scale and its gradient stay float32. The gradient here, 2 + 2**-8,
    is exact in float32 and not a bfloat16 number (Keras' own
    RMSNormalization reads its scale as bfloat16 and rounds it to 2)."""
    from keras_vit.layers import RMSNormalization
    from model_gradients import gradients

    model = keras.Sequential([keras.Input((3, 4)), RMSNormalization(
        epsilon=0.0, dtype="mixed_bfloat16")])
    assert model.layers[0].gamma.dtype == "float32"
    x = np.ones((1, 3, 4), "float32")  # each row's RMS is 1
    weights = np.array([1.0, 1.0, 2.0 ** -8], "float32")[None, :, None]
    out = model(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    (grad,) = gradients(model, x, lambda y: keras.ops.sum(
        keras.ops.cast(y, "float32") * keras.ops.convert_to_tensor(weights)))
    np.testing.assert_array_equal(grad, np.full(4, 2.0 + 2.0 ** -8))


def test_num_classes_zero_returns_the_pooled_embedding():
    model = VisionTransformer(**dict(TINY, num_classes=0), classifier="gap",
                              fc_norm=True)
    assert model(_images()).shape == (2, 8)
    assert "head/kernel" not in {w.path for w in model.weights}


def test_distilled_averages_the_two_heads(tmp_path):
    model = _randomise(VisionTransformer(**TINY, distilled=True))
    tokens = VisionTransformer(**TINY, distilled=True, include_top=False)
    tokens.set_weights([w for w in model.get_weights()][:len(
        tokens.weights)])
    t = to_numpy(tokens(_images()))
    weights = {w.path: to_numpy(w) for w in model.weights}
    logits = [t[:, i] @ weights[f"{h}/kernel"] + weights[f"{h}/bias"]
              for i, h in ((0, "head"), (1, "head_dist"))]
    np.testing.assert_allclose(to_numpy(model(_images())),
                               (logits[0] + logits[1]) / 2, rtol=1e-5,
                               atol=1e-5)
    model.save(tmp_path / "deit.keras")
    again = keras.saving.load_model(tmp_path / "deit.keras")
    np.testing.assert_allclose(to_numpy(again(_images())),
                               to_numpy(model(_images())), atol=1e-6)


def test_a_distilled_model_takes_a_new_head_as_one():
    import keras_vit

    model = _randomise(VisionTransformer(**TINY, distilled=True))
    fine_tune = keras_vit.rebuild(model, num_classes=5)
    assert fine_tune(_images()).shape == (2, 5)
    for name in ("head", "head_dist"):  # both new heads start at zero
        assert not to_numpy(fine_tune.get_layer(name).kernel).any()
    tokens = keras_vit.rebuild(model, include_top=False)
    assert tokens(_images()).shape == (2, 2 + 4, 8)


def test_defaults_build_the_papers_vit():
    default = VisionTransformer(**TINY)
    assert [w.path for w in default.weights][:4] == [
        "patch_embedding/conv/kernel", "patch_embedding/conv/bias",
        "class_token/cls", "position_embedding/pos_embedding"]
    assert default.get_layer("encoder_block_0").drop_path is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(classifier="gap", class_token=False, pooling="token",
          include_top=False), "pooling='token' takes the class token"),
    (dict(class_token=False), "classifier='token' takes the class token"),
    (dict(num_registers=-1), "num_registers"),
    (dict(num_registers=True), "num_registers"),
    (dict(layer_scale=0), "layer_scale"),
    (dict(drop_path_rate=1.0), "drop_path_rate"),
    (dict(qk_norm="yes"), "qk_norm"),
    (dict(fc_norm=True), "fc_norm=True normalises the pooled"),
    (dict(classifier="gap", fc_norm=True, final_norm=False), "final_norm"),
    (dict(posemb_includes_prefix=False, position_embedding="relative"),
     "posemb_includes_prefix=False"),
    (dict(gelu="relu"), "gelu"),
    (dict(mlp="reglu"), "mlp must be one of"),
    (dict(mlp=None), "mlp must be one of"),
    (dict(norm="rmsnorm"), "norm must be one of"),
    (dict(norm=None), "norm must be one of"),
    (dict(patch_norm="yes"), "patch_norm must be True or False"),
    (dict(classifier="mean"), "classifier"),
    (dict(distilled=True, classifier="gap", class_token=True), "distilled"),
    (dict(distilled=True, representation_size=4), "distilled"),
    (dict(num_classes=0, classifier_activation="softmax"),
     "classifier_activation belongs to a head"),
    (dict(num_classes=0, label_names=["a"]), "label_names belongs"),
])
def test_family_options_are_checked_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VisionTransformer(**{**TINY, **kwargs})


# -- the attention-pool head (classifier="map") --------------------------------

def _gelu(x, form):
    if form == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                      * (x + 0.044715 * x ** 3)))
    import math

    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def _map_reference(tokens, head, skip=0):
    """big_vision's MAPHead in NumPy: the probe's query attends over the
    tokens (after ``skip`` prefix tokens), then y + MLP(LayerNorm(y))."""
    w = {v.path.split("/", 1)[1]: to_numpy(v).astype("float64")
         for v in head.weights}
    x = tokens[:, skip:].astype("float64")
    b, n, d = x.shape
    heads = head.num_heads
    dh = d // heads

    def project(t, name):
        return (t @ w[f"{name}/kernel"].reshape(d, d)
                + w[f"{name}/bias"].reshape(d)).reshape(*t.shape[:-1],
                                                        heads, dh)

    q = project(w["probe"][0], "query")  # (1, heads, dh)
    k, v = project(x, "key"), project(x, "value")
    logits = np.einsum("qhc,bnhc->bhqn", q, k) / np.sqrt(dh)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bhqn,bnhc->bqhc", p, v).reshape(b, 1, d)
    y = context @ w["out/kernel"].reshape(d, d) + w["out/bias"]
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    normed = ((y - mean) / np.sqrt(var + head.layer_norm_epsilon)
              * w["norm/gamma"] + w["norm/beta"])
    hidden = _gelu(normed @ w["mlp/dense_0/kernel"] + w["mlp/dense_0/bias"],
                   head.gelu)
    y = y + hidden @ w["mlp/dense_1/kernel"] + w["mlp/dense_1/bias"]
    return y[:, 0]


@pytest.mark.parametrize("options, skip", [
    (dict(), 0),  # SigLIP's: no class token
    (dict(class_token=True, num_registers=1, gelu="exact",
          layer_norm_epsilon=1e-5), 2),  # timm pools the patches only
])
def test_map_head_is_big_visions_map_head(options, skip):
    model = _randomise(VisionTransformer(**dict(TINY, num_classes=0),
                                         classifier="map", **options))
    head = model.get_layer("pooling")
    assert head.num_prefix_tokens == skip
    tokens = to_numpy(model.feature_model("tokens")(_images()))
    assert tokens.shape == (2, skip + 4, 8)
    want = _map_reference(tokens, head, skip)
    got = to_numpy(model(_images()))
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # What a head reads: the pooled embedding, as timm's pre_logits.
    np.testing.assert_allclose(to_numpy(model.feature_model("pre_logits")(
        _images())), got, atol=1e-6)


def test_map_head_round_trips_through_config_and_keras_file(tmp_path):
    from keras_vit.layers import AttentionPoolHead

    model = _randomise(VisionTransformer(**TINY, classifier="map"))
    names = {w.path for w in model.weights}
    assert {"pooling/probe", "pooling/query/kernel", "pooling/out/bias",
            "pooling/norm/gamma", "pooling/mlp/dense_1/kernel"} <= names
    assert "class_token/cls" not in names  # no class token by default
    head = model.get_layer("pooling")
    again = AttentionPoolHead.from_config(head.get_config())
    assert again.get_config() == head.get_config()
    x = _images()
    copy = VisionTransformer.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    np.testing.assert_allclose(to_numpy(copy(x)), to_numpy(model(x)),
                               atol=1e-6)
    model.save(tmp_path / "map.keras")
    loaded = keras.saving.load_model(tmp_path / "map.keras")
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)),
                               atol=1e-6)


def test_map_heads_official_keys_and_rebuilds():
    import keras_vit
    from keras_vit.zoo import convert

    model = _randomise(VisionTransformer(**dict(TINY, num_classes=0),
                                         classifier="map"))
    arrays = convert.export_arrays(model)
    assert {"MAPHead_0/probe",
            "MAPHead_0/MultiHeadDotProductAttention_0/query/kernel",
            "MAPHead_0/MultiHeadDotProductAttention_0/out/kernel",
            "MAPHead_0/LayerNorm_0/scale",
            "MAPHead_0/MlpBlock_0/Dense_1/bias"} <= set(arrays)
    assert arrays["MAPHead_0/MultiHeadDotProductAttention_0/key/kernel"] \
        .shape == (8, 2, 4)
    # A new head on the pooled embedding; the tokens without the pool.
    x = _images()
    model = _randomise(VisionTransformer(**TINY, classifier="map"))
    pooled = to_numpy(model.feature_model("pre_logits")(x))
    classifier = keras_vit.rebuild(model, num_classes=5)
    assert classifier(x).shape == (2, 5)
    np.testing.assert_allclose(
        to_numpy(classifier.feature_model("pre_logits")(x)), pooled,
        atol=1e-6)
    tokens = keras_vit.rebuild(model, include_top=False)
    np.testing.assert_allclose(to_numpy(tokens(x)),
                               to_numpy(model.feature_model("tokens")(x)),
                               atol=1e-6)


@pytest.mark.parametrize("options", [
    dict(classifier="map"), dict(classifier="map", num_classes=0),
    dict(include_top=False, pooling="map"),
    dict(classifier="map", class_token=True, num_registers=1,
         representation_size=6, fc_norm=True),
])
def test_map_parameter_count_is_the_built_models(options):
    from keras_vit.base import geometry

    model = VisionTransformer(**{**TINY, **options})
    assert geometry.parameter_count(model.get_config()) == \
        model.count_params()


@pytest.mark.parametrize("kwargs, message", [
    (dict(classifier="map", distilled=True, class_token=True),
     "distilled=True .* received classifier='map'"),
    (dict(classifier="map", pooling="token", include_top=False),
     "pooling='token' takes the class token, but classifier='map'"),
    (dict(classifier="MAP"), "classifier"),
    (dict(classifier="map", num_classes=0, classifier_activation="softmax"),
     "classifier_activation belongs to a head"),
])
def test_map_refusals_name_the_argument_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        VisionTransformer(**{**TINY, **kwargs})
    assert "\n" not in str(info.value)


def test_attention_pool_head_refuses_bad_arguments():
    from keras_vit.layers import AttentionPoolHead

    with pytest.raises(ValueError, match="num_heads must be a positive "
                                         "integer; received num_heads=0"):
        AttentionPoolHead(0, 16)
    with pytest.raises(ValueError, match="gelu"):
        AttentionPoolHead(2, 16, gelu="relu")
    with pytest.raises(ValueError, match="num_heads=3"):
        AttentionPoolHead(3, 16)(np.zeros((1, 4, 8), "float32"))
