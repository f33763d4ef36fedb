"""keras_vit.base.atomic: no loss. Every file the package writes appears
complete or not at all: a writer killed mid-write, a full disk or an
interrupted writer leaves the old file (or none) and no partial one; a
Ctrl-C waits for the renames that must happen together; a killed owner's
scratch is removed; a lock decides by the holder's pid where flock is
missing."""

import keras
import numpy as np
import pytest

from testkit import QUICK, tiny as _tiny
from testkit import killed_when_ready, wait_until


_KILLED_WRITER = r"""
import importlib.util, sys, time
# keras_vit/base/atomic.py alone (stdlib only): no Keras start-up to wait for.
spec = importlib.util.spec_from_file_location("atomic", sys.argv[3])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
path, old = sys.argv[1], sys.argv[2]
with atomic.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
        f.write("{" + "x" * 1_000_000)  # half a JSON document
        f.flush()
        print("writing", flush=True)
        time.sleep(60)  # killed here, mid-write
        f.write("}")
"""


@pytest.mark.parametrize("old", [None, '{"complete": true}\n'])
def test_writer_killed_mid_write_leaves_old_file_or_none(tmp_path, old):
    import json
    import os
    import subprocess
    import sys

    from keras_vit.base import atomic

    path = tmp_path / "metrics.json"
    if old is not None:
        path.write_text(old)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path), str(old),
         atomic.__file__],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    with killed_when_ready(proc, "writing"):
        pass  # killed mid-write
    if old is None:
        assert not path.exists()
    else:
        assert json.loads(path.read_text()) == {"complete": True}
    strays = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    assert all(".partial" in name for name in strays), strays


class _BoomError(Exception):
    pass


def _half_then_boom(path, *args, **kwargs):
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 half")
    raise _BoomError("killed mid-write")


@pytest.mark.slow
def test_every_writer_goes_through_the_atomic_helper(tmp_path, monkeypatch):
    """Each writer, interrupted after writing part of its file, leaves
    nothing under the final name (the old file where there was one)."""
    import json
    import os

    import keras_vit.train
    from keras_vit.base import atomic
    from keras_vit.export import common
    from keras_vit.zoo import convert
    from keras_vit.zoo.download import cache as download_cache

    model = _tiny()
    monkeypatch.setattr(np, "savez", _half_then_boom)
    with pytest.raises(_BoomError):
        convert.save_npz(model, tmp_path / "w.npz")
    monkeypatch.undo()

    real_dumps = json.dumps

    def dumps_then_boom(*args, **kwargs):
        real_dumps(*args, **kwargs)
        raise _BoomError("killed mid-write")

    monkeypatch.setattr(json, "dumps", dumps_then_boom)
    for write in (lambda p: atomic.write_json(p, {"a": 1}),
                  lambda p: common.write_json(p, {"a": 1}),
                  lambda p: download_cache.write_sidecar(p, "0" * 64)):
        target = tmp_path / "old.json"
        target.write_text("old")
        with pytest.raises(_BoomError):
            write(target)
        assert target.read_text() == "old"
    monkeypatch.undo()

    # model.keras of a run: the Trainer's save.
    monkeypatch.setattr(keras.Model, "save",
                        lambda self, path, **kw: _half_then_boom(path))
    out = tmp_path / "run"
    with pytest.raises(_BoomError):
        keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                out_dir=out, total_steps=1, warmup_steps=0,
                                **QUICK).fit()
    assert not (out / "model.keras").exists()
    assert not (out / "metrics.json").exists()
    assert all(".partial" not in n for n in os.listdir(out))


_FULL_DISK_WRITER = r"""
import importlib.util, resource, signal, sys
spec = importlib.util.spec_from_file_location("atomic", sys.argv[2])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
# The disk is "full" after 4 KiB: writes past it fail with EFBIG (the
# signal that would kill the process instead is ignored).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    atomic.write_json(sys.argv[1], {"weights": "x" * 100_000})
except OSError as e:
    print("refused", e.errno, flush=True)
"""


def test_a_full_disk_leaves_the_old_file_and_no_partial(tmp_path):
    import errno
    import json
    import subprocess
    import sys

    from keras_vit.base import atomic

    path = tmp_path / "report.json"
    path.write_text('{"complete": true}\n')
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_WRITER, str(path),
         atomic.__file__], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["refused", str(errno.EFBIG)], proc.stderr
    assert json.loads(path.read_text()) == {"complete": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_ctrl_c_waits_for_the_renames_that_must_happen_together(tmp_path):
    import signal

    from keras_vit.base import atomic

    done = []
    with pytest.raises(KeyboardInterrupt):
        with atomic.interrupts_deferred():
            signal.raise_signal(signal.SIGINT)  # Ctrl-C mid-commit
            done.append("renamed")  # still runs
    assert done == ["renamed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_watcher_removes_scratch_when_its_owner_is_killed(tmp_path):
    import subprocess
    import sys

    from keras_vit.base import atomic

    scratch = tmp_path / ".m.partial-x"
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import importlib.util, os, sys, time\n"
         "spec = importlib.util.spec_from_file_location('atomic', sys.argv[2])"
         "\natomic = importlib.util.module_from_spec(spec)\n"
         "spec.loader.exec_module(atomic)\n"
         "os.mkdir(sys.argv[1])\n"
         "watcher = atomic.ScratchWatcher(sys.argv[1])\n"
         "print('ready', flush=True)\ntime.sleep(120)\n",
         str(scratch), atomic.__file__], stdout=subprocess.PIPE, text=True)
    with killed_when_ready(owner, "ready"):
        assert scratch.is_dir()
    wait_until(lambda: not scratch.exists())
    assert not scratch.exists()


def test_save_npz_on_a_full_disk_keeps_the_old_checkpoint(tmp_path):
    import resource
    import signal

    from keras_vit import zoo

    model = _tiny()
    path = tmp_path / "w.npz"
    path.write_bytes(b"old")
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, hard))
    try:
        with pytest.raises(OSError):
            zoo.save_npz(model, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]


def test_without_flock_the_pid_in_the_lock_decides(tmp_path, monkeypatch):
    import errno
    import os
    import subprocess
    import sys

    from keras_vit.base import atomic

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(atomic.fcntl, "flock", no_flock)
    lock = tmp_path / "run.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    lock.write_text(f"pid {dead} since 2020-01-01 00:00:00\n")
    taken = atomic.FileLock(lock).acquire()  # its process is gone
    assert lock.read_text().startswith(f"pid {os.getpid()} since")
    taken.release()
    assert lock.read_text() == ""
    lock.write_text(f"pid {os.getppid()} since 2020-01-01 00:00:00\n")
    with pytest.raises(atomic.LockHeldError, match=rf"held by pid "
                                                   rf"{os.getppid()} since"):
        atomic.FileLock(lock).acquire()
