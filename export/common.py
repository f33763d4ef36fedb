"""Pieces every exporter shares: destinations written atomically, peak
memory, sample images, the comparison with Keras and the JSON report.

Nothing here imports TensorFlow at module level, so the command line can
validate its arguments before paying for that import.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid

import numpy as np

from keras_vit import atomic

FORMATS = ("saved_model", "tflite", "onnx")
# What a path of each format must end with (a SavedModel is a directory).
EXTENSIONS = {"tflite": ".tflite", "onnx": ".onnx"}
_FILE_EXTENSIONS = (".tflite", ".onnx", ".keras", ".h5", ".pb", ".json",
                    ".npz", ".zip")
REPORT_SUFFIX = ".report.json"
SAVED_MODEL_REPORT = "export_report.json"
# The two input ranges a model can take (keras_vit models see [-1, 1]
# unless built with include_preprocessing=True).
UNIT, PIXELS = "[-1, 1]", "[0, 255]"


class ExportError(RuntimeError):
    """The export could not produce an artifact that runs and matches Keras.

    Raised when conversion fails, when the artifact's outputs are outside the
    tolerance of its format (``error.report`` holds the measurements), or
    when the destination cannot be written. Nothing that looks finished is
    left behind.
    """

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def check_format(format):
    """Returns ``format`` normalised (``"SavedModel"`` -> ``"saved_model"``)
    or raises ValueError naming the argument.

    >>> check_format("TFLite")
    'tflite'
    """
    value = str(format).lower().replace("-", "_")
    value = {"savedmodel": "saved_model", "tf_saved_model": "saved_model",
             "litert": "tflite"}.get(value, value)
    if value not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}; received "
                         f"format={format!r}")
    return value


def require_installed(module, purpose):
    """Raises MissingDependencyError (the package's name and the pip
    command) unless ``module`` can be imported; does not import it (tf2onnx
    imports TensorFlow, which a JAX or PyTorch process leaves to its
    converter process).

    >>> require_installed("json", "this example")
    """
    import importlib.util

    from keras_vit.errors import PACKAGES, MissingDependencyError

    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise MissingDependencyError(PACKAGES.get(top, top), purpose)


def check_path(path, format):
    """The absolute destination for ``format``; raises ValueError for a
    wrong extension.

    >>> check_path("/tmp/vit.onnx", "onnx")
    '/tmp/vit.onnx'
    >>> check_path("/tmp/vit.onnx", "tflite")
    Traceback (most recent call last):
    ...
    ValueError: format 'tflite' needs a path ending with .tflite; ...
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"path must be a file or directory name; received "
                         f"path={path!r}")
    text = os.fspath(path)
    full = os.path.abspath(text)
    if format in EXTENSIONS:
        if not full.lower().endswith(EXTENSIONS[format]):
            raise ValueError(
                f"format {format!r} needs a path ending with "
                f"{EXTENSIONS[format]}; received path={text!r}")
    elif full.lower().endswith(_FILE_EXTENSIONS):
        raise ValueError(
            "a SavedModel is a directory; its path must not end with a file "
            f"extension; received path={text!r}")
    return full


class Staging:
    """A hidden directory next to the destination where an export is built.

    Everything is written and verified here first; :meth:`commit_files` /
    :meth:`commit_dir` then move it into place with ``os.replace``, the
    main artifact last. Leaving the
    ``with`` block without a commit (an error, Ctrl-C) removes the
    directory, so a failed export leaves nothing that looks finished; a
    killed process leaves only the hidden ``.NAME.partial-*`` directory.
    """

    def __init__(self, dest, directory=False, overwrite=True):
        self.dest = dest
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else (
                "does not exist")
            raise ExportError(f"cannot write {dest!r}: the directory "
                              f"{parent!r} {what}")
        if os.path.lexists(dest):
            if not overwrite:
                raise ExportError(f"{dest!r} exists; pass overwrite=True to "
                                  "replace it")
            if os.path.isdir(dest) != directory:
                kind = "directory" if os.path.isdir(dest) else "file"
                raise ExportError(f"{dest!r} is a {kind}; this export cannot "
                                  "replace it")
            if directory and os.listdir(dest) and not os.path.exists(
                    os.path.join(dest, "saved_model.pb")):
                # Replacing a directory deletes it: only ever an old export.
                raise ExportError(
                    f"{dest!r} is a directory that is not empty and holds "
                    "no SavedModel; refusing to replace it")
        try:
            self.path = tempfile.mkdtemp(
                prefix=f".{os.path.basename(dest)}.partial-", dir=parent)
        except OSError as e:
            raise ExportError(f"cannot write to the directory of {dest!r}: "
                              f"{e.strerror or e}") from e
        self.committed = False

    def file(self, name):
        return os.path.join(self.path, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)
        return False

    def commit_files(self, moves, stale=()):
        """Moves ``[(staged_name, final_path), ...]`` into place in order.

        The last entry is the artifact: an old one at that path is removed
        first (then the ``stale`` files of the old export), so that between
        the moves no finished-looking artifact pairs with data files from
        another export.
        """
        main = moves[-1][1]
        for old in [main] + list(stale):
            if os.path.lexists(old):
                os.remove(old)
        for name, final in moves:
            os.replace(self.file(name), final)
        self.committed = True

    def commit_dir(self, name):
        """Moves the staged directory ``name`` to the destination, swapping
        out an existing one."""
        old = None
        if os.path.lexists(self.dest):
            old = f"{self.path}.old-{uuid.uuid4().hex[:8]}"
            os.replace(self.dest, old)
        os.replace(self.file(name), self.dest)
        self.committed = True
        if old:
            shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------
# memory


def current_rss():
    """Resident memory of this process in bytes (0 if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class PeakRSS:
    """Samples this process's resident memory in a thread (every 10 ms).

    A sampler, not the kernel's high-water mark, so that a peak measured
    around one export is not that of an earlier one in the same process.
    Children report their own peaks through :meth:`add_child`.

    >>> with PeakRSS() as rss:
    ...     block = bytearray(64 * 2**20)
    >>> rss.peak >= 64 * 2**20
    True
    """

    def __init__(self, interval=0.01):
        self.interval = interval
        self.peak = 0
        self.child_peak = 0
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, current_rss())

    def __enter__(self):
        self.peak = current_rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss())
        return False

    def sample(self):
        self.peak = max(self.peak, current_rss())
        return self.peak

    def add_child(self, peak_bytes):
        self.child_peak = max(self.child_peak, int(peak_bytes or 0))


def mib(nbytes):
    return round(nbytes / 2**20, 1)


def path_size(path):
    """Bytes of a file, or of all files under a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f))
                   for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


# --------------------------------------------------------------------------
# sample images


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
        from PIL import Image

        folder = skimage.data.data_dir
        for name in ("astronaut.png", "chelsea.png", "coffee.png",
                     "hubble_deep_field.jpg", "ihc.png",
                     "motorcycle_left.png", "retina.jpg", "rocket.jpg"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with Image.open(path) as im:
                    photos.append((f"skimage:{name}",
                                   np.asarray(im.convert("RGB"))))
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


def to_input_range(pixels, dtype, value_range):
    """uint8 pixels -> what an artifact takes: uint8, [0, 255] or [-1, 1]
    floats (the official ViT scaling (x - 127.5) / 127.5)."""
    if np.dtype(dtype) == np.uint8:
        return pixels.astype(np.uint8)
    x = pixels.astype(np.float32)
    if value_range == UNIT:
        x = x * np.float32(1 / 127.5) - np.float32(1.0)
    return x.astype(dtype)


# --------------------------------------------------------------------------
# representative data for calibration


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


QUANTIZATIONS = ("float32", "float16", "dynamic_int8", "int8")
DEFAULT_REPRESENTATIVE_SAMPLES = 100


def check_quantization(quantization, representative_data,
                       representative_samples):
    """Validates the quantization arguments every exporter takes; returns
    the number of calibration images (default 100).

    >>> check_quantization("int8", None, None)
    100
    >>> check_quantization("int4", None, None)
    Traceback (most recent call last):
    ...
    ValueError: quantization must be one of ('float32', 'float16', \
'dynamic_int8', 'int8'); received quantization='int4'
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}; "
                         f"received quantization={quantization!r}")
    if representative_samples is None:
        representative_samples = DEFAULT_REPRESENTATIVE_SAMPLES
    if (not isinstance(representative_samples, int)
            or isinstance(representative_samples, bool)
            or representative_samples < 1):
        raise ValueError("representative_samples must be a positive integer;"
                         f" received representative_samples="
                         f"{representative_samples!r}")
    if representative_data is not None and quantization != "int8":
        raise ValueError(
            "representative_data is only used with quantization='int8'; "
            f"received quantization={quantization!r}")
    return representative_samples


def calibration_images(graph, data, limit):
    """``(images, note)``: up to ``limit`` calibration images for ``graph``
    (a ServingGraph) from ``data``, or (None) crops of the sample photos."""
    if data is None:
        # Seed 0 for calibration; verification uses other crops (seed 1).
        return graph.sample_images(limit, seed=0, kind="photos")
    images = representative_images(
        data, graph.input_shape, graph.input_dtype, graph.value_range, limit)
    return images, f"{len(images)} images from representative_data"


# --------------------------------------------------------------------------
# comparison and tolerance

# Per format/variant: the largest max-abs difference allowed, as a fraction
# of max(1, max|Keras output|), the smallest top-1 agreement and the largest
# relative RMS error. None: not a criterion (for float formats the max-abs
# bound already implies that any top-1 flip is a near-tie).
TOLERANCES = {
    "saved_model": {"max_abs_diff": 1e-4, "top1_agreement": None,
                    "rel_rms_error": None},
    "onnx": {"max_abs_diff": 5e-4, "top1_agreement": None,
             "rel_rms_error": None},
    "tflite/float32": {"max_abs_diff": 5e-4, "top1_agreement": None,
                       "rel_rms_error": None},
    "tflite/float16": {"max_abs_diff": 5e-2, "top1_agreement": None,
                       "rel_rms_error": 0.05},
    "tflite/dynamic_int8": {"max_abs_diff": None, "top1_agreement": 0.9,
                            "rel_rms_error": 0.25},
    # Measured: trained ViTs agree 0.95-0.996 in full int8; tiny random
    # ones 0.78-1.0 (FACTS: 0.88). A broken artifact agrees at chance and
    # has a relative RMS error near or above 1.
    "tflite/int8": {"max_abs_diff": None, "top1_agreement": 0.8,
                    "rel_rms_error": 0.5},
    # The ONNX variants take the TFLite ones' bounds: the same weights in
    # the same precisions (float16 weights; int8 weights with float or
    # calibrated int8 activations).
    "onnx/float16": {"max_abs_diff": 5e-2, "top1_agreement": None,
                     "rel_rms_error": 0.05},
    "onnx/dynamic_int8": {"max_abs_diff": None, "top1_agreement": 0.9,
                          "rel_rms_error": 0.25},
    "onnx/int8": {"max_abs_diff": None, "top1_agreement": 0.8,
                  "rel_rms_error": 0.5},
}


def tolerance_for(kind, override=None):
    """The tolerance of ``kind`` (a key of TOLERANCES) with ``override``
    (a dict with some of the same keys) applied."""
    tol = dict(TOLERANCES[kind])
    if override is not None:
        if not isinstance(override, dict) or set(override) - set(tol):
            raise ValueError(
                f"tolerance must be a dict with keys from {sorted(tol)}; "
                f"received tolerance={override!r}")
        tol.update(override)
    return tol


def top1_source(names):
    for name in ("logits", "probabilities"):
        if name in names:
            return name
    return None


def compare(reference, actual, tol):
    """Measures ``actual`` against ``reference`` (dicts of arrays with the
    same keys and row counts) and checks ``tol``.

    Returns ``(metrics, failures)``: per-output max abs difference, scale
    and relative RMS error; top-1 agreement when a logits or probabilities
    output exists; and the list of violated criteria (empty when it passes).
    """
    metrics = {"max_abs_diff": {}, "scale": {}, "rel_rms_error": {},
               "limits": {}}
    failures = []
    for name, ref in reference.items():
        if name not in actual:
            failures.append(f"output {name!r} is missing (artifact returned "
                            f"{sorted(actual)})")
            continue
        ref = np.asarray(ref, np.float64)
        got = np.asarray(actual[name], np.float64)
        if got.shape != ref.shape:
            failures.append(f"output {name!r} has shape {got.shape}, "
                            f"Keras {ref.shape}")
            continue
        if not np.all(np.isfinite(got)):
            failures.append(f"output {name!r} has non-finite values")
            diff = float("inf")
            rel = float("inf")
        else:
            diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
            rms_ref = float(np.sqrt(np.mean(ref ** 2))) if ref.size else 0.0
            rms_err = float(np.sqrt(np.mean((got - ref) ** 2))) if ref.size \
                else 0.0
            rel = rms_err / rms_ref if rms_ref > 0 else rms_err
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        metrics["max_abs_diff"][name] = diff
        metrics["scale"][name] = scale
        metrics["rel_rms_error"][name] = rel
        if tol.get("max_abs_diff") is not None:
            limit = tol["max_abs_diff"] * max(1.0, scale)
            metrics["limits"][name] = limit
            if not diff <= limit:
                failures.append(f"{name}: max abs difference {diff:.3g} > "
                                f"{limit:.3g}")
        if tol.get("rel_rms_error") is not None and not (
                rel <= tol["rel_rms_error"]):
            failures.append(f"{name}: relative RMS error {rel:.3g} > "
                            f"{tol['rel_rms_error']}")
    source = top1_source(reference)
    agreement = None
    if source is not None and source in actual and np.shape(
            actual[source]) == np.shape(reference[source]):
        ref_top = np.argmax(reference[source], axis=-1)
        got_top = np.argmax(actual[source], axis=-1)
        agreement = float(np.mean(ref_top == got_top))
        if tol.get("top1_agreement") is not None and (
                agreement < tol["top1_agreement"]):
            failures.append(f"top-1 agreement {agreement:.3f} < "
                            f"{tol['top1_agreement']}")
    metrics["top1_agreement"] = agreement
    return metrics, failures


# --------------------------------------------------------------------------
# reports


def versions():
    """Versions of the libraries an artifact depends on (None if absent)."""
    import importlib.metadata as md

    out = {}
    for dist in ("keras-vit", "tensorflow", "keras", "tf2onnx", "onnx",
                 "onnxruntime", "ai-edge-litert", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if np.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def write_json(path, data):
    """Writes ``data`` as JSON through a temporary file and a rename."""
    atomic.write_json(path, _jsonable(data))


def read_report(path):
    """The report of an artifact: ``path`` may be the artifact itself (a
    ``.tflite``/``.onnx`` file or a SavedModel directory) or the report."""
    if os.path.isdir(path):
        path = os.path.join(path, SAVED_MODEL_REPORT)
    elif not path.endswith(".json"):
        path = path + REPORT_SUFFIX
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def timer(store, key):
    start = time.perf_counter()
    try:
        yield
    finally:
        store[key] = round(time.perf_counter() - start, 3)
