"""The run directory: what a run keeps on disk to resume after a crash.

    OUT/checkpoints/   ckpt-STEP.npz and manifest.json
    OUT/logs/          TensorBoard event files (train/, eval/)
    OUT/history.jsonl  one line per logged step
    OUT/run.json       the recipe and the set-up
    OUT/metrics.json   final figures (written at the end)
    OUT/model.keras    the trained model (EMA weights when EMA is on)
    OUT/run.lock       the pid of the process the run belongs to

Running the same command again resumes from the last checkpoint; a second
process on the same folder while the first runs is refused.
"""

from __future__ import annotations

import contextlib
import json
import os

from keras_vit.base import atomic
from keras_vit.base import schema
from keras_vit.base.limits import MAX_CLASSES
from keras_vit.train import checkpoints as ckpt_lib

#: The run directory's lock: the pid of the process that owns the run.
RUN_LOCK = "run.lock"

# What may differ when a run resumes: bookkeeping, not the trained weights.
_RESUME_FREE = {"total_steps", "steps_per_epoch", "strategy", "epochs",
                "recipe.checkpoint_every", "recipe.log_every",
                "recipe.eval_every", "recipe.total_steps", "recipe.epochs",
                "recipe.batch_size", "eval_data", "recipe.precision",
                "recipe.jit_compile", "precision", "jit_compile", "backend"}
# Settings a record may lack (recorded since a later version).
_RECORDED_SINCE = {"label_names", "recipe.scale_lr_with_batch"}


def checkpoint_dir(out_dir):
    """The folder of ``out_dir``'s checkpoints."""
    return os.path.join(out_dir, "checkpoints")


def history_path(out_dir):
    """The path of ``out_dir``'s history (one JSON line per logged step)."""
    return os.path.join(out_dir, "history.jsonl")


def write_scalar(name, value, step):
    """A TensorBoard scalar through TensorFlow's own summary writer
    (``tf.summary.scalar`` needs the tensorboard package, which TF 2.21
    does not install)."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)
    return tf.summary.write(name, tf.constant(float(value), tf.float32),
                            step=step, metadata=metadata)


def summary_writer(folder):
    """A TensorBoard event writer (TensorFlow's, on every Keras backend)."""
    import tensorflow as tf

    return tf.summary.create_file_writer(folder)


def write_scalars(writer, step, values):
    """Writes ``values`` (``{name: number}``) at ``step`` with the event
    ``writer`` of :func:`summary_writer`, and flushes it."""
    with writer.as_default(step=step):
        for name, value in values.items():
            write_scalar(name, value, step)
    writer.flush()


def save_results(out_dir, model, metrics, *, ema):
    """Saves a finished run's ``model`` as ``out_dir/model.keras`` and
    ``metrics`` (with the model's path and whether it holds the ``ema``
    weights) as ``out_dir/metrics.json``."""
    path = os.path.join(out_dir, "model.keras")
    with atomic.atomic_path(path) as tmp:
        model.save(tmp)
    metrics["model_path"] = path
    metrics["model_holds"] = "ema weights" if ema else "weights"
    atomic.write_json(os.path.join(out_dir, "metrics.json"), metrics)


# What run.json (and the record a checkpoint keeps) holds, as far as
# resuming reads it.
_NAME = schema.Nullable(schema.Str())
_COUNT = schema.Nullable(schema.Int(1))
RUN_RECORD = schema.Object({
    "model": _NAME, "train_data": _NAME, "eval_data": _NAME,
    "num_classes": schema.Nullable(schema.Int(1, MAX_CLASSES)),
    "label_names": schema.Nullable(schema.List(schema.Str(),
                                               max_len=MAX_CLASSES)),
    "image_size": schema.Nullable(schema.OneOf(
        schema.Int(1), schema.List(schema.Int(1), lengths={2}))),
    "recipe": schema.Object(),
    "total_steps": _COUNT, "steps_per_epoch": _COUNT,
    "micro_batch_size": _COUNT, "accumulation_steps": _COUNT,
    "backend": _NAME, "precision": _NAME,
    "jit_compile": schema.Nullable(schema.Bool()),
}, what="a run record (a JSON object)")
HISTORY_ROW = schema.Object({"step": schema.Int(0)}, required=("step",),
                            what="a history row (a JSON object)")


def read_run_record(path=None, text=None):
    """The run record in the file ``path`` or in ``text`` (``path`` naming
    where it came from), checked against :data:`RUN_RECORD`."""
    if text is None:
        return schema.read_json(path, "run.json", RUN_RECORD)
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return schema.check(RUN_RECORD, schema.parse_json(raw, path, "run record"),
                        path)


def append_jsonl(path, row):
    """Appends ``row`` as one JSON line to ``path``, flushed to disk.

    A last line without its newline (a process killed mid-append) is cut
    off first.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "history.jsonl")
    >>> append_jsonl(path, {"step": 1})
    >>> with open(path, "a") as f:
    ...     _ = f.write('{"step": 2, "lo')  # killed here
    >>> append_jsonl(path, {"step": 2})
    >>> open(path).read().splitlines()
    ['{"step": 1}', '{"step": 2}']
    """
    line = (json.dumps(atomic.to_json(row)) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                f.truncate(_end_of_last_line(f, end))
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _end_of_last_line(f, end, block=4096):
    """The offset just past the last newline before ``end`` (0 if none)."""
    pos = end
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def read_history(out_dir):
    """The rows of ``out_dir``'s history, or None when it has none, each
    checked against :data:`HISTORY_ROW`. A last line cut short by a killed
    process is skipped; any other line that is not a row is refused."""
    path = history_path(out_dir)
    if not os.path.isfile(path):
        return None
    rows = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                value = schema.parse_json(line, where, "history row")
            except ValueError:
                if not line.endswith(b"\n"):
                    continue  # the partial row of a killed process
                raise
            rows.append(schema.check(HISTORY_ROW, value, where))
    return rows


def truncate_history(out_dir, step):
    """Drops log lines of steps after the checkpoint at ``step`` (a killed
    run logged them, the resumed run redoes them)."""
    rows = read_history(out_dir)
    if rows is not None:
        atomic.write_text(history_path(out_dir), "".join(
            json.dumps(r) + "\n" for r in rows if r.get("step", 0) <= step))


def lock_run_dir(owner, out_dir):
    """Makes ``out_dir`` belong to this process for as long as ``owner``
    lives (returns a callable that releases it earlier). Another process
    holding it raises :class:`keras_vit.base.atomic.LockHeldError`."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, RUN_LOCK)
    try:
        return atomic.hold_lock(owner, path)
    except atomic.LockHeldError as e:
        raise atomic.LockHeldError(
            f"the run folder out_dir={out_dir!r} (--out) is in use by "
            f"{e.holder}: wait for that run to end or stop it, or pass "
            "another out_dir. The lock is released when its process ends; "
            "if no such process runs (a lock kept by a network file "
            f"system), delete {path}", path, e.holder) from None


def prepare(out_dir, resume):
    """Makes ``out_dir``'s checkpoint folder; ``resume=False`` first
    deletes the checkpoints, history and metrics of an earlier run."""
    checkpoints = checkpoint_dir(out_dir)
    if not resume and os.path.isdir(checkpoints):
        ckpt_lib.clear(checkpoints)
        for name in ("history.jsonl", "metrics.json"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))
    os.makedirs(checkpoints, exist_ok=True)


def open_run(out_dir, checkpoints, model, settings, *, resume, chief,
             say):
    """Opens ``out_dir`` for a run whose ``settings`` are the record of
    ``run.json``: with ``resume``, the newest checkpoint restored into
    ``model`` by ``checkpoints`` (refused under other settings); only the
    ``chief`` writes. Returns the step resumed from, or None."""
    if chief:
        prepare(out_dir, resume)
    # Recorded in every checkpoint: a resumed run is checked against it.
    checkpoints.settings = json.dumps(atomic.to_json(settings),
                                      sort_keys=True)
    directory = checkpoint_dir(out_dir)
    if resume and os.path.isfile(os.path.join(directory, "checkpoint")):
        raise ValueError(
            f"The run in {out_dir!r} was checkpointed by an earlier "
            "keras-vit (tf.train.Checkpoint files), which this one does "
            "not resume; start again with resume=False (--restart) or "
            "use another out_dir")
    resumed_from = checkpoints.restore(model) if resume else None
    if chief:
        checkpoints.start_run()
    if resumed_from is not None:
        check_resume(out_dir, settings,
                     recorded=checkpoints.recorded_settings,
                     resumed_from=resumed_from, resume=resume, say=say)
        if chief:
            truncate_history(out_dir, resumed_from)
    if chief:
        atomic.write_json(os.path.join(out_dir, "run.json"), settings)
    return resumed_from


def run_config_changes(before, now):
    """``["key: old -> new", ...]`` for the settings of ``before`` that
    ``now`` changes and that change what the run trains.

    >>> run_config_changes({"train_data": "a", "recipe": {"seed": 0}},
    ...                    {"train_data": "b", "recipe": {"seed": 1}})
    ['recipe.seed: 0 -> 1', "train_data: 'a' -> 'b'"]
    """
    def flat(config, prefix=""):
        out = {}
        for key, value in config.items():
            if isinstance(value, dict) and key == "recipe":
                out.update(flat(value, f"{key}."))
            else:
                out[prefix + key] = value
        return out

    old, new = flat(before), flat(atomic.to_json(now))
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new))
            if key not in _RESUME_FREE and old.get(key) != new.get(key)
            and not (key in _RECORDED_SINCE and key not in old)]


def check_resume(out_dir, now, *, recorded, resumed_from, resume, say):
    """Refuses to resume the checkpoint at step ``resumed_from`` of
    ``out_dir`` under settings ``now`` other than those it was made with:
    ``recorded`` (the JSON text the checkpoint holds) or else ``run.json``.
    ``resume="force"`` only notes the differences (through ``say``)."""
    path = os.path.join(out_dir, "run.json")
    if recorded is not None:
        before = read_run_record(
            f"the checkpoint at step {resumed_from} of {out_dir}", recorded)
    elif os.path.isfile(path):
        before = read_run_record(path)
    elif resume == "force":
        say(f"note: {path} is missing; resuming the checkpoint "
            "at step {} with the settings given now".format(resumed_from))
        return
    else:
        raise ValueError(
            f"The run in {out_dir!r} has a checkpoint (step "
            f"{resumed_from}) but no run.json recording the settings "
            "it was trained with, so resuming it could mix settings. "
            "Restore run.json, use another out_dir, resume=False "
            "(--restart) to start again, or resume='force' "
            "(--resume-anyway) to continue with the settings given now.")
    check_settings(out_dir, before, now, resume=resume, say=say)


def check_settings(out_dir, before, now, *, resume, say):
    """Refuses to resume under settings ``now`` other than ``before``."""
    for key in ("total_steps", "steps_per_epoch"):
        if before.get(key) != now[key]:
            say(f"note: resuming a run whose {key} was {before.get(key)} "
                f"with {key}={now[key]}")
    changed = run_config_changes(before, now)
    if changed and resume != "force":
        raise ValueError(
            f"The run in {out_dir!r} was started with other "
            "settings; resuming it would mix them: " + "; ".join(changed)
            + ". Use the original settings, another out_dir, "
            "resume=False (--restart) to start again, or "
            "resume='force' (--resume-anyway) to continue regardless.")
    for line in changed:
        say(f"note: resuming with a changed setting: {line}")
    batch_before = before.get("recipe", {}).get("batch_size")
    batch_now = now["recipe"]["batch_size"]
    if batch_before != batch_now:
        raise ValueError(
            f"The run in {out_dir!r} used batch_size="
            f"{before['recipe']['batch_size']}; resuming it with "
            f"batch_size={batch_now} would misplace the "
            "data position. Use the same batch size, another out_dir, "
            "or resume=False.")
