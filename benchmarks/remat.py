"""Rematerialisation: a training step's memory and time with and without
``remat=True``.

Memory is what the step keeps for its backward pass: the residuals of the
model's VJP (``jax.vjp`` on the JAX backend, shapes only through
``jax.eval_shape``, so nothing is compiled or allocated). That is the
activation memory remat exists to cut, the same on any XLA device. At two
batch sizes it gives a per-image part, and the largest batch whose
residuals fit a budget (``--budget-gib``, 16 by default) beside the
weights, their gradients and SGD momentum. XLA's compiled memory analysis
is printed too: on the CPU backend XLA folds the recomputation back into
the forward pass (the two compiled programs are the same), so only an
accelerator's compiled figure shows remat there.

The step time is measured where the recomputation really runs: a PyTorch
backend child (``torch.utils.checkpoint`` recomputes each block), the two
settings in alternating rounds at ``--time-batch`` images; the ratio is
the cost of running each block's forward twice.

    python benchmarks/remat.py                          # ViT-L/16, 384 px
    python benchmarks/remat.py --model ViT-Ti/16 --image-size 64
    python benchmarks/remat.py --model ViT-Ti/16 --image-size 32 \
        --num-layers 2 --rounds 1                       # tests the script

Prints a Markdown table (``--out FILE`` writes it too) naming the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-L/16")
    p.add_argument("--image-size", type=int, default=384)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-layers", type=int,
                   help="blocks (default: the model's own); fewer makes a "
                   "quick run that tests the script")
    p.add_argument("--batches", default="1,2", help="two batch sizes whose "
                   "compiled memory gives the per-image slope")
    p.add_argument("--budget-gib", type=float, default=16.0)
    p.add_argument("--time-batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--time-child", action="store_true",
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batches = tuple(int(b) for b in args.batches.split(","))
    if len(args.batches) != 2 or args.batches[0] >= args.batches[1]:
        p.error(f"--batches must be two increasing sizes, got {args.batches}")
    if args.rounds < 1 or args.time_batch < 1:
        p.error("--rounds and --time-batch must be positive")
    if args.num_layers is not None and args.num_layers < 1:
        p.error(f"--num-layers must be positive, got {args.num_layers}")
    return args


def _model(args, remat):
    import keras_vit

    layers = {} if args.num_layers is None else {
        "num_layers": args.num_layers}
    return keras_vit.zoo.load(args.model, weights=None,
                               image_size=args.image_size,
                               num_classes=args.num_classes, remat=remat,
                               **layers)


def _loss_fn(model):
    import jax
    import jax.numpy as jnp

    def loss(trainable, non_trainable, images, labels):
        logits, _ = model.stateless_call(trainable, non_trainable, images,
                                         training=True)
        logp = jax.nn.log_softmax(logits.astype("float32"))
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return loss


def _inputs(model, batch, size):
    import jax
    import jax.numpy as jnp

    return ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32),
            jax.ShapeDtypeStruct((batch,), jnp.int32))


def residual_bytes(model, batch, size):
    """Bytes the step keeps for the backward pass at ``batch`` images: the
    leaves of the VJP closure (the weights among them), from shapes
    alone."""
    import jax
    import numpy as np

    loss = _loss_fn(model)

    def vjp(trainable, other, images, labels):
        return jax.vjp(lambda t: loss(t, other, images, labels), trainable)[1]

    leaves = jax.tree_util.tree_leaves(jax.eval_shape(
        vjp, *_inputs(model, batch, size)))
    return sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize
               for leaf in leaves)


def compiled_bytes(model, batch, size):
    import jax

    analysis = jax.jit(jax.grad(_loss_fn(model))).lower(
        *_inputs(model, batch, size)).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)


def measure(args, remat):
    import numpy as np

    model = _model(args, remat)
    b1, b2 = args.batches
    start = time.perf_counter()
    r1, r2 = (residual_bytes(model, b, args.image_size) for b in (b1, b2))
    per_image = (r2 - r1) / (b2 - b1)
    compiled = compiled_bytes(model, b2, args.image_size)
    print(f"  remat={remat}: kept {r2 / 2**30:.2f} GiB at batch {b2}, "
          f"compiled {compiled / 2**30:.2f} GiB "
          f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    # What the closure keeps whatever the batch (the weights, once), their
    # gradients and SGD momentum.
    budget = (args.budget_gib * 2**30 - (r1 - b1 * per_image)
              - 2 * weights)
    return {"per_image": per_image, "weights": weights, "budget": budget,
            "compiled": compiled, "blocks": model.num_layers}


def largest_batch(budget, per_image):
    return max(0, int(budget // per_image)) if per_image > 0 else None


def time_child(args):
    """In a torch process: the median training-step time of each setting,
    as JSON on stdout."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    images = torch.tensor(rng.uniform(-1, 1, (
        args.time_batch, args.image_size, args.image_size, 3)),
        dtype=torch.float32)
    labels = torch.tensor(rng.integers(0, args.num_classes, args.time_batch))
    models = {remat: _model(args, remat) for remat in (False, True)}

    def step(model):
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        logits = model(images, training=True)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        return time.perf_counter() - start

    for model in models.values():
        step(model)  # warm-up
    times = {False: [], True: []}
    for _ in range(args.rounds):  # alternating: drift hits both alike
        for remat, model in models.items():
            times[remat].append(step(model))
    print(json.dumps({str(k): statistics.median(v) for k, v in times.items()}))
    return 0


def step_times(args, argv):
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__),
                           *argv, "--time-child"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the torch timing child failed:\n"
                         f"{proc.stderr[-3000:]}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    return times["False"], times["True"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.time_child:
        return time_child(args)
    os.environ["KERAS_BACKEND"] = "jax"
    from keras_vit.runtime import hardware

    results = {remat: measure(args, remat) for remat in (False, True)}
    plain_s, remat_s = step_times(args, argv)
    plain, remat = results[False], results[True]
    # The backward pass of a rematerialised block recomputes it: at its
    # peak it holds every block's input and one block's activations.
    peak = remat["per_image"] + plain["per_image"] / plain["blocks"]
    plain["fits"] = largest_batch(plain["budget"], plain["per_image"])
    remat["fits"] = largest_batch(remat["budget"], peak)
    ratio = (remat["fits"] / plain["fits"]) if plain["fits"] else float("inf")
    blocks = ("" if args.num_layers is None
              else f" ({plain['blocks']} blocks)")
    lines = [
        f"Training step of {args.model}{blocks} at {args.image_size} px, "
        f"{args.num_classes} classes: activations kept for the backward "
        f"pass (JAX VJP residuals at batches {args.batches[0]} and "
        f"{args.batches[1]}), step time on the PyTorch backend; CPU: "
        f"{hardware.detect().describe()}.",
        "",
        "| | without remat | with remat | ratio |",
        "|---|---|---|---|",
        f"| kept for backward, per image (GiB) | "
        f"{plain['per_image'] / 2**30:.3f} | "
        f"{remat['per_image'] / 2**30:.3f} | "
        f"{plain['per_image'] / remat['per_image']:.1f}x less |",
        f"| weights (GiB; x3 with gradients and momentum) | "
        f"{plain['weights'] / 2**30:.2f} | {remat['weights'] / 2**30:.2f} | |",
        f"| peak per image in the backward pass (GiB; with remat: kept "
        f"+ one block's activations) | {plain['per_image'] / 2**30:.3f} | "
        f"{peak / 2**30:.3f} | {plain['per_image'] / peak:.1f}x less |",
        f"| largest batch in {args.budget_gib:g} GiB | {plain['fits']} | "
        f"{remat['fits']} | {ratio:.1f}x |",
        f"| XLA CPU compiled step at batch {args.batches[1]} (GiB) | "
        f"{plain['compiled'] / 2**30:.2f} | {remat['compiled'] / 2**30:.2f} "
        "| (XLA:CPU folds the recomputation away) |",
        f"| step time at batch {args.time_batch}, median of {args.rounds} "
        f"(s, PyTorch backend) | {plain_s:.2f} | {remat_s:.2f} | "
        f"{remat_s / plain_s:.2f}x |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    from speed_tables import exit_now

    exit_now(main())
