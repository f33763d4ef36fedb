"""keras_vit.models.positions.AxisPositionTable (the ``position_axes``
row, Gemma 4's position table): the patch at row r and column c gets
the first table's row c plus the second's row r, written out in NumPy
here patch by patch with the layer's own weights read back."""

import numpy as np
import pytest

from keras_vit.models.positions import AxisPositionTable
from numpy_layers import to_numpy as _np
from testkit import randomise_weights


@pytest.mark.parametrize("grid, prefix", [((2, 3), 0), ((3, 1), 1),
                                          ((4, 4), 2)])
def test_each_patch_gets_its_columns_row_plus_its_rows_row(grid, prefix):
    rows, cols = grid
    x = np.random.default_rng(0).normal(
        size=(2, prefix + rows * cols, 6)).astype("float32")
    layer = AxisPositionTable(grid, 5, num_prefix_tokens=prefix)
    layer.build(x.shape)
    randomise_weights(layer)
    table = _np(layer.table)
    want = x.astype("float64").copy()
    for r in range(rows):
        for c in range(cols):
            want[:, prefix + r * cols + c] += table[0, c] + table[1, r]
    np.testing.assert_allclose(_np(layer(x)), want, rtol=1e-6, atol=1e-6)


def test_a_dynamic_size_reads_the_rows_of_the_images_grid():
    layer = AxisPositionTable((2, 2), 6, stride=4)
    images = np.zeros((1, 12, 8, 3), "float32")  # a 3 x 2 grid
    x = np.zeros((1, 6, 4), "float32")
    layer.build(x.shape)
    randomise_weights(layer)
    table = _np(layer.table)
    got = _np(layer(x, images=images))[0]
    np.testing.assert_allclose(got[5], table[0, 1] + table[1, 2], rtol=1e-6)


def test_a_grid_past_the_tables_rows_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"position_axes=4 .* 5 x 2"):
        AxisPositionTable((5, 2), 4)
