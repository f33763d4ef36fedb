"""Every Keras class the package registers can be found by Keras after
``import keras_vit`` alone: a ``.keras`` file a training run wrote names
its schedule and loss (``keras_vit>SoftTargetCrossentropy`` in a DeiT
fine-tune's ``model.keras`` was not found before), and
``keras.saving.load_model`` must load it compiled."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# MPP's training wrapper (keras_vit/train/mpp/model.py) registers when
# keras_vit.train.mpp is imported (its trainer, or zoo.load of an MPP run):
# importing it inside `import keras` would import keras_vit.layers half
# loaded when keras_vit.layers is the first import.
NOT_AT_IMPORT = ("train/mpp/",)


def _registered_classes():
    """The classes of the package decorated with Keras' registration."""
    found = []
    for path in sorted((ROOT / "keras_vit").rglob("*.py")):
        if any(part in path.as_posix() for part in NOT_AT_IMPORT):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    "register_keras_serializable" in ast.unparse(d)
                    for d in node.decorator_list):
                found.append(node.name)
    return found


def test_import_keras_vit_registers_every_class_it_defines():
    names = _registered_classes()
    assert {"VisionTransformer", "WarmupDecay", "SoftTargetCrossentropy",
            "BinaryMixedTargets"} <= set(names), names
    # A fresh process, as a user's: nothing imported but keras and the
    # package's front door.
    code = (
        "import json, sys, keras, keras_vit\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps([n for n in names if keras.saving."
        "get_registered_object('keras_vit>' + n) is None]))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(names)],
                         capture_output=True, text=True, timeout=300,
                         check=True).stdout
    missing = json.loads(out.strip().splitlines()[-1])
    assert not missing, f"not registered after import keras_vit: {missing}"


@pytest.mark.parametrize("first", [
    "import keras_vit.layers", "import keras_vit; keras_vit.layers.gelu",
    "import keras_vit.train.mixing"])
def test_any_module_can_be_imported_first(first):
    """Registration runs inside the first `import keras`; whichever module
    of the package starts it, the import completes (a registration that
    imported a module reading keras_vit.layers at its top made
    `import keras_vit.layers` fail half loaded)."""
    # On jax, which imports in a few seconds where TensorFlow takes ten:
    # the cycle is the package's, whatever the backend.
    env = dict(os.environ, KERAS_BACKEND="jax")
    proc = subprocess.run([sys.executable, "-c", first], timeout=300,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
