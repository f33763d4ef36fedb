"""The serialisation contract of every layer and model the package
registers with Keras: ``from_config(get_config())`` rebuilds an object with
the same config and, given the same weights, the same outputs.

The classes are found by walking Keras' registry after importing every
module of the package, so a new layer or model cannot escape the test: it
fails until the new class has a case below.
"""

import importlib
import json
import pkgutil

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.runtime.backend import to_numpy
from keras_vit.models.config import json_ready


def _import_everything():
    """Imports every module of keras_vit (and its zoo and export
    sub-packages) so that each registers its classes."""
    for info in pkgutil.walk_packages(keras_vit.__path__, "keras_vit."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    for sub in ("keras_vit.zoo", "keras_vit.export"):
        package = importlib.import_module(sub)
        for info in pkgutil.walk_packages(package.__path__, sub + "."):
            importlib.import_module(info.name)


def _registered_layers():
    _import_everything()
    prefix = keras_vit.layers.PACKAGE + ">"
    return {name[len(prefix):]: cls
            for name, cls in keras.saving.get_custom_objects().items()
            if name.startswith(prefix)
            and issubclass(cls, keras.layers.Layer)}


def _rng_input(shape, dtype="float32"):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _tiny_vit(**kwargs):
    return {**dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                   num_heads=2, mlp_dim=16, num_classes=3), **kwargs}


def _mpp_inputs():
    from keras_vit.train.mpp import corruption_plan

    mode, source = corruption_plan(2, 4, (0, 0))
    return [_rng_input((2, 16, 16, 3)), to_numpy(mode), to_numpy(source)]


def _mpp_kwargs():
    return dict(encoder=keras_vit.vit(16, 8, 8, 1, 2, 16, 3).get_config(),
                target="mean_color")


# class name -> (constructor keyword arguments, a function giving an input).
CASES = {
    "PatchEmbedding": (dict(hidden_size=8, patch_size=4),
                       lambda: _rng_input((2, 8, 8, 3))),
    "ClassToken": (dict(), lambda: _rng_input((2, 4, 8))),
    "RegisterTokens": (dict(num_tokens=2, index=1),
                       lambda: _rng_input((2, 4, 8))),
    "DropPath": (dict(rate=0.25, seed=3), lambda: _rng_input((2, 4, 8))),
    "PositionEmbedding": (dict(grid_size=(2, 2), num_prefix_tokens=1),
                          lambda: _rng_input((2, 5, 8))),
    "RelativePositionEmbedding": (
        dict(grid_size=(2, 2), num_heads=2, num_prefix_tokens=1),
        lambda: _rng_input((2, 5, 8))),
    "RotaryEmbedding": (
        dict(grid_size=(2, 2), head_dim=4, num_prefix_tokens=1,
             temperature=50.0), lambda: _rng_input((2, 5, 8))),
    "MixedRotaryEmbedding": (
        dict(grid_size=(2, 2), head_dim=4, num_heads=2, depth=2,
             num_prefix_tokens=1), lambda: _rng_input((2, 5, 8))),
    "RelativePositionBias": (dict(grid_size=(2, 2), num_heads=2),
                             lambda: _rng_input((2, 5, 8))),
    "PaddingBias": (dict(num_prefix_tokens=1), lambda: np.array(
        [[1, 1, 0], [1, 0, 0]], "int32")),
    "PatchMerger": (dict(grid_size=(2, 4), merge_size=2, width=6),
                    lambda: _rng_input((2, 8, 8))),
    "Neck": (dict(grid_size=[2, 3], channels=4),
             lambda: _rng_input((2, 6, 8))),
    "AxisPositionTable": (dict(grid_size=[2, 3], size=4, num_prefix_tokens=1),
                          lambda: _rng_input((2, 7, 8))),
    "UnscaledNorm": (dict(kind="rms", epsilon=1e-6),
                     lambda: _rng_input((2, 7, 8))),
    "SoftTokenPool": (dict(grid_size=[2, 4], kernel=2, standardize=True),
                      lambda: _rng_input((2, 8, 8))),
    "RelativePositionMlp": (dict(grid_size=[2, 3], num_heads=2, width=4,
                                 num_prefix_tokens=1),
                            lambda: _rng_input((2, 7, 8))),
    "FusedConv2D": (dict(filters=4, kernel_size=[2, 2], strides=[2, 2]),
                    lambda: _rng_input((2, 6, 6, 3))),
    "FusedDense": (dict(units=4, gelu="tanh"), lambda: _rng_input((2, 5, 8))),
    "FusedLayerNormalization": (dict(epsilon=1e-5),
                                lambda: _rng_input((2, 5, 8))),
    "RMSNormalization": (dict(epsilon=1e-5), lambda: _rng_input((2, 5, 8))),
    "FusedEinsumDense": (dict(equation="abc,cde->abde",
                              output_shape=(None, 2, 4), bias_axes="de"),
                         lambda: _rng_input((2, 5, 8))),
    "MultiHeadSelfAttention": (dict(num_heads=2, attention_dropout_rate=0.1),
                               lambda: _rng_input((2, 5, 8))),
    "MlpBlock": (dict(mlp_dim=16, dropout_rate=0.1),
                 lambda: _rng_input((2, 5, 8))),
    "EncoderBlock": (dict(num_heads=2, mlp_dim=16, dropout_rate=0.1,
                          attention_dropout_rate=0.1, layer_norm_epsilon=1e-5),
                     lambda: _rng_input((2, 5, 8))),
    "AxialEncoderBlock": (dict(num_heads=2, mlp_dim=16, dropout_rate=0.1,
                               attention_dropout_rate=0.1,
                               layer_norm_epsilon=1e-5),
                          lambda: _rng_input((2, 2, 3, 8))),
    "TokenPooling": (dict(method="gap"), lambda: _rng_input((2, 5, 8))),
    "AttentionPoolHead": (dict(num_heads=2, mlp_dim=16, num_prefix_tokens=1),
                          lambda: _rng_input((2, 5, 8))),
    "StackScores": (dict(), lambda: [_rng_input((2, 2, 5, 5))] * 2),
    "PatchTokens": (dict(num_prefix_tokens=1, stride=4, return_prefix=True),
                    lambda: [_rng_input((2, 5, 8)), _rng_input((2, 8, 8, 3))]),
    "StdConv2D": (dict(filters=4, kernel_size=(3, 3), standardization="std",
                       eps=1e-5), lambda: _rng_input((2, 8, 8, 3))),
    "ResidualUnit": (dict(features=32, strides=2, groups=32, epsilon=1e-5),
                     lambda: _rng_input((2, 8, 8, 64))),
    "PreActBottleneck": (dict(filters=32, strides=2, groups=32,
                              epsilon=1e-5),
                         lambda: _rng_input((2, 8, 8, 64))),
    "PatchCorruption": (dict(), lambda: [
        _rng_input((2, 4, 8)), np.array([[0, 1, 2, 0]] * 2, "int32"),
        np.array([[1, 0, 3, 2]] * 2, "int32")]),
    "VisionTransformer": (
        _tiny_vit(classifier="gap", representation_size=6,
                  resnet=dict(num_layers=(), width_factor=0.5),
                  image_size=(32, 64), dropout_rate=0.1),
        lambda: _rng_input((2, 32, 64, 3))),
    "AxialVisionTransformer": (_tiny_vit(position_embedding="learned_2d"),
                               lambda: _rng_input((2, 16, 16, 3))),
    "ResNetV2": (dict(image_size=32, block_units=(1, 1, 1, 1),
                      width_factor=0.5, num_classes=3, return_stages=True),
                 lambda: _rng_input((2, 32, 32, 3))),
    "MaskedPatchPrediction": (None, _mpp_inputs),
}


def test_every_registered_layer_and_model_has_a_case():
    assert set(_registered_layers()) == set(CASES)


def _outputs(obj, x):
    y = obj(x, training=False)
    if isinstance(y, dict):
        return {k: to_numpy(v) for k, v in y.items()}
    return to_numpy(y)


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_round_trip(name):
    cls = _registered_layers()[name]
    kwargs, make_input = CASES[name]
    given = kwargs or {}  # MaskedPatchPrediction keeps a trimmed encoder
    if kwargs is None:
        kwargs = _mpp_kwargs()
    obj = cls(**kwargs, name="probe")
    x = make_input()
    _outputs(obj, x)  # builds it
    rng = np.random.default_rng(1)
    for w in obj.weights:  # so that every output depends on every weight
        w.assign(rng.standard_normal(w.shape).astype(w.dtype) * 0.1)
    y = _outputs(obj, x)
    config = obj.get_config()
    json.dumps(config)  # plain JSON
    for key, value in given.items():  # the arguments, as given
        got, want = json_ready(config[key]), json_ready(value)
        if isinstance(want, dict):  # a hybrid's resnet: defaults added
            got = {k: got[k] for k in want}
        assert got == want, key
    clone = cls.from_config(config)
    assert clone.get_config() == config
    _outputs(clone, x)  # builds it
    clone.set_weights(obj.get_weights())
    np.testing.assert_equal(_outputs(clone, x), y)


def test_model_arguments_are_attributes():
    model = keras_vit.vit(**_tiny_vit(classifier="gap"))
    assert (model.num_heads, model.image_size, model.classifier,
            model.grid_size) == (2, 16, "gap", (2, 2))
    # A subclass's own constructor decides the config.

    class Wider(keras_vit.VisionTransformer):
        def __init__(self, width=16, **kwargs):
            super().__init__(**_tiny_vit(), **kwargs)
            self.width = width

    wide = Wider(width=24)
    assert wide.get_config() == {"width": 24, "name": "vision_transformer",
                                 "dtype": None}
    assert Wider.from_config(wide.get_config()).width == 24
