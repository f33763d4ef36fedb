"""keras_vit.train.callbacks in anyone's ``model.fit``: step boundaries
under Keras' gradient accumulation, checkpoints read whole before
anything is assigned, the history's means, and refusals that name the
argument."""

import os

import keras
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from keras_vit.train import callbacks, checkpoints


def _model(accumulation=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(
        0.1, gradient_accumulation_steps=accumulation), "mse")
    return model


def _fit(model, batches, cbs):
    x = np.arange(batches * 6, dtype="float32").reshape(batches * 2, 3)
    model.fit(x / x.max(), np.ones((batches * 2, 2), "float32"),
              batch_size=2, epochs=1, verbose=0, callbacks=cbs,
              shuffle=False)


def test_checkpoints_fall_on_optimizer_steps_under_accumulation(tmp_path):
    # 6 batches of 2 micro-batches a step: steps 1-3, saved every 2 and at
    # the end; the optimizer's own count agrees with the file's step.
    model = _model(accumulation=2)
    saver = callbacks.StepCheckpoints(tmp_path, every=2,
                                      accumulation_steps=2)
    log = callbacks.StepLog(total_steps=3, every=1, accumulation_steps=2,
                            show=False)
    _fit(model, 6, [log, saver])
    assert checkpoints.steps(str(tmp_path)) == [2, 3]
    assert [row["step"] for row in log.rows] == [1, 2, 3]
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 3
    again = _model(accumulation=2)
    assert callbacks.StepCheckpoints(tmp_path, every=2).restore(again) == 3
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_history_rows_are_the_means_of_their_own_steps():
    model = _model()
    log = callbacks.StepLog(total_steps=6, every=2, show=False)
    _fit(model, 6, [log])
    # The reference: the same model and batches one train_on_batch at a
    # time, each batch's own loss (Keras' logs in fit are running means).
    ref = _model()
    x = np.arange(36, dtype="float32").reshape(12, 3)
    x, y = x / x.max(), np.ones((12, 2), "float32")
    losses = []
    for i in range(6):
        ref.reset_metrics()
        losses.append(float(ref.train_on_batch(x[2 * i:2 * i + 2],
                                               y[2 * i:2 * i + 2])))
    want = [np.mean(losses[i:i + 2]) for i in (0, 2, 4)]
    assert [row["step"] for row in log.rows] == [2, 4, 6]
    np.testing.assert_allclose([row["loss"] for row in log.rows], want,
                               rtol=1e-4)


def test_a_non_finite_loss_stops_naming_the_step():
    model = _model()
    model.compile(keras.optimizers.SGD(1e30), "mse")
    log = callbacks.StepLog(total_steps=10, every=1, show=False,
                            hint="learning_rate=1e30")
    with pytest.raises(FloatingPointError,
                       match=r"at step \d+; lower learning_rate=1e30"):
        _fit(model, 10, [log])


def test_refusals_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="every"):
        callbacks.StepCheckpoints(tmp_path, every=0)
    with pytest.raises(ValueError, match="accumulation_steps"):
        callbacks.StepLog(total_steps=3, every=1, accumulation_steps=0)
    bare = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    checkpoints.save(str(tmp_path), 1, {"model": [np.zeros((3, 2))]},
                     {"epoch": 0, "batch_in_epoch": 1})
    with pytest.raises(ValueError, match="has no optimizer: compile it"):
        callbacks.StepCheckpoints(tmp_path, every=1).restore(bare)


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_a_damaged_checkpoint_is_refused_before_anything_is_assigned(
        tmp_path_factory, cut, byte):
    folder = tmp_path_factory.mktemp("damaged")
    model = _model()
    model.optimizer.build(model.trainable_variables)
    saver = callbacks.StepCheckpoints(folder, every=1)
    saver.set_model(model)
    path = saver.save(4)
    data = bytearray(open(path, "rb").read())
    # One byte changed, or the file cut short, at a drawn place.
    at = cut % len(data)
    if cut % 2:
        data[at] = byte if data[at] != byte else (byte + 1) % 256
    else:
        del data[at:]
    with open(path, "wb") as f:
        f.write(bytes(data))
    other = _model()
    for v in other.trainable_variables:
        v.assign(np.full(v.shape, 7.0, "float32"))
    before = other.get_weights()
    try:
        step = callbacks.StepCheckpoints(folder, every=1).restore(other)
    except ValueError as e:
        assert str(e).startswith(f"The checkpoint {path!r}")
        assert "\n" not in str(e)
        for a, b in zip(before, other.get_weights()):
            np.testing.assert_array_equal(a, b)
    else:
        # A change the archive does not notice (inside a value): read as
        # written, every array of the right shape and dtype, finite or not.
        assert step == 4
        assert all(w.shape == b.shape for w, b in zip(
            other.get_weights(), before))
    os.remove(path)
