"""timm's ViT family as timm lists it today, walked cheaply with the walk of
``benchmarks/timm_coverage.py`` (the script behind
docs/coverage-timm.md): a few architectures that together carry every
option value timm's architecture functions pass (chosen from timm's list
by a rule, not by name), each built by timm at depth 1 with random
weights and written by timm's ``save_for_hf``. Each must load with timm's
logits or be refused in one line whose feature is a known gap; a feature
not in :data:`KNOWN_GAPS` (a regression, or a new timm option) fails."""

import importlib.util
import math
import os
import sys

import pytest

import timm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "timm_coverage.py")

# What keras_vit cannot load from timm today, as the walk names it: a
# refused argument's feature (timm_coverage.argument_feature) or a
# refusal's (timm_coverage.message_feature). An architecture missing from
# keras_vit's table of timm's architectures (zoo/timm/architectures.json)
# is not a gap but a stale table: its verdict (NAME_ONLY) fails here.
KNOWN_GAPS = {
    "norms inside attention and MLP (BEiT-3 sub-LN)",
    "attention pool over the prefix tokens",
    # EVA's (eva.py) beyond DINOv3 and the EVA giants.
    "separate q, k, v projections (EVA-02)",
    "EVA-02's rotary grid (ref_feat_shape)",
    "RoPE-ViT and PE attention (attn_type)",
    "attention pool of PE (attn_pool_*)",
    "global_pool=map",  # in an EVA: PE's attention pool (the ViT's loads)
    # NaFlexVit's settings beyond SigLIP 2's and timm's own NaFlex ViTs.
    "NaFlex: aspect-preserving table resize (pos_embed_ar_preserving)",
    "NaFlex: factorized position table (pos_embed='factorized')",
    "NaFlex: another setting (naflexvit)",
    # The modules keras_vit does not read yet, refused by module.
    # DeepSeek's aligner (the _enc and _align towers).
    "DeepSeek: the aligner (global_pool='align', encoder_pool)",
    # SAM's ViT-B at 224 (no pretrained tag) ends in a LayerNorm of its
    # own epsilon instead of the neck.
    "SAM without its neck (neck_chans=None)",
}


def _module():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    spec = importlib.util.spec_from_file_location("timm_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """``(the script, its rows for the representatives, timm's list)``;
    the size cap off, so that features only the largest architectures
    carry (DINOv2 giant's GLU MLP) are walked too, at depth 1."""
    coverage = _module()
    arches = coverage.architectures()
    folder = tmp_path_factory.mktemp("timm_walk")
    return coverage, [coverage.walk_one(name, *arches[name],
                                        workdir=str(folder),
                                        max_parameters=math.inf)
                      for name in coverage.representatives(arches)], arches


def test_representatives_carry_every_option_value_of_timms_list(walked):
    coverage, rows, arches = walked
    carried = set().union(*(coverage.features(
        module, coverage.architecture_args(name, module))
        for name, (module, _) in arches.items()))
    chosen = set().union(*(coverage.features(
        row["module"], coverage.architecture_args(row["name"], row["module"]))
        for row in rows))
    assert carried == chosen
    # Every module, and a plain ViT among them.
    assert {row["module"] for row in rows} == set(coverage.MODULES)
    assert not coverage.options(coverage.architecture_args(
        rows[0]["name"], rows[0]["module"]))


def test_each_loads_with_timms_logits_or_is_refused_in_one_line(walked):
    coverage, rows, _ = walked
    # (timm itself fails to build its sapiens2 architectures today.)
    unexpected = [(r["name"], r["status"], r["message"]) for r in rows
                  if r["status"] not in (coverage.EXACT, coverage.REFUSED)
                  and not (r["status"] == coverage.NO_BUILD
                           and "sapiens2" in r["name"])]
    assert not unexpected, unexpected
    refused = [r for r in rows if r["status"] == coverage.REFUSED]
    assert all(r["one_line"] for r in refused), [
        (r["name"], r["message"]) for r in refused if not r["one_line"]]
    # The probe of an architecture keras_vit refuses reads the same
    # weights with the options spelled out: never a different answer.
    wrong = [(r["name"], r["probe_message"]) for r in refused
             if r["probe_status"] == coverage.DIFFERS
             and not r["probe_missing"]]
    assert not wrong, wrong
    assert any(r["status"] == coverage.EXACT for r in rows)


def test_aimv2s_norms_and_swiglu_load_with_timms_logits(walked):
    """The representative carrying AIMv2's options (RMSNorm, the norm
    after the patch embedding, timm's unpacked SwiGLU, SiLU) loads with
    timm's logits, and so does every representative with RMSNorm."""
    coverage, rows, _ = walked
    carrying = [row for row in rows if {"embed_norm_layer", "norm_layer"}
                & set(coverage.options(coverage.architecture_args(
                    row["name"], row["module"])))
                and "backbone" not in coverage.architecture_args(
                    row["name"], row["module"])]
    aimv2 = [row for row in carrying if row["name"].startswith("aimv2_")]
    assert aimv2, [row["name"] for row in rows]
    assert all(row["status"] == coverage.EXACT for row in aimv2), [
        (row["name"], row["status"], row["message"]) for row in aimv2]
    # Any other refusal of a row with a norm is for another feature.
    assert not [row["name"] for row in carrying if "RMSNorm" in row["group"]
                or "norm after the patch" in row["group"]]


def test_the_features_refused_are_known_gaps(walked):
    coverage, rows, _ = walked
    found = {feature: row["name"]
             for row in rows if row["status"] == coverage.REFUSED
             for feature in row["group"].split(" + ")}
    new = {feature: name for feature, name in found.items()
           if feature not in KNOWN_GAPS}
    assert not new, (f"refusals of features not in KNOWN_GAPS (a regression "
                     f"or a new timm option): {new}")


def test_keras_vits_table_is_timms_for_the_installed_timm(walked):
    """zoo/timm/architectures.json is what ``--write-table`` writes from
    the installed timm: its version, every architecture of the
    modules in timm's order, and for the representatives (every option
    value timm passes) the very rows."""
    from keras_vit.zoo.timm import arguments as timm_arguments

    coverage, rows, arches = walked
    table = timm_arguments.table()
    assert table["timm"] == timm.__version__, (
        "regenerate: python benchmarks/timm_coverage.py --write-table "
        "zoo/timm/architectures.json")
    assert list(table["architectures"]) == list(arches)
    for row in rows:
        assert table["architectures"][row["name"]] == coverage.table_entry(
            row["name"], row["module"]), row["name"]


def test_an_argument_keras_vit_lacks_is_refused_by_name_from_either_place():
    from keras_vit.zoo import formats
    from keras_vit.zoo.timm import arguments as timm_arguments

    # Every architecture of the table's ViT modules loads: a block a
    # later timm's table could name stands for one it does not.
    arch, options = timm_arguments.architecture("vit_small_patch16_18x2_224")
    options = dict(options, block_fn="NormFormerBlock")
    with pytest.raises(formats.FormatError, match=(
            r"field architecture: block_fn='NormFormerBlock' \(timm's "
            r"vit_small_patch16_18x2_224 sets it\) is a timm setting "
            r"keras_vit cannot honour")) as info:
        timm_arguments.honoured({}, arch, "config.json", options)
    assert "\n" not in str(info.value)
    # The same mapping for a config.json's model_args, named as its field.
    arch, options = timm_arguments.architecture("vit_base_patch16_224")
    with pytest.raises(formats.FormatError, match=(
            r"field model_args.mlp_layer: mlp_layer='SwiGLU' is a timm "
            r"setting keras_vit cannot honour")):
        timm_arguments.honoured({"model_args": {"mlp_layer": "SwiGLU"}},
                                arch, "config.json", options)


def test_the_tables_arguments_and_the_configs_read_alike():
    from keras_vit.zoo.timm import arguments as timm_arguments

    def read(name, **model_args):
        arch, options = timm_arguments.architecture(name)
        return arch, timm_arguments.honoured(
            {"model_args": model_args}, arch, "config.json", options)

    # CLIP: the norm before the blocks, no patch bias, LayerNorm eps 1e-5.
    _, got = read("vit_base_patch16_clip_224")
    assert (got["pre_norm"], got["patch_bias"], got["layer_norm_epsilon"]) \
        == (True, False, 1e-5)
    # A config's argument overrides the table's: timm's own "layernorm".
    _, got = read("vit_base_patch16_clip_224", norm_layer="layernorm")
    assert got["layer_norm_epsilon"] == 1e-6
    # A fractional mlp_ratio: timm truncates int(dim * mlp_ratio), also
    # for a width the config gives.
    arch, got = read("vit_so400m_patch14_siglip_224")
    assert arch.config["mlp_dim"] == int(1152 * 3.7362) == 4304
    _, got = read("vit_so400m_patch14_siglip_224", embed_dim=96, num_heads=6)
    assert got["mlp_dim"] == int(96 * 3.7362) == 358
    # SigLIP 2's tanh GELU, DINOv2's size and layer scale, dynamic sizes.
    assert read("vit_base_patch32_siglip_256")[1]["gelu"] == "tanh"
    arch, got = read("vit_small_patch14_dinov2")
    assert (arch.image_size, got["layer_scale"]) == (518, 1e-5)
    assert read("test_vit")[1]["dynamic_image_size"] is True


def test_the_report_counts_tags_by_class_and_feature():
    coverage = _module()

    def row(name, status, tags, group="", **extra):
        return dict(dict(name=name, module="vision_transformer",
                         tags=[f"{name}.t{i}" for i in range(tags)],
                         parameters=1e6, status=status, message="m",
                         group=group, image_size=32, probe_status=None,
                         probe_missing=None, probe_message=""), **extra)

    rows = [row("a", coverage.EXACT, 3),
            row("b", coverage.REFUSED, 2, "RMSNorm"),
            row("c", coverage.REFUSED, 4, "SwiGLU / GLU MLP + RMSNorm"),
            row("d", coverage.DIFFERS, 1, message="max |diff| 0.3"),
            row("e", coverage.TOO_LARGE, 0)]
    lines, loaded, tags = coverage.summary(rows)
    assert (loaded, tags) == (3, 10)
    text = "\n".join(lines)
    assert "| refused | 2 | 6 |" in text
    # By group, most tags first; by single feature, alone and in all.
    groups = [x for x in lines if x.startswith("| SwiGLU / GLU MLP + ")
              or x.startswith("| RMSNorm | 1 ")]
    assert groups[0].startswith("| SwiGLU / GLU MLP + RMSNorm | 1 | 4 |")
    assert "| RMSNorm | 2 | 6 | 1 | 2 |" in text
    assert "| SwiGLU / GLU MLP | 1 | 4 | 0 | 0 |" in text
    assert "| d | zoo.load of timm's folder | 32 | max \\|diff\\| 0.3 |" in (
        text)
    page = coverage.report(rows, "python benchmarks/timm_coverage.py")
    assert "**30.0% of the pretrained tags load with timm's logits**" in page
    assert f"timm {timm.__version__}" in page
