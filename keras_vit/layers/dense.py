"""Keras layers of the Vision Transformer (Dosovitskiy et al., 2020).

Numerics follow the official JAX implementation, not Keras defaults:
LayerNorm epsilon 1e-6, GELU in its tanh form (flax ``nn.gelu``), pre-LN
blocks, a zero class token and a zero-initialised head.

Every layer stores its ``__init__`` arguments and returns exactly those from
``get_config`` so that ``from_config(get_config())`` rebuilds it.
"""

from __future__ import annotations

import functools
import math
import re

import keras
import numpy as np
from keras import layers, ops

from keras_vit.runtime import compat
from keras_vit.base.checks import check_choice

PACKAGE = "keras_vit"

# The official code initialises its Dense kernels with Xavier-uniform and
# their biases with N(0, 1e-6); the patch conv, pre-logits and every ResNet
# conv (hybrid and BiT) use Flax's default lecun_normal; position embeddings
# N(0, 0.02) "from BERT".
_XAVIER = "glorot_uniform"


def _bias_init():
    return keras.initializers.RandomNormal(stddev=1e-6)


def _xavier_flat(fan_in, fan_out):
    """Xavier-uniform for a kernel stored with more than two axes.

    Flax's ``DenseGeneral`` initialises its (D, heads, D/heads) kernels as the
    flattened (fan_in, fan_out) matrix; Keras' ``glorot_uniform`` would count
    the leading axis as a convolution's receptive field and start the
    attention about 6x too small at ViT-B width.
    """
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


def gelu_tanh(x):
    """GELU in its tanh approximation, the form the official ViT uses.

    Written out rather than through ``tf.nn.gelu`` so that every exporter sees
    plain tanh/mul/add ops (exact GELU through TF emits an ``Erfc`` op that
    onnxruntime refuses).
    """
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + ops.tanh(c * (x + 0.044715 * ops.power(x, 3))))


GELU_FORMS = ("tanh", "exact")


def gelu(x, form="tanh"):
    """GELU in ``form`` ``"tanh"`` (the official ViT code, flax's default)
    or ``"exact"`` (erf; timm and PyTorch's default). The two differ by up
    to about 1e-3 per activation and 1e-4 to 3e-4 on ViT logits, so a model
    reproduces its checkpoint's own forward only with the form it was
    trained with. Exact GELU is written out with ``erf`` too: ``tf.nn.gelu``
    emits an ``Erfc`` op that onnxruntime refuses.

    >>> import numpy as np
    >>> x = ops.convert_to_tensor(np.array([-1.0, 0.5], "float32"))
    >>> diff = (ops.convert_to_numpy(gelu(x, "exact"))
    ...         - ops.convert_to_numpy(gelu(x, "tanh")))
    >>> [f"{d:.1e}" for d in diff]
    ['1.5e-04', '1.7e-05']
    """
    if form == "tanh":
        return gelu_tanh(x)
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def mlp_gelu_tanh(x):
    """The tanh GELU as the MLP's activation (``keras.ops.gelu``). On
    TensorFlow, :class:`FusedDense` replaces its float call by the spelling
    that fuses into the matmul (:mod:`keras_vit.runtime.fused_ops`); this function
    runs on the other backends and in quantized calls."""
    return ops.gelu(x, approximate=True)


def mlp_gelu_exact(x):
    """The exact (erf) GELU as the MLP's activation: :func:`gelu`."""
    return gelu(x, "exact")


#: The MLP activation of each ``gelu`` form.
MLP_GELU = {"tanh": mlp_gelu_tanh, "exact": mlp_gelu_exact}


def _chains_in_xla(dtype, training):
    """Whether a call with ``training`` runs its GELU, LayerNorm and
    softmax chains as XLA programs (:mod:`keras_vit.runtime.fused_ops`): training
    calls only, where the machine's plan says so
    (:class:`keras_vit.runtime.hardware.Plan`'s ``elementwise``, ``"xla"`` only
    for TensorFlow's CPU graph). Inference calls never ask for the plan."""
    if training is not True:
        return False
    from keras_vit.runtime import hardware

    return hardware.plan(dtype).elementwise == "xla"


# A bias's gradient sums the output's gradient over every row (every token
# of every image). Under mixed precision that sum must accumulate in
# float32: TensorFlow's CPU kernels (``BiasAddGrad``, oneDNN's fused
# convolution backward) and XLA:CPU's reduce of JAX's broadcast-add
# gradient accumulate bfloat16 in bfloat16, and came out 10-40% off the
# float32 model's bias gradients (tests/models/test_mixed_precision_
# gradients.py); torch accumulates in float32. :func:`add_bias` is the one
# place the layers here add a bias.


@functools.lru_cache(maxsize=None)
def _jax_bias_add():
    """``h + bias`` whose bias gradient sums over every axis but the last
    in float32, rounding once (built on first use)."""
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
    a gradient summed in float32 on every backend: TensorFlow's spelling is
    :func:`keras_vit.runtime.fused_ops.bias_add` (``training`` picks the one that
    fuses best), JAX's a custom gradient, torch's a plain add."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_vit.runtime import fused_ops

        return fused_ops.bias_add(h, bias, training)
    if backend == "jax":
        return _jax_bias_add()(h, bias)
    return h + bias


def _dense_2d(x, kernel, bias, training=None):
    """``x @ kernel + bias`` for a 2-D ``x``, the bias gradient summed in
    float32 (:func:`add_bias`). On TensorFlow,
    :func:`keras_vit.runtime.fused_ops.dense`, whose bias add grappler fuses into
    the matmul. On torch, one ``addmm``: eager torch runs a separate
    add as its own pass over the output, which cost 3.4x the fused call
    for ViT-B's MLP in bf16 on an AMX CPU (``benchmarks/speed.py``). On
    JAX a matmul and the add, which XLA fuses by itself."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_vit.runtime import fused_ops

        return fused_ops.dense(x, kernel, bias, training)
    if backend == "torch":
        import torch

        return torch.addmm(bias, x, kernel)
    return add_bias(ops.matmul(x, kernel), bias, training)


def rematerialized(layer, forward, *tensors):
    """``forward(*tensors)``, rematerialised (``keras.remat``: only the
    inputs are kept for the backward pass, which runs ``forward`` again),
    for ``layer``'s training call. Every tensor to differentiate goes in
    ``tensors``, positionally: TensorFlow's recompute_grad gives keyword
    arguments no gradient.

    The recomputation would draw new dropout masks from Keras' stateful
    seed generators (on TensorFlow gradients were off by 9 on a tiny
    block, on torch by 0.26 on a tiny ViT, with no error): their states,
    read here, are given back to them at the start of each run of
    ``forward``, so the backward pass recomputes the masks the forward
    used. On JAX no state may change inside the checkpointed function (the
    change would leak out of a jitted step), so the states go in and the
    advanced ones come out as values, assigned here.
    """
    generators = [sub.seed_generator for sub in
                  compat.flatten_layers(layer, include_self=False)
                  if getattr(sub, "seed_generator", None) is not None]
    # Copies of the values now (``state.value`` is the variable itself).
    states = [ops.copy(g.state.value) for g in generators]
    if keras.backend.backend() != "jax" or not generators:
        def run(*args):
            for generator, state in zip(generators, states):
                generator.state.assign(state)
            return forward(*args)

        return keras.remat(run)(*tensors)

    outer = compat.stateless_scope()

    def run_stateless(seeds, *args):
        with keras.StatelessScope() as scope:
            if outer is not None:  # the weights as the step sees them
                scope.state_mapping.update(outer.state_mapping)
            for generator, seed in zip(generators, seeds):
                scope.state_mapping[id(generator.state)] = seed
            out = forward(*args)
            advanced = [scope.get_current_value(g.state) for g in generators]
        return out, advanced

    out, advanced = keras.remat(run_stateless)(states, *tensors)
    for generator, state in zip(generators, advanced):
        generator.state.assign(state)
    return out


def check_remat(remat):
    """``remat`` if it is True or False, else a ValueError naming it."""
    if not isinstance(remat, bool):
        raise ValueError(f"remat must be True or False; received "
                         f"remat={remat!r}")
    return remat


def check_gelu(form):
    """``form`` if it is one of :data:`GELU_FORMS`, else a ValueError."""
    return check_choice("gelu", form, GELU_FORMS)


def _with_arguments(config, layer, names):
    """``config``, the base class's, with ``layer``'s ``__init__``
    arguments ``names``: each layer here stores every argument, normalised,
    as the attribute of its name, and its config holds exactly those."""
    config.update({name: getattr(layer, name) for name in names})
    return config


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedConv2D(layers.Conv2D):
    """``keras.layers.Conv2D`` whose channels-last call with a bias adds
    it through :func:`add_bias`: under mixed precision the bias gradient
    sums in float32 (TensorFlow's fused convolution backward and XLA:CPU
    sum bfloat16 in bfloat16), and TensorFlow fuses the add into the
    convolution all the same. Everything else, and torch, is Keras' own
    call; weights, config and numbers are Conv2D's."""

    def call(self, inputs, training=None):
        if (keras.backend.backend() == "torch" or not self.use_bias
                or self.data_format != "channels_last"):
            return super().call(inputs)
        y = self.convolution_op(inputs, self.kernel)
        y = add_bias(y, ops.cast(self.bias, y.dtype), training)
        if self.activation is not None:
            y = self.activation(y)
        return y


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchEmbedding(layers.Layer):
    """Cuts an image (or feature map) into patches and embeds each linearly.

    A ``patch_size`` x ``patch_size`` convolution with the same stride,
    flattened to a sequence: (B, H, W, C) -> (B, H/P * W/P, hidden_size).
    """

    def __init__(self, hidden_size, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.patch_size = int(patch_size)
        self.conv = FusedConv2D(
            self.hidden_size,
            self.patch_size,
            strides=self.patch_size,
            padding="valid",
            kernel_initializer="lecun_normal",
            dtype=self.dtype_policy,
            name="conv",
        )

    def build(self, input_shape):
        self.conv.build(input_shape)
        self.built = True

    def call(self, images, training=None):
        x = self.conv(images, training=training)
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1] * shape[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        n = None
        if h is not None and w is not None:
            n = (h // self.patch_size) * (w // self.patch_size)
        return (b, n, self.hidden_size)

    def get_config(self):
        return _with_arguments(super().get_config(), self,
                               ("hidden_size", "patch_size"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassToken(layers.Layer):
    """Prepends a learnable class token (initialised to zeros) to a sequence."""

    def build(self, input_shape):
        self.cls = self.add_weight(
            name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros"
        )
        self.built = True

    def call(self, x):
        cls = ops.cast(self.cls, x.dtype)
        cls = ops.broadcast_to(cls, (ops.shape(x)[0], 1, ops.shape(x)[2]))
        return ops.concatenate([cls, x], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)


# Position embeddings added to the tokens (paper Appendix D.4). "relative" is
# not among them: it biases the attention logits instead (see
# relative_attention_bias and EncoderBlock).
ADDITIVE_POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d")


def sincos_2d_table(grid_size, width, temperature=10_000.0):
    """The fixed 2D sin-cos position embedding of MoCo v3 / big_vision.

    Returns a float32 array (rows * cols, width) in raster order: for each
    patch ``[sin(x w), cos(x w), sin(y w), cos(y w)]`` with x the column, y
    the row and ``w = temperature ** -(arange(width / 4) / (width / 4 - 1))``
    (big_vision's ``posemb_sincos_2d``).

    >>> sincos_2d_table((2, 3), 8).shape
    (6, 8)
    """
    rows, cols = (int(g) for g in grid_size)
    if width % 4 or width < 8:
        raise ValueError(
            "position_embedding='sincos_2d' needs a width that is a multiple "
            f"of 4 and at least 8; received width={width}")
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
    y, x = np.mgrid[:rows, :cols]
    x = x.reshape(-1, 1) * omega[None]
    y = y.reshape(-1, 1) * omega[None]
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], 1)
    return table.astype("float32")


def _resize_axis(table, new_len, axis):
    """Linear interpolation of ``table`` to ``new_len`` entries along
    ``axis`` with aligned corners (``scipy.ndimage.zoom(order=1)``, as
    :func:`keras_vit.zoo.resize_posemb`), in keras.ops: ``new_len`` may be
    a tensor (a TensorFlow graph with dynamic image sizes). The table's own
    length along ``axis`` is static."""
    old_len = int(table.shape[axis])
    if isinstance(new_len, int) and new_len == old_len:
        return table
    if old_len == 1:
        return ops.take(table, ops.zeros((new_len,), "int32"), axis=axis)
    positions = ops.cast(ops.arange(new_len), "float32")
    step = (old_len - 1) / ops.maximum(ops.cast(new_len, "float32") - 1.0,
                                       1.0)
    coords = positions * step
    lo = ops.cast(ops.clip(ops.floor(coords), 0, old_len - 2), "int32")
    frac = coords - ops.cast(lo, "float32")
    shape = [1] * len(table.shape)
    shape[axis] = -1
    frac = ops.cast(ops.reshape(frac, shape), table.dtype)
    lower = ops.take(table, lo, axis=axis)
    upper = ops.take(table, lo + 1, axis=axis)
    return lower * (1.0 - frac) + upper * frac


def resize_grid_table(grid, grid_size, new_grid):
    """``grid`` (rows * cols, D), the position rows of a patch grid of
    ``grid_size`` in raster order, resized to ``new_grid`` (rows, cols),
    either of which may be tensors: the official resize of the paper's
    section 3.2 (bilinear, aligned corners), computed in the graph."""
    rows, cols = grid_size
    dim = grid.shape[-1]
    table = ops.reshape(grid, (rows, cols, dim))
    table = _resize_axis(table, new_grid[0], 0)
    table = _resize_axis(table, new_grid[1], 1)
    return ops.reshape(table, (-1, dim))


def sincos_2d_grid(rows, cols, width, temperature=10_000.0):
    """:func:`sincos_2d_table` in keras.ops, for a grid whose ``rows`` and
    ``cols`` may be tensors: float32 (rows * cols, width)."""
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
    omega = ops.convert_to_tensor(omega.astype("float32"))
    y = ops.cast(ops.repeat(ops.arange(rows), cols), "float32")
    x = ops.cast(ops.tile(ops.arange(cols), [rows]), "float32")
    x = x[:, None] * omega[None]
    y = y[:, None] * omega[None]
    return ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)],
                           axis=1)


def runtime_grid(images, stride):
    """The patch grid (rows, cols) of ``images`` (B, H, W, C) cut by
    ``stride`` pixels a patch: Python ints where the shape is known (JAX
    and torch always, TensorFlow when static), else scalar tensors. A side
    the stride does not divide is refused: the convolution would drop its
    last pixels without a word (on a TensorFlow graph the call fails with
    an InvalidArgumentError naming the size)."""
    height, width = ops.shape(images)[1], ops.shape(images)[2]
    if isinstance(height, int) and isinstance(width, int):
        if height % stride or width % stride or not (height and width):
            raise ValueError(
                f"a dynamic-size model takes images whose height and width "
                f"are positive multiples of {stride} (its patch grid's "
                f"stride); received images of {height}x{width} pixels")
        return height // stride, width // stride
    import tensorflow as tf

    check = tf.debugging.Assert(
        tf.logical_and(tf.equal(height % stride, 0),
                       tf.equal(width % stride, 0)),
        [f"a dynamic-size model takes images whose height and width are "
         f"multiples of {stride} (its patch grid's stride); received "
         "images of", height, "x", width, "pixels"])
    with tf.control_dependencies([check]):
        return tf.identity(height // stride), tf.identity(width // stride)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionEmbedding(layers.Layer):
    """Adds a position embedding of shape (1, num_tokens, D) to the tokens.

    ``grid_size`` (rows, cols) and ``num_prefix_tokens`` (1 with a class
    token) record how the table maps onto the patch grid, which is what a
    resolution change needs to resize it (``keras_vit.zoo.resize_posemb``).

    ``kind`` (paper Appendix D.4):

    * ``"learned_1d"`` (the paper's default): one learned row per token,
      class token included, weight ``pos_embedding`` (1, num_tokens, D);
    * ``"learned_2d"``: an X (column) and a Y (row) table of width D/2 each,
      weights ``pos_embedding_x`` (cols, D/2) and ``pos_embedding_y``
      (rows, D/2); a patch gets ``concat(X[col], Y[row])``;
    * ``"sincos_2d"``: the fixed table of :func:`sincos_2d_table`, no weights.

    With the two 2D kinds the prefix (class) token gets no embedding: it has
    no place on the grid, and it is itself a learned vector, so a learned
    offset for it would only duplicate it (MoCo v3 gives it zeros too).

    ``stride`` (pixels per grid cell: the patch size, times a hybrid's
    ResNet stride) makes the table follow the images' size: called with
    ``images=`` (the model's input), the grid rows are resized in the graph
    to that input's grid with the official resize (bilinear, aligned
    corners: :func:`keras_vit.zoo.resize_posemb`; the 2D kinds per axis,
    ``"sincos_2d"`` recomputed), so one model takes any height and width
    the stride divides. At ``grid_size`` the table is used as it is.
    """

    def __init__(self, grid_size, num_prefix_tokens=0, kind="learned_1d",
                 stride=None, **kwargs):
        super().__init__(**kwargs)
        check_choice("kind", kind, ADDITIVE_POSITION_EMBEDDINGS)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind
        self.stride = None if stride is None else int(stride)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if (self.stride is None and input_shape[1] is not None
                and input_shape[1] != self.num_tokens):
            raise ValueError(
                f"PositionEmbedding expects {self.num_tokens} tokens "
                f"(grid_size={self.grid_size}, num_prefix_tokens="
                f"{self.num_prefix_tokens}); received input_shape={input_shape}"
            )
        dim = int(input_shape[-1])
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.kind == "learned_1d":
            self.pos_embedding = self.add_weight(
                name="pos_embedding", shape=(1, self.num_tokens, dim),
                initializer=init)
        elif self.kind == "learned_2d":
            if dim % 2:
                raise ValueError(
                    "position_embedding='learned_2d' needs an even hidden size "
                    f"(X and Y halves); received input_shape={input_shape}")
            rows, cols = self.grid_size
            self.pos_embedding_x = self.add_weight(
                name="pos_embedding_x", shape=(cols, dim // 2),
                initializer=init)
            self.pos_embedding_y = self.add_weight(
                name="pos_embedding_y", shape=(rows, dim // 2),
                initializer=init)
        else:
            grid = sincos_2d_table(self.grid_size, dim)
            prefix = np.zeros((self.num_prefix_tokens, dim), "float32")
            self._fixed_table = np.concatenate([prefix, grid])[None]
        self.built = True

    def table(self, grid=None):
        """The embedding added to the tokens, (1, num_tokens, D), any kind:
        for ``grid`` (rows, cols; ints or scalar tensors) when given, else
        for ``grid_size``."""
        # Sizes known now (ints) decide here; tensors (a TensorFlow graph
        # of a dynamic-size model) always take the resize, which is the
        # identity at grid_size.
        known = grid is not None and all(isinstance(g, int) for g in grid)
        resize = grid is not None and (not known
                                       or tuple(grid) != self.grid_size)
        rows, cols = grid if resize else self.grid_size
        if self.kind == "learned_1d":
            if not resize:
                return self.pos_embedding
            table = self.pos_embedding[0]
            prefix = table[:self.num_prefix_tokens]
            patches = resize_grid_table(table[self.num_prefix_tokens:],
                                        self.grid_size, (rows, cols))
            return ops.concatenate([prefix, patches], axis=0)[None]
        if self.kind == "sincos_2d":
            if not resize:
                return ops.convert_to_tensor(self._fixed_table)
            dim = self._fixed_table.shape[-1]
            patches = sincos_2d_grid(rows, cols, dim)
        else:
            pos_x, pos_y = self.pos_embedding_x, self.pos_embedding_y
            if resize:
                pos_x = _resize_axis(pos_x, cols, 0)
                pos_y = _resize_axis(pos_y, rows, 0)
            half = pos_x.shape[-1]
            x = ops.broadcast_to(pos_x[None], (rows, cols, half))
            y = ops.broadcast_to(pos_y[:, None], (rows, cols, half))
            patches = ops.reshape(ops.concatenate([x, y], axis=-1),
                                  (-1, 2 * half))
        prefix = ops.zeros((self.num_prefix_tokens, patches.shape[-1]),
                           patches.dtype)
        return ops.concatenate([prefix, patches], axis=0)[None]

    def call(self, x, images=None):
        grid = None
        if images is not None and self.stride is not None:
            grid = runtime_grid(images, self.stride)
        return x + ops.cast(self.table(grid), x.dtype)

    def compute_output_spec(self, x, images=None):
        # The tokens' own shape: tracing the resize with the free sizes of
        # a dynamic model would pair token counts and grids that disagree.
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            grid_size=list(self.grid_size),
            num_prefix_tokens=self.num_prefix_tokens,
            kind=self.kind,
            stride=self.stride,
        )
        return config


def relative_table_rows(num_patches, num_prefix_tokens=0):
    """Rows of a 1D relative position table: one per offset between two of
    ``num_patches`` patches (2P - 1), plus one shared by every pair that
    involves a prefix (class) token when there is one."""
    return 2 * int(num_patches) - 1 + (1 if num_prefix_tokens else 0)


def relative_position_index(num_tokens, table_rows):
    """(N, N) row of the relative table for each (query, key) pair.

    The table's shape says its layout (:func:`relative_table_rows`): an odd
    number of rows 2P - 1 covers the offsets of P patches, offset
    ``q - k`` at row ``q - k + P - 1`` (raster order, as the paper's 1D
    relative attention); an even number 2P adds a last row for every pair
    with one of the ``num_tokens - P`` prefix tokens.

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
    """The paper's 1D relative attention logits (Appendix D.4).

    "An extra attention [that uses] the original query but relative
    positional embeddings as keys": ``bias[b, h, i, j] = q[b, i, h] .
    table[index(i, j), h] / sqrt(head_dim)``, the same scale as the content
    logits (as in Shaw et al. 2018), to be added to them before the softmax.

    Args:
        query: projected queries (B, N, heads, head_dim); N must be static.
        table: (rows, heads, head_dim), see :func:`relative_position_index`.

    Returns:
        (B, heads, N, N) logits.
    """
    n = int(query.shape[1])
    rows, heads, head_dim = (int(s) for s in table.shape)
    index = relative_position_index(n, rows)
    # First every query against every offset (B, H, N, rows), then one gather
    # picks each pair's offset: N * rows dot products instead of N * N tables.
    logits = ops.einsum("bqhk,rhk->bhqr", query, ops.cast(table, query.dtype))
    logits = ops.reshape(logits, (-1, heads, n * rows))
    flat = (np.arange(n)[:, None] * rows + index).reshape(-1)
    bias = ops.reshape(ops.take(logits, flat, axis=2), (-1, heads, n, n))
    return bias * ops.cast(1.0 / math.sqrt(head_dim), bias.dtype)


def _spec_with_scores(layer, x, return_attention_scores, num_heads):
    """The symbolic output of a layer that returns its input's shape and,
    when asked, attention maps (B, heads, N, N). Written out because Keras
    passes ``compute_output_shape`` the tensors' shapes only, not the flag,
    and tracing the call instead fails under ``keras.RematScope``."""
    out = keras.KerasTensor(x.shape, dtype=layer.compute_dtype)
    if not return_attention_scores:
        return out
    b, n = x.shape[0], x.shape[1]
    return out, keras.KerasTensor((b, num_heads, n, n),
                                  dtype=layer.compute_dtype)


@functools.lru_cache(maxsize=None)
def _flat_einsum(equation):
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedDense(layers.Dense):
    """``keras.layers.Dense`` whose float call is :func:`_dense_2d` (the
    bias add TensorFlow's CPU graph fuses into the matmul, torch's
    ``addmm``), and, with the tanh GELU of :func:`mlp_gelu_tanh` as its
    activation, TensorFlow's fused MatMul + BiasAdd + GELU spelling
    (:mod:`keras_vit.runtime.fused_ops`).

    ``gelu`` (None, ``"tanh"`` or ``"exact"``) makes the GELU of that form
    the layer's activation, kept in the config by its name (``activation``
    then stays None there).

    Everything else is Keras' own: ``kernel`` (LoRA merged in when
    enabled), ``quantize`` and the quantized calls (Keras dispatches to
    ``quantized_call`` instead of ``call`` once the layer is quantized),
    ``enable_lora``, saving. Same numbers as ``Dense`` up to float rounding.
    """

    def __init__(self, units, gelu=None, **kwargs):
        if gelu is not None and kwargs.get("activation") is not None:
            raise ValueError(
                "FusedDense takes gelu or activation, not both; received "
                f"gelu={gelu!r}, activation={kwargs['activation']!r}")
        super().__init__(units, **kwargs)
        self.gelu = None if gelu is None else check_gelu(gelu)
        if self.gelu is not None:
            self.activation = MLP_GELU[self.gelu]

    def get_config(self):
        config = super().get_config()
        if self.gelu is not None:
            config["activation"] = None
        config["gelu"] = self.gelu
        return config

    def call(self, inputs, training=None):
        if self.bias is None:
            return super().call(inputs)
        shape = ops.shape(inputs)
        x = inputs
        if len(inputs.shape) != 2:
            x = ops.reshape(inputs, (-1, self.kernel.shape[0]))
        kernel = ops.cast(self.kernel, x.dtype)
        bias = ops.cast(self.bias, x.dtype)
        if self.gelu is not None and _chains_in_xla(x.dtype, training):
            from keras_vit.runtime import fused_ops

            # The training step's GELU and its gradient as one XLA loop
            # each, after the oneDNN matmul + BiasAdd.
            y = fused_ops.xla_gelu(_dense_2d(x, kernel, bias, training),
                                   self.gelu)
        elif (self.activation is mlp_gelu_tanh
              and keras.backend.backend() == "tensorflow"):
            from keras_vit.runtime import fused_ops

            # Training needs the GELU's inner values for its gradient, so
            # nothing fuses there: that spelling minimises backward ops.
            spell = (fused_ops.dense_gelu_tanh_for_training
                     if training is True else fused_ops.dense_gelu_tanh)
            y = spell(x, kernel, bias)
        else:
            y = _dense_2d(x, kernel, bias, training)
            if self.activation not in (None, keras.activations.linear):
                y = self.activation(y)
        if len(inputs.shape) != 2:
            y = ops.reshape(y, (*shape[:-1], self.units))
        return y

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses to quantize a subclass unless asked (its call might
        # not be Dense's); this one's quantized call is Dense's own.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedEinsumDense(layers.EinsumDense):
    """``keras.layers.EinsumDense`` whose float call, for a plain
    projection (``"abc,cde->abde"``: tokens to heads, ``"abcd,cde->abe"``:
    heads back), is one 2-D :func:`_dense_2d` on the flattened tokens and
    kernel: the shape every backend's fastest GEMM (oneDNN, cuBLAS, XLA)
    takes as it is, with the bias add TensorFlow's grappler fuses into it.
    The kernel keeps its einsum shape ((D, heads, D/heads) or (heads,
    D/heads, D), the released checkpoints' layout); ``quantize``,
    ``enable_lora`` and their calls are Keras' own, as in
    :class:`FusedDense`."""

    def call(self, inputs, training=None):
        flat = _flat_einsum(self.equation)
        kernel_axes = self.equation.replace(" ", "").split("->")[0]
        kernel_axes = kernel_axes.split(",")[1]
        # One BiasAdd needs a bias over every output axis of the kernel.
        if (flat is None or self.bias is None
                or self.activation not in (None, keras.activations.linear)
                or self.bias_axes != kernel_axes[flat[0]:]):
            return super().call(inputs, training=training)
        k, _ = flat
        kernel = self.kernel
        kernel_shape = tuple(kernel.shape)
        rows = math.prod(kernel_shape[:k])
        cols = math.prod(kernel_shape[k:])
        shape = ops.shape(inputs)
        lead = len(inputs.shape) - k
        x = ops.reshape(inputs, (-1, rows))
        y = _dense_2d(x, ops.reshape(ops.cast(kernel, x.dtype), (rows, cols)),
                      ops.reshape(ops.cast(self.bias, x.dtype), (cols,)),
                      training)
        return ops.reshape(y, (*shape[:lead], *kernel_shape[k:]))

    def quantize(self, mode=None, type_check=True, config=None):
        # As FusedDense: the quantized call is EinsumDense's own.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedLayerNormalization(layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` whose training call on
    TensorFlow, where the machine's plan says so, runs the normalisation
    and its gradient as one XLA program each
    (:func:`keras_vit.runtime.fused_ops.xla_layer_norm`: float32 statistics, as
    Keras' own) instead of about ten graph ops each way. Inference, other
    backends and any option other than a plain last-axis LayerNorm with
    ``center`` and ``scale`` run Keras' own call; weights, config and the
    numbers (to float32 rounding) are Keras'."""

    def call(self, inputs, training=None):
        if (self.center and self.scale and not self.rms_scaling
                and list(self.axis) in ([-1], [len(inputs.shape) - 1])
                and _chains_in_xla(inputs.dtype, training)):
            from keras_vit.runtime import fused_ops

            return fused_ops.xla_layer_norm(inputs, self.gamma, self.beta,
                                            self.epsilon, self.compute_dtype)
        return super().call(inputs)


@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadSelfAttention(layers.Layer):
    """Multi-head dot-product self-attention with the official parameter layout.

    The projections are :class:`FusedEinsumDense` layers ``query``, ``key``,
    ``value`` (kernels (D, heads, D/heads), biases (heads, D/heads)) and
    ``out`` (kernel (heads, D/heads, D), bias (D,)): the shapes of the
    released checkpoints, so that loading is a copy, and of Keras'
    ``MultiHeadAttention``, so that Keras' ``quantize`` and
    ``enable_lora`` reach them. ``return_attention_scores=True`` in
    ``call`` also returns the softmax probabilities (B, heads, N, N).
    """

    def __init__(self, num_heads, attention_dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.attention_dropout_rate = float(attention_dropout_rate)
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
        for name in ("query", "key", "value"):
            layer = FusedEinsumDense(
                "abc,cde->abde", (None, self.num_heads, head_dim),
                bias_axes="de", kernel_initializer=_xavier_flat(dim, dim),
                bias_initializer="zeros", dtype=self.dtype_policy, name=name)
            layer.build(tuple(input_shape))
            setattr(self, name, layer)
        self.out = FusedEinsumDense(
            "abcd,cde->abe", (None, dim), bias_axes="e",
            kernel_initializer=_xavier_flat(dim, dim),
            bias_initializer="zeros", dtype=self.dtype_policy, name="out")
        self.out.build(tuple(input_shape[:-1]) + (self.num_heads, head_dim))
        self.built = True

    def _qkv(self, x):
        """q, k, v as (B, N, heads, D/heads)."""
        return self.query(x), self.key(x), self.value(x)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, x, training=None,
                            return_attention_scores=False, **kwargs):
        return _spec_with_scores(self, x, return_attention_scores,
                                 self.num_heads)

    def call(self, x, training=None, return_attention_scores=False,
             attention_bias=None, relative_embedding=None):
        """``attention_bias``: optional logits added before the softmax,
        broadcastable to (batch, heads, queries, keys).
        ``relative_embedding``: optional 1D relative position table (rows,
        heads, head_dim) whose logits with these queries
        (:func:`relative_attention_bias`) are added the same way."""
        from keras_vit.runtime import hardware

        q, k, v = self._qkv(x)
        if relative_embedding is not None:
            relative = relative_attention_bias(q, relative_embedding)
            attention_bias = (relative if attention_bias is None
                              else attention_bias + relative)
        scale = 1.0 / math.sqrt(self.head_dim)
        dropout = training is True and self.attention_dropout_rate > 0
        plan = hardware.plan(x.dtype)
        fused = (not return_attention_scores and not dropout
                 and plan.attention == "fused")
        if fused:
            # The backend's fused kernel (flash/cuDNN attention on GPUs,
            # one XLA or SDPA kernel on JAX and torch CPUs).
            context = ops.dot_product_attention(q, k, v, bias=attention_bias,
                                                scale=scale)
            probs = None
        else:
            # Plain einsums: on TensorFlow CPUs these become oneDNN batch
            # matmuls. TensorFlow has no fused attention kernel; its
            # dot_product_attention is an einsum spelling of its own that
            # ran 5% slower in the ViT-S/16 graph on a 2-core EPYC
            # (benchmarks/attention_paths.py). Attention maps need the
            # probabilities, which the fused kernels never return.
            xla = _chains_in_xla(x.dtype, training)
            if not xla:  # the XLA softmax scales inside its own loop
                q = q * ops.cast(scale, q.dtype)
            logits = ops.einsum("bqhk,bvhk->bhqv", q, k)
            if attention_bias is not None:
                # Softmax in float32 under mixed precision elsewhere: bf16
                # logits lose the small differences that decide where a
                # head attends.
                bias = ops.cast(attention_bias, "float32")
                logits = ops.cast(logits, "float32") + (
                    bias / scale if xla else bias)
            if xla:
                from keras_vit.runtime import fused_ops

                # One XLA loop each way, float32 inside whatever the
                # logits' dtype: the float32 softmax's numbers without its
                # casts or a pass to scale the queries.
                probs = ops.cast(fused_ops.xla_softmax(logits, scale),
                                 x.dtype)
            elif attention_bias is None and plan.softmax == "input":
                # oneDNN's bf16 softmax reads and writes bf16 but computes
                # in float32 inside: the casts would only cost two passes.
                probs = ops.softmax(logits, axis=-1)
            else:
                logits = ops.cast(logits, "float32")
                probs = ops.cast(ops.softmax(logits, axis=-1), x.dtype)
            weights = self.dropout(probs, training=training)
            context = ops.einsum("bhqv,bvhk->bqhk", weights, v)
        y = self.out(context)
        if return_attention_scores:
            return y, probs
        return y

    def get_config(self):
        return _with_arguments(super().get_config(), self,
                               ("num_heads", "attention_dropout_rate"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class MlpBlock(layers.Layer):
    """Dense -> GELU (``gelu``: "tanh" or "exact") -> Dropout -> Dense ->
    Dropout."""

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu="tanh", **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu = check_gelu(gelu)
        self.dropout = layers.Dropout(self.dropout_rate,
                                      dtype=self.dtype_policy)

    def build(self, input_shape):
        dim = int(input_shape[-1])
        self.dense_0 = FusedDense(
            self.mlp_dim, gelu=self.gelu,
            kernel_initializer=_XAVIER, bias_initializer=_bias_init(),
            dtype=self.dtype_policy, name="dense_0",
        )
        self.dense_1 = FusedDense(
            dim, kernel_initializer=_XAVIER, bias_initializer=_bias_init(),
            dtype=self.dtype_policy, name="dense_1",
        )
        self.dense_0.build((None, dim))
        self.dense_1.build((None, self.mlp_dim))
        self.built = True

    def call(self, x, training=None):
        # The tokens as one 2-D matrix: what the fastest GEMMs take as is.
        shape = ops.shape(x)
        h = self.dense_0(ops.reshape(x, (-1, shape[-1])), training=training)
        h = self.dropout(h, training=training)
        h = self.dense_1(h, training=training)
        h = ops.reshape(h, shape)
        return self.dropout(h, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return _with_arguments(super().get_config(), self,
                               ("mlp_dim", "dropout_rate", "gelu"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(layers.Layer):
    """Pre-LN Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

    ``remat=True`` rematerialises the block in training (``keras.remat``:
    ``jax.checkpoint``, ``tf.recompute_grad``, torch's checkpoint): only the
    block's input is kept for the backward pass, which runs the block's
    forward again, so a training step stores one tensor per block instead
    of all its activations (the paper's big models fit batches several
    times larger) for about one more forward pass of compute. The numbers
    are the same; inference (``training`` not True) is unchanged.
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu="tanh",
        remat=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.remat = check_remat(remat)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.gelu = check_gelu(gelu)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm_1 = FusedLayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
            name="norm_1",
        )
        self.attention = MultiHeadSelfAttention(
            self.num_heads, self.attention_dropout_rate,
            dtype=self.dtype_policy, name="attention",
        )
        self.dropout = layers.Dropout(self.dropout_rate,
                                      dtype=self.dtype_policy)
        self.norm_2 = FusedLayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
            name="norm_2",
        )
        self.mlp = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu,
                            dtype=self.dtype_policy, name="mlp")

    def build(self, input_shape):
        for sub in (self.norm_1, self.attention, self.norm_2, self.mlp):
            sub.build(input_shape)
        self.built = True

    def call(self, x, training=None, return_attention_scores=False,
             relative_embedding=None):
        """``relative_embedding``: optional 1D relative position table
        (rows, heads, head_dim) whose logits (:func:`relative_attention_bias`)
        are added to the content logits before the softmax."""
        if self.remat and training is True and not return_attention_scores:
            return self._rematerialized(x, relative_embedding)
        return self._forward(x, training, return_attention_scores,
                             relative_embedding)

    def _rematerialized(self, x, relative_embedding):
        tables = () if relative_embedding is None else (relative_embedding,)
        return rematerialized(
            self, lambda x, *table: self._forward(
                x, True, relative_embedding=table[0] if table else None),
            x, *tables)

    def _forward(self, x, training=None, return_attention_scores=False,
                 relative_embedding=None):
        # The relative logits use "the original query": the attention
        # layer's own projection.
        y = self.attention(
            self.norm_1(x), training=training,
            return_attention_scores=return_attention_scores,
            relative_embedding=relative_embedding,
        )
        if return_attention_scores:
            y, scores = y
        x = x + self.dropout(y, training=training)
        x = x + self.mlp(self.norm_2(x), training=training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, x, training=None,
                            return_attention_scores=False, **kwargs):
        return _spec_with_scores(self, x, return_attention_scores,
                                 self.num_heads)

    def get_config(self):
        return _with_arguments(super().get_config(), self, (
            "num_heads", "mlp_dim", "dropout_rate", "attention_dropout_rate",
            "layer_norm_epsilon", "gelu", "remat"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenPooling(layers.Layer):
    """Pools a token sequence: ``"token"`` takes token 0, ``"gap"`` the mean."""

    def __init__(self, method="token", **kwargs):
        super().__init__(**kwargs)
        if method not in ("token", "gap"):
            raise ValueError(
                f"method must be 'token' or 'gap'; received method={method!r}"
            )
        self.method = method

    def call(self, x):
        if self.method == "token":
            return x[:, 0]
        return ops.mean(x, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return _with_arguments(super().get_config(), self, ("method",))


@keras.saving.register_keras_serializable(package=PACKAGE)
class StackScores(layers.Layer):
    """Stacks per-layer attention maps into (B, layers, heads, N, N)."""

    def call(self, scores):
        return ops.stack(list(scores), axis=1)

    def compute_output_shape(self, input_shape):
        first = input_shape[0]
        return (first[0], len(input_shape)) + tuple(first[1:])


@keras.saving.register_keras_serializable(package=PACKAGE)
class StdConv2D(layers.Conv2D):
    """Conv2D with weight standardisation (Qiao et al. 2019), as BiT uses.

    The kernel is standardised over its (H, W, in) axes before every use. The
    two official code bases differ in the formula, and both are kept exactly:

    * ``standardization="std"`` (vit_jax hybrids): (w - mean) / (std + eps),
      with eps = 1e-5;
    * ``standardization="var"`` (big_transfer BiT): (w - mean) /
      sqrt(var + eps), with eps = 1e-10.
    """

    def __init__(self, *args, standardization="var", eps=1e-10, **kwargs):
        super().__init__(*args, **kwargs)
        if standardization not in ("std", "var"):
            raise ValueError(
                "standardization must be 'std' or 'var'; received "
                f"standardization={standardization!r}")
        self.standardization = standardization
        self.eps = float(eps)

    def standardized_kernel(self, kernel):
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        centred = kernel - mean
        var = ops.mean(ops.square(centred), axis=(0, 1, 2), keepdims=True)
        if self.standardization == "std":
            return centred / (ops.sqrt(var) + self.eps)
        return centred / ops.sqrt(var + self.eps)

    def convolution_op(self, inputs, kernel):
        # Standardise in float32 even under mixed precision: the statistics
        # of a small kernel lose too much in bf16 (float64 stays float64).
        dtype = keras.backend.result_type(kernel.dtype, "float32")
        w = self.standardized_kernel(ops.cast(kernel, dtype))
        return super().convolution_op(inputs, ops.cast(w, inputs.dtype))

    def get_config(self):
        return _with_arguments(super().get_config(), self,
                               ("standardization", "eps"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResidualUnit(layers.Layer):
    """Post-activation bottleneck unit of the hybrids' ResNet (vit_jax).

    conv1 1x1 -> GN -> ReLU -> conv2 3x3 (stride here) -> GN -> ReLU ->
    conv3 1x1 -> GN (scale initialised to zero), added to the shortcut (a
    projection conv + GN when the shape changes), then ReLU. Convolutions are
    weight-standardised as (w - mean) / (std + 1e-5) with TF 'SAME' padding;
    GroupNorm has 32 groups and epsilon 1e-6. This differs from BiT's
    pre-activation unit on purpose: it is what the released hybrids computed.
    ``standardization``/``std_eps`` pick the weight standardisation of
    :class:`StdConv2D` (timm's port of these hybrids runs ``"var"`` with
    1e-8 and GroupNorm epsilon 1e-5).
    """

    def __init__(self, features, strides=1, groups=32, epsilon=1e-6,
                 standardization="std", std_eps=1e-5, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = check_remat(remat)
        self.features = int(features)
        self.strides = int(strides)
        self.groups = int(groups)
        self.epsilon = float(epsilon)
        self.standardization = standardization
        self.std_eps = float(std_eps)

    def _conv(self, filters, size, strides, name):
        return StdConv2D(filters, size, strides=strides, padding="same",
                         use_bias=False, standardization=self.standardization,
                         eps=self.std_eps, kernel_initializer="lecun_normal",
                         dtype=self.dtype_policy, name=name)

    def _norm(self, name, zero=False):
        return layers.GroupNormalization(
            self.groups, epsilon=self.epsilon,
            gamma_initializer="zeros" if zero else "ones",
            dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        out = self.features * 4
        self.needs_projection = (input_shape[-1] != out or self.strides != 1)
        self.conv1 = self._conv(self.features, 1, 1, "conv1")
        self.gn1 = self._norm("gn1")
        self.conv2 = self._conv(self.features, 3, self.strides, "conv2")
        self.gn2 = self._norm("gn2")
        self.conv3 = self._conv(out, 1, 1, "conv3")
        self.gn3 = self._norm("gn3", zero=True)
        self.conv1.build(input_shape)
        mid = tuple(input_shape[:-1]) + (self.features,)
        self.gn1.build(mid)
        self.conv2.build(mid)
        self.gn2.build(mid)
        self.conv3.build(mid)
        self.gn3.build(tuple(input_shape[:-1]) + (out,))
        if self.needs_projection:
            self.conv_proj = self._conv(out, 1, self.strides, "conv_proj")
            self.gn_proj = self._norm("gn_proj")
            self.conv_proj.build(input_shape)
            self.gn_proj.build(tuple(input_shape[:-1]) + (out,))
        self.built = True

    def call(self, x, training=None):
        if self.remat and training is True:
            return rematerialized(self, self._forward, x)
        return self._forward(x)

    def _forward(self, x):
        residual = x
        if self.needs_projection:
            residual = self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def get_config(self):
        return _with_arguments(super().get_config(), self, (
            "features", "strides", "groups", "epsilon", "standardization",
            "std_eps", "remat"))
