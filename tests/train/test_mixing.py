"""keras_vit.train.mixing: for the same lambda and the same box, the mixed
images and soft targets equal timm's Mixup (its own code run side by
side); a seeded batch mix is reproducible and its targets sum to 1; bad
arguments are refused in one line naming them."""

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from keras_vit.train import mixing

NUM_CLASSES = 5


def _batch(height=7, width=10, n=4):
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (n, height, width, 3)).astype("float32")
    return images, np.array([0, 3, 4, 3])[:n]


def _timm_mix(images, labels, lam, cutmix, smoothing, box_seed):
    """timm's Mixup (mode "batch") on NCHW copies, its lambda and its
    choice of MixUp or CutMix fixed; the CutMix box drawn by its own
    rand_bbox from NumPy's global state seeded with ``box_seed``."""
    import torch
    from timm.data.mixup import Mixup

    mixer = Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, label_smoothing=smoothing,
                  num_classes=NUM_CLASSES)
    mixer._params_per_batch = lambda: (lam, cutmix)
    np.random.seed(box_seed)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    x, target = mixer(x, torch.from_numpy(labels))
    return x.numpy().transpose(0, 2, 3, 1), target.numpy()


@pytest.mark.parametrize("lam, cutmix, smoothing, box_seed", [
    (0.7, False, 0.1, 0),
    (0.3141, False, 0.0, 0),
    (0.6, True, 0.1, 0),    # a box inside the image
    (0.2, True, 0.0, 3),    # a big box, clipped: lambda corrected
    (0.93, True, 0.25, 11),
])
def test_same_lambda_and_box_as_timm(lam, cutmix, smoothing, box_seed):
    from timm.data.mixup import cutmix_bbox_and_lam

    images, labels = _batch()
    want_images, want_targets = _timm_mix(images, labels, lam, cutmix,
                                          smoothing, box_seed)
    # The centre timm's rand_bbox draws: its first two randint calls.
    np.random.seed(box_seed)
    center = (np.random.randint(0, 7), np.random.randint(0, 10))
    got_images, got_targets = mixing.apply_mix(
        images, labels, lam=lam, cutmix=cutmix, center=center,
        label_smoothing=smoothing, num_classes=NUM_CLASSES)
    np.testing.assert_allclose(got_images.numpy(), want_images, atol=1e-6)
    np.testing.assert_allclose(got_targets.numpy(), want_targets, atol=1e-6)
    if cutmix:
        np.random.seed(box_seed)
        (top, bottom, left, right), timm_lam = cutmix_bbox_and_lam(
            (4, 3, 7, 10), lam)
        box, our_lam = mixing.cutmix_box(7, 10, lam, center)
        assert [int(v) for v in box] == [top, bottom, left, right]
        assert float(our_lam) == pytest.approx(timm_lam, abs=1e-12)
        if box_seed == 3:
            assert timm_lam != pytest.approx(lam)  # the clipped case


def test_seeded_batches_mix_reproducibly():
    images, labels = _batch(8, 8)
    options = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1,
                   num_classes=NUM_CLASSES)
    a = mixing.mix_batch(images, labels, seed=(3, 4), **options)
    b = mixing.mix_batch(images, labels, seed=(3, 4), **options)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    draws = {round(float(mixing.mix_batch(images, labels, seed=(3, s),
                                          **options)[1][0, 0]), 6)
             for s in range(8)}
    assert len(draws) > 4  # new seed, new lambda
    # CutMix only: each image holds its partner's pixels in exactly the
    # share the targets give the partner.
    flat = np.repeat(np.arange(4, dtype="float32"), 64 * 3).reshape(
        4, 8, 8, 3)
    for s in range(4):
        mixed, targets = mixing.mix_batch(
            flat, np.arange(4), cutmix_alpha=1.0, num_classes=4, seed=(s, 0))
        partner_share = np.mean(mixed.numpy()[0] == 3.0)
        assert targets.numpy()[0, 3] == pytest.approx(partner_share)
    # Nothing to mix: the smoothed one-hot labels.
    _, targets = mixing.mix_batch(images, labels, label_smoothing=0.1,
                                  num_classes=NUM_CLASSES, seed=(0, 0))
    np.testing.assert_allclose(targets.numpy()[0],
                               [0.92, 0.02, 0.02, 0.02, 0.02], atol=1e-6)


GOOD = {
    "mixup_alpha": st.one_of(st.floats(0, 3), st.integers(0, 3)),
    "cutmix_alpha": st.one_of(st.floats(0, 3), st.integers(0, 3)),
    "switch_prob": st.floats(0, 1),
    "label_smoothing": st.floats(0, 1, exclude_max=True),
    "num_classes": st.integers(1, 6),
}
HOSTILE = st.sampled_from([float("nan"), float("inf"), -float("inf"), True,
                           "0.5", None, [1.0]])
BAD = {
    # Above the cap too (limits.MAX_MIX_ALPHA, what a recipe takes).
    "mixup_alpha": st.one_of(st.floats(-3, 0, exclude_max=True),
                             st.floats(100, 1e300, exclude_min=True),
                             HOSTILE),
    "cutmix_alpha": st.one_of(st.floats(-3, 0, exclude_max=True),
                              st.floats(100, 1e300, exclude_min=True),
                              HOSTILE),
    "switch_prob": st.one_of(st.floats(-2, 0, exclude_max=True),
                             st.floats(1, 3, exclude_min=True), HOSTILE),
    "label_smoothing": st.one_of(st.floats(-2, 0, exclude_max=True),
                                 st.floats(1, 3), HOSTILE),
    "num_classes": st.one_of(st.integers(-3, 0), st.just(2.5), HOSTILE),
}


@st.composite
def mixing_calls(draw):
    """(the argument that is bad or None, the keyword arguments, labels):
    half the calls all valid, the others with one argument (or a label)
    bad."""
    bad = draw(st.sampled_from([None] * 6 + sorted(BAD) + ["labels"]))
    call = {name: draw(BAD[name] if name == bad else GOOD[name])
            for name in GOOD}
    classes = call["num_classes"] if bad != "num_classes" else 3
    labels = draw(st.lists(st.integers(0, classes - 1), min_size=2,
                           max_size=2))
    if bad == "labels":
        labels[draw(st.integers(0, 1))] = draw(st.sampled_from(
            [-1, classes, classes + 5]))
    return bad, call, np.array(labels)


_VALID = dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
              label_smoothing=0.1, num_classes=3)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(mixing_calls())
# Every argument's refusal, whatever the draws.
@example(("label_smoothing", dict(_VALID, label_smoothing=1.0),
          np.array([0, 1])))
@example(("labels", _VALID, np.array([0, 3])))
@example(("mixup_alpha", dict(_VALID, mixup_alpha=-0.1), np.array([0, 1])))
@example(("mixup_alpha", dict(_VALID, mixup_alpha=1e9), np.array([0, 1])))
@example(("cutmix_alpha", dict(_VALID, cutmix_alpha=float("nan")),
          np.array([0, 1])))
def test_arguments_are_checked(case):
    bad, call, labels = case
    images = np.zeros((2, 3, 3, 3), "float32")
    if bad is None:
        mixed, targets = mixing.mix_batch(images, labels, seed=(1, 2),
                                          **call)
        assert targets.shape == (2, call["num_classes"])
        np.testing.assert_allclose(targets.numpy().sum(axis=1), 1.0,
                                   atol=1e-6)
        assert np.all(targets.numpy() >= 0)
        assert mixed.shape == images.shape
        return
    with pytest.raises(ValueError) as error:
        mixing.mix_batch(images, labels, seed=(1, 2), **call)
    message = str(error.value)
    assert "\n" not in message and message.startswith(bad), (bad, message)
