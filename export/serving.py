"""A serving signature that takes encoded images: what TF Serving and
Vertex AI clients send.

``serving_default(image_bytes)`` takes a 1-D batch of JPEG, PNG, GIF, BMP
or WebP files, decodes each with :func:`keras_vit.data.images.decode`,
applies :func:`keras_vit.zoo.preprocess_input` (bilinear resize to the
model's size without antialiasing or crop, then the model's own input
normalisation) and returns the top-k ``labels``, their ``scores``
(softmax of the logits, or the model's own output where its
``classifier_activation`` is softmax or sigmoid), the ``classes`` and the
``logits`` (the model's own output): what a Python client calling those
two functions sees.

The images of a batch are decoded one after another, so a request's peak
memory is that of its largest image (at most
:data:`keras_vit.data.images.PIXEL_BUDGET`), not the sum.

An element the decoder refuses, or a file TensorFlow's decoder fails on,
stops the call with ``tf.errors.InvalidArgumentError`` naming its index
(``image_bytes[1] (1258 bytes) is a damaged PNG that the TensorFlow
decoder cannot read``: no apostrophe, TensorFlow's assertion escapes it);
the process (a TF Serving server) keeps serving.

A model without a classification head serves its embedding (one output
named by :func:`keras_vit.export.graph.default_outputs`).
"""

from __future__ import annotations

import io

import numpy as np

from keras_vit.base.checks import check_int
from keras_vit.data import images as image_decoder
from keras_vit.data.normalization import takes_raw_pixels
from keras_vit.export import samples
from keras_vit.export.graph import ServingGraph, check_head, default_outputs
from keras_vit.runtime.backend import no_grad, to_numpy

INPUT_NAME = "image_bytes"
OUTPUTS = ("labels", "scores", "classes", "logits")
FORMATS = image_decoder.FORMATS
DEFAULT_TOP_K = 5
# Each format, and the colour modes that decode differently.
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
    return check_int("top_k", top_k, low=1)


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
    converted to ``mode`` first (GIFs are palette images).

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


def decode(data, index=0):
    """The (H, W, 3) uint8 pixels of one encoded image, as the signature
    decodes them; raises :class:`~keras_vit.data.images.ImageError` naming
    ``image_bytes[index]``, as the signature does.

    >>> decode(b"GIF89a", 2)
    Traceback (most recent call last):
    ...
    keras_vit.data.images.ImageError: image_bytes[2] is a 0x0 GIF, \
with no pixels
    """
    return image_decoder.decode_bytes(bytes(data), f"{INPUT_NAME}[{index}]")


def as_batch(images):
    """A 1-D object array of ``bytes`` from encoded images (a list, or one).

    >>> as_batch([b"a", 1])
    Traceback (most recent call last):
    ...
    ValueError: image_bytes[1] must be the bytes of an encoded file; \
received int
    """
    if isinstance(images, (bytes, bytearray)):
        images = [images]
    out = np.empty(len(images), dtype=object)
    for i, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, np.bytes_)):
            raise ValueError(f"{INPUT_NAME}[{i}] must be the bytes of an "
                             f"encoded file; received {type(data).__name__}")
        out[i] = bytes(data)
    return out


class ImageBytesGraph(ServingGraph):
    """The serving graph of ``to_saved_model(..., input="image_bytes")``.

    Args:
        model: a Keras model taking (batch, H, W, 3) images.
        top_k, labels: as for :func:`~keras_vit.export.to_saved_model`
            (a classifier's options only).
        cast_to_float32: export a float32 copy of a bf16/fp16 model.
    """

    def __init__(self, model, top_k=DEFAULT_TOP_K, labels=None,
                 cast_to_float32=True):
        from keras_vit.models.features import is_classifier, why_features

        top_k = check_top_k(top_k)
        self.classifier = is_classifier(model)
        if self.classifier:
            check_head(model, ("scores",), what="input='image_bytes' returns")
        outputs = ("logits",) if self.classifier else default_outputs(model)
        if not self.classifier and (top_k != DEFAULT_TOP_K
                                    or labels is not None):
            raise ValueError(
                "top_k and labels rank classes; model="
                f"{model.name!r} is a feature extractor ({why_features(model)}) "
                f"whose signature returns its embedding "
                f"{outputs[0]!r}; received top_k={top_k!r}, "
                f"labels={labels!r}"[:300])
        super().__init__(model, outputs, uint8_input=False,
                         cast_to_float32=cast_to_float32,
                         allow_low_precision=True)
        if self.input_shape[-1] != 3:
            raise ValueError(
                f"input='image_bytes' decodes RGB images; model="
                f"{model.name!r} takes {self.input_shape[-1]} channels")
        self.extra_image_sizes = ()  # files are resized to the model's
        self.image_size = tuple(int(s) for s in self.input_shape[:2])
        self.scale = not takes_raw_pixels(self.model)
        self.input_dtype = "string"
        self._bytes_args = {"top_k": top_k, "labels": labels,
                            "cast_to_float32": bool(cast_to_float32)}
        if not self.classifier:
            self.top_k = self.num_classes = None
            self.label_source = self.label_names = None
            return
        self.outputs = OUTPUTS
        self.num_classes = int(self.raw.output["logits"].shape[-1])
        self.top_k = min(top_k, self.num_classes)
        self._bytes_args["top_k"] = self.top_k
        self.label_source, self.label_names = _label_names(
            self.source_model, self.num_classes, labels)
        if self.top_k < top_k:
            self.notes.append(f"top_k={top_k} clipped to the model's "
                              f"{self.num_classes} classes")

    def _model_input(self, pixels):
        """Decoded (H, W, 3) uint8 pixels -> the model's (h, w, 3) float32
        input, as :func:`keras_vit.zoo.preprocess_input` computes it."""
        import tensorflow as tf

        x = tf.image.resize(tf.cast(pixels, tf.float32), self.image_size,
                            method="bilinear", antialias=False)
        if self.scale:
            x = self.normalization(x)
        return x

    def _one(self, data, index):
        """``(input, reason, index)`` of one encoded file; a refusal gives
        zeros and its ``reason``."""
        import tensorflow as tf

        pixels, _, reason = image_decoder.decode_or_refuse(data)
        x = tf.cond(tf.equal(reason, ""), lambda: self._model_input(pixels),
                    lambda: tf.zeros(self.image_size + (3,), tf.float32))
        return x, reason, index

    def inputs(self, image_bytes):
        """The model's input batch for a 1-D batch of encoded files
        (TensorFlow ops). The first element refused or damaged fails the
        call naming it.

        A graph cannot catch an op's error, and TensorFlow's decoders fail
        with one that names no element: ``ignore_errors`` of a ``tf.data``
        map survives it, and the element it drops is the damaged one."""
        import tensorflow as tf

        count = tf.shape(image_bytes, out_type=tf.int64)[0]
        index = tf.range(count)
        shape = self.image_size + (3,)
        kept = tf.data.Dataset.from_tensor_slices((image_bytes, index)).map(
            self._one).ignore_errors().batch(tf.maximum(count, 1))
        none = tf.data.Dataset.from_tensors((
            tf.zeros((0,) + shape, tf.float32), tf.zeros((0,), tf.string),
            tf.zeros((0,), tf.int64)))  # every element dropped, or none
        x, reasons, kept_index = kept.concatenate(none).take(
            1).get_single_element()
        n = tf.shape(kept_index, out_type=tf.int64)[0]
        positions = tf.range(n)
        # The first position whose kept index is not its own is the first
        # dropped element.
        dropped = tf.reduce_min(tf.concat([tf.boolean_mask(
            positions, tf.not_equal(kept_index, positions)), [n]], 0))
        refused_at = tf.reduce_min(tf.concat([tf.boolean_mask(
            positions, tf.not_equal(reasons, "")), [n]], 0))
        refused = tf.gather(tf.concat([kept_index, [count]], 0), refused_at)
        first = tf.minimum(dropped, refused)  # count when none is
        data = tf.gather(tf.concat([image_bytes, [""]], 0), first)
        damaged = tf.strings.join([tf.strings.format(
            " ({} bytes) is a damaged ", tf.strings.length(data)),
            image_decoder.format_name(data),
            " that the TensorFlow decoder cannot read"])
        reason = tf.gather(tf.concat([reasons, [""]], 0), refused_at)
        message = tf.strings.join([
            tf.strings.format(INPUT_NAME + "[{}]", first),
            tf.where(first < refused, damaged, " " + reason)])
        check = tf.debugging.Assert(first >= count, [message], summarize=1)
        with tf.control_dependencies([check]):
            return tf.ensure_shape(tf.identity(x), (None,) + shape)

    def image_sizes(self):
        return None  # files of any size are resized to the model's

    def serve(self, image_bytes):
        """The signature's computation (TensorFlow): bytes -> dict."""
        import tensorflow as tf

        raw = self.raw(self.inputs(image_bytes), training=False)
        if not self.classifier:
            return {name: tf.cast(raw[name], tf.float32)
                    for name in self.outputs}
        logits = tf.cast(raw["logits"], tf.float32)
        probabilities = (logits if self.own_probabilities
                         else tf.nn.softmax(logits, axis=-1))
        scores, classes = tf.math.top_k(probabilities, k=self.top_k)
        return {"labels": tf.gather(tf.constant(self.label_names), classes),
                "scores": scores,
                "classes": tf.cast(classes, tf.int64),
                "logits": logits}

    def input_spec(self):
        """The signature's input; its name is the input's key."""
        import tensorflow as tf

        return tf.TensorSpec((None,), tf.string, name=INPUT_NAME)

    def preprocess(self, images):
        """Encoded files -> the model's input batch, in NumPy."""
        from keras_vit.zoo import preprocess_input

        return np.stack([preprocess_input(
            decode(data, i), self.image_size, scale=self.scale,
            input_normalization=self.normalization)
            for i, data in enumerate(images)])

    def reference(self, images, batch_size=8):
        """Keras' ``logits`` and top-k ``scores`` (a feature extractor's
        embedding) for encoded ``images``, on the user's backend: the
        model's own call (:meth:`keras_outputs`)."""
        x = self.preprocess(images)
        name = "logits" if self.classifier else self.outputs[0]
        parts = []
        with no_grad():
            for start in range(0, len(x), batch_size):
                parts.append(to_numpy(self.keras_outputs(
                    x[start:start + batch_size])[name]))
        logits = np.concatenate(parts).astype(np.float32)
        if not self.classifier:
            return {name: logits}
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = logits if self.own_probabilities else (
            np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True))
        # Sorted values: continuous in the inputs, unlike their indices.
        scores = -np.sort(-probs, axis=-1)[:, :self.top_k]
        return {"logits": logits, "scores": scores}

    def source_logits(self, images):
        return super().source_logits(self.preprocess(images))

    def sample_images(self, n, seed=0, kind="noise"):
        """``n`` encoded files in every format and colour mode, at sizes
        around the model's: photo crops or uniform noise."""
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
        if self.classifier:
            outputs = {"labels": [None, k], "scores": [None, k],
                       "classes": [None, k],
                       "logits": [None, self.num_classes]}
        else:
            name = self.outputs[0]
            outputs = {name: [None] + [
                int(d) for d in self.raw.output[name].shape[1:]]}
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
            "outputs": outputs,
            "top_k": k,
            "labels": self.label_source,
        }

    def class_names(self):
        """The names the ``labels`` output returns, unless class indices."""
        if self.label_source in (None, "class indices"):
            return None, None
        return self.label_source, list(self.label_names)

    def rebuild_args(self):
        return dict(self._bytes_args, input=INPUT_NAME)
