"""The README's main job: ``keras-vit demo``, offline, end to end.

The quick variant runs in tests/test_cli.py; this runs the real thing as a
user would (a fresh process, the console script) and holds it to the
acceptance figures: at least 95% on the held-out digits, at 32x32 and after
the fine-tune at 48x48, in under 5 minutes of wall time.
"""

import json
import os
import re
import subprocess

import numpy as np
import pytest

import keras
from keras_vit import zoo


def _figure(text, label):
    match = re.search(rf"^\s+{re.escape(label)}\s+([0-9.]+)", text, re.M)
    assert match, f"no {label!r} line in:\n{text}"
    return float(match.group(1))


@pytest.mark.slow
def test_demo_reaches_95_percent_in_under_5_minutes(tmp_path):
    out = tmp_path / "demo"
    env = dict(os.environ, KERAS_VIT_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(["keras-vit", "demo", "--out", str(out)],
                          capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    wall = float(re.search(r"^\s+wall time\s+([0-9.]+)s", text, re.M)
                 .group(1))
    assert wall < 300, text
    assert _figure(text, "test accuracy @32") >= 0.95, text
    tuned = re.search(r"test accuracy @48, fine-tuned[^\d]*\d+ epochs?\s+"
                      r"([0-9.]+)", text)
    assert tuned and float(tuned.group(1)) >= 0.95, text
    # The export stage wrote and verified all three formats and printed
    # the verification table (one row per format, top-1 agreement 1.000).
    for fmt in ("saved_model", "tflite", "onnx"):
        row = re.search(rf"^\| {fmt} \| float32 \|.*\| ([0-9.]+) \| 4,1 \|",
                        text, re.M)
        assert row and float(row.group(1)) == 1.0, text
    assert re.search(r"export \(SavedModel, TFLite, ONNX\)\s+ok", text), text
    for name in ("digits_vit_saved_model", "digits_vit.tflite",
                 "digits_vit.onnx"):
        assert (out / name).exists(), name

    # The files are what the summary says: the 32x32 model and its npz.
    model = keras.saving.load_model(out / "digits_vit.keras")
    arrays = zoo.read_npz(out / "digits_vit.npz")
    for key, value in zoo.export_arrays(model).items():
        np.testing.assert_array_equal(arrays[key], value)
    for run in ("pretrain_32", "finetune_48"):
        metrics = json.loads((out / "runs" / run / "metrics.json").read_text())
        assert metrics["complete"] and metrics["eval"]["accuracy"] >= 0.95
        assert os.listdir(out / "runs" / run / "logs" / "train")
