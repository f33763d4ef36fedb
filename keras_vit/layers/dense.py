"""Dense, LayerNorm, RMSNorm, GELU and the patch convolution, with the
official initialisers, their calls through :mod:`keras_vit.runtime.kernels`.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers, ops

from keras_vit.base import options
from keras_vit.base.checks import check_choice
from keras_vit.layers.registered import PACKAGE
from keras_vit.runtime import kernels
from keras_vit.runtime.backend import is_torch
# The one place the layers add a bias (a gradient summed in float32).
from keras_vit.runtime.kernels import add_bias  # noqa: F401


# The official Dense kernels are Xavier-uniform, their biases N(0, 1e-6).
XAVIER = "glorot_uniform"


def bias_init():
    return keras.initializers.RandomNormal(stddev=1e-6)


def xavier_flat(fan_in, fan_out):
    """Xavier-uniform of the flattened (fan_in, fan_out) matrix, as Flax's
    ``DenseGeneral``: Keras' ``glorot_uniform`` would start a (D, heads,
    D/heads) kernel about 6x too small at ViT-B width."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


def gelu_tanh(x):
    """GELU in its tanh approximation, the form the official ViT uses,
    written out so that exporters see plain tanh/mul/add ops."""
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + ops.tanh(c * (x + 0.044715 * ops.power(x, 3))))


GELU_FORMS = kernels.GELU_FORMS
"""The two spellings of GELU itself: flax's tanh approximation, or erf."""

MLP_ACTIVATIONS = (*GELU_FORMS, "quick")
"""The ``gelu`` values a layer takes: the two GELU forms, and ``"quick"``,
``x * sigmoid(1.702 x)`` (OpenAI's CLIP)."""


def gelu(x, form="tanh"):
    """GELU in ``form`` ``"tanh"`` (the official ViT code) or ``"exact"``
    (erf; timm's): they differ by up to 1e-4 to 3e-4 on ViT logits. Written
    out: ``tf.nn.gelu`` emits an ``Erfc`` op that onnxruntime refuses.

    >>> import numpy as np
    >>> x = ops.convert_to_tensor(np.array([-1.0, 0.5], "float32"))
    >>> diff = (ops.convert_to_numpy(gelu(x, "exact"))
    ...         - ops.convert_to_numpy(gelu(x, "tanh")))
    >>> [f"{d:.1e}" for d in diff]
    ['1.5e-04', '1.7e-05']
    """
    if form == "tanh":
        return gelu_tanh(x)
    if form == "quick":
        return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def mlp_gelu_tanh(x):
    """The tanh GELU as the MLP's activation (``keras.ops.gelu``)."""
    return ops.gelu(x, approximate=True)


def mlp_gelu_exact(x):
    """The exact (erf) GELU as the MLP's activation: :func:`gelu`."""
    return gelu(x, "exact")


def mlp_gelu_quick(x):
    """The quick (sigmoid) GELU as the MLP's activation: :func:`gelu`."""
    return gelu(x, "quick")


MLP_GELU = {"tanh": mlp_gelu_tanh, "exact": mlp_gelu_exact,
            "quick": mlp_gelu_quick}
"""The MLP activation of each ``gelu`` form."""


def check_gelu(form):
    """``form`` if it is one of :data:`MLP_ACTIVATIONS`, else a
    ValueError naming ``gelu``."""
    return check_choice("gelu", form, MLP_ACTIVATIONS)


MLP_KINDS = options.choices("mlp")
"""The MLP of an encoder block: ``"gelu"`` (the paper's), ``"swiglu"``
(Shazeer 2020) or ``"geglu"`` (:func:`gated`)."""


def check_mlp(kind):
    """``kind`` if it is one of :data:`MLP_KINDS`, else a ValueError
    naming ``mlp``."""
    return check_choice("mlp", kind, MLP_KINDS)


def unbounded(shape, dtype=None):
    """Clamp bounds that clamp nothing: rows of ``[-inf, inf, -inf,
    inf]``."""
    return ops.convert_to_tensor(
        np.broadcast_to(np.array([-np.inf, np.inf] * 2, "float32"),
                        shape), dtype)


def clamp(x, bounds):
    """``x`` clamped between ``bounds`` (min, max: scalars or vectors
    over its last axis), in its dtype.

    >>> import numpy as np
    >>> ops.convert_to_numpy(clamp(np.array([-2.0, 0.5, 3.0]), [-1.0, 1.0])).tolist()
    [-1.0, 0.5, 1.0]
    """
    low, high = ops.cast(bounds[0], x.dtype), ops.cast(bounds[1], x.dtype)
    return ops.minimum(ops.maximum(x, low), high)


def gated(h, activation):
    """A gated MLP's features of a packed projection: ``activation(gate)
    * value`` for ``h = [gate, value]`` split in half on the last axis
    (timm's ``SwiGLUPacked`` order).

    >>> import numpy as np
    >>> h = np.array([[1.0, 2.0]], "float32")
    >>> round(float(ops.convert_to_numpy(gated(h, ops.silu))[0, 0]), 4)
    1.4621
    >>> round(float(ops.convert_to_numpy(gated(h, MLP_GELU["tanh"]))[0, 0]), 4)
    1.6824
    """
    gate, value = ops.split(h, 2, axis=-1)
    return activation(gate) * value


def with_arguments(config, layer, names):
    """``config`` with ``layer``'s attributes ``names``."""
    config.update({name: getattr(layer, name) for name in names})
    return config


class KeptArguments:
    """A layer whose ``__init__`` arguments come from one table:
    ``ARGUMENTS`` maps each name to the function that normalises it;
    ``self.keep_arguments(locals())`` stores each as an attribute, and
    ``get_config`` returns exactly those."""

    ARGUMENTS = {}

    def keep_arguments(self, given):
        for name, normalise in self.ARGUMENTS.items():
            setattr(self, name, normalise(given[name]))

    def get_config(self):
        return with_arguments(super().get_config(), self, self.ARGUMENTS)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedConv2D(layers.Conv2D):
    """``keras.layers.Conv2D`` whose channels-last call with a bias adds
    it through :func:`add_bias`, so that under mixed precision the bias
    gradient sums in float32 (TensorFlow and XLA:CPU sum it in bfloat16).
    """

    def call(self, inputs, training=None):
        if (is_torch() or not self.use_bias
                or self.data_format != "channels_last"):
            return super().call(inputs)
        y = self.convolution_op(inputs, self.kernel)
        y = kernels.add_bias(y, ops.cast(self.bias, y.dtype), training)
        if self.activation is not None:
            y = self.activation(y)
        return y


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedDense(layers.Dense):
    """``keras.layers.Dense`` whose float call with a bias is
    :func:`keras_vit.runtime.kernels.dense` (each backend's fused spelling).
    ``gelu`` (None or one of :data:`MLP_ACTIVATIONS`) makes that GELU the
    activation, kept in the config by its name.
    """

    def __init__(self, units, gelu=None, **kwargs):
        if gelu is not None and kwargs.get("activation") is not None:
            raise ValueError(
                "FusedDense takes gelu or activation, not both; received "
                f"gelu={gelu!r}, activation={kwargs['activation']!r}")
        super().__init__(units, **kwargs)
        self.gelu = None if gelu is None else check_gelu(gelu)
        if self.gelu is not None:
            self.activation = MLP_GELU[self.gelu]

    def get_config(self):
        config = super().get_config()
        if self.gelu is not None:
            config["activation"] = None
        config["gelu"] = self.gelu
        return config

    def call(self, inputs, training=None):
        if self.bias is None:
            return super().call(inputs)
        shape = ops.shape(inputs)
        x = inputs
        if len(inputs.shape) != 2:
            x = ops.reshape(inputs, (-1, self.kernel.shape[0]))
        y = kernels.dense(x, ops.cast(self.kernel, x.dtype),
                          ops.cast(self.bias, x.dtype), self.activation,
                          self.gelu, training)
        if len(inputs.shape) != 2:
            y = ops.reshape(y, (*shape[:-1], self.units))
        return y

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses to quantize a subclass unless asked (its call might
        # not be Dense's); this one's quantized call is Dense's own.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedEinsumDense(layers.EinsumDense):
    """``keras.layers.EinsumDense`` whose float call, for a plain
    projection, is :func:`keras_vit.runtime.kernels.einsum_dense`: one 2-D
    matmul on the flattened tokens and kernel."""

    def call(self, inputs, training=None):
        kernel_axes = self.equation.replace(" ", "").split("->")[0]
        flat = kernels.flat_einsum(self.equation)
        # One BiasAdd needs a bias over every output axis of the kernel.
        if (flat is None or self.bias is None
                or self.activation not in (None, keras.activations.linear)
                or self.bias_axes != kernel_axes.split(",")[1][flat[0]:]):
            return super().call(inputs, training=training)
        return kernels.einsum_dense(inputs, self.equation, self.kernel,
                                    self.bias, training)

    def quantize(self, mode=None, type_check=True, config=None):
        # As FusedDense: the quantized call is EinsumDense's own.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedLayerNormalization(layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` whose plain last-axis call goes
    through :func:`keras_vit.runtime.kernels.layer_norm` (one XLA program
    each way in training on TensorFlow where the plan says so)."""

    def call(self, inputs, training=None):
        if (self.center and self.scale and not self.rms_scaling
                and list(self.axis) in ([-1], [len(inputs.shape) - 1])):
            y = kernels.layer_norm(inputs, self.gamma, self.beta,
                                   self.epsilon, self.compute_dtype, training)
            if y is not None:
                return y
        return super().call(inputs)


NORM_KINDS = options.choices("norm")
"""The norms a model builds: ``"layer"``, LayerNorm (the paper's);
``"rms"``, RMSNorm (Zhang & Sennrich 2019: AIMv2's)."""


def check_norm(kind):
    """``kind`` if it is one of :data:`NORM_KINDS`, else a ValueError
    naming ``norm``."""
    return check_choice("norm", kind, NORM_KINDS)


@keras.saving.register_keras_serializable(package=PACKAGE)
class RMSNormalization(layers.RMSNormalization):
    """RMSNorm over the last axis: ``x / sqrt(mean(x ** 2) + epsilon) *
    gamma`` (timm's ``RmsNorm``). Keras' own layer with the scale named
    ``gamma`` (LayerNormalization's name) and kept float32 under mixed
    precision. ``LayerNormalization(rms_scaling=True)`` is not this: it
    divides by the standard deviation.

    >>> import numpy as np
    >>> norm = RMSNormalization(epsilon=0.0)
    >>> out = norm(np.array([[3.0, -4.0]], "float32"))
    >>> [round(float(v), 4) for v in ops.convert_to_numpy(out)[0]]
    [0.8485, -1.1314]
    """

    def __init__(self, axis=-1, epsilon=1e-6, **kwargs):
        super().__init__(axis=axis, epsilon=epsilon, **kwargs)
        self.autocast = False

    def build(self, input_shape):
        axis = self.axis if isinstance(self.axis, (list, tuple)) else [
            self.axis]
        self.axis = sorted(axis)
        self.scale = self.add_weight(
            name="gamma", shape=tuple(input_shape[a] for a in self.axis),
            initializer="ones", autocast=False)
        self.built = True

    @property
    def gamma(self):
        return self.scale

    def call(self, x):
        out = ops.rms_normalization(x, scale=self.scale, axis=self.axis,
                                    epsilon=self.epsilon)
        return ops.cast(out, self.compute_dtype)


def unscaled_norm(x, kind, epsilon):
    """``x`` normalised over its last axis by a norm of ``kind`` without
    a scale or a bias, in float32.

    >>> import numpy as np
    >>> x = np.array([[3.0, -4.0]], "float32")
    >>> y = ops.convert_to_numpy(unscaled_norm(x, "rms", 0.0))
    >>> [round(float(v), 4) for v in y[0]]
    [0.8485, -1.1314]
    """
    y = ops.cast(x, "float32")
    if kind == "layer":
        y = y - ops.mean(y, axis=-1, keepdims=True)
    y = y * ops.rsqrt(ops.mean(ops.square(y), axis=-1, keepdims=True)
                      + np.float32(epsilon))
    return ops.cast(y, x.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class UnscaledNorm(KeptArguments, layers.Layer):
    """A norm of ``kind`` (:data:`NORM_KINDS`) of ``epsilon`` over the
    last axis with no weights (:func:`unscaled_norm`).

    >>> import numpy as np
    >>> y = UnscaledNorm("rms", 0.0)(np.array([[3.0, -4.0]], "float32"))
    >>> [round(float(v), 4) for v in ops.convert_to_numpy(y)[0]]
    [0.8485, -1.1314]
    """

    ARGUMENTS = {"kind": check_norm, "epsilon": float}

    def __init__(self, kind="layer", epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.keep_arguments(locals())

    def call(self, x):
        return unscaled_norm(x, self.kind, self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape


def make_norm(kind, epsilon, dtype, name, fused=True):
    """The norm layer of ``kind`` (:data:`NORM_KINDS`) of ``epsilon``:
    :class:`FusedLayerNormalization` (Keras' own with ``fused=False``) or
    :class:`RMSNormalization`.

    >>> make_norm("rms", 1e-5, None, "norm").__class__.__name__
    'RMSNormalization'
    """
    if check_norm(kind) == "rms":
        return RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    layer_norm = (FusedLayerNormalization if fused
                  else layers.LayerNormalization)
    return layer_norm(epsilon=epsilon, dtype=dtype, name=name)
