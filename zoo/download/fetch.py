"""Download and cache pretrained checkpoints: :func:`fetch`, the front of
the downloads. Environment variables:

``KERAS_VIT_CACHE``
    Cache directory (default ``$XDG_CACHE_HOME/keras_vit`` or ``~/.cache/keras_vit``).
``KERAS_VIT_OFFLINE``
    ``1``/``true``/``yes``/``on``: never download (missing files raise
    :class:`~keras_vit.zoo.download.cache.OfflineError`).
``KERAS_VIT_MIRROR``
    Base URL that replaces ``https://storage.googleapis.com/`` when downloading.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from keras_vit.base import environment
from keras_vit.zoo.download.cache import (
    ENV_CACHE, OFFICIAL_BASE, ChecksumError, DownloadError, OfflineError,
    PathLike, cache_path_for, check_url, exclusive_lock, normalise_sha256,
    official_url, remove_stale_partials, verify_cached)
from keras_vit.zoo.download.http import DEFAULT_DEADLINE, download_file

__all__ = ["is_offline", "resolve_url", "fetch", "unavailable",
           "unreachable"]

ENV_OFFLINE = "KERAS_VIT_OFFLINE"
ENV_MIRROR = "KERAS_VIT_MIRROR"


def is_offline() -> bool:
    """Whether ``KERAS_VIT_OFFLINE`` forbids network access."""
    return environment.read(ENV_OFFLINE)


def unreachable(url: str, timeout: float) -> Optional[str]:
    """Why a connection to ``url``'s server (or the proxy the environment
    names for it) cannot be opened within ``timeout`` seconds (capped at
    :data:`~keras_vit.base.limits.MAX_CONNECT_WAIT_SECONDS`), or None when
    it opens. Routes that download through another library ask this first,
    instead of that library's retries.

    >>> unreachable("http://127.0.0.1:9/x", 1.0)   # nothing listens on 9
    'cannot reach 127.0.0.1:9 (Connection refused)'
    """
    import socket
    import urllib.parse

    from keras_vit.base.limits import MAX_CONNECT_WAIT_SECONDS

    wait = min(float(timeout), MAX_CONNECT_WAIT_SECONDS)
    parts = urllib.parse.urlsplit(url)
    proxy = environment.proxy_for(url)
    host, port = proxy or (
        parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    where = f"{'the proxy ' if proxy else ''}{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=wait).close()
    except socket.timeout:
        return f"cannot reach {where} (no answer in {wait:g} s)"
    except OSError as e:
        return f"cannot reach {where} ({e.strerror or e})"
    return None


def resolve_url(url: str) -> str:
    """Return the URL to actually download from (``gs://`` as HTTPS, the
    official prefix replaced by ``KERAS_VIT_MIRROR`` if set)."""
    url = official_url(url)
    mirror = environment.read(ENV_MIRROR)
    if mirror and url.startswith(OFFICIAL_BASE):
        return mirror.rstrip("/") + "/" + url[len(OFFICIAL_BASE):]
    return url


def unavailable(reason: str, files, *, mirror: Optional[str] = None,
                error: Optional[type] = None) -> "DownloadError":
    """The one error of a download that failed or may not run: one line
    saying ``reason``, what to fetch elsewhere (``files``: ``(url, path)``
    pairs) and where to place it, and the variables to set (``mirror``:
    another server's, or None). ``error``: the class (default
    :class:`OfflineError` when downloads are off, else
    :class:`DownloadError`)."""
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
    then = (f"or unset {ENV_OFFLINE} to download it" if offline
            else f"then set {ENV_OFFLINE}=1")
    text = (f"{reason}; download {what}, {then} ({ENV_CACHE} moves the "
            "cache" + (f"; {mirror}" if mirror else "") + ")")
    return error(" ".join(text.split()))


def _mirror_hint(url: str) -> Optional[str]:
    """:func:`unavailable`'s word on mirrors, for an official file."""
    if not official_url(url).startswith(OFFICIAL_BASE):
        return None
    return f"{ENV_MIRROR} names a mirror"


def fetch(url: str, *, sha256: Optional[str] = None, cache_dir: Optional[PathLike] = None,
          progress: Optional[bool] = None, timeout: float = 60.0,
          deadline: float = DEFAULT_DEADLINE) -> Path:
    """Return the local path of ``url``'s file, downloading it into the cache if needed.

    Args:
        url: Official ``https://storage.googleapis.com/...`` (or ``gs://``) URL;
            any other http(s) URL also works but is never mirrored.
        sha256: Expected hex digest; verified after download and on cache hits.
        cache_dir: Cache root; defaults to
            :func:`~keras_vit.zoo.download.cache.cache_dir`.
        progress: Show a progress bar (``None``: when stderr is a terminal).
        timeout: Stall timeout: the longest wait for the next bytes, in seconds.
        deadline: The longest the whole download may take, in seconds; a
            process waiting for another's download of the same file waits
            at most ``deadline + timeout``.

    Raises:
        ValueError: ``url`` is not an http(s)/gs URL, or ``sha256`` is malformed.
        OfflineError: the file is not cached and ``KERAS_VIT_OFFLINE`` is set.
        ChecksumError: the (downloaded or cached) file has the wrong SHA-256.
        DownloadError: any other download failure.
    """
    check_url(url)
    expected = normalise_sha256(sha256)
    final = cache_path_for(url, cache_dir)

    if final.is_file():
        verify_cached(final, expected, url)
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
            f"{where}, or point {ENV_CACHE} at a writable folder") from e
    for name, value in (("timeout", timeout), ("deadline", deadline)):
        if not (isinstance(value, (int, float)) and value > 0):
            from keras_vit.base.checks import check_number

            check_number(name, value, low=0, low_open=True)
    with exclusive_lock(final.with_name(final.name + ".lock"), wait=deadline + timeout):
        # Another process may have completed the download while we waited.
        if final.is_file():
            verify_cached(final, expected, url)
            return final
        remove_stale_partials(final.parent)
        try:
            download_file(resolved, url, final, expected, progress, timeout,
                          deadline)
        except ChecksumError:
            raise  # the file came: placing it by hand would not help
        except DownloadError as e:
            # e's one line says it all; its traceback adds nothing.
            raise unavailable(str(e), files, mirror=_mirror_hint(url)) from None
    return final
