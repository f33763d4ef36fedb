"""keras_vit.train.fit: the recipe's loss (label smoothing) against a hand
computation, and the same loss compiled into the Trainer's model."""

import keras
import numpy as np
import pytest

from testkit import QUICK, tiny as _tiny
import keras_vit


# A correctness bug of the audit.
def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_label_smoothing_matches_a_hand_computation():
    from keras_vit.train.fit import smoothed_sparse_crossentropy

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)).astype("float32")
    labels = np.array([0, 3, 1, 1, 2])
    eps, k = 0.1, 4
    target = np.full((5, k), eps / k)
    target[np.arange(5), labels] += 1.0 - eps
    expected = float(np.mean(-(target * _log_softmax(logits)).sum(-1)))
    loss = smoothed_sparse_crossentropy(eps)
    assert float(loss(labels, logits)) == pytest.approx(expected, rel=1e-5)
    # The loss the Trainer compiles into the model it fits.
    tr = keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                 total_steps=2, warmup_steps=1,
                                 label_smoothing=eps, **QUICK)
    images = rng.uniform(-1, 1, size=(5, 16, 16, 3)).astype("float32")
    digits = np.array([0, 9, 3, 3, 7])
    model_logits = keras.ops.convert_to_numpy(tr.model(images))
    target = np.full((5, 10), eps / 10)
    target[np.arange(5), digits] += 1.0 - eps
    want = float(-(target * _log_softmax(model_logits)).sum(-1).mean())
    got = tr.model.loss(digits, model_logits)
    assert float(keras.ops.convert_to_numpy(got)) == pytest.approx(
        want, rel=1e-5)
