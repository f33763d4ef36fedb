"""The training engine: one custom loop for every ``tf.distribute`` strategy.

Every strategy (one device, several GPUs, a TPU, several workers) runs the
same compiled step: ``strategy.run`` over batches split per replica,
gradients summed across replicas, clipped at a global norm, applied, and an
exponential moving average of the weights updated. Keras' ``model.fit`` is
not used here because it fails under ``MultiWorkerMirroredStrategy`` with
Keras 3 (keras issue 20585); for one device, :func:`compile_for_finetune`
makes ``model.fit`` follow a recipe too.

A run directory holds everything a run needs to resume after a crash:

    OUT/checkpoints/   model, optimizer, EMA weights, step, data position
    OUT/logs/          TensorBoard event files (train/, eval/)
    OUT/history.jsonl  one line per logged step
    OUT/run.json       the recipe and the set-up
    OUT/metrics.json   final figures (written at the end)
    OUT/model.keras    the trained model (EMA weights when EMA is on)

Running the same command again resumes from the last checkpoint.
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
from keras_vit.train import strategy as strategy_lib


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


def _write_json(path, obj):
    """Writes atomically: a crash leaves the old file or the new one."""
    atomic.write_json(path, obj, default=_json_default)


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


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


# What may differ when a run resumes: bookkeeping that does not change the
# trained weights (the step count is noted, the batch size refused apart).
_RESUME_FREE = {"total_steps", "steps_per_epoch", "strategy", "epochs",
                "recipe.checkpoint_every", "recipe.log_every",
                "recipe.eval_every", "recipe.total_steps", "recipe.epochs",
                "recipe.batch_size", "eval_data", "recipe.precision",
                "recipe.jit_compile", "precision", "jit_compile"}


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

    old, new = flat(before), flat(json.loads(json.dumps(
        now, default=_json_default)))
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
    the scope; a VisionTransformer is rebuilt with the same weights when
    ``image_size`` (position embeddings resized), ``num_classes`` (a new
    zero-initialised head) or ``dropout_rate`` differ), or a function
    returning a model.
    """
    import keras

    from keras_vit import zoo
    from keras_vit.models.vit import VisionTransformer

    options = dict(model_options or {})
    if isinstance(model, (str, os.PathLike)) and (
            os.fspath(model).endswith(".keras")):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No model file at model={path!r}")
        model = keras.saving.load_model(path, compile=False)
    elif isinstance(model, str):
        if dropout_rate is not None:
            options.setdefault("dropout_rate", dropout_rate)
        built = zoo.load(model, weights=weights, image_size=image_size,
                         num_classes=num_classes, **options)
        return built
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
    policy = keras.mixed_precision.global_policy().name
    if model.dtype_policy.name != policy:
        # Built under another dtype policy (e.g. float32 for a bfloat16
        # run): rebuild it under the run's policy with the same weights.
        if isinstance(model, VisionTransformer):
            changes["dtype"] = None
        else:
            copy = keras.models.clone_model(model)
            copy.set_weights(model.get_weights())
            model = copy
    if image_size is not None and _model_image_size(model) != image_size:
        changes["image_size"] = image_size
    if (isinstance(model, VisionTransformer) and model.include_top
            and num_classes is not None and model.num_classes != num_classes):
        # A new task: the whole head (pre_logits too) becomes one
        # zero-initialised layer, as in the paper (Appendix B.1.1).
        changes.update(num_classes=num_classes, representation_size=None)
    if dropout_rate is not None and getattr(
            model, "dropout_rate", dropout_rate) != dropout_rate:
        changes["dropout_rate"] = dropout_rate
    if changes:
        if not isinstance(model, VisionTransformer):
            raise ValueError(
                f"{changes} differ from the model's, and only a "
                "VisionTransformer can be rebuilt with other settings")
        # The paper's higher-resolution fine-tune: same weights, position
        # embeddings interpolated to the new grid.
        config = dict(model.get_config(), **changes)
        arrays = zoo.export_arrays(model)
        model = VisionTransformer.from_config(config)
        zoo.load_weights(model, arrays)
        return model
    return _copy_into_scope(model)


def _copy_into_scope(model):
    """The same model with its variables created in the current strategy's
    scope (a no-op when they already are)."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if all(strategy.extended.variable_created_in_scope(v.value)
           for v in model.variables):
        return model
    config = model.get_config()
    try:
        copy = type(model).from_config(config)
    except Exception:  # noqa: BLE001 - not every model rebuilds from config
        copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def step_uses_xla(strategy_, requested="auto", precision="float32"):
    """Whether the train step compiles its forward and backward pass with
    XLA. ``requested`` True or False is taken as it is; ``"auto"`` follows
    :func:`keras_vit.hardware.plan` for one replica (XLA for
    ``mixed_bfloat16`` on CPUs without AMX and on GPUs, TensorFlow's oneDNN
    graph where AMX is, graph mode for float32 on CPUs) and stays off for
    several replicas and the TPU (which compiles the whole step anyway)."""
    if requested in (True, False):
        return requested
    from keras_vit import hardware

    info = strategy_lib.describe(strategy_)
    if info["name"] == "tpu" or strategy_.num_replicas_in_sync != 1:
        return False
    return hardware.plan(precision).train_jit


class Trainer:
    """Fine-tunes or trains a model with a recipe under a strategy.

    Args:
        model: a zoo name (``"ViT-B/16"``), a ``.keras`` path, a
            ``keras.Model`` or a function returning one. Built by the
            library under the strategy's scope and dtype policy.
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
            ``tf.distribute.Strategy``.
        weights: for a zoo name: a weights tag, path, URL, ``"auto"``, or
            None (random initialisation).
        resume: continue from the last checkpoint in ``out_dir``; False
            deletes old checkpoints and starts again.
        model_options: more keyword arguments for ``zoo.load``.
        tpu: TPU name or address for the ``tpu`` strategy.
        verbose: print the set-up, a progress bar and the result.
        **overrides: recipe fields (``total_steps=``, ``batch_size=``, ...).

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
                 verbose=True, **overrides):
        import keras
        import tensorflow as tf

        if keras.backend.backend() != "tensorflow":
            # The loop below is tf.distribute's (GradientTape, replica
            # contexts, tf.train.Checkpoint); no jax or torch engine yet.
            strategy_lib.check_backend(strategy)
            raise NotImplementedError(
                f"the Trainer (fine_tune, pretrain) runs on the TensorFlow "
                f"backend; under KERAS_BACKEND={keras.backend.backend()} "
                "use keras_vit.train.compile_for_finetune(model, ...) and "
                "model.fit (same recipe, one device), or set "
                "KERAS_BACKEND=tensorflow.")
        self.recipe = recipes_lib.get(recipe, **overrides)
        self.verbose = verbose
        self.strategy = strategy_lib.strategy(strategy, tpu=tpu)
        self.info = strategy_lib.describe(self.strategy)
        self.is_chief = self.info["is_chief"]
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
        replicas = self.strategy.num_replicas_in_sync
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
        if r.warmup_steps >= self.total_steps:
            raise ValueError(
                f"warmup_steps={r.warmup_steps} must be smaller than the "
                f"run's total_steps={self.total_steps}")
        self.precision = strategy_lib.precision_for(self.strategy,
                                                    r.precision)
        self.jit_compile = step_uses_xla(self.strategy, r.jit_compile,
                                         self.precision)

        # The resolution and dropout: the recipe's for a zoo name; a given
        # model keeps its own unless they were asked for explicitly.
        given = not isinstance(model, str) or model.endswith(".keras")
        keras.utils.set_random_seed(r.seed)
        with self.strategy.scope(), _dtype_policy(self.precision):
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
            self.optimizer.build(self.model.trainable_variables)
            # The loop sums gradients across replicas itself (it must clip
            # the summed gradient); the Keras optimizer would sum them a
            # second time. (tests/test_train.py checks that a two-replica
            # run equals a one-device run, which a double sum would break.)
            self.optimizer._all_reduce_sum_gradients = list
            self.ema = []
            if r.ema_decay is not None:
                self.ema = [
                    tf.Variable(v.value, trainable=False,
                                name=f"ema_{i}",
                                aggregation=tf.VariableAggregation
                                .ONLY_FIRST_REPLICA)
                    for i, v in enumerate(self.model.trainable_variables)]
            self.epoch_var = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="epoch",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.batch_var = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="batch_in_epoch",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.model_name = (model if isinstance(model, str)
                           else getattr(self.model, "zoo_name", None)
                           or self.model.name)

        self.out_dir = None if out_dir is None else os.path.abspath(
            os.fspath(out_dir))
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, ema=self.ema,
            epoch=self.epoch_var, batch_in_epoch=self.batch_var)
        self.manager = None
        self.resumed_from = None
        if self.out_dir is not None:
            self._open_run_dir(resume)
        self._train_step = None
        self._eval_steps = {}

    # ------------------------------------------------------------------
    # the objective: two hooks a subclass overrides to train something
    # other than a classifier (keras_vit.train.mpp does)

    def prepare_model(self, model):
        """The model :func:`build_model` made -> the model to train. Runs
        in the strategy scope under the run's dtype policy. Here: checks
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
        images were right (summed the same way). Runs inside the compiled
        step; ``seed`` is a stateless random seed (shape (2,), int64),
        distinct for every step, replica and micro-batch. Here: softmax
        cross-entropy with the recipe's label smoothing."""
        import tensorflow as tf

        r, num_classes = self.recipe, self.train.num_classes
        logits = tf.cast(self.model(images, training=True), tf.float32)
        target = tf.one_hot(labels, num_classes)
        if r.label_smoothing:
            target = (target * (1.0 - r.label_smoothing)
                      + r.label_smoothing / num_classes)
        per_example = tf.nn.softmax_cross_entropy_with_logits(target, logits)
        correct = tf.reduce_sum(tf.cast(
            tf.equal(tf.argmax(logits, -1), labels), tf.float32))
        return tf.reduce_sum(per_example), correct

    # ------------------------------------------------------------------
    # run directory and checkpoints

    @property
    def checkpoint_dir(self):
        return os.path.join(self.out_dir, "checkpoints")

    def _open_run_dir(self, resume):
        import tensorflow as tf

        self._resume = resume
        if self.is_chief:
            if not resume and os.path.isdir(self.checkpoint_dir):
                shutil.rmtree(self.checkpoint_dir)
                for name in ("history.jsonl", "metrics.json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(self.out_dir, name))
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            directory = self.checkpoint_dir
        else:
            # Every worker takes part in saving; only the chief's copy is
            # kept (TensorFlow's multi-worker checkpointing pattern).
            directory = os.path.join(
                self.out_dir, f".worker_{self.info['task_id']}")
            os.makedirs(directory, exist_ok=True)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, directory, max_to_keep=3)
        latest = tf.train.latest_checkpoint(self.checkpoint_dir) if (
            resume) else None
        if latest:
            try:
                self.checkpoint.restore(
                    latest).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as e:
                raise ValueError(
                    f"The checkpoint {latest!r} does not fit this model "
                    "(another architecture or number of classes); use "
                    "another out_dir, or resume=False (--restart) to start "
                    f"again. TensorFlow said: {str(e)[:300]}") from None
            self.resumed_from = int(self.optimizer.iterations.numpy())
            self._check_run_config()
            if self.is_chief:
                self._truncate_history(self.resumed_from)
        if self.is_chief:
            _write_json(os.path.join(self.out_dir, "run.json"),
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
            "precision": self.precision,
            "jit_compile": self.jit_compile,
            "micro_batch_size": self.micro,
            "accumulation_steps": self.accum,
        }

    def _check_run_config(self):
        path = os.path.join(self.out_dir, "run.json")
        if not os.path.isfile(path):
            return
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
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
        if self.manager is None:
            return None
        self.epoch_var.assign(epoch)
        self.batch_var.assign(batch_in_epoch)
        path = self.manager.save(
            checkpoint_number=int(self.optimizer.iterations.numpy()))
        if not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        return path

    # ------------------------------------------------------------------
    # input

    def _distributed(self, make):
        """``make(shard, per_replica_batch, local_replicas)`` -> dataset,
        run once per input pipeline (per worker)."""
        import tensorflow as tf

        def fn(ctx):
            local = (self.strategy.num_replicas_in_sync
                     // ctx.num_input_pipelines)
            return make((ctx.num_input_pipelines, ctx.input_pipeline_id),
                        local)

        return self.strategy.distribute_datasets_from_function(
            fn, options=tf.distribute.InputOptions(
                experimental_fetch_to_device=True))

    def _train_dataset(self, epoch, skip_steps):
        r = self.recipe
        remaining = self.steps_per_epoch - skip_steps

        def make(shard, local):
            per_step = self.per_replica * local  # this pipeline, one step
            return data_lib.dataset(
                self.train, self.image_size, self.per_replica, training=True,
                seed=r.seed, epoch=epoch, crop_area=r.crop_area, flip=r.flip,
                shard=shard, skip=skip_steps * per_step,
                take=remaining * per_step,
                raw_pixels=data_lib.takes_raw_pixels(self.model))

        return self._distributed(make)

    # ------------------------------------------------------------------
    # the compiled steps

    def _make_train_step(self):
        import tensorflow as tf

        strategy, model, opt = self.strategy, self.model, self.optimizer
        r = self.recipe
        variables = model.trainable_variables
        global_batch = float(r.batch_size)
        accum, micro, size = self.accum, self.micro, self.image_size
        replicas = strategy.num_replicas_in_sync
        reg_scale = 1.0 / (replicas * accum)
        ema, ema_decay = self.ema, r.ema_decay

        def seed_of(micro_index):
            # Stateless: a resumed run draws what the killed one would have.
            ctx = tf.distribute.get_replica_context()
            replica = tf.cast(ctx.replica_id_in_sync_group, tf.int64)
            counter = ((tf.cast(opt.iterations, tf.int64) * replicas
                        + replica) * accum
                       + tf.cast(micro_index, tf.int64))
            return tf.stack([tf.constant(r.seed, tf.int64), counter])

        def forward_backward(images, labels, seed):
            with tf.GradientTape() as tape:
                total, correct = self.compute_loss(images, labels, seed)
                # Summed over the replica's images and divided by the
                # global batch: the cross-replica sum is then the mean.
                loss = total / global_batch
                if model.losses:
                    loss += tf.add_n(model.losses) * reg_scale
            grads = tape.gradient(loss, variables)
            grads = [tf.zeros_like(v) if g is None else g
                     for g, v in zip(grads, variables)]
            return loss, correct, grads

        if self.jit_compile:
            # XLA for the heavy part only: all-reduce, clipping and the
            # optimizer update stay in the strategy's graph.
            forward_backward = tf.function(forward_backward,
                                           jit_compile=True)

        def grads_of(images, labels, micro_index=0):
            return forward_backward(images, labels, seed_of(micro_index))

        def replica_step(images, labels):
            if accum == 1:
                loss, correct, grads = grads_of(images, labels)
            else:
                # Gradient accumulation: the replica's batch in `accum`
                # micro-batches, one forward/backward pass at a time.
                images = tf.reshape(images, (accum, micro, size, size, 3))
                labels = tf.reshape(labels, (accum, micro))

                def body(i, loss, correct, grads):
                    l_, c_, g_ = grads_of(images[i], labels[i], i)
                    return (i + 1, loss + l_, correct + c_,
                            [a + b for a, b in zip(grads, g_)])

                _, loss, correct, grads = tf.while_loop(
                    lambda i, *_: i < accum, body,
                    (tf.constant(0), tf.constant(0.0), tf.constant(0.0),
                     [tf.zeros_like(v) for v in variables]))
            ctx = tf.distribute.get_replica_context()
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            if r.grad_clip_norm is not None:
                grads, norm = tf.clip_by_global_norm(grads, r.grad_clip_norm)
            else:
                norm = tf.linalg.global_norm(grads)
            opt.apply(grads, variables)
            if ema:
                # Polyak averaging with the usual warm-up of the decay, so
                # early steps are not dominated by the initial weights.
                t = tf.cast(opt.iterations, tf.float32)
                decay = tf.minimum(ema_decay, (1.0 + t) / (10.0 + t))
                for e, v in zip(ema, variables):
                    e.assign(decay * e + (1.0 - decay) * v.value)
            return loss, correct, norm

        sum_ = tf.distribute.ReduceOp.SUM

        @tf.function
        def train_step(iterator):
            images, labels = next(iterator)
            loss, correct, norm = strategy.run(replica_step,
                                               args=(images, labels))
            return (strategy.reduce(sum_, loss, axis=None),
                    strategy.reduce(sum_, correct, axis=None) / global_batch,
                    strategy.reduce(tf.distribute.ReduceOp.MEAN, norm,
                                    axis=None))

        return train_step

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
        return (
            f"{self.model_name} ({self.model.count_params():,} parameters) "
            f"at {self.image_size}x{self.image_size} on {self.train.name} "
            f"({self.train.num_examples} images, {self.train.num_classes} "
            f"classes): recipe {r.name}, {r.optimizer} lr {r.learning_rate:g} "
            f"{r.schedule} (warmup {r.warmup_steps}), {self.total_steps} "
            f"steps of {r.batch_size} images ({self.steps_per_epoch} per "
            f"epoch; {self.strategy.num_replicas_in_sync} replica(s) x "
            f"{self.per_replica}{accum}), strategy {self.info['name']}, "
            f"{self.precision}{', XLA' if self.jit_compile else ''}")

    def fit(self, stop_at_step=None):
        """Trains to the recipe's last step (from the last checkpoint if
        there is one), evaluates, saves, and returns a :class:`TrainResult`.

        ``stop_at_step`` ends the run early after that step, with a
        checkpoint (a later ``fit()`` continues it).
        """
        import tensorflow as tf
        from tqdm.auto import tqdm

        r = self.recipe
        t_start = time.perf_counter()
        self._memory_history = []
        step = int(self.optimizer.iterations.numpy())
        epoch = int(self.epoch_var.numpy())
        in_epoch = int(self.batch_var.numpy())
        start_step = step
        self._say(f"training {self.describe()}")
        if self.resumed_from is not None:
            self._say(f"resumed from step {self.resumed_from} (epoch "
                      f"{epoch}, batch {in_epoch} of {self.steps_per_epoch}) "
                      f"of {self.manager.latest_checkpoint}")
        if self._train_step is None:
            self._train_step = self._make_train_step()
        writer = None
        if self.out_dir is not None and self.is_chief:
            writer = tf.summary.create_file_writer(
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
                iterator = iter(self._train_dataset(epoch, in_epoch))
                while in_epoch < self.steps_per_epoch and step < end:
                    pending.append(self._train_step(iterator))
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
            self._load_ema()
            if self.eval is not None:
                metrics["eval_ema"] = self._evaluate_and_log(step, tag="ema")
        if self.out_dir is not None and self.is_chief:
            path = os.path.join(self.out_dir, "model.keras")
            with atomic.atomic_path(path) as tmp:
                self.model.save(tmp)
            metrics["model_path"] = path
            metrics["model_holds"] = "ema weights" if self.ema else "weights"
            _write_json(os.path.join(self.out_dir, "metrics.json"), metrics)
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
        import tensorflow as tf

        values = np.asarray([[float(t) for t in out] for out in pending])
        loss, acc, norm = (float(v) for v in values.mean(axis=0))
        lr = float(self.optimizer.learning_rate.numpy()) if hasattr(
            self.optimizer.learning_rate, "numpy") else float(
                self.optimizer.learning_rate)
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
            with open(self._history_path(), "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
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

    @contextlib.contextmanager
    def ema_weights(self):
        """Temporarily puts the EMA weights into the model."""
        if not self.ema:
            yield
            return
        import tensorflow as tf

        variables = self.model.trainable_variables
        backup = [tf.identity(v.value.read_value()) for v in variables]
        self._load_ema()
        try:
            yield
        finally:
            for v, b in zip(variables, backup):
                v.assign(b)

    def _load_ema(self):
        for v, e in zip(self.model.trainable_variables, self.ema):
            v.assign(e.read_value())

    def _evaluate_and_log(self, step, tag=None, raw=False):
        if tag is None and not raw and self.ema:
            with self.ema_weights():
                result = self.evaluate(self.eval)
        else:
            result = self.evaluate(self.eval)
        if self.out_dir is not None and self.is_chief:
            import tensorflow as tf

            name = "eval" if tag is None else f"eval_{tag}"
            writer = tf.summary.create_file_writer(
                os.path.join(self.out_dir, "logs", name))
            with writer.as_default(step=step):
                write_scalar("accuracy", result["accuracy"], step)
                write_scalar("loss", result["loss"], step)
            writer.close()
        return result

    def evaluate(self, data, batch_size=None):
        """Accuracy and loss of the model (as it is now) on ``data``."""
        source = data_lib.load_data(data, split="test", verbose=self.verbose)
        return evaluate(self.model, source, batch_size=batch_size or min(
            self.micro * self.strategy.num_replicas_in_sync, 256),
            strategy=self.strategy, eval_crop=self.recipe.eval_crop,
            verbose=self.verbose and self.is_chief,
            _cache=self._eval_steps)


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
    from keras_vit.backend import infer

    steps = -(-source.num_examples // batch_size)
    loss = correct = count = 0.0
    for images, labels, mask in data_lib.padded_eval_dataset(
            source, size, batch_size, num_batches=steps,
            eval_crop=eval_crop).as_numpy_iterator():
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
    import keras

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
    return _SmoothedSparseCE(label_smoothing)


def _smoothed_class():
    import keras
    from keras import ops

    @keras.saving.register_keras_serializable(package="keras_vit")
    class SmoothedSparseCE(keras.losses.Loss):
        def __init__(self, label_smoothing=0.0, name="smoothed_sparse_ce",
                     **kwargs):
            super().__init__(name=name, **kwargs)
            self.label_smoothing = float(label_smoothing)

        def call(self, y_true, y_pred):
            k = ops.shape(y_pred)[-1]
            target = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)),
                                          "int32"), k)
            return keras.losses.categorical_crossentropy(
                target, y_pred, from_logits=True,
                label_smoothing=self.label_smoothing)

        def get_config(self):
            return {**super().get_config(),
                    "label_smoothing": self.label_smoothing}

    return SmoothedSparseCE


def _SmoothedSparseCE(label_smoothing):  # noqa: N802 - a lazy class
    global _SMOOTHED
    if _SMOOTHED is None:
        _SMOOTHED = _smoothed_class()
    return _SMOOTHED(label_smoothing)


_SMOOTHED = None
