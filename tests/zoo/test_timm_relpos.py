"""timm's relative-position ViTs (``vision_transformer_relpos.py``): the
relative position MLP of log-spaced offsets per block or shared, with
and without a class token, pre-norm blocks with layer scale and
post-norm blocks, built by timm at two blocks with random weights,
written by timm's ``save_for_hf`` and loaded by keras_vit with timm's
logits, at timm's size and at another (the MLP reads the new grid's
offsets, as timm's does)."""

import pytest

import torch  # noqa: F401 (before TensorFlow: tests/conftest.py)

from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from testkit import (assert_close_to_timm, assert_refused_naming,  # noqa: E402
                     random_images, random_timm_model, timm_forward)

# timm architecture -> (timm's arguments over it, what keras_vit builds).
CASES = {
    "vit_relpos_medium_patch16_224": (dict(embed_dim=64, num_heads=2), dict(
        relative_mlp="block", classifier="gap", fc_norm=True,
        class_token=False, layer_scale=1e-6, qkv_bias=False)),
    "vit_srelpos_small_patch16_224": (dict(embed_dim=64, num_heads=2,
                                           rel_pos_dim=48), dict(
        relative_mlp="shared", relative_mlp_width=48, fc_norm=False)),
    "vit_relpos_medium_patch16_cls_224": (dict(embed_dim=64, num_heads=2,
                                               rel_pos_dim=32), dict(
        classifier="token", class_token=True, relative_mlp_width=32)),
    "vit_relpos_small_patch16_rpn_224": (dict(embed_dim=64, num_heads=2),
                                         dict(post_norm=True,
                                              layer_scale=None)),
    "vit_relpos_base_patch16_clsgap_224": (dict(embed_dim=64, num_heads=2),
                                           dict(class_token=True,
                                                classifier="gap")),
}


def _relpos(arch, folder, size=48):
    theirs = random_timm_model(arch, size, 5, depth=2, **CASES[arch][0])
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


@pytest.mark.parametrize("arch", sorted(CASES))
def test_relpos_vit_loads_with_timms_logits(arch, tmp_path):
    theirs = _relpos(arch, tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    for key, value in CASES[arch][1].items():
        assert config[key] == value, key
    x = random_images(48)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))


def test_relpos_vit_at_another_size_is_timms_forward_at_that_size(tmp_path):
    """timm's model at another size computes its MLP over that grid's
    offsets (its weights unchanged); so does keras_vit's at that size."""
    arch = "vit_relpos_medium_patch16_cls_224"
    theirs = _relpos(arch, tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"), image_size=(64, 32))
    again = random_timm_model(arch, (64, 32), 5, depth=2, **CASES[arch][0])
    again.load_state_dict(theirs.state_dict())
    x = random_images(64, width=32)
    assert_close_to_timm(ours(x), timm_forward(again, x))


@pytest.mark.parametrize("model_args, fields, named", [
    (dict(rel_pos_type="bias"), {}, "rel_pos_type"),
    (dict(block_fn="ParallelBlock"), {}, "block_fn"),
    (dict(global_pool="map"), {}, "model_args.global_pool")])
def test_relpos_settings_keras_vit_lacks_are_refused_by_name(
        model_args, fields, named, tmp_path):
    _relpos("vit_relpos_medium_patch16_224", tmp_path / "repo")
    assert_refused_naming(tmp_path / "repo", named, model_args, **fields)
