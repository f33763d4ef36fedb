"""Any image size at call time: ``dynamic_image_size=True`` builds a model
whose position table is resized in the graph to each input's patch grid
with the official resize, so its logits equal those of
``rebuild(model, image_size=...)`` at every size the stride divides (square
or not, every additive position-embedding kind and placement, hybrids and
BiT), on every backend; SavedModel and ONNX exports keep the free height
and width and are verified at three sizes; TFLite stays fixed-size."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.runtime.backend import to_numpy
from keras_vit.models import axial_vit, resnet_v2, vit
from testkit import FAMILY_OPTIONS

TINY = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=2,
            mlp_dim=64, num_classes=5)
# Square and not, larger and smaller than the built 32x32, one patch high.
SIZES = ((32, 32), (24, 40), (64, 16), (8, 8))


def _randomised(model, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(0, 0.1, w.shape).astype(w.dtype))
    return model


def _max_diff(model, reference, size, seed=1):
    x = np.random.default_rng(seed).uniform(-1, 1, (2, *size, 3))
    x = x.astype("float32")
    return float(np.abs(to_numpy(model(x)) - to_numpy(reference(x))).max())


@pytest.mark.backends
@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d", "sincos_2d"])
@pytest.mark.parametrize("placement", ["stem", "every_layer_shared"])
def test_logits_equal_rebuild_at_every_size(kind, placement):
    model = _randomised(vit(
        image_size=32, position_embedding=kind,
        position_embedding_placement=placement, dynamic_image_size=True,
        **TINY))
    assert model.input_shape == (None, None, None, 3)
    for size in SIZES:
        fixed = keras_vit.rebuild(model, image_size=size,
                                  dynamic_image_size=False)
        assert fixed.input_shape == (None, *size, 3)
        assert _max_diff(model, fixed, size) < 1e-5, (kind, size)


@pytest.mark.backends
def test_family_options_follow_the_input_size():
    """The contract model's options (testkit.FAMILY_OPTIONS) with a class
    token: registers and the class token outside the table, the patch
    norm before it is added, the attention-pool head over the patches of
    any grid: the resized table still covers the patches only."""
    model = _randomised(vit(
        image_size=32, dynamic_image_size=True,
        **dict(FAMILY_OPTIONS, class_token=True), **TINY))
    for size in SIZES[1:3]:
        fixed = keras_vit.rebuild(model, image_size=size,
                                  dynamic_image_size=False)
        assert _max_diff(model, fixed, size) < 1e-5, size


@pytest.mark.backends
@pytest.mark.backend_independent(
    "test_logits_equal_rebuild_at_every_size checks the in-graph resize on "
    "every backend; test_hybrid and test_bit check the ResNet stems' "
    "numbers on jax and torch")
def test_hybrid_and_bit_follow_the_input_size():
    hybrid = _randomised(vit(
        image_size=64, patch_size=1, hidden_size=32, num_layers=1,
        num_heads=2, mlp_dim=64, num_classes=3,
        resnet=dict(num_layers=(), width_factor=0.5),
        dynamic_image_size=True))
    for size in ((64, 64), (96, 32)):
        fixed = keras_vit.rebuild(hybrid, image_size=size,
                                  dynamic_image_size=False)
        assert _max_diff(hybrid, fixed, size) < 1e-5, size
    bit = _randomised(resnet_v2(32, (1, 1, 1, 1), 0.5, num_classes=3,
                                dynamic_image_size=True))
    fixed = keras_vit.rebuild(bit, image_size=(64, 48),
                              dynamic_image_size=False)
    assert _max_diff(bit, fixed, (64, 48)) < 1e-5


@pytest.mark.backends
def test_a_side_the_stride_does_not_divide_is_refused():
    model = vit(image_size=32, dynamic_image_size=True, **TINY)
    with pytest.raises(ValueError, match=r"multiples of 8.*\(1, 30, 32, 3\)"):
        model(np.zeros((1, 30, 32, 3), "float32"))


def test_a_tensorflow_graph_refuses_it_at_run_time():
    import tensorflow as tf

    model = vit(image_size=32, dynamic_image_size=True, **TINY)
    run = tf.function(model, input_signature=[
        tf.TensorSpec((None, None, None, 3), tf.float32)])
    assert run(tf.zeros((1, 40, 24, 3))).shape == (1, 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiples"):
        run(tf.zeros((1, 30, 32, 3)))


def test_a_tensorflow_graph_resizes_the_table_as_loading_does():
    """Differential, the graph's branch of the resize (a grid of scalar
    tensors, known only at run time): the table equals the one a
    checkpoint loaded at that grid gets (NumPy, float64), to float32
    rounding."""
    import tensorflow as tf

    from keras_vit.zoo import convert

    model = _randomised(vit(image_size=32, dynamic_image_size=True, **TINY))
    layer = model.get_layer("position_embedding")
    scalar = tf.TensorSpec((), tf.int32)
    table = tf.function(layer.table, input_signature=[(scalar, scalar)])
    bound = 4 * np.finfo("float32").eps * np.abs(
        to_numpy(layer.pos_embedding)).max()
    for grid in ((3, 5), (8, 2), (1, 1), (4, 4)):
        fixed = vit(image_size=(8 * grid[0], 8 * grid[1]), **TINY)
        convert.load_weights(fixed, convert.export_arrays(model))
        np.testing.assert_allclose(
            table((tf.constant(grid[0]), tf.constant(grid[1]))).numpy(),
            to_numpy(fixed.get_layer("position_embedding").table()),
            rtol=0, atol=bound, err_msg=str(grid))


@pytest.mark.parametrize("build,message", [
    (lambda: vit(image_size=32, position_embedding="relative",
                 dynamic_image_size=True, **TINY), "relative"),
    (lambda: axial_vit(32, 8, 32, 1, 2, 64, 3, dynamic_image_size=True),
     "Axial-ViT"),
    (lambda: vit(image_size=32, dynamic_image_size="yes", **TINY),
     "dynamic_image_size='yes'"),
])
def test_what_cannot_follow_the_size_is_refused(build, message):
    with pytest.raises(ValueError, match="dynamic_image_size") as e:
        build()
    assert message in str(e.value)


@pytest.mark.backends
def test_the_keras_file_and_the_zoo_keep_it(tmp_path):
    model = _randomised(vit(image_size=32, dynamic_image_size=True, **TINY))
    path = tmp_path / "dynamic.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.dynamic_image_size is True
    assert _max_diff(loaded, model, (24, 40)) == 0.0
    zoo_model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
                                   num_classes=3, dynamic_image_size=True)
    assert zoo_model.input_shape == (None, None, None, 3)
    assert tuple(zoo_model.predict(np.zeros((2, 48, 64, 3)),
                                   verbose=0).shape) == (2, 3)


# ---------------------------------------------------------------------------
# exports


@pytest.mark.slow
def test_exports_keep_the_free_size_and_verify_three(tmp_path):
    import onnxruntime

    model = _randomised(vit(image_size=32, dynamic_image_size=True, **TINY))
    sizes = [[32, 32], [48, 48], [16, 48]]
    report = keras_vit.export.to_saved_model(model, tmp_path / "sm")
    assert report["verification"]["image_sizes"] == sizes
    assert report["input"]["shape"] == [None, None, None, 3]
    onnx_path = tmp_path / "m.onnx"
    report = keras_vit.export.to_onnx(model, onnx_path)
    assert report["verification"]["passed"], report["verification"]
    assert report["verification"]["image_sizes"] == sizes
    session = onnxruntime.InferenceSession(str(onnx_path))
    height, width = session.get_inputs()[0].shape[1:3]
    assert not isinstance(height, int) and not isinstance(width, int)
    # Run by hand at a size the verification did not use.
    x = np.random.default_rng(3).uniform(-1, 1, (1, 40, 24, 3))
    out = session.run(None, {session.get_inputs()[0].name:
                             x.astype("float32")})[0]
    np.testing.assert_allclose(out, to_numpy(model(x.astype("float32"))),
                               atol=1e-4)
    report = keras_vit.export.to_tflite(model, tmp_path / "m.tflite")
    assert report["input"]["shape"] == [None, 32, 32, 3]
    assert any("fixed-size" in n for n in report["notes"]), report["notes"]
