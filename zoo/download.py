"""Download and cache pretrained checkpoints.

Files are identified by their *official* URL (``https://storage.googleapis.com/...``
or the equivalent ``gs://...``) and cached under :func:`cache_dir`.  The cache
location depends only on the official URL, so pointing ``KERAS_VIT_MIRROR`` at a
different mirror reuses files that were already downloaded.

Environment variables:

``KERAS_VIT_CACHE``
    Cache directory (default ``$XDG_CACHE_HOME/keras_vit`` or ``~/.cache/keras_vit``).
``KERAS_VIT_OFFLINE``
    ``1``/``true``/``yes``/``on``: never download; missing files raise
    :class:`OfflineError` telling where to put them by hand.
``KERAS_VIT_MIRROR``
    Base URL that replaces ``https://storage.googleapis.com/`` when downloading.

Downloads are safe against concurrent processes (an exclusive ``flock`` per
file), against interruption (data is streamed into a uniquely named
``.partial`` file and atomically renamed only once complete and verified), and
against corruption (optional SHA-256 verification).

This module deliberately depends only on the standard library and ``tqdm``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import io
import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Union

from tqdm import tqdm

from keras_vit.base import environment
from keras_vit.base.errors import KerasVitError

__all__ = [
    "DownloadError",
    "ChecksumError",
    "OfflineError",
    "OFFICIAL_BASE",
    "cache_dir",
    "is_offline",
    "resolve_url",
    "cache_path_for",
    "fetch",
    "sha256_file",
]

OFFICIAL_BASE = "https://storage.googleapis.com/"

ENV_CACHE = "KERAS_VIT_CACHE"
ENV_OFFLINE = "KERAS_VIT_OFFLINE"
ENV_MIRROR = "KERAS_VIT_MIRROR"
ENV_STALL = "KERAS_VIT_DOWNLOAD_STALL_S"

_CHUNK = 1 << 20  # 1 MiB
_USER_AGENT = "keras-vit"
_STALE_PARTIAL_SECONDS = 24 * 3600
_SCHEMES = ("http", "https", "gs")
# Name pattern of our temporary files: "<file>.<pid>.<random>.partial".
_PARTIAL_RE = re.compile(r"\.\d+\.[A-Za-z0-9_]+\.partial$")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._+=@,-]")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The whole of one download may take this long (a ViT-H checkpoint is
# 2.5 GB); ``timeout`` bounds each wait for bytes (a stall).
DEFAULT_DEADLINE = 3 * 3600.0
# The least a download must move: fewer than STALL_BYTES in the last
# KERAS_VIT_DOWNLOAD_STALL_S seconds (default DEFAULT_STALL) stops it, so a
# server trickling a byte a second fails in minutes, not at the deadline.
STALL_BYTES = 64 << 10
DEFAULT_STALL = environment.VARIABLES[ENV_STALL].default

PathLike = Union[str, "os.PathLike[str]"]


class DownloadError(KerasVitError, OSError):
    """A file could not be downloaded."""


class ChecksumError(DownloadError):
    """A file's SHA-256 does not match the expected value."""


class OfflineError(DownloadError):
    """A file is missing from the cache and downloads are disabled."""


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def stall_seconds() -> float:
    """The window of the minimum-throughput rule: ``KERAS_VIT_DOWNLOAD_STALL_S``
    (a positive number of seconds), else :data:`DEFAULT_STALL`."""
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
        # Keep the last mark at least a window old, and those after it.
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


def cache_dir() -> Path:
    """Return the cache root (not created here; :func:`fetch` creates it)."""
    explicit = environment.read(ENV_CACHE)
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "keras_vit"
    return Path.home() / ".cache" / "keras_vit"


def is_offline() -> bool:
    """Whether ``KERAS_VIT_OFFLINE`` forbids network access (``1``, ``true``,
    ``yes``, ``on``; ``0``, ``false``, ``no``, ``off`` or unset allow it;
    anything else is refused rather than guessed)."""
    return environment.read(ENV_OFFLINE)


def _scheme(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme.lower()


def _check_url(url: str) -> None:
    """Raise ``ValueError`` unless ``url`` is an http(s) or gs URL."""
    if not isinstance(url, str) or _scheme(url) not in _SCHEMES:
        raise ValueError(
            f"url must be an http://, https:// or gs:// URL, got url={url!r} "
            "(local files are not downloaded; pass their path to the caller instead)"
        )


def _official_url(url: str) -> str:
    """Turn ``gs://bucket/path`` into its public HTTPS URL; leave others alone."""
    if _scheme(url) == "gs":
        return OFFICIAL_BASE + url.split("://", 1)[1].lstrip("/")
    return url


def resolve_url(url: str) -> str:
    """Return the URL to actually download from.

    ``gs://`` URLs become public HTTPS URLs; if ``KERAS_VIT_MIRROR`` is set, the
    official prefix is replaced by the mirror base.  Other URLs are unchanged.
    """
    url = _official_url(url)
    mirror = environment.read(ENV_MIRROR)
    if mirror and url.startswith(OFFICIAL_BASE):
        return mirror.rstrip("/") + "/" + url[len(OFFICIAL_BASE):]
    return url


def _cache_root(override: Optional[PathLike]) -> Path:
    # Separate helper because fetch's/cache_path_for's ``cache_dir`` argument
    # shadows the module-level function of the same name.
    return Path(override).expanduser() if override is not None else cache_dir()


def _sanitise(component: str) -> str:
    """Make one path component safe as a file name on any common OS."""
    safe = _UNSAFE_CHARS.sub("_", component)
    if not safe.strip("."):  # "." and ".." must not navigate the tree
        safe = safe.replace(".", "_")
    return safe


def cache_path_for(url: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Return where the file for the (official, unresolved) ``url`` is cached.

    The layout is ``<cache>/<host>/<url path>`` with every component sanitised,
    so files with the same name in different directories never collide.
    """
    _check_url(url)
    parts = urllib.parse.urlsplit(_official_url(url))
    root = _cache_root(cache_dir)
    host = (parts.hostname or "unknown-host").lower()
    if parts.port is not None:
        host = f"{host}_{parts.port}"
    components = [
        _sanitise(c) for c in urllib.parse.unquote(parts.path).split("/") if c not in ("", ".")
    ]
    if not components:
        components = ["index"]
    if parts.query:
        # Distinct queries must map to distinct files, but keep names short.
        digest = hashlib.sha256(parts.query.encode("utf-8")).hexdigest()[:12]
        components[-1] = f"{components[-1]}_{digest}"
    return root.joinpath(_sanitise(host), *components)


# ---------------------------------------------------------------------------
# Hashing and the verified-hash sidecar
# ---------------------------------------------------------------------------


def sha256_file(path: PathLike) -> str:
    """Return the hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_sidecar(path: Path, digest: str) -> None:
    """Record ``digest`` together with the size/mtime it was computed for.

    Best effort: a read-only cache only costs a re-hash on the next load.
    """
    try:
        st = path.stat()
        record = {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        from keras_vit.base import atomic  # light to load only when used

        atomic.write_json(_sidecar(path), record, indent=None, suffix="")
    except OSError:
        pass


def _sidecar_confirms(path: Path, expected: str) -> bool:
    """True if the sidecar vouches that ``path`` (unchanged since) hashes to ``expected``."""
    try:
        record = json.loads(_sidecar(path).read_text())
        st = path.stat()
        return (
            record.get("sha256") == expected
            and record.get("size") == st.st_size
            and record.get("mtime_ns") == st.st_mtime_ns
        )
    except (OSError, ValueError, AttributeError):
        return False


def _verify_cached(path: Path, expected: Optional[str], url: str) -> None:
    """Check a cached file against ``expected`` (cheaply, via the sidecar, if possible)."""
    if expected is None or _sidecar_confirms(path, expected):
        return
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"cached file {path} has sha256 {actual}, expected {expected} (for {url}). "
            "Delete it to download it again, or replace it with the correct file."
        )
    _write_sidecar(path, actual)  # e.g. a file placed by hand: skip hashing next time


def _normalise_sha256(sha256: Optional[str]) -> Optional[str]:
    if sha256 is None:
        return None
    value = str(sha256).strip().lower()
    if not _HEX64.match(value):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got sha256={sha256!r}")
    return value


# ---------------------------------------------------------------------------
# File-system helpers
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path, wait: float = float("inf")) -> Iterator[None]:
    """Hold the exclusive lock ``lock_path`` (:class:`keras_vit.base.atomic.FileLock`,
    the run folders' lock too), waiting at most ``wait`` seconds; a waiter
    that gives up names the holder."""
    from keras_vit.base import atomic  # light to load only when used

    try:
        lock = atomic.FileLock(lock_path).acquire(wait)
    except atomic.LockHeldError as e:
        raise DownloadError(
            f"gave up after waiting {wait:.0f} s for the lock {lock_path}, "
            f"held by {e.holder}; if that process is gone, delete the lock file "
            "and try again"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _remove_stale_partials(directory: Path, max_age: float = _STALE_PARTIAL_SECONDS) -> None:
    """Delete our temporary files older than ``max_age`` seconds (left by killed processes).

    Live downloads write continuously, so their mtime is always recent.
    """
    cutoff = time.time() - max_age
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not _PARTIAL_RE.search(entry.name):
            continue
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)


# ---------------------------------------------------------------------------
# Download
# ---------------------------------------------------------------------------


def _describe(resolved: str, url: str) -> str:
    """Name the URL actually used, and the official one if a mirror was involved."""
    official = _official_url(url)
    return resolved if resolved == official else f"{resolved} (mirror of {official})"


def unavailable(reason: str, files, *, mirror: Optional[str] = None,
                error: Optional[type] = None) -> "DownloadError":
    """The one error of a download that failed or may not run: one line
    saying ``reason``, what to fetch elsewhere (the URLs of ``files``,
    ``(url, path)`` pairs; a URL ``reason`` already names is "it") and
    the exact cache paths to place it at, and the variable to set:
    ``KERAS_VIT_OFFLINE=1`` (or, when it is set, unsetting it),
    ``KERAS_VIT_CACHE`` (which moves the cache) and ``mirror`` (another
    server's variable, or None). ``error``: the class,
    :class:`OfflineError` when downloads are off, else
    :class:`DownloadError`. Every route that downloads (the bucket's
    files, the Hub's) ends here, so they all say it one way, short enough
    for the command line's one line of an error (600 characters)."""
    offline = is_offline()
    error = error or (OfflineError if offline else DownloadError)
    files = [(url, os.fspath(path)) for url, path in files]
    urls = {url.rsplit("/", 1)[0] for url, _ in files}
    folders = {os.path.dirname(path) for _, path in files}
    if len(files) == 1:
        url, path = files[0]
        what = (f"{'it' if url in reason else url} elsewhere and place it at "
                f"{path}")
    elif len(urls) == 1 and len(folders) == 1:  # one repository's files
        names = " and ".join(url.rsplit("/", 1)[1] for url, _ in files)
        what = (f"{names} from {urls.pop()}/ elsewhere and place them in "
                f"{folders.pop()}{os.sep}")
    else:
        what = " and ".join(f"{url} elsewhere and place it at {path}"
                            for url, path in files)
    if offline:
        then = f"or unset {ENV_OFFLINE} to download it"
    else:
        then = f"then set {ENV_OFFLINE}=1"
    text = (f"{reason}; download {what}, {then} ({ENV_CACHE} moves the "
            "cache" + (f"; {mirror}" if mirror else "") + ")")
    return error(" ".join(text.split()))


def _mirror_hint(url: str) -> Optional[str]:
    """:func:`unavailable`'s word on mirrors, for an official file."""
    if not _official_url(url).startswith(OFFICIAL_BASE):
        return None
    return f"{ENV_MIRROR} names a mirror"


class _DeadlineExceeded(socket.timeout):
    """The overall deadline of a download passed while waiting for bytes."""


class _DeadlineSocket:
    """A connected socket whose every wait is bounded by the stall
    ``timeout`` and by what is left of the download's ``give_up`` time, so
    a server trickling its status line, headers or body cannot hold a
    download past its deadline (a plain socket timeout restarts with each
    byte)."""

    def __init__(self, sock, give_up: float, timeout: float):
        self._sock = sock
        self._give_up = give_up
        self._timeout = timeout
        self._files = 0
        self._closed = False

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
        # http.client reads the response through this file: its reads
        # must come back to recv_into above. As with a real socket, the
        # connection closing its socket leaves the file open (urllib does
        # that as soon as the headers are in).
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
    :class:`_DeadlineSocket` (connect included: its timeout is cut to what
    is left)."""

    class Connection(base):
        def __init__(self, *args, give_up: float, stall: float, **kwargs):
            super().__init__(*args, **kwargs)
            self._give_up = give_up
            self._stall = stall

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


def _open(request, give_up: float, stall: float):
    """``urlopen`` with the whole exchange (connect, status line, headers,
    redirects, body) bounded by ``give_up`` (a ``time.monotonic`` value)."""
    opener = urllib.request.build_opener(_DeadlineHandler(give_up, stall))
    return opener.open(request, timeout=stall)


def _late(where: str, deadline: float, when: str) -> DownloadError:
    return DownloadError(
        f"download of {where} did not finish within {deadline:.0f} s ({when}); pass a "
        "larger deadline or use a faster mirror"
    )


def _download(
    resolved: str,
    url: str,
    final: Path,
    expected: Optional[str],
    progress: Optional[bool],
    timeout: float,
    deadline: float = DEFAULT_DEADLINE,
) -> None:
    """Stream ``resolved`` into ``final`` via a temporary file; verify; rename atomically."""
    where = _describe(resolved, url)
    give_up = time.monotonic() + deadline
    rate = Throughput(stall_seconds())
    # The package's one atomic writer, imported here so that loading this
    # module stays light. The temporary name ends in ".partial", so
    # _remove_stale_partials finds strays.
    from keras_vit.base import atomic

    with atomic.atomic_path(final, suffix="") as partial:
        with open(partial, "wb") as out:
            request = urllib.request.Request(resolved, headers={"User-Agent": _USER_AGENT})
            try:
                response = _open(request, give_up, timeout)
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
                        "not the file: a login or error page of a proxy or mirror?"
                    )
                digest = hashlib.sha256()
                received = 0
                disable = None if progress is None else not progress  # None: only on a TTY
                with tqdm(
                    total=total, unit="B", unit_scale=True, unit_divisor=1024,
                    desc=final.name, disable=disable,
                ) as bar:
                    while True:
                        got = f"after {received} of {total or 'unknown'} bytes"
                        if time.monotonic() > give_up:
                            raise _late(where, deadline, got)
                        try:
                            # read1: what has arrived (a trickling server cannot
                            # hold one read open past the deadline).
                            chunk = response.read1(_CHUNK)
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
                f"checksum mismatch for {where}: expected sha256 {expected}, got {actual}"
            )
    _write_sidecar(final, actual)


def _check_complete(path: str, name: str, where: str) -> None:
    """Refuses a body that cannot be the file: an ``.npz`` must be a whole
    zip archive whose every member's CRC-32 matches (a short body without
    Content-Length, or an HTML page served with 200, is not)."""
    if not name.endswith(".npz"):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DownloadError(
            f"{where} did not send a complete .npz archive ({e}); nothing was cached"
        ) from e
    if bad is not None:
        raise DownloadError(f"{where} sent a corrupt .npz archive (bad member {bad!r})")


def _content_length(response) -> Optional[int]:
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def fetch(
    url: str,
    *,
    sha256: Optional[str] = None,
    cache_dir: Optional[PathLike] = None,
    progress: Optional[bool] = None,
    timeout: float = 60.0,
    deadline: float = DEFAULT_DEADLINE,
) -> Path:
    """Return the local path of ``url``'s file, downloading it into the cache if needed.

    Args:
        url: Official ``https://storage.googleapis.com/...`` (or ``gs://``) URL;
            any other http(s) URL also works but is never mirrored.
        sha256: Expected hex digest; verified after download and on cache hits
            (cheaply, via a ``.sha256`` sidecar, when the file is unchanged).
        cache_dir: Cache root; defaults to :func:`cache_dir`.
        progress: Show a progress bar: ``True``/``False``, or ``None`` for
            "only when stderr is a terminal".
        timeout: Stall timeout: the longest wait for the next bytes, in seconds.
        deadline: The longest the whole download may take, in seconds,
            from the connection to the last byte (a server trickling its
            headers is bounded too); a
            process waiting for another's download of the same file waits
            at most ``deadline + timeout`` and then names the holder.

    Raises:
        ValueError: ``url`` is not an http(s)/gs URL, or ``sha256`` is malformed.
        OfflineError: the file is not cached and ``KERAS_VIT_OFFLINE`` is set.
        ChecksumError: the (downloaded or cached) file has the wrong SHA-256.
        DownloadError: any other download failure.
    """
    _check_url(url)
    expected = _normalise_sha256(sha256)
    final = cache_path_for(url, cache_dir)

    if final.is_file():
        _verify_cached(final, expected, url)
        return final

    resolved = resolve_url(url)
    files = [(resolved, final)]
    if is_offline():
        raise unavailable(
            f"{final.name} is not in the keras-vit cache and downloads are off "
            f"({ENV_OFFLINE}={environment.raw(ENV_OFFLINE)!r})"
            + (f"; its sha256 is {expected}" if expected else ""),
            files, mirror=_mirror_hint(url))

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        where = f"cache_dir={cache_dir!r}" if cache_dir is not None else (
            f"{ENV_CACHE}={environment.raw(ENV_CACHE)!r}" if environment.raw(ENV_CACHE)
            else "the default cache")
        raise DownloadError(
            f"cannot create the cache folder {final.parent} ({e.strerror}); check "
            f"{where}, or point {ENV_CACHE} at a writable folder"
        ) from e
    for name, value in (("timeout", timeout), ("deadline", deadline)):
        if not (isinstance(value, (int, float)) and value > 0):
            # Imported only here: this module stays light on the good path.
            from keras_vit.base.checks import check_number

            check_number(name, value, low=0, low_open=True)
    with _exclusive_lock(final.with_name(final.name + ".lock"), wait=deadline + timeout):
        # Another process may have completed the download while we waited.
        if final.is_file():
            _verify_cached(final, expected, url)
            return final
        _remove_stale_partials(final.parent)
        try:
            _download(resolved, url, final, expected, progress, timeout, deadline)
        except ChecksumError:
            raise  # the file came: placing it by hand would not help
        except DownloadError as e:
            # The network's word (refused, 404, stalled, late, cut short)
            # is in e's one line; the traceback under it adds nothing.
            raise unavailable(str(e), files, mirror=_mirror_hint(url)) from None
    return final
