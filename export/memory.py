"""Peak resident memory of an export (this process and its converter
processes) and the sizes of what it wrote."""

from __future__ import annotations

import os
import threading

from keras_vit.runtime import hardware


def current_rss():
    """Resident memory of this process in bytes (0 if unknown)."""
    rss = hardware.resident_memory()
    return 0 if rss is None else rss


def own_peak_rss():
    """This process's peak resident memory in bytes since it was started.

    Read from ``VmHWM``: a new process's ``ru_maxrss`` (the fallback
    where ``/proc`` is missing) starts at the RSS of its parent.

    >>> own_peak_rss() >= current_rss() > 0
    True
    """
    peak = hardware.peak_resident_memory()
    if peak is not None:
        return peak
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # bytes vs KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def worker_peaks(rss):
    """The peaks, in bytes, a converter process reports to its parent: its
    own and those of its children (``rss``, the :class:`PeakRSS` it ran
    under)."""
    return {"peak_rss": own_peak_rss(), "child_peak_rss": rss.child_peak}


class PeakRSS:
    """Samples this process's resident memory in a thread (every 10 ms).

    A sampler, not the kernel's high-water mark, so that a peak is not
    that of an earlier export in the same process.

    >>> with PeakRSS() as rss:
    ...     block = bytearray(64 * 2**20)
    >>> rss.peak >= 64 * 2**20
    True
    """

    def __init__(self, interval=0.01):
        self.interval = interval
        self.peak = 0
        self.child_peak = 0
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, current_rss())

    def __enter__(self):
        self.peak = current_rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss())
        return False

    def sample(self):
        self.peak = max(self.peak, current_rss())
        return self.peak

    def add_child(self, peak_bytes):
        self.child_peak = max(self.child_peak, int(peak_bytes or 0))


def mib(nbytes):
    return round(nbytes / 2**20, 1)


def path_size(path):
    """Bytes of a file, or of all files under a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f))
                   for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)
