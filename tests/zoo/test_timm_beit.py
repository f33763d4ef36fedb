"""timm's BEiT folders (``beit.py``: BEiT, BEiT v2), written by timm
itself, read by ``zoo.load``: the 2D relative position bias of every
block (or the one shared table) goes onto the model through timm's
names, and the logits and the blocks' features are timm's. At a size the
tables were not built for, they are resampled as timm's
``checkpoint_filter_fn`` does, and the logits are those of timm's model
built at that size from the same file."""

import numpy as np
import pytest

import keras
from keras_vit import zoo
from keras_vit.zoo import position_tables
from testkit import (assert_close_to_timm, assert_features_are_timms,
                     random_images, random_timm_model, timm_forward,
                     timm_from_file)

pytestmark = pytest.mark.backends

# timm's BEiT arguments of the tiny models, and the one-table variant (as
# BEiT's pretraining builds it: no absolute table, whose resize is
# keras_vit's bilinear rule, not timm's bicubic one).
TINY = dict(depth=2, patch_size=8, embed_dim=32, num_heads=2)
SHARED = dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True,
              use_abs_pos_emb=False)


def _folder(tmp_path, arch, **kwargs):
    from timm.models import save_for_hf

    theirs = random_timm_model(arch, 32, 5, **dict(TINY, **kwargs))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    return theirs, tmp_path / "repo"


@pytest.mark.parametrize("arch, kwargs, bias", [
    ("beit_base_patch16_224", {}, "block"),
    ("beitv2_base_patch16_224", {}, "block"),
    # One table for every block, and the position table beside it.
    ("beit_base_patch16_224", dict(use_rel_pos_bias=False,
                                   use_shared_rel_pos_bias=True,
                                   use_abs_pos_emb=True), "shared"),
])
def test_beit_loads_with_timms_logits_and_features(tmp_path, arch, kwargs,
                                                   bias):
    theirs, repo = _folder(tmp_path, arch, **kwargs)
    ours = zoo.load(str(repo))
    assert ours.get_config()["relative_bias"] == bias
    x = random_images(32)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                         timm_forward(theirs, x))
    assert_features_are_timms(ours, theirs, x)


def _timm_resize(table, new_grid, old_grid=None, dtype="float32"):
    """timm's resize of a flat BEiT table on its default (torch) path, its
    coordinates and arithmetic in torch's default ``dtype``."""
    import torch
    from timm.layers import pos_embed_rel

    if pos_embed_rel._USE_SCIPY:
        pytest.skip("TIMM_USE_SCIPY_INTERP asks timm for unilm's cubic "
                    "scipy interp2d (gone from SciPy 1.14)")
    rows = (2 * new_grid[0] - 1) * (2 * new_grid[1] - 1) + 3
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        return pos_embed_rel.resize_rel_pos_bias_table(
            torch.from_numpy(table.astype(dtype)), new_window_size=new_grid,
            new_bias_shape=(rows, table.shape[1]),
            old_window_size=old_grid).numpy()
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("old_grid, new_grid, square", [
    ((4, 4), (6, 6), True), ((4, 4), (2, 2), True),  # up, down
    ((14, 14), (24, 24), True), ((24, 24), (14, 14), True),  # 224 <-> 384
    ((4, 4), (3, 5), True),  # to a non-square grid
    ((3, 5), (6, 4), False), ((1, 3), (2, 2), False),  # from one
])
def test_the_bias_table_resizes_as_timms(old_grid, new_grid, square):
    from testkit import assert_relative

    rng = np.random.default_rng(0)
    rows = (2 * old_grid[0] - 1) * (2 * old_grid[1] - 1) + 3
    table = rng.normal(size=(rows, 3)).astype("float32")
    # timm assumes a square source unless told (as when it loads a file).
    told = None if square else old_grid
    got = position_tables.resize_relative_bias(table, new_grid, told)
    want = _timm_resize(table, new_grid, told)
    assert got.shape == want.shape and got.dtype == table.dtype
    np.testing.assert_array_equal(got[-3:], table[-3:])  # the class token's
    # timm's float32 run rounds the spread offsets (up to 23 here) to
    # float32, 1e-6 apart: its tables are 1e-6 of their scale from ours.
    assert_relative(got, want, 1e-6)
    # In float64 the two are the same arithmetic.
    np.testing.assert_allclose(
        position_tables.resize_relative_bias(table.astype("float64"),
                                             new_grid, told),
        _timm_resize(table, new_grid, told, "float64"), rtol=0, atol=1e-12)


def test_a_bias_table_of_no_known_grid_is_refused():
    from keras_vit.zoo.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match="old_grid"):
        position_tables.resize_relative_bias(np.zeros((13, 2)), (2, 2))


@pytest.mark.parametrize("kwargs", [{}, SHARED], ids=["block", "shared"])
@pytest.mark.parametrize("size", [48, 16, (32, 48)])
def test_beit_at_another_size_has_timms_logits(tmp_path, kwargs, size):
    _, repo = _folder(tmp_path, "beit_base_patch16_224", **kwargs)
    ours = zoo.load(str(repo), image_size=size)
    # timm's model at that size, loading the file through its own filter.
    theirs = timm_from_file("beit_base_patch16_224", repo, 5, img_size=size,
                            **TINY, **kwargs)
    height, width = (size, size) if isinstance(size, int) else size
    x = random_images(height, width=width)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                         timm_forward(theirs, x))
