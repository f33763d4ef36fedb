"""The family's named members (DeiT, DeiT III, DINOv2, CLIP, SigLIP,
SigLIP 2, EVA-02, Perception Encoder, DINOv3, Qwen3.5's towers): every
row of
``keras_vit.base.family_rows`` against timm's own facts (its
``pretrained_cfg``: Hub repository, input size, mean/std, head; its models:
parameter count and logits), the names in ``zoo.list_models``, ``zoo.info``
and the command line, and a named member loaded from a local stand-in for
the Hub. Random weights, written by timm itself; never the real Hub."""

import inspect
import json

import numpy as np
import pytest

from keras_vit import zoo
from testkit import (assert_close_to_timm, random_images,
                     random_timm_model, timm_forward)
from keras_vit.base import family_rows, variants
from keras_vit.data.normalization import NAMED, config_value
from keras_vit.models.encoder import FAMILY_DEFAULTS
from keras_vit.models.vit import VisionTransformer
from keras_vit.zoo import registry
from keras_vit.zoo.timm import arguments as timm_arguments

ROWS = sorted(family_rows.MEMBERS)
FAMILIES = sorted(family_rows.FAMILIES)
# What a row builds where it names nothing: the builder's defaults.
BUILDER_DEFAULTS = {
    **{k: p.default for k, p in inspect.signature(
        VisionTransformer.__init__).parameters.items()
       if p.default is not p.empty},
    **FAMILY_DEFAULTS}
# timm's pretrained_cfg licence, where the row's family says another:
# timm's repositories of OpenAI's towers say Apache-2.0, OpenAI's release
# (openai/CLIP) is MIT.
LICENSE_SAID_OTHERWISE = {"clip": "apache-2.0"}


def _one_row_per_option_set():
    """The first row (in table order) of each family and set of row
    options (``distilled``, registers, the MLP, the GELU), and of each
    family and input normalisation (DINOv3's satellite rows): the check
    that builds timm's models runs once for each, while every row's sizes
    and options are checked against timm's architecture
    (:func:`test_row_is_timms_release`)."""
    first = {}
    for name, member in family_rows.MEMBERS.items():
        first.setdefault(
            (member.family, repr(sorted(member.options.items()))), name)
        first.setdefault((member.family, family_rows.normalization(name)),
                         name)
    return sorted(set(first.values()))


def _readers_config(member):
    """keras_vit's builder arguments of timm's architecture of ``member``
    as zoo/timm's readers derive them from timm's own arguments (the
    table of timm's architectures, checked against timm in
    test_timm_walk.py): EVA's reader, the Qwen towers' (a tower without
    the merger), or the ViT's; timm's GELU is the exact one unless it
    names another."""
    arch, options = timm_arguments.architecture(member.timm)
    entry = timm_arguments.table_entry(member.timm)
    if entry["module"] == "eva":  # timm's Eva: its own reader
        from keras_vit.zoo.timm import eva

        honoured = eva.honoured(entry["args"], "timm_architectures.json")
    elif entry["module"] == "qwen3_vit":
        from keras_vit.zoo.timm import eva

        honoured, tokens = eva.qwen_honoured(
            entry["args"], "timm_architectures.json", {})
        assert not tokens and "merge_size" not in honoured, member.timm
    else:
        honoured = timm_arguments.honoured(
            {}, arch, "timm_architectures.json", options)
    return arch, {**arch.config, "gelu": "exact",
                  "position_resize": timm_arguments.TABLE_RESIZE, **honoured}


OPTION_ROWS = _one_row_per_option_set()
# The test-size input of each patch size: a 2x2 grid.
SMALL = {14: 28, 16: 32, 32: 64}


def _timm():
    import timm
    return timm


def _random_timm_model(arch, size, num_classes, depth=1):
    _timm()
    return random_timm_model(arch, size, num_classes, depth)


def _release(member):
    """timm's ``arch.tag`` of ``member``'s default release."""
    return f"{member.timm}.{member.weights[0].tag}"










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
    """Hub repository, input size, mean/std, head size, label list and
    licence of every release are those of timm's pretrained_cfg; the
    row's sizes and options are those of timm's architecture as
    zoo/timm's reader derives them (:func:`_readers_config`): every
    argument the reader sets is the row's, or the builder's default where
    the row names none, and the row names nothing else."""
    timm = _timm()
    from timm.models import get_pretrained_cfg

    member = family_rows.MEMBERS[name]
    assert timm.is_model(member.timm), member.timm
    arch, theirs = _readers_config(member)
    ours = family_rows.config(name)
    ours.pop("input_normalization")
    assert set(ours) <= set(theirs), sorted(set(ours) - set(theirs))
    built = {**BUILDER_DEFAULTS, **ours}
    assert {k: built.get(k, "(no such argument)") for k in theirs} == theirs
    # The size timm builds the architecture at, unless its release is at
    # another (timm builds PE at 224 and resizes its 448/512 px tables).
    assert member.image_size in (arch.image_size, get_pretrained_cfg(
        f"{member.timm}.{member.weights[0].tag}").input_size[1])
    norm = NAMED[family_rows.normalization(name)]
    family = family_rows.FAMILIES[member.family]
    for weights in member.weights:
        full = f"{member.timm}.{weights.tag}"
        assert full in timm.list_pretrained(member.timm + "*"), full
        cfg = get_pretrained_cfg(full)
        assert weights.source == f"hf-hub:{cfg.hf_hub_id}", full
        if LICENSE_SAID_OTHERWISE.get(member.family) != cfg.license:
            assert family.license.lower().startswith(
                cfg.license.removesuffix("-license")), (full, cfg.license)
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


@pytest.mark.parametrize("name", ROWS)
def test_row_parameter_count_is_timms(name):
    """``zoo.info``'s count (from the row's config alone) is the
    parameter count of timm's model of the row's default release at full
    size, built on torch's meta device (shapes, no memory: DINOv3-7B/16
    too)."""
    timm = _timm()
    member = family_rows.MEMBERS[name]
    theirs = timm.create_model(
        _release(member), pretrained=False, device="meta",
        img_size=member.image_size,
        num_classes=member.weights[0].num_classes)
    keys = theirs.state_dict()
    config = family_rows.config(name)
    layers, width = config["num_layers"], config["hidden_size"]
    # timm's EVA projects the keys without a bias; keras_vit's qkv_bias
    # holds one for each projection (zeros from EVA's files: a key bias
    # adds the same logit to every key of a query, which the softmax
    # cancels).
    key_bias = (any(k.endswith(("attn.q_bias", "attn.q_proj.bias"))
                    for k in keys)
                and not any(k.endswith("attn.k_proj.bias") for k in keys))
    # timm's Qwen towers normalise the mean token without a scale or bias;
    # keras_vit's fc_norm holds both (ones and zeros from their files).
    bare_norm = config.get("fc_norm", False) and not any(
        k.startswith(("fc_norm.", "norm.")) for k in keys)
    assert zoo.info(name)["parameters"]["count"] == sum(
        p.numel() for p in theirs.parameters()) + (
        key_bias * layers * width + bare_norm * 2 * width)


@pytest.mark.parametrize("name", OPTION_ROWS)
def test_row_config_gives_timms_logits(name, tmp_path):
    """timm's model of the row at one block, written by timm, loads into
    the row's architecture (``zoo.load(name, weights=folder)``) with timm's
    logits: the row's options are the ones timm's model runs."""
    member = family_rows.MEMBERS[name]
    size = SMALL[member.patch_size]
    classes = member.weights[0].num_classes
    # At the row's default release: its pretrained_cfg (mean/std) is what
    # timm's writer writes.
    theirs = _random_timm_model(_release(member), size, classes)
    _save_for_hf(theirs, tmp_path / "repo")
    # The name's sizes, amended to timm's one block.
    ours = zoo.load(name, weights=str(tmp_path / "repo"), num_layers=1)
    config = ours.get_config()
    expected = family_rows.config(name)
    expected.pop("input_normalization")
    for key, value in expected.items():
        if key != "num_layers":
            assert config[key] == value, key
    norm = NAMED[family_rows.normalization(name)]
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


def test_dinov3_pe_core_and_qwen_names_and_info():
    """DINOv3's S+ and H+ are names of their own (a '+' reads 'plus', as
    timm spells it), timm's name alone is the LVD release and its tag
    picks the satellite row, with its own mean/std; a dotted name
    (Qwen3.5) is a row's before a timm tag; PE core's head is the
    image-text projection."""
    assert variants.parse("dinov3-s+16").name == "DINOv3-S+/16"
    assert variants.parse("dinov3-s16").name == "DINOv3-S/16"
    assert variants.parse("vit_huge_plus_patch16_dinov3").name == (
        "DINOv3-H+/16")
    assert variants.parse("vit_large_patch16_dinov3").name == "DINOv3-L/16"
    sat = variants.parse("vit_large_patch16_dinov3.sat493m")
    assert (sat.name, sat.tag) == ("DINOv3-L/16-sat", "sat493m")
    assert variants.parse("R50+ViT-B/16").name == "R50+ViT-B/16"
    tagged = variants.parse("Qwen3.5-L/16.qwen3_5_4b")
    assert (tagged.name, tagged.tag) == ("Qwen3.5-L/16", "qwen3_5_4b")
    assert variants.parse("qwen3.5-so400m-16").name == "Qwen3.5-So400m/16"
    with pytest.raises(zoo.UnknownModelError,
                       match=r"Qwen3.5-L/16 has \['qwen3_5_2b', "
                             r"'qwen3_5_4b'\]"):
        variants.parse("Qwen3.5-L/16.fb")
    info = zoo.info("DINOv3-L/16-sat")
    assert info["input_normalization"] == {
        "name": "sat493m", "mean": [0.430, 0.411, 0.296],
        "std": [0.213, 0.156, 0.143]}
    assert info["config"]["dynamic_image_size"] is True
    assert zoo.info("DINOv3-L/16")["input_normalization"]["name"] == (
        "imagenet")
    # timm's vit_7b_patch16_dinov3: 6.7B parameters, counted from the row.
    assert zoo.info("DINOv3-7B/16")["parameters"]["count"] == 6_716_030_976
    core = zoo.info("PE-Core-L/14-336")
    assert core["labels"] is None and core["config"]["rope_grid"] == [24, 24]
    assert core["parameters"]["num_classes"] == 1024
    assert registry.hub_weights("PE-Core-L/14-336", "auto").head_type == (
        "projection")
    qwen = zoo.info("Qwen3.5-L/16")
    assert list(qwen["weights"]) == ["qwen3_5_2b", "qwen3_5_4b"]
    assert [qwen["config"][k] for k in ("gelu", "class_token", "fc_norm")] \
        == ["tanh", False, True]
    assert "merge_size" not in qwen["config"]


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


@pytest.mark.parametrize("family", FAMILIES)
def test_list_and_info_commands_show_every_row(family, capsys):
    """``keras-vit list --family F`` lists the family's rows with their
    default release starred and its image size; ``keras-vit info NAME``
    shows each row's source, image size, input normalisation (name, mean
    and std), head and licence."""
    from keras_vit import cli

    assert cli.main(["list", "--family", family]) == 0
    rows = [line.split() for line in
            capsys.readouterr().out.splitlines()[1:-1]]
    names = [n for n in family_rows.MEMBERS
             if family_rows.MEMBERS[n].family == family]
    assert [r[0] for r in rows] == names == zoo.list_models(family=family)
    for row, name in zip(rows, names):
        member = family_rows.MEMBERS[name]
        assert row[1:3] == [family, f"{member.weights[0].tag}*"], row
        assert row[3].rstrip(",") == f"({member.image_size})", row
        assert cli.main(["info", name]) == 0
        out = capsys.readouterr().out
        norm = family_rows.normalization(name)
        mean, std = NAMED[norm]
        default = member.weights[0]
        for line in (f"{name}  (family {family}, registered)",
                     f"  source:         {default.source}",
                     f"  image size:     {member.image_size}",
                     f"  normalisation:  {norm} (mean {tuple(mean)}, "
                     f"std {tuple(std)} of [0, 1] pixels)",
                     "  labels:         " + (
                         f"{default.labels} ({default.num_classes} classes)"
                         if default.labels else
                         f"none: a {default.num_classes}-wide head without "
                         "class names" if default.num_classes else
                         "none: no head, the model returns the pooled "
                         "embedding"),
                     f"license {family_rows.FAMILIES[family].license}"):
            assert line in out, (name, line)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_row_offline_is_one_line(family, tmp_path, monkeypatch, capsys):
    """``keras-vit predict NAME`` with the Hub out of reach and
    ``KERAS_VIT_OFFLINE=1``: one line, no traceback, naming the default
    release's URL and the cache folder to place its files in, for the
    first row of every family."""
    import numpy as np
    from PIL import Image

    from keras_vit import cli
    from keras_vit.zoo.download import cache as download_cache

    unreachable = "http://127.0.0.1:9"  # nothing listens: refused at once
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", unreachable)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    name = next(n for n, m in family_rows.MEMBERS.items()
                if m.family == family)
    repo = family_rows.MEMBERS[name].weights[0].source.removeprefix(
        "hf-hub:")
    image = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(image)
    assert cli.main(["predict", name, str(image)]) != 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("keras-vit: error:"), err
    base = f"{unreachable}/{repo}/resolve/main/"
    folder = download_cache.cache_path_for(base + "config.json").parent
    assert base in lines[0] and f"{folder}/" in lines[0], lines[0]
    assert "unset KERAS_VIT_OFFLINE" in lines[0], lines[0]


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
        # The names' sizes, amended to the stand-ins' one block.
        model = zoo.load("DeiT-Ti/16", progress=False, num_layers=1)
        again = zoo.load("deit_tiny_patch16_224.fb_in1k", progress=False,
                         num_layers=1)
        tower = zoo.load("CLIP-B/32", progress=False, num_layers=1)
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
