"""The same image shapes, legal and illegal (0 and 1 pixel, under a
patch, not a multiple of the patch, large, not square), through Keras'
call and each compiled ``predict`` path, on every backend: the same
answers, and the same refusal in the same words
(:class:`keras_vit.layers.image_sizes.ImageSizes`, the one rule). The
exported artifacts get the same shapes in
tests/export/test_image_sizes.py."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers.image_sizes import ImageSizes

from image_shapes import CASES, PATHS, TINY
from image_shapes import images as _images

def _refusal(fn):
    try:
        return None, fn()
    except Exception as e:  # noqa: BLE001 - a path may raise another kind
        return e, None


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    return {"fixed": keras_vit.vit(**TINY),
            "dynamic": keras_vit.vit(**TINY, dynamic_image_size=True)}


@pytest.mark.backends
@pytest.mark.parametrize("kind, hw, ok", CASES)
def test_keras_and_every_predict_path_agree(models, kind, hw, ok):
    model = models[kind]
    x = _images(hw)
    error, want = _refusal(lambda: keras.ops.convert_to_numpy(model(x)))
    if ok:
        assert error is None, error
    else:
        assert isinstance(error, ValueError), error
        assert str(error) == model.image_sizes().refusal(x.shape)
    for path in PATHS:
        model.predict_path = path
        # Where a path does not exist on this backend (graph: TensorFlow
        # only; xla: not torch), predict takes the nearest one.
        # A legal predict first: the relaxed retrace of a graph path is
        # what once took any shape.
        model.predict(_images((32, 32), seed=1), verbose=0)
        got_error, got = _refusal(lambda: model.predict(x, verbose=0))
        if ok:
            assert got_error is None, (path, got_error)
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=path)
        else:
            assert isinstance(got_error, ValueError), (path, got_error)
            assert str(got_error) == str(error), path
    model.predict_path = "auto"


@pytest.mark.backends
def test_a_wrong_number_of_channels_is_refused_on_every_path(models):
    model = models["dynamic"]
    x = _images((32, 32))[..., :1]
    for path in PATHS:
        model.predict_path = path
        with pytest.raises(ValueError, match=r"\(batch, height, width, 3\)"):
            model.predict(x, verbose=0)
    model.predict_path = "auto"
    with pytest.raises(ValueError, match=r"received images of shape "
                       r"\(2, 32, 32, 1\)"):
        model(x)


def test_a_traced_call_with_free_sizes_still_refuses(models):
    """A TensorFlow function of the dynamic model traced with unknown
    height and width (what a relaxed retrace makes) asserts the rule when
    it runs."""
    import tensorflow as tf

    model = models["dynamic"]
    fn = tf.function(lambda x: model(x, training=False), input_signature=[
        tf.TensorSpec((None, None, None, 3), tf.float32)])
    assert fn(_images((32, 64))).shape == (2, 3)
    for hw in ((0, 32), (1, 1), (33, 32)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="positive multiples of 8"):
            fn(_images(hw))


def test_image_sizes_rule():
    fixed = ImageSizes(size=(32, 48), channels=3)
    assert fixed.refusal((1, 32, 48, 3)) is None
    assert fixed.refusal((1, 48, 32, 3)) is not None
    assert fixed.refusal((1, 32, 48, 1)) is not None
    assert fixed.refusal((32, 48, 3)) is not None
    assert fixed.refusal((None, None, None, 3)) is None
    dynamic = ImageSizes(multiple=8, channels=3)
    for hw in ((8, 8), (8, 800)):
        assert dynamic.refusal((1,) + hw + (3,)) is None
    for hw in ((0, 8), (8, 0), (7, 8), (9, 8), (-8, 8)):
        assert dynamic.refusal((1,) + hw + (3,)) is not None, hw
    for sizes in (fixed, dynamic):
        assert ImageSizes.from_json(sizes.to_json()) == sizes
        assert all(sizes.refusal((1,) + hw + (3,))
                   for hw in sizes.refused_examples())


@pytest.mark.parametrize("image_size", [10**6, (32, 10**6), 4097])
@pytest.mark.parametrize("builder", ["vit", "axial_vit", "resnet_v2"])
def test_builders_cap_the_image_size(builder, image_size):
    """A side past MAX_IMAGE_SIDE is refused in one line naming
    ``image_size``, before any memory estimate or layer: ``(32, 10**6)``
    once built a 500k-token model."""
    from keras_vit.base.limits import MAX_IMAGE_SIDE
    from keras_vit.models.resnet_v2 import resnet_v2

    build = {"vit": lambda: keras_vit.vit(**dict(TINY, image_size=image_size)),
             "axial_vit": lambda: keras_vit.axial_vit(
                 **dict(TINY, image_size=image_size)),
             "resnet_v2": lambda: resnet_v2(image_size, (1, 1, 1, 1), 1, 3)}
    with pytest.raises(ValueError) as info:
        build[builder]()
    message = str(info.value)
    assert message == (f"image_size must be at most {MAX_IMAGE_SIDE} pixels "
                       f"a side; received image_size={image_size!r}")
    assert "\n" not in message


def test_the_largest_side_is_taken():
    from keras_vit.base.limits import MAX_IMAGE_SIDE
    from keras_vit.layers.image_sizes import check_image_size

    assert check_image_size((MAX_IMAGE_SIDE, 32)) == (MAX_IMAGE_SIDE, 32)
    with pytest.raises(ValueError, match="image_size must be positive"):
        check_image_size(0)
