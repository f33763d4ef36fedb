"""A folder of images as a source: one sub-folder per class (sorted
names give the labels), its files checked once by
:func:`~keras_vit.train.data.image_checks.check_images`.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from keras_vit.base.names import class_name, shown_apart
from keras_vit.data import images as image_decoder
from keras_vit.train.data.image_checks import FACT_COLUMNS, check_images
from keras_vit.train.data.sources import DataError, ImageSource


def existing_folder(path, expected):
    """``path`` as a string when it is a folder; otherwise a
    FileNotFoundError that echoes it and says what was ``expected``."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        what = "is a file, not a folder" if os.path.exists(path) else (
            "does not exist")
        raise FileNotFoundError(
            f"Image folder data={path!r} {what}; expected {expected}.")
    return path


def skipped_text(skipped, path):
    """The first ten ``(path, reason)`` of ``skipped``, for a warning."""
    return "; ".join(f"{os.path.relpath(p, path)} ({why})"
                     for p, why in skipped[:10])


class FolderSource(ImageSource):
    """A folder with one sub-folder of images per class (sorted names give
    the labels). Files that are not images, or that cannot be read, are
    reported in one warning and left out; an empty class folder is kept as a
    class (so labels still follow the folder names) with a warning.

    Args:
        path: the folder.
        verbose: show a progress bar while checking many files.
    """

    in_memory = True

    def __init__(self, path, *, verbose=True):
        path = existing_folder(
            path, "a folder with one sub-folder of images per class")
        classes = sorted(
            d for d in os.listdir(path)
            if not d.startswith(".") and os.path.isdir(os.path.join(path, d)))
        if not classes:
            raise DataError(
                f"Image folder data={path!r} has no class sub-folders; "
                "expected one sub-folder of images per class, e.g. "
                f"{os.path.join(path, 'cat', '001.jpg')}")
        spelled = {}
        for cls in classes:  # two spellings of one name: two folders, one class
            twin = spelled.setdefault(class_name(cls), cls)
            if twin != cls:
                raise DataError(
                    f"Image folder data={path!r} has the class folders "
                    f"{shown_apart(twin, [cls])} and {shown_apart(cls, [twin])}"
                    ", one name in two Unicode spellings; merge them into one")
        candidates = []
        for label, cls in enumerate(classes):
            folder = os.path.join(path, cls)
            for root, dirs, names in os.walk(folder):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for fname in sorted(names):
                    if not fname.startswith("."):
                        candidates.append((os.path.join(root, fname), label))
        files, labels, skipped, facts = check_images(candidates, verbose,
                                                     with_facts=True)
        counts = np.bincount(np.asarray(labels, "int64"),
                             minlength=len(classes))
        empty = [c for c, n in zip(classes, counts) if n == 0]
        if not files:
            raise DataError(
                f"Image folder data={path!r} has no images TensorFlow can "
                f"read ({len(skipped)} files skipped, e.g. {skipped[:3]})")
        super().__init__(len(files), len(classes), classes)
        self.name = path
        self._set_files(path, files, labels, facts, skipped, empty)
        messages = []
        if skipped:
            shown = skipped_text(skipped, path)
            more = (f"; and {len(skipped) - 10} more"
                    if len(skipped) > 10 else "")
            messages.append(
                f"skipped {len(skipped)} of {len(candidates)} files that are "
                f"not readable images: {shown}{more}")
        if empty:
            messages.append(
                f"class folder(s) {empty} have no images (kept as classes so "
                "labels follow the folder names; they cannot be learned)")
        if messages:
            warnings.warn(f"Image folder {path!r}: " + ". ".join(messages),
                          UserWarning, stacklevel=2)

    def _set_files(self, path, files, labels, facts, skipped=(), empty=()):
        self.path = path
        self.skipped = skipped
        self.empty_classes = empty
        self._files = np.asarray(files, dtype=object)
        self._labels = np.asarray(labels, "int64")
        self._facts = np.asarray(facts, "int64").reshape(
            len(self._files), FACT_COLUMNS)

    def labels(self):
        return self._labels

    def subset(self, indices):
        idx = np.unique(np.asarray(indices, "int64"))
        new = FolderSource.__new__(FolderSource)
        ImageSource.__init__(new, len(idx), self.num_classes,
                             self.class_names)
        new.name = f"{self.name}[subset]"
        new._set_files(self.path, self._files[idx], self._labels[idx],
                       self._facts[idx])
        return new

    def table(self):
        # Records are rows of the file list (and of the scan's facts).
        return np.arange(len(self._files), dtype="int64"), self._labels

    def _row(self, record):
        """(path, facts, size, name) of a record (a row of the file list)."""
        import tensorflow as tf

        path = tf.gather(tf.constant(self._files.astype(str)), record)
        facts = tf.gather(tf.constant(self._facts), record)
        name = tf.strings.join(["image '", path, "'"])
        return path, facts[:-1], facts[-1], name

    def decode(self, record):
        import tensorflow as tf

        path, facts, size, name = self._row(record)
        image = image_decoder.decode_inspected(tf.io.read_file(path), facts,
                                               size, name)
        return tf.cast(image, tf.float32)

    def decode_crop(self, record, crop):
        import tensorflow as tf

        if type(self).decode is not FolderSource.decode:
            return super().decode_crop(record, crop)  # its own pixels
        path, facts, size, name = self._row(record)
        image = image_decoder.decode_crop(
            tf.io.read_file(path), crop, name, facts, size,
            kind=self._jpeg_kind(), fast_dct=True)
        return tf.cast(image, tf.float32)

    def _jpeg_kind(self):
        """``(scale, oriented)`` when every file is a JPEG decoded at one
        scale (the graph of a crop then has no branch), else None."""
        facts = self._facts
        jpeg = image_decoder.FORMATS.index("JPEG")
        if len(facts) == 0 or (facts[:, 0] != jpeg).any() or len(
                set(facts[:, 3])) != 1:
            return None
        return int(facts[0, 3]), bool((facts[:, 4] != 1).any())
