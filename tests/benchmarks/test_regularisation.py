"""benchmarks/regularisation.py end to end with a tiny budget (one seed, a
few steps of a one-block ViT): it checks the script and its report, not
what regularisation does."""

import os
import re

import pytest

from testkit import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "regularisation.py")


def _summary_rows(text):
    """The rows of the report's first markdown table (the summary), as
    dicts keyed by its header's cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    head, _, *body = table
    return [dict(zip(head, cells)) for cells in body]


def _numbers(row, column):
    """The numbers in the cell of ``row`` whose header starts with
    ``column``."""
    cell = next(v for k, v in row.items() if k.startswith(column))
    return [float(v) for v in re.findall(r"[-+]?\d+\.\d+", cell)]


@pytest.mark.slow
def test_tiny_run_reports_every_recipe(tmp_path, capsys):
    bench = load_script(SCRIPT)
    out = tmp_path / "reg.md"
    # Two recipes keep it to seconds: plain, and DeiT's pipeline (crop,
    # erasing, MixUp / CutMix, smoothing) with an override.
    recipes = ["plain", "deit+randaugment=none"]
    assert bench.main(["--recipes", *recipes, "--seeds", "3", "--steps", "2",
                       "--batch-size", "8", "--width", "8", "--depth", "1",
                       "--heads", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "- CPU: " in text and "CPU features: " in text
    assert "--steps 2" in text  # the command
    rows = _summary_rows(text)
    assert [r["recipe"] for r in rows] == recipes
    plain_test = _numbers(rows[0], "test accuracy")[0]
    for r in rows:
        mean, std, low, high = _numbers(r, "test accuracy")
        assert 0.0 <= low <= mean <= high <= 1.0 and std == 0.0  # one seed
        train_mean, train_low, train_high = _numbers(r, "train accuracy")
        assert 0.0 <= train_low <= train_mean <= train_high <= 1.0
    assert rows[0]["test − plain, paired by seed: mean ± std [min, max]"] \
        == "-"  # plain is the baseline
    for r in rows[1:]:
        assert _numbers(r, "test − plain")[0] == pytest.approx(
            _numbers(r, "test accuracy")[0] - plain_test, abs=2e-3)
    # The override reached the recipe, and the recipe lines say so.
    assert "deit+randaugment=none: adam" in text
    assert "RandAugment None, erasing 0.25" in text


def test_recipe_arguments_are_checked():
    bench = load_script(SCRIPT)
    assert bench.parse_recipe_spec("augreg+mixup_alpha=0") == (
        "augreg", {"mixup_alpha": 0.0})
    with pytest.raises(ValueError, match=r"unknown recipe 'augrg' in "
                       r"'augrg\+mixup_alpha=0' \(did you mean 'augreg'\?\)"):
        bench.parse_recipe_spec("augrg+mixup_alpha=0")
    with pytest.raises(ValueError, match="expected field=value"):
        bench.parse_recipe_spec("deit+mixup_alpha")
    r = bench.build_recipe("plain", steps=50, batch_size=16, image_size=16,
                           seed=4)
    # Plain keeps AugReg's optimiser and turns every regulariser off.
    assert (r.optimizer, r.learning_rate, r.grad_clip_norm) == ("adam",
                                                                1e-3, 1.0)
    assert not r.mixes and r.randaugment is None and r.crop_area is None
    assert (r.weight_decay, r.dropout_rate, r.drop_path_rate) == (0, 0, 0)
    assert (r.total_steps, r.warmup_steps, r.seed) == (50, 5, 4)
    # --keep-ema keeps DeiT's decay where the run is long enough to hold
    # its average (at least twice its ~25k-step horizon), and is refused,
    # naming the field, where it would save the starting weights.
    kept = bench.build_recipe("deit", steps=50_000, batch_size=16,
                              image_size=16, seed=0, keep_ema=True)
    assert kept.ema_decay == 0.99996 and kept.mixes
    with pytest.raises(ValueError, match=r"ema_decay=0\.99996 .* "
                       r"total_steps=50 "):
        bench.build_recipe("deit", steps=50, batch_size=16, image_size=16,
                           seed=0, keep_ema=True)
