"""timm's SAM image encoders (``vision_transformer_sam.py``): windowed
attention with global blocks, the decomposed relative positions and the
convolutional neck, built by timm at a few blocks with random weights,
written by timm's ``save_for_hf`` and loaded by keras_vit with timm's
outputs, at timm's size and at others (the position table resized as
timm's forward resizes it, the global blocks' relative tables too)."""


import numpy as np
import pytest

import torch

from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from testkit import (assert_close_to_timm, assert_refused_naming,  # noqa: E402
                     random_images, random_timm_model, timm_forward)

# A SAM of a 4 x 4 grid of patches, windows of 3 (padded to 6), block 1
# global; its neck to 16 channels.
SAM = dict(embed_dim=32, num_heads=2, window_size=3,
           global_attn_indexes=[1], neck_chans=16)


def _sam(folder, num_classes=0, depth=3, **kwargs):
    theirs = random_timm_model("samvit_base_patch16", 64, num_classes,
                               depth=depth, **dict(SAM, **kwargs))
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


@pytest.mark.parametrize("num_classes", [0, 5])
def test_sam_loads_with_timms_outputs(num_classes, tmp_path):
    """Headless (timm's SAM tags: the neck's map pooled) and with a
    classifier head (timm's ``head.fc``)."""
    theirs = _sam(tmp_path / "repo", num_classes)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    assert (config["window_size"], config["global_blocks"],
            config["decomposed_bias"], config["neck"]) == (3, [1], True, 16)
    assert config["class_token"] is False and config["final_norm"] is False
    x = random_images(64)
    assert ours(x).shape == (2, num_classes or 16)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))


def test_sam_at_another_size_is_timms_forward_at_that_size(tmp_path):
    """timm's SAM runs any size: its table resized (bicubic, antialiased),
    its global blocks' relative tables too (linearly), its windows padded.
    keras_vit loaded at that size computes the same."""
    theirs = _sam(tmp_path / "repo", 5)
    ours = zoo.load(str(tmp_path / "repo"), image_size=(96, 80))
    x = random_images(96, width=80)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))


def test_sam_intermediate_features_are_timms(tmp_path):
    """forward_intermediates: each block's map (timm's NCHW, ours NHWC)."""
    theirs = _sam(tmp_path / "repo", depth=2, global_attn_indexes=[0])
    ours = zoo.load(str(tmp_path / "repo"))
    images = random_images(64)
    features = ours.intermediate_model([0, 1], prefix_tokens=False)(images)
    with torch.no_grad():
        timms = theirs.forward_intermediates(
            torch.from_numpy(images).permute(0, 3, 1, 2), indices=[0, 1],
            intermediates_only=True)
    for i, maps in enumerate(timms):
        np.testing.assert_allclose(
            np.asarray(features[f"block_{i}"]),
            maps.numpy().transpose(0, 2, 3, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_args, fields, named", [
    (dict(use_rope=True, use_rel_pos=False), {}, "use_rope"),
    (dict(neck_chans=None), {}, "neck_chans"),
    (dict(head_hidden_size=64), {}, "head_hidden_size"),
    (dict(global_pool="token"), {}, "model_args.global_pool"),
    (dict(window_attn="shifted"), {}, "window_attn")])
def test_sam_settings_keras_vit_lacks_are_refused_by_name(
        model_args, fields, named, tmp_path):
    _sam(tmp_path / "repo", depth=1)
    assert_refused_naming(tmp_path / "repo", named, model_args, **fields)


def test_writing_sam_as_timms_vit_is_refused_in_one_line(tmp_path):
    """timm's ViT has no windows: save_pretrained names the option."""
    _sam(tmp_path / "repo", depth=1)
    ours = zoo.load(str(tmp_path / "repo"))
    with pytest.raises(ValueError, match="window_size") as refused:
        zoo.save_pretrained(ours, tmp_path / "back")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "back" / "model.safetensors").exists()
