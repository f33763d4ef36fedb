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
(``tests/core/test_graph_fusion.py`` builds them under several names and counts
the fused nodes). The numbers are those of
:func:`keras_vit.layers.gelu_tanh`: the fused kernel and the unfused ops
agree to float32 rounding.

Everything here is TensorFlow-only and only changes op names and input
order; the JAX and torch backends never import this module.

LayerNorm stays Keras' own (Mean, SquaredDifference, Rsqrt and a few
element-wise ops, float32 statistics under bf16): TensorFlow 2.21's
remapper knows three LayerNorm patterns and none can be reached from a
Keras 3 model, measured on an AVX-512 CPU with oneDNN (counts from
:mod:`keras_vit.graph_ops`):

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
        h = tf.nn.bias_add(tf.linalg.matmul(x, kernel, name="mm"), bias,
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


def dense(x, kernel, bias):
    """``x @ kernel + bias`` with the bias added by ``BiasAdd``: grappler
    fuses it into the matmul, and its gradient is one ``BiasAddGrad``
    instead of a broadcast ``Sum``."""
    import tensorflow as tf

    return tf.nn.bias_add(tf.linalg.matmul(x, kernel), bias)


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
    with the bias gradient from ``BiasAddGrad``.

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
    return _lean_gelu_tanh()(dense(x, kernel, bias))
