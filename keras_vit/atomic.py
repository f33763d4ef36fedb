"""Every file keras-vit writes appears complete or not at all.

One helper for all writers (run directories, reports, plots, converted
models, checkpoints in the official layout, the download cache, export
reports): the data goes to a temporary name in the destination's folder,
is flushed to disk, and is renamed over the destination only when whole
(``os.replace`` is atomic on POSIX and Windows). A process killed at any
moment leaves the old file or the new one, plus at most a stray
``*.partial`` file that no reader takes for a result.

>>> import json, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "metrics.json")
>>> write_json(path, {"complete": True})
>>> json.load(open(path))
{'complete': True}
>>> with atomic_path(path) as tmp:
...     _ = open(tmp, "w").write("half")
...     raise RuntimeError("killed mid-write")
Traceback (most recent call last):
RuntimeError: killed mid-write
>>> json.load(open(path))  # the old file, untouched
{'complete': True}
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid

PARTIAL = ".partial"


def _fsync(path):
    if os.path.isdir(path):
        return
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(path, suffix=None):
    """Yields a temporary path beside ``path``; whatever the block writes
    there replaces ``path`` when the block ends normally and is deleted if
    it raises (or never appears under ``path`` if the process dies).

    Args:
        path: the destination file (or directory: a whole tree written at
            the temporary path is renamed into place; an existing tree at
            ``path`` is replaced).
        suffix: the temporary name's ending; default: ``path``'s extension,
            which writers that check it (``model.save`` wants ``.keras``,
            ``np.savez`` appends ``.npz`` otherwise) need.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if suffix is None:
        suffix = os.path.splitext(path)[1]
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}."
                               f"{uuid.uuid4().hex[:8]}{PARTIAL}{suffix}")
    try:
        yield tmp
        if not os.path.exists(tmp):
            raise FileNotFoundError(
                f"nothing was written for {path!r} (expected {tmp!r})")
        _fsync(tmp)
        if os.path.isdir(path) and not os.path.isdir(tmp):
            raise IsADirectoryError(
                f"cannot write the file {path!r}: a directory of that name "
                "exists; pass another name")
        if os.path.isdir(tmp) and os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text):
    """Writes ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def write_json(path, obj, *, indent=2, default=None):
    """Writes ``obj`` as JSON (and a final newline) to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")
