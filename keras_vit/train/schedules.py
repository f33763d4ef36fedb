"""The Keras classes a model compiled by :mod:`keras_vit.train` saves in its
``.keras`` file: the recipes' learning-rate schedule, the smoothed
cross-entropy loss and the accuracy of mixed targets. Importing this module
registers them with Keras, so such a file loads compiled.

>>> s = WarmupDecay(0.01, warmup_steps=10, total_steps=100)
>>> round(float(s(9)), 4), round(float(s(100)), 6)
(0.01, 0.0)
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_vit.runtime.backend import is_tensorflow


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then
    ``decay`` (cosine, linear or constant) to 0 at ``total_steps``.

    ``ticks_per_step``: how many counts of the counter make one step
    (Keras' optimizer counts every micro-batch when it accumulates).

    >>> s = WarmupDecay(1.0, 2, 10, ticks_per_step=2)
    >>> [round(float(s(t)), 3) for t in (0, 1, 2, 3)]
    [0.5, 0.5, 1.0, 1.0]
    """

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine",
                 ticks_per_step=1):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay
        self.ticks_per_step = int(ticks_per_step)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.ticks_per_step > 1:
            step = ops.floor(step / float(self.ticks_per_step))
        ramp = (ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
                if self.warmup_steps else 1.0)
        span = float(max(self.total_steps - self.warmup_steps, 1))
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        if self.decay == "cosine":
            factor = 0.5 * (1.0 + ops.cos(math.pi * progress))
        elif self.decay == "linear":
            factor = 1.0 - progress
        else:
            factor = 1.0
        return self.peak * ramp * factor

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "decay": self.decay,
                "ticks_per_step": self.ticks_per_step}


@keras.saving.register_keras_serializable(package="keras_vit")
class SmoothedSparseCE(keras.losses.Loss):
    """Cross-entropy from logits for integer labels, with label smoothing
    (Keras' sparse loss has none)."""

    def __init__(self, label_smoothing=0.0, name="smoothed_sparse_ce",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        k = ops.shape(y_pred)[-1]
        target = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"),
                             k)
        return keras.losses.categorical_crossentropy(
            target, y_pred, from_logits=True,
            label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(),
                "label_smoothing": self.label_smoothing}


def top_one_hits(y_true, y_pred):
    """1.0 where the top class of ``y_pred`` is the target's: an integer
    label, or the largest entry of a target row. Keras' ``"accuracy"``
    picks one form at its first batch, so a model trained on mixed rows
    scored 0.0 on integer labels."""
    guess = ops.argmax(y_pred, axis=-1)
    if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] != 1:
        truth = ops.argmax(y_true, axis=-1)
    else:
        truth = ops.reshape(y_true, ops.shape(guess))
    return ops.cast(ops.equal(ops.cast(truth, "int32"),
                              ops.cast(guess, "int32")), "float32")


@keras.saving.register_keras_serializable(package="keras_vit")
class TopOneAccuracy(keras.metrics.MeanMetricWrapper):
    """Top-1 accuracy for integer labels and target rows alike
    (:func:`top_one_hits`), named ``"accuracy"``.

    >>> import numpy as np
    >>> m = TopOneAccuracy()
    >>> logits = np.array([[0.1, 0.9], [0.8, 0.2]], "float32")
    >>> m.update_state(np.array([1, 1]), logits)
    >>> m.update_state(np.array([[0.3, 0.7], [0.6, 0.4]], "float32"), logits)
    >>> float(m.result())
    0.75
    """

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(top_one_hits, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


@keras.saving.register_keras_serializable(package="keras_vit")
class SGD(keras.optimizers.SGD):
    """``keras.optimizers.SGD`` whose update on TensorFlow, outside
    ``tf.distribute``, is one kernel per variable
    (``ResourceApplyKerasMomentum``) with the ``global_clipnorm`` factor
    folded into the learning rate: about 1,000 fewer passes over the
    weights a step over 200 variables. Everywhere else it is Keras' SGD as
    is; the same numbers to float32 rounding.

    >>> import numpy as np
    >>> w = keras.Variable(np.ones(3, "float32"))
    >>> opt = SGD(0.1, momentum=0.9, global_clipnorm=1.0)
    >>> opt.apply([keras.ops.convert_to_tensor(np.full(3, 2.0, "float32"))],
    ...           [w])
    >>> [round(float(v), 4) for v in keras.ops.convert_to_numpy(w)]
    [0.9423, 0.9423, 0.9423]
    """

    # The global clipping factor of the step being built, dropped once the
    # step's updates are written (a traced tensor must not leak).
    _update_scale = None

    def _backend_update_step(self, grads, trainable_variables,
                             learning_rate):
        try:
            super()._backend_update_step(grads, trainable_variables,
                                         learning_rate)
        finally:
            self._update_scale = None

    def _fused(self):
        if not is_tensorflow() or self.nesterov:
            return False
        import tensorflow as tf

        return not tf.distribute.has_strategy()

    def _clip_gradients(self, grads):
        self._update_scale = None
        if not (self.global_clipnorm and self.global_clipnorm > 0
                and not self.clipnorm and not self.clipvalue
                and self._fused()):
            return super()._clip_gradients(grads)
        import tensorflow as tf

        dense = [g for g in grads if g is not None]
        if any(isinstance(g, tf.IndexedSlices) for g in dense):
            return super()._clip_gradients(grads)
        squares = tf.math.add_n([
            tf.cast(tf.nn.l2_loss(g), "float32") for g in dense]) * 2.0
        norm = tf.math.sqrt(squares)
        clip = float(self.global_clipnorm)
        # Keras' factor: min(1, clip / norm), NaN for a non-finite norm.
        self._update_scale = (clip * tf.math.minimum(1.0 / norm, 1.0 / clip)
                              + (norm - norm))
        return grads

    def update_step(self, gradient, variable, learning_rate):
        import tensorflow as tf

        scale = self._update_scale
        if (not self.momentum or not self._fused()
                or isinstance(gradient, tf.IndexedSlices)):
            if scale is not None:
                gradient = gradient * tf.cast(scale, gradient.dtype)
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        if scale is not None:
            lr = lr * tf.cast(scale, dtype)
        momentum = self.momentums[self._get_variable_index(variable)]
        target = (variable.value if isinstance(variable, keras.Variable)
                  else variable)
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=target.handle, accum=momentum.value.handle, lr=lr,
            grad=tf.cast(gradient, dtype),
            momentum=tf.cast(self.momentum, dtype), use_locking=False,
            use_nesterov=False)
