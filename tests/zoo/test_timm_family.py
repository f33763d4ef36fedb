"""The ViT family members timm defines as its one VisionTransformer with
options (DeiT, DeiT-III, DINOv2 with and without registers, CLIP image
towers, the average-pool models), built by timm itself at depth 1 with
random weights, written by timm's ``save_for_hf``, loaded by keras_vit with
timm's logits, and written back so that timm loads the same logits."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
pytest.importorskip("safetensors")

from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from keras_vit.data.normalization import of_model  # noqa: E402

CLASSES = 5
# timm architecture -> (image size, patch size, what keras_vit builds).
FAMILY = {
    # Options given as timm's model_args rather than by an architecture.
    "vit_small_patch16_224": (32, 16, dict(
        class_token=False, classifier="avgmax", num_registers=2,
        qk_norm=True, fc_norm=True)),
    "deit_tiny_patch16_224": (32, 16, dict(classifier="token")),
    "deit_tiny_distilled_patch16_224": (32, 16, dict(distilled=True)),
    "deit3_small_patch16_224": (32, 16, dict(posemb_includes_prefix=False,
                                             layer_scale=1e-6)),
    "vit_small_patch14_dinov2": (28, 14, dict(layer_scale=1e-5)),
    "vit_small_patch14_reg4_dinov2": (28, 14, dict(num_registers=4)),
    "vit_base_patch16_clip_quickgelu_224": (32, 16, dict(
        pre_norm=True, patch_bias=False, gelu="quick")),
    "vit_medium_patch16_gap_256": (32, 16, dict(class_token=False,
                                                classifier="gap",
                                                qkv_bias=False)),
}
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


# timm's own arguments beyond the architecture's, per test case.
TIMM_ARGS = {"vit_small_patch16_224": dict(
    class_token=False, global_pool="avgmax", reg_tokens=2, qk_norm=True)}


def _timm_model(arch, size, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, depth=1, img_size=size,
                              num_classes=CLASSES, **kwargs)
    with torch.no_grad():  # every parameter random, norms and scales too
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


def _images(size, n=2):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, size, size, 3)).astype("float32")


def _forward(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()


def _assert_close(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= 1e-5 * scale + 1e-6, (
        np.abs(ours - theirs).max(), scale)


@pytest.mark.parametrize("arch", sorted(FAMILY))
def test_timm_family_member_loads_with_timm_logits(arch, tmp_path):
    size, _, expected = FAMILY[arch]
    theirs = _timm_model(arch, size, **TIMM_ARGS.get(arch, {}))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    x = _images(size)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    for key, value in expected.items():
        assert config[key] == value, key
    _assert_close(ours(x), _forward(theirs, x))
    # timm reads the repository keras_vit writes, with the same logits.
    zoo.save_pretrained(ours, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    again = timm.create_model(
        written["architecture"], pretrained=True,
        num_classes=written["num_classes"],
        pretrained_cfg_overlay=dict(
            file=str(tmp_path / "back" / "model.safetensors"),
            num_classes=written["num_classes"]),
        **written["model_args"]).eval()
    _assert_close(_forward(again, x), _forward(theirs, x))


def test_imagenet_normalised_deit_loads_and_keeps_its_normalisation(
        tmp_path):
    theirs = _timm_model("deit_tiny_patch16_224", 32)
    theirs.pretrained_cfg = dict(theirs.pretrained_cfg, **IMAGENET)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    normalisation = of_model(ours).to_config()
    assert ours.get_config()["input_normalization"] == normalisation
    np.testing.assert_allclose(normalisation["mean"], IMAGENET["mean"])
    np.testing.assert_allclose(normalisation["std"], IMAGENET["std"])
    x = _images(32)
    _assert_close(ours(x), _forward(theirs, x))
    zoo.save_pretrained(ours, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["pretrained_cfg"]["mean"] == IMAGENET["mean"]
    assert written["pretrained_cfg"]["std"] == IMAGENET["std"]


def test_timm_settings_keras_vit_lacks_are_refused_by_name(tmp_path):
    theirs = _timm_model("vit_small_patch16_224", 32, global_pool="map")
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    with pytest.raises(ValueError, match="global_pool='map'"):
        zoo.load(str(tmp_path / "repo"))


def test_headless_timm_model_returns_its_pooled_features(tmp_path):
    torch.manual_seed(0)
    theirs = timm.create_model("vit_medium_patch16_gap_256",
                               pretrained=False, depth=1, img_size=32,
                               num_classes=0).eval()
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    x = _images(32)
    out = np.asarray(ours(x))
    assert out.shape == (2, 512)
    _assert_close(out, _forward(theirs, x))


@pytest.mark.parametrize("arch", ["deit_tiny_distilled_patch16_224",
                                  "vit_medium_patch16_gap_256",
                                  "vit_small_patch16_224"])
def test_pre_logits_features_are_timms_head_input(arch, tmp_path):
    """The features a classifier's head reads, as timm's
    ``forward_head(pre_logits=True)`` returns them: after ``fc_norm``, and
    the mean of the class and distillation tokens for distilled DeiT."""
    size = FAMILY[arch][0]
    theirs = _timm_model(arch, size, **TIMM_ARGS.get(arch, {}))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    x = _images(size)
    ours = zoo.load(str(tmp_path / "repo")).feature_model("pre_logits")
    with torch.no_grad():
        want = theirs.forward_head(theirs.forward_features(
            torch.from_numpy(x.transpose(0, 3, 1, 2))), pre_logits=True)
    _assert_close(ours(x), want.numpy())
