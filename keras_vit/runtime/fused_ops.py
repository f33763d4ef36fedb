"""TensorFlow spellings of ViT ops that TensorFlow's CPU graph fuses.

On a CPU, TensorFlow optimises every ``tf.function`` graph with grappler
before oneDNN runs it. Grappler's remapper replaces known subgraphs by
fused kernels (``MatMul + BiasAdd + GELU`` becomes one
``_MklNativeFusedMatMul`` with ``fused_ops=[BiasAdd, GeluApproximate]``),
but it matches op types *and the order of each op's inputs*, and before it
looks, grappler's canonicalizer sorts the inputs of commutative ops (Mul,
AddV2) by node name (``tensorflow/core/grappler/utils/canonicalizer.cc``).
``tf.nn.gelu``, ``keras.ops.gelu`` and a hand-written tanh GELU all end up
in an order the remapper's pattern rejects, so nothing fused.

:func:`dense_gelu_tanh` writes the same formula with node names chosen so
that the sorted order is the pattern's, in every block and under any model
name:

* its own ops live in one absolute name scope, ``keras_vit_gelu_b`` (made
  unique per block by TensorFlow as ``keras_vit_gelu_b_1``, ...), where the
  node names ``o0`` ... ``o9`` fix their relative order;
* the constants that the pattern wants *before* an op of the block live in
  ``keras_vit_gelu_a/``, those it wants *after* in ``keras_vit_gelu_c/``.
  Grappler's common-subexpression elimination merges equal constants of all
  blocks into one node named after one of them; since every block's ops
  sort between the two scopes, the merged constants still sort right.

The model's own name never enters a comparison, so renaming a model,
nesting it, or running two in one graph changes nothing
(``tests/runtime/test_graph_ops.py`` builds them under several names and counts
the fused nodes). The numbers are those of
:func:`keras_vit.layers.gelu_tanh`: the fused kernel and the unfused ops
agree to float32 rounding.

Everything here is TensorFlow-only and only changes op names and input
order; the JAX and torch backends never import this module.

LayerNorm stays Keras' own (Mean, SquaredDifference, Rsqrt and a few
element-wise ops, float32 statistics under bf16): TensorFlow 2.21's
remapper knows three LayerNorm patterns and none can be reached from a
Keras 3 model, measured on an AVX-512 CPU with oneDNN (counts from
:mod:`keras_vit.runtime.graph_ops`):

* the Mean / Sub / Square / Rsqrt spelling written in exactly the
  pattern's input order (names chosen as for the GELU) gave 0
  ``_MklLayerNorm`` nodes, with Square(Sub) or, when grappler rewrote it,
  SquaredDifference;
* the tf.keras 2 spelling through ``FusedBatchNormV3`` needs its ``Fill``
  scale and offset nodes, which constant folding removes whenever the batch
  size is static (every first trace of ``predict``);
* the instance-norm-like pattern needs gamma and beta as graph constants,
  not variables.
"""

from __future__ import annotations

import functools
import math

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

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
# A bias's gradient is the sum of the output's gradient over every row (every
# token of every image: 1,576 rows for ViT-B at batch 8, 4,096 for a patch
# embedding at batch 32). TensorFlow's CPU kernels for that sum,
# ``BiasAddGrad`` and the bias part of oneDNN's fused convolution backward,
# accumulate a bfloat16 gradient in bfloat16: once the running sum is 256
# times a term, adding the term rounds it away (their float16 kernels
# accumulate in float32; ``Sum`` does for bfloat16). Summing 1,576 rows of
# N(0.5, 1) that way came out 236 short of 788 (30%); a mixed_bfloat16 ViT's
# bias gradients came out 15-38% off the float32 model's while every other
# gradient agreed to ~2%, on this backend only (JAX and torch sum in
# float32). Float32 and float16 are unaffected, and there ``BiasAdd`` stays.
#
# ``bias_add`` is the one place TensorFlow's layers here add a bias. For a
# bfloat16 ``h`` the sum accumulates in float32 and rounds once:
# * a training call (``training=True``) adds with ``BiasAdd`` and sums the
#   gradient in float32 with the faster of two spellings that do, chosen
#   once per process (_sums_rows_by_matmul): a matmul with a row of ones
#   where the CPU multiplies bfloat16 natively (oneDNN accumulates its
#   products in float32: on a 2-core AMD EPYC with avx512_bf16 over (1576,
#   3072) 0.59 ms against ``BiasAddGrad``'s 1.38 ms), else ``Sum``. On a
#   CPU without bfloat16 units (AVX2 only) the matmul is both slower (10.7
#   ms against Sum's 6.2 ms, 2-core AMD EPYC, avx2) and rounds its partial
#   sums to bfloat16 (4096 rows of N(0.5, 1): 11.4 off the exact sum,
#   where one rounding allows 8.3);
# * any other call adds with ``AddV2``, whose gradient is ``Sum`` (float32
#   accumulation), so a gradient through an inference call is right too;
#   grappler's remapper fuses that add into the matmul (and the GELU) exactly
#   as it fuses ``BiasAdd``, so inference graphs do not change, where the
#   custom gradient's ``IdentityN`` would split the MatMul + BiasAdd + GELU
#   fusion (mixed_bfloat16 ViT-B/16 predict 390 -> 444 ms).


@functools.lru_cache(maxsize=None)
def _bias_add_with_summed_gradient():
    """``BiasAdd`` whose bias gradient is ``ones(1, rows) @ dy``: the sum
    over rows with float32 accumulation, at matmul speed. Built once, on
    first use."""
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
    """True where a bfloat16 matmul with a row of ones is the faster float32
    sum over rows: the CPU has bfloat16 matrix units (the package's reading
    of its flags) and, probed once here, the matmul's sum of ``rows`` rows
    of N(0.5, 1) rounds once, as TensorFlow's ``Sum`` (float32 accumulation)
    does. Anything else sums with ``Sum``."""
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
    ``training`` (True for a training call) picks the spelling for a
    bfloat16 ``h``; the numbers are the same either way.

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
    """``x @ kernel + bias`` with the bias added by :func:`bias_add`:
    grappler fuses it into the matmul; its gradient is one ``BiasAddGrad``
    or, for bfloat16, a sum accumulated in float32; never a float32
    broadcast ``Sum``, which is slow."""
    import tensorflow as tf

    return bias_add(tf.linalg.matmul(x, kernel), bias, training)


@functools.lru_cache(maxsize=None)
def _lean_gelu_tanh():
    """tanh GELU as a ``tf.custom_gradient``: the forward keeps the gate
    and tanh it needs, and the backward is 7 element-wise ops (one
    ``TanhGrad``) where TensorFlow's autodiff of the forward's ops emits
    11. Built once, on first use (TensorFlow is imported lazily)."""
    import tensorflow as tf

    c1 = _SQRT_2_OVER_PI
    c2 = c1 * 0.044715

    @tf.custom_gradient
    def gelu(h):
        dtype = h.dtype
        h2 = tf.math.square(h)
        # tanh(sqrt(2/pi) (h + 0.044715 h^3)) = tanh(h (c1 + c2 h^2))
        t = tf.math.tanh(h * (h2 * tf.constant(c2, dtype)
                              + tf.constant(c1, dtype)))
        gate = (t + tf.constant(1.0, dtype)) * tf.constant(0.5, dtype)

        def grad(dy):
            # d/dh [h gate] = gate + h/2 (1 - t^2) (c1 + 3 c2 h^2)
            slope = h2 * tf.constant(1.5 * c2, dtype) + tf.constant(
                0.5 * c1, dtype)
            return dy * gate + tf.raw_ops.TanhGrad(y=t, dy=dy * h) * slope

        return h * gate, grad

    return gelu


def dense_gelu_tanh_for_training(x, kernel, bias):
    """:func:`dense_gelu_tanh` for a training step: a forward whose
    outputs the backward needs cannot fuse into the matmul anyway, so it
    is spelled for the fewest backward ops instead (:func:`_lean_gelu_tanh`)
    with the bias gradient of :func:`bias_add`.

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
# In a training step TensorFlow's graph runs each element-wise op of the
# GELU and of LayerNorm (and of their gradients) as its own pass over the
# activations: a tanh GELU is about 8 passes forward and 7 backward, a
# LayerNorm about 10 each way with its float32 casts under mixed precision.
# Compiled with XLA (``tf.function(jit_compile=True)``, called from the
# non-XLA graph) each chain is one fused loop: one read and one write
# forward, two reads and one write backward. The matmuls stay oneDNN's,
# which is why the step as a whole is not compiled (hardware.plan). On a
# 2-core AMD EPYC (avx512_bf16, no AMX) this took the mixed_bfloat16
# ViT-B/16 training step from 1.46 to 1.34 s (batch 8, 224 px).
#
# Sums inside these programs are spelled for XLA:CPU. A sum over the last
# axis (LayerNorm's statistics, the softmax's normaliser) is a dot with a
# column of ones: XLA:CPU's reduce loops ran those at a fraction of the
# speed of its dot (on (1576, 768) float32: a LayerNorm gradient 2.1 ->
# 1.0 ms, the softmax gradient over (8, 12, 197, 197) 1.95 -> 1.07 ms).
# A sum over rows (gamma's and beta's gradients) is left to TensorFlow's
# graph, whose column reduction is several times XLA:CPU's.


def _last_axis_sum(t):
    """``sum(t, -1, keepdims=True)`` of a float32 tensor as a dot with a
    column of ones (see above); the same float32 sum in another order."""
    import tensorflow as tf

    width = t.shape[-1]
    rows = tf.reshape(t, (-1, width))
    return tf.reshape(tf.matmul(rows, tf.ones((width, 1), t.dtype)),
                      tf.concat([tf.shape(t)[:-1], [1]], 0))


@functools.lru_cache(maxsize=None)
def _xla_gelu(form):
    """GELU of ``form`` with its gradient, each one XLA program; the
    backward recomputes the gate from the pre-activation inside its loop
    (cheaper than storing it). Math in float32 whatever the input dtype,
    the result in the input's."""
    import tensorflow as tf

    c1 = _SQRT_2_OVER_PI
    c2 = c1 * 0.044715
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)

    def gate_and_slope(f):
        """``gelu(f) = f * gate`` and ``d gelu / d f``."""
        if form == "tanh":
            t = tf.math.tanh(f * (f * f * c2 + c1))
            gate = (t + 1.0) * 0.5
            slope = gate + f * 0.5 * (1.0 - t * t) * (f * f * (3.0 * c2) + c1)
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
    program; statistics and math in float32 (as Keras' under mixed
    precision), the output cast to ``out_dtype`` inside the forward
    program (a cast after it would be one more pass over the activations),
    the input's gradient in the input's dtype, gamma's and beta's in
    float32, summed over the rows by the graph (see above)."""
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
    each one XLA program, float32 inside, the sums as dots (see above)."""
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
    forward and gradient each one XLA program (the graph's gradient is
    four passes over the (batch, heads, tokens, tokens) scores, and a
    separate scaling of the queries two more), float32 inside, the result
    in the input's dtype.

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
