"""The ViT family's options of VisionTransformer (class token, registers,
position table without the prefix, pooling, fc_norm, layer scale, q/k
norm, biases, quick GELU, pre-norm, final norm, stochastic depth, no head):
what each builds, each refusal naming its argument, and a ``.keras`` round
trip of a tiny model with every option on, on each backend."""

import numpy as np
import pytest

import keras

from keras_vit.models.vit import VisionTransformer
from keras_vit.runtime.backend import to_numpy

pytestmark = pytest.mark.backends

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=2,
            num_heads=2, mlp_dim=16, num_classes=3)
EVERY_OPTION = dict(
    classifier="avgmax", class_token=True, num_registers=2,
    posemb_includes_prefix=False, fc_norm=True, pre_norm=True,
    layer_scale=0.5, qk_norm=True, qkv_bias=False, proj_bias=False,
    patch_bias=False, drop_path_rate=0.2, gelu="quick",
    layer_norm_epsilon=1e-5)


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
