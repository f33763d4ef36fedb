"""keras_vit.train.loop: the Trainer's exponential moving average of the
weights against a hand computation."""

import numpy as np
import pytest

from testkit import QUICK, tiny as _tiny
import keras_vit


# A correctness bug of the audit.
@pytest.mark.slow
def test_ema_matches_a_hand_computation():
    decay_cap = 0.2
    tr = keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                 total_steps=3, warmup_steps=1,
                                 learning_rate=1e-2, ema_decay=decay_cap,
                                 **QUICK)

    def current():
        return [v.numpy().copy() for v in tr.model.trainable_variables]

    ema = current()
    for t in (1, 2):
        tr.fit(stop_at_step=t)
        now = current()
        decay = min(decay_cap, (1.0 + t) / (10.0 + t))  # 2/11, then 0.2
        ema = [decay * e + (1.0 - decay) * v for e, v in zip(ema, now)]
        for e, want in zip(tr.ema, ema):
            np.testing.assert_allclose(e.numpy(), want, rtol=1e-5,
                                       atol=1e-7)
    assert not np.allclose(ema[0], now[0])  # the average lags the weights
