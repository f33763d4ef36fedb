"""How a training run reports itself: the progress bar, the history lines
and TensorBoard scalars as it goes, and the figures of the finished run.

:class:`RunLog` serves one ``Trainer.fit()``: the loop hands it each step's
outputs and each evaluation; it keeps the history in memory (a run without
a run directory still returns it) and, on the chief, writes it to the run
directory (:mod:`~keras_vit.train.run_dir`).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from keras_vit.train import recipes as recipes_lib
from keras_vit.train import run_dir


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


def done_line(step, metrics, wall):
    """The line a finished run prints.

    >>> done_line(3, {"train_loss": 0.5}, 1.25)
    'done: step 3, train loss 0.5000 (1.2s)'
    >>> print(done_line(3, {"train_loss": 0.5, "eval": {
    ...     "accuracy": 0.75, "num_examples": 4, "per_class": {
    ...         "cat": {"accuracy": 1.0}, "dog": {"accuracy": 0.5}}}}, 1.0))
    ... # doctest: +NORMALIZE_WHITESPACE
    done: step 3, train loss 0.5000, eval accuracy 0.7500 on 4 images
    (cat 1.0000, dog 0.5000) (1.0s)
    """
    ev = metrics.get("eval_ema") or metrics.get("eval")
    return (
        f"done: step {step}, train loss {metrics['train_loss']:.4f}"
        + (f", eval accuracy {ev['accuracy']:.4f} on {ev['num_examples']}"
           f" images" + _per_class(ev) if ev else "")
        + f" ({wall:.1f}s)"
        + (f"; wrote {metrics['model_path']}"
           if "model_path" in metrics else ""))


def _per_class(result, limit=10):
    """`` (cat 1.0000, dog 0.5000)``: an evaluation's accuracy per class
    by name, when it has at most ``limit`` classes."""
    from keras_vit.base.checks import printable

    per_class = result.get("per_class") or {}
    if not per_class or len(per_class) > limit:
        return ""
    return " (" + ", ".join(
        f"{printable(name)} " + ("-" if row["accuracy"] is None
                                 else f"{row['accuracy']:.4f}")
        for name, row in per_class.items()) + ")"


class RunLog:
    """The progress bar, history and TensorBoard events of one ``fit()``.

    Args:
        out_dir: the run directory (its ``history.jsonl`` and ``logs/``),
            or None.
        chief: whether this process writes (and shows) them.
        show: whether to show the progress bar.
        step: the step the run starts from (now: the clock starts too);
            ``total_steps``: its last.
        recipe: the run's :class:`~keras_vit.train.recipes.Recipe` (the
            learning rate of each logged step comes from its schedule).
    """

    def __init__(self, out_dir, *, chief, show, step, total_steps, recipe):
        from tqdm.auto import tqdm

        self.out_dir, self.chief = out_dir, chief
        self.start_step, self._started = step, time.perf_counter()
        self.wall = None
        # The optimizer's schedule, remade: asking the optimizer would first
        # copy a JAX step's state.
        self._schedule = recipes_lib.learning_rate_schedule(recipe,
                                                            total_steps)
        self._recipe_rate = recipe.learning_rate
        self.rows = []
        self._pending = []
        self._writer = None
        if out_dir is not None and chief:
            self._writer = run_dir.summary_writer(
                os.path.join(out_dir, "logs", "train"))
        self._bar = tqdm(total=total_steps, initial=step, unit="step",
                         desc="train", disable=not (show and chief),
                         dynamic_ncols=True)

    def step_done(self, step, epoch, outputs, *, log):
        """Takes a step's ``outputs`` (loss, accuracy, gradient norm) and,
        with ``log``, writes the line of the steps since the last one;
        returns that line, or None."""
        self._pending.append(outputs)
        self._bar.update(1)
        if not log:
            return None
        from keras import ops

        values = np.asarray([[float(t) for t in out]
                             for out in self._pending])
        self._pending = []
        loss, acc, norm = (float(v) for v in values.mean(axis=0))
        lr = float(ops.convert_to_numpy(self._schedule(step)))
        row = history_row(step, epoch, loss, acc, norm, lr,
                          recipe_rate=self._recipe_rate)
        self.rows.append(row)
        if self.chief and self.out_dir is not None:
            run_dir.append_jsonl(run_dir.history_path(self.out_dir), row)
        if self._writer is not None:
            run_dir.write_scalars(self._writer, step, {
                key: row[key] for key in ("loss", "accuracy", "grad_norm",
                                          "learning_rate")})
        self._bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}",
                              lr=f"{lr:.3g}", refresh=False)
        return row

    def evaluated(self, step, result, tag=None):
        """Writes an evaluation's accuracy and loss under ``logs/eval``
        (``logs/eval_TAG`` with a ``tag``)."""
        if self.out_dir is None or not self.chief:
            return
        name = "eval" if tag is None else f"eval_{tag}"
        writer = run_dir.summary_writer(
            os.path.join(self.out_dir, "logs", name))
        run_dir.write_scalars(writer, step, {
            "accuracy": result["accuracy"], "loss": result["loss"]})
        writer.close()

    def figures(self, settings, *, step, complete, resumed_from, batch_size,
                num_examples):
        """The figures of a run that ended at ``step`` (``metrics.json``):
        its ``settings`` (``run.json``), where it started and ended, the
        last history line, the whole history and the speed."""
        self.wall = wall = time.perf_counter() - self._started
        start_step = self.start_step
        history = self.history()
        last = self.rows[-1] if self.rows else (history[-1] if history
                                                else {})
        return {
            **settings,
            "complete": complete,
            "start_step": start_step,
            "resumed_from_step": resumed_from,
            "final_step": step,
            "epochs_seen": round(step * batch_size / num_examples, 3),
            "train_loss": last.get("loss"),
            "train_accuracy": last.get("accuracy"),
            "history": history,
            "wall_time": round(wall, 2),
            "images_per_second": round(
                (step - start_step) * batch_size / max(wall, 1e-9), 2),
        }

    def finish(self, model, metrics, *, ema):
        """Saves a complete run's ``model`` and ``metrics`` (see
        :func:`~keras_vit.train.run_dir.save_results`) and returns the
        line to print."""
        if self.out_dir is not None and self.chief:
            run_dir.save_results(self.out_dir, model, metrics, ema=ema)
        if self._writer is not None:
            self._writer.close()
        return done_line(metrics["final_step"], metrics, self.wall)

    def history(self):
        """The whole run's history: the run directory's (an earlier,
        resumed ``fit()`` included), else the lines of this one."""
        rows = None if self.out_dir is None else run_dir.read_history(
            self.out_dir)
        return list(self.rows) if rows is None else rows

    def close_bar(self):
        self._bar.close()
