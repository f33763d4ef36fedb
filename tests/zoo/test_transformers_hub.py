"""Hugging Face transformers' ViT layout (config.json + model.safetensors as
ViTForImageClassification / ViTModel write them), against transformers' own
forward. Random weights, written by transformers' save_pretrained; never
the real Hub."""

import json
import shutil

import numpy as np
import pytest

# torch and transformers before TensorFlow (tests/conftest.py: the other
# order crashes here).
import torch
import transformers

from keras_vit import zoo  # noqa: E402
from keras_vit.zoo import checkpoints  # noqa: E402
from _fake_hub import FakeHub, run_against_hub  # noqa: E402
from testkit import assert_relative, randomise_torch  # noqa: E402

SIZE = 32
LABELS = {0: "tabby", 1: "tiger cat", 2: "lynx"}


def _config(**overrides):
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, image_size=SIZE, patch_size=8,
                  num_labels=3, id2label=LABELS,
                  label2id={v: k for k, v in LABELS.items()})
    values.update(overrides)
    return transformers.ViTConfig(**values)




def _images(n=3):
    rng = np.random.default_rng(1)
    return rng.uniform(-1, 1, (n, SIZE, SIZE, 3)).astype("float32")


def _torch_input(x):
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def _saved_repo(tmp_path_factory, cls, seed, name):
    """A randomised ``cls`` saved as safetensors; returns ``(folder, its
    output on _images())``."""
    model = randomise_torch(cls(_config()), seed)
    path = tmp_path_factory.mktemp("hf") / name
    model.save_pretrained(path, safe_serialization=True)
    with torch.no_grad():
        return path, model(pixel_values=_torch_input(_images()))


@pytest.fixture(scope="module")
def classifier_repo(tmp_path_factory):
    path, out = _saved_repo(tmp_path_factory,
                            transformers.ViTForImageClassification, 0,
                            "vit_cls")
    return path, out.logits.numpy()


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory):
    path, out = _saved_repo(tmp_path_factory, transformers.ViTModel, 1,
                            "vit_model")
    return path, out.pooler_output.numpy(), out.last_hidden_state.numpy()


def _copy(src, dst, *names):
    dst.mkdir(parents=True, exist_ok=True)
    for name in names or ("config.json", "model.safetensors"):
        shutil.copy(src / name, dst / name)
    return dst


def test_classifier_folder_matches_transformers_forward(classifier_repo):
    path, expected = classifier_repo
    model = zoo.load(str(path))
    got = np.asarray(model(_images()))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # transformers' numerics, from the config.
    block = model.get_layer("encoder_block_0")
    assert block.layer_norm_epsilon == 1e-12
    assert model.get_layer("encoder_norm").epsilon == 1e-12
    # id2label are the model's label names.
    assert model.zoo_labels == ["tabby", "tiger cat", "lynx"]
    top = zoo.decode_predictions(got, top=1, labels=model)[0][0]
    assert top[1] == LABELS[int(np.argmax(got[0]))]


def test_a_folder_written_with_id2label_only_keeps_its_names(tmp_path):
    """transformers 5 writes ``"label2id": null`` for a config given only
    ``id2label``: such a folder loads, names and all."""
    config = _config()
    config.label2id = None
    model = randomise_torch(transformers.ViTForImageClassification(config), 3)
    model.save_pretrained(tmp_path / "repo", safe_serialization=True)
    written = json.loads((tmp_path / "repo" / "config.json").read_text())
    assert written.get("label2id", None) is None
    loaded = zoo.load(str(tmp_path / "repo"))
    assert loaded.zoo_labels == ["tabby", "tiger cat", "lynx"]


def test_vit_model_pooler_is_pre_logits(model_repo):
    path, pooled, tokens = model_repo
    model = zoo.load(str(path))
    assert model.get_layer("pre_logits") is not None
    np.testing.assert_allclose(np.asarray(model(_images())), pooled,
                               atol=1e-5, rtol=0)
    features = zoo.load(str(path), pooling=None)
    np.testing.assert_allclose(np.asarray(features(_images())), tokens,
                               atol=1e-5, rtol=0)
    # A new head on the encoder: zero-initialised, the pooler dropped.
    head = zoo.load(str(path), num_classes=5)
    assert np.asarray(head(_images())).shape == (3, 5)
    assert head.zoo_labels is None


def test_weights_file_for_a_vit_name(classifier_repo, tmp_path):
    path, expected = classifier_repo
    # The file alone (no config.json beside it): the name gives the sizes,
    # transformers' defaults (eps 1e-12, exact GELU) the numerics. A name
    # of other sizes lists the mis-shaped tensors.
    weights = str(_copy(path, tmp_path / "lone", "model.safetensors")
                  / "model.safetensors")
    with pytest.raises(checkpoints.CheckpointError, match="mis-shaped") as info:
        zoo.load("ViT-Ti/8", weights=weights)
    assert weights in str(info.value)
    model = zoo.load("ViT-Ti/8", weights=weights, hidden_size=32, mlp_dim=64,
                     num_heads=2, num_layers=2)
    np.testing.assert_allclose(np.asarray(model(_images())), expected,
                               atol=1e-5, rtol=0)
    assert model.zoo_labels is None  # no config.json: no id2label
    # Beside its config.json, the file brings id2label along.
    model = zoo.load("ViT-Ti/8", weights=str(path / "model.safetensors"),
                     hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2)
    assert model.zoo_labels == ["tabby", "tiger cat", "lynx"]


def test_other_model_types_and_pickles_are_refused(classifier_repo, tmp_path):
    path, _ = classifier_repo
    config = json.loads((path / "config.json").read_text())
    # DeiT, DINOv2 and CLIP load (tests/zoo/test_transformers_family.py);
    # BEiT does not.
    beit = _copy(path, tmp_path / "beit")
    (beit / "config.json").write_text(json.dumps(
        dict(config, model_type="beit",
             architectures=["BeitForImageClassification"])))
    with pytest.raises(ValueError, match="model_type='beit'.*relative "
                                         "position bias"):
        zoo.load(str(beit))
    mim = _copy(path, tmp_path / "mim")
    (mim / "config.json").write_text(json.dumps(
        dict(config, architectures=["ViTForMaskedImageModeling"])))
    with pytest.raises(ValueError, match="ViTForMaskedImageModeling"):
        zoo.load(str(mim))
    pickled = _copy(path, tmp_path / "pickled", "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02 never read")
    with pytest.raises(FileNotFoundError,
                       match="pytorch_model.bin.*never unpickles"):
        zoo.load(str(pickled))


def test_absurd_config_is_refused_before_allocation(classifier_repo,
                                                    tmp_path):
    path, _ = classifier_repo
    config = json.loads((path / "config.json").read_text())
    for field, value, match in (
            ("hidden_size", 10**9, "field hidden_size"),
            ("num_hidden_layers", 10**6, "field num_hidden_layers"),
            ("image_size", 10**6, "field image_size"),
            ("num_attention_heads", 3, "divides hidden_size=32"),
            ("hidden_act", "relu", "field hidden_act"),
            ("qkv_bias", False, "field qkv_bias"),
            ("layer_norm_eps", "tiny", "field layer_norm_eps")):
        bad = _copy(path, tmp_path / field)
        (bad / "config.json").write_text(json.dumps(dict(config,
                                                         **{field: value})))
        with pytest.raises(ValueError, match=match) as info:
            zoo.load(str(bad))
        assert str(bad / "config.json") in str(info.value)
    # A config larger than its tensors: every mismatch listed, in one error.
    big = _copy(path, tmp_path / "big")
    (big / "config.json").write_text(json.dumps(
        dict(config, hidden_size=4096, intermediate_size=16384,
             num_attention_heads=16, num_hidden_layers=48)))
    with pytest.raises(checkpoints.CheckpointError) as info:
        zoo.load(str(big))
    message = str(info.value)
    assert "missing" in message and "mis-shaped" in message
    assert "'vit.encoder.layer.2.attention.attention.key.bias'" in message
    assert ("'vit.encoder.layer.0.attention.output.dense.bias': [32] "
            "(expected [4096])") \
        in message


def test_missing_and_extra_tensors_listed_together(classifier_repo,
                                                   tmp_path):
    from safetensors.numpy import load_file, save_file

    path, _ = classifier_repo
    state = load_file(str(path / "model.safetensors"))
    state.pop("vit.layernorm.weight")
    state["vit.embeddings.mask_token"] = np.zeros((1, 1, 32), "float32")
    state["classifier.bias"] = np.zeros((4,), "float32")
    bad = _copy(path, tmp_path / "bad", "config.json")
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(checkpoints.CheckpointError) as info:
        zoo.load(str(bad))
    message = str(info.value)
    for part in ("vit.layernorm.weight", "vit.embeddings.mask_token",
                 "'classifier.bias': [4] (expected [3])", str(bad / "model.safetensors")):
        assert part in message


@pytest.mark.slow
def test_hf_hub_handle_online_then_offline(classifier_repo, tmp_path):
    """zoo.load("hf-hub:...") against a local endpoint (HF_ENDPOINT) in a
    fresh process, then with HF_HUB_OFFLINE=1 from huggingface_hub's cache
    alone."""
    path, expected = classifier_repo
    code = ("import json, numpy as np\n"
            "from keras_vit import zoo\n"
            "m = zoo.load('hf-hub:google/vit-tiny-test', progress=False)\n"
            "x = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3))\n"
            "print(json.dumps([np.asarray(m(x.astype('float32'))).tolist(),"
            " m.zoo_labels]))\n")
    with FakeHub("google/vit-tiny-test", path) as hub:
        got, labels = run_against_hub(code, tmp_path / "hf", hub.url)
    np.testing.assert_allclose(np.array(got), expected, atol=1e-5, rtol=0)
    assert labels == ["tabby", "tiger cat", "lynx"]
    assert list((tmp_path / "hf").rglob("model.safetensors"))

    # The server is gone: the cache alone.
    got, _ = run_against_hub(code, tmp_path / "hf", hub.url, offline=True)
    np.testing.assert_allclose(np.array(got), expected, atol=1e-5, rtol=0)


def test_hf_hub_repo_with_only_pytorch_model_bin_is_refused(
        classifier_repo, tmp_path, monkeypatch):
    path, _ = classifier_repo
    hub = FakeHub("google/vit-pickled", {
        "config.json": (path / "config.json").read_bytes(),
        "pytorch_model.bin": b"\x80\x02 never read"})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        with pytest.raises(Exception, match="pytorch_model.bin.*never "
                                            "unpickles") as info:
            zoo.load("hf-hub:google/vit-pickled", progress=False)
    finally:
        hub.stop()
    assert "hf-hub:google/vit-pickled" in str(info.value)
    assert not any("pytorch_model.bin" in p for p in hub.asked)


def test_the_preprocessors_normalisation_travels_with_the_model(
        classifier_repo, tmp_path):
    """A preprocessor_config.json asking for ImageNet's mean/std (DeiT-style
    files in the ViT layout) loads into a model that records it (and
    feeds itself so through zoo.preprocess_input, the pipelines and the
    exporters); a written copy says it again. A preprocessor that does not
    normalise, or a std of 0, is refused naming the file and field; the
    official mean 0.5 / std 0.5 loads as the default."""
    from keras_vit.data.normalization import of_model

    path, expected = classifier_repo
    folder = _copy(path, tmp_path / "imagenet_norm")
    pre = folder / "preprocessor_config.json"
    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    pre.write_text(json.dumps({
        "do_normalize": True, "do_rescale": True,
        "image_mean": imagenet["mean"], "image_std": imagenet["std"]}))
    model = zoo.load(str(folder))
    assert model.get_config()["input_normalization"] == imagenet
    np.testing.assert_allclose(np.asarray(model(_images())), expected,
                               atol=1e-5, rtol=0)
    zoo.save_pretrained(model, tmp_path / "back", layout="transformers")
    written = json.loads(
        (tmp_path / "back" / "preprocessor_config.json").read_text())
    assert (written["image_mean"], written["image_std"]) == (
        imagenet["mean"], imagenet["std"])
    assert of_model(zoo.load(str(tmp_path / "back"))).to_config() == imagenet
    pre.write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0] * 3}))
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"image_mean/image_std\['std'\] must be "
                       "positive") as info:
        zoo.load(str(folder))
    assert str(pre) in str(info.value)
    pre.write_text(json.dumps({"do_normalize": False}))
    with pytest.raises(checkpoints.CheckpointError, match="do_normalize=False"):
        zoo.load(str(folder))
    pre.write_text("[1, 2]")
    with pytest.raises(checkpoints.CheckpointError, match="not an object"):
        zoo.load(str(folder))
    pre.write_text(json.dumps({"image_mean": [0.5, 0.5, 0.5],
                               "image_std": [0.5, 0.5, 0.5],
                               "rescale_factor": 0.00392156862745098}))
    model = zoo.load(str(folder))
    np.testing.assert_allclose(np.asarray(model(_images())), expected,
                               atol=1e-5, rtol=0)


# -- writing: keras_vit -> transformers ---------------------------------------

def _keras_classifier(gelu="exact", seed=3):
    import keras_vit

    model = keras_vit.vit(image_size=SIZE, patch_size=8, hidden_size=32,
                          num_layers=2, num_heads=2, mlp_dim=64,
                          num_classes=3, gelu=gelu, layer_norm_epsilon=1e-6)
    rng = np.random.default_rng(seed)
    for w in model.weights:  # every weight random, the zero head too
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


@pytest.mark.parametrize("gelu", ["exact", "tanh"])
def test_save_pretrained_transformers_loads_in_transformers(tmp_path, gelu):
    model = _keras_classifier(gelu)
    out = zoo.save_pretrained(model, tmp_path / "hf", layout="transformers",
                              labels=["tabby", "tiger cat", "lynx"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {"0": "tabby", "1": "tiger cat",
                                  "2": "lynx"}
    loaded, info = transformers.ViTForImageClassification.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    with torch.no_grad():
        theirs = loaded.eval()(
            pixel_values=_torch_input(_images())).logits.numpy()
    ours = np.asarray(model(_images()))
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=1e-5)
    assert np.abs(ours).max() > 0.1  # the logits say something
    # And back: zoo.load reads the folder, labels and numerics included.
    back = zoo.load(str(tmp_path / "hf"))
    np.testing.assert_allclose(np.asarray(back(_images())), ours,
                               atol=1e-5, rtol=1e-5)
    assert list(back.zoo_labels) == ["tabby", "tiger cat", "lynx"]


def test_transformers_round_trip_keeps_their_numbers(classifier_repo,
                                                     tmp_path):
    """transformers -> keras_vit -> transformers: the same tensors."""
    from safetensors.numpy import load_file

    path, expected = classifier_repo
    model = zoo.load(str(path))
    zoo.save_pretrained(model, tmp_path / "again", layout="transformers")
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(after) == set(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["layer_norm_eps"] == 1e-12 and config["hidden_act"] == "gelu"
    assert config["id2label"]["1"] == "tiger cat"


def _randomised(model, seed=4):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def test_headless_model_is_written_as_vit_model(tmp_path):
    """include_top=False: a ViTModel. Its pre_logits is the tanh pooler
    (pooler_output); without one there is no pooler and
    add_pooling_layer=False loads it (last_hidden_state). Non-square
    images, as transformers' image_size=[h, w]."""
    import keras_vit

    kw = dict(image_size=(SIZE, 16), patch_size=8, hidden_size=32,
              num_layers=2, num_heads=2, mlp_dim=64, num_classes=3,
              include_top=False, gelu="exact", layer_norm_epsilon=1e-6)
    x = _images()[:, :, :16]
    pooled = _randomised(keras_vit.vit(representation_size=24,
                                       pooling="token", **kw))
    zoo.save_pretrained(pooled, tmp_path / "pooled", layout="transformers")
    config = json.loads((tmp_path / "pooled" / "config.json").read_text())
    assert config["architectures"] == ["ViTModel"]
    assert config["image_size"] == [SIZE, 16] and "id2label" not in config
    loaded, info = transformers.ViTModel.from_pretrained(
        tmp_path / "pooled", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    with torch.no_grad():
        theirs = loaded.eval()(pixel_values=_torch_input(x)).pooler_output
    ours = np.asarray(pooled(x))
    assert ours.shape == (3, 24)
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5, rtol=1e-5)
    back = zoo.load(str(tmp_path / "pooled"))
    np.testing.assert_allclose(np.asarray(back(x)), ours, atol=1e-5,
                               rtol=1e-5)

    tokens = _randomised(keras_vit.vit(**kw))
    zoo.save_pretrained(tokens, tmp_path / "tokens", layout="transformers")
    loaded, info = transformers.ViTModel.from_pretrained(
        tmp_path / "tokens", add_pooling_layer=False,
        output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    with torch.no_grad():
        theirs = loaded.eval()(pixel_values=_torch_input(x)).last_hidden_state
    ours = np.asarray(tokens(x))
    assert ours.shape == (3, 4 * 2 + 1, 32)
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(zoo.load(str(tmp_path / "tokens"))(x)), ours, atol=1e-5,
        rtol=1e-5)
    with pytest.raises(ValueError, match="labels.*include_top=False"):
        zoo.save_pretrained(tokens, tmp_path / "z", layout="transformers",
                            labels=["a"])


def test_models_transformers_cannot_hold_are_refused(tmp_path):
    import keras_vit

    kw = dict(image_size=SIZE, patch_size=8, hidden_size=32, num_layers=2,
              num_heads=2, mlp_dim=64, num_classes=3)
    cases = [
        (keras_vit.vit(classifier="gap", **kw), "classifier='gap'"),
        (keras_vit.vit(representation_size=16, **kw), "pre_logits"),
        (keras_vit.vit(position_embedding="sincos_2d", **kw),
         "position embedding"),
        (keras_vit.vit(resnet=dict(num_layers=()), **kw), "hybrid"),
        (keras_vit.vit(include_top=False, pooling="gap",
                       **dict(kw, num_classes=None)), "pooling='gap'"),
    ]
    for model, reason in cases:
        with pytest.raises(ValueError, match=reason):
            zoo.save_pretrained(model, tmp_path / "x", layout="transformers")
    assert not (tmp_path / "x" / "config.json").exists()
    with pytest.raises(ValueError, match="layout.*'onnx'"):
        zoo.save_pretrained(cases[0][0], tmp_path / "y", layout="onnx")
    with pytest.raises(ValueError, match="2 names for a head of 3"):
        zoo.save_pretrained(_keras_classifier(), tmp_path / "z",
                            layout="transformers", labels=["a", "b"])


# -- SigLIP's image towers ------------------------------------------------------

def _siglip_vision_config(**overrides):
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, image_size=SIZE, patch_size=16)
    values.update(overrides)
    return transformers.SiglipVisionConfig(**values)




@pytest.fixture(scope="module")
def siglip_repo(tmp_path_factory):
    model = randomise_torch(transformers.SiglipVisionModel(
        _siglip_vision_config()), 5)
    path = tmp_path_factory.mktemp("hf") / "siglip"
    model.save_pretrained(path, safe_serialization=True)
    with torch.no_grad():
        out = model(pixel_values=_torch_input(_images()))
    return path, out.pooler_output.numpy(), out.last_hidden_state.numpy()


def test_siglip_vision_model_loads_with_its_pooler_output(siglip_repo,
                                                         tmp_path):
    """A SiglipVisionModel is the ViT with the attention-pool head, no
    class token, the tanh GELU: num_classes=0 returns pooler_output; the
    tokens are last_hidden_state (post_layernorm is the final norm); a
    new head sits on the pooled embedding; and keras_vit writes the
    tower back as a SiglipVisionModel that transformers loads whole."""
    from safetensors.numpy import load_file

    path, pooled, tokens = siglip_repo
    model = zoo.load(str(path))
    config = model.get_config()
    assert (config["classifier"], config["class_token"], config["gelu"],
            config["num_classes"], config["layer_norm_epsilon"]) == (
        "map", False, "tanh", 0, 1e-6)
    assert config["input_normalization"] is None  # mean = std = 0.5
    assert_relative(model(_images()), pooled)
    assert_relative(zoo.load(str(path), include_top=False)(_images()),
                     tokens)
    assert np.asarray(zoo.load(str(path), num_classes=4)(_images())).shape \
        == (3, 4)

    out = zoo.save_pretrained(model, tmp_path / "back",
                              layout="transformers")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["model_type"] == "siglip_vision_model"
    loaded, info = transformers.SiglipVisionModel.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    with torch.no_grad():
        theirs = loaded.eval()(pixel_values=_torch_input(_images()))
    assert_relative(theirs.pooler_output.numpy(), pooled)
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(after) == set(before)
    for key, value in before.items():
        np.testing.assert_allclose(after[key], value, rtol=0, atol=1e-7,
                                   err_msg=key)
    assert_relative(zoo.load(out)(_images()), pooled)


@pytest.mark.parametrize("side", [16, 64])
def test_vit_and_siglip_at_another_size_are_transformers_there(
        classifier_repo, siglip_repo, side):
    """Loaded at another image size, ViT and SigLIP give transformers'
    forward with interpolate_pos_encoding=True at that size (its bicubic
    resize of the table; a model built for any size too), shrunk and
    enlarged."""
    x = np.random.default_rng(3).uniform(-1, 1, (2, side, side, 3)).astype(
        "float32")
    for (path, *_), cls, output in (
            (classifier_repo, transformers.ViTForImageClassification,
             "logits"),
            (siglip_repo, transformers.SiglipVisionModel, "pooler_output")):
        theirs = cls.from_pretrained(path).eval()
        with torch.no_grad():
            expected = getattr(theirs(pixel_values=_torch_input(x),
                                      interpolate_pos_encoding=True),
                               output).numpy()
        assert_relative(zoo.load(str(path), image_size=side)(x), expected)
        assert_relative(zoo.load(str(path), dynamic_image_size=True)(x),
                        expected)


def test_siglip_models_image_tower_and_a_tower_without_head(tmp_path):
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, vocab_size=100, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    whole = randomise_torch(transformers.SiglipModel(transformers.SiglipConfig(
        vision_config=_siglip_vision_config().to_dict(),
        text_config=text)), 6)
    whole.save_pretrained(tmp_path / "whole", safe_serialization=True)
    with torch.no_grad():
        pooled = whole.vision_model(
            pixel_values=_torch_input(_images())).pooler_output.numpy()
    assert_relative(zoo.load(str(tmp_path / "whole"))(_images()), pooled)

    bare = randomise_torch(transformers.SiglipVisionModel(
        _siglip_vision_config(vision_use_head=False, hidden_act="gelu")), 7)
    bare.save_pretrained(tmp_path / "bare", safe_serialization=True)
    with torch.no_grad():
        tokens = bare(pixel_values=_torch_input(_images())).last_hidden_state
    model = zoo.load(str(tmp_path / "bare"))
    assert model.get_config()["gelu"] == "exact"
    assert_relative(model(_images()), tokens.numpy())


def test_siglip_settings_keras_vit_lacks_are_refused_by_name(siglip_repo,
                                                            tmp_path):
    import keras_vit

    path, _, _ = siglip_repo
    config = json.loads((path / "config.json").read_text())
    for field, value, match in (
            ("architectures", ["SiglipForImageClassification"],
             "field architectures"),
            ("hidden_act", "relu", "field hidden_act"),
            ("image_size", [32, 48], "field image_size")):
        bad = _copy(path, tmp_path / field)
        (bad / "config.json").write_text(json.dumps(dict(config,
                                                         **{field: value})))
        with pytest.raises(ValueError, match=match) as info:
            zoo.load(str(bad))
        assert str(bad / "config.json") in str(info.value)
    with pytest.raises(ValueError, match="config.json fixes its own"):
        zoo.load("ViT-Ti/16", weights=str(path))
    # A model pooled by attention with a classification head: no
    # transformers class holds it.
    headed = keras_vit.vit(image_size=SIZE, patch_size=16, hidden_size=32,
                           num_layers=1, num_heads=2, mlp_dim=64,
                           num_classes=3, classifier="map")
    with pytest.raises(ValueError, match="SiglipVisionModel.*classification "
                                         "head"):
        zoo.save_pretrained(headed, tmp_path / "x", layout="transformers")
    assert not (tmp_path / "x" / "config.json").exists()
