"""keras_vit's timed calls and the child processes that run them on the
other Keras backends, for benchmarks/speed.py: the random batches,
``model.predict`` of one batch (``predict_call``) and one ``model.fit``
step (``fit_call``), and ``BackendChild``, a keras_vit process per Keras
backend (``speed.py --backend-child BACKEND ARCH CLASSES``) that makes and
calls its cases on request, in the same interleaved rounds as the parent's.
``backend_child`` is that process's loop.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import numpy as np
from speed_peers import keras_vit_model

# The children are started through the runner, which dispatches
# --backend-child to backend_child.
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "speed.py")


def images(batch, size, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32")


def labels(batch, classes):
    return (np.arange(batch) * 7919 % classes).astype("int64")


def predict_call(model, batch, size, path="auto"):
    """``model.predict`` of one batch on ``path``, and the path it runs."""
    x = images(batch, size)
    model.predict_path = path
    resolved = model.resolved_predict_path()

    def fn():
        model.predict_path = path
        return model.predict(x, batch_size=batch, verbose=0)
    return fn, resolved


def fit_call(size, batch, arch, classes, dtype=None):
    """``model.train_on_batch`` after ``compile_for_finetune`` (what
    ``model.fit`` runs), and the model's ``jit_compile``."""
    from keras_vit.train import compile_for_finetune

    model = keras_vit_model(size, arch, classes, dtype)
    compile_for_finetune(model, "finetune", total_steps=10**6,
                         warmup_steps=1, batch_size=batch)
    x, y = images(batch, size), labels(batch, classes)
    return (lambda: model.train_on_batch(x, y)), model.jit_compile


# --------------------------------------------------------------------------
# keras_vit on the other Keras backends: one child process each (Keras reads
# KERAS_BACKEND once), kept alive and asked to make and call its cases in
# turn with the parent's, so that they share the parent's interleaved
# rounds.

BACKENDS = ("tensorflow", "jax", "torch")
DTYPES = ("float32", "bfloat16", "mixed_bfloat16")


class BackendChild:
    """A keras_vit process on ``backend``, answering one JSON line per
    request on its stdout (``REPLY {...}``)."""

    def __init__(self, backend, arch, classes, tmp, dtypes=DTYPES,
                 notes=None):
        self.backend, self.dtypes = backend, tuple(dtypes)
        # Where the child's notes on its paths go (the report's "Notes").
        self.notes = {} if notes is None else notes
        self.log = os.path.join(tmp, f"{backend}-child.log")
        env = dict(os.environ, KERAS_BACKEND=backend,
                   TF_CPP_MIN_LOG_LEVEL="3")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, SCRIPT,
                 "--backend-child", backend, json.dumps(arch), str(classes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, env=env)
        self.info = None

    def hello(self):
        """Waits for the child to be ready; its library versions."""
        if self.info is None:
            self.info = self.request(op="hello")
        return self.info["versions"]

    def request(self, **message):
        if self.proc.poll() is not None:
            raise RuntimeError(f"the {self.backend} child exited with "
                               f"{self.proc.returncode}: {self._tail()}")
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("REPLY "):
                reply = json.loads(line[len("REPLY "):])
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply
        self.proc.wait()
        raise RuntimeError(f"the {self.backend} child exited with "
                           f"{self.proc.returncode}: {self._tail()}")

    def _tail(self):
        try:
            with open(self.log) as f:
                return f.read()[-300:].strip()
        except OSError:
            return ""

    def case(self, case):
        """``case.make`` for a case the child runs; the child's answer
        names the path (e.g. which predict path its backend takes)."""
        def make():
            reply = self.request(op="make", section=case.section,
                                 dtype=case.dtype, size=case.size,
                                 batch=case.batch)
            case.path = reply["path"]
            self.notes.update(reply.get("notes", {}))
            key = reply["id"]
            return lambda: self.request(op="call", id=key)
        case.make = make
        return case

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def backend_child(backend, arch_json, classes):
    """The child's loop: make, call and drop cases on request."""
    import keras

    arch, classes = json.loads(arch_json), int(classes)
    module = {"jax": "jax", "torch": "torch"}.get(backend, "tensorflow")
    calls, models = {}, {}

    def reply(**fields):
        print("REPLY " + json.dumps(fields), flush=True)

    for line in sys.stdin:
        message = json.loads(line)
        op = message["op"]
        try:
            if op == "hello":
                lib = __import__(module)
                reply(backend=keras.backend.backend(),
                      versions={module: lib.__version__})
            elif op == "make":
                size, batch = message["size"], message["batch"]
                dtype = message["dtype"]
                built_dtype = None if dtype == "float32" else dtype
                key = len(calls)
                note = f"keras_vit on {backend}, {dtype}"
                if message["section"] == "inference":
                    if (size, dtype) not in models:
                        models[size, dtype] = keras_vit_model(
                            size, arch, classes, built_dtype)
                    calls[key], resolved = predict_call(
                        models[size, dtype], batch, size)
                    path = f"model.predict (auto: {resolved})"
                    notes = {f"{note}, model.predict":
                             f"runs the {resolved!r} path"}
                else:
                    calls[key], jit = fit_call(size, batch, arch, classes,
                                               built_dtype)
                    path = "compile_for_finetune + train_on_batch"
                    notes = {f"{note}, compile_for_finetune":
                             f"model.jit_compile = {jit}"}
                reply(id=key, path=path, notes=notes)
            elif op == "call":
                calls[message["id"]]()
                reply()
            elif op == "reset":
                calls.clear()
                models.clear()
                gc.collect()
                reply()
        except Exception as e:  # noqa: BLE001 - the parent reports it
            reply(error=f"{type(e).__name__}: {str(e)[:300]}")
    return 0
