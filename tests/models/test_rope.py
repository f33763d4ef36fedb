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
