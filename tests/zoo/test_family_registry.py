"""The family's named members (DeiT, DeiT III, DINOv2, CLIP, SigLIP,
SigLIP 2, EVA-02): every row of
``keras_vit.base.family_rows`` against timm's own facts (its
``pretrained_cfg``: Hub repository, input size, mean/std, head; its models:
parameter count and logits), the names in ``zoo.list_models``, ``zoo.info``
and the command line, and a named member loaded from a local stand-in for
the Hub. Random weights, written by timm itself; never the real Hub."""

import json

import numpy as np
import pytest

from keras_vit import zoo
from testkit import (assert_close_to_timm, random_images,
                     random_timm_model, timm_forward)
from keras_vit.base import family_rows, variants
from keras_vit.data.normalization import NAMED, config_value
from keras_vit.zoo import registry
from keras_vit.zoo.timm import arguments as timm_arguments

ROWS = sorted(family_rows.MEMBERS)


def _one_row_per_option_set():
    """The first row (in table order) of each family and set of row
    options (``distilled``, registers, the MLP, the GELU): the checks that
    build timm's models run once for each, while every row's sizes and
    options are checked against timm's architecture
    (:func:`test_row_is_timms_release`)."""
    first = {}
    for name, member in family_rows.MEMBERS.items():
        key = (member.family, repr(sorted(member.options.items())))
        first.setdefault(key, name)
    return sorted(first.values())


OPTION_ROWS = _one_row_per_option_set()
# The test-size input of each patch size: a 2x2 grid.
SMALL = {14: 28, 16: 32, 32: 64}


def _timm():
    import timm
    return timm


def _random_timm_model(arch, size, num_classes, depth=1):
    _timm()
    return random_timm_model(arch, size, num_classes, depth)










def _save_for_hf(model, folder):
    """timm's own writer; the config.json it writes may name no setting
    beyond the test's size (the row, not the file, must say the rest).
    timm restates its architecture's pooling there (SigLIP's "map"): it is
    taken out, so that the row's own pooling is the one that loads."""
    from timm.models import save_for_hf

    save_for_hf(model, folder, safe_serialization=True)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    args = config.get("model_args", {})
    pool = args.pop("global_pool", "token")
    assert pool == config.pop("global_pool", "token") == model.global_pool
    path.write_text(json.dumps(config))
    assert args.pop("in_chans", 3) == 3, args  # timm's default, said again
    assert set(args) <= {"depth", "img_size", "num_classes"}, args
    return config


# --------------------------------------------------------------------------
# Each row against timm


@pytest.mark.parametrize("name", ROWS)
def test_row_is_timms_release(name):
    """Hub repository, input size, mean/std, head size and label list of
    every release are those of timm's pretrained_cfg; the row's sizes and
    options are those of timm's architecture (as keras_vit's table of
    timm's architectures, checked against timm in test_timm_walk.py,
    reads it; timm's GELU is the exact one unless it names another)."""
    timm = _timm()
    from timm.models import get_pretrained_cfg

    member = family_rows.MEMBERS[name]
    assert timm.is_model(member.timm), member.timm
    arch, options = timm_arguments.architecture(member.timm)
    entry = timm_arguments.table_entry(member.timm)
    if entry["module"] == "eva":  # timm's Eva: its own reader
        from keras_vit.zoo.timm import eva

        honoured = eva.honoured(entry["args"], "timm_architectures.json")
    else:
        honoured = timm_arguments.honoured(
            {}, arch, "timm_architectures.json", options)
    theirs = {**arch.config, "gelu": "exact", **honoured}
    ours = family_rows.config(name)
    ours.pop("input_normalization")
    assert {k: theirs.get(k) for k in ours} == ours
    # The size timm builds the architecture at, unless its release is at
    # another (timm builds PE at 224 and resizes its 448/512 px tables).
    assert member.image_size in (arch.image_size, get_pretrained_cfg(
        f"{member.timm}.{member.weights[0].tag}").input_size[1])
    norm = NAMED[family_rows.FAMILIES[member.family].normalization]
    for weights in member.weights:
        full = f"{member.timm}.{weights.tag}"
        assert full in timm.list_pretrained(member.timm + "*"), full
        cfg = get_pretrained_cfg(full)
        assert weights.source == f"hf-hub:{cfg.hf_hub_id}", full
        assert cfg.input_size[1:] == (member.image_size, member.image_size)
        assert weights.num_classes == cfg.num_classes, full
        np.testing.assert_allclose(norm.mean, cfg.mean, rtol=0, atol=1e-8)
        np.testing.assert_allclose(norm.std, cfg.std, rtol=0, atol=1e-8)
        # ImageNet's names on an ImageNet-1k head, none on anything else.
        assert weights.labels == (
            "imagenet2012" if cfg.num_classes == 1000 else None), full
    # timm's name alone, where rows share the architecture (SigLIP and
    # SigLIP 2), is the row of the release timm loads by default.
    if [m.timm for m in family_rows.MEMBERS.values()].count(member.timm) > 1:
        meant = family_rows.MEMBERS[variants.parse(member.timm).name]
        assert get_pretrained_cfg(member.timm).tag in [
            w.tag for w in meant.weights], member.timm
    meta = zoo.info(name)
    default = member.weights[0]
    assert meta["source"] == default.source
    assert meta["image_size"] == member.image_size
    assert meta["labels"] == default.labels
    assert meta["input_normalization"]["mean"] == list(norm.mean)
    assert meta["parameters"]["num_classes"] == default.num_classes


@pytest.mark.parametrize("name", OPTION_ROWS)
def test_row_parameter_count_is_timms(name):
    """``zoo.info``'s count (from the row's config alone) is the
    parameter count of timm's model at full depth, found from timm's
    models of one and two blocks (each block holds as many)."""
    member = family_rows.MEMBERS[name]
    classes = member.weights[0].num_classes
    models = [_random_timm_model(member.timm, member.image_size, classes,
                                 depth) for depth in (1, 2)]
    one, two = (sum(p.numel() for p in m.parameters()) for m in models)
    layers, width = family_rows.SIZES[member.size][1::-1]
    # timm's EVA projects the keys without a bias; keras_vit's qkv_bias
    # holds one for each projection (zeros from EVA's files: a key bias
    # adds the same logit to every key of a query, which the softmax
    # cancels).
    keys = models[0].state_dict()
    key_bias = (any(k.endswith(("attn.q_bias", "attn.q_proj.bias"))
                    for k in keys)
                and not any(k.endswith("attn.k_proj.bias") for k in keys))
    assert zoo.info(name)["parameters"]["count"] == one + (layers - 1) * (
        two - one) + key_bias * layers * width


@pytest.mark.parametrize("name", OPTION_ROWS)
def test_row_config_gives_timms_logits(name, tmp_path):
    """timm's model of the row at one block, written by timm, loads into
    the row's architecture (``zoo.load(name, weights=folder)``) with timm's
    logits: the row's options are the ones timm's model runs."""
    member = family_rows.MEMBERS[name]
    size = SMALL[member.patch_size]
    classes = member.weights[0].num_classes
    theirs = _random_timm_model(member.timm, size, classes)
    _save_for_hf(theirs, tmp_path / "repo")
    ours = zoo.load(name, weights=str(tmp_path / "repo"))
    config = ours.get_config()
    expected = family_rows.config(name)
    expected.pop("input_normalization")
    for key, value in expected.items():
        if key != "num_layers":
            assert config[key] == value, key
    norm = NAMED[family_rows.FAMILIES[member.family].normalization]
    assert config["input_normalization"] == config_value(norm)
    assert config["num_classes"] == classes
    x = random_images(size)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))


def test_giant_dinov2_rows_are_timms_swiglu():
    """DINOv2-g's rows build the SwiGLU MLP timm runs: a gated SiLU MLP
    whose first layer is twice the width the second reads."""
    import torch

    mlp = _random_timm_model("vit_giant_patch14_dinov2", 28, 0).blocks[0].mlp
    assert "Glu" in type(mlp).__name__ and isinstance(mlp.act, torch.nn.SiLU)
    for name in ("DINOv2-g/14", "DINOv2-reg-g/14"):
        config = family_rows.config(name)
        assert config["mlp"] == "swiglu"
        assert mlp.fc2.in_features == config["mlp_dim"]
        assert mlp.fc1.out_features == 2 * config["mlp_dim"]


# --------------------------------------------------------------------------
# Names, list and info


def test_names_parse_and_list():
    names = zoo.list_models()
    for name in ROWS:
        assert name in names and variants.parse(name).name == name
    assert len(names) == len(set(names))
    for spelling in ("deit-b16", "DeiT-B_16", "deit_base_patch16_224"):
        assert variants.parse(spelling).name == "DeiT-B/16"
    arch = variants.parse("deit3_base_patch16_224.fb_in1k")
    assert (arch.name, arch.tag, arch.family) == ("DeiT3-B/16", "fb_in1k",
                                                  "vit")
    assert variants.parse("dinov2-reg-l14").name == "DINOv2-reg-L/14"
    with pytest.raises(zoo.UnknownModelError, match="'fb_in1k'"):
        variants.parse("vit_base_patch16_clip_quickgelu_224.fb_in1k")
    with pytest.raises(zoo.UnknownModelError,
                       match="Did you mean 'DeiT-B/16'"):
        zoo.info("DeiT-B/61")
    assert zoo.list_models(family="clip") == [
        "CLIP-B/32", "CLIP-B/16", "CLIP-L/14", "CLIP-L/14-336"]
    assert zoo.list_models("DeiT-B*", family="deit") == [
        "DeiT-B/16", "DeiT-B/16-384", "DeiT-B/16-distilled",
        "DeiT-B/16-distilled-384"]
    assert zoo.list_models(family="vit")[0] == "ViT-Ti/16"
    # SigLIP and SigLIP 2 share timm's architectures: the tag picks the
    # row, and timm's name alone is the newer release.
    assert variants.parse("siglip-so400m-14-378").name == (
        "SigLIP-So400m/14-378")
    tagged = variants.parse("vit_base_patch16_siglip_256.webli_i18n")
    assert (tagged.name, tagged.tag) == ("SigLIP-B/16-256", "webli_i18n")
    assert variants.parse("vit_base_patch16_siglip_256").name == (
        "SigLIP2-B/16-256")
    with pytest.raises(zoo.UnknownModelError,
                       match=r"SigLIP-B/16 has \['webli'\]; SigLIP2-B/16 "
                             r"has \['v2_webli'\]"):
        variants.parse("vit_base_patch16_siglip_224.fb_in1k")
    assert zoo.list_models("*so400m*", family="siglip") == [
        "SigLIP-So400m/14", "SigLIP-So400m/14-378", "SigLIP-So400m/16-256"]
    with pytest.raises(ValueError, match="family='deet'.*Did you mean 'deit'"):
        zoo.list_models(family="deet")


def test_info_says_source_normalisation_size_parameters_labels():
    deit = zoo.info("DeiT-B/16")
    assert deit["family"] == "deit" and deit["registered"]
    assert deit["source"] == "hf-hub:timm/deit_base_patch16_224.fb_in1k"
    assert deit["input_normalization"]["name"] == "imagenet"
    # timm's deit_base_patch16_224: 86.6M, ViT-B/16's count at 224.
    assert deit["parameters"] == {"count": 86_567_656, "image_size": 224,
                                  "num_classes": 1000,
                                  "representation_size": None}
    assert deit["labels"] == "imagenet2012"
    assert deit["weights"]["fb_in1k"][0]["license"].startswith("Apache-2.0")
    dino = zoo.info("DINOv2-L/14")
    assert dino["labels"] is None and dino["parameters"]["num_classes"] == 0
    assert dino["image_size"] == 518
    clip = zoo.info("CLIP-B/16")
    assert clip["config"]["gelu"] == "quick"
    assert clip["source"] == "hf-hub:timm/vit_base_patch16_clip_224.openai"
    assert clip["input_normalization"]["name"] == "clip"
    siglip = zoo.info("SigLIP-B/16-256")
    assert siglip["family"] == "siglip" and siglip["labels"] is None
    assert [siglip["config"][k] for k in ("class_token", "classifier",
                                          "gelu")] == [False, "map", "exact"]
    assert siglip["input_normalization"] == {
        "name": "official", "mean": [0.5] * 3, "std": [0.5] * 3}
    assert list(siglip["weights"]) == ["webli", "webli_i18n"]
    assert siglip["parameters"]["num_classes"] == 0
    so400m = zoo.info("SigLIP2-So400m/16-256")
    assert (so400m["config"]["gelu"], so400m["config"]["mlp_dim"]) == (
        "tanh", 4304)
    assert so400m["source"] == (
        "hf-hub:timm/vit_so400m_patch16_siglip_256.v2_webli")
    tuned = zoo.info("SigLIP-So400m/14-378")["weights"]["webli_ft_in1k"][0]
    assert (tuned["num_classes"], tuned["labels"]) == (1000, "imagenet2012")
    # The 2020 models say theirs the same way.
    vit = zoo.info("ViT-B/16")
    assert vit["input_normalization"]["name"] == "official"
    assert vit["source"].startswith("https://storage.googleapis.com/")
    assert json.loads(json.dumps(deit)) == deit


def test_list_and_info_commands(capsys):
    from keras_vit import cli

    assert cli.main(["list", "--family", "dinov2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["NAME", "FAMILY"]
    rows = [line.split() for line in lines[1:-1]]
    assert [r[0] for r in rows] == zoo.list_models(family="dinov2")
    assert {r[1] for r in rows} == {"dinov2"}
    assert all(r[2] == "lvd142m*" for r in rows)
    assert cli.main(["list"]) == 0
    table = {line.split()[0]: line.split()
             for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert table["DeiT3-B/16"][1:3] == ["deit3", "fb_in22k_ft_in1k*"]
    assert table["ViT-B/16"][1] == "vit"
    assert cli.main(["list", "b16", "--family", "clip"]) == 0
    assert [line.split()[0] for line in
            capsys.readouterr().out.splitlines()[1:-1]] == ["CLIP-B/16"]
    assert cli.main(["list", "--family", "nope"]) == 2
    assert "--family nope" in capsys.readouterr().err

    assert cli.main(["info", "DeiT-B/16"]) == 0
    out = capsys.readouterr().out
    for line in ("source:         hf-hub:timm/deit_base_patch16_224.fb_in1k",
                 "image size:     224",
                 "normalisation:  imagenet (mean (0.485, 0.456, 0.406)",
                 "parameters:     86,567,656 (at 224 px, 1000 classes)",
                 "labels:         imagenet2012 (1000 classes)"):
        assert line in out, line
    assert cli.main(["info", "DINOv2-S/14"]) == 0
    out = capsys.readouterr().out
    assert "labels:         none: no head, the model returns the pooled " \
           "embedding" in out
    assert "518px, no head (pooled embedding)" in out

    assert cli.main(["list", "--family", "siglip2"]) == 0
    rows = [line.split() for line in
            capsys.readouterr().out.splitlines()[1:-1]]
    assert [r[0] for r in rows] == zoo.list_models(family="siglip2")
    assert all(r[1:3] == ["siglip2", "v2_webli*"] for r in rows)
    assert cli.main(["info", "SigLIP-B/16"]) == 0
    out = capsys.readouterr().out
    for line in ("source:         hf-hub:timm/vit_base_patch16_siglip_224."
                 "webli",
                 "normalisation:  official (mean (0.5, 0.5, 0.5)",
                 # timm's vit_base_patch16_siglip_224, attention pool too.
                 "parameters:     92,884,224 (at 224 px, 0 classes)",
                 "labels:         none: no head, the model returns the "
                 "pooled embedding"):
        assert line in out, line


def test_guide_names_every_member():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides"
             / "zoo.md").read_text()
    for name in ROWS:
        assert f"`{name}`" in guide, name


# --------------------------------------------------------------------------
# Loading


def test_weights_none_builds_the_rows_architecture():
    dino = zoo.load("DINOv2-S/14", weights=None, image_size=28)
    config = dino.get_config()
    assert dino.output_shape == (None, 384)  # no head: the embedding
    assert (config["layer_scale"], config["gelu"]) == (1e-5, "exact")
    assert config["input_normalization"] in ("imagenet",
                                             NAMED["imagenet"].to_config())
    assert dino.zoo_name == "DINOv2-S/14" and dino.zoo_weights is None
    deit = zoo.load("DeiT-Ti/16-distilled", weights=None, image_size=32)
    assert deit.output_shape == (None, 1000)
    assert deit.get_config()["distilled"] is True
    assert deit.count_params() == registry.parameter_count(
        family_rows.config("DeiT-Ti/16-distilled"), image_size=32,
        num_classes=1000)
    with pytest.raises(ValueError, match="weights='augreg'.*fb_in1k"):
        zoo.load("DeiT-Ti/16", weights="augreg")


def test_convert_refuses_a_hub_release_by_name():
    with pytest.raises(ValueError, match="weights='fb_in1k' of DeiT-B/16 "
                                         "is timm's repository"):
        zoo.resolve_weights("DeiT-B/16", "fb_in1k")


def test_named_member_loads_from_the_hub(tmp_path, monkeypatch):
    """``zoo.load("DeiT-Ti/16")`` reads timm's repository of its default
    release through huggingface_hub (here a local stand-in): timm's
    logits, ImageNet's label names and mean/std, the zoo's name. A CLIP
    tower's repository names timm's GELU architecture; the row's QuickGELU
    is what loads."""
    from _fake_hub import FakeHub

    deit = _random_timm_model("deit_tiny_patch16_224", 32, 1000)
    _save_for_hf(deit, tmp_path / "deit")
    clip = _random_timm_model("vit_base_patch32_clip_quickgelu_224", 64, 512)
    config = _save_for_hf(clip, tmp_path / "clip")
    config["architecture"] = "vit_base_patch32_clip_224"  # as on the Hub
    (tmp_path / "clip" / "config.json").write_text(json.dumps(config))
    for name in ("KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    with FakeHub({"timm/deit_tiny_patch16_224.fb_in1k": tmp_path / "deit",
                  "timm/vit_base_patch32_clip_224.openai":
                  tmp_path / "clip"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model = zoo.load("DeiT-Ti/16", progress=False)
        again = zoo.load("deit_tiny_patch16_224.fb_in1k", progress=False)
        tower = zoo.load("CLIP-B/32", progress=False)
    assert {p.split("/resolve/")[0] for p in hub.gets} == {
        "/timm/deit_tiny_patch16_224.fb_in1k",
        "/timm/vit_base_patch32_clip_224.openai"}
    x = random_images(32)
    assert_close_to_timm(model(x), timm_forward(deit, x))
    assert_close_to_timm(again(x), timm_forward(deit, x))
    assert model.zoo_name == "DeiT-Ti/16"
    assert model.zoo_weights.tag == "fb_in1k"
    assert list(model.label_names) == registry.label_names("imagenet2012")
    assert model.get_config()["input_normalization"] == (
        NAMED["imagenet"].to_config())
    x = random_images(64)
    assert tower.get_config()["gelu"] == "quick"
    assert_close_to_timm(tower(x), timm_forward(clip, x))
    assert tower.zoo_name == "CLIP-B/32" and tower.label_names is None
