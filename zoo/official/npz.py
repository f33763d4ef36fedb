"""Reads ``.npz`` checkpoints one array at a time.

:func:`open_npz` returns ``{key: LazyArray}``: each knows its shape and
dtype from the ``.npy`` header inside the archive and reads its data only
when converted (``np.asarray``, ``astype``), so a load's memory peak stays near the size of
the model.

>>> import os, tempfile, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "c.npz")
>>> np.savez(path, a=np.arange(6.0).reshape(2, 3))
>>> arrays = open_npz(path)
>>> arrays["a"].shape, arrays["a"][1].shape, np.asarray(arrays["a"][1])
((2, 3), (3,), array([3., 4., 5.]))
"""

from __future__ import annotations

import math
import struct
import threading
import zipfile
import zlib

import numpy as np

from keras_vit.base import archives

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header


class _Member:
    """One ``.npy`` member of the archive, with a one-slot cache so that the
    slices of a stacked array are read once. Stored members are read
    straight from the file and checked against the CRC-32; compressed ones
    go through ``zipfile``."""

    def __init__(self, path, header, fileobj):
        info = header.info
        self.path, self.info, self.name = path, info, info.filename
        self._cached, self._lock = None, threading.Lock()
        self.header_len = header.header_len
        self.shape, self.dtype = header.shape, header.dtype
        self.fortran = header.fortran
        _check_header(self.name, self.shape, self.dtype)
        # Where a stored member's bytes start (None: read through zipfile).
        self.member_offset = None
        if info.compress_type == zipfile.ZIP_STORED:
            fileobj.seek(info.header_offset)
            raw = fileobj.read(_LOCAL_HEADER.size)
            if len(raw) < _LOCAL_HEADER.size:
                raise EOFError(f"{self.name!r} starts past the end of the "
                               "file (truncated archive?)")
            fields = _LOCAL_HEADER.unpack(raw)
            if fields[0] == b"PK\x03\x04":
                self.member_offset = (info.header_offset + _LOCAL_HEADER.size
                                      + fields[-2] + fields[-1])
                end = self.member_offset + info.file_size
                if end > fileobj.seek(0, 2):
                    raise ValueError(
                        f"{self.name!r} ends past the end of the file "
                        "(truncated archive?)")

    def _read_stored(self):
        count = math.prod(self.shape)
        with open(self.path, "rb") as f:
            f.seek(self.member_offset)
            header = f.read(self.header_len)
            data = np.fromfile(f, dtype=self.dtype, count=count)
        if data.size != count:
            raise EOFError(f"{self.name!r} ends early: {data.size} of "
                           f"{count} values")
        crc = zlib.crc32(memoryview(data).cast("B"), zlib.crc32(header))
        if crc != self.info.CRC:
            raise zipfile.BadZipFile(f"bad CRC-32 for file {self.name!r}")
        return data.reshape(self.shape, order="F" if self.fortran else "C")

    def verify(self):
        """Reads the member through in 1 MiB chunks and checks its CRC-32
        and length, holding no more than one chunk."""
        crc, size, chunk = 0, 0, 1 << 20
        if self.member_offset is not None:
            with open(self.path, "rb") as f:
                f.seek(self.member_offset)
                while size < self.info.file_size:
                    block = f.read(min(chunk, self.info.file_size - size))
                    if not block:
                        break
                    crc, size = zlib.crc32(block, crc), size + len(block)
            if size != self.info.file_size:
                raise EOFError(f"{self.name!r} ends early: {size} of "
                               f"{self.info.file_size} bytes")
            if crc != self.info.CRC:
                raise zipfile.BadZipFile(f"bad CRC-32 for file {self.name!r}")
            return
        # zipfile checks the length and CRC-32 when it reaches the end.
        with zipfile.ZipFile(self.path) as archive, \
                archive.open(self.name) as f:
            while f.read(chunk):
                pass

    def read(self):
        with self._lock:
            if self._cached is None:
                if self.member_offset is not None:
                    self._cached = self._read_stored()
                else:
                    with zipfile.ZipFile(self.path) as archive, \
                            archive.open(self.name) as f:
                        self._cached = np.lib.format.read_array(
                            f, allow_pickle=False)
            return self._cached

    def release(self):
        with self._lock:
            self._cached = None


class LazyArray:
    """An array of a ``.npz`` archive that is read when converted.

    ``reshape`` and integer indexing of the first axis are lazy;
    ``np.asarray(x)`` and ``x.astype(dtype)`` read it.
    """

    __slots__ = ("shape", "dtype", "_member", "_index", "_reshape")

    def __init__(self, member, shape, dtype, index=None, reshape=None):
        self._member, self._index, self._reshape = member, index, reshape
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def source(self):
        """The archive member the data comes from."""
        return self._member.name

    def __repr__(self):
        return f"LazyArray({self.source!r}, shape={self.shape}, " \
               f"dtype={self.dtype})"

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, i):
        if (self._index is not None or self._reshape is not None
                or not isinstance(i, (int, np.integer)) or not self.shape):
            return np.asarray(self)[i]
        if not -self.shape[0] <= i < self.shape[0]:
            raise IndexError(f"index {i} is out of bounds for axis 0 with "
                             f"size {self.shape[0]}")
        return LazyArray(self._member, self.shape[1:], self.dtype,
                         index=int(i) % self.shape[0])

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        size = math.prod(self.shape)
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(size // max(known, 1) if d == -1 else int(d)
                      for d in shape)
        if math.prod(shape) != size:
            raise ValueError(f"cannot reshape an array of size {size} into "
                             f"shape {shape}")
        return LazyArray(self._member, shape, self.dtype, index=self._index,
                         reshape=shape)

    def read(self):
        """The data as a NumPy array."""
        data = self._member.read()
        if self._index is not None:
            data = data[self._index]
        if self._reshape is not None:
            data = data.reshape(self._reshape)
        return data

    def __array__(self, dtype=None, copy=None):
        data = self.read()
        if dtype is not None and np.dtype(dtype) != data.dtype:
            return data.astype(dtype)
        return data.copy() if copy else data

    def astype(self, dtype):
        return np.asarray(self, dtype=dtype)

    def release(self):
        """Drops the cached data of the archive member."""
        self._member.release()


# Number kinds a checkpoint may hold: bool, signed, unsigned, float.
NUMBER_KINDS = "biuf"


def _check_header(name, shape, dtype):
    """Refuses a member whose header does not describe plain numbers."""
    if dtype.kind not in NUMBER_KINDS or dtype.fields is not None:
        raise ValueError(f"{name!r} has dtype {dtype.str!r}, not a number "
                         "type (bool, int, uint or float)")


def verify(arrays):
    """Checks every archive member behind ``arrays`` (CRC-32 and length)
    without keeping their data; raises ``zipfile.BadZipFile`` or
    ``EOFError`` naming the first bad member.

    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "c.npz")
    >>> np.savez(path, a=np.arange(6.0))
    >>> verify(open_npz(path))
    1
    """
    members = {}
    for value in arrays.values():
        if isinstance(value, LazyArray):
            members.setdefault(id(value._member), value._member)
    for member in members.values():
        member.verify()
    return len(members)


def open_npz(path):
    """``{key: LazyArray}`` for every array of the ``.npz`` at ``path``
    (headers only are read here; never unpickles). Raises ``ValueError``,
    ``zipfile.BadZipFile`` or ``OSError`` for a file that is not a valid
    archive."""
    out = {}
    headers = archives.npz_headers(path)
    with open(path, "rb") as fileobj:
        for name, header in headers.items():
            if header is None:
                raise ValueError(f"unexpected member {name!r} in the archive")
            member = _Member(path, header, fileobj)
            out[name[:-len(".npy")]] = LazyArray(member, member.shape,
                                                 member.dtype)
    return out
