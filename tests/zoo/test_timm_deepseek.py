"""timm's DeepSeek vision towers (``deepseek_vit.py``): RMS-norm pre-norm
blocks, biased attention beside a bias-free packed SwiGLU MLP, the axial
rotary form over the patch indices and no position table, a final RMS
norm; the classifier's mean through a norm without a scale. Built by timm
at two blocks with random weights, written by timm's ``save_for_hf`` and
loaded by keras_vit with timm's outputs, at timm's size and another."""

import numpy as np
import pytest

import torch  # noqa: F401 (before TensorFlow: tests/conftest.py)

import keras  # noqa: E402
from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from testkit import (assert_close_to_timm, assert_features_are_timms,  # noqa: E402
                     assert_refused_naming, random_images,
                     random_timm_model, timm_forward)

SMALL = dict(embed_dim=64, num_heads=4)


def _deepseek(folder, size=42, num_classes=5, arch="deepseek_vit_412m",
              **kwargs):
    theirs = random_timm_model(arch, size, num_classes, depth=2,
                               **dict(SMALL, **kwargs))
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


@pytest.mark.backends
@pytest.mark.parametrize("num_classes, kwargs", [
    (5, {}), (0, {}), (5, dict(final_norm=False))])
def test_deepseek_tower_loads_with_timms_outputs(num_classes, kwargs,
                                                 tmp_path):
    theirs = _deepseek(tmp_path / "repo", num_classes=num_classes, **kwargs)
    ours = zoo.load(str(tmp_path / "repo"), image_size=42)
    config = ours.get_config()
    for key, value in dict(mlp="swiglu", mlp_bias=False, proj_bias=True,
                           rope="eva02", rope_halves=True, norm="rms",
                           pooled_norm=kwargs.get("final_norm", True),
                           position_embedding="none").items():
        assert config[key] == value, key
    x = random_images(42)
    out = (keras.ops.convert_to_numpy(ours(x)) if num_classes
           else ours.predict(x, verbose=0))
    assert_close_to_timm(out, timm_forward(theirs, x))


def test_deepseek_tower_takes_any_size_as_timms_does(tmp_path):
    """No table: timm's tower turns any grid's patch indices; keras_vit's
    one model (dynamic_image_size) the same, and one built at a size."""
    theirs = _deepseek(tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"))
    assert ours.get_config()["dynamic_image_size"]
    for height, width in ((56, 28), (28, 70)):
        x = random_images(height, width=width)
        assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                             timm_forward(theirs, x))
    at_size = zoo.load(str(tmp_path / "repo"), image_size=(56, 28))
    x = random_images(56, width=28)
    assert_close_to_timm(keras.ops.convert_to_numpy(at_size(x)),
                         timm_forward(theirs, x))


def test_deepseek_encoders_mean_pool_has_no_norm(tmp_path):
    theirs = _deepseek(tmp_path / "enc", num_classes=0,
                       arch="deepseek_vit_412m_enc", global_pool="avg",
                       out_features=32)
    ours = zoo.load(str(tmp_path / "enc"), image_size=42)
    assert not ours.get_config()["pooled_norm"]
    x = random_images(42)
    assert_close_to_timm(ours.predict(x, verbose=0), timm_forward(theirs, x))


def test_deepseek_block_features_are_timms_forward_intermediates(tmp_path):
    theirs = _deepseek(tmp_path / "repo", num_classes=0)
    ours = zoo.load(str(tmp_path / "repo"), image_size=42)
    assert_features_are_timms(ours, theirs, random_images(42),
                              prefix_tokens=False)


@pytest.mark.parametrize("arch, model_args, named", [
    ("deepseek_vit_412m_enc", dict(out_features=32), "global_pool='align'"),
    ("deepseek_vit_412m_align", dict(out_features=32), "encoder_pool"),
    ("deepseek_vit_412m", dict(dynamic_img_pad=True), "dynamic_img_pad")])
def test_deepseek_settings_keras_vit_lacks_are_refused_by_name(
        arch, model_args, named, tmp_path):
    _deepseek(tmp_path / "repo", arch=arch, num_classes=0,
              **({"out_features": 32} if "out_features" in model_args
                 else {}))
    args = {k: v for k, v in model_args.items() if k != "out_features"}
    assert_refused_naming(tmp_path / "repo", named, args)


def test_the_mlp_bias_row_counts_and_drops_the_mlps_biases_only():
    import keras_vit

    model = keras_vit.vit(image_size=16, patch_size=8, hidden_size=16,
                          num_layers=1, num_heads=2, mlp_dim=32,
                          num_classes=3, mlp_bias=False)
    paths = {w.path for w in model.weights}
    assert "encoder_block_0/attention/out/bias" in paths
    assert not any(p.startswith("encoder_block_0/mlp/") and p.endswith(
        "bias") for p in paths)
    from keras_vit.base import geometry
    assert geometry.parameter_count(model.get_config()) == \
        model.count_params()
    assert np.isfinite(keras.ops.convert_to_numpy(
        model(np.zeros((1, 16, 16, 3), "float32")))).all()
