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

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "timm_coverage.py")

# What keras_vit cannot load from timm today, as the walk names it: a
# refused argument's feature (timm_coverage.argument_feature), a refusal's
# (timm_coverage.message_feature), or the walk's verdict on a name.
KNOWN_GAPS = {
    # keras_vit's table of timm names lacks the architecture, though its
    # arguments all read (e.g. vit_base_patch16_radio_v3).
    "name only: not in keras_vit's table (every option it sets reads)",
    # The table maps vit_{base,huge}_patch*_gap_* onto vit_medium's options
    # (no qkv bias, layer scale); the strict loader refuses the weights.
    "keras_vit's table gives the name other options (the weights do not "
    "fit)",
    "SwiGLU / GLU MLP", "silu activation (act_layer)", "RMSNorm",
    "norm after the patch embedding", "LayerNorm eps 1e-05 (norm_layer)",
    "parallel blocks (ViT-22B style)", "parallel blocks (several branches)",
    "post-norm blocks (ResPostBlock)", "differential attention",
    "norms inside attention and MLP (BEiT-3 sub-LN)",
    "MLP width not a whole number of units (mlp_ratio)",
    "dynamic image size", "attention pool over the prefix tokens",
    "hybrid backbone ResNet-D (resnet26d/50d)", "hybrid backbone ConvStem",
}


def _module():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    spec = importlib.util.spec_from_file_location("timm_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """``(the script, its rows for the representatives)``; the size cap
    off, so that features only the largest architectures carry (DINOv2
    giant's GLU MLP) are walked too, at depth 1."""
    coverage = _module()
    arches = coverage.architectures()
    chosen = coverage.representatives(arches)
    folder = tmp_path_factory.mktemp("timm_walk")
    return coverage, [coverage.walk_one(name, *arches[name],
                                        workdir=str(folder),
                                        max_parameters=math.inf)
                      for name in chosen]


def test_representatives_carry_every_option_value_of_timms_list(walked):
    coverage, rows = walked
    arches = coverage.architectures()
    carried = {(key, coverage.argument_feature(key, value))
               for name, (module, _) in arches.items()
               for key, value in coverage.options(
                   coverage.architecture_args(name, module)).items()}
    chosen = {(key, coverage.argument_feature(key, value))
              for row in rows
              for key, value in coverage.options(coverage.architecture_args(
                  row["name"], row["module"])).items()}
    assert carried == chosen
    # All three modules, and a plain ViT among them.
    assert {row["module"] for row in rows} == set(coverage.MODULES)
    assert not coverage.options(coverage.architecture_args(
        rows[0]["name"], rows[0]["module"]))


def test_each_loads_with_timms_logits_or_is_refused_in_one_line(walked):
    coverage, rows = walked
    unexpected = [(r["name"], r["status"], r["message"]) for r in rows
                  if r["status"] not in (coverage.EXACT, coverage.REFUSED)]
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


def test_the_features_refused_are_known_gaps(walked):
    coverage, rows = walked
    found = {feature: row["name"]
             for row in rows if row["status"] == coverage.REFUSED
             for feature in row["group"].split(" + ")}
    new = {feature: name for feature, name in found.items()
           if feature not in KNOWN_GAPS}
    assert not new, (f"refusals of features not in KNOWN_GAPS (a regression "
                     f"or a new timm option): {new}")


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
