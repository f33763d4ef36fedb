"""Rematerialisation: a training step's memory and time with and without
``remat=True``, measured on the JAX backend from XLA's own accounting.

For each setting the gradient step of the model (softmax cross-entropy,
gradients of every weight) is compiled at two batch sizes and XLA's
``memory_analysis()`` of the compiled program gives the bytes it allocates
(arguments, outputs and temporaries, with aliasing taken off). Memory grows
linearly in the batch, so the two points give a fixed part (weights,
gradients) and a per-image part, and from them the largest batch whose
step fits a budget (``--budget-gib``, 16 by default: a 16 GiB accelerator;
weights, gradients and SGD momentum of the optimizer are counted on top).
The step time is measured on this machine's CPU at ``--time-batch``
images, the two settings in alternating rounds, and the ratio is what to
expect anywhere: remat runs each block's forward twice.

    KERAS_BACKEND=jax python benchmarks/remat.py                # ViT-L/16, 384 px
    KERAS_BACKEND=jax python benchmarks/remat.py --model ViT-Ti/16 --image-size 64

Prints a Markdown table (``--out FILE`` writes it too) naming the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-L/16")
    p.add_argument("--image-size", type=int, default=384)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batches", default="1,2", help="two batch sizes whose "
                   "compiled memory gives the per-image slope")
    p.add_argument("--budget-gib", type=float, default=16.0)
    p.add_argument("--time-batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args(argv)
    args.batches = tuple(int(b) for b in args.batches.split(","))
    if len(args.batches) != 2 or args.batches[0] >= args.batches[1]:
        p.error(f"--batches must be two increasing sizes, got {args.batches}")
    if args.rounds < 1 or args.time_batch < 1:
        p.error("--rounds and --time-batch must be positive")
    return args


def cpu_line():
    flags = set()
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = [f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags]
    return f"{model}, {os.cpu_count()} cores; {', '.join(wanted) or 'no AVX-512'}"


def gradient_step(model):
    """A jitted ``(trainable, non_trainable, images, labels) -> grads``."""
    import jax
    import jax.numpy as jnp

    def loss(trainable, non_trainable, images, labels):
        logits, _ = model.stateless_call(trainable, non_trainable, images,
                                         training=True)
        logp = jax.nn.log_softmax(logits.astype("float32"))
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return jax.jit(jax.grad(loss))


def inputs(model, batch, size, classes):
    import jax
    import jax.numpy as jnp

    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]
    images = jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return trainable, other, images, labels


def compiled_bytes(step, args_):
    analysis = step.lower(*args_).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)


def measure(args, remat):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import keras_vit

    model = keras_vit.zoo.load(args.model, weights=None,
                               image_size=args.image_size,
                               num_classes=args.num_classes, remat=remat)
    step = gradient_step(model)
    points = []
    for batch in args.batches:
        start = time.perf_counter()
        points.append(compiled_bytes(step, inputs(
            model, batch, args.image_size, args.num_classes)))
        print(f"  remat={remat} batch {batch}: "
              f"{points[-1] / 2**30:.2f} GiB compiled in "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    (b1, b2), (m1, m2) = args.batches, points
    per_image = (m2 - m1) / (b2 - b1)
    fixed = m1 - b1 * per_image
    # SGD with momentum keeps one more copy of the weights beside them.
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    budget = args.budget_gib * 2**30 - fixed - weights
    fits = max(0, int(budget // per_image)) if per_image > 0 else None
    trainable, other, _, _ = inputs(model, 1, args.image_size,
                                    args.num_classes)
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.uniform(-1, 1, (
        args.time_batch, args.image_size, args.image_size, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, args.num_classes, args.time_batch),
                         jnp.int32)

    def run():
        start = time.perf_counter()
        jax.block_until_ready(step(trainable, other, images, labels))
        return time.perf_counter() - start

    run()  # compile at the timing batch
    return {"per_image": per_image, "fixed": fixed, "fits": fits,
            "run": run, "points": points}


def main(argv=None):
    args = parse_args(argv)
    import keras

    if keras.backend.backend() != "jax":
        print("benchmarks/remat.py measures with XLA's memory analysis: run "
              "it with KERAS_BACKEND=jax", file=sys.stderr)
        return 2
    results = {remat: measure(args, remat) for remat in (False, True)}
    times = {False: [], True: []}
    for _ in range(args.rounds):  # alternating: drift hits both alike
        for remat in (False, True):
            times[remat].append(results[remat]["run"]())
    median = {k: statistics.median(v) for k, v in times.items()}
    plain, remat = results[False], results[True]
    lines = [
        f"Training step of {args.model} at {args.image_size} px, "
        f"{args.num_classes} classes, JAX (XLA memory analysis of the "
        f"compiled gradient step at batches {args.batches[0]} and "
        f"{args.batches[1]}); CPU: {cpu_line()}.",
        "",
        "| | without remat | with remat | ratio |",
        "|---|---|---|---|",
        f"| step memory per image (GiB) | {plain['per_image'] / 2**30:.3f} | "
        f"{remat['per_image'] / 2**30:.3f} | "
        f"{plain['per_image'] / remat['per_image']:.1f}x less |",
        f"| fixed part: weights, gradients (GiB) | "
        f"{plain['fixed'] / 2**30:.2f} | {remat['fixed'] / 2**30:.2f} | |",
        f"| largest batch in {args.budget_gib:g} GiB (+ SGD momentum) | "
        f"{plain['fits']} | {remat['fits']} | "
        f"{(remat['fits'] / plain['fits']) if plain['fits'] else float('inf'):.1f}x |",
        f"| step time at batch {args.time_batch}, median of {args.rounds} "
        f"(s) | {median[False]:.2f} | {median[True]:.2f} | "
        f"{median[True] / median[False]:.2f}x |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
