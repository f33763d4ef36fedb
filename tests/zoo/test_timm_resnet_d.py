"""timm's ResNet-D hybrids (``vit_*_resnet26d_224``,
``vit_small_resnet50d_s16_224``): a ViT over the feature map of timm's
``resnet26d`` / ``resnet50d`` (deep stem, BatchNorm, shortcuts that
average-pool before their projection). Built by timm at one block with
random weights and running statistics, written by timm's ``save_for_hf``
and loaded by keras_vit with timm's logits, at timm's size and another;
the model keras_vit builds for ``resnet=dict(variant="d")`` on every
Keras path."""

import numpy as np
import pytest

import torch  # before TensorFlow (tests/conftest.py)

import keras  # noqa: E402
from timm.models import save_for_hf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402
from keras_vit.base import geometry  # noqa: E402
from testkit import (assert_close_to_timm, random_images,  # noqa: E402
                     random_timm_model, randomise_keras, timm_forward)

SMALL = dict(embed_dim=64, num_heads=4)


def _resnet_d(folder, arch="vit_small_resnet26d_224", size=64,
              num_classes=5):
    theirs = random_timm_model(arch, size, num_classes, **SMALL)
    # The backbone redrawn at scales that carry the image through its
    # twenty-odd convolutions (randomise_torch's N(0, 0.2) makes every
    # image's features alike), its running statistics too (PyTorch's zero
    # mean and unit variance would hide a swap).
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in theirs.patch_embed.backbone.named_parameters():
            if p.ndim == 4:  # a convolution: He's variance, 2 / fan-in
                p.copy_(torch.randn(p.shape, generator=generator)
                        * np.sqrt(2 / p[0].numel()))
            elif name.endswith("weight"):  # a norm's scale
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=generator))
            else:  # its shift
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
        for name, buffer in theirs.named_buffers():
            if name.endswith("running_mean"):
                buffer.copy_(0.05 * torch.randn(buffer.shape,
                                               generator=generator))
            elif name.endswith("running_var"):
                buffer.copy_(0.5 + torch.rand(buffer.shape,
                                              generator=generator))
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


def _images(size):
    """Two images unlike each other (two noise images give a ResNet's
    few pooled cells alike): noise, and a brighter image of less
    contrast."""
    x = random_images(size)
    x[1] = 0.3 * x[1] + 0.5
    return x


@pytest.mark.backends
@pytest.mark.parametrize("arch, stages", [
    ("vit_small_resnet26d_224", [2, 2, 2, 2]),
    ("vit_small_resnet50d_s16_224", [3, 4, 6])])
def test_resnet_d_hybrids_load_with_timms_logits(arch, stages, tmp_path):
    theirs = _resnet_d(tmp_path / "repo", arch)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    assert config["resnet"] == dict(num_layers=stages, width_factor=1,
                                    variant="d")
    assert (config["patch_size"], config["mlp_dim"]) == (1, 192)
    assert ours.count_params() == geometry.parameter_count(config)
    x = _images(64)
    want = timm_forward(theirs, x)
    assert np.abs(want[0] - want[1]).max() > 1e-2 * np.abs(want).max()
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)), want)


def test_a_resnet_d_hybrid_at_another_size_is_timms(tmp_path):
    """The position table resized as timm's loader resizes it for a model
    built at 96 pixels (the ResNet's grid at stride 32: 2 x 2 to 3 x 3)."""
    import timm
    from safetensors.torch import load_file
    from timm.models.vision_transformer import checkpoint_filter_fn

    _resnet_d(tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"), image_size=96)
    # timm's pretrained=True would fetch the backbone's own weights first:
    # its checkpoint filter (the resize its loader applies) instead.
    theirs = timm.create_model("vit_small_resnet26d_224", depth=1,
                               img_size=96, num_classes=5, **SMALL).eval()
    state = load_file(str(tmp_path / "repo" / "model.safetensors"))
    theirs.load_state_dict(checkpoint_filter_fn(state, theirs))
    x = _images(96)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                         timm_forward(theirs, x))


@pytest.mark.parametrize("drop, match", [
    ("patch_embed.backbone.conv1.6.weight", r"conv1\.6\.weight \(the deep "
     r"stem's third convolution\) is missing"),
    ("patch_embed.backbone.layer2.0.conv1.weight", r"not whole stages "
     r"from the first; found blocks \{1: \[0, 1\], 2: \[1\]"),
])
def test_a_backbone_that_is_not_resnet_d_is_refused_naming_the_key(
        drop, match, tmp_path):
    from safetensors.numpy import load_file, save_file

    _resnet_d(tmp_path / "repo")
    path = tmp_path / "repo" / "model.safetensors"
    state = load_file(str(path))
    del state[drop]
    save_file(state, str(path))
    with pytest.raises(ValueError, match=match):
        zoo.load(str(tmp_path / "repo"))


def test_resnet_d_options_are_checked_in_one_line():
    for resnet, match in (
            (dict(num_layers=(2,), variant="e"), r"resnet\['variant'\]"),
            (dict(num_layers=(2, 2), variant="d", fold_last_stage=True),
             r"resnet\['fold_last_stage'\] cannot be set for variant 'd'"),
            (dict(num_layers=(2,), variant="d", standardization="var"),
             r"resnet\['standardization'\] cannot be set")):
        with pytest.raises(ValueError, match=match):
            keras_vit.vit(image_size=32, patch_size=1, hidden_size=16,
                          num_layers=1, num_heads=2, mlp_dim=32,
                          num_classes=3, resnet=resnet)


def _tiny(**kwargs):
    model = keras_vit.vit(image_size=32, patch_size=1, hidden_size=16,
                          num_layers=1, num_heads=2, mlp_dim=32,
                          num_classes=3, resnet=dict(num_layers=(1, 1),
                                                     variant="d"), **kwargs)
    return randomise_keras(model)


@pytest.mark.backends
# quantize's one warning naming the layers left in float
# (tests/models/test_keras_features.py checks it).
@pytest.mark.filterwarnings("ignore:quantize\\(:UserWarning")
def test_the_resnet_d_hybrid_on_every_keras_path(tmp_path):
    """``.keras``, int8 (the projections; the convolutions stay float),
    LoRA, remat, mixed_bfloat16, a dynamic image size and the ResNet's
    feature map, each computing what the float model does."""
    from keras_vit.models import lora

    model = _tiny()
    x = random_images(32)
    want = keras.ops.convert_to_numpy(model(x))
    assert np.abs(want).max() > 1e-3
    model.save(tmp_path / "d.keras")
    back = keras.saving.load_model(tmp_path / "d.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(back(x)), want,
                               atol=1e-6, rtol=0)

    def same_weights(other):
        other.set_weights(model.get_weights())
        return other

    scale = np.abs(want).max()
    for kwargs, tolerance in ((dict(remat=True), 1e-6),
                              (dict(dtype="mixed_bfloat16"), 0.05),
                              (dict(dynamic_image_size=True), 1e-5)):
        other = same_weights(_tiny(**kwargs))
        got = keras.ops.convert_to_numpy(other(x)).astype("float32")
        np.testing.assert_allclose(got, want, atol=tolerance * scale, rtol=0,
                                   err_msg=str(kwargs))
    dynamic = same_weights(_tiny(dynamic_image_size=True))
    assert keras.ops.convert_to_numpy(dynamic(random_images(64))).shape == (
        2, 3)
    quantized = same_weights(_tiny())
    quantized.quantize("int8")
    error = np.abs(keras.ops.convert_to_numpy(quantized(x)) - want).max()
    assert 0 < error < 0.1 * scale, error
    adapted = same_weights(_tiny())
    assert lora.enable_lora(adapted, rank=2)["layers"] > 0
    np.testing.assert_allclose(keras.ops.convert_to_numpy(adapted(x)), want,
                               atol=1e-6, rtol=0)
    features = keras_vit.models.feature_model(model, "resnet")
    assert tuple(features(x).shape) == (2, 4, 4, 512)  # stride 8


@pytest.mark.parametrize("write, match", [
    (lambda m, d: zoo.save_npz(m, d / "w.npz"),
     r"resnet variant 'd' \(timm's ResNet-D\).*model\.keras"),
    (lambda m, d: zoo.save_pretrained(m, d / "timm"), r"resnet="),
    (lambda m, d: zoo.save_pretrained(m, d / "hf", layout="transformers"),
     r"a ResNet stem \(hybrid\); model\.save\('model\.keras'\) keeps it"),
    (lambda m, d: zoo.save_pretrained(m, d / "kh", layout="keras-hub"),
     r"a ResNet stem \(hybrid\)"),
])
def test_every_writer_refuses_the_resnet_d_hybrid_in_one_line(
        write, match, tmp_path):
    with pytest.raises(ValueError, match=match) as caught:
        write(_tiny(), tmp_path)
    assert "\n" not in str(caught.value)
