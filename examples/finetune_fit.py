"""Fine-tune a zoo model on your own image folder with ``model.fit`` and
the paper's fine-tuning recipe (SGD momentum 0.9, cosine schedule with
warm-up, global-norm clipping at 1, no weight decay), on one device or
several: under a ``tf.distribute`` strategy on TensorFlow (a TPU VM or
Colab TPU, several GPUs, or plain CPU), under ``keras.distribution`` on
JAX (data parallel, or model parallel with the big matrices split
Megatron-style over a ``model`` axis).

The folder holds one sub-folder per class (``flowers/daisy/*.jpg``,
``flowers/rose/*.jpg``, ...). At full size, on a TPU VM::

    python examples/finetune_fit.py --data flowers/ --strategy tpu \\
        --model ViT-B/16 --image-size 384 --batch-size 512 --steps 500

on a machine with GPUs: ``--strategy mirrored``; on one CPU: ``--strategy
default`` (the default). ``--cpu-devices 2 --strategy mirrored`` splits the
CPU into two logical devices, which is how the test runs it, tiny. On JAX
(a TPU VM or several GPUs)::

    KERAS_BACKEND=jax python examples/finetune_fit.py --data flowers/ \\
        --model ViT-L/16 --image-size 384 --parallel model --model-axis 4

(on a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` gives
JAX two devices.)

What to notice: on TensorFlow the model is built and compiled *inside*
``strategy.scope()``, so its variables and the optimizer's slots are
mirrored (or sharded on the TPU); on JAX the distribution is set before
the model is built, because Keras places each variable when it is
created. Either way ``model.fit`` then splits each global batch across
the replicas by itself.
"""

import argparse
import contextlib
import os


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True,
                   help="a folder with one sub-folder of images per class")
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--weights", default="auto",
                   help="'auto' (the released ones), none, a tag or a file")
    p.add_argument("--image-size", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=512,
                   help="global batch: split across the replicas")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--strategy", default="default",
                   choices=("tpu", "mirrored", "default"),
                   help="TensorFlow: the tf.distribute strategy")
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="TensorFlow: split the CPU into N logical devices "
                        "(testing)")
    p.add_argument("--parallel", default="data", choices=("data", "model"),
                   help="JAX: keras.distribution data or model parallel")
    p.add_argument("--model-axis", type=int, default=2,
                   help="JAX: devices per model replica with --parallel "
                        "model")
    p.add_argument("--out", default="finetuned.keras",
                   help="a .keras file, or a folder to save model.keras "
                        "in (missing folders are created)")
    args = p.parse_args(argv)
    # Checked before training, not after it: Keras saves only to a name
    # ending in .keras.
    out = args.out
    if not out.endswith(".keras"):
        if os.path.splitext(out)[1] and not os.path.isdir(out):
            p.error(f"--out must be a .keras file or a folder; received "
                    f"--out {out!r}")
        out = os.path.join(out, "model.keras")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    except OSError as e:
        p.error(f"--out {args.out!r}: cannot create its folder ({e})")

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    import keras_vit
    import keras_vit.train as kt

    on_jax = keras.backend.backend() == "jax"
    if not on_jax and args.cpu_devices:
        # Before anything creates a tensor (reading the data folder too):
        # logical devices are fixed then.
        kt.configure_cpu_devices(args.cpu_devices)
    train = kt.load_data(args.data)
    if on_jax:
        # DataParallel, or ModelParallel with the package's layout map of
        # this very model (the heads, mlp_dim and widths split over the
        # model axis).
        split = args.model_axis if args.parallel == "model" else 1
        sized = (dict(model=args.model, image_size=args.image_size,
                      num_classes=train.num_classes) if split > 1 else {})
        distribution = kt.distribution(model_parallel=split, **sized)
        keras.distribution.set_distribution(distribution)
        print(f"distribution: {type(distribution).__name__} over "
              f"{len(keras.distribution.list_devices())} devices")
        scope = contextlib.nullcontext()
    else:
        # TPUClusterResolver + TPUStrategy on a TPU VM / Colab TPU,
        # MirroredStrategy over the GPUs (or the logical CPUs), or none.
        strategy = kt.strategy(args.strategy)
        print(f"strategy: {kt.describe(strategy)}")
        print(f"replicas: {strategy.num_replicas_in_sync}")
        scope = strategy.scope()

    weights = None if args.weights == "none" else args.weights
    with scope:
        model = keras_vit.zoo.load(args.model, weights=weights,
                                   image_size=args.image_size,
                                   num_classes=train.num_classes)
        recipe = kt.compile_for_finetune(
            model, total_steps=args.steps, warmup_steps=max(1, args.steps // 10),
            batch_size=args.batch_size, learning_rate=args.learning_rate,
            label_names=train)  # the saved model names the data's classes

    # Inception crop + flip, scaled to [-1, 1], as in the paper; global
    # batches (model.fit gives each replica batch_size / replicas).
    ds = kt.dataset(train, args.image_size, recipe.batch_size)
    history = model.fit(ds.repeat(), steps_per_epoch=args.steps, epochs=1,
                        verbose=2)
    if on_jax:
        mlp = next(w for w in model.weights
                   if w.path.endswith("dense_0/kernel"))
        print(f"mlp kernel layout: {mlp.value.sharding.spec}")
    model.save(out)
    print(f"final loss: {history.history['loss'][-1]:.4f}")
    print(f"saved: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
