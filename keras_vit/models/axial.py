"""Axial-ViT (paper Appendix D.6): a ViT whose patch grid stays 2D.

Every block of a ViT becomes an axial block: self-attention along each
row + MLP, then along each column + MLP (Ho et al. 2019). There is no class
token; classification takes the mean of the grid after the final norm.
"""

from __future__ import annotations

import keras
from keras import layers, ops

from keras_vit import layers as vit_layers
from keras_vit.models.common import (carry_policy, check_label_names,
                                     classification_head, image_input)
from keras_vit.models.compiled import CompiledModelMixin
from keras_vit.models.config import ConstructorConfig
from keras_vit.models.encoder import (NORMALISED, check_encoder_args,
                                      check_patch_grid,
                                      check_position_embedding)
from keras_vit.models.features import FeaturesMixin
from keras_vit.models.positions import PositionScheme
from keras_vit.models.quantization import QuantizeMixin

_POOLINGS = (None, "gap", "avg")
_POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "none")
# AxialEncoderBlock's arguments, which its get_config returns.
_BLOCK_ARGUMENTS = ("num_heads", "mlp_dim", "dropout_rate",
                    "attention_dropout_rate", "layer_norm_epsilon", "remat")


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class AxialEncoderBlock(layers.Layer):
    """Row self-attention + MLP, then column self-attention + MLP.

    Takes and returns a grid (B, rows, cols, D); ``row`` and ``column``
    are :class:`keras_vit.layers.EncoderBlock` s.
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0,
                 attention_dropout_rate=0.0, layer_norm_epsilon=1e-6,
                 remat=False, **kwargs):
        super().__init__(**kwargs)
        self.row, self.column = (
            vit_layers.EncoderBlock(
                num_heads, mlp_dim, dropout_rate, attention_dropout_rate,
                layer_norm_epsilon, remat=remat, dtype=self.dtype_policy,
                name=name)
            for name in ("row", "column"))
        # The arguments as the two blocks normalised them.
        for key in _BLOCK_ARGUMENTS:
            setattr(self, key, getattr(self.row, key))

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "AxialEncoderBlock takes a grid (batch, rows, cols, D); "
                f"received input_shape={input_shape}")
        _, rows, cols, dim = input_shape
        self.row.build((None, cols, dim))
        self.column.build((None, rows, dim))
        self.built = True

    def call(self, x, training=None):
        _, rows, cols, dim = x.shape  # static: reshapes export cleanly
        y = ops.reshape(x, (-1, cols, dim))  # every row is a sequence
        y = self.row(y, training=training)
        y = ops.transpose(ops.reshape(y, (-1, rows, cols, dim)), (0, 2, 1, 3))
        y = ops.reshape(y, (-1, rows, dim))  # every column is a sequence
        y = self.column(y, training=training)
        y = ops.reshape(y, (-1, cols, rows, dim))
        return ops.transpose(y, (0, 2, 1, 3))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return dict(super().get_config(),
                    **{key: getattr(self, key) for key in _BLOCK_ARGUMENTS})


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class AxialVisionTransformer(QuantizeMixin, ConstructorConfig, FeaturesMixin,
                             CompiledModelMixin, keras.Model):
    """Axial-ViT of the paper's Appendix D.6.

    Build it with :func:`axial_vit`; ``get_config`` returns exactly the
    constructor arguments: the ViT's less those that need a sequence.
    """

    def __init__(self, image_size=224, patch_size=16, hidden_size=768,
                 num_layers=12, num_heads=12, mlp_dim=3072, num_classes=1000,
                 representation_size=None, dropout_rate=0.0,
                 attention_dropout_rate=0.0, include_top=True, pooling=None,
                 include_preprocessing=False, classifier_activation=None,
                 num_channels=3, layer_norm_epsilon=1e-6, head_bias_init=0.0,
                 position_embedding="learned_1d", label_names=None,
                 dynamic_image_size=False, remat=False,
                 input_normalization=None,
                 name="axial_vision_transformer", **kwargs):
        if dynamic_image_size is not False:
            raise ValueError(
                "Axial-ViT runs its row and column attention over the grid it "
                "was built for; build the size you need with keras_vit."
                "rebuild(model, image_size=...) instead; received "
                f"dynamic_image_size={dynamic_image_size!r}")
        image_hw, patch, grid = check_patch_grid(image_size, patch_size)
        spec = check_encoder_args(
            hidden_size, num_layers, num_heads, mlp_dim, num_channels,
            pooling, _POOLINGS, representation_size, include_top,
            num_classes, dropout_rate, attention_dropout_rate,
            image_size=image_size, tokens=grid[0] * grid[1])
        label_names = check_label_names(label_names, spec["num_classes"],
                                        include_top)
        if position_embedding not in _POSITION_EMBEDDINGS:
            raise ValueError(
                f"Axial-ViT takes position_embedding in {_POSITION_EMBEDDINGS} "
                "(a relative table needs a 1D sequence); received "
                f"position_embedding={position_embedding!r}")
        check_position_embedding(
            position_embedding, "stem", spec["hidden_size"], spec["num_heads"])
        dim, rate = spec["hidden_size"], spec["dropout_rate"]
        dtype = kwargs.pop("dtype", None)

        inputs, x, input_normalization = image_input(
            image_hw, spec["num_channels"], include_preprocessing, dtype,
            input_normalization)
        x = vit_layers.PatchEmbedding(dim, patch, dtype=dtype,
                                      name="patch_embedding")(x)
        x = PositionScheme(position_embedding, "stem", grid, 0,
                           spec["num_heads"], dtype).at_stem(x)
        x = layers.Dropout(rate, dtype=dtype, name="embedding_dropout")(x)
        x = layers.Reshape((grid[0], grid[1], dim), dtype=dtype,
                           name="to_grid")(x)
        for i in range(spec["num_layers"]):
            x = AxialEncoderBlock(
                spec["num_heads"], spec["mlp_dim"], rate,
                spec["attention_dropout_rate"], layer_norm_epsilon,
                remat=vit_layers.check_remat(remat), dtype=dtype,
                name=f"axial_block_{i}")(x)
        x = layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype,
                                      name="encoder_norm")(x)
        x = classification_head(
            x, layers.GlobalAveragePooling2D(dtype=dtype, name="pooling")
            if include_top or pooling is not None else None,
            include_top, spec["representation_size"], spec["num_classes"],
            keras.initializers.Constant(head_bias_init),
            classifier_activation, dtype)
        super().__init__(inputs=inputs, outputs=x, name=name, **kwargs)
        carry_policy(self, dtype)
        for key in NORMALISED:
            setattr(self, key, spec[key])
        self.grid_size = grid
        self.label_names = label_names
        self.input_normalization = input_normalization


def axial_vit(image_size, patch_size, hidden_size, num_layers, num_heads,
              mlp_dim, num_classes, **kwargs):
    """Builds an Axial-ViT (paper Appendix D.6) of any size.

    Args:
        image_size: input resolution, an int or (height, width); a multiple
            of ``patch_size``.
        patch_size: side of the square patches.
        hidden_size: token width D.
        num_layers: number of axial blocks, each a row block and a column
            block (attention + MLP each): twice as many attention layers and
            MLPs as a ViT of the same depth.
        num_heads: attention heads (must divide ``hidden_size``).
        mlp_dim: hidden width of every MLP.
        num_classes: size of the head, applied to the mean of the grid.
        **kwargs: ``representation_size``, ``dropout_rate``,
            ``attention_dropout_rate``, ``include_top``, ``pooling`` (with
            ``include_top=False``: None returns the grid (B, rows, cols, D),
            ``"gap"``/``"avg"`` its mean), ``include_preprocessing``,
            ``classifier_activation``, ``num_channels``, ``name``, ``dtype``,
            and ``position_embedding``: ``"learned_1d"`` (default),
            ``"learned_2d"``, ``"sincos_2d"`` or ``"none"``, added once
            before the first block.

    Returns:
        An :class:`AxialVisionTransformer` (a ``keras.Model``).

    Example:

    >>> import numpy as np
    >>> from keras_vit.models import axial_vit
    >>> model = axial_vit(image_size=32, patch_size=8, hidden_size=16,
    ...                   num_layers=1, num_heads=2, mlp_dim=32, num_classes=10)
    >>> tuple(model(np.zeros((2, 32, 32, 3), "float32")).shape)
    (2, 10)
    """
    return AxialVisionTransformer(image_size, patch_size, hidden_size,
                                  num_layers, num_heads, mlp_dim, num_classes,
                                  **kwargs)
