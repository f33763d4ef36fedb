"""Keras 3's model features on keras_vit beside keras-hub's ViT, in one run
on one machine: ``model.quantize(mode)`` (output error and forward speed
per mode) and LoRA (trainable share at rank 8, and digits fine-tuning
with LoRA against full fine-tuning). Prints markdown tables naming the CPU.

    python benchmarks/keras_features.py                 # ViT-Ti/16 @224
    python benchmarks/keras_features.py --quick         # smoke test
    python benchmarks/keras_features.py --skip-finetune   # or --only-finetune

Both models hold the same random weights (``keras_vit.zoo.to_keras_hub``
copies them; a random head, so the logits are not all zero) and the same
images, and use the exact GELU (keras-hub's only form). The error is the
largest logit difference to the float model of the same library, over the
largest float logit. Speed: the median forward time of a batch in a
``tf.function`` graph, the two libraries' calls alternating (the machine
is shared and noisy; the ratios within one run are what count).

Fine-tuning (the paper's protocol on scikit-learn's digits): a ViT of
ViT-Ti's width is trained at 32 px, loaded at 48 px (position table
resized), and fine-tuned in full or with rank-8 LoRA on the queries and
values (``keras_vit.models.lora``; the head and the resized position
table train in full).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

VIT_TI16 = dict(image_size=224, patch_size=16, hidden_size=192,
                num_layers=12, num_heads=3, mlp_dim=768)
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=2, mlp_dim=64)
MODES = ("float32", "int8", "int4", "float8")


def cpu_line():
    from keras_vit.runtime import hardware

    name = hardware.cpu_model() or "unknown CPU"
    flags = hardware.cpu_flags()
    units = sorted(flags & {"amx_bf16", "amx_int8", "avx512_bf16",
                            "avx512_vnni", "avx_vnni"})
    return (f"{name}, {os.cpu_count()} CPUs, flags: "
            f"{' '.join(units) or 'no bf16/int8 units'}")


def _graph(model):
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=False))


def _quantize(lib, model, mode):
    if mode == "float32":
        return
    if lib == "keras_vit":
        model.quantize(mode)
    else:   # keras-hub's classifier holds an unbuilt preprocessor
        model.backbone.quantize(mode)
        model.output_dense.quantize(mode)


def quantize_table(args):
    import keras
    import keras_vit
    from keras_vit import zoo

    arch = TINY if args.quick else VIT_TI16
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    base = keras_vit.models.vit(num_classes=1000, gelu="exact", **arch)
    for w in base.weights:
        if w.path.startswith("head/"):
            w.assign((0.05 * rng.standard_normal(w.shape)).astype(w.dtype))
    size = arch["image_size"]
    x = rng.uniform(-1, 1, (args.batch, size, size, 3)).astype("float32")
    rows = []
    floats = {}
    for mode in MODES:
        models = {"keras_vit": base.__class__.from_config(base.get_config()),
                  "keras_hub": None}
        models["keras_vit"].set_weights(base.get_weights())
        models["keras_hub"] = zoo.to_keras_hub(base)
        fns, counts = {}, {}
        for lib, model in models.items():
            _quantize(lib, model, mode)
            counts[lib] = sum(1 for layer in model._flatten_layers()
                              if getattr(layer, "quantization_mode", None))
            fns[lib] = _graph(model)
            out = keras.ops.convert_to_numpy(fns[lib](x))   # traces
            if mode == "float32":
                floats[lib] = out
            err = float(np.max(np.abs(out - floats[lib]))
                        / np.max(np.abs(floats[lib])))
            rows.append({"mode": mode, "lib": lib, "layers": counts[lib],
                         "error": err, "times": []})
        for _ in range(args.runs):
            for lib in ("keras_vit", "keras_hub"):
                t0 = time.perf_counter()
                keras.ops.convert_to_numpy(fns[lib](x))
                row = next(r for r in rows
                           if r["mode"] == mode and r["lib"] == lib)
                row["times"].append(time.perf_counter() - t0)
    what = ("tiny ViT @32 (--quick: checks the script, not the figures)"
            if args.quick else "ViT-Ti/16 @224")
    print(f"\n### model.quantize: {what}, batch {args.batch}, median of "
          f"{args.runs}\n")
    print("| mode | library | quantized layers | max logit error / max "
          "logit | forward ms | img/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        med = statistics.median(r["times"])
        print(f"| {r['mode']} | {r['lib']} | {r['layers']} | "
              f"{100 * r['error']:.2f}% | {1000 * med:.1f} | "
              f"{args.batch / med:.1f} |")


def lora_share_table(args):
    import keras
    import keras_vit
    from keras_vit import zoo
    from keras_vit.models import lora

    arch = TINY if args.quick else VIT_TI16
    keras.utils.set_random_seed(0)
    ours = keras_vit.models.vit(num_classes=1000, gelu="exact", **arch)
    hub = zoo.to_keras_hub(ours)
    report = lora.enable_lora(ours, rank=8, targets=["query", "value"])
    hub.backbone.enable_lora(8)   # keras-hub's default: query and value
    for w in hub.weights:         # its head trains too, as ours
        if w.path.startswith(hub.output_dense.name + "/"):
            w.trainable = True

    def share(model):
        total = sum(int(np.prod(w.shape)) for w in model.weights)
        train = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        return train, total

    print("\n### LoRA rank 8 on the queries and values, head trained\n")
    print("| library | trainable | total | share |")
    print("|---|---|---|---|")
    print(f"| keras_vit | {report['trainable']:,} | {report['total']:,} | "
          f"{100 * report['fraction']:.2f}% |")
    train, total = share(hub)
    print(f"| keras_hub | {train:,} | {total:,} | {100 * train / total:.2f}% "
          "|")


def finetune_table(args):
    import tempfile

    import keras
    import keras_vit
    from keras_vit import zoo
    from keras_vit.cli.demo import load_digits_images
    from keras_vit.models import lora

    layers, epochs = (2, 2) if args.quick else (4, 10)
    pretrain_epochs = 2 * epochs if args.quick else 40
    keras.utils.set_random_seed(0)
    x32, y32, _, _ = load_digits_images(32)
    x48, y48, x_test, y_test = load_digits_images(48)

    def build(size):
        return keras_vit.models.vit(size, 8, 192, layers, 3, 384, 10)

    def compiled(model, lr):
        model.compile(keras.optimizers.Adam(lr),
                      keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True), metrics=["accuracy"])
        return model

    def accuracy(model):
        pred = np.argmax(model.predict(x_test, verbose=0), -1)
        return float(np.mean(pred == y_test))

    base = compiled(build(32), 1e-3)
    base.fit(x32, y32, batch_size=64, epochs=pretrain_epochs, verbose=0)
    _, _, x32_test, _ = load_digits_images(32)
    pre = float(np.mean(np.argmax(base.predict(x32_test, verbose=0), -1)
                        == y_test))
    path = os.path.join(tempfile.mkdtemp(), "base.npz")
    zoo.save_npz(base, path)

    def at_48():
        model = build(48)
        zoo.load_weights(model, path)
        return model

    rows = [("pre-trained, evaluated at 32", "-", pre, 0.0),
            ("pre-trained at 32, evaluated at 48", "-", accuracy(at_48()),
             0.0)]
    for name, lr, targets in (("full fine-tuning, lr 1e-3", 1e-3, None),
                              ("LoRA rank 8, query + value, lr 1e-2", 1e-2,
                               ["query", "value"]),
                              ("LoRA rank 8, query + value, lr 3e-3", 3e-3,
                               ["query", "value"]),
                              ("LoRA rank 8, MLP, lr 1e-2", 1e-2, "mlp"),
                              ("LoRA rank 8, MLP, lr 3e-3", 3e-3, "mlp"),
                              ("LoRA rank 8, all projections, lr 3e-3", 3e-3,
                               "all")):
        model = at_48()
        share = 1.0
        if targets is not None:
            share = lora.enable_lora(
                model, rank=8, targets=targets,
                train=["head", "position_embedding"])["fraction"]
        t0 = time.perf_counter()
        compiled(model, lr).fit(x48, y48, batch_size=64, epochs=epochs,
                                verbose=0)
        rows.append((name, f"{100 * share:.1f}%", accuracy(model),
                     time.perf_counter() - t0))
    print(f"\n### Fine-tuning on digits at 48 px: width 192, MLP 384, "
          f"{layers} blocks, {epochs} epochs (pre-trained {pretrain_epochs} "
          "at 32)\n")
    print("| run | trainable | test accuracy | fit s |")
    print("|---|---|---|---|")
    for name, share, acc, secs in rows:
        print(f"| {name} | {share} | {100 * acc:.1f}% | {secs:.0f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-finetune", action="store_true")
    parser.add_argument("--only-finetune", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = min(args.runs, 3)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    warnings.filterwarnings("ignore", message="quantize\\(")
    # keras-hub goes through Keras' own loop: one warning per layer.
    warnings.filterwarnings("ignore", message=".*quantiz")
    import keras

    print(f"keras {keras.__version__}, backend {keras.backend.backend()}; "
          f"{cpu_line()}")
    print(f"command: python benchmarks/keras_features.py "
          f"{' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    if not args.only_finetune:
        quantize_table(args)
        lora_share_table(args)
    if not args.skip_finetune:
        finetune_table(args)


if __name__ == "__main__":
    main()
