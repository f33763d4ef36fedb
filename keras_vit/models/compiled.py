"""Fast defaults shared by the model classes of keras_vit.

Keras' own ``predict`` feeds every call through a fresh ``tf.data``
pipeline and, for TensorFlow on a CPU, turns XLA off.
:class:`CompiledModelMixin` gives the models a ``predict`` that, on arrays
and tensors, calls one compiled function directly, on the path the machine
runs fastest (:func:`keras_vit.runtime.hardware.plan`): ``"xla"`` (batches
padded up to a power of two, at most ``batch_size``), ``"graph"`` (a
TensorFlow graph without XLA, whose oneDNN kernels use a CPU's bf16 matrix
units) or ``"eager"``.

``model.predict_path`` (default ``"auto"``) picks one explicitly;
``"keras"`` (or ``model.compiled_predict = False``) is Keras' own
``predict``, which datasets, generators, callbacks, ``steps`` and
distribution strategies always take. The compiled functions are made
again whenever :func:`computation_key` changes.

>>> import numpy as np, keras_vit
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> x = np.random.default_rng(0).uniform(-1, 1, (5, 32, 32, 3))
>>> y = model.predict(x, verbose=0)
>>> y.shape, bool(np.allclose(y, model(x), atol=1e-5))
((5, 3), True)
>>> model.resolved_predict_path() in ("xla", "graph", "eager")
True
>>> model.predict_path = "xla"
>>> _ = model.predict(x, verbose=0)
>>> model.compiled_predict_sizes("xla")   # 5 images ran as one batch of 8
[8]
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_vit.layers.image_sizes import image_sizes
from keras_vit.runtime import compat
from keras_vit.runtime.backend import name as backend_name

_DEFAULT_BATCH = 32


def _is_array(x):
    if isinstance(x, np.ndarray):
        return True
    backend = backend_name()
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(x, tf.Tensor) and not isinstance(
            x, tf.RaggedTensor)
    return keras.ops.is_tensor(x)


def bucket(n, batch_size):
    """The batch size ``n`` images run at: the next power of two, capped at
    ``batch_size``."""
    return min(batch_size, 1 << max(0, math.ceil(math.log2(max(1, n)))))


PREDICT_PATHS = ("auto", "xla", "graph", "eager", "keras")


def model_compute_dtype(model):
    """The compute dtype most of ``model``'s weighted layers run in
    (``"bfloat16"`` for ``dtype="bfloat16"`` and ``"mixed_bfloat16"``)."""
    counts = {}
    for layer in compat.flatten_layers(model, include_self=False):
        if layer.weights:
            dtype = layer.compute_dtype
            counts[dtype] = counts.get(dtype, 0) + 1
    if not counts:
        return "float32"
    return max(counts, key=counts.get)


def _quantized(model):
    return any(getattr(layer, "quantization_mode", None)
               for layer in compat.flatten_layers(model, include_self=False))


def computation_key(model):
    """What a compiled forward of ``model`` depends on besides its input
    and its variables' values: every layer's dtype policy, LoRA and
    trainable flags, and every variable's path, shape, dtype and
    trainability (``quantize`` and ``enable_lora`` replace and add
    variables)."""
    layers = tuple(
        (layer.name, layer.dtype_policy.name, layer.trainable,
         getattr(layer, "lora_enabled", False),
         getattr(layer, "lora_rank", None))
        for layer in compat.flatten_layers(model, include_self=True))
    variables = tuple((v.path, tuple(v.shape), str(v.dtype), v.trainable)
                      for v in model.weights)
    return layers, variables


class _Forward:
    """The inference call of one model: an object, not a closure, since
    TensorFlow counts traces per code object and would warn."""

    def __init__(self, model):
        self.model = model

    def __call__(self, images):
        return self.model(images, training=False)


def _tf_runner(model, path):
    import tensorflow as tf

    if path == "xla":
        return tf.function(_Forward(model), jit_compile=True)
    if path == "graph":
        return tf.function(_Forward(model), jit_compile=False,
                           reduce_retracing=True)
    return _Forward(model)


def _jax_runner(model, path):
    import jax

    if path != "xla":
        return _Forward(model)

    def forward(trainable, non_trainable, images):
        out, _ = model.stateless_call(trainable, non_trainable, images,
                                      training=False)
        return out

    jitted = jax.jit(forward)

    def run(images):
        return jitted([v.value for v in model.trainable_variables],
                      [v.value for v in model.non_trainable_variables],
                      images)
    return run


def _torch_runner(model):
    import torch

    def run(images):
        with torch.no_grad():
            return model(images, training=False)
    return run


class CompiledModelMixin:
    """A direct compiled ``predict`` (see the module docstring)."""

    #: False: ``predict`` is Keras' own (same as ``predict_path="keras"``).
    compiled_predict = True
    #: ``"auto"`` (the machine's plan), ``"xla"``, ``"graph"``, ``"eager"``
    #: or ``"keras"``.
    predict_path = "auto"

    def image_sizes(self):
        """The image shapes the model takes
        (:class:`keras_vit.layers.image_sizes.ImageSizes`)."""
        return image_sizes(self)

    def __call__(self, *args, **kwargs):
        # Before Keras' own input check: every path refuses the same way.
        if args and getattr(self, "inputs", None) and len(self.inputs) == 1:
            images = args[0]
            if getattr(images, "shape", None) is not None and not isinstance(
                    images, (dict, list, tuple)):
                args = (image_sizes(self).check_images(images),) + args[1:]
        return super().__call__(*args, **kwargs)

    def resolved_predict_path(self):
        """The path ``predict`` takes for arrays: ``"xla"``, ``"graph"``,
        ``"eager"`` or ``"keras"``."""
        path = self.predict_path
        if path not in PREDICT_PATHS:
            raise ValueError(
                f"predict_path must be one of {', '.join(PREDICT_PATHS)}; "
                f"received predict_path={path!r}")
        if not self.compiled_predict:
            return "keras"
        backend = backend_name()
        if path == "auto":
            from keras_vit.runtime import hardware

            path = hardware.plan(model_compute_dtype(self)).predict
            if _quantized(self):
                # A compiled graph flips some int8 roundings (0.3-0.4% of
                # the logits' range on ViT-Ti/16 int8).
                path = "eager"
        if path == "graph" and backend != "tensorflow":
            path = "xla" if backend == "jax" else "eager"
        if path == "xla" and backend == "torch":
            path = "eager"
        return path

    def _fast_predict_applies(self, x, steps, callbacks):
        if steps is not None or callbacks or self.run_eagerly:
            return False
        if not _is_array(x):
            return False
        backend = backend_name()
        if backend == "tensorflow":
            if getattr(self, "_distribute_strategy", None):
                return False
            import tensorflow as tf

            if tf.distribute.has_strategy():
                return False
        elif backend == "jax":
            if keras.distribution.distribution() is not None:
                return False
        return self.resolved_predict_path() != "keras"

    def _compiled_state(self):
        """The compiled functions of the model as it computes now, dropped
        when :func:`computation_key` changes (kept out of Keras' tracking).
        """
        key = computation_key(self)
        held = self.__dict__.get("_keras_vit_predict")
        if held is None or held["key"] != key:
            held = {"key": key, "paths": {}}
            self.__dict__["_keras_vit_predict"] = held
        return held["paths"]

    def _runner(self, path):
        state = self._compiled_state()
        if path not in state:
            backend = backend_name()
            if backend == "tensorflow":
                fn = _tf_runner(self, path)
            elif backend == "jax":
                fn = _jax_runner(self, path)
            else:
                fn = _torch_runner(self)
            state[path] = {"fn": fn, "sizes": set()}
        return state[path]

    def compiled_predict_sizes(self, path=None):
        """The batch sizes ``predict`` has run on ``path`` (default: the
        path it takes now)."""
        path = path or self.resolved_predict_path()
        state = (self.__dict__.get("_keras_vit_predict") or {}).get(
            "paths", {})
        return sorted(state.get(path, {}).get("sizes", ()))

    def _keras_function_is_stale(self, which):
        """True when the model's computation changed since Keras last made
        its ``which`` function: Keras resets them after ``quantize`` only.
        """
        key = computation_key(self)
        seen = self.__dict__.setdefault("_keras_vit_function_keys", {})
        stale = which in seen and seen[which] != key
        seen[which] = key
        return stale

    def make_predict_function(self, force=False):
        stale = self._keras_function_is_stale("predict")
        return super().make_predict_function(force=force or stale)

    def make_test_function(self, force=False):
        stale = self._keras_function_is_stale("test")
        return super().make_test_function(force=force or stale)

    def predict(self, x, batch_size=None, verbose="auto", steps=None,
                callbacks=None):
        if getattr(self, "naflex", False) and not isinstance(x, dict):
            from keras_vit.data import naflex

            x = naflex.model_inputs(self, x)
        # Refused before a function traced with relaxed shapes takes it.
        if _is_array(x) and getattr(self, "inputs", None) and len(
                self.inputs) == 1:
            image_sizes(self).check(tuple(x.shape))
        if not self._fast_predict_applies(x, steps, callbacks):
            return super().predict(x, batch_size=batch_size, verbose=verbose,
                                   steps=steps, callbacks=callbacks)
        if batch_size is None:
            batch_size = _DEFAULT_BATCH
        if (not isinstance(batch_size, (int, np.integer))
                or isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError("batch_size must be a positive integer; "
                             f"received batch_size={batch_size!r}")
        batch_size = int(batch_size)
        path = self.resolved_predict_path()
        dtype = self.inputs[0].dtype if self.inputs else "float32"
        x = keras.ops.convert_to_tensor(x)
        if keras.backend.standardize_dtype(x.dtype) != dtype:
            x = keras.ops.cast(x, dtype)
        n = int(x.shape[0])
        if n == 0:
            raise ValueError("predict received no images (x has shape "
                             f"{tuple(x.shape)})")
        state = self._runner(path)
        pad_to_bucket = path == "xla"
        num_batches = -(-n // batch_size)
        bar = None
        if num_batches > 1 and verbose not in (0, False):
            bar = keras.utils.Progbar(num_batches)
        outputs = []
        for i, start in enumerate(range(0, n, batch_size)):
            chunk = x if n <= batch_size else x[start:start + batch_size]
            m = int(chunk.shape[0])
            size = bucket(m, batch_size) if pad_to_bucket else m
            if size > m:
                pad = keras.ops.zeros((size - m,) + tuple(chunk.shape[1:]),
                                      chunk.dtype)
                chunk = keras.ops.concatenate([chunk, pad], 0)
            state["sizes"].add(size)
            out = state["fn"](chunk)
            outputs.append(keras.tree.map_structure(
                lambda t, m=m, size=size: keras.ops.convert_to_numpy(
                    t if m == size else t[:m]), out))
            if bar is not None:
                bar.update(i + 1)
        if len(outputs) == 1:
            return outputs[0]
        return keras.tree.map_structure(
            lambda *parts: np.concatenate(parts), *outputs)
