"""Where a CPU training step's time goes: matmuls against everything else.

The matmuls of a ViT training step run at the CPU's roofline (oneDNN's
kernels); what is left to drive down is the rest: element-wise passes,
casts, the optimizer, the XLA programs of the GELU/LayerNorm/softmax
chains. This profiles ``train_on_batch`` of a model compiled with the
paper's fine-tune recipe on TensorFlow's CPU graph (TensorFlow's
profiler; its trace is read with JAX's ``ProfileData``) and prints the
op time a step by kind and the share outside the matmuls.

    python benchmarks/step_profile.py                       # ViT-B/16, mixed_bfloat16
    python benchmarks/step_profile.py --model ViT-Ti/16 --precision float32

Op times are summed over the executor's threads, so they add up to more
than the wall time of the step; the share is of that sum.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

# TensorFlow's kernels, by the op type after the ':' in an event's name.
MATMUL_OPS = ("MatMul", "BatchMatMul", "Conv2D", "Einsum", "Conv2DBackprop")


def op_kind(event_name):
    """``"matmul"``, ``"xla"`` (an XLA program: the element-wise chains),
    ``"other"`` (any other TensorFlow kernel) or None (the executor's own
    bookkeeping, not an op)."""
    if event_name.startswith("CpuExecutable::"):
        return "xla"
    if ":" not in event_name or "::" in event_name:
        return None
    op = event_name.rsplit(":", 1)[1].strip()
    if op.startswith("__"):  # a function call: its ops are counted inside
        return None
    return "matmul" if any(m in op for m in MATMUL_OPS) else "other"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    from jax.profiler import ProfileData

    import keras_vit
    from keras_vit.runtime import hardware

    model = keras_vit.zoo.load(args.model, weights=None,
                               image_size=args.image_size, num_classes=10)
    keras_vit.train.compile_for_finetune(model, total_steps=100,
                                         batch_size=args.batch_size,
                                         precision=args.precision)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch_size, args.image_size,
                            args.image_size, 3)).astype("float32")
    y = (np.arange(args.batch_size) % 10).astype("int32")
    for _ in range(2):
        model.train_on_batch(x, y)
    folder = tempfile.mkdtemp()
    tf.profiler.experimental.start(folder)
    start = time.perf_counter()
    for _ in range(args.steps):
        model.train_on_batch(x, y)
    wall = (time.perf_counter() - start) / args.steps
    tf.profiler.experimental.stop()
    path = glob.glob(os.path.join(folder, "**", "*.xplane.pb"),
                     recursive=True)[0]
    kinds, ops = collections.Counter(), collections.Counter()
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                kind = op_kind(event.name)
                if kind:
                    ms = event.duration_ns / 1e6 / args.steps
                    kinds[kind] += ms
                    if kind == "other":
                        ops[event.name.rsplit(":", 1)[1].strip()] += ms
    total = sum(kinds.values())
    print(f"Training step of {args.model} at {args.image_size} px, batch "
          f"{args.batch_size}, {args.precision}, compile_for_finetune + "
          f"train_on_batch on TensorFlow; {hardware.detect().describe()}; "
          f"wall {1e3 * wall:.0f} ms a step (profiled).\n")
    print("| kind | op ms a step | share |\n|---|---|---|")
    for kind in ("matmul", "xla", "other"):
        print(f"| {kind} | {kinds[kind]:.0f} | "
              f"{100 * kinds[kind] / total:.1f}% |")
    print(f"| outside the matmuls | {total - kinds['matmul']:.0f} | "
          f"{100 * (total - kinds['matmul']) / total:.1f}% |")
    print("\nThe costliest other ops (ms a step): " + ", ".join(
        f"{op} {ms:.1f}" for op, ms in ops.most_common(8)) + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
