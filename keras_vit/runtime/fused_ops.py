"""TensorFlow spellings of ViT ops that TensorFlow's CPU graph fuses.

Grappler's remapper fuses ``MatMul + BiasAdd + GELU`` into one oneDNN
kernel only if each op's inputs come in the pattern's order, and its
canonicalizer first sorts the inputs of commutative ops by node name, so
``tf.nn.gelu`` and ``keras.ops.gelu`` never fuse. :func:`dense_gelu_tanh`
names its nodes so that the sorted order is the pattern's under any model
name: its ops live in the absolute scope ``keras_vit_gelu_b`` (``o0`` ...
``o9`` fix their order), the constants wanted before them in
``keras_vit_gelu_a/`` and after them in ``keras_vit_gelu_c/`` (so constants
merged across blocks still sort right). TensorFlow-only.

LayerNorm stays Keras' own: none of TensorFlow 2.21's three LayerNorm
patterns can be reached from a Keras 3 model (measured on an AVX-512 CPU
with oneDNN: 0 ``_MklLayerNorm`` nodes).
"""

from __future__ import annotations

import functools
import math

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_C1, _C2 = _SQRT_2_OVER_PI, _SQRT_2_OVER_PI * 0.044715

# Absolute name scopes (a trailing "/" makes a scope absolute in a graph).
_BEFORE = "keras_vit_gelu_a/"
_OPS = "keras_vit_gelu_b/"
_AFTER = "keras_vit_gelu_c/"


def dense_gelu_tanh(x, kernel, bias):
    """``gelu_tanh(x @ kernel + bias)`` for a 2-D ``x``, spelled so that
    TensorFlow's CPU graph fuses all of it into one oneDNN matmul.

    >>> import numpy as np, tensorflow as tf
    >>> from keras_vit.layers import gelu_tanh
    >>> rng = np.random.default_rng(0)
    >>> x, k, b = (rng.normal(size=s).astype("float32")
    ...            for s in ((4, 8), (8, 16), (16,)))
    >>> y = dense_gelu_tanh(tf.constant(x), tf.constant(k), tf.constant(b))
    >>> ref = gelu_tanh(tf.constant(x @ k + b))
    >>> bool(np.allclose(y, ref, atol=1e-6))
    True
    """
    import tensorflow as tf

    dtype = x.dtype
    with tf.name_scope(_OPS):
        h = bias_add(tf.linalg.matmul(x, kernel, name="mm"), bias,
                     name="o2")
        with tf.name_scope(_BEFORE):
            coefficient = tf.constant(0.044715, dtype, name="coefficient")
        with tf.name_scope(_AFTER):
            sqrt_2_over_pi = tf.constant(_SQRT_2_OVER_PI, dtype,
                                         name="sqrt_2_over_pi")
            one = tf.constant(1.0, dtype, name="one")
            half = tf.constant(0.5, dtype, name="half")
        # x + 0.044715 x^3, as (0.044715 x) * x^2: the remapper's form of
        # pow(x, 3) after grappler's arithmetic optimiser.
        cube = tf.math.multiply(
            tf.math.multiply(coefficient, h, name="o4"),
            tf.math.square(h, name="o5"), name="o3")
        inner = tf.math.multiply(tf.math.add(h, cube, name="o6"),
                                 sqrt_2_over_pi, name="o7")
        gate = tf.math.add(tf.math.tanh(inner, name="o8"), one, name="o9")
        return tf.math.multiply(tf.math.multiply(gate, half, name="o1"), h,
                                name="o0")


# --------------------------------------------------------------------------
# Adding a bias.
#
# TensorFlow's CPU ``BiasAddGrad`` (and oneDNN's fused convolution backward)
# accumulate a bfloat16 bias gradient in bfloat16: summing 1,576 rows of
# N(0.5, 1) came out 236 short of 788, and a mixed_bfloat16 ViT's bias
# gradients 15-38% off. For a bfloat16 ``h``, ``bias_add`` sums in float32:
# * a training call uses ``BiasAdd`` with a custom gradient: a matmul with a
#   row of ones where the CPU has bfloat16 units (0.59 ms against
#   ``BiasAddGrad``'s 1.38 ms), else ``Sum`` (on AVX2 the matmul is slower,
#   10.7 against 6.2 ms, and rounds its partial sums to bfloat16);
# * any other call uses ``AddV2`` (gradient ``Sum``), which grappler still
#   fuses into the matmul, where the custom gradient's ``IdentityN`` would
#   split the fusion (mixed_bfloat16 ViT-B/16 predict 390 -> 444 ms).


@functools.lru_cache(maxsize=None)
def _bias_add_with_summed_gradient():
    """``BiasAdd`` whose bias gradient sums the rows with float32
    accumulation."""
    import tensorflow as tf

    by_matmul = _sums_rows_by_matmul()

    @tf.custom_gradient
    def add(h, bias):
        def grad(dy):
            width = tf.shape(dy)[-1]
            rows = tf.reshape(dy, (-1, width))
            if not by_matmul:
                return dy, tf.math.reduce_sum(rows, axis=0)
            ones = tf.ones((1, tf.shape(rows)[0]), dy.dtype)
            return dy, tf.reshape(tf.linalg.matmul(ones, rows), (width,))

        return tf.nn.bias_add(h, bias), grad

    return add


@functools.lru_cache(maxsize=None)
def _sums_rows_by_matmul(rows=4096, width=64):
    """True where the CPU has bfloat16 units and a bfloat16 matmul with a
    row of ones, probed once, sums ``rows`` rows rounding only once."""
    import numpy as np
    import tensorflow as tf

    from keras_vit.runtime import hardware

    if hardware.detect().bf16_units is None:
        return False
    with tf.init_scope():  # eager, also when first asked inside a trace
        terms = np.random.default_rng(0).normal(0.5, 1.0, (rows, width))
        dy = tf.cast(tf.constant(terms, tf.float32), tf.bfloat16)
        exact = np.asarray(tf.cast(dy, tf.float64)).sum(0)
        got = tf.linalg.matmul(tf.ones((1, rows), tf.bfloat16), dy)[0]
        error = np.abs(np.asarray(tf.cast(got, tf.float64)) - exact)
    return bool((error <= 2.0 ** -8 * np.abs(exact)
                 + 2.0 ** -16 * np.abs(terms).sum(0)).all())


def bias_add(h, bias, training=None, name=None):
    """``h + bias`` over ``h``'s last axis on TensorFlow, spelled so that
    grappler fuses it into the matmul or convolution before it and so that
    its gradient sums in float32 whatever ``h``'s dtype (see above).

    >>> import numpy as np, tensorflow as tf
    >>> dy = tf.ones((4096, 1), tf.bfloat16)
    >>> h, b = tf.zeros((4096, 1), tf.bfloat16), tf.zeros((1,), tf.bfloat16)
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(b)
    ...     y = bias_add(h, b, training=True)
    >>> float(tape.gradient(y, b, output_gradients=dy)[0])
    4096.0
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(b)
    ...     y = tf.nn.bias_add(h, b)          # summed in bfloat16
    >>> float(tape.gradient(y, b, output_gradients=dy)[0])
    256.0
    """
    import tensorflow as tf

    if h.dtype != tf.bfloat16:
        return tf.nn.bias_add(h, bias, name=name)
    if training is True:
        return _bias_add_with_summed_gradient()(h, bias)
    return tf.math.add(h, bias, name=name)


def dense(x, kernel, bias, training=None):
    """``x @ kernel + bias`` with the bias added by :func:`bias_add`."""
    import tensorflow as tf

    return bias_add(tf.linalg.matmul(x, kernel), bias, training)


@functools.lru_cache(maxsize=None)
def _lean_gelu_tanh():
    """tanh GELU as a ``tf.custom_gradient``: a backward of 7 element-wise
    ops where TensorFlow's autodiff emits 11."""
    import tensorflow as tf

    @tf.custom_gradient
    def gelu(h):
        dtype = h.dtype
        h2 = tf.math.square(h)
        # tanh(sqrt(2/pi) (h + 0.044715 h^3)) = tanh(h (_C1 + _C2 h^2))
        t = tf.math.tanh(h * (h2 * tf.constant(_C2, dtype)
                              + tf.constant(_C1, dtype)))
        gate = (t + tf.constant(1.0, dtype)) * tf.constant(0.5, dtype)

        def grad(dy):
            # d/dh [h gate] = gate + h/2 (1 - t^2) (_C1 + 3 _C2 h^2)
            slope = h2 * tf.constant(1.5 * _C2, dtype) + tf.constant(
                0.5 * _C1, dtype)
            return dy * gate + tf.raw_ops.TanhGrad(y=t, dy=dy * h) * slope

        return h * gate, grad

    return gelu


def dense_gelu_tanh_for_training(x, kernel, bias):
    """:func:`dense_gelu_tanh` for a training step, spelled for the fewest
    backward ops (it cannot fuse anyway).

    >>> import numpy as np, tensorflow as tf
    >>> x = tf.constant(np.linspace(-4, 4, 12, dtype="float32")[None])
    >>> k, b = tf.eye(12), tf.zeros(12)
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = dense_gelu_tanh_for_training(x, k, b)
    >>> with tf.GradientTape() as ref_tape:
    ...     ref_tape.watch(x)
    ...     ref = dense_gelu_tanh(x, k, b)
    >>> bool(np.allclose(y, ref, atol=1e-6))
    True
    >>> bool(np.allclose(tape.gradient(y, x), ref_tape.gradient(ref, x),
    ...                  atol=1e-6))
    True
    """
    return _lean_gelu_tanh()(dense(x, kernel, bias, training=True))


# --------------------------------------------------------------------------
# Element-wise chains of a training step as small XLA programs.
#
# TensorFlow's graph runs each element-wise op of GELU and LayerNorm as its
# own pass over the activations; compiled with XLA (called from the non-XLA
# graph, the matmuls stay oneDNN's) each chain is one fused loop: the
# mixed_bfloat16 ViT-B/16 training step went from 1.46 to 1.34 s (batch 8,
# 2-core AVX-512 EPYC). A sum over the last axis is a dot with a column of
# ones, faster on XLA:CPU than its reduce loops (a LayerNorm gradient 2.1 ->
# 1.0 ms); a sum over rows is left to TensorFlow's graph, which is faster.


def _last_axis_sum(t):
    """``sum(t, -1, keepdims=True)`` as a dot with a column of ones."""
    import tensorflow as tf

    width = t.shape[-1]
    rows = tf.reshape(t, (-1, width))
    return tf.reshape(tf.matmul(rows, tf.ones((width, 1), t.dtype)),
                      tf.concat([tf.shape(t)[:-1], [1]], 0))


@functools.lru_cache(maxsize=None)
def _xla_gelu(form):
    """GELU of ``form`` with its gradient, each one XLA program, float32
    inside."""
    import tensorflow as tf

    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)

    def gate_and_slope(f):
        """``gelu(f) = f * gate`` and ``d gelu / d f``."""
        if form == "tanh":
            t = tf.math.tanh(f * (f * f * _C2 + _C1))
            gate = (t + 1.0) * 0.5
            slope = gate + f * 0.5 * (1.0 - t * t) * (
                f * f * (3.0 * _C2) + _C1)
        else:
            gate = (tf.math.erf(f * inv_sqrt2) + 1.0) * 0.5
            slope = gate + f * tf.math.exp(-0.5 * f * f) * inv_sqrt_2pi
        return gate, slope

    @tf.function(jit_compile=True, autograph=False)
    def forward(h):
        f = tf.cast(h, tf.float32)
        gate, _ = gate_and_slope(f)
        return tf.cast(f * gate, h.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def backward(h, dy):
        f = tf.cast(h, tf.float32)
        _, slope = gate_and_slope(f)
        return tf.cast(tf.cast(dy, tf.float32) * slope, h.dtype)

    @tf.custom_gradient
    def gelu(h):
        return forward(h), lambda dy: backward(h, dy)

    return gelu


def xla_gelu(h, form="tanh"):
    """``form`` (``"tanh"`` or ``"exact"``) GELU of ``h`` for a training
    step: forward and gradient each one XLA program (see above). The same
    numbers as :func:`keras_vit.layers.gelu` to float32 rounding.

    >>> import numpy as np, tensorflow as tf
    >>> from keras_vit.layers import gelu
    >>> h = tf.constant(np.linspace(-5, 5, 11, dtype="float32"))
    >>> with tf.GradientTape(persistent=True) as tape:
    ...     tape.watch(h)
    ...     y, ref = xla_gelu(h, "exact"), gelu(h, "exact")
    >>> bool(np.allclose(y, ref, atol=1e-6))
    True
    >>> bool(np.allclose(tape.gradient(y, h), tape.gradient(ref, h),
    ...                  atol=1e-6))
    True
    """
    return _xla_gelu(form)(h)


@functools.lru_cache(maxsize=None)
def _xla_layer_norm(epsilon, out_dtype):
    """LayerNorm over the last axis with its gradient, each one XLA
    program, float32 inside, cast to ``out_dtype`` inside the forward
    program (saving a pass)."""
    import tensorflow as tf

    def mean(t):
        return _last_axis_sum(t) * (1.0 / t.shape[-1])

    @tf.function(jit_compile=True, autograph=False)
    def forward(x, gamma, beta):
        f = tf.cast(x, tf.float32)
        mu = mean(f)
        centred = f - mu
        rstd = tf.math.rsqrt(mean(centred * centred) + epsilon)
        y = centred * rstd * tf.cast(gamma, tf.float32) + tf.cast(
            beta, tf.float32)
        return tf.cast(y, out_dtype), mu, rstd

    @tf.function(jit_compile=True, autograph=False)
    def backward(x, gamma, mu, rstd, dy):
        f = tf.cast(x, tf.float32)
        d = tf.cast(dy, tf.float32)
        normed = (f - mu) * rstd
        g = d * tf.cast(gamma, tf.float32)
        dx = rstd * (g - mean(g) - normed * mean(g * normed))
        return tf.cast(dx, x.dtype), d * normed

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        y, mu, rstd = forward(x, gamma, beta)

        def grad(dy):
            dx, d_normed = backward(x, gamma, mu, rstd, dy)
            width = x.shape[-1]
            d_gamma = tf.math.reduce_sum(tf.reshape(d_normed, (-1, width)), 0)
            d_beta = tf.math.reduce_sum(
                tf.reshape(tf.cast(dy, tf.float32), (-1, width)), 0)
            # gamma and beta: one layer's weights, of one dtype.
            return (dx, tf.cast(d_gamma, gamma.dtype),
                    tf.cast(d_beta, gamma.dtype))

        return y, grad

    return layer_norm


def xla_layer_norm(x, gamma, beta, epsilon, out_dtype=None):
    """LayerNorm of ``x`` over its last axis (``(x - mean) / sqrt(var +
    epsilon) * gamma + beta``) for a training step: forward and gradient
    each one XLA program, float32 inside. Keras' ``LayerNormalization``
    numbers to float32 rounding; the result in ``out_dtype`` (default:
    the input's).

    >>> import numpy as np, tensorflow as tf, keras
    >>> x = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 8)),
    ...                 tf.float32)
    >>> ln = keras.layers.LayerNormalization(epsilon=1e-6)
    >>> ln.build(x.shape)
    >>> y = xla_layer_norm(x, ln.gamma, ln.beta, 1e-6)
    >>> bool(np.allclose(y, ln(x), atol=1e-5))
    True
    """
    import tensorflow as tf

    out_dtype = tf.as_dtype(out_dtype or x.dtype)
    return _xla_layer_norm(float(epsilon), out_dtype)(
        x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta))


@functools.lru_cache(maxsize=None)
def _xla_softmax(scale):
    """``softmax(scale * logits)`` over the last axis with its gradient,
    each one XLA program."""
    import tensorflow as tf

    @tf.function(jit_compile=True, autograph=False)
    def forward(logits):
        f = tf.cast(logits, tf.float32) * scale
        e = tf.math.exp(f - tf.math.reduce_max(f, -1, keepdims=True))
        return tf.cast(e / _last_axis_sum(e), logits.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def backward(probs, dy):
        p = tf.cast(probs, tf.float32)
        d = tf.cast(dy, tf.float32)
        return tf.cast(p * (d - _last_axis_sum(d * p)) * scale, probs.dtype)

    @tf.custom_gradient
    def softmax(logits):
        probs = forward(logits)
        return probs, lambda dy: backward(probs, dy)

    return softmax


def xla_softmax(logits, scale=1.0):
    """``softmax(scale * logits)`` over the last axis for a training step:
    forward and gradient each one XLA program, float32 inside.

    >>> import numpy as np, tensorflow as tf
    >>> z = tf.constant(np.random.default_rng(0).normal(size=(2, 5)),
    ...                 tf.float32)
    >>> with tf.GradientTape(persistent=True) as tape:
    ...     tape.watch(z)
    ...     p, ref = xla_softmax(z, 0.5), tf.nn.softmax(z * 0.5)
    ...     loss, ref_loss = tf.reduce_sum(p * z), tf.reduce_sum(ref * z)
    >>> bool(np.allclose(p, ref, atol=1e-6))
    True
    >>> bool(np.allclose(tape.gradient(loss, z), tape.gradient(ref_loss, z),
    ...                  atol=1e-6))
    True
    """
    return _xla_softmax(float(scale))(logits)
