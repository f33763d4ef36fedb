"""The package on every Keras backend, checked from child processes.

Keras picks its backend once per process, so what crosses backends (a
``.keras`` file saved under one and loaded under another) or must hold from
a clean start (TensorFlow never imported under jax or torch) runs in fresh
interpreters with KERAS_BACKEND set; TensorFlow's side of a crossing runs in
this process, whose backend it is.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import quick_xla_flags

OTHER = ("jax", "torch")
ALL = ("tensorflow",) + OTHER


def run_on(backend, script, *args, timeout=300):
    """Runs ``script`` under KERAS_BACKEND=backend; returns its stdout."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if backend == "jax":
        # Tiny models: compiling them is most of a JAX child's time.
        env["XLA_FLAGS"] = quick_xla_flags(env.get("XLA_FLAGS", ""))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{backend} child failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc.stdout


NO_TF = """
import json, sys
import numpy as np
import keras, keras_vit
from keras_vit import analysis, zoo
from keras_vit.models.features import feature_model

# (No keras.utils.set_random_seed: Keras' own seeding imports TensorFlow.)
kw = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
          num_heads=4, mlp_dim=64, num_classes=5)
path = sys.argv[1]
zoo.save_npz(keras_vit.vit(**kw), path)
model = keras_vit.vit(**kw)
zoo.load_weights(model, path)
x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
logits = model.predict(x, verbose=0)
maps = analysis.attention_maps(model, x)
features = feature_model(model).predict(x, verbose=0)
sim = analysis.position_embedding_similarity(model)
print(json.dumps({
    "backend": keras.backend.backend(),
    "tensorflow": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")[:5],
    "logits": list(logits.shape), "maps": list(maps.shape),
    "rows": float(maps.sum(-1).mean()), "features": list(features.shape),
    "sim": list(np.shape(sim))}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", OTHER)
def test_models_zoo_analysis_never_import_tensorflow(backend, tmp_path):
    out = json.loads(run_on(backend, NO_TF, tmp_path / "w.npz")
                     .strip().splitlines()[-1])
    assert out["backend"] == backend
    assert out["tensorflow"] == [], out["tensorflow"]
    assert out["logits"] == [3, 5]
    assert out["maps"] == [3, 2, 4, 17, 17]
    assert out["rows"] == pytest.approx(1.0, abs=1e-5)
    assert out["features"][0] == 3


# Saves a model as STEM.keras (and its logits as STEM.npy) with seed SEED,
# then loads every further STEM.keras, saving its logits as
# STEM.<backend>.npy. Run in a child per backend, and in this process for
# TensorFlow (the suite's own backend).
SAVE_LOAD = """
import sys
import numpy as np
import keras
import keras_vit  # registers the package's classes for deserialisation

args = globals().get("ARGS") or sys.argv[1:]
x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
if args[0] != "-":
    keras.utils.set_random_seed(int(args[1]))
    model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                          num_layers=2, num_heads=4, mlp_dim=64,
                          num_classes=5, classifier="gap")
    # Non-zero head so that the logits say something about every weight.
    model.get_layer("head").kernel.assign(
        np.random.default_rng(1).normal(size=(32, 5)).astype("float32"))
    model.save(args[0] + ".keras")
    np.save(args[0] + ".npy", model.predict(x, verbose=0))
for stem in args[2:]:
    model = keras.saving.load_model(stem + ".keras")
    np.save(stem + "." + keras.backend.backend() + ".npy",
            model.predict(x, verbose=0))
"""


def _save_load_here(*args):
    import keras
    assert keras.backend.backend() == "tensorflow"
    exec(textwrap.dedent(SAVE_LOAD), {"ARGS": [str(a) for a in args]})


@pytest.mark.slow
def test_keras_file_saved_on_each_backend_loads_on_the_others(tmp_path):
    # Three children, not six: each saves its own file and loads those
    # already written; TensorFlow runs here, first and last.
    stems = {b: str(tmp_path / b) for b in ALL}
    _save_load_here(stems["tensorflow"], 0)
    run_on("jax", SAVE_LOAD, stems["jax"], 1, stems["tensorflow"])
    run_on("torch", SAVE_LOAD, stems["torch"], 2, stems["tensorflow"],
           stems["jax"])
    run_on("jax", SAVE_LOAD, "-", "-", stems["torch"])
    _save_load_here("-", "-", stems["jax"], stems["torch"])
    for saved in ALL:
        want = np.load(stems[saved] + ".npy")
        assert np.abs(want).max() > 1e-2  # the head is not the zero init
        for loaded in ALL:
            if loaded != saved:
                got = np.load(f"{stems[saved]}.{loaded}.npy")
                np.testing.assert_allclose(
                    got, want, rtol=1e-5, atol=1e-5,
                    err_msg=f"saved on {saved}, loaded on {loaded}")


CLI = """
import contextlib, io, json, os, sys
import numpy as np
from PIL import Image
import keras_vit
from keras_vit import cli

folder = sys.argv[1]
model = keras_vit.vit(image_size=32, patch_size=8, hidden_size=32,
                      num_layers=2, num_heads=4, mlp_dim=64, num_classes=5)
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
print(json.dumps({"predict_rc": predict_rc, "inspect_rc": inspect_rc,
                  "predict": json.loads(out.getvalue())}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", OTHER)
def test_cli_predict_and_inspect(backend, tmp_path):
    out = json.loads(run_on(backend, CLI, tmp_path).strip().splitlines()[-1])
    assert out["predict_rc"] == 0 and out["inspect_rc"] == 0
    top = out["predict"]["predictions"][0]["top"]
    assert len(top) == 5 and sorted(t["index"] for t in top) == list(range(5))
    pngs = [f for f in os.listdir(tmp_path / "report") if f.endswith(".png")]
    assert len(pngs) >= 3, pngs
