"""Reading Keras' ``.h5`` weight files without Keras: every dataset
checked (name, shape, dtype, storage contiguous and inside the file) before
its data is read.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base.archives import special_file
from keras_vit.base.checks import require, shown
from keras_vit.base.limits import MAX_H5_ENTRIES
from keras_vit.zoo import checkpoints, hub_files


def open_h5(path):
    """``h5py.File(path, "r")`` of a regular file that exists and is HDF5,
    else a CheckpointError (or FileNotFoundError) naming ``path``."""
    h5py = require("h5py", purpose="reading a keras-hub preset")
    kind = special_file(path)
    if kind is not None:
        raise checkpoints.CheckpointError(f"{path}: is {kind}, not a regular file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} does not exist; a keras-hub preset "
                                "holds its weights there")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise checkpoints.CheckpointError(
            f"{path}: is not an HDF5 file ({' '.join(str(e).split())[:200]})"
        ) from None


def read_h5(path, wanted, expected,
            what="the keras-hub ViT its config describes", optional=()):
    """The datasets of the ``.h5`` file ``path`` named by ``wanted``
    (variable path -> dataset path), checked before any is read: names
    and shapes against ``expected`` (variable path -> shape; an error
    says the file does not hold ``what``), dtypes and storage. Variables
    in ``optional`` may be missing."""
    f = open_h5(path)
    shapes = {name: expected[name] for name in wanted if name in expected}
    with f:
        found = h5_datasets(f, f"{path}:")
        by_dataset = {v: k for k, v in wanted.items() if k in shapes}
        named = {by_dataset.get(k, k): tuple(ds.shape)
                 for k, ds in found.items()}
        hub_files.check_names(named, shapes, f"{path}: does not hold {what}",
                              optional)
        read = {name: key for name, key in wanted.items()
                if name in shapes and key in found}
        check_datasets(path, [(key, found[key]) for key in read.values()])
        return {name: float_array(found[key]) for name, key in read.items()}


def h5_datasets(f, where):
    """``{name: h5py.Dataset}`` of the open HDF5 file ``f`` (a Keras
    weights file), but its optimizer's; links are not followed. More than
    :data:`MAX_H5_ENTRIES` entries is a CheckpointError starting with
    ``where``."""
    import h5py

    found, count = {}, [0]

    def visit(name, obj):
        count[0] += 1
        if count[0] > MAX_H5_ENTRIES:
            raise checkpoints.CheckpointError(
                f"{where} has more than {MAX_H5_ENTRIES} entries; a ViT's "
                "weights have a few thousand")
        if isinstance(obj, h5py.Dataset) and not name.startswith(
                "optimizer/"):
            found[name] = obj

    f.visititems(visit)
    return found


def check_datasets(path, datasets, stored="stored ", ids=()):
    """One CheckpointError naming the file ``path`` and every dataset of
    ``datasets`` (``(name, h5py.Dataset)`` pairs) keras_vit does not read:
    not a float array (integer position ids, each a row of its table, for
    the names in ``ids``), or stored (after ``stored`` in the error)
    otherwise than contiguous inside the file."""
    size = os.path.getsize(path)
    problems = []
    for name, ds in datasets:
        is_ids = name in ids
        if not (ds.dtype.kind in "iu" if is_ids else is_float_dataset(ds)):
            problems.append(f"{name}: dtype {shown(str(ds.dtype), 40)}")
            continue
        where = h5_storage_problem(ds, size)
        if where:
            problems.append(f"{name}: {stored}{where}")
        elif is_ids and not ((ds[()] >= 0) & (ds[()] < ds.size)).all():
            problems.append(f"{name}: position ids outside [0, {ds.size}) "
                            f"(rows of a table of {ds.size})")
    if problems:
        raise checkpoints.CheckpointError(
            f"{path}: has datasets keras_vit does not read: "
            f"{'; '.join(problems[:12])} (Keras writes float arrays, "
            "contiguous, inside the file)")


def h5_storage_problem(ds, file_size):
    """How ``ds`` is stored when it is not as Keras writes it (contiguous,
    inside the file), else None."""
    if ds.is_virtual:
        return "as a virtual dataset (it reads other files)"
    if ds.external:
        return "in another file"
    if ds.chunks is not None:
        return "in chunks (Keras writes contiguous arrays)"
    offset = ds.id.get_offset()
    nbytes = ds.size * ds.dtype.itemsize
    if nbytes and (offset is None or offset + nbytes > file_size):
        return (f"past the end of the file ({nbytes} bytes at offset "
                f"{offset}, file of {file_size})")
    return None


def is_float_dataset(ds):
    """Whether Keras wrote ``ds`` as a float array: float16/32/64, or
    bfloat16 as 2-byte opaque values marked ``dtype=bfloat16``."""
    kind, size = ds.dtype.kind, ds.dtype.itemsize
    return (kind == "f" and size in (2, 4, 8)) or (
        kind == "V" and size == 2 and ds.dtype.names is None
        and ds.attrs.get("dtype") == "bfloat16")


def float_array(ds):
    """A float dataset's values as float32 (a bfloat16 value is the high
    half of a float32)."""
    if ds.dtype.kind == "V":
        bits = np.frombuffer(ds[()].tobytes(), dtype="<u2")
        return (bits.astype("<u4") << 16).view("<f4").reshape(ds.shape)
    return np.asarray(ds[()], dtype="float32")
