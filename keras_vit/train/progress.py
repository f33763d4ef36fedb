"""How a training run reports itself: the history lines and TensorBoard
scalars as it goes, and the figures and last line of the finished run.

:class:`RunLog` serves one ``Trainer.fit()``: it keeps the history in
memory and, on the chief, writes it to the run directory.
"""

from __future__ import annotations

import os

from keras_vit.base.checks import printable
from keras_vit.train import run_dir


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
    per_class = result.get("per_class") or {}
    if not per_class or len(per_class) > limit:
        return ""
    return " (" + ", ".join(
        f"{printable(name)} " + ("-" if row["accuracy"] is None
                                 else f"{row['accuracy']:.4f}")
        for name, row in per_class.items()) + ")"


class RunLog:
    """The history and TensorBoard events of one ``fit()``, and its
    figures.

    Args:
        out_dir: the run directory (its ``history.jsonl`` and ``logs/``),
            or None.
        chief: whether this process writes them.
        step: the step the run starts from.
    """

    def __init__(self, out_dir, *, chief, step):
        self.out_dir, self.chief = out_dir, chief
        self.start_step = step
        self.wall = None
        self.rows = []
        self._writer = None
        if out_dir is not None and chief:
            self._writer = run_dir.summary_writer(
                os.path.join(out_dir, "logs", "train"))

    def write_row(self, row):
        """Keeps a history ``row`` (from
        :class:`~keras_vit.train.callbacks.StepLog`) and, on the chief,
        appends it to ``history.jsonl`` and TensorBoard."""
        self.rows.append(row)
        if self.chief and self.out_dir is not None:
            run_dir.append_jsonl(run_dir.history_path(self.out_dir), row)
        if self._writer is not None:
            run_dir.write_scalars(self._writer, row["step"], {
                key: row[key] for key in ("loss", "accuracy",
                                          "learning_rate") if key in row})

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
                num_examples, wall):
        """The figures (``metrics.json``) of a run that ended at ``step``
        after ``wall`` seconds of training, with its ``settings``."""
        self.wall = wall
        history = self.history()
        last = self.rows[-1] if self.rows else (history[-1] if history
                                                else {})
        return {
            **settings,
            "complete": complete,
            "start_step": self.start_step,
            "resumed_from_step": resumed_from,
            "final_step": step,
            "epochs_seen": round(step * batch_size / num_examples, 3),
            "train_loss": last.get("loss"),
            "train_accuracy": last.get("accuracy"),
            "history": history,
            "wall_time": round(wall, 2),
            "images_per_second": round(
                (step - self.start_step) * batch_size / max(wall, 1e-9), 2),
        }

    def finish(self, model, metrics, *, ema):
        """Saves a complete run's ``model`` and ``metrics`` and returns the
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
