"""Every use keras-vit makes of another project's private API, one function
each, so that an upgrade that removes one fails here, loudly and by name.

Each wrapper raises :class:`PrivateAPIError` naming the missing private name
and the installed version.

>>> import keras
>>> inputs = keras.Input((2,))
>>> model = keras.Model(inputs, keras.layers.Dense(1, name="head")(inputs))
>>> [layer.name for layer in flatten_layers(model, include_self=False)][-1]
'head'
"""

from __future__ import annotations

import importlib.metadata

from keras_vit.base.errors import KerasVitError


class PrivateAPIError(KerasVitError, RuntimeError):
    """A private API keras-vit relies on is gone from an installed package."""


def _missing(api, package, purpose):
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    return PrivateAPIError(
        f"the private API {api} is gone from {package} {version}; keras-vit "
        f"uses it to {purpose}. Install the {package} version keras-vit "
        "was tested with, or update keras_vit/runtime/compat.py.")


def _require(obj, attr, api, package, purpose):
    if not hasattr(obj, attr):
        raise _missing(api, package, purpose)
    return getattr(obj, attr)


def flatten_layers(model, include_self=True):
    """All layers of ``model``, nested ones included
    (Keras ``Layer._flatten_layers``)."""
    fn = _require(model, "_flatten_layers", "Layer._flatten_layers", "keras",
                  "list the layers nested in a model")
    return list(fn(include_self=include_self))


def current_remat_mode():
    """The mode of the ``keras.RematScope`` around this code (``"full"``,
    ``"activations"``, ...) or None outside one
    (``keras.src.backend.common.remat.get_current_remat_mode``)."""
    purpose = "tell a model built inside keras.RematScope"
    try:
        from keras.src.backend.common import remat
    except ImportError:
        raise _missing("keras.src.backend.common.remat", "keras",
                       purpose) from None
    get = _require(remat, "get_current_remat_mode",
                   "remat.get_current_remat_mode", "keras", purpose)
    scope = get()
    return None if scope is None else getattr(scope, "mode", str(scope))


def stateless_scope():
    """The ``keras.StatelessScope`` this code runs in, or None
    (``keras.src.backend.common.stateless_scope.get_stateless_scope``)."""
    purpose = "keep dropout masks in a rematerialised block"
    try:
        from keras.src.backend.common import stateless_scope as module
    except ImportError:
        raise _missing("keras.src.backend.common.stateless_scope", "keras",
                       purpose) from None
    return _require(module, "get_stateless_scope",
                    "stateless_scope.get_stateless_scope", "keras",
                    purpose)()


def run_through_graph(functional, inputs, call_fn):
    """Calls the layers of the Functional model ``functional`` on ``inputs``
    through ``call_fn(layer, *args, **kwargs)``, which may change what each
    returns (Keras ``Functional._run_through_graph``)."""
    fn = _require(functional, "_run_through_graph",
                  "Functional._run_through_graph", "keras",
                  "rewire a ViT for masked patch prediction")
    return fn(inputs, operation_fn=lambda op: op, call_fn=call_fn)


def repair_multi_worker_fit():
    """Makes Keras 3's ``model.fit`` run under a multi-worker
    ``tf.distribute.MultiWorkerMirroredStrategy``, where it fails
    converting a ``PerReplica`` value to a tensor.

    Keras fails in two reductions there: the symbolic build averages the
    first batch across replicas (the build now takes the first local
    replica's batch: it needs shapes, not values), and every step averages
    scalar logs with ``axis=0`` (now without an axis). Other strategies
    keep Keras' code. Idempotent; returns True."""
    api = "keras.src.backend.tensorflow.trainer"
    purpose = "run model.fit under MultiWorkerMirroredStrategy"
    try:
        from keras.src.backend.tensorflow import trainer
    except ImportError as e:
        raise _missing(api, "keras", purpose) from e

    def need(owner, attr, where=api):
        return _require(owner, attr, f"{where}.{attr}", "keras", purpose)

    cls = need(trainer, "TensorFlowTrainer")
    reduce_fn = need(trainer, "reduce_per_replica")
    build = need(cls, "_maybe_symbolic_build", api + ".TensorFlowTrainer")
    multi = need(trainer, "_collective_all_reduce_multi_worker")
    if getattr(reduce_fn, "_keras_vit_repair", None) is not None:
        return True
    import tensorflow as tf
    from keras import tree

    def first_local(strategy, value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not multi(strategy):
            return reduce_fn(values, strategy, reduction)

        def mean(value):
            # A worker with one replica holds a plain tensor: still reduced
            # over the workers, as Keras does.
            local = first_local(strategy, value)
            axis = 0 if local.shape.rank else None
            return strategy.reduce("MEAN", value, axis=axis)

        return tree.map_structure(mean, values)

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or not multi(strategy) or iterator is None:
            return build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            data_batch = tree.map_structure(
                lambda v: first_local(strategy, v), next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    # The repair keeps Keras' own function, for multi_worker_fit_is_broken.
    reduce_per_replica._keras_vit_repair = reduce_fn
    trainer.reduce_per_replica = reduce_per_replica
    cls._maybe_symbolic_build = maybe_symbolic_build
    return True


def sum_gradients_before_the_optimizer(optimizer):
    """Makes a Keras ``optimizer`` under a ``tf.distribute`` strategy with
    several replicas clip and accumulate the gradient summed over the
    replicas, as on one device.

    Keras sums the replicas' gradients after ``global_clipnorm`` clipped
    each replica's own, and its accumulation fails there (a ``merge_call``
    inside a ``cond``). Here ``apply`` sums across replicas first (the loss
    is already divided by the replicas) and skips BaseOptimizer's private
    ``_all_reduce_sum_gradients``; with accumulation, Keras' update runs
    once in the cross-replica context. With one replica nothing changes.
    Returns ``optimizer``.
    """
    _require(optimizer, "_all_reduce_sum_gradients",
             "TFOptimizer._all_reduce_sum_gradients", "keras",
             "sum gradients across replicas once, before clipping")
    import tensorflow as tf

    interim = tf.__internal__.distribute.interim
    _require(interim, "maybe_merge_call",
             "tf.__internal__.distribute.interim.maybe_merge_call",
             "tensorflow", "accumulate gradients under tf.distribute")
    keras_apply = optimizer.apply

    def apply(grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return keras_apply(grads, trainable_variables)
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [grads[i] for i in present])
        if not optimizer.gradient_accumulation_steps:
            for i, value in zip(present, summed):
                grads[i] = value
            return keras_apply(grads, trainable_variables)

        def update(distribution, *values):
            # Cross-replica: Keras' cond runs once, each update it makes
            # reaches every replica's copy (a merge_call in the cond, as
            # Keras makes it from the replica context, fails).
            for i, value in zip(present, values):
                grads[i] = distribution.experimental_local_results(value)[0]
            keras_merge = interim.maybe_merge_call
            interim.maybe_merge_call = (
                lambda fn, strategy, *args, **kwargs:
                fn(strategy, *args, **kwargs))
            try:
                return keras_apply(grads, trainable_variables)
            finally:
                interim.maybe_merge_call = keras_merge

        return context.merge_call(update, args=tuple(summed))

    optimizer.apply = apply
    optimizer._all_reduce_sum_gradients = list
    return optimizer


def multi_worker_fit_is_broken(strategy):
    """Whether Keras' own per-step reduction still fails under the
    multi-worker ``strategy`` (run inside it, on each worker): True while
    Keras averages a scalar with ``axis=0`` there, so
    :func:`repair_multi_worker_fit` is still needed."""
    from keras.src.backend.tensorflow import trainer
    import tensorflow as tf

    current = trainer.reduce_per_replica
    original = getattr(current, "_keras_vit_repair", None) or current
    value = strategy.run(lambda: tf.constant(1.0))
    try:
        original(value, strategy, "auto")
    except (ValueError, tf.errors.InvalidArgumentError):
        return True
    return False


def forget_deferred_variables(variables):
    """Takes ``variables`` (made in a ``keras.StatelessScope`` without
    initialising them) off Keras' list of variables waiting for one, so
    that the list does not keep them alive
    (``keras.src.backend.common.global_state``)."""
    api = "keras.src.backend.common.global_state"
    purpose = "free variables built only for their shapes"
    try:
        from keras.src.backend.common import global_state
    except ImportError as e:
        raise _missing(api, "keras", purpose) from e
    get = _require(global_state, "get_global_attribute",
                   api + ".get_global_attribute", "keras", purpose)
    put = _require(global_state, "set_global_attribute",
                   api + ".set_global_attribute", "keras", purpose)
    name = "uninitialized_variables"
    pending = get(name)
    if pending:
        ours = {id(v) for v in variables}
        put(name, [v for v in pending if id(v) not in ours])


def quantization_modes(default):
    """The quantization modes this Keras knows
    (``keras.src.dtype_policies.QUANTIZATION_MODES``), or ``default`` where
    the list is not there."""
    try:
        from keras.src import dtype_policies
    except ImportError as e:
        raise _missing("keras.src.dtype_policies", "keras",
                       "list the quantization modes Keras knows") from e
    return tuple(getattr(dtype_policies, "QUANTIZATION_MODES", default))


def should_quantize_layer(layer, filters):
    """Whether Keras' ``Model.quantize`` would quantize ``layer`` under
    ``filters`` (``keras.src.quantizers.utils.should_quantize_layer``)."""
    api = "keras.src.quantizers.utils.should_quantize_layer"
    purpose = "pick the layers a quantize(filters=...) call applies to"
    try:
        from keras.src.quantizers import utils
    except ImportError as e:
        raise _missing(api, "keras", purpose) from e
    return _require(utils, "should_quantize_layer", api, "keras",
                    purpose)(layer, filters)


def patch_numpy_product():
    """Gives NumPy 2 back ``np.product`` (an alias of ``np.prod``), which
    tf2onnx 1.17's large-model route still calls. Only for a throwaway
    process: the converter's child process calls it."""
    import numpy as np

    if not hasattr(np, "product"):
        np.product = np.prod


def tf2onnx_tensor_data(storage):
    """``{name: raw bytes}`` of the weights tf2onnx's large-model route kept
    out of the proto (``ExternalTensorStorage.name_to_tensor_data``)."""
    if storage is None:
        return None
    return _require(storage, "name_to_tensor_data",
                    "ExternalTensorStorage.name_to_tensor_data", "tf2onnx",
                    "write the weights of a large ONNX model")


def tflite_ops_details(interpreter):
    """The ops of a LiteRT/TFLite ``Interpreter``, each a dict with
    ``op_name``, ``inputs`` and ``outputs``
    (``Interpreter._get_ops_details``)."""
    fn = _require(interpreter, "_get_ops_details",
                  "Interpreter._get_ops_details", "ai-edge-litert",
                  "report which ops of a .tflite file run in int8")
    return fn()


def onednn_supports(dtype_name):
    """Whether TensorFlow's oneDNN kernels run ``dtype_name`` (e.g.
    ``"bfloat16"``) natively on this CPU (TensorFlow's
    ``_pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU``: AVX512F or
    AVX-NE-CONVERT for bf16). Only then does grappler rewrite bf16 ops to
    oneDNN ones; elsewhere TensorFlow runs them through Eigen."""
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_utils

    fn = _require(_pywrap_utils, "IsDataTypeSupportedByOneDNNOnThisCPU",
                  "_pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU",
                  "tensorflow", "ask whether oneDNN runs bf16 on this CPU")
    return bool(fn(tf.as_dtype(dtype_name)))


def tf_executed_graphs(run, arg_name=None):
    """Calls ``run()`` with TensorFlow's run metadata on and returns the
    ``GraphDef`` partitions its functions ran as: the graphs after grappler
    and oneDNN's rewrites, one per function instantiated during the call
    (``context.enable_run_metadata`` / ``export_run_metadata``).
    ``arg_name`` keeps only the functions with an argument of that name
    (the metadata can hold other models' functions too)."""
    from tensorflow.python.eager import context as tf_context

    ctx = tf_context.context()
    for attr in ("enable_run_metadata", "export_run_metadata",
                 "disable_run_metadata"):
        _require(ctx, attr, f"tensorflow.python.eager.context.{attr}",
                 "tensorflow", "read the graphs TensorFlow optimised")
    ctx.enable_run_metadata()
    try:
        run()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    functions = list(metadata.function_graphs)
    if arg_name is not None:
        functions = [f for f in functions if any(
            node.op == "_Arg" and node.name == arg_name
            for node in f.pre_optimization_graph.node)]
    return [partition for function in functions
            for partition in function.partition_graphs]


def onednn_enabled():
    """Whether this TensorFlow runs its CPU graphs through oneDNN, which
    is where grappler's fusions of matmul, bias and GELU exist
    (``_pywrap_util_port.IsMklEnabled``); see
    :func:`keras_vit.runtime.hardware.enable_onednn`."""
    from tensorflow.python.util import _pywrap_util_port

    fn = _require(_pywrap_util_port, "IsMklEnabled",
                  "_pywrap_util_port.IsMklEnabled", "tensorflow",
                  "ask whether TensorFlow's CPU graphs use oneDNN")
    return bool(fn())


def ema_once_per_step(optimizer):
    """Makes the weight average of a Keras ``optimizer`` with
    ``use_ema=True`` and ``gradient_accumulation_steps=k`` move once per
    optimizer step, as the recipe's ``ema_decay`` means, not at every
    micro-batch, as Keras does. Overrides BaseOptimizer's private
    ``_update_model_variables_moving_average`` on this instance. Returns
    ``optimizer``."""
    if not (optimizer.use_ema and optimizer.gradient_accumulation_steps):
        return optimizer
    purpose = "average the weights once per optimizer step"
    _require(optimizer, "_update_model_variables_moving_average",
             "BaseOptimizer._update_model_variables_moving_average",
             "keras", purpose)
    _require(optimizer, "_iterations", "BaseOptimizer._iterations", "keras",
             purpose)
    from keras import ops

    def update(trainable_variables):
        k = optimizer.gradient_accumulation_steps
        # Called after the update of this call, before the count moves on.
        updates = ops.equal((optimizer._iterations + 1) % k, 0)
        first = ops.equal(optimizer.iterations, 0)
        for var, average in zip(trainable_variables,
                                optimizer._model_variables_moving_average):
            if average is None:
                continue
            momentum = ops.where(
                first, 0.0, ops.where(updates, optimizer.ema_momentum, 1.0))
            momentum = ops.cast(momentum, var.dtype)
            average.assign(momentum * average + (1 - momentum) * var)

    optimizer._update_model_variables_moving_average = update
    return optimizer


# Keras optimizer methods a per-variable learning rate overrides or calls:
# update_step is the documented hook of a custom optimizer; the others are
# BaseOptimizer's private ones.
_PER_VARIABLE_HOOKS = ("update_step", "_apply_weight_decay",
                       "_use_weight_decay", "_get_variable_index")
_PER_VARIABLE_CLASSES = {}


def per_variable_learning_rates(optimizer, scales):
    """A copy of the unbuilt Keras ``optimizer`` (its class, its config and
    the variables it excludes from weight decay) whose update of each
    variable uses the learning rate times that variable's scale,
    ``scales[variable.path]``, decoupled weight decay included (as a
    per-group ``lr`` scales both in PyTorch). Scaling gradients instead
    would be the same only for plain SGD: Adam divides the scale away.

    >>> import keras, numpy as np
    >>> v = keras.Variable(np.ones(2, "float32"), name="w")
    >>> opt = per_variable_learning_rates(keras.optimizers.SGD(0.1),
    ...                                   {v.path: 0.5})
    >>> opt.apply([keras.ops.ones(2)], [v])
    >>> [round(float(x), 4) for x in keras.ops.convert_to_numpy(v)]
    [0.95, 0.95]
    """
    # Under torch, optimizers are fused stand-ins that never call
    # update_step: subclass the Keras class they stand in for.
    cls = next(c for c in type(optimizer).__mro__ if not c.__module__
               .startswith("keras.src.backend.torch.optimizers"))
    for hook in _PER_VARIABLE_HOOKS:
        _require(cls, hook, f"BaseOptimizer.{hook}", "keras",
                 "give each variable its own learning rate (layer decay)")
    if getattr(optimizer, "built", False):
        raise ValueError(
            f"optimizer={optimizer.name!r} is already built (it has "
            "updated variables); per-variable learning rates need an "
            "unbuilt optimizer")
    if cls not in _PER_VARIABLE_CLASSES:
        _PER_VARIABLE_CLASSES[cls] = _per_variable_class(cls)
    config = optimizer.get_config()
    config["variable_scales"] = {str(k): float(v) for k, v in scales.items()}
    scaled = _PER_VARIABLE_CLASSES[cls].from_config(config)
    for attr in ("_exclude_from_weight_decay",
                 "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, attr):
            setattr(scaled, attr, getattr(optimizer, attr))
    return scaled


def _per_variable_class(base):
    from keras import ops

    class PerVariableRate(base):
        def __init__(self, *args, variable_scales=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.variable_scales = {str(k): float(v) for k, v in
                                    (variable_scales or {}).items()}
            self._variable_rates = []

        def build(self, variables):
            missing = [v.path for v in variables
                       if v.path not in self.variable_scales]
            if missing:
                raise ValueError(
                    f"no learning-rate scale for the variable "
                    f"{missing[0]!r} ({len(missing)} of {len(variables)} "
                    "without one): build the scales from the model this "
                    "optimizer trains")
            super().build(variables)
            self._variable_rates = [self.variable_scales[v.path]
                                    for v in variables]

        def _apply_weight_decay(self, variables):
            return  # in update_step, at each variable's own rate

        def update_step(self, gradient, variable, learning_rate):
            scale = self._variable_rates[self._get_variable_index(variable)]
            learning_rate = learning_rate * scale
            if (self.weight_decay is not None
                    and self._use_weight_decay(variable)):
                decay = (ops.cast(self.weight_decay, variable.dtype)
                         * ops.cast(learning_rate, variable.dtype))
                self.assign_sub(variable, variable * decay)
            return super().update_step(gradient, variable, learning_rate)

        def get_config(self):
            return {**super().get_config(),
                    "variable_scales": dict(self.variable_scales)}

    PerVariableRate.__name__ = PerVariableRate.__qualname__ = (
        f"PerVariableRate{base.__name__}")
    return PerVariableRate
