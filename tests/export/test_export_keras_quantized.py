"""A SavedModel of a model quantized by Keras is verified against that
model within the bound stated for it: the graph's last-bit float
differences flip some of the int8 layers' roundings, which a float
model's bound (1e-4) does not allow for."""

import os

import numpy as np

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.export import common, saved_model  # noqa: E402


def test_a_keras_quantized_saved_model_verifies_within_its_stated_bound(
        tmp_path):
    # ViT-Ti/16 (12 blocks of width 192): a tiny model's graph and eager
    # roundings happen to agree.
    model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=64,
                               num_classes=10)
    rng = np.random.default_rng(1)
    for v in model.weights:
        v.assign(rng.normal(0, 0.05, tuple(v.shape)).astype("float32"))
    model.quantize("int8")
    path = os.fspath(tmp_path / "q")
    report = export.to_saved_model(model, path)
    bound = common.TOLERANCES["saved_model/keras_quantized"]
    assert report["tolerance"]["max_abs_diff"] == bound["max_abs_diff"]
    # Within the stated bound: the graph's int8 roundings may leave a
    # float model's (seen beyond it on one machine, equal on another).
    diff = max(report["max_abs_diff"].values())
    assert diff <= bound["max_abs_diff"]
    assert any(str(w.dtype) == "int8" for w in model.weights)  # quantized
    x = rng.uniform(-1, 1, (3, 64, 64, 3)).astype("float32")
    got = saved_model.open_artifact(path)(x)["logits"]
    want = keras.ops.convert_to_numpy(model(x))
    scale = max(1.0, float(np.max(np.abs(want))))
    assert np.max(np.abs(got - want)) <= bound["max_abs_diff"] * scale
