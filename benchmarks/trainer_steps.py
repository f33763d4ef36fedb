"""Trainer steps per second on the current Keras backend: the same short
ViT-Ti/16 run (random weights, the pre-training recipe, digits upsampled
to the model's resolution) under TensorFlow, JAX or torch.

    KERAS_BACKEND=jax python benchmarks/trainer_steps.py
    KERAS_BACKEND=torch python benchmarks/trainer_steps.py --image-size 96

The first ``--warmup`` steps (tracing, compilation) run untimed; the next
``--steps`` are timed as one block, input pipeline included. Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViT-Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--strategy", default="default")
    args = parser.parse_args(argv)

    import keras

    import keras_vit.train as kt

    common = dict(recipe="pretrain", weights=None,
                  image_size=args.image_size, batch_size=args.batch_size,
                  warmup_steps=1, crop_area=None, log_every=1000,
                  checkpoint_every=10_000, strategy=args.strategy,
                  verbose=False, dropout_rate=0.0)
    total = args.warmup + args.steps
    trainer = kt.Trainer(args.model, "digits", total_steps=total, **common)
    trainer.fit(stop_at_step=args.warmup)
    t0 = time.perf_counter()
    trainer.fit(stop_at_step=total)
    wall = time.perf_counter() - t0
    print(json.dumps({
        "backend": keras.backend.backend(), "model": args.model,
        "image_size": args.image_size, "batch_size": args.batch_size,
        "strategy": trainer.info["name"], "steps": args.steps,
        "steps_per_second": round(args.steps / wall, 3),
        "images_per_second": round(args.steps * args.batch_size / wall, 2),
        "cpu_count": os.cpu_count()}))


if __name__ == "__main__":
    main()
