"""A serving signature that takes encoded images: what TF Serving and
Vertex AI clients send.

``serving_default(image_bytes)`` takes a 1-D batch of JPEG, PNG, GIF, BMP
or WebP files, decodes each with :func:`keras_vit.data.images.decode` (the
decoder ``keras-vit predict``, the Python API and the training pipeline
use, written in TensorFlow ops so that the SavedModel carries it: EXIF
orientation, palettes, alpha, 16-bit, a GIF's first frame and the pixel
budget), applies the package's evaluation transform
(:func:`keras_vit.zoo.preprocess_input`: bilinear resize to the model's
size without antialiasing or crop, then the model's own input
normalisation, :func:`keras_vit.data.normalization.of_model`, unless the
model normalises pixels itself) and returns the top-k ``labels``, their
softmax ``scores``, the ``classes`` and the ``logits``. A Python client
that reads the file with :func:`keras_vit.data.images.read` and calls
``zoo.preprocess_input(pixels, size, input_normalization=of_model(model))``
(``scale=False`` for a model that normalises itself), as ``keras-vit
predict`` does, sees the server's numbers.

The images of a batch are decoded one after another, each checked
against :data:`keras_vit.data.images.PIXEL_BUDGET` from its header before
anything is allocated, so a request's peak memory is that of its largest
image (at most the budget: 16 million pixels), not the sum.

An element the decoder refuses (empty, not one of those formats, over the
budget, ...) stops the call with ``tf.errors.InvalidArgumentError``
naming its index (``image_bytes[2] (7 bytes) is not a JPEG, PNG, GIF, BMP
or WebP file``); a file with a valid header and a damaged body fails in
the decoder with TensorFlow's own InvalidArgumentError. Either way the
call fails and the process (a TF Serving server) keeps serving.
"""

from __future__ import annotations

import io

import numpy as np

from keras_vit.data import images as image_decoder
from keras_vit.data.normalization import takes_raw_pixels
from keras_vit.export import samples
from keras_vit.export.graph import ServingGraph

INPUT_NAME = "image_bytes"
OUTPUTS = ("labels", "scores", "classes", "logits")
FORMATS = image_decoder.FORMATS
DEFAULT_TOP_K = 5
# Verification covers each format and the colour modes that decode
# differently (palette, alpha, greyscale) at sizes other than the model's.
_SAMPLE_KINDS = (("JPEG", "RGB"), ("PNG", "RGB"), ("BMP", "RGB"),
                 ("GIF", "RGB"), ("PNG", "RGBA"), ("JPEG", "L"),
                 ("PNG", "P"), ("WEBP", "RGB"))
SAMPLES = len(_SAMPLE_KINDS)


def check_top_k(top_k):
    """``top_k`` as an int, or ValueError naming it.

    >>> check_top_k(3)
    3
    >>> check_top_k(0)
    Traceback (most recent call last):
    ...
    ValueError: top_k must be a positive integer; received top_k=0
    """
    if (not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool)
            or top_k < 1):
        raise ValueError("top_k must be a positive integer; received "
                         f"top_k={top_k!r}")
    return int(top_k)


def _label_names(model, num_classes, labels):
    """``(source, [name, ...])``: the class names the signature returns."""
    from keras_vit.zoo import api
    from keras_vit.zoo.preprocessing import model_labels

    if labels is None:
        source, rows = model_labels(model, num_classes, by_head=False)
        if rows is None:
            return "class indices", [str(i) for i in range(num_classes)]
        return source, [str(name) for _, name in rows]
    if isinstance(labels, str):
        try:
            names = [str(name) for _, name in api.labels(labels)]
        except ValueError as e:  # it lists the known names
            raise ValueError(f"labels={labels!r} names no label list that "
                             f"ships with the package ({e})") from e
        source = labels
    elif isinstance(labels, (list, tuple)) and labels and all(
            isinstance(n, str) for n in labels):
        names, source = list(labels), "labels argument"
    else:
        raise ValueError("labels must be None (the model's own), a label "
                         "list name such as 'imagenet2012' or a list of "
                         f"class names; received labels={labels!r}"[:300])
    if len(names) != num_classes:
        shown = repr(labels) if isinstance(labels, str) else (
            f"a list of {len(names)} names")
        raise ValueError(f"labels has {len(names)} names but the model has "
                         f"{num_classes} classes; received labels={shown}")
    return source, names


def encode(pixels, fmt="PNG", mode="RGB", quality=90):
    """``pixels`` (H, W, 3) uint8 as the bytes of a ``fmt`` file (Pillow),
    converted to ``mode`` first (``"L"``, ``"RGBA"``, ``"P"``); GIFs are
    palette images.

    >>> encode(np.zeros((4, 6, 3), "uint8"))[:4]
    b'\\x89PNG'
    """
    from PIL import Image

    image = Image.fromarray(np.asarray(pixels, np.uint8))
    if fmt == "GIF" or mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE)
    elif mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    options = {"quality": quality} if fmt == "JPEG" else {}
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def decode(data):
    """The RGB pixels of one encoded image, as the signature decodes them
    (:func:`keras_vit.data.images.decode_bytes`: the same TensorFlow ops, run
    eagerly): (H, W, 3) uint8."""
    return image_decoder.decode_bytes(bytes(data), INPUT_NAME)


def as_batch(images):
    """A 1-D object array of ``bytes`` from a list of encoded images (or
    one), which ``tf.constant`` turns into a tf.string batch."""
    if isinstance(images, (bytes, bytearray)):
        images = [images]
    out = np.empty(len(images), dtype=object)
    for i, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, np.bytes_)):
            raise ValueError("image_bytes must hold encoded files as bytes; "
                             f"element {i} is a {type(data).__name__}")
        out[i] = bytes(data)
    return out


class ImageBytesGraph(ServingGraph):
    """The serving graph of ``to_saved_model(..., input="image_bytes")``:
    encoded files in, top-k labels, scores, classes and logits out.

    Args:
        model: a Keras classifier taking (batch, H, W, 3) images.
        top_k: how many classes to return (clipped to the class count).
        labels: None (the names the model's weights carry, else the class
            indices as strings), a label list name (``"imagenet2012"``) or
            a list of names.
        cast_to_float32: export a float32 copy of a bf16/fp16 model.
    """

    def __init__(self, model, top_k=DEFAULT_TOP_K, labels=None,
                 cast_to_float32=True):
        from keras_vit.models.features import is_classifier

        top_k = check_top_k(top_k)
        if not is_classifier(model):
            raise ValueError(
                "input='image_bytes' returns class labels and needs a "
                f"classification head; model={model.name!r} is a feature "
                "extractor (num_classes=0 or include_top=False): export its "
                "embedding with input='images'")
        super().__init__(model, ("logits",), uint8_input=False,
                         cast_to_float32=cast_to_float32,
                         allow_low_precision=True)
        if self.input_shape[-1] != 3:
            raise ValueError(
                f"input='image_bytes' decodes RGB images; model="
                f"{model.name!r} takes {self.input_shape[-1]} channels")
        # Encoded files are resized to one size (the model's): a
        # dynamic-size model's other sizes do not apply here.
        self.extra_image_sizes = ()
        self.num_classes = int(self.raw.output["logits"].shape[-1])
        self.top_k = min(top_k, self.num_classes)
        self.label_source, self.label_names = _label_names(
            self.source_model, self.num_classes, labels)
        self.image_size = tuple(int(s) for s in self.input_shape[:2])
        # Whether the signature normalises the pixels (as the model's own
        # normalisation says) or the model does it itself.
        self.scale = not takes_raw_pixels(self.model)
        self.outputs = OUTPUTS
        self.input_dtype = "string"
        self._bytes_args = {"top_k": self.top_k, "labels": labels,
                            "cast_to_float32": bool(cast_to_float32)}
        if self.top_k < top_k:
            self.notes.append(f"top_k={top_k} clipped to the model's "
                              f"{self.num_classes} classes")

    # ---------------------------------------------------------- serving

    def _pixels(self, data, index):
        """One encoded file -> (H, W, 3) float32 in the model's range
        (TensorFlow ops): the package's decoder, then the resize."""
        import tensorflow as tf

        pixels = image_decoder.decode(
            data, tf.strings.format(INPUT_NAME + "[{}]", index))
        # zoo.preprocess_input, op for op: bilinear without antialiasing
        # (the identity at the model's size), then the model's input
        # normalisation.
        x = tf.image.resize(tf.cast(pixels, tf.float32), self.image_size,
                            method="bilinear", antialias=False)
        if self.scale:
            x = self.normalization(x)
        return x

    def image_sizes(self):
        # Encoded files of any size are resized to the model's: the
        # artifact takes no images of a size to check.
        return None

    def refused_image_sizes(self):
        return ()

    def serve(self, image_bytes):
        """The signature's computation (TensorFlow): bytes -> dict."""
        import tensorflow as tf

        index = tf.range(tf.shape(image_bytes)[0])
        # One image at a time: the peak memory is the largest image's.
        x = tf.map_fn(
            lambda args: self._pixels(*args), (image_bytes, index),
            fn_output_signature=tf.TensorSpec(self.image_size + (3,),
                                              tf.float32),
            parallel_iterations=1)
        logits = tf.cast(self.raw(x, training=False)["logits"], tf.float32)
        scores, classes = tf.math.top_k(tf.nn.softmax(logits, axis=-1),
                                        k=self.top_k)
        return {"labels": tf.gather(tf.constant(self.label_names), classes),
                "scores": scores,
                "classes": tf.cast(classes, tf.int64),
                "logits": logits}

    def input_spec(self):
        """The signature's input; its name is the input's key (not the
        argument name of the traced function)."""
        import tensorflow as tf

        return tf.TensorSpec((None,), tf.string, name=INPUT_NAME)

    # ------------------------------------------------------------ numbers

    def preprocess(self, images):
        """Encoded files -> the model's input batch, in NumPy: the
        package's decoder run eagerly and
        :func:`keras_vit.zoo.preprocess_input`."""
        from keras_vit.zoo import preprocess_input

        return np.stack([preprocess_input(
            decode(data), self.image_size, scale=self.scale,
            input_normalization=self.normalization) for data in images])

    def reference(self, images, batch_size=8):
        """Keras' ``logits`` and top-k ``scores`` for encoded ``images``:
        decoded eagerly by :mod:`keras_vit.data.images` and preprocessed by
        ``zoo.preprocess_input`` on the user's backend, the path a Python
        user takes."""
        from keras_vit.runtime.backend import no_grad, to_numpy

        x = self.preprocess(images)
        parts = []
        with no_grad():
            for start in range(0, len(x), batch_size):
                parts.append(to_numpy(self.raw(x[start:start + batch_size],
                                               training=False)["logits"]))
        logits = np.concatenate(parts).astype(np.float32)
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
        # Sorted values: continuous in the inputs, unlike their indices.
        scores = -np.sort(-probs, axis=-1)[:, :self.top_k]
        return {"logits": logits, "scores": scores}

    def source_logits(self, images):
        return super().source_logits(self.preprocess(images))

    def sample_images(self, n, seed=0, kind="noise"):
        """``n`` encoded files in every format and colour mode, at sizes
        around the model's (one at its exact size): photo crops
        (``"photos"``) or uniform noise (``"noise"``)."""
        rng = np.random.default_rng(seed)
        height, width = self.image_size
        out, kinds = [], []
        for i in range(n):
            fmt, mode = _SAMPLE_KINDS[i % len(_SAMPLE_KINDS)]
            if i == 0:
                h, w = height, width
            else:
                h = int(rng.integers(max(1, height // 2), 2 * height + 1))
                w = int(rng.integers(max(1, width // 2), 2 * width + 1))
            if kind == "photos":
                pixels = samples.photo_images((h, w, 3), 1,
                                              seed=seed + i)[0][0]
            else:
                pixels = samples.noise_images((h, w, 3), 1, "uint8",
                                              samples.PIXELS, seed + i)[0]
            out.append(encode(pixels, fmt, mode))
            kinds.append(fmt if mode == "RGB" else f"{fmt}/{mode}")
        what = ("crops of the sample photos" if kind == "photos"
                else "uniform noise images")
        return as_batch(out), (
            f"{n} encoded {what} ({', '.join(dict.fromkeys(kinds))}) of "
            f"sizes around {height}x{width} (seed {seed})")

    def describe(self):
        height, width = self.image_size
        k = self.top_k
        return {
            "input": {"name": INPUT_NAME, "shape": [None], "dtype": "string",
                      "formats": list(FORMATS),
                      "preprocessing_inside": True,
                      "preprocessing": (
                          f"decode to RGB, bilinear resize to {height}x{width}"
                          " without antialiasing or crop"
                          + (", then (x / 255 - mean) / std with mean "
                             f"{list(self.normalization.mean)} and std "
                             f"{list(self.normalization.std)}"
                             if self.scale else ""))},
            "outputs": {"labels": [None, k], "scores": [None, k],
                        "classes": [None, k],
                        "logits": [None, self.num_classes]},
            "top_k": k,
            "labels": self.label_source,
        }

    def class_names(self):
        """The names the ``labels`` output returns, unless they are the
        class indices (then the model names no classes)."""
        if self.label_source == "class indices":
            return None, None
        return self.label_source, list(self.label_names)

    def rebuild_args(self):
        return dict(self._bytes_args, input=INPUT_NAME)
