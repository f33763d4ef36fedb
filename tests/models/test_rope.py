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


def _timm_eva02(abs_pos):
    torch.manual_seed(0)
    # EVA-02 CLIP's block: q, k, v apart (no key bias), a norm before the
    # attention's output projection, the SwiGLU MLP with a norm inside,
    # rotary embeddings of EVA-02's form on a reference grid unlike the
    # model's (coordinates scaled at every size).
    model = Eva(img_size=SIZE, patch_size=PATCH, embed_dim=WIDTH, depth=2,
                num_heads=HEADS, qkv_fused=False, mlp_ratio=4 * 2 / 3,
                swiglu_mlp=True, scale_mlp=True, scale_attn_inner=True,
                use_rot_pos_emb=True,
                ref_feat_shape=(3, 5), use_abs_pos_emb=abs_pos,
                dynamic_img_size=True, num_classes=5).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("abs_pos", [False, True])
def test_eva02_rope_and_block_give_timms_logits(abs_pos):
    """EVA-02's options (rope="eva02" with rope_grid, mlp_norm,
    attention_norm, the SwiGLU MLP) read from timm's names; without a position table at any
    size, with one (resized by another rule than timm's) at the size it
    was built for."""
    from keras_vit.zoo.timm import eva

    reference = _timm_eva02(abs_pos)
    state = eva.with_key_biases(
        {k: v.numpy() for k, v in reference.state_dict().items()})
    ours = keras_vit.vit(
        image_size=SIZE, patch_size=PATCH, hidden_size=WIDTH, num_layers=2,
        num_heads=HEADS, mlp_dim=int(WIDTH * 4 * 2 / 3), num_classes=5,
        classifier="gap", class_token=True, fc_norm=True, gelu="exact",
        position_embedding="learned_1d" if abs_pos else "none",
        mlp="swiglu", mlp_norm=True, attention_norm=True, rope="eva02",
        rope_grid=(3, 5),
        rope_temperature=10000.0, dynamic_image_size=not abs_pos)
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
