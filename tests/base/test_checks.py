"""keras_vit.base.checks, the one set of argument checks: its helpers'
own contract, and KERAS_BACKEND refused in one line (a misspelt backend, a
backend that is not installed) before Keras fails with a traceback."""

import numpy as np
import pytest

from keras_vit.base import checks
from keras_vit import train as kt


def test_the_checks_share_one_helper():
    # One place for argument checks (keras_vit.base.checks): the helpers' own
    # contract.
    assert checks.closest("vitb16", ["ViT-B/16", "ViT-B/32"]) == ["ViT-B/16"]
    assert checks.check_choice("x", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"x must be one of \('a', 'b'\); "
                                         r"received x=\['a'\]\.$"):
        checks.check_choice("x", ["a"], ("a", "b"))
    assert checks.check_int("n", np.int64(3), low=1) == 3
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match=f"received n={bad!r}"):
            checks.check_int("n", bad, low=1)
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="must be a number in"):
            checks.check_number("p", bad, low=0, high=1)
    with pytest.raises(kt.StrategyError):
        checks.check_choice("strategy", "x", ("auto",),
                            error=kt.StrategyError)


def test_an_unknown_keras_backend_is_one_line():
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jaxx")
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "list"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("keras-vit: error: KERAS_BACKEND must be one "
                               "of ('tensorflow', 'jax', 'torch'")
    assert "received KERAS_BACKEND='jaxx'. Did you mean 'jax'?" in lines[0]


def test_a_keras_backend_that_is_not_installed_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    # Keras' openvino backend, with the package hidden from the child
    # whether or not it is installed here (the `openvino` extra installs it).
    hidden = tmp_path / "hidden" / "openvino"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'openvino'\", "
        "name='openvino')\n")
    env = dict(os.environ, KERAS_BACKEND="openvino", PYTHONPATH=os.pathsep.join(
        [str(hidden.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # `list` needs no Keras (the command starts without it) and works.
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "list"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ViT-B/16" in proc.stdout, proc.stderr
    # A command that needs Keras says which module is missing.
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "demo",
                           "--quick", "--out", str(tmp_path / "demo")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("importing Keras (backend 'openvino', KERAS_BACKEND) needs the "
            "package 'openvino', which is not installed") in lines[0]
