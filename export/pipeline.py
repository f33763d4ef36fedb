"""The one exporter skeleton: stage under a temporary name, convert, run
the artifact in its runtime, compare it with Keras, move it into place and
write the report.

The format modules describe the export as an :class:`ExportJob` and pass
it to :func:`run` with themselves
(:class:`keras_vit.export.formats.FormatModule`).

Under JAX or PyTorch the model goes to a ``.keras`` file and ``convert``
runs in a child process with ``KERAS_BACKEND=tensorflow``
(``python -m keras_vit.export._tf_worker``); the reference outputs are
still computed on the user's backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import numpy as np

from keras_vit.base import atomic
from keras_vit.base import environment
from keras_vit.runtime import quiet
from keras_vit.runtime.backend import is_tensorflow
from keras_vit.export import common, labels, memory, staging
from keras_vit.export import verify as checks

TIMEOUT_ENV = "KERAS_VIT_EXPORT_TIMEOUT"
TF_WORKER = "keras_vit.export._tf_worker"


@dataclasses.dataclass
class ExportJob:
    """One export, as a format module describes it to :func:`run`."""

    format: str            # a name from common.FORMATS
    what: str              # "the TFLite file", for messages
    dest: str              # the checked, absolute destination
    graph: object          # the ServingGraph
    tolerance: dict
    options: dict          # the report's "options"
    params: dict = dataclasses.field(default_factory=dict)  # for convert()
    arrays: dict = dataclasses.field(default_factory=dict)  # for convert()
    notes: list = dataclasses.field(default_factory=list)
    verify: bool = True
    batch_sizes: tuple = (4, 1)
    verify_data: object = "noise"
    samples: int | None = None
    seed: int = 0
    overwrite: bool = True
    side_files: tuple = ()  # files beside an artifact, e.g. ONNX ".data"

    @property
    def directory(self):
        return self.format == "saved_model"


def tensorflow_here():
    """Whether this process runs Keras on TensorFlow (else conversions run
    in a TensorFlow child process)."""
    return is_tensorflow()


def run(job, module):
    """Runs ``job`` with the steps of its format's ``module`` (a
    :class:`~keras_vit.export.formats.FormatModule`); returns the report."""
    timeout_seconds()  # checked before any work
    times = {}
    with staging.Staging(job.dest, directory=job.directory,
                        overwrite=job.overwrite) as stage, \
            memory.PeakRSS() as rss:
        # Named as the file it becomes (a link's target may have another
        # name; ONNX records its data file's name inside the model).
        name = "saved_model" if job.directory else os.path.basename(
            stage.target)
        staged = stage.file(name)
        open_runtime = module.open_artifact
        with common.timer(times, "conversion_seconds"):
            if tensorflow_here():
                result = module.convert(job.graph, staged, stage.path,
                                        job.params, job.arrays, rss)
            else:
                result, open_runtime = _convert_in_tensorflow(
                    job, staged, stage.path, rss, open_runtime,
                    module.RUNTIME_NEEDS_TENSORFLOW)
            result = module.finish(staged, stage.path, job.params,
                                   job.arrays, result)
            rss.add_child(result.pop("child_peak_rss", 0))
            # Before verification: the file checked is the file kept.
            job.options["label_names"] = labels.record(
                job.format, staged, job.graph, job.notes)
            sizes = job.graph.image_sizes()
            if sizes is not None:
                job.options["image_sizes"] = {
                    **sizes.to_json(),
                    "where": labels.record_image_sizes(job.format, staged,
                                                       sizes)}
        job.options.update(result.get("options", {}))
        files = [stage.file(f) for f in result["files"]]
        checked = None
        if job.verify:
            try:
                checked = checks.verify(
                    job.graph, open_runtime, staged, job.batch_sizes,
                    job.tolerance, data=job.verify_data,
                    samples=job.samples, seed=job.seed)
            except checks.ArtifactDidNotRun as e:
                raise common.ExportError(
                    f"{job.what} {job.dest!r}: the converted file did not "
                    f"run in its runtime ({e}); nothing was written") from e
            times["verification_seconds"] = checked.pop(
                "verification_seconds")
        report = checks.assemble_report(job.format, job.dest, files,
                                        job.graph, job.options, checked,
                                        times, rss, job.notes)
        if checked is not None:
            checks.raise_if_failed(
                checked, f"{job.what} {job.dest!r}", report,
                remedy=common.remedy(job.format, job.options))
        if job.directory:
            common.write_json(os.path.join(staged, common.SAVED_MODEL_REPORT),
                              report)
            stage.commit_dir(name)
            return report
        report_name = name + common.REPORT_SUFFIX
        common.write_json(stage.file(report_name), report)
        # Beside what a symbolic link points at (ONNX finds its ".data"
        # file there).
        target = stage.target
        folder = os.path.dirname(target)
        moves = [(os.path.basename(f), os.path.join(folder,
                                                    os.path.basename(f)))
                 for f in files if f != staged]
        # A side file of an older export at this path that this export
        # does not write would pair with the wrong artifact.
        written = {final for _, final in moves}
        stale = [target + s for s in job.side_files
                 if target + s not in written]
        stage.commit_files(moves + [(report_name,
                                     target + common.REPORT_SUFFIX),
                                    (name, target)], stale=stale)
    return report


def timeout_seconds():
    """The time limit of a converter process: ``$KERAS_VIT_EXPORT_TIMEOUT``
    seconds (:mod:`keras_vit.base.environment`), default 3600.

    >>> timeout_seconds() > 0
    True
    """
    return environment.read(TIMEOUT_ENV)


def child_command(module, job_path):
    """The command line of a converter process: ``python -m module``.

    >>> child_command("keras_vit.export._tf_worker", "job.json")[1:]
    ['-m', 'keras_vit.export._tf_worker', 'job.json']
    """
    return [sys.executable, "-m", module, job_path]


def _tail(path, lines=3, limit=600):
    """The last ``lines`` non-blank lines of a converter's log, joined
    with `` | ``, without TensorFlow's C++ start-up lines unless the user
    asked for them (``TF_CPP_MIN_LOG_LEVEL=0``)."""
    try:
        with open(path, "rb") as f:
            text = f.read()[-20000:].decode("utf-8", "replace")
    except OSError:
        return ""
    if quiet.tf_logs_hidden():
        text = quiet.without_tf_logs(text)
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-limit:]


def run_child(module, job, workdir, rss, what, env=None):
    """Runs ``python -m module JOB.json`` and returns its result.

    A ValueError in the child is raised here as a ValueError with the
    same message; any other failure, a crash, a kill or a run past
    :func:`timeout_seconds` as one :class:`ExportError` naming ``what``.
    """
    timeout = timeout_seconds()
    job = dict(job, result=os.path.join(workdir, f"{module}.result.json"))
    job_path = os.path.join(workdir, f"{module}.job.json")
    atomic.write_json(job_path, job)
    child_env = environment.for_quiet_child()
    child_env.update(env or {})
    log_path = os.path.join(workdir, f"{module}.log")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            child_command(module, job_path), env=child_env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    # Killed with the staging directory if this process dies.
    stage = staging.current()
    if stage is not None:
        stage.watcher.add_group(child.pid)
    deadline = time.monotonic() + timeout
    try:
        while True:
            # Not wait4's ru_maxrss: it starts at this process's.
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                _stop(child)
                raise common.ExportError(
                    f"{what} did not finish within {timeout:g} s and was "
                    f"stopped ({TIMEOUT_ENV} sets the limit); nothing was "
                    "written")
            time.sleep(0.05)
    except BaseException:
        _stop(child)
        raise
    finally:
        if stage is not None:
            stage.watcher.drop_group(child.pid)
    child.returncode = os.waitstatus_to_exitcode(status)
    result = None
    if os.path.exists(job["result"]):
        with open(job["result"]) as f:
            result = json.load(f)
    if child.returncode == 0 and result is not None and "error" not in result:
        rss.add_child(result.get("peak_rss", 0))
        rss.add_child(result.get("child_peak_rss", 0))
        return result
    if result is not None and "error" in result:
        error = result["error"]
        message = " ".join(str(error["message"]).split())
        if error["type"] in ("ValueError", "MissingDependencyError"):
            raise ValueError(message)
        raise common.ExportError(f"{what} failed: {error['type']}: "
                                 f"{message}")
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        how = f"was killed by {name}" + (
            " (out of memory?)" if name == "SIGKILL" else "")
    else:
        how = f"exited with status {child.returncode}"
    tail = _tail(log_path)
    raise common.ExportError(f"{what} {how}; nothing was written" + (
        f"; its last output: {tail}" if tail else ""))


def child_main(job_path, work, stamp=True):
    """The main of a process that :func:`run_child` started: writes
    ``work(job)`` (or the error) to ``job["result"]``, ``stamp``: with
    its ``seconds`` and ``peak_rss``; returns the exit status."""
    with open(job_path) as f:
        job = json.load(f)
    start = time.perf_counter()
    try:
        result = work(job)
    except Exception as e:  # noqa: BLE001 - handed to the parent
        traceback.print_exc()
        atomic.write_json(job["result"], {"error": {
            "type": type(e).__name__, "message": str(e)}})
        return 1
    if stamp:
        result["seconds"] = round(time.perf_counter() - start, 3)
        result["peak_rss"] = memory.own_peak_rss()
    atomic.write_json(job["result"], result)
    return 0


def _stop(child):
    """Kills ``child`` and its process group and reaps it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # reaped by os.waitpid
        child.wait()


class _Replay:
    """The outputs a converter process computed for the verification
    batches, looked up by the batch's contents."""

    replays = True

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, images):
        key = batch_key(images)
        if key not in self.outputs:
            shape = ({k: np.shape(v) for k, v in images.items()}
                     if isinstance(images, dict) else np.shape(images))
            raise common.ExportError(
                f"the converter process did not run a batch of shape "
                f"{shape}")
        return self.outputs[key]


def batch_key(images):
    """A name for a batch of images: the hash of its shape and bytes.

    >>> batch_key(np.zeros((2, 3))) == batch_key(np.zeros((2, 3)))
    True
    >>> batch_key(np.zeros((2, 3))) == batch_key(np.zeros((3, 2)))
    False
    """
    if isinstance(images, dict):  # a NaFlex batch: each input, by name
        return batch_key(np.array([f"{name}={batch_key(images[name])}"
                                   for name in sorted(images)]))
    images = np.asarray(images)
    digest = hashlib.sha256(repr((images.shape, images.dtype.str)).encode())
    if images.dtype == object:  # encoded files: their bytes, not pointers
        for data in images.ravel():
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(bytes(data))
    else:
        digest.update(np.ascontiguousarray(images).tobytes())
    return digest.hexdigest()[:24]


def pack_batch(arrays, key, batch):
    """Stores ``batch`` in ``arrays`` under ``key`` for an ``.npz`` read
    without pickle: an array as it is; a 1-D batch of ``bytes`` (encoded
    files) as their concatenation (``key/data``, uint8) and end offsets
    (``key/ends``). :func:`unpack_batch` reads it back.

    >>> arrays = {}
    >>> pack_batch(arrays, "b", np.array([b"ab", b"", b"c"], dtype=object))
    >>> sorted(arrays), unpack_batch(arrays, "b").tolist()
    (['b/data', 'b/ends'], [b'ab', b'', b'c'])

    A NaFlex batch (a dict of arrays) goes in as ``key/input:<name>``.
    """
    if isinstance(batch, dict):
        for name, value in batch.items():
            arrays[f"{key}/input:{name}"] = np.asarray(value)
        return
    batch = np.asarray(batch)
    if batch.dtype != object:
        arrays[key] = batch
        return
    parts = [bytes(data) for data in batch]
    arrays[f"{key}/data"] = np.frombuffer(b"".join(parts), dtype=np.uint8)
    arrays[f"{key}/ends"] = np.cumsum([len(p) for p in parts],
                                      dtype=np.int64)


def unpack_batch(arrays, key):
    """The batch :func:`pack_batch` stored under ``key``."""
    if key in arrays:
        return arrays[key]
    prefix = f"{key}/input:"
    named = {k[len(prefix):]: v for k, v in arrays.items()
             if k.startswith(prefix)}
    if named:
        return named
    data = arrays[f"{key}/data"].tobytes()
    ends = [int(e) for e in arrays[f"{key}/ends"]]
    out = np.empty(len(ends), dtype=object)
    for i, (start, end) in enumerate(zip([0] + ends[:-1], ends)):
        out[i] = data[start:end]
    return out


def _convert_in_tensorflow(job, staged, workdir, rss, open_runtime,
                           runtime_needs_tensorflow):
    """``convert`` of ``job`` in a TensorFlow child process; returns
    ``(result, open_runtime)``. When the artifact's runtime is TensorFlow,
    the child also runs the verification batches and the returned runtime
    replays its outputs."""
    graph = job.graph
    model_path = os.path.join(workdir, "model.keras")
    with atomic.atomic_path(model_path) as tmp:
        graph.model.save(tmp)
    arrays = dict(job.arrays)
    run_keys = []
    needs_tf_runtime = job.verify and runtime_needs_tensorflow
    if needs_tf_runtime:
        images, _ = checks.verification_images(
            graph, job.batch_sizes, job.verify_data, job.samples, job.seed)
        extras = [part for _, part in checks.extra_batches(
            graph, job.batch_sizes, job.seed)]
        for batch in checks.batches(images, job.batch_sizes) + extras:
            run_keys.append(batch_key(batch))
            pack_batch(arrays, f"run/{run_keys[-1]}", batch)
    arrays_path = None
    if arrays:
        arrays_path = os.path.join(workdir, "arrays.npz")
        with atomic.atomic_path(arrays_path) as tmp:
            np.savez(tmp, **arrays)
    spec = {"format": job.format, "model": model_path,
            "graph": graph.rebuild_args(), "staged": staged,
            "workdir": workdir, "params": job.params, "arrays": arrays_path,
            "run": run_keys}
    result = run_child(TF_WORKER, spec, workdir, rss,
                       what="the TensorFlow converter process",
                       env={"KERAS_BACKEND": "tensorflow"})
    if needs_tf_runtime:
        with np.load(os.path.join(workdir, result.pop("outputs")),
                     allow_pickle=False) as data:
            outputs = {}
            for key in data.files:
                batch, name = key.split("/", 1)
                outputs.setdefault(batch, {})[name] = data[key]
        open_runtime = lambda path: _Replay(outputs)  # noqa: E731
    return result, open_runtime
