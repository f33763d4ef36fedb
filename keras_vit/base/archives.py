"""File checks before a reader opens a path: a zip archive where one is
expected (:func:`check_archive`), no FIFO, device or directory where a
regular file is (:func:`special_file`), and every array header of an
``.npz`` bounded by the bytes the file holds for it before anything is
allocated (:func:`npz_headers`, :func:`read_npz`)."""

from __future__ import annotations

import math
import os
import stat
import zipfile
from typing import NamedTuple

from keras_vit.base.errors import ConfigError
from keras_vit.base.limits import DEFLATE_MAX_EXPANSION, MAX_ARRAY_BYTES


def check_archive(name, path, kind, *, error=ValueError):
    """``path`` if it is a zip archive (a ``.keras`` model, an ``.npz``),
    else one error naming the argument: ``FileNotFoundError`` for a missing
    file, ``error`` otherwise.

    >>> check_archive("MODEL", ".", "a .keras model")
    Traceback (most recent call last):
    ValueError: MODEL='.' is a directory, not a .keras model
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise error(f"{name}={path!r} is a directory, not {kind}")
    special = special_file(path)  # opening a FIFO would block
    if special is not None:
        raise error(f"{name}={path!r} is {special}, not {kind}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name}={path!r} does not exist (expected "
                                f"{kind})")
    if not zipfile.is_zipfile(path):
        raise error(f"{name}={path!r} is not {kind} (not a zip archive: "
                    "truncated, or another format?)")
    return path


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def special_file(path):
    """What ``path`` is when it is not a regular file (``"a directory"``,
    ...), or None for a regular file, a link to one or a path that does
    not exist (opening a FIFO blocks, a device never ends).

    >>> special_file("/dev/null")
    'a character device'
    >>> special_file(__file__) is None
    True
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


class NpyHeader(NamedTuple):
    """An ``.npy`` member's header, checked; ``header_len``: the bytes
    before the data, ``info``: the zip directory entry."""

    shape: tuple
    dtype: object
    fortran: bool
    header_len: int
    info: zipfile.ZipInfo


def _short(error):
    return " ".join(str(error).split())[:200]


def read_npy_header(f, path, field):
    """``(shape, fortran, dtype)`` of the ``.npy`` header (format 1.0 or
    2.0) at the start of the stream ``f``, or a
    :class:`~keras_vit.base.errors.ConfigError` naming ``path`` and
    ``field``."""
    import numpy as np

    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    try:
        version = np.lib.format.read_magic(f)
        if version not in readers:
            raise ValueError(f".npy format version {version}")
        shape, fortran, dtype = readers[version](f)
    except (ValueError, EOFError, OSError, SyntaxError, TypeError,
            zipfile.BadZipFile) as e:
        raise ConfigError(path, field, f"has no readable .npy header "
                          f"({type(e).__name__}: {_short(e)})") from None
    return tuple(shape), fortran, np.dtype(dtype)


def check_npy_size(path, field, shape, dtype, data_bytes):
    """Refuses, before anything is allocated, an array header whose
    ``shape`` and ``dtype`` do not fill exactly the ``data_bytes`` the file
    holds for it, declare more than
    :data:`~keras_vit.base.limits.MAX_ARRAY_BYTES`, or hold Python objects.

    >>> import numpy as np
    >>> try:
    ...     check_npy_size("c.npz", "a.npy", (2**40,), np.dtype("<f4"), 16)
    ... except ConfigError as e:
    ...     print(str(e).split(" but ")[1])
    the file holds 16 bytes for it
    """
    if dtype.hasobject:
        raise ConfigError(path, field, f"holds Python objects (dtype "
                          f"{dtype.str!r}); arrays are never unpickled")
    if any(d < 0 for d in shape):
        raise ConfigError(path, field, f"declares a negative dimension "
                          f"{shape}")
    declared = math.prod(shape) * dtype.itemsize
    if declared != data_bytes:
        raise ConfigError(path, field, f"declares shape {shape} of "
                          f"{dtype.str} ({declared} bytes) but the file "
                          f"holds {data_bytes} bytes for it")
    if declared > MAX_ARRAY_BYTES:
        raise ConfigError(path, field, f"declares shape {shape} of "
                          f"{dtype.str} ({declared} bytes), more than the "
                          f"{MAX_ARRAY_BYTES} bytes an array may have")


def check_member_size(path, info, file_size):
    """Refuses a zip member whose directory entry promises more than the
    file of ``file_size`` bytes can give, or that is neither stored nor
    deflated."""
    where = info.filename
    if info.compress_size > file_size:
        raise ConfigError(path, where, f"holds {info.compress_size} "
                          f"compressed bytes in a file of {file_size}")
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise ConfigError(path, where, f"is stored uncompressed as "
                              f"{info.compress_size} bytes but declares "
                              f"{info.file_size}")
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        if info.file_size > DEFLATE_MAX_EXPANSION * info.compress_size + 64:
            raise ConfigError(path, where, f"declares {info.file_size} "
                              f"bytes from {info.compress_size} deflated "
                              "ones, more than deflate can expand (a zip "
                              "bomb, or a lying directory entry)")
    else:
        raise ConfigError(path, where, f"is compressed with zip method "
                          f"{info.compress_type}; NumPy writes stored or "
                          "deflated members")


def npz_headers(path):
    """``{member name: NpyHeader}`` of every member of the ``.npz`` at
    ``path`` (None for a member that is not an ``.npy``), each checked
    against the bytes the archive holds for it. A file that is no zip
    archive raises ``zipfile.BadZipFile`` or ``OSError``.

    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "c.npz")
    >>> np.savez(path, a=np.zeros((2, 3), "float32"))
    >>> h = npz_headers(path)["a.npy"]
    >>> h.shape, h.dtype.str
    ((2, 3), '<f4')
    """
    path = os.fspath(path)
    headers = {}
    with open(path, "rb") as fileobj:
        size = os.fstat(fileobj.fileno()).st_size
        with zipfile.ZipFile(fileobj) as archive:
            for info in archive.infolist():
                check_member_size(path, info, size)
                if not info.filename.endswith(".npy"):
                    headers[info.filename] = None
                    continue
                with archive.open(info) as f:
                    shape, fortran, dtype = read_npy_header(
                        f, path, info.filename)
                    header_len = f.tell()
                check_npy_size(path, info.filename, shape, dtype,
                               info.file_size - header_len)
                headers[info.filename] = NpyHeader(shape, dtype, fortran,
                                                   header_len, info)
    return headers


def read_npz(path):
    """``{key: array}`` of the ``.npz`` at ``path``, every header bounded
    by :func:`npz_headers` before NumPy allocates, never unpickled.

    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "c.npz")
    >>> np.savez(path, a=np.arange(3))
    >>> read_npz(path)["a"].tolist()
    [0, 1, 2]
    """
    import numpy as np

    npz_headers(path)
    with np.load(os.fspath(path), allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}
