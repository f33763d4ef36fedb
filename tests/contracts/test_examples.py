"""The scripts in examples/ run (on local random checkpoints).

The scripts that run on one backend share a Python process: a small
driver (``DRIVER``) runs each in turn as ``python SCRIPT ARGS`` would, as
``__main__`` with its ``sys.argv``, its stdout captured and its exit
status kept, and resets Keras's global state (``clear_session``: the
layer names, the dtype policy, the JAX distribution) between them. What
they show does not depend on the model's size, so the fine-tuning and
export runs take a one-block ViT saved as ``.keras`` (a source every
script's ``--model`` / ``--source`` takes, as it takes a zoo name): the
cost of a run is then its imports and its tracing, not twelve blocks.
The fine-tuning run on two logical CPUs goes first in the TensorFlow
process: the logical devices are fixed before the first tensor exists
(the scripts after it run on one device, the default strategy, either
way).
"""

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
EXAMPLES = ROOT / "examples"

# A one-block ViT at 32x32 (a 2x2 patch grid): 32 wide with 2 heads and an
# MLP of 64, so that a model axis of two divides every split dimension.
TINY = dict(patch=16, hidden=32, layers=1, heads=2, mlp=64)


def vit_ti_checkpoint(path, grid, seed):
    """A random official ViT-Ti/16 checkpoint with a 1000-class head, for a
    (16 * grid)-pixel input."""
    return official.write(path, official.vit_arrays(
        patch=16, hidden=192, layers=12, heads=3, mlp=768, grid=grid,
        num_classes=1000, seed=seed))


def tiny_model(folder, num_classes, seed, **options):
    """The TINY ViT with the random weights of an official-layout
    checkpoint (written to ``folder``), head included: a zero head would
    make every class a tie."""
    import keras_vit
    from keras_vit import zoo

    checkpoint = official.write(
        Path(folder) / f"tiny_{num_classes}_{seed}.npz",
        official.vit_arrays(grid=2, num_classes=num_classes, seed=seed,
                            **TINY))
    model = keras_vit.vit(
        image_size=32, patch_size=TINY["patch"], hidden_size=TINY["hidden"],
        num_layers=TINY["layers"], num_heads=TINY["heads"],
        mlp_dim=TINY["mlp"], num_classes=num_classes, **options)
    zoo.load_weights(model, checkpoint)
    return model


def tiny_keras_file(path, num_classes, seed):
    """``path``: the tiny model saved as ``.keras``."""
    tiny_model(path.parent, num_classes, seed).save(path)
    return path


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


def _env(**extra):
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)


# Runs scripts one after the other in this process, each as `python SCRIPT
# ARGS` runs it; writes {name: {status, stdout, error, cpu}} after each
# (cpu: its CPU seconds, imports included for the first).
DRIVER = """\
import contextlib, io, json, runpy, sys, time, traceback
jobs_path, results_path = sys.argv[1:3]
with open(jobs_path) as f:
    jobs = json.load(f)
results = {}
for job in jobs:
    print(f"--- {job['name']}", file=sys.stderr, flush=True)
    keras = sys.modules.get("keras")
    if keras is not None:
        keras.backend.clear_session()
    out, status, error = io.StringIO(), 0, ""
    cpu = time.process_time()
    sys.argv = [job["script"], *job["args"]]
    sys.path[0] = job["folder"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(job["script"], run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        status, error = 1, traceback.format_exc()
    results[job["name"]] = {"status": status, "stdout": out.getvalue(),
                            "error": error,
                            "cpu": round(time.process_time() - cpu, 1)}
    with open(results_path, "w") as f:
        json.dump(results, f)
"""


def run_examples(tmp, jobs, **env):
    """Runs ``jobs`` (``{name: (script, args)}``) in one process (DRIVER);
    returns ``{name: result}``, a job the process did not finish failed
    with the process's stderr."""
    results = tmp / "results.json"
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps([
        {"name": name, "script": str(EXAMPLES / script),
         "folder": str(EXAMPLES), "args": [str(a) for a in args]}
        for name, (script, args) in jobs.items()]))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(spec), str(results)],
        capture_output=True, text=True, timeout=900, env=_env(**env),
        cwd=tmp)
    got = json.loads(results.read_text()) if results.exists() else {}
    for name in jobs:
        got.setdefault(name, {"status": None, "stdout": "", "error": (
            f"the driver exited with {proc.returncode} before it ended")})
        got[name]["stderr"] = proc.stderr
    return got


def example_stdout(results, name):
    """The stdout of the job ``name`` (exit status 0 asserted)."""
    result = results[name]
    # This job's part of the shared stderr: from its marker to the next.
    stderr = result["stderr"]
    start = stderr.find(f"--- {name}\n")
    end = stderr.find("\n--- ", start + 1) if start >= 0 else -1
    stderr = stderr[max(start, 0):end if end >= 0 else None]
    assert result["status"] == 0, (
        f"exit status {result['status']}\n{result['error']}\n"
        f"--- stderr ---\n{stderr[-3000:]}")
    return result["stdout"]


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def tf_examples(tmp_path_factory):
    """The TensorFlow examples, run in one process: ``(results, folder)``."""
    from keras_vit import zoo

    tmp = tmp_path_factory.mktemp("examples")
    # First, before any tensor exists: it splits the CPU in two logical
    # devices (--cpu-devices 2). The architecture of a .keras file,
    # randomly initialised (--weights none), with a new head for the
    # folder's two classes, saved in a folder that does not exist yet.
    jobs = {"mirrored": ("finetune_fit.py", [
        "--data", colour_folders(tmp / "colours"),
        "--model", tiny_keras_file(tmp / "tiny.keras", 5, seed=5),
        "--weights", "none", "--image-size", "32", "--batch-size", "8",
        "--steps", "3", "--strategy", "mirrored", "--cpu-devices", "2",
        "--out", tmp / "runs" / "tuned"])}
    if _has("skimage"):
        jobs["classify"] = ("classify_image.py", [
            "--model", "ViT-Ti/16", "--image-size", "64", "--weights",
            vit_ti_checkpoint(tmp / "ti_2.npz", grid=2, seed=1)])
        if _has("matplotlib"):
            jobs["inspect"] = ("inspect_attention.py", [
                "--model", "ViT-Ti/16", "--out", tmp / "rollout.png",
                "--weights", vit_ti_checkpoint(tmp / "ti_4.npz", grid=4,
                                               seed=2)])
    # A local timm repository (the Hub is out of reach here), timm's GELU.
    zoo.save_pretrained(tiny_model(tmp, 5, seed=3, gelu="exact"),
                        tmp / "source")
    data = colour_folders(tmp / "pets", (("cat", (200, 120, 30)),
                                         ("sky", (30, 90, 220))))
    for layout in ("timm", "transformers"):
        jobs[f"hub {layout}"] = ("hub_finetune_push.py", [
            "--source", tmp / "source", "--data", data, "--steps", "2",
            "--batch-size", "8", "--save", tmp / f"tuned_{layout}",
            "--layout", layout])
    jobs["export"] = ("export_for_deployment.py", [
        "--model", tiny_keras_file(tmp / "random_1000.keras", 1000, seed=4),
        "--out", tmp / "exported"])
    return run_examples(tmp, jobs, MPLBACKEND="Agg"), tmp


@pytest.mark.slow
def test_classify_image_example(tf_examples):
    results, _ = tf_examples
    lines = example_stdout(results, "classify").strip().splitlines()
    assert lines[0].startswith("ViT-Ti/16 at 64x64")
    assert len(lines) == 6 and all("%" in line for line in lines[1:])
    probs = [float(line.split("%")[0]) for line in lines[1:]]
    assert probs == sorted(probs, reverse=True)


@pytest.mark.slow
def test_inspect_attention_example(tf_examples):
    """examples/inspect_attention.py on the astronaut with a local random
    checkpoint: the figure is written, the rollout map covers the patch
    grid, and five classes with probabilities are printed."""
    results, tmp = tf_examples
    stdout = example_stdout(results, "inspect")
    lines = stdout.strip().splitlines()
    probs = [float(line.split("%")[0]) for line in lines[:5]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 100.01
    grid = re.search(r"map: (\d+)x(\d+) patches, sum ([0-9.]+)", stdout)
    assert grid and grid.group(1) == grid.group(2) == "4", stdout
    assert 0 < float(grid.group(3)) <= 1.0  # the patch tokens' share
    from PIL import Image
    with Image.open(tmp / "rollout.png") as figure:
        assert figure.size[0] > figure.size[1] > 100  # three panels side by side


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["timm", "transformers"])
def test_hub_finetune_push_example(tf_examples, layout):
    """examples/hub_finetune_push.py from a local timm repository (the Hub
    is out of reach here): fine-tunes a new head, saves in the layout, and
    the saved folder reloads with the same logits; the upload is shown."""
    from keras_vit import zoo

    results, tmp = tf_examples
    stdout = example_stdout(results, f"hub {layout}")
    diff = float(re.search(r"max \|logit diff\| ([0-9.e+-]+)",
                           stdout).group(1))
    assert diff < 1e-5, stdout
    assert "to push: huggingface_hub.HfApi().upload_folder(" in stdout
    tuned = zoo.load(str(tmp / f"tuned_{layout}"))
    assert tuned.output_shape == (None, 2)
    assert list(tuned.zoo_labels) == ["cat", "sky"]


@pytest.mark.slow
def test_export_for_deployment_example(tf_examples):
    """examples/export_for_deployment.py on a local random model with a
    1000-class head (ImageNet's names): the three artifacts are written
    and each runs in its own runtime with the top-1 of Keras."""
    results, tmp = tf_examples
    stdout = example_stdout(results, "export")
    out = tmp / "exported"
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


@pytest.mark.slow
def test_finetune_fit_example_on_two_logical_cpus(tf_examples):
    """examples/finetune_fit.py: model.fit under MirroredStrategy over two
    logical CPU devices fine-tunes and saves a model that reloads."""
    results, tmp = tf_examples
    stdout = example_stdout(results, "mirrored")
    out = tmp / "runs" / "tuned" / "model.keras"
    assert "replicas: 2" in stdout, stdout
    assert f"saved: {out}" in stdout, stdout
    loss = float(re.search(r"final loss: ([0-9.naninf]+)", stdout).group(1))
    assert np.isfinite(loss) and 0 < loss < 10, loss
    import keras
    # The model and layer classes, and the schedule and loss the compiled
    # model saved with it (importing their modules registers them).

    model = keras.saving.load_model(out)
    assert model.output_shape == (None, 2)
    # The head trained away from its zero initialisation.
    assert np.abs(model.get_layer("head").get_weights()[0]).max() > 0


@pytest.fixture(scope="module")
def jax_fits(tmp_path_factory):
    """examples/finetune_fit.py on JAX with two CPU devices, data and model
    parallel, in one process: ``{parallel: result}``."""
    tmp = tmp_path_factory.mktemp("jax_fits")
    data = colour_folders(tmp / "data")
    model = tiny_keras_file(tmp / "tiny.keras", 5, seed=6)
    jobs = {parallel: ("finetune_fit.py", [
        "--data", data, "--out", tmp / f"tuned_{parallel}.keras",
        "--model", model, "--weights", "none", "--image-size", "32",
        "--batch-size", "8", "--steps", "2", "--parallel", parallel])
        for parallel in ("data", "model")}
    return run_examples(tmp, jobs, KERAS_BACKEND="jax",
                        XLA_FLAGS=two_jax_cpu_devices_flags())


@pytest.mark.slow
@pytest.mark.parametrize("parallel,spec", [
    ("data", "P(None, None)"),
    ("model", "P(None, 'model')"),
])
def test_finetune_fit_example_on_two_jax_devices(jax_fits, parallel, spec):
    """examples/finetune_fit.py on JAX: model.fit under keras.distribution
    on two JAX CPU devices; model parallel splits the MLP kernel on its
    output."""
    stdout = example_stdout(jax_fits, parallel)
    kind = "DataParallel" if parallel == "data" else "ModelParallel"
    assert f"distribution: {kind} over 2 devices" in stdout, stdout
    assert f"mlp kernel layout: {spec}" in stdout, stdout
    loss = float(re.search(r"final loss: ([0-9.naninf]+)", stdout).group(1))
    assert np.isfinite(loss) and 0 < loss < 10
