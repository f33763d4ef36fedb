"""File checks before a reader opens a path: a zip archive where one is
expected (:func:`check_archive`), and no FIFO, device or directory where a
regular file is (:func:`special_file`)."""

from __future__ import annotations

import os
import stat
import zipfile


def check_archive(name, path, kind, *, error=ValueError):
    """``path`` if it is a zip archive (a ``.keras`` model, an ``.npz``),
    else one error naming the argument: a folder, a missing file
    (``FileNotFoundError``) or a file of another format (``error``); a
    loader would say "File not found" or try to unpickle it.

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
    """What ``path`` is when it is not a regular file (``"a FIFO (named
    pipe)"``, ``"a directory"``, ...), or None for a regular file or a link
    to one, and for a path that does not exist. Readers check this before
    opening: opening a FIFO blocks until someone writes to it, a device
    never ends.

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
