"""The two attention paths of keras_vit on each Keras backend, timed in one
run: ``keras.ops.dot_product_attention`` ("fused") and the explicit einsum
+ softmax spelling ("einsum"), in the forward of a whole ViT (what
``predict`` runs: a ``tf.function`` graph on TensorFlow, ``jax.jit`` on
JAX, eager ``no_grad`` on torch). Prints a markdown table with the CPU
flags; ``keras_vit.runtime.hardware.plan().attention`` takes the faster one.

    python benchmarks/attention_paths.py                 # ViT-S/16 @224, batch 8
    python benchmarks/attention_paths.py --quick         # smoke test

Each backend runs in its own child process (Keras picks its backend at
import); within one child the two paths alternate call by call, so the
ratio is fair on a noisy shared machine. ``max |diff|`` is the largest
logit difference between the two paths on the same weights and images.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VIT_S16 = dict(image_size=224, patch_size=16, hidden_size=384, num_layers=12,
               num_heads=6, mlp_dim=1536)
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64)
BACKENDS = ("tensorflow", "jax", "torch")


def cpu_flags():
    from keras_vit.runtime import hardware

    if not hardware.cpu_fields():
        return "unknown"
    return " ".join(sorted(hardware.cpu_flags() & {
        "amx_bf16", "avx512_bf16", "avx512f", "avx2"})) or (
            "none of avx2/avx512/amx")


def cpu_name():
    from keras_vit.runtime import hardware

    return hardware.cpu_model() or "unknown CPU"


def _forward(model, backend):
    """The compiled forward ``predict`` uses on ``backend``."""
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda x: model(x, training=False))
    if backend == "jax":
        import jax

        def f(trainable, non_trainable, x):
            return model.stateless_call(trainable, non_trainable, x,
                                        training=False)[0]

        jitted = jax.jit(f)
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        return lambda x: jitted(tv, ntv, x)
    import torch

    def run(x):
        with torch.no_grad():
            return model(x, training=False)
    return run


def child(args):
    """Times both paths on this process's backend; prints one JSON line."""
    import numpy as np

    import keras
    import keras_vit
    from keras_vit.runtime import hardware

    backend = keras.backend.backend()
    arch = TINY if args.quick else VIT_S16
    keras.utils.set_random_seed(0)
    model = keras_vit.models.vit(num_classes=1000, **arch)
    rng = np.random.default_rng(0)
    for w in model.weights:   # a non-zero head: logits to compare
        if w.path.startswith("head/"):
            w.assign((0.02 * rng.standard_normal(w.shape)).astype(w.dtype))
    size = arch["image_size"]
    x = keras.ops.convert_to_tensor(
        rng.uniform(-1, 1, (args.batch, size, size, 3)).astype("float32"))
    runs, outs = {}, {}
    for path in ("fused", "einsum"):
        os.environ[hardware.ATTENTION_ENV] = path
        fn = _forward(model, backend)   # traced under this path
        t0 = time.perf_counter()
        outs[path] = keras.ops.convert_to_numpy(fn(x))
        first = time.perf_counter() - t0
        runs[path] = {"fn": fn, "first": first, "times": []}
    for _ in range(args.runs):
        for path in ("fused", "einsum"):
            # Eager torch reads the plan at every call.
            os.environ[hardware.ATTENTION_ENV] = path
            t0 = time.perf_counter()
            keras.ops.convert_to_numpy(runs[path]["fn"](x))
            runs[path]["times"].append(time.perf_counter() - t0)
    os.environ.pop(hardware.ATTENTION_ENV)
    result = {"backend": backend,
              "plan": hardware.plan("float32").attention,
              "diff": float(np.max(np.abs(outs["fused"] - outs["einsum"]))),
              "scale": float(np.max(np.abs(outs["einsum"])))}
    for path in ("fused", "einsum"):
        med = statistics.median(runs[path]["times"])
        result[path] = {"ms": 1000 * med, "img_s": args.batch / med,
                        "first_s": runs[path]["first"]}
    print("RESULT " + json.dumps(result), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = min(args.runs, 3)
    if args.child:
        return child(args)
    rows = []
    for backend in args.backends.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child",
               "--batch", str(args.batch), "--runs", str(args.runs)]
        if args.quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, KERAS_BACKEND=backend,
                                       TF_CPP_MIN_LOG_LEVEL="3"))
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(f"{backend}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(line[0][len("RESULT "):]))
    what = "tiny ViT @32 (--quick)" if args.quick else "ViT-S/16 @224"
    print(f"\n{what}, batch {args.batch}, float32, median of {args.runs}; "
          f"{cpu_name()}, {os.cpu_count()} CPUs, flags: {cpu_flags()}\n")
    print("| backend | fused ms | einsum ms | fused / einsum | max abs logit "
          "diff | plan picks |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["fused"]["ms"] / r["einsum"]["ms"]
        print(f"| {r['backend']} | {r['fused']['ms']:.1f} | "
              f"{r['einsum']['ms']:.1f} | {ratio:.2f} | {r['diff']:.2g} "
              f"(of {r['scale']:.2g}) | {r['plan']} |")
    return rows


if __name__ == "__main__":
    main()
