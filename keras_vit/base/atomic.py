"""Every file keras-vit writes appears complete or not at all.

The data goes to a temporary name in the destination's folder, is
flushed to disk, and is renamed over the destination only when whole
(``os.replace`` is atomic on POSIX and Windows). A process killed at any
moment leaves the old file or the new one, plus at most a stray
``*.partial`` file.

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
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref

from keras_vit.base.errors import KerasVitError

try:  # POSIX only; elsewhere locks are not taken.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

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
    it raises.

    Args:
        path: the destination file (or directory: a tree written at the
            temporary path replaces it).
        suffix: the temporary name's ending; default: ``path``'s extension
            (``model.save`` wants ``.keras``, ``np.savez`` appends ``.npz``
            otherwise).
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


def write_text(path, text, *, suffix=None):
    """Writes ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path, suffix=suffix) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def to_json(value, *, strict=False):
    """``value`` with what JSON cannot hold made plain: NumPy values as
    Python numbers and lists, keys as strings, anything unknown as its
    ``str``. ``strict``: non-finite floats as strings (strict JSON parsers
    refuse ``NaN``).

    >>> import numpy as np
    >>> to_json({1: (np.float32(0.5), np.arange(2)), "x": np.bool_(True)})
    {'1': [0.5, [0, 1]], 'x': True}
    >>> to_json([float("nan"), "s"], strict=True)
    ['nan', 's']
    """
    import numpy as np

    if isinstance(value, dict):
        return {str(k): to_json(v, strict=strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, strict=strict) for v in value]
    if isinstance(value, np.ndarray):
        return to_json(value.tolist(), strict=strict)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return str(value) if strict and not np.isfinite(value) else value
    if value is None or isinstance(value, str):
        return value
    return str(value)


def write_json(path, obj, *, indent=2, strict=False, suffix=None):
    """Writes ``obj`` as JSON (made plain by :func:`to_json`) to ``path``
    atomically."""
    write_text(path, json.dumps(to_json(obj, strict=strict), indent=indent)
               + "\n", suffix=suffix)


# A lock file stays (unlinking it while another process waits on it would
# let a third lock a new inode concurrently).

_LOCK_POLL = 0.2


class LockHeldError(KerasVitError, OSError):
    """Another process holds a lock. ``holder`` is what it wrote into the
    lock file (``"pid 123 since 2025-01-01 12:00:00"``)."""

    def __init__(self, message, path, holder):
        super().__init__(message)
        self.path = path
        self.holder = holder


def _holder(handle):
    handle.seek(0)
    return handle.read(200).decode("utf-8", "replace").strip() or (
        "another process")


def _live_holder(handle):
    """Where ``flock`` is not supported: what the lock file names if that
    pid is another process still running, else None."""
    holder = _holder(handle)
    try:
        pid = int(holder.split()[1]) if holder.startswith("pid ") else None
    except (IndexError, ValueError):
        pid = None
    if pid is None or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:  # alive, another user's
        pass
    return holder


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing) until
    :meth:`release`; the holder writes its pid and start time into it.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "run.lock")
    >>> lock = FileLock(path).acquire()
    >>> open(path).read().startswith(f"pid {os.getpid()} since")
    True
    >>> lock.release()
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._handle = None
        self._flocked = True

    def acquire(self, wait=0.0):
        """Takes the lock, waiting at most ``wait`` seconds (``inf``:
        forever); :class:`LockHeldError` naming the holder when it cannot.
        Returns ``self``."""
        handle = open(self.path, "a+b")
        if fcntl is None:  # pragma: no cover
            self._handle = handle
            return self
        give_up = time.monotonic() + wait
        self._flocked = True
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = None
            except OSError:
                # No flock on this file system: the pid in the file decides
                # (two takers at the same instant can both win).
                holder = _live_holder(handle)
                if holder is None:
                    self._flocked = False
                    break
            except BaseException:
                handle.close()
                raise
            if time.monotonic() >= give_up:
                holder = holder or _holder(handle)
                handle.close()
                raise LockHeldError(
                    f"the lock {self.path} is held by {holder}", self.path,
                    holder)
            time.sleep(min(_LOCK_POLL, max(0.0, give_up - time.monotonic())))
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        handle.flush()
        self._handle = handle
        return self

    def release(self):
        handle, self._handle = self._handle, None
        if handle is None:
            return
        with contextlib.suppress(OSError):
            if not self._flocked:
                handle.truncate(0)  # the pid alone held it: free it
            elif fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def exclusive_lock(path, wait=float("inf")):
    """Holds a :class:`FileLock` on ``path`` for the block."""
    lock = FileLock(path).acquire(wait)
    try:
        yield lock
    finally:
        lock.release()


# Locks held for owners: a second owner in this process shares the lock.
_HELD = {}
_HELD_GUARD = threading.Lock()


def _drop(key):
    with _HELD_GUARD:
        entry = _HELD.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _HELD[key]
            entry[0].release()


def hold_lock(owner, path):
    """Takes the lock ``path`` (no wait) for as long as ``owner`` lives;
    returns a callable that releases it earlier."""
    key = os.path.realpath(path)
    with _HELD_GUARD:
        entry = _HELD.get(key)
        if entry is None:
            entry = _HELD[key] = [FileLock(path).acquire(), 0]
        entry[1] += 1
    return weakref.finalize(owner, _drop, key)


# A watcher process removes a staging directory when its owner dies (kill
# -9 runs no Python cleanup): its pipe's input ends.

_WATCHER = r"""
import os, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
path, groups = sys.argv[1], set()
for line in sys.stdin:
    verb, _, pgid = line.partition(" ")
    if verb in ("add", "drop") and pgid.strip().isdigit():
        (groups.add if verb == "add" else groups.discard)(int(pgid))
for pgid in groups:  # processes the owner started that write in path
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
if groups:
    time.sleep(0.2)
if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
elif os.path.lexists(path):
    os.remove(path)
"""


class ScratchWatcher:
    """Removes ``path`` (a file or a directory tree) when :meth:`close` is
    called or, if this process dies first, as soon as it is gone; process
    groups passed to :meth:`add_group` are killed first (children writing
    into ``path`` would create it again).

    >>> import tempfile
    >>> scratch = tempfile.mkdtemp()
    >>> ScratchWatcher(scratch).close()
    >>> os.path.exists(scratch)
    False
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            # -I -S: no site packages, no user paths; starts in ~20 ms.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHER, self.path],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
                text=True)
        except OSError:
            self._proc = None

    def _send(self, line):
        if self._proc is not None:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()

    def add_group(self, pgid):
        """Kills process group ``pgid`` too, unless :meth:`drop_group`."""
        self._send(f"add {int(pgid)}")

    def drop_group(self, pgid):
        self._send(f"drop {int(pgid)}")

    def close(self):
        """Removes ``path`` now and stops the watcher."""
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            shutil.rmtree(self.path, ignore_errors=True)
        elif os.path.lexists(self.path):
            with contextlib.suppress(OSError):
                os.remove(self.path)
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)


@contextlib.contextmanager
def interrupts_deferred():
    """Holds Ctrl-C (SIGINT) back during the block and raises its
    KeyboardInterrupt after it. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    try:
        previous = signal.signal(signal.SIGINT,
                                 lambda *args: caught.append(args))
    except (ValueError, OSError):  # not the main interpreter
        yield
        return
    if previous is None:  # installed outside Python: Python's own after
        previous = signal.default_int_handler
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not caught or previous is signal.SIG_IGN:
        return
    if callable(previous):
        previous(*caught[0])  # Python's handler raises KeyboardInterrupt
    else:
        raise KeyboardInterrupt
