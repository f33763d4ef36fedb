"""Trainer steps per second on the current Keras backend, next to plain
Keras ``model.fit`` on the same model, batch and optimizer in the same
process: the same short ViT-Ti/16 run (random weights, the pre-training
recipe, digits upsampled to the model's resolution) under TensorFlow, JAX
or torch.

    KERAS_BACKEND=jax python benchmarks/trainer_steps.py
    KERAS_BACKEND=torch python benchmarks/trainer_steps.py --image-size 96

The first ``--warmup`` steps (tracing, compilation) run untimed; then
``--rounds`` blocks of ``--steps`` steps each of the Trainer and of
``model.fit`` (the recipe's optimizer with its clipping in the optimizer,
the same tf.data batches; ``--no-peer`` skips it) are timed in turn, input
pipeline included, and the fastest block of each is reported (wall time,
and the process's CPU time per step). The machine may be shared: compare
the two figures of one run (``trainer_vs_fit``), not figures of different
runs. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def make_trainer(args):
    import keras_vit.train as kt

    common = dict(recipe="pretrain", weights=None,
                  image_size=args.image_size, batch_size=args.batch_size,
                  warmup_steps=1, crop_area=None, log_every=1000,
                  checkpoint_every=10_000, strategy=args.strategy,
                  verbose=False, dropout_rate=0.0)
    total = args.warmup + args.rounds * args.steps
    trainer = kt.Trainer(args.model, "digits", total_steps=total + 1,
                         **common)
    trainer.fit(stop_at_step=args.warmup)
    state = {"at": args.warmup}

    def run(steps):
        state["at"] += steps
        trainer.fit(stop_at_step=state["at"])

    return trainer, run


def make_fit(args):
    """``model.fit`` of a fresh copy of the model with the recipe's
    optimizer (clipping in the optimizer), on the Trainer's tf.data
    batches."""
    import keras

    import keras_vit.train as kt
    from keras_vit import zoo
    from keras_vit.train.data.pipeline import dataset, takes_raw_pixels

    keras.utils.set_random_seed(0)
    model = zoo.load(args.model, weights=None, image_size=args.image_size,
                     num_classes=10, dropout_rate=0.0)
    total = args.warmup + args.rounds * args.steps
    recipe = kt.compile_for_finetune(
        model, "pretrain", total_steps=total + 1, warmup_steps=1,
        batch_size=args.batch_size, crop_area=None, dropout_rate=0.0)
    ds = dataset("digits", args.image_size, recipe.batch_size,
                 crop_area=None, seed=0, raw_pixels=takes_raw_pixels(model))
    ds = ds.repeat()
    model.fit(ds, steps_per_epoch=args.warmup, epochs=1, verbose=0)

    def run(steps):  # a new pass over the data, as the Trainer's fit()
        model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)

    return model, run


def timed(run, steps):
    """``(wall seconds, process CPU seconds)`` per step of ``run(steps)``."""
    w, c = time.perf_counter(), time.process_time()
    run(steps)
    return ((time.perf_counter() - w) / steps,
            (time.process_time() - c) / steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViT-Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2,
                        help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed blocks of each (Trainer, fit)")
    parser.add_argument("--strategy", default="default")
    parser.add_argument("--no-peer", action="store_true",
                        help="time the Trainer only")
    args = parser.parse_args(argv)

    import keras

    trainer, runs = make_trainer(args)
    runs = {"trainer": runs}
    if not args.no_peer:
        runs["fit"] = make_fit(args)[1]
    # Interleaved blocks, so that a load that changes on a shared machine
    # weighs on both alike; the fastest block of each is reported.
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(timed(run, args.steps))
    best = {name: (min(w for w, _ in t), min(c for _, c in t))
            for name, t in times.items()}
    rate = 1.0 / best["trainer"][0]
    row = {
        "backend": keras.backend.backend(), "model": args.model,
        "image_size": args.image_size, "batch_size": args.batch_size,
        "strategy": trainer.info["name"],
        "steps": args.steps * args.rounds,
        "steps_per_second": round(rate, 3),
        "images_per_second": round(rate * args.batch_size, 2),
        "cpu_seconds_per_step": round(best["trainer"][1], 3)}
    if "fit" in best:
        peer = 1.0 / best["fit"][0]
        row["fit_steps_per_second"] = round(peer, 3)
        row["fit_cpu_seconds_per_step"] = round(best["fit"][1], 3)
        row["trainer_vs_fit"] = round(rate / peer, 3)
        row["trainer_vs_fit_cpu"] = round(best["fit"][1]
                                          / best["trainer"][1], 3)
    if keras.backend.backend() == "torch":
        import torch

        row["torch_threads"] = torch.get_num_threads()
    row["cpu_count"] = os.cpu_count()
    print(json.dumps(row))


if __name__ == "__main__":
    main()
