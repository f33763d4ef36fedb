"""timm's Qwen vision towers (``qwen3_vit.py``: the Qwen3-VL and Qwen3.5
image encoders), written by timm itself, read by ``zoo.load``: the
classifier, the classifier over the patch merger (``_merge``) and the
encoder whose output is the merger's tokens (``_enc``), each with timm's
outputs at two image sizes (the learned table resized per image as timm
does) and the blocks' features as timm's ``forward_intermediates``. What
keras_vit does not compute is refused in one line naming it."""

import pytest

import keras
import torch
from keras_vit import zoo
from testkit import (assert_close_to_timm, assert_features_are_timms,
                     assert_refused_naming, random_images, timm_forward)

pytestmark = pytest.mark.backends

# Small towers: two blocks 32 wide, 8-pixel patches, the table a 6 x 6
# grid (timm's pos_embed_grid_size) that neither image size matches.
SMALL = dict(depth=2, embed_dim=32, num_heads=2, patch_size=8,
             pos_embed_grid_size=6)


def _folder(tmp_path, arch, **kwargs):
    import timm
    from timm.models import save_for_hf

    from testkit import randomise_torch

    torch.manual_seed(0)
    theirs = randomise_torch(timm.create_model(
        arch, pretrained=False, img_size=32, **SMALL, **kwargs), seed=None)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    return theirs, tmp_path / "repo"


@pytest.mark.parametrize("arch, kwargs", [
    ("qwen3_vit_88m", dict(num_classes=5)),
    ("qwen3_vit_88m_merge", dict(num_classes=5, out_features=24)),
    ("qwen3_vit_88m_enc", dict(out_features=24)),
    # The encoder without the merger's last projection, mean-pooled.
    ("qwen3_vit_88m_enc", dict(out_features=0, global_pool="avg")),
])
def test_qwen_towers_load_with_timms_outputs_at_two_sizes(tmp_path, arch,
                                                          kwargs):
    theirs, repo = _folder(tmp_path, arch, **kwargs)
    ours = zoo.load(str(repo))
    config = ours.get_config()
    assert (config["rope"], config["rope_halves"], config["class_token"],
            config["gelu"]) == ("eva02", True, False, "tanh")
    merged = kwargs.get("global_pool", "merge") == "merge" and arch != (
        "qwen3_vit_88m")
    assert config["merge_size"] == (2 if merged else 0)
    for height, width in ((32, 32), (48, 64)):
        x = random_images(height, width=width)
        want = timm_forward(theirs, x)
        got = keras.ops.convert_to_numpy(ours(x))
        assert got.shape == want.shape
        assert_close_to_timm(got, want)
    # The blocks' features, as timm's forward_intermediates.
    assert_features_are_timms(ours, getattr(theirs, "encoder", theirs), x,
                              prefix_tokens=False)


@pytest.mark.parametrize("setting, named", [
    (dict(act_layer="gelu"), "model_args.act_layer"),
    (dict(merge_size=1), "model_args.merge_size"),
    (dict(global_pool="max"), "model_args.global_pool"),
    (dict(deepstack=True), "model_args.deepstack"),
])
def test_a_qwen_setting_keras_vit_does_not_compute_is_named(
        tmp_path, setting, named):
    _, repo = _folder(tmp_path, "qwen3_vit_88m_merge", num_classes=5,
                      out_features=24)
    assert_refused_naming(repo, named, setting)


def test_an_image_the_merger_cannot_split_is_refused(tmp_path):
    _, repo = _folder(tmp_path, "qwen3_vit_88m_enc", out_features=24)
    ours = zoo.load(str(repo))
    with pytest.raises(ValueError, match="multiples of 16"):
        ours(random_images(24, width=32))
