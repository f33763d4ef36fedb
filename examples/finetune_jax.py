"""Fine-tune a zoo model on an image folder with ``model.fit`` on the JAX
backend, over several devices with ``keras.distribution``: data parallel
(the batch split, weights replicated) or model parallel (the big matrices
split Megatron-style over a ``model`` axis, the batch over the rest).

At full size on a TPU VM or a machine with several GPUs::

    KERAS_BACKEND=jax python examples/finetune_jax.py --data flowers/ \\
        --model ViT-L/16 --image-size 384 --parallel model --model-axis 4

On a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` gives JAX
two devices (how the test runs it, tiny). The distribution is set before
the model is built: Keras places each variable when it is created.
"""

import argparse
import os


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True,
                   help="a folder with one sub-folder of images per class")
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--weights", default="auto",
                   help="'auto' (the released ones), none, a tag or a file")
    p.add_argument("--image-size", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--parallel", default="data", choices=("data", "model"))
    p.add_argument("--model-axis", type=int, default=2,
                   help="devices per model replica with --parallel model")
    args = p.parse_args(argv)

    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    import keras_vit.train as kt
    from keras_vit import zoo

    if keras.backend.backend() != "jax":
        p.error(f"keras.distribution needs KERAS_BACKEND=jax; this process "
                f"has {keras.backend.backend()!r}")
    train = kt.load_data(args.data)
    weights = None if args.weights == "none" else args.weights
    build = dict(weights=weights, image_size=args.image_size,
                 num_classes=train.num_classes)
    # DataParallel, or ModelParallel with the package's layout map of this
    # very model (the heads, mlp_dim and widths split over the model axis).
    model_parallel = args.model_axis if args.parallel == "model" else 1
    distribution = kt.distribution(model_parallel=model_parallel,
                                   model=args.model if model_parallel > 1
                                   else None,
                                   **({"image_size": args.image_size,
                                       "num_classes": train.num_classes}
                                      if model_parallel > 1 else {}))
    keras.distribution.set_distribution(distribution)
    print(f"distribution: {type(distribution).__name__} over "
          f"{len(keras.distribution.list_devices())} devices")

    model = zoo.load(args.model, **build)
    recipe = kt.compile_for_finetune(
        model, total_steps=args.steps, warmup_steps=max(1, args.steps // 10),
        batch_size=args.batch_size, learning_rate=args.learning_rate)
    ds = kt.dataset(train, args.image_size, recipe.batch_size)
    history = model.fit(ds.repeat(), steps_per_epoch=args.steps, epochs=1,
                        verbose=2)
    mlp = [w for w in model.weights if w.path.endswith("dense_0/kernel")][0]
    print(f"mlp kernel layout: {mlp.value.sharding.spec}")
    print(f"final loss: {history.history['loss'][-1]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
