"""Every use keras-vit makes of another project's private API, one function
each, so that an upgrade that removes one fails here, loudly and by name.

Keras, tf2onnx and LiteRT have no public way to do these few things; each
wrapper checks that the private name is still there and raises
:class:`PrivateAPIError` naming it (and the installed version) if not.
``tests/core/test_compat.py`` calls every wrapper against the installed
versions.

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
    try:
        from keras.src.backend.common import remat
    except ImportError:
        raise _missing("keras.src.backend.common.remat", "keras",
                       "tell a model built inside keras.RematScope") from None
    get = _require(remat, "get_current_remat_mode",
                   "remat.get_current_remat_mode", "keras",
                   "tell a model built inside keras.RematScope")
    scope = get()
    return None if scope is None else getattr(scope, "mode", str(scope))


def stateless_scope():
    """The ``keras.StatelessScope`` this code runs in, or None
    (``keras.src.backend.common.stateless_scope.get_stateless_scope``)."""
    try:
        from keras.src.backend.common import stateless_scope as module
    except ImportError:
        raise _missing("keras.src.backend.common.stateless_scope", "keras",
                       "keep dropout masks in a rematerialised block") from None
    return _require(module, "get_stateless_scope",
                    "stateless_scope.get_stateless_scope", "keras",
                    "keep dropout masks in a rematerialised block")()


def run_through_graph(functional, inputs, call_fn):
    """Calls the layers of the Functional model ``functional`` on ``inputs``
    through ``call_fn(layer, *args, **kwargs)``, which may change what each
    returns (Keras ``Functional._run_through_graph``)."""
    fn = _require(functional, "_run_through_graph",
                  "Functional._run_through_graph", "keras",
                  "rewire a ViT for masked patch prediction")
    return fn(inputs, operation_fn=lambda op: op, call_fn=call_fn)


def skip_optimizer_gradient_sum(optimizer):
    """Stops a Keras optimizer under ``tf.distribute`` from summing the
    gradients across replicas (the training loop has summed them already,
    before clipping); Keras ``TFOptimizer._all_reduce_sum_gradients``."""
    _require(optimizer, "_all_reduce_sum_gradients",
             "TFOptimizer._all_reduce_sum_gradients", "keras",
             "sum gradients across replicas once, before clipping")
    optimizer._all_reduce_sum_gradients = list


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

    The metadata can also hold functions of other models that TensorFlow
    happened to instantiate in the same window; ``arg_name`` keeps only the
    functions with an argument of that name."""
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
    (``_pywrap_util_port.IsMklEnabled``). TensorFlow's own default is on
    only for x86 CPUs with AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX;
    ``import keras_vit`` before TensorFlow turns it on for the others
    (:func:`keras_vit.runtime.hardware.enable_onednn`); ``TF_ENABLE_ONEDNN_OPTS``
    decides when set."""
    from tensorflow.python.util import _pywrap_util_port

    fn = _require(_pywrap_util_port, "IsMklEnabled",
                  "_pywrap_util_port.IsMklEnabled", "tensorflow",
                  "ask whether TensorFlow's CPU graphs use oneDNN")
    return bool(fn())


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
    per-group ``lr`` scales both in PyTorch).

    Keras optimizers have one learning rate for every variable. The copy
    is of a subclass that overrides ``update_step`` (scaling the rate it
    is handed) and BaseOptimizer's private ``_apply_weight_decay`` (the
    decay moves into ``update_step``, where the variable's rate is
    known; Keras decays every variable before updating any, and each
    variable's decay still precedes its own update), and reads the
    private ``_use_weight_decay`` and ``_get_variable_index``. It is the
    original's update on every backend (under torch, through Keras'
    per-variable loop instead of its fused optimizers). Scaling gradients
    instead would be the same only for plain SGD: Adam divides the scale
    away.

    >>> import keras, numpy as np
    >>> v = keras.Variable(np.ones(2, "float32"), name="w")
    >>> opt = per_variable_learning_rates(keras.optimizers.SGD(0.1),
    ...                                   {v.path: 0.5})
    >>> opt.apply([keras.ops.ones(2)], [v])
    >>> [round(float(x), 4) for x in keras.ops.convert_to_numpy(v)]
    [0.95, 0.95]
    """
    # Under torch, keras.optimizers.SGD(...) and its kind are instances of
    # fused stand-ins (keras.src.backend.torch.optimizers) that update all
    # variables in one call, never through update_step: subclass the Keras
    # class they stand in for.
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
