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

# The registered name first, then Keras, while none of the modules below
# is half-imported: the first ``import keras`` of a process registers the
# model classes (keras_vit.registration), which import these modules and
# read keras_vit.layers.PACKAGE as they are defined.
from keras_vit.layers.registered import PACKAGE

import keras  # noqa: F401

from keras_vit.layers.attention import (
    MultiHeadSelfAttention, decomposed_bias, relative_attention_bias,
    relative_position_index, relative_table_rows)
from keras_vit.layers.blocks import (
    EncoderBlock, MlpBlock, ResidualUnit, StackScores, StdConv2D, TokenPooling,
    check_remat, rematerialized)
from keras_vit.layers.dense import (
    GELU_FORMS, MLP_GELU, FusedConv2D, FusedDense, FusedEinsumDense,
    FusedLayerNormalization, add_bias, check_gelu, gelu, gelu_tanh,
    mlp_gelu_exact, mlp_gelu_tanh)
from keras_vit.layers.embeddings import (
    ADDITIVE_POSITION_EMBEDDINGS, ClassToken, PatchEmbedding, PositionEmbedding,
    resize_grid_table, runtime_grid, sincos_2d_table)
from keras_vit.layers.image_sizes import ImageSizes, image_sizes

# The ViT family's layers and constants (register tokens, stochastic depth,
# pooling methods, the MLP's activations).
from keras_vit.layers.blocks import POOLING_METHODS, DropPath
from keras_vit.layers.dense import MLP_ACTIVATIONS
from keras_vit.layers.embeddings import PatchTokens, RegisterTokens
# Multihead attention pooling (``classifier="map"``: SigLIP, big_vision).
from keras_vit.layers.pooling_head import (AttentionPoolHead, Neck,
                                           PatchMerger, SoftTokenPool)
# RMSNorm, the norm of ``norm="rms"`` (AIMv2), and the norms' kinds.
from keras_vit.layers.dense import (NORM_KINDS, RMSNormalization,
                                    UnscaledNorm, check_norm, make_norm)

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
            "RegisterTokens"]
__all__ += ["AttentionPoolHead", "Neck", "PatchTokens", "SoftTokenPool"]
__all__ += ["NORM_KINDS", "RMSNormalization", "UnscaledNorm", "check_norm",
            "make_norm"]
