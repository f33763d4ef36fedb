"""A source from a short description (what the command line takes):
``"digits"``, ``"tfds:NAME[:SPLIT]"``, a folder, an ``.npz``, a pair of
arrays; and the held-out split that matches a training description.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base.archives import check_archive, npz_headers
from keras_vit.base.checks import closest
from keras_vit.train.data.folders import FolderSource
from keras_vit.train.data.sources import (ArraySource, DataError,
                                          ImageSource, digits)
from keras_vit.train.data.tfds_source import TfdsSource


def load_data(spec, split=None, *, data_dir=None, download=False,
              verbose=True):
    """A source from a short description (what the command line takes).

    ``spec`` is one of: ``"digits"`` or ``"digits:test"``;
    ``"tfds:NAME"`` or ``"tfds:NAME:SPLIT"``; a folder with one sub-folder
    per class; an ``.npz`` with arrays ``x`` (or ``images``) and ``y`` (or
    ``labels``); a pair ``(images, labels)``; or an :class:`ImageSource`.
    ``split`` picks the split when ``spec`` does not name one.

    >>> load_data("digits:test").name
    'digits:test'
    """
    if isinstance(spec, ImageSource):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return ArraySource(*spec)
    if not isinstance(spec, (str, os.PathLike)):
        raise DataError(_spec_help(spec))
    text = os.fspath(spec)
    if text == "digits" or text.startswith("digits:"):
        return digits(text.partition(":")[2] or split or "train")
    if text.startswith("tfds:"):
        name, maybe_split = _tfds_parts(text[len("tfds:"):])
        return TfdsSource(name, maybe_split or split or "train",
                          data_dir=data_dir, download=download)
    if text.lower().endswith(".npz"):
        return _npz_source(text)
    if os.path.isdir(text) or os.sep in text or os.path.exists(text):
        try:
            return FolderSource(text, verbose=verbose)
        except FileNotFoundError as e:
            hint = "" if os.path.exists(text) else _folder_hint(text)
            if hint:
                raise FileNotFoundError(f"{e}{hint}") from None
            raise
    raise DataError(_spec_help(spec))


def _tfds_parts(rest):
    """(name, split) of ``NAME[:SPLIT]``: a version ("cifar10:3.0.2") also
    has a colon, so the last part is a split only when it is not one."""
    name, _, split = rest.rpartition(":")
    if not name or split[:1].isdigit():
        return rest, ""
    return name, split


def _folder_hint(text):
    """`` Did you mean the folder 'X'?`` for a folder beside ``text``
    whose name is close to it (a typo in a folder name), or ``""``."""
    parent, name = os.path.split(os.path.normpath(text))
    try:
        entries = sorted(os.listdir(parent or "."))[:10_000]
    except OSError:
        return ""
    folders = [e for e in entries if not e.startswith(".")
               and os.path.isdir(os.path.join(parent, e))]
    near = closest(name, folders)
    return (f" Did you mean the folder {os.path.join(parent, near[0])!r}?"
            if near else "")


def _spec_help(spec):
    hint = ""
    if isinstance(spec, str):
        builtin = closest(spec, ("digits", "digits:test", "digits:train"))
        # A folder that exists is what a mistyped name most likely meant.
        hint = _folder_hint(spec)
        if hint and builtin:
            hint = f"{hint[:-1]}, or {builtin[0]!r}?"
        elif builtin:
            hint = f" Did you mean {builtin[0]!r}?"
    return (f"Cannot read data={spec!r}: expected 'digits', 'digits:test', "
            "'tfds:NAME[:SPLIT]', a folder with one sub-folder of images per "
            f"class, or an .npz file with arrays x and y.{hint}")


def _npz_source(path):
    check_archive("data", path, "an .npz archive", error=DataError)
    try:
        npz_headers(path)  # every array header bounded before NumPy allocates
        with np.load(path) as f:  # allow_pickle=False: never unpickled
            keys = set(f.files)
            xk = next((k for k in ("x", "images", "image") if k in keys),
                      None)
            yk = next((k for k in ("y", "labels", "label") if k in keys),
                      None)
            if xk is None or yk is None:
                raise DataError(
                    f"data={path!r} must hold arrays 'x' (or 'images') and "
                    f"'y' (or 'labels'); it holds {sorted(keys)}")
            images, labels = f[xk], f[yk]
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile, pickle, format errors
        raise DataError(f"data={path!r} is not a readable .npz of arrays "
                        f"({type(e).__name__}: {e})") from None
    return ArraySource(images, labels, name=path)


def default_eval_spec(spec):
    """The held-out split matching a training ``spec``, or None:
    ``digits`` -> ``digits:test``; ``tfds:NAME`` -> its ``test`` split."""
    if not isinstance(spec, str):
        return None
    if spec in ("digits", "digits:train"):
        return "digits:test"
    if spec.startswith("tfds:"):
        return f"tfds:{_tfds_parts(spec[len('tfds:'):])[0]}:test"
    return None
