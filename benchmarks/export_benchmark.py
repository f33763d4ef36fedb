"""Export ViT-B/16 and ViT-L/16 (and ViT-H/14 with --include-huge) to every
format and print time, peak memory and file size per export; with
``--speed``, time the OpenVINO exports beside keras_vit's own predict and
timm instead.

Each export runs in its own child process, so that one export's peak does
not carry over to the next; the peak is the child's (and, for ONNX, its
converter process's) maximum resident memory. Models have random weights
(``keras_vit.zoo.load(name, weights=None)``) with a random head, so that
the verification compares non-trivial logits.

    python benchmarks/export_benchmark.py                   # B/16 and L/16
    python benchmarks/export_benchmark.py --include-huge --formats onnx
    python benchmarks/export_benchmark.py --models ViT-B/16 --baseline
    python benchmarks/export_benchmark.py --speed           # OpenVINO vs timm
    python benchmarks/export_benchmark.py --speed --quick   # tiny, a smoke run

``--baseline`` adds, for the first model, a plain
``tf2onnx.convert.from_function`` conversion (what the first try did) to
compare memory with the exporter's route. Not a test: it takes tens of
minutes and most of the machine's memory.

``--speed`` measures ViT-B/16 at 224 (``--size``), batch 8 (``--batch``):
the verified OpenVINO float32 and bfloat16 exports (compiled with the
precision hint each records), keras_vit's ``model.predict`` in float32
and bfloat16 (the path ``keras_vit.runtime.hardware.plan`` picks) and timm
(eager, ``inference_mode``; float32 and bf16 autocast), in interleaved
rounds (benchmarks/speed.py's runner: every path once per round, so that
load from other processes falls on every row alike), and prints one
markdown table with the CPU's matrix features. torch and timm are
imported before TensorFlow (see benchmarks/speed_peers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "saved_model": [None],
    "tflite": ["float32", "float16", "dynamic_int8", "int8"],
    "onnx": [None],
    "openvino": ["float32", "bfloat16", "int8"],
}
EXTENSIONS = {"saved_model": "", "tflite": ".tflite", "onnx": ".onnx",
              "openvino": ".xml"}


def _model(name):
    import keras_vit

    return _random_head(keras_vit.zoo.load(name, weights=None))


def _random_head(model):
    """The zoo's head starts at zero (as fine-tuning does); random values
    make the logits, and so the verification, non-trivial."""
    import numpy as np

    head = model.get_layer("head")
    rng = np.random.default_rng(0)
    head.kernel.assign(rng.normal(0, 0.02, head.kernel.shape).astype(
        "float32"))
    return model


def child(args):
    """One export in this (child) process; prints its report as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    model = _model(args.model)
    build = time.perf_counter() - start
    if args.format == "baseline":
        report = _baseline(model, args.path)
    else:
        from keras_vit import export

        kwargs = {}
        if args.variant:
            # OpenVINO names its variants precisions.
            kwargs["precision" if args.format == "openvino"
                   else "quantization"] = args.variant
            if args.variant == "int8" and args.format != "openvino":
                kwargs["representative_samples"] = args.samples
            if args.variant in ("dynamic_int8", "int8"):
                # Random weights and a random 1000-class head give logits
                # with tiny margins, so top-1 flips between near-ties say
                # little; the table shows the agreement, and the relative
                # RMS error (garbage is near 1) is still enforced.
                kwargs["tolerance"] = {"top1_agreement": None}
        try:
            report = export.export(model, args.path, format=args.format,
                                   **kwargs)
        except export.ExportError as e:
            report = dict(e.report or {}, error=str(e)[:500])
    report["build_seconds"] = round(build, 1)
    print("REPORT " + json.dumps(report, default=str), flush=True)
    return 0


def _baseline(model, path):
    """A plain tf2onnx conversion, as in the first try (no verification)."""
    import tensorflow as tf
    import tf2onnx

    from keras_vit.export import common, memory

    size = model.inputs[0].shape[1]
    spec = [tf.TensorSpec((None, size, size, 3), tf.float32, name="images")]
    fn = tf.function(lambda x: model(x, training=False), input_signature=spec)
    times = {}
    with memory.PeakRSS() as rss, common.timer(times, "conversion_seconds"):
        proto, _ = tf2onnx.convert.from_function(fn, input_signature=spec,
                                                 opset=17)
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())
    return {"format": "onnx", "options": {"route": "plain tf2onnx"},
            "file_size": os.path.getsize(path), "peak_rss_mb":
            memory.mib(rss.peak), **times, "verified": False}


def _run_child(model, fmt, variant, path, samples):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, fmt,
           variant or "-", path, "--samples", str(samples)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    out_lines = []
    # Reading stdout to the end, then wait4 for the child's peak memory
    # (on Linux it starts at this process's RSS: this one imports no
    # backend before it starts the children).
    for line in proc.stdout:
        out_lines.append(line)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    report = {}
    for line in out_lines:
        if line.startswith("REPORT "):
            report = json.loads(line[len("REPORT "):])
    if not report:
        report = {"error": f"child exited with {proc.returncode}: "
                           + "".join(out_lines)[-300:]}
    report["wall_seconds"] = round(wall, 1)
    report["child_peak_rss_mb"] = round(usage.ru_maxrss / 1024, 1)
    return report


def _row(model, fmt, variant, r):
    peak = max(r.get("child_peak_rss_mb", 0),
               r.get("peak_rss_mb_converter_process", 0) or 0)
    diff = r.get("max_abs_diff") or {}
    diff = max(diff.values()) if diff else None
    rms = (r.get("rel_rms_error") or {}).get("logits")
    agree = r.get("top1_agreement")
    if "error" in r:
        status = ("FAILED verification" if "does not match Keras"
                  in r["error"] else "error")
    else:
        status = "ok" if r.get("verified") else "not verified"
    return "| " + " | ".join([
        model, fmt if fmt != "baseline" else "onnx (plain tf2onnx)",
        variant or "-",
        f"{r.get('conversion_seconds', float('nan')):.0f}",
        f"{r.get('verification_seconds', float('nan')):.0f}",
        f"{r['wall_seconds']:.0f}",
        f"{peak / 1024:.2f}",
        f"{r.get('file_size', 0) / 2**20:.0f}",
        "-" if diff is None else f"{diff:.1e}",
        "-" if rms is None else f"{rms:.3f}",
        "-" if agree is None else f"{agree:.3f}",
        status]) + " |"


def _cpu_family():
    """``family F model M`` of the CPU, from /proc/cpuinfo (the model name
    of a cloud CPU can be as short as "AMD EPYC")."""
    from keras_vit.runtime import hardware

    fields = hardware.cpu_fields()
    if not fields:
        return "family unknown"
    return (f"family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}")


def speed(args):
    """OpenVINO float32 and bfloat16 beside keras_vit's predict and timm,
    interleaved; prints the markdown table."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from speed_peers import (TINY, VIT_B16, forward_flops, import_peers,
                             keras_vit_model, threads, versions)

    peers, skipped = import_peers(())  # torch and timm before TensorFlow
    peers.pop("keras_hub", None)
    import openvino as ov
    import speed as runner
    from speed_backends import images

    from keras_vit.export import benchmark
    from keras_vit.export import openvino as openvino_export
    from keras_vit.export.graph import ServingGraph

    arch = TINY if args.quick else VIT_B16
    size = 32 if args.quick else args.size
    batch, classes = args.batch, 1000
    tmp = tempfile.mkdtemp(prefix="keras_vit_openvino_speed_")
    # keras_vit's predict (the path hardware.plan picks) and timm, as
    # benchmarks/speed.py builds them; then the two OpenVINO exports.
    cases, keep = runner.inference_cases(
        size, [batch], arch, classes, peers, [], tmp,
        backend_rows_only=True, dtypes=("float32", "bfloat16"))
    diffs = {}

    def openvino(precision):
        def make():
            if "export" not in keep:
                keep["export"] = _random_head(
                    keras_vit_model(size, arch, classes))
            graph = ServingGraph(keep["export"], outputs=("features",))
            fn, extra = benchmark._runner("openvino", graph.model, graph,
                                          tmp, runner.say, precision)
            diffs[precision] = extra["max_abs_diff"]
            x = images(batch, size)
            return lambda: fn(x)
        return make

    flops = forward_flops(size, num_classes=classes, **arch) * batch
    for precision in ("float32", "bfloat16"):
        cases.append(runner.Case("inference", "OpenVINO", "verified export",
                                 precision, size, batch, flops,
                                 openvino(precision)))
    load = [os.getloadavg()[0]]
    try:
        rows = runner.run_cases(cases, args.runs, warmup=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load.append(os.getloadavg()[0])
    caps = openvino_export.core().get_property(
        "CPU", "OPTIMIZATION_CAPABILITIES")
    name = "tiny ViT (--quick)" if args.quick else "ViT-B/16"
    print(f"\n## OpenVINO beside keras_vit and timm: {name} at {size}, "
          f"batch {batch}\n")
    print(f"- command: `python benchmarks/export_benchmark.py "
          f"{' '.join(args.argv)}`")
    print(f"- CPU: {runner.cpu_model()} ({_cpu_family()}), "
          f"{os.cpu_count()} cores; {runner.matrix_units()}")
    print(f"- OpenVINO {ov.__version__.split('-')[0]}, CPU plugin "
          f"capabilities {', '.join(caps)}; {threads(peers)}")
    print("- versions: " + ", ".join(f"{k} {v}" for k, v in
                                      versions(peers).items()))
    print(f"- median of {args.runs} interleaved rounds after one warm-up "
          f"call; random weights; load average {load[0]:.1f} before, "
          f"{load[1]:.1f} after (other processes share the cores)")
    for line in skipped:
        print(f"- skipped: {line}")
    print()
    print("| framework | path | precision | img/s | x timm (same "
          "precision) | first call s | max abs diff vs Keras float32 |")
    print("|---|---|---|---|---|---|---|")
    timm = {r["dtype"]: r["images_per_s"] for r in rows
            if r["framework"] == "timm"}
    # float32 rows first, then bf16; in each, keras_vit, OpenVINO, timm.
    order = {"keras_vit": 0, "OpenVINO": 1, "timm": 2}
    for r in sorted(rows, key=lambda r: (r["dtype"] != "float32",
                                         order[r["framework"]])):
        peer = timm.get("float32" if r["dtype"] == "float32"
                        else "bf16 autocast")
        ratio = (f"{r['images_per_s'] / peer:.2f}x"
                 if r["images_per_s"] and peer and r["framework"] != "timm"
                 else "-")
        diff = diffs.get(r["dtype"]) if r["framework"] == "OpenVINO" else None
        print(f"| {r['framework']} | {r['path']} | {r['dtype']} | "
              + (f"{r['images_per_s']:.2f}" if r["images_per_s"]
                 else f"failed: {r['error']}")
              + f" | {ratio} | "
              + (f"{r['first_call_s']:.1f}" if r["first_call_s"] else "-")
              + f" | {'-' if diff is None else f'{diff:.2e}'} |")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "FORMAT",
                                                     "VARIANT", "PATH"))
    parser.add_argument("--models", default="ViT-B/16,ViT-L/16")
    parser.add_argument("--include-huge", action="store_true",
                        help="add ViT-H/14 (2.5 GB of weights)")
    parser.add_argument("--formats",
                        default="saved_model,tflite,onnx,openvino")
    parser.add_argument("--variants", default=None,
                        help="TFLite variants (default: all four)")
    parser.add_argument("--samples", type=int, default=32,
                        help="int8 calibration images (default 32)")
    parser.add_argument("--baseline", action="store_true",
                        help="also a plain tf2onnx conversion of the first "
                             "model, for the memory comparison")
    parser.add_argument("--out", help="keep the artifacts here")
    parser.add_argument("--json", help="write all reports to this file")
    parser.add_argument("--speed", action="store_true",
                        help="time the OpenVINO exports beside keras_vit's "
                             "predict and timm (see the module docstring)")
    # The settings of --speed, each help naming its default.
    for flag, default, what in (("--size", 224, "image size"),
                                ("--batch", 8, "batch size"),
                                ("--runs", 7, "timed rounds")):
        parser.add_argument(flag, type=int, default=default,
                            help=f"--speed: {what} (default {default})")
    parser.add_argument("--quick", action="store_true",
                        help="--speed on a tiny ViT: checks the script, "
                             "not the speed")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.speed:
        return speed(args)
    if args.child:
        args.model, args.format, variant, args.path = args.child
        args.variant = None if variant == "-" else variant
        return child(args)

    models = [m for m in args.models.split(",") if m]
    if args.include_huge and "ViT-H/14" not in models:
        models.append("ViT-H/14")
    formats = [f for f in args.formats.split(",") if f]
    out = args.out or tempfile.mkdtemp(prefix="keras_vit_export_bench_")
    jobs = []
    if args.baseline:
        jobs.append((models[0], "baseline", None))
    for model in models:
        for fmt in formats:
            variants = VARIANTS[fmt]
            if fmt == "tflite" and args.variants:
                variants = args.variants.split(",")
            for variant in variants:
                jobs.append((model, fmt, variant))
    print(f"{len(jobs)} exports, artifacts in {out}", flush=True)
    head = ("| model | format | variant | convert s | verify s | total s | "
            "peak RSS GiB | file MiB | max abs diff | rel RMS | top-1 | "
            "status |")
    rows, reports = [], []
    try:
        for model, fmt, variant in jobs:
            stem = model.replace("/", "_").replace("-", "_") + (
                f"_{variant}" if variant else "")
            ext = EXTENSIONS.get(fmt, ".onnx")
            path = os.path.join(out, f"{stem}_{fmt}{ext}")
            report = _run_child(model, fmt, variant, path, args.samples)
            reports.append({**report, "model": model, "format": fmt,
                            "variant": variant})
            rows.append(_row(model, fmt, variant, report))
            print(rows[-1], flush=True)
            if "error" in report:
                print(f"    {report['error'][:300]}", flush=True)
            if not args.out:
                for name in os.listdir(out):
                    full = os.path.join(out, name)
                    (shutil.rmtree if os.path.isdir(full) else os.remove)(
                        full)
    finally:
        print()
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        print("\n".join(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(reports, f, indent=2, default=str)
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
