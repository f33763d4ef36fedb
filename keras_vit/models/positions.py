"""Where position information enters the encoder, for every kind.

A :class:`PositionScheme` decides it, at the tokens (an additive table)
and in attention (the keyword arguments of a block's call); the encoder
calls :meth:`~PositionScheme.before_block` for each block.

>>> import numpy as np
>>> scheme = PositionScheme("relative", "stem", (2, 2), 1, num_heads=2)
>>> x = np.zeros((1, 5, 8), "float32")
>>> y, kwargs = scheme.before_block(0, x)
>>> y is x, sorted(kwargs), tuple(kwargs["relative_embedding"].shape)
(True, ['relative_embedding'], (8, 2, 4))
>>> scheme.before_block(1, x)[1]
{}
"""

from __future__ import annotations

import functools

import keras
import numpy as np
from keras import layers, ops

from keras_vit import layers as vit_layers
from keras_vit.base import options
from keras_vit.base.checks import check_choice


class _GridLayer(layers.Layer):
    """A layer built for a grid of patches: config ``grid_size`` then the
    attributes named in ``config_names``."""

    config_names = ()

    def __init__(self, grid_size, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    def _grid(self, images):
        """The built grid, or a dynamic-size model's from ``images``."""
        if images is None:
            return self.grid_size
        return vit_layers.runtime_grid(images, self.stride)

    def get_config(self):
        return dict(super().get_config(), grid_size=list(self.grid_size),
                    **{name: getattr(self, name)
                       for name in self.config_names})


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class RelativePositionEmbedding(_GridLayer):
    """The learned table of ``position_embedding="relative"``: one
    embedding per 1D offset between two patches, (2P - 1 [+ 1], heads, D /
    heads); the extra last row, with a class token, is shared by every pair
    that involves it. Called on the tokens, it returns the table."""

    kind = "relative"
    config_names = ("num_heads", "num_prefix_tokens")

    def __init__(self, grid_size, num_heads, num_prefix_tokens=0, **kwargs):
        super().__init__(grid_size, **kwargs)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def build(self, input_shape):
        dim = int(input_shape[-1])
        if dim % self.num_heads:
            raise ValueError(
                f"hidden size {dim} is not divisible by "
                f"num_heads={self.num_heads}")
        rows = vit_layers.relative_table_rows(self.num_patches,
                                              self.num_prefix_tokens)
        self.rel_embedding = self.add_weight(
            name="rel_embedding",
            shape=(rows, self.num_heads, dim // self.num_heads),
            initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.built = True

    def call(self, x):
        return ops.cast(self.rel_embedding, x.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(self.rel_embedding.shape)


def relative_bias_index(grid):
    """(N, N) row of BEiT's 2D relative bias table for each (query, key)
    pair of the class token and a (rows, cols) grid of patches; the last
    three rows for the class token's pairs, as BEiT and timm lay it out.

    >>> relative_bias_index((1, 2)).tolist()
    [[5, 3, 3], [4, 1, 0], [4, 2, 1]]
    """
    rows, cols = grid
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    offsets = ((r[:, None] - r[None, :] + rows - 1) * (2 * cols - 1)
               + c[:, None] - c[None, :] + cols - 1)
    size = (2 * rows - 1) * (2 * cols - 1)
    index = np.zeros((rows * cols + 1,) * 2, "int32")
    index[1:, 1:] = offsets
    index[0, :], index[:, 0], index[0, 0] = size, size + 1, size + 2
    return index


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class RelativePositionBias(_GridLayer):
    """BEiT's relative position bias (``relative_bias``): a learned bias
    per head for each 2D offset (:func:`relative_bias_index`); called on
    the tokens, it returns the (1, heads, N, N) bias for the logits."""

    config_names = ("num_heads",)

    def __init__(self, grid_size, num_heads, **kwargs):
        super().__init__(grid_size, **kwargs)
        self.num_heads = int(num_heads)

    def build(self, input_shape):
        rows, cols = self.grid_size
        self.table = self.add_weight(
            name="table", shape=((2 * rows - 1) * (2 * cols - 1) + 3,
                                 self.num_heads),
            initializer=keras.initializers.Zeros())
        self.built = True

    def call(self, x):
        index = relative_bias_index(self.grid_size)
        bias = ops.take(ops.cast(self.table, x.dtype), index.reshape(-1),
                        axis=0)
        bias = ops.reshape(bias, index.shape + (self.num_heads,))
        return ops.transpose(bias, (2, 0, 1))[None]

    def compute_output_shape(self, input_shape):
        tokens = self.num_patches + 1
        return (1, self.num_heads, tokens, tokens)


def log_offsets(grid):
    """Every 2D offset (dr, dc) between two patches of a (rows, cols)
    grid, in row-major order, each as ``sign(d) log(1 + |d|)`` (timm's
    ``'cr'`` log coordinates).

    >>> np.round(log_offsets((1, 2)).astype(float), 4).tolist()
    [[0.0, -0.6931], [0.0, 0.0], [0.0, 0.6931]]
    """
    rows, cols = grid
    dr, dc = np.meshgrid(np.arange(1 - rows, rows), np.arange(1 - cols, cols),
                         indexing="ij")
    offsets = np.stack([dr, dc], -1).reshape(-1, 2).astype("float64")
    return (np.sign(offsets) * np.log1p(np.abs(offsets))).astype("float32")


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class RelativePositionMlp(_GridLayer):
    """timm's relative position MLP (``relative_mlp``, ``RelPosMlp``):
    each 2D offset in log coordinates (:func:`log_offsets`) through
    Dense(``width``) -> ReLU -> Dropout(0.125) -> Dense(``num_heads``)
    gives a bias per head; prefix tokens' pairs get none. Called on the
    tokens, it returns the (1, heads, N, N) bias for the logits."""

    config_names = ("num_heads", "width", "num_prefix_tokens")

    def __init__(self, grid_size, num_heads, width=128, num_prefix_tokens=0,
                 **kwargs):
        super().__init__(grid_size, **kwargs)
        self.num_heads, self.width = int(num_heads), int(width)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.fc1 = layers.Dense(self.width, activation="relu",
                                dtype=self.dtype_policy, name="fc1")
        self.dropout = layers.Dropout(0.125, dtype=self.dtype_policy)
        self.fc2 = layers.Dense(self.num_heads, dtype=self.dtype_policy,
                                name="fc2")

    def build(self, input_shape):
        self.fc1.build((None, 2))
        self.fc2.build((None, self.width))
        self.built = True

    def call(self, x, training=None):
        per_offset = self.fc2(self.dropout(self.fc1(ops.convert_to_tensor(
            log_offsets(self.grid_size), self.compute_dtype)),
            training=training))
        index = relative_bias_index(self.grid_size)[1:, 1:]
        bias = ops.reshape(ops.take(per_offset, index.reshape(-1), axis=0),
                           index.shape + (self.num_heads,))
        bias = ops.transpose(bias, (2, 0, 1))
        prefix = self.num_prefix_tokens
        if prefix:
            bias = ops.pad(bias, ((0, 0), (prefix, 0), (prefix, 0)))
        return bias[None]

    def compute_output_shape(self, input_shape):
        tokens = self.num_patches + self.num_prefix_tokens
        return (1, self.num_heads, tokens, tokens)


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class AxisPositionTable(_GridLayer):
    """Gemma 4's position table (``position_axes``): weight ``table`` (2,
    ``size``, width); patch (r, c) gets ``table[0, c] + table[1, r]``
    added, prefix tokens nothing. Any grid of up to ``size`` rows and
    columns reads its own rows (no resize).

    >>> import numpy as np
    >>> axes = AxisPositionTable((1, 2), 4, num_prefix_tokens=1)
    >>> y = axes(np.zeros((1, 3, 2), "float32"))
    >>> _ = axes.table.assign(np.arange(16, dtype="float32").reshape(2, 4, 2))
    >>> ops.convert_to_numpy(axes(np.zeros((1, 3, 2), "float32")))[0].tolist()
    [[0.0, 0.0], [8.0, 10.0], [10.0, 12.0]]
    """

    config_names = ("size", "num_prefix_tokens", "stride")

    def __init__(self, grid_size, size, num_prefix_tokens=0, stride=None,
                 **kwargs):
        super().__init__(grid_size, **kwargs)
        self.size = int(size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)
        if max(self.grid_size) > self.size:
            raise ValueError(
                f"position_axes={self.size} holds rows for grids of up to "
                f"{self.size} x {self.size} patches; received a grid of "
                f"{self.grid_size[0]} x {self.grid_size[1]}")

    def build(self, x_shape, images_shape=None):
        self.table = self.add_weight(
            name="table", shape=(2, self.size, int(x_shape[-1])),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02))
        self.built = True

    def call(self, x, images=None):
        rows, cols = self._grid(images)
        table = ops.cast(self.table, x.dtype)
        per_col = ops.take(table[0], ops.arange(cols), axis=0)
        per_row = ops.take(table[1], ops.arange(rows), axis=0)
        added = ops.reshape(per_row[:, None, :] + per_col[None, :, :],
                            (1, -1, ops.shape(table)[-1]))
        if self.num_prefix_tokens:
            added = ops.pad(added, ((0, 0), (self.num_prefix_tokens, 0),
                                    (0, 0)))
        return x + added

    def compute_output_shape(self, x_shape, images_shape=None):
        return tuple(x_shape)


def _per_patch(y, x):
    """The patches' (row, column) values, row-major, each (N, 1): ``y``
    per row (rows,) and ``x`` per column (cols,)."""
    rows, cols = ops.shape(y)[0], ops.shape(x)[0]
    return (ops.reshape(ops.repeat(y[:, None], cols, axis=1), (-1, 1)),
            ops.reshape(ops.tile(x[None, :], (rows, 1)), (-1, 1)))


def _sin_cos_table(angles, num_prefix_tokens):
    """A rotary table of ``angles`` (..., patches, head_dim / 2): each
    angle once per half of the features, sines then cosines, after
    ``num_prefix_tokens`` rows of sines 0 and cosines 1 (not turned)."""
    angles = ops.concatenate([angles, angles], axis=-1)
    table = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
    half = (*tuple(table.shape[:-2]), num_prefix_tokens,
            int(table.shape[-1]) // 2)
    prefix = ops.concatenate([ops.zeros(half), ops.ones(half)], axis=-1)
    return ops.concatenate([prefix, table], axis=-2)


ROPE_FORMS = ("dinov3", "eva02")
"""The rotary embeddings' forms of one table for every block (``rope="mixed"``
learns one per block: :class:`MixedRotaryEmbedding`)."""


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class RotaryEmbedding(_GridLayer):
    """The rotary table of ``rope`` (no weights): called on the tokens
    (and, in a dynamic-size model, the images), it returns each token's
    sines and cosines (tokens, 2 * head_dim) for
    :func:`keras_vit.layers.attention.rotate`; prefix tokens are not
    rotated.

    ``"dinov3"``: coordinates ``2 (i + 0.5) / side - 1`` span [-1, 1] at
    any size, periods ``temperature ** (2 k / (head_dim / 2))``.
    ``"eva02"`` (timm's ``RotaryEmbeddingCat``): coordinates ``r``, ``c``
    (scaled by ``reference_grid / grid`` if given), rates ``temperature
    ** (-k / f)``, adjacent pairs turned. ``offset``: timm's
    ``grid_offset``; ``indexing="xy"``: columns' angles first.

    >>> import numpy as np
    >>> rope = RotaryEmbedding((2, 2), head_dim=8, num_prefix_tokens=1)
    >>> table = ops.convert_to_numpy(rope(np.zeros((1, 5, 16), "float32")))
    >>> table.shape, table[0].tolist() == [0.0] * 8 + [1.0] * 8
    ((5, 16), True)
    """

    config_names = ("head_dim", "num_prefix_tokens", "form", "temperature",
                    "stride", "reference_grid", "offset", "indexing")

    def __init__(self, grid_size, head_dim, num_prefix_tokens=0,
                 form="dinov3", temperature=100.0, stride=None,
                 reference_grid=None, offset=0.0, indexing="ij", **kwargs):
        super().__init__(grid_size, **kwargs)
        self.head_dim = int(head_dim)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.form = check_choice("rope", form, ROPE_FORMS)
        self.temperature = float(temperature)
        self.stride = None if stride is None else int(stride)
        self.reference_grid = options.optional_grid("rope_grid",
                                                    reference_grid)
        self.offset = options.number("rope_offset", offset)
        self.indexing = check_choice("rope_indexing", indexing,
                                     options.choices("rope_indexing"))
        if self.head_dim % 4:
            raise ValueError(
                f"rope={form!r} rotates each head's features in pairs, half "
                "by rows and half by columns: it needs a head width divisible "
                f"by 4; received head width {self.head_dim} (hidden_size / "
                "num_heads)")

    def _coordinates(self, rows, cols):
        """Each axis' patch coordinates and the angle per unit of each
        frequency, in the form's terms."""
        quarter = np.arange(self.head_dim // 4, dtype="float32")
        temperature = np.float32(self.temperature)
        index = [ops.cast(ops.arange(side), "float32") + np.float32(
            self.offset) for side in (rows, cols)]
        if self.form == "eva02":
            if self.reference_grid is not None:
                index = [i / ops.cast(side, "float32") * np.float32(ref)
                         for i, side, ref in zip(index, (rows, cols),
                                                 self.reference_grid)]
            return index, 1.0 / temperature ** (quarter / quarter.size)
        centred = [2.0 * ((i + 0.5) / ops.cast(side, "float32")) - 1.0
                   for i, side in zip(index, (rows, cols))]
        periods = temperature ** (2.0 * quarter / (self.head_dim // 2))
        return centred, np.float32(2 * np.pi) / periods

    def _angles(self, rows, cols):
        (y, x), rates = self._coordinates(rows, cols)
        rates = ops.convert_to_tensor(rates.astype("float32"))[None]
        y, x = _per_patch(y, x)
        first, second = (y, x) if self.indexing == "ij" else (x, y)
        return ops.concatenate([first * rates, second * rates], axis=-1)

    def call(self, x, images=None):
        rows, cols = self._grid(images)
        return _sin_cos_table(self._angles(rows, cols),
                              self.num_prefix_tokens)

    def compute_output_shape(self, x_shape, images_shape=None):
        return (x_shape[1], 2 * self.head_dim)


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class MixedRotaryEmbedding(_GridLayer):
    """RoPE-ViT's mixed rotary table (``rope="mixed"``, Heo et al. 2024):
    learned frequencies ``freqs`` (2, blocks, heads, head_dim / 2), the
    columns' then the rows'. Called on the tokens with the block's index,
    it returns that block's table, (heads, tokens, 2 * head_dim).
    Initialised as RoPE-ViT does: axial rates turned by a random angle.

    >>> import numpy as np
    >>> rope = MixedRotaryEmbedding((2, 3), 8, 2, 4, num_prefix_tokens=1)
    >>> tuple(rope(np.zeros((1, 7, 16), "float32"), block=3).shape)
    (2, 7, 16)
    """

    config_names = ("head_dim", "num_heads", "depth", "num_prefix_tokens",
                    "temperature", "stride", "offset", "indexing")

    def __init__(self, grid_size, head_dim, num_heads, depth,
                 num_prefix_tokens=0, temperature=10.0, stride=None,
                 offset=0.0, indexing="xy", **kwargs):
        super().__init__(grid_size, **kwargs)
        self.head_dim, self.num_heads = int(head_dim), int(num_heads)
        self.depth = int(depth)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.temperature = float(temperature)
        self.stride = None if stride is None else int(stride)
        self.offset = options.number("rope_offset", offset)
        self.indexing = check_choice("rope_indexing", indexing,
                                     options.choices("rope_indexing"))
        if self.head_dim % 4:
            raise ValueError(
                "rope='mixed' turns each head's features in pairs by two "
                "axes: it needs a head width divisible by 4; received head "
                f"width {self.head_dim} (hidden_size / num_heads)")

    def _initial(self, shape, dtype=None):
        rates = self.temperature ** (-np.arange(0, self.head_dim, 4)
                                     / self.head_dim)
        turn = ops.convert_to_numpy(keras.random.uniform(
            (self.depth, self.num_heads, 1), 0, 2 * np.pi))
        fx = np.concatenate([rates * np.cos(turn),
                             rates * np.cos(turn + np.pi / 2)], -1)
        fy = np.concatenate([rates * np.sin(turn),
                             rates * np.sin(turn + np.pi / 2)], -1)
        return ops.convert_to_tensor(np.stack([fx, fy]).astype("float32"),
                                     dtype)

    def build(self, x_shape, images_shape=None):
        self.freqs = self.add_weight(
            name="freqs", shape=(2, self.depth, self.num_heads,
                                 self.head_dim // 2),
            initializer=self._initial)
        self.built = True

    def call(self, x, images=None, block=0):
        rows, cols = self._grid(images)
        y, x_ = _per_patch(*(ops.cast(ops.arange(side), "float32")
                             + np.float32(self.offset)
                             for side in (rows, cols)))
        if self.indexing == "ij":
            x_, y = y, x_
        freqs = ops.cast(self.freqs, "float32")
        angles = (x_[None] * freqs[0, block][:, None, :]
                  + y[None] * freqs[1, block][:, None, :])  # (heads, N, .)
        return _sin_cos_table(angles, self.num_prefix_tokens)

    def compute_output_shape(self, x_shape, images_shape=None):
        return (self.num_heads, x_shape[1], 2 * self.head_dim)


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class PaddingBias(layers.Layer):
    """The attention logits' bias that leaves a NaFlex batch's padding
    out of every query's keys: (B, 1, 1, prefix + N) from ``mask`` (B, N:
    nonzero for a patch), 0 for tokens, -1e9 for padding."""

    def __init__(self, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, mask):
        bias = ops.where(ops.not_equal(mask, 0), 0.0, -1e9)
        if self.num_prefix_tokens:
            bias = ops.pad(bias, ((0, 0), (self.num_prefix_tokens, 0)))
        # (B, 1, 1, T) by expand_dims: TFLite has no kernel for a strided
        # slice that adds axes to a tensor of unknown length.
        return ops.expand_dims(ops.expand_dims(ops.cast(bias, "float32"), 1),
                               1)

    def compute_output_spec(self, mask):
        tokens = mask.shape[1]
        if tokens is not None:
            tokens += self.num_prefix_tokens
        return keras.KerasTensor((mask.shape[0], 1, 1, tokens), "float32")

    def get_config(self):
        return dict(super().get_config(),
                    num_prefix_tokens=self.num_prefix_tokens)


def check_dynamic_image_size(dynamic_image_size, position_embedding,
                             family=None):
    """``dynamic_image_size`` as a bool, or a ValueError naming it: tables
    per offset of the built grid cannot be resized in the graph."""
    if not isinstance(dynamic_image_size, bool):
        raise ValueError("dynamic_image_size must be True or False; "
                         f"received dynamic_image_size={dynamic_image_size!r}")
    bias = (family or {}).get("relative_bias")
    if dynamic_image_size and (family or {}).get("naflex"):
        raise ValueError(
            "naflex=True takes patches of any grid already: "
            "dynamic_image_size=True does not apply; received naflex=True, "
            "dynamic_image_size=True")
    if dynamic_image_size and bias is not None:
        raise ValueError(
            f"relative_bias={bias!r} holds a bias per offset of the grid it "
            "was built for: build the size you need with keras_vit.rebuild("
            "model, image_size=...) instead of dynamic_image_size=True; "
            f"received relative_bias={bias!r}, dynamic_image_size=True")
    mapped = [f"{row.name}={(family or {})[row.name]!r}"
              for row in options.OPTIONS if row.fixed_grid
              and (family or {}).get(row.name, row.default) != row.default]
    if dynamic_image_size and mapped:
        raise ValueError(
            f"{', '.join(mapped)} read the patches as a map of the grid the "
            "model was built for: build the size you need with "
            "keras_vit.rebuild(model, image_size=...) instead of "
            f"dynamic_image_size=True; received {', '.join(mapped)}, "
            "dynamic_image_size=True")
    if dynamic_image_size and position_embedding == "relative":
        raise ValueError(
            "dynamic_image_size=True resizes additive position tables in the "
            "graph; position_embedding='relative' has none (its table is per "
            "1D offset of the built grid): build the size you need with "
            "keras_vit.rebuild(model, image_size=...) instead; received "
            "position_embedding='relative', dynamic_image_size=True")
    return dynamic_image_size


class PositionScheme:
    """The position embedding of an encoder: ``kind`` (one of
    :data:`~keras_vit.models.encoder.POSITION_EMBEDDINGS`) placed as
    ``placement`` says: ``"stem"`` once (``"relative"``: into the first
    block's attention), ``"every_layer"`` a table per block (layers
    ``position_embedding_{i}``), ``"every_layer_shared"`` one table
    (layer ``position_embedding``) before every block.

    Args:
        num_prefix_tokens: tokens before the patches that the table
            covers (0 when they join after it).
        images, stride: a dynamic-size model's input and patch stride.
        family: the model's family options, normalised (``rope``,
            ``relative_bias``, ``position_axes`` ...).
        patches: a NaFlex model's inputs: every block's attention leaves
            the padding out (:class:`PaddingBias` over ``all_prefix``
            tokens before the patches).
    """

    def __init__(self, kind, placement, grid, num_prefix_tokens, num_heads,
                 dtype=None, images=None, stride=None, family=None,
                 head_dim=None, depth=1, patches=None, all_prefix=0):
        self.kind, self.placement = kind, placement
        self.grid, self.prefix = grid, num_prefix_tokens
        self.num_heads, self.dtype = num_heads, dtype
        self.images, self.stride = images, stride
        self.patches, self.padding = patches, None
        if patches is not None:
            self.padding = PaddingBias(all_prefix, dtype=dtype,
                                       name="padding_bias")(
                                           patches["patch_mask"])
        self.resize = options.position_resize(family or {})
        self.aspect = (family or {}).get("position_aspect", False)
        self.shared = None
        if kind != "none" and placement != "every_layer":
            self.shared = self._make("position_embedding")
        family = dict(options.DEFAULTS, **(family or {}))
        self.rope, self.rope_table = None, None
        rope = dict(temperature=family["rope_temperature"], stride=stride,
                    offset=family["rope_offset"],
                    indexing=family["rope_indexing"], dtype=dtype,
                    name="rotary_embedding")
        if family["rope"] == "mixed":
            self.rope = MixedRotaryEmbedding(
                grid, head_dim, num_heads, depth,
                options.prefix_tokens(family), **rope)
        elif family["rope"] is not None:
            self.rope = RotaryEmbedding(
                grid, head_dim, options.prefix_tokens(family),
                form=family["rope"], reference_grid=family["rope_grid"],
                **rope)
        self.axes = family["position_axes"] and AxisPositionTable(
            grid, family["position_axes"], num_prefix_tokens, stride=stride,
            dtype=dtype, name="position_axes")
        self.bias_kind, self.bias = family["relative_bias"], None
        if self.bias_kind == "shared":
            self.bias = RelativePositionBias(grid, num_heads, dtype=dtype,
                                             name="relative_bias")
        self.mlp_kind = family["relative_mlp"]
        self.mlp = functools.partial(
            RelativePositionMlp, grid, num_heads, family["relative_mlp_width"],
            all_prefix, dtype=dtype)
        if self.mlp_kind == "shared":
            self.mlp = self.mlp(name="relative_mlp")

    def _make(self, name):
        if self.kind == "relative":
            return RelativePositionEmbedding(self.grid, self.num_heads,
                                             self.prefix, dtype=self.dtype,
                                             name=name)
        return vit_layers.PositionEmbedding(
            self.grid, self.prefix, kind=self.kind, stride=self.stride,
            resize=self.resize, aspect=self.aspect, dtype=self.dtype,
            name=name)

    def _add(self, layer, x):
        if self.patches is not None:
            return layer(x, coords=self.patches["patch_coords"],
                         patch_mask=self.patches["patch_mask"])
        if self.images is None:
            return layer(x)
        return layer(x, images=self.images)

    def _table(self, i):
        """The layer block ``i`` reads (None: no position there)."""
        if self.kind == "none" or (self.placement == "stem" and (
                self.kind != "relative" or i > 0)):
            return None
        if self.placement == "every_layer":
            return self._make(f"position_embedding_{i}")
        return self.shared

    def at_stem(self, x):
        """The tokens after the patch embedding, with an additive table
        placed at the stem added."""
        if self.axes:
            x = self._add(self.axes, x)
        if (self.kind in vit_layers.ADDITIVE_POSITION_EMBEDDINGS
                and self.placement == "stem"):
            return self._add(self.shared, x)
        return x

    def before_block(self, i, x):
        """Block ``i``'s input and its call's keyword arguments (an
        additive table added, ``"relative"``'s passed as
        ``relative_embedding``); call it once per block."""
        position = {}
        if isinstance(self.rope, MixedRotaryEmbedding):  # one per block
            position["rope"] = self.rope(x, images=self.images, block=i)
        elif self.rope is not None:
            if self.rope_table is None:  # one table for every block
                self.rope_table = self._add(self.rope, x)
            position["rope"] = self.rope_table
        if self.padding is not None:
            position["attention_bias"] = self.padding
        if self.bias_kind is not None:
            bias = self.bias or RelativePositionBias(
                self.grid, self.num_heads, dtype=self.dtype,
                name=f"relative_bias_{i}")
            position["attention_bias"] = bias(x)
        if self.mlp_kind is not None:
            mlp = (self.mlp if self.mlp_kind == "shared"
                   else self.mlp(name=f"relative_mlp_{i}"))
            position["attention_bias"] = mlp(x)
        layer = self._table(i)
        if layer is None:
            return x, position
        if self.kind == "relative":
            return x, dict(position, relative_embedding=layer(x))
        return self._add(layer, x), position
