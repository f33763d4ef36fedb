"""Multi-head self-attention and the relative position bias of its scores."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers, ops

from keras_vit.base.options import ROPE_HALVES
from keras_vit.layers.registered import PACKAGE
from keras_vit.layers.dense import (
    FusedEinsumDense, KeptArguments, check_norm, clamp, make_norm,
    unbounded, unscaled_norm, xavier_flat)
from keras_vit.runtime import kernels


def rotate(x, table, adjacent=False):
    """Rotary position embedding (Su et al. 2021) of ``x`` (batch, tokens,
    heads, head_dim) by ``table`` (tokens, 2 * head_dim: sines, then
    cosines; or one such table per head): ``x * cos + r(x) * sin`` with
    ``r([a, b]) = [-b, a]`` over the two halves of the features, in
    float32. ``adjacent=True`` turns adjacent pairs instead (EVA-02): the
    features are reordered even then odd, and the result stays in that
    order (the dot products of queries and keys are the same).

    >>> import numpy as np
    >>> x = np.array([[[[1.0, 2.0]]]], "float32")
    >>> angle = np.pi / 2  # a quarter turn of the pair (1, 2)
    >>> table = np.array([[np.sin(angle)] * 2 + [np.cos(angle)] * 2], "float32")
    >>> np.round(ops.convert_to_numpy(rotate(x, table)), 6).tolist()
    [[[[-2.0, 1.0]]]]
    """
    sin, cos = ops.split(ops.cast(table, "float32"), 2, axis=-1)
    if len(table.shape) == 3:  # one table per head (heads, tokens, .)
        sin, cos = (ops.transpose(t, (1, 0, 2))[None] for t in (sin, cos))
    else:
        sin, cos = sin[None, :, None, :], cos[None, :, None, :]
    y = ops.cast(x, "float32")
    if adjacent:
        width = int(x.shape[-1])
        y = ops.take(y, np.concatenate([np.arange(0, width, 2),
                                        np.arange(1, width, 2)]), axis=-1)
    first, second = ops.split(y, 2, axis=-1)
    turned = ops.concatenate([-second, first], axis=-1)
    return ops.cast(y * cos + turned * sin, x.dtype)


def relative_table_rows(num_patches, num_prefix_tokens=0):
    """Rows of a 1D relative position table: 2P - 1 offsets, plus one for
    the pairs with a prefix token when there is one."""
    return 2 * int(num_patches) - 1 + (1 if num_prefix_tokens else 0)


def relative_position_index(num_tokens, table_rows):
    """(N, N) row of the relative table for each (query, key) pair: offset
    ``q - k`` at row ``q - k + P - 1``; an even number of rows adds a last
    one for every pair with a prefix token.

    >>> relative_position_index(3, 5)
    array([[2, 1, 0],
           [3, 2, 1],
           [4, 3, 2]])
    """
    has_prefix_row = table_rows % 2 == 0
    patches = (table_rows + (0 if has_prefix_row else 1)) // 2
    prefix = num_tokens - patches
    if prefix < 0 or (prefix > 0) != has_prefix_row:
        fits = f"{patches} patches" + (
            " and at least one prefix token" if has_prefix_row else
            " and no prefix token")
        raise ValueError(
            f"a relative position table of {table_rows} rows fits {fits}; "
            f"received num_tokens={num_tokens}")
    pos = np.arange(num_tokens) - prefix
    index = pos[:, None] - pos[None, :] + patches - 1
    index[:prefix, :] = table_rows - 1
    index[:, :prefix] = table_rows - 1
    return index


def relative_attention_bias(query, table):
    """The paper's 1D relative attention logits (Appendix D.4):
    ``bias[b, h, i, j] = q[b, i, h] . table[index(i, j), h] /
    sqrt(head_dim)``, to be added to the logits before the softmax.

    Args:
        query: projected queries (B, N, heads, head_dim); N must be static.
        table: (rows, heads, head_dim), see :func:`relative_position_index`.

    Returns:
        (B, heads, N, N) logits.
    """
    n = int(query.shape[1])
    rows, heads, head_dim = (int(s) for s in table.shape)
    index = relative_position_index(n, rows)
    # Every query against every offset, then one gather: N * rows products.
    logits = ops.einsum("bqhk,rhk->bhqr", query, ops.cast(table, query.dtype))
    logits = ops.reshape(logits, (-1, heads, n * rows))
    flat = (np.arange(n)[:, None] * rows + index).reshape(-1)
    bias = ops.reshape(ops.take(logits, flat, axis=2), (-1, heads, n, n))
    return bias * ops.cast(1.0 / math.sqrt(head_dim), bias.dtype)


def decomposed_bias(query, table_h, table_w, size):
    """MViTv2's decomposed relative position logits (SAM's image encoder):
    ``q . table_h[r - r' + rows - 1] + q . table_w[c - c' + cols - 1]``
    from the unscaled queries (B, rows * cols, heads, head_dim) of a
    ``size`` map; (B, heads, N, N) logits.

    >>> q = np.ones((1, 2, 1, 1), "float32")  # a 1 x 2 map, one head
    >>> h, w = np.zeros((1, 1), "float32"), np.array([[1], [2], [3]], "float32")
    >>> ops.convert_to_numpy(decomposed_bias(q, h, w, (1, 2)))[0, 0].tolist()
    [[2.0, 1.0], [3.0, 2.0]]
    """
    rows, cols = size
    heads, width = int(query.shape[2]), int(query.shape[3])
    offsets = {}
    for name, side, table in (("h", rows, table_h), ("w", cols, table_w)):
        index = np.arange(side)[:, None] - np.arange(side)[None, :] + side - 1
        offsets[name] = ops.reshape(ops.take(ops.cast(table, query.dtype),
                                             index.reshape(-1), axis=0),
                                    (side, side, width))
    q = ops.reshape(query, (-1, rows, cols, heads, width))
    per_row = ops.einsum("bxyhc,xkc->bhxyk", q, offsets["h"])
    per_col = ops.einsum("bxyhc,ykc->bhxyk", q, offsets["w"])
    n = rows * cols
    return (ops.repeat(ops.reshape(per_row, (-1, heads, n, rows)), cols,
                       axis=-1)
            + ops.tile(ops.reshape(per_col, (-1, heads, n, cols)),
                       (1, 1, 1, rows)))


class ReturnsScores:
    """The output shapes of a layer whose call returns its input's shape
    and, when asked, attention maps (B, heads, N, N): written out because
    tracing the call fails under ``keras.RematScope``."""

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, x, training=None,
                            return_attention_scores=False, **kwargs):
        out = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return out
        b, n = x.shape[0], x.shape[1]
        return out, keras.KerasTensor((b, self.num_heads, n, n),
                                      dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadSelfAttention(ReturnsScores, KeptArguments, layers.Layer):
    """Multi-head dot-product self-attention with the official parameter layout.

    The projections ``query``, ``key``, ``value`` (kernels (D, heads,
    D/heads)) and ``out`` (kernel (heads, D/heads, D)) have the released
    checkpoints' shapes and Keras' ``MultiHeadAttention``'s (so
    ``quantize`` and ``enable_lora`` reach them).

    The options are the ViT family's (:mod:`keras_vit.base.options`):
    ``qk_norm`` makes norms ``query_norm`` and ``key_norm``,
    ``output_norm`` one before ``out``, ``clip`` weight ``clip`` (rows [in
    min, in max, out min, out max]), ``decomposed`` (rows, cols) tables
    ``rel_pos_h``/``rel_pos_w`` (:func:`decomposed_bias`); ``rope`` is the
    form of the rotary table a call passes (:func:`rotate`).
    """

    ARGUMENTS = {"num_heads": int, "attention_dropout_rate": float,
                 "qkv_bias": bool, "proj_bias": bool, "qk_norm": bool,
                 "norm_epsilon": float, "norm": check_norm,
                 "rope": lambda form: form, "rope_halves": lambda v: v,
                 "output_norm": bool, "value_norm": bool, "clip": bool,
                 "differential": lambda v: v,
                 "index": int, "decomposed": lambda v: None if v is None
                 else [int(s) for s in v]}

    def __init__(self, num_heads, attention_dropout_rate=0.0, qkv_bias=True,
                 proj_bias=True, qk_norm=False, norm_epsilon=1e-6,
                 norm="layer", rope=None, output_norm=False,
                 rope_halves=None, differential=None, index=0,
                 decomposed=None, value_norm=False, clip=False, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        self.dropout = layers.Dropout(self.attention_dropout_rate,
                                      dtype=self.dtype_policy)

    def build(self, input_shape):
        dim = int(input_shape[-1])
        if dim % self.num_heads:
            raise ValueError(
                f"hidden size {dim} is not divisible by num_heads={self.num_heads}"
            )
        head_dim = dim // self.num_heads
        self.head_dim = head_dim
        if self.differential and head_dim % 2:
            raise ValueError(
                "differential attention splits each head's queries and keys "
                f"in two halves: the head width {dim} / num_heads="
                f"{self.num_heads} = {head_dim} must be even; received "
                f"differential={self.differential!r}")
        for name in ("query", "key", "value"):
            layer = FusedEinsumDense(
                "abc,cde->abde", (None, self.num_heads, head_dim),
                bias_axes="de" if self.qkv_bias else None,
                kernel_initializer=xavier_flat(dim, dim),
                bias_initializer="zeros", dtype=self.dtype_policy, name=name)
            layer.build(tuple(input_shape))
            setattr(self, name, layer)
        self.out = FusedEinsumDense(
            "abcd,cde->abe", (None, dim),
            bias_axes="e" if self.proj_bias else None,
            kernel_initializer=xavier_flat(dim, dim),
            bias_initializer="zeros", dtype=self.dtype_policy, name="out")
        self.out.build(tuple(input_shape[:-1]) + (self.num_heads, head_dim))
        if self.differential:
            self._build_differential(input_shape)
        for name, side in zip(("h", "w"), self.decomposed or ()):
            setattr(self, f"rel_pos_{name}", self.add_weight(
                name=f"rel_pos_{name}", shape=(2 * side - 1, head_dim),
                initializer="zeros"))
        if self.qk_norm:  # differential attention's see the half heads
            split = 2 if self.differential else 1
            heads_shape = tuple(input_shape[:-1]) + (
                self.num_heads * split, head_dim // split)
            for name in ("query_norm", "key_norm"):
                norm = make_norm(self.norm, self.norm_epsilon,
                                 self.dtype_policy, name)
                norm.build(heads_shape)
                setattr(self, name, norm)
        if self.output_norm:
            self.context_norm = make_norm(self.norm, self.norm_epsilon,
                                          self.dtype_policy, "output_norm")
            self.context_norm.build(tuple(input_shape[:-1]) + (dim,))
        if self.clip:
            self.clip_bounds = self.add_weight(
                name="clip", shape=(4, 4), initializer=unbounded,
                trainable=False)
        self.built = True

    def _project(self, layer, x, index):
        """``layer`` of ``x``, both clamped by row ``index`` of the clip
        bounds where the layer has them."""
        if not self.clip:
            return layer(x)
        bounds = ops.cast(self.clip_bounds[index], "float32")
        return clamp(layer(clamp(x, bounds[:2])), bounds[2:])

    def _build_differential(self, input_shape):
        half = self.head_dim // 2
        names = (("q1", "k1", "q2", "k2") if self.differential == "vectors"
                 else ("a", "b"))
        for name in names:
            setattr(self, f"lambda_{name}", self.add_weight(
                name=f"lambda_{name}",
                shape=(half,) if self.differential == "vectors" else (),
                initializer=(keras.initializers.RandomNormal(stddev=0.1)
                             if self.differential == "vectors"
                             else "zeros"), dtype="float32"))
        self.sub_norm = make_norm("rms", 1e-5, self.dtype_policy,
                                  "sub_norm")
        self.sub_norm.build(tuple(input_shape[:-1]) + (
            self.num_heads, self.head_dim))

    @property
    def lambda_init(self):
        """Differential attention's depth-dependent start of lambda."""
        return 0.8 - 0.6 * math.exp(-0.3 * self.index)

    def _lambda(self):
        if self.differential == "vectors":
            first = ops.exp(ops.sum(self.lambda_q1 * self.lambda_k1))
            second = ops.exp(ops.sum(self.lambda_q2 * self.lambda_k2))
        else:
            first, second = ops.exp(self.lambda_a), ops.exp(self.lambda_b)
        return first - second + self.lambda_init

    def differential_context(self, q, k, v, bias, dropout, training,
                             need_probs):
        """Differential attention's context (B, N, heads, head_dim) and
        maps: ``softmax(q1 k1) v - lambda softmax(q2 k2) v`` of each head's
        query and key halves, RMS-normed (``sub_norm``) and scaled by ``1 -
        lambda_init``. The halves run as ``2 * heads`` heads of one call,
        zero-padded to the values' width."""
        half = self.head_dim // 2
        shape = ops.shape(q)
        split = (shape[0], shape[1], 2 * self.num_heads, half)
        zeros = ((0, 0), (0, 0), (0, 0), (0, half))
        q, k = (ops.pad(ops.reshape(t, split), zeros) for t in (q, k))
        v = ops.repeat(v, 2, axis=2)
        if bias is not None and bias.shape[1] not in (None, 1):
            bias = ops.repeat(bias, 2, axis=1)
        context, probs = kernels.attention(
            q, k, v, bias, 1.0 / math.sqrt(half), dropout, training,
            need_probs=need_probs)
        lam = ops.cast(self._lambda(), context.dtype)
        pairs = ops.reshape(context, (shape[0], shape[1], self.num_heads, 2,
                                      self.head_dim))
        context = pairs[:, :, :, 0] - lam * pairs[:, :, :, 1]
        context = self.sub_norm(context) * ops.cast(
            1.0 - self.lambda_init, context.dtype)
        if probs is not None:
            maps = ops.reshape(probs, (shape[0], self.num_heads, 2, shape[1],
                                       shape[1]))
            probs = maps[:, :, 0] - ops.cast(lam, maps.dtype) * maps[:, :, 1]
        return context, probs

    def _qkv(self, x):
        """q, k, v as (B, N, heads, D/heads), q and k normalised per head
        with ``qk_norm`` (per half head with ``differential``)."""
        q, k, v = (self._project(layer, x, n) for n, layer in enumerate(
            (self.query, self.key, self.value)))
        if self.qk_norm and self.differential:
            shape = ops.shape(q)
            halves = (shape[0], shape[1], 2 * self.num_heads,
                      self.head_dim // 2)
            q, k = (ops.reshape(norm(ops.reshape(t, halves)), shape)
                    for norm, t in ((self.query_norm, q),
                                    (self.key_norm, k)))
        elif self.qk_norm:
            q, k = self.query_norm(q), self.key_norm(k)
        if self.value_norm:
            v = unscaled_norm(v, self.norm, self.norm_epsilon)
        return q, k, v

    def call(self, x, training=None, return_attention_scores=False,
             attention_bias=None, relative_embedding=None, rope=None):
        """``attention_bias``: logits added before the softmax.
        ``relative_embedding``: a 1D relative table
        (:func:`relative_attention_bias`). ``rope``: a rotary table that
        turns the queries and keys after their norms (:func:`rotate`)."""
        q, k, v = self._qkv(x)
        if rope is not None:
            adjacent = not (ROPE_HALVES[self.rope] if self.rope_halves
                            is None else self.rope_halves)
            q, k = rotate(q, rope, adjacent), rotate(k, rope, adjacent)
        relative = (relative_attention_bias(q, relative_embedding)
                    if relative_embedding is not None else
                    decomposed_bias(q, self.rel_pos_h, self.rel_pos_w,
                                    self.decomposed)
                    if self.decomposed else None)
        if relative is not None:
            attention_bias = (relative if attention_bias is None
                              else attention_bias + relative)
        dropout = (self.dropout if training is True
                   and self.attention_dropout_rate > 0 else None)
        attend = (self.differential_context if self.differential else
                  lambda q, k, v, bias, *rest, need_probs: kernels.attention(
                      q, k, v, bias, 1.0 / math.sqrt(self.head_dim), *rest,
                      need_probs=need_probs))
        context, probs = attend(q, k, v, attention_bias, dropout, training,
                                need_probs=return_attention_scores)
        if self.output_norm:  # width spelled out: -1 leaves it unknown
            shape = ops.shape(context)
            context = ops.reshape(self.context_norm(ops.reshape(
                context, (shape[0], shape[1],
                          self.num_heads * self.head_dim))), shape)
        y = self._project(self.out, context, 3)
        return (y, probs) if return_attention_scores else y
