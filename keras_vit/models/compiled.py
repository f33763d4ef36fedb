"""Fast defaults shared by the model classes of keras_vit.

Keras turns XLA off for TensorFlow on machines without an accelerator, and
its ``predict`` feeds every call through a fresh ``tf.data`` pipeline. For
inference XLA is the faster path on CPUs as well (``docs/benchmarks.md``),
so :class:`CompiledModelMixin` gives the models a ``predict`` that, on
arrays and tensors, calls one XLA-compiled function directly, in batches
whose size is rounded up to a power of two (at most ``batch_size``): a new
number of images compiles at most ``log2(batch_size) + 1`` programs instead
of one per size, and the padding rows are dropped from the result.

Datasets, generators, callbacks, ``steps``, a distribution strategy, a
backend other than TensorFlow or ``model.compiled_predict = False`` take
Keras' own ``predict``. Training keeps Keras' rule (``model.compile``'s
``jit_compile``; :class:`keras_vit.train.Trainer` has its own option), since
XLA did not make a float32 training step faster on CPU.

>>> import numpy as np, keras_vit
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> x = np.random.default_rng(0).uniform(-1, 1, (5, 32, 32, 3))
>>> y = model.predict(x, verbose=0)
>>> y.shape, bool(np.allclose(y, model(x), atol=1e-5))
((5, 3), True)
>>> model.compiled_predict_sizes()      # 5 images ran as one batch of 8
[8]
"""

from __future__ import annotations

import math

import keras
import numpy as np

_DEFAULT_BATCH = 32


def _is_array(x):
    if isinstance(x, np.ndarray):
        return True
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return isinstance(x, tf.Tensor) and not isinstance(
            x, tf.RaggedTensor)
    return False


def bucket(n, batch_size):
    """The batch size ``n`` images run at: the next power of two, capped at
    ``batch_size``."""
    return min(batch_size, 1 << max(0, math.ceil(math.log2(max(1, n)))))


class _Forward:
    """The inference call of one model. A callable object rather than a
    closure: TensorFlow counts traces per code object, so closures of many
    models would look like one function retracing and warn."""

    def __init__(self, model):
        self.model = model

    def __call__(self, images):
        return self.model(images, training=False)


class CompiledModelMixin:
    """A direct XLA-compiled ``predict`` (see the module docstring). Mixed
    into the keras_vit model classes before ``keras.Model``."""

    #: False: ``predict`` is Keras' own.
    compiled_predict = True

    # -- predict ----------------------------------------------------------

    def _fast_predict_applies(self, x, steps, callbacks):
        if keras.backend.backend() != "tensorflow" or not _is_array(x):
            return False
        if steps is not None or callbacks or self.run_eagerly:
            return False
        if getattr(self, "_distribute_strategy", None):
            return False
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return False
        return bool(self.compiled_predict)

    def _compiled_call(self):
        state = self.__dict__.get("_keras_vit_predict")
        if state is None:
            import tensorflow as tf

            # Kept out of Keras' attribute tracking (not a layer or weight).
            state = self.__dict__["_keras_vit_predict"] = {
                "fn": tf.function(_Forward(self), jit_compile=True),
                "sizes": set()}
        return state

    def compiled_predict_sizes(self):
        """The batch sizes ``predict`` has compiled programs for."""
        state = self.__dict__.get("_keras_vit_predict") or {}
        return sorted(state.get("sizes", ()))

    def predict(self, x, batch_size=None, verbose="auto", steps=None,
                callbacks=None):
        if not self._fast_predict_applies(x, steps, callbacks):
            return super().predict(x, batch_size=batch_size, verbose=verbose,
                                   steps=steps, callbacks=callbacks)
        import tensorflow as tf

        if batch_size is None:
            batch_size = _DEFAULT_BATCH
        if (not isinstance(batch_size, (int, np.integer))
                or isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError("batch_size must be a positive integer; "
                             f"received batch_size={batch_size!r}")
        batch_size = int(batch_size)
        dtype = self.inputs[0].dtype if self.inputs else "float32"
        x = tf.convert_to_tensor(x)
        if x.dtype != dtype:
            x = tf.cast(x, dtype)
        n = int(x.shape[0])
        if n == 0:
            raise ValueError("predict received no images (x has shape "
                             f"{tuple(x.shape)})")
        state = self._compiled_call()
        num_batches = -(-n // batch_size)
        bar = None
        if num_batches > 1 and verbose not in (0, False):
            bar = keras.utils.Progbar(num_batches)
        outputs = []
        for i, start in enumerate(range(0, n, batch_size)):
            # Whole inputs go in as they are (no slice copy).
            chunk = x if n <= batch_size else x[start:start + batch_size]
            m = int(chunk.shape[0])
            size = bucket(m, batch_size)
            if size > m:
                pad = tf.zeros((size - m,) + tuple(chunk.shape[1:]),
                               chunk.dtype)
                chunk = tf.concat([chunk, pad], 0)
            state["sizes"].add(size)
            out = state["fn"](chunk)
            outputs.append(tf.nest.map_structure(
                lambda t, m=m, size=size: (t if m == size else t[:m]).numpy(),
                out))
            if bar is not None:
                bar.update(i + 1)
        if len(outputs) == 1:
            return outputs[0]
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts),
                                     *outputs)
