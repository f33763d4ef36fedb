"""Images an export runs: deterministic noise, crops of the sample photos
that ship with scikit-learn/scikit-image, and calibration images taken
from the user's data."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import numpy as np

from keras_vit.data.normalization import check_normalization, config_value

UNIT, PIXELS = "[-1, 1]", "[0, 255]"


def count(inputs):
    """How many images a batch of inputs holds: an array's rows, or a
    NaFlex batch's (a dict of arrays with one batch axis).

    >>> count(np.zeros((3, 4))), count({"patches": np.zeros((2, 5, 6))})
    (3, 2)
    """
    if isinstance(inputs, dict):
        return len(next(iter(inputs.values())))
    return len(inputs)


def rows(inputs, start, stop):
    """Images ``start`` to ``stop`` of a batch of inputs (an array, or a
    NaFlex batch: the same rows of each of its arrays).

    >>> rows({"patch_mask": np.arange(6).reshape(3, 2)}, 1, 3)
    {'patch_mask': array([[2, 3],
           [4, 5]])}
    """
    if isinstance(inputs, dict):
        return {name: value[start:stop] for name, value in inputs.items()}
    return inputs[start:stop]


def noise_images(shape, n, dtype, value_range, seed=0):
    """``n`` deterministic uniform random images of ``shape`` (H, W, C) in
    ``value_range`` (uint8: [0, 255]).

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
    """(name, RGB uint8 array) of the photos that ship with scikit-learn
    and scikit-image (if installed)."""
    photos = []
    # Any missing piece: try the next source.
    with contextlib.suppress(Exception):
        from sklearn.datasets import load_sample_images

        data = load_sample_images()
        photos += [(f"sklearn:{os.path.basename(name)}", np.asarray(img))
                   for name, img in zip(data.filenames, data.images)]
    with contextlib.suppress(Exception):
        import skimage.data

        from keras_vit.data import images

        folder = skimage.data.data_dir
        for name in ("astronaut.png", "chelsea.png", "coffee.png",
                     "hubble_deep_field.jpg", "ihc.png",
                     "motorcycle_left.png", "retina.jpg", "rocket.jpg"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                photos.append((f"skimage:{name}", images.read(path)))
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
    """``(images, description)``: ``n`` uint8 images of ``shape`` (H, W,
    3), random crops of the sample photos, resized and randomly flipped
    (upscaled scikit-learn digits when no photo is installed).

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
    normalised floats (``normalization``; None: the official [-1, 1])."""
    if np.dtype(dtype) == np.uint8:
        return pixels.astype(np.uint8)
    x = pixels.astype(np.float32)
    if value_range == UNIT:
        x = check_normalization("normalization", normalization)(x)
    return x.astype(dtype)


# The files a folder given as representative_data contributes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
# How far [0, 255] pixels may stray (a bicubic resize overshoots a little).
_PIXEL_SLACK = 2.0


class GivenImages(NamedTuple):
    """Images an artifact is verified on, in its input range, and the
    report's words for them."""

    images: np.ndarray
    note: str


def _first_images(element):
    """The images of one element of a dataset: an array, the first item
    of a tuple, or the "images" (or similar) entry of a dict."""
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


def _folder_files(folder):
    """The image files under ``folder`` (any depth), in sorted order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, name) for name in sorted(files)
                  if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES
                  and os.path.isfile(os.path.join(root, name))]
    return found


def _read_folder(folder, shape, count):
    """Up to ``count`` image files of ``folder`` (a random draw) as float32
    [0, 255] pixels of ``shape``, resized as ``zoo.preprocess_input``
    does."""
    text = os.fspath(folder)
    if not os.path.isdir(text):
        raise ValueError(
            f"representative_data={text!r} is not a folder (a path names a "
            "folder of image files, in class sub-folders or not)")
    paths = _folder_files(text)
    if not paths:
        raise ValueError(f"representative_data={text!r} holds no image files"
                         f" ({', '.join(IMAGE_SUFFIXES)})")
    if shape[-1] != 3:
        raise ValueError(f"representative_data={text!r}: image files are "
                         f"RGB; the model takes {shape[-1]} channels")
    if len(paths) > count:
        picked = np.random.default_rng(0).permutation(len(paths))[:count]
        paths = [paths[i] for i in picked]
    from keras_vit.data import images
    from keras_vit.zoo import preprocess_input

    out = np.empty((len(paths),) + tuple(shape), np.float32)
    for i, path in enumerate(paths):
        out[i] = preprocess_input(images.read(path), tuple(shape[:2]),
                                  scale=False)
    return out


def _collect(data, shape, count):
    """Up to ``count`` images of ``data`` (an array, an iterable or
    ``tf.data.Dataset`` of images, batches or ``(images, labels)`` pairs,
    or a callable returning one) as float32, and whether every element
    held integers (pixels)."""
    if callable(data) and not hasattr(data, "__iter__"):
        data = data()
    if hasattr(data, "as_numpy_iterator"):
        data = data.as_numpy_iterator()
    if isinstance(data, np.ndarray):
        data = [data]
    if not hasattr(data, "__iter__") or isinstance(data, (str, bytes)):
        raise ValueError(
            "representative_data must be a folder, an array, an iterable, a "
            "tf.data.Dataset or a callable returning one; received "
            f"representative_data={type(data).__name__}")
    chunks, total, integer = [], 0, True
    for element in data:
        x = np.asarray(_first_images(element))
        if x.ndim == len(shape):
            x = x[None]
        if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
            raise ValueError(
                "representative_data must yield images of shape "
                f"{tuple(shape)} (or batches of them); got an element of "
                f"shape {tuple(x.shape)}")
        if x.dtype.kind not in "iuf":
            raise ValueError("representative_data must hold numbers; got an "
                             f"element of dtype {x.dtype}")
        integer = integer and x.dtype.kind in "iu"
        chunks.append(x[:count - total].astype(np.float32))
        total += len(chunks[-1])
        if total >= count:
            break
    if not total:
        raise ValueError("representative_data yielded no images")
    return np.concatenate(chunks), integer


def _describe(normalization):
    value = config_value(normalization)
    return ("the official [-1, 1]" if value is None else
            f"mean {value['mean']}, std {value['std']}")


def _input_bounds(normalization, channels):
    """Per channel, the model inputs that [0, 255] pixels become."""
    ends = [np.asarray(normalization(np.full(channels, v, np.float32)),
                       np.float64) for v in (0.0, 255.0)]
    if any(e.size not in (1, channels) for e in ends):
        ends = [np.full(channels, f(np.concatenate(ends))) for f in
                (np.min, np.max)]
    low, high = (np.broadcast_to(e, (channels,)) for e in ends)
    return np.minimum(low, high), np.maximum(low, high)


def read_as_input(x, integer, graph, name="representative_data"):
    """``(images, reading)``: the user's images ``x`` (float32), given as
    the argument ``name``, as what ``graph``'s artifact takes (its dtype),
    and how they were read. Integers are [0, 255] pixels; floats within
    the model's input range (per channel) are model inputs; other floats
    within [0, 255] are pixels, normalised as the model says unless the
    artifact takes pixels."""
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds values that are not "
                         "finite (NaN or infinity)")
    low, high = float(x.min()), float(x.max())
    span = f"spans [{low:.4g}, {high:.4g}]"
    pixels = -_PIXEL_SLACK <= low and high <= 255 + _PIXEL_SLACK
    if graph.value_range == PIXELS:
        if not pixels or (not integer and high <= 1.0):
            raise ValueError(
                f"{name} {span}; the artifact takes [0, 255] "
                "pixels" + (" (images scaled to [0, 1]? multiply them by "
                            "255)" if pixels else ""))
        if np.dtype(graph.input_dtype) == np.uint8:
            x = np.clip(np.round(x), 0, 255).astype(np.uint8)
        return x, "[0, 255] pixels"
    normalization = graph.normalization
    bounds = _input_bounds(normalization, x.shape[-1])
    if not integer:
        axes = tuple(range(x.ndim - 1))
        slack = 0.02 * (bounds[1] - bounds[0])
        if (np.all(x.min(axis=axes) >= bounds[0] - slack)
                and np.all(x.max(axis=axes) <= bounds[1] + slack)):
            return x, ("the model's inputs (normalised as "
                       f"{_describe(normalization)}), taken as given")
    if pixels:
        return normalization(x).astype(np.float32), (
            "[0, 255] pixels, normalised as the model's input_normalization "
            f"({_describe(normalization)})")
    raise ValueError(
        f"{name} {span}: neither [0, 255] pixels nor the "
        f"model's inputs, which span [{bounds[0].min():.4g}, "
        f"{bounds[1].max():.4g}] ({_describe(normalization)}); give "
        "[0, 255] pixels or images normalised as the model's "
        "input_normalization")


def user_images(graph, data, limit, held_out=0):
    """The user's images for a full-int8 export of ``graph``:
    ``(calibration, note, reading, check)``. Up to ``limit`` images
    calibrate; ``check`` (:class:`GivenImages`) holds up to ``held_out``
    further images to verify on, else the calibration images. ``data`` is
    a folder of image files or images in any form of :func:`_collect`."""
    count = limit + held_out
    if isinstance(data, (str, os.PathLike)):
        x, integer = _read_folder(data, graph.input_shape, count), True
        source = f"of {os.fspath(data)}"
    else:
        x, integer = _collect(data, graph.input_shape, count)
        name = getattr(data, "name", None)  # --calibration-data names it
        source = (f"of {name}" if isinstance(name, str) and name
                  else "from representative_data")
    x, reading = read_as_input(x, integer, graph)
    x = x.astype(graph.input_dtype)
    calibration, rest = x[:limit], x[limit:]
    if len(rest):
        check = GivenImages(rest, f"{len(rest)} images {source} held out "
                                  f"from calibration ({reading})")
    else:
        check = GivenImages(calibration, (
            f"the {len(calibration)} calibration images {source} ({reading};"
            " none beyond them to hold out)"))
    return calibration, f"{len(calibration)} images {source}", reading, check


def check_counts(graph, **counts):
    """Refuses a count of images (by its argument's name) that alone
    would take more than half of this machine's available memory."""
    from keras_vit.models.memory import check_input_batch

    for name, count in counts.items():
        check_input_batch(count, graph.input_shape,
                          hint=f"lower {name}={count}")


def calibration_images(graph, data, limit):
    """``(images, note)``: up to ``limit`` calibration images for ``graph``
    (a ServingGraph) from ``data`` (see :func:`user_images`), or (None)
    crops of the sample photos."""
    if data is None:  # verification uses other crops (seed 1)
        return graph.sample_images(limit, seed=0, kind="photos")
    return user_images(graph, data, limit)[:2]


def int8_calibration(graph, data, limit, verify_data, held_out, options,
                     notes):
    """``(images, verify_data)`` of a full-int8 export of ``graph``: the
    calibration images and what it is verified on (``verify_data``, else
    the user's held-out images, else photos); recorded in ``options`` and
    ``notes``."""
    if getattr(graph, "naflex", False):
        raise ValueError(
            f"quantization='int8' calibrates on images of one size; model="
            f"{graph.source_model.name!r} takes NaFlex patches (naflex=True)"
            ": export it with quantization='dynamic_int8' (int8 weights, "
            "no calibration) or 'float16'")
    check_counts(graph, representative_samples=limit,
                 agreement_samples=held_out)
    if data is None:
        images, note = calibration_images(graph, None, limit)
        options["representative_data"] = note
        notes.append(
            f"no representative_data given: calibrated on {note}; pass the "
            "training pipeline's images for calibration that matches "
            "deployment")
        return images, "photos" if verify_data is None else verify_data
    images, note, reading, check = user_images(
        graph, data, limit, held_out if verify_data is None else 0)
    options["representative_data"] = note
    options["calibration_input"] = reading
    if verify_data is not None:
        return images, verify_data
    options["verify_data"] = check.note
    return images, check
