"""Keras callbacks for what ``model.fit`` lacks, usable by anyone's ``fit``:

- :class:`StepCheckpoints`: kill-safe checkpoints at optimizer-step
  boundaries of every model and optimizer variable.
- :class:`StopOnCtrlC`: the first Ctrl-C stops ``fit`` after the step under
  way; a second exits at once.
- :class:`StepLog`: the progress bar and a row of means every ``every``
  steps.
- :class:`EveryNSteps`: a function called every N optimizer steps.
- :class:`SeedEachBatch`: the backend's global random generator seeded
  per batch, for exact resume where Keras keeps no state of it (torch).
- :class:`TrainedWeights`: the trained weights, not the EMA Keras puts in
  at the end of every ``fit``, for a run that stopped early.
- :func:`close_all`: cleans up when ``fit`` raises.

Each counts optimizer steps, not ``fit``'s batches: with Keras' gradient
accumulation a step is k batches.

>>> import keras, numpy as np, tempfile
>>> keras.utils.set_random_seed(0)
>>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
>>> model.compile("sgd", "mse")
>>> folder = tempfile.mkdtemp()
>>> saver = StepCheckpoints(folder, every=2)
>>> _ = model.fit(np.ones((8, 3)), np.ones((8, 2)), batch_size=2,
...               epochs=1, verbose=0, callbacks=[saver])
>>> sorted(os.listdir(folder))
['ckpt-2.npz', 'ckpt-4.npz', 'manifest.json']
>>> StepCheckpoints(folder, every=2).restore(model)
4
"""

from __future__ import annotations

import math
import os
import time

import keras

from keras_vit.base.checks import check_int
from keras_vit.runtime.backend import variable_to_numpy
from keras_vit.train import checkpoints as ckpt_lib
from keras_vit.train.interrupt import StopOnInterrupt


class StepCounter(keras.callbacks.Callback):
    """Counts optimizer steps from ``start_step``: one every
    ``accumulation_steps`` training batches, calling :meth:`on_step_end`
    at each step boundary (where the accumulators are empty)."""

    def __init__(self, *, start_step=0, accumulation_steps=1):
        super().__init__()
        self.begin(start_step)
        self.accumulation_steps = check_int(
            "accumulation_steps", accumulation_steps, low=1)

    def begin(self, start_step):
        """Counts from ``start_step`` again (a ``fit`` that goes on from
        there)."""
        self.start_step = self.step = check_int("start_step", start_step,
                                                low=0)
        self._batches = 0

    def at_step_boundary(self):
        """Whether the batches counted so far end an optimizer step."""
        return not self._batches % self.accumulation_steps

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self.at_step_boundary():
            self.step = (self.start_step
                         + self._batches // self.accumulation_steps)
            self.on_step_end(self.step, logs or {})

    def on_step_end(self, step, logs):
        """Called when a batch ends optimizer step ``step``, with the
        batch's ``logs``."""


class StepCheckpoints(StepCounter):
    """Saves ``ckpt-STEP.npz`` into ``directory`` every ``every`` optimizer
    steps and at the end of each epoch of ``fit`` (so a run stopped early
    keeps its last step).

    A file holds every model variable (trainable or not: the dropout seed
    states too) and every optimizer variable, written atomically, the
    newest ``keep`` kept. Resuming exactly also needs ``fit`` fed the
    batches from the restored step on.

    Args:
        start_step: the step ``fit`` starts from (the one restored).
        accumulation_steps: ``fit`` batches per optimizer step.
        settings: a string (JSON) recorded in every file.
        save: False on all but one process of a multi-worker run.
        position: ``step -> {name: int}`` of more integers to record.
    """

    def __init__(self, directory, *, every, start_step=0,
                 accumulation_steps=1, keep=ckpt_lib.KEEP, settings=None,
                 save=True, position=None):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self.directory = os.fspath(directory)
        self.every = check_int("every", every, low=1)
        self.keep = check_int("keep", keep, low=1)
        self.settings = settings
        self.writes = save
        self.position = position or (lambda step: {"epoch": 0,
                                                   "batch_in_epoch": step})
        self.saved_step = start_step if start_step else None
        self.latest = None
        self.recorded_settings = None
        #: The id of the run (the folder's manifest's, else the restored
        #: file's).
        self.run = None

    @staticmethod
    def _groups(model):
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                f"model={model.name!r} has no optimizer: compile it before "
                "saving or restoring its checkpoints")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        return {"model": list(model.variables),
                "optimizer": list(optimizer.variables)}

    def restore(self, model):
        """Loads the newest checkpoint of :attr:`directory` into ``model``
        (compiled) and returns its step, or None when there is none. The
        file is checked whole before anything is assigned; a mismatch is
        one ValueError naming the file and the differences."""
        found = ckpt_lib.latest(self.directory)
        if found is None:
            return None
        step, path = found
        groups = self._groups(model)
        expected = {name: [(tuple(v.shape), variable_to_numpy(v).dtype)
                           for v in values]
                    for name, values in groups.items()}
        manifest = ckpt_lib.read_manifest(self.directory)
        arrays, meta = ckpt_lib.load(path, expected,
                                     run=manifest and manifest["run"])
        for name, values in groups.items():
            for variable, value in zip(values, arrays[name]):
                variable.assign(value)
        self.run = manifest["run"] if manifest else meta["run"]
        self.recorded_settings = meta["settings"]
        self.latest = path
        self.begin(step)
        self.saved_step = step
        return step

    def save(self, step=None):
        """Writes the checkpoint of ``step`` (default: the step reached)."""
        step = self.step if step is None else step
        self.saved_step = step
        # Read on every process (a weight split over jax processes is
        # gathered, which all of them take part in); one writes.
        groups = self._groups(self.model)
        arrays = {name: [variable_to_numpy(v) for v in values]
                  for name, values in groups.items()}
        if not self.writes:
            return None
        self.latest = ckpt_lib.save(self.directory, step, arrays,
                                    self.position(step), keep=self.keep,
                                    settings=self.settings, run=self.run)
        self.run = ckpt_lib.start_run(self.directory)
        return self.latest

    def start_run(self):
        """Writes the folder's manifest with the run's id, if it has none
        (the id of the checkpoint restored, else a new one)."""
        if self.writes:
            self.run = ckpt_lib.start_run(self.directory, self.run)
        return self.run

    def on_step_end(self, step, logs):
        if step % self.every == 0:
            self.save(step)

    def on_epoch_end(self, epoch, logs=None):
        # Before Keras' end of fit, which puts the EMA into the weights.
        if self.saved_step != self.step and self.at_step_boundary():
            self.save()


class StopOnCtrlC(StepCounter):
    """The first Ctrl-C sets ``model.stop_training`` at the next optimizer
    step boundary (a :class:`StepCheckpoints` placed after this callback
    saves that step); a second exits the process at once with status 130.
    Only in the main thread.

    After ``fit``: :attr:`requested` says whether it stopped for Ctrl-C.
    Keras calls no ``on_train_end`` when ``fit`` raises, so call
    :meth:`close` in a ``finally`` around ``fit``.

    >>> import keras
    >>> stop = StopOnCtrlC()
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> try:
    ...     _ = model.fit(keras.ops.ones((4, 2)), keras.ops.ones((4, 1)),
    ...                   callbacks=[stop], verbose=0)
    ... finally:
    ...     stop.close()
    >>> stop.requested
    False
    """

    def __init__(self, *, start_step=0, accumulation_steps=1, enabled=True):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self._guard = StopOnInterrupt(enabled=enabled)

    @property
    def requested(self):
        return self._guard.requested

    def on_train_begin(self, logs=None):
        self._guard.__enter__()

    def on_step_end(self, step, logs):
        if self._guard.requested:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.close()

    def close(self):
        """Gives Ctrl-C back to the handler it had before ``fit`` (once:
        later calls do nothing)."""
        self._guard.__exit__(None, None, None)


class EveryNSteps(StepCounter):
    """Calls ``fn(step)`` every ``every`` optimizer steps before
    ``end_step`` (the last step's work is the caller's)."""

    def __init__(self, fn, *, every, start_step=0, accumulation_steps=1,
                 end_step=None):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self.fn, self.every, self.end_step = fn, check_int(
            "every", every, low=1), end_step

    def on_step_end(self, step, logs):
        if (step % self.every == 0
                and (self.end_step is None or step < self.end_step)
                and not self.model.stop_training):
            self.fn(step)


class SeedEachBatch(StepCounter):
    """Seeds the backend's global random generator before every batch from
    ``seed`` and the batch's index in the run, so that a resumed run draws
    what the uninterrupted one would have where Keras keeps no state
    (torch's dropout of layers built without a seed)."""

    def __init__(self, seed, *, start_step=0, accumulation_steps=1):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self.seed = int(seed)

    def on_train_batch_begin(self, batch, logs=None):
        from keras_vit.runtime.backend import seed_global_generator

        index = self.start_step * self.accumulation_steps + self._batches
        seed_global_generator((self.seed * 1_000_003 + index) % 2**63)


class TrainedWeights(StepCounter):
    """Keras' ``fit`` ends by putting the optimizer's weight average into
    the model, also when it stops early. With ``enabled``: at the end of a
    ``fit`` that reached ``total_steps``, ``on_complete(step)`` runs on the
    trained weights (its result kept as :attr:`result`); after a ``fit``
    stopped before, the trained weights are put back."""

    def __init__(self, *, total_steps, enabled=True, on_complete=None,
                 start_step=0, accumulation_steps=1):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self.total_steps = total_steps
        self.enabled, self.on_complete = enabled, on_complete
        self.result = None
        self._trained = None

    def on_epoch_end(self, epoch, logs=None):
        if not self.enabled:
            return
        if self.step >= self.total_steps:
            if self.on_complete is not None:
                self.result = self.on_complete(self.step)
        else:
            self._trained = [variable_to_numpy(v)
                             for v in self.model.trainable_variables]

    def on_train_end(self, logs=None):
        if self._trained is not None:
            for v, value in zip(self.model.trainable_variables,
                                self._trained):
                v.assign(value)
            self._trained = None


class StepLog(StepCounter):
    """A progress bar over ``total_steps`` and, every ``every`` optimizer
    steps and at the end, a row ``{"step", "epoch", "loss", "accuracy",
    "learning_rate"}`` of the means since the row before, passed to
    ``write(row)``. A loss that is not finite raises FloatingPointError.

    Args:
        schedule: ``step -> learning rate`` for the rows (asking the
            optimizer would copy a jax step's state).
        write: ``row -> None``; rows are kept in :attr:`rows` too.
        epoch_of: ``step -> epoch`` of the data.
        hint: the words after "lower" in the non-finite loss's message.
    """

    def __init__(self, *, total_steps, every, schedule=None, write=None,
                 start_step=0, accumulation_steps=1, epoch_of=None,
                 show=True, hint="the learning rate"):
        super().__init__(start_step=start_step,
                         accumulation_steps=accumulation_steps)
        self.total_steps = total_steps
        self.every = check_int("every", every, low=1)
        self.schedule, self.write = schedule, write
        self.epoch_of = epoch_of or (lambda step: 0)
        self.hint = hint
        self.rows = []
        self._show = show
        self._bar = None
        self._last = {}  # metric -> (batches counted, sum)
        self._epoch_batches = 0
        self._started = None

    def on_train_begin(self, logs=None):
        from tqdm.auto import tqdm

        self._started = time.perf_counter()
        self._bar = tqdm(total=self.total_steps, initial=self.start_step,
                         unit="step", desc="train", disable=not self._show,
                         dynamic_ncols=True)

    def on_epoch_begin(self, epoch, logs=None):
        self._last = {}  # Keras starts its running means again
        self._epoch_batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_batches += 1
        super().on_train_batch_end(batch, logs)

    def on_step_end(self, step, logs):
        self._bar.update(1)
        if step % self.every == 0 or step == self.total_steps:
            self._row(step, self._epoch_batches, logs)

    def _row(self, step, batches, logs):
        row = {"step": step, "epoch": int(self.epoch_of(step))}
        for key in ("loss", "accuracy"):
            if key not in logs:
                continue
            # Keras' logs are running means over the epoch's batches so far.
            total = float(logs[key]) * batches
            seen, before = self._last.get(key, (0, 0.0))
            self._last[key] = (batches, total)
            value = (total - before) / max(1, batches - seen)
            row[key] = round(value, 6)
            if key == "loss" and not math.isfinite(value):
                raise FloatingPointError(
                    f"the training loss is {value} at step {step}; lower "
                    f"{self.hint} or clip gradients (grad_clip_norm)")
        if self.schedule is not None:
            row["learning_rate"] = float(
                keras.ops.convert_to_numpy(self.schedule(step)))
        self.rows.append(row)
        if self.write is not None:
            self.write(row)
        self._bar.set_postfix(
            {k: f"{row[k]:.4g}" for k in ("loss", "accuracy",
                                            "learning_rate") if k in row},
            refresh=False)

    def on_epoch_end(self, epoch, logs=None):
        # A stop between rows (Ctrl-C, the end): the steps since the last.
        if self.rows and self.rows[-1]["step"] == self.step:
            return
        if (self._epoch_batches and self.step > self.start_step
                and self.at_step_boundary()):
            self._row(self.step, self._epoch_batches, logs or {})

    def on_train_end(self, logs=None):
        self.close()

    def close(self):
        """Closes the progress bar (once: later calls do nothing)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def wall(self):
        """Seconds since ``fit`` began."""
        return time.perf_counter() - self._started


def close_all(callbacks):
    """Calls ``close()`` on each of ``callbacks`` that has one. Keras calls
    no ``on_train_end`` when ``fit`` raises: call this in a ``finally``
    around ``fit``.

    >>> import keras
    >>> callbacks = [StopOnCtrlC(), keras.callbacks.History()]
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> try:
    ...     _ = model.fit(keras.ops.ones((4, 2)), keras.ops.ones((4, 1)),
    ...                   callbacks=callbacks, verbose=0)
    ... finally:
    ...     close_all(callbacks)
    """
    for callback in callbacks:
        if callable(getattr(callback, "close", None)):
            callback.close()
