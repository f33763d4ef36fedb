"""The training loop is Keras' own: :class:`Trainer` builds the model in
the run's placement, compiles it with the recipe's optimizer, and runs
``model.fit`` on the recipe's input with the callbacks of
:mod:`~keras_vit.train.callbacks`.
"""

from __future__ import annotations

import dataclasses
import os

from keras_vit.train.data.load import load_data
from keras_vit.train import recipes as recipes_lib
from keras_vit.train import run_dir, settings
from keras_vit.train.build import build_model, dtype_policy
from keras_vit.train.evaluation import model_image_size
from keras_vit.train.interrupt import TrainingInterrupted
from keras_vit.train.placement import Placement
from keras_vit.train.progress import RunLog


@dataclasses.dataclass
class TrainResult:
    """What a finished (or stopped) run returns.

    Attributes:
        model: the trained ``keras.Model`` (EMA weights when EMA is on).
        metrics: the figures also written to ``metrics.json``.
        out_dir: the run directory, or None.
    """

    model: object
    metrics: dict
    out_dir: str | None


class Trainer:
    """Fine-tunes or trains a model with a recipe through ``model.fit``,
    on any Keras backend. The input is a function of the step, so a
    resumed run ends where an uninterrupted one would.

    Args:
        model: a zoo name (``"ViT-B/16"``), a ``.keras`` path, a
            ``keras.Model`` or a function returning one.
        train_data: an :class:`~keras_vit.train.data.sources.ImageSource`
            or a spec for :func:`~keras_vit.train.load_data` (``"digits"``,
            ``"tfds:cifar10"``, a folder, an ``.npz``, ``(x, y)``).
        eval_data: held-out data evaluated at the end (and every
            ``eval_every`` steps), or None.
        recipe: a recipe name (``"finetune"``, ``"pretrain"``, ...) or a
            :class:`~keras_vit.train.recipes.Recipe`.
        out_dir: the run directory (checkpoints, logs, metrics, model);
            None keeps nothing on disk and cannot resume.
        strategy: a name for :func:`~keras_vit.train.strategy` or a
            ``tf.distribute.Strategy`` (TensorFlow); ``"auto"``,
            ``"default"`` or ``"data_parallel"`` (JAX); ``"auto"`` or
            ``"default"`` (torch).
        weights: for a zoo name: a weights tag, path, URL, ``"auto"``, or
            None (random initialisation).
        resume: continue from the last checkpoint in ``out_dir``; False
            deletes old checkpoints and starts again.
        model_options: more keyword arguments for ``zoo.load``.
        remat: True rematerialises every block in training (less
            memory); None keeps the model's own setting.
        tpu: TPU name or address for the ``tpu`` strategy.
        model_parallel: JAX only: split the big weights over this many
            devices (``keras.distribution.ModelParallel``).
        verbose: print the set-up, a progress bar and the result.
        **overrides: recipe fields (``total_steps=``, ``batch_size=``, ...).

    Subclasses change the objective with :meth:`prepare_model`,
    :meth:`objective` and :meth:`training_batches`.

    Example (a few steps on the built-in digits):

    >>> import keras_vit, keras_vit.train as kt
    >>> tiny = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
    >>> run = kt.Trainer(tiny, "digits", recipe="pretrain", total_steps=3,
    ...                  warmup_steps=1, batch_size=16, strategy="default",
    ...                  verbose=False).fit()
    >>> run.metrics["final_step"], 0 < run.metrics["train_loss"] < 5
    (3, True)
    """

    #: Whether the model's head is named after the data's classes (not for
    #: a self-supervised objective).
    names_classes = True
    strategy = property(lambda self: self.placement.strategy)

    def __init__(self, model, train_data, eval_data=None, *,
                 recipe="finetune", out_dir=None, strategy="auto",
                 weights="auto", resume=True, model_options=None, tpu=None,
                 model_parallel=None, remat=None, verbose=True,
                 **overrides):
        import keras

        self.recipe = recipes_lib.get(recipe, **overrides)
        self.verbose = verbose
        self.placement = Placement(strategy, tpu=tpu,
                                   model_parallel=model_parallel)
        self.info = self.placement.info
        self.is_chief = self.info["is_chief"]
        self.out_dir = None if out_dir is None else os.path.abspath(
            os.fspath(out_dir))
        if self.out_dir is not None and self.is_chief:
            self._release_run_dir = run_dir.lock_run_dir(self, self.out_dir)
        self.train = load_data(train_data, verbose=verbose)
        self.eval = (None if eval_data is None
                     else load_data(eval_data, split="test",
                                    verbose=verbose))
        named = recipe if isinstance(recipe, str) else None
        plan = settings.plan(
            self.recipe, self.train, self.eval,
            replicas=self.placement.replicas,
            strategy_name=self.info["name"], named=named is not None,
            overrides=overrides)
        self.recipe = r = plan.recipe
        self.per_replica, self.micro, self.accum = (
            plan.per_replica, plan.micro, plan.accum)
        self.steps_per_epoch = plan.steps_per_epoch
        self.total_steps = plan.total_steps
        self.precision = self.placement.precision(r.precision)
        self.jit_compile = self.placement.uses_xla(r.jit_compile,
                                                   self.precision)

        keras.utils.set_random_seed(r.seed)
        _build_and_compile(self, model, weights=weights, remat=remat,
                           model_options=model_options, named=named,
                           overrides=overrides)
        r = self.recipe
        self.ema = r.ema_decay is not None
        self.model_name = settings.model_name(model, self.trained_model())
        from keras_vit.train.callbacks import StepCheckpoints

        self.checkpoints = StepCheckpoints(
            run_dir.checkpoint_dir(self.out_dir or "."),
            every=r.checkpoint_every, accumulation_steps=self.accum,
            save=self.is_chief and self.out_dir is not None,
            position=self.position)
        self.resumed_from = None if self.out_dir is None else (
            run_dir.open_run(self.out_dir, self.checkpoints, self.model,
                             self._run_config(), resume=resume,
                             chief=self.is_chief, say=self._say))
        self.step = self.resumed_from or 0

    def prepare_model(self, model):
        """The model :func:`build_model` made -> the model to train (in the
        run's placement scope and dtype policy). Here: checks the head."""
        settings.check_head(model, self.train.num_classes)
        return model

    def objective(self):
        """``(loss, metrics)`` for ``model.compile``, or None for the
        recipe's (:func:`~keras_vit.train.recipes.compile_model`)."""
        return None

    def trained_model(self):
        """The model a run returns and saves (``self.model`` is what
        ``fit`` trains)."""
        return self.model

    def training_batches(self, dataset, first_step, shard):
        """The ``tf.data`` batches of one input pipeline (``shard``: its
        index), the first for ``first_step`` -> what ``fit`` trains on."""
        return dataset

    def position(self, step):
        """``{"epoch", "batch_in_epoch"}`` of the data at ``step``."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        return {"epoch": epoch, "batch_in_epoch": in_epoch}

    def _run_config(self):
        return settings.record(self)

    def _say(self, *args):
        if self.verbose and self.is_chief:
            print(*args, flush=True)

    def describe(self):
        """One paragraph on what the run does."""
        return settings.describe(self)

    def _batches(self, start, end):
        """``fit``'s input from optimizer step ``start`` to ``end``, as the
        uninterrupted run would see it."""
        from keras_vit.train.data.pipeline import steps_dataset

        options = dict(recipes_lib.pipeline_options(
            self.recipe, self.train.num_classes),
            model=self.trained_model())
        options.pop("training")

        def make(shard, local, per_batch):
            batches = steps_dataset(
                self.train, self.image_size, self.micro * per_batch,
                start=start, end=end, steps_per_epoch=self.steps_per_epoch,
                images_per_step=self.per_replica * local, shard=shard,
                **options)
            return self.training_batches(batches, start, shard)

        return self.placement.batches(make)

    def fit(self, stop_at_step=None):
        """Trains to the recipe's last step (from the last checkpoint if
        there is one), evaluates, saves, and returns a :class:`TrainResult`.
        ``stop_at_step`` ends the run early after that step, with a
        checkpoint."""
        r, start = self.recipe, self.step
        log = RunLog(self.out_dir, chief=self.is_chief, step=start)
        self._say(f"training {self.describe()}")
        if self.resumed_from is not None and start == self.resumed_from:
            at = self.position(start)
            self._say(f"resumed from step {start} (epoch {at['epoch']}, "
                      f"batch {at['batch_in_epoch']} of "
                      f"{self.steps_per_epoch}) of {self.checkpoints.latest}")
        end = self.total_steps if stop_at_step is None else min(
            self.total_steps, stop_at_step)
        callbacks, ctrl_c, steps, final = _callbacks(self, log, start, end)
        if end > start:
            from keras_vit.train.callbacks import close_all

            try:
                with self.placement.scope():
                    self.model.fit(self._batches(start, end), epochs=1,
                                   steps_per_epoch=(end - start) * self.accum,
                                   callbacks=callbacks, shuffle=False,
                                   verbose=0)
            finally:  # fit that raises calls no on_train_end
                close_all(callbacks)
        self.step = step = steps.step
        if ctrl_c.requested and step < self.total_steps:
            raise TrainingInterrupted(step, self.total_steps, self.out_dir)
        done = step >= self.total_steps
        metrics = log.figures(
            self._run_config(), step=step, complete=done,
            resumed_from=self.resumed_from, batch_size=r.batch_size,
            num_examples=self.train.num_examples,
            wall=steps.wall if end > start else 0.0)
        if done:
            if self.eval is not None:
                # With EMA: the trained weights were evaluated before (final).
                tag = "ema" if self.ema else None
                metrics["eval" if tag is None else "eval_ema"] = (
                    self._evaluate_and_log(log, step, tag))
                if final.result is not None:
                    metrics["eval"] = final.result
            self._say(log.finish(self.trained_model(), metrics, ema=self.ema))
        return TrainResult(self.trained_model(), metrics, self.out_dir)

    def _evaluate_and_log(self, log, step, tag=None):
        result = self.evaluate(self.eval)
        log.evaluated(step, result, tag)
        return result

    def evaluate(self, data, batch_size=None):
        """Accuracy and loss of the model (as it is now) on ``data``."""
        from keras_vit.train import evaluation

        source = load_data(data, split="test", verbose=self.verbose)
        return evaluation.evaluate(
            self.model, source, batch_size=batch_size or min(
                self.micro * self.placement.replicas, 256),
            strategy=self.placement.evaluation_strategy(),
            eval_crop=self.recipe.eval_crop,
            verbose=self.verbose and self.is_chief)


def _build_and_compile(t, model, *, weights, model_options, remat, named,
                       overrides):
    """Builds ``t``'s (a :class:`Trainer`) model in its placement under its
    dtype policy, fits the recipe to it, and compiles it."""
    r = t.recipe
    with t.placement.scope():
        built = build_model(
            model, num_classes=t.train.num_classes, weights=weights,
            model_options=model_options, dtype=t.precision,
            label_names=(t.train.class_names if t.names_classes else None),
            **settings.model_settings(model, r, overrides))
        from keras_vit.models.common import set_remat

        set_remat(built, remat)
        t.image_size = model_image_size(built)
        t.recipe = r = settings.fit_to_model(
            r, built, image_size=t.image_size, name=named,
            overrides=overrides)
    built = t.placement.place(built)
    with t.placement.scope(), dtype_policy(t.precision):
        t.model = t.prepare_model(built)
        t.optimizer = recipes_lib.compile_model(
            t.model, r, t.total_steps, accumulation_steps=t.accum,
            jit_compile=t.jit_compile, objective=t.objective())
        t.optimizer.build(t.model.trainable_variables)


def _callbacks(trainer, log, start, end):
    """The callbacks of one ``Trainer.fit()`` from step ``start`` to
    ``end``: ``(all of them, the Ctrl-C one, the log, the end of fit)``."""
    from keras_vit.train.callbacks import (EveryNSteps, SeedEachBatch,
                                           StepLog, StopOnCtrlC,
                                           TrainedWeights)

    r = trainer.recipe
    counts = dict(start_step=start, accumulation_steps=trainer.accum)
    trainer.checkpoints.begin(start)
    # Ctrl-C stops after the step under way (one process with a run
    # directory; several workers would have to agree on the step).
    ctrl_c = StopOnCtrlC(enabled=trainer.out_dir is not None
                         and trainer.info["workers"] == 1, **counts)
    steps = StepLog(
        total_steps=trainer.total_steps, every=r.log_every,
        schedule=recipes_lib.learning_rate_schedule(r, trainer.total_steps),
        write=log.write_row,
        epoch_of=lambda step: step // trainer.steps_per_epoch,
        show=trainer.verbose and trainer.is_chief,
        hint=f"learning_rate={r.learning_rate}", **counts)
    # Keras puts the EMA into the weights at the end of every fit.
    final = TrainedWeights(
        total_steps=trainer.total_steps, enabled=trainer.ema,
        on_complete=(None if trainer.eval is None else
                     lambda step: trainer._evaluate_and_log(log, step)),
        **counts)
    # The checkpoint after Ctrl-C's: a stop is saved at its own step.
    callbacks = [SeedEachBatch(r.seed, **counts), steps, ctrl_c]
    if trainer.out_dir is not None:
        callbacks.append(trainer.checkpoints)
    callbacks.append(final)
    if r.eval_every and trainer.eval is not None:
        callbacks.append(EveryNSteps(
            lambda step: trainer._evaluate_and_log(log, step),
            every=r.eval_every, end_step=end, **counts))
    return callbacks, ctrl_c, steps, final


def fine_tune(model, train_data, eval_data=None, *, recipe="finetune",
              **kwargs):
    """Fine-tunes ``model`` with the paper's recipe and returns a
    :class:`TrainResult`; see :class:`Trainer` for the arguments::

        run = keras_vit.train.fine_tune("ViT-B/16", "tfds:oxford_iiit_pet",
                                        recipe="finetune-pets-flowers",
                                        out_dir="runs/pets")
    """
    return Trainer(model, train_data, eval_data, recipe=recipe,
                   **kwargs).fit()


def pretrain(model, train_data, eval_data=None, *, recipe="pretrain",
             **kwargs):
    """Trains ``model`` (usually ``weights=None``) with the paper's
    pre-training recipe (Table 3); see :class:`Trainer`."""
    kwargs.setdefault("weights", None)
    return Trainer(model, train_data, eval_data, recipe=recipe,
                   **kwargs).fit()
