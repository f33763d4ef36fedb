"""Images an export runs: deterministic noise, crops of the sample photos
that ship with scikit-learn/scikit-image, and calibration images taken
from the user's data."""

from __future__ import annotations

import functools
import os

import numpy as np

from keras_vit.data.normalization import check_normalization

# The two input ranges a model can take (keras_vit models see [-1, 1]
# unless built with include_preprocessing=True).
UNIT, PIXELS = "[-1, 1]", "[0, 255]"


def noise_images(shape, n, dtype, value_range, seed=0):
    """``n`` deterministic random images of ``shape`` (H, W, C).

    Float images are uniform in [-1, 1] or [0, 255] (``value_range`` UNIT or
    PIXELS); uint8 images uniform in [0, 255].

    >>> noise_images((4, 4, 3), 2, "uint8", PIXELS).shape
    (2, 4, 4, 3)
    """
    rng = np.random.default_rng(seed)
    size = (n,) + tuple(shape)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, size, dtype=np.uint8)
    low, high = (-1.0, 1.0) if value_range == UNIT else (0.0, 255.0)
    return rng.uniform(low, high, size).astype(dtype)


@functools.lru_cache(maxsize=1)
def _photo_sources():
    """(name, RGB uint8 array) of the photos that ship with installed
    packages: scikit-learn's two sample images (always there) and the
    colour photos of scikit-image's data folder (if installed)."""
    photos = []
    try:
        from sklearn.datasets import load_sample_images

        data = load_sample_images()
        photos += [(f"sklearn:{os.path.basename(name)}", np.asarray(img))
                   for name, img in zip(data.filenames, data.images)]
    except Exception:  # noqa: BLE001 - any missing piece: try the next source
        pass
    try:
        import skimage.data

        from keras_vit.data import images

        folder = skimage.data.data_dir
        for name in ("astronaut.png", "chelsea.png", "coffee.png",
                     "hubble_deep_field.jpg", "ihc.png",
                     "motorcycle_left.png", "retina.jpg", "rocket.jpg"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                photos.append((f"skimage:{name}", images.read(path)))
    except Exception:  # noqa: BLE001
        pass
    return tuple(photos)


def _digit_sources():
    from sklearn.datasets import load_digits

    digits = load_digits().images[:64]  # 8x8, values 0..16
    pixels = (digits * (255.0 / 16.0)).astype(np.uint8)
    return [(f"sklearn:digits[{i}]", np.repeat(img[..., None], 3, -1))
            for i, img in enumerate(pixels)]


def _resize(image, height, width):
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize(
        (width, height), Image.BILINEAR))


def photo_images(shape, n, seed=0):
    """``n`` real-looking uint8 images of ``shape`` (H, W, 3): random crops
    (a quarter to all of the area) of the sample photos that ship with
    scikit-learn and scikit-image, resized and randomly flipped. Returns
    ``(images, description)``; falls back to upscaled scikit-learn digits
    when no photo is installed.

    >>> images, note = photo_images((32, 32, 3), 4, seed=1)
    >>> images.shape, images.dtype.name
    ((4, 32, 32, 3), 'uint8')
    """
    height, width, channels = shape
    sources = _photo_sources()
    what = "random crops of the sample photos of scikit-learn/scikit-image"
    if not sources:
        sources = _digit_sources()
        what = "upscaled scikit-learn digits (no sample photo installed)"
    rng = np.random.default_rng(seed)
    out = np.empty((n, height, width, channels), np.uint8)
    for i in range(n):
        _, photo = sources[int(rng.integers(len(sources)))]
        h, w = photo.shape[:2]
        area = rng.uniform(0.25, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(h, max(8, round((area / aspect) ** 0.5))))
        cw = int(min(w, max(8, round((area * aspect) ** 0.5))))
        top = int(rng.integers(h - ch + 1))
        left = int(rng.integers(w - cw + 1))
        crop = _resize(np.ascontiguousarray(
            photo[top:top + ch, left:left + cw]), height, width)
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        if channels != 3:
            crop = np.repeat(crop.mean(-1, keepdims=True), channels, -1)
        out[i] = crop
    return out, f"{n} {what}"


def to_input_range(pixels, dtype, value_range, normalization=None):
    """uint8 pixels -> what an artifact takes: uint8, [0, 255] or
    normalised floats (``normalization``, the model's input normalisation;
    None: the official [-1, 1], (x - 127.5) / 127.5)."""
    if np.dtype(dtype) == np.uint8:
        return pixels.astype(np.uint8)
    x = pixels.astype(np.float32)
    if value_range == UNIT:
        x = check_normalization("normalization", normalization)(x)
    return x.astype(dtype)



def _first_images(element):
    """The images of one element of a dataset: an array, or the first item
    of an (images, labels) tuple, or the "images"/"image" entry of a dict."""
    if isinstance(element, dict):
        for key in ("images", "image", "pixels", "inputs", "x"):
            if key in element:
                return element[key]
        raise ValueError(
            "representative_data yields dicts without an 'images' or 'image' "
            f"key; keys: {sorted(element)}")
    if isinstance(element, (tuple, list)):
        if not element:
            raise ValueError("representative_data yields empty tuples")
        return element[0]
    return element


def representative_images(data, shape, dtype, value_range, limit):
    """Up to ``limit`` images from ``data`` as an (n, H, W, C) array.

    ``data`` is an array of images, an iterable or ``tf.data.Dataset``
    yielding images, batches of images, or ``(images, labels)`` pairs (what a
    training pipeline yields), or a callable returning such an iterable.
    Images must already be in the range the exported artifact takes; a
    float pipeline in [0, 255] for an artifact that takes [-1, 1] is caught.
    """
    if callable(data) and not hasattr(data, "__iter__"):
        data = data()
    if hasattr(data, "as_numpy_iterator"):
        data = data.as_numpy_iterator()
    if isinstance(data, np.ndarray):
        data = [data]
    if not hasattr(data, "__iter__"):
        raise ValueError(
            "representative_data must be an array, an iterable, a tf.data."
            f"Dataset or a callable returning one; received "
            f"representative_data={type(data).__name__}")
    chunks, count = [], 0
    for element in data:
        x = np.asarray(_first_images(element))
        if x.ndim == len(shape):
            x = x[None]
        if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
            raise ValueError(
                "representative_data must yield images of shape "
                f"{tuple(shape)} (or batches of them); got an element of "
                f"shape {tuple(x.shape)}")
        chunks.append(x[:limit - count])
        count += len(chunks[-1])
        if count >= limit:
            break
    if not count:
        raise ValueError("representative_data yielded no images")
    images = np.concatenate(chunks)
    if np.dtype(dtype) != np.uint8 and value_range == UNIT:
        low, high = float(images.min()), float(images.max())
        if high > 1.5 or low < -1.5:
            raise ValueError(
                "representative_data must be in the artifact's input range "
                f"{UNIT}; its images span [{low:.3g}, {high:.3g}] (pixels? "
                "scale them with (x - 127.5) / 127.5, or export with "
                "uint8_input=True)")
    return images.astype(dtype, copy=False)


def calibration_images(graph, data, limit):
    """``(images, note)``: up to ``limit`` calibration images for ``graph``
    (a ServingGraph) from ``data``, or (None) crops of the sample photos."""
    if data is None:
        # Seed 0 for calibration; verification uses other crops (seed 1).
        return graph.sample_images(limit, seed=0, kind="photos")
    images = representative_images(
        data, graph.input_shape, graph.input_dtype, graph.value_range, limit)
    # Data that names itself (the command line's --calibration-data) is
    # recorded by name.
    name = getattr(data, "name", None)
    if isinstance(name, str) and name:
        return images, f"{len(images)} images of {name}"
    return images, f"{len(images)} images from representative_data"
