"""keras_vit.layers.attention: the self-attention layer's initialisation
is the official (flax DenseGeneral) one."""

import keras
import numpy as np

import keras_vit


def test_attention_kernels_at_vit_b_width_match_flax():
    # The audit's figures: Keras' 3-D glorot gave q/k/v std 0.0058 and out
    # 0.014 at D=768; flax's flattened DenseGeneral fans give 0.036.
    keras.utils.set_random_seed(0)
    layer = keras_vit.layers.MultiHeadSelfAttention(num_heads=12)
    layer.build((None, 5, 768))
    for var in layer.weights:
        if var.path.endswith("kernel"):
            std = float(np.std(keras.ops.convert_to_numpy(var.value)))
            assert abs(std - 0.0361) < 0.001, (var.path, std)
