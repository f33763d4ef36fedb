"""RandAugment against its definition, timm's ``auto_augment.py``: each
operation on the same 8-bit image gives timm's image, the level of every
operation is timm's, the draws follow the definition, the tf.data batch
path is its images one by one, and hostile options are refused."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from keras_vit.train.data import augment, randaugment as ra

import timm.data.auto_augment as aa
from PIL import Image

# timm's names of the "increasing" set (DeiT's rand-m9-mstd0.5-inc1).
TIMM_NAMES = {
    "auto_contrast": "AutoContrast", "equalize": "Equalize",
    "invert": "Invert", "rotate": "Rotate",
    "posterize": "PosterizeIncreasing", "solarize": "SolarizeIncreasing",
    "solarize_add": "SolarizeAdd", "color": "ColorIncreasing",
    "contrast": "ContrastIncreasing", "brightness": "BrightnessIncreasing",
    "sharpness": "SharpnessIncreasing", "shear_x": "ShearX",
    "shear_y": "ShearY", "translate_x": "TranslateXRel",
    "translate_y": "TranslateYRel"}
FILL = (124, 116, 104)  # timm's fill for ImageNet's mean: not grey


def _photo(height=48, width=64, seed=3):
    from keras_vit.export import samples

    return samples.photo_images((height, width, 3), 1, seed=seed)[0][0]


def _timm_op(monkeypatch, name, image, magnitude, sign):
    """timm's operation ``name`` on ``image`` with its level's random
    sign forced to ``sign`` (timm negates when ``random.random() >
    0.5``), bilinear, filling with FILL."""
    monkeypatch.setattr(random, "random", lambda s=sign: 0.9 if s < 0 else 0.1)
    level = aa.LEVEL_TO_ARG[name]
    hparams = dict(aa._HPARAMS_DEFAULT, img_mean=FILL)
    args = level(magnitude, hparams) if level else ()
    out = aa.NAME_TO_OP[name](Image.fromarray(image), *args, fillcolor=FILL,
                              resample=Image.BILINEAR)
    return np.asarray(out).astype("float32")


@pytest.mark.parametrize("magnitude", [0.0, 3.0, 9.0, 10.0])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_each_operation_is_timms_on_the_same_image(monkeypatch, magnitude,
                                                   sign):
    image = _photo()
    # One batch, one operation an image: the batch path, every operation.
    n = len(ra.OPS)
    draws = np.stack([np.arange(n), np.full(n, magnitude), np.full(n, sign)],
                     axis=1)[:, None, :]
    out = ra.augment_images(np.stack([image] * n).astype("float32"), draws,
                            fill=FILL)
    assert out.dtype == np.uint8
    for k, op in enumerate(ra.OPS):
        try:
            expected = _timm_op(monkeypatch, TIMM_NAMES[op], image,
                                magnitude, sign)
        except ValueError:
            # Posterize keeping 0 bits at magnitude 10: Pillow (10 and
            # later) refuses it in timm; by the definition it is black.
            assert op == "posterize" and magnitude == 10.0
            expected = np.zeros_like(out[k])
        np.testing.assert_array_equal(out[k], expected, err_msg=op)
        np.testing.assert_array_equal(
            ra.apply_op(image, op, magnitude, sign, FILL), expected,
            err_msg=op)


def test_levels_are_timms(monkeypatch):
    hparams = dict(aa._HPARAMS_DEFAULT)
    for op in ra.OPS:
        level = aa.LEVEL_TO_ARG[TIMM_NAMES[op]]
        for magnitude in np.arange(0.0, 10.01, 0.25):
            for sign in (1.0, -1.0):
                ours = ra.level_to_arg(op, magnitude, sign)
                if level is None:
                    assert ours is None
                    continue
                monkeypatch.setattr(random, "random",
                                    lambda s=sign: 0.9 if s < 0 else 0.1)
                (theirs,) = level(float(magnitude), hparams)
                assert float(ours) == pytest.approx(theirs, abs=1e-5), (
                    op, magnitude, sign)


def test_draws_follow_the_definition():
    import tensorflow as tf

    ds = tf.data.Dataset.range(3000).map(
        lambda i: ra.draw_ops(tf.stack([i, tf.constant(11, tf.int64)]),
                              num_ops=2, magnitude=9.0, magnitude_std=0.5))
    draws = np.concatenate([d.numpy() for d in ds.batch(1000)])  # (3000, 2, 3)
    ops, levels, signs = draws[..., 0], draws[..., 1], draws[..., 2]
    applied = ops >= 0
    # Each round applies its operation with chance 0.5, the operation
    # uniform over the 15, the sign fair, the level N(9, 0.5) kept <= 10.
    assert abs(applied.mean() - 0.5) < 0.02
    counts = np.bincount(ops[applied].astype(int), minlength=len(ra.OPS))
    expected = applied.sum() / len(ra.OPS)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
    assert abs((signs > 0).mean() - 0.5) < 0.02
    assert levels.max() <= 10.0 and abs(np.median(levels) - 9.0) < 0.05
    assert 0.4 < np.std(levels[levels < 10.0]) < 0.6
    # Rounds are independent draws; the same seed, the same draws.
    assert np.mean(ops[:, 0] == ops[:, 1]) < 0.35
    np.testing.assert_array_equal(
        ra.draw_ops((4, 11), 2, 9.0, 0.5).numpy(), draws[4])
    fixed = ra.draw_ops((4, 11), 2, 9.0).numpy()
    assert set(fixed[:, 1].tolist()) == {9.0}


def test_a_batch_is_its_images_one_by_one():
    """The tf.data path (draws from seeds, one Pillow call a batch) is each
    image's draws applied one by one."""
    images = np.stack([_photo(24, 32, seed=s) for s in range(6)])
    draws = np.stack([ra.draw_ops((s, 2), num_ops=3, magnitude=7.0,
                                  magnitude_std=1.0).numpy()
                      for s in range(6)])
    assert (draws[..., 0] >= 0).any() and (draws[..., 0] < 0).any()
    batch = ra.rand_augment_batch(images, draws, FILL).numpy()
    for image, rows, got in zip(images, draws, batch):
        one = image.astype("float32")
        for op, magnitude, sign in rows:
            if op >= 0:
                one = ra.apply_op(one, ra.OPS[int(op)], magnitude, sign,
                                  FILL)
        np.testing.assert_array_equal(got, one)
    np.testing.assert_array_equal(
        ra.rand_augment(images[0], (0, 2), 3, 7.0, 1.0, FILL), batch[0])


def test_non_finite_pixels_and_unknown_operations_are_refused():
    import tensorflow as tf

    images = np.full((2, 8, 8, 3), 100.0, "float32")
    images[1, 2, 3, 0] = np.nan
    draws = np.zeros((2, 1, 3), "float32")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="images must be finite"):
        ra.rand_augment_batch(images, draws)
    with pytest.raises(ValueError, match="images must be finite"):
        ra.augment_images(images, draws)
    with pytest.raises(ValueError, match=r"draws \(N, num_ops, 3\)"):
        ra.augment_images(images[:1], draws)
    with pytest.raises(ValueError, match="op must be one of"):
        ra.apply_op(images[0], "blur", 9.0)


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=True), st.text(max_size=4),
    st.lists(st.one_of(st.integers(-3, 30), st.floats(allow_nan=True),
                       st.booleans(), st.text(max_size=2)), max_size=4)
    .map(tuple)))
def test_hostile_randaugment_options_are_refused_naming_them(value):
    try:
        checked = augment.check_randaugment(value)
    except ValueError as error:
        message = str(error)
        assert "\n" not in message and "randaugment" in message
        return
    if value is None:
        assert checked is None
        return
    num_ops, magnitude = checked[:2]
    assert isinstance(num_ops, int) and num_ops >= 1
    assert 0.0 <= magnitude <= 10.0
    assert len(checked) == 2 or 0.0 <= checked[2] <= 10.0
