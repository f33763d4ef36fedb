"""The Keras classes a model compiled by :mod:`keras_vit.train` saves in its
``.keras`` file: the recipes' learning-rate schedule and the smoothed
cross-entropy loss. Importing this module registers both with Keras
(``keras_vit>WarmupDecay``, ``keras_vit>SmoothedSparseCE``), so such a file
loads compiled after ``import keras_vit.train.schedules``; loading with
``compile=False`` needs neither.

>>> s = WarmupDecay(0.01, warmup_steps=10, total_steps=100)
>>> round(float(s(9)), 4), round(float(s(100)), 6)
(0.01, 0.0)
"""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then
    ``decay`` (cosine, linear or constant) to 0 at ``total_steps``."""

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine"):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = float(max(self.warmup_steps, 1))
        ramp = ops.minimum(1.0, (step + 1.0) / warm) if (
            self.warmup_steps) else 1.0
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
                "total_steps": self.total_steps, "decay": self.decay}


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
