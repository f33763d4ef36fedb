"""ResNet+ViT hybrids: names, counts, conversion, parity with timm."""

import functools

import numpy as np
import pytest

import published_counts
import official
from conftest import count_params, shapes_only

import keras_vit
from keras_vit import zoo
from keras_vit.runtime.backend import to_numpy
from keras_vit.models import vit
from keras_vit.base.variants import parse

import torch
import timm.models.vision_transformer as timm_vit
from timm.layers import GroupNormAct, StdConv2dSame  # noqa: E402
from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem  # noqa: E402
from timm.models.vision_transformer_hybrid import HybridEmbed  # noqa: E402

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends

TINY = dict(hidden=32, layers=2, heads=4, mlp=64)
WIDTH_FACTOR = 0.5  # root width 32: the smallest GroupNorm(32) allows


def _timm_hybrid(num_layers, image, patch, classifier, num_classes, path):
    # GroupNorm epsilon 1e-6 as in vit_jax (timm's default is 1e-5); timm's
    # StdConv keeps its own formula sqrt(var + 1e-8), the documented
    # difference from the official (std + 1e-5).
    norm = functools.partial(GroupNormAct, num_groups=32, eps=1e-6)
    conv = functools.partial(StdConv2dSame, eps=1e-8)
    if num_layers:
        backbone = ResNetV2(layers=num_layers, num_classes=0, global_pool="",
                            preact=False, stem_type="same", conv_layer=conv,
                            norm_layer=norm, width_factor=WIDTH_FACTOR)
    else:
        backbone = create_resnetv2_stem(3, out_chs=int(64 * WIDTH_FACTOR),
                                        stem_type="same", preact=False,
                                        conv_layer=conv, norm_layer=norm)
    model = timm_vit.VisionTransformer(
        img_size=image, patch_size=patch, embed_dim=TINY["hidden"],
        depth=TINY["layers"], num_heads=TINY["heads"],
        mlp_ratio=TINY["mlp"] / TINY["hidden"], num_classes=num_classes,
        global_pool="token" if classifier == "token" else "avg",
        class_token=classifier == "token", fc_norm=False,
        embed_layer=functools.partial(HybridEmbed, backbone=backbone),
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"))
    model.load_pretrained(str(path))
    return model.eval()


@pytest.mark.parametrize("num_layers,image,patch,classifier,gn_4d", [
    ((1, 1), 64, 1, "token", False),
    ((1, 2), 64, 2, "gap", True),
    ((), 64, 2, "token", False),
])
def test_logits_match_timm(tmp_path, num_layers, image, patch, classifier,
                           gn_4d):
    width = int(64 * WIDTH_FACTOR)
    stride = 4 * 2 ** max(len(num_layers) - 1, 0) * patch
    grid = image // stride
    res, channels = official.hybrid_arrays(num_layers=num_layers, width=width,
                                           gn_4d=gn_4d, seed=2)
    arrays = official.vit_arrays(patch=patch, grid=grid, num_classes=6,
                                 classifier=classifier, seed=2,
                                 channels=channels if num_layers else width,
                                 **TINY)
    arrays.update(res)
    path = official.write(tmp_path / "hybrid.npz", arrays)
    x = np.random.default_rng(0).uniform(-1, 1, (2, image, image, 3)).astype(
        "float32")

    ours = vit(image, patch, TINY["hidden"], TINY["layers"], TINY["heads"],
               TINY["mlp"], 6, classifier=classifier,
               resnet=dict(num_layers=num_layers, width_factor=WIDTH_FACTOR))
    zoo.load_weights(ours, path)
    got = np.asarray(ours.predict(x, verbose=0))
    ref = _timm_hybrid(num_layers, image, patch, classifier, 6, path)
    with torch.no_grad():
        want = ref(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    assert np.abs(want[0] - want[1]).max() > 1e-2
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


PARAMS_224_1000 = published_counts.of_family("+")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "R50+ViT-L/32" else n
    for n in PARAMS_224_1000])
def test_parameter_count(name):
    build = functools.partial(vit, image_size=224, num_classes=1000,
                              **parse(name).config)
    # The smallest allocated for real, the others counted as shapes only.
    assert count_params(build, allocate=name == "R+ViT-Ti/16") == (
        PARAMS_224_1000[name])


def test_every_registered_hybrid_is_pinned():
    from keras_vit.base import variants
    hybrids = {n for n in variants.REGISTERED if "+" in n}
    assert hybrids == set(PARAMS_224_1000)


def test_option_ii_folds_the_last_stage():
    # Grids and counts of 224-pixel R50 stems: built as shapes only
    # (conftest.shapes_only), the same variables without drawing them.
    a = shapes_only(lambda: vit(224, 1, 32, 1, 4, 64, 3, resnet=dict(
        num_layers=(3, 4, 6, 3), width_factor=0.5, fold_last_stage=True)))
    b = shapes_only(lambda: vit(224, 1, 32, 1, 4, 64, 3, resnet=dict(
        num_layers=(3, 4, 9), width_factor=0.5)))
    assert a.grid_size == b.grid_size == (14, 14)
    assert a.count_params() == b.count_params()
    c = shapes_only(lambda: vit(224, 1, 32, 1, 4, 64, 3, resnet=dict(
        num_layers=(3, 4, 6, 3), width_factor=0.5)))
    assert c.grid_size == (7, 7)  # option (i): stride 32
    assert parse("R50+ViT-B/16").config["resnet"]["num_layers"] == [3, 4, 9]
    assert parse("R50+ViT-B/32").config["resnet"]["num_layers"] == [3, 4, 6, 3]
    assert parse("R+ViT-Ti/16").config["patch_size"] == 8


def test_hybrid_round_trip_and_feature_map(tmp_path):
    import keras
    model = vit(64, 1, 32, 1, 4, 64, 3, resnet=dict(num_layers=(1, 1),
                                                    width_factor=0.5),
                include_top=False, pooling="token")
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(rng.standard_normal(w.shape).astype("float32") * 0.2)
    x = rng.uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    path = tmp_path / "h.keras"
    model.save(path)
    again = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(model(x)))
    fmap = keras_vit.models.feature_model(model, "resnet")
    assert tuple(fmap(x).shape) == (2, 8, 8, 256)


def test_hybrid_posemb_resize(tmp_path):
    res, channels = official.hybrid_arrays(num_layers=(1,), width=32, seed=3)
    arrays = official.vit_arrays(patch=1, grid=8, num_classes=6, seed=3,
                                 channels=channels, **TINY)
    arrays.update(res)
    model = vit(32, 1, 32, 2, 4, 64, 6, resnet=dict(num_layers=(1,),
                                                    width_factor=0.5))
    assert zoo.load_weights(model, arrays)["resized_posemb"] is None
    big = vit(64, 1, 32, 2, 4, 64, 6, resnet=dict(num_layers=(1,),
                                                  width_factor=0.5))
    report = zoo.load_weights(big, arrays)
    assert report["resized_posemb"] == (64, 256)


def test_hybrid_bad_input():
    with pytest.raises(ValueError, match=r"image_size=200"):
        vit(200, 1, 32, 1, 4, 64, 3, resnet=dict(num_layers=(3, 4, 9)))
    with pytest.raises(ValueError, match="width_factor"):
        vit(224, 1, 32, 1, 4, 64, 3, resnet=dict(num_layers=(1,),
                                                 width_factor=0.3))
    with pytest.raises(ValueError, match="unknown keys"):
        vit(224, 1, 32, 1, 4, 64, 3, resnet=dict(depth=50))
    res, channels = official.hybrid_arrays(num_layers=(1, 1), width=32)
    arrays = official.vit_arrays(patch=1, grid=8, num_classes=6,
                                 channels=channels, **TINY)
    arrays.update(res)
    other = vit(64, 1, 32, 2, 4, 64, 6, resnet=dict(num_layers=(1, 2),
                                                    width_factor=0.5))
    with pytest.raises(zoo.CheckpointError, match="block2/unit2"):
        zoo.load_weights(other, arrays)
