"""The ``naflex`` option: one model for any aspect ratio and resolution.

The property it exists for, that each image of a batch of mixed grids and
padding gets the output it gets alone, for hostile grids drawn by
hypothesis; the inputs keras_vit.data.naflex makes; and the settings it
refuses in one line. Its table resize per image (``position_resize``) is
compared with torch's in tests/layers/test_position_resize.py,
transformers' own SigLIP2 towers in
tests/zoo/test_transformers_siglip2.py, the exports in
tests/export/test_export_naflex.py."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import keras_vit
from keras_vit.data import naflex
from testkit import randomise_keras

TINY = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=2,
            num_heads=2, mlp_dim=32, naflex=True)


@pytest.fixture(scope="module")
def models():
    """A tiny NaFlex model per pooling, random weights."""
    return {
        "map": randomise_keras(keras_vit.vit(**TINY, num_classes=3,
                                             classifier="map")),
        "gap": randomise_keras(keras_vit.vit(**TINY, num_classes=3,
                                             classifier="gap",
                                             num_registers=2), 1),
        "token": randomise_keras(keras_vit.vit(**TINY, num_classes=3), 2),
        "tokens": randomise_keras(keras_vit.vit(**TINY, num_classes=0,
                                                include_top=False), 3),
    }


@settings(max_examples=12, deadline=None)
@given(grids=st.lists(st.tuples(st.integers(1, 7), st.integers(1, 7)),
                      min_size=1, max_size=3),
       extra=st.integers(0, 5), pooling=st.sampled_from(
           ["map", "gap", "token", "tokens"]), seed=st.integers(0, 99))
def test_each_image_of_a_mixed_batch_gets_what_it_gets_alone(
        models, grids, extra, pooling, seed):
    model = models[pooling]
    rng = np.random.default_rng(seed)
    images = [rng.uniform(-1, 1, (4 * r, 4 * c, 3)) for r, c in grids]
    longest = max(r * c for r, c in grids) + extra
    batch = naflex.patchify(images, 4, max_patches=longest, resize=False)
    together = np.asarray(model(batch))
    assert np.all(np.isfinite(together))
    for i, (r, c) in enumerate(grids):
        alone = np.asarray(model(naflex.patchify(
            images[i:i + 1], 4, max_patches=r * c, resize=False)))
        if pooling == "tokens":  # the image's own tokens, then padding
            together_i = together[i, :alone.shape[1]]
        else:
            together_i = together[i]
        np.testing.assert_allclose(together_i, alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["map", "gap", "token", "tokens"])
def test_a_row_of_padding_alone_is_finite_and_moves_no_other_image(
        models, pooling):
    """A batch padded with a row of no patch (a serving batch filled up)
    gives that row finite outputs (the masked mean and max of nothing are
    zeros, as timm's mean is) and the other image what it gets alone."""
    model = models[pooling]
    image = np.random.default_rng(5).uniform(-1, 1, (8, 12, 3))
    alone = naflex.patchify([image], 4, max_patches=6, resize=False)
    batch = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in
             alone.items()}
    out = np.asarray(model(batch))
    assert np.all(np.isfinite(out)), out
    np.testing.assert_allclose(out[0], np.asarray(model(alone))[0],
                               atol=1e-5, rtol=0)
    if pooling == "gap":  # each of the three pools: zeros, not 0 / 0
        for method in ("gap", "max", "avgmax"):
            layer = keras_vit.layers.TokenPooling(method,
                                                  num_prefix_tokens=1)
            bias = np.zeros((1, 1, 1, 4), "float32")
            bias[..., 1:] = -1e9
            pooled = np.asarray(layer(np.ones((1, 4, 2), "float32"),
                                      padding_bias=bias))
            np.testing.assert_array_equal(pooled, np.zeros((1, 2)))


def test_the_patches_are_the_images_cut_row_by_row():
    image = np.arange(8 * 12 * 3, dtype="float32").reshape(8, 12, 3)
    batch = naflex.patchify([image], 4, max_patches=8, resize=False)
    assert batch["patch_mask"].tolist() == [[1] * 6 + [0] * 2]
    assert batch["patch_coords"][0, :6].tolist() == [
        [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    # Patch (1, 2): rows 4-7, columns 8-11, each pixel's channels.
    np.testing.assert_array_equal(batch["patches"][0, 5],
                                  image[4:8, 8:12].reshape(-1))
    assert not batch["patches"][0, 6:].any()
    # The same weights take the images whole: the patch embedding is the
    # convolution's.
    model = randomise_keras(keras_vit.vit(**dict(
        TINY, naflex=False, image_size=(8, 12)), num_classes=0,
        classifier="gap"))
    flex = keras_vit.vit(**TINY, num_classes=0, classifier="gap")
    for mine, theirs in zip(flex.get_layer("patch_embedding").weights,
                            model.get_layer("patch_embedding").weights):
        mine.assign(theirs)
    ours = flex.get_layer("patch_embedding")(batch["patches"])
    want = model.get_layer("patch_embedding")(image[None])
    np.testing.assert_allclose(np.asarray(ours)[:, :6], np.asarray(want),
                               atol=1e-3, rtol=1e-5)


def test_each_image_keeps_its_aspect_ratio_within_the_budget():
    for height, width in ((100, 300), (300, 100), (64, 64), (5, 999)):
        rows, cols = naflex.grid_for(height, width, 16, 64)
        assert rows * cols <= 64
        assert rows >= 1 and cols >= 1
        # One more patch row or column (at the same ratio) would not fit.
        assert (rows + 1) * (cols + 1) > 64 or min(rows, cols) == 1
        if min(rows, cols) > 2:
            assert abs(rows / cols - height / width) / (height / width) < 0.5
    batch = naflex.patchify([np.zeros((100, 300, 3))], 16, max_patches=64)
    rows, cols = batch["patch_coords"].max(axis=1)[0] + 1
    assert (rows, cols) == naflex.grid_for(100, 300, 16, 64)


@pytest.mark.parametrize("images, kwargs, match", [
    ([], {}, "at least one image"),
    ([np.zeros((8, 8))], {}, r"images\[0\] must be \(height, width"),
    ([np.zeros((8, 8, 3)), np.zeros((8, 8, 1))], {}, r"images\[1\]"),
    ([np.zeros((10, 8, 3))], dict(resize=False), "10 x 8 pixels"),
    ([np.zeros((8, 8, 3))], dict(max_patches=0), "max_patches"),
])
def test_patchify_refuses_in_one_line(images, kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        naflex.patchify(images, 4, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rope="eva02"), "rope='eva02'"),
    (dict(position_embedding="sincos_2d"), "position_embedding='sincos_2d'"),
    (dict(dynamic_image_size=True), "dynamic_image_size=True"),
    (dict(resnet=dict(num_layers=(1,), width_factor=1)), "resnet="),
    (dict(merge_size=2, classifier="gap", class_token=False),
     "merge_size=2"),
])
def test_what_naflex_cannot_take_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        keras_vit.vit(**dict(TINY, **kwargs), num_classes=0)
    assert "naflex=True" in str(info.value)
    assert "\n" not in str(info.value)


def test_predict_takes_images_of_any_aspect_ratio():
    """``predict`` on images of mixed sizes: each resized keeping its
    aspect ratio to at most the table's patches, as patchify does."""
    model = randomise_keras(keras_vit.vit(**TINY, num_classes=3,
                                          classifier="map"))
    rng = np.random.default_rng(5)
    images = [rng.uniform(-1, 1, size).astype("float32")
              for size in ((10, 30, 3), (40, 8, 3), (16, 16, 3))]
    got = model.predict(images, verbose=0)
    assert got.shape == (3, 3)
    for i, image in enumerate(images):
        want = model(naflex.patchify([image], 4, max_patches=16))
        np.testing.assert_allclose(got[i], np.asarray(want)[0], atol=1e-5,
                                   rtol=0)


def test_the_fixed_size_twin_computes_the_same_function():
    """``rebuild(model, naflex=False)`` gives the same function at one
    size (the patch embedding is the convolution's, the table resized by
    the official rule there): what a format that takes only images of
    one size would export. The exporters take NaFlex models themselves
    (tests/export/test_export_naflex.py)."""
    model = keras_vit.vit(**TINY, num_classes=3, classifier="map")
    fixed = keras_vit.rebuild(randomise_keras(model), naflex=False)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
    np.testing.assert_allclose(
        np.asarray(fixed(x.astype("float32"))),
        np.asarray(model(naflex.patchify(x, 4, 16, resize=False))),
        atol=1e-5, rtol=0)


def test_the_predict_command_keeps_each_images_aspect_ratio(tmp_path,
                                                            capsys):
    """``keras-vit predict`` on a folder of mixed aspect ratios with a
    NaFlex model: each image normalised at its own size and cut within
    the table's patches, the same numbers as patchify gives."""
    import json

    from PIL import Image

    from keras_vit import cli
    from keras_vit.data.images import read
    from keras_vit.data.normalization import of_model

    model = randomise_keras(keras_vit.vit(**TINY, num_classes=4,
                                          classifier="map"))
    path = tmp_path / "flex.keras"
    model.save(path)
    rng = np.random.default_rng(7)
    folder = tmp_path / "images"
    folder.mkdir()
    for name, size in (("wide", (9, 40)), ("tall", (50, 12)),
                       ("square", (16, 16))):
        Image.fromarray(rng.integers(0, 256, (*size, 3), "uint8")).save(
            folder / f"{name}.png")
    assert cli.main(["predict", str(path), str(folder), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["image_size"] == "any"
    for pred in result["predictions"]:
        pixels = np.asarray(read(pred["image"]), "float32")
        batch = naflex.patchify([of_model(model)(pixels)], 4, 16)
        rows, cols = batch["patch_coords"].max(axis=1)[0] + 1
        assert (rows, cols) == naflex.grid_for(*pixels.shape[:2], 4, 16)
        p = np.asarray(model(batch))[0]
        p = np.exp(p - p.max()) / np.exp(p - p.max()).sum()
        top = pred["top"]
        assert top[0]["index"] == int(np.argmax(p))
        np.testing.assert_allclose(top[0]["probability"], p.max(),
                                   atol=1e-5)


def test_intermediate_blocks_are_tokens_not_one_grid():
    """Each image of a NaFlex batch has its grid: the blocks' outputs come
    as tokens ("NLC", those of the model's own last block), and a map on
    one grid ("NHWC") is refused in one line."""
    model = randomise_keras(keras_vit.vit(**TINY, num_classes=0,
                                          include_top=False,
                                          num_registers=1))
    batch = naflex.patchify([np.ones((8, 12, 3)), np.ones((4, 4, 3))], 4,
                            max_patches=8, resize=False)
    out = keras_vit.models.intermediate_model(
        model, indices=1, output_format="NLC", prefix_tokens=True,
        norm=True)(batch)
    tokens = np.asarray(model(batch))  # class and register tokens first
    np.testing.assert_allclose(np.asarray(out["block_1"]), tokens[:, 2:],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(out["block_1_prefix"]),
                               tokens[:, :2], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="output_format='NHWC'") as info:
        keras_vit.models.intermediate_model(model)
    assert "\n" not in str(info.value)
