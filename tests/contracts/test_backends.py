"""The package on every Keras backend, checked from child processes.

Keras picks its backend once per process, so what crosses backends (a
``.keras`` file saved under one and loaded under another) or must hold from
a clean start (TensorFlow never imported under jax or torch) runs in fresh
interpreters with KERAS_BACKEND set; TensorFlow's side of a crossing runs in
this process, whose backend it is.

Starting a backend costs a child several CPU-seconds, so one child per
backend runs all of that backend's steps, the clean-start check first (the
later steps import TensorFlow: ``keras.utils.set_random_seed``); each step
is caught on its own and reports a JSON line, which the test of that step
reads (:func:`crossings`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import quick_xla_flags
from testkit import wait_until

OTHER = ("jax", "torch")
ALL = ("tensorflow",) + OTHER

# The steps, as functions of the child's script; TensorFlow's save_load
# runs from the same text in this process.
STEPS = '''
import contextlib, io, json, os, sys, traceback
import numpy as np


def no_tensorflow(path):
    """A tiny ViT saved and loaded (zoo), run, its attention maps, features
    and position-embedding similarity (analysis): the shapes, and the
    TensorFlow modules loaded by then (none on jax or torch)."""
    import keras, keras_vit
    from keras_vit import analysis, zoo
    from keras_vit.models.features import feature_model

    # (No keras.utils.set_random_seed: Keras' own seeding imports
    # TensorFlow.)
    kw = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
              num_heads=4, mlp_dim=64, num_classes=5)
    zoo.save_npz(keras_vit.vit(**kw), path)
    model = keras_vit.vit(**kw)
    zoo.load_weights(model, path)
    x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype(
        "float32")
    logits = model.predict(x, verbose=0)
    maps = analysis.attention_maps(model, x)
    features = feature_model(model).predict(x, verbose=0)
    sim = analysis.position_embedding_similarity(model)
    return {
        "backend": keras.backend.backend(),
        "tensorflow": sorted(m for m in sys.modules
                             if m.split(".")[0] == "tensorflow")[:5],
        "logits": list(logits.shape), "maps": list(maps.shape),
        "rows": float(maps.sum(-1).mean()), "features": list(features.shape),
        "sim": list(np.shape(sim))}


def save_load(stem, seed, loads):
    """Saves a model made with ``seed`` as STEM.keras and its logits as
    STEM.npy (no stem: nothing saved), then loads each STEM.keras of
    ``loads``, saving its logits as STEM.<backend>.npy."""
    import keras
    import keras_vit  # registers the package's classes for deserialisation

    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(
        "float32")
    if stem is not None:
        keras.utils.set_random_seed(seed)
        model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                              num_layers=2, num_heads=4, mlp_dim=64,
                              num_classes=5, classifier="gap")
        # Non-zero head so that the logits say something about every weight.
        model.get_layer("head").kernel.assign(
            np.random.default_rng(1).normal(size=(32, 5)).astype("float32"))
        model.save(stem + ".keras")
        np.save(stem + ".npy", model.predict(x, verbose=0))
    for other in loads:
        model = keras.saving.load_model(other + ".keras")
        np.save(other + "." + keras.backend.backend() + ".npy",
                model.predict(x, verbose=0))


def cli_predict_and_inspect(folder):
    """``keras-vit predict --json`` and ``inspect`` on a tiny .keras file:
    their exit codes and what predict printed."""
    from PIL import Image
    import keras_vit
    from keras_vit import cli

    os.makedirs(folder)
    model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                          num_layers=2, num_heads=4, mlp_dim=64,
                          num_classes=5)
    model.get_layer("head").kernel.assign(
        np.random.default_rng(1).normal(size=(32, 5)).astype("float32"))
    path = os.path.join(folder, "tiny.keras")
    model.save(path)
    image = os.path.join(folder, "img.png")
    Image.fromarray(np.random.default_rng(0).integers(
        0, 256, (40, 30, 3), "uint8")).save(image)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        predict_rc = cli.main(["predict", path, image, "--json"])
    inspect_rc = cli.main(["inspect", path, image, "--out",
                           os.path.join(folder, "report")])
    return {"predict_rc": predict_rc, "inspect_rc": inspect_rc,
            "predict": json.loads(out.getvalue())}
'''

# The child: the steps of argv[1] (a JSON list of [name, *args]) in turn,
# each reported on a line "STEP {json}" with its result or, where it
# raised, its traceback. The step ["wait", path] creates path, then reads
# a line of further steps from stdin (what the child runs once another
# child has written the files they need).
CHILD = STEPS + '''

def run(steps):
    for name, *args in steps:
        if name == "wait":
            open(args[0], "w").close()
            run(json.loads(sys.stdin.readline()))
            continue
        try:
            outcome = {"result": globals()[name](*args)}
        except Exception:
            outcome = {"error": traceback.format_exc()}
        print("STEP " + json.dumps(dict(outcome, step=name)), flush=True)


run(json.loads(sys.argv[1]))
'''


def start_on(backend, steps, folder):
    """Starts the child running ``steps`` under KERAS_BACKEND=backend, its
    stdout and stderr in folder/BACKEND.out and .err; returns its Popen."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if backend == "jax":
        # Tiny models: compiling them is most of a JAX child's time.
        env["XLA_FLAGS"] = quick_xla_flags(env.get("XLA_FLAGS", ""))
    with open(folder / f"{backend}.out", "w") as out, \
            open(folder / f"{backend}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(steps)], env=env,
            stdin=subprocess.PIPE, stdout=out, stderr=err, text=True)


def finish(proc, backend, folder, more=None, timeout=300):
    """Sends the waiting child ``more`` steps (none: closes its stdin),
    waits for it and returns {step: [outcome, ...]}, with the child's exit
    code and stderr's tail under "child"."""
    try:
        proc.communicate(None if more is None else json.dumps(more) + "\n",
                         timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    outcomes = {"child": (f"{backend} child: exit code {proc.returncode}\n"
                          + (folder / f"{backend}.err").read_text()[-4000:])}
    for line in (folder / f"{backend}.out").read_text().splitlines():
        if line.startswith("STEP "):
            outcome = json.loads(line[5:])
            outcomes.setdefault(outcome.pop("step"), []).append(outcome)
    return outcomes


def here(stem, seed, loads):
    """TensorFlow's save_load, in this process: {"save_load": [outcome]}."""
    import traceback

    import keras
    assert keras.backend.backend() == "tensorflow"
    steps = {}
    exec(STEPS, steps)
    try:
        steps["save_load"](stem, seed, loads)
        return {"save_load": [{"result": None}]}
    except Exception:
        return {"save_load": [{"error": traceback.format_exc()}]}


@pytest.fixture(scope="module")
def crossings(tmp_path_factory):
    """Every step of every backend, run once for the module's tests:
    ``(folder, {backend: {step: [outcome, ...]}})``.

    A .keras file crosses both ways between each two backends with one
    child per backend: TensorFlow saves here; the jax child saves and loads
    TensorFlow's, then waits; the torch child saves and loads TensorFlow's
    and jax's; the jax child, given the go, loads torch's; TensorFlow loads
    jax's and torch's here."""
    folder = tmp_path_factory.mktemp("backends")
    stem = {b: str(folder / b) for b in ALL}
    ran = {"tensorflow": here(stem["tensorflow"], 0, [])}
    waiting = folder / "jax.waiting"
    jax = start_on("jax", [
        ["no_tensorflow", str(folder / "jax.npz")],
        ["save_load", stem["jax"], 1, [stem["tensorflow"]]],
        ["cli_predict_and_inspect", str(folder / "jax-cli")],
        ["wait", str(waiting)]], folder)
    try:
        wait_until(lambda: waiting.exists() or jax.poll() is not None,
                   seconds=300, poll=0.1)
        ran["torch"] = finish(start_on("torch", [
            ["no_tensorflow", str(folder / "torch.npz")],
            ["save_load", stem["torch"], 2,
             [stem["tensorflow"], stem["jax"]]],
            ["cli_predict_and_inspect", str(folder / "torch-cli")]], folder),
            "torch", folder)
        ran["jax"] = finish(jax, "jax", folder,
                            more=[["save_load", None, None, [stem["torch"]]]])
    finally:
        if jax.poll() is None:
            jax.kill()
            jax.wait(timeout=30)
    tf_loads = here(None, None, [stem["jax"], stem["torch"]])
    ran["tensorflow"]["save_load"] += tf_loads["save_load"]
    return folder, ran


def results(ran, backend, step, count=1):
    """The ``count`` results of ``step`` on ``backend``; fails with the
    step's traceback, or the child's stderr where the step never ran."""
    outcomes = ran[backend].get(step, [])
    assert len(outcomes) == count, (
        f"{step} ran {len(outcomes)} of {count} times on {backend}; "
        + ran[backend].get("child", ""))
    for outcome in outcomes:
        assert "error" not in outcome, (
            f"{step} on {backend}:\n{outcome['error']}")
    return [outcome["result"] for outcome in outcomes]


@pytest.mark.slow
@pytest.mark.parametrize("backend", OTHER)
def test_models_zoo_analysis_never_import_tensorflow(backend, crossings):
    out, = results(crossings[1], backend, "no_tensorflow")
    assert out["backend"] == backend
    assert out["tensorflow"] == [], out["tensorflow"]
    assert out["logits"] == [3, 5]
    assert out["maps"] == [3, 2, 4, 17, 17]
    assert out["rows"] == pytest.approx(1.0, abs=1e-5)
    assert out["features"][0] == 3


@pytest.mark.slow
def test_keras_file_saved_on_each_backend_loads_on_the_others(crossings):
    folder, ran = crossings
    # TensorFlow and torch save_load once each, jax twice (save and load
    # TensorFlow's, then load torch's once it exists).
    for backend, count in (("tensorflow", 2), ("jax", 2), ("torch", 1)):
        results(ran, backend, "save_load", count)
    for saved in ALL:
        want = np.load(folder / f"{saved}.npy")
        assert np.abs(want).max() > 1e-2  # the head is not the zero init
        for loaded in ALL:
            if loaded != saved:
                got = np.load(folder / f"{saved}.{loaded}.npy")
                np.testing.assert_allclose(
                    got, want, rtol=1e-5, atol=1e-5,
                    err_msg=f"saved on {saved}, loaded on {loaded}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", OTHER)
def test_cli_predict_and_inspect(backend, crossings):
    folder, ran = crossings
    out, = results(ran, backend, "cli_predict_and_inspect")
    assert out["predict_rc"] == 0 and out["inspect_rc"] == 0
    top = out["predict"]["predictions"][0]["top"]
    assert len(top) == 5 and sorted(t["index"] for t in top) == list(range(5))
    report = folder / f"{backend}-cli" / "report"
    pngs = [f for f in os.listdir(report) if f.endswith(".png")]
    assert len(pngs) >= 3, pngs
