"""Keras-style input and output helpers: the official evaluation transform
and top-K class names, like ``keras.applications``' ``preprocess_input``
and ``decode_predictions``.

The official ViT evaluation resizes the whole image (bilinear, no
antialiasing, no crop) and scales pixels to [-1, 1].

>>> import numpy as np
>>> from keras_vit import zoo
>>> x = zoo.preprocess_input(np.full((50, 70, 3), 255, "uint8"), 32)
>>> x.shape, float(x.min()), float(x.max())
((32, 32, 3), 1.0, 1.0)
>>> preds = np.zeros((1, 1000), "float32"); preds[0, 207] = 5.0
>>> zoo.decode_predictions(preds, top=1)[0][0][:2]
('n02099601', 'golden retriever')
"""

from __future__ import annotations

import numpy as np

from keras_vit.base.checks import as_array, check_pair
from keras_vit.data.normalization import check_normalization

# Head sizes that identify a label list shipped with the package.
LABELS_BY_HEAD = {1000: "imagenet2012", 21843: "imagenet21k"}


def preprocess_input(images, image_size=None, scale=True,
                     input_normalization=None):
    """The official evaluation transform on one image (H, W, 3) or a batch
    (B, H, W, 3) of pixels in [0, 255]: resized to ``image_size`` (None
    keeps the size), then normalised as ``input_normalization`` says (None:
    the official [-1, 1]; ``"imagenet"``, ``"clip"``, ``{"mean": [...],
    "std": [...]}``); ``scale=False`` keeps [0, 255]. Returns float32
    NumPy."""
    import keras

    x = as_array("images", images)
    if x.ndim not in (3, 4) or x.shape[-1] != 3 or 0 in x.shape[-3:-1]:
        raise ValueError("images must be (height, width, 3) or (batch, "
                         "height, width, 3) with height and width >= 1; "
                         f"received images of shape {x.shape}")
    single = x.ndim == 3
    if single:
        x = x[None]
    if image_size is not None and tuple(x.shape[1:3]) != check_pair("image_size", image_size):
        # tf.image.resize without antialiasing, as the official pipeline.
        x = np.asarray(keras.ops.image.resize(
            x, check_pair("image_size", image_size), interpolation="bilinear", antialias=False))
    if scale:
        x = check_normalization("input_normalization",
                                input_normalization)(x)
    x = x.astype("float32")
    return x[0] if single else x


def preprocessing_layer(image_size, input_normalization=None):
    """The same transform as Keras layers (Resizing + Rescaling), to put in
    front of a model or into a ``tf.data`` pipeline.

    >>> import numpy as np
    >>> from keras_vit import zoo
    >>> layer = zoo.preprocessing_layer(32)
    >>> tuple(layer(np.zeros((2, 48, 40, 3), "float32")).shape)
    (2, 32, 32, 3)
    """
    import keras

    height, width = check_pair("image_size", image_size)
    return keras.Sequential([
        keras.layers.Resizing(height, width, interpolation="bilinear",
                              antialias=False),
        check_normalization("input_normalization",
                            input_normalization).layer(name=None),
    ], name="vit_eval_preprocessing")


def _preview(labels):
    text = repr(labels if isinstance(labels, str) else list(labels)[:3])
    return text if isinstance(labels, str) or len(labels) <= 3 else (
        text[:-1] + ", ...]")


def _labels_for(labels, num_classes):
    from keras_vit.zoo import api

    if labels is None:
        labels = LABELS_BY_HEAD.get(num_classes)
        if labels is None:
            raise ValueError(
                f"no label list ships for {num_classes} classes; pass "
                "labels=[...] (names) or a model whose weights have them")
    if hasattr(labels, "inputs"):  # a model: the labels of its weights
        names = (getattr(labels, "label_names", None)
                 or getattr(labels, "zoo_labels", None))
        record = getattr(labels, "zoo_weights", None)
        labels = names or (record.labels if record is not None else
                           LABELS_BY_HEAD.get(num_classes))
        if labels is None:
            raise ValueError("the model's weights name no label list; pass "
                             "labels=[...]")
    if isinstance(labels, str):
        rows = [tuple(r) for r in api.labels(labels)]
    else:
        rows = [(None, str(name)) for name in labels]
    if len(rows) != num_classes:
        raise ValueError(f"labels has {len(rows)} names but preds have "
                         f"{num_classes} classes; received labels="
                         f"{_preview(labels)}")
    return rows


def softmax(logits):
    """Probabilities from ``logits`` along the last axis, in float64.

    >>> softmax([0.0, 0.0]).tolist()
    [0.5, 0.5]
    """
    z = np.asarray(logits, dtype="float64")
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def model_labels(model, num_classes, *, by_head=True):
    """The class names of ``model``'s ``num_classes`` outputs, as
    ``(source, [(wordnet_id, name), ...])``, or ``(None, None)`` if none
    fits: its ``label_names``, else the list its weights name, else
    (``by_head``) the list that ships for that head size.

    >>> model_labels(object(), 10)
    (None, None)
    """
    from keras_vit.zoo import api, registry

    names = (getattr(model, "label_names", None)
             or getattr(model, "zoo_labels", None))
    record = getattr(model, "zoo_weights", None)
    if names and getattr(record, "labels", None) and list(names) == (
            registry.label_names(record.labels)):
        names = None  # a released head's list: keep its WordNet ids
    if names and len(names) == num_classes:
        return "label_names", [(None, n) for n in names]
    name = getattr(record, "labels", None) if record is not None else (
        LABELS_BY_HEAD.get(num_classes) if by_head else None)
    if not name:
        return None, None
    labels = api.labels(name)
    if len(labels) != num_classes:
        return None, None
    return name, labels


# How far from 1 a row of probabilities may sum: float32 softmax outputs
# sum within 1e-6; 16-bit ones (a float16 or bfloat16 head) within ~1e-2.
_SUM_TOLERANCE = {2: 1e-2}
_DEFAULT_SUM_TOLERANCE = 1e-3


def head_activation(model):
    """The name of ``model``'s ``classifier_activation`` (given as a name,
    a function or a saved function's config; ``"linear"`` for none), or
    None for a model that does not say (a plain Keras model).

    >>> import types
    >>> head_activation(types.SimpleNamespace(classifier_activation=None))
    'linear'
    """
    if not hasattr(model, "classifier_activation"):
        return None
    import keras

    return keras.activations.get(model.classifier_activation).__name__


def head_probabilities(model, outputs):
    """``outputs`` of ``model``'s head as the scores to rank, float64, as
    its ``classifier_activation`` says: the softmax of logits (no
    activation), the outputs of ``softmax`` and of any other (``sigmoid``:
    one probability per class), the exp of a ``log_*`` one's. A model
    that does not say (a plain Keras model) is judged by the values
    (:func:`probabilities`).

    >>> import types
    >>> sigmoid = types.SimpleNamespace(classifier_activation="sigmoid")
    >>> head_probabilities(sigmoid, [[0.9, 0.8]]).tolist()
    [[0.9, 0.8]]
    >>> head_probabilities(types.SimpleNamespace(classifier_activation=None),
    ...                    [[0.0, 0.0]]).tolist()
    [[0.5, 0.5]]
    """
    activation = head_activation(model)
    if activation is None:
        return probabilities(outputs)
    if activation in ("linear", "softmax"):  # None is linear: logits
        return probabilities(outputs, activation == "linear")
    p = np.asarray(outputs, "float64")
    return np.exp(p) if activation.startswith("log_") else p


def probabilities(preds, from_logits=None):
    """``preds`` (classes on the last axis) as probabilities, float64.

    ``from_logits``: True (always take the softmax), False (probabilities
    already, checked), or None (probabilities if every row is non-negative
    and sums to 1 within 1e-3, 1e-2 for 16-bit floats; else logits).

    >>> probabilities([[0.0, 0.0]]).tolist()
    [[0.5, 0.5]]
    >>> probabilities([[0.2, 0.8]]).tolist()  # already probabilities
    [[0.2, 0.8]]
    """
    raw = np.asarray(preds)
    p = raw.astype("float64")
    if from_logits not in (None, True, False):
        raise ValueError("from_logits must be True, False or None (decide "
                         f"from the values); received from_logits="
                         f"{from_logits!r}")
    if from_logits is None:
        tol = _SUM_TOLERANCE.get(raw.dtype.itemsize, _DEFAULT_SUM_TOLERANCE)
        from_logits = not (p.size and (p >= 0).all() and np.allclose(
            p.sum(axis=-1), 1.0, rtol=0, atol=tol))
    if from_logits:
        return softmax(p)
    if (p < 0).any() or not np.isfinite(p).all():
        bad = float(p[~((p >= 0) & np.isfinite(p))].ravel()[0])
        raise ValueError(
            "from_logits=False: preds must be probabilities (non-negative, "
            f"finite); received a value {bad!r}; pass from_logits=True or "
            "None for logits")
    return p


def decode_predictions(preds, top=5, labels=None, *, from_logits=None):
    """Top ``top`` classes of each row of ``preds`` ((batch, classes),
    logits or probabilities) as lists of ``(wordnet_id, name, score)``,
    best first; ``score`` is the class's probability (``from_logits`` as in
    :func:`probabilities`).

    ``labels``: None (the list that ships for the head size), a list name
    (``"imagenet2012"``), a list of class names (wordnet_id is then None)
    or a model from :func:`keras_vit.zoo.load`.
    """
    p = np.asarray(preds)
    if p.ndim != 2:
        raise ValueError("preds must be (batch, classes); received shape "
                         f"{p.shape}")
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int; received top={top!r}")
    rows = _labels_for(labels, p.shape[1])
    p = probabilities(p, from_logits)
    out = []
    for row in p:
        order = np.argsort(-row, kind="stable")[:top]
        out.append([(rows[i][0], rows[i][1], float(row[i])) for i in order])
    return out
