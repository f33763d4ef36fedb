"""Run checkpoints without TensorFlow objects: one ``.npz`` per saved step.

A run's state is one file, ``OUT/checkpoints/ckpt-STEP.npz``:

    model/00000 ...      every model variable, trainable or not
    optimizer/00000 ...  the optimizer's variables
    meta/step, meta/epoch, meta/batch_in_epoch
    meta/run             the id of the run that wrote it (UTF-8 bytes)
    meta/settings        the run's settings (JSON as UTF-8 bytes, uint8)

A file's contents decide, never its name. The folder's ``manifest.json``
holds the run's id and the names the run wrote; a file whose name
disagrees with its step, or of another run, stops with one line. Pruning
deletes only files the manifest lists that still hold what the run wrote.

Files are written atomically, the last :data:`KEEP` are kept, and nothing
is unpickled: :func:`load` checks every array header against the run
before reading any data.

>>> import os, tempfile, numpy as np
>>> folder = tempfile.mkdtemp()
>>> for step in (1, 2, 3, 4):
...     _ = save(folder, step, {"model": [np.full((2,), step, "float32")]},
...              {"epoch": 0, "batch_in_epoch": step})
>>> sorted(os.listdir(folder)), latest(folder)[0]
(['ckpt-2.npz', 'ckpt-3.npz', 'ckpt-4.npz', 'manifest.json'], 4)
>>> groups, meta = load(latest(folder)[1], {"model": [((2,), "float32")]})
>>> groups["model"][0].tolist(), meta["batch_in_epoch"]
([4.0, 4.0], 4)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
import zipfile

import numpy as np

from keras_vit.base import archives, atomic
from keras_vit.base.errors import KerasVitError

KEEP = 3
META = ("step", "epoch", "batch_in_epoch")
#: The file of a checkpoint folder naming its run and what the run wrote.
MANIFEST = "manifest.json"
# The names save writes: no leading zeros, so one step has one name.
_NAME = re.compile(r"^ckpt-(0|[1-9][0-9]{0,17})\.npz$")


class RunCheckpointError(KerasVitError, ValueError):
    """A run checkpoint (or its folder's manifest) that cannot be read,
    does not fit the run, or disagrees with its name."""


def path_for(directory, step):
    """``directory/ckpt-STEP.npz``."""
    return os.path.join(directory, f"ckpt-{int(step)}.npz")


def name_step(name):
    """The step a file name says (``ckpt-12.npz`` -> 12), or None for a name
    :func:`save` never writes (``ckpt-0012.npz``, ``notes.txt``)."""
    found = _NAME.match(name)
    return int(found.group(1)) if found else None


def steps(directory):
    """The steps the checkpoint names in ``directory`` say, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = (name_step(name) for name in os.listdir(directory))
    return sorted(step for step in found if step is not None)


def read_manifest(directory):
    """``{"run": id, "written": [names]}`` of ``directory``, or None when it
    has none; a manifest that is not one is refused naming the file."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError) as e:
        doc = e
    if (not isinstance(doc, dict) or not isinstance(doc.get("run"), str)
            or not isinstance(doc.get("written"), list)
            or not all(isinstance(n, str) for n in doc["written"])):
        raise RunCheckpointError(
            f"The checkpoint manifest {path!r} is not one (expected "
            '{"run": "<id>", "written": [names]}); restore it, or delete it '
            "to resume with the checkpoints it named left in place")
    return doc


def _write_manifest(directory, run, written):
    atomic.write_json(os.path.join(directory, MANIFEST),
                      {"run": run, "written": sorted(set(written))})


def start_run(directory, run=None):
    """The id of the run whose checkpoints ``directory`` holds: the
    manifest's, else ``run`` (the id a restored checkpoint recorded) or a
    new one, written into a new manifest."""
    manifest = read_manifest(directory)
    if manifest is not None:
        return manifest["run"]
    run = run or uuid.uuid4().hex
    os.makedirs(directory, exist_ok=True)
    _write_manifest(directory, run, [])
    return run


def _unreadable(path, e):
    return RunCheckpointError(
        f"The checkpoint {path!r} cannot be read ({type(e).__name__}: "
        f"{' '.join(str(e).split())[:200]}); delete it to resume from the "
        "one before, or start again with resume=False")


def _text(value):
    if value.dtype != np.uint8 or value.ndim != 1:
        raise ValueError("not a byte string")
    return value.tobytes().decode("utf-8")


def read_meta(path):
    """``{"step", "epoch", "batch_in_epoch", "run", "settings"}`` a
    checkpoint records (``run``/``settings`` may be None), reading only its
    ``meta/`` arrays; one :class:`RunCheckpointError` otherwise."""
    try:
        headers = archives.npz_headers(path)
        with np.load(path, allow_pickle=False) as archive:
            raw = {key: archive[key] for key in archive.files
                   if key.startswith("meta/")}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise _unreadable(path, e) from None
    meta, problems = {"run": None, "settings": None}, []
    for key in ("run", "settings"):
        if f"meta/{key}" in raw:
            try:
                meta[key] = _text(raw[f"meta/{key}"])
            except ValueError as e:
                problems.append(f"meta/{key}: unreadable ({e})")
    for key in META:
        value = raw.get(f"meta/{key}")
        if value is None or value.shape != () or value.dtype.kind not in "iu":
            problems.append(f"meta/{key}: missing or not an integer")
        else:
            meta[key] = int(value)
    if problems:
        raise RunCheckpointError(
            f"The checkpoint {path!r} is not one keras-vit wrote: "
            + "; ".join(problems) + "; move it out of the folder, or "
            "start again with resume=False")
    meta["headers"] = headers
    return meta


def _check_identity(path, meta, run):
    """Refuses a file whose recorded step is not its name's, or whose
    recorded run is not ``run`` (the folder's; None: any)."""
    named = name_step(os.path.basename(path))
    if named != meta["step"]:
        raise RunCheckpointError(
            f"The checkpoint {path!r} records step {meta['step']} but its "
            f"name says step {named} (a renamed or copied file?); give it "
            f"its own name (ckpt-{meta['step']}.npz) or move it out of the "
            "folder")
    if run is not None and meta["run"] is not None and meta["run"] != run:
        raise RunCheckpointError(
            f"The checkpoint {path!r} was written by run {meta['run']}, not "
            f"by this folder's run {run} ({MANIFEST}); move it out of the "
            "folder, or resume it in a folder of its own")


def _is_ours(path, run):
    """Whether ``path`` still holds what this run wrote under that name."""
    try:
        meta = read_meta(path)
    except RunCheckpointError:
        return False
    return (meta["run"] == run
            and meta["step"] == name_step(os.path.basename(path)))


def latest(directory):
    """``(step, path)`` of the newest checkpoint, or None. The step is the
    one the file records, checked against its name and the folder's run."""
    found = steps(directory)
    if not found:
        return None
    path = path_for(directory, found[-1])
    manifest = read_manifest(directory)
    meta = read_meta(path)
    _check_identity(path, meta, manifest and manifest["run"])
    return meta["step"], path


def save(directory, step, groups, meta, *, keep=KEEP, settings=None,
         run=None):
    """Writes ``groups`` (name -> list of arrays), ``meta`` (name -> int;
    ``step`` is added) and ``settings`` (JSON text) as ``ckpt-STEP.npz``
    atomically, recorded in the folder's manifest as the run's, then
    deletes all but the newest ``keep`` files the run wrote. A file of that
    name the run did not write is refused. Returns the path."""
    run = start_run(directory, run)
    path = path_for(directory, step)
    name = os.path.basename(path)
    written = read_manifest(directory)["written"]
    if os.path.exists(path) and not (name in written and _is_ours(path, run)):
        raise RunCheckpointError(
            f"Cannot save the checkpoint of step {step}: {path!r} exists and "
            "was not written by this run; move it out of the folder")
    arrays = {f"{group}/{i:05d}": np.asarray(value)
              for group, values in groups.items()
              for i, value in enumerate(values)}
    for key, value in dict(meta, step=step).items():
        arrays[f"meta/{key}"] = np.asarray(int(value), np.int64)
    arrays["meta/run"] = np.frombuffer(run.encode("utf-8"), np.uint8)
    if settings is not None:
        arrays["meta/settings"] = np.frombuffer(
            settings.encode("utf-8"), np.uint8)
    # Named first: a process killed after the write leaves no file the
    # manifest does not know.
    _write_manifest(directory, run, written + [name])
    with atomic.atomic_path(path) as tmp:
        np.savez(tmp, **arrays)
    _prune(directory, run, keep, path)
    return path


def _prune(directory, run, keep, current):
    """Deletes all but the newest ``keep`` of the files the manifest lists
    that still hold what the run wrote (``current`` is kept); the others
    leave the manifest."""
    ours = []
    for name in read_manifest(directory)["written"]:
        path = os.path.join(directory, name)
        if name_step(name) is not None and _is_ours(path, run):
            ours.append((name_step(name), path))
    ours.sort()
    kept = [path for _, path in ours]
    for _, path in ours[:-keep]:
        if path != current:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            kept.remove(path)
    _write_manifest(directory, run, [os.path.basename(p) for p in kept])


def clear(directory):
    """Deletes what earlier runs of ``directory`` wrote (checkpoints, the
    manifest, ``*.partial`` files) and leaves every other file."""
    if not os.path.isdir(directory):
        return
    try:
        run = (read_manifest(directory) or {}).get("run")
    except RunCheckpointError:
        run = None  # a damaged manifest: only files without a run go
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if (name.startswith((".ckpt-", f".{MANIFEST}."))
                and atomic.PARTIAL in name):
            mine = True
        elif name_step(name) is not None:
            try:
                meta = read_meta(path)
            except RunCheckpointError:
                continue
            mine = (meta["step"] == name_step(name)
                    and meta["run"] in (None, run))
        else:
            continue
        if mine:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.remove(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, MANIFEST))


def load(path, expected, *, run=None):
    """Reads a checkpoint and checks it against ``expected`` (group name ->
    list of ``(shape, dtype)``), its step against its name and its run
    against ``run`` (None: any). Returns ``(groups, meta)``; raises
    :class:`RunCheckpointError` listing every mismatch at once."""
    meta = read_meta(path)
    _check_identity(path, meta, run)
    headers = {name[:-len(".npy")]: header
               for name, header in meta.pop("headers").items()
               if header is not None}
    problems = []
    for name, specs in expected.items():
        keys = sorted(k for k in headers if k.startswith(name + "/"))
        if len(keys) != len(specs):
            problems.append(f"{name}: {len(keys)} arrays in the file, "
                            f"{len(specs)} in this run")
            continue
        for key, (shape, dtype) in zip(keys, specs):
            header = headers[key]
            if tuple(header.shape) != tuple(shape):
                problems.append(f"{key}: shape {tuple(header.shape)} in the "
                                f"file, {tuple(shape)} in this run")
            elif header.dtype != np.dtype(dtype):
                problems.append(f"{key}: dtype {header.dtype} in the file, "
                                f"{np.dtype(dtype)} in this run")
    extra = sorted({k.split("/")[0] for k in headers} - set(expected)
                   - {"meta"})
    if extra:
        problems.append(f"groups this run does not have: {extra}")
    if problems:
        raise RunCheckpointError(
            f"The checkpoint {path!r} does not fit this run (another "
            "architecture, number of classes, optimizer or EMA setting); "
            "use another out_dir, or resume=False (--restart) to start "
            "again. Differences: " + "; ".join(problems[:8])
            + (f"; and {len(problems) - 8} more" if len(problems) > 8
               else ""))
    try:
        with np.load(path, allow_pickle=False) as archive:
            groups = {name: [archive[k] for k in sorted(
                k for k in headers if k.startswith(name + "/"))]
                for name in expected}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise _unreadable(path, e) from None
    return groups, meta
