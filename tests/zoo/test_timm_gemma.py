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


@pytest.mark.backends
@pytest.mark.parametrize("arch, num_classes", [
    ("gemma4_vit_167m", 5), ("gemma4_vit_167m_enc", 0)])
def test_gemma4_e4b_towers_clamp_every_projection_as_timms(arch,
                                                          num_classes,
                                                          tmp_path):
    """The E2B/E4B tower's projections clamp their inputs and outputs to
    bounds its file holds: random bounds inside the values' range (timm's
    ±inf would hide a clamp left out) give timm's outputs."""
    theirs = random_timm_model(arch, 96, num_classes, depth=2, **SMALL)
    rng = np.random.default_rng(3)
    with torch.no_grad():
        for name, buffer in theirs.named_buffers():
            if name.endswith(("_min", "_max")):
                low = name.endswith("_min")
                buffer.fill_(float(rng.uniform(-1.5, -0.3) if low
                                   else rng.uniform(0.3, 1.5)))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"), image_size=96)
    assert ours.get_config()["clip_linears"]
    x = random_images(96)
    want = timm_forward(theirs, x)
    assert_close_to_timm(ours.predict(x, verbose=0), want)
    # The clamps act: without them the outputs differ.
    for w in ours.weights:
        if w.path.endswith("/clip"):
            w.assign(np.tile(np.float32([-1e9, 1e9, -1e9, 1e9]),
                             (w.shape[0], 1)))
    assert not np.allclose(ours.predict(x, verbose=0), want, rtol=1e-3)


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
    (dict(num_kv_heads=2), {}, "num_kv_heads"),
    (dict(head_dim=8), {}, "head_dim"),
    (dict(global_pool="none"), {}, "model_args.global_pool")])
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


@pytest.mark.parametrize("arch, kwargs", [
    # The encoders' tokens: the soft-token pool (3 x 3 cells, sqrt(D),
    # the 31B tower's standardisation; the E4B's without), or all of them.
    ("gemma4_vit_570m_enc", {}),
    ("gemma4_vit_570m_enc", dict(standardize=False)),
    ("gemma4_vit_570m_enc", dict(global_pool="none")),
    # The classifier over the soft-pooled tokens.
    ("gemma4_vit_570m", dict(encoder_pool="soft")),
])
def test_gemma4_soft_token_pool_and_tokens_are_timms(arch, kwargs,
                                                     tmp_path):
    theirs = _gemma(tmp_path / "repo", size=96, arch=arch,
                    num_classes=5 if "enc" not in arch else 0, **kwargs)
    ours = zoo.load(str(tmp_path / "repo"), image_size=96)
    x = random_images(96)
    assert_close_to_timm(ours.predict(x, verbose=0), timm_forward(theirs, x))


def test_gemma4_soft_token_pool_needs_whole_cells(tmp_path):
    """A grid the 3 x 3 cells do not tile (timm raises at the forward) is
    refused at the build, naming the option."""
    _gemma(tmp_path / "enc", num_classes=0, arch="gemma4_vit_570m_enc")
    with pytest.raises(ValueError, match="soft_pool=3 .* 4 x 4"):
        zoo.load(str(tmp_path / "enc"), image_size=64)


@pytest.mark.parametrize("arch", ["gemma4_vit_570m", "gemma4_vit_570m_enc"])
def test_gemma4_block_features_are_timms_forward_intermediates(arch,
                                                              tmp_path):
    """Dense-task features: each block's tokens as an NHWC map at the
    patch grid, timm's NCHW maps of the same blocks (the classifier's and
    the encoder's own forward_intermediates)."""
    from testkit import assert_features_are_timms

    theirs = _gemma(tmp_path / "repo", num_classes=0, arch=arch)
    ours = zoo.load(str(tmp_path / "repo"), image_size=48)
    assert_features_are_timms(ours, theirs, random_images(48),
                              prefix_tokens=False)
