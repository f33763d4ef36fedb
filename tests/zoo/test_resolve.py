"""resolve_model (every kind of model spec, and bad ones) and rebuild (each
change, same outputs when nothing changes, a round trip through .keras)."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.runtime.backend import to_numpy
from keras_vit.base.errors import UnexpectedKeywordError
from keras_vit.base.variants import UnknownModelError
from keras_vit.zoo import rebuild, resolve_model

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends


def _tiny(**kwargs):
    options = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
                   num_heads=2, mlp_dim=32, num_classes=3)
    options.update(kwargs)
    keras.utils.set_random_seed(0)
    model = keras_vit.vit(**options)
    # Random weights everywhere (the head is zero-initialised).
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.1, w.shape).astype("float32")
                       for w in model.get_weights()])
    return model


def _images(size=32, n=2):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, size, size, 3)).astype("float32")


def _same(a, b, atol=1e-5):
    np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=atol)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolve")
    model = _tiny()
    path = root / "tiny.keras"
    model.save(path)
    run = root / "run"
    run.mkdir()
    model.save(run / "model.keras")
    return model, str(path), str(run)


# --------------------------------------------------------------------------
# resolve_model


def test_a_zoo_name_is_built_by_the_zoo():
    model = resolve_model("ViT-Ti/16", weights="none", image_size=32,
                          num_classes=10)
    assert model.zoo_name == "ViT-Ti/16"
    assert model.num_classes == 10 and model.grid_size == (2, 2)


def test_a_keras_file_and_a_run_directory(saved):
    model, path, run = saved
    x = _images()
    for spec in (path, run, os.fspath(path)):
        loaded = resolve_model(spec)
        _same(loaded(x), model(x))


def test_a_timm_repository_folder_goes_to_the_zoo(tmp_path):
    # A folder with model.safetensors (and no model.keras) is a local timm
    # repository, for zoo.load (tests/zoo/test_timm_hub.py loads one through
    # `keras-vit predict`), not refused as an unfinished run.
    from keras_vit.zoo.resolve import model_path

    (tmp_path / "model.safetensors").write_bytes(b"")
    assert model_path(tmp_path) is None
    (tmp_path / "model.keras").write_bytes(b"")
    assert model_path(tmp_path) == os.path.join(tmp_path, "model.keras")


def test_a_model_is_returned_itself_unless_changed(saved):
    model = saved[0]
    assert resolve_model(model) is model
    changed = resolve_model(model, num_classes=5)
    assert changed is not model and changed.num_classes == 5


def test_a_file_with_changes_is_rebuilt(saved):
    bigger = resolve_model(saved[1], image_size=48)
    assert bigger.grid_size == (6, 6)


@pytest.mark.parametrize("spec, kind, needle", [
    (3, ValueError, ("model must be a keras.Model, a zoo name, a .keras "
                     "file or a run directory; received model=3")),
    ("ViT-Q/16", UnknownModelError, "ViT-Q/16"),
])
def test_bad_specs_name_the_argument(spec, kind, needle):
    with pytest.raises(kind, match=needle.replace(".", r"\.")):
        resolve_model(spec, weights=None)


def test_bad_files_and_folders(tmp_path, saved):
    with pytest.raises(FileNotFoundError,
                       match=r"MODEL=.* is a folder without model.keras"):
        resolve_model(tmp_path, argument="MODEL")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="never unpickles"):
        resolve_model(pickled, argument="MODEL")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "gone.keras"))
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="is a file but not a .keras model"):
        resolve_model(str(text))
    cut = tmp_path / "cut.keras"
    cut.write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ValueError, match=r"model=.*cut.keras.* is not a "
                       r"\.keras model"):
        resolve_model(str(cut))


def test_a_given_error_class_is_used(tmp_path):
    class MineError(Exception):
        pass

    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(MineError, match="MODEL="):
        resolve_model(str(text), argument="MODEL", error=MineError)


def test_zoo_keywords_with_a_file_are_errors(saved):
    model, path, _ = saved
    with pytest.raises(ValueError, match="weights applies to zoo names only"):
        resolve_model(path, weights="augreg")
    with pytest.raises(ValueError, match="include_top applies to zoo names"):
        resolve_model(model, include_top=False)


def test_a_misspelt_zoo_name_suggests():
    with pytest.raises(UnknownModelError, match="ViT-B/16"):
        resolve_model("ViT-B/61x", weights=None)


# --------------------------------------------------------------------------
# rebuild


def test_no_change_gives_the_same_outputs(saved):
    model = saved[0]
    copy = rebuild(model)
    assert copy is not model
    x = _images()
    _same(copy(x), model(x))
    assert rebuild(model, copy=False) is model


def test_image_size_resizes_the_position_embeddings():
    model = _tiny()
    bigger = rebuild(model, image_size=48)
    assert bigger.grid_size == (6, 6)
    # The same resize as loading the checkpoint at that size.
    from keras_vit import zoo

    expected = keras_vit.vit(48, 8, 16, 1, 2, 32, 3)
    zoo.load_weights(expected, zoo.export_arrays(model))
    x = _images(48)
    _same(bigger(x), expected(x))
    # Back to the model's own size: the same model again.
    x = _images()
    _same(rebuild(bigger, image_size=32)(x), model(x), atol=1e-4)


def test_num_classes_gives_a_zero_head_and_drops_pre_logits():
    model = _tiny(representation_size=8)
    new = rebuild(model, num_classes=7)
    assert new.num_classes == 7 and new.representation_size is None
    _same(new(_images()), np.zeros((2, 7)))
    kept = rebuild(model, num_classes=7, keep_pre_logits=True)
    assert kept.representation_size == 8
    # The encoder is unchanged: its tokens equal the original's.
    x = _images()
    _same(new.feature_model("tokens")(x), model.feature_model("tokens")(x))


def test_a_headless_model_gets_a_head_and_gives_it_back():
    """num_classes=0 (no head: the pooled embedding) is a head size like
    any other, both ways; a model built without its top gets one only when
    asked for include_top=True too."""
    headless = _tiny(num_classes=0)
    x = _images()
    embedding = to_numpy(headless(x))
    assert embedding.shape == (2, 16)
    headed = rebuild(headless, num_classes=5)
    assert headed.output_shape == (None, 5)
    # The new head is zero-initialised on the same encoder.
    _same(headed(x), np.zeros((2, 5)))
    back = rebuild(headed, num_classes=0)
    assert back.output_shape == (None, 16)
    _same(back(x), embedding)
    tokens = _tiny(include_top=False)
    with pytest.raises(ValueError, match=r"num_classes=5 .*include_top=True"):
        rebuild(tokens, num_classes=5)
    assert rebuild(tokens, num_classes=5,
                   include_top=True).output_shape == (None, 5)


def test_zoo_load_num_classes_0_returns_the_embedding():
    full = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
                              num_classes=3)
    headless = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
                                  num_classes=0)
    assert headless.output_shape == (None, 192)
    assert full.get_layer("head").input.shape[-1] == 192


def test_dtype_builds_under_that_policy():
    model = _tiny()
    low = rebuild(model, dtype="mixed_bfloat16")
    assert low.dtype_policy.name == "mixed_bfloat16"
    assert low.get_config()["dtype"] == "mixed_bfloat16"  # saved with it
    back = rebuild(low, dtype="float32")
    assert back.dtype_policy.name == "float32"
    x = _images()
    _same(back(x), model(x))  # float32 weights survive the bf16 copy
    assert keras.config.dtype_policy().name == "float32"


def test_outputs_by_feature_name():
    model = _tiny(representation_size=8)
    x = _images()
    parts = rebuild(model, outputs=["tokens", "pre_logits", "logits",
                                    "attention_scores"])
    out = parts(x)
    assert tuple(out["tokens"].shape) == (2, 17, 16)
    assert tuple(out["pre_logits"].shape) == (2, 8)
    assert tuple(out["attention_scores"].shape) == (2, 1, 2, 17, 17)
    _same(out["logits"], model(x))
    assert tuple(rebuild(model, outputs="pre_logits")(x).shape) == (2, 8)


def test_other_changes_and_bad_ones():
    model = _tiny()
    assert rebuild(model, dropout_rate=0.1).dropout_rate == 0.1
    with pytest.raises(UnexpectedKeywordError, match="'dropout_rat'.*Did you "
                       "mean 'dropout_rate'"):
        rebuild(model, dropout_rat=0.1)
    for size in (0, (32, -8), "32", (32, 32, 32)):
        with pytest.raises(ValueError, match=r"received image_size="):
            rebuild(model, image_size=size)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    copy = rebuild(plain)
    np.testing.assert_allclose(to_numpy(copy.weights[0]),
                               to_numpy(plain.weights[0]))
    with pytest.raises(ValueError, match="only a keras_vit model"):
        rebuild(plain, dropout_rate=0.1)


def test_resnet_and_axial_rebuild():
    bit = keras_vit.models.resnet_v2(image_size=32, block_units=(1, 1, 1, 1),
                                     width_factor=1, num_classes=3)
    new = rebuild(bit, num_classes=4, image_size=64)
    assert new.num_classes == 4
    assert tuple(new.inputs[0].shape[1:3]) == (64, 64)
    axial = keras_vit.axial_vit(32, 8, 16, 1, 2, 32, 3)
    x = _images()
    _same(rebuild(axial)(x), axial(x))
    assert rebuild(axial, image_size=48).grid_size == (6, 6)


def test_round_trip_through_keras_file(tmp_path):
    model = _tiny()
    new = rebuild(model, image_size=48, num_classes=5)
    path = tmp_path / "new.keras"
    new.save(path)
    loaded = resolve_model(str(path))
    x = _images(48)
    _same(loaded(x), new(x))
    assert loaded.get_config() == new.get_config()


def test_the_moved_names_have_one_import_path():
    """resolve_model, rebuild, model_path and load_keras_file read
    checkpoints, the zoo's work: they live in keras_vit.zoo.resolve and
    keras_vit.zoo.keras_archive only (docs/changelog.md lists the removed
    aliases), and keras_vit.models answers them as it answers any name it
    lacks."""
    import keras_vit.models
    from keras_vit.zoo import keras_archive, resolve

    for module, name in ((resolve, "resolve_model"), (resolve, "rebuild"),
                         (resolve, "model_path"),
                         (keras_archive, "load_keras_file")):
        assert callable(getattr(module, name))
        assert not hasattr(keras_vit.models, name), name
    assert not hasattr(resolve, "load_keras_file")
    with pytest.raises(AttributeError):
        keras_vit.models.no_such_builder  # noqa: B018


# A position table of another grid with as many patches (4x4 -> 8x2) is a
# different table: copying it unchanged put every row on the wrong patch.
_TINY = dict(patch_size=8, hidden_size=32, num_layers=1, num_heads=2,
             mlp_dim=64, num_classes=5)


def _randomised(model):
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(rng.normal(0, 0.1, w.shape).astype(w.dtype))
    return model


def test_rebuild_resizes_a_table_of_another_grid_with_as_many_patches():
    from keras_vit.zoo import position_tables

    model = _randomised(keras_vit.vit(image_size=32, **_TINY))
    tall = rebuild(model, image_size=(64, 16))
    assert tall.grid_size == (8, 2)
    table = model.get_layer("position_embedding").pos_embedding.numpy()
    want = position_tables.resize_posemb(table, (8, 2), 1, old_grid=(4, 4))
    got = tall.get_layer("position_embedding").pos_embedding.numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    # And back again: the 8x2 table is not square, its grid comes along.
    square = rebuild(tall, image_size=32)
    back = position_tables.resize_posemb(got, (4, 4), 1, old_grid=(8, 2))
    np.testing.assert_allclose(
        square.get_layer("position_embedding").pos_embedding.numpy(), back,
        atol=1e-6)


def test_a_square_checkpoint_is_resized_into_a_grid_of_as_many_patches():
    from keras_vit.zoo import convert, position_tables

    square = _randomised(keras_vit.vit(image_size=32, **_TINY))
    arrays = convert.export_arrays(square)
    tall = keras_vit.vit(image_size=(64, 16), **_TINY)
    report = convert.load_weights(tall, arrays)
    assert report["resized_posemb"] == (16, 16)
    want = position_tables.resize_posemb(arrays[convert.POSEMB_KEY], (8, 2), 1)
    np.testing.assert_allclose(
        tall.get_layer("position_embedding").pos_embedding.numpy(), want,
        atol=1e-6)
