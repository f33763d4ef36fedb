"""Parity with timm, an implementation nobody here wrote.

Random checkpoints in the official layout are loaded by timm's own npz loader
and by keras_vit; logits (or, for pre_logits, the features before it) must
agree to 1e-5. timm runs with tanh GELU, as the official model does.
"""

import functools

import numpy as np
import pytest

import official
from conftest import TINY, tiny_builder_kwargs

import torch
import timm.models.vision_transformer as timm_vit

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends


def _timm_model(classifier, num_classes, path):
    model = timm_vit.VisionTransformer(
        img_size=TINY["patch"] * TINY["grid"], patch_size=TINY["patch"],
        embed_dim=TINY["hidden"], depth=TINY["layers"],
        num_heads=TINY["heads"], mlp_ratio=TINY["mlp"] / TINY["hidden"],
        num_classes=num_classes,
        global_pool="token" if classifier == "token" else "avg",
        class_token=classifier == "token", fc_norm=False,
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"))
    model.load_pretrained(str(path))
    return model.eval()


def _images(n=3, seed=1):
    side = TINY["patch"] * TINY["grid"]
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (n, side, side, 3)).astype("float32")


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("layout", ["old", "new", "stacked"])
def test_logits_match_timm(tmp_path, classifier, layout):
    arrays = official.vit_arrays(**TINY, num_classes=11, classifier=classifier,
                                 seed=3, layout=layout)
    path = official.write(tmp_path / "ckpt.npz", arrays)
    x = _images()
    ours = keras_vit.models.vit(**tiny_builder_kwargs(classifier, num_classes=11))
    zoo.load_weights(ours, path)
    got = np.asarray(ours.predict(x, verbose=0))
    ref = _timm_model(classifier, 11, path)
    with torch.no_grad():
        want = ref(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    assert got.shape == want.shape == (3, 11)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # Guard against a vacuous pass: logits must differ between images.
    assert np.abs(want[0] - want[1]).max() > 1e-2


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_representation_size_matches_timm_features(tmp_path, classifier):
    """timm drops pre_logits: compare the pooled features before it, then
    apply the checkpoint's pre_logits and head by hand in NumPy."""
    arrays = official.vit_arrays(**TINY, num_classes=5, classifier=classifier,
                                 representation_size=24, seed=4)
    path = official.write(tmp_path / "ckpt.npz", arrays)
    x = _images()
    ours = keras_vit.models.vit(**tiny_builder_kwargs(
        classifier, representation_size=24, num_classes=5))
    zoo.load_weights(ours, path)
    feats = keras_vit.models.vit(**tiny_builder_kwargs(classifier),
                                 include_top=False, pooling=classifier)
    # The same checkpoint without pre_logits and head: pooled features.
    no_head = {k: v for k, v in arrays.items()
               if not k.startswith(("pre_logits/", "head/"))}
    zoo.load_weights(feats, no_head)

    ref = _timm_model(classifier, 0, path)
    with torch.no_grad():
        pooled = ref(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(np.asarray(feats.predict(x, verbose=0)), pooled,
                               atol=1e-5, rtol=0)
    pre = np.tanh(pooled @ arrays["pre_logits/kernel"] + arrays["pre_logits/bias"])
    want = pre @ arrays["head/kernel"] + arrays["head/bias"]
    np.testing.assert_allclose(np.asarray(ours.predict(x, verbose=0)), want,
                               atol=1e-5, rtol=0)
