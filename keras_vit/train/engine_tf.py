"""The Trainer's TensorFlow engine: one custom loop for every
``tf.distribute`` strategy.

Every strategy (one device, several GPUs, a TPU, several workers) runs the
same compiled step (built in :mod:`keras_vit.train.engine_tf_step`):
``strategy.run`` over batches split per replica,
gradients summed across replicas, clipped at a global norm, applied, and an
exponential moving average of the weights updated. Keras' ``model.fit`` is
not used here because it fails under ``MultiWorkerMirroredStrategy`` with
Keras 3 (keras issue 20585). Checkpoints are ``tf.train.Checkpoint`` files
kept by a ``CheckpointManager`` (every worker saves; the chief's copy is
kept). The jax and torch engines are in :mod:`keras_vit.train.engine_keras`.
"""

from __future__ import annotations

import os
import shutil

from keras_vit.runtime import compat
from keras_vit.data.normalization import pipeline_options
from keras_vit.train.data.pipeline import dataset
from keras_vit.train import evaluation
from keras_vit.train.distribute import describe, precision_for
from keras_vit.train.distribute import strategy as make_strategy
from keras_vit.train.engine_tf_step import make_train_step, step_uses_xla


class TFEngine:
    """Variables, step and checkpoints under a ``tf.distribute`` strategy."""

    backend = "tensorflow"

    def __init__(self, name="auto", *, tpu=None):
        self.strategy = make_strategy(name, tpu=tpu)
        self.info = dict(describe(self.strategy), backend=self.backend)
        self.replicas = self.strategy.num_replicas_in_sync
        self.manager = None
        self.ema = []
        # The run's settings (JSON) written into every checkpoint, and those
        # found in the one restored (None: written before they were kept).
        self.run_settings = None
        self.recorded_settings = None

    def scope(self):
        return self.strategy.scope()

    def precision(self, requested):
        return precision_for(self.strategy, requested)

    def uses_xla(self, requested, precision):
        return step_uses_xla(self.strategy, requested, precision)

    def setup(self, trainer):
        """Called in :meth:`scope` once the model and optimizer are built."""
        import tensorflow as tf

        self.trainer = trainer
        self.model, self.optimizer = trainer.model, trainer.optimizer
        # The loop sums gradients across replicas itself (it must clip
        # the summed gradient); the Keras optimizer would sum them a
        # second time. (tests/train/test_train.py checks that a two-replica
        # run equals a one-device run, which a double sum would break.)
        compat.skip_optimizer_gradient_sum(self.optimizer)
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        if trainer.recipe.ema_decay is not None:
            self.ema = [
                tf.Variable(v.value, trainable=False, name=f"ema_{i}",
                            aggregation=first)
                for i, v in enumerate(self.model.trainable_variables)]
        self.epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="epoch", aggregation=first)
        self.batch_var = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="batch_in_epoch", aggregation=first)
        # The seed generators' states (dropout) are listed too: the model's
        # own tracking leaves them out, and a resumed run must draw the
        # masks the killed one would have.
        seeds = [v for v in self.model.non_trainable_variables
                 if "seed_generator" in v.path]
        self._components = dict(
            model=self.model, optimizer=self.optimizer, ema=self.ema,
            epoch=self.epoch_var, batch_in_epoch=self.batch_var,
            **({"seed_states": seeds} if seeds else {}))
        self.checkpoint = tf.train.Checkpoint(**self._components)
        self._train_step = None
        self._eval_steps = {}

    # ---------------------------------------------------------------- state

    def step(self):
        return int(self.optimizer.iterations.numpy())

    @property
    def position(self):
        return int(self.epoch_var.numpy()), int(self.batch_var.numpy())

    @property
    def latest_checkpoint(self):
        return None if self.manager is None else self.manager.latest_checkpoint

    def sync(self):
        """The variables are always current under TensorFlow."""

    def open_checkpoints(self, out_dir, directory, resume):
        """Sets up saving into ``directory`` and, with ``resume``, restores
        the newest checkpoint there; returns its step or None."""
        import tensorflow as tf

        if not self.info["is_chief"]:
            # Every worker takes part in saving; only the chief's copy is
            # kept (TensorFlow's multi-worker checkpointing pattern).
            directory_ = os.path.join(out_dir,
                                      f".worker_{self.info['task_id']}")
            os.makedirs(directory_, exist_ok=True)
        else:
            directory_ = directory
        # The settings ride in the checkpoint itself, as a string variable
        # on the CPU (no accelerator holds strings).
        with tf.device("/cpu:0"):
            self.settings_var = tf.Variable(
                self.run_settings or "", dtype=tf.string, trainable=False,
                name="run_settings")
        self.checkpoint = tf.train.Checkpoint(
            **self._components, run_settings=self.settings_var)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, directory_, max_to_keep=3)
        latest = tf.train.latest_checkpoint(directory) if resume else None
        if not latest:
            if resume and os.path.isdir(directory) and any(
                    n.startswith("ckpt-") and n.endswith(".npz")
                    for n in os.listdir(directory)):
                raise ValueError(
                    f"The run in {out_dir!r} was checkpointed by the jax or "
                    "torch backend (.npz); resume it under that "
                    "KERAS_BACKEND, or start again with resume=False "
                    "(--restart)")
            return None
        recorded = any(name.startswith("run_settings/")
                       for name, _ in tf.train.list_variables(latest))
        # A checkpoint from before the settings were recorded restores
        # without them.
        target = (self.checkpoint if recorded
                  else tf.train.Checkpoint(**self._components))
        try:
            target.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise ValueError(
                f"The checkpoint {latest!r} does not fit this model "
                "(another architecture or number of classes); use "
                "another out_dir, or resume=False (--restart) to start "
                f"again. TensorFlow said: {str(e)[:300]}") from None
        self.recorded_settings = (
            self.settings_var.numpy().decode("utf-8") if recorded else None)
        # From here on, checkpoints record the settings given now.
        self.settings_var.assign(self.run_settings or "")
        return self.step()

    def save(self, epoch, batch_in_epoch):
        """Saves model, optimizer, EMA, step and data position (all
        workers must call it; only the chief's copy is kept)."""
        self.epoch_var.assign(epoch)  # a later fit() goes on from here
        self.batch_var.assign(batch_in_epoch)
        if self.manager is None:
            return None
        path = self.manager.save(checkpoint_number=self.step())
        if not self.info["is_chief"]:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        return path

    # ---------------------------------------------------------------- EMA

    def ema_weights(self):
        """A context in which the model holds the EMA weights."""
        from keras_vit.train.engine_keras import swapped_in_ema

        return swapped_in_ema(self)

    def _invalidate(self):
        """The variables are the step's own under TensorFlow."""

    def load_ema(self):
        for v, e in zip(self.model.trainable_variables, self.ema):
            v.assign(e.read_value())

    # ---------------------------------------------------------------- input

    def _distributed(self, make):
        """``make(shard, local_replicas)`` -> dataset, run once per input
        pipeline (per worker)."""
        import tensorflow as tf

        def fn(ctx):
            local = (self.strategy.num_replicas_in_sync
                     // ctx.num_input_pipelines)
            return make((ctx.num_input_pipelines, ctx.input_pipeline_id),
                        local)

        return self.strategy.distribute_datasets_from_function(
            fn, options=tf.distribute.InputOptions(
                experimental_fetch_to_device=True))

    def batches(self, epoch, skip_steps):
        """This epoch's distributed batches from step ``skip_steps`` on."""
        t, r = self.trainer, self.trainer.recipe
        remaining = t.steps_per_epoch - skip_steps

        def make(shard, local):
            per_step = t.per_replica * local  # this pipeline, one step
            return dataset(
                t.train, t.image_size, t.per_replica, training=True,
                seed=r.seed, epoch=epoch, crop_area=r.crop_area, flip=r.flip,
                shard=shard, skip=skip_steps * per_step,
                take=remaining * per_step,
                **pipeline_options(self.model))

        return self._distributed(make)

    def evaluate(self, data, batch_size, **kwargs):
        return evaluation.evaluate(
            self.model, data, batch_size=batch_size, strategy=self.strategy,
            _cache=self._eval_steps, **kwargs)

    # ---------------------------------------------------------------- step

    def train_step(self, iterator, step):
        """One optimizer step on the next batch of ``iterator``."""
        if self._train_step is None:
            self._train_step = make_train_step(self)
        return self._train_step(iterator)
