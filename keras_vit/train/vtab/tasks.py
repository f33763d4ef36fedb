"""The VTAB-1k protocol as data: the 19 tasks of the paper's Table 9
(:data:`TASKS`), their 800 + 200 example splits
(:func:`split_instructions`) and the labels some derive from other features
(:func:`label_fn`), under the names of google-research/task_adaptation.
Nothing here reads data or imports Keras."""

from __future__ import annotations

import dataclasses
import difflib

from keras_vit.train.data.sources import DataError

GROUPS = ("Natural", "Specialized", "Structured")
# The protocol's sizes: 800 training + 200 validation examples per task.
TRAIN_EXAMPLES = 800
VAL_EXAMPLES = 200
# BiT's training crop (384 of 448) as an inception crop of that area.
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
    # Structured: a crop or a flip would change the labels.
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


def _parts(task, sizes):
    """``{"train"|"val"|"test": (tfds split, start, stop)}`` from the sizes
    of the tfds splits (``{"train": 3060, ...}``)."""
    kind, *args = task.layout

    def size(split):
        if split not in sizes:
            raise DataError(
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
        raise DataError(
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
    ``sweep=True`` trains on ``train800`` and evaluates on ``val200``.
    ``test_examples`` limits the test part (None: all of it).
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
