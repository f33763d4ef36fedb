"""timm's NaFlexVit (``naflexvit.py``), written by timm itself, read by
``zoo.load`` as a NaFlex model (``naflex=True``): each architecture
family keras_vit computes, a tiny random model, against timm's own
forward on one dict batch of mixed grids (the table shrunk, kept and
enlarged, other aspect ratios) with padding. What keras_vit does not
compute is refused in one line naming the setting and the closest one
it computes."""

import numpy as np
import pytest

import keras
import torch
from keras_vit import zoo
from keras_vit.data import naflex
from keras_vit.zoo.formats import FormatError
from testkit import assert_refused_naming, assert_relative, randomise_torch

pytestmark = pytest.mark.backends

# Two blocks 32 wide, 4-pixel patches, a 4 x 4 table (timm's
# pos_embed_grid_size).
SMALL = dict(depth=2, embed_dim=32, num_heads=2, patch_size=4,
             pos_embed_grid_size=(4, 4), num_classes=5)
GRIDS = ((3, 5), (6, 2), (4, 4), (1, 7), (7, 9))


def _folder(tmp_path, arch, **kwargs):
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(0)
    theirs = randomise_torch(timm.create_model(
        arch, pretrained=False, **dict(SMALL, **kwargs)), seed=None)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    return theirs, tmp_path / "repo"


def _batches():
    """keras_vit's NaFlex batch and timm's dict of the same arrays."""
    rng = np.random.default_rng(3)
    images = [rng.uniform(-1, 1, (4 * r, 4 * c, 3)).astype("float32")
              for r, c in GRIDS]
    ours = naflex.patchify(images, 4, max_patches=66, resize=False)
    return ours, {"patches": torch.from_numpy(ours["patches"]),
                  "patch_coord": torch.from_numpy(
                      ours["patch_coords"]).long(),
                  "patch_valid": torch.from_numpy(
                      ours["patch_mask"]).bool()}


# timm architecture -> (its own arguments here, what keras_vit builds).
FAMILIES = {
    # SigLIP 2's NaFlex towers: the bilinear resize, the attention pool.
    "naflexvit_base_patch16_siglip": ({}, dict(
        position_resize="bilinear_aa", classifier="map", gelu="tanh",
        class_token=False)),
    "naflexvit_so400m_patch16_siglip": (dict(embed_dim=36), dict(
        position_resize="bilinear_aa", classifier="map", mlp_dim=134)),
    # timm's own: the bicubic resize, registers, layer scale.
    "naflexvit_base_patch16_gap": ({}, dict(
        position_resize="bicubic_aa", classifier="gap", num_registers=4,
        fc_norm=True, layer_scale=1e-5, gelu="exact")),
    "naflexvit_base_patch16_map": ({}, dict(
        position_resize="bicubic_aa", classifier="map", num_registers=1)),
    "naflexvit_so150m2_patch16_reg1_gap": (dict(embed_dim=26), dict(
        position_resize="bicubic_aa", classifier="gap", qkv_bias=False,
        mlp_dim=68)),
    "naflexvit_so150m2_patch16_reg1_map": (dict(embed_dim=26), dict(
        classifier="map", qkv_bias=False)),
    # The aspect ratio kept: each image's table resized to a square of its
    # longer side and cropped (but the table's own grid, read as it is);
    # C-RADIO's resizes without antialiasing, with aligned corners (v3)
    # or without (v4).
    "naflexvit_base_patch16_par_gap": ({}, dict(
        position_resize="bicubic_aa", position_aspect=True,
        classifier="gap", num_registers=4)),
    "naflexvit_base_patch16_radio_v3": ({}, dict(
        position_resize="bilinear_corners", position_aspect=True,
        classifier="token", class_token=True, final_norm=False)),
    "naflexvit_huge_patch16_radio_v4": (dict(embed_dim=32, num_heads=2),
                                        dict(position_resize="bilinear",
                                             position_aspect=True)),
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_naflexvit_loads_with_timms_outputs_on_mixed_grids(tmp_path, arch):
    kwargs, builds = FAMILIES[arch]
    theirs, repo = _folder(tmp_path, arch, **kwargs)
    ours = zoo.load(str(repo))
    config = ours.get_config()
    assert config["naflex"] is True and config["image_size"] == 16
    assert config["posemb_includes_prefix"] is False
    assert {k: config[k] for k in builds} == builds
    batch, timms = _batches()
    with torch.no_grad():
        want = theirs(timms).numpy()
    got = keras.ops.convert_to_numpy(ours(batch, training=False))
    assert_relative(got, want, 1e-5, 1e-6)


@pytest.mark.parametrize("arch, named, closest", [
    ("naflexvit_base_patch16_parfac_gap", "pos_embed='factorized'",
     "pos_embed='learned'"),
])
def test_an_architecture_keras_vit_does_not_compute_is_named(
        tmp_path, arch, named, closest):
    _, repo = _folder(tmp_path, arch, depth=1)
    with pytest.raises(FormatError) as e:
        zoo.load(str(repo))
    message = str(e.value)
    assert named in message and closest in message, message
    assert "field architecture" in message and "\n" not in message


@pytest.mark.parametrize("setting, named", [
    (dict(pos_embed_interp_mode="nearest"), "model_args.pos_embed_interp_mode"),
    # Aligned corners with antialiasing: no kernel of keras_vit's.
    (dict(pos_embed_align_corners=True), "bilinear (antialias=False, "
     "align_corners=True)"),
    (dict(pos_embed_use_grid_sample=True), "model_args.pos_embed_use_grid"),
    (dict(rope_type="axial"), "rope_type=''"),
    (dict(patchify_channels_last=False), "patchify_channels_last=True"),
    (dict(attn_pool_mlp_ratio=2.0), "model_args.attn_pool_mlp_ratio"),
    (dict(sapiens=True), "model_args.sapiens"),
])
def test_a_naflex_setting_keras_vit_does_not_compute_is_named(
        tmp_path, setting, named):
    _, repo = _folder(tmp_path, "naflexvit_base_patch16_siglip", depth=1)
    assert_refused_naming(repo, named, setting)
