"""The README's install, ``pip install -e .``, in a fresh venv that sees
nothing of this environment: built once per test run and shared by the
tests that run on it, the doc journeys
(tests/journeys/test_readme_and_guides.py) and the full demo
(tests/cli/test_demo.py: the README's first line is ``pip install -e . &&
keras-vit demo``).

The install is the costliest set-up of the suite (a minute of CPU: pip
resolves and unpacks TensorFlow and its company), so it is made once:
under pytest-xdist the workers share the run's base temporary folder, the
first to ask builds the venv there under a file lock, and the others wait
for it and reuse it (or its failure, reported again). Packages come from
pip's cache when they are in it.
"""

import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_install_command():
    """The README's install line, as ``["pip", "install", "-e", "."]``."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^(pip install -e \.) && keras-vit demo", text, re.M)
    assert match, "the README's first command is no longer pip install -e ."
    return match.group(1).split()


def pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def clean_env(**extra):
    """This process's environment without what would leak this
    environment (or a test's settings) into another Python: PYTHONPATH,
    VIRTUAL_ENV, KERAS_BACKEND, KERAS_VIT_* and HF_*; plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KERAS_BACKEND")
           and not k.startswith(("KERAS_VIT_", "HF_"))}
    env.update(extra)
    return env


def venv_env(python, **extra):
    """``clean_env`` for the processes of the fresh venv at ``python``,
    which keep the bytecode of what they import, as in a user's venv: the
    install skips byte-compiling (``--no-compile``), so without it each
    process (this environment may set PYTHONDONTWRITEBYTECODE) compiles
    TensorFlow's modules again, seconds of CPU every time. The ``.pyc``
    files go to a folder of the venv (PYTHONPYCACHEPREFIX), not next to
    the sources: the editable install imports this checkout."""
    env = clean_env(**extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(Path(python).parent.parent / "pycache")
    return env


def _shared_root(tmp_path_factory):
    """The run's base temporary folder, the same for every xdist worker."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def readme_venv(tmp_path_factory):
    """The python of the README's install in a fresh venv, built by the
    first caller of this test run; None when PyPI is unreachable (the
    install needs it). A failed install fails every caller with pip's
    message, without a second try."""
    root = _shared_root(tmp_path_factory)
    folder = root / "readme_venv"
    state = folder / "state.json"
    with open(root / "readme_venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not state.exists():
            folder.mkdir(exist_ok=True)
            state.write_text(json.dumps(_build(folder / "venv")))
    built = json.loads(state.read_text())
    if built["status"] == "unreachable":
        return None
    assert built["status"] == "ok", built["error"]
    return Path(built["python"])


def _build(env_dir):
    if not pypi_reachable():
        return {"status": "unreachable"}
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"],
                           capture_output=True, text=True).stdout.strip()
    env = clean_env()
    if cache and os.path.isdir(cache):
        env["PIP_CACHE_DIR"] = cache
    # --no-compile: pip would otherwise byte-compile every module of
    # TensorFlow and its company, tens of thousands of files;
    # Python compiles what the tests import, on first import.
    install = subprocess.run(
        [str(python), "-m", *readme_install_command(), "-q",
         "--disable-pip-version-check", "--no-compile"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    if install.returncode != 0:
        return {"status": "failed", "error": install.stderr[-3000:]}
    return {"status": "ok", "python": str(python)}
