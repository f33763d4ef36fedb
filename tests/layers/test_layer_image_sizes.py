"""keras_vit.layers.image_sizes: the rule of which image shapes a model
takes (a fixed size, or positive multiples of a stride), its refusals
in words, its JSON form, the graph check a TensorFlow function keeps,
and the rule read off a model. (The models' own calls on legal and
illegal shapes are tests/models/test_image_sizes.py.)"""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_vit import layers as kl
from keras_vit.base.limits import MAX_IMAGE_SIDE
from keras_vit.layers.image_sizes import ImageSizes, check_image_size


# -- check_image_size --------------------------------------------------------

@pytest.mark.parametrize("value, pair", [
    (224, (224, 224)), ((32, 48), (32, 48)), ([16, 8], (16, 8)),
    (np.int64(7), (7, 7)), ((MAX_IMAGE_SIDE, 1), (MAX_IMAGE_SIDE, 1))])
def test_check_image_size_gives_a_height_width_pair(value, pair):
    assert check_image_size(value) == pair


@pytest.mark.parametrize("value, words", [
    ((32, MAX_IMAGE_SIDE + 1), "at most 4096 pixels a side"),
    (0, "positive integers"),
    ((224, -1), "positive integers"),
    ("224", "an int or a pair of ints"),
    ((1, 2, 3), "an int or a pair of ints"),
    (True, "an int or a pair of ints"),
    (2.0, "an int or a pair of ints"),
])
def test_check_image_size_refuses_naming_the_argument_and_value(value,
                                                                words):
    with pytest.raises(ValueError) as caught:
        check_image_size(value, name="size")
    message = str(caught.value)
    assert words in message
    assert f"received size={value!r}" in message


# -- the rule ----------------------------------------------------------------

FIXED = ImageSizes(size=(32, 24), channels=3)
DYNAMIC = ImageSizes(multiple=8, channels=3)


def test_a_fixed_rule_takes_its_size_and_any_batch():
    for shape in [(1, 32, 24, 3), (5, 32, 24, 3), (None, 32, 24, 3),
                  (None, None, None, None)]:
        assert FIXED.refusal(shape) is None, shape


@pytest.mark.parametrize("shape", [
    (1, 24, 32, 3), (1, 32, 25, 3), (1, 0, 24, 3), (1, 32, 24, 1),
    (32, 24, 3), (1, 1, 32, 24, 3)])
def test_a_fixed_rule_refuses_any_other_shape_in_words(shape):
    words = ("images must have the shape (batch, 32, 24, 3); received "
             f"images of shape {tuple(shape)}")
    assert FIXED.refusal(shape) == words
    with pytest.raises(ValueError) as caught:
        FIXED.check(shape)
    assert str(caught.value) == words


def test_a_dynamic_rule_takes_positive_multiples_of_its_stride():
    for shape in [(1, 8, 8, 3), (2, 16, 40, 3), (None, None, 24, 3)]:
        assert DYNAMIC.refusal(shape) is None, shape


@pytest.mark.parametrize("shape", [
    (1, 0, 8, 3), (1, 9, 8, 3), (1, 8, 12, 3), (1, 4, 4, 3), (1, 8, 8, 1)])
def test_a_dynamic_rule_refuses_sizes_off_its_stride_in_words(shape):
    words = ("images must have the shape (batch, height, width, 3) with "
             "height and width positive multiples of 8; received images "
             f"of shape {tuple(shape)}")
    assert DYNAMIC.refusal(shape) == words


def test_a_rule_without_channels_takes_any_number_of_them():
    rule = ImageSizes(size=(8, 8))
    assert rule.refusal((1, 8, 8, 1)) is None
    assert rule.refusal((1, 8, 8, 7)) is None
    assert "(batch, 8, 8, channels)" in rule.refusal((1, 8, 9, 3))


def test_each_rule_describes_itself():
    assert FIXED.describe() == "32x24x3"
    assert ImageSizes(size=(8, 8)).describe() == "8x8"
    assert DYNAMIC.describe() == "height and width positive multiples of 8"
    assert not FIXED.dynamic and DYNAMIC.dynamic


def test_the_refused_examples_of_each_rule():
    assert DYNAMIC.refused_examples() == [
        (0, 8), (8, 0), (9, 8), (8, 17), (1, 1), (7, 7)]
    assert FIXED.refused_examples() == [
        (0, 24), (1, 1), (33, 24), (64, 48), (32, 48)]
    for h, w in DYNAMIC.refused_examples():
        assert DYNAMIC.refusal((1, h, w, 3)) is not None
    for h, w in FIXED.refused_examples():
        assert FIXED.refusal((1, h, w, 3)) is not None


@settings(max_examples=60, deadline=None)
@given(multiple=st.integers(1, 64), height=st.integers(1, 512),
       width=st.integers(1, 512), dynamic=st.booleans())
def test_every_refused_example_is_refused_by_its_rule(multiple, height,
                                                      width, dynamic):
    """What an exported artifact is checked with must be refused by the
    rule it was exported under, for every stride (a ResNet's is 1, where
    off-stride sizes do not exist) and fixed size."""
    rule = (ImageSizes(multiple=multiple, channels=3) if dynamic
            else ImageSizes(size=(height, width), channels=3))
    examples = rule.refused_examples()
    assert examples
    for h, w in examples:
        assert rule.refusal((1, h, w, 3)) is not None, (rule.describe(), h, w)


def test_the_json_form_records_the_rule_and_reads_back():
    assert FIXED.to_json() == {"channels": 3, "image_size": [32, 24]}
    assert DYNAMIC.to_json() == {"channels": 3, "image_size": "dynamic",
                                 "multiple_of": 8}
    assert DYNAMIC.to_text() == (
        '{"channels": 3, "image_size": "dynamic", "multiple_of": 8}')
    for rule in (FIXED, DYNAMIC, ImageSizes(multiple=4)):
        back = ImageSizes.from_json(rule.to_json())
        assert back == rule
        assert (back.size, back.multiple, back.channels) == (
            rule.size, rule.multiple if rule.dynamic else 1, rule.channels)
    assert FIXED != DYNAMIC and FIXED != ImageSizes(size=(32, 24))


def test_check_images_returns_images_it_takes_and_refuses_the_others():
    images = keras.ops.zeros((1, 16, 8, 3))
    out = DYNAMIC.check_images(images)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out),
                                  np.zeros((1, 16, 8, 3)))
    with pytest.raises(ValueError, match=r"received images of shape "
                                         r"\(1, 12, 8, 3\)"):
        DYNAMIC.check_images(keras.ops.zeros((1, 12, 8, 3)))


@pytest.mark.parametrize("rule, good, bad", [
    (DYNAMIC, (1, 16, 8, 3), (1, 9, 8, 3)),
    (FIXED, (2, 32, 24, 3), (2, 32, 32, 3)),
])
def test_a_tensorflow_graph_with_free_sizes_checks_them_when_it_runs(
        rule, good, bad):
    # TensorFlow-specific: a function traced with free sizes knows them
    # only when it runs, where the assertion (or the shape arithmetic)
    # must stop it.
    import tensorflow as tf

    checked = tf.function(
        rule.check_images,
        input_signature=[tf.TensorSpec((None, None, None, 3), "float32")])
    np.testing.assert_array_equal(checked(tf.ones(good)).numpy(),
                                  np.ones(good))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        checked(tf.ones(bad))


# -- the rule of a model -----------------------------------------------------

def test_a_model_of_fixed_input_takes_its_size():
    inputs = keras.Input((16, 12, 3))
    model = keras.Model(inputs, kl.PatchEmbedding(8, 4)(inputs))
    assert kl.image_sizes(model) == ImageSizes(size=(16, 12), channels=3)


def test_a_dynamic_model_takes_multiples_of_its_largest_stride():
    inputs = keras.Input((None, None, 3))
    tokens = kl.PatchEmbedding(8, 4, name="patch_embedding")(inputs)
    assert kl.image_sizes(keras.Model(inputs, tokens)) == ImageSizes(
        multiple=4, channels=3)
    # A resized position table of a coarser grid sets the stride.
    added = kl.PositionEmbedding((2, 2), stride=8,
                                 name="position_embedding")(tokens,
                                                            images=inputs)
    assert kl.image_sizes(keras.Model(inputs, added)) == ImageSizes(
        multiple=8, channels=3)


def test_a_model_with_no_stride_takes_any_size():
    inputs = keras.Input((None, None, 3))
    model = keras.Model(inputs, keras.layers.Conv2D(2, 3)(inputs))
    assert kl.image_sizes(model) == ImageSizes(multiple=1, channels=3)
