"""A new user's first run: a quiet command line (no TensorFlow C++ log
lines), a demo whose exit status says whether every stage worked, and a
missing optional package named in one line. The README's install in a
fresh venv, and every journey of the docs on it, are in
tests/journeys/test_readme_and_guides.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from keras_vit import cli
from keras_vit.cli import demo

ROOT = Path(__file__).resolve().parents[2]
TF_LOG = re.compile(r"^[IWEF]\d{4} |I0000|E0000|cuInit|absl::InitializeLog",
                    re.M)


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


def test_a_python_user_hides_tensorflow_start_up_lines_with_one_call():
    """The README's switch for a script: the same script prints TensorFlow's
    start-up lines without the call (so the check can fail) and none with
    it, while the script's own stderr still gets through."""
    script = (
        "import sys, keras_vit\n"
        "if sys.argv[1] == 'hide':\n"
        "    keras_vit.hide_tensorflow_logs()\n"
        "keras_vit.vit(image_size=16, patch_size=8, hidden_size=8, "
        "num_layers=1, num_heads=1, mlp_dim=8, num_classes=2)\n"
        "print('mine', file=sys.stderr)\n")
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell has it
    runs = {mode: subprocess.run([sys.executable, "-c", script, mode],
                                 capture_output=True, text=True, env=env,
                                 timeout=300, cwd=ROOT)
            for mode in ("show", "hide")}
    for proc in runs.values():
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stderr.rstrip().endswith("mine"), proc.stderr
    assert TF_LOG.search(runs["show"].stderr), runs["show"].stderr
    assert not TF_LOG.search(runs["hide"].stderr), runs["hide"].stderr


def test_stderr_filter_drops_only_tensorflow_lines():
    """The filter keeps every other byte, progress bars' partial lines too,
    in order."""
    code = (
        "import os, sys\n"
        "from keras_vit.runtime import quiet\n"
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
    from keras_vit.base.errors import MissingDependencyError
    from keras_vit.train.data.tfds_source import import_tfds

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(MissingDependencyError, match="'tensorflow-datasets'"):
        import_tfds()
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
