"""keras_vit.models.positions.RelativePositionMlp (the ``relative_mlp``
row, timm's ``RelPosMlp``): the bias of each pair of patches is the MLP
of their offset in log coordinates, written out in NumPy here pair by
pair with the layer's own weights read back."""

import numpy as np
import pytest

from keras_vit.models.positions import RelativePositionMlp, log_offsets
from numpy_layers import to_numpy as _np
from testkit import randomise_weights, weights_below


def _bias(w, grid, heads, prefix):
    """bias[h, i, j]: MLP(sign(d) log(1 + |d|)) of patch i's offset from
    patch j, zero where i or j is a prefix token."""
    rows, cols = grid
    n = rows * cols
    out = np.zeros((heads, n + prefix, n + prefix))
    for i in range(n):
        for j in range(n):
            d = np.array([i // cols - j // cols, i % cols - j % cols], float)
            h = np.maximum(np.sign(d) * np.log1p(np.abs(d)) @ w["fc1/kernel"]
                           + w["fc1/bias"], 0)
            out[:, prefix + i, prefix + j] = h @ w["fc2/kernel"] + w["fc2/bias"]
    return out


@pytest.mark.parametrize("grid, prefix", [((2, 3), 0), ((3, 3), 1),
                                          ((1, 4), 2)])
def test_each_pairs_bias_is_the_mlp_of_its_log_offset(grid, prefix):
    layer = RelativePositionMlp(grid, num_heads=2, width=5,
                                num_prefix_tokens=prefix)
    tokens = np.zeros((1, grid[0] * grid[1] + prefix, 4), "float32")
    layer(tokens)
    randomise_weights(layer)
    got = _np(layer(tokens))
    assert got.shape == (1, 2) + (tokens.shape[1],) * 2
    np.testing.assert_allclose(got[0], _bias(weights_below(layer), grid, 2,
                                             prefix), rtol=1e-5, atol=1e-5)


def test_the_log_offsets_are_row_major_from_the_most_negative():
    table = log_offsets((2, 2))
    assert table.shape == (9, 2)
    np.testing.assert_allclose(table[0], -np.log(2.0) * np.ones(2),
                               rtol=1e-6)
    np.testing.assert_array_equal(table[4], [0.0, 0.0])
