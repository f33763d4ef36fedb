"""Inference speed of a model in each runtime: Keras (a TF graph), XLA,
onnxruntime, LiteRT and OpenVINO, plus bf16 where the CPU has bf16
instructions.

>>> import keras_vit
>>> from keras_vit.export import benchmark
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> result = benchmark.run(model, runtimes=("keras",), batch_sizes=(1,),
...                        runs=2, bf16=False)
>>> [(r["runtime"], r["batch"]) for r in result["rows"]]
[('keras', 1)]
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from keras_vit.base.checks import check_int
from keras_vit.base.limits import MAX_RUNS
from keras_vit.export import memory
from keras_vit.export.formats import format_module
from keras_vit.runtime import hardware
from keras_vit.runtime.backend import name as backend_name

RUNTIMES = ("keras", "xla", "onnx", "tflite", "openvino")


def cpu_bf16_support():
    """``(supported, reason)``: whether the CPU has bf16 instructions
    (AVX512_BF16 or AMX)."""
    flags = hardware.cpu_flags()
    if not flags and not hardware.cpu_fields():
        return False, "cannot read /proc/cpuinfo"
    found = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if found:
        return True, "CPU has " + ", ".join(found)
    return False, "CPU has neither avx512_bf16 nor amx_bf16"


def check_runtimes(runtimes):
    """``runtimes`` (names or a comma-separated string) as a tuple."""
    if isinstance(runtimes, str):
        runtimes = [r for r in runtimes.split(",") if r]
    runtimes = tuple(runtimes)
    bad = [r for r in runtimes if r not in RUNTIMES]
    if not runtimes or bad:
        raise ValueError(f"runtimes must be names from {RUNTIMES}; received "
                         f"runtimes={runtimes!r}")
    return runtimes


def _time_runs(fn, images, runs, warmup, rss):
    for _ in range(warmup):
        fn(images)
    rss.sample()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(images)
        times.append(time.perf_counter() - start)
        rss.sample()
    return times


def _keras_runner(model, jit):
    """The model on this process's Keras backend: a ``tf.function`` (with
    XLA if ``jit``) on TensorFlow, ``jax.jit`` (XLA) or the plain call on
    JAX, the call without autograd on PyTorch."""
    from keras_vit.models.memory import infer

    def first(out):
        return {"out": np.asarray(next(iter(out.values())) if isinstance(
            out, dict) else out)}

    backend = backend_name()
    if backend == "tensorflow":
        import tensorflow as tf

        function = tf.function(lambda x: model(x, training=False),
                               jit_compile=jit)
        return lambda images: first(function(tf.constant(images)))
    if not jit:
        return lambda images: first(infer(model, images))
    if backend != "jax":
        raise ImportError(f"the {backend} backend does not compile with XLA")
    import jax

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables])
    forward = jax.jit(lambda t, n, x: model.stateless_call(
        t, n, x, training=False)[0])
    return lambda images: first(forward(*state, images))


def run(model, runtimes=RUNTIMES, batch_sizes=(1, 8), runs=5, warmup=1,
        bf16="auto", workdir=None, say=None):
    """Times ``model`` in each runtime at each batch size.

    Each measurement is the median of ``runs`` timed calls after ``warmup``
    untimed ones. ONNX, TFLite and OpenVINO run verified float32 exports.
    ``bf16`` ("auto": when the CPU has bf16 instructions) adds rows for the
    model rebuilt in mixed_bfloat16 (Keras, XLA) and for OpenVINO's
    bfloat16 export. Peak RSS includes the Keras model, which stays loaded.

    Returns ``{"rows": [...], "skipped": [...], "notes": [...]}``.
    """
    runtimes = check_runtimes(runtimes)
    batch_sizes = tuple(int(b) for b in batch_sizes)
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes must be positive; received "
                         f"batch_sizes={batch_sizes!r}")
    check_int("runs", runs, low=1, high=MAX_RUNS)
    say = say or (lambda *_: None)
    from keras_vit.export.graph import ServingGraph

    graph = ServingGraph(model, outputs=("features",))
    result = {"rows": [], "skipped": [], "notes": []}
    tmp = workdir or tempfile.mkdtemp(prefix="keras_vit_bench_")
    try:
        jobs = [(name, "float32", graph.model) for name in runtimes]
        supported, why = cpu_bf16_support()
        if bf16 == "auto":
            bf16 = supported
            if not supported:
                result["skipped"].append(f"bf16: {why}")
        elif bf16 and not supported:
            result["notes"].append(f"bf16 requested although {why}")
        if bf16:
            tf_runtimes = [r for r in runtimes if r in ("keras", "xla")]
            if not tf_runtimes and "openvino" not in runtimes:
                result["skipped"].append(
                    "bf16: only measured with the keras/xla/openvino "
                    "runtimes")
            if tf_runtimes:
                from keras_vit.zoo import rebuild

                try:
                    copy = rebuild(graph.model, dtype="mixed_bfloat16")
                except Exception as e:  # noqa: BLE001 - reported as skipped
                    copy = None
                    result["skipped"].append(
                        f"bf16: cannot rebuild {type(graph.model).__name__} "
                        f"in mixed_bfloat16 ({e})")
                for name in tf_runtimes if copy is not None else ():
                    jobs.append((name, "mixed_bfloat16", copy))
                result["notes"].append(f"bf16 rows: mixed_bfloat16 ({why})")
            if "openvino" in runtimes:
                jobs.append(("openvino", "bfloat16", graph.model))
                result["notes"].append(
                    "openvino bfloat16: the bfloat16 export, computed in "
                    f"bf16 ({why})")
            if {"onnx", "tflite"} & set(runtimes):
                result["skipped"].append(
                    "bf16 for onnx/tflite: their converters take float32 "
                    "graphs only")
        for name, dtype, net in jobs:
            try:
                fn, extra = _runner(name, net, graph, tmp, say, dtype)
            except ImportError as e:
                result["skipped"].append(f"{name}: {e}")
                continue
            for batch in batch_sizes:
                images, _ = graph.sample_images(batch, seed=batch)
                with memory.PeakRSS() as rss:
                    times = _time_runs(fn, images, runs, warmup, rss)
                median = statistics.median(times)
                row = {"runtime": name, "dtype": dtype, "batch": batch,
                       "images_per_s": batch / median,
                       "median_s": median, "runs": runs,
                       "peak_rss_mb": memory.mib(rss.peak), **extra}
                result["rows"].append(row)
                say(f"  {name:7} {dtype:15} batch {batch:>3}: "
                    f"{row['images_per_s']:8.2f} img/s "
                    f"(median of {runs}), peak RSS {row['peak_rss_mb']} MiB")
            del fn
            gc.collect()
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _runner(name, model, graph, tmp, say, dtype="float32"):
    """``(images -> outputs, extra row fields)`` for runtime ``name`` at
    ``dtype`` (OpenVINO: "bfloat16" runs its bfloat16 export)."""
    if name in ("keras", "xla"):
        return _keras_runner(model, jit=name == "xla"), {}
    from keras_vit import export

    options = {}
    if name == "openvino":
        precision = "bfloat16" if dtype == "bfloat16" else "float32"
        file, what = f"model_{precision}.xml", f"OpenVINO {precision}"
        options["precision"] = precision
    elif name == "onnx":
        import onnxruntime  # noqa: F401

        file, what = "model.onnx", "ONNX"
    else:
        import ai_edge_litert  # noqa: F401

        file, what = "model.tflite", "TFLite float32"
    path = os.path.join(tmp, file)
    say(f"  exporting to {what} (verified) ...")
    report = export.export(graph.model, path, name, outputs=("features",),
                           **options)
    return format_module(name).open_artifact(path), {
        "export_seconds": report["conversion_seconds"],
        "max_abs_diff": max(report["max_abs_diff"].values())}


def markdown_table(result, batch_sizes=None):
    """The rows of :func:`run` as a markdown table: one line per runtime
    and dtype, images/s per batch size, and the peak RSS."""
    rows = result["rows"]
    if batch_sizes is None:
        batch_sizes = sorted({r["batch"] for r in rows})
    keys = list(dict.fromkeys((r["runtime"], r["dtype"]) for r in rows))
    head = ["runtime", "dtype"] + [f"batch {b} img/s" for b in batch_sizes] \
        + ["peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for runtime, dtype in keys:
        mine = [r for r in rows if (r["runtime"], r["dtype"]) == (runtime,
                                                                  dtype)]
        cells = [runtime, dtype]
        for b in batch_sizes:
            hit = [r for r in mine if r["batch"] == b]
            cells.append(f"{hit[0]['images_per_s']:.2f}" if hit else "-")
        cells.append(f"{max(r['peak_rss_mb'] for r in mine):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
