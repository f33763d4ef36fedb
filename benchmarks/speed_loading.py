"""The checkpoint-loading measurements of benchmarks/speed.py: each one in
a fresh process (``speed.py --load-child MODE PATH ARCH SIZE``), so that
imports and caches of the parent do not count. ``load_child`` is what such
a child runs; ``measure_loading`` writes a random official-layout
checkpoint and starts the children, round after round.
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


def load_child(mode, path, arch_json, size):
    """Runs in the child: the same imports for every mode, then one
    measurement, printed as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import keras_vit
    from keras_vit.export import memory

    arch = json.loads(arch_json)
    out = {}
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
    return 0


def _start_child(mode, path, arch, size):
    cmd = [sys.executable, SCRIPT, "--load-child", mode, path,
           json.dumps(arch), str(size)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _finish_child(proc):
    """The child's result, with its own peak RSS."""
    lines = proc.stdout.read().splitlines()
    proc.wait()
    result = {}
    for line in lines:
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT "):]))
    if proc.returncode:
        result["error"] = f"child exited with {proc.returncode}"
    return result


def measure_loading(size, arch, classes, repeats, tmp, say,
                    side_by_side=False):
    """Writes a random official-layout checkpoint, then times np.load,
    zoo.load and build + load_weights, each in a fresh process, round
    after round (``side_by_side``: the processes of a round at once, for
    --quick, where only the script is under test); ``say`` reports the
    progress."""
    import keras_vit

    path = os.path.join(tmp, "ViT-B_16-random.npz")
    model = keras_vit_model(size, arch, classes)
    keras_vit.zoo.save_npz(model, path)
    del model
    gc.collect()
    nbytes = os.path.getsize(path)
    modes = ("baseline", "np.load", "zoo.load", "build+load_weights")
    results = {m: [] for m in modes}
    for i in range(repeats):
        if side_by_side:
            procs = [_start_child(m, path, arch, size) for m in modes]
            for mode, proc in zip(modes, procs):
                results[mode].append(_finish_child(proc))
        else:
            for mode in modes:
                results[mode].append(_finish_child(
                    _start_child(mode, path, arch, size)))
        say(f"  loading round {i + 1}/{repeats} done")
    return {"path": path, "bytes": nbytes, "results": results,
            "side_by_side": side_by_side}
