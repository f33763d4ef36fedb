"""timm's EVA folders (DINOv3 here), written by timm itself, read by
``zoo.load``: the model's options come from the folder's architecture and
``model_args``, the weights go onto the model through EVA's names, and
the logits are timm's at the size it was built for and, the DINOv3
models being dynamic-size, at another. What keras_vit does not compute
is refused in one line naming the argument."""


import pytest

import keras
from keras_vit import zoo
from testkit import (assert_close_to_timm, assert_refused_naming,
                     random_images, random_timm_model, timm_forward,
                     timm_from_file)

pytestmark = pytest.mark.backends

CLASSES = 5


def _folder(tmp_path, arch, **kwargs):
    from timm.models import save_for_hf

    theirs = random_timm_model(arch, 32, CLASSES, depth=2, **kwargs)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    return theirs, tmp_path / "repo"


@pytest.mark.parametrize("arch, kwargs", [
    ("vit_small_patch16_dinov3", dict(patch_size=8)),
    # Biases on the query and value (the key's are EVA's zeros).
    ("vit_small_patch16_dinov3_qkvb", dict(patch_size=8)),
    # The unpacked SwiGLU MLP, its width aligned to 8.
    ("vit_small_plus_patch16_dinov3", dict(patch_size=8)),
])
def test_dinov3_loads_with_timms_logits_at_two_sizes(tmp_path, arch, kwargs):
    theirs, repo = _folder(tmp_path, arch, **kwargs)
    ours = zoo.load(str(repo))
    config = ours.get_config()
    assert (config["rope"], config["num_registers"],
            config["position_embedding"], config["classifier"]) == (
        "dinov3", 4, "none", "gap")
    assert config["dynamic_image_size"] is True
    for size in (32, 48):
        x = random_images(size)
        assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                             timm_forward(theirs, x))


@pytest.mark.parametrize("arch", ["eva02_tiny_patch14_224",
                                  "vit_pe_core_tiny_patch16_384"])
@pytest.mark.parametrize("size", [16, 48])
def test_at_another_size_the_model_is_timms_built_there(tmp_path, arch,
                                                       size):
    """A table and EVA-02's rotary form (Perception Encoder's too) at
    another image size: the logits of timm's model created at that size
    from the same file, its table resized by timm's own filter (bicubic,
    antialiased), its rotary grid scaled."""
    _, repo = _folder(tmp_path, arch, patch_size=8)
    ours = zoo.load(str(repo), image_size=size)
    assert ours.get_config()["position_resize"] == "bicubic_aa"
    theirs = timm_from_file(arch, repo, CLASSES, img_size=size, depth=2,
                            patch_size=8)
    x = random_images(size)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                         timm_forward(theirs, x))


@pytest.mark.parametrize("setting, named", [
    (dict(attn_only_layer_scale=True), "model_args.attn_only_layer_scale"),
    (dict(rope_shift_coords=0.5), "model_args.rope_shift_coords"),
    (dict(rope_type="mrope"), "model_args.rope_type"),
    (dict(num_kv_heads=2), "model_args.num_kv_heads"),
    (dict(gated_attn=True), "model_args.gated_attn"),
])
def test_an_eva_setting_keras_vit_does_not_compute_is_named(
        tmp_path, setting, named):
    _, repo = _folder(tmp_path, "vit_small_patch16_dinov3", patch_size=8)
    assert_refused_naming(repo, named, setting)
