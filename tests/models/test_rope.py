"""Rotary position embeddings (the ``rope`` option) against timm, an
implementation nobody here wrote: timm's EVA model in DINOv3's
configuration (rotary embeddings of DINOv3's form, register tokens, layer
scale, no q/k/v bias, no position table), random weights put onto
keras_vit's model through timm's EVA names, gives the same logits at the
size it was built for and, with ``dynamic_image_size``, at others."""

import functools

import numpy as np
import pytest

import keras
import torch
from timm.models.eva import Eva

import keras_vit
from keras_vit.zoo import layouts
from keras_vit.zoo.timm.layout import TIMM_EVA
from testkit import assert_features_are_timms

pytestmark = pytest.mark.backends

SIZE, PATCH, WIDTH, HEADS = 32, 8, 32, 2


def _timm(temperature):
    torch.manual_seed(0)
    model = Eva(img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=2,
                num_heads=HEADS, qkv_bias=False, init_values=1e-5,
                rope_type="dinov3", rope_temperature=temperature,
                rope_rotate_half=True, use_rot_pos_emb=True,
                use_abs_pos_emb=False, num_reg_tokens=4, use_fc_norm=False,
                norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-5),
                dynamic_img_size=True, num_classes=5).eval()
    with torch.no_grad():  # no weight at its initial 0 or 1 hides a term
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def _ours(temperature, **kwargs):
    return keras_vit.vit(
        image_size=SIZE, patch_size=PATCH, hidden_size=WIDTH, num_layers=2,
        num_heads=HEADS, mlp_dim=4 * WIDTH, num_classes=5, classifier="gap",
        class_token=True, num_registers=4, position_embedding="none",
        layer_scale=1e-5, qkv_bias=False, gelu="exact",
        layer_norm_epsilon=1e-5, rope="dinov3",
        rope_temperature=temperature, **kwargs)


def _logits(model, images):
    with torch.no_grad():
        return model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()


@pytest.mark.parametrize("temperature", [100.0, 10000.0])
def test_dinov3_rope_gives_timms_logits_at_any_size(temperature):
    reference = _timm(temperature)
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    ours = _ours(temperature, dynamic_image_size=True)
    layouts.load(ours, TIMM_EVA, state, source_name="timm EVA")
    rng = np.random.default_rng(1)
    for height, width in ((SIZE, SIZE), (48, 32), (16, 40)):
        images = rng.uniform(-1, 1, (2, height, width, 3)).astype("float32")
        got = keras.ops.convert_to_numpy(ours(images))
        want = _logits(reference, images)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        assert np.abs(want[0] - want[1]).max() > 1e-3  # not vacuous


# timm's EVA in the configurations of the families that use its rotary
# forms: EVA-02 CLIP's block (q, k, v apart with no key bias, a norm before
# the attention's output projection, the SwiGLU MLP with a norm inside);
# RoPE-ViT and Perception Encoder's (timm's RoPE attention, columns'
# angles first, indices offset by 1; DINOv3's form offset and by columns
# too). Each on a reference grid unlike the model's, so the coordinates
# are scaled at every size. timm's arguments, then keras_vit's.
_FORMS = {
    "eva02": (dict(qkv_fused=False, mlp_ratio=4 * 2 / 3, swiglu_mlp=True,
                   scale_mlp=True, scale_attn_inner=True),
              dict(mlp_dim=int(WIDTH * 4 * 2 / 3), classifier="gap",
                   fc_norm=True, mlp="swiglu", mlp_norm=True,
                   attention_norm=True, rope="eva02", rope_grid=(3, 5),
                   rope_temperature=10000.0)),
    "rope_vit_pe": (dict(attn_type="rope", rope_grid_indexing="xy",
                         rope_grid_offset=1.0, rope_temperature=100.0,
                         global_pool="token", init_values=1e-5),
                    dict(mlp_dim=4 * WIDTH, classifier="token",
                         layer_scale=1e-5, rope="eva02", rope_grid=(3, 5),
                         rope_temperature=100.0, rope_indexing="xy",
                         rope_offset=1.0)),
    # Perception Encoder core: the norm before the blocks (no patch
    # bias) and its attention pool, of its own heads, over every token.
    "pe_core": (dict(attn_type="rope", rope_grid_indexing="xy",
                     rope_grid_offset=1.0, global_pool="map",
                     attn_pool_num_heads=4, use_pre_transformer_norm=True),
                dict(mlp_dim=4 * WIDTH, classifier="map", pre_norm=True,
                     patch_bias=False, pool_heads=4, pool_prefix=True,
                     rope="eva02", rope_grid=(3, 5), rope_temperature=1e4,
                     rope_indexing="xy", rope_offset=1.0)),
    # EVA-02's coordinates with the halves turned (Qwen's vision towers).
    "eva02_halves": (dict(rope_rotate_half=True, attn_type="rope",
                          rope_temperature=1e4),
                     dict(mlp_dim=4 * WIDTH, classifier="gap", fc_norm=True,
                          rope="eva02", rope_halves=True, rope_grid=(3, 5),
                          rope_temperature=1e4)),
    # RoPE-ViT's mixed form: learned frequencies per block and head.
    "mixed": (dict(rope_type="mixed", attn_type="rope",
                   rope_grid_indexing="xy", rope_temperature=10.0,
                   global_pool="token", init_values=1e-5),
              dict(mlp_dim=4 * WIDTH, classifier="token", layer_scale=1e-5,
                   rope="mixed", rope_temperature=10.0, rope_indexing="xy")),
    "dinov3_xy": (dict(rope_type="dinov3", rope_rotate_half=True,
                       rope_grid_indexing="xy", rope_grid_offset=0.5,
                       rope_temperature=100.0),
                  dict(mlp_dim=4 * WIDTH, classifier="gap", fc_norm=True,
                       rope="dinov3", rope_temperature=100.0,
                       rope_indexing="xy", rope_offset=0.5)),
}


def _timm_form(form, abs_pos):
    torch.manual_seed(0)
    model = Eva(img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=2,
                num_heads=HEADS, use_rot_pos_emb=True, ref_feat_shape=(3, 5),
                use_abs_pos_emb=abs_pos, dynamic_img_size=True,
                num_classes=5, **_FORMS[form][0]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("form, abs_pos", [("eva02", False),
                                           ("eva02", True),
                                           ("rope_vit_pe", False),
                                           ("pe_core", False),
                                           ("eva02_halves", True),
                                           ("mixed", False),
                                           ("dinov3_xy", False)])
def test_the_rotary_families_give_timms_logits(form, abs_pos):
    """The rotary forms and their options (rope_grid, rope_offset,
    rope_indexing) and EVA-02's blocks (mlp_norm, attention_norm), read
    from timm's names: without a position table at any size, with one
    (resized by another rule than timm's) at the size it was built for;
    and each block's features as timm's forward_intermediates."""
    from keras_vit.zoo.timm import eva

    reference = _timm_form(form, abs_pos)
    state = eva.with_key_biases(
        {k: v.numpy() for k, v in reference.state_dict().items()})
    ours = keras_vit.vit(
        image_size=SIZE, patch_size=PATCH, hidden_size=WIDTH, num_layers=2,
        num_heads=HEADS, num_classes=5, class_token=True, gelu="exact",
        position_embedding="learned_1d" if abs_pos else "none",
        dynamic_image_size=not abs_pos, **_FORMS[form][1])
    layouts.load(ours, TIMM_EVA, state, source_name="timm EVA")
    rng = np.random.default_rng(1)
    sizes = ((SIZE, SIZE),) if abs_pos else ((SIZE, SIZE), (48, 32),
                                            (16, 40))
    for height, width in sizes:
        images = rng.uniform(-1, 1, (2, height, width, 3)).astype("float32")
        got = keras.ops.convert_to_numpy(ours(images))
        want = _logits(reference, images)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        assert np.abs(want[0] - want[1]).max() > 1e-3
    # Dense-task features: each block's patch map and prefix tokens, as
    # timm's forward_intermediates gives them.
    assert_features_are_timms(ours, reference, images)
