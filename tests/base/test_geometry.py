"""The shapes a config implies, computed once (``keras_vit.base.geometry``)
and equal to what the builders build: the parameter count of every family
option against ``count_params()``, the stride and token count against the
built model, and the readers of those numbers (attention analysis, the
memory estimate) agreeing with them."""

import pytest

import keras_vit
from keras_vit.base import geometry

BASE = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=2,
            num_heads=2, mlp_dim=32, num_classes=5)
OPTIONS = [
    {}, dict(classifier="gap"), dict(num_registers=4, classifier="gap"),
    dict(distilled=True), dict(layer_scale=0.1), dict(qk_norm=True),
    dict(qkv_bias=False), dict(proj_bias=False), dict(patch_bias=False),
    dict(fc_norm=True, classifier="gap"),
    dict(final_norm=False, pre_norm=True, class_token=False,
         classifier="gap"),
    dict(posemb_includes_prefix=False, num_registers=2),
    dict(num_classes=0), dict(include_top=False),
    dict(representation_size=12), dict(position_embedding="sincos_2d"),
    dict(position_embedding="none"), dict(image_size=(32, 48)),
    dict(resnet=dict(num_layers=(1, 1), width_factor=0.5), patch_size=1),
    dict(resnet=dict(num_layers=(1, 1, 1), width_factor=0.5,
                     fold_last_stage=True), patch_size=1, image_size=64),
    dict(classifier="map"), dict(classifier="map", num_classes=0),
    dict(include_top=False, pooling="map"),
]


@pytest.mark.parametrize("options", OPTIONS, ids=[
    ",".join(sorted(o)) or "paper" for o in OPTIONS])
def test_the_count_and_grid_are_the_built_models(options):
    model = keras_vit.vit(**{**BASE, **options})
    config = model.get_config()
    assert geometry.parameter_count(config) == model.count_params()
    size = config["image_size"]
    rows, cols = (size, size) if isinstance(size, int) else size
    assert (geometry.grid_side(config, rows),
            geometry.grid_side(config, cols)) == tuple(model.grid_size)
    from keras_vit.analysis.attention import token_geometry

    g = token_geometry(model)
    assert g.num_prefix_tokens == geometry.prefix_tokens(config)
    assert g.patch_pixels == geometry.effective_stride(config)


def test_bit_count_is_the_built_models():
    from keras_vit.models.resnet_v2 import resnet_v2

    model = resnet_v2(image_size=32, block_units=(1, 1, 1, 1),
                      width_factor=0.5, num_classes=7)
    assert geometry.parameter_count(model.get_config()) == model.count_params()


def test_an_unknown_option_is_not_counted():
    assert geometry.parameter_count(dict(BASE, some_new_option=1)) is None
    assert geometry.parameter_count(
        dict(BASE, position_embedding="relative")) is None


def test_the_memory_estimate_counts_the_prefix_tokens():
    from keras_vit.models.memory import config_estimate

    plain = config_estimate(BASE)["tokens"]
    assert config_estimate(dict(BASE, num_registers=4))["tokens"] == plain + 4
    assert config_estimate(dict(BASE, classifier="gap"))["tokens"] == plain - 1
