"""Running VTAB-1k: every task fine-tuned with the one recipe and scored
(:func:`run`), resumable task by task, and the scores summarised per group
(:func:`summarize`, :func:`markdown`)."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np

from keras_vit.base import atomic
from keras_vit.base.checks import check_int
from keras_vit.train import distribute, loop
from keras_vit.train import recipes as recipes_lib
from keras_vit.train.vtab.data import load_tasks
from keras_vit.train.vtab.tasks import (
    CROP_AREA, GROUPS, TASKS, TRAIN_EXAMPLES, VAL_EXAMPLES, resolve_tasks,
    tasks_in)


def _fresh_model(model):
    """A function giving each task its own copy of a ``keras.Model``."""
    import keras

    if not isinstance(model, keras.Model):
        return model

    def copy():
        from keras_vit.zoo import rebuild

        return rebuild(model)

    return copy


def _task_overrides(task, overrides):
    fields = dict(overrides)
    if task.augment:
        fields.setdefault("crop_area", CROP_AREA)
    else:
        fields.update(crop_area=None, flip=False)
    return fields


def summarize(results, *, total_tasks=len(TASKS)):  # noqa: B008 - a constant
    """Group means and the mean over tasks from ``{task: {"accuracy": ...}}``.

    >>> s = summarize({"dtd": {"accuracy": 0.5}, "svhn": {"accuracy": 0.7},
    ...                "dmlab": {"accuracy": 0.4}})
    >>> round(s["groups"]["Natural"]["mean"], 4), s["groups"]["Structured"]
    (0.6, {'mean': 0.4, 'tasks': ['dmlab'], 'complete': False})
    >>> round(s["mean"], 4), s["complete"], "Specialized" in s["groups"]
    (0.5333, False, False)
    """
    groups = {}
    for group in GROUPS:
        done = [n for n in tasks_in(group) if n in results]
        if done:
            groups[group] = {
                "mean": float(np.mean([results[n]["accuracy"]
                                       for n in done])),
                "tasks": done,
                "complete": len(done) == len(tasks_in(group))}
    accs = [r["accuracy"] for r in results.values()]
    return {"groups": groups, "mean": float(np.mean(accs)) if accs else None,
            "complete": len(results) == total_tasks}


def markdown(scores):
    """The scores as a markdown table (per task, per group, mean)."""
    rows = ["| group | task | top-1 (%) | trained on | evaluated on |",
            "|---|---|---:|---:|---:|"]
    for name, r in scores["tasks"].items():
        rows.append(f"| {r['group']} | {TASKS[name].title} | "
                    f"{100 * r['accuracy']:.1f} | {r['num_train']} | "
                    f"{r['num_eval']} |")
    for group, g in scores["groups"].items():
        note = "" if g["complete"] else (
            f" ({len(g['tasks'])} of {len(tasks_in(group))} tasks)")
        rows.append(f"| **{group}** | mean{note} | {100 * g['mean']:.1f} | | |")
    note = "" if scores["complete"] else (
        f" ({len(scores['tasks'])} of {len(TASKS)} tasks)")
    rows.append(f"| **all** | mean{note} | {100 * scores['mean']:.1f} | | |")
    return "\n".join(rows) + "\n"


def run(model, tasks=None, *, out_dir=None, data_dir=None, download=False,
        sweep=False, steps=None, train_examples=TRAIN_EXAMPLES,
        val_examples=VAL_EXAMPLES, test_examples=None, weights="auto",
        strategy="auto", model_options=None, keep_models=False, tpu=None,
        verbose=True, **overrides):
    """Fine-tunes ``model`` on each VTAB-1k task and scores it.

    Args:
        model: a zoo name, a ``.keras`` path or a ``keras.Model`` (each task
            starts from a fresh copy with a new zero-initialised head).
        tasks: task and group names (:func:`resolve_tasks`); None: all 19.
        out_dir: where ``vtab.json`` and ``vtab.md`` (``vtab-sweep.*`` for
            a sweep) and one run directory per task go; None: nothing is
            written. A task whose finished run matches is not run again.
        data_dir, download: where tfds data is prepared; whether to
            download and prepare missing data (needs the network).
        sweep: train on ``train800``, score on ``val200`` (the paper's
            hyper-parameter selection) instead of ``train800val200`` on
            the test part.
        steps: optimizer steps per task (default: the recipe's 2500); the
            warmup is then 10% of them unless ``warmup_steps`` is given.
        train_examples, val_examples, test_examples: the protocol's 800 /
            200 / all; smaller values make quick trial runs.
        weights, strategy, model_options, tpu: as for
            :class:`~keras_vit.train.Trainer`.
        keep_models: keep each task's checkpoints and ``model.keras``
            (they are deleted once its scores are written).
        **overrides: ``finetune`` recipe fields (``batch_size``,
            ``micro_batch_size``, ``image_size``, ``learning_rate``, ...).

    Returns:
        ``{"tasks": {name: {...}}, "groups": {...}, "mean": ..., ...}``,
        also written to ``out_dir``.
    """
    names = resolve_tasks(tasks)
    train_examples = check_int("train_examples", train_examples, low=1)
    val_examples = check_int("val_examples", val_examples, low=1)
    if test_examples is not None:
        test_examples = check_int("test_examples", test_examples, low=1)
    if steps is not None:
        steps = check_int("steps", steps, low=1)
        overrides["total_steps"] = steps
        if "warmup_steps" not in overrides:
            overrides["warmup_steps"] = steps // 10
    recipe = recipes_lib.get("finetune", **overrides)  # checks them early
    sizes = dict(sweep=sweep, train_examples=train_examples,
                 val_examples=val_examples, test_examples=test_examples)
    # Checked before reading data.
    strategy_ = distribute.for_backend(strategy, tpu=tpu)
    sources = load_tasks(names, data_dir=data_dir, download=download,
                         **sizes)
    build = _fresh_model(model)
    model_name = model if isinstance(model, str) else getattr(
        model, "zoo_name", None) or getattr(model, "name", str(model))
    stem = "vtab-sweep" if sweep else "vtab"
    settings = recipe.to_dict()
    for field in ("crop_area", "flip"):  # per task: see "augment"
        settings.pop(field)
    protocol = {
        "mode": "sweep: train800 -> val200" if sweep else
                "final: train800val200 -> test",
        "train_examples": train_examples, "val_examples": val_examples,
        "test_examples": test_examples, "recipe": settings,
        "augment": "random crop and flip where the task allows it "
                   "(Natural, Specialized), resize only (Structured)",
        "source": "Dosovitskiy et al. 2021, section 4.1, Appendix B.1.1, "
                  "Table 9; splits and labels of google-research/"
                  "task_adaptation"}
    results = {}
    for name in names:
        task = TASKS[name]
        train, evaluation = sources[name]
        run_dir = None if out_dir is None else os.path.join(
            out_dir, f"{name}-sweep" if sweep else name)
        expected = {"train_split": train.split, "eval_split": evaluation.split,
                    "total_steps": recipe.total_steps,
                    "learning_rate": recipe.learning_rate}
        done = _read_scores(run_dir)
        if done is not None and all(done.get(k) == v
                                    for k, v in expected.items()):
            results[name] = done
            if verbose:
                print(f"vtab: {name}: already scored in {run_dir} "
                      f"({done['accuracy']:.4f})")
            continue
        if verbose:
            print(f"vtab: {name} ({task.group}): training on {train.split} "
                  f"({train.num_examples}), evaluating on {evaluation.split} "
                  f"({evaluation.num_examples})")
        result = loop.Trainer(
            build, train, evaluation, recipe="finetune", out_dir=run_dir,
            strategy=strategy_, weights=weights, model_options=model_options,
            verbose=verbose, **_task_overrides(task, overrides)).fit()
        metrics = result.metrics
        results[name] = {
            "task": name, "title": task.title, "group": task.group,
            "tfds": task.tfds_name,
            "tfds_version": str(train.builder.info.version),
            "accuracy": float(metrics["eval"]["accuracy"]),
            "loss": float(metrics["eval"]["loss"]),
            "num_classes": train.num_classes,
            "num_train": train.num_examples,
            "num_eval": int(metrics["eval"]["num_examples"]),
            "train_split": train.split, "eval_split": evaluation.split,
            "total_steps": metrics["total_steps"],
            "learning_rate": metrics["recipe"]["learning_rate"],
            "image_size": metrics["image_size"],
            "batch_size": metrics["recipe"]["batch_size"],
            "augment": task.augment,
            "crop_area": metrics["recipe"]["crop_area"],
            "flip": metrics["recipe"]["flip"],
        }
        if run_dir is not None:
            atomic.write_json(os.path.join(run_dir, "vtab_task.json"),
                              results[name])
            if not keep_models:
                shutil.rmtree(os.path.join(run_dir, "checkpoints"),
                              ignore_errors=True)
                path = os.path.join(run_dir, "model.keras")
                if os.path.exists(path):
                    os.remove(path)
        del result
    scores = {"model": model_name, "protocol": protocol,
              "tasks": {n: results[n] for n in names}, **summarize(results)}
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        atomic.write_json(os.path.join(out_dir, f"{stem}.json"), scores)
        atomic.write_text(os.path.join(out_dir, f"{stem}.md"),
                          markdown(scores))
    return scores


def _read_scores(run_dir):
    if run_dir is None:
        return None
    path = os.path.join(run_dir, "vtab_task.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        try:
            scores = json.load(f)
        except json.JSONDecodeError:
            return None
    ok = isinstance(scores.get("accuracy"), float) and math.isfinite(
        scores["accuracy"])
    return scores if ok else None
