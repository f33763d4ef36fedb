"""The scripts in examples/ run (on a local random checkpoint)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import official

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_classify_image_example(tmp_path):
    pytest.importorskip("skimage")
    path = official.write(tmp_path / "ti.npz", official.vit_arrays(
        patch=16, hidden=192, layers=12, heads=3, mlp=768, grid=2,
        num_classes=1000, seed=1))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "classify_image.py"),
         "--model", "ViT-Ti/16", "--weights", str(path), "--image-size", "64"],
        capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("ViT-Ti/16 at 64x64")
    assert len(lines) == 6 and all("%" in line for line in lines[1:])
    probs = [float(line.split("%")[0]) for line in lines[1:]]
    assert probs == sorted(probs, reverse=True)
