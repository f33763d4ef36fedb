"""The download cache: which file each URL is cached as, whether a cached
file can be trusted, the lock a download holds and the stray files a killed
one leaves; and the errors every download route raises.

Files are cached at :func:`cache_path_for` of their *official* URL, so a
mirror reuses the files already downloaded. A file is trusted when its
SHA-256 matches, checked cheaply through a ``.sha256`` sidecar recording the
size and mtime it was computed for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import urllib.parse
from pathlib import Path
from typing import Iterator, Optional, Union

from keras_vit.base import environment
from keras_vit.base.errors import KerasVitError

__all__ = ["DownloadError", "ChecksumError", "OfflineError", "OFFICIAL_BASE",
           "cache_dir", "cache_path_for", "sha256_file"]

OFFICIAL_BASE = "https://storage.googleapis.com/"

ENV_CACHE = "KERAS_VIT_CACHE"

CHUNK = 1 << 20  # 1 MiB: how much a hash or a download reads at a time
_STALE_PARTIAL_SECONDS = 24 * 3600
_SCHEMES = ("http", "https", "gs")
# Name pattern of our temporary files: "<file>.<pid>.<random>.partial".
_PARTIAL_RE = re.compile(r"\.\d+\.[A-Za-z0-9_]+\.partial$")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._+=@,-]")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

PathLike = Union[str, "os.PathLike[str]"]


class DownloadError(KerasVitError, OSError):
    """A file could not be downloaded."""


class ChecksumError(DownloadError):
    """A file's SHA-256 does not match the expected value."""


class OfflineError(DownloadError):
    """A file is missing from the cache and downloads are disabled."""


def cache_dir() -> Path:
    """Return the cache root (not created here;
    :func:`keras_vit.zoo.download.fetch.fetch` creates it)."""
    explicit = environment.read(ENV_CACHE)
    if explicit is not None:
        return explicit
    xdg = environment.xdg_cache_home()
    if xdg:
        return Path(xdg).expanduser() / "keras_vit"
    return Path.home() / ".cache" / "keras_vit"


def _scheme(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme.lower()


def check_url(url: str) -> None:
    """Raise ``ValueError`` unless ``url`` is an http(s) or gs URL."""
    if not isinstance(url, str) or _scheme(url) not in _SCHEMES:
        raise ValueError(
            f"url must be an http://, https:// or gs:// URL, got url={url!r} "
            "(local files are not downloaded; pass their path to the caller instead)")


def official_url(url: str) -> str:
    """Turn ``gs://bucket/path`` into its public HTTPS URL; leave others alone."""
    if _scheme(url) == "gs":
        return OFFICIAL_BASE + url.split("://", 1)[1].lstrip("/")
    return url


def _cache_root(override: Optional[PathLike]) -> Path:
    # cache_path_for's ``cache_dir`` argument shadows the function.
    return Path(override).expanduser() if override is not None else cache_dir()


def _sanitise(component: str) -> str:
    """Make one path component safe as a file name on any common OS."""
    safe = _UNSAFE_CHARS.sub("_", component)
    if not safe.strip("."):  # "." and ".." must not navigate the tree
        safe = safe.replace(".", "_")
    return safe


def cache_path_for(url: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Return where the file for the (official, unresolved) ``url`` is cached:
    ``<cache>/<host>/<url path>``, every component sanitised."""
    check_url(url)
    parts = urllib.parse.urlsplit(official_url(url))
    root = _cache_root(cache_dir)
    host = (parts.hostname or "unknown-host").lower()
    if parts.port is not None:
        host = f"{host}_{parts.port}"
    components = [_sanitise(c) for c in urllib.parse.unquote(parts.path).split("/")
                  if c not in ("", ".")] or ["index"]
    if parts.query:
        # Distinct queries must map to distinct files, but keep names short.
        digest = hashlib.sha256(parts.query.encode("utf-8")).hexdigest()[:12]
        components[-1] = f"{components[-1]}_{digest}"
    return root.joinpath(_sanitise(host), *components)


def sha256_file(path: PathLike) -> str:
    """Return the hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_sidecar(path: Path, digest: str) -> None:
    """Record ``digest`` together with the size/mtime it was computed for
    (best effort: a read-only cache only costs a re-hash)."""
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
        return (record.get("sha256") == expected and record.get("size") == st.st_size
                and record.get("mtime_ns") == st.st_mtime_ns)
    except (OSError, ValueError, AttributeError):
        return False


def verify_cached(path: Path, expected: Optional[str], url: str) -> None:
    """Check a cached file against ``expected`` (cheaply, via the sidecar, if possible)."""
    if expected is None or _sidecar_confirms(path, expected):
        return
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"cached file {path} has sha256 {actual}, expected {expected} (for {url}). "
            "Delete it to download it again, or replace it with the correct file.")
    write_sidecar(path, actual)  # e.g. a file placed by hand: skip hashing next time


def normalise_sha256(sha256: Optional[str]) -> Optional[str]:
    if sha256 is None:
        return None
    value = str(sha256).strip().lower()
    if not _HEX64.match(value):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got sha256={sha256!r}")
    return value


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, wait: float = float("inf")) -> Iterator[None]:
    """Hold the exclusive lock ``lock_path`` (:class:`keras_vit.base.atomic.FileLock`),
    waiting at most ``wait`` seconds; a waiter that gives up names the holder."""
    from keras_vit.base import atomic  # light to load only when used

    try:
        lock = atomic.FileLock(lock_path).acquire(wait)
    except atomic.LockHeldError as e:
        raise DownloadError(
            f"gave up after waiting {wait:.0f} s for the lock {lock_path}, "
            f"held by {e.holder}; if that process is gone, delete the lock file "
            "and try again") from None
    try:
        yield
    finally:
        lock.release()


def remove_stale_partials(directory: Path, max_age: float = _STALE_PARTIAL_SECONDS) -> None:
    """Delete our temporary files older than ``max_age`` seconds (left by killed processes;
    live downloads write continuously)."""
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
