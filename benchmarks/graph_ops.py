"""What TensorFlow's CPU graph fused, for a zoo model on this machine.

Runs the model once per (dtype, job) with TensorFlow's run metadata on and
counts the ops of the graphs that actually ran, after grappler and oneDNN
(keras_vit.runtime.graph_ops): fused matmul + bias + GELU nodes, bias-only fused
matmuls, bare matmuls, bias gradients as BiasAddGrad, softmax, LayerNorm,
Tanh, Cast, Mul, Sum and the total. bf16 rows show oneDNN's rewrites only
on CPUs where oneDNN runs bf16 (AVX512F or AVX-NE-CONVERT); the header
says whether this one does, and which path the plan picks.

    python benchmarks/graph_ops.py                      # ViT-B/16, 224
    python benchmarks/graph_ops.py --model ViT-Ti/16 --jobs infer,train
    python benchmarks/graph_ops.py --top 40             # every op type

Random weights; no timing (see benchmarks/speed.py for that).
"""

from __future__ import annotations

import argparse
import collections
import os


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B/16")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16,mixed_bfloat16")
    parser.add_argument("--jobs", default="infer,train",
                        help="comma-separated: infer, train")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N most frequent op types per row")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    import keras

    import keras_vit
    import keras_vit.train as kt
    from keras_vit.runtime import compat
    from keras_vit.runtime import graph_ops
    from keras_vit.runtime import hardware

    if keras.backend.backend() != "tensorflow":
        parser.error("the graphs counted are TensorFlow's: run with "
                     "KERAS_BACKEND=tensorflow")
    jobs = [j for j in args.jobs.split(",") if j]
    for job in jobs:
        if job not in ("infer", "train"):
            parser.error(f"--jobs takes infer and train; received {job!r}")
    machine = hardware.detect()
    print(f"# {machine.describe()}")
    print(f"# oneDNN: {compat.onednn_enabled()}; oneDNN bf16 kernels on "
          f"this CPU: {compat.onednn_supports('bfloat16')}")
    rows = []
    for dtype in [d for d in args.dtypes.split(",") if d]:
        plan = hardware.plan(dtype)
        print(f"# {dtype}: predict path {plan.predict}, training jit "
              f"{plan.train_jit}, softmax in {plan.softmax} ({plan.reason})")
        for job in jobs:
            model = keras_vit.zoo.load(args.model, weights=None,
                                       image_size=args.image_size,
                                       num_classes=10, dtype=dtype)
            if job == "train":
                # The graph path, so that there are ops to count (an XLA
                # step is one cluster).
                kt.compile_for_finetune(model, total_steps=10,
                                        warmup_steps=1,
                                        batch_size=args.batch_size,
                                        jit_compile=False)
            nodes = graph_ops.executed_nodes(
                model, batch_size=args.batch_size, training=job == "train")
            counts = collections.Counter(map(graph_ops.node_label, nodes))
            summary = graph_ops.fusion_summary(counts)
            # Cast pairs that undo each other (two passes for nothing).
            summary["cast_round_trips"] = len(
                graph_ops.cast_round_trips(nodes))
            rows.append((dtype, job, summary, counts))
    keys = graph_ops.SUMMARY_KEYS + ("cast_round_trips",)
    print("| dtype | job | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for dtype, job, summary, _ in rows:
        print(f"| {dtype} | {job} | "
              + " | ".join(str(summary[k]) for k in keys) + " |")
    if args.top:
        for dtype, job, _, counts in rows:
            print(f"\n## {dtype} {job}\n"
                  + graph_ops.format_counts(counts, args.top))


if __name__ == "__main__":
    main()
