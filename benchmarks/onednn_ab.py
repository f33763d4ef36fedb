"""TensorFlow with and without its oneDNN CPU rewrites, on this CPU.

``import keras_vit`` turns TensorFlow's oneDNN rewrites on where TensorFlow
leaves them off (AVX2-only x86 CPUs; see
:func:`keras_vit.runtime.hardware.enable_onednn`). This script shows what that is
worth here: the same ViT runs ``model.predict`` and a training step
(``compile_for_finetune`` + ``train_on_batch``) in child processes with
``TF_ENABLE_ONEDNN_OPTS=0`` and ``=1``, alternated for ``--rounds`` rounds,
and prints a table of the medians: images/s (wall clock) and CPU seconds
per image (the process's user + system time), with the ratio. CPU time
says more than the wall clock on a shared machine: other processes take
wall time from both settings, not CPU time. Each job runs in a fresh
process; ``--quick`` (only the script under test) runs the jobs of a
setting in one process, in turn, which saves a TensorFlow import per job.

    python benchmarks/onednn_ab.py                 # ViT-B/16, ~10 min
    python benchmarks/onednn_ab.py --model ViT-S/16 --sizes 224
    python benchmarks/onednn_ab.py --quick         # a tiny ViT, seconds

Every figure names the CPU and its matrix units; quote ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The benchmarks' shared --out writer, a sibling module (this folder is
# sys.path[0] when run as a script, not when loaded by path from a test).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from speed_tables import emit, exit_now  # noqa: E402

SETTINGS = ("0", "1")
CHILD_FLAG = "--child"


def child(name, cases, quick):
    """The measurements of ``cases`` (``(size, batch, job, reps)`` each)
    in this process, in turn: prints one JSON line per case."""
    for size, batch, job, reps in cases:
        measure(name, size, batch, job, reps, quick)


def measure(name, size, batch, job, reps, quick):
    """One measurement in this process: prints JSON."""
    import numpy as np

    import keras_vit
    from keras_vit import train
    from keras_vit.runtime import compat

    if quick:
        model = keras_vit.vit(size, 8, 32, 2, 2, 64, 10)
    else:
        model = keras_vit.zoo.load(name, weights=None, image_size=size)
    classes = int(model.outputs[0].shape[-1])
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    y = np.arange(batch) % classes
    if job == "predict":
        def step():
            model.predict(x, batch_size=batch, verbose=0)
    else:
        train.compile_for_finetune(model)

        def step():
            model.train_on_batch(x, y)
    step()
    step()
    walls = []
    cpu0 = time.process_time()
    for _ in range(reps):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
    cpu = (time.process_time() - cpu0) / reps
    print(json.dumps({"img_s": batch / statistics.median(walls),
                      "cpu_s_per_img": cpu / batch,
                      "onednn": compat.onednn_enabled()}), flush=True)


def run_child(name, cases, setting, quick):
    """``cases`` measured in turn in one fresh process with
    ``TF_ENABLE_ONEDNN_OPTS=setting``: one result per case."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting,
               TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    env.pop("KERAS_VIT_ONEDNN", None)
    argv = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, name,
            json.dumps(cases)] + (["--quick"] if quick else [])
    out = subprocess.run(argv, capture_output=True, text=True, env=env,
                         timeout=3600)
    if out.returncode:
        raise SystemExit(f"child {cases} with TF_ENABLE_ONEDNN_OPTS="
                         f"{setting} failed: {out.stderr[-2000:]}")
    results = [json.loads(line) for line in out.stdout.splitlines()
               if line.startswith("{")]
    if len(results) != len(cases):
        raise SystemExit(f"child {cases} with TF_ENABLE_ONEDNN_OPTS="
                         f"{setting} printed {len(results)} results for "
                         f"{len(cases)} cases: {out.stdout[-2000:]}")
    return results


def cpu_line():
    from keras_vit.runtime import hardware

    flags, model = hardware.cpu_flags(), hardware.cpu_model()
    units = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                         "avx_vnni", "amx_bf16") if f in flags]
    return (f"{model or 'unknown CPU'}, {os.cpu_count()} logical cores; "
            f"flags: {', '.join(units) or 'none of avx2/avx512/amx'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B/16",
                        help="a zoo name (default ViT-B/16)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="224,384",
                        help="predict image sizes (default 224,384)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--train-size", type=int, default=224)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny ViT at 32 px: tests the script")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be at least 1")
    sizes = [32] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 2 if args.quick else 3
    cases = [(s, args.batch, "predict", reps) for s in sizes]
    if not args.skip_train:
        cases.append((32 if args.quick else args.train_size, args.batch,
                      "train", reps))
    # The cases each child process measures: one per process, or (--quick)
    # every case of a setting in one process.
    groups = [cases] if args.quick else [[case] for case in cases]
    results = {}
    started = time.time()
    for r in range(args.rounds):
        for group in groups:
            for setting in SETTINGS:
                for case, got in zip(group, run_child(
                        args.model, group, setting, args.quick)):
                    if got["onednn"] != (setting == "1"):
                        raise SystemExit(f"TF_ENABLE_ONEDNN_OPTS={setting} "
                                         "did not take effect in the child")
                    results.setdefault((case, setting), []).append(got)
                    print(f"[round {r + 1}/{args.rounds}] {case[2]} "
                          f"{case[0]}px oneDNN "
                          f"{'on' if setting == '1' else 'off'}: "
                          f"{got['img_s']:.3g} img/s, "
                          f"{got['cpu_s_per_img']:.3g} CPU s/img",
                          flush=True)
    lines = [
        "# TensorFlow with and without oneDNN",
        "",
        f"- command: `python benchmarks/onednn_ab.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{(time.time() - started) / 60:.1f} min",
        f"- CPU: {cpu_line()}",
        f"- load average (1 min) at the end: {os.getloadavg()[0]:.2f}",
        f"- model: {'a tiny ViT (--quick)' if args.quick else args.model}, "
        f"random weights, float32; medians of {args.rounds} alternated "
        "rounds, each a fresh process"
        + (" (both jobs of a setting in one)" if args.quick else ""),
        "",
        "| job | image | batch | img/s off | img/s on | on / off | "
        "CPU s/img off | CPU s/img on | off / on (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        off = results[(case, "0")]
        on = results[(case, "1")]
        wall = [statistics.median(g["img_s"] for g in x) for x in (off, on)]
        cpu = [statistics.median(g["cpu_s_per_img"] for g in x)
               for x in (off, on)]
        lines.append(f"| {case[2]} | {case[0]} | {case[1]} | {wall[0]:.3g} | "
                     f"{wall[1]:.3g} | {wall[1] / wall[0]:.2f}x | "
                     f"{cpu[0]:.3g} | {cpu[1]:.3g} | {cpu[0] / cpu[1]:.2f}x |")
    lines += ["", "Ratios above 1 favour oneDNN on."]
    print()
    emit("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        child(sys.argv[2], json.loads(sys.argv[3]), "--quick" in sys.argv)
        exit_now(0)  # the results are printed
    else:
        sys.exit(main())
