"""Reading a VTAB task's tfds splits under the protocol
(:func:`load_task`), with the ``tfds build`` commands that prepare what is
missing (:func:`how_to_prepare`)."""

from __future__ import annotations

from keras_vit.train.data.sources import DataError, ImageSource
from keras_vit.train.data.tfds_source import (
    TfdsSource, download_and_prepare, import_tfds, tfds_builder)
from keras_vit.train.vtab.tasks import (
    DERIVED_LABELS, TASKS, TRAIN_EXAMPLES, VAL_EXAMPLES, label_fn,
    resolve_tasks, split_instructions)


class TaskSource(TfdsSource):
    """A VTAB task's tfds split with its label, read like a
    :class:`~keras_vit.train.data.tfds_source.TfdsSource` (build it with
    :func:`load_task`)."""

    def __init__(self, task, builder, split, num_examples):
        features = builder.info.features
        if task.label not in DERIVED_LABELS and task.label not in features:
            raise DataError(
                f"tfds dataset {task.tfds_name!r} has no feature "
                f"{task.label!r} (VTAB task {task.name!r}); its features: "
                f"{sorted(features.keys())}")
        names = None
        num_classes = task.num_classes or task.bins
        if task.label not in DERIVED_LABELS and task.bins is None:
            num_classes = num_classes or features[task.label].num_classes
            names = getattr(features[task.label], "names", None)
        ImageSource.__init__(self, num_examples, num_classes, names)
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
        # Exactly the examples the protocol counts (tfds' mock data yields
        # a fixed number).
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


def how_to_prepare(tasks, data_dir=None):
    """What to run to prepare the tfds data of ``tasks`` (text)."""
    tasks = [TASKS[t] for t in resolve_tasks(tasks)]
    names = sorted({t.tfds_name for t in tasks})
    where = f" --data_dir {data_dir}" if data_dir else ""
    lines = [f"Prepare it once, with network access: `tfds build "
             f"{' '.join(names)}{where}`"]
    for name in names:
        try:
            builder = tfds_builder(import_tfds(), name, data_dir)
        except DataError:
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
    builder = tfds_builder(import_tfds(), task.tfds_name, data_dir)
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"VTAB task {task.name!r}: tfds dataset {task.tfds_name!r} is "
                f"not prepared in {str(builder.data_dir_root)!r}. "
                + how_to_prepare([task.name], data_dir))
        download_and_prepare(builder, task.tfds_name, data_dir)
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
