"""Export to ONNX through tf2onnx, verified with onnxruntime.

Large models convert in a child process (see ``_onnx_worker.py`` for why
and for the measurements): ViT-B/16 peaked at 15.3 GiB with a plain
``tf2onnx.convert.from_function`` and peaks at 2.9 GiB this way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from keras_vit.errors import require
from keras_vit.export import _onnx_worker as worker
from keras_vit.export import common
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph

# tf2onnx 1.17 writes opsets up to 18; onnxruntime 1.31 runs up to 23.
# 17 is the first with LayerNormalization and runs on onnxruntime >= 1.11.
DEFAULT_OPSET = 17
MIN_OPSET = 13
# Models with more weights than this convert in a child process; smaller
# ones convert in this process, where tf2onnx's overhead is negligible and
# the child's start-up (importing TensorFlow again) would dominate.
ISOLATE_ABOVE_BYTES = 64 * 2**20


def max_opset():
    """The newest opset tf2onnx can write (and onnx knows)."""
    onnx = require("onnx", purpose="ONNX export")
    constants = require("tf2onnx.constants", purpose="ONNX export")

    return min(max(constants.OPSET_TO_IR_VERSION),
               onnx.defs.onnx_opset_version())


def open_artifact(path, num_threads=None):
    """Loads an ``.onnx`` file (external data beside it) with onnxruntime
    on the CPU and returns ``images -> {name: array}``."""
    ort = require("onnxruntime", purpose="running ONNX files")

    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    session = ort.InferenceSession(path, options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]

    def run(images):
        return dict(zip(names, session.run(None, {name: images})))

    return run


def _check_opset(opset):
    if opset is None:
        return DEFAULT_OPSET
    top = max_opset()
    if (not isinstance(opset, int) or isinstance(opset, bool)
            or not MIN_OPSET <= opset <= top):
        raise ValueError(f"opset must be an integer from {MIN_OPSET} to {top}"
                         f" (tf2onnx's newest); received opset={opset!r}")
    return opset


def _convert_here(graph, path, opset, external_data):
    """Converts in this process (small models)."""
    tf2onnx = require("tf2onnx", purpose="ONNX export")

    spec = graph.input_spec()
    proto, _ = tf2onnx.convert.from_function(
        graph.function(), input_signature=[spec], opset=opset)
    worker.name_batch_dimension(proto)
    worker.guard_zero_pad_before_max_pool(proto)
    files, total, external = worker.write_model(proto, None, path,
                                                external_data)
    return {"files": [os.path.basename(f) for f in files],
            "tensor_bytes": total, "external_data": external}


def _convert_in_child(saved_model_dir, path, opset, external_data, stage,
                      rss):
    """Converts in a child process; returns the worker's result."""
    job = {"saved_model": saved_model_dir, "output": path, "opset": opset,
           "external_data": external_data,
           "result": stage.file("worker_result.json")}
    job_path = stage.file("worker_job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ)
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    log_path = stage.file("worker.log")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, worker.__file__, job_path], env=env,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            # wait4, not wait: it also returns the child's peak memory.
            _, status, usage = os.wait4(child.pid, 0)
        except BaseException:
            child.kill()
            child.wait()
            raise
        child.returncode = os.waitstatus_to_exitcode(status)
    rss.add_child(usage.ru_maxrss * 1024)
    if child.returncode != 0:
        with open(log_path, "rb") as f:
            tail = f.read()[-3000:].decode("utf-8", "replace")
        raise common.ExportError(
            f"tf2onnx failed (converter process exit status "
            f"{child.returncode}); its last output:\n{tail}")
    with open(job["result"]) as f:
        return json.load(f)


def to_onnx(model, path, *, opset=None, external_data=None,
            uint8_input=False, outputs=("logits", "probabilities"),
            verify=True, batch_sizes=(4, 1), tolerance=None,
            verify_data="noise", cast_to_float32=True, overwrite=True,
            isolate="auto"):
    """Exports ``model`` to an ``.onnx`` file and verifies it with
    onnxruntime.

    The graph takes ``images`` (batch dimension ``"batch"``, dynamic) and
    returns the named ``outputs``.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy).
        path: the file to write; must end with ``.onnx``.
        opset: ONNX opset, 13 to 18 (default 17).
        external_data: store the weights in ``path + ".data"`` (None: only
            when they exceed the 2 GiB protobuf limit, e.g. ViT-H/14).
        uint8_input: take uint8 pixels and scale them inside.
        outputs: output names (see :class:`~keras_vit.export.graph.
            ServingGraph`).
        verify: run and compare the artifact.
        batch_sizes: batch sizes to run it at.
        tolerance: overrides of the format's tolerance.
        verify_data: ``"noise"``, ``"photos"`` or an array of images.
        cast_to_float32: export bf16/fp16 models as a float32 copy.
        overwrite: replace existing files.
        isolate: convert in a child process: True, False, or ``"auto"``
            (when the weights exceed 64 MiB; much lower peak memory, see the
            module docstring).

    Returns:
        The report (also written to ``path + ".report.json"``).

    Example:

    >>> import tempfile, os, keras_vit
    >>> from keras_vit.export import to_onnx
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> out = os.path.join(tempfile.mkdtemp(), "vit.onnx")
    >>> report = to_onnx(model, out, external_data=True)
    >>> report["files"]
    ['vit.onnx', 'vit.onnx.data']
    """
    dest = common.check_path(path, "onnx")
    # Before any work: the conversion may run in a child process, whose
    # ImportError would arrive as a worker failure, not as this one line.
    for module in ("tf2onnx", "onnx", "onnxruntime"):
        require(module, purpose="ONNX export")
    opset = _check_opset(opset)
    if external_data not in (None, True, False):
        raise ValueError("external_data must be None (automatic), True or "
                         f"False; received external_data={external_data!r}")
    if isolate not in ("auto", True, False):
        raise ValueError("isolate must be 'auto', True or False; received "
                         f"isolate={isolate!r}")
    tol = common.tolerance_for("onnx", tolerance)
    checks.check_options(batch_sizes, verify_data)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32)
    if isolate == "auto":
        isolate = graph.weights_bytes() > ISOLATE_ABOVE_BYTES
    options = {"opset": opset, "uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs),
               "cast_to_float32": bool(cast_to_float32),
               "converter_process": "child" if isolate else "this process"}
    times = {}
    name = os.path.basename(dest)
    with common.Staging(dest, overwrite=overwrite) as stage, \
            common.PeakRSS() as rss:
        staged = stage.file(name)
        with common.timer(times, "conversion_seconds"):
            if isolate:
                saved_model_dir = stage.file("saved_model")
                graph.save(saved_model_dir)
                result = _convert_in_child(saved_model_dir, staged, opset,
                                           external_data, stage, rss)
            else:
                result = _convert_here(graph, staged, opset, external_data)
        options["external_data"] = result["external_data"]
        files = [stage.file(f) for f in result["files"]]
        checked = None
        if verify:
            checked = checks.verify(graph, open_artifact, staged,
                                    batch_sizes, tol, data=verify_data)
            times["verification_seconds"] = checked.pop(
                "verification_seconds")
        report = checks.assemble_report("onnx", dest, files, graph, options,
                                        checked, times, rss)
        if checked is not None:
            checks.raise_if_failed(checked, f"the ONNX file {dest!r}",
                                   report)
        report_name = name + common.REPORT_SUFFIX
        common.write_json(stage.file(report_name), report)
        moves = [(os.path.basename(f), os.path.join(os.path.dirname(dest),
                                                    os.path.basename(f)))
                 for f in files if f != staged]
        # Without external data now, a data file beside an older export at
        # this path is stale.
        stale = [] if moves else [dest + ".data"]
        stage.commit_files(moves + [(report_name, dest + common.REPORT_SUFFIX),
                                    (name, dest)], stale=stale)
    return report
