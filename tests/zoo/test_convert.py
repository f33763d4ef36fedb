"""Checkpoint conversion: layouts, resize, strictness, bad files."""


import numpy as np
import pytest
import scipy.ndimage

import official
from conftest import TINY, tiny_builder_kwargs
from testkit import cached_tiny_vit as _tiny_model
from testkit import bad_calls_test
from testkit import one_error_line as _one_error_line
from testkit import tiny as _tiny

import keras_vit
from keras_vit import zoo
from keras_vit.runtime.backend import to_numpy
from keras_vit.zoo import convert

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends


def _model(**kw):
    return keras_vit.models.vit(**tiny_builder_kwargs(**kw))


def _x(side=32, n=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, side, side, 3)).astype(
        "float32")


@pytest.mark.parametrize("old_grid,new_grid,prefix", [
    ((4, 4), (6, 6), 1), ((7, 7), (12, 12), 1), ((24, 24), (14, 14), 0),
    ((14, 14), (24, 24), 1), ((5, 5), (3, 8), 1), ((4, 4), (1, 1), 0)])
def test_resize_posemb_matches_scipy_zoom(old_grid, new_grid, prefix):
    rng = np.random.default_rng(0)
    d = 16
    posemb = rng.standard_normal((1, prefix + old_grid[0] * old_grid[1], d)
                                 ).astype("float32")
    got = zoo.resize_posemb(posemb, new_grid, prefix, old_grid=old_grid)
    grid = posemb[0, prefix:].reshape(old_grid[0], old_grid[1], d)
    zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
    want = scipy.ndimage.zoom(grid, zoom, order=1).reshape(-1, d)
    assert got.shape == (1, prefix + new_grid[0] * new_grid[1], d)
    np.testing.assert_array_equal(got[0, :prefix], posemb[0, :prefix])
    np.testing.assert_allclose(got[0, prefix:], want, atol=1e-6, rtol=0)


def _table_model(grid, kind, dynamic=False):
    return keras_vit.models.vit(
        image_size=(8 * grid[0], 8 * grid[1]), patch_size=8, hidden_size=16,
        num_layers=1, num_heads=2, mlp_dim=32, num_classes=3,
        position_embedding=kind, dynamic_image_size=dynamic)


@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d"])
@pytest.mark.parametrize("old_grid,new_grid", [
    ((4, 4), (6, 6)), ((24, 24), (14, 14)), ((14, 14), (37, 37)),
    ((5, 5), (3, 8)), ((4, 4), (1, 1)), ((1, 3), (4, 5))])
def test_loading_and_a_dynamic_size_resize_a_table_alike(kind, old_grid,
                                                         new_grid):
    """Differential: a checkpoint's position table loaded into a model of
    another grid (NumPy, float64) and a dynamic-size model's table resized
    for an input of that grid (keras.ops) are the same table, to float32
    rounding: both are keras_vit.layers.embeddings.resize_axis."""
    dynamic = _table_model(old_grid, kind, dynamic=True)
    rng = np.random.default_rng(0)
    for w in dynamic.weights:
        w.assign(rng.normal(0, 3, w.shape).astype("float32"))
    fixed = _table_model(new_grid, kind)
    convert.load_weights(fixed, convert.export_arrays(dynamic),
                         source_grid=old_grid)
    loaded = to_numpy(fixed.get_layer("position_embedding").table())
    resized = to_numpy(dynamic.get_layer("position_embedding").table(new_grid))
    scale = max(np.abs(to_numpy(w)).max() for w in
                dynamic.get_layer("position_embedding").weights)
    np.testing.assert_allclose(resized, loaded, rtol=0,
                               atol=4 * np.finfo("float32").eps * scale)


def test_all_layouts_load_identically(tmp_path):
    outputs = []
    for layout in ("old", "new", "stacked"):
        arrays = official.vit_arrays(**TINY, num_classes=7, seed=5,
                                     layout=layout)
        model = _model()
        zoo.load_weights(model, official.write(tmp_path / f"{layout}.npz",
                                               arrays))
        outputs.append(to_numpy(model(_x())))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_export_arrays_round_trip(tmp_path):
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=6)
    model = _model()
    zoo.load_weights(model, arrays)
    back = zoo.export_arrays(model)
    assert set(back) == set(arrays)
    for k in arrays:
        np.testing.assert_array_equal(back[k], arrays[k])
    path = zoo.save_npz(model, tmp_path / "out.npz")
    again = _model()
    zoo.load_weights(again, path)
    np.testing.assert_array_equal(to_numpy(again(_x())),
                                  to_numpy(model(_x())))


def test_higher_resolution_resizes_posemb_like_the_official_code():
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=7)
    model = _model(grid=6)  # 48x48 input, 6x6 grid instead of 4x4
    report = zoo.load_weights(model, arrays)
    assert report["resized_posemb"] == (16, 36)
    got = model.get_layer("position_embedding").pos_embedding.numpy()
    pe = arrays["Transformer/posembed_input/pos_embedding"]
    grid = pe[0, 1:].reshape(4, 4, -1)
    want = scipy.ndimage.zoom(grid, (1.5, 1.5, 1), order=1).reshape(36, -1)
    np.testing.assert_allclose(got[0, 1:], want, atol=1e-6)
    np.testing.assert_array_equal(got[0, 0], pe[0, 0])
    assert np.isfinite(to_numpy(model(_x(48)))).all()


def test_new_head_is_zero_and_pre_logits_dropped():
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=8,
                                 representation_size=24)
    model = _model(num_classes=3)
    report = zoo.load_weights(model, arrays)
    assert report["head"] == "replaced" and report["pre_logits"] == "dropped"
    assert not np.any(model.get_layer("head").kernel.numpy())
    np.testing.assert_array_equal(to_numpy(model(_x())), 0.0)


def test_keep_pre_logits_on_new_head():
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=8,
                                 representation_size=24)
    model = _model(num_classes=3, representation_size=24)
    report = zoo.load_weights(model, arrays, keep_pre_logits=True)
    assert report["pre_logits"] == "loaded"
    np.testing.assert_array_equal(
        model.get_layer("pre_logits").kernel.numpy(), arrays["pre_logits/kernel"])


def _drop(*keys):
    return lambda arrays: [arrays.pop(k) for k in keys]


# How a checkpoint's head can fail a model of as many classes -> the words
# that name it in the error.
BAD_HEADS = {
    "no head": (_drop("head/kernel", "head/bias"),
                "missing from the checkpoint (2): head/kernel, head/bias"),
    "no head bias": (_drop("head/bias"),
                     "missing from the checkpoint (1): head/bias"),
    "transposed kernel": (
        lambda a: a.__setitem__("head/kernel", a["head/kernel"].T.copy()),
        "head/kernel: checkpoint (7, 32) vs model (32, 7)"),
    "bias of other classes": (
        lambda a: a.__setitem__("head/bias", np.zeros(9, "float32")),
        "head/bias: checkpoint (9,) vs model (7,)"),
}


@pytest.mark.parametrize("bad", sorted(BAD_HEADS))
def test_a_missing_or_mis_shaped_head_is_refused_not_zeroed(bad):
    """Only a head of another number of classes is replaced by zeros; a
    checkpoint without one, or with one of the model's classes in another
    shape, once left a zero head silently (report: 'replaced')."""
    edit, needle = BAD_HEADS[bad]
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=3)
    edit(arrays)
    model = _model(num_classes=7)
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(zoo.CheckpointError) as e:
        zoo.load_weights(model, arrays)
    assert needle in str(e.value), str(e.value)
    for w, b in zip(model.weights, before):  # nothing half loaded
        np.testing.assert_array_equal(w.numpy(), b)
    if bad.startswith("no head"):  # whatever the model's number of classes
        with pytest.raises(zoo.CheckpointError, match="head/"):
            zoo.load_weights(_model(num_classes=3), arrays)


def test_a_new_head_asked_of_a_load_is_zero(tmp_path):
    """zoo.load(name, weights=file, num_classes=other) fine-tunes: a zero
    head, whether the file has a head of other classes or none."""
    sizes = tiny_builder_kwargs()
    del sizes["num_classes"], sizes["classifier"], sizes["representation_size"]
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=4)
    full = official.write(tmp_path / "full.npz", arrays)
    _drop("head/kernel", "head/bias")(arrays)
    bare = official.write(tmp_path / "bare.npz", arrays)
    for path in (full, bare):
        model = zoo.load("ViT-Ti/16", weights=str(path), num_classes=5,
                         **sizes)
        assert not np.any(model.get_layer("head").kernel.numpy()), path
    with pytest.raises(ValueError, match="has no head"):
        zoo.load("ViT-Ti/16", weights=str(bare), **sizes)


def test_pre_logits_with_same_head_is_an_error():
    """A head trained on pre_logits features must not be loaded without them."""
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=8,
                                 representation_size=24)
    with pytest.raises(zoo.CheckpointError, match="pre_logits"):
        zoo.load_weights(_model(num_classes=7), arrays)


def test_strict_lists_every_problem_at_once():
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=9)
    del arrays["Transformer/encoderblock_1/LayerNorm_2/scale"]
    arrays["Transformer/encoderblock_7/LayerNorm_0/scale"] = np.ones(32, "float32")
    arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"] = np.ones(
        (32, 65), "float32")
    model = _model()
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(zoo.CheckpointError) as e:
        zoo.load_weights(model, arrays)
    msg = str(e.value)
    assert "missing" in msg and "encoderblock_1/LayerNorm_2/scale" in msg
    assert "unexpected" in msg and "encoderblock_7/LayerNorm_0/scale" in msg
    assert "mis-shaped" in msg and "(32, 65)" in msg
    # Nothing was half loaded.
    for w, b in zip(model.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_checkpoint_of_another_architecture(tmp_path):
    arrays = official.vit_arrays(patch=8, hidden=48, layers=3, heads=4, mlp=96,
                                 grid=4, num_classes=7)
    path = official.write(tmp_path / "other.npz", arrays)
    with pytest.raises(zoo.CheckpointError) as e:
        zoo.load_weights(_model(), path)
    assert "other.npz" in str(e.value) and "another architecture" in str(e.value)


def test_gap_checkpoint_into_token_model():
    arrays = official.vit_arrays(**TINY, num_classes=7, classifier="gap")
    with pytest.raises(zoo.CheckpointError, match="cls"):
        zoo.load_weights(_model(classifier="token"), arrays)


def test_corrupt_and_truncated_npz(tmp_path):
    good = official.write(tmp_path / "good.npz",
                          official.vit_arrays(**TINY, num_classes=7))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all" * 100)
    for bad in (truncated, garbage):
        with pytest.raises(zoo.CheckpointError) as e:
            zoo.load_weights(_model(), bad)
        assert str(bad) in str(e.value)
    with pytest.raises(zoo.CheckpointError, match="not found"):
        zoo.read_npz(tmp_path / "missing.npz")


def test_pickled_arrays_are_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(zoo.CheckpointError):
        zoo.read_npz(path)


def test_gn_like_key_normalisation_is_idempotent():
    arrays = official.vit_arrays(**TINY, num_classes=7, layout="stacked")
    once = convert.normalize_keys(arrays)
    assert convert.normalize_keys(once).keys() == once.keys()
    assert "Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias" in once


# Declared shapes are bounded before any allocation: the model's depth
# bounds a checkpoint's stack of blocks.
def test_compressed_stack_of_many_blocks_is_bounded_by_the_model(tmp_path):
    import time

    # 10**6 rows of zeros deflate to ~4 KB: the header is honest, the depth
    # is not; the model's depth bounds it before any slice is made.
    path = tmp_path / "deep.npz"
    np.savez_compressed(
        path, **{"Transformer/encoderblock/LayerNorm_0/scale":
                 np.zeros((10 ** 6, 1), "float32")})
    start = time.perf_counter()
    with pytest.raises(keras_vit.zoo.CheckpointError,
                       match="stacks 1000000 encoder blocks; the model has 1"):
        keras_vit.zoo.load_weights(_tiny(), str(path))
    assert time.perf_counter() - start < 5.0


def test_directories_where_a_file_belongs(tmp_path, capsys):
    from keras_vit import cli, zoo

    model = _tiny()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        zoo.save_npz(model, tmp_path)
    assert [p.name for p in tmp_path.parent.iterdir()
            if ".partial" in p.name] == []  # nothing written beside it
    with pytest.raises(zoo.CheckpointError, match="is a directory, not an"):
        zoo.load_weights(model, tmp_path)
    with pytest.raises(IsADirectoryError, match=r"weights=.* is a directory"):
        zoo.load("ViT-Ti/16", weights=str(tmp_path), image_size=16)
    zoo.save_npz(model, tmp_path / "w.npz")
    (tmp_path / "out.keras").mkdir()
    assert cli.main(["convert", str(tmp_path / "w.npz"), "-m", "ViT-Ti/16",
                     "--image-size", "16", "-o",
                     str(tmp_path / "out.keras")]) == 2
    assert "is a directory; pass a file name" in _one_error_line(capsys)


# Bad arguments to save_npz, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("save_npz to a folder", lambda: zoo.save_npz(_tiny_model(), "."),
     "path", "'.'", "weights.npz"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
