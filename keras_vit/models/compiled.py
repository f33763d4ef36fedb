"""Fast defaults shared by the model classes of keras_vit.

Keras turns XLA off for TensorFlow on machines without an accelerator, and
its ``predict`` feeds every call through a fresh ``tf.data`` pipeline. For
these models XLA is the faster path on CPUs as well (``docs/benchmarks.md``),
so :class:`CompiledModelMixin` makes it the default:

* ``jit_compile="auto"`` (the default of ``model.compile`` and of an
  uncompiled model) resolves to XLA on CPUs too, unless a distribution
  strategy is in scope (Keras' own rule there);
* ``predict`` on arrays and tensors calls one XLA-compiled function directly,
  in batches whose size is rounded up to a power of two (at most
  ``batch_size``), so a new number of images compiles at most
  ``log2(batch_size) + 1`` programs instead of one per size; the padding rows
  are dropped from the result. Datasets, generators, callbacks, ``steps``,
  a distribution strategy or ``model.jit_compile = False`` take Keras' own
  ``predict``.

>>> import numpy as np, keras_vit
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> model.jit_compile
True
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


class CompiledModelMixin:
    """XLA by default on CPU and a direct compiled ``predict`` (see the
    module docstring). Mixed into the keras_vit model classes before
    ``keras.Model``."""

    def _resolve_auto_jit_compile(self):
        if keras.backend.backend() == "tensorflow":
            if getattr(self, "_distribute_strategy", None):
                return False
            return all(layer.supports_jit for layer in self._flatten_layers())
        return super()._resolve_auto_jit_compile()

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
        return bool(self.jit_compile)

    def _compiled_call(self):
        state = self.__dict__.get("_keras_vit_predict")
        if state is None:
            import tensorflow as tf

            def forward(images):
                return self(images, training=False)

            # Kept out of Keras' attribute tracking (not a layer or weight).
            state = self.__dict__["_keras_vit_predict"] = {
                "fn": tf.function(forward, jit_compile=True), "sizes": set()}
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
            chunk = x[start:start + batch_size]
            m = int(chunk.shape[0])
            size = bucket(m, batch_size)
            if size > m:
                pad = tf.zeros((size - m,) + tuple(chunk.shape[1:]),
                               chunk.dtype)
                chunk = tf.concat([chunk, pad], 0)
            state["sizes"].add(size)
            out = state["fn"](chunk)
            outputs.append(tf.nest.map_structure(
                lambda t, m=m: t[:m].numpy(), out))
            if bar is not None:
                bar.update(i + 1)
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts),
                                     *outputs)
