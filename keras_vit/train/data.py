"""Input pipelines: a tfds dataset, a folder of images, numpy arrays, or
scikit-learn's digits (offline), read with the paper's preprocessing.

A *source* is a labelled collection of images (:class:`ImageSource`); the
pipelines turn it into batches of images in [-1, 1]:

- training: inception crop (random area and aspect ratio), random
  horizontal flip, resize to the training resolution;
- evaluation: optional central crop, resize.

Everything random is seeded per epoch and per example (stateless ops), so
an epoch is the same batches in the same order every time it is built; a
resumed run rebuilds the epoch it stopped in and skips what it consumed.

>>> import keras_vit.train as kt
>>> train = kt.digits("train")
>>> train.num_examples, train.num_classes
(1347, 10)
>>> images, labels = next(iter(kt.dataset(train, image_size=16,
...                                       batch_size=4, training=False)))
>>> tuple(images.shape), float(images.numpy().min()) >= -1.0
((4, 16, 16, 3), True)
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from keras_vit import compat
from keras_vit import images as image_decoder
from keras_vit.archives import check_archive, special_file
from keras_vit.checks import closest, require
from keras_vit.errors import KerasVitError

# The file names a folder scan reads; what is inside decides the format
# (keras_vit.images decodes JPEG, PNG, GIF, BMP and WebP).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
# A folder scan keeps, per file, keras_vit.images.FACTS and the file's size.
FACT_COLUMNS = len(image_decoder.FACTS) + 1
# Streams (tfds) are shuffled through a buffer of this many records.
SHUFFLE_BUFFER = 10_000
# Paper / official input pipeline: inception crop of 5%-100% of the area.
INCEPTION_AREA = (0.05, 1.0)
INCEPTION_ASPECT = (3 / 4, 4 / 3)


class DataError(KerasVitError, ValueError):
    """A data source that cannot be read as asked (message says why)."""


# --------------------------------------------------------------------------
# sources


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
        self.class_names = list(class_names) if class_names else None

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
        (as ``tf.slice`` takes them). Here the image is decoded whole;
        sources of files decode only the window of a JPEG."""
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
        if labels.min() < 0 or labels.max() >= num_classes:
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

    The split depends only on ``seed`` (scikit-learn's ``train_test_split``
    with ``random_state=seed``). Flips are off: a mirrored digit is another
    symbol.

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
        self.path = path
        self._set_files(files, labels, facts)
        self.skipped = skipped
        self.empty_classes = empty
        messages = []
        if skipped:
            shown = "; ".join(f"{os.path.relpath(p, path)} ({why})"
                              for p, why in skipped[:10])
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

    def _set_files(self, files, labels, facts):
        """The files, their labels and what the scan read from each
        (:func:`check_images`' ``facts``)."""
        self._files = np.asarray(files, dtype=object)
        self._labels = np.asarray(labels, "int64")
        self._facts = np.asarray(facts, "int64").reshape(
            len(self._files), FACT_COLUMNS)

    @classmethod
    def _from_lists(cls, parent, idx):
        self = cls.__new__(cls)
        ImageSource.__init__(self, len(idx), parent.num_classes,
                             parent.class_names)
        self.name = f"{parent.name}[subset]"
        self.path = parent.path
        self._set_files(parent._files[idx], parent._labels[idx],
                        parent._facts[idx])
        self.skipped = ()
        self.empty_classes = ()
        return self

    def labels(self):
        return self._labels

    def subset(self, indices):
        idx = np.unique(np.asarray(indices, "int64"))
        return FolderSource._from_lists(self, idx)

    def table(self):
        # Records are rows of the file list: decode() reads the file and
        # what the scan found in its header from the same row.
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


def check_images(candidates, verbose, *, with_facts=False):
    """Splits ``[(path, label)]`` into the images every path decodes and
    the skipped files, each with the reason: ``(files, labels, skipped)``,
    and with ``with_facts`` the (files, :data:`FACT_COLUMNS`) int64 array
    of what :func:`keras_vit.images.inspect` read from each header and the
    file's size, so that training decodes without reading headers again.

    Each file is read and decoded once by :mod:`keras_vit.images` (in
    parallel, in ``tf.data``): the decoder's refusals (not an image, a
    format it does not read, over the pixel budget, ...) and files it
    cannot decode are skipped here, so that training never meets them: a
    pipeline that drops every image would otherwise spin forever, and one
    that drops a few would not say which.
    """
    import tensorflow as tf
    from tqdm.auto import tqdm

    files, labels, skipped, facts = [], [], [], []
    readable = []
    for path, label in candidates:
        ext = os.path.splitext(path)[1].lower()
        if ext not in IMAGE_EXTENSIONS:
            skipped.append((path, f"not an image extension {ext or '(none)'}"))
            continue
        # Opening a FIFO blocks until something writes to it: the run would
        # hang with no output. Only regular files are read.
        kind = special_file(path)
        if kind is not None:
            skipped.append((path, f"{kind}, not a regular file"))
            continue
        readable.append((path, label))
    def result():
        return (files, labels, skipped) + ((facts,) if with_facts else ())

    if not readable:
        return result()

    def check(i, path):
        data = tf.io.read_file(path)
        pixels, header, reason = image_decoder.decode_or_refuse(data)
        size = tf.cast(tf.strings.length(data), tf.int64)[None]
        return i, reason, tf.concat([header, size], 0), tf.shape(pixels)[0]

    paths = [p for p, _ in readable]
    ds = tf.data.Dataset.from_tensor_slices(np.asarray(paths, dtype=str))
    ds = ds.enumerate().map(check, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.ignore_errors().prefetch(tf.data.AUTOTUNE)
    reasons, found = {}, {}
    bar = tqdm(ds.as_numpy_iterator(), desc="checking images", unit="file",
               total=len(paths), leave=False,
               disable=not verbose or len(paths) < 2000)
    for i, reason, row, _ in bar:
        reasons[int(i)] = reason.decode()
        found[int(i)] = row
    failed = 0
    for i, (path, label) in enumerate(readable):
        reason = reasons.get(i)
        if reason is None:  # TensorFlow failed: read it again for why
            failed += 1
            reason = "unreadable"
            if failed <= 20:
                try:
                    image_decoder.read(path, name="it")
                except (image_decoder.ImageError, OSError) as e:
                    reason = str(e).removeprefix("it ")
        if reason:
            skipped.append((path, reason))
        else:
            files.append(path)
            labels.append(label)
            facts.append(found[i])
    return result()


class TfdsSource(ImageSource):
    """A split of a tensorflow-datasets dataset that is already prepared.

    Nothing is downloaded unless ``download=True``: with no network, tfds
    would otherwise retry for minutes before failing. A dataset that is not
    prepared raises at once with the command that prepares it.

    Args:
        name: a tfds name (``"cifar10"``, ``"oxford_iiit_pet:3.*.*"``).
        split: a tfds split, slicing allowed (``"train[:90%]"``).
        data_dir: where tfds keeps prepared data (default: tfds' own,
            ``TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
        download: download and prepare it if missing (needs the network).
        image_key, label_key: the feature names.
    """

    in_memory = False

    def __init__(self, name, split="train", *, data_dir=None, download=False,
                 image_key="image", label_key="label"):
        tfds = import_tfds()
        builder = tfds_builder(tfds, name, data_dir)
        if not builder.is_prepared():
            if not download:
                raise FileNotFoundError(
                    f"tfds dataset {name!r} is not prepared in "
                    f"{str(builder.data_dir_root)!r} and nothing is "
                    "downloaded unless asked. Prepare it once with network "
                    f"access: `tfds build {name}` (or pass --download / "
                    "download=True), or point --data-dir / data_dir= at a "
                    "folder where it is prepared (TFDS_DATA_DIR).")
            builder.download_and_prepare()
        features = builder.info.features
        for key, what in ((image_key, "image_key"), (label_key, "label_key")):
            if key not in features:
                raise DataError(
                    f"tfds dataset {name!r} has no feature {what}={key!r}; "
                    f"its features: {sorted(features.keys())}")
        label_feature = features[label_key]
        if not hasattr(label_feature, "num_classes"):
            raise DataError(
                f"tfds feature label_key={label_key!r} of {name!r} is not a "
                "ClassLabel")
        try:
            num_examples = builder.info.splits[split].num_examples
        except (KeyError, ValueError) as e:
            raise DataError(
                f"tfds dataset {name!r} has no split={split!r} ({e}); its "
                f"splits: {sorted(builder.info.splits.keys())}") from None
        super().__init__(num_examples, label_feature.num_classes,
                         getattr(label_feature, "names", None))
        self.name = f"tfds:{name}:{split}"
        self.builder = builder
        self.split = split
        self.image_key = image_key
        self.label_key = label_key
        self._keep = None  # sorted indices of a subset
        self._labels = None

    def _raw(self):
        tfds = import_tfds()
        return self.builder.as_dataset(
            split=self.split, shuffle_files=False,
            decoders={self.image_key: tfds.decode.SkipDecoding()},
            read_config=tfds.ReadConfig(try_autocache=False))

    def stream(self):
        import tensorflow as tf

        ik, lk = self.image_key, self.label_key
        ds = self._raw().map(lambda ex: (ex[ik], tf.cast(ex[lk], tf.int64)))
        if self._keep is not None:
            mask = np.zeros(self._parent_size, bool)
            mask[self._keep] = True
            mask = tf.constant(mask)
            ds = ds.enumerate().filter(
                lambda i, ex: tf.gather(mask, i)).map(lambda i, ex: ex)
        return ds

    def labels(self):
        if self._labels is None:
            from tqdm.auto import tqdm

            out = []
            ds = self.stream().map(lambda rec, label: label).batch(1024)
            for batch in tqdm(ds.as_numpy_iterator(), desc="reading labels",
                              total=-(-self.num_examples // 1024),
                              leave=False, disable=self.num_examples < 20000):
                out.append(batch)
            self._labels = np.concatenate(out).astype("int64")
        return self._labels

    def subset(self, indices):
        idx = np.unique(np.asarray(indices, "int64"))
        new = object.__new__(TfdsSource)
        new.__dict__.update(self.__dict__)
        parent_keep = self._keep
        new._parent_size = getattr(self, "_parent_size", self.num_examples)
        new._keep = idx if parent_keep is None else parent_keep[idx]
        new.num_examples = len(idx)
        new._labels = None if self._labels is None else self._labels[idx]
        new.name = f"{self.name}[subset]"
        return new

    def decode(self, record):
        import tensorflow as tf

        image = image_decoder.decode(record, f"an image of {self.name}")
        return tf.cast(image, tf.float32)

    def decode_crop(self, record, crop):
        import tensorflow as tf

        if type(self).decode is not TfdsSource.decode:
            return super().decode_crop(record, crop)  # its own pixels
        image = image_decoder.decode_crop(
            record, crop, f"an image of {self.name}", fast_dct=True)
        return tf.cast(image, tf.float32)


def import_tfds():
    """The tensorflow_datasets module, or an error naming the package."""
    return require("tensorflow_datasets", purpose="tfds datasets")


def tfds_builder(tfds, name, data_dir):
    """The tfds builder of ``name``; an unknown name suggests the nearest."""
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"tfds name must be a non-empty string; received "
                        f"name={name!r}")
    base = name.split(":")[0].split("/")[0]
    known = tfds.list_builders()
    if base not in known:
        close = closest(base, known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise DataError(
            f"Unknown tfds dataset name={name!r}.{hint} "
            "`tfds.list_builders()` lists them all.")
    try:
        return tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - tfds raises many kinds
        raise DataError(f"tfds could not open name={name!r}: {e}") from None


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
        rest = text[len("tfds:"):]
        # A version ("cifar10:3.0.2") also has a colon: the split is the
        # part after the last colon only when it names a split.
        name, _, maybe_split = rest.rpartition(":")
        if not name or maybe_split[:1].isdigit():
            name, maybe_split = rest, ""
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
        rest = spec[len("tfds:"):]
        name, _, maybe = rest.rpartition(":")
        if not name or maybe[:1].isdigit():
            name = rest
        return f"tfds:{name}:test"
    return None


# --------------------------------------------------------------------------
# preprocessing


def scale(images):
    """[0, 255] -> [-1, 1], the official ViT input range."""
    return images / 127.5 - 1.0


def takes_raw_pixels(model):
    """Whether ``model`` scales [0, 255] pixels itself (built with
    ``include_preprocessing=True``, so its first layer is the Rescaling
    named ``preprocessing``): the pipelines then leave pixels unscaled.

    >>> import keras_vit
    >>> kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
    ...           num_heads=1, mlp_dim=8, num_classes=2)
    >>> takes_raw_pixels(keras_vit.vit(**kw, include_preprocessing=True))
    True
    >>> takes_raw_pixels(keras_vit.vit(**kw))
    False
    """
    import keras

    return any(isinstance(layer, keras.layers.Rescaling)
               and layer.name == "preprocessing"
               for layer in compat.flatten_layers(model))


def _mix(seed, epoch):
    # A distinct, reproducible stream per (seed, epoch), well inside int64.
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 17) % (2 ** 31 - 1)


def inception_box(shape, seed, area_range=INCEPTION_AREA,
                  aspect_range=INCEPTION_ASPECT):
    """``(begin, size)`` of a random box covering ``area_range`` of an
    image of ``shape`` (height, width, channels) with an aspect ratio in
    ``aspect_range``: the "inception crop" of the official training
    pipeline. ``seed`` is a stateless seed (shape (2,))."""
    import tensorflow as tf

    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.zeros([1, 0, 4]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=aspect_range,
        area_range=area_range, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, size


def inception_crop(image, size, seed, area_range=INCEPTION_AREA,
                   aspect_range=INCEPTION_ASPECT):
    """The :func:`inception_box` of ``image``, resized to ``size``
    (bilinear)."""
    import tensorflow as tf

    begin, crop = inception_box(tf.shape(image), seed, area_range,
                                aspect_range)
    image = tf.slice(image, begin, crop)
    return tf.image.resize(image, (size, size), method="bilinear")


def eval_resize(image, size, crop_fraction=1.0):
    """Central crop of ``crop_fraction`` of each side (1.0: none), then a
    bilinear resize to ``size``."""
    import tensorflow as tf

    if crop_fraction < 1.0:
        image = tf.image.central_crop(image, crop_fraction)
    return tf.image.resize(image, (size, size), method="bilinear")


def _check_size(image_size):
    if not isinstance(image_size, int) or isinstance(image_size, bool) or (
            image_size < 1):
        raise ValueError(f"image_size must be a positive integer; received "
                         f"image_size={image_size!r}")


def _examples(source, training, seed, epoch):
    """(index, record, label, epoch_seed) in this epoch's order.

    ``epoch=None`` draws a new order every time the dataset is iterated
    (what ``model.fit`` needs); an int gives the same order every time.
    """
    import tensorflow as tf

    if epoch is None:
        seeds = tf.data.Dataset.random(
            seed=seed, rerandomize_each_iteration=True).take(1)
    else:
        seeds = tf.data.Dataset.from_tensors(
            tf.constant(_mix(seed, epoch), tf.int64))
    if source.in_memory:
        records, labels = source.table()
        records = tf.constant(records)
        labels = tf.constant(labels, tf.int64)
        n = source.num_examples

        def order(s):
            idx = tf.range(n, dtype=tf.int64)
            if training:
                idx = tf.random.experimental.stateless_shuffle(
                    idx, seed=tf.stack([s, tf.constant(seed, tf.int64)]))
            return tf.data.Dataset.from_tensor_slices(idx).map(
                lambda i: (i, tf.gather(records, i), tf.gather(labels, i), s))

        return seeds.flat_map(order)
    stream = source.stream().enumerate()
    if epoch is None:
        ds = tf.data.Dataset.zip(stream, tf.data.Dataset.random(
            seed=seed, rerandomize_each_iteration=True))
        ds = ds.map(lambda i_ex, s: (i_ex[0], i_ex[1][0], i_ex[1][1], s))
    else:
        s = tf.constant(_mix(seed, epoch), tf.int64)
        ds = stream.map(lambda i, ex: (i, ex[0], ex[1], s))
    if training:
        ds = ds.shuffle(min(SHUFFLE_BUFFER, source.num_examples),
                        seed=_mix(seed, epoch or 0),
                        reshuffle_each_iteration=epoch is None)
    return ds


def _preprocess(source, image_size, training, crop_area, flip, eval_crop,
                raw_pixels=False):
    import tensorflow as tf

    flip = flip and source.flip_ok

    def fn(index, record, label, epoch_seed):
        if training:
            seed = tf.stack([epoch_seed, index])
            crop_seed, flip_seed = tf.unstack(
                tf.random.experimental.stateless_split(seed, 2))
            if crop_area is not None:
                # The box is drawn from the header's size (the same box a
                # whole decode gives), and a JPEG decodes only the box.
                image = source.decode_crop(record, lambda shape: (
                    inception_box(shape, crop_seed, tuple(crop_area))))
            else:
                image = source.decode(record)
            image = tf.image.resize(image, (image_size, image_size),
                                    method="bilinear")
            if flip:
                image = tf.image.stateless_random_flip_left_right(
                    image, flip_seed)
        else:
            image = eval_resize(source.decode(record), image_size, eval_crop)
        image = tf.ensure_shape(image, (image_size, image_size, 3))
        return (image if raw_pixels else scale(image)), label

    return fn


def steps_per_epoch(source, global_batch_size, *, shards=1):
    """Full batches in one epoch (the ragged remainder is dropped); a
    ValueError naming the batch size and the number of images when that is
    none at all (``model.fit`` would run epochs that train nothing).
    ``shards``: the epoch is split into that many parts, each batched by
    itself."""
    per_shard = source.num_examples // shards
    if per_shard < global_batch_size:
        where = (f"{per_shard} images in each of {shards} shards of "
                 if shards > 1 else f"{source.num_examples} images in ")
        raise ValueError(
            f"batch_size={global_batch_size} is larger than the training "
            f"data ({where}{source.name!r}): an epoch would hold no full "
            f"batch; pass batch_size={per_shard} or less (or more data)")
    return per_shard // global_batch_size


def dataset(source, image_size, batch_size, *, training=True, seed=0,
            epoch=None, crop_area=INCEPTION_AREA, flip=True, eval_crop=1.0,
            shard=(1, 0), skip=0, take=None, drop_remainder=None,
            prefetch=True, raw_pixels=False):
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches.

    Args:
        source: an :class:`ImageSource` or a spec for :func:`load_data`.
        image_size: output resolution (square).
        batch_size: images per batch.
        training: augment (inception crop, flip) and shuffle, and drop the
            ragged last batch (a source with fewer images than one batch
            is refused); else resize only, in order.
        seed: seeds the shuffle and the augmentation.
        epoch: None reshuffles each time the dataset is iterated (for
            ``model.fit``); an int fixes that epoch's order.
        crop_area: inception-crop area range, or None for a plain resize.
        flip: random horizontal flips (only if ``source.flip_ok``).
        eval_crop: central-crop fraction before the evaluation resize.
        shard: ``(num_shards, index)``: this pipeline's part of each epoch.
        skip: examples of this shard to skip first (resuming mid-epoch).
        take: examples of this shard to yield at most.
        drop_remainder: default: ``training``.
        prefetch: overlap input with compute.
        raw_pixels: yield [0, 255] pixels, for a model that scales them
            itself (see :func:`takes_raw_pixels`); default: [-1, 1].
    """
    import tensorflow as tf

    source = load_data(source)
    _check_size(image_size)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; received "
                         f"batch_size={batch_size!r}")
    ds = _examples(source, training, seed, epoch)
    num_shards, index = shard
    if training and epoch is not None:
        # Files that fail to decode (FolderSource drops those it finds at
        # load; one changed since could fail) are dropped below; repeating
        # the epoch's order fills the gap so every shard still yields
        # exactly `take`. Bounded: a stream of failures ends, never spins.
        ds = ds.repeat(3)
    if num_shards > 1:
        ds = ds.shard(num_shards, index)
    if skip:
        ds = ds.skip(skip)
    ds = ds.map(_preprocess(source, image_size, training, crop_area, flip,
                            eval_crop, raw_pixels),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)
    if take is not None:
        ds = ds.take(take)
    elif training and epoch is not None:
        ds = ds.take(max(0, source.num_examples // num_shards - skip))
    if drop_remainder is None:
        drop_remainder = training
    if drop_remainder:  # no full batch: refused, not an empty epoch
        steps_per_epoch(source, batch_size, shards=num_shards)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    options = tf.data.Options()
    options.deterministic = True
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def padded_eval_dataset(source, image_size, batch_size, *, num_batches,
                        shard=(1, 0), eval_crop=1.0, raw_pixels=False):
    """Evaluation batches of ``(images, labels, mask)`` padded with masked
    blank images to exactly ``num_batches`` full batches, so every replica
    and worker runs the same number of steps on static shapes."""
    import tensorflow as tf

    ds = dataset(source, image_size, batch_size, training=False,
                 shard=shard, eval_crop=eval_crop, drop_remainder=False,
                 prefetch=False, raw_pixels=raw_pixels).unbatch()
    ds = ds.map(lambda x, y: (x, y, tf.constant(1.0)))
    blank = tf.data.Dataset.from_tensors(
        (tf.zeros((image_size, image_size, 3)), tf.constant(0, tf.int64),
         tf.constant(0.0))).repeat()
    ds = ds.concatenate(blank).take(num_batches * batch_size)
    return ds.batch(batch_size, drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)
