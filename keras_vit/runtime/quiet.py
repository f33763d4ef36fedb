"""Keeps TensorFlow's C++ log lines off the ``keras-vit`` command's stderr.

TensorFlow 2.21 writes its start-up lines through absl before absl logging
is initialised, ignoring ``TF_CPP_MIN_LOG_LEVEL`` (21 such lines in
``keras-vit demo`` with it set to 3), from several shared libraries: only
file descriptor 2 sees them all. The command routes it through a pipe and a
thread that drops those lines and passes everything else unchanged,
partial lines (progress bars) included. A library leaves stderr alone;
``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off. A converter that prints
from C++ on success runs inside :func:`captured_output`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import tempfile
import threading

from keras_vit.base import environment

# An absl/glog line: severity, MMDD, time, thread id, file:line].
_LOG_LINE = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s\]]+:\d+\]")
_OTHER_LINES = (
    b"WARNING: All log messages before absl::InitializeLog() is called",
    # The second line of cpu_feature_guard.cc's message.
    b"To enable the following instructions:",
    # LiteRT's note at the first run of a .tflite file, once per process.
    b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
)
# A partial line that may still become one of the above is held back; any
# other partial line (a progress bar redrawn with \r) is passed at once.
_MAY_START = (b"I", b"W", b"E", b"F", b"T")

_installed = None


def is_tf_log_line(line: bytes) -> bool:
    """True for one line of TensorFlow's C++ logging.

    >>> is_tf_log_line(b"I0000 00:00:1795411190.888766   13412 port.cc:153] "
    ...                b"oneDNN custom operations are on.")
    True
    >>> is_tf_log_line(b"keras-vit: error: no such file")
    False
    """
    return bool(_LOG_LINE.match(line)) or line.startswith(_OTHER_LINES)


def tf_logs_hidden():
    """False when the user asked to see TensorFlow's C++ logs
    (``TF_CPP_MIN_LOG_LEVEL=0``), True otherwise."""
    return os.environ.get(environment.TF_LOG_LEVEL) != "0"


def without_tf_logs(text):
    """``text`` (what a process printed) without the lines of TensorFlow's
    C++ logging (:func:`is_tf_log_line`).

    >>> print(without_tf_logs(
    ...     "E0000 00:00:1795690886.949431    7315 util.cc:131] oneDNN "
    ...     "supports DT_UINT8 only on platforms with AVX-512.\\n"
    ...     "MemoryError: out of memory\\n"), end="")
    MemoryError: out of memory
    """
    return "".join(line for line in text.splitlines(keepends=True)
                   if not is_tf_log_line(line.encode("utf-8", "replace")))


def _flush_std_streams():
    for stream in (sys.stdout, sys.stderr):
        # closed or None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


@contextlib.contextmanager
def captured_output():
    """Runs the block with file descriptors 1 and 2 sent to a temporary
    file, written to stderr only if the block raises. With
    ``TF_CPP_MIN_LOG_LEVEL=0`` nothing is redirected.

    >>> with captured_output():
    ...     _ = os.write(1, b"fully_quantize: 0\\n")
    >>> try:
    ...     with captured_output():
    ...         raise ValueError("conversion failed")
    ... except ValueError as e:
    ...     print(e)
    conversion failed
    """
    saved = []
    if tf_logs_hidden():
        _flush_std_streams()
        try:
            for fd in (1, 2):
                saved.append(os.dup(fd))
        except OSError:  # no stdout or stderr to redirect: nothing to hide
            for fd in saved:
                os.close(fd)
            saved = []
    if not saved:
        yield
        return
    failed = True
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield
                failed = False
            finally:
                _flush_std_streams()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                if failed:
                    sink.seek(0)
                    with contextlib.suppress(OSError):
                        _write_all(2, sink.read())
    finally:
        for fd in saved:
            os.close(fd)


def _filter(read_fd, write_fd):
    pending = b""      # the start of a line not yet decided
    passing = False    # the current line was already let through
    with os.fdopen(read_fd, "rb", buffering=0) as src:
        while True:
            chunk = src.read(65536)
            if not chunk:
                break
            data = pending + chunk
            pending = b""
            out = []
            while data:
                nl = data.find(b"\n")
                if nl < 0:  # a partial line
                    if passing or b"\r" in data or not data.startswith(
                            _MAY_START):
                        out.append(data)
                        passing = True
                    else:
                        pending = data
                    break
                line, data = data[:nl + 1], data[nl + 1:]
                if passing or not is_tf_log_line(line):
                    out.append(line)
                passing = False
            if out:
                os.write(write_fd, b"".join(out))
    if pending and not is_tf_log_line(pending):
        os.write(write_fd, pending)


def filter_stderr():
    """Routes file descriptor 2 through the filter for the rest of the
    process (once; a no-op when ``TF_CPP_MIN_LOG_LEVEL`` is ``0``)."""
    global _installed
    if _installed is not None or not tf_logs_hidden():
        return
    environment.quiet_tensorflow(os.environ)
    try:
        sys.stderr.flush()
        original = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
    except OSError:  # no usable fd 2: nothing to filter
        return
    thread = threading.Thread(target=_filter, args=(read_fd, original),
                              name="keras-vit-stderr", daemon=True)
    thread.start()
    _installed = (original, thread)
    atexit.register(_restore)


def hide_tensorflow_logs():
    """Hides TensorFlow's C++ start-up lines (``I0000 ... oneDNN custom
    operations are on``, ...) for the rest of this Python process, as the
    ``keras-vit`` command does; everything else on stderr passes unchanged.
    Call it before the first model is built; ``TF_CPP_MIN_LOG_LEVEL=0``
    makes it a no-op. In a script or a notebook, first thing::

        import keras_vit
        keras_vit.hide_tensorflow_logs()
    """
    filter_stderr()


def _restore():
    """Puts the original stderr back and lets the filter drain the pipe."""
    global _installed
    if _installed is None:
        return
    original, thread = _installed
    _installed = None
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os.dup2(original, 2)  # closes the pipe's last write end in this process
    thread.join(timeout=5)
