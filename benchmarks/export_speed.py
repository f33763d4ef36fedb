"""Speed of the exported artifacts at each deployment precision, with
their agreement with Keras, in one markdown table.

    python benchmarks/export_speed.py                      # ViT-B/16 at 224
    python benchmarks/export_speed.py --model ViT-S/16 --repeats 7
    python benchmarks/export_speed.py --quick              # tiny, a smoke run

Rows: onnxruntime and LiteRT (XNNPACK), each at float32, float16, dynamic
int8 and static int8, every artifact exported (and verified) by
``keras_vit.export``. Speed columns: images/s at each batch size, the
median over ``--repeats`` rounds in which every artifact runs once per batch
size in turn (interleaved, so that load from other processes on a shared
machine falls on every row alike), and the ratio to the float32 artifact of
the same runtime. Threads: the cores this process may use.

Agreement with Keras is measured twice, because it means different things:

- on the benchmarked model (random weights, ``zoo.load(name,
  weights=None)`` with a random head, so that logits carry a signal): max
  abs difference and relative RMS error of the logits on crops of the
  sample photos. Its top-1 agreement is NOT a quality figure: the classes
  of a random model are near-ties, and the smallest error flips them. The
  export's top-1 criterion is therefore lifted for that model only;
- on a trained model (the demo's digits ViT, trained here for
  ``--digits-epochs`` epochs, its predictions confident): top-1 agreement
  with Keras on the 450 held-out digits, int8 calibrated on training
  digits. That column is the one that says whether a precision keeps the
  predictions. ``--quick`` trains the tiny ViT instead, on 256 digits.

The CPU's matrix features (avx512_vnni, avx512_bf16, amx_int8, amx_bf16)
are printed first: int8 speed-ups depend on VNNI / AMX.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

PRECISIONS = ("float32", "float16", "dynamic_int8", "int8")
RUNTIMES = {"onnx": ".onnx", "tflite": ".tflite"}
CPU_FLAGS = ("avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
             "amx_bf16")
TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=1,
            num_heads=4, mlp_dim=64, num_classes=10)


def cpu_flags():
    """``{flag: present}`` for CPU_FLAGS, as keras_vit.runtime.hardware
    reads them (/proc/cpuinfo)."""
    from keras_vit.runtime import hardware

    flags = hardware.cpu_flags()
    return {flag: flag in flags for flag in CPU_FLAGS}


def benchmark_model(name, quick):
    """The benchmarked model: random weights with a random head (see
    export_benchmark.py: the zoo's head starts at zero, which would make
    every logit equal); ``quick``: a tiny ViT, every weight perturbed."""
    if not quick:
        from export_benchmark import _model

        return _model(name)
    import keras

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.models.vit(**TINY)
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.1, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def digits_model(epochs, quick):
    """The demo's digits ViT (``quick``: the tiny ViT, on 256 digits)
    trained for ``epochs`` epochs; returns ``(model, x_train, x_test, test
    accuracy)``."""
    import keras

    import keras_vit
    from keras_vit.cli import demo

    keras.utils.set_random_seed(0)
    subset = (256, 64) if quick else None
    x_train, y_train, x_test, y_test = demo.load_digits_images(
        demo.IMAGE_SIZE, subset=subset)
    # --quick: the tiny ViT (16 tokens of width 32, one block; the demo's
    # has 64 of width 64 in 4 blocks), whose training and eight exports
    # take a third of the demo model's CPU time.
    model = (keras_vit.models.vit(**dict(TINY, image_size=demo.IMAGE_SIZE))
             if quick else demo.build_model(demo.IMAGE_SIZE))
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    logits = np.asarray(model.predict(x_test, batch_size=128, verbose=0))
    accuracy = float(np.mean(logits.argmax(-1) == y_test))
    return model, x_train, x_test, accuracy


def export_all(model, folder, runtimes, calibration, verify_data,
               int8_tolerance, say):
    """Exports ``model`` at every precision in every runtime; returns
    ``{(runtime, precision): report}``. ``int8_tolerance``: an override of
    the int8 rows' verification bounds, or None for the defaults."""
    from keras_vit import export

    reports = {}
    for runtime in runtimes:
        for precision in PRECISIONS:
            path = os.path.join(folder, f"{precision}{RUNTIMES[runtime]}")
            kwargs = dict(quantization=precision, outputs=("logits",))
            if precision == "int8":
                kwargs["representative_data"] = calibration
            if verify_data is not None:
                kwargs["verify_data"] = verify_data
            if int8_tolerance and precision in ("dynamic_int8", "int8"):
                kwargs["tolerance"] = int8_tolerance
            start = time.perf_counter()
            say(f"  exporting {runtime} {precision} ...")
            reports[runtime, precision] = export.export(
                model, path, format=runtime, **kwargs)
            say(f"    {time.perf_counter() - start:.0f} s, "
                f"{reports[runtime, precision]['file_size_mb']} MiB")
    return reports


def open_runtime(runtime, path, threads):
    if runtime == "onnx":
        from keras_vit.export.onnx import open_artifact
    else:
        from keras_vit.export.tflite import open_artifact
    return open_artifact(path, num_threads=threads)


def time_interleaved(runners, images, batches, repeats):
    """``{(key, batch): median seconds}``: one warm-up call per runner and
    batch, then ``repeats`` rounds in which each runs once per batch."""
    for run in runners.values():
        for batch in batches:
            run(images[:batch])
    times = {(key, b): [] for key in runners for b in batches}
    for _ in range(repeats):
        for key, run in runners.items():
            for batch in batches:
                start = time.perf_counter()
                run(images[:batch])
                times[key, batch].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def table(reports, speed, batches, agreement):
    head = (["format", "precision", "file MiB"]
            + [f"img/s b{b}" for b in batches]
            + [f"x fp32 b{b}" for b in batches]
            + ["max abs diff", "rel RMS", "top-1 (random model)",
               "top-1 (trained digits)"])
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for runtime, precision in reports:
        r = reports[runtime, precision]
        # From the bytes, three significant digits under 1 MiB: a tiny
        # model's int8 file (--quick) would print as 0.0.
        size = r["file_size"] / 2**20
        cells = [runtime, precision,
                 f"{size:.1f}" if size >= 1 else f"{size:.3g}"]
        rate = {b: b / speed[(runtime, precision), b] for b in batches}
        base = {b: b / speed[(runtime, "float32"), b] for b in batches}
        cells += [f"{rate[b]:.2f}" for b in batches]
        cells += [f"{rate[b] / base[b]:.2f}" for b in batches]
        cells += [f"{r['max_abs_diff']['logits']:.3g}",
                  f"{r['rel_rms_error']['logits']:.3g}",
                  f"{r['top1_agreement']:.3f}"]
        trained = agreement.get((runtime, precision))
        cells.append("-" if trained is None else f"{trained:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B/16",
                        help="zoo name (random weights); default ViT-B/16")
    parser.add_argument("--batches", default="1,8",
                        help="batch sizes, comma-separated (default 1,8)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved rounds; the median is kept")
    parser.add_argument("--runtimes", default="onnx,tflite")
    parser.add_argument("--calibration-samples", type=int, default=32,
                        help="images calibrating static int8 (default 32)")
    parser.add_argument("--digits-epochs", type=int, default=15,
                        help="epochs of the trained digits model whose "
                             "agreement is measured; 0 skips it")
    parser.add_argument("--threads", type=int,
                        default=len(os.sched_getaffinity(0)),
                        help="runtime threads (default: usable cores)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model and 2 repeats: checks the script")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    runtimes = [r for r in args.runtimes.split(",") if r]
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad or not runtimes or not batches or min(batches) < 1:
        parser.error(f"--runtimes takes {sorted(RUNTIMES)} and --batches "
                     f"positive integers; received --runtimes "
                     f"{args.runtimes} --batches {args.batches}")
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.digits_epochs = min(args.digits_epochs, 1)
        args.calibration_samples = min(args.calibration_samples, 8)

    def say(message):
        print(message, file=sys.stderr, flush=True)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import onnxruntime
    from speed import cpu_model

    from keras_vit.export import common, samples

    flags = cpu_flags()
    label = "tiny ViT (quick)" if args.quick else args.model
    header = [
        f"# Exported artifacts: {label}, speed and agreement with Keras",
        "",
        f"- command: `python benchmarks/export_speed.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
        f"- CPU: {cpu_model()}; "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items()),
        f"- threads: {args.threads} (of {os.cpu_count()} cores, "
        f"{len(os.sched_getaffinity(0))} usable); median of {args.repeats} "
        "interleaved rounds",
        f"- onnxruntime {onnxruntime.__version__}; "
        + ", ".join(f"{k} {v}" for k, v in common.versions().items()
                    if k in ("tensorflow", "ai-edge-litert", "tf2onnx")),
    ]
    print("\n".join(header), flush=True)

    with tempfile.TemporaryDirectory(prefix="export_speed_") as folder:
        say(f"building {label} ...")
        model = benchmark_model(args.model, args.quick)
        shape = tuple(model.inputs[0].shape[1:])
        pixels, _ = samples.photo_images(shape, args.calibration_samples,
                                        seed=0)
        calibration = samples.to_input_range(pixels, "float32", samples.UNIT)
        # Every row compared on the same images (other crops than the
        # calibration's).
        pixels, _ = samples.photo_images(shape, 32, seed=1)
        verify_images = samples.to_input_range(pixels, "float32", samples.UNIT)
        os.mkdir(os.path.join(folder, "main"))
        # A random model's top-1 is a near-tie: no agreement bound.
        reports = export_all(model, os.path.join(folder, "main"), runtimes,
                             calibration, verify_images,
                             {"top1_agreement": None}, say)

        agreement, accuracy = {}, None
        if args.digits_epochs > 0:
            say(f"training the digits model for {args.digits_epochs} "
                "epochs ...")
            digits, x_train, x_test, accuracy = digits_model(
                args.digits_epochs, args.quick)
            os.mkdir(os.path.join(folder, "digits"))
            rng = np.random.default_rng(0)
            chosen = rng.choice(len(x_train), min(100, len(x_train)),
                                replace=False)
            # --quick trains one epoch on 256 digits: its logits are small
            # and near-tied, so int8 noise is large relative to them (ONNX
            # dynamic int8 measured 0.64 relative RMS). The smoke run keeps
            # only the bound a broken artifact fails (RMS near or above 1);
            # the full run checks the default bounds.
            loose = ({"top1_agreement": None, "rel_rms_error": 1.0}
                     if args.quick else None)
            trained = export_all(digits, os.path.join(folder, "digits"),
                                 runtimes, x_train[chosen], x_test, loose,
                                 say)
            agreement = {k: r["top1_agreement"] for k, r in trained.items()}

        say("timing ...")
        images, _ = samples.photo_images(shape, max(batches), seed=2)
        images = samples.to_input_range(images, "float32", samples.UNIT)
        runners = {key: open_runtime(key[0], r["path"], args.threads)
                   for key, r in reports.items()}
        speed = time_interleaved(runners, images, batches, args.repeats)

    print()
    print(table(reports, speed, batches, agreement))
    print()
    print("Agreement columns: max abs diff / rel RMS error of the logits "
          "and top-1 (random model) on 32 crops of the sample photos of "
          "scikit-learn/scikit-image, vs Keras float32; the random model's "
          "top-1 agreement is not a quality figure (near-tie classes).")
    if accuracy is not None:
        n = len(x_test)
        which = "the tiny ViT (quick)" if args.quick else (
            "the demo's digits ViT")
        print(f"top-1 (trained digits): {which} trained "
              f"{args.digits_epochs} epochs (Keras test accuracy "
              f"{accuracy:.3f}), agreement with Keras on its {n} held-out "
              "digits; int8 calibrated on 100 training digits.")
    print("float16 stores the weights in half precision; both runtimes "
          "compute in float32 on this CPU. Static int8: onnxruntime "
          "QOperator with per-channel weights; LiteRT full int8 with "
          "LayerNorm, softmax, attention matmuls and residual adds float.")
    return 0


if __name__ == "__main__":
    from speed_tables import exit_now

    exit_now(main())
