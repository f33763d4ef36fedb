"""The scripts in examples/ run (on a local random checkpoint)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import official
from conftest import two_jax_cpu_devices_flags

ROOT = Path(__file__).resolve().parents[2]


def vit_ti_checkpoint(path, grid, seed):
    """A random official ViT-Ti/16 checkpoint with a 1000-class head, for a
    (16 * grid)-pixel input."""
    return official.write(path, official.vit_arrays(
        patch=16, hidden=192, layers=12, heads=3, mlp=768, grid=grid,
        num_classes=1000, seed=seed))


def colour_folders(root, classes=(("red", (200, 30, 30)),
                                  ("blue", (30, 30, 200)))):
    """``root/<class>/`` with 8 noisy single-colour PNGs each."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, colour in classes:
        (root / name).mkdir(parents=True)
        for i in range(8):
            pixels = np.clip(np.array(colour) + rng.integers(
                -20, 20, (24, 20, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def run_example(script, *args, **env):
    """Runs examples/``script`` with ``args``; returns its stdout (exit
    status 0 asserted)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *map(str, args)],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_classify_image_example(tmp_path):
    pytest.importorskip("skimage")
    path = vit_ti_checkpoint(tmp_path / "ti.npz", grid=2, seed=1)
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


@pytest.mark.slow
def test_finetune_fit_example_on_two_logical_cpus(tmp_path):
    """examples/finetune_fit.py: model.fit under MirroredStrategy over two
    logical CPU devices fine-tunes and saves a model that reloads."""
    data = colour_folders(tmp_path / "data")
    # A folder that does not exist yet: created, model.keras saved in it.
    out = tmp_path / "runs" / "tuned" / "model.keras"
    stdout = run_example(
        "finetune_fit.py", "--data", data, "--model", "ViT-Ti/16",
        "--weights", "none", "--image-size", "32", "--batch-size", "8",
        "--steps", "3", "--strategy", "mirrored", "--cpu-devices", "2",
        "--out", out.parent)
    assert "replicas: 2" in stdout, stdout
    assert f"saved: {out}" in stdout, stdout
    loss = float(re.search(r"final loss: ([0-9.naninf]+)", stdout).group(1))
    assert np.isfinite(loss) and 0 < loss < 10, loss
    import keras
    # The model and layer classes, and the schedule and loss the compiled
    # model saved with it (importing their modules registers them).
    import keras_vit.models  # noqa: F401
    import keras_vit.train.schedules  # noqa: F401

    model = keras.saving.load_model(out)
    assert model.output_shape == (None, 2)
    # The head trained away from its zero initialisation.
    assert np.abs(model.get_layer("head").get_weights()[0]).max() > 0


@pytest.mark.slow
def test_inspect_attention_example(tmp_path):
    """examples/inspect_attention.py on the astronaut with a local random
    checkpoint: the figure is written, the rollout map covers the patch
    grid, and five classes with probabilities are printed."""
    pytest.importorskip("skimage")
    pytest.importorskip("matplotlib")
    path = vit_ti_checkpoint(tmp_path / "ti.npz", grid=4, seed=2)
    out = tmp_path / "rollout.png"
    stdout = run_example("inspect_attention.py", "--model", "ViT-Ti/16",
                         "--weights", path, "--out", out)
    lines = stdout.strip().splitlines()
    probs = [float(line.split("%")[0]) for line in lines[:5]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 100.01
    grid = re.search(r"map: (\d+)x(\d+) patches, sum ([0-9.]+)", stdout)
    assert grid and grid.group(1) == grid.group(2) == "4", stdout
    assert 0 < float(grid.group(3)) <= 1.0  # the patch tokens' share
    from PIL import Image
    with Image.open(out) as figure:
        assert figure.size[0] > figure.size[1] > 100  # three panels side by side


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["timm", "transformers"])
def test_hub_finetune_push_example(tmp_path, layout):
    """examples/hub_finetune_push.py from a local timm repository (the Hub
    is out of reach here): fine-tunes a new head, saves in the layout, and
    the saved folder reloads with the same logits; the upload is shown."""
    from keras_vit import zoo

    source = tmp_path / "source"
    zoo.save_pretrained(zoo.load("ViT-Ti/16", weights=None, image_size=32,
                                 num_classes=5, gelu="exact"), source)
    data = colour_folders(tmp_path / "data", (("cat", (200, 120, 30)),
                                              ("sky", (30, 90, 220))))
    save = tmp_path / "tuned"
    stdout = run_example(
        "hub_finetune_push.py", "--source", source, "--data", data,
        "--steps", "2", "--batch-size", "8", "--save", save,
        "--layout", layout)
    diff = float(re.search(r"max \|logit diff\| ([0-9.e+-]+)",
                           stdout).group(1))
    assert diff < 1e-5, stdout
    assert "to push: huggingface_hub.HfApi().upload_folder(" in stdout
    tuned = zoo.load(str(save))
    assert tuned.output_shape == (None, 2)
    assert list(tuned.zoo_labels) == ["cat", "sky"]


@pytest.mark.slow
@pytest.mark.parametrize("parallel,model,spec", [
    ("data", "ViT-Ti/16", "P(None, None)"),
    ("model", "ViT-S/16", "P(None, 'model')"),
])
def test_finetune_fit_example_on_two_jax_devices(tmp_path, parallel, model,
                                                spec):
    """examples/finetune_fit.py on JAX: model.fit under keras.distribution
    on two JAX CPU devices; model parallel splits the MLP kernel on its
    output."""
    stdout = run_example(
        "finetune_fit.py", "--data", colour_folders(tmp_path / "data"),
        "--out", tmp_path / "tuned.keras",
        "--model", model, "--weights", "none", "--image-size", "32",
        "--batch-size", "8", "--steps", "2", "--parallel", parallel,
        KERAS_BACKEND="jax",
        XLA_FLAGS=two_jax_cpu_devices_flags())
    kind = "DataParallel" if parallel == "data" else "ModelParallel"
    assert f"distribution: {kind} over 2 devices" in stdout, stdout
    assert f"mlp kernel layout: {spec}" in stdout, stdout
    loss = float(re.search(r"final loss: ([0-9.naninf]+)", stdout).group(1))
    assert np.isfinite(loss) and 0 < loss < 10


@pytest.mark.slow
def test_export_for_deployment_example(tmp_path):
    """examples/export_for_deployment.py on a local random checkpoint: the
    three artifacts are written and each runs in its own runtime with the
    top-1 of Keras."""
    path = vit_ti_checkpoint(tmp_path / "ti.npz", grid=2, seed=4)
    out = tmp_path / "exported"
    stdout = run_example("export_for_deployment.py", "--model", "ViT-Ti/16",
                         "--weights", path, "--out", out)
    assert (out / "vit_saved_model" / "saved_model.pb").is_file()
    assert (out / "vit.onnx").is_file() and (out / "vit_int8.tflite").is_file()
    for name in ("saved_model", "onnx", "tflite_int8"):
        line = next(x for x in stdout.splitlines()
                    if x.startswith(name + ":"))
        diff = float(re.search(r"max \|logit diff\| ([0-9.e+-]+)", line)
                     .group(1))
        bound = 1.0 if name == "tflite_int8" else 1e-3
        assert diff < bound, line
        if name != "tflite_int8":  # int8 may swap a random model's near-ties
            assert "top-1 as Keras on 100% of 2 photos" in line, line
        top5 = json.loads(re.search(r"top-5 classes (\[.*\])", line)
                          .group(1))
        assert len(set(top5)) == 5 and all(0 <= c < 1000 for c in top5)
