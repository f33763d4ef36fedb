"""keras_vit.train.data: the training data (load_data, the image-folder
source and its checks, the input pipeline) under hostile input. No hang
on images TensorFlow cannot decode, a FIFO or an image over the pixel
budget: each dropped file is named once; a hostile .npz is refused
naming what is wrong."""

import re
import time

import numpy as np
import pytest

from testkit import QUICK, tiny as _tiny
from testkit import bad_calls_test
from testkit import class_folders as _class_folders
from testkit import fifo as _fifo
from testkit import jpeg as _jpeg
import keras_vit
from keras_vit import train as kt


# A correctness bug of the audit: a model that scales its own pixels was
# fed the pipeline's [-1, 1] images.
def test_trainer_feeds_raw_pixels_to_a_preprocessing_model():
    from keras_vit.train.data.pipeline import dataset, takes_raw_pixels

    plain, raw = _tiny(), _tiny(include_preprocessing=True)
    assert not takes_raw_pixels(plain)
    assert takes_raw_pixels(raw)
    images, _ = next(iter(dataset(
        "digits", 16, 64, training=False, raw_pixels=True)))
    assert float(images.numpy().max()) > 100.0  # [0, 255], not [-1, 1]
    # Same weights: the same evaluation whether the model or the pipeline
    # scales the pixels.
    raw.set_weights(plain.get_weights())
    for layer in (plain.get_layer("head"), raw.get_layer("head")):
        kernel = np.random.default_rng(0).normal(size=(32, 10)) * 0.5
        layer.kernel.assign(kernel.astype("float32"))
    a = keras_vit.train.evaluate(plain, "digits:test", verbose=False)
    b = keras_vit.train.evaluate(raw, "digits:test", verbose=False)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    assert a["accuracy"] == pytest.approx(b["accuracy"])


# ---------------------------------------------------------------------------
# No hang on images TensorFlow cannot decode; each dropped one named.
# ---------------------------------------------------------------------------


def _truncated_jpeg(path, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
        path, "JPEG")
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * 0.8)])  # passes PIL's verify()


def test_folder_of_undecodable_images_fails_fast_naming_it(tmp_path):
    from keras_vit import train as kt

    root = tmp_path / "bad"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            _truncated_jpeg(root / c / f"{i}.jpg", i)
    start = time.monotonic()
    with pytest.raises(kt.DataError, match=re.escape(repr(str(root)))
                       + r" has no images TensorFlow can read"):
        kt.load_data(str(root))
    with pytest.raises(kt.DataError,
                       match="is a JPEG cut short inside its image data"):
        kt.Trainer(_tiny(num_classes=2), str(root), **QUICK)
    assert time.monotonic() - start < 20.0


def test_each_dropped_image_is_named_once(tmp_path):
    from keras_vit import train as kt

    root = _class_folders(tmp_path / "mixed", 4)
    _truncated_jpeg(root / "b" / "cut.jpg", 7)
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(root))
    text = " ".join(str(w.message) for w in record)
    assert text.count("cut.jpg") == 1
    assert source.num_examples == 8
    batches = list(kt.dataset(source, 16, 4, training=True, epoch=0))
    assert sum(int(b[0].shape[0]) for b in batches) == 8


@pytest.mark.parametrize("case, needle", [
    ("not_a_zip", "is not an .npz archive (not a zip archive"),
    ("nan_pixels", "NaN or infinite pixels in 2 of 4 images"),
    ("negative_labels", "labels must be >= 0; received labels in [-1, 1]"),
    ("object_arrays", "is not a readable .npz of arrays"),
])
def test_hostile_npz_data(tmp_path, case, needle):
    from keras_vit import train as kt

    path = tmp_path / "data.npz"
    x = np.zeros((4, 8, 8, 3), "float32")
    y = np.array([0, 1, 0, 1])
    if case == "not_a_zip":
        path.write_text("x,y\n1,2\n")
    elif case == "nan_pixels":
        x[1, 0, 0, 0] = np.nan
        x[3, 2, 2, 2] = np.inf
        np.savez(path, x=x, y=y)
    elif case == "negative_labels":
        np.savez(path, x=x, y=np.array([0, -1, 1, 0]))
    else:  # a pickle inside: never loaded
        np.savez(path, x=np.array([object()] * 4, dtype=object), y=y)
    with pytest.raises(kt.DataError) as info:
        kt.load_data(str(path))
    assert needle in str(info.value)


def test_a_fifo_in_an_image_folder_is_skipped_and_named(tmp_path):
    from keras_vit import train as kt

    root = _class_folders(tmp_path / "data", 2)
    _fifo(root / "a" / "x.png")  # opening it would block forever
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"x\.png \(a FIFO \(named pipe\), "
                                         r"not a regular file\)"):
        source = kt.load_data(str(root))
    assert source.num_examples == 4
    assert time.monotonic() - start < 20.0


# -- one pixel budget for every image reader --------------------------------

def _two_class_folder(tmp_path):
    """``tmp_path/data`` with classes a and b, two 20x20 PNGs each."""
    from PIL import Image

    root = tmp_path / "data"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 20), (i * 40, 0, 0)).save(
                root / c / f"{i}.png")
    return root


def _load_over_budget(root, monkeypatch, png, jpeg):
    """Loads ``root`` (:func:`_two_class_folder` and two images over the
    budget) under a pixel budget scaled down to 1,000 (16 million in real
    life): the 40x40 PNG ``png`` is skipped by name, saying why, the JPEG
    ``jpeg`` kept. Returns the source."""
    from keras_vit.data import images
    from keras_vit import train as kt

    monkeypatch.setattr(images, "PIXEL_BUDGET", 1000)
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(root))
    text = " ".join(str(w.message) for w in record)
    assert (f"{png} (is a 40x40 PNG, over the 1,000-pixel budget for "
            "images decoded whole") in text
    assert jpeg not in text
    assert source.num_examples == 5
    return source


def test_oversized_images_are_skipped_in_training_folders(tmp_path,
                                                          monkeypatch):
    """The pixel budget is read from the header: a PNG over it is skipped
    by name, a JPEG over it kept (decoded at a reduced scale)."""
    from PIL import Image

    root = _two_class_folder(tmp_path)
    Image.new("RGB", (40, 40)).save(root / "a" / "big.png")
    Image.new("RGB", (80, 80)).save(root / "b" / "big.jpg")
    _load_over_budget(root, monkeypatch, "big.png", "big.jpg")


def test_training_folders_keep_large_jpegs_and_skip_large_pngs(tmp_path,
                                                               monkeypatch):
    from PIL import Image

    from keras_vit import train as kt

    root = _two_class_folder(tmp_path)
    _jpeg(root / "a" / "photo.jpg", (64, 48))
    Image.new("RGB", (40, 40)).save(root / "b" / "wide.png")
    source = _load_over_budget(root, monkeypatch, "wide.png", "photo.jpg")
    batch, _ = next(iter(kt.dataset(source, image_size=16, batch_size=5,
                                     training=False)))
    assert tuple(batch.shape) == (5, 16, 16, 3)


def test_phone_photos_saved_as_mpo_are_kept_in_training_folders(tmp_path):
    """PIL names the JPEGs many phones write (a JPEG with a second picture
    after it) "MPO"; they were skipped as a format TensorFlow cannot read,
    which it can. They train, and count as JPEGs for the pixel budget."""
    from PIL import Image

    from keras_vit.data import images
    from keras_vit import train as kt

    root = _two_class_folder(tmp_path)
    photo = root / "a" / "phone.jpg"
    Image.new("RGB", (64, 48), (200, 10, 10)).save(
        photo, format="MPO", save_all=True,
        append_images=[Image.new("RGB", (32, 24))])
    with Image.open(photo) as im:
        assert im.format == "MPO"
    source = kt.load_data(str(root))
    assert source.num_examples == 5 and not source.skipped
    assert images.decode_plan("MPO", 12000, 9000).scale == 4


# Bad arguments to load_data, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
def _mixer(num_classes=10, **kwargs):
    from keras_vit.train.mixing import BatchMixer

    return BatchMixer(**dict(dict(mixup_alpha=0.8, cutmix_alpha=1.0,
                                  label_smoothing=0.1,
                                  num_classes=num_classes), **kwargs))


PYTHON_API = [
    ("load_data", lambda: kt.load_data("digit"), "data", "'digit'",
     "digits"),
    ("dataset randaugment", lambda: kt.dataset(
        "digits", 16, 8, randaugment=(0, 9)), "randaugment num_ops", "0",
     "an integer in [1, 64]"),
    ("dataset random_erasing", lambda: kt.dataset(
        "digits", 16, 8, random_erasing=1.5), "random_erasing", "1.5",
     "[0.0, 1.0]"),
    ("dataset mixing for evaluation", lambda: kt.dataset(
        "digits", 16, 8, training=False, mixing=_mixer()), "mixing",
     "BatchMixer(", "with training=False"),
    ("dataset mixing classes", lambda: kt.dataset(
        "digits", 16, 8, mixing=_mixer(num_classes=3)), "num_classes",
     "num_classes=3", "has 10 classes"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)


def test_a_failed_tfds_download_is_one_line_with_the_way_out():
    import requests

    from keras_vit.train.data.sources import DataError
    from keras_vit.train.data.tfds_source import download_and_prepare

    class Unreachable:
        def download_and_prepare(self):
            raise requests.ConnectionError(
                "HTTPSConnectionPool(host='www.cs.toronto.edu', port=443):"
                "\n Max retries exceeded")

    with pytest.raises(DataError) as error:
        download_and_prepare(Unreachable(), "cifar10")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "tfds dataset 'cifar10' could not be downloaded (ConnectionError: "
        "HTTPSConnectionPool(host='www.cs.toronto.edu'")
    assert "tfds build cifar10" in message and "--data-dir" in message


def test_an_offline_tfds_download_is_refused_before_any_connection(
        monkeypatch):
    from keras_vit.train.data.sources import DataError
    from keras_vit.train.data.tfds_source import download_and_prepare

    class Untouchable:
        def download_and_prepare(self):
            raise AssertionError("downloaded while offline")

    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    with pytest.raises(DataError, match="KERAS_VIT_OFFLINE=1 forbids "
                       "downloading it; prepare it where"):
        download_and_prepare(Untouchable(), "cifar10", "/data/tfds")


def test_tfds_retries_are_bounded_for_the_download_and_put_back():
    from tensorflow_datasets.core.download import downloader
    from keras_vit.train.data.tfds_source import download_and_prepare

    seen = []

    class Recording:
        def download_and_prepare(self):
            seen.append(downloader.MAX_RETRIES)

    before = downloader.MAX_RETRIES
    download_and_prepare(Recording(), "cifar10")
    assert seen == [min(before, 2)] and downloader.MAX_RETRIES == before


# ---------------------------------------------------------------------------
# More augmentation (the DeiT / AugReg recipes): off by default, exactly
# the plain pipeline then; stateless parts reproducible; mixed batches
# carry soft targets.
# ---------------------------------------------------------------------------


def _first(**options):
    images, labels = next(iter(kt.dataset(
        "digits", 16, 8, seed=1, epoch=0, prefetch=False, **options)))
    return images.numpy(), labels.numpy()


def test_augmentation_is_off_by_default_and_seeded():
    plain = _first()
    off = _first(randaugment=None, random_erasing=0.0, three_augment=False,
                 color_jitter=0.0, mixing=None)
    np.testing.assert_array_equal(plain[0], off[0])
    np.testing.assert_array_equal(plain[1], off[1])
    # 3-Augment, colour jitter, RandAugment and the mix are stateless: the
    # same epoch twice is the same batches; the crop and flip are those
    # drawn without them (the same images, so the labels mixed are the
    # plain ones).
    options = dict(three_augment=True, color_jitter=0.3,
                   randaugment=(2, 9, 0.5), mixing=_mixer())
    a, b = _first(**options), _first(**options)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.allclose(a[0], plain[0])
    assert a[1].shape == (8, 10)
    np.testing.assert_allclose(a[1].sum(axis=1), 1.0, atol=1e-6)
    top_two = np.sort(np.argsort(a[1], axis=1)[:, -2:], axis=1)
    pairs = np.sort(np.stack([plain[1], plain[1][::-1]], axis=1), axis=1)
    np.testing.assert_array_equal(top_two[pairs[:, 0] != pairs[:, 1]],
                                  pairs[pairs[:, 0] != pairs[:, 1]])
    # RandAugment and Keras' RandomErasing: in range, and doing something.
    images, labels = _first(randaugment=(2, 9), random_erasing=1.0)
    assert images.shape == (8, 16, 16, 3) and labels.shape == (8,)
    assert images.min() >= -1.0 and images.max() <= 1.0
    assert not np.allclose(images, plain[0])
