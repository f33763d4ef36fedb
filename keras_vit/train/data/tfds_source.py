"""A split of a prepared tensorflow-datasets dataset as a source, and
the checks that open its builder."""

from __future__ import annotations

import numpy as np

from keras_vit.data import images as image_decoder
from keras_vit.base.checks import closest, require
from keras_vit.train.data.sources import DataError, ImageSource


class TfdsSource(ImageSource):
    """A split of a tensorflow-datasets dataset that is already prepared.

    Nothing is downloaded unless ``download=True`` (with no network, tfds
    retries for minutes).

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
            download_and_prepare(builder, name, data_dir)
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

            ds = self.stream().map(lambda rec, label: label).batch(1024)
            out = list(tqdm(ds.as_numpy_iterator(), desc="reading labels",
                            total=-(-self.num_examples // 1024),
                            leave=False, disable=self.num_examples < 20000))
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


def download_and_prepare(builder, name, data_dir=None):
    """tfds' ``builder.download_and_prepare()`` within the package's network
    rules: refused under ``KERAS_VIT_OFFLINE=1``; tfds' retries bounded,
    each download's connection and reads bounded in time; a failure is
    one line naming the dataset, the reason and how to prepare it
    elsewhere."""
    import contextlib
    import os

    from keras_vit.base import environment
    from keras_vit.base.limits import MAX_CONNECT_WAIT_SECONDS
    from keras_vit.zoo.download import fetch as download

    elsewhere = (f"prepare it where the network reaches its source (`tfds "
                 f"build {name}`) and ")
    target = getattr(builder, "data_dir", None)
    root = getattr(builder, "data_dir_root", None)
    if target is not None and root is not None:
        elsewhere += (f"place the {os.path.relpath(str(target), str(root))} "
                      f"folder it writes in {str(root).rstrip(os.sep)}"
                      f"{os.sep}, or pass its data folder as --data-dir / "
                      "data_dir= (TFDS_DATA_DIR)")
    else:
        elsewhere += ("pass that folder as --data-dir / data_dir= "
                      "(TFDS_DATA_DIR)")
    if environment.read("KERAS_VIT_OFFLINE"):
        raise DataError(f"tfds dataset {name!r} is not prepared"
                        f"{f' in {data_dir!r}' if data_dir else ''} and "
                        f"KERAS_VIT_OFFLINE=1 forbids downloading it; "
                        f"{elsewhere}")
    # tfds retries each URL 10 times with a doubling back-off (205 s
    # measured with no route), and opens URLs through _open_url with no
    # timeout (~2 min a try): both patched for this call, then put back.
    try:
        from tensorflow_datasets.core.download import downloader
    except ImportError:  # another tfds layout
        downloader = None
    retries = getattr(downloader, "MAX_RETRIES", None)
    open_url = getattr(downloader, "_open_url", None)
    read_wait = environment.read("KERAS_VIT_DOWNLOAD_STALL_S")

    @contextlib.contextmanager
    def bounded_open(url, **kwargs):
        why = download.unreachable(url, MAX_CONNECT_WAIT_SECONDS)
        if why is not None:
            raise ConnectionError(f"{url}: {why}")
        kwargs.setdefault("timeout", (MAX_CONNECT_WAIT_SECONDS, read_wait))
        with open_url(url, **kwargs) as opened:
            yield opened

    if retries is not None:
        downloader.MAX_RETRIES = min(retries, 2)
    if open_url is not None:
        downloader._open_url = bounded_open
    try:
        builder.download_and_prepare()
    except OSError as e:  # requests' errors are OSErrors too
        reason = " ".join(str(e).split())
        if len(reason) > 300:
            reason = reason[:300] + "..."
        raise DataError(f"tfds dataset {name!r} could not be downloaded "
                        f"({type(e).__name__}: {reason}); {elsewhere}"
                        ) from None
    finally:
        if retries is not None:
            downloader.MAX_RETRIES = retries
        if open_url is not None:
            downloader._open_url = open_url


def import_tfds():
    """The tensorflow_datasets module, or an error naming the package."""
    return require("tensorflow_datasets", purpose="tfds datasets")


def tfds_builder(tfds, name, data_dir):
    """The tfds builder of ``name``; an unknown name suggests the nearest."""
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"tfds name must be a non-empty string; received "
                        f"name={name!r}")
    base = name.split(":")[0].split("/")[0]
    # Without the community datasets: their GCS index costs minutes of
    # retries with no network, and no community name passes below anyway.
    known = tfds.list_builders(with_community_datasets=False)
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
