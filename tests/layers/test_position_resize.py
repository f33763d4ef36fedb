"""The ``position_resize`` row: each source's resize of a learned table,
the same through every path that resizes one.

A table meets another patch grid in three places: weights loaded at
another image size (``zoo.resize_posemb``, NumPy float64), a dynamic-size
model's graph (the layer's own table, keras.ops), and each image of a
NaFlex batch (``naflex_weights``). For every kernel and grids hypothesis
draws, the three equal the computation of the source the kernel names:
torch's ``interpolate`` as timm (bicubic, antialiased), transformers
(bicubic, a=-0.75) and SigLIP2 (bilinear, antialiased) call it, and the
official resize (bilinear, aligned corners). The sources' own models at
another size are compared in tests/zoo (timm in test_timm_hub.py,
transformers in test_transformers_family.py)."""

import keras
import numpy as np
import pytest
import torch  # before TensorFlow (tests/conftest.py)
from hypothesis import given, settings, strategies as st

import keras_vit  # noqa: E402
from keras_vit.base import options  # noqa: E402
from keras_vit.layers.embeddings import (  # noqa: E402
    RESIZE_KERNELS, PositionEmbedding, naflex_weights)
from keras_vit.zoo.position_tables import resize_posemb  # noqa: E402

# Each backend runs the graph and NaFlex paths with its own ops.
pytestmark = pytest.mark.backends

# The kernel -> torch's interpolate arguments that compute it.
TORCH = {"bilinear_corners": dict(mode="bilinear", align_corners=True),
         "bilinear_aa": dict(mode="bilinear", align_corners=False,
                             antialias=True),
         "bicubic_aa": dict(mode="bicubic", align_corners=False,
                            antialias=True),
         "bicubic": dict(mode="bicubic", align_corners=False),
         "bilinear": dict(mode="bilinear", align_corners=False)}


def _torch_resize(grid_rows, old, new, kernel):
    """torch's resize of the (rows * cols, D) ``grid_rows`` of grid
    ``old`` to ``new``, in float64."""
    dim = grid_rows.shape[-1]
    table = torch.from_numpy(grid_rows.reshape(*old, dim)).permute(2, 0, 1)
    return torch.nn.functional.interpolate(
        table[None], size=new, **TORCH[kernel])[0].permute(
            1, 2, 0).reshape(-1, dim).numpy()


def test_every_kernel_of_the_row_has_its_reference():
    assert set(TORCH) == set(RESIZE_KERNELS)
    assert set(options.choices("position_resize")) == {None, *TORCH}


@settings(max_examples=15, deadline=None)
@given(old=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       new=st.tuples(st.integers(1, 13), st.integers(1, 13)),
       kernel=st.sampled_from(RESIZE_KERNELS), seed=st.integers(0, 99))
def test_every_path_resizes_as_the_source_does(old, new, kernel, seed):
    prefix, dim = 1, 4
    table = np.random.default_rng(seed).normal(
        size=(1, prefix + old[0] * old[1], dim))
    want = _torch_resize(table[0, prefix:], old, new, kernel)
    # Loading at another size: NumPy float64, rounded once.
    loaded = resize_posemb(table, new, prefix, old_grid=old, kernel=kernel)
    np.testing.assert_allclose(loaded[0, prefix:], want, atol=1e-10)
    np.testing.assert_array_equal(loaded[0, :prefix], table[0, :prefix])
    # The layer's own table at another grid (a dynamic-size model's).
    layer = PositionEmbedding(old, prefix, stride=4, resize=kernel)
    layer.build((None, None, dim))
    layer.pos_embedding.assign(table.astype("float32"))
    graph = keras.ops.convert_to_numpy(layer.table(new))
    np.testing.assert_allclose(graph[0, prefix:], want, atol=2e-5)
    # One NaFlex image of that grid, padded by two tokens.
    coords = np.stack(np.meshgrid(np.arange(new[0]), np.arange(new[1]),
                                  indexing="ij"), -1).reshape(1, -1, 2)
    coords = np.concatenate([coords, np.zeros((1, 2, 2), int)], 1)
    mask = (np.arange(coords.shape[1]) < new[0] * new[1])[None]
    weights = keras.ops.convert_to_numpy(naflex_weights(
        coords, mask.astype("int32"), old, kernel)).astype("float64")
    np.testing.assert_allclose(weights[0, :new[0] * new[1]]
                               @ table[0, prefix:], want, atol=2e-5)


@settings(max_examples=15, deadline=None)
@given(old=st.tuples(st.integers(1, 7), st.integers(1, 7)),
       grids=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)),
                      min_size=1, max_size=3),
       kernel=st.sampled_from(RESIZE_KERNELS), seed=st.integers(0, 99))
def test_a_naflex_table_keeping_the_aspect_is_timms_square_then_cropped(
        old, grids, kernel, seed):
    """``aspect=True`` (position_aspect, timm's pos_embed_ar_preserving):
    each image of a batch gets the table resized to a square of its
    grid's longer side, its top-left corner cut to the grid, by torch's
    own interpolate; the table's own grid is read as it is."""
    dim = 3
    table = np.random.default_rng(seed).normal(size=(old[0] * old[1], dim))
    count = max(r * c for r, c in grids) + 1  # and one padding token
    coords = np.zeros((len(grids), count, 2), int)
    mask = np.zeros((len(grids), count), "int32")
    for b, (r, c) in enumerate(grids):
        coords[b, :r * c] = np.stack(np.meshgrid(
            np.arange(r), np.arange(c), indexing="ij"), -1).reshape(-1, 2)
        mask[b, :r * c] = 1
    weights = keras.ops.convert_to_numpy(naflex_weights(
        coords, mask, old, kernel, aspect=True)).astype("float64")
    for b, (r, c) in enumerate(grids):
        side = max(r, c)
        want = (table if (r, c) == tuple(old) else _torch_resize(
            table, old, (side, side), kernel).reshape(side, side, dim)[
                :r, :c].reshape(-1, dim))
        np.testing.assert_allclose(weights[b, :r * c] @ table, want,
                                   atol=2e-5)


def test_a_dynamic_model_computes_what_the_model_loaded_at_that_size_does():
    """The in-graph resize and the load-time one agree end to end: a
    dynamic-size model at 24 x 12 pixels is the model built for that size
    holding the table resized on loading, for every kernel."""
    x = np.random.default_rng(0).uniform(-1, 1, (2, 24, 12, 3)).astype(
        "float32")
    for kernel in RESIZE_KERNELS:
        dynamic = keras_vit.vit(
            image_size=16, patch_size=4, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32, num_classes=3, classifier="gap",
            dynamic_image_size=True, position_resize=kernel)
        at_size = keras_vit.zoo.rebuild(dynamic, image_size=(24, 12))
        assert at_size.get_config()["position_resize"] == kernel
        np.testing.assert_allclose(keras.ops.convert_to_numpy(dynamic(x)),
                                   keras.ops.convert_to_numpy(at_size(x)),
                                   atol=2e-5)


@pytest.mark.parametrize("values, kernel", [
    ({}, "bilinear_corners"), ({"naflex": True}, "bilinear_aa"),
    ({"position_resize": "bicubic"}, "bicubic"),
    ({"position_resize": "bicubic_aa", "naflex": True}, "bicubic_aa")])
def test_none_is_the_models_own_kernel(values, kernel):
    assert options.position_resize(values) == kernel
    model = keras_vit.vit(image_size=8, patch_size=4, hidden_size=8,
                          num_layers=1, num_heads=2, mlp_dim=16,
                          num_classes=2, **values)
    assert model.get_layer("position_embedding").resize == kernel


def test_an_unknown_kernel_is_refused_naming_the_row():
    with pytest.raises(ValueError, match="position_resize='bicubic_antialias"
                       "'.*Did you mean 'bicubic_aa'"):
        keras_vit.vit(image_size=8, patch_size=4, hidden_size=8,
                      num_layers=1, num_heads=2, mlp_dim=16,
                      num_classes=2, position_resize="bicubic_antialias")
