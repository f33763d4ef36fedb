"""keras-hub's ViT family beyond ViT (zoo/keras_hub/family.py): DeiT (and
its classifier), DINOv2 with and without registers (and with its SwiGLU
MLP), SigLIP's and CLIP's
image towers, each built by keras-hub at tiny sizes with every weight
random, written by its save_to_preset, loaded by zoo.load and compared with
what keras-hub computes from the same preset (its from_preset), on random
inputs as the backbones take them (the image converter's output). Each is
then written back (zoo.save_pretrained(..., layout="keras-hub")) and
loaded by keras-hub's own from_preset as the class it came from, with the
original's outputs."""

import json
import shutil

import numpy as np
import pytest

import keras_hub

from keras_vit import zoo  # noqa: E402
from keras_vit.base.errors import ConfigError  # noqa: E402
from keras_vit.data.normalization import of_model  # noqa: E402
from keras_vit.models import feature_model  # noqa: E402
from keras_vit.zoo import checkpoints  # noqa: E402
from testkit import tiny_vit  # noqa: E402

SIZES = dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
             intermediate_dim=64)
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _randomise(model, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:  # every float weight: norms, layer scales too
        if "int" not in str(w.dtype):  # not a table's position ids
            w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _images(n=2, size=32):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, size, size, 3)).astype("float32")


def _close(ours, theirs):
    theirs = np.asarray(theirs)
    assert np.abs(theirs).max() > 0.05  # the outputs say something
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5,
                               atol=1e-5 * np.abs(theirs).max())


def _saved(model, folder):
    model.save_to_preset(str(folder))
    return folder


def _written_back(model, folder, cls=None, labels=None):
    """``model`` written by keras_vit as a keras-hub preset, loaded by
    keras-hub (``cls.from_preset``, default any backbone)."""
    zoo.save_pretrained(model, str(folder), labels, layout="keras-hub")
    cls = cls or keras_hub.models.Backbone
    return cls.from_preset(str(folder))


def _siglip(**kw):
    vision = keras_hub.models.SigLIPVisionEncoder(
        image_shape=(32, 32, 3), **dict(SIZES, **kw))
    text = keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=50, embedding_dim=32, hidden_dim=32, num_layers=1,
        num_heads=2, intermediate_dim=64, sequence_length=8)
    return _randomise(keras_hub.models.SigLIPBackbone(vision, text), seed=3)


def _clip():
    vision = keras_hub.models.CLIPVisionEncoder(image_shape=(32, 32, 3),
                                                **SIZES)
    text = keras_hub.models.CLIPTextEncoder(
        vocabulary_size=50, embedding_dim=32, hidden_dim=32, num_layers=1,
        num_heads=2, intermediate_dim=64, max_sequence_length=8)
    return _randomise(keras_hub.models.CLIPBackbone(vision, text,
                                                    projection_dim=16), seed=4)


def test_deit_classifier_and_backbone(tmp_path):
    converter = keras_hub.layers.DeiTImageConverter(
        image_size=(32, 32), scale=[1 / (255 * s) for s in IMAGENET["std"]],
        offset=[-m / s for m, s in zip(IMAGENET["mean"], IMAGENET["std"])])
    backbone = keras_hub.models.DeiTBackbone(
        image_shape=(32, 32, 3), use_mha_bias=False, layer_norm_epsilon=1e-5,
        **SIZES)
    hub = _randomise(keras_hub.models.DeiTImageClassifier(
        backbone=backbone, num_classes=3, activation="softmax",
        preprocessor=keras_hub.models.DeiTImageClassifierPreprocessor(
            image_converter=converter)))
    x = _images()
    theirs = keras_hub.models.DeiTImageClassifier.from_preset(
        str(_saved(hub, tmp_path / "clf")))
    model = zoo.load(str(tmp_path / "clf"))
    _close(model(x), theirs(x))
    _close(feature_model(model, "tokens")(x), theirs.backbone(x))
    config = model.get_config()
    # The distillation token rides as a register: keras-hub's head reads
    # the class token alone.
    assert (config["num_registers"], config["distilled"]) == (1, False)
    assert config["gelu"] == "exact" and config["layer_norm_epsilon"] == 1e-5
    assert model.zoo_name.startswith("DeiT ")
    # The task's image converter: predict on [0, 255] pixels is the model
    # on the pixels normalised as it records.
    pixels = np.round((x + 1) * 127.5)
    np.testing.assert_allclose(of_model(model).mean, IMAGENET["mean"],
                               rtol=1e-5)
    _close(model(of_model(model)(pixels)), theirs.predict(pixels, verbose=0))
    # The backbone alone: every token; a live object reads the same.
    _saved(hub.backbone, tmp_path / "bb")
    tokens = zoo.load(str(tmp_path / "bb"))
    assert tokens.get_config()["include_top"] is False
    _close(tokens(x), theirs.backbone(x))
    _close(zoo.from_keras_hub(hub)(x), theirs(x))
    # Written back: the classifier (its head, its image converter, the
    # class names) and the backbone alone, as keras-hub's own classes.
    back = _written_back(model, tmp_path / "clf_back",
                         keras_hub.models.DeiTImageClassifier,
                         labels=["a", "b", "c"])
    _close(back(x), theirs(x))
    _close(back.predict(pixels, verbose=0), theirs.predict(pixels, verbose=0))
    again = zoo.load(str(tmp_path / "clf_back"))
    assert list(again.label_names) == ["a", "b", "c"]
    back = _written_back(tokens, tmp_path / "bb_back")
    assert type(back).__name__ == "DeiTBackbone"
    _close(back(x), theirs.backbone(x))


@pytest.mark.parametrize("registers,table,antialias,swiglu", [
    (0, 32, False, False), (2, 48, True, False), (1, 32, False, True)],
    ids=["plain", "registers_resized", "registers_swiglu"])
def test_dinov2_with_and_without_registers(tmp_path, registers, table,
                                           antialias, swiglu):
    """With registers the table covers the class token and the patches;
    a table kept at another position_embedding_shape is resized when the
    preset loads, by keras-hub (bicubic, antialiased here) and by keras_vit
    with the same Keras op. DINOv2-g's SwiGLU MLP (``weights_in``: gate
    columns, then value columns) keeps two thirds of intermediate_dim,
    rounded up to a multiple of 8: 64 -> 48 gated features."""
    hub = _randomise(keras_hub.models.DINOV2Backbone(
        image_shape=(32, 32, 3), num_register_tokens=registers,
        position_embedding_shape=(table, table, 3),
        antialias_in_interpolation=antialias, use_swiglu_ffn=swiglu,
        **SIZES), seed=2)
    theirs = keras_hub.models.Backbone.from_preset(
        str(_saved(hub, tmp_path / "p")))
    model = zoo.load(str(tmp_path / "p"))
    x = _images()
    _close(model(x), theirs(x))
    config = model.get_config()
    assert config["num_registers"] == registers
    assert config["layer_scale"] == 1.0 and config["include_top"] is False
    assert config["posemb_includes_prefix"] is (registers == 0)
    assert (config["mlp"], config["mlp_dim"]) == (
        ("swiglu", 48) if swiglu else ("gelu", 64))
    assert of_model(model).mean == pytest.approx(IMAGENET["mean"])
    # Written back as a DINOV2Backbone whose table is kept at image_shape.
    back = _written_back(model, tmp_path / "back")
    assert type(back).__name__ == "DINOV2Backbone"
    assert (back.num_register_tokens, back.use_swiglu_ffn) == (registers,
                                                                swiglu)
    _close(back(x), theirs(x))
    assert of_model(zoo.load(str(tmp_path / "back"))).mean == pytest.approx(
        IMAGENET["mean"])
    # Another size: keras_vit's resize from the preset's image_shape.
    assert model.get_layer("encoder_norm").output.shape[1] == 17 + registers
    bigger = zoo.load(str(tmp_path / "p"), image_size=48, num_classes=4)
    assert np.asarray(bigger(_images(size=48))).shape == (2, 4)


def test_siglip_image_tower_returns_its_pooled_embedding(tmp_path):
    hub = _siglip()
    theirs = keras_hub.models.Backbone.from_preset(
        str(_saved(hub, tmp_path / "p")))
    model = zoo.load(str(tmp_path / "p"))
    x = _images()
    _close(model(x), theirs.vision_encoder(x))
    config = model.get_config()
    assert (config["classifier"], config["num_classes"]) == ("map", 0)
    assert config["gelu"] == "tanh" and config["class_token"] is False
    assert of_model(model).mean == pytest.approx([0.5] * 3)
    # The tower saved alone reads the same; include_top=False: the tokens.
    alone = zoo.load(str(_saved(hub.vision_encoder, tmp_path / "alone")))
    _close(alone(x), theirs.vision_encoder(x))
    tokens = zoo.load(str(tmp_path / "p"), include_top=False)
    assert tokens.output_shape == (None, 16, 32)
    back = _written_back(model, tmp_path / "back")
    assert type(back).__name__ == "SigLIPVisionEncoder"
    _close(back(x), theirs.vision_encoder(x))


def test_clip_image_tower_returns_its_tokens(tmp_path):
    """keras-hub's CLIP picks the table's rows by position ids stored with
    the weights: zeros in a tower built without weights (every token gets
    row 0), 0..N-1 in a converted one. Both load as keras-hub computes."""
    hub = _clip()
    x = _images()
    ids = hub.vision_encoder.embedding.position_ids
    for name, value in (("zeros", np.zeros((1, 17))),
                        ("arange", np.arange(17)[None])):
        ids.assign(value.astype("int64"))
        theirs = keras_hub.models.Backbone.from_preset(
            str(_saved(hub, tmp_path / name)))
        model = zoo.load(str(tmp_path / name))
        _close(model(x), theirs.vision_encoder(x))
    config = model.get_config()
    assert (config["pre_norm"], config["patch_bias"]) == (True, False)
    assert config["gelu"] == "quick" and config["layer_norm_epsilon"] == 1e-5
    assert of_model(model).mean == pytest.approx([0.4815, 0.4578, 0.4082],
                                                 abs=1e-4)
    back = _written_back(model, tmp_path / "back")
    assert type(back).__name__ == "CLIPVisionEncoder"
    _close(back(x), theirs.vision_encoder(x))


# -- hostile and refused presets -------------------------------------------------

def _edit(src, dst, change, name="config.json"):
    shutil.copytree(src, dst)
    data = json.loads((dst / name).read_text())
    change(data)
    (dst / name).write_text(json.dumps(data))
    return dst


def _config(**kw):
    return lambda data: data["config"].update(kw)


def _vision(**kw):
    return lambda data: data["config"]["vision_encoder"]["config"].update(kw)


def _clip_tower(data):
    data["config"]["vision_encoder"]["class_name"] = "CLIPVisionEncoder"


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """A DINOv2 backbone's and a SigLIP model's presets, written once."""
    root = tmp_path_factory.mktemp("presets")
    return {"dino": _saved(keras_hub.models.DINOV2Backbone(
                image_shape=(16, 16, 3), **SIZES), root / "dino"),
            "siglip": _saved(_siglip(), root / "siglip")}


@pytest.mark.parametrize("src,change,field", [
    ("dino", _config(use_layer_norm_v2=True), "use_layer_norm_v2"),
    ("dino", _config(position_embedding_shape=[16, 24, 3]),
     "position_embedding_shape"),
    ("dino", _config(hidden_dim=10**9), "hidden_dim"),
    ("siglip", _vision(layer_norm_epsilon=1e-5), "layer_norm_epsilon"),
    ("siglip", _vision(intermediate_activation="relu"),
     "intermediate_activation"),
    ("siglip", _clip_tower, "vision_encoder.class_name"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_what_keras_vit_lacks_is_refused_naming_the_field(
        presets, tmp_path, src, change, field):
    folder = _edit(presets[src], tmp_path / "bad", change)
    (folder / "model.weights.h5").unlink()  # refused from the config
    with pytest.raises(ConfigError) as info:
        zoo.load(str(folder))
    message = str(info.value)
    assert field in message and str(folder) in message, message
    assert "\n" not in message


def test_presets_whose_weights_disagree_are_refused_naming_the_file(
        presets, tmp_path):
    import h5py

    dino, siglip = presets["dino"], presets["siglip"]
    # A DeiT classifier that averages every token with the patches.
    deit = keras_hub.models.DeiTImageClassifier(
        backbone=keras_hub.models.DeiTBackbone(image_shape=(16, 16, 3),
                                               **SIZES),
        num_classes=2, pooling="gap")
    with pytest.raises(ConfigError, match="pooling='gap'"):
        zoo.load(str(_saved(deit, tmp_path / "gap")))
    # Weights that disagree with the config, and position ids past the
    # table, are named with the file.
    wide = _edit(dino, tmp_path / "wide",
                 _config(num_register_tokens=3))
    with pytest.raises(checkpoints.CheckpointError, match="missing.*"
                       "dinov2_embedding/vars/"):
        zoo.load(str(wide))
    # A SwiGLU config over a GELU MLP's weights: SwiGLU's missing.
    gated = _edit(dino, tmp_path / "gated",
                  _config(use_swiglu_ffn=True))
    with pytest.raises(checkpoints.CheckpointError,
                       match="missing.*mlp/weights_in/vars/0"):
        zoo.load(str(gated))
    shutil.copytree(siglip, tmp_path / "ids")
    weights = tmp_path / "ids" / "model.weights.h5"
    with h5py.File(weights, "a") as f:
        f["layers/sig_lip_vision_encoder/layers/sig_lip_vision_embedding/"
          "vars/0"][0, 3] = 99
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"position ids outside \[0, 16\)"):
        zoo.load(str(tmp_path / "ids"))
    # A ViT name gives no sizes to a family preset.
    with pytest.raises(ValueError, match="DINOv2 preset"):
        zoo.load("ViT-Ti/16", weights=str(dino))


def test_what_no_keras_hub_class_computes_is_not_written(tmp_path):
    """A model no keras-hub class computes is refused in one line naming
    the option and the closest class, before anything is written."""
    cases = [
        (dict(layer_scale=1.0, qk_norm=True), "DINOV2Backbone",
         "qk_norm=True"),
        (dict(pre_norm=True, patch_bias=False, layer_norm_epsilon=1e-5,
              gelu="tanh"), "CLIPVisionEncoder", "gelu='tanh'"),
    ]
    for options, closest, option in cases:
        model = tiny_vit(include_top=False, image_size=16, patch_size=8,
                         num_layers=1, gelu=options.pop("gelu", "exact"),
                         **options)
        with pytest.raises(ValueError) as info:
            zoo.save_pretrained(model, str(tmp_path / "no"),
                                layout="keras-hub")
        message = str(info.value)
        assert closest in message and option in message, message
        assert "\n" not in message
        assert not (tmp_path / "no").exists()
