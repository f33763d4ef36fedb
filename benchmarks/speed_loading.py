"""The checkpoint-loading measurements of benchmarks/speed.py: each one in
a fresh process (``speed.py --load-child MODE PATH ARCH SIZE``), so that
imports and caches of the parent do not count. ``load_child`` is what such
a child runs; ``measure_loading`` writes a random official-layout
checkpoint and starts the children, round after round. ``--quick`` (only
the script under test) runs the four measurements of a round in one fresh
process, in turn (MODE ``all``): one TensorFlow import instead of four.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import numpy as np
from speed_peers import keras_vit_model

# The children are started through the runner, which dispatches
# --load-child to load_child.
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "speed.py")


# --------------------------------------------------------------------------
# checkpoint loading, each measurement in a fresh process


MODES = ("baseline", "np.load", "zoo.load", "build+load_weights")
# The --load-child mode that runs every one of MODES in turn, in one process.
ALL = "all"


def load_child(mode, path, arch_json, size):
    """Runs in the child: the same imports for every mode, then one
    measurement (``mode`` ``all``: each of MODES in turn), printed as JSON,
    one ``RESULT`` line per measurement naming its mode."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    arch = json.loads(arch_json)
    for one in MODES if mode == ALL else (mode,):
        _measure(one, path, arch, size)
    return 0


def _measure(mode, path, arch, size):
    import keras_vit
    from keras_vit.export import memory

    out = {"mode": mode}
    start = time.perf_counter()
    if mode == "np.load":
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        out["seconds"] = time.perf_counter() - start
        out["arrays"] = len(arrays)
    elif mode == "zoo.load":
        keras_vit.zoo.load("ViT-B/16", weights=path, image_size=size, **arch)
        out["seconds"] = time.perf_counter() - start
    elif mode == "build+load_weights":
        model = keras_vit.zoo.load("ViT-B/16", weights=None, image_size=size,
                                   **arch)
        out["build_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        keras_vit.zoo.load_weights(model, path)
        out["seconds"] = time.perf_counter() - start
    out["peak_rss"] = memory.own_peak_rss()
    print("RESULT " + json.dumps(out), flush=True)


def _start_child(mode, path, arch, size):
    cmd = [sys.executable, SCRIPT, "--load-child", mode, path,
           json.dumps(arch), str(size)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _finish_child(proc, modes):
    """``{mode: result}`` of the child, each with the child's peak RSS
    after it; a mode the child did not report carries the error."""
    lines = proc.stdout.read().splitlines()
    proc.wait()
    results = {}
    for line in lines:
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            results[result.pop("mode")] = result
    for mode in modes:
        result = results.setdefault(mode, {})
        if proc.returncode:
            result["error"] = f"child exited with {proc.returncode}"
        elif not result:
            result["error"] = "child reported no result"
    return results


def measure_loading(size, arch, classes, repeats, tmp, say,
                    one_process=False):
    """Writes a random official-layout checkpoint, then times np.load,
    zoo.load and build + load_weights, each in a fresh process, round
    after round (``one_process``: the four of a round in one fresh
    process, in turn, for --quick, where only the script is under test;
    each peak RSS then holds the measurements before it); ``say`` reports
    the progress."""
    import keras_vit

    path = os.path.join(tmp, "ViT-B_16-random.npz")
    model = keras_vit_model(size, arch, classes)
    keras_vit.zoo.save_npz(model, path)
    del model
    gc.collect()
    nbytes = os.path.getsize(path)
    results = {m: [] for m in MODES}
    for i in range(repeats):
        if one_process:
            got = _finish_child(_start_child(ALL, path, arch, size), MODES)
        else:
            got = {}
            for mode in MODES:
                got.update(_finish_child(
                    _start_child(mode, path, arch, size), (mode,)))
        for mode in MODES:
            results[mode].append(got[mode])
        say(f"  loading round {i + 1}/{repeats} done")
    return {"path": path, "bytes": nbytes, "results": results,
            "one_process": one_process}
