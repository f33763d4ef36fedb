"""The patch merger (Qwen's projector) against NumPy: each k x k block of
the normed patch tokens, in row-major order, through the two Dense
layers; the config round trip and the refusals."""

import numpy as np
import pytest

import keras
from keras_vit.layers import PatchMerger


def _numpy(layer, x, rows, cols, k):
    gamma, beta, w0, b0, w1, b1 = (keras.ops.convert_to_numpy(v)
                                   for v in layer.weights)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    x = (x - mean) / np.sqrt(var + layer.norm_epsilon) * gamma + beta
    batch, _, dim = x.shape
    blocks = x.reshape(batch, rows // k, k, cols // k, k, dim)
    blocks = blocks.transpose(0, 1, 3, 2, 4, 5).reshape(batch, -1,
                                                        k * k * dim)
    from scipy.special import erf

    h = blocks @ w0 + b0
    h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
    return h @ w1 + b1


@pytest.mark.parametrize("rows, cols, k", [(4, 6, 2), (3, 6, 3)])
def test_the_merger_is_its_math(rows, cols, k):
    layer = PatchMerger((rows, cols), merge_size=k, width=5)
    x = np.random.default_rng(0).normal(size=(2, rows * cols, 8)).astype(
        "float32")
    got = keras.ops.convert_to_numpy(layer(x))
    assert got.shape == (2, rows * cols // (k * k), 5)
    np.testing.assert_allclose(got, _numpy(layer, x, rows, cols, k),
                               atol=1e-4, rtol=1e-4)
    again = PatchMerger.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()


def test_a_grid_the_merger_cannot_split_is_refused():
    with pytest.raises(ValueError, match="merge_size=2 .* 3 x 4"):
        PatchMerger((3, 4), merge_size=2)
    with pytest.raises(ValueError, match="merge_size=1"):
        PatchMerger((4, 4), merge_size=1)
