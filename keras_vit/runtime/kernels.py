"""How the layers' math runs on this machine and backend: the spellings
each backend runs fastest or most exactly, chosen by
:func:`keras_vit.runtime.hardware.plan`; the same numbers as the plain Keras
ops they replace, to float rounding.
"""

from __future__ import annotations

import functools
import math
import re

import keras
from keras import ops

from keras_vit.runtime import fused_ops, hardware
from keras_vit.runtime.backend import is_tensorflow, name as backend_name

#: GELU's two forms: flax's tanh approximation and erf.
GELU_FORMS = ("tanh", "exact")


def chains_in_xla(dtype, training):
    """Whether a call with ``training`` runs its GELU, LayerNorm and
    softmax chains as XLA programs: training calls only, where the plan's
    ``elementwise`` says so."""
    if training is not True:
        return False
    return hardware.plan(dtype).elementwise == "xla"


# TensorFlow's CPU kernels and XLA:CPU's reduce of JAX's broadcast-add
# gradient accumulate a bfloat16 bias gradient in bfloat16 (10-40% off the
# float32 model's); torch accumulates in float32.


@functools.lru_cache(maxsize=None)
def _jax_bias_add():
    """``h + bias`` whose bias gradient sums in float32, rounding once."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def add(h, bias):
        return h + bias

    def forward(h, bias):
        return h + bias, None

    def backward(_, dy):
        axes = tuple(range(dy.ndim - 1))
        return dy, jnp.sum(dy, axis=axes, dtype=jnp.float32).astype(dy.dtype)

    add.defvjp(forward, backward)
    return add


def add_bias(h, bias, training=None):
    """``h + bias`` over ``h``'s last axis, ``bias`` of ``h``'s dtype, with
    a gradient summed in float32 on every backend."""
    backend = backend_name()
    if backend == "tensorflow":
        return fused_ops.bias_add(h, bias, training)
    if backend == "jax":
        return _jax_bias_add()(h, bias)
    return h + bias


def matmul_bias(x, kernel, bias, training=None):
    """``x @ kernel + bias`` for a 2-D ``x``, the bias gradient summed in
    float32 (:func:`add_bias`). On torch one ``addmm``: a separate add
    cost 3.4x the fused call for ViT-B's MLP in bf16 on an AMX CPU."""
    backend = backend_name()
    if backend == "tensorflow":
        return fused_ops.dense(x, kernel, bias, training)
    if backend == "torch":
        import torch

        return torch.addmm(bias, x, kernel)
    return add_bias(ops.matmul(x, kernel), bias, training)


@functools.lru_cache(maxsize=None)
def flat_einsum(equation):
    """``(k, n)`` when ``equation`` is a plain projection that one 2-D
    matmul computes: the input's last ``k`` axes contract with the kernel's
    first ``k`` and the kernel's other ``n`` axes end the output, in order
    (``"abc,cde->abde"``, ``"abcd,cde->abe"``); None for anything else."""
    match = re.fullmatch(r"(\w+),(\w+)->(\w+)", equation.replace(" ", ""))
    if not match:
        return None
    inp, ker, out = match.groups()
    for k in range(1, len(ker)):
        lead = len(inp) - k
        if (lead > 0 and ker[:k] == inp[lead:] and out[:lead] == inp[:lead]
                and out[lead:] == ker[k:]):
            return k, len(ker) - k
    return None


def dense(x, kernel, bias, activation=None, gelu=None, training=None):
    """``activation(x @ kernel + bias)`` for a 2-D ``x`` (``gelu``: the
    activation is the GELU of that form), in the spelling that fuses best
    on this plan."""
    if gelu in GELU_FORMS and chains_in_xla(x.dtype, training):
        return fused_ops.xla_gelu(matmul_bias(x, kernel, bias, training),
                                  gelu)
    if gelu == "tanh" and is_tensorflow():
        spell = (fused_ops.dense_gelu_tanh_for_training
                 if training is True else fused_ops.dense_gelu_tanh)
        return spell(x, kernel, bias)
    y = matmul_bias(x, kernel, bias, training)
    if activation not in (None, keras.activations.linear):
        y = activation(y)
    return y


def einsum_dense(inputs, equation, kernel, bias, training=None):
    """The einsum projection ``equation`` of ``inputs`` by ``kernel`` plus
    ``bias``, as one 2-D :func:`matmul_bias` on the flattened tokens and
    kernel. None where ``equation`` is not a plain projection
    (:func:`flat_einsum`)."""
    flat = flat_einsum(equation)
    if flat is None:
        return None
    k, _ = flat
    kernel_shape = tuple(kernel.shape)
    rows = math.prod(kernel_shape[:k])
    cols = math.prod(kernel_shape[k:])
    shape = ops.shape(inputs)
    lead = len(inputs.shape) - k
    x = ops.reshape(inputs, (-1, rows))
    y = matmul_bias(x, ops.reshape(ops.cast(kernel, x.dtype), (rows, cols)),
                    ops.reshape(ops.cast(bias, x.dtype), (cols,)), training)
    return ops.reshape(y, (*shape[:lead], *kernel_shape[k:]))


def layer_norm(inputs, gamma, beta, epsilon, dtype, training=None):
    """A last-axis LayerNorm's training call as one XLA program each way,
    where the plan runs elementwise chains in XLA; None otherwise."""
    if not chains_in_xla(inputs.dtype, training):
        return None
    return fused_ops.xla_layer_norm(inputs, gamma, beta, epsilon, dtype)


#: cuDNN's flash attention trains only on sequences of a multiple of this
#: many tokens (JAX: "Unsupported sequence length" for ViT-B/16's 197).
ATTENTION_MULTIPLE = 64


def padded_attention(q, k, v, scale, multiple=ATTENTION_MULTIPLE,
                     implementation=None):
    """JAX's ``dot_product_attention`` of ``q``, ``k``, ``v`` (batch,
    tokens, heads, head width) over the tokens padded with zeros to a
    multiple of ``multiple`` (masked, then dropped): a shape cuDNN's flash
    kernel trains on. ``implementation``: JAX's (default: cuDNN for
    bf16/float16 on a GPU, else XLA's)."""
    import jax
    import jax.numpy as jnp

    tokens = q.shape[1]
    padded = -(-tokens // multiple) * multiple
    if padded != tokens:
        pad = ((0, 0), (0, padded - tokens), (0, 0), (0, 0))
        q, k, v = (jnp.pad(t, pad) for t in (q, k, v))
    if implementation is None:
        implementation = ("cudnn" if q.dtype in (jnp.bfloat16, jnp.float16)
                          and hardware.cudnn_flash_attention() else "xla")
    lengths = jnp.full((q.shape[0],), tokens, jnp.int32)
    context = jax.nn.dot_product_attention(
        q, k, v, scale=scale, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=implementation)
    return context[:, :tokens]


def attention(q, k, v, bias, scale, dropout, training=None,
              need_probs=False):
    """Scaled dot-product attention of ``q``, ``k``, ``v`` (batch,
    tokens, heads, head width) with optional logits ``bias`` (broadcast to
    (batch, heads, queries, keys)): ``(context, probabilities)``, the
    probabilities None where the spelling never forms them.
    ``dropout``: None, or the dropout layer on the probabilities in
    training. ``need_probs``: the caller returns attention maps."""
    plan = hardware.plan(q.dtype)
    path = (plan.train_attention if training is True
            and plan.train_attention else plan.attention)
    if (not need_probs and dropout is None and bias is None
            and path == "padded" and backend_name() == "jax"):
        return padded_attention(q, k, v, scale), None
    if (not need_probs and dropout is None
            and path in ("fused", "padded")):
        return ops.dot_product_attention(q, k, v, bias=bias,
                                         scale=scale), None
    # Plain einsums: TensorFlow's own dot_product_attention ran 5% slower
    # in the ViT-S/16 graph on a 2-core EPYC.
    dtype = q.dtype
    xla = chains_in_xla(dtype, training)
    if not xla:  # the XLA softmax scales inside its own loop
        q = q * ops.cast(scale, q.dtype)
    logits = ops.einsum("bqhk,bvhk->bhqv", q, k)
    if bias is not None:
        # Softmax in float32: bf16 logits lose small differences.
        bias = ops.cast(bias, "float32")
        logits = ops.cast(logits, "float32") + (bias / scale if xla else bias)
    if xla:
        probs = ops.cast(fused_ops.xla_softmax(logits, scale), dtype)
    elif bias is None and plan.softmax == "input":
        # oneDNN's bf16 softmax computes in float32 inside.
        probs = ops.softmax(logits, axis=-1)
    else:
        logits = ops.cast(logits, "float32")
        probs = ops.cast(ops.softmax(logits, axis=-1), dtype)
    weights = (probs if dropout is None
               else dropout(probs, training=training))
    return ops.einsum("bhqv,bvhk->bqhk", weights, v), probs
