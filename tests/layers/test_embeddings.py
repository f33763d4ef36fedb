"""keras_vit.layers.embeddings: the patch embedding, the class, register
and patch tokens, the position tables of each kind and the official
resize of a table (linear, aligned corners), against NumPy and
``scipy.ndimage.zoom(order=1)``."""

import keras
import numpy as np
import pytest
from keras import ops
from scipy import ndimage

from keras_vit import layers as kl
from numpy_layers import inputs as _inputs, norm as apply_norm, to_numpy as _np
from keras_vit.layers import embeddings

RTOL, ATOL = 1e-5, 1e-5

B, D = 2, 8


def _randomise(layer, seed=1):
    """Every weight drawn anew (the class token and the biases start at
    zero, the norms' scales at one)."""
    rng = np.random.default_rng(seed)
    for var in layer.weights:
        var.assign(rng.normal(size=tuple(var.shape)).astype("float32"))


def _weights(layer):
    """``layer``'s weights by their path below the layer, in float64."""
    prefix = layer.path + "/"
    return {v.path[len(prefix):]: _np(v.value).astype("float64")
            for v in layer.weights}


def _zoom(grid, shape):
    """scipy's order-1 zoom of a (rows, cols, D) grid to ``shape``: the
    official resize of a position table."""
    rows, cols, _ = grid.shape
    out = ndimage.zoom(grid, (shape[0] / rows, shape[1] / cols, 1), order=1)
    assert out.shape[:2] == tuple(shape)
    return out


def _sincos(rows, cols, width, temperature=10_000.0):
    """big_vision's posemb_sincos_2d, patch by patch in raster order."""
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
    table = []
    for r in range(rows):
        for c in range(cols):
            table.append(np.concatenate([np.sin(c * omega), np.cos(c * omega),
                                         np.sin(r * omega), np.cos(r * omega)]))
    return np.array(table)


# -- PatchEmbedding ----------------------------------------------------------

def _patchify(images, p):
    """(B, H, W, C) -> (B, H/p * W/p, p * p * C), patches in raster order,
    each flattened in (row, column, channel) order."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


@pytest.mark.parametrize("use_bias", [True, False])
def test_patch_embedding_is_patchify_then_matmul(use_bias):
    layer = kl.PatchEmbedding(D, 2, use_bias=use_bias)
    images = _inputs(B, 4, 6, 3)
    layer.build(images.shape)
    _randomise(layer)
    w = _weights(layer)
    assert ("conv/bias" in w) == use_bias
    want = _patchify(images.astype("float64"), 2) @ w["conv/kernel"].reshape(
        -1, D) + w.get("conv/bias", 0.0)
    got = _np(layer(images))
    assert got.shape == (B, 6, D)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert layer.compute_output_shape((None, 4, 6, 3)) == (None, 6, D)
    assert layer.compute_output_shape((None, None, 6, 3)) == (None, None, D)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_patch_embedding_norm_normalises_each_patch(norm):
    layer = kl.PatchEmbedding(D, 2, norm=norm, norm_epsilon=1e-3)
    images = _inputs(B, 4, 4, 3)
    layer.build(images.shape)
    _randomise(layer)
    w = _weights(layer)
    tokens = _patchify(images.astype("float64"), 2) @ w[
        "conv/kernel"].reshape(-1, D) + w["conv/bias"]
    want = apply_norm(norm, tokens, {k[5:]: v for k, v in w.items()
                                     if k.startswith("norm/")}, 1e-3)
    np.testing.assert_allclose(_np(layer(images)), want, rtol=RTOL,
                               atol=ATOL)


def test_patch_embedding_refuses_an_unknown_norm_naming_it():
    with pytest.raises(ValueError, match="norm='batch'"):
        kl.PatchEmbedding(D, 2, norm="batch")


def test_patch_embedding_config_round_trips():
    layer = kl.PatchEmbedding(D, 4, use_bias=False, norm="rms",
                              norm_epsilon=1e-5, name="patch_embedding")
    config = layer.get_config()
    want = {"hidden_size": D, "patch_size": 4, "use_bias": False,
            "norm": "rms", "norm_epsilon": 1e-5}
    for key, value in want.items():
        assert config[key] == value, key
    rebuilt = kl.PatchEmbedding.from_config(config)
    assert isinstance(rebuilt.token_norm, kl.RMSNormalization)
    assert rebuilt.conv.kernel_size == (4, 4) and not rebuilt.conv.use_bias


# -- prefix and patch tokens -------------------------------------------------

def test_class_token_starts_at_zero():
    layer = kl.ClassToken()
    x = _inputs(B, 3, D)
    got = _np(layer(x))
    np.testing.assert_array_equal(got[:, 0], np.zeros((B, D)))
    np.testing.assert_array_equal(got[:, 1:], x)


def test_class_token_prepends_its_learned_vector_to_every_example():
    layer = kl.ClassToken()
    x = _inputs(B, 3, D)
    layer.build(x.shape)
    _randomise(layer)
    cls = _weights(layer)["cls"]
    got = _np(layer(x))
    assert got.shape == (B, 4, D)
    np.testing.assert_allclose(got[:, 0], np.broadcast_to(cls[0, 0], (B, D)),
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(got[:, 1:], x)
    assert layer.compute_output_shape((None, 3, D)) == (None, 4, D)
    assert layer.compute_output_shape((None, None, D)) == (None, None, D)


@pytest.mark.parametrize("index", [0, 1, 3])
def test_register_tokens_go_in_after_the_first_index_tokens(index):
    layer = kl.RegisterTokens(2, index=index)
    x = _inputs(B, 3, D)
    layer.build(x.shape)
    _randomise(layer)
    registers = _weights(layer)["registers"]
    assert registers.shape == (1, 2, D)
    want = np.concatenate([x[:, :index], np.repeat(registers, B, axis=0),
                           x[:, index:]], axis=1)
    got = _np(layer(x))
    assert got.shape == (B, 5, D)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert layer.compute_output_shape((None, 3, D)) == (None, 5, D)


def test_register_tokens_config_round_trips():
    config = kl.RegisterTokens(4, index=1).get_config()
    assert (config["num_tokens"], config["index"]) == (4, 1)
    rebuilt = kl.RegisterTokens.from_config(config)
    assert (rebuilt.num_tokens, rebuilt.index) == (4, 1)


TOKENS = np.arange(B * 7 * 3, dtype="float32").reshape(B, 7, 3)
IMAGES = np.zeros((B, 8, 12, 3), "float32")


def test_patch_tokens_lay_the_patches_on_the_images_grid():
    got = _np(kl.PatchTokens(1, 4)([TOKENS, IMAGES]))
    assert got.shape == (B, 2, 3, 3)
    for r in range(2):
        for c in range(3):
            np.testing.assert_array_equal(got[:, r, c],
                                          TOKENS[:, 1 + r * 3 + c])


def test_patch_tokens_as_a_sequence_with_the_prefix():
    layer = kl.PatchTokens(1, 4, output_format="NLC", return_prefix=True)
    patches, prefix = layer([TOKENS, IMAGES])
    np.testing.assert_array_equal(_np(patches), TOKENS[:, 1:])
    np.testing.assert_array_equal(_np(prefix), TOKENS[:, :1])
    assert layer.compute_output_shape([(None, 7, 3), (None, 8, 12, 3)]) == (
        (None, 6, 3), (None, 1, 3))
    nhwc = kl.PatchTokens(1, 4)
    assert nhwc.compute_output_shape([(None, 7, 3), (None, 8, 12, 3)]) == (
        None, 2, 3, 3)


def test_patch_tokens_refuse_an_unknown_format_and_round_trip_their_config():
    with pytest.raises(ValueError, match="output_format='NCHW'"):
        kl.PatchTokens(1, 4, output_format="NCHW")
    config = kl.PatchTokens(2, 8, output_format="NLC",
                            return_prefix=True).get_config()
    rebuilt = kl.PatchTokens.from_config(config)
    assert (rebuilt.num_prefix_tokens, rebuilt.stride, rebuilt.output_format,
            rebuilt.return_prefix) == (2, 8, "NLC", True)


# -- the sin-cos table and the resize ----------------------------------------

@pytest.mark.parametrize("rows, cols, width", [(2, 3, 8), (3, 3, 16)])
def test_sincos_table_is_the_sines_and_cosines_of_column_then_row(
        rows, cols, width):
    table = kl.sincos_2d_table((rows, cols), width)
    assert table.shape == (rows * cols, width) and table.dtype == np.float32
    np.testing.assert_allclose(table, _sincos(rows, cols, width), rtol=RTOL,
                               atol=1e-6)


def test_sincos_table_of_a_grid_of_tensors_is_the_same_table():
    grid = (ops.convert_to_tensor(2), ops.convert_to_tensor(3))
    got = _np(kl.sincos_2d_table(grid, 8))
    np.testing.assert_allclose(got, _sincos(2, 3, 8), rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("width", [6, 4, 10])
def test_sincos_table_refuses_a_width_off_the_multiples_of_four(width):
    with pytest.raises(ValueError, match=f"width={width}"):
        kl.sincos_2d_table((2, 2), width)


def test_resize_axis_interpolates_with_aligned_corners():
    table = np.array([[0.0], [2.0], [10.0]])
    # Samples at 0, 0.5, 1, 1.5 and 2 of the old axis.
    want = [0.0, 1.0, 2.0, 6.0, 10.0]
    np.testing.assert_allclose(embeddings.resize_axis(table, 5, 0)[:, 0],
                               want, rtol=RTOL, atol=ATOL)
    # Shrinking: samples at 0 and 2, the corners.
    np.testing.assert_allclose(embeddings.resize_axis(table, 2, 0)[:, 0],
                               [0.0, 10.0], rtol=RTOL, atol=ATOL)
    # One sample: the first entry.
    np.testing.assert_allclose(embeddings.resize_axis(table, 1, 0)[:, 0],
                               [0.0], rtol=RTOL, atol=ATOL)


def test_resize_axis_of_a_tensor_matches_scipy_along_any_axis():
    table = _inputs(3, 4, 2)
    for axis, new_len in ((0, 5), (1, 7), (1, 2)):
        zoom = [1.0, 1.0, 1.0]
        zoom[axis] = new_len / table.shape[axis]
        want = ndimage.zoom(table.astype("float64"), zoom, order=1)
        got = _np(embeddings.resize_axis(ops.convert_to_tensor(table),
                                         new_len, axis))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        # A length given as a scalar tensor (a dynamic-size graph's).
        got = _np(embeddings.resize_axis(ops.convert_to_tensor(table),
                                         ops.convert_to_tensor(new_len),
                                         axis))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_resize_axis_repeats_an_axis_of_one_entry():
    table = np.array([[1.0, 2.0]])
    np.testing.assert_array_equal(embeddings.resize_axis(table, 3, 0),
                                  [[1.0, 2.0]] * 3)


def test_resize_axis_keeps_a_table_of_the_same_length():
    table = _inputs(4, 2)
    np.testing.assert_array_equal(embeddings.resize_axis(table, 4, 0), table)


@pytest.mark.parametrize("grid_size, new_grid", [
    ((2, 3), (4, 5)), ((4, 4), (3, 2)), ((3, 3), (3, 6))])
def test_resize_grid_table_matches_scipy_zoom(grid_size, new_grid):
    grid = _inputs(grid_size[0] * grid_size[1], D).astype("float64")
    want = _zoom(grid.reshape(*grid_size, D), new_grid).reshape(-1, D)
    np.testing.assert_allclose(
        kl.resize_grid_table(grid, grid_size, new_grid), want,
        rtol=1e-12, atol=1e-12)
    got = kl.resize_grid_table(ops.convert_to_tensor(grid.astype("float32")),
                               grid_size, new_grid)
    np.testing.assert_allclose(_np(got), want, rtol=RTOL, atol=ATOL)


def test_runtime_grid_cuts_the_images_by_the_stride():
    images = ops.zeros((1, 8, 12, 3))
    assert kl.runtime_grid(images, 4) == (2, 3)


def test_runtime_grid_refuses_a_side_off_the_stride():
    with pytest.raises(ValueError, match=r"multiples of 4; received images "
                                         r"of shape \(1, 10, 12, 3\)"):
        kl.runtime_grid(ops.zeros((1, 10, 12, 3)), 4)


# -- PositionEmbedding -------------------------------------------------------

def _position(kind, grid=(2, 3), prefix=1, stride=None, dim=D):
    layer = kl.PositionEmbedding(grid, num_prefix_tokens=prefix, kind=kind,
                                 stride=stride)
    layer.build((None, None if stride else prefix + grid[0] * grid[1], dim))
    _randomise(layer)
    return layer


def _learned_2d(w, rows, cols, prefix):
    """Zeros for the prefix tokens, then concat(X[col], Y[row])."""
    x, y = w["pos_embedding_x"], w["pos_embedding_y"]
    half = x.shape[-1]
    patches = [np.concatenate([x[c], y[r]]) for r in range(rows)
               for c in range(cols)]
    return np.concatenate([np.zeros((prefix, 2 * half)), patches])


def test_learned_1d_adds_one_learned_row_per_token():
    layer = _position("learned_1d")
    table = _weights(layer)["pos_embedding"]
    assert table.shape == (1, 7, D)
    x = _inputs(B, 7, D)
    np.testing.assert_allclose(_np(layer(x)), x + table, rtol=RTOL,
                               atol=ATOL)


def test_learned_2d_adds_the_column_and_row_halves():
    layer = _position("learned_2d")
    w = _weights(layer)
    assert w["pos_embedding_x"].shape == (3, D // 2)
    assert w["pos_embedding_y"].shape == (2, D // 2)
    x = _inputs(B, 7, D)
    np.testing.assert_allclose(_np(layer(x)), x + _learned_2d(w, 2, 3, 1),
                               rtol=RTOL, atol=ATOL)


def test_sincos_2d_adds_the_fixed_table_and_nothing_to_the_prefix():
    layer = _position("sincos_2d", prefix=2)
    assert layer.weights == []
    x = _inputs(B, 8, D)
    want = np.concatenate([np.zeros((2, D)), _sincos(2, 3, D)])
    np.testing.assert_allclose(_np(layer(x)), x + want, rtol=RTOL, atol=ATOL)


def test_the_additive_kinds_are_the_papers_three():
    assert kl.ADDITIVE_POSITION_EMBEDDINGS == ("learned_1d", "learned_2d",
                                               "sincos_2d")


def test_learned_1d_resizes_its_patch_rows_to_the_images_grid():
    layer = _position("learned_1d", grid=(2, 2), stride=4)
    table = _weights(layer)["pos_embedding"][0]
    x = _inputs(B, 1 + 3 * 4, D)
    images = np.zeros((B, 12, 16, 3), "float32")
    patches = _zoom(table[1:].reshape(2, 2, D), (3, 4)).reshape(-1, D)
    want = x + np.concatenate([table[:1], patches])
    np.testing.assert_allclose(_np(layer(x, images=images)), want,
                               rtol=RTOL, atol=ATOL)


def test_learned_2d_resizes_each_axis_table_to_the_images_grid():
    layer = _position("learned_2d", grid=(2, 2), stride=4)
    w = _weights(layer)
    resized = {
        "pos_embedding_x": ndimage.zoom(w["pos_embedding_x"], (2, 1),
                                        order=1),
        "pos_embedding_y": ndimage.zoom(w["pos_embedding_y"], (1.5, 1),
                                        order=1)}
    x = _inputs(B, 1 + 3 * 4, D)
    images = np.zeros((B, 12, 16, 3), "float32")
    np.testing.assert_allclose(_np(layer(x, images=images)),
                               x + _learned_2d(resized, 3, 4, 1),
                               rtol=RTOL, atol=ATOL)


def test_sincos_2d_is_recomputed_for_the_images_grid():
    layer = _position("sincos_2d", grid=(2, 2), stride=4)
    x = _inputs(B, 1 + 3 * 4, D)
    images = np.zeros((B, 12, 16, 3), "float32")
    want = x + np.concatenate([np.zeros((1, D)), _sincos(3, 4, D)])
    np.testing.assert_allclose(_np(layer(x, images=images)), want,
                               rtol=RTOL, atol=ATOL)


def test_at_its_own_grid_a_table_is_added_as_it_is():
    layer = _position("learned_1d", grid=(2, 3), stride=4)
    table = _weights(layer)["pos_embedding"]
    x = _inputs(B, 7, D)
    images = np.zeros((B, 8, 12, 3), "float32")
    np.testing.assert_allclose(_np(layer(x, images=images)), x + table,
                               rtol=RTOL, atol=ATOL)


def test_position_embedding_refuses_a_token_count_off_its_grid():
    layer = kl.PositionEmbedding((2, 3), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="expects 7 tokens"):
        layer.build((None, 6, D))


def test_learned_2d_refuses_an_odd_width():
    layer = kl.PositionEmbedding((2, 3), kind="learned_2d")
    with pytest.raises(ValueError, match="even hidden size"):
        layer.build((None, 6, 7))


def test_position_embedding_refuses_an_unknown_kind_naming_it():
    with pytest.raises(ValueError, match="kind='relative'"):
        kl.PositionEmbedding((2, 3), kind="relative")


def test_position_embedding_config_round_trips():
    layer = kl.PositionEmbedding((2, 3), num_prefix_tokens=1,
                                 kind="learned_2d", stride=16)
    config = layer.get_config()
    assert config["grid_size"] == [2, 3]
    assert (config["num_prefix_tokens"], config["kind"],
            config["stride"]) == (1, "learned_2d", 16)
    rebuilt = kl.PositionEmbedding.from_config(config)
    assert (rebuilt.grid_size, rebuilt.num_prefix_tokens, rebuilt.kind,
            rebuilt.stride, rebuilt.num_tokens) == (
                (2, 3), 1, "learned_2d", 16, 7)


def test_position_embedding_symbolic_output_is_the_tokens_shape():
    layer = kl.PositionEmbedding((2, 2), num_prefix_tokens=1, stride=4)
    spec = layer.compute_output_spec(keras.KerasTensor((None, None, D)))
    assert tuple(spec.shape) == (None, None, D)
