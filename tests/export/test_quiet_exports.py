"""``keras-vit export`` prints what the user needs and nothing of
TensorFlow's: no C++ log line (``I0000 ... port.cc``, ``E0000 ... oneDNN
supports DT_UINT8 only on platforms with AVX-512``, which TensorFlow prints
even on an AVX-512 CPU), no converter chatter (``fully_quantize: 0,
inference_type: 6, ...``), no TensorFlow warning relabelled as the
package's. Each format runs as the real command, in a fresh process with
the user's environment (no ``TF_CPP_MIN_LOG_LEVEL``), on a tiny model; the
converter processes the package starts are checked with a stand-in child.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from testkit import tiny as _tiny

from keras_vit.base import environment
from keras_vit.export import common, memory, pipeline

# What must not reach a user's terminal.
NOISE = [
    re.compile(r"^[IWEF]\d{4} "),                      # absl/glog lines
    re.compile(r"^WARNING: All log messages before absl::InitializeLog"),
    re.compile(r"cpu_feature_guard|cudart_stub|port\.cc|cuda_platform"),
    re.compile(r"oneDNN supports DT_UINT8"),
    re.compile(r"fully_quantize:|inference_type:"),   # the TFLite converter
    re.compile(r"XNNPACK delegate"),                   # LiteRT's first run
    re.compile(r"tf\.lite\.Interpreter is deprecated"),
    re.compile(r"^keras-vit: warning: .*(tensorflow|keras)", re.I),
]


def _noise(text):
    return [line for line in text.splitlines()
            if any(p.search(line) for p in NOISE)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    _tiny(seed=3, num_classes=3).save(path)
    return str(path)


def _export(model_file, output, *options):
    """``keras-vit export MODEL -o OUTPUT OPTIONS`` as a new user runs it:
    their environment without TF_CPP_MIN_LOG_LEVEL (the tests set it)."""
    env = {k: v for k, v in os.environ.items()
           if k != environment.TF_LOG_LEVEL}
    env["KERAS_VIT_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "keras_vit.cli", "export", model_file,
         "-o", str(output), *options],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _report(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_tflite_int8_export_prints_no_converter_or_tensorflow_lines(
        model_file, tmp_path):
    """Full int8 runs TFLite's calibration (which prints from C++) and the
    quantization debugger (which warns that tf.lite.Interpreter is
    deprecated); the file is run with LiteRT (which logs its XNNPACK
    delegate)."""
    out = tmp_path / "m.tflite"
    proc = _export(model_file, out, "-f", "tflite", "-q", "int8")
    assert _noise(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    assert f"Wrote {out}" in proc.stdout + proc.stderr
    report = _report(str(out) + common.REPORT_SUFFIX)
    assert report["verified"] is True
    assert report["options"]["quantization"] == "int8"


@pytest.mark.slow
def test_saved_model_image_bytes_export_prints_no_onednn_uint8_line(
        model_file, tmp_path):
    """The image_bytes signature turns photos by their EXIF orientation
    with a uint8 transpose, for which TensorFlow logs "oneDNN supports
    DT_UINT8 only on platforms with AVX-512" whatever the CPU has; its
    verification runs that graph in the command's process."""
    out = tmp_path / "sm"
    proc = _export(model_file, out, "-f", "saved_model",
                   "--input", "image_bytes", "--top-k", "2")
    assert _noise(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    assert _report(out / "export_report.json")["verified"] is True


@pytest.mark.slow
def test_onnx_export_prints_no_tensorflow_lines(model_file, tmp_path):
    out = tmp_path / "m.onnx"
    proc = _export(model_file, out, "-f", "onnx")
    assert _noise(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    assert _report(str(out) + common.REPORT_SUFFIX)["verified"] is True


# --------------------------------------------------------------------------
# the converter processes (a stand-in child: what TensorFlow prints there)

_CHILD = r"""
import os, sys
sys.stderr.write(
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n"
    "I0000 00:00:1795690873.760887    7315 port.cc:153] oneDNN custom "
    "operations are on.\n")
print("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", ""))
print("the converter ran out of patience", flush=True)
sys.stderr.write(
    "E0000 00:00:1795690886.949431    7315 util.cc:131] oneDNN supports "
    "DT_UINT8 only on platforms with AVX-512. Falling back to the default "
    "Eigen-based implementation if present.\n")
sys.stderr.flush()
os._exit(3)
"""


def _crash_child(monkeypatch, tmp_path):
    monkeypatch.setattr(pipeline, "child_command", lambda module, job: [
        sys.executable, "-c", _CHILD, job])
    with pytest.raises(common.ExportError) as e:
        pipeline.run_child("x", {}, str(tmp_path), memory.PeakRSS(),
                           what="the child")
    return str(e.value)


def test_a_converter_process_is_quiet_and_its_failure_shows_no_tf_lines(
        monkeypatch, tmp_path):
    """A converter process gets the command's TensorFlow log level when the
    user set none; the last output a failure quotes leaves TensorFlow's
    C++ lines out."""
    monkeypatch.delenv(environment.TF_LOG_LEVEL, raising=False)
    message = _crash_child(monkeypatch, tmp_path)
    assert message == (
        "the child exited with status 3; nothing was written; its last "
        f"output: TF_CPP_MIN_LOG_LEVEL={environment.QUIET_TF_LOG_LEVEL} | "
        "the converter ran out of patience")


@pytest.mark.parametrize("level", ["1", "0"])
def test_a_converter_process_keeps_the_users_log_level(monkeypatch, tmp_path,
                                                       level):
    """The user's TF_CPP_MIN_LOG_LEVEL reaches the child unchanged; with 0
    (TensorFlow's logs wanted) the failure quotes them too."""
    monkeypatch.setenv(environment.TF_LOG_LEVEL, level)
    message = _crash_child(monkeypatch, tmp_path)
    assert f"TF_CPP_MIN_LOG_LEVEL={level} |" in message
    assert ("oneDNN supports DT_UINT8" in message) == (level == "0")


# --------------------------------------------------------------------------
# what a converter prints from C++ in this process (the TFLite converter)


def test_a_converters_output_is_shown_only_when_it_fails(capfd):
    from keras_vit.runtime import quiet

    with quiet.captured_output():
        os.write(2, b"fully_quantize: 0, inference_type: 6\n")
        os.write(1, b"converter chatter\n")
    assert capfd.readouterr() == ("", "")
    os.write(1, b"after\n")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"
    with pytest.raises(RuntimeError, match="^op FOO failed$"):
        with quiet.captured_output():
            os.write(2, b"error: 'tfl.foo' op is neither a custom op nor "
                        b"a flex op\n")
            raise RuntimeError("op FOO failed")
    assert capfd.readouterr().err == (
        "error: 'tfl.foo' op is neither a custom op nor a flex op\n")
