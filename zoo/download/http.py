"""One file over HTTP(S), streamed into the download cache within bounds.

Every wait for bytes is bounded by the stall ``timeout`` and by what is
left of the whole download's deadline (:class:`_DeadlineSocket`: a plain
socket timeout restarts with each byte), and a download too slow for
:class:`Throughput` stops.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import io
import socket
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from keras_vit.base import environment
from keras_vit.zoo.download.cache import (CHUNK, ChecksumError, DownloadError,
                                          official_url, write_sidecar)

ENV_STALL = "KERAS_VIT_DOWNLOAD_STALL_S"

_USER_AGENT = "keras-vit"
# The whole of one download may take this long (a ViT-H checkpoint is 2.5 GB).
DEFAULT_DEADLINE = 3 * 3600.0
# Fewer than STALL_BYTES in the last KERAS_VIT_DOWNLOAD_STALL_S seconds stops
# a download: a trickling server fails in minutes, not at the deadline.
STALL_BYTES = 64 << 10


def stall_seconds() -> float:
    """The window of the minimum-throughput rule, in seconds."""
    return environment.read(ENV_STALL)


class Throughput:
    """The minimum-throughput rule: :meth:`stalled` is True once a whole
    window of ``seconds`` has passed in which fewer than :data:`STALL_BYTES`
    arrived."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._marks = [(time.monotonic(), 0)]

    def stalled(self, received: int) -> bool:
        """Records ``received`` (bytes so far) and applies the rule."""
        now = time.monotonic()
        self._marks.append((now, received))
        while len(self._marks) > 1 and self._marks[1][0] <= now - self.seconds:
            self._marks.pop(0)
        since, base = self._marks[0]
        return now - since >= self.seconds and received - base < STALL_BYTES

    def error(self, where: str, received: int, total=None) -> "DownloadError":
        """The error for a stalled download of ``where``."""
        return DownloadError(
            f"download of {where} stalled: fewer than {STALL_BYTES} bytes arrived in "
            f"the last {self.seconds:g} s ({received} of {total or 'unknown'} bytes so "
            f"far) and it was stopped; retry on a faster network or mirror, or set "
            f"{ENV_STALL} to a longer window")


class _DeadlineExceeded(socket.timeout):
    """The overall deadline of a download passed while waiting for bytes."""


class _DeadlineSocket:
    """A connected socket whose every wait is bounded by the stall
    ``timeout`` and by what is left of the download's ``give_up`` time."""

    def __init__(self, sock, give_up: float, timeout: float):
        self._sock, self._give_up, self._timeout = sock, give_up, timeout
        self._files, self._closed = 0, False

    def _arm(self):
        left = self._give_up - time.monotonic()
        if left <= 0:
            raise _DeadlineExceeded("the download deadline passed")
        self._sock.settimeout(min(self._timeout, left))

    def recv_into(self, *args):
        self._arm()
        return self._sock.recv_into(*args)

    def recv(self, *args):
        self._arm()
        return self._sock.recv(*args)

    def sendall(self, *args):
        self._arm()
        return self._sock.sendall(*args)

    def makefile(self, mode="r", buffering=None, **kwargs):
        # http.client reads through this file: its reads must come back
        # to recv_into; closing the socket leaves the file open (urllib
        # closes it once the headers are in).
        self._files += 1
        raw = socket.SocketIO(self, mode.replace("b", ""))
        return io.BufferedReader(raw) if "r" in mode else io.BufferedWriter(raw)

    def _decref_socketios(self):
        self._files -= 1
        if self._closed and self._files <= 0:
            self._sock.close()

    def close(self):
        self._closed = True
        if self._files <= 0:
            self._sock.close()

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _deadline_connection(base):
    """An ``http.client`` connection class whose socket is a
    :class:`_DeadlineSocket`."""

    class Connection(base):
        def __init__(self, *args, give_up: float, stall: float, **kwargs):
            super().__init__(*args, **kwargs)
            self._give_up, self._stall = give_up, stall

        def connect(self):
            left = self._give_up - time.monotonic()
            if left <= 0:
                raise _DeadlineExceeded("the download deadline passed")
            self.timeout = min(self._stall, left)
            super().connect()  # HTTPS: the TLS handshake runs in here
            self.sock = _DeadlineSocket(self.sock, self._give_up, self._stall)

    return Connection


class _DeadlineHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Opens http and https URLs through :func:`_deadline_connection`."""

    def __init__(self, give_up: float, stall: float):
        super().__init__()
        self._bounds = dict(give_up=give_up, stall=stall)

    def http_open(self, req):
        connection = _deadline_connection(http.client.HTTPConnection)
        return self.do_open(functools.partial(connection, **self._bounds), req)

    def https_open(self, req):
        extra = {}
        if getattr(self, "_check_hostname", None) is not None:  # Python < 3.12
            extra["check_hostname"] = self._check_hostname
        connection = _deadline_connection(http.client.HTTPSConnection)
        return self.do_open(functools.partial(connection, **self._bounds), req,
                            context=self._context, **extra)


def _late(where: str, deadline: float, when: str) -> DownloadError:
    return DownloadError(
        f"download of {where} did not finish within {deadline:.0f} s ({when}); pass a "
        "larger deadline or use a faster mirror")


def download_file(resolved: str, url: str, final: Path, expected: Optional[str],
                  progress: Optional[bool], timeout: float,
                  deadline: float = DEFAULT_DEADLINE) -> None:
    """Stream ``resolved`` into ``final`` via a temporary file; verify; rename atomically."""
    official = official_url(url)  # where names the mirror it came from
    where = (resolved if resolved == official
             else f"{resolved} (mirror of {official})")
    give_up = time.monotonic() + deadline
    rate = Throughput(stall_seconds())
    # Its temporary name ends in ".partial" (remove_stale_partials).
    from keras_vit.base import atomic

    with atomic.atomic_path(final, suffix="") as partial:
        with open(partial, "wb") as out:
            request = urllib.request.Request(resolved, headers={"User-Agent": _USER_AGENT})
            try:
                # The whole exchange is bounded by give_up.
                opener = urllib.request.build_opener(
                    _DeadlineHandler(give_up, timeout))
                response = opener.open(request, timeout=timeout)
            except urllib.error.HTTPError as e:  # must precede URLError (its base class)
                e.close()
                raise DownloadError(
                    f"HTTP error {e.code} ({e.reason}) while downloading {where}") from e
            except (OSError, http.client.HTTPException) as e:  # timeouts, resets, bad status lines
                if time.monotonic() >= give_up:  # connect or headers too slow
                    raise _late(where, deadline, "before its response headers were complete") from e
                reason = e.reason if isinstance(e, urllib.error.URLError) else repr(e)
                raise DownloadError(f"could not download {where}: {reason}") from e

            with response:
                total = _content_length(response)
                kind = response.headers.get("Content-Type", "")
                if "text/html" in kind.lower() and not final.name.endswith((".html", ".htm")):
                    raise DownloadError(
                        f"{where} answered with an HTML page (Content-Type {kind!r}), "
                        "not the file: a login or error page of a proxy or mirror?")
                digest, received = hashlib.sha256(), 0
                disable = None if progress is None else not progress  # None: only on a TTY
                with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                          desc=final.name, disable=disable) as bar:
                    while True:
                        got = f"after {received} of {total or 'unknown'} bytes"
                        if time.monotonic() > give_up:
                            raise _late(where, deadline, got)
                        try:
                            # read1: a trickling server cannot hold one read open.
                            chunk = response.read1(CHUNK)
                        except http.client.IncompleteRead as e:
                            received += len(e.partial)
                            raise DownloadError(
                                f"download of {where} truncated: got {received} of {total} bytes"
                            ) from e
                        except (OSError, http.client.HTTPException) as e:
                            if time.monotonic() >= give_up:
                                raise _late(where, deadline, got) from e
                            raise DownloadError(
                                f"download of {where} failed after {received} bytes: {e!r}"
                            ) from e
                        if not chunk:
                            break
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                        if rate.stalled(received):
                            raise rate.error(where, received, total)

        # http.client silently returns EOF when the server closes the connection early.
        if total is not None and received != total:
            raise DownloadError(f"download of {where} truncated: got {received} of {total} bytes")
        _check_complete(partial, final.name, where)
        actual = digest.hexdigest()
        if expected is not None and actual != expected:
            raise ChecksumError(
                f"checksum mismatch for {where}: expected sha256 {expected}, got {actual}")
    write_sidecar(final, actual)


def _check_complete(path: str, name: str, where: str) -> None:
    """Refuses an ``.npz`` body that is not a whole zip archive whose every
    member's CRC-32 matches."""
    if not name.endswith(".npz"):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DownloadError(
            f"{where} did not send a complete .npz archive ({e}); nothing was cached") from e
    if bad is not None:
        raise DownloadError(f"{where} sent a corrupt .npz archive (bad member {bad!r})")


def _content_length(response) -> Optional[int]:
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
