"""timm's BEiT folders (``beit.py``: BEiT, BEiT v2), written by timm
itself, read by ``zoo.load``: the 2D relative position bias of every
block (or the one shared table) goes onto the model through timm's
names, and the logits and the blocks' features are timm's. A size the
tables were not built for is refused in one line."""

import pytest

import keras
from keras_vit import zoo
from testkit import (assert_close_to_timm, assert_features_are_timms,
                     random_images, random_timm_model, timm_forward)

pytestmark = pytest.mark.backends


def _folder(tmp_path, arch, **kwargs):
    from timm.models import save_for_hf

    theirs = random_timm_model(arch, 32, 5, depth=2, patch_size=8,
                               embed_dim=32, num_heads=2, **kwargs)
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


def test_a_size_the_bias_tables_do_not_fit_is_refused(tmp_path):
    _, repo = _folder(tmp_path, "beit_base_patch16_224")
    with pytest.raises(Exception) as e:
        zoo.load(str(repo), image_size=48)
    message = str(e.value)
    assert "relative_bias_0/table" in message or "relative_position_bias_table" in message, message
