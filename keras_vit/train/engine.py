"""The training loop: one Trainer for the TensorFlow, JAX and torch backends.

:class:`Trainer` holds what every backend shares: the recipe and its
schedule, gradient accumulation over micro-batches, clipping of the summed
gradient, an EMA of the weights, the data position and exact resume, the
run directory, logs and the progress bar. An engine per backend holds the
rest (where variables live, the compiled step, checkpoints):
``tf.distribute`` under TensorFlow (:mod:`keras_vit.train.engine_tf`), a
``jax.jit`` step (one device or ``keras.distribution.DataParallel``) or an
eager torch step (:mod:`keras_vit.train.engine_keras`). For ``model.fit``,
:func:`compile_for_finetune` makes Keras' own loop follow a recipe too.

A run directory holds everything a run needs to resume after a crash:

    OUT/checkpoints/   model, optimizer, EMA weights, step, data position
                       (tf.train files under TensorFlow, ckpt-STEP.npz
                       under jax and torch)
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
import dataclasses
import json
import math
import os
import shutil
import time

import numpy as np

from keras_vit import atomic
from keras_vit.train import data as data_lib
from keras_vit.train import recipes as recipes_lib
from keras_vit.train import distribute as strategy_lib
from keras_vit.train.engine_tf import step_uses_xla  # noqa: F401 - public


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


@contextlib.contextmanager
def _dtype_policy(name):
    """Layers built inside get ``name`` as their Keras dtype policy."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def write_scalar(name, value, step):
    """A TensorBoard scalar through TensorFlow's own summary writer.

    ``tf.summary.scalar`` needs the tensorboard package (TF 2.21 no longer
    installs it); this writes the same event (a float32 tensor tagged for
    TensorBoard's scalars plugin) with TensorFlow alone.
    """
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)
    return tf.summary.write(name, tf.constant(float(value), tf.float32),
                            step=step, metadata=metadata)


def _summary_writer(folder):
    """A TensorBoard event writer (TensorFlow's, on every Keras backend)."""
    import tensorflow as tf

    return tf.summary.create_file_writer(folder)


def append_jsonl(path, row):
    """Appends ``row`` as one JSON line to ``path``, flushed to disk.

    A process killed mid-append leaves a last line cut short; the next
    append would glue its row onto it, so a last line without its newline
    is cut off first (it is the partial row of a step the resumed run
    redoes). Every complete line survives.

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


def _read_jsonl(path):
    """The rows of a JSON-lines file; a line cut short by a killed process
    is skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


#: The run directory's lock: the pid of the process that owns the run.
RUN_LOCK = "run.lock"


def lock_run_dir(owner, out_dir):
    """Makes ``out_dir`` belong to this process for as long as ``owner``
    lives (returns a callable that releases it earlier): two runs writing
    one folder prune each other's checkpoints and interleave their
    histories. Another process holding it raises
    :class:`keras_vit.atomic.LockHeldError` naming its pid; a lock whose
    process died is taken over (the kernel drops it)."""
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


# What may differ when a run resumes: bookkeeping that does not change the
# trained weights (the step count is noted, the batch size refused apart).
_RESUME_FREE = {"total_steps", "steps_per_epoch", "strategy", "epochs",
                "recipe.checkpoint_every", "recipe.log_every",
                "recipe.eval_every", "recipe.total_steps", "recipe.epochs",
                "recipe.batch_size", "eval_data", "recipe.precision",
                "recipe.jit_compile", "precision", "jit_compile", "backend"}


def run_config_changes(before, now):
    """``["key: old -> new", ...]`` for the settings of a run's
    ``run.json`` (``before``) that ``now`` changes and that change what
    the run trains (learning rate, seed, data, model, recipe...).

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
            if key not in _RESUME_FREE and old.get(key) != new.get(key)]


def _model_image_size(model):
    shape = model.inputs[0].shape
    if shape[1] is None or shape[1] != shape[2]:
        raise ValueError(
            f"model={model.name!r} must take square images of a fixed size; "
            f"its input shape is {tuple(shape)}")
    return int(shape[1])


def _model_classes(model):
    return int(model.outputs[0].shape[-1])


def _classifier_of(model):
    """``"token"`` or ``"gap"`` for a ViT, else None (BiT, other models)."""
    head = getattr(model, "classifier", None)
    return head if head in recipes_lib.CLASSIFIERS else None


def build_model(model, *, num_classes, image_size=None, weights="auto",
                dropout_rate=None, model_options=None):
    """A model for training, built in the current strategy scope.

    ``model`` is a zoo name (loaded with ``weights``; a head of another size
    is replaced by a zero-initialised one, position embeddings are resized
    to ``image_size``), a ``.keras`` path, a ``keras.Model`` (copied into
    the scope; a keras_vit model is rebuilt with the same weights by
    :func:`keras_vit.models.rebuild` when ``image_size`` (position
    embeddings resized), ``num_classes`` (a new zero-initialised head),
    ``dropout_rate`` or the dtype policy differ), or a function returning a
    model.
    """
    import keras

    from keras_vit.models import rebuild, resolve_model
    from keras_vit.models.resolve import model_path

    options = dict(model_options or {})
    if isinstance(model, (str, os.PathLike)) and model_path(model) is None:
        if dropout_rate is not None:
            options.setdefault("dropout_rate", dropout_rate)
        return resolve_model(model, weights=weights, image_size=image_size,
                             num_classes=num_classes, **options)
    if isinstance(model, (str, os.PathLike)):
        model = resolve_model(model)  # a .keras file or a run directory
    elif callable(model) and not isinstance(model, keras.Model):
        model = model()
    if hasattr(model, "to_classifier") and num_classes is not None:
        # A self-supervised model (keras_vit.train.mpp): its encoder with a
        # new zero-initialised head.
        model = model.to_classifier(num_classes)
    if not isinstance(model, keras.Model):
        raise ValueError(
            "model must be a zoo name, a .keras path, a keras.Model or a "
            f"function returning one; received model={model!r}")
    changes = {}
    if image_size is not None and _model_image_size(model) != image_size:
        changes["image_size"] = image_size
    if dropout_rate is not None and hasattr(model, "dropout_rate"):
        changes["dropout_rate"] = dropout_rate
    # Built under another dtype policy (e.g. float32 for a bfloat16 run):
    # rebuilt under the run's policy. A new task's head (pre_logits too)
    # becomes one zero-initialised layer, as in the paper (Appendix B.1.1);
    # a new resolution interpolates the position embeddings (the paper's
    # higher-resolution fine-tune).
    rebuilt = rebuild(model, num_classes=num_classes,
                      dtype=keras.mixed_precision.global_policy().name,
                      copy=False, **changes)
    if rebuilt is not model:
        return rebuilt
    return _copy_into_scope(model)


def _copy_into_scope(model):
    """The same model with its variables created in the current strategy's
    scope (a no-op when they already are, and on the jax and torch
    backends, whose engines place the variables themselves)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return model
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if all(strategy.extended.variable_created_in_scope(v.value)
           for v in model.variables):
        return model
    from keras_vit.models import rebuild

    return rebuild(model)


def make_engine(strategy="auto", *, tpu=None, model_parallel=None):
    """The engine for the current Keras backend: ``tf.distribute`` under
    TensorFlow (:mod:`~keras_vit.train.engine_tf`), a ``jax.jit`` step
    (one device, ``keras.distribution.DataParallel``, or ``ModelParallel``
    with ``model_parallel=k``) under JAX, an eager autograd step under
    torch (:mod:`~keras_vit.train.engine_keras`)."""
    import keras

    backend = keras.backend.backend()
    strategy_lib.check_backend(strategy)
    if model_parallel is not None and model_parallel != 1 and backend != "jax":
        way_out = ("the Trainer replicates the model with a tf.distribute "
                   "strategy (strategy='mirrored', 'multi_worker' or 'tpu'), "
                   "or set KERAS_BACKEND=jax to shard it."
                   if backend == "tensorflow" else
                   "the Trainer runs on one device (strategy='default'): "
                   "set KERAS_BACKEND=jax to shard the model.")
        raise strategy_lib.StrategyError(
            f"model_parallel={model_parallel} shards weights with "
            "keras.distribution.ModelParallel, which runs on the 'jax' "
            f"Keras backend; under {backend!r} {way_out}")
    if backend == "tensorflow":
        from keras_vit.train.engine_tf import TFEngine

        return TFEngine(strategy, tpu=tpu)
    from keras_vit.train import engine_keras

    engines = {"jax": engine_keras.JaxEngine,
               "torch": engine_keras.TorchEngine}
    if backend not in engines:
        raise NotImplementedError(
            f"the Trainer runs on the tensorflow, jax and torch Keras "
            f"backends; received KERAS_BACKEND={backend}")
    if backend == "jax":
        return engines[backend](strategy, model_parallel=model_parallel)
    return engines[backend](strategy)


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
            self._release_run_dir = lock_run_dir(self, out_dir)
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
        replicas = self.engine.replicas
        if r.batch_size % replicas:
            raise ValueError(
                f"batch_size={r.batch_size} is not divisible by the "
                f"{replicas} replicas of the {self.info['name']} strategy; "
                f"use a multiple of {replicas}")
        self.per_replica = r.batch_size // replicas
        self.micro = r.micro_batch_size or self.per_replica
        if self.per_replica % self.micro:
            raise ValueError(
                f"micro_batch_size={r.micro_batch_size} must divide the "
                f"per-replica batch {self.per_replica} (batch_size="
                f"{r.batch_size} over {replicas} replicas)")
        self.accum = self.per_replica // self.micro
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
        with self.engine.scope(), _dtype_policy(self.precision):
            self.model = build_model(
                model, num_classes=self.train.num_classes,
                image_size=(r.image_size if ("image_size" in overrides
                                             or not given) else None),
                weights=weights,
                dropout_rate=(r.dropout_rate if ("dropout_rate" in overrides
                                                 or not given) else None),
                model_options=model_options)
            self.image_size = _model_image_size(self.model)
            head = _classifier_of(self.model)
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
        if _model_classes(model) != self.train.num_classes:
            raise ValueError(
                f"model={model.name!r} has {_model_classes(model)} outputs "
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
        return os.path.join(self.out_dir, "checkpoints")

    def _open_run_dir(self, resume):
        self._resume = resume
        if self.is_chief:
            if not resume and os.path.isdir(self.checkpoint_dir):
                shutil.rmtree(self.checkpoint_dir)
                for name in ("history.jsonl", "metrics.json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(self.out_dir, name))
            os.makedirs(self.checkpoint_dir, exist_ok=True)
        # Recorded in every checkpoint: a resumed run is checked against
        # the checkpoint's own record, which no side file can change.
        self.engine.run_settings = json.dumps(
            atomic.to_json(self._run_config()), sort_keys=True)
        self.resumed_from = self.engine.open_checkpoints(
            self.out_dir, self.checkpoint_dir, resume)
        if self.resumed_from is not None:
            self._check_run_config()
            if self.is_chief:
                self._truncate_history(self.resumed_from)
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

    def _check_run_config(self):
        path = os.path.join(self.out_dir, "run.json")
        recorded = self.engine.recorded_settings
        if recorded is not None:
            self._check_settings(json.loads(recorded))
            return
        # A checkpoint from before the settings were recorded in it: the
        # run's run.json is the record.
        if not os.path.isfile(path):
            # The settings a checkpoint was made with are in run.json: a
            # checkpoint without it cannot show it is the same run, so it
            # is not resumed under whatever settings are given now.
            if self._resume == "force":
                self._say(f"note: {path} is missing; resuming the checkpoint "
                          "at step {} with the settings given now".format(
                              self.resumed_from))
                return
            raise ValueError(
                f"The run in {self.out_dir!r} has a checkpoint (step "
                f"{self.resumed_from}) but no run.json recording the settings "
                "it was trained with, so resuming it could mix settings. "
                "Restore run.json, use another out_dir, resume=False "
                "(--restart) to start again, or resume='force' "
                "(--resume-anyway) to continue with the settings given now.")
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
        self._check_settings(before)

    def _check_settings(self, before):
        """Refuses to resume under settings other than ``before`` (what the
        checkpoint, or for an older one run.json, recorded)."""
        for key in ("total_steps", "steps_per_epoch"):
            if before.get(key) != getattr(self, key):
                self._say(
                    f"note: resuming a run whose {key} was {before.get(key)} "
                    f"with {key}={getattr(self, key)}")
        changed = run_config_changes(before, self._run_config())
        if changed and self._resume != "force":
            raise ValueError(
                f"The run in {self.out_dir!r} was started with other "
                "settings; resuming it would mix them: " + "; ".join(changed)
                + ". Use the original settings, another out_dir, "
                "resume=False (--restart) to start again, or "
                "resume='force' (--resume-anyway) to continue regardless.")
        for line in changed:
            self._say(f"note: resuming with a changed setting: {line}")
        batch_before = before.get("recipe", {}).get("batch_size")
        if batch_before != self.recipe.batch_size:
            raise ValueError(
                f"The run in {self.out_dir!r} used batch_size="
                f"{before['recipe']['batch_size']}; resuming it with "
                f"batch_size={self.recipe.batch_size} would misplace the "
                "data position. Use the same batch size, another out_dir, "
                "or resume=False.")

    def _history_path(self):
        return os.path.join(self.out_dir, "history.jsonl")

    def _truncate_history(self, step):
        """Drops log lines of steps after the checkpoint (a killed run
        logged them, the resumed run redoes them)."""
        path = self._history_path()
        if not os.path.isfile(path):
            return
        rows = [r for r in _read_jsonl(path) if r.get("step", 0) <= step]
        atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in rows))

    def _read_history(self):
        if self.out_dir is None or not os.path.isfile(self._history_path()):
            return list(self._memory_history)
        return _read_jsonl(self._history_path())

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
            writer = _summary_writer(os.path.join(self.out_dir, "logs",
                                                  "train"))
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
            path = os.path.join(self.out_dir, "model.keras")
            with atomic.atomic_path(path) as tmp:
                self.model.save(tmp)
            metrics["model_path"] = path
            metrics["model_holds"] = "ema weights" if self.ema else "weights"
            atomic.write_json(os.path.join(self.out_dir, "metrics.json"),
                              metrics)
        if writer is not None:
            writer.close()
        ev = metrics.get("eval_ema") or metrics.get("eval")
        self._say(
            f"done: step {step}, train loss {metrics['train_loss']:.4f}"
            + (f", eval accuracy {ev['accuracy']:.4f} on {ev['num_examples']}"
               f" images" if ev else "")
            + f" ({wall:.1f}s)"
            + (f"; wrote {metrics['model_path']}"
               if "model_path" in metrics else ""))
        return TrainResult(self.model, metrics, self.out_dir)

    def _log(self, step, epoch, pending, writer, bar):
        from keras import ops

        values = np.asarray([[float(t) for t in out] for out in pending])
        loss, acc, norm = (float(v) for v in values.mean(axis=0))
        lr = float(ops.convert_to_numpy(self._schedule(step)))
        row = {"step": step, "epoch": epoch, "loss": round(loss, 6),
               "accuracy": round(acc, 6), "grad_norm": round(norm, 6),
               "learning_rate": lr}
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"the training loss is {loss} at step {step}; lower "
                f"learning_rate={self.recipe.learning_rate} or clip "
                "gradients (grad_clip_norm)")
        self._memory_history.append(row)
        if self.is_chief and self.out_dir is not None:
            append_jsonl(self._history_path(), row)
        if writer is not None:
            with writer.as_default(step=step):
                for key in ("loss", "accuracy", "grad_norm", "learning_rate"):
                    write_scalar(key, row[key], step)
            writer.flush()
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
            writer = _summary_writer(os.path.join(self.out_dir, "logs", name))
            with writer.as_default(step=step):
                write_scalar("accuracy", result["accuracy"], step)
                write_scalar("loss", result["loss"], step)
            writer.close()
        return result

    def evaluate(self, data, batch_size=None):
        """Accuracy and loss of the model (as it is now) on ``data``."""
        source = data_lib.load_data(data, split="test", verbose=self.verbose)
        return self.engine.evaluate(
            source, batch_size or min(self.micro * self.engine.replicas, 256),
            eval_crop=self.recipe.eval_crop,
            verbose=self.verbose and self.is_chief)


def evaluate(model, data, *, image_size=None, batch_size=64,
             strategy="default", eval_crop=1.0, verbose=True, _cache=None):
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``data``.

    Every image is counted once: the last batch is padded with masked
    blanks, so all replicas and workers run the same steps.

    >>> import keras_vit, keras_vit.train as kt
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)  # zero head: chance
    >>> r = kt.evaluate(model, "digits:test", verbose=False)
    >>> r["num_examples"], round(r["loss"], 4)
    (450, 2.3026)
    """
    import keras
    import tensorflow as tf
    from tqdm.auto import tqdm

    on_tf = keras.backend.backend() == "tensorflow"
    if not on_tf:
        strategy_lib.check_backend(strategy)
    source = data_lib.load_data(data, split="test", verbose=verbose)
    size = image_size or _model_image_size(model)
    if _model_classes(model) < source.num_classes:
        raise ValueError(
            f"model={model.name!r} has {_model_classes(model)} outputs but "
            f"data={source.name!r} has {source.num_classes} classes")
    if not on_tf:
        return _evaluate_one_device(model, source, size, batch_size,
                                    eval_crop)
    strategy_ = strategy_lib.strategy(strategy)
    replicas = strategy_.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"batch_size={batch_size} is not divisible by the "
                         f"{replicas} replicas")
    per_replica = batch_size // replicas
    steps = -(-source.num_examples // batch_size)

    def fn(ctx):
        local = replicas // ctx.num_input_pipelines
        return data_lib.padded_eval_dataset(
            source, size, per_replica, num_batches=steps * local,
            shard=(ctx.num_input_pipelines, ctx.input_pipeline_id),
            eval_crop=eval_crop, raw_pixels=data_lib.takes_raw_pixels(model))

    dist = strategy_.distribute_datasets_from_function(fn)
    cache = _cache if _cache is not None else {}
    key = (id(model), id(strategy_))
    if key not in cache:
        def replica_fn(images, labels, mask):
            logits = tf.cast(model(images, training=False), tf.float32)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, logits)
            correct = tf.cast(tf.equal(tf.argmax(logits, -1), labels),
                              tf.float32)
            return (tf.reduce_sum(per_example * mask),
                    tf.reduce_sum(correct * mask), tf.reduce_sum(mask))

        @tf.function
        def step_fn(iterator):
            out = strategy_.run(replica_fn, args=next(iterator))
            return [strategy_.reduce(tf.distribute.ReduceOp.SUM, o, axis=None)
                    for o in out]

        cache[key] = step_fn
    step_fn = cache[key]
    totals = np.zeros(3)
    iterator = iter(dist)
    for _ in tqdm(range(steps), desc="evaluate", unit="batch", leave=False,
                  disable=not verbose or steps < 20):
        totals += [float(v) for v in step_fn(iterator)]
    loss, correct, count = (float(v) for v in totals)
    return {"accuracy": correct / max(count, 1.0),
            "loss": loss / max(count, 1.0), "num_examples": int(count)}


def _evaluate_one_device(model, source, size, batch_size, eval_crop):
    """:func:`evaluate` on the jax and torch backends: the same padded,
    masked batches (tf.data stays the input pipeline), the model run eagerly
    on NumPy without gradients, the sums taken in float64."""
    import keras

    from keras_vit.backend import infer

    if keras.backend.backend() == "jax":
        # Keras' compiled predict step: op-by-op eager jax is many times
        # slower, and the padded batches all have one shape.
        def infer(model, images):  # noqa: F811 - the jax way
            out = model.predict_on_batch(images)
            return np.asarray(out[0] if isinstance(out, (list, tuple))
                              else out)

    steps = -(-source.num_examples // batch_size)
    loss = correct = count = 0.0
    for images, labels, mask in data_lib.padded_eval_dataset(
            source, size, batch_size, num_batches=steps,
            eval_crop=eval_crop, raw_pixels=data_lib.takes_raw_pixels(model)
    ).as_numpy_iterator():
        logits = infer(model, images).astype("float64")
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, labels[:, None], -1)[:, 0]
        loss -= float((picked * mask).sum())
        correct += float(((logits.argmax(-1) == labels) * mask).sum())
        count += float(mask.sum())
    return {"accuracy": correct / max(count, 1.0),
            "loss": loss / max(count, 1.0), "num_examples": int(count)}


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


def compile_for_finetune(model, recipe="finetune", *, steps_per_epoch=None,
                         **overrides):
    """Compiles ``model`` for ``model.fit`` with a recipe's optimizer,
    schedule, clipping, gradient accumulation and loss (one device; use
    :class:`Trainer` for distributed runs). Returns the :class:`Recipe`.

    Feed it batches of ``recipe.micro_batch_size or recipe.batch_size``
    (e.g. from :func:`~keras_vit.train.dataset`) for ``total_steps``
    optimizer steps (times the accumulation steps when accumulating).

    >>> import keras_vit, keras_vit.train as kt
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
    >>> r = kt.compile_for_finetune(model, total_steps=6, warmup_steps=1,
    ...                             batch_size=32, learning_rate=0.03)
    >>> ds = kt.dataset("digits", 16, r.batch_size, crop_area=None)
    >>> h = model.fit(ds, steps_per_epoch=6, epochs=1, verbose=0)
    >>> h.history["loss"][0] < 2.31
    True
    """

    r = recipes_lib.get(recipe, classifier=_classifier_of(model),
                        **overrides)
    if r.total_steps is None:
        if steps_per_epoch is None:
            raise ValueError(
                f"recipe {r.name!r} counts epochs={r.epochs}; pass "
                "steps_per_epoch=... (or total_steps=...) so the learning-"
                "rate schedule knows the run's length")
        total = max(1, math.ceil(r.epochs * steps_per_epoch))
    else:
        total = r.total_steps
    accum = 1
    if r.micro_batch_size:
        if r.batch_size % r.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={r.micro_batch_size} must divide "
                f"batch_size={r.batch_size}")
        accum = r.batch_size // r.micro_batch_size
    optimizer = recipes_lib.make_optimizer(
        r, total, clip_in_optimizer=True, accumulation_steps=accum)
    model.compile(optimizer=optimizer,
                  loss=smoothed_sparse_crossentropy(r.label_smoothing),
                  metrics=["accuracy"], jit_compile=_fit_jit(model, r))
    return r


def _fit_jit(model, recipe):
    """``jit_compile`` for ``model.fit``: the recipe's when set; on
    TensorFlow with one device, the machine's plan for the model's compute
    dtype (Keras' own "auto" never uses XLA on a CPU, the slower bf16 path
    where there is no AMX); else Keras' "auto"."""
    import keras

    if recipe.jit_compile in (True, False):
        return recipe.jit_compile
    if keras.backend.backend() != "tensorflow":
        return "auto"
    import tensorflow as tf

    from keras_vit import hardware
    from keras_vit.models.compiled import model_compute_dtype

    if tf.distribute.has_strategy():
        return "auto"
    return hardware.plan(model_compute_dtype(model)).train_jit


def smoothed_sparse_crossentropy(label_smoothing=0.0):
    """Cross-entropy from logits for integer labels, with label smoothing
    (Keras' sparse loss has none; its dense one needs one-hot labels)."""
    import keras

    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return recipes_lib.smoothed_loss(label_smoothing)
