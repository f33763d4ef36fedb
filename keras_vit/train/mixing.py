"""MixUp and CutMix of whole batches, with label smoothing, as a step of a
``tf.data`` pipeline: ``(images, integer labels)`` batches in,
``(mixed images, soft targets)`` out, for any Keras backend's
``model.fit``.

The definition is timm 1.0's ``Mixup`` in its default ``mode="batch"``:
one lambda per batch, every image mixed with its partner in the reversed
batch, CutMix's lambda corrected to the clipped box, the one-hot labels
smoothed before mixing. Randomness is stateless: the same ``seed`` gives
the same mix.

>>> import numpy as np
>>> images = np.zeros((4, 8, 8, 3), "float32")
>>> images[:2] = 1.0
>>> mixed, targets = mix_batch(images, np.array([0, 1, 2, 2]),
...                            mixup_alpha=0.8, cutmix_alpha=1.0,
...                            label_smoothing=0.1, num_classes=3,
...                            seed=(0, 7))
>>> targets.shape, np.allclose(targets.numpy().sum(axis=1), 1.0)
(TensorShape([4, 3]), True)
"""

from __future__ import annotations

import keras
import numpy as np

from keras_vit.base.checks import check_int, check_keywords, check_number
from keras_vit.base.limits import MAX_MIX_ALPHA


def check_mixing(mixup_alpha=0.0, cutmix_alpha=0.0, switch_prob=0.5,
                 label_smoothing=0.0, num_classes=None):
    """The mixing arguments as floats (and ``num_classes`` as an int), or
    a ValueError naming the first bad one.

    >>> check_mixing(mixup_alpha=-1.0)
    Traceback (most recent call last):
    ValueError: mixup_alpha must be a number in [0.0, 100.0]; received mixup_alpha=-1.0
    """
    check_number("mixup_alpha", mixup_alpha, low=0.0, high=MAX_MIX_ALPHA)
    check_number("cutmix_alpha", cutmix_alpha, low=0.0, high=MAX_MIX_ALPHA)
    check_number("switch_prob", switch_prob, low=0.0, high=1.0)
    check_number("label_smoothing", label_smoothing, low=0.0, high=1.0,
                 high_open=True)
    if num_classes is not None:
        num_classes = check_int("num_classes", num_classes, low=1)
    return (float(mixup_alpha), float(cutmix_alpha), float(switch_prob),
            float(label_smoothing), num_classes)


def smoothed_one_hot(labels, num_classes, label_smoothing=0.0):
    """Integer ``labels`` -> one-hot rows with ``label_smoothing`` spread
    over all ``num_classes`` (``1 - s + s / C`` on the label).

    >>> [round(float(v), 4) for v in smoothed_one_hot([2], 4, 0.2)[0]]
    [0.05, 0.05, 0.85, 0.05]
    """
    import tensorflow as tf

    off = label_smoothing / num_classes
    return tf.one_hot(tf.cast(labels, tf.int32), num_classes,
                      on_value=1.0 - label_smoothing + off, off_value=off,
                      dtype=tf.float32)


def mix_targets(labels, num_classes, lam, label_smoothing=0.0):
    """Soft targets of a batch mixed with weight ``lam``, smoothed before
    mixing: timm's ``mixup_target``.

    >>> mix_targets([0, 1], 2, 0.75).numpy().tolist()
    [[0.75, 0.25], [0.25, 0.75]]
    """
    import tensorflow as tf

    lam = tf.cast(lam, tf.float64)
    first = smoothed_one_hot(labels, num_classes, label_smoothing)
    return (first * tf.cast(lam, tf.float32)
            + tf.reverse(first, [0]) * tf.cast(1.0 - lam, tf.float32))


def cutmix_box(height, width, lam, center):
    """``((top, bottom, left, right), lam)`` of the CutMix box for
    ``lam`` centred on ``center`` (row, column), clipped to the image, and
    lambda corrected to the share it leaves (timm's ``rand_bbox`` with
    ``correct_lam=True``). In float64 as timm, so the integer sides agree.

    >>> box, lam = cutmix_box(10, 10, 0.75, (0, 5))
    >>> [int(v) for v in box], float(lam)
    ([0, 3, 3, 8], 0.85)
    """
    import tensorflow as tf

    lam = tf.cast(lam, tf.float64)
    ratio = tf.sqrt(1.0 - lam)
    cut_h = tf.cast(tf.cast(height, tf.float64) * ratio, tf.int32)
    cut_w = tf.cast(tf.cast(width, tf.float64) * ratio, tf.int32)
    cy, cx = (tf.cast(c, tf.int32) for c in center)
    top = tf.clip_by_value(cy - cut_h // 2, 0, height)
    bottom = tf.clip_by_value(cy + (cut_h + 1) // 2, 0, height)
    left = tf.clip_by_value(cx - cut_w // 2, 0, width)
    right = tf.clip_by_value(cx + (cut_w + 1) // 2, 0, width)
    area = tf.cast((bottom - top) * (right - left), tf.float64)
    lam = 1.0 - area / tf.cast(height * width, tf.float64)
    return (top, bottom, left, right), lam


def _beta(alpha, seeds):
    # Beta(a, a) as a ratio of two Gamma(a) draws, in float64; 1 for alpha 0.
    import tensorflow as tf

    if not alpha:
        return tf.constant(1.0, tf.float64)
    a = tf.random.stateless_gamma([], seeds[0], alpha, dtype=tf.float64)
    b = tf.random.stateless_gamma([], seeds[1], alpha, dtype=tf.float64)
    # Both draws underflow to 0 for a tiny alpha: either image, equally.
    return tf.where(a + b > 0.0, a / tf.maximum(a + b, 1e-300),
                    tf.cast(a >= b, tf.float64))


def _check_labels(labels, num_classes):
    """Refuses labels outside [0, num_classes) (all-zero one-hot rows):
    eagerly with a ValueError, inside a graph with an assertion."""
    import tensorflow as tf

    if tf.executing_eagerly():
        values = np.asarray(labels)
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                "labels must be a 1-D batch of integer class indices; "
                f"received labels of shape {values.shape} and dtype "
                f"{values.dtype}")
        bad = values[(values < 0) | (values >= num_classes)]
        if bad.size:
            raise ValueError(
                f"labels must be in [0, num_classes={num_classes}); "
                f"received label {int(bad[0])}")
        return labels
    labels = tf.convert_to_tensor(labels)
    ok = tf.reduce_all((labels >= 0) & (labels < num_classes))
    with tf.control_dependencies([tf.debugging.Assert(
            ok, [f"labels must be in [0, num_classes={num_classes})"])]):
        return tf.identity(labels)


def mix_batch(images, labels, *, mixup_alpha=0.0, cutmix_alpha=0.0,
              switch_prob=0.5, label_smoothing=0.0, num_classes, seed):
    """One batch mixed: ``(mixed images, soft targets)``.

    Args:
        images: a batch ``(n, height, width, channels)``, any range.
        labels: ``n`` integer class indices in ``[0, num_classes)``.
        mixup_alpha: Beta(alpha, alpha) of MixUp's lambda; 0: no MixUp.
        cutmix_alpha: the same for CutMix; 0: no CutMix.
        switch_prob: with both on, the chance that a batch is CutMix.
        label_smoothing: spread over all classes before mixing.
        num_classes: the targets' width.
        seed: a stateless seed: two integers (a pair or a shape-(2,)
            tensor).

    With both alphas 0 the targets are the smoothed one-hot labels.

    >>> import numpy as np
    >>> x = np.stack([np.full((4, 4, 3), v, "float32") for v in (0, 1)])
    >>> mixed, y = mix_batch(x, np.array([0, 1]), mixup_alpha=1.0,
    ...                      num_classes=2, seed=(1, 2))
    >>> lam = float(y[0, 0])  # image 0's weight on itself
    >>> bool(np.allclose(mixed[0], 1.0 - lam)), \\
    ...     bool(np.allclose(y.numpy().sum(1), 1.0))
    (True, True)
    """
    import tensorflow as tf

    mixup_alpha, cutmix_alpha, switch_prob, label_smoothing, num_classes = (
        check_mixing(mixup_alpha, cutmix_alpha, switch_prob,
                     label_smoothing, num_classes))
    labels = _check_labels(labels, num_classes)
    images = tf.convert_to_tensor(images)
    if not (mixup_alpha or cutmix_alpha):
        return images, smoothed_one_hot(labels, num_classes,
                                        label_smoothing)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    seeds = tf.random.experimental.stateless_split(seed, 6)
    if mixup_alpha and cutmix_alpha:
        use_cutmix = tf.random.stateless_uniform(
            [], seeds[0], dtype=tf.float64) < switch_prob
    else:
        use_cutmix = tf.constant(bool(cutmix_alpha))
    shape = tf.shape(images)
    center = (tf.random.stateless_uniform([], seeds[5], 0, shape[1],
                                          dtype=tf.int32),
              tf.random.stateless_uniform(
                  [], tf.random.experimental.stateless_fold_in(seeds[5], 1),
                  0, shape[2], dtype=tf.int32))
    lam = tf.where(use_cutmix, _beta(cutmix_alpha, seeds[3:5]),
                   _beta(mixup_alpha, seeds[1:3]))
    return apply_mix(images, labels, lam=lam, cutmix=use_cutmix,
                     center=center, label_smoothing=label_smoothing,
                     num_classes=num_classes)


def apply_mix(images, labels, *, lam, cutmix, center=(0, 0),
              label_smoothing=0.0, num_classes):
    """The mix of :func:`mix_batch` once its draws are made: ``lam``,
    whether it is CutMix (a bool or a boolean tensor) and the CutMix box's
    ``center`` (row, column). Below, the 2 x 2 box for lambda 0.75 centred
    on a corner keeps 1 of its 4 pixels: lambda becomes 15/16.

    >>> import numpy as np
    >>> x = np.stack([np.zeros((4, 4, 3)), np.ones((4, 4, 3))]).astype("float32")
    >>> mixed, y = apply_mix(x, np.array([0, 1]), lam=0.75, cutmix=True,
    ...                      center=(0, 0), num_classes=2)
    >>> float(mixed.numpy()[0].mean()), y.numpy()[0].tolist()
    (0.0625, [0.9375, 0.0625])
    """
    import tensorflow as tf

    images = tf.convert_to_tensor(images)
    lam = tf.cast(lam, tf.float64)
    shape = tf.shape(images)
    box, lam_box = cutmix_box(shape[1], shape[2], lam, center)
    # One pass for either mix: each pixel's weights on image and partner.
    top, bottom, left, right = box
    rows = tf.range(shape[1])[:, None]
    cols = tf.range(shape[2])[None, :]
    inside = tf.cast((rows >= top) & (rows < bottom) & (cols >= left)
                     & (cols < right), images.dtype)
    own = tf.where(cutmix, 1.0 - inside, tf.cast(lam, images.dtype))
    other = tf.where(cutmix, inside, tf.cast(1.0 - lam, images.dtype))
    plane = shape[1:]

    def spread(weights):
        return tf.broadcast_to(weights[:, :, None], plane)[None]

    mixed = (images * spread(own)
             + tf.reverse(images, [0]) * spread(other))
    lam = tf.where(cutmix, lam_box, lam)
    return mixed, mix_targets(labels, num_classes, lam, label_smoothing)


class BatchMixer:
    """:func:`mix_batch` with its options bound: ``mixer(images, labels,
    seed)``. :meth:`map` applies it to a batched ``tf.data.Dataset``.

    >>> import tensorflow as tf, numpy as np
    >>> ds = tf.data.Dataset.from_tensor_slices(
    ...     (np.zeros((8, 4, 4, 3), "float32"), np.arange(8) % 2)).batch(4)
    >>> mixer = BatchMixer(mixup_alpha=0.8, cutmix_alpha=1.0,
    ...                    label_smoothing=0.1, num_classes=2)
    >>> [tuple(y.shape) for _, y in mixer.map(ds, seed=0)]
    [(4, 2), (4, 2)]
    """

    def __init__(self, *, mixup_alpha=0.0, cutmix_alpha=0.0,
                 switch_prob=0.5, label_smoothing=0.0, num_classes):
        (self.mixup_alpha, self.cutmix_alpha, self.switch_prob,
         self.label_smoothing, self.num_classes) = check_mixing(
            mixup_alpha, cutmix_alpha, switch_prob, label_smoothing,
            num_classes)

    def options(self):
        return {name: getattr(self, name) for name in _OPTIONS}

    def __call__(self, images, labels, seed):
        return mix_batch(images, labels, seed=seed, **self.options())

    def map(self, dataset, *, seed=0, epoch=None):
        return mix_dataset(dataset, seed=seed, epoch=epoch,
                           **self.options())

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"BatchMixer({args})"


_OPTIONS = ("mixup_alpha", "cutmix_alpha", "switch_prob", "label_smoothing",
            "num_classes")


def mix_dataset(dataset, *, seed=0, epoch=None, **options):
    """A batched ``dataset`` of ``(images, labels)`` mixed by
    :func:`mix_batch` (``options``: its keyword arguments but ``seed``).

    Each batch gets its own stateless seed from ``seed``: ``epoch=None``
    draws new ones each time the dataset is iterated, an int gives that
    epoch the same mixes every time it is built.

    >>> import tensorflow as tf, numpy as np
    >>> ds = tf.data.Dataset.from_tensor_slices(
    ...     (np.zeros((4, 4, 4, 3), "float32"), np.arange(4) % 3)).batch(2)
    >>> mixed = mix_dataset(ds, seed=1, epoch=0, mixup_alpha=0.2,
    ...                     num_classes=3)
    >>> [tuple(y.shape) for _, y in mixed]
    [(2, 3), (2, 3)]
    """
    import tensorflow as tf

    check_int("seed", seed, low=0)
    if epoch is not None:
        check_int("epoch", epoch, low=0)
    check_keywords("mix_dataset", options, _OPTIONS)
    if "num_classes" not in options:
        raise ValueError("mix_dataset needs num_classes; received "
                         f"options={sorted(options)}")
    options = dict(zip(_OPTIONS, check_mixing(**options)))
    if epoch is None:
        seeds = tf.data.Dataset.random(seed=seed,
                                       rerandomize_each_iteration=True)
    else:
        seeds = tf.data.Dataset.random(seed=(seed * 1_000_003 + epoch)
                                       % (2 ** 31 - 1))
    seeds = seeds.batch(2)

    # No Python control flow on tensors: autograph (seconds) is not needed.
    @tf.autograph.experimental.do_not_convert
    def mix(batch, seed):
        return mix_batch(batch[0], batch[1], seed=seed, **options)

    return tf.data.Dataset.zip(dataset, seeds).map(
        mix, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def dense_targets(y_true, y_pred):
    """``y_true`` as ``(batch, num_classes)`` float rows: soft targets as
    they are, integer labels one-hot (told apart by shape).

    >>> import numpy as np
    >>> logits = np.zeros((2, 3), "float32")
    >>> keras.ops.convert_to_numpy(dense_targets(
    ...     keras.ops.convert_to_tensor([2, 0]), logits)).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    ops = keras.ops
    classes = y_pred.shape[-1]
    if (len(y_true.shape) == len(y_pred.shape) and classes != 1
            and y_true.shape[-1] == classes):
        return ops.cast(y_true, y_pred.dtype)
    labels = ops.cast(ops.reshape(y_true, (-1,)), "int32")
    return ops.one_hot(labels, classes, dtype=y_pred.dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class SoftTargetCrossentropy(keras.losses.Loss):
    """Softmax cross-entropy from logits against soft targets (smoothed
    already), or against integer labels smoothed by ``label_smoothing``.

    >>> import numpy as np
    >>> loss = SoftTargetCrossentropy()
    >>> logits = np.log(np.array([[0.5, 0.5]], "float32"))
    >>> round(float(loss(np.array([[0.5, 0.5]], "float32"), logits)), 4), \\
    ...     round(float(loss(np.array([0]), logits)), 4)
    (0.6931, 0.6931)
    """

    def __init__(self, label_smoothing=0.0, name="soft_target_ce",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        ops = keras.ops
        target = dense_targets(y_true, y_pred)
        if self.label_smoothing and not (
                len(y_true.shape) == len(y_pred.shape)
                and y_true.shape[-1] == y_pred.shape[-1]):
            target = (target * (1.0 - self.label_smoothing)
                      + self.label_smoothing / y_pred.shape[-1])
        return -ops.sum(target * ops.log_softmax(y_pred, axis=-1), axis=-1)

    def get_config(self):
        return {**super().get_config(),
                "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="keras_vit")
class BinaryMixedTargets(keras.losses.Loss):
    """DeiT III's loss for mixed batches: every class present in the
    target a positive, binary cross-entropy from logits averaged over the
    classes; integer labels are one-hot.

    >>> import numpy as np
    >>> loss = BinaryMixedTargets()
    >>> targets = np.array([[0.7, 0.3, 0.0]], "float32")  # two classes mixed
    >>> round(float(loss(targets, np.array([[9.0, 9.0, -9.0]], "float32"))), 4)
    0.0001
    """

    def __init__(self, name="binary_mixed_targets", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        ops = keras.ops
        positive = ops.cast(ops.greater(dense_targets(y_true, y_pred), 0.0),
                            y_pred.dtype)
        return ops.mean(ops.binary_crossentropy(positive, y_pred,
                                                from_logits=True), axis=-1)

