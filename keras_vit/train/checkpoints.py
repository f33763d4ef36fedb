"""Run checkpoints without TensorFlow objects: one ``.npz`` per saved step.

The jax and torch engines of :class:`~keras_vit.train.Trainer` keep every
piece of a run's state in one file, ``OUT/checkpoints/ckpt-STEP.npz``:

    model/00000 ...      every model variable, trainable or not (the dropout
                         seed-generator states too, so a resumed run draws
                         the same masks)
    optimizer/00000 ...  the optimizer's variables (its iteration count,
                         moments, ...)
    ema/00000 ...        the weight average, when the recipe has one
    meta/step, meta/epoch, meta/batch_in_epoch
    meta/settings        the run's settings (JSON as UTF-8 bytes, uint8), so
                         that a resumed run is checked against what the
                         checkpoint itself records, not an editable side file

Files are written through :mod:`keras_vit.base.atomic` (a killed write leaves a
``*.partial`` name that :func:`latest` never returns), the last
:data:`KEEP` are kept, and nothing is unpickled: :func:`load` reads and
checks the whole file against the run before anything is assigned.

>>> import os, tempfile, numpy as np
>>> folder = tempfile.mkdtemp()
>>> for step in (1, 2, 3, 4):
...     _ = save(folder, step, {"model": [np.full((2,), step, "float32")]},
...              {"epoch": 0, "batch_in_epoch": step})
>>> sorted(os.listdir(folder)), latest(folder)[0]
(['ckpt-2.npz', 'ckpt-3.npz', 'ckpt-4.npz'], 4)
>>> groups, meta = load(latest(folder)[1], {"model": [((2,), "float32")]})
>>> groups["model"][0].tolist(), meta["batch_in_epoch"]
([4.0, 4.0], 4)
"""

from __future__ import annotations

import os
import re
import zipfile

import numpy as np

from keras_vit.base import atomic

KEEP = 3
META = ("step", "epoch", "batch_in_epoch")
_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


def path_for(directory, step):
    """``directory/ckpt-STEP.npz``."""
    return os.path.join(directory, f"ckpt-{int(step)}.npz")


def steps(directory):
    """The steps of the complete checkpoints in ``directory``, oldest
    first (temporary ``*.partial`` files of a killed write are not
    checkpoints)."""
    if not os.path.isdir(directory):
        return []
    found = (_NAME.match(name) for name in os.listdir(directory))
    return sorted(int(m.group(1)) for m in found if m)


def latest(directory):
    """``(step, path)`` of the newest checkpoint, or None."""
    found = steps(directory)
    return (found[-1], path_for(directory, found[-1])) if found else None


def save(directory, step, groups, meta, *, keep=KEEP, settings=None):
    """Writes ``groups`` (name -> list of arrays) and ``meta`` (name -> int;
    ``step`` is added) as ``ckpt-STEP.npz`` atomically, then deletes all but
    the newest ``keep`` checkpoints. ``settings`` (a string: the run's
    settings as JSON) is recorded in the file. Returns the path."""
    arrays = {f"{name}/{i:05d}": np.asarray(value)
              for name, values in groups.items()
              for i, value in enumerate(values)}
    for key, value in dict(meta, step=step).items():
        arrays[f"meta/{key}"] = np.asarray(int(value), np.int64)
    if settings is not None:
        arrays["meta/settings"] = np.frombuffer(
            settings.encode("utf-8"), np.uint8)
    path = path_for(directory, step)
    with atomic.atomic_path(path) as tmp:
        np.savez(tmp, **arrays)
    for old in steps(directory)[:-keep]:
        os.remove(path_for(directory, old))
    return path


def load(path, expected):
    """Reads a checkpoint whole and checks it against ``expected`` (group
    name -> list of ``(shape, dtype)``): every group with as many arrays,
    each of the expected shape and dtype, and the meta fields. Returns
    ``(groups, meta)``, ``meta["settings"]`` the recorded settings (JSON
    text, None in a checkpoint written before they were recorded); raises
    ValueError listing every mismatch at once before the caller assigns
    anything."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(
            f"The checkpoint {path!r} cannot be read ({e}); delete it to "
            "resume from the one before, or start again with "
            "resume=False") from None
    problems = []
    groups = {}
    for name, specs in expected.items():
        keys = sorted(k for k in arrays if k.startswith(name + "/"))
        if len(keys) != len(specs):
            problems.append(f"{name}: {len(keys)} arrays in the file, "
                            f"{len(specs)} in this run")
            continue
        values = [arrays[k] for k in keys]
        for key, value, (shape, dtype) in zip(keys, values, specs):
            if tuple(value.shape) != tuple(shape):
                problems.append(f"{key}: shape {tuple(value.shape)} in the "
                                f"file, {tuple(shape)} in this run")
            elif np.dtype(value.dtype) != np.dtype(dtype):
                problems.append(f"{key}: dtype {value.dtype} in the file, "
                                f"{np.dtype(dtype)} in this run")
        groups[name] = values
    extra = sorted({k.split("/")[0] for k in arrays} - set(expected)
                   - {"meta"})
    if extra:
        problems.append(f"groups this run does not have: {extra}")
    meta = {"settings": None}
    raw = arrays.get("meta/settings")
    if raw is not None:
        try:
            if raw.dtype != np.uint8 or raw.ndim != 1:
                raise ValueError("not a byte string")
            meta["settings"] = raw.tobytes().decode("utf-8")
        except ValueError as e:
            problems.append(f"meta/settings: unreadable ({e})")
    for key in META:
        value = arrays.get(f"meta/{key}")
        if value is None or value.shape != () or value.dtype.kind not in "iu":
            problems.append(f"meta/{key}: missing or not an integer")
        else:
            meta[key] = int(value)
    if problems:
        raise ValueError(
            f"The checkpoint {path!r} does not fit this run (another "
            "architecture, number of classes, optimizer or EMA setting); "
            "use another out_dir, or resume=False (--restart) to start "
            "again. Differences: " + "; ".join(problems[:8])
            + (f"; and {len(problems) - 8} more" if len(problems) > 8
               else ""))
    return groups, meta
