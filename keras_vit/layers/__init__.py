"""Keras layers of the Vision Transformer, in keras.ops: embeddings, attention, dense, blocks.

The layers of Dosovitskiy et al. (2020) and its hybrids. Numerics follow the
official JAX implementation, not Keras defaults: LayerNorm epsilon 1e-6,
GELU in its tanh form (flax ``nn.gelu``), pre-LN blocks, a zero class token
and a zero-initialised head.

Every layer stores its ``__init__`` arguments and returns exactly those from
``get_config`` so that ``from_config(get_config())`` rebuilds it. Each
registers with Keras as ``keras_vit>ClassName``, whichever module of this
package defines it, so ``.keras`` files saved before the layers were split
into modules load as they did.
"""

# The registered name first, then Keras: the first ``import keras`` of a
# process registers the model classes, which read PACKAGE as they are defined.
from keras_vit.layers.registered import PACKAGE

import keras  # noqa: F401

from keras_vit.layers.attention import (
    MultiHeadSelfAttention, decomposed_bias, relative_attention_bias,
    relative_position_index, relative_table_rows)
from keras_vit.layers.blocks import (
    POOLING_METHODS, DropPath, EncoderBlock, MlpBlock, ResidualUnit,
    StackScores, StdConv2D, TokenPooling, check_remat, rematerialized)
from keras_vit.layers.dense import (
    GELU_FORMS, MLP_ACTIVATIONS, MLP_GELU, NORM_KINDS, FusedConv2D,
    FusedDense, FusedEinsumDense, FusedLayerNormalization, RMSNormalization,
    UnscaledNorm, add_bias, check_gelu, check_norm, gelu, gelu_tanh,
    make_norm, mlp_gelu_exact, mlp_gelu_tanh)
from keras_vit.layers.embeddings import (
    ADDITIVE_POSITION_EMBEDDINGS, ClassToken, PatchEmbedding, PatchTokens,
    PositionEmbedding, RegisterTokens, resize_grid_table, runtime_grid,
    sincos_2d_table)
from keras_vit.layers.image_sizes import ImageSizes, image_sizes
from keras_vit.layers.pooling_head import (AttentionPoolHead, Neck,
                                           PatchMerger, SoftTokenPool)

__all__ = [
    "ADDITIVE_POSITION_EMBEDDINGS", "ClassToken", "EncoderBlock", "FusedConv2D",
    "FusedDense", "FusedEinsumDense", "FusedLayerNormalization", "GELU_FORMS",
    "ImageSizes", "MLP_GELU", "MlpBlock", "MultiHeadSelfAttention", "PACKAGE",
    "PatchEmbedding", "PositionEmbedding", "ResidualUnit", "StackScores",
    "StdConv2D", "TokenPooling", "add_bias", "check_gelu", "check_remat",
    "gelu", "gelu_tanh", "image_sizes", "mlp_gelu_exact", "mlp_gelu_tanh",
    "decomposed_bias", "relative_attention_bias", "relative_position_index",
    "relative_table_rows", "rematerialized", "resize_grid_table",
    "runtime_grid", "sincos_2d_table"]
__all__ += ["DropPath", "MLP_ACTIVATIONS", "POOLING_METHODS", "PatchMerger",
            "RegisterTokens", "AttentionPoolHead", "Neck", "PatchTokens",
            "SoftTokenPool", "NORM_KINDS", "RMSNormalization", "UnscaledNorm",
            "check_norm", "make_norm"]
