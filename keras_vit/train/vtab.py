"""VTAB-1k: the 19 transfer tasks of the paper's Table 9 with its protocol.

The Visual Task Adaptation Benchmark (Zhai et al. 2019) in its 1000-example
form, as the paper runs it (section 4.1, Appendix B.1.1, Table 9):

- every task trains on 1000 examples: the first 800 of the task's training
  part and the first 200 of its validation part (``train800val200``), and
  is scored (top-1) on the task's whole test part;
- the hyper-parameter sweep trains on the 800 (``train800``) and scores on
  the 200 (``val200``): ``sweep=True`` / ``--sweep``;
- one setting for all tasks: the ``finetune`` recipe, i.e. SGD momentum
  0.9, lr 0.01, 2500 steps, batch 512, cosine decay, clipping at norm 1,
  resolution 384, zero-initialised head;
- pre-processing of Kolesnikov et al. (2020) (BiT) at one resolution: a
  random crop and a horizontal flip for training, except where they would
  change the label (the Structured tasks: counts, positions, distances and
  angles); a plain resize for evaluation;
- scores per group (Natural, Specialized, Structured) and their mean.

The tasks are read with tensorflow-datasets under the names, splits and
derived labels of google-research/task_adaptation (the VTAB code), written
here from its definitions: e.g. CLEVR count is the number of objects minus
3, KITTI distance buckets the depth of the closest vehicle. Nothing is
downloaded unless asked: missing data fails at once, before any training,
with the ``tfds build`` command (and manual-download steps) it needs.

>>> from keras_vit.train import vtab
>>> len(vtab.TASKS), [len(vtab.tasks_in(g)) for g in vtab.GROUPS]
(19, [7, 4, 8])
>>> t = vtab.TASKS["clevr_count"]
>>> t.tfds_name, t.num_classes, t.group
('clevr', 8, 'Structured')
>>> vtab.split_instructions("caltech101", {"train": 3060, "test": 6084})
{'train': 'train[0:800]+train[2754:2954]', 'eval': 'test'}
>>> vtab.split_instructions("caltech101", {"train": 3060, "test": 6084},
...                         sweep=True)
{'train': 'train[0:800]', 'eval': 'train[2754:2954]'}

Running it (the command ``keras-vit vtab`` does the same)::

    scores = vtab.run("ViT-B/16", tasks=["dtd", "structured"],
                      data_dir="~/tensorflow_datasets", out_dir="runs/vtab")
    print(scores["mean"], scores["groups"]["Structured"]["mean"])
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import shutil

import numpy as np

from keras_vit import atomic
from keras_vit.errors import check_int
from keras_vit.train import data as data_lib
from keras_vit.train import engine as engine_lib
from keras_vit.train import recipes as recipes_lib

GROUPS = ("Natural", "Specialized", "Structured")
# The protocol's sizes: 800 training + 200 validation examples per task.
TRAIN_EXAMPLES = 800
VAL_EXAMPLES = 200
# BiT's training crop: resize to 448, random 384x384 crop, i.e. 73% of the
# area; here as an inception crop of that area (and aspect 3/4..4/3).
CROP_AREA = ((384 / 448) ** 2,) * 2


@dataclasses.dataclass(frozen=True)
class Task:
    """One VTAB-1k task.

    Attributes:
        name: the name used here (``"clevr_count"``).
        title: the column of the paper's Table 9 (``"Clevr-Count"``).
        group: ``"Natural"``, ``"Specialized"`` or ``"Structured"``.
        tfds_name: the tensorflow-datasets name (with config).
        layout: where its train / val / test parts lie in the tfds splits:
            ``("splits", train, val, test)``: three tfds splits;
            ``("head", percent, test)``: the first ``percent`` % of
            ``train`` for training, the rest for validation, ``test`` split;
            ``("thirds", a, b)``: ``train`` cut into a %, b % and the rest;
            ``("test_head", percent)``: ``train``; the first ``percent`` %
            of ``test`` for validation, the rest for testing.
        label: the tfds feature holding the label, or the name of a derived
            label (``"clevr_count"``, ``"clevr_distance"``,
            ``"kitti_distance"``).
        num_classes: None: the label feature's (or ``bins``).
        bins: regroup the label feature's values into this many classes of
            neighbouring values (dSprites).
        pixel_scale: multiplies the decoded pixels (dSprites stores 0/1).
        augment: random crop and flip in training (off where either would
            change the label).
    """

    name: str
    title: str
    group: str
    tfds_name: str
    layout: tuple
    label: str = "label"
    num_classes: int | None = None
    bins: int | None = None
    pixel_scale: float = 1.0
    augment: bool = True


_STANDARD = ("splits", "train", "validation", "test")

TASKS = {t.name: t for t in (
    # Natural
    Task("caltech101", "Caltech101", "Natural", "caltech101",
         ("head", 90, "test")),
    Task("cifar100", "CIFAR-100", "Natural", "cifar100", ("head", 90, "test")),
    Task("dtd", "DTD", "Natural", "dtd", _STANDARD),
    Task("oxford_flowers102", "Flowers102", "Natural", "oxford_flowers102",
         _STANDARD),
    Task("oxford_iiit_pet", "Pets", "Natural", "oxford_iiit_pet",
         ("head", 80, "test")),
    Task("sun397", "Sun397", "Natural", "sun397/tfds", _STANDARD),
    Task("svhn", "SVHN", "Natural", "svhn_cropped", ("head", 90, "test")),
    # Specialized
    Task("patch_camelyon", "Camelyon", "Specialized", "patch_camelyon",
         _STANDARD),
    Task("eurosat", "EuroSAT", "Specialized", "eurosat/rgb",
         ("thirds", 60, 20)),
    Task("resisc45", "Resisc45", "Specialized", "resisc45",
         ("thirds", 60, 20)),
    Task("diabetic_retinopathy", "Retinopathy", "Specialized",
         "diabetic_retinopathy_detection/btgraham-300", _STANDARD),
    # Structured: labels are counts, positions, distances and angles, which
    # a crop or a flip would change.
    Task("clevr_count", "Clevr-Count", "Structured", "clevr",
         ("head", 90, "validation"), label="clevr_count", num_classes=8,
         augment=False),
    Task("clevr_distance", "Clevr-Dist", "Structured", "clevr",
         ("head", 90, "validation"), label="clevr_distance", num_classes=6,
         augment=False),
    Task("dmlab", "DMLab", "Structured", "dmlab", _STANDARD, augment=False),
    Task("dsprites_location", "dSpr-Loc", "Structured", "dsprites",
         ("thirds", 80, 10), label="label_x_position", bins=16,
         pixel_scale=255.0, augment=False),
    Task("dsprites_orientation", "dSpr-Ori", "Structured", "dsprites",
         ("thirds", 80, 10), label="label_orientation", bins=16,
         pixel_scale=255.0, augment=False),
    Task("smallnorb_azimuth", "sNORB-Azim", "Structured", "smallnorb",
         ("test_head", 50), label="label_azimuth", augment=False),
    Task("smallnorb_elevation", "sNORB-Elev", "Structured", "smallnorb",
         ("test_head", 50), label="label_elevation", augment=False),
    Task("kitti_distance", "KITTI-Dist", "Structured", "kitti", _STANDARD,
         label="kitti_distance", num_classes=4, augment=False),
)}


def tasks_in(group):
    """The task names of a group (``"Natural"``, ...), in Table 9 order."""
    return [t.name for t in TASKS.values() if t.group == group]


def resolve_tasks(tasks=None):
    """Task names from names and group names (any case; ``-`` for ``_``);
    None: all 19. Duplicates are dropped, the order kept.

    >>> resolve_tasks(["DTD", "specialized"])
    ['dtd', 'patch_camelyon', 'eurosat', 'resisc45', 'diabetic_retinopathy']
    """
    if tasks is None:
        return list(TASKS)
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    groups = {g.lower(): g for g in GROUPS}
    out = []
    for raw in tasks:
        key = str(raw).strip().lower().replace("-", "_")
        if key in groups:
            names = tasks_in(groups[key])
        elif key in TASKS:
            names = [key]
        else:
            choices = list(TASKS) + list(groups)
            close = difflib.get_close_matches(key, choices, n=3)
            hint = (f" Did you mean {', '.join(map(repr, close))}?"
                    if close else "")
            raise ValueError(
                f"Unknown VTAB task {raw!r} in tasks={list(tasks)!r}.{hint} "
                f"Tasks: {', '.join(TASKS)}; or a group: "
                f"{', '.join(groups)}.")
        out += [n for n in names if n not in out]
    if not out:
        raise ValueError(f"tasks must name at least one task; received "
                         f"tasks={tasks!r}")
    return out


# --------------------------------------------------------------------------
# splits


def _parts(task, sizes):
    """``{"train"|"val"|"test": (tfds split, start, stop)}`` from the sizes
    of the tfds splits (``{"train": 3060, ...}``)."""
    kind, *args = task.layout

    def size(split):
        if split not in sizes:
            raise data_lib.DataError(
                f"tfds dataset {task.tfds_name!r} has no split {split!r} "
                f"(VTAB task {task.name!r}); its splits: {sorted(sizes)}")
        return int(sizes[split])

    if kind == "splits":
        return {part: (split, 0, size(split))
                for part, split in zip(("train", "val", "test"), args)}
    if kind == "head":
        percent, test = args
        n = size("train")
        cut = percent * n // 100
        return {"train": ("train", 0, cut), "val": ("train", cut, n),
                "test": (test, 0, size(test))}
    if kind == "thirds":
        a, b = args
        n = size("train")
        cut1 = a * n // 100
        cut2 = cut1 + b * n // 100
        return {"train": ("train", 0, cut1), "val": ("train", cut1, cut2),
                "test": ("train", cut2, n)}
    if kind == "test_head":
        (percent,) = args
        n = size("test")
        cut = percent * n // 100
        return {"train": ("train", 0, size("train")),
                "val": ("test", 0, cut), "test": ("test", cut, n)}
    raise ValueError(f"unknown layout={task.layout!r} of task {task.name!r}")


def _take(task, part, span, count, argument):
    """The tfds split string for the first ``count`` examples of a part
    (None: all of it)."""
    split, start, stop = span
    available = stop - start
    if count is None:
        count = available
    if count > available:
        raise data_lib.DataError(
            f"VTAB task {task.name!r} has {available} examples in its {part} "
            f"part ({split}[{start}:{stop}] of tfds {task.tfds_name!r}); "
            f"received {argument}={count}")
    if start == 0 and count == available and stop == available:
        return split, count
    return f"{split}[{start}:{start + count}]", count


def split_instructions(task, sizes, *, sweep=False,
                       train_examples=TRAIN_EXAMPLES,
                       val_examples=VAL_EXAMPLES, test_examples=None,
                       _counts=None):
    """The tfds split strings a run of ``task`` trains and evaluates on.

    ``sizes`` are the example counts of the dataset's tfds splits. The final
    run trains on ``train800val200`` and evaluates on the test part;
    ``sweep=True`` trains on ``train800`` and evaluates on ``val200`` (the
    paper's hyper-parameter selection). ``test_examples`` limits the test
    part (None: all of it, as the protocol does).
    """
    task = TASKS[task] if isinstance(task, str) else task
    parts = _parts(task, sizes)
    train, n_train = _take(task, "train", parts["train"], train_examples,
                           "train_examples")
    val, n_val = _take(task, "val", parts["val"], val_examples,
                       "val_examples")
    if sweep:
        out = {"train": train, "eval": val}
        counts = {"train": n_train, "eval": n_val}
    else:
        test, n_test = _take(task, "test", parts["test"], test_examples,
                             "test_examples")
        out = {"train": f"{train}+{val}", "eval": test}
        counts = {"train": n_train + n_val, "eval": n_test}
    if _counts is not None:
        _counts.update(counts)
    return out


# --------------------------------------------------------------------------
# labels derived from other features (task_adaptation's definitions)


def _bucket(value, edges):
    """Index of the last of the increasing ``edges`` below ``value``."""
    import tensorflow as tf

    edges = tf.constant(edges, tf.float32)
    return tf.reduce_sum(tf.cast(edges < value, tf.int64)) - 1


def _clevr_count(example):
    # CLEVR scenes hold 3 to 10 objects: 8 classes.
    import tensorflow as tf

    return tf.cast(tf.shape(example["objects"]["pixel_coords"])[0] - 3,
                   tf.int64)


def _clevr_distance(example):
    # Depth (third pixel coordinate) of the closest object, in 6 bins.
    import tensorflow as tf

    depth = tf.reduce_min(example["objects"]["pixel_coords"][:, 2])
    return _bucket(depth, [0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])


def _kitti_distance(example):
    # Depth (z, metres) of the closest car, van or truck (types 0-2); no
    # vehicle counts as 1000 m: bins near / mid / far / none.
    import tensorflow as tf

    objects = example["objects"]
    vehicle = objects["type"] < 3
    depth = tf.boolean_mask(objects["location"][:, 2], vehicle)
    depth = tf.reduce_min(tf.concat([depth, [1000.0]], axis=0))
    return _bucket(depth, [-100.0, 8.0, 20.0, 999.0])


DERIVED_LABELS = {"clevr_count": _clevr_count,
                  "clevr_distance": _clevr_distance,
                  "kitti_distance": _kitti_distance}


def label_fn(task, features=None):
    """``example dict -> int64 label`` of a task (a graph function).
    ``features`` (the tfds ``FeaturesDict``) gives the number of values of
    a binned label; needed only for tasks with ``bins``."""
    import tensorflow as tf

    task = TASKS[task] if isinstance(task, str) else task
    if task.label in DERIVED_LABELS:
        return DERIVED_LABELS[task.label]
    key = task.label
    if task.bins is None:
        return lambda example: tf.cast(example[key], tf.int64)
    values = features[key].num_classes
    bins = task.bins
    # Neighbouring values share a class: floor(v / (values / bins)).
    return lambda example: tf.cast(example[key], tf.int64) * bins // values


# --------------------------------------------------------------------------
# data


class TaskSource(data_lib.TfdsSource):
    """A VTAB task's tfds split with its label, read like a
    :class:`~keras_vit.train.data.TfdsSource` (build it with
    :func:`load_task`)."""

    def __init__(self, task, builder, split, num_examples):
        features = builder.info.features
        if task.label not in DERIVED_LABELS and task.label not in features:
            raise data_lib.DataError(
                f"tfds dataset {task.tfds_name!r} has no feature "
                f"{task.label!r} (VTAB task {task.name!r}); its features: "
                f"{sorted(features.keys())}")
        names = None
        num_classes = task.num_classes or task.bins
        if task.label not in DERIVED_LABELS and task.bins is None:
            num_classes = num_classes or features[task.label].num_classes
            names = getattr(features[task.label], "names", None)
        data_lib.ImageSource.__init__(self, num_examples, num_classes, names)
        self.name = f"vtab:{task.name}:{split}"
        self.task = task
        self.builder = builder
        self.split = split
        self.image_key = "image"
        self.label_key = "label"
        self.flip_ok = task.augment
        self._keep = None
        self._labels = None
        self._label_fn = label_fn(task, features)

    def _raw(self):
        fn = self._label_fn
        # take(): exactly the examples the protocol counts, however many
        # the reader yields (tfds' mock data yields a fixed number).
        return super()._raw().take(self.num_examples).map(
            lambda ex: {"image": ex["image"], "label": fn(ex)})

    def decode(self, record):
        image = super().decode(record)
        if self.task.pixel_scale != 1.0:
            import tensorflow as tf

            image = tf.minimum(image * self.task.pixel_scale, 255.0)
        return image

    def subset(self, indices):
        new = super().subset(indices)
        new.__class__ = type(self)
        return new


def _builder(task, data_dir):
    tfds = data_lib.import_tfds()
    return data_lib.tfds_builder(tfds, task.tfds_name, data_dir)


def how_to_prepare(tasks, data_dir=None):
    """What to run to prepare the tfds data of ``tasks`` (text)."""
    tasks = [TASKS[t] for t in resolve_tasks(tasks)]
    names = sorted({t.tfds_name for t in tasks})
    where = f" --data_dir {data_dir}" if data_dir else ""
    lines = [f"Prepare it once, with network access: `tfds build "
             f"{' '.join(names)}{where}`"]
    for name in names:
        try:
            builder = _builder(next(t for t in tasks if t.tfds_name == name),
                               data_dir)
        except data_lib.DataError:
            continue
        manual = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
        if manual:
            steps = " ".join(manual.split())
            lines.append(
                f"{name} needs a manual download first ({steps}); put the "
                f"files in a folder and add --manual_dir FOLDER to `tfds "
                f"build {name}`")
    lines.append(
        "or let keras-vit prepare them (--download / download=True), or "
        "point --data-dir / data_dir= (or TFDS_DATA_DIR) at the folder "
        "where they are prepared.")
    return ". ".join(lines)


def load_task(task, *, data_dir=None, download=False, sweep=False,
              train_examples=TRAIN_EXAMPLES, val_examples=VAL_EXAMPLES,
              test_examples=None):
    """``(train, eval)`` :class:`TaskSource` s of one task under the
    protocol (see :func:`split_instructions`). Raises ``FileNotFoundError``
    with the preparation steps when the data is not prepared."""
    task = TASKS[resolve_tasks([task])[0]] if isinstance(task, str) else task
    builder = _builder(task, data_dir)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"VTAB task {task.name!r}: tfds dataset {task.tfds_name!r} is "
                f"not prepared in {str(builder.data_dir_root)!r}. "
                + how_to_prepare([task.name], data_dir))
        builder.download_and_prepare()
    sizes = {k: v.num_examples for k, v in builder.info.splits.items()}
    counts = {}
    splits = split_instructions(
        task, sizes, sweep=sweep, train_examples=train_examples,
        val_examples=val_examples, test_examples=test_examples,
        _counts=counts)
    return (TaskSource(task, builder, splits["train"], counts["train"]),
            TaskSource(task, builder, splits["eval"], counts["eval"]))


def load_tasks(tasks=None, *, data_dir=None, download=False, **sizes):
    """``{name: (train, eval)}`` for every task, checking all of them
    before returning: one error lists every task whose data is missing."""
    names = resolve_tasks(tasks)
    loaded, missing = {}, []
    for name in names:
        try:
            loaded[name] = load_task(name, data_dir=data_dir,
                                     download=download, **sizes)
        except FileNotFoundError:
            missing.append(name)
    if missing:
        where = data_dir or "tfds' default data_dir (~/tensorflow_datasets " \
                            "or TFDS_DATA_DIR)"
        listed = ", ".join(f"{n} (tfds {TASKS[n].tfds_name!r})"
                           for n in missing)
        raise FileNotFoundError(
            f"VTAB data missing in {where} for {len(missing)} of "
            f"{len(names)} task(s): {listed}. "
            + how_to_prepare(missing, data_dir))
    return loaded


# --------------------------------------------------------------------------
# the runner


def _fresh_model(model):
    """A function giving each task its own copy of a ``keras.Model`` (the
    runs must not fine-tune one another's weights)."""
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


def _same_protocol(metrics, expected):
    return all(metrics.get(k) == v for k, v in expected.items())


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
    # Checked before reading data: a name this backend cannot run fails
    # at once.
    strategy_ = engine_lib.strategy_lib.for_backend(strategy, tpu=tpu)
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
        if done is not None and _same_protocol(done, expected):
            results[name] = done
            if verbose:
                print(f"vtab: {name}: already scored in {run_dir} "
                      f"({done['accuracy']:.4f})")
            continue
        if verbose:
            print(f"vtab: {name} ({task.group}): training on {train.split} "
                  f"({train.num_examples}), evaluating on {evaluation.split} "
                  f"({evaluation.num_examples})")
        result = engine_lib.Trainer(
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

