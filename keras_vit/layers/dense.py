"""Dense, LayerNorm, RMSNorm, GELU and the patch convolution in the spellings each backend runs
fastest (fused where the machine's plan says so), with the official initialisers."""

from __future__ import annotations

import functools
import math
import re

import keras
from keras import layers, ops

from keras_vit.base import options
from keras_vit.base.checks import check_choice
from keras_vit.layers.registered import PACKAGE
from keras_vit.runtime.backend import is_tensorflow, is_torch, name as backend_name



# The official code initialises its Dense kernels with Xavier-uniform and
# their biases with N(0, 1e-6); the patch conv, pre-logits and every ResNet
# conv (hybrid and BiT) use Flax's default lecun_normal; position embeddings
# N(0, 0.02) "from BERT".
XAVIER = "glorot_uniform"


def bias_init():
    return keras.initializers.RandomNormal(stddev=1e-6)


def xavier_flat(fan_in, fan_out):
    """Xavier-uniform for a kernel stored with more than two axes.

    Flax's ``DenseGeneral`` initialises its (D, heads, D/heads) kernels as the
    flattened (fan_in, fan_out) matrix; Keras' ``glorot_uniform`` would count
    the leading axis as a convolution's receptive field and start the
    attention about 6x too small at ViT-B width.
    """
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


def gelu_tanh(x):
    """GELU in its tanh approximation, the form the official ViT uses.

    Written out rather than through ``tf.nn.gelu`` so that every exporter sees
    plain tanh/mul/add ops (exact GELU through TF emits an ``Erfc`` op that
    onnxruntime refuses).
    """
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + ops.tanh(c * (x + 0.044715 * ops.power(x, 3))))


GELU_FORMS = ("tanh", "exact")
"""The two spellings of GELU itself: flax's tanh approximation, or erf.
Training steps may run either as one XLA program
(:func:`keras_vit.runtime.fused_ops.xla_gelu`)."""

MLP_ACTIVATIONS = (*GELU_FORMS, "quick")
"""The ``gelu`` values a layer takes: the two GELU forms, and ``"quick"``,
``x * sigmoid(1.702 x)``, the sigmoid approximation OpenAI's CLIP image
towers were trained with (timm's ``quick_gelu``)."""


def gelu(x, form="tanh"):
    """GELU in ``form`` ``"tanh"`` (the official ViT code, flax's default)
    or ``"exact"`` (erf; timm and PyTorch's default). The two differ by up
    to about 1e-3 per activation and 1e-4 to 3e-4 on ViT logits, so a model
    reproduces its checkpoint's own forward only with the form it was
    trained with. Exact GELU is written out with ``erf`` too: ``tf.nn.gelu``
    emits an ``Erfc`` op that onnxruntime refuses.

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
    """The tanh GELU as the MLP's activation (``keras.ops.gelu``). On
    TensorFlow, :class:`FusedDense` replaces its float call by the spelling
    that fuses into the matmul (:mod:`keras_vit.runtime.fused_ops`); this function
    runs on the other backends and in quantized calls."""
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


def chains_in_xla(dtype, training):
    """Whether a call with ``training`` runs its GELU, LayerNorm and
    softmax chains as XLA programs (:mod:`keras_vit.runtime.fused_ops`): training
    calls only, where the machine's plan says so
    (:class:`keras_vit.runtime.hardware.Plan`'s ``elementwise``, ``"xla"`` only
    for TensorFlow's CPU graph). Inference calls never ask for the plan."""
    if training is not True:
        return False
    from keras_vit.runtime import hardware

    return hardware.plan(dtype).elementwise == "xla"


# A bias's gradient sums the output's gradient over every row (every token
# of every image). Under mixed precision that sum must accumulate in
# float32: TensorFlow's CPU kernels (``BiasAddGrad``, oneDNN's fused
# convolution backward) and XLA:CPU's reduce of JAX's broadcast-add
# gradient accumulate bfloat16 in bfloat16, and came out 10-40% off the
# float32 model's bias gradients (tests/models/test_mixed_precision_
# gradients.py); torch accumulates in float32. :func:`add_bias` is the one
# place the layers here add a bias.


@functools.lru_cache(maxsize=None)
def _jax_bias_add():
    """``h + bias`` whose bias gradient sums over every axis but the last
    in float32, rounding once (built on first use)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def add(h, bias):
        return h + bias

    def forward(h, bias):
        return h + bias, None

    def backward(_, dy):
        axes = tuple(range(dy.ndim - 1))
        return dy, jnp.sum(dy, axis=axes, dtype=jnp.float32).astype(dy.dtype)

    add.defvjp(forward, backward)
    return add


def add_bias(h, bias, training=None):
    """``h + bias`` over ``h``'s last axis, ``bias`` of ``h``'s dtype, with
    a gradient summed in float32 on every backend: TensorFlow's spelling is
    :func:`keras_vit.runtime.fused_ops.bias_add` (``training`` picks the one that
    fuses best), JAX's a custom gradient, torch's a plain add."""
    backend = backend_name()
    if backend == "tensorflow":
        from keras_vit.runtime import fused_ops

        return fused_ops.bias_add(h, bias, training)
    if backend == "jax":
        return _jax_bias_add()(h, bias)
    return h + bias


def _dense_2d(x, kernel, bias, training=None):
    """``x @ kernel + bias`` for a 2-D ``x``, the bias gradient summed in
    float32 (:func:`add_bias`). On TensorFlow,
    :func:`keras_vit.runtime.fused_ops.dense`, whose bias add grappler fuses into
    the matmul. On torch, one ``addmm``: eager torch runs a separate
    add as its own pass over the output, which cost 3.4x the fused call
    for ViT-B's MLP in bf16 on an AMX CPU (``benchmarks/speed.py``). On
    JAX a matmul and the add, which XLA fuses by itself."""
    backend = backend_name()
    if backend == "tensorflow":
        from keras_vit.runtime import fused_ops

        return fused_ops.dense(x, kernel, bias, training)
    if backend == "torch":
        import torch

        return torch.addmm(bias, x, kernel)
    return add_bias(ops.matmul(x, kernel), bias, training)


def check_gelu(form):
    """``form`` if it is one of :data:`MLP_ACTIVATIONS`, else a
    ValueError naming ``gelu``."""
    return check_choice("gelu", form, MLP_ACTIVATIONS)


MLP_KINDS = options.choices("mlp")
"""The MLP of an encoder block: ``"gelu"``, Dense -> GELU -> Dense (the
paper's); ``"swiglu"``, one Dense to twice the width whose first half,
through SiLU, gates the second, then Dense (Shazeer 2020's SwiGLU, the
MLP of DINOv2-g, AIMv2, TIPS)."""


def check_mlp(kind):
    """``kind`` if it is one of :data:`MLP_KINDS`, else a ValueError
    naming ``mlp``."""
    return check_choice("mlp", kind, MLP_KINDS)


def swiglu(h):
    """SwiGLU's gating of a packed projection: ``silu(gate) * value`` for
    ``h = [gate, value]`` split in half on the last axis (the order of
    timm's ``SwiGLUPacked`` and transformers' DINOv2 ``weights_in``).

    >>> import numpy as np
    >>> float(ops.convert_to_numpy(swiglu(np.array([[0.0, 2.0]])))[0, 0])
    0.0
    >>> round(float(ops.convert_to_numpy(swiglu(np.array([[1.0, 2.0]])))[0, 0]), 4)
    1.4621
    """
    gate, value = ops.split(h, 2, axis=-1)
    return ops.silu(gate) * value


def with_arguments(config, layer, names):
    """``config``, the base class's, with ``layer``'s ``__init__``
    arguments ``names``: each layer here stores every argument, normalised,
    as the attribute of its name, and its config holds exactly those."""
    config.update({name: getattr(layer, name) for name in names})
    return config


class KeptArguments:
    """A layer whose ``__init__`` arguments are kept as
    :func:`with_arguments` reads them, from one table: ``ARGUMENTS`` maps
    each name to the function that normalises it (``int``, ``float``, a
    check), in the order they are checked and configured.
    ``self.keep_arguments(locals())`` in ``__init__`` stores each,
    normalised, as the attribute of its name; ``get_config`` returns
    exactly those."""

    ARGUMENTS = {}

    def keep_arguments(self, given):
        for name, normalise in self.ARGUMENTS.items():
            setattr(self, name, normalise(given[name]))

    def get_config(self):
        return with_arguments(super().get_config(), self, self.ARGUMENTS)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedConv2D(layers.Conv2D):
    """``keras.layers.Conv2D`` whose channels-last call with a bias adds
    it through :func:`add_bias`: under mixed precision the bias gradient
    sums in float32 (TensorFlow's fused convolution backward and XLA:CPU
    sum bfloat16 in bfloat16), and TensorFlow fuses the add into the
    convolution all the same. Everything else, and torch, is Keras' own
    call; weights, config and numbers are Conv2D's."""

    def call(self, inputs, training=None):
        if (is_torch() or not self.use_bias
                or self.data_format != "channels_last"):
            return super().call(inputs)
        y = self.convolution_op(inputs, self.kernel)
        y = add_bias(y, ops.cast(self.bias, y.dtype), training)
        if self.activation is not None:
            y = self.activation(y)
        return y


@functools.lru_cache(maxsize=None)
def _flat_einsum(equation):
    """``(k, n)`` when ``equation`` is a plain projection that one 2-D
    matmul computes: the input's last ``k`` axes contract with the kernel's
    first ``k`` and the kernel's other ``n`` axes end the output, in order
    (``"abc,cde->abde"``, ``"abcd,cde->abe"``); None for anything else."""
    match = re.fullmatch(r"(\w+),(\w+)->(\w+)", equation.replace(" ", ""))
    if not match:
        return None
    inp, ker, out = match.groups()
    for k in range(1, len(ker)):
        lead = len(inp) - k
        if (lead > 0 and ker[:k] == inp[lead:] and out[:lead] == inp[:lead]
                and out[lead:] == ker[k:]):
            return k, len(ker) - k
    return None


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedDense(layers.Dense):
    """``keras.layers.Dense`` whose float call is :func:`_dense_2d` (the
    bias add TensorFlow's CPU graph fuses into the matmul, torch's
    ``addmm``), and, with the tanh GELU of :func:`mlp_gelu_tanh` as its
    activation, TensorFlow's fused MatMul + BiasAdd + GELU spelling
    (:mod:`keras_vit.runtime.fused_ops`).

    ``gelu`` (None or one of :data:`MLP_ACTIVATIONS`) makes the GELU of that form
    the layer's activation, kept in the config by its name (``activation``
    then stays None there).

    Everything else is Keras' own: ``kernel`` (LoRA merged in when
    enabled), ``quantize`` and the quantized calls (Keras dispatches to
    ``quantized_call`` instead of ``call`` once the layer is quantized),
    ``enable_lora``, saving. Same numbers as ``Dense`` up to float rounding.
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
        kernel = ops.cast(self.kernel, x.dtype)
        bias = ops.cast(self.bias, x.dtype)
        if self.gelu in GELU_FORMS and chains_in_xla(x.dtype, training):
            from keras_vit.runtime import fused_ops

            # The training step's GELU and its gradient as one XLA loop
            # each, after the oneDNN matmul + BiasAdd.
            y = fused_ops.xla_gelu(_dense_2d(x, kernel, bias, training),
                                   self.gelu)
        elif (self.activation is mlp_gelu_tanh
              and is_tensorflow()):
            from keras_vit.runtime import fused_ops

            # Training needs the GELU's inner values for its gradient, so
            # nothing fuses there: that spelling minimises backward ops.
            spell = (fused_ops.dense_gelu_tanh_for_training
                     if training is True else fused_ops.dense_gelu_tanh)
            y = spell(x, kernel, bias)
        else:
            y = _dense_2d(x, kernel, bias, training)
            if self.activation not in (None, keras.activations.linear):
                y = self.activation(y)
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
    projection (``"abc,cde->abde"``: tokens to heads, ``"abcd,cde->abe"``:
    heads back), is one 2-D :func:`_dense_2d` on the flattened tokens and
    kernel: the shape every backend's fastest GEMM (oneDNN, cuBLAS, XLA)
    takes as it is, with the bias add TensorFlow's grappler fuses into it.
    The kernel keeps its einsum shape ((D, heads, D/heads) or (heads,
    D/heads, D), the released checkpoints' layout); ``quantize``,
    ``enable_lora`` and their calls are Keras' own, as in
    :class:`FusedDense`."""

    def call(self, inputs, training=None):
        flat = _flat_einsum(self.equation)
        kernel_axes = self.equation.replace(" ", "").split("->")[0]
        kernel_axes = kernel_axes.split(",")[1]
        # One BiasAdd needs a bias over every output axis of the kernel.
        if (flat is None or self.bias is None
                or self.activation not in (None, keras.activations.linear)
                or self.bias_axes != kernel_axes[flat[0]:]):
            return super().call(inputs, training=training)
        k, _ = flat
        kernel = self.kernel
        kernel_shape = tuple(kernel.shape)
        rows = math.prod(kernel_shape[:k])
        cols = math.prod(kernel_shape[k:])
        shape = ops.shape(inputs)
        lead = len(inputs.shape) - k
        x = ops.reshape(inputs, (-1, rows))
        y = _dense_2d(x, ops.reshape(ops.cast(kernel, x.dtype), (rows, cols)),
                      ops.reshape(ops.cast(self.bias, x.dtype), (cols,)),
                      training)
        return ops.reshape(y, (*shape[:lead], *kernel_shape[k:]))

    def quantize(self, mode=None, type_check=True, config=None):
        # As FusedDense: the quantized call is EinsumDense's own.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedLayerNormalization(layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` whose training call on
    TensorFlow, where the machine's plan says so, runs the normalisation
    and its gradient as one XLA program each
    (:func:`keras_vit.runtime.fused_ops.xla_layer_norm`: float32 statistics, as
    Keras' own) instead of about ten graph ops each way. Inference, other
    backends and any option other than a plain last-axis LayerNorm with
    ``center`` and ``scale`` run Keras' own call; weights, config and the
    numbers (to float32 rounding) are Keras'."""

    def call(self, inputs, training=None):
        if (self.center and self.scale and not self.rms_scaling
                and list(self.axis) in ([-1], [len(inputs.shape) - 1])
                and chains_in_xla(inputs.dtype, training)):
            from keras_vit.runtime import fused_ops

            return fused_ops.xla_layer_norm(inputs, self.gamma, self.beta,
                                            self.epsilon, self.compute_dtype)
        return super().call(inputs)


NORM_KINDS = options.choices("norm")
"""The norms a model builds: ``"layer"``, LayerNorm (subtracts the mean,
divides by the standard deviation, a scale and a bias: the paper's);
``"rms"``, RMSNorm (Zhang & Sennrich 2019: divides by the root mean
square, no mean subtracted, a scale and no bias: AIMv2's)."""


def check_norm(kind):
    """``kind`` if it is one of :data:`NORM_KINDS`, else a ValueError
    naming ``norm``."""
    return check_choice("norm", kind, NORM_KINDS)


@keras.saving.register_keras_serializable(package=PACKAGE)
class RMSNormalization(layers.RMSNormalization):
    """RMSNorm over the last axis: ``x / sqrt(mean(x ** 2) + epsilon) *
    gamma``, with no mean subtracted and no bias (timm's ``RmsNorm``, the
    epsilon inside the root as there). Keras' own layer and op
    (``keras.ops.rms_normalization``: float32 statistics, torch's
    ``rms_norm`` on torch) with two changes: the scale is the weight
    ``gamma``, the name LayerNormalization gives its scale, so a norm's
    checkpoint key is the same whichever kind it is; and the scale stays
    float32 under mixed precision (LayerNormalization's rule; Keras'
    layer would round it to bfloat16 first). Keras' other spelling,
    ``LayerNormalization(rms_scaling=True)``, is not this: it divides by
    the standard deviation (the variance around the mean).

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


def make_norm(kind, epsilon, dtype, name, fused=True):
    """The norm layer of ``kind`` (:data:`NORM_KINDS`) of ``epsilon``:
    :class:`FusedLayerNormalization` (Keras' own LayerNormalization with
    ``fused=False``: the model's norms outside the blocks, as they have
    always been saved) or :class:`RMSNormalization`.

    >>> make_norm("rms", 1e-5, None, "norm").__class__.__name__
    'RMSNormalization'
    """
    if check_norm(kind) == "rms":
        return RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    layer_norm = (FusedLayerNormalization if fused
                  else layers.LayerNormalization)
    return layer_norm(epsilon=epsilon, dtype=dtype, name=name)
