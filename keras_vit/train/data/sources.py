"""Labelled images as sources: the interface every pipeline reads
(:class:`ImageSource`), images in numpy arrays, scikit-learn's digits (the
offline dataset) and :class:`DataError`.
"""

from __future__ import annotations

import numpy as np

from keras_vit.base.errors import KerasVitError
from keras_vit.base import names


class DataError(KerasVitError, ValueError):
    """A data source that cannot be read as asked (message says why)."""


class ImageSource:
    """A labelled set of images the pipelines read.

    Attributes:
        name: what it is, e.g. ``"digits:train"`` or a folder path.
        num_examples: number of images.
        num_classes: number of classes (labels are ``0 .. num_classes-1``).
        class_names: list of names, or None.
        flip_ok: whether a horizontal flip keeps the label (not for digits).
        skipped: ``[(path, reason)]`` of files left out (folders).
    """

    name = "images"
    flip_ok = True
    in_memory = True
    skipped = ()

    def __init__(self, num_examples, num_classes, class_names=None):
        self.num_examples = int(num_examples)
        self.num_classes = int(num_classes)
        # One spelling per name (NFC).
        self.class_names = names.class_names(class_names) if class_names \
            else None

    def labels(self):
        """All labels, in record order, as an int64 numpy array."""
        raise NotImplementedError

    def subset(self, indices):
        """The examples at ``indices`` (taken in ascending order)."""
        raise NotImplementedError

    def decode(self, record):
        """A record -> float32 (height, width, 3) image with values in
        [0, 255] (a graph function, used inside ``Dataset.map``)."""
        raise NotImplementedError

    def decode_crop(self, record, crop):
        """A window of ``decode(record)``: ``crop(shape)`` -> ``(begin,
        size)`` chooses it from the image's (height, width, 3) int32 shape
        (as ``tf.slice`` takes them)."""
        import tensorflow as tf

        image = self.decode(record)
        begin, size = crop(tf.shape(image))
        return tf.slice(image, begin, size)

    # In-memory sources give their records as a table; streams as a dataset.
    def table(self):
        raise NotImplementedError

    def stream(self):
        raise NotImplementedError

    def __repr__(self):
        return (f"<{type(self).__name__} {self.name!r}: {self.num_examples} "
                f"images, {self.num_classes} classes>")


class ArraySource(ImageSource):
    """Images held in a numpy array.

    Args:
        images: ``(N, H, W, 3)``, ``(N, H, W, 1)`` or ``(N, H, W)``.
        labels: ``(N,)`` integers in ``[0, num_classes)``.
        num_classes: default ``max(labels) + 1``.
        value_range: the pixel range of ``images``, mapped to [0, 255]
            (e.g. ``(0, 1)`` for floats, ``(-1, 1)`` if already scaled).
        name, class_names, flip_ok: see :class:`ImageSource`.

    >>> import numpy as np
    >>> s = ArraySource(np.zeros((6, 8, 8), "uint8"), [0, 1, 2, 0, 1, 2])
    >>> s.num_classes, s.subset([4, 1]).labels().tolist()
    (3, [1, 1])
    """

    def __init__(self, images, labels, num_classes=None, *,
                 value_range=(0, 255), name="arrays", class_names=None,
                 flip_ok=True):
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise DataError(
                "images must have shape (N, H, W), (N, H, W, 1) or "
                f"(N, H, W, 3); received images.shape={images.shape}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise DataError(
                f"labels must have shape ({len(images)},) to match images; "
                f"received labels.shape={labels.shape}")
        if len(images) == 0:
            raise DataError("images is empty; received images.shape="
                            f"{images.shape}")
        if not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"labels must be integers; received "
                            f"labels.dtype={labels.dtype}")
        if labels.min() < 0:
            raise DataError(f"labels must be >= 0; received labels in "
                            f"[{labels.min()}, {labels.max()}]")
        if images.dtype.kind == "f" and not np.isfinite(images).all():
            bad = int((~np.isfinite(images)).any(axis=(1, 2, 3)).sum())
            raise DataError(f"images holds NaN or infinite pixels in {bad} "
                            f"of {len(images)} images; received "
                            f"data={name!r}")
        if num_classes is None:
            num_classes = int(labels.max()) + 1
        if labels.max() >= num_classes:
            raise DataError(
                f"labels must lie in [0, num_classes={num_classes}); received "
                f"labels in [{labels.min()}, {labels.max()}]")
        lo, hi = (float(v) for v in value_range)
        if not hi > lo:
            raise DataError(
                f"value_range must be (low, high) with high > low; received "
                f"value_range={value_range!r}")
        super().__init__(len(images), num_classes, class_names)
        self.images = images
        self._labels = labels.astype("int64")
        self.value_range = (lo, hi)
        self.name = name
        self.flip_ok = flip_ok
        self._tensor = None

    def labels(self):
        return self._labels

    def subset(self, indices):
        idx = np.unique(np.asarray(indices, "int64"))
        return ArraySource(self.images[idx], self._labels[idx],
                           self.num_classes, value_range=self.value_range,
                           name=f"{self.name}[subset]",
                           class_names=self.class_names, flip_ok=self.flip_ok)

    def table(self):
        return np.arange(self.num_examples, dtype="int64"), self._labels

    def decode(self, record):
        import tensorflow as tf

        if self._tensor is None:
            # Made once, eagerly (decode runs inside Dataset.map traces).
            with tf.init_scope():
                self._tensor = tf.constant(self.images)
        image = tf.cast(tf.gather(self._tensor, record), tf.float32)
        lo, hi = self.value_range
        if (lo, hi) != (0.0, 255.0):
            image = (image - lo) * (255.0 / (hi - lo))
        if self.images.shape[-1] == 1:
            image = tf.image.grayscale_to_rgb(image)
        return image


def digits(split="train", *, seed=0, test_size=0.25):
    """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), the
    built-in offline dataset, split stratified into train and test.

    The split depends only on ``seed``. Flips are off: a mirrored digit is
    another symbol.

    >>> digits("test").num_examples
    450
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
        raise DataError(f"digits split must be 'train' or 'test'; received "
                        f"split={split!r}")
    data = load_digits()
    x = data.images.astype("float32")  # 0..16
    y = data.target.astype("int64")
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=seed)
    x, y = (x_tr, y_tr) if split == "train" else (x_te, y_te)
    return ArraySource(x, y, 10, value_range=(0, 16), name=f"digits:{split}",
                       class_names=[str(i) for i in range(10)], flip_ok=False)
