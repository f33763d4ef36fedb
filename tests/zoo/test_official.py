"""keras_vit.zoo.official.release: an official .npz as a source of zoo.load, its
input size and head read from the file."""

import keras
import numpy as np

import keras_vit


# A correctness bug of the audit: a hybrid's input size is the file's
# grid times its patch size times the ResNet stride.
def test_hybrid_checkpoint_by_path_gets_the_resnet_stride(tmp_path):
    import official

    res, channels = official.hybrid_arrays(num_layers=(1,), width=32, seed=3)
    arrays = official.vit_arrays(patch=1, grid=8, num_classes=6, seed=3,
                                 channels=channels, hidden=32, layers=1,
                                 heads=4, mlp=64)
    arrays.update(res)
    path = tmp_path / "hybrid.npz"
    np.savez(path, **arrays)
    model = keras_vit.zoo.load(
        "R26+ViT-S/32", weights=str(path), patch_size=1, hidden_size=32,
        num_layers=1, num_heads=4, mlp_dim=64,
        resnet=dict(num_layers=(1,), width_factor=0.5))
    # grid 8 x (patch 1 x ResNet stride 4): 32 pixels, not 8.
    assert model.input_shape[1:3] == (32, 32)
    pos = model.get_layer("position_embedding").weights[0]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(pos),
                                  arrays["Transformer/posembed_input/pos_embedding"])
