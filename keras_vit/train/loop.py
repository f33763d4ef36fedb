"""The training loop: one Trainer for the TensorFlow, JAX and torch backends.

:class:`Trainer` holds what every backend shares: the recipe and its
schedule, gradient accumulation over micro-batches, clipping of the summed
gradient, an EMA of the weights, the data position and exact resume. The
rooms around it hold the rest: the settings, fitted and checked
(:mod:`~keras_vit.train.settings`), the run directory
(:mod:`~keras_vit.train.run_dir`), the progress bar, history and logs
(:mod:`~keras_vit.train.progress`), the classifier's loss and its
evaluation (:mod:`~keras_vit.train.evaluation`). An engine per backend
(:func:`make_engine`) holds where variables live, the compiled step and
checkpoints: ``tf.distribute`` under TensorFlow
(:mod:`keras_vit.train.engine_tf`), a ``jax.jit`` step (one device,
``keras.distribution.DataParallel`` or ``ModelParallel``) or an eager
torch step (:mod:`keras_vit.train.engine_keras`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from keras_vit.train.data.load import load_data
from keras_vit.train import recipes as recipes_lib
from keras_vit.train import run_dir, settings
from keras_vit.train.build import build_model, dtype_policy, make_engine
from keras_vit.train.evaluation import classification_terms, model_image_size
from keras_vit.train.interrupt import StopOnInterrupt, TrainingInterrupted
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
    """Fine-tunes or trains a model with a recipe, on any Keras backend.

    One loop for every backend: the recipe's schedule, gradient
    accumulation, clipping, an EMA of the weights, exact resume, logs. An
    engine per backend (:func:`make_engine`) holds the step, the variables
    and the checkpoints (``tf.train`` files, or one ``.npz`` per step under
    jax and torch); a run resumes under the backend that started it.

    Args:
        model: a zoo name (``"ViT-B/16"``), a ``.keras`` path, a
            ``keras.Model`` or a function returning one. Built by the
            library under the engine's scope and dtype policy.
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
        remat: True rematerialises every block of the model in training
            (:func:`keras_vit.models.common.set_remat`: the same gradients,
            each block keeping only its input for the backward pass, for
            about one more forward pass a step); False turns it off; None
            keeps the model's own setting.
        tpu: TPU name or address for the ``tpu`` strategy.
        model_parallel: JAX only: split the big weights over this many
            devices (``keras.distribution.ModelParallel``, layouts from
            :func:`~keras_vit.train.layout_map`); leave ``strategy="auto"``.
        verbose: print the set-up, a progress bar and the result.
        **overrides: recipe fields (``total_steps=``, ``batch_size=``, ...).

    Subclasses change the objective with two hooks, :meth:`prepare_model`
    and :meth:`compute_loss` (written with ``keras.ops``, they serve every
    backend; :mod:`keras_vit.train.mpp` does this).

    Example (a few steps on the built-in digits):

    >>> import keras_vit, keras_vit.train as kt
    >>> tiny = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
    >>> run = kt.Trainer(tiny, "digits", recipe="pretrain", total_steps=3,
    ...                  warmup_steps=1, batch_size=16, strategy="default",
    ...                  verbose=False).fit()
    >>> run.metrics["final_step"], 0 < run.metrics["train_loss"] < 5
    (3, True)
    """

    #: Whether the model's head is named after the data's classes
    #: (``class_names``, e.g. a folder's sub-folders): a classifier's is,
    #: the head of a self-supervised objective is not.
    names_classes = True

    def __init__(self, model, train_data, eval_data=None, *,
                 recipe="finetune", out_dir=None, strategy="auto",
                 weights="auto", resume=True, model_options=None, tpu=None,
                 model_parallel=None, remat=None, verbose=True,
                 **overrides):
        import keras

        self.recipe = recipes_lib.get(recipe, **overrides)
        self.verbose = verbose
        self.engine = make_engine(strategy, tpu=tpu,
                                  model_parallel=model_parallel)
        self.strategy, self.info = self.engine.strategy, self.engine.info
        self.is_chief = self.info["is_chief"]
        self.out_dir = None if out_dir is None else os.path.abspath(
            os.fspath(out_dir))
        if self.out_dir is not None and self.is_chief:
            # Before the data and the model: a second run is refused at once.
            self._release_run_dir = run_dir.lock_run_dir(self, self.out_dir)
        self.train = load_data(train_data, verbose=verbose)
        self.eval = (None if eval_data is None
                     else load_data(eval_data, split="test",
                                    verbose=verbose))
        named = recipe if isinstance(recipe, str) else None
        plan = settings.plan(
            self.recipe, self.train, self.eval, replicas=self.engine.replicas,
            strategy_name=self.info["name"], named=named is not None,
            overrides=overrides)
        self.recipe = r = plan.recipe
        self.per_replica, self.micro, self.accum = (
            plan.per_replica, plan.micro, plan.accum)
        self.steps_per_epoch = plan.steps_per_epoch
        self.total_steps = plan.total_steps
        self.precision = self.engine.precision(r.precision)
        self.jit_compile = self.engine.uses_xla(r.jit_compile,
                                                self.precision)

        keras.utils.set_random_seed(r.seed)
        with self.engine.scope(), dtype_policy(self.precision):
            self.model = build_model(
                model, num_classes=self.train.num_classes, weights=weights,
                model_options=model_options,
                label_names=(self.train.class_names if self.names_classes
                             else None),
                **settings.model_settings(model, r, overrides))
            # Rematerialised blocks: the same numbers, several times less
            # activation memory for about one more forward pass a step.
            from keras_vit.models.common import set_remat

            set_remat(self.model, remat)
            self.image_size = model_image_size(self.model)
            self.recipe = r = settings.fit_to_model(
                r, self.model, image_size=self.image_size, name=named,
                overrides=overrides)
            self.model = self.prepare_model(self.model)
            self.optimizer = recipes_lib.make_optimizer(r, self.total_steps)
            self.optimizer.build(self.model.trainable_variables)
            self.engine.setup(self)
        self.ema = self.engine.ema
        self.model_name = settings.model_name(model, self.model)
        self.resumed_from = None if self.out_dir is None else (
            run_dir.open_run(self.out_dir, self.engine, self._run_config(),
                             resume=resume, chief=self.is_chief,
                             say=self._say))

    # The TensorFlow engine's data position and checkpoint objects (kept as
    # the Trainer's own attributes for code written against them).
    epoch_var = property(lambda self: self.engine.epoch_var)
    batch_var = property(lambda self: self.engine.batch_var)
    checkpoint = property(lambda self: self.engine.checkpoint)
    manager = property(lambda self: self.engine.manager)

    # ------------------------------------------------------------------
    # the objective: hooks a subclass overrides (keras_vit.train.mpp does)

    def prepare_model(self, model):
        """The model :func:`build_model` made -> the model to train. Runs
        in the engine's scope under the run's dtype policy. Here: checks
        that a classifier has one output per class of the data."""
        settings.check_head(model, self.train.num_classes)
        return model

    def compute_loss(self, images, labels, seed):
        """The loss of one (micro-)batch on one replica, summed over its
        images (the loop divides by the global batch), and how many of its
        images were right (summed the same way), both float32 scalars.
        Runs inside the compiled step of every backend, so it is written
        with ``keras.ops``; ``seed`` is a stateless random seed (shape
        (2,), integers), distinct for every step, replica and micro-batch.
        Here: softmax cross-entropy with the recipe's label smoothing
        (:func:`~keras_vit.train.evaluation.classification_terms`)."""
        return classification_terms(
            self.model(images, training=True), labels,
            self.train.num_classes,
            label_smoothing=self.recipe.label_smoothing)

    # ------------------------------------------------------------------
    # run directory and checkpoints

    @property
    def checkpoint_dir(self):
        return run_dir.checkpoint_dir(self.out_dir)

    def _run_config(self):
        return settings.record(self)

    def save_checkpoint(self, epoch, batch_in_epoch):
        """Saves model, optimizer, EMA, step and data position (all
        workers must call it; only the chief's copy is kept)."""
        return self.engine.save(epoch, batch_in_epoch)

    # ------------------------------------------------------------------
    # training

    def _say(self, *args):
        if self.verbose and self.is_chief:
            print(*args, flush=True)

    def describe(self):
        """One paragraph on what the run does."""
        return settings.describe(self)

    def fit(self, stop_at_step=None):
        """Trains to the recipe's last step (from the last checkpoint if
        there is one), evaluates, saves, and returns a :class:`TrainResult`.

        ``stop_at_step`` ends the run early after that step, with a
        checkpoint (a later ``fit()`` continues it).
        """
        r = self.recipe
        step = self.engine.step()
        self._run_log = log = RunLog(
            self.out_dir, chief=self.is_chief, show=self.verbose, step=step,
            total_steps=self.total_steps, recipe=r)
        epoch, in_epoch = self.engine.position
        self._say(f"training {self.describe()}")
        if self.resumed_from is not None:
            self._say(f"resumed from step {self.resumed_from} (epoch "
                      f"{epoch}, batch {in_epoch} of {self.steps_per_epoch}) "
                      f"of {self.engine.latest_checkpoint}")
        end = self.total_steps if stop_at_step is None else min(
            self.total_steps, stop_at_step)
        step, stopped = _run_steps(self, log, step=step, end=end,
                                   epoch=epoch, in_epoch=in_epoch)
        if stopped:
            raise TrainingInterrupted(step, self.total_steps, self.out_dir)
        done = step >= self.total_steps
        metrics = log.figures(
            self._run_config(), step=step, complete=done,
            resumed_from=self.resumed_from, batch_size=r.batch_size,
            num_examples=self.train.num_examples)
        if not done:
            return TrainResult(self.model, metrics, self.out_dir)
        if self.eval is not None:
            metrics["eval"] = self._evaluate_and_log(step, raw=True)
        if self.ema:
            self.engine.load_ema()
            if self.eval is not None:
                metrics["eval_ema"] = self._evaluate_and_log(step, tag="ema")
        self._say(log.finish(self.model, metrics, ema=bool(self.ema)))
        return TrainResult(self.model, metrics, self.out_dir)

    # ------------------------------------------------------------------
    # evaluation

    def ema_weights(self):
        """A context in which the model holds the EMA weights."""
        return self.engine.ema_weights()

    def _evaluate_and_log(self, step, tag=None, raw=False):
        with (self.ema_weights() if tag is None and not raw and self.ema
              else contextlib.nullcontext()):
            result = self.evaluate(self.eval)
        self._run_log.evaluated(step, result, tag)
        return result

    def evaluate(self, data, batch_size=None):
        """Accuracy and loss of the model (as it is now) on ``data``."""
        source = load_data(data, split="test", verbose=self.verbose)
        return self.engine.evaluate(
            source, batch_size or min(self.micro * self.engine.replicas, 256),
            eval_crop=self.recipe.eval_crop,
            verbose=self.verbose and self.is_chief)


def _run_steps(trainer, log, *, step, end, epoch, in_epoch):
    """Runs ``trainer``'s optimizer steps from ``step`` to ``end``, from the
    data position (``epoch``, ``in_epoch``) on: the log, checkpoints and
    evaluations at the recipe's cadence, and a checkpoint of the last step.
    Returns the step reached and whether Ctrl-C stopped the run."""
    engine, r = trainer.engine, trainer.recipe
    last_saved = step if trainer.resumed_from is not None else None
    # Ctrl-C stops after the step under way, which is then saved (one
    # process with a run directory; several workers would have to agree on
    # the step, so they stop as before).
    stop = StopOnInterrupt(enabled=trainer.out_dir is not None
                           and trainer.info["workers"] == 1)
    with stop:
        try:
            while step < end and not stop.requested:
                if in_epoch >= trainer.steps_per_epoch:
                    epoch, in_epoch = epoch + 1, 0
                iterator = iter(engine.batches(epoch, in_epoch))
                while (in_epoch < trainer.steps_per_epoch and step < end
                       and not stop.requested):
                    outputs = engine.train_step(iterator, step)
                    step += 1
                    in_epoch += 1
                    log.step_done(step, epoch, outputs, log=(
                        step % r.log_every == 0 or step == end))
                    if step % r.checkpoint_every == 0 and step < end:
                        trainer.save_checkpoint(epoch, in_epoch)
                        last_saved = step
                    if (r.eval_every and trainer.eval is not None
                            and step % r.eval_every == 0 and step < end
                            and not stop.requested):
                        trainer._evaluate_and_log(step)
        finally:
            log.close_bar()
        if last_saved != step:
            trainer.save_checkpoint(epoch, in_epoch)
        engine.sync()
    return step, stop.requested


def fine_tune(model, train_data, eval_data=None, *, recipe="finetune",
              **kwargs):
    """Fine-tunes ``model`` with the paper's recipe (Table 4 / B.1.1) and
    returns a :class:`TrainResult`; see :class:`Trainer` for the arguments.

    A zoo name gets a zero-initialised head for the data's classes and
    position embeddings resized to the recipe's resolution (384)::

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
