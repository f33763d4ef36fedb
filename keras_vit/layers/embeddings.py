"""Patch embedding, class token and position tables, with the one resize of a table to a
new grid (loading weights at another size and dynamic image sizes alike)."""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from keras_vit.base import options
from keras_vit.base.checks import check_choice
from keras_vit.layers.registered import PACKAGE
from keras_vit.layers.dense import (FusedConv2D, KeptArguments, check_norm,
                                    gelu, make_norm, with_arguments)
from keras_vit.layers.image_sizes import ImageSizes


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchEmbedding(KeptArguments, layers.Layer):
    """Cuts an image (or feature map) into patches and embeds each linearly.

    A ``patch_size`` x ``patch_size`` convolution with the same stride,
    flattened to a sequence: (B, H, W, C) -> (B, H/P * W/P, hidden_size).
    ``norm`` (``"layer"`` or ``"rms"``; None: none) normalises each patch's
    embedding (timm's ``embed_norm_layer``). ``stem=True``: three
    convolutions instead of one (timm's ``ConvStem``): P/4 then 2 then 2,
    each of the first two followed by BatchNorm and exact GELU.
    """

    ARGUMENTS = {"hidden_size": int, "patch_size": int, "use_bias": bool,
                 "norm": lambda v: None if v is None else check_norm(v),
                 "norm_epsilon": float, "stem": bool}

    def __init__(self, hidden_size, patch_size, use_bias=True, norm=None,
                 norm_epsilon=1e-6, stem=False, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())
        self.token_norm = (None if self.norm is None else make_norm(
            self.norm, self.norm_epsilon, self.dtype_policy, "norm"))
        if self.stem and (self.patch_size % 4 or self.hidden_size % 4):
            raise ValueError(
                "the conv stem cuts patches of a multiple of 4 pixels into "
                "a width divisible by 4; received patch_size="
                f"{self.patch_size}, hidden_size={self.hidden_size}")
        last = 2 if self.stem else self.patch_size
        self.stem_layers = []
        for n, size in enumerate((self.patch_size // 4, 2) if self.stem
                                 else ()):
            self.stem_layers += [
                FusedConv2D(self.hidden_size // 4, size, strides=size,
                            padding="valid", use_bias=False,
                            kernel_initializer="lecun_normal",
                            dtype=self.dtype_policy, name=f"stem_conv_{n}"),
                layers.BatchNormalization(epsilon=1e-5,
                                          dtype=self.dtype_policy,
                                          name=f"stem_norm_{n}")]
        self.conv = FusedConv2D(
            self.hidden_size, last, strides=last, padding="valid",
            use_bias=self.use_bias, kernel_initializer="lecun_normal",
            dtype=self.dtype_policy, name="conv")

    def build(self, input_shape):
        if len(input_shape) == 3:  # flattened patches (NaFlex)
            channels, rest = divmod(int(input_shape[-1]), self.patch_size ** 2)
            if rest:
                raise ValueError(
                    f"patches of {input_shape[-1]} values are not "
                    f"{self.patch_size} x {self.patch_size} pixels of some "
                    f"channels; received input_shape={input_shape}")
            input_shape = (None, self.patch_size, self.patch_size, channels)
            if self.stem:
                raise ValueError(
                    "the conv stem reads images, not flattened patches; "
                    f"received input_shape={input_shape}")
        for layer in self.stem_layers:
            layer.build(input_shape)
            input_shape = layer.compute_output_shape(input_shape)
        self.conv.build(input_shape)
        if self.token_norm is not None:
            self.token_norm.build((None, None, self.hidden_size))
        self.built = True

    def call(self, images, training=None):
        if len(images.shape) == 3:
            # Patches already cut, each (P, P, C) flattened row by row: the
            # convolution's kernel in the same order is one projection.
            kernel = ops.reshape(ops.cast(self.conv.kernel, images.dtype),
                                 (-1, self.hidden_size))
            x = ops.matmul(images, kernel)
            if self.use_bias:
                x = x + ops.cast(self.conv.bias, x.dtype)
        else:
            x = images
            for conv, norm in zip(self.stem_layers[::2],
                                  self.stem_layers[1::2]):
                x = gelu(norm(conv(x), training=training), "exact")
            x = self.conv(x, training=training)
            shape = ops.shape(x)
            x = ops.reshape(x, (shape[0], shape[1] * shape[2],
                                self.hidden_size))
        if self.token_norm is not None:
            x = self.token_norm(x)
        return x

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 3:
            return (input_shape[0], input_shape[1], self.hidden_size)
        b, h, w, _ = input_shape
        n = None
        if h is not None and w is not None:
            n = (h // self.patch_size) * (w // self.patch_size)
        return (b, n, self.hidden_size)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassToken(layers.Layer):
    """Prepends a learnable class token (initialised to zeros) to a sequence."""

    def build(self, input_shape):
        self.cls = self.add_weight(
            name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")
        self.built = True

    def call(self, x):
        cls = ops.cast(self.cls, x.dtype)
        cls = ops.broadcast_to(cls, (ops.shape(x)[0], 1, ops.shape(x)[2]))
        return ops.concatenate([cls, x], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchTokens(layers.Layer):
    """The patch tokens of a token sequence, without the prefix tokens:
    as a sequence (``"NLC"``) or a map on the patch grid (``"NHWC"``);
    with ``return_prefix`` also the prefix tokens. Called on ``[tokens,
    images]``: the grid is that of ``images`` at ``stride``.

    >>> import numpy as np
    >>> t = np.arange(2 * 5 * 3, dtype="float32").reshape(2, 5, 3)
    >>> m = PatchTokens(1, 8)([t, np.zeros((2, 16, 16, 3), "float32")])
    >>> tuple(m.shape), float(m[0, 0, 1, 0])
    ((2, 2, 2, 3), 6.0)
    """

    def __init__(self, num_prefix_tokens, stride, output_format="NHWC",
                 return_prefix=False, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = int(stride)
        self.output_format = check_choice("output_format", output_format,
                                          ("NHWC", "NLC"))
        self.return_prefix = bool(return_prefix)

    def call(self, inputs):
        tokens, images = inputs
        patches = tokens[:, self.num_prefix_tokens:]
        if self.output_format == "NHWC":
            shape = ops.shape(images)
            patches = ops.reshape(patches, (
                -1, shape[1] // self.stride, shape[2] // self.stride,
                ops.shape(tokens)[-1]))
        if self.return_prefix:
            return patches, tokens[:, :self.num_prefix_tokens]
        return patches

    def compute_output_shape(self, input_shape):
        tokens_shape, images_shape = input_shape
        b, n, d = tokens_shape
        if self.output_format == "NHWC":
            h, w = (None if s is None else s // self.stride
                    for s in images_shape[1:3])
            patches = (b, h, w, d)
        else:
            patches = (b, None if n is None else n - self.num_prefix_tokens,
                       d)
        if self.return_prefix:
            return patches, (b, self.num_prefix_tokens, d)
        return patches

    def get_config(self):
        return with_arguments(super().get_config(), self, (
            "num_prefix_tokens", "stride", "output_format", "return_prefix"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class RegisterTokens(layers.Layer):
    """Inserts ``num_tokens`` learned register tokens (Darcet et al. 2023),
    weight ``registers`` (1, num_tokens, D), after the first ``index``
    tokens of a sequence."""

    def __init__(self, num_tokens, index=0, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)
        self.index = int(index)

    def build(self, input_shape):
        self.registers = self.add_weight(
            name="registers", shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=1e-6))
        self.built = True

    def call(self, x):
        shape = ops.shape(x)
        registers = ops.broadcast_to(ops.cast(self.registers, x.dtype),
                                     (shape[0], self.num_tokens, shape[2]))
        # No empty slice before the first token: TFLite's XNNPack delegate
        # fails to prepare a graph holding a zero-length one.
        parts = ([x[:, :self.index]] if self.index else []) + [
            registers, x[:, self.index:]]
        return ops.concatenate(parts, axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + self.num_tokens, d)

    def get_config(self):
        return with_arguments(super().get_config(), self,
                              ("num_tokens", "index"))


ADDITIVE_POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d")
"""Position embeddings added to the tokens (paper Appendix D.4)."""


def sincos_2d_table(grid_size, width, temperature=10_000.0):
    """The fixed 2D sin-cos position embedding of big_vision's
    ``posemb_sincos_2d``, (rows * cols, width) in raster order: NumPy for a
    ``grid_size`` of ints, a tensor for scalar tensors.

    >>> sincos_2d_table((2, 3), 8).shape
    (6, 8)
    """
    rows, cols = grid_size
    if width % 4 or width < 8:
        raise ValueError(
            "position_embedding='sincos_2d' needs a width that is a multiple "
            f"of 4 and at least 8; received width={width}")
    known = all(isinstance(g, (int, np.integer)) for g in grid_size)
    xp, dtype = (np, "float64") if known else (ops, "float32")
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
    omega = xp.convert_to_tensor(omega.astype(dtype)) if xp is ops else omega
    y = xp.repeat(xp.arange(rows), cols)
    x = xp.tile(xp.arange(cols), [rows])
    x, y = ((a.astype(dtype) if known else ops.cast(a, dtype))[:, None]
            * omega[None] for a in (x, y))
    table = xp.concatenate([xp.sin(x), xp.cos(x), xp.sin(y), xp.cos(y)],
                           axis=1)
    return table.astype("float32") if known else table


def _array_module(table):
    """NumPy for a NumPy array, keras.ops for a tensor or a variable."""
    return np if isinstance(table, np.ndarray) else ops


def _sample_points(old_len, new_len):
    """Where the ``new_len`` samples of a linear resize with aligned
    corners fall on an axis of ``old_len`` (> 1) entries: ``(lo, frac)``.
    In float64, as ``scipy.ndimage.zoom``: float32 puts a 24 -> 14 resize
    up to 2e-5 off the official table."""
    if isinstance(new_len, int):
        coords = np.arange(new_len) * ((old_len - 1) / max(new_len - 1, 1))
        lo = np.clip(np.floor(coords).astype(int), 0, old_len - 2)
        return lo.astype("int32"), coords - lo
    step = (old_len - 1) / ops.maximum(ops.cast(new_len, "float64") - 1.0,
                                       1.0)
    coords = ops.cast(ops.arange(new_len), "float64") * step
    lo = ops.cast(ops.clip(ops.floor(coords), 0, old_len - 2), "int32")
    return lo, coords - ops.cast(lo, "float64")


def resize_axis(table, new_len, axis, kernel="bilinear_corners"):
    """``table`` resized to ``new_len`` entries along ``axis`` with
    ``kernel`` (:data:`RESIZE_KERNELS`; by default
    ``scipy.ndimage.zoom(order=1)``, the official resize, paper section
    3.2). A NumPy ``table`` is resized with NumPy in its own dtype, a
    tensor with keras.ops (``new_len`` may then be a scalar tensor).

    >>> resize_axis(np.array([[0.0], [1.0]]), 3, 0)[:, 0].tolist()
    [0.0, 0.5, 1.0]
    """
    xp = _array_module(table)
    old_len = int(table.shape[axis])
    if isinstance(new_len, (int, np.integer)):
        new_len = int(new_len)
        if new_len == old_len:
            return table
    if kernel != "bilinear_corners":
        index = (np.arange(new_len, dtype=table.dtype) if xp is np
                 else ops.arange(new_len))
        weights = resize_weights(index, new_len, old_len, kernel)
        if xp is ops:
            weights = ops.cast(weights, table.dtype)
        return xp.moveaxis(xp.tensordot(weights, table, axes=[[1], [axis]]),
                           0, axis)
    if old_len == 1:
        return xp.take(table, xp.zeros((new_len,), "int32"), axis=axis)
    lo, frac = _sample_points(old_len, new_len)
    shape = [1] * len(table.shape)
    shape[axis] = -1
    frac = (frac.reshape(shape) if isinstance(frac, np.ndarray)
            else ops.reshape(frac, shape))
    if xp is ops:
        frac = ops.cast(frac, table.dtype)
    lower = xp.take(table, lo, axis=axis)
    upper = xp.take(table, lo + 1, axis=axis)
    return lower * (1.0 - frac) + upper * frac


def resize_grid_table(grid, grid_size, new_grid,
                      kernel="bilinear_corners"):
    """``grid`` (rows * cols, D), the position rows of a patch grid of
    ``grid_size`` in raster order, resized to ``new_grid`` (rows, cols)
    with :func:`resize_axis` along the rows, then the columns."""
    xp = _array_module(grid)
    rows, cols = grid_size
    dim = grid.shape[-1]
    table = xp.reshape(grid, (rows, cols, dim))
    table = resize_axis(table, new_grid[0], 0, kernel)
    table = resize_axis(table, new_grid[1], 1, kernel)
    return xp.reshape(table, (-1, dim))


#: How a position table is resized to another grid (``position_resize``):
#: ``"bilinear_corners"`` (the paper's), ``"bilinear_aa"``/``"bicubic_aa"``
#: (torch's antialiased ``interpolate``: SigLIP2, timm), ``"bicubic"``
#: (torch's, a=-0.75: transformers' ``interpolate_pos_encoding``).
RESIZE_KERNELS = options.choices("position_resize")[1:]  # None resolves


def _cubic(distance, a, xp):
    """The cubic convolution kernel of ``a`` at ``distance`` (>= 0)."""
    near = ((a + 2.0) * distance - (a + 3.0)) * distance * distance + 1.0
    far = (((distance - 5.0) * distance + 8.0) * distance - 4.0) * a
    return xp.where(distance < 1.0, near,
                    xp.where(distance < 2.0, far, 0.0 * far))


def resize_weights(index, new_len, old_len, kernel):
    """The weights (``index.shape + (old_len,)``) that read entry
    ``index`` of an axis resized from ``old_len`` entries to ``new_len``
    off the old entries, for ``kernel`` (one of :data:`RESIZE_KERNELS`).
    ``index`` and ``new_len`` are broadcastable float arrays (NumPy
    computes in their dtype, keras.ops in float32); ``old_len`` an int.

    >>> w = resize_weights(np.arange(3.0), 3.0, 2, "bilinear_corners")
    >>> w.tolist()
    [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]
    >>> w = resize_weights(np.arange(2.0), 2.0, 4, "bilinear_aa")
    >>> np.round(w * 7, 6).tolist()  # shrinking: the triangle twice as wide
    [[3.0, 3.0, 1.0, 0.0], [0.0, 1.0, 3.0, 3.0]]
    """
    check_choice("position_resize", kernel, RESIZE_KERNELS)
    xp = np if isinstance(index, np.ndarray) else ops
    dtype = index.dtype if xp is np else "float32"
    if xp is ops:
        index = ops.cast(index, dtype)
        new_len = ops.cast(new_len, dtype)
    if kernel == "bilinear_corners":
        centre = index * ((old_len - 1) / xp.maximum(new_len - 1.0, 1.0))
    else:
        scale = old_len / new_len
        centre = (index + 0.5) * scale - 0.5
    if kernel == "bilinear":  # torch reads no entry beyond an end
        centre = xp.clip(centre, 0.0, old_len - 1.0)
    # torch's bicubic without antialiasing reads two entries beyond each
    # end, clamped to the border one: weigh them and fold them back.
    ends = 2 if kernel == "bicubic" else 0
    source = np.arange(-ends, old_len + ends, dtype=dtype)
    distance = xp.abs((source if xp is np else ops.convert_to_tensor(source))
                      - xp.expand_dims(centre, -1))
    if kernel.endswith("_aa"):  # the kernel as wide as the step, shrinking
        distance = distance / xp.expand_dims(xp.maximum(scale, 1.0), -1)
    if kernel.startswith("bilinear"):
        weights = xp.maximum(1.0 - distance, 0.0)
    else:
        weights = _cubic(distance, -0.5 if ends == 0 else -0.75, xp)
    if ends:  # each read beyond an end onto the border entry
        fold = np.eye(old_len, dtype=dtype)[np.clip(
            source.astype(int), 0, old_len - 1)]
        weights = xp.matmul(weights, fold if xp is np
                            else ops.convert_to_tensor(fold))
    if kernel.endswith("_aa"):
        weights = weights / xp.sum(weights, axis=-1, keepdims=True)
    return weights


def naflex_weights(coords, mask, grid_size, kernel="bilinear_aa",
                   aspect=False):
    """The weights (B, N, rows * cols) that resize a position table of
    ``grid_size`` (rows, cols) to each patch of a NaFlex batch:
    ``coords`` (B, N, 2), each patch's row and column in its image's grid,
    whose size is the largest coordinate of its patches (``mask`` (B, N):
    nonzero for a patch) plus one. ``aspect=True``: each image's table is
    resized to a square of its longer side (timm's
    ``pos_embed_ar_preserving``)."""
    coords = ops.cast(coords, "float32")
    # expand_dims, not [..., None]: TFLite has no kernel for a strided
    # slice that adds an axis to a tensor of unknown shape.
    valid = ops.expand_dims(ops.cast(ops.not_equal(mask, 0), "float32"), -1)
    sizes = ops.max(coords * valid, axis=1, keepdims=True) + 1.0  # (B,1,2)
    if aspect:  # both sides the longer one's; the grid its top-left
        # (but at the table's own grid, which is read as it is).
        square = ops.repeat(ops.max(sizes, axis=-1, keepdims=True), 2, -1)
        native = ops.all(ops.equal(sizes, ops.convert_to_tensor(
            np.array(grid_size, "float32"))), axis=-1, keepdims=True)
        sizes = ops.where(native, sizes, square)
    rows, cols = (resize_weights(coords[..., axis], sizes[..., axis],
                                 length, kernel)
                  for axis, length in enumerate(grid_size))
    shape = ops.shape(rows)
    return ops.reshape(ops.expand_dims(rows, -1)
                       * ops.expand_dims(cols, -2),
                       (shape[0], shape[1], grid_size[0] * grid_size[1]))


def runtime_grid(images, stride):
    """The patch grid (rows, cols) of ``images`` (B, H, W, C) cut by
    ``stride`` pixels a patch: ints where the shape is known, else scalar
    tensors. A side that is not a positive multiple of the stride is
    refused (:class:`~keras_vit.layers.image_sizes.ImageSizes`)."""
    images = ImageSizes(multiple=stride).check_images(images)
    height, width = ops.shape(images)[1], ops.shape(images)[2]
    return height // stride, width // stride


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionEmbedding(layers.Layer):
    """Adds a position embedding of shape (1, num_tokens, D) to the tokens.

    ``kind`` (paper Appendix D.4): ``"learned_1d"``, weight
    ``pos_embedding`` (1, num_tokens, D); ``"learned_2d"``, weights
    ``pos_embedding_x`` (cols, D/2) and ``pos_embedding_y`` (rows, D/2), a
    patch gets ``concat(X[col], Y[row])``; ``"sincos_2d"``, the fixed
    :func:`sincos_2d_table`. The 2D kinds give prefix tokens zeros.

    ``stride`` makes the table follow the images' size: called with
    ``images=``, the table is resized in the graph to their grid with
    ``resize`` (a kernel of :data:`RESIZE_KERNELS`).
    """

    def __init__(self, grid_size, num_prefix_tokens=0, kind="learned_1d",
                 stride=None, resize="bilinear_corners", aspect=False,
                 **kwargs):
        super().__init__(**kwargs)
        check_choice("kind", kind, ADDITIVE_POSITION_EMBEDDINGS)
        check_choice("resize", resize, RESIZE_KERNELS)
        self.resize, self.aspect = resize, bool(aspect)
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
        """The embedding added to the tokens, (1, num_tokens, D), for
        ``grid`` (rows, cols) when given, else for ``grid_size``."""
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
                                        self.grid_size, (rows, cols),
                                        self.resize)
            return ops.concatenate([prefix, patches], axis=0)[None]
        if self.kind == "sincos_2d":
            if not resize:
                return ops.convert_to_tensor(self._fixed_table)
            dim = self._fixed_table.shape[-1]
            patches = sincos_2d_table((rows, cols), dim)
        else:
            pos_x, pos_y = self.pos_embedding_x, self.pos_embedding_y
            if resize:
                pos_x = resize_axis(pos_x, cols, 0, self.resize)
                pos_y = resize_axis(pos_y, rows, 0, self.resize)
            half = pos_x.shape[-1]
            x = ops.broadcast_to(pos_x[None], (rows, cols, half))
            y = ops.broadcast_to(pos_y[:, None], (rows, cols, half))
            patches = ops.reshape(ops.concatenate([x, y], axis=-1),
                                  (-1, 2 * half))
        prefix = ops.zeros((self.num_prefix_tokens, patches.shape[-1]),
                           patches.dtype)
        return ops.concatenate([prefix, patches], axis=0)[None]

    def call(self, x, images=None, coords=None, patch_mask=None):
        """``coords`` and ``patch_mask``: a NaFlex batch's
        (:func:`naflex_weights`)."""
        if coords is not None:
            return x + ops.cast(self.naflex_table(coords, patch_mask),
                                x.dtype)
        grid = None
        if images is not None and self.stride is not None:
            grid = runtime_grid(images, self.stride)
        return x + ops.cast(self.table(grid), x.dtype)

    def naflex_table(self, coords, mask):
        """The (B, prefix + N, D) rows a NaFlex batch adds (learned
        tables only: :func:`naflex_weights` of each image)."""
        table = ops.cast(self.pos_embedding[0], "float32")
        prefix = self.num_prefix_tokens
        patches = ops.matmul(naflex_weights(coords, mask, self.grid_size,
                                            self.resize, self.aspect),
                             table[prefix:])
        if not prefix:
            return patches
        batch = ops.shape(patches)[0]
        return ops.concatenate([ops.broadcast_to(
            table[None, :prefix], (batch, prefix, table.shape[-1])),
            patches], axis=1)

    def compute_output_spec(self, x, images=None, coords=None,
                            patch_mask=None):
        # The tokens' own shape: tracing the resize with the free sizes of
        # a dynamic model would pair token counts and grids that disagree.
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = dict(super().get_config(), grid_size=list(self.grid_size),
                      num_prefix_tokens=self.num_prefix_tokens,
                      kind=self.kind, stride=self.stride)
        if self.resize != "bilinear_corners":  # saved before it: none
            config["resize"] = self.resize
        if self.aspect:
            config["aspect"] = True
        return config
