"""Runs an artifact in its deployment runtime and compares it with Keras."""

from __future__ import annotations

import datetime
import os
import time

import numpy as np

from keras_vit.base.errors import KerasVitError
from keras_vit.data.naflex import PATCH_INPUTS
from keras_vit.export import common, memory
from keras_vit.export.samples import (GivenImages, check_counts, count,
                                      read_as_input, rows)
from keras_vit.base.checks import check_type
from keras_vit.runtime.backend import name as backend_name


def top1_source(names):
    return next((n for n in ("logits", "probabilities") if n in names), None)


def compare(reference, actual, tol):
    """Measures ``actual`` against ``reference`` (dicts of arrays with the
    same keys and row counts) and checks ``tol``; returns ``(metrics,
    failures)``, the list of violated criteria."""
    metrics = {"max_abs_diff": {}, "scale": {}, "rel_rms_error": {},
               "limits": {}}
    failures = []
    for name, ref in reference.items():
        if name not in actual:
            failures.append(f"output {name!r} is missing (artifact returned "
                            f"{sorted(actual)})")
            continue
        ref = np.asarray(ref, np.float64)
        got = np.asarray(actual[name], np.float64)
        if got.shape != ref.shape:
            failures.append(f"output {name!r} has shape {got.shape}, "
                            f"Keras {ref.shape}")
            continue
        if not np.all(np.isfinite(got)):
            failures.append(f"output {name!r} has non-finite values")
            diff = rel = float("inf")
        elif not ref.size:
            diff = rel = 0.0
        else:
            diff = float(np.max(np.abs(got - ref)))
            rms_ref = float(np.sqrt(np.mean(ref ** 2)))
            rms_err = float(np.sqrt(np.mean((got - ref) ** 2)))
            rel = rms_err / rms_ref if rms_ref > 0 else rms_err
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        metrics["max_abs_diff"][name] = diff
        metrics["scale"][name] = scale
        metrics["rel_rms_error"][name] = rel
        if tol.get("max_abs_diff") is not None:
            limit = tol["max_abs_diff"] * max(1.0, scale)
            metrics["limits"][name] = limit
            if not diff <= limit:
                failures.append(f"{name}: max abs difference {diff:.3g} > "
                                f"{limit:.3g}")
        if tol.get("rel_rms_error") is not None and not (
                rel <= tol["rel_rms_error"]):
            failures.append(f"{name}: relative RMS error {rel:.3g} > "
                            f"{tol['rel_rms_error']}")
    source = top1_source(reference)
    agreement = None
    if source is not None and source in actual and np.shape(
            actual[source]) == np.shape(reference[source]):
        ref_top = np.argmax(reference[source], axis=-1)
        got_top = np.argmax(actual[source], axis=-1)
        agreement = float(np.mean(ref_top == got_top))
        if tol.get("top1_agreement") is not None and (
                agreement < tol["top1_agreement"]):
            failures.append(f"top-1 agreement {agreement:.3f} < "
                            f"{tol['top1_agreement']}")
    metrics["top1_agreement"] = agreement
    return metrics, failures


def _check_batch_sizes(batch_sizes):
    if isinstance(batch_sizes, int):
        batch_sizes = (batch_sizes,)
    sizes = tuple(batch_sizes or ())
    if not sizes or not all(isinstance(b, (int, np.integer))
                            and not isinstance(b, bool) and b > 0
                            for b in sizes):
        raise ValueError("batch_sizes must be positive integers; received "
                         f"batch_sizes={batch_sizes!r}")
    return tuple(dict.fromkeys(int(b) for b in sizes))


def check_options(batch_sizes, verify_data):
    """Validates the verification arguments before any conversion runs;
    returns the batch sizes as a tuple."""
    if isinstance(verify_data, str) and verify_data not in ("noise",
                                                            "photos"):
        raise ValueError("verify_data must be 'noise', 'photos' or an array "
                         f"of images; received verify_data={verify_data!r}")
    return _check_batch_sizes(batch_sizes)


class ArtifactDidNotRun(common.ExportError):
    """The runtime could not load or run the converted file; the message
    is the runtime's own error, in one line."""


def _in_runtime(call, *args):
    """``call(*args)``, the runtime's own RuntimeError raised as
    :class:`ArtifactDidNotRun`."""
    try:
        return call(*args)
    except KerasVitError:
        raise
    except RuntimeError as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ArtifactDidNotRun(f"{type(e).__name__}: {first}") from e


def _run_in_chunks(run, images, batch_size):
    parts = []
    for start in range(0, count(images), batch_size):
        out = _in_runtime(run, rows(images, start, start + batch_size))
        parts.append({k: np.asarray(v) for k, v in out.items()})
    return {k: np.concatenate([p[k] for p in parts])
            for k in parts[0] if all(k in p for p in parts)}


def verification_images(graph, batch_sizes, data="noise", samples=None,
                        seed=0):
    """``(images, note)``: the images :func:`verify` runs (deterministic);
    an array of ``data`` is read as ``representative_data`` is
    (:func:`~keras_vit.export.samples.read_as_input`)."""
    sizes = check_options(batch_sizes, data)
    if isinstance(data, str):
        if (samples or 0) > max(sizes):
            check_counts(graph, agreement_samples=samples)
        count = max(max(sizes), samples or 0)
        return graph.sample_images(count, seed=seed, kind=data)
    if isinstance(data, GivenImages):  # the user's, already in range
        return data.images, data.note
    if getattr(graph, "naflex", False):
        return _given_patches(graph, data)
    images = np.asarray(data)
    shape = tuple(graph.input_shape)
    if (images.ndim != 4 or images.shape[1:] != shape
            or images.dtype.kind not in "iuf"):
        raise ValueError(
            f"verify_data must be images of shape (n,) + {shape}, numbers;"
            f" received {images.dtype} of shape {images.shape}")
    images, reading = read_as_input(images.astype(np.float32),
                                    images.dtype.kind in "iu", graph,
                                    "verify_data")
    return images, f"{len(images)} images given as verify_data ({reading})"


def _given_patches(graph, data):
    """``(inputs, note)``: ``verify_data`` given for a NaFlex model (a
    dict of its inputs)."""
    if not isinstance(data, dict) or sorted(data) != sorted(PATCH_INPUTS):
        raise ValueError(
            "verify_data for a NaFlex model (naflex=True) must be 'noise', "
            "'photos' or a dict of its inputs "
            f"{list(PATCH_INPUTS)} (keras_vit.data.naflex.patchify); "
            f"received verify_data={type(data).__name__}")
    width = int(graph.raw.input["patches"].shape[-1])
    inputs = {"patches": np.asarray(data["patches"], np.float32),
              "patch_coords": np.asarray(data["patch_coords"], np.int32),
              "patch_mask": np.asarray(data["patch_mask"], np.int32)}
    batch, tokens = inputs["patch_mask"].shape[:2] if (
        inputs["patch_mask"].ndim == 2) else (None, None)
    if (batch is None or inputs["patches"].shape != (batch, tokens, width)
            or inputs["patch_coords"].shape != (batch, tokens, 2)):
        raise ValueError(
            "verify_data must hold patches (n, N, "
            f"{width}), patch_coords (n, N, 2) and patch_mask (n, N); "
            "received shapes " + ", ".join(
                f"{k} {v.shape}" for k, v in inputs.items()))
    return inputs, f"{batch} images given as verify_data ({tokens} patches)"


def extra_batches(graph, batch_sizes, seed=0):
    """``[(label, inputs)]``: what :func:`verify` runs besides its images:
    a dynamic-size artifact's other image sizes, a NaFlex one's other
    patch counts."""
    sizes = _check_batch_sizes(batch_sizes)
    extras = [(f"image size {h}x{w}", sizes[-1], {"image_size": (h, w)})
              for h, w in getattr(graph, "extra_image_sizes", ())]
    extras += [(f"{n} patches", sizes[0], {"max_patches": n})
               for n in getattr(graph, "extra_patch_counts", ())]
    return [(label, graph.sample_images(size, seed=seed + 1, kind="noise",
                                        **where)[0])
            for label, size, where in extras]


def batches(images, batch_sizes):
    """The batches :func:`verify` runs, in order: ``images`` in chunks of
    the first batch size, then the first images at each other size.

    >>> [len(b) for b in batches(np.zeros((6, 2)), (4, 1))]
    [4, 2, 1]
    """
    sizes = _check_batch_sizes(batch_sizes)
    first = [rows(images, i, i + sizes[0])
             for i in range(0, count(images), sizes[0])]
    return first + [rows(images, 0, size) for size in sizes[1:]]


def refused_sizes(graph, run):
    """Runs the artifact (``run``) on image sizes the model refuses and
    says which it refuses too and which it takes (ONNX's converter drops
    the graph's assertions). ``None`` when ``graph`` takes no images or
    ``run`` replays outputs computed elsewhere."""
    probes = getattr(graph, "refused_image_sizes", lambda: ())()
    if not probes or getattr(run, "replays", False):
        return None
    sizes = graph.image_sizes()
    channels = graph.input_shape[-1]
    refused, taken = [], []
    for height, width in probes:
        images = np.zeros((1, height, width, channels), graph.input_dtype)
        try:
            run(images)
        except Exception:  # noqa: BLE001 - each runtime raises its own
            refused.append(f"{height}x{width}")
        else:
            taken.append(f"{height}x{width}")
    return {"rule": sizes.describe(), "refused": refused,
            "taken_though_keras_refuses": taken}


def verify(graph, open_runtime, artifact, batch_sizes=(4, 1),
           tolerance=None, data="noise", samples=None, seed=0):
    """Runs ``artifact`` and compares it with Keras.

    ``open_runtime(artifact)`` returns a function ``images -> {name:
    array}``. The images (``data``: ``"noise"``, ``"photos"``, an array in
    the artifact's input range, or
    :class:`~keras_vit.export.samples.GivenImages`) are run in chunks of
    the first batch size; every other batch size runs once on the first
    images.

    Returns the verification part of the report; ``report["passed"]`` is
    False with ``report["failures"]`` listing why when the artifact is
    outside ``tolerance``.
    """
    sizes = check_options(batch_sizes, data)
    images, note = verification_images(graph, sizes, data, samples, seed)
    start = time.perf_counter()
    reference = graph.reference(images)
    run = _in_runtime(open_runtime, artifact)
    actual = _run_in_chunks(run, images, sizes[0])
    metrics, failures = compare(reference, actual, tolerance)
    # Top-1 agreement of a few images is too coarse to judge.
    few = dict(tolerance, top1_agreement=None)

    def check(label, got, ref):
        extra, extra_failures = compare(ref, got, few)
        failures.extend(f"{label}: {f}" for f in extra_failures)
        for key in ("max_abs_diff", "rel_rms_error"):
            for name, value in extra[key].items():
                metrics[key][name] = max(metrics[key].get(name, value), value)

    for size in sizes[1:]:
        check(f"batch {size}", _run_in_chunks(run, rows(images, 0, size),
                                              size),
              {k: v[:size] for k, v in reference.items()})
    for label, part in extra_batches(graph, sizes, seed):
        check(label, _run_in_chunks(run, part, count(part)),
              graph.reference(part))
    size_check = refused_sizes(graph, run)
    report = {
        "batch_sizes": list(sizes),
        "samples": int(count(images)),
        "data": note,
        "max_abs_diff": metrics["max_abs_diff"],
        "output_scale": metrics["scale"],
        "rel_rms_error": metrics["rel_rms_error"],
        "top1_agreement": metrics["top1_agreement"],
        "tolerance": dict(tolerance, max_abs_diff_limits=metrics["limits"]),
        "image_sizes": ([list(graph.input_shape[:2])]
                        + [list(s) for s in graph.extra_image_sizes]
                        if getattr(graph, "extra_image_sizes", ()) else None),
        **({"patch_counts": [int(graph.patch_count)]
            + [int(n) for n in graph.extra_patch_counts]}
           if getattr(graph, "naflex", False) else {}),
        "refused_image_sizes": size_check,
        "passed": not failures,
        "failures": failures,
    }
    if graph.source_dtype is not None:
        name, source = graph.source_logits(rows(images, 0, sizes[0]))
        if source is not None and name in actual:
            report[f"max_abs_diff_vs_{graph.source_dtype}_model"] = float(
                np.max(np.abs(actual[name][:sizes[0]] - source)))
    report["verification_seconds"] = round(time.perf_counter() - start, 3)
    return report


def raise_if_failed(result, what, report, remedy=None):
    """Raises ExportError with the failures of a verification ``result``
    and ``remedy``; the error carries the full ``report``."""
    if not result["passed"]:
        raise common.ExportError(
            f"{what} does not match Keras within the tolerance of its format "
            f"({'; '.join(result['failures'])}); nothing was written"
            + (f". {remedy}" if remedy else ""),
            report=report)


def assemble_report(fmt, dest, files, graph, options, verification, times,
                    rss, notes=()):
    """The JSON report of an export (also returned to the caller)."""
    size = sum(memory.path_size(f) for f in files)
    report = {
        "format": fmt,
        "path": dest,
        "files": sorted({f.rsplit("/", 1)[-1] for f in files}),
        "file_size": size,
        "file_size_mb": memory.mib(size),
        "weights_mb": memory.mib(graph.weights_bytes()),
        "model": {"name": graph.source_model.name,
                  "class": type(graph.source_model).__name__,
                  "parameters": int(graph.source_model.count_params()),
                  "source_dtype": graph.source_dtype or "float32"},
        **graph.describe(),
        "options": options,
        "verified": verification is not None,
    }
    if verification is not None:
        top = ("max_abs_diff", "top1_agreement", "rel_rms_error",
               "tolerance", "batch_sizes")
        report.update((key, verification[key]) for key in top)
        report["verification"] = {k: v for k, v in verification.items()
                                  if k not in top}
    else:
        notes = list(notes) + ["verify=False: the artifact was NOT run"]
    report.update(times)
    report["peak_rss_mb"] = memory.mib(max(rss.peak, rss.child_peak))
    if rss.child_peak:
        report["peak_rss_mb_this_process"] = memory.mib(rss.peak)
        report["peak_rss_mb_converter_process"] = memory.mib(rss.child_peak)
    report["notes"] = list(graph.notes) + list(notes)
    # The backend of the reference outputs.
    report["keras_backend"] = backend_name()
    report["versions"] = common.versions()
    report["created"] = datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds")
    return report


def verification_table(reports):
    """A markdown table of export reports: format, file, size, differences
    with Keras and their tolerance, time and memory."""
    for i, report in enumerate(check_type(
            "reports", reports, (list, tuple), "a list of export reports")):
        check_type(f"reports[{i}]", report, dict, "an export report (a dict)")
    head = ("format", "variant", "file", "MiB", "max abs diff",
            "tolerance", "top-1 agree", "batches", "convert s", "peak RSS MiB")
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for r in reports:
        diff = max(r.get("max_abs_diff", {}).values() or [float("nan")])
        limits = r.get("tolerance", {}).get("max_abs_diff_limits", {})
        tol = r.get("tolerance", {})
        parts = []
        if limits:
            parts.append(f"<= {max(limits.values()):.2g}")
        if tol.get("top1_agreement") is not None:
            parts.append(f"top-1 >= {tol['top1_agreement']}")
        if tol.get("rel_rms_error") is not None:
            parts.append(f"rms <= {tol['rel_rms_error']}")
        agree = r.get("top1_agreement")
        cells = (r["format"], common.variant(r["options"]),
                 os.path.basename(r["path"]), f"{r['file_size_mb']:.1f}",
                 f"{diff:.2e}", ", ".join(parts) or "-",
                 "-" if agree is None else f"{agree:.3f}",
                 ",".join(str(b) for b in r.get("batch_sizes", [])),
                 f"{r['conversion_seconds']:.1f}", f"{r['peak_rss_mb']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
