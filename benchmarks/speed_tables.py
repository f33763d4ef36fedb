"""The markdown tables of benchmarks/speed.py's report: ``fmt`` and
``table``, and the rows and tables built from the measurements (the model
rows beside timm, the backend comparison, the speed targets, the
matrix-multiply ceiling and checkpoint loading).
"""

from __future__ import annotations

import os
import statistics
import sys


# --------------------------------------------------------------------------
# tables


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1 or value == 0:
        return f"{value:.{digits}f}"
    return f"{value:.3g}"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _timm_ref(rows, row, dtype):
    for r in rows:
        if (r["framework"] == "timm" and r["dtype"] == dtype
                and r["size"] == row["size"] and r["batch"] == row["batch"]
                and r["images_per_s"]):
            return r["images_per_s"]
    return None


def model_table(rows, best):
    head = ["framework", "backend", "path", "dtype", "image", "batch",
            "img/s", "x timm fp32", "x timm bf16", "first call s", "GFLOP/s",
            "% of ceiling"]
    out = []
    for r in rows:
        ips = r["images_per_s"]
        ref32 = _timm_ref(rows, r, "float32")
        ref16 = _timm_ref(rows, r, "bf16 autocast")
        top = ceiling_for(r["dtype"], best)
        out.append([
            r["framework"], r["backend"] or "-", r["path"], r["dtype"],
            str(r["size"]),
            str(r["batch"]),
            ips if ips else (f"failed: {r['error']}" if r["error"] else "-"),
            ips / ref32 if ips and ref32 else None,
            ips / ref16 if ips and ref16 else None,
            r["first_call_s"], r["gflops_per_s"],
            100 * r["gflops_per_s"] / top if r["gflops_per_s"] and top
            else None])
    return table(head, out)


# The rows compared across backends: the default path of each job.
BACKEND_JOBS = (("inference", "model.predict (auto"),
                ("training", "compile_for_finetune + train_on_batch"))


def backend_rows(results, backends):
    """keras_vit's default paths on each backend side by side with timm:
    one row per job, dtype, image size and batch."""
    out = []
    for section, prefix in BACKEND_JOBS:
        rows = results.get(section, [])
        groups = {}
        for r in rows:
            if r["framework"] == "keras_vit" and r["path"].startswith(
                    prefix):
                key = (r["dtype"], r["size"], r["batch"])
                groups.setdefault(key, {})[r["backend"]] = r
        for (dtype, size, batch), by_backend in groups.items():
            speed = {b: by_backend[b]["images_per_s"] for b in backends
                     if b in by_backend}
            ref_dtype = "float32" if dtype == "float32" else "bf16 autocast"
            timm = _timm_ref(rows, {"size": size, "batch": batch}, ref_dtype)
            done = {b: v for b, v in speed.items() if v}
            fastest = max(done, key=done.get) if done else None
            tf_speed = done.get("tensorflow")
            out.append({
                "job": "inference (model.predict)" if section == "inference"
                else "training step (model.fit)", "dtype": dtype,
                "size": size, "batch": batch, "speed": speed,
                "timm": timm, "timm_dtype": ref_dtype, "fastest": fastest,
                "fastest_vs_tensorflow": done[fastest] / tf_speed
                if fastest and tf_speed else None,
                "fastest_vs_timm": done[fastest] / timm
                if fastest and timm else None})
    return out


def backend_table(rows, backends):
    head = (["job", "dtype", "image", "batch"]
            + [f"{b} img/s" for b in backends]
            + ["timm img/s", "fastest", "fastest / tensorflow",
               "fastest / timm"])
    body = [[r["job"], r["dtype"], str(r["size"]), str(r["batch"])]
            + [r["speed"].get(b) for b in backends]
            + [r["timm"], r["fastest"] or "-", r["fastest_vs_tensorflow"],
               r["fastest_vs_timm"]] for r in rows]
    return table(head, body)


def ceiling_table(rows):
    head = ["framework", "matmul", "dtype", "median s", "GFLOP/s"]
    return table(head, [[r["framework"], r["path"], r["dtype"],
                         r["median_s"], r["gflops_per_s"]] for r in rows])


def loading_table(rows):
    head = ["what", "seconds", "x np.load", "peak RSS above baseline MiB",
            "peak / checkpoint size"]
    body = [[r["what"] + (f" ({r['peak_note']})" if r["peak_note"] else ""),
             r["seconds"] if r["seconds"] is not None else
             f"failed: {r['error']}", r["vs_np_load"],
             r["peak_above_baseline_mib"], r["peak_vs_checkpoint"]]
            for r in rows]
    return table(head, body)


TARGETS = [
    # (goal, section, keras_vit path prefix, dtype, timm dtype, ratio, ceiling %)
    ("inference bf16 >= 1.2x timm bf16, >= 55% of ceiling", "inference",
     "model.predict (auto", "bfloat16", "bf16 autocast", 1.2, 55),
    ("inference float32 >= 1.05x timm float32", "inference",
     "model.predict (auto", "float32", "float32", 1.05, None),
    ("Trainer mixed_bfloat16 >= 1.2x timm bf16 step", "training",
     "Trainer train step (default)", "mixed_bfloat16", "bf16 autocast",
     1.2, None),
    ("model.fit mixed_bfloat16 >= 1.2x timm bf16 step", "training",
     "compile_for_finetune", "mixed_bfloat16", "bf16 autocast", 1.2, None),
    ("Trainer float32 >= 1.05x timm float32 step", "training",
     "Trainer train step (default)", "float32", "float32", 1.05, None),
    ("model.fit float32 >= 1.05x timm float32 step", "training",
     "compile_for_finetune", "float32", "float32", 1.05, None),
]


def targets_table(results, best):
    """The speed goals, each row of the run checked
    against its target."""
    head = ["goal", "image", "batch", "keras_vit img/s", "timm img/s",
            "ratio", "% of ceiling", "met"]
    out = []
    for goal, section, prefix, dtype, ref_dtype, ratio, ceiling in TARGETS:
        for r in results.get(section, []):
            if (r["framework"] != "keras_vit" or r["dtype"] != dtype
                    or r["backend"] != "tensorflow"
                    or not r["path"].startswith(prefix)
                    or not r["images_per_s"]):
                continue
            ref = _timm_ref(results[section], r, ref_dtype)
            got = r["images_per_s"] / ref if ref else None
            top = ceiling_for(dtype, best)
            pct = (100 * r["gflops_per_s"] / top
                   if r["gflops_per_s"] and top else None)
            if got is None:
                met = "-"
            elif got < ratio:
                met = "no"
            elif ceiling is None or (pct is not None and pct >= ceiling):
                met = "yes"
            elif pct is None:
                # --backend-rows-only and --skip-ceiling measure no ceiling.
                met = "ratio yes; ceiling not measured"
            else:
                met = "no"
            out.append([goal, str(r["size"]), str(r["batch"]),
                        r["images_per_s"], ref, got, pct, met])
    return table(head, out)


def ceilings(rows):
    """Best GFLOP/s per dtype (fp32, bf16)."""
    best = {}
    for r in rows:
        if r["gflops_per_s"]:
            best[r["dtype"]] = max(best.get(r["dtype"], 0), r["gflops_per_s"])
    return best


def ceiling_for(dtype, best):
    return best.get("float32" if dtype == "float32" else "bfloat16")


def loading_rows(loaded):
    res = loaded["results"]
    baseline = statistics.median(
        [r["peak_rss"] for r in res["baseline"] if "peak_rss" in r] or [0])

    def med(mode, key):
        values = [r[key] for r in res[mode] if key in r]
        return statistics.median(values) if values else None

    rows = []
    ref = med("np.load", "seconds")
    for mode, label, key in (
            ("np.load", "np.load, every array read", "seconds"),
            ("zoo.load", "zoo.load(\"ViT-B/16\", weights=path)", "seconds"),
            ("build+load_weights", "zoo.load(weights=None): build only",
             "build_seconds"),
            ("build+load_weights", "zoo.load_weights(model, path) into the "
             "built model", "seconds")):
        errors = [r["error"] for r in res[mode] if "error" in r]
        seconds = med(mode, key)
        peak = None
        if key == "seconds" or mode != "build+load_weights":
            peak = med(mode, "peak_rss")
        above = None if peak is None else peak - baseline
        rows.append({
            "what": label, "seconds": seconds,
            "vs_np_load": seconds / ref if seconds and ref else None,
            "peak_above_baseline_mib": None if above is None
            else above / 2**20,
            "peak_vs_checkpoint": None if above is None
            else above / loaded["bytes"],
            "error": errors[0] if errors else None,
            "peak_note": ("build + load_weights in one process"
                          if mode == "build+load_weights" else "")})
    return rows, baseline


def emit(text, out=None):
    """Prints a benchmark's table and, when ``out`` names a file, writes
    it there too (ending in one newline), as every benchmark's ``--out``
    does."""
    text = text.rstrip("\n")
    print(text)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def exit_now(code):
    """Ends a benchmark process once its results are printed and written,
    without the interpreter's teardown: unloading TensorFlow or PyTorch
    takes about 1.6 CPU seconds (JAX 0.7), and nothing waits for it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
