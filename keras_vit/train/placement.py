"""Where a run's variables and batches live, on each Keras backend; the
steps themselves are Keras' own (``model.fit``).

- TensorFlow: a ``tf.distribute`` strategy; the input is one pipeline per
  worker, each its shard of every epoch.
- jax: one device, ``keras.distribution.DataParallel``, or
  ``ModelParallel`` with ``model_parallel=k`` over a ``(devices / k, k)``
  mesh.
- torch: one device.

>>> import keras_vit.train as kt
>>> kt.placement.Placement("default").info["name"]
'default'
"""

from __future__ import annotations

import contextlib

from keras_vit.base.checks import check_int
from keras_vit.train import distribute as strategy_lib


class Placement:
    """The strategy or distribution a run trains under.

    Attributes:
        backend: the Keras backend's name.
        strategy: the ``tf.distribute.Strategy`` (TensorFlow), the
            ``keras.distribution.Distribution`` (jax; None on one device),
            or None (torch).
        replicas: how many copies of the model split each batch.
        info: name, class, replicas, workers, task and whether this process
            is the chief.
    """

    def __init__(self, name="auto", *, tpu=None, model_parallel=None):
        from keras_vit.runtime.backend import name as backend_name

        self.backend = backend_name()
        strategy_lib.check_backend(name)
        if self.backend not in ("tensorflow", "jax", "torch"):
            raise NotImplementedError(
                f"the Trainer runs on the tensorflow, jax and torch Keras "
                f"backends; received KERAS_BACKEND={self.backend}")
        if (model_parallel is not None and model_parallel != 1
                and self.backend != "jax"):
            way_out = ("the Trainer replicates the model with a "
                       "tf.distribute strategy (strategy='mirrored', "
                       "'multi_worker' or 'tpu'), or set KERAS_BACKEND=jax "
                       "to shard it." if self.backend == "tensorflow" else
                       "the Trainer runs on one device (strategy="
                       "'default'): set KERAS_BACKEND=jax to shard the "
                       "model.")
            raise strategy_lib.StrategyError(
                f"model_parallel={model_parallel} shards weights with "
                "keras.distribution.ModelParallel, which runs on the 'jax' "
                f"Keras backend; under {self.backend!r} {way_out}")
        self.model_parallel = model_parallel
        self._mesh = None
        self.strategy = None
        self.replicas = 1
        if self.backend == "tensorflow":
            self.strategy = strategy_lib.strategy(name, tpu=tpu)
            self.info = dict(strategy_lib.describe(self.strategy),
                             backend=self.backend)
            self.replicas = self.strategy.num_replicas_in_sync
            if self.info["workers"] > 1:
                from keras_vit.runtime import compat

                compat.repair_multi_worker_fit()
            return
        self.name = (self._resolve_jax(name.replace("-", "_"))
                     if self.backend == "jax" else "default")
        workers, index = 1, 0
        if self.backend == "jax":
            import jax

            workers, index = jax.process_count(), jax.process_index()
        self.info = {"name": self.name, "class": type(self).__name__,
                     "replicas": self.replicas, "workers": workers,
                     "task_type": "worker" if workers > 1 else None,
                     "task_id": index, "is_chief": index == 0,
                     "backend": self.backend}
        if self.name == "model_parallel":
            self.info["model_parallel"] = model_parallel

    def _resolve_jax(self, name):
        import jax
        import keras
        import numpy as np

        from keras_vit.train import layouts

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
            # The mesh now; the ModelParallel once the model exists.
            self._mesh = keras.distribution.DeviceMesh(
                shape, [layouts.BATCH_AXIS, layouts.MODEL_AXIS],
                devices=np.array(devices).reshape(shape))
            self.replicas = shape[0]
            return "model_parallel"
        if name == "auto":
            name = "data_parallel" if jax.device_count() > 1 else "default"
        if name == "data_parallel":
            devices = keras.distribution.list_devices()
            self.strategy = keras.distribution.DataParallel(devices=devices)
            self.replicas = len(devices)
        return name

    @property
    def is_chief(self):
        return self.info["is_chief"]

    def scope(self):
        """The context the model and optimizer are built and trained in."""
        if self.strategy is None:
            return contextlib.nullcontext()
        return self.strategy.scope()

    @property
    def on_tpu(self):
        """Whether the run trains on TPU cores."""
        if self.backend == "tensorflow":
            return self.info["name"] == "tpu"
        if self.backend == "jax":
            import jax

            return jax.devices()[0].platform == "tpu"
        return False

    def precision(self, requested):
        """The Keras dtype policy name the run trains in
        (:func:`~keras_vit.train.distribute.check_precision`)."""
        return strategy_lib.check_precision(requested, on_tpu=self.on_tpu)

    def uses_xla(self, requested, precision):
        """``jit_compile`` for ``model.compile``: on TensorFlow
        :func:`~keras_vit.train.distribute.step_uses_xla`; jax compiles
        every step; torch runs eagerly unless asked."""
        if self.backend == "tensorflow":
            return strategy_lib.step_uses_xla(self.strategy, requested,
                                              precision)
        if self.backend == "jax":
            return True
        return requested is True

    def place(self, model):
        """``model`` with its variables where the run keeps them: under a
        jax distribution rebuilt in its scope; else as it is."""
        if self.backend != "jax" or (self.strategy is None
                                     and self._mesh is None):
            return model
        import keras

        from keras_vit.train import layouts
        from keras_vit.zoo import rebuild

        if self._mesh is not None:
            self.strategy = keras.distribution.ModelParallel(
                layout_map=layouts.layout_map(model, self._mesh),
                batch_dim_name=layouts.BATCH_AXIS)
        with self.strategy.scope():
            return rebuild(model)

    def batches(self, make):
        """The training input for ``fit``: ``make(shard, local, per_batch)``
        returns one pipeline's ``tf.data.Dataset``, its shard ``(pipelines,
        index)`` of every epoch for ``local`` replicas, each batch holding
        ``per_batch`` replicas' images. Under a ``tf.distribute`` strategy
        with several replicas it runs once per worker, a batch per replica;
        elsewhere once, with every replica's images in one batch."""
        if self.backend != "tensorflow" or self.replicas == 1:
            return make((1, 0), self.replicas, self.replicas)
        import tensorflow as tf

        strategy = self.strategy

        def fn(ctx):
            local = strategy.num_replicas_in_sync // ctx.num_input_pipelines
            return make((ctx.num_input_pipelines, ctx.input_pipeline_id),
                        local, 1)

        return strategy.distribute_datasets_from_function(
            fn, options=tf.distribute.InputOptions(
                experimental_fetch_to_device=True))

    def evaluation_strategy(self):
        """What :func:`~keras_vit.train.evaluate` takes as ``strategy``."""
        return self.strategy if self.backend == "tensorflow" else "default"
