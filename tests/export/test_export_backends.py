"""Export from a JAX or PyTorch session (tests marked `backends` run on all
three backends).

Off TensorFlow the conversion runs in a TensorFlow child process from the
model saved as ``.keras``; the artifact is compared with the model's
outputs on the user's own backend. Each test here runs the artifact again
itself, at a batch size the exporter did not use, against the model on
this backend. The child-process machinery (errors, kills, time limit) is
tested on TensorFlow with a stand-in child, in seconds.
"""

import json
import os
import sys
import time

import numpy as np
import pytest
import onnxruntime as ort
import ai_edge_litert.interpreter as litert

import keras  # noqa: E402
from conftest import tiny_builder_kwargs  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.models.memory import infer  # noqa: E402
from keras_vit.export import pipeline  # noqa: E402

SECOND_BATCH = 3  # not one of the exporter's (4, 1)
NAMES = {"saved_model": "m", "tflite": "m.tflite", "onnx": "m.onnx"}


@pytest.fixture(scope="module")
def tiny():
    """A one-block ViT of 16 pixels (four patches): what crosses to the
    converter process and back does not depend on the model's size, and
    each export's TensorFlow child converts it in less time than the
    suite's two-block tiny ViT."""
    keras.utils.set_random_seed(7)
    model = keras_vit.models.vit(**dict(
        tiny_builder_kwargs(num_classes=5, grid=2), num_layers=1,
        hidden_size=16, num_heads=2, mlp_dim=32))
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.1, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _images(model, n, seed=5):
    shape = (n,) + tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(
        "float32")


def _run_artifact(fmt, path, x):
    """The artifact's logits, run here in its own runtime."""
    if fmt == "onnx":
        session = ort.InferenceSession(path,
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, {"images": x})))["logits"]
    if fmt == "tflite":
        runner = litert.Interpreter(model_path=path).get_signature_runner(
            "serving_default")
        return runner(images=x)["logits"]
    import tensorflow as tf  # a SavedModel's runtime
    loaded = tf.saved_model.load(path)
    return loaded.signatures["serving_default"](
        images=tf.constant(x))["logits"].numpy()


@pytest.mark.backends
@pytest.mark.parametrize("fmt", sorted(NAMES))
def test_every_format_from_this_backend(tiny, tmp_path, fmt):
    path = str(tmp_path / NAMES[fmt])
    report = export.export(tiny, path, format=fmt)
    assert report["verified"] is True
    assert report["keras_backend"] == keras.backend.backend()
    assert report["batch_sizes"] == [4, 1]
    assert max(report["max_abs_diff"].values()) < 1e-4
    assert export.read_report(path)["created"] == report["created"]
    # Only the artifact and its report: the .keras file, the job and the
    # converter's scratch files stayed in the staging directory.
    expected = ["m"] if fmt == "saved_model" else [NAMES[fmt],
                                                   NAMES[fmt] + ".report.json"]
    assert sorted(os.listdir(tmp_path)) == expected
    if keras.backend.backend() != "tensorflow":
        assert report["peak_rss_mb_converter_process"] > 0
        if fmt == "onnx":
            assert report["options"]["converter_process"] == "child"

    x = _images(tiny, SECOND_BATCH)
    np.testing.assert_allclose(_run_artifact(fmt, path, x), infer(tiny, x),
                               atol=1e-4)


# TFLite only: its calibration runs in the converter process. An ONNX
# int8 export converts the same float32 file there as the float32 export
# above, then calibrates and quantizes in this process with onnxruntime,
# the same on every backend (test_export.py's ONNX precision tests); its
# quantized artifact checked against this backend's logits is the
# command line's dynamic_int8 export below.
@pytest.mark.backends
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tflite"])
def test_int8_from_this_backend(tiny, tmp_path, fmt):
    """Calibration images travel to the converter process; the report has
    what it has on TensorFlow."""
    path = str(tmp_path / NAMES[fmt])
    data = _images(tiny, 8, seed=3)
    report = export.export(tiny, path, format=fmt, quantization="int8",
                           representative_data=data,
                           tolerance={"top1_agreement": 0.6})
    options = report["options"]
    assert options["representative_data"] == (
        "8 images from representative_data")
    assert "int8" in options["op_dtypes"]["FULLY_CONNECTED"]
    assert options["op_dtypes"]["SOFTMAX"] == ["float32"]
    x = _images(tiny, SECOND_BATCH)
    got, want = _run_artifact(fmt, path, x), infer(tiny, x)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert rel < 0.5


# --------------------------------------------------------------------------
# the child process: errors, kills and the time limit (a stand-in child)

_CHILD = """
import json, os, signal, sys, time
job = json.load(open(sys.argv[1]))
how = os.environ["FAKE_CHILD"]
if how == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "hangs":
    open(job["result"] + ".pid", "w").write(str(os.getpid()))
    time.sleep(120)
if how.startswith("raises "):
    kind = how.split()[1]
    print("Traceback (most recent call last):\\n  ... a long traceback")
    json.dump({"error": {"type": kind, "message": "bad\\nthing"}},
              open(job["result"], "w"))
    sys.exit(1)
sys.exit(3)
"""


@pytest.fixture
def fake_child(monkeypatch):
    """Every export converts in a stand-in child process whose behaviour
    the FAKE_CHILD environment variable picks."""
    monkeypatch.setattr(pipeline, "tensorflow_here", lambda: False)
    monkeypatch.setattr(pipeline, "child_command", lambda module, job: [
        sys.executable, "-c", _CHILD, job])

    def behave(how):
        monkeypatch.setenv("FAKE_CHILD", how)

    return behave


@pytest.mark.parametrize("how,error,match", [
    ("killed", export.ExportError,
     r"^the TensorFlow converter process was killed by SIGKILL \(out of "
     r"memory\?\); nothing was written$"),
    ("exits", export.ExportError,
     r"^the TensorFlow converter process exited with status 3; nothing "
     r"was written$"),
    ("raises RuntimeError", export.ExportError,
     r"^the TensorFlow converter process failed: RuntimeError: bad thing$"),
    ("raises ValueError", ValueError, r"^bad thing$"),
])
def test_a_failed_child_is_one_error_and_leaves_the_old_artifact(
        tiny, tmp_path, fake_child, how, error, match):
    path = str(tmp_path / "m.tflite")
    with open(path, "wb") as f:
        f.write(b"an older export")
    fake_child(how)
    with pytest.raises(error, match=match):
        export.to_tflite(tiny, path)
    assert sorted(os.listdir(tmp_path)) == ["m.tflite"]
    with open(path, "rb") as f:
        assert f.read() == b"an older export"


def test_a_hanging_child_is_stopped_at_the_time_limit(
        tiny, tmp_path, fake_child, monkeypatch):
    fake_child("hangs")
    monkeypatch.setenv(pipeline.TIMEOUT_ENV, "2")
    pids = []
    real_stop = pipeline._stop

    def stop(child):
        pids.append(child.pid)
        real_stop(child)

    monkeypatch.setattr(pipeline, "_stop", stop)
    start = time.monotonic()
    with pytest.raises(export.ExportError,
                       match=r"did not finish within 2 s and was stopped "
                             r"\(KERAS_VIT_EXPORT_TIMEOUT"):
        export.to_onnx(tiny, str(tmp_path / "m.onnx"))
    assert time.monotonic() - start < 30
    assert os.listdir(tmp_path) == []
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(pids[0], 0)


def test_bad_time_limit_is_refused(tiny, tmp_path, fake_child, monkeypatch):
    fake_child("exits")
    monkeypatch.setenv(pipeline.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"KERAS_VIT_EXPORT_TIMEOUT must be "
                                         r"a positive number.*'soon'"):
        export.to_onnx(tiny, str(tmp_path / "m.onnx"))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_model_the_converter_cannot_rebuild(tmp_path, monkeypatch):
    """A custom layer that is not registered cannot be loaded in the
    TensorFlow process: one error that says so, nothing written."""
    monkeypatch.setattr(pipeline, "tensorflow_here", lambda: False)

    class Doubler(keras.layers.Layer):  # defined here: not importable
        def call(self, x):
            return x * 2.0

    inputs = keras.Input((8, 8, 3))
    x = Doubler()(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(x))
    with pytest.raises(export.ExportError,
                       match=r"converter process failed: RuntimeError: the "
                             r"model could not be rebuilt under TensorFlow.*"
                             r"register_keras_serializable") as e:
        export.to_onnx(model, str(tmp_path / "m.onnx"))
    assert "Traceback" not in str(e.value)
    assert os.listdir(tmp_path) == []


def test_job_and_result_are_json(tmp_path, monkeypatch):
    """What crosses to the converter process is JSON and an .npz read
    without pickle."""
    from keras_vit.export import memory

    rss = memory.PeakRSS()
    code = ("import json, sys; job = json.load(open(sys.argv[1])); "
            "json.dump({'echo': job['value']}, open(job['result'], 'w'))")
    monkeypatch.setattr(pipeline, "child_command", lambda module, job: [
        sys.executable, "-c", code, job])
    result = pipeline.run_child("x", {"value": [1, "two"]}, str(tmp_path),
                                rss, what="the child")
    assert result == {"echo": [1, "two"]}
    assert json.load(open(tmp_path / "x.job.json"))["value"] == [1, "two"]


def test_a_converter_peak_is_the_childs_own_not_its_parents(
        tmp_path, monkeypatch):
    """A memory figure: the converter process's peak in an export's report
    is what that process used. On Linux the ru_maxrss that wait4 returns
    for a child starts at its parent's RSS, so a parent holding 768 MiB (a
    loaded model) made a 35 MiB child report 768 MiB."""
    from keras_vit.export import memory

    ballast = np.ones(768 * 2**20 // 8)  # resident: every page written
    assert memory.current_rss() > 768 * 2**20
    rss = memory.PeakRSS()
    code = ("import json, sys; from keras_vit.export import memory; "
            "job = json.load(open(sys.argv[1])); ballast = bytearray(2**26); "
            "json.dump(memory.worker_peaks(memory.PeakRSS()), "
            "open(job['result'], 'w'))")
    monkeypatch.setattr(pipeline, "child_command", lambda module, job: [
        sys.executable, "-c", code, job])
    pipeline.run_child("x", {}, str(tmp_path), rss, what="the child")
    # The child's interpreter and its 64 MiB bytearray, not the parent's.
    assert 64 * 2**20 < rss.child_peak < 400 * 2**20, rss.child_peak
    del ballast


@pytest.mark.backends
def test_benchmark_runs_the_model_on_this_backend(tiny):
    from keras_vit.export import benchmark

    result = benchmark.run(tiny, runtimes=("keras", "xla"),
                           batch_sizes=(2,), runs=1, bf16=False)
    rows = {r["runtime"] for r in result["rows"]}
    if keras.backend.backend() == "torch":
        assert rows == {"keras"}
        assert result["skipped"] == [
            "xla: the torch backend does not compile with XLA"]
    else:
        assert rows == {"keras", "xla"}
    assert all(r["images_per_s"] > 0 for r in result["rows"])


@pytest.mark.backends
@pytest.mark.slow
def test_cli_export_from_this_backend(tiny, tmp_path, capsys):
    import argparse

    from keras_vit.cli import export as export_cli

    keras_file = str(tmp_path / "tiny.keras")
    tiny.save(keras_file)
    parser = argparse.ArgumentParser(prog="keras-vit")
    export_cli.register(parser.add_subparsers(dest="command", required=True))
    out = str(tmp_path / "tiny.onnx")
    args = parser.parse_args(["export", keras_file, "-f", "onnx", "-q",
                              "dynamic_int8", "-o", out])
    assert args.func(args) == 0
    assert "| onnx | dynamic_int8 | tiny.onnx |" in capsys.readouterr().out
    report = export.read_report(out)
    assert report["keras_backend"] == keras.backend.backend()
    assert report["verified"] and report["top1_agreement"] >= 0.9


@pytest.mark.parametrize("name", [
    "keras_vit.export.memory", "keras_vit.export.samples",
    "keras_vit.export.staging", "keras_vit.export.pipeline",
    "keras_vit.export.verify"])
def test_docstring_examples(name):
    import doctest
    import importlib

    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no example"
