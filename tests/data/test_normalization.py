"""A model's input normalisation is decided once
(``keras_vit.data.normalization``) and every path that feeds the model
honours it: the model's own ``preprocessing`` layer, ``zoo.preprocess_input``
(``keras-vit predict``), the training/evaluation pipeline, analysis, the
exported serving graphs, a saved ``.keras`` file and ``rebuild``."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_vit
from keras_vit import zoo
from keras_vit.data import normalization
from keras_vit.data.normalization import (NAMED, check_normalization,
                                          model_input, of_model,
                                          pipeline_options)

KW = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
          num_heads=2, mlp_dim=16, num_classes=3)
CUSTOM = {"mean": [0.2, 0.3, 0.4], "std": [0.1, 0.2, 0.3]}
# timm's tags with mean 0 and std 1: the model takes pixels / 255.
UNIT = {"mean": [0.0] * 3, "std": [1.0] * 3}


def _pair(value):
    """The same weights, with and without the normalisation inside."""
    keras.utils.set_random_seed(0)
    inside = keras_vit.vit(**KW, include_preprocessing=True,
                           input_normalization=value)
    outside = keras_vit.vit(**KW, input_normalization=value)
    outside.set_weights(inside.get_weights())
    return inside, outside


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _pixels(n=2, size=16):
    return np.random.default_rng(0).uniform(
        0, 255, (n, size, size, 3)).astype("float32")


@pytest.mark.backends
@pytest.mark.parametrize("value", [None, "imagenet", "clip", CUSTOM, UNIT])
def test_every_path_normalises_as_the_model_says(value, tmp_path):
    inside, outside = _pair(value)
    expected = check_normalization("input_normalization", value)
    assert of_model(inside) == of_model(outside) == expected
    pixels = _pixels()
    want = _np(inside(pixels))
    # The formula itself, written out.
    mean, std = np.float32(expected.mean), np.float32(expected.std)
    np.testing.assert_allclose(_np(model_input(outside, pixels)),
                               (pixels / 255 - mean) / std, atol=1e-5)
    # zoo.preprocess_input (what keras-vit predict runs) and analysis.
    fed = zoo.preprocess_input(pixels, input_normalization=of_model(outside))
    np.testing.assert_allclose(_np(outside(fed)), want, atol=1e-5)
    np.testing.assert_array_equal(model_input(inside, pixels), pixels)
    # The evaluation pipeline, at the model's size (no resize, no crop).
    from keras_vit.train.data.pipeline import dataset

    labels = np.zeros(len(pixels), "int64")
    for model in (inside, outside):
        (batch, _), = dataset((pixels.astype("uint8"), labels), 16, 2,
                              training=False, prefetch=False,
                              **pipeline_options(model)).as_numpy_iterator()
        np.testing.assert_allclose(
            _np(model(batch)),
            _np(inside(pixels.astype("uint8").astype("float32"))),
            atol=1e-4)
    # The exported serving graph with uint8 input normalises inside.
    from keras_vit.export.graph import ServingGraph

    graph = ServingGraph(outside, ("logits",), uint8_input=True)
    uint8 = pixels.astype("uint8")
    np.testing.assert_allclose(
        _np(graph.serve(uint8)["logits"]),
        _np(inside(uint8.astype("float32"))), atol=1e-4)
    assert graph.describe()["input"]["normalization"] == expected.to_config()
    # A .keras file and rebuild keep it.
    path = tmp_path / "m.keras"
    inside.save(path)
    again = keras.saving.load_model(path)
    assert of_model(again) == expected
    np.testing.assert_allclose(_np(again(pixels)), want, atol=1e-6)
    assert of_model(keras_vit.rebuild(outside, num_classes=5)) == expected


def test_the_official_normalisation_is_the_default_and_is_not_recorded():
    model = keras_vit.vit(**KW)
    assert model.get_config()["input_normalization"] is None
    assert of_model(model) == NAMED["official"]
    named = keras_vit.vit(**KW, input_normalization="official")
    assert named.get_config()["input_normalization"] is None
    layer = keras_vit.vit(**KW, include_preprocessing=True).get_layer(
        "preprocessing")
    # The official Rescaling, as the checkpoints written so far hold it.
    assert layer.get_config()["scale"] == pytest.approx(1 / 127.5)
    assert layer.get_config()["offset"] == pytest.approx(-1.0)


def test_a_plain_keras_model_reads_as_its_first_layer_says():
    inputs = keras.Input((4, 4, 3))
    plain = keras.Model(inputs, keras.layers.Rescaling(
        1 / 127.5, -1, name="preprocessing")(inputs))
    assert normalization.takes_raw_pixels(plain)
    assert of_model(plain) == NAMED["official"]


# Hostile normalisations: a normalisation is accepted whole or refused in
# one line naming the argument; never a NaN or a division by zero later.
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                     st.integers(-5, 5), st.booleans(), st.text(max_size=3),
                     st.none())
_values = st.one_of(
    st.none(), st.text(max_size=10), st.sampled_from(sorted(NAMED)),
    st.dictionaries(st.sampled_from(["mean", "std", "scale"]),
                    st.one_of(_numbers, st.lists(_numbers, max_size=4)),
                    max_size=3),
    st.lists(_numbers, max_size=3), _numbers)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_hostile_normalisations_are_refused_in_one_line(value):
    try:
        result = check_normalization("input_normalization", value)
    except ValueError as e:
        message = str(e)
        assert message.startswith("input_normalization")
        assert "\n" not in message
        return
    assert len(result.mean) == len(result.std) == 3
    assert all(math.isfinite(v) for v in result.mean + result.std)
    assert all(v > 0 for v in result.std)
    extremes = np.float32([[0.0] * 3, [255.0] * 3])
    assert np.all(np.isfinite(result(extremes)))


def test_the_builders_refuse_a_bad_normalisation_naming_it():
    with pytest.raises(ValueError, match=r"input_normalization\['std'\] "
                       "must be positive"):
        keras_vit.vit(**KW, input_normalization={"mean": 0.5, "std": 0})


class _Recorded:
    """What the pipelines read off a model: its config."""

    name = "recorded"

    def __init__(self, value, raw):
        self.config = {"input_normalization": value,
                       "include_preprocessing": raw}

    def get_config(self):
        return self.config


_normalisations = st.one_of(
    st.none(), st.sampled_from(sorted(NAMED)),
    st.builds(lambda m, s: {"mean": m, "std": s},
              st.lists(st.floats(-1, 1), min_size=3, max_size=3),
              st.lists(st.floats(0.01, 2), min_size=3, max_size=3)))


@settings(max_examples=200, deadline=None)
@given(_normalisations, st.booleans(), _normalisations,
       st.sampled_from([None, True, False]))
def test_a_pipeline_feeds_what_the_model_says_or_stops_in_one_line(
        recorded, raw, asked, asked_raw):
    model = _Recorded(recorded, raw)
    want = check_normalization("input_normalization", recorded)
    try:
        options = pipeline_options(model, raw_pixels=asked_raw,
                                   input_normalization=asked)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message
        assert message.startswith(("raw_pixels=", "input_normalization="))
        assert "contradicts model='recorded'" in message
        if message.startswith("raw_pixels="):
            assert asked_raw is not None and asked_raw != raw
        else:
            assert not normalization.same(want, check_normalization(
                "input_normalization", asked))
        return
    assert options == {"raw_pixels": raw, "input_normalization": want}
    assert asked_raw in (None, raw)
    assert asked is None or normalization.same(
        want, check_normalization("input_normalization", asked))


def test_without_a_model_the_arguments_decide():
    assert pipeline_options() == {"raw_pixels": False,
                                  "input_normalization": NAMED["official"]}
    assert pipeline_options(raw_pixels=True, input_normalization="clip") == {
        "raw_pixels": True, "input_normalization": NAMED["clip"]}
    with pytest.raises(ValueError, match=r"^raw_pixels must be True, False "
                       "or None .*; received raw_pixels='yes'$"):
        pipeline_options(raw_pixels="yes")
