"""The Trainer's engines for the jax and torch Keras backends.

:class:`~keras_vit.train.Trainer` keeps the recipe, schedule, data
position, run directory and logs; an engine owns what differs between
backends: where variables live, how one optimizer step computes its
gradients, and how the state is checkpointed. TensorFlow's engine is
``tf.distribute`` (:mod:`keras_vit.train.engine_tf`); the two here share
everything but the gradient:

- jax: one ``jax.jit`` step over the model's variables as plain arrays
  (``keras.StatelessScope``, as ``model.stateless_call`` does, so a
  subclass's ``compute_loss`` may call ``self.model`` as usual) and
  ``optimizer.stateless_apply``; micro-batches run in a ``fori_loop`` inside
  the step (one micro-batch runs without a loop), and the state's buffers
  are donated to the step. ``strategy="data_parallel"`` (and ``"auto"``
  when jax sees more than one device) shards every batch over the devices
  with ``keras.distribution.DataParallel`` and replicates the variables; the
  compiled step then computes the whole batch's gradient, so no explicit
  all-reduce is needed. ``model_parallel=k`` uses
  ``keras.distribution.ModelParallel`` on a ``(devices / k, k)`` mesh: the
  weights, their optimizer slots and their EMA are split as
  :func:`keras_vit.train.layout_map` says, the batch over the first axis;
  XLA inserts the communication.
- torch: an eager step with autograd on one device (micro-batches add
  their gradients in ``.grad``).

Both feed the same tf.data pipeline as NumPy, clip the summed gradient at
the recipe's global norm, update the EMA with the TensorFlow engine's
warm-up formula, and checkpoint into one ``.npz`` per step
(:mod:`keras_vit.train.checkpoints`).
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import ops

from keras_vit.base.checks import check_int
from keras_vit.train import checkpoints as ckpt_lib
from keras_vit.data.normalization import pipeline_options
from keras_vit.train.data.pipeline import dataset
from keras_vit.train import evaluation
from keras_vit.train.distribute import check_backend, check_precision


def clip_by_global_norm(grads, clip_norm):
    """``(grads scaled to a global norm of at most clip_norm, the norm
    before clipping)``, as ``tf.clip_by_global_norm``; ``clip_norm`` None
    only measures.

    >>> g, n = clip_by_global_norm([np.array([3.0]), np.array([4.0])], 1.0)
    >>> [round(float(x[0]), 6) for x in g], float(n)
    ([0.6, 0.8], 5.0)
    """
    norm = ops.sqrt(sum(ops.sum(ops.square(ops.cast(g, "float32")))
                        for g in grads))
    if clip_norm is None:
        return list(grads), norm
    scale = clip_norm / ops.maximum(norm, clip_norm)
    # ops.multiply, not *: NumPy gradients times a torch tensor fail.
    return [ops.multiply(g, ops.cast(scale, g.dtype)) for g in grads], norm


def ema_decay_at(iterations, cap):
    """The EMA decay after ``iterations`` optimizer steps: the usual
    warm-up ``(1 + t) / (10 + t)``, at most ``cap`` (early steps are not
    dominated by the initial weights).

    >>> round(float(ema_decay_at(1, 0.9999)), 6), float(ema_decay_at(1e6, 0.5))
    (0.181818, 0.5)
    """
    t = ops.cast(iterations, "float32")
    return ops.minimum(cap, (1.0 + t) / (10.0 + t))


@contextlib.contextmanager
def swapped_in_ema(engine):
    """A context in which ``engine``'s model holds its EMA weights (the
    trained weights come back at the end). Every engine's ``ema_weights``."""
    if not engine.ema:
        yield
        return
    engine.sync()
    variables = engine.model.trainable_variables
    backup = [ops.convert_to_numpy(v.value) for v in variables]
    engine.load_ema()
    try:
        yield
    finally:
        for v, b in zip(variables, backup):
            v.assign(b)
        engine._invalidate()


def _fresh_variables(values, prefix):
    return [keras.Variable(ops.convert_to_numpy(v), trainable=False,
                           name=f"{prefix}_{i}")
            for i, v in enumerate(values)]


class KerasEngine:
    """What the jax and torch engines share; see the module docstring."""

    backend = None

    def __init__(self, name="auto"):
        check_backend(name)
        self.distribution = None
        self.replicas = 1
        self.name = self._resolve(name)
        self.ema = []
        self.position = (0, 0)  # epoch, batch in the epoch
        self.latest_checkpoint = None
        self.directory = None
        # The run's settings (JSON) written into every checkpoint, and those
        # found in the one restored (None: written before they were kept).
        self.run_settings = None
        self.recorded_settings = None

    def _resolve(self, name):
        return "default"

    @property
    def strategy(self):
        """The ``keras.distribution.Distribution``, or None (one device)."""
        return self.distribution

    @property
    def info(self):
        return {"name": self.name, "class": type(self).__name__,
                "replicas": self.replicas, "workers": 1, "task_type": None,
                "task_id": 0, "is_chief": True, "backend": self.backend}

    def scope(self):
        return contextlib.nullcontext()

    def precision(self, requested):
        return check_precision(requested, on_tpu=False)

    def uses_xla(self, requested, precision):
        return False

    def setup(self, trainer):
        """Called in :meth:`scope` once the model and optimizer are built."""
        self.trainer = trainer
        self.model, self.optimizer = trainer.model, trainer.optimizer
        if trainer.recipe.ema_decay is not None:
            self.ema = _fresh_variables(
                [v.value for v in self.model.trainable_variables], "ema")

    # ---------------------------------------------------------------- state

    def step(self):
        return int(ops.convert_to_numpy(self.optimizer.iterations))

    def sync(self):
        """Makes the Keras variables current (the jax step works on
        copies)."""

    def _groups(self):
        self.sync()
        groups = {"model": self.model.variables,
                  "optimizer": self.optimizer.variables}
        if self.ema:
            groups["ema"] = self.ema
        return groups

    def open_checkpoints(self, out_dir, directory, resume):
        """Saves into ``directory`` from now on and, with ``resume``,
        restores the newest checkpoint there; returns its step or None."""
        self.directory = directory
        return self.restore(directory) if resume else None

    def save(self, epoch, batch_in_epoch):
        self.position = (epoch, batch_in_epoch)  # a later fit() goes on
        if self.directory is None:
            return None
        arrays = {name: [ops.convert_to_numpy(v) for v in values]
                  for name, values in self._groups().items()}
        self.latest_checkpoint = ckpt_lib.save(
            self.directory, self.step(), arrays,
            {"epoch": epoch, "batch_in_epoch": batch_in_epoch},
            settings=self.run_settings)
        return self.latest_checkpoint

    def restore(self, directory):
        """Loads the newest checkpoint in ``directory`` (validated whole
        first); returns its step, or None when there is none."""
        import os

        found = ckpt_lib.latest(directory)
        if found is None:
            if os.path.isfile(os.path.join(directory, "checkpoint")):
                raise ValueError(
                    f"The run in {os.path.dirname(directory)!r} was "
                    "checkpointed by the TensorFlow backend (tf.train."
                    "Checkpoint); resume it with KERAS_BACKEND=tensorflow, "
                    "or start again with resume=False (--restart)")
            return None
        step, path = found
        groups = self._groups()
        expected = {name: [(tuple(v.shape),
                            ops.convert_to_numpy(v.value).dtype)
                           for v in values]
                    for name, values in groups.items()}
        arrays, meta = ckpt_lib.load(path, expected)
        for name, values in groups.items():
            for variable, value in zip(values, arrays[name]):
                variable.assign(value)
        self._invalidate()
        self.position = (meta["epoch"], meta["batch_in_epoch"])
        self.recorded_settings = meta["settings"]
        self.latest_checkpoint = path
        return step

    def _invalidate(self):
        """The Keras variables changed under the engine."""

    # ---------------------------------------------------------------- EMA

    def load_ema(self):
        self.sync()
        for v, e in zip(self.model.trainable_variables, self.ema):
            v.assign(e.value)
        self._invalidate()

    def ema_weights(self):
        return swapped_in_ema(self)

    # ---------------------------------------------------------------- input

    def batches(self, epoch, skip_steps):
        """This epoch's batches from step ``skip_steps`` on, as NumPy
        ``(images, labels)`` split into ``(accum, micro * replicas, ...)``."""
        t, r = self.trainer, self.trainer.recipe
        batch = r.batch_size
        remaining = t.steps_per_epoch - skip_steps
        ds = dataset(
            t.train, t.image_size, batch, training=True, seed=r.seed,
            epoch=epoch, crop_area=r.crop_area, flip=r.flip,
            skip=skip_steps * batch, take=remaining * batch,
            **pipeline_options(self.model))
        accum = t.accum
        for images, labels in ds.as_numpy_iterator():
            yield (images.reshape((accum, batch // accum) + images.shape[1:]),
                   labels.reshape((accum, batch // accum)).astype("int32"))

    def evaluate(self, data, batch_size, **kwargs):
        self.sync()
        return evaluation.evaluate(self.model, data, batch_size=batch_size,
                                   strategy="default", **kwargs)

    def _seed(self, step, micro):
        accum = self.trainer.accum
        return np.asarray([self.trainer.recipe.seed, step * accum + micro],
                          "int32")


class TorchEngine(KerasEngine):
    """Eager autograd on one device."""

    backend = "torch"

    def train_step(self, iterator, step):
        import torch

        t, r = self.trainer, self.trainer.recipe
        images, labels = next(iterator)
        variables = self.model.trainable_variables
        for v in variables:
            v.value.grad = None
        loss_sum = correct_sum = 0.0
        for i in range(t.accum):
            seed = self._seed(step, i)
            # Keras' torch dropout draws from torch's global generator
            # (for layers built without a seed), which no checkpoint holds:
            # seeding it from the run's seed and step makes the masks of a
            # resumed run those of the killed one.
            torch.manual_seed(int(seed[0]) * 1_000_003 + int(seed[1]))
            total, correct = t.compute_loss(
                ops.convert_to_tensor(images[i]),
                ops.convert_to_tensor(labels[i]), seed)
            loss = total / float(r.batch_size)
            if self.model.losses:
                loss = loss + sum(self.model.losses) / t.accum
            loss.backward()  # adds into .grad: the accumulation
            loss_sum += float(loss.detach())
            correct_sum += float(correct.detach())
        with torch.no_grad():
            grads = [torch.zeros_like(v.value) if v.value.grad is None
                     else v.value.grad for v in variables]
            grads, norm = clip_by_global_norm(grads, r.grad_clip_norm)
            self.optimizer.apply(grads, variables)
            for v in variables:
                v.value.grad = None
            if self.ema:
                decay = ema_decay_at(step + 1, r.ema_decay)
                for e, v in zip(self.ema, variables):
                    e.assign(decay * e.value + (1.0 - decay) * v.value)
        return loss_sum, correct_sum / r.batch_size, float(norm)


class JaxEngine(KerasEngine):
    """One ``jax.jit`` step; one device, ``DataParallel`` or
    ``ModelParallel``."""

    backend = "jax"

    def __init__(self, name="auto", model_parallel=None):
        self.model_parallel = model_parallel
        super().__init__(name)
        self._state = None
        self._step_fn = None
        self._layouts = None

    def _resolve(self, name):
        import jax

        from keras_vit.train import layouts

        name = name.replace("-", "_")
        k = self.model_parallel
        if k is not None and k != 1:
            check_int("model_parallel", k, low=1)
            if name != "auto":
                raise ValueError(
                    f"model_parallel={k} shards the weights over a "
                    "(devices / model_parallel, model_parallel) mesh with "
                    "keras.distribution.ModelParallel, which also splits "
                    "the batch; it replaces strategy="
                    f"{name!r}: leave strategy='auto'")
            # The mesh now (the Trainer sizes the batch by its replicas);
            # the ModelParallel in setup(), from the built model's
            # variables (layouts.layout_map checks that k divides them).
            devices = keras.distribution.list_devices()
            if len(devices) % k:
                near = min((d for d in range(1, len(devices) + 1)
                            if len(devices) % d == 0),
                           key=lambda d: (abs(d - k), d))
                raise ValueError(
                    f"model_parallel={k} does not divide the "
                    f"{len(devices)} devices jax sees; the nearest that "
                    f"does is {near}")
            shape = (len(devices) // k, k)
            self._mesh = keras.distribution.DeviceMesh(
                shape, [layouts.BATCH_AXIS, layouts.MODEL_AXIS],
                devices=np.array(devices).reshape(shape))
            self.replicas = shape[0]
            return "model_parallel"
        if name == "auto":
            name = "data_parallel" if jax.device_count() > 1 else "default"
        if name == "data_parallel":
            devices = keras.distribution.list_devices()
            self.distribution = keras.distribution.DataParallel(
                devices=devices)
            self.replicas = len(devices)
        return name

    @property
    def info(self):
        info = super().info
        if self.name == "model_parallel":
            info["model_parallel"] = self.model_parallel
        return info

    def scope(self):
        if self.distribution is None:
            return contextlib.nullcontext()
        return self.distribution.scope()

    def setup(self, trainer):
        super().setup(trainer)
        if self.name == "model_parallel":
            from keras_vit.train import layouts

            # Built on one device, the variables are placed by _pull.
            self.distribution = keras.distribution.ModelParallel(
                layout_map=layouts.layout_map(self.model, self._mesh),
                batch_dim_name=layouts.BATCH_AXIS)

    def uses_xla(self, requested, precision):
        return True  # jax compiles every step

    # The step works on arrays: (trainable, non-trainable, optimizer, ema).

    def _state_layouts(self):
        """The ``TensorLayout`` of every array of the state (all
        replicated under DataParallel; under ModelParallel a weight's, its
        optimizer slots' and its EMA's from the layout map)."""
        if self._layouts is None:
            d = self.distribution
            m, opt = self.model, self.optimizer
            trainable = [d.get_variable_layout(v)
                         for v in m.trainable_variables]
            by_name = {v.path.replace("/", "_"): (tuple(v.shape), layout)
                       for v, layout in zip(m.trainable_variables,
                                            trainable)}

            def slot(v):
                # Keras names a slot f"{reference path with _}_{slot}".
                best = None
                for prefix, (shape, layout) in by_name.items():
                    if (v.name.startswith(prefix + "_")
                            and tuple(v.shape) == shape
                            and (best is None or len(prefix) > best[0])):
                        best = (len(prefix), layout)
                return (best[1] if best is not None
                        else d.get_variable_layout(v))

            self._layouts = (
                trainable,
                [d.get_variable_layout(v)
                 for v in m.non_trainable_variables],
                [slot(v) for v in opt.variables],
                list(trainable) if self.ema else [])
        return self._layouts

    def _shardings(self):
        return keras.tree.map_structure(
            lambda layout: layout.backend_layout, self._state_layouts())

    def _place_batch(self, tree, batch_axis):
        """Shards ``tree`` along ``batch_axis`` over the mesh's batch
        axis; a no-op on one device."""
        if self.distribution is None:
            return tree
        mesh = self.distribution.device_mesh

        def put(x):
            axes = [None] * np.ndim(x)
            axes[batch_axis] = mesh.axis_names[0]
            layout = keras.distribution.TensorLayout(axes, mesh)
            return keras.distribution.distribute_tensor(x, layout)

        return keras.tree.map_structure(put, tree)

    def _pull(self):
        """The state, copied from the Keras variables (the step donates
        its buffers) and placed on the devices."""
        if self._state is None:
            import jax

            m = self.model
            state = ([v.value for v in m.trainable_variables],
                     [v.value for v in m.non_trainable_variables],
                     [v.value for v in self.optimizer.variables],
                     [e.value for e in self.ema])
            # One batched transfer (a copy per array costs a dispatch each).
            where = (jax.devices()[0] if self.distribution is None
                     else self._shardings())
            self._state = jax.device_put(state, where, may_alias=False)
        return self._state

    def sync(self):
        """Hands the step's arrays to the Keras variables; the next step
        starts from copies of them (it donates its input buffers)."""
        if self._state is None:
            return
        m = self.model
        groups = (m.trainable_variables, m.non_trainable_variables,
                  self.optimizer.variables, self.ema)
        for variables, values in zip(groups, self._state):
            for v, value in zip(variables, values):
                v.assign(value)
        self._state = None

    def _invalidate(self):
        self._state = None

    def step(self):
        if self._state is not None:
            i = self.optimizer.variables.index(self.optimizer.iterations)
            return int(np.asarray(self._state[2][i]))
        return super().step()

    def _make_step(self):
        import jax
        import jax.numpy as jnp

        t, r = self.trainer, self.trainer.recipe
        model, optimizer = self.model, self.optimizer
        trainable = model.trainable_variables
        non_trainable = model.non_trainable_variables
        accum, global_batch = t.accum, float(r.batch_size)
        shardings = (None if self.distribution is None
                     else self._shardings())

        def loss_fn(tv, ntv, images, labels, seed):
            mapping = list(zip(trainable, tv)) + list(zip(non_trainable, ntv))
            with keras.StatelessScope(state_mapping=mapping,
                                      collect_losses=True) as scope:
                total, correct = t.compute_loss(images, labels, seed)
                loss = total / global_batch
                if scope.losses:
                    loss = loss + sum(scope.losses) / accum
            new_ntv = [scope.get_current_value(v) for v in non_trainable]
            new_ntv = [old if new is None else new
                       for old, new in zip(ntv, new_ntv)]
            return loss, (correct, new_ntv)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step_fn(state, images, labels, step):
            tv, ntv, ov, ema = state

            def micro(i, carry):
                ntv, grads, loss, correct = carry
                seed = jnp.stack([jnp.int32(r.seed), step * accum + i])
                (l_, (c_, ntv)), g_ = grad_fn(tv, ntv, images[i], labels[i],
                                              seed)
                grads = [a + b for a, b in zip(grads, g_)]
                return ntv, grads, loss + l_, correct + c_

            if accum == 1:
                # No loop around one micro-batch: XLA optimises a plain
                # forward and backward better than a while-loop body.
                seed = jnp.stack([jnp.int32(r.seed), step])
                (loss, (correct, ntv)), grads = grad_fn(
                    tv, ntv, images[0], labels[0], seed)
            else:
                zeros = [jnp.zeros_like(v) for v in tv]
                ntv, grads, loss, correct = jax.lax.fori_loop(
                    0, accum, micro, (ntv, zeros, jnp.float32(0.0),
                                      jnp.float32(0.0)))
            grads, norm = clip_by_global_norm(grads, r.grad_clip_norm)
            tv, ov = optimizer.stateless_apply(ov, grads, tv)
            if ema:
                decay = ema_decay_at(step + 1, r.ema_decay)
                ema = [decay * e + (1.0 - decay) * v
                       for e, v in zip(ema, tv)]
            state = (tv, ntv, ov, ema)
            if shardings is not None:
                # Each array keeps its layout from step to step (one
                # compilation; XLA would otherwise pick the outputs').
                state = jax.lax.with_sharding_constraint(state, shardings)
            return state, (loss, correct / global_batch, norm)

        # The state's buffers are donated: updated in place, not copied.
        return jax.jit(step_fn, donate_argnums=0)

    def train_step(self, iterator, step):
        if self._step_fn is None:
            self._step_fn = self._make_step()
        images, labels = self._place_batch(next(iterator), batch_axis=1)
        self._state, out = self._step_fn(self._pull(), images, labels,
                                         np.int32(step))
        return out
