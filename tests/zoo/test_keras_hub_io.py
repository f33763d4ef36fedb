"""keras-hub's ViT both ways (zoo/keras_hub/io.py), against keras-hub's own
forward: live ViTImageClassifier / ViTBackbone objects and the preset
directories its save_to_preset writes, on random weights at tiny sizes."""

import json
import shutil
import sys

import numpy as np
import pytest

import keras_hub

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402
from keras_vit.base.errors import ConfigError, MissingDependencyError  # noqa: E402
from keras_vit.zoo import checkpoints
from keras_vit.zoo.keras_hub import io as keras_hub_io
from keras_vit.zoo.keras_hub import layout as keras_hub_layout


def _randomise(model, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:  # every weight, LayerNorms and zero heads too
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _images(shape=(32, 32), n=3):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, *shape, 3)).astype("float32")


def _backbone(image_shape=(32, 32, 3), **kw):
    kw = dict(dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                   mlp_dim=64), **kw)
    return keras_hub.models.ViTBackbone(image_shape=image_shape, **kw)


def _official_converter():
    # keras-hub's ViT presets: mean 0.5 / std 0.5, per channel.
    return keras_hub.layers.ViTImageConverter(
        image_size=(32, 32), scale=[1 / 127.5] * 3, offset=[-1.0] * 3)


# Two corners of keras-hub's options keras_vit reproduces: class token with
# a pre_logits layer, another epsilon and a softmax; no class token (gap),
# no biases, a non-square image.
CASES = {
    "token": (dict(layer_norm_epsilon=1e-5),
              dict(intermediate_dim=24, activation="softmax"), (32, 32)),
    "gap_no_bias": (dict(image_shape=(32, 16, 3), use_class_token=False,
                         use_mha_bias=False, use_mlp_bias=False,
                         use_patch_bias=False),
                    dict(pooling="gap"), (32, 16)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def classifier(request, tmp_path_factory):
    backbone_kw, task_kw, shape = CASES[request.param]
    preprocessor = None
    if shape == (32, 32):
        preprocessor = keras_hub.models.ViTImageClassifierPreprocessor(
            image_converter=_official_converter())
    hub = _randomise(keras_hub.models.ViTImageClassifier(
        backbone=_backbone(**backbone_kw), num_classes=3,
        preprocessor=preprocessor, **task_kw))
    path = tmp_path_factory.mktemp("kh") / request.param
    hub.save_to_preset(str(path))
    return hub, path, shape


def test_classifier_object_and_preset_match_keras_hub(classifier):
    hub, path, shape = classifier
    x = _images(shape)
    expected = np.asarray(hub(x))
    assert np.abs(expected).max() > 0.05  # the outputs say something
    for source in (hub, path, str(path)):
        model = zoo.from_keras_hub(source)
        np.testing.assert_allclose(np.asarray(model(x)), expected,
                                   atol=1e-5, rtol=0, err_msg=str(source))
    # keras-hub's numerics: its epsilon, its exact GELU.
    eps = hub.backbone.layer_norm_epsilon
    assert model.get_layer("encoder_norm").epsilon == eps
    assert model.get_layer("encoder_block_0").layer_norm_epsilon == eps
    assert model.get_config()["gelu"] == "exact"
    assert model.zoo_source == str(path)
    # The reader alone: facts and the arrays in keras-hub's own names,
    # which its layout puts on the model's variables.
    arch, arrays = keras_hub_io.read(path)
    assert arch["kind"] == "classifier" and arch["num_classes"] == 3
    table = "vit_patching_and_embedding/position_embedding/embeddings"
    assert arrays[table].ndim == 2
    assert keras_hub_layout.VIT.key_of("head/kernel") == "predictions/kernel"
    assert "predictions/kernel" in arrays


def test_backbone_object_and_preset_give_its_tokens(tmp_path):
    backbone = _randomise(_backbone(layer_norm_epsilon=1e-6), seed=2)
    x = _images()
    expected = np.asarray(backbone(x))
    backbone.save_to_preset(str(tmp_path / "bb"))
    for source in (backbone, tmp_path / "bb"):
        model = zoo.from_keras_hub(source)
        assert model.get_config()["include_top"] is False
        np.testing.assert_allclose(np.asarray(model(x)), expected,
                                   atol=1e-5, rtol=0)
    # A new head on the encoder, and a resized position table.
    head = zoo.from_keras_hub(tmp_path / "bb", num_classes=5, image_size=48)
    assert np.asarray(head(_images((48, 48)))).shape == (3, 5)


def test_preset_reads_without_keras_hub(classifier, monkeypatch):
    """A preset directory is JSON and HDF5: keras-hub is not imported."""
    hub, path, shape = classifier
    expected = np.asarray(hub(_images(shape)))
    monkeypatch.setitem(sys.modules, "keras_hub", None)
    model = zoo.from_keras_hub(path)
    np.testing.assert_allclose(np.asarray(model(_images(shape))), expected,
                               atol=1e-5, rtol=0)
    with pytest.raises(MissingDependencyError, match="pip install 'keras-hub'"):
        zoo.to_keras_hub(model)


# -- zoo.load: a preset directory is one of its sources -------------------------

def test_zoo_load_reads_a_preset_as_from_keras_hub(classifier):
    hub, path, shape = classifier
    x = _images(shape)
    want = zoo.from_keras_hub(path)
    for source in (path, str(path)):
        model = zoo.load(source)
        np.testing.assert_allclose(np.asarray(model(x)), np.asarray(want(x)),
                                   atol=1e-6, rtol=0, err_msg=str(source))
        assert model.get_config() == want.get_config()
        assert model.zoo_source == str(path)
        assert model.zoo_labels is None and model.zoo_weights is None
    # kwargs reach the model as from_keras_hub's do: features, and another
    # size where the grid is square (the position table is resized).
    kw = dict(include_top=False, pooling=None)
    if shape[0] == shape[1]:
        kw["image_size"] = shape = (48, 48)
    features = zoo.load(str(path), **kw)
    x = _images(shape)
    np.testing.assert_allclose(
        np.asarray(features(x)),
        np.asarray(zoo.from_keras_hub(path, **kw)(x)), atol=1e-6, rtol=0)
    assert features.output_shape[-1] == 32


def test_zoo_load_preset_with_another_head(classifier):
    hub, path, shape = classifier
    model = zoo.load(str(path), num_classes=5)
    out = np.asarray(model(_images(shape)))
    assert out.shape == (3, 5)
    np.testing.assert_array_equal(out, 0.0)  # a new, zero-initialised head
    assert model.get_config()["representation_size"] is None
    # A backbone preset gets a head only when asked for one.
    backbone = _randomise(_backbone(), seed=6)
    backbone.save_to_preset(str(path.parent / f"{path.name}_bb"))
    tokens = zoo.load(str(path.parent / f"{path.name}_bb"))
    np.testing.assert_allclose(np.asarray(tokens(_images())),
                               np.asarray(backbone(_images())),
                               atol=1e-5, rtol=0)
    head = zoo.load(str(path.parent / f"{path.name}_bb"), num_classes=4)
    assert np.asarray(head(_images())).shape == (3, 4)


def test_zoo_load_other_directories_keep_their_errors(preset, tmp_path):
    # A folder no reader claims: said to be one (it was once parsed as a
    # zoo name, "Unknown model name='/tmp/...'").
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="is a folder keras_vit "
                       "cannot read"):
        zoo.load(str(tmp_path / "empty"))
    # A config.json that is not keras-hub's (nor transformers' or timm's).
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"class_name": "X"}')
    with pytest.raises(FileNotFoundError, match="is a folder keras_vit "
                       "cannot read"):
        zoo.load(str(tmp_path / "other"))
    # A preset that is keras-hub's but not of the ViT family (DINOv2 and
    # the others load: tests/zoo/test_keras_hub_family.py): its reader's
    # error.
    def rename(data):
        data["class_name"] = "ResNetBackbone"

    _edit(preset, tmp_path / "resnet", "config.json", rename)
    with pytest.raises(ConfigError, match="class_name='ResNetBackbone'"):
        zoo.load(str(tmp_path / "resnet"))
    # As weights= for a name, its sizes must fit: refused naming the preset.
    with pytest.raises(checkpoints.CheckpointError) as info:
        zoo.load("ViT-Ti/16", weights=str(preset))
    assert repr(str(preset)) in str(info.value)


def test_bfloat16_preset_loads_its_values(tmp_path):
    """Keras stores bfloat16 as 2-byte opaque data marked dtype=bfloat16;
    each value is read exactly (as float32)."""
    backbone = _randomise(_backbone(dtype="bfloat16"), seed=5)
    backbone.save_to_preset(str(tmp_path / "bf16"))
    model = zoo.from_keras_hub(tmp_path / "bf16")
    want = np.asarray(backbone.get_layer("vit_encoder").layer_norm.gamma
                      .value.numpy(), "float32")
    got = model.get_layer("encoder_norm").gamma.numpy()
    np.testing.assert_array_equal(got, want)


# -- keras_vit -> keras-hub ------------------------------------------------------

def _keras_vit(**kw):
    kw = dict(dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
                   num_heads=2, mlp_dim=64, num_classes=3, gelu="exact"), **kw)
    return _randomise(keras_vit.vit(**kw), seed=3)


@pytest.mark.parametrize("kw", [
    dict(representation_size=24, layer_norm_epsilon=1e-12),
    dict(classifier="gap", image_size=(32, 16))])
def test_to_keras_hub_round_trip_through_a_preset(tmp_path, kw):
    model = _keras_vit(**kw)
    shape = model.get_config()["image_size"]
    shape = (shape, shape) if isinstance(shape, int) else tuple(shape)
    x = _images(shape)
    ours = np.asarray(model(x))
    hub = zoo.to_keras_hub(model)
    assert isinstance(hub, keras_hub.models.ViTImageClassifier)
    np.testing.assert_allclose(np.asarray(hub(x)), ours, atol=1e-5, rtol=0)
    # keras-hub's task API: predict takes [0, 255] pixels through the
    # image converter, as the official [-1, 1] of keras_vit.
    pixels = np.round((x + 1) * 127.5).astype("float32")
    np.testing.assert_allclose(hub.predict(pixels, verbose=0),
                               np.asarray(model(pixels / 127.5 - 1)),
                               atol=1e-5, rtol=0)
    hub.save_to_preset(str(tmp_path / "p"))
    again = keras_hub.models.ViTImageClassifier.from_preset(
        str(tmp_path / "p"))
    np.testing.assert_allclose(np.asarray(again(x)), ours, atol=1e-5, rtol=0)
    back = zoo.from_keras_hub(tmp_path / "p")
    np.testing.assert_allclose(np.asarray(back(x)), ours, atol=1e-5, rtol=0)


def test_the_input_normalisation_goes_to_keras_hub_and_back(tmp_path):
    """A model trained on ImageNet-normalised inputs becomes a keras-hub
    classifier whose image converter normalises so (its predict on [0, 255]
    pixels is the model on normalised ones), and its preset loads back
    into a model that records the same normalisation."""
    from keras_vit.data.normalization import of_model

    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    model = _randomise(keras_vit.vit(
        image_size=32, patch_size=8, hidden_size=32, num_layers=1,
        num_heads=2, mlp_dim=64, num_classes=3, gelu="exact",
        input_normalization="imagenet"), seed=4)
    hub = zoo.to_keras_hub(model)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3))
    pixels = np.round(pixels).astype("float32")
    np.testing.assert_allclose(
        hub.predict(pixels, verbose=0),
        np.asarray(model(of_model(model)(pixels))), atol=1e-4, rtol=0)
    hub.save_to_preset(str(tmp_path / "p"))
    back = zoo.from_keras_hub(tmp_path / "p")
    np.testing.assert_allclose(of_model(back).mean, imagenet["mean"],
                               rtol=1e-5)
    np.testing.assert_allclose(of_model(back).std, imagenet["std"],
                               rtol=1e-5)


def test_label_names_go_to_keras_hub_and_back(tmp_path):
    """zoo_labels ride on the live classifier and come back with its head;
    a new head drops them; its save_to_preset keeps them in the preset's
    metadata.json, which keras-hub ignores and zoo.load reads back."""
    model = _keras_vit()
    model.zoo_labels = ["cat", "dog", "bird"]
    hub = zoo.to_keras_hub(model)
    assert hub.zoo_labels == ["cat", "dog", "bird"]
    assert zoo.from_keras_hub(hub).zoo_labels == ["cat", "dog", "bird"]
    assert zoo.from_keras_hub(hub, num_classes=5).zoo_labels is None
    hub.save_to_preset(str(tmp_path / "p"))
    back = zoo.load(str(tmp_path / "p"))
    assert list(back.label_names) == ["cat", "dog", "bird"]
    assert zoo.from_keras_hub(tmp_path / "p").zoo_labels == [
        "cat", "dog", "bird"]
    # keras-hub reads the preset as before.
    again = keras_hub.models.ViTImageClassifier.from_preset(
        str(tmp_path / "p"))
    x = _images()
    np.testing.assert_allclose(np.asarray(again.backbone(x)),
                               np.asarray(hub.backbone(x)), atol=1e-5, rtol=0)
    # Names that do not fit the head are refused before anything is written.
    hub.zoo_labels = ["cat"]
    with pytest.raises(ValueError, match="zoo_labels.*3 classes"):
        hub.save_to_preset(str(tmp_path / "q"))
    assert not (tmp_path / "q").exists()


def test_headless_model_becomes_a_backbone(tmp_path):
    model = _keras_vit(include_top=False)
    hub = zoo.to_keras_hub(model)
    assert isinstance(hub, keras_hub.models.ViTBackbone)
    x = _images()
    np.testing.assert_allclose(np.asarray(hub(x)), np.asarray(model(x)),
                               atol=1e-5, rtol=0)
    hub.save_to_preset(str(tmp_path / "bb"))
    again = keras_hub.models.Backbone.from_preset(str(tmp_path / "bb"))
    np.testing.assert_allclose(np.asarray(again(x)), np.asarray(model(x)),
                               atol=1e-5, rtol=0)


def test_models_keras_hub_cannot_hold_are_refused():
    cases = [
        (_keras_vit(gelu="tanh"), "gelu='tanh'.*gelu='exact'"),
        (_keras_vit(resnet=dict(num_layers=())), "hybrid"),
        (_keras_vit(position_embedding="sincos_2d"), "position embedding"),
        (_keras_vit(include_top=False, pooling="token",
                    representation_size=16), "pre_logits"),
        (_keras_vit(classifier_activation="relu"), "classifier_activation"),
    ]
    for model, reason in cases:
        with pytest.raises(ValueError, match=reason):
            zoo.to_keras_hub(model)
    with pytest.raises(ValueError, match="from_keras_hub takes"):
        zoo.from_keras_hub(_keras_vit())


# -- hostile presets ----------------------------------------------------------------

def _edit(src, dst, name, change):
    shutil.copytree(src, dst)
    path = dst / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    hub = _randomise(keras_hub.models.ViTImageClassifier(
        backbone=_backbone(), num_classes=3,
        preprocessor=keras_hub.models.ViTImageClassifierPreprocessor(
            image_converter=_official_converter())))
    path = tmp_path_factory.mktemp("kh") / "preset"
    hub.save_to_preset(str(path))
    return path


BAD_CONFIGS = [
    ("config.json", "hidden_dim", 10**9),
    ("config.json", "num_layers", 10**6),
    ("config.json", "image_shape", [10**6, 32, 3]),
    ("config.json", "num_heads", 3),
    ("config.json", "layer_norm_epsilon", "tiny"),
    ("config.json", "use_class_token", "yes"),
    ("config.json", "dtype", "int8"),
    ("config.json", "patch_size", [8, 4]),
    ("task.json", "num_classes", -1),
    ("task.json", "pooling", "max"),
    ("task.json", "activation", "relu"),
    ("image_converter.json", "scale", -1 / 255),
    ("image_converter.json", "offset", [0.0, 1.0]),
]


@pytest.mark.parametrize("name,field,value", BAD_CONFIGS,
                         ids=[f"{n}:{f}" for n, f, _ in BAD_CONFIGS])
def test_hostile_config_refused_before_reading_weights(preset, tmp_path,
                                                       name, field, value):
    def change(data):
        data["config"][field] = value

    path = _edit(preset, tmp_path / "bad", name, change)
    # The weights are gone: the refusal comes from the config alone, before
    # anything is allocated or read.
    (tmp_path / "bad" / "model.weights.h5").unlink()
    with pytest.raises(ConfigError) as info:
        zoo.from_keras_hub(tmp_path / "bad")
    message = str(info.value)
    assert str(path) in message
    assert field in message, message


def test_other_classes_and_settings_are_refused(preset, tmp_path):
    def rename(data):
        data["class_name"] = "ResNetBackbone"

    _edit(preset, tmp_path / "a", "config.json", rename)
    with pytest.raises(ConfigError, match="DINOV2Backbone.*class_name="
                       "'ResNetBackbone'"):
        zoo.from_keras_hub(tmp_path / "a")

    def new_option(data):
        data["config"]["use_layer_scale"] = True

    _edit(preset, tmp_path / "b", "config.json", new_option)
    with pytest.raises(ConfigError, match="use_layer_scale"):
        zoo.from_keras_hub(tmp_path / "b")

    def first_patch(data):  # pooling 'token' without a class token
        data["config"]["use_class_token"] = False

    _edit(preset, tmp_path / "c", "config.json", first_patch)
    with pytest.raises(ConfigError, match="first patch"):
        zoo.from_keras_hub(tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("[1, 2]")
    with pytest.raises(checkpoints.CheckpointError, match="not an object"):
        zoo.from_keras_hub(tmp_path / "d")


def test_weights_that_disagree_are_listed_naming_the_file(preset, tmp_path):
    import h5py

    def wider(data):  # a config larger than its tensors
        data["config"].update(hidden_dim=64, num_layers=3)

    _edit(preset, tmp_path / "wide", "config.json", wider)
    with pytest.raises(checkpoints.CheckpointError) as info:
        zoo.from_keras_hub(tmp_path / "wide")
    message = str(info.value)
    assert str(tmp_path / "wide" / "model.weights.h5") in message
    assert "missing" in message and "mis-shaped" in message
    assert "vit_encoder/transformer_block_3/ln_1/gamma" in message
    assert "'vit_encoder/ln/gamma': [32] (expected [64])" in message

    def h5_case(name, edit):
        folder = tmp_path / name
        shutil.copytree(preset, folder)
        with h5py.File(folder / "model.weights.h5", "a") as f:
            edit(f)
        with pytest.raises(checkpoints.CheckpointError) as info:
            zoo.from_keras_hub(folder)
        assert str(folder / "model.weights.h5") in str(info.value)
        return str(info.value)

    gamma = "layers/vi_t_encoder/layer_norm/vars/0"

    def replace(f, **kw):
        del f[gamma]
        f.create_dataset(gamma, **kw)

    assert "dtype" in h5_case("ints", lambda f: replace(
        f, data=np.zeros(32, "int32")))
    assert "in chunks" in h5_case("chunked", lambda f: replace(
        f, data=np.zeros(32, "float32"), chunks=(8,), compression="gzip"))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\0" * 128)
    assert "another file" in h5_case("external", lambda f: replace(
        f, shape=(32,), dtype="float32", external=[(str(outside), 0, 128)]))
    assert "missing" in h5_case("soft_link", lambda f: (
        f.__delitem__(gamma), f.__setitem__(gamma, h5py.SoftLink(
            "/layers/vi_t_encoder/layer_norm/vars/1"))))
    # A truncated file.
    short = tmp_path / "short"
    shutil.copytree(preset, short)
    data = (short / "model.weights.h5").read_bytes()
    (short / "model.weights.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(checkpoints.CheckpointError) as info:
        zoo.from_keras_hub(short)
    assert str(short / "model.weights.h5") in str(info.value)
