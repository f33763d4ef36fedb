"""timm's ViT weights in timm's Hub layout (config.json + model.safetensors),
both ways, against timm's own forward. Random weights, written by timm
itself; never the real Hub."""

import copy
import json

import numpy as np
import pytest

import torch
import timm
import safetensors.torch as safetensors_torch

import keras  # noqa: E402

from keras_vit import zoo  # noqa: E402
from _fake_hub import FakeHub, run_against_hub  # noqa: E402
from testkit import TENSOR as _TENSOR  # noqa: E402
from testkit import safetensors as _safetensors  # noqa: E402

ARCH = "vit_tiny_patch16_224"
SIZE = 32
CLASSES = 7
LABELS = [f"class {i}" for i in range(CLASSES)]


def _timm_model(seed=0):
    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, img_size=SIZE,
                              num_classes=CLASSES)
    with torch.no_grad():  # every parameter random, LayerNorms included
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


def _config(**overrides):
    config = {
        "architecture": ARCH, "num_classes": CLASSES, "global_pool": "token",
        "label_names": LABELS,
        "pretrained_cfg": {"input_size": [3, SIZE, SIZE],
                           "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                           "num_classes": CLASSES}}
    config.update(overrides)
    return config


def _write_repo(path, model, config):
    path.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


def _images(n=3):
    rng = np.random.default_rng(1)
    return rng.uniform(-1, 1, (n, SIZE, SIZE, 3)).astype("float32")


def _timm_logits(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    model = _timm_model()
    path = _write_repo(tmp_path_factory.mktemp("hub") / "vit", model,
                       _config())
    return path, _timm_logits(model, _images())


def test_timm_repo_matches_timm_forward(repo):
    path, expected = repo
    x = _images()
    model = zoo.load(str(path))  # architecture, size, head from config.json
    assert model.zoo_name == "ViT-Ti/16" and model.gelu == "exact"
    assert model.inputs[0].shape[1:3] == (SIZE, SIZE)
    assert model.zoo_labels == LABELS
    np.testing.assert_allclose(np.asarray(model(x)), expected, atol=1e-5,
                               rtol=0)

    # A .safetensors file with an architecture name, as weights=.
    same = zoo.load("ViT-Ti/16", weights=str(path / "model.safetensors"))
    np.testing.assert_allclose(np.asarray(same(x)), expected, atol=1e-5,
                               rtol=0)
    # The official tanh GELU is what the .npz files need, not timm's.
    tanh = zoo.load(str(path), gelu="tanh")
    assert np.abs(np.asarray(tanh(x)) - expected).max() > 1e-5


@pytest.fixture(scope="module")
def narrow_repo(tmp_path_factory):
    """keras_vit's timm folder of a 32-wide, 2-layer, patch-8 ViT: timm's
    nearest architecture with its model_args."""
    import keras_vit

    model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                          num_layers=2, num_heads=2, mlp_dim=64,
                          num_classes=5, gelu="exact")
    path = tmp_path_factory.mktemp("narrow") / "repo"
    zoo.save_pretrained(model, path, layout="timm")
    return path, model


@pytest.mark.parametrize("name", ["ViT-B/16", "ViT-L/32", "DINOv2-S/14",
                                  "vit_base_patch16_224"])
@pytest.mark.parametrize("form", ["folder", "model.safetensors"])
def test_a_name_of_another_architecture_than_the_files_is_refused(
        narrow_repo, name, form):
    """zoo.load(name, weights=<timm folder or file>): the name's sizes
    are the model's, and a file of others is refused in one line naming
    the name and the file, as a .keras file of another size is."""
    path, _ = narrow_repo
    weights = path if form == "folder" else path / "model.safetensors"
    with pytest.raises(ValueError) as refused:
        zoo.load(name, weights=str(weights))
    message = str(refused.value)
    assert f"name={name!r}" in message and "config.json" in message
    assert "hidden_size=" in message and "\n" not in message


def test_a_name_amended_to_the_files_sizes_loads_it(narrow_repo):
    path, model = narrow_repo
    ours = zoo.load("ViT-B/16", weights=str(path), hidden_size=32,
                    num_layers=2, num_heads=2, mlp_dim=64, patch_size=8)
    x = _images()
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(model(x)))


@pytest.mark.parametrize("size", [16, 48, (48, 32)])
def test_at_another_size_the_table_is_resized_as_timm_does(repo, size):
    """Loaded at another image size (shrunk, enlarged, not square), or
    built for any size, the model is timm's at that size: timm's
    ``set_input_size`` and ``dynamic_img_size`` resize the table with
    bicubic antialiased interpolation, which keras_vit's own bilinear
    rule misses by far more than 1e-5."""
    from testkit import assert_close_to_timm

    path, _ = repo
    rows, cols = (size, size) if isinstance(size, int) else size
    x = np.random.default_rng(2).uniform(-1, 1, (2, rows, cols, 3)).astype(
        "float32")
    theirs = _timm_model()
    theirs.set_input_size(img_size=size)
    expected = _timm_logits(theirs, x)
    assert_close_to_timm(zoo.load(str(path), image_size=size)(x), expected)
    dynamic = zoo.load(str(path), dynamic_image_size=True)
    assert_close_to_timm(dynamic(x), expected)
    official = zoo.load(str(path), image_size=size,
                        position_resize="bilinear_corners")
    assert np.abs(np.asarray(official(x)) - expected).max() > 1e-4 * np.abs(
        expected).max()


def test_unsupported_timm_features_are_refused(tmp_path, repo):
    model = _timm_model()
    # Weights of options the architecture's config does not ask for (here
    # register tokens and layer scale on a plain ViT) are named, never
    # dropped.
    extra = tmp_path / "registers"
    _write_repo(extra, model, _config())
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["reg_token"] = torch.zeros(1, 4, 192)
    state["blocks.0.ls1.gamma"] = torch.ones(192)
    safetensors_torch.save_file(state, str(extra / "model.safetensors"))
    with pytest.raises(ValueError, match=(
            r"unexpected in the checkpoint \(2\): blocks\.0\.ls1\.gamma, "
            "reg_token")):
        zoo.load(str(extra))
    # An option the config asks for whose weights the file lacks.
    args = _write_repo(tmp_path / "args", model, _config(
        model_args={"img_size": SIZE, "qk_norm": True}))
    with pytest.raises(ValueError, match=(
            r"missing .*blocks\.0\.attn\.q_norm\.weight")):
        zoo.load(str(args))
    unknown = _write_repo(tmp_path / "unknown", model, _config(
        model_args={"img_size": SIZE, "mlp_layer": "swiglu"}))
    with pytest.raises(ValueError, match="model_args.mlp_layer"):
        zoo.load(str(unknown))
    axial = _write_repo(tmp_path / "axial", model,
                        _config(architecture="axial_vit_b16"))
    with pytest.raises(ValueError, match="axial family"):
        zoo.load(str(axial))
    with pytest.raises(ValueError, match="hf-hub:<owner>/<name>"):
        zoo.load("hf-hub:no-owner")


def test_save_pretrained_loads_in_timm(tmp_path, repo):
    path, expected = repo
    ours = zoo.load(str(path))
    out = zoo.save_pretrained(ours, tmp_path / "out", labels=LABELS)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architecture"] == ARCH
    assert config["label_names"] == LABELS
    theirs = timm.create_model(
        config["architecture"], pretrained=True, img_size=SIZE,
        num_classes=config["num_classes"],
        # timm drops a head whose size differs from its pretrained_cfg's.
        pretrained_cfg_overlay=dict(file=f"{out}/model.safetensors",
                                    num_classes=config["num_classes"])).eval()
    np.testing.assert_allclose(_timm_logits(theirs, _images()), expected,
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(ours(_images())), expected,
                               atol=1e-5, rtol=0)


def test_predict_command_reads_a_timm_repo(tmp_path, repo, capsys):
    from PIL import Image

    from keras_vit import cli

    path, _ = repo
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(
        0, 256, (40, 50, 3)).astype("uint8")).save(image)
    assert cli.main(["predict", str(path), str(image), "--top", "2",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["image_size"] == [SIZE, SIZE]
    assert out["labels"] == "label_names"
    (pred,) = out["predictions"]
    assert [t["label"] in LABELS for t in pred["top"]] == [True, True]
    # The same as the model on zoo.preprocess_input's pixels.
    model = zoo.load(str(path))
    pixels = np.asarray(Image.open(image).convert("RGB"), "float32")
    logits = np.asarray(model(zoo.preprocess_input(pixels, SIZE)[None]))[0]
    assert pred["top"][0]["index"] == int(np.argmax(logits))
    # Named by its file (an hf-hub: handle by the handle), not "None".
    weights = str(path / "model.safetensors")
    assert cli.main(["predict", weights, str(image), "--top", "1"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "None" not in header and f"({weights})" in header, header


@pytest.mark.slow
def test_hf_hub_handle_downloads_through_huggingface_hub(tmp_path, repo):
    """zoo.load("hf-hub:...") against a local endpoint (HF_ENDPOINT), in a
    fresh process: the files land in huggingface_hub's cache, and with
    HF_HUB_OFFLINE=1 a second process loads them from there alone."""
    path, expected = repo
    code = ("import json, sys, numpy as np\n"
            "from keras_vit import zoo\n"
            "m = zoo.load('hf-hub:timm/vit_tiny_test'{})\n"
            "x = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3))\n"
            "print(json.dumps(np.asarray(m(x.astype('float32'))).tolist()))\n")
    # The first download as a user writes it: progress bars on (the quiet
    # path alone once hid a child that failed with them on).
    with FakeHub("timm/vit_tiny_test", path) as hub:
        got = np.array(run_against_hub(code.format(""), tmp_path / "hf",
                                       hub.url))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert sorted(p.rsplit("/", 1)[-1] for p in hub.gets) == [
        "config.json", "model.safetensors"]
    assert list((tmp_path / "hf").rglob("model.safetensors"))

    # The server is gone: the cache alone.
    got = run_against_hub(code.format(", progress=False"), tmp_path / "hf",
                          hub.url, offline=True)
    np.testing.assert_allclose(np.array(got), expected, atol=1e-5, rtol=0)


def test_timm_bit_repo_matches_timm_forward(tmp_path):
    """BiT (timm's resnetv2_50x1_bit): the same repository layout, timm's
    stage/block names onto the official units; timm's own forward."""
    torch.manual_seed(0)
    bit = timm.create_model("resnetv2_50x1_bit", pretrained=False,
                            num_classes=CLASSES).eval()
    with torch.no_grad():
        for name, p in bit.named_parameters():
            if "norm" in name:  # GroupNorm scales near 1 keep logits O(1)
                p.copy_(1.0 + 0.1 * torch.randn_like(p)
                        if name.endswith("weight") else
                        0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.1)
    path = _write_repo(tmp_path / "bit", bit, _config(
        architecture="resnetv2_50x1_bit",
        pretrained_cfg={"input_size": [3, SIZE, SIZE],
                        "mean": [0.5] * 3, "std": [0.5] * 3}))
    x = _images()
    expected = _timm_logits(bit, x)
    with torch.no_grad():  # the reference: timm's forward in float64
        exact = bit.double()(torch.from_numpy(
            x.astype("float64").transpose(0, 3, 1, 2))).numpy()
    ours = zoo.load(str(path))
    assert ours.zoo_name == "BiT-R50x1" and ours.zoo_labels == LABELS
    got = np.asarray(ours(x))
    assert np.abs(expected).max() > 1.0  # logits are not all ~0
    # Through 50 random layers float32 itself is off by ~2e-4 on logits of
    # ~5 (timm float32 vs float64, seen here): keras_vit must be at least
    # as close to the float64 forward as timm's own float32 forward is.
    timm_error = np.abs(expected - exact).max()
    assert np.abs(got - exact).max() <= max(1e-5, 1.2 * timm_error)
    with pytest.raises(ValueError, match="stages.0.blocks.0.extra"):
        state = {k: v.contiguous() for k, v in bit.state_dict().items()}
        state["stages.0.blocks.0.extra.weight"] = torch.zeros(3)
        safetensors_torch.save_file(state, str(path / "model.safetensors"))
        zoo.load(str(path))


def _random_resnet_vit(arch, size, seed=0):
    """timm's hybrid with every parameter random; norm scales near 1 keep
    activations and logits O(1)."""
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, img_size=size,
                              num_classes=CLASSES).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)
                        if name.endswith("weight") else
                        0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("arch, name", [
    ("vit_tiny_r_s16_p8_224", "R+ViT-Ti/16"),  # root only, 8x8 patches
    pytest.param("vit_small_r26_s32_224", "R26+ViT-S/32",  # four stages
                 marks=pytest.mark.slow),  # ~25 s here
])
def test_timm_hybrid_repo_matches_timm_forward(tmp_path, arch, name):
    """ResNet+ViT hybrids: timm's backbone keys onto the official units and
    timm's ResNet numerics (sqrt(var + 1e-8) standardisation, GroupNorm
    epsilon 1e-5), against timm's own forward."""
    size = 64
    model = _random_resnet_vit(arch, size)
    path = _write_repo(tmp_path / "hybrid", model, _config(
        architecture=arch, pretrained_cfg={
            "input_size": [3, size, size], "mean": [0.5] * 3,
            "std": [0.5] * 3}))
    x = np.random.default_rng(1).uniform(
        -1, 1, (2, size, size, 3)).astype("float32")
    expected = _timm_logits(model, x)
    with torch.no_grad():  # the reference: timm's forward in float64
        exact = model.double()(torch.from_numpy(
            x.astype("float64").transpose(0, 3, 1, 2))).numpy()
    ours = zoo.load(str(path))
    assert ours.zoo_name == name and ours.zoo_labels == LABELS
    assert ours.resnet["standardization"] == "var"
    got = np.asarray(ours(x))
    assert np.abs(expected).max() > 1.0  # logits are not all ~0
    # The ResNet itself is timm's to the last bit: in float64 its features
    # match timm's float64 backbone; the official numerics (std + 1e-5,
    # GroupNorm epsilon 1e-6) would not.
    with torch.no_grad():
        theirs = model.patch_embed.backbone(torch.from_numpy(
            x.astype("float64").transpose(0, 3, 1, 2))).numpy()
    theirs = theirs.transpose(0, 2, 3, 1)
    for numerics, close in ((ours.resnet, True), (dict(
            ours.resnet, standardization="std", std_eps=1e-5,
            norm_epsilon=1e-6), False)):
        ours64 = zoo.load(str(path), dtype="float64", resnet=numerics)
        stem = [layer for layer in ours64.layers
                if layer.name.startswith("resnet_")][-1]
        features = np.asarray(keras.Model(ours64.input, stem.output)(
            x.astype("float64")))
        assert (np.abs(features - theirs).max() < 1e-9) == close
    # End to end in float32 both are off timm's float64 forward by float32
    # rounding (seen: ours 1.3x (Ti) and 1.8x (R26) timm's own, the rest
    # from the encoder's float32 accumulation order, not the ResNet).
    timm_error = np.abs(expected - exact).max()
    assert np.abs(got - exact).max() <= max(1e-5, 2.5 * timm_error)


def test_unsupported_timm_hybrids_are_refused(tmp_path):
    model = _random_resnet_vit("vit_tiny_r_s16_p8_224", 64)
    path = _write_repo(tmp_path / "h", model, _config(
        architecture="vit_small_resnet26d_224"))
    # A ResNetV2 hybrid's file named a ResNet-D one: its contents decide.
    with pytest.raises(ValueError, match=r"ResNet-D backbone's blocks "
                       r"\(patch_embed\.backbone\.layer<stage>\.<block>\) "
                       r"are not whole stages from the first; found blocks "
                       r"\{\}"):
        zoo.load(str(path))
    path = _write_repo(tmp_path / "h", model, _config(
        architecture="vit_tiny_r_s16_p8_224",
        model_args={"padding_same": False}))
    with pytest.raises(ValueError, match="padding_same"):
        zoo.load(str(path))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["patch_embed.backbone.extra.weight"] = torch.zeros(3)
    safetensors_torch.save_file(state, str(path / "model.safetensors"))
    path.joinpath("config.json").write_text(json.dumps(_config(
        architecture="vit_tiny_r_s16_p8_224",
        pretrained_cfg={"input_size": [3, 64, 64], "mean": [0.5] * 3,
                        "std": [0.5] * 3})))
    with pytest.raises(ValueError, match="backbone.extra.weight"):
        zoo.load(str(path))


# Hostile timm configs: refused naming the file and the field.
@pytest.mark.parametrize("text, needle", [
    ("[1, 2, 3]", "config.json is a JSON list, not an object"),
    ("[" * 100000 + "]" * 100000, "config.json is nested too deeply"),
    (b"\xff\xfe{", "config.json is not UTF-8 text"),
    ('{"architecture": ', "config.json is not valid JSON"),
    ('{"architecture": 5}', "field architecture: expected a string; "
                            "received architecture=5"),
    ('{"pretrained_cfg": "x"}', "field pretrained_cfg: expected a JSON "
                                "object; received pretrained_cfg='x'"),
    ('{"pretrained_cfg": {"input_size": "224"}}',
     "field pretrained_cfg.input_size: expected a size in pixels"),
    ('{"pretrained_cfg": {"input_size": [3, 1000000, 1000000]}}',
     "received pretrained_cfg.input_size=[3, 1000000, 1000000]"),
    ('{"pretrained_cfg": {"mean": "abc"}}',
     "field pretrained_cfg.mean: expected a list of 3 numbers"),
    ('{"model_args": [1]}', "field model_args: expected a JSON object"),
    ('{"model_args": {"img_size": true}}', "field model_args.img_size"),
    ('{"num_classes": "3"}', "field num_classes: expected an integer in "
                             "[0, 1000000]; received num_classes='3'"),
    ('{"label_names": {"a": 1}}', "field label_names: expected a list of "
                                  "strings"),
])
def test_malformed_timm_configs_name_the_file_and_field(tmp_path, text,
                                                        needle):
    from keras_vit.base.errors import ConfigError
    from keras_vit.zoo.timm import hub as timm_hub

    _safetensors(tmp_path / "model.safetensors", {"w": _TENSOR})
    config = tmp_path / "config.json"
    (config.write_bytes if isinstance(text, bytes) else config.write_text)(
        text)
    with pytest.raises(ConfigError) as info:
        timm_hub.fetch(str(tmp_path))
    assert str(info.value).startswith(str(config))
    assert needle in str(info.value)


def test_an_oversized_timm_config_is_refused_before_reading(tmp_path,
                                                            monkeypatch):
    from keras_vit.base.errors import ConfigError
    from keras_vit.zoo.timm import hub as timm_hub

    monkeypatch.setattr(timm_hub, "MAX_CONFIG_BYTES", 1000)
    config = tmp_path / "config.json"
    config.write_text('{"label_names": ["' + "x" * 2000 + '"]}')
    with pytest.raises(ConfigError, match="is 2021 bytes; a timm config"):
        timm_hub.read_config(config)


# -- AIMv2: RMSNorm, the norm after the patch embedding, timm's SwiGLU ---------

AIMV2 = "aimv2_large_patch14_224"
# Narrowed (timm's model_args): the layout is AIMv2's at a test's cost.
AIMV2_ARGS = dict(embed_dim=48, num_heads=2)


def _timm_reload(folder, **kwargs):
    """timm's model from a repository keras_vit wrote, as timm loads it."""
    from testkit import timm_from_file

    written = json.loads((folder / "config.json").read_text())
    return written, timm_from_file(
        written["architecture"], folder, written["num_classes"],
        **dict(written["model_args"], **kwargs))


def test_aimv2_loads_with_timms_logits_native_and_resized_and_back(tmp_path):
    from timm.models import save_for_hf

    from testkit import (assert_close_to_timm, random_images,
                         random_timm_model, timm_forward)

    theirs = random_timm_model(AIMV2, 28, CLASSES, **AIMV2_ARGS)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    assert {k: config[k] for k in (
        "norm", "patch_norm", "layer_norm_epsilon", "mlp", "mlp_dim",
        "classifier", "class_token", "qkv_bias", "proj_bias", "fc_norm")} \
        == dict(norm="rms", patch_norm=True, layer_norm_epsilon=1e-5,
                mlp="swiglu", mlp_dim=int(48 * 2.75), classifier="gap",
                class_token=False, qkv_bias=False, proj_bias=False,
                fc_norm=False)
    x = random_images(28)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))
    # At another size: timm's own model at that size, its table resized
    # as timm resizes one (bicubic, antialiased).
    bigger = zoo.load(str(tmp_path / "repo"), image_size=42)
    assert bigger.get_config()["position_resize"] == "bicubic_aa"
    at_size = copy.deepcopy(theirs)
    at_size.set_input_size(img_size=42)
    x42 = random_images(42)
    assert_close_to_timm(bigger(x42), timm_forward(at_size, x42))
    # Written back as AIMv2: the unpacked SwiGLU, timm's logits.
    zoo.save_pretrained(ours, tmp_path / "back")
    written, again = _timm_reload(tmp_path / "back")
    assert written["architecture"] == AIMV2
    assert {"blocks.0.mlp.fc1_g.weight", "blocks.0.mlp.fc1_x.weight",
            "patch_embed.norm.weight"} <= set(again.state_dict())
    assert_close_to_timm(timm_forward(again, x), timm_forward(theirs, x))
    reread = zoo.load(str(tmp_path / "back"))
    assert reread.get_config()["norm"] == "rms"
    assert_close_to_timm(reread(x), timm_forward(theirs, x))


@pytest.mark.parametrize("options", [
    # RMSNorm and a patch norm with the GELU MLP: timm's "rmsnorm".
    dict(norm="rms", patch_norm=True, classifier="gap", class_token=False,
         fc_norm=True),
    # A LayerNorm after the patch embedding: timm's "layernorm".
    dict(patch_norm=True),
    # AIMv2's MLP without its patch norm, with a class token.
    dict(norm="rms", mlp="swiglu", layer_norm_epsilon=1e-5, qkv_bias=False),
    # BEiT-3's sub-LN: norms before the attention's output projection and
    # inside the MLP (timm's scale_attn_norm, scale_mlp_norm), pooled over
    # every token (pool_include_prefix).
    dict(attention_norm=True, mlp_norm=True, classifier="gap",
         class_token=True, pool_prefix=True),
])
def test_norm_options_write_for_timm_and_read_back(tmp_path, options):
    import keras_vit
    from testkit import assert_close_to_timm, random_images, timm_forward

    keras.utils.set_random_seed(3)
    ours = keras_vit.vit(image_size=32, patch_size=16, hidden_size=32,
                         num_layers=1, num_heads=2, mlp_dim=64,
                         num_classes=CLASSES, gelu="exact", **options)
    rng = np.random.default_rng(0)
    for w in ours.weights:  # norms and the head too: nothing at 0 or 1
        w.assign(rng.normal(0, 0.3, w.shape).astype("float32"))
    zoo.save_pretrained(ours, tmp_path / "out")
    _, theirs = _timm_reload(tmp_path / "out")
    x = random_images(32)
    assert_close_to_timm(timm_forward(theirs, x), np.asarray(ours(x)))
    again = zoo.load(str(tmp_path / "out"))
    for key, value in options.items():
        assert again.get_config()[key] == value, key


def test_norm_settings_keras_vit_lacks_are_refused_by_name(tmp_path):
    import keras_vit
    from timm.models import save_for_hf

    from testkit import random_timm_model

    # A patch norm of another kind or epsilon than the model's norms.
    theirs = random_timm_model(AIMV2, 28, CLASSES, embed_norm_layer=(
        "layernorm"), **AIMV2_ARGS)
    save_for_hf(theirs, tmp_path / "mixed", safe_serialization=True)
    with pytest.raises(ValueError, match=(
            "model_args.embed_norm_layer: embed_norm_layer='layernorm'")):
        zoo.load(str(tmp_path / "mixed"))
    # Half of timm's SwiGLU first layer: named, never half loaded.
    save_for_hf(random_timm_model(AIMV2, 28, CLASSES, **AIMV2_ARGS),
                tmp_path / "half", safe_serialization=True)
    state = safetensors_torch.load_file(str(tmp_path / "half" /
                                            "model.safetensors"))
    del state["blocks.0.mlp.fc1_x.weight"]
    safetensors_torch.save_file(state, str(tmp_path / "half" /
                                           "model.safetensors"))
    with pytest.raises(ValueError, match=(
            r"missing from the checkpoint \(1\): blocks\.0\.mlp\.fc1_x\."
            r"weight \(beside blocks\.0\.mlp\.fc1_g\.weight\)")):
        zoo.load(str(tmp_path / "half"))
    # RMSNorm of epsilon 1e-5 with the GELU MLP: no timm config says it.
    model = keras_vit.vit(image_size=32, patch_size=16, hidden_size=32,
                          num_layers=1, num_heads=2, mlp_dim=64,
                          num_classes=CLASSES, norm="rms",
                          layer_norm_epsilon=1e-5)
    with pytest.raises(ValueError, match=(
            "norm='rms', patch_norm=False, mlp='gelu', "
            "layer_norm_epsilon=1e-05")) as info:
        zoo.save_pretrained(model, tmp_path / "refused")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("options", [dict(norm="rms"),
                                     dict(patch_norm=True)])
def test_transformers_layouts_refuse_the_norm_options(tmp_path, options):
    """Of the transformers classes keras_vit writes, only AIMv2's has
    RMSNorm and a patch norm: a model with either that AIMv2 cannot hold
    is refused by name (each nearest class with what it holds), never
    written as LayerNorms."""
    import keras_vit

    sizes = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
                 num_heads=2, mlp_dim=64, num_classes=0, **options)
    siglip = keras_vit.vit(classifier="map", class_token=False, **sizes)
    with pytest.raises(ValueError, match=(
            "SiglipVisionModel, which cannot hold this model: the options "
            f"{next(iter(options))}")):
        zoo.save_pretrained(siglip, tmp_path / "siglip",
                            layout="transformers")
    plain = keras_vit.vit(pre_norm=True, patch_bias=False, **sizes)
    name, value = next(iter(options.items()))
    with pytest.raises(ValueError, match=(
            f"cannot hold this model: CLIPVisionModel \\(it holds {name}=")
            ) as info:
        zoo.save_pretrained(plain, tmp_path / "clip", layout="transformers")
    assert f"the model {value!r}" in str(info.value)
    assert not (tmp_path / "siglip" / "model.safetensors").exists()


def test_a_dynamic_size_file_loads_at_the_size_of_its_table(tmp_path):
    """timm's test_vit (dynamic_img_size, data config at 160 px) written
    at 32 px holds a 2 x 2 table: keras_vit builds the model there, as
    timm does, with timm's logits. Built at the data config's 160 it
    resized the table up and, at 32 px, back down: 5e-4 off."""
    from timm.models import save_for_hf

    from testkit import (assert_close_to_timm, random_images,
                         random_timm_model, timm_forward)

    theirs = random_timm_model("test_vit", 32, CLASSES)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    written = json.loads((tmp_path / "repo" / "config.json").read_text())
    assert written["pretrained_cfg"]["input_size"] == [3, 160, 160]
    ours = zoo.load(str(tmp_path / "repo"))
    assert ours.image_size == 32
    x = random_images(32)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))
