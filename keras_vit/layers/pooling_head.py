"""The layers after the blocks: multihead attention pooling ("MAP"), the
patch merger of Qwen's vision towers, SAM's neck and Gemma 4's pool."""

from __future__ import annotations

import math

import keras
from keras import layers, ops

from keras_vit.base.checks import check_choice
from keras_vit.layers.blocks import MlpBlock
from keras_vit.layers.dense import (
    FusedDense, FusedEinsumDense, KeptArguments, check_gelu, check_norm, make_norm,
    xavier_flat)
from keras_vit.layers.embeddings import runtime_grid
from keras_vit.layers.registered import PACKAGE

#: The attention pool's forms: big_vision's MAPHead, AIMv2's head.
FORMS = ("map", "aimv2")


@keras.saving.register_keras_serializable(package=PACKAGE)
class AttentionPoolHead(KeptArguments, layers.Layer):
    """Pools (B, N, D) tokens into (B, D) by attention from a learned probe.

    A learned ``probe`` (1, 1, D) is the one query of ``num_heads``-head
    attention over the tokens (projections laid out as
    :class:`~keras_vit.layers.MultiHeadSelfAttention`'s), then ``y +
    MLP(norm(y))``: big_vision's ``MAPHead``, timm's
    ``AttentionPoolLatent``, transformers'
    ``SiglipMultiheadAttentionPoolingHead``. The first
    ``num_prefix_tokens`` tokens are left out. The softmax runs in float32:
    bf16 loses the small differences between the probe's logits.

    ``form="aimv2"``: AIMv2's head, the probe itself the query, ``key`` and
    ``value`` biased as ``qkv_bias`` says, no norm and no MLP.
    """

    ARGUMENTS = {"num_heads": int, "mlp_dim": int, "gelu": check_gelu,
                 "layer_norm_epsilon": float, "num_prefix_tokens": int,
                 "form": lambda form: check_choice("form", form, FORMS),
                 "qkv_bias": bool}

    def __init__(self, num_heads, mlp_dim, gelu="tanh",
                 layer_norm_epsilon=1e-6, num_prefix_tokens=0, norm="layer",
                 form="map", qkv_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        self.norm_kind = check_norm(norm)
        for name in ("num_heads", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; "
                                 f"received {name}={getattr(self, name)}")
        if self.num_prefix_tokens < 0:
            raise ValueError("num_prefix_tokens must be 0 or more; received "
                             f"num_prefix_tokens={self.num_prefix_tokens}")

    def build(self, input_shape):
        dim = int(input_shape[-1])
        if dim % self.num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by "
                             f"num_heads={self.num_heads}")
        head_dim = dim // self.num_heads
        self.head_dim = head_dim
        self.probe = self.add_weight(name="probe", shape=(1, 1, dim),
                                     initializer="glorot_uniform")
        batch = tuple(input_shape[:1])
        map_form = self.form == "map"
        for name, length in ((("query", 1),) if map_form else ()) + (
                ("key", input_shape[1]), ("value", input_shape[1])):
            layer = FusedEinsumDense(
                "abc,cde->abde", (None, self.num_heads, head_dim),
                bias_axes="de" if map_form or self.qkv_bias else None,
                kernel_initializer=xavier_flat(dim, dim),
                bias_initializer="zeros", dtype=self.dtype_policy, name=name)
            layer.build(batch + (length, dim))
            setattr(self, name, layer)
        self.out = FusedEinsumDense(
            "abcd,cde->abe", (None, dim), bias_axes="e",
            kernel_initializer=xavier_flat(dim, dim),
            bias_initializer="zeros", dtype=self.dtype_policy, name="out")
        self.out.build(batch + (1, self.num_heads, head_dim))
        if not map_form:  # AIMv2's: the projected attention is the output
            self.built = True
            return
        self.norm = make_norm(self.norm_kind, self.layer_norm_epsilon,
                              self.dtype_policy, "norm")
        self.norm.build(batch + (1, dim))
        self.mlp = MlpBlock(self.mlp_dim, 0.0, self.gelu,
                            dtype=self.dtype_policy, name="mlp")
        self.mlp.build(batch + (1, dim))
        self.built = True

    def call(self, x, training=None, padding_bias=None):
        """``padding_bias``: a NaFlex batch's
        :class:`~keras_vit.models.positions.PaddingBias`."""
        if self.num_prefix_tokens:
            x = x[:, self.num_prefix_tokens:]
        if self.form == "map":
            q = self.query(ops.cast(self.probe, x.dtype))[0]
        else:  # AIMv2's: the probe itself, split into the heads
            q = ops.reshape(ops.cast(self.probe, x.dtype),
                            (1, self.num_heads, self.head_dim))
        k, v = self.key(x), self.value(x)
        q = q * ops.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        logits = ops.cast(ops.einsum("qhk,bvhk->bhqv", q, k), "float32")
        if padding_bias is not None:
            logits = logits + ops.cast(
                padding_bias[..., self.num_prefix_tokens:], "float32")
        probs = ops.softmax(logits, axis=-1)
        context = ops.einsum("bhqv,bvhk->bqhk", ops.cast(probs, x.dtype), v)
        y = self.out(context)  # (B, 1, D)
        if self.form == "map":
            y = y + self.mlp(self.norm(y), training=training)
        return y[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return dict(super().get_config(), norm=self.norm_kind)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchMerger(KeptArguments, layers.Layer):
    """Merges each ``merge_size`` x ``merge_size`` block of patch tokens
    into one: a norm over each token, the block's tokens concatenated,
    then Dense(k * k * D) -> exact GELU -> Dense(``width``) (none for
    ``width=None``): timm's ``Qwen3VitPatchMerger``. A dynamic-size model
    passes its ``images`` and the patch ``stride``.

    >>> import numpy as np
    >>> merger = PatchMerger((4, 6), merge_size=2, width=8)
    >>> tuple(merger(np.zeros((1, 24, 16), "float32")).shape)
    (1, 6, 8)
    """

    ARGUMENTS = {"merge_size": int, "width": lambda w: None if w is None
                 else int(w), "norm_epsilon": float, "norm": check_norm}

    def __init__(self, grid_size, merge_size=2, width=None, norm="layer",
                 norm_epsilon=1e-6, stride=None, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        self.grid_size = tuple(int(g) for g in grid_size)
        self.stride = None if stride is None else int(stride)
        if self.merge_size < 2 or any(g % self.merge_size
                                      for g in self.grid_size):
            raise ValueError(
                f"merge_size={self.merge_size} merges square blocks of "
                f"patches: it needs 2 or more, dividing the patch grid "
                f"{self.grid_size[0]} x {self.grid_size[1]}")

    @property
    def image_multiple(self):
        """What an image side must be a multiple of, or None."""
        return None if self.stride is None else self.stride * self.merge_size

    def build(self, x_shape, images_shape=None):
        dim = int(x_shape[-1])
        merged = dim * self.merge_size ** 2
        self.norm_layer = make_norm(self.norm, self.norm_epsilon,
                                    self.dtype_policy, "norm")
        self.norm_layer.build((None, dim))
        self.dense_0 = FusedDense(merged, gelu="exact",
                                  kernel_initializer="glorot_uniform",
                                  dtype=self.dtype_policy, name="dense_0")
        self.dense_0.build((None, merged))
        self.dense_1 = None
        if self.width is not None:
            self.dense_1 = FusedDense(self.width,
                                      kernel_initializer="glorot_uniform",
                                      dtype=self.dtype_policy, name="dense_1")
            self.dense_1.build((None, merged))
        self.built = True

    def call(self, x, images=None):
        k = self.merge_size
        if images is None:
            rows, cols = (g // k for g in self.grid_size)
        else:
            rows, cols = runtime_grid(images, self.stride * k)
        dim = int(x.shape[-1])
        x = self.norm_layer(x)
        x = ops.reshape(x, (-1, rows, k, cols, k, dim))
        x = ops.reshape(ops.transpose(x, (0, 1, 3, 2, 4, 5)),
                        (-1, k * k * dim))
        x = self.dense_0(x)
        if self.dense_1 is not None:
            x = self.dense_1(x)
        return ops.reshape(x, (-1, rows * cols, int(x.shape[-1])))

    def compute_output_shape(self, x_shape, images_shape=None):
        tokens = x_shape[1]
        if tokens is not None:
            tokens //= self.merge_size ** 2
        width = (self.width if self.width is not None
                 else x_shape[-1] * self.merge_size ** 2)
        return (x_shape[0], tokens, width)

    def get_config(self):
        return dict(super().get_config(), grid_size=list(self.grid_size),
                    stride=self.stride)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Neck(KeptArguments, layers.Layer):
    """SAM's neck: the patch tokens of a ``grid_size`` map through a 1 x 1
    convolution to ``channels``, a LayerNorm, a 3 x 3 convolution and a
    LayerNorm (no biases). Tokens in, tokens out.

    >>> import numpy as np
    >>> neck = Neck((2, 3), channels=4)
    >>> tuple(neck(np.zeros((1, 6, 8), "float32")).shape)
    (1, 6, 4)
    """

    ARGUMENTS = {"channels": int,
                 "grid_size": lambda grid: [int(g) for g in grid]}

    def __init__(self, grid_size, channels, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())

    def build(self, input_shape):
        rows, cols = self.grid_size
        width = int(input_shape[-1])
        for n, (kernel, inputs) in enumerate(((1, width),
                                              (3, self.channels))):
            conv = layers.Conv2D(self.channels, kernel, padding="same",
                                 use_bias=False, dtype=self.dtype_policy,
                                 name=f"conv_{n}")
            conv.build((None, rows, cols, inputs))
            norm = make_norm("layer", 1e-6, self.dtype_policy, f"norm_{n}")
            norm.build((None, rows, cols, self.channels))
            setattr(self, f"conv_{n}", conv)
            setattr(self, f"norm_{n}", norm)
        self.built = True

    def call(self, x):
        rows, cols = self.grid_size
        x = ops.reshape(x, (-1, rows, cols, int(x.shape[-1])))
        x = self.norm_1(self.conv_1(self.norm_0(self.conv_0(x))))
        return ops.reshape(x, (-1, rows * cols, self.channels))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1], self.channels)


@keras.saving.register_keras_serializable(package=PACKAGE)
class SoftTokenPool(KeptArguments, layers.Layer):
    """Gemma 4's soft-token pool: the patch tokens of a ``grid_size`` map
    averaged over each ``kernel`` x ``kernel`` cell, times
    ``sqrt(width)``; with ``standardize``, then ``(x - std_bias) *
    std_scale``.

    >>> import numpy as np
    >>> pool = SoftTokenPool((2, 4), kernel=2)
    >>> x = np.arange(8, dtype="float32").reshape(1, 8, 1)
    >>> ops.convert_to_numpy(pool(x))[0, :, 0].tolist()  # (0+1+4+5)/4, ...
    [2.5, 4.5]
    """

    ARGUMENTS = {"kernel": int, "standardize": bool,
                 "grid_size": lambda grid: [int(g) for g in grid]}

    def __init__(self, grid_size, kernel, standardize=False, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        rows, cols = self.grid_size
        if rows % self.kernel or cols % self.kernel:
            raise ValueError(
                f"soft_pool={self.kernel} averages cells of {self.kernel} x "
                f"{self.kernel} patches: the grid's sides must be multiples "
                f"of it; received a grid of {rows} x {cols}")

    def build(self, input_shape):
        width = int(input_shape[-1])
        if self.standardize:
            self.std_bias = self.add_weight(name="std_bias", shape=(width,),
                                            initializer="zeros")
            self.std_scale = self.add_weight(name="std_scale",
                                             shape=(width,),
                                             initializer="ones")
        self.built = True

    def call(self, x):
        (rows, cols), k = self.grid_size, self.kernel
        width = int(x.shape[-1])
        cells = ops.reshape(x, (-1, rows // k, k, cols // k, k, width))
        y = ops.mean(ops.cast(cells, "float32"), axis=(2, 4))
        y = ops.reshape(y, (-1, rows // k * (cols // k), width))
        y = y * math.sqrt(width)
        if self.standardize:
            y = (y - ops.cast(self.std_bias, "float32")) * ops.cast(
                self.std_scale, "float32")
        return ops.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        rows, cols = self.grid_size
        return (input_shape[0], rows * cols // self.kernel ** 2,
                input_shape[-1])
