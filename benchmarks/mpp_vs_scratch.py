"""Masked patch prediction vs. training from scratch, at the same
fine-tuning budget, on scikit-learn's digits (offline).

1. Pre-train the demo's narrowed ViT-Ti/4 at 32x32 (64 patches of 4x4
   pixels, see keras_vit/cli/demo.py) by masked patch prediction on the 1347
   training images, their labels unused (paper Appendix B.1.2: 50% of the
   patches corrupted, 80/10/10, 3-bit mean colour targets).
2. Fine-tune its encoder with a zero-initialised head, and the same
   architecture from random weights, with the same recipe, steps, batches
   and seeds: the paper's fine-tuning recipe (SGD momentum 0.9, cosine
   decay, clipping at norm 1), at each learning rate of ``--lrs``.
3. Print a table: top-1 accuracy on the 450 held-out digits, and times.
   ``--labels N`` fine-tunes on the first N labelled images only (the
   pre-training still sees all 1347 images, unlabelled).

    python benchmarks/mpp_vs_scratch.py                  # ~7 min on 2 cores
    python benchmarks/mpp_vs_scratch.py --pretrain-steps 100 --finetune-steps 50

Scaling of the paper's recipe (Adam, 2e-4, 10k warmup, cosine, batch 4096,
1M steps) to this size: batch 64, warmup 10% of the steps, learning rate
1e-3 (what trains this tiny ViT from scratch in keras_vit.cli.demo; 2e-4 is for
batch 4096 and 86M parameters).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pretrain-steps", type=int, default=800)
    p.add_argument("--pretrain-batch", type=int, default=64)
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--target", default="mean_color")
    p.add_argument("--finetune-steps", type=int, default=200)
    p.add_argument("--finetune-batch", type=int, default=32)
    p.add_argument("--lrs", default="0.01,0.03",
                   help="fine-tuning learning rates, comma-separated")
    p.add_argument("--labels", type=int, default=None,
                   help="fine-tune on the first N training images only")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = _args(argv)
    import keras

    import keras_vit.train as kt
    from keras_vit.cli import demo

    common = dict(crop_area=None, flip=False, strategy="default",
                  verbose=False, seed=args.seed)
    print(f"model: {demo.MODEL_NAME} {demo.ARCH} at {demo.IMAGE_SIZE}x"
          f"{demo.IMAGE_SIZE}; data: digits (1347 train / 450 test)",
          flush=True)

    keras.utils.set_random_seed(args.seed)
    t0 = time.perf_counter()
    pre = kt.pretrain_mpp(
        demo.build_model(demo.IMAGE_SIZE), "digits", target=args.target,
        total_steps=args.pretrain_steps,
        warmup_steps=max(1, args.pretrain_steps // 10),
        batch_size=args.pretrain_batch, learning_rate=args.pretrain_lr,
        **common)
    pre_time = time.perf_counter() - t0
    history = pre.metrics["history"]
    print(f"pre-training: {args.pretrain_steps} steps of "
          f"{args.pretrain_batch}, loss {history[0]['loss']:.3f} -> "
          f"{history[-1]['loss']:.3f}, corrupted patches right "
          f"{history[-1]['accuracy']:.3f} ({pre_time:.0f}s)", flush=True)

    train = kt.digits("train")
    if args.labels:
        train = train.subset(np.arange(min(args.labels, train.num_examples)))
    rows = []
    for lr in (float(v) for v in args.lrs.split(",")):
        for init in ("mpp", "scratch"):
            keras.utils.set_random_seed(args.seed)
            model = (kt.mpp_to_classifier(pre.model, num_classes=10)
                     if init == "mpp" else demo.build_model(demo.IMAGE_SIZE))
            t0 = time.perf_counter()
            run = kt.fine_tune(
                model, train, "digits:test", recipe="finetune",
                total_steps=args.finetune_steps,
                warmup_steps=max(1, args.finetune_steps // 10),
                batch_size=args.finetune_batch, learning_rate=lr, **common)
            rows.append((lr, init, run.metrics["eval"]["accuracy"],
                         time.perf_counter() - t0))
            print(f"fine-tune lr {lr:g} from {init}: accuracy "
                  f"{rows[-1][2]:.4f} ({rows[-1][3]:.0f}s)", flush=True)

    labels = train.num_examples
    print()
    print(f"| init | pre-train steps (batch {args.pretrain_batch}) | "
          f"fine-tune steps (batch {args.finetune_batch}, {labels} labels) "
          "| fine-tune lr | test accuracy | time |")
    print("|---|---|---|---|---|---|")
    for lr, init, acc, secs in rows:
        steps = args.pretrain_steps if init == "mpp" else 0
        spent = secs + (pre_time if init == "mpp" else 0.0)
        print(f"| {'MPP' if init == 'mpp' else 'scratch'} | {steps} | "
              f"{args.finetune_steps} | {lr:g} | {acc:.4f} | "
              f"{spent:.0f}s{' (incl. pre-training)' if init == 'mpp' else ''}"
              " |")
    best = {init: max(a for _, i, a, _ in rows if i == init)
            for init in ("mpp", "scratch")}
    print(f"\nbest over the learning rates: MPP {best['mpp']:.4f}, scratch "
          f"{best['scratch']:.4f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
