"""A new user's first run: the README's install command in a fresh venv, a
quiet command line (no TensorFlow C++ log lines), and a demo whose exit
status says whether every stage worked."""

import os
import re
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from keras_vit import cli, demo

ROOT = Path(__file__).resolve().parents[1]
TF_LOG = re.compile(r"^[IWEF]\d{4} |I0000|E0000|cuInit|absl::InitializeLog",
                    re.M)


def _readme_install_command():
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^(pip install -e \.) && keras-vit demo", text, re.M)
    assert match, "the README's first command is no longer pip install -e ."
    return match.group(1).split()


def test_cli_prints_no_tensorflow_log_lines():
    env = dict(os.environ, KERAS_VIT_OFFLINE="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell has it
    for argv in (["keras-vit", "info", "ViT-Ti/16"],
                 [sys.executable, "-m", "keras_vit.cli", "list", "R50"]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "ViT" in proc.stdout
        assert not TF_LOG.search(proc.stderr), proc.stderr
        assert not TF_LOG.search(proc.stdout), proc.stdout


def test_stderr_filter_drops_only_tensorflow_lines():
    """The filter keeps every other byte, progress bars' partial lines too,
    in order."""
    code = (
        "import os, sys\n"
        "from keras_vit import quiet\n"
        "quiet.filter_stderr()\n"
        "os.write(2, b'WARNING: All log messages before absl::InitializeLog()"
        " is called are written to STDERR\\n')\n"
        "os.write(2, b'I0000 00:00:1795411190.888766   13412 port.cc:153] "
        "oneDNN custom operations are on.\\nkeep 1\\n')\n"
        "os.write(2, b'\\r 10%|#    |')\n"
        "os.write(2, b'\\r100%|#####|\\n')\n"
        "os.write(2, b'E0000 00:00:1795411190.9   13412 cuda_executor.cc:1] "
        "failed call to cuInit\\n')\n"
        "print('Error: keep 2', file=sys.stderr)\n"
        "sys.stderr.write('Tail without newline')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=120, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (b"keep 1\n\r 10%|#    |\r100%|#####|\n"
                           b"Error: keep 2\nTail without newline")


def test_demo_fails_when_a_stage_fails(monkeypatch, capsys):
    def run(**kwargs):
        return {"export": {"status": "failed: tflite, onnx"}}

    monkeypatch.setattr(demo, "run", run)
    assert cli.main(["demo", "--quick"]) == 1
    assert capsys.readouterr().err.strip() == (
        "keras-vit: error: demo stage export failed: tflite, onnx")
    for status in ("ok", "skipped"):  # --quick skips the export stage
        monkeypatch.setattr(demo, "run",
                            lambda status=status, **kw: {"export": {"status": status}})
        assert cli.main(["demo", "--quick"]) == 0


def _pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_readme_install_in_a_fresh_venv(tmp_path):
    """``pip install -e .`` in a venv that sees nothing of this one (no
    ``--system-site-packages``, no ``[dev]`` extra) installs every runtime
    package: the command, TFDS, tf2onnx, onnxruntime, onnx and LiteRT
    import. Packages come from pip's cache when they are in it."""
    if not _pypi_reachable():
        pytest.skip("PyPI (pypi.org:443) is unreachable: the install "
                    "needs it")
    command = _readme_install_command()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"],
                           capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if cache and os.path.isdir(cache):
        env["PIP_CACHE_DIR"] = cache
    # --no-compile: pip would otherwise byte-compile every module of
    # TensorFlow and its company, tens of thousands of files;
    # Python compiles what the checks below import, on first import.
    install = subprocess.run(
        [str(py), "-m", *command, "-q", "--disable-pip-version-check",
         "--no-compile"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert install.returncode == 0, install.stderr[-3000:]

    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(["keras-vit", "--help"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo" in proc.stdout and not TF_LOG.search(proc.stderr)
    code = ("import tf2onnx, onnxruntime, onnx, tensorflow_datasets, "
            "ai_edge_litert.interpreter, keras_vit\n"
            "print(keras_vit.__file__)")
    proc = subprocess.run([str(py), "-c", code], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(ROOT / "keras_vit" / "__init__.py")


# --------------------------------------------------------------------------
# A missing optional package: one line naming it and the pip command.


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("fmt,module,package", [
    ("onnx", "tf2onnx", "tf2onnx"), ("onnx", "onnxruntime", "onnxruntime"),
    ("tflite", "ai_edge_litert", "ai-edge-litert")])
def test_export_without_its_package_is_one_line_exit_2(
        tmp_path, monkeypatch, capsys, fmt, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # import raises
    monkeypatch.delitem(sys.modules, f"{module}.interpreter", raising=False)
    out = tmp_path / f"m.{fmt}"
    assert cli.main(["export", "ViT-Ti/16", "--weights", "none",
                     "--image-size", "32", "--format", fmt,
                     "--output", str(out)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("keras-vit: error: ")
    assert f"package '{package}', which is not installed: pip install " \
           f"'{package}'" in line
    assert not out.exists()


def test_missing_packages_anywhere_name_the_pip_package(monkeypatch, capsys):
    from keras_vit.errors import MissingDependencyError
    from keras_vit.train import data

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(MissingDependencyError, match="'tensorflow-datasets'"):
        data.import_tfds()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "keras_vit.analysis.plots",
                        raising=False)
    with pytest.raises(MissingDependencyError,
                       match=r"pip install 'matplotlib'"):
        import keras_vit.analysis.plots  # noqa: F401

    # Where no require() stands in the way, the command line still gives
    # the one line: a ModuleNotFoundError for a known optional package.
    def fails(args):
        import skimage.data  # noqa: F401

    monkeypatch.setitem(sys.modules, "skimage", None)
    parser = cli.build_parser()
    args = parser.parse_args(["list"])
    monkeypatch.setattr(args, "func", fails, raising=False)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["list"]) == 2
    assert _one_error_line(capsys) == (
        "keras-vit: error: keras_vit needs the package 'scikit-image', which "
        "is not installed: pip install 'scikit-image'")
