"""The training loop: one Trainer for the TensorFlow, JAX and torch backends.

:class:`Trainer` holds what every backend shares: the recipe and its
schedule, gradient accumulation over micro-batches, clipping of the summed
gradient, an EMA of the weights, the data position and exact resume, the
run directory (:mod:`~keras_vit.train.run_dir`), logs and the progress bar.
An engine per backend (:func:`make_engine`) holds the rest (where variables
live, the compiled step, checkpoints): ``tf.distribute`` under TensorFlow
(:mod:`keras_vit.train.engine_tf`), a ``jax.jit`` step (one device or
``keras.distribution.DataParallel``) or an eager torch step
(:mod:`keras_vit.train.engine_keras`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import numpy as np

from keras_vit import atomic
from keras_vit.train import data as data_lib
from keras_vit.train import recipes as recipes_lib
from keras_vit.train import run_dir
from keras_vit.train.build import build_model, dtype_policy, make_engine
from keras_vit.train.evaluation import (classifier_of, model_classes,
                                        model_image_size)


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


def split_batch(batch_size, micro_batch_size, replicas, strategy_name):
    """``(per_replica, micro, accumulation_steps)``: ``batch_size`` split
    over the ``replicas`` of the strategy ``strategy_name``, and each
    replica's share into micro-batches of ``micro_batch_size`` (None: one
    micro-batch), or a ValueError naming the setting.

    >>> split_batch(512, 64, 4, "mirrored")
    (128, 64, 2)
    """
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by the "
            f"{replicas} replicas of the {strategy_name} strategy; "
            f"use a multiple of {replicas}")
    per_replica = batch_size // replicas
    micro = micro_batch_size or per_replica
    if per_replica % micro:
        raise ValueError(
            f"micro_batch_size={micro_batch_size} must divide the "
            f"per-replica batch {per_replica} (batch_size="
            f"{batch_size} over {replicas} replicas)")
    return per_replica, micro, per_replica // micro


def history_row(step, epoch, loss, acc, norm, learning_rate, *,
                recipe_rate):
    """The history line of ``step``: the mean ``loss``, accuracy (``acc``)
    and gradient ``norm`` since the last line and the ``learning_rate``
    used; a FloatingPointError (naming the recipe's ``recipe_rate``) when
    the loss is not finite.

    >>> history_row(2, 0, 1.5, 0.625, 2.0, 0.001, recipe_rate=0.003)
    {'step': 2, 'epoch': 0, 'loss': 1.5, 'accuracy': 0.625, \
'grad_norm': 2.0, 'learning_rate': 0.001}
    """
    row = {"step": step, "epoch": epoch, "loss": round(loss, 6),
           "accuracy": round(acc, 6), "grad_norm": round(norm, 6),
           "learning_rate": learning_rate}
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"the training loss is {loss} at step {step}; lower "
            f"learning_rate={recipe_rate} or clip "
            "gradients (grad_clip_norm)")
    return row


def _done_line(step, metrics, wall):
    """The line a finished run prints."""
    ev = metrics.get("eval_ema") or metrics.get("eval")
    return (
        f"done: step {step}, train loss {metrics['train_loss']:.4f}"
        + (f", eval accuracy {ev['accuracy']:.4f} on {ev['num_examples']}"
           f" images" if ev else "")
        + f" ({wall:.1f}s)"
        + (f"; wrote {metrics['model_path']}"
           if "model_path" in metrics else ""))


class Trainer:
    """Fine-tunes or trains a model with a recipe, on any Keras backend.

    One loop for every backend: the recipe and its schedule, gradient
    accumulation over micro-batches, clipping of the summed gradient at
    the recipe's global norm, an EMA of the weights, the data position and
    exact resume, the run directory, logs and progress bar. What differs is
    an engine (:func:`make_engine`): ``tf.distribute`` under TensorFlow
    (``default``, ``mirrored``, ``multi_worker``, ``tpu``; ``tf.train``
    checkpoints); under JAX one jitted step on one device (``"default"``)
    or ``keras.distribution.DataParallel`` over all devices
    (``"data_parallel"``; ``"auto"`` picks it when jax sees several
    devices), or ``keras.distribution.ModelParallel`` with
    ``model_parallel=k`` (each weight split over k devices by
    :func:`~keras_vit.train.layout_map`, the batch over the rest); under
    torch an eager step on one device. The jax and torch
    engines checkpoint into one ``.npz`` per step
    (:mod:`~keras_vit.train.checkpoints`); a run resumes under the backend
    that started it.

    Args:
        model: a zoo name (``"ViT-B/16"``), a ``.keras`` path, a
            ``keras.Model`` or a function returning one. Built by the
            library under the engine's scope and dtype policy.
        train_data: an :class:`~keras_vit.train.data.ImageSource` or a spec
            for :func:`~keras_vit.train.load_data` (``"digits"``,
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
        tpu: TPU name or address for the ``tpu`` strategy.
        model_parallel: JAX only: split the big weights over this many
            devices (``keras.distribution.ModelParallel`` on a
            ``(devices / k, k)`` mesh, Megatron-style layouts from
            :func:`~keras_vit.train.layout_map`; the batch is split over
            the ``devices / k`` replicas). Leave ``strategy="auto"``.
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

    def __init__(self, model, train_data, eval_data=None, *,
                 recipe="finetune", out_dir=None, strategy="auto",
                 weights="auto", resume=True, model_options=None, tpu=None,
                 model_parallel=None, verbose=True, **overrides):
        import keras

        self.recipe = recipes_lib.get(recipe, **overrides)
        self.verbose = verbose
        self.engine = make_engine(strategy, tpu=tpu,
                                  model_parallel=model_parallel)
        self.strategy = self.engine.strategy
        self.info = self.engine.info
        self.is_chief = self.info["is_chief"]
        if out_dir is not None and self.is_chief:
            # Before the data and the model: a second run is refused at once.
            self._release_run_dir = run_dir.lock_run_dir(self,
                                                         out_dir)
        self.train = data_lib.load_data(train_data, verbose=verbose)
        self.eval = (None if eval_data is None
                     else data_lib.load_data(eval_data, split="test",
                                             verbose=verbose))
        if self.eval is not None and (
                self.eval.num_classes != self.train.num_classes):
            raise ValueError(
                f"eval_data has {self.eval.num_classes} classes but "
                f"train_data has {self.train.num_classes}; received "
                f"eval_data={self.eval.name!r}")
        r = self.recipe
        self.per_replica, self.micro, self.accum = split_batch(
            r.batch_size, r.micro_batch_size, self.engine.replicas,
            self.info["name"])
        self.steps_per_epoch = data_lib.steps_per_epoch(self.train,
                                                        r.batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"batch_size={r.batch_size} is larger than the training data "
                f"({self.train.num_examples} images in "
                f"{self.train.name!r}); use a smaller batch_size")
        self.total_steps = r.steps_for(self.train.num_examples)
        if isinstance(recipe, str) and "warmup_steps" not in overrides:
            # The named recipe's warmup, scaled to fit a short run.
            r = self.recipe = r.replace(warmup_steps=recipes_lib.fit_warmup(
                r, self.total_steps))
        if r.warmup_steps >= self.total_steps:
            raise ValueError(
                f"warmup_steps={r.warmup_steps} (--warmup-steps) must be "
                f"smaller than the run's total_steps={self.total_steps} "
                "(--steps, or --epochs times the steps per epoch)")
        self.precision = self.engine.precision(r.precision)
        self.jit_compile = self.engine.uses_xla(r.jit_compile,
                                                self.precision)

        # The resolution and dropout: the recipe's for a zoo name; a given
        # model keeps its own unless they were asked for explicitly.
        given = not isinstance(model, str) or model.endswith(".keras")
        keras.utils.set_random_seed(r.seed)
        with self.engine.scope(), dtype_policy(self.precision):
            self.model = build_model(
                model, num_classes=self.train.num_classes,
                image_size=(r.image_size if ("image_size" in overrides
                                             or not given) else None),
                weights=weights,
                dropout_rate=(r.dropout_rate if ("dropout_rate" in overrides
                                                 or not given) else None),
                model_options=model_options)
            self.image_size = model_image_size(self.model)
            head = classifier_of(self.model)
            if (head and isinstance(recipe, str)
                    and "learning_rate" not in overrides):
                # The named recipe's rate for this head (Appendix D.3: GAP
                # needs a lower one); an explicit learning_rate wins.
                r = r.replace(learning_rate=recipes_lib.head_learning_rate(
                    recipe, head))
            self.recipe = r = r.replace(
                image_size=self.image_size,
                dropout_rate=float(getattr(self.model, "dropout_rate",
                                           r.dropout_rate)))
            self.model = self.prepare_model(self.model)
            self.optimizer = recipes_lib.make_optimizer(r, self.total_steps)
            # The optimizer's own schedule, read at a step for the logs
            # (asking the optimizer would first copy a JAX step's state).
            self._schedule = recipes_lib.learning_rate_schedule(
                r, self.total_steps)
            self.optimizer.build(self.model.trainable_variables)
            self.engine.setup(self)
        self.ema = self.engine.ema
        self.model_name = (model if isinstance(model, str)
                           else getattr(self.model, "zoo_name", None)
                           or self.model.name)

        self.out_dir = None if out_dir is None else os.path.abspath(
            os.fspath(out_dir))
        self.resumed_from = None
        if self.out_dir is not None:
            self._open_run_dir(resume)

    # The TensorFlow engine's data position and checkpoint objects (kept as
    # the Trainer's own attributes for code written against them).
    epoch_var = property(lambda self: self.engine.epoch_var)
    batch_var = property(lambda self: self.engine.batch_var)
    checkpoint = property(lambda self: self.engine.checkpoint)
    manager = property(lambda self: self.engine.manager)

    # ------------------------------------------------------------------
    # the objective: two hooks a subclass overrides to train something
    # other than a classifier (keras_vit.train.mpp does)

    def prepare_model(self, model):
        """The model :func:`build_model` made -> the model to train. Runs
        in the engine's scope under the run's dtype policy. Here: checks
        that a classifier has one output per class of the data."""
        if model_classes(model) != self.train.num_classes:
            raise ValueError(
                f"model={model.name!r} has {model_classes(model)} outputs "
                f"but the data has {self.train.num_classes} classes; pass a "
                "zoo name or a VisionTransformer (they get a new "
                "zero-initialised head of the right size)")
        return model

    def compute_loss(self, images, labels, seed):
        """The loss of one (micro-)batch on one replica, summed over its
        images (the loop divides by the global batch), and how many of its
        images were right (summed the same way), both float32 scalars.
        Runs inside the compiled step of every backend, so it is written
        with ``keras.ops``; ``seed`` is a stateless random seed (shape
        (2,), integers), distinct for every step, replica and micro-batch.
        Here: softmax cross-entropy with the recipe's label smoothing."""
        from keras import ops

        r, num_classes = self.recipe, self.train.num_classes
        logits = ops.cast(self.model(images, training=True), "float32")
        labels = ops.cast(labels, "int32")
        target = ops.one_hot(labels, num_classes)
        if r.label_smoothing:
            target = (target * (1.0 - r.label_smoothing)
                      + r.label_smoothing / num_classes)
        per_example = -ops.sum(target * ops.log_softmax(logits, axis=-1),
                               axis=-1)
        correct = ops.sum(ops.cast(
            ops.equal(ops.cast(ops.argmax(logits, axis=-1), "int32"),
                      labels), "float32"))
        return ops.sum(per_example), correct

    # ------------------------------------------------------------------
    # run directory and checkpoints

    @property
    def checkpoint_dir(self):
        return run_dir.checkpoint_dir(self.out_dir)

    def _open_run_dir(self, resume):
        if self.is_chief:
            run_dir.prepare(self.out_dir, resume)
        # Recorded in every checkpoint: a resumed run is checked against
        # the checkpoint's own record, which no side file can change.
        self.engine.run_settings = json.dumps(
            atomic.to_json(self._run_config()), sort_keys=True)
        self.resumed_from = self.engine.open_checkpoints(
            self.out_dir, self.checkpoint_dir, resume)
        if self.resumed_from is not None:
            run_dir.check_resume(
                self.out_dir, self._run_config(),
                recorded=self.engine.recorded_settings,
                resumed_from=self.resumed_from, resume=resume, say=self._say)
            if self.is_chief:
                run_dir.truncate_history(self.out_dir, self.resumed_from)
        if self.is_chief:
            atomic.write_json(os.path.join(self.out_dir, "run.json"),
                              self._run_config())

    def _run_config(self):
        return {
            "model": self.model_name,
            "train_data": self.train.name,
            "eval_data": None if self.eval is None else self.eval.name,
            "num_classes": self.train.num_classes,
            "image_size": self.image_size,
            "recipe": self.recipe.to_dict(),
            "total_steps": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "strategy": self.info,
            "backend": self.engine.backend,
            "precision": self.precision,
            "jit_compile": self.jit_compile,
            "micro_batch_size": self.micro,
            "accumulation_steps": self.accum,
        }

    def _read_history(self):
        rows = None if self.out_dir is None else run_dir.read_history(
            self.out_dir)
        return list(self._memory_history) if rows is None else rows

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
        r = self.recipe
        accum = (f", {self.accum} accumulation steps of {self.micro}"
                 if self.accum > 1 else "")
        backend = ("" if self.engine.backend == "tensorflow"
                   else f" on {self.engine.backend}")
        return (
            f"{self.model_name} ({self.model.count_params():,} parameters) "
            f"at {self.image_size}x{self.image_size} on {self.train.name} "
            f"({self.train.num_examples} images, {self.train.num_classes} "
            f"classes): recipe {r.name}, {r.optimizer} lr {r.learning_rate:g} "
            f"{r.schedule} (warmup {r.warmup_steps}), {self.total_steps} "
            f"steps of {r.batch_size} images ({self.steps_per_epoch} per "
            f"epoch; {self.engine.replicas} replica(s) x "
            f"{self.per_replica}{accum}), strategy {self.info['name']}"
            f"{backend}, {self.precision}"
            f"{', XLA' if self.jit_compile else ''}")

    def fit(self, stop_at_step=None):
        """Trains to the recipe's last step (from the last checkpoint if
        there is one), evaluates, saves, and returns a :class:`TrainResult`.

        ``stop_at_step`` ends the run early after that step, with a
        checkpoint (a later ``fit()`` continues it).
        """
        from tqdm.auto import tqdm

        r = self.recipe
        t_start = time.perf_counter()
        self._memory_history = []
        step = self.engine.step()
        epoch, in_epoch = self.engine.position
        start_step = step
        self._say(f"training {self.describe()}")
        if self.resumed_from is not None:
            self._say(f"resumed from step {self.resumed_from} (epoch "
                      f"{epoch}, batch {in_epoch} of {self.steps_per_epoch}) "
                      f"of {self.engine.latest_checkpoint}")
        writer = None
        if self.out_dir is not None and self.is_chief:
            writer = run_dir.summary_writer(
                os.path.join(self.out_dir, "logs", "train"))
        end = self.total_steps if stop_at_step is None else min(
            self.total_steps, stop_at_step)
        bar = tqdm(total=self.total_steps, initial=step, unit="step",
                   desc="train", disable=not (self.verbose and self.is_chief),
                   dynamic_ncols=True)
        pending = []
        last_saved = step if self.resumed_from is not None else None
        last = {}
        try:
            while step < end:
                if in_epoch >= self.steps_per_epoch:
                    epoch, in_epoch = epoch + 1, 0
                iterator = iter(self.engine.batches(epoch, in_epoch))
                while in_epoch < self.steps_per_epoch and step < end:
                    pending.append(self.engine.train_step(iterator, step))
                    step += 1
                    in_epoch += 1
                    bar.update(1)
                    if step % r.log_every == 0 or step == end:
                        last = self._log(step, epoch, pending, writer, bar)
                        pending = []
                    if step % r.checkpoint_every == 0 and step < end:
                        self.save_checkpoint(epoch, in_epoch)
                        last_saved = step
                    if (r.eval_every and self.eval is not None
                            and step % r.eval_every == 0 and step < end):
                        self._evaluate_and_log(step)
        finally:
            bar.close()
        if last_saved != step:
            self.save_checkpoint(epoch, in_epoch)
        self.engine.sync()
        wall = time.perf_counter() - t_start
        done = step >= self.total_steps
        history = self._read_history()
        if not last and history:  # nothing trained here: resumed at the end
            last = history[-1]
        metrics = {
            **self._run_config(),
            "complete": done,
            "start_step": start_step,
            "resumed_from_step": self.resumed_from,
            "final_step": step,
            "epochs_seen": round(step * r.batch_size
                                 / self.train.num_examples, 3),
            "train_loss": last.get("loss"),
            "train_accuracy": last.get("accuracy"),
            "history": history,
            "wall_time": round(wall, 2),
            "images_per_second": round(
                (step - start_step) * r.batch_size / max(wall, 1e-9), 2),
        }
        if not done:
            return TrainResult(self.model, metrics, self.out_dir)
        if self.eval is not None:
            metrics["eval"] = self._evaluate_and_log(step, raw=True)
        if self.ema:
            self.engine.load_ema()
            if self.eval is not None:
                metrics["eval_ema"] = self._evaluate_and_log(step, tag="ema")
        if self.out_dir is not None and self.is_chief:
            run_dir.save_results(self.out_dir, self.model, metrics,
                                 ema=bool(self.ema))
        if writer is not None:
            writer.close()
        self._say(_done_line(step, metrics, wall))
        return TrainResult(self.model, metrics, self.out_dir)

    def _log(self, step, epoch, pending, writer, bar):
        from keras import ops

        values = np.asarray([[float(t) for t in out] for out in pending])
        loss, acc, norm = (float(v) for v in values.mean(axis=0))
        lr = float(ops.convert_to_numpy(self._schedule(step)))
        row = history_row(step, epoch, loss, acc, norm, lr,
                          recipe_rate=self.recipe.learning_rate)
        self._memory_history.append(row)
        if self.is_chief and self.out_dir is not None:
            run_dir.append_jsonl(run_dir.history_path(self.out_dir), row)
        if writer is not None:
            run_dir.write_scalars(writer, step, {
                key: row[key] for key in ("loss", "accuracy", "grad_norm",
                                          "learning_rate")})
        bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}",
                        lr=f"{lr:.3g}", refresh=False)
        return row

    # ------------------------------------------------------------------
    # evaluation

    def ema_weights(self):
        """A context in which the model holds the EMA weights."""
        return self.engine.ema_weights()

    def _evaluate_and_log(self, step, tag=None, raw=False):
        if tag is None and not raw and self.ema:
            with self.ema_weights():
                result = self.evaluate(self.eval)
        else:
            result = self.evaluate(self.eval)
        if self.out_dir is not None and self.is_chief:
            name = "eval" if tag is None else f"eval_{tag}"
            writer = run_dir.summary_writer(
                os.path.join(self.out_dir, "logs", name))
            run_dir.write_scalars(writer, step, {
                "accuracy": result["accuracy"], "loss": result["loss"]})
            writer.close()
        return result

    def evaluate(self, data, batch_size=None):
        """Accuracy and loss of the model (as it is now) on ``data``."""
        source = data_lib.load_data(data, split="test", verbose=self.verbose)
        return self.engine.evaluate(
            source, batch_size or min(self.micro * self.engine.replicas, 256),
            eval_crop=self.recipe.eval_crop,
            verbose=self.verbose and self.is_chief)


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
