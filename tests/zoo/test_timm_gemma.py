"""timm's Gemma 4 vision towers (``gemma4_vit.py``): four RMS norms a
block, q/k norms and a value norm without a scale, unscaled logits, the
GeGLU MLP without biases, a position table per axis, the 2D rotary form
and a patch projection of ``2 * (x - 0.5)``, built by timm at two blocks
with random weights, written by timm's ``save_for_hf`` and loaded by
keras_vit with timm's outputs: with a classifier, headless (the
patches' mean through the scale-less norm), and at another size (the
tables read that grid's rows, the rotary form its indices)."""

import numpy as np
import pytest

import torch  # noqa: F401 (before TensorFlow: tests/conftest.py)

import keras  # noqa: E402

from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from testkit import (assert_close_to_timm, assert_refused_naming,  # noqa: E402
                     random_images, random_timm_model, timm_forward)

# Small sizes of the 570M tower's architecture: heads of 16 features (four
# quarters of 4: the rotary halves' pairs are not the adjacent ones).
SMALL = dict(embed_dim=64, num_heads=4, head_dim=16, intermediate_size=96,
             position_embedding_size=8)


def _gemma(folder, size=48, num_classes=5, arch="gemma4_vit_570m",
           **kwargs):
    theirs = random_timm_model(arch, size, num_classes, depth=2,
                               **dict(SMALL, **kwargs))
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


@pytest.mark.backends
@pytest.mark.parametrize("num_classes", [5, 0])
def test_gemma4_tower_loads_with_timms_outputs(num_classes, tmp_path):
    theirs = _gemma(tmp_path / "repo", num_classes=num_classes)
    # The file's data config says 768 px (Gemma 4's); its tables, 8 rows.
    ours = zoo.load(str(tmp_path / "repo"), image_size=48)
    config = ours.get_config()
    for key, value in dict(sandwich_norm=True, value_norm=True, mlp="geglu",
                           position_axes=8, rope="eva02", norm="rms",
                           qkv_bias=False, proj_bias=False).items():
        assert config[key] == value, key
    x = random_images(48)
    out = (keras.ops.convert_to_numpy(ours(x)) if num_classes
           else ours.predict(x, verbose=0))
    assert_close_to_timm(out, timm_forward(theirs, x))


@pytest.mark.parametrize("final_norm", [True, False])
def test_gemma4_pooled_features_are_normed_as_the_class_says(final_norm,
                                                            tmp_path):
    """timm's classifier norms the patches' mean (unless final_norm=False);
    its encoder's mean pool has no norm."""
    theirs = _gemma(tmp_path / "repo", num_classes=0, final_norm=final_norm)
    encoder = _gemma(tmp_path / "enc", num_classes=0,
                     arch="gemma4_vit_570m_enc", global_pool="avg")
    x = random_images(48)
    for folder, model in (("repo", theirs), ("enc", encoder)):
        ours = zoo.load(str(tmp_path / folder), image_size=48)
        assert_close_to_timm(ours.predict(x, verbose=0),
                             timm_forward(model, x))


def test_gemma4_tower_at_another_size_is_timms_forward_at_that_size(
        tmp_path):
    """timm's tower reads the position tables' rows and the rotary angles
    of any grid; keras_vit's, built at that size, the same."""
    theirs = _gemma(tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"), image_size=(64, 32))
    x = random_images(64, width=32)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))


def test_gemma4_position_table_bounds_the_grid(tmp_path):
    """A grid past the tables' rows is refused, naming the option."""
    _gemma(tmp_path / "repo")
    with pytest.raises(ValueError, match="position_axes=8"):
        zoo.load(str(tmp_path / "repo"), image_size=16 * 9)


@pytest.mark.parametrize("model_args, fields, named", [
    (dict(use_clipped_linears=True), {}, "use_clipped_linears"),
    (dict(num_kv_heads=2), {}, "num_kv_heads"),
    (dict(head_dim=8), {}, "head_dim"),
    (dict(encoder_pool="soft"), {}, "encoder_pool"),
    ({}, dict(global_pool="none"), "global_pool")])
def test_gemma4_settings_keras_vit_lacks_are_refused_by_name(
        model_args, fields, named, tmp_path):
    _gemma(tmp_path / "repo")
    assert_refused_naming(tmp_path / "repo", named, model_args, **fields)


def test_the_rotary_quarters_swap_keeps_every_dot_product():
    """Gemma 4's pairs (k, k + d/4) in each half, and keras_vit's (k, k +
    d/2) after the swap of the middle quarters, turn q and k alike: the
    logits of every pair of tokens agree."""
    from keras_vit.zoo.timm.gemma import _quarters_swapped

    rng = np.random.default_rng(0)
    d, f = 16, 4
    q, k = rng.normal(size=(2, 3, d))
    angles = rng.uniform(0, 6, size=(3, 2 * f))  # per token: x's, y's

    def gemma(v, a):  # rotate_half within each half, by x then y
        halves = np.split(v, 2, axis=-1)
        out = []
        for half, ang in zip(halves, np.split(a, 2, axis=-1)):
            ang = np.concatenate([ang, ang], -1)
            first, second = np.split(half, 2, axis=-1)
            out.append(half * np.cos(ang)
                       + np.concatenate([-second, first], -1) * np.sin(ang))
        return np.concatenate(out, -1)

    def ours(v, a):  # rotate_half over the whole head
        a = np.concatenate([a, a], -1)
        first, second = np.split(v, 2, axis=-1)
        return v * np.cos(a) + np.concatenate([-second, first], -1) * np.sin(a)

    want = gemma(q, angles) @ gemma(k, angles).T
    swap = lambda v: _quarters_swapped(v.T, d).T  # noqa: E731
    got = ours(swap(q), angles) @ ours(swap(k), angles).T
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_gemma4_encoders_soft_token_pool_is_refused_by_name(tmp_path):
    """The _enc towers' default pool (k x k cells, sqrt(D) and a
    standardisation) is none keras_vit computes."""
    _gemma(tmp_path / "enc", num_classes=0, arch="gemma4_vit_570m_enc")
    assert_refused_naming(tmp_path / "enc", "global_pool='soft'")
