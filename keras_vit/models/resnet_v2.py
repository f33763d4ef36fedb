"""BiT: the pre-activation ResNet (v2) of "Big Transfer" as a Keras model.

Kolesnikov et al. 2020, computed exactly as the official big_transfer code
(explicit zero padding, VALID convolutions and pooling).
"""

from __future__ import annotations

import numbers

import keras
from keras import layers, ops

from keras_vit import layers as vit_layers
from keras_vit.base import geometry
from keras_vit.base.checks import check_choice, check_int, check_keywords
from keras_vit.base.options import flag
from keras_vit.layers.image_sizes import check_image_size
from keras_vit.models.common import (carry_policy, check_label_names,
                                     classification_head, image_input)
from keras_vit.models.compiled import CompiledModelMixin
from keras_vit.models.config import ConstructorConfig
from keras_vit.models.features import FeaturesMixin
from keras_vit.models.positions import check_dynamic_image_size
from keras_vit.models.quantization import QuantizeMixin

BIT_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
BIT_VARIANTS = ("R50x1", "R50x3", "R101x1", "R101x3", "R152x2", "R152x4")

_POOLINGS = (None, "avg")
_NUM_STAGES = 4
_MIN_IMAGE_SIZE = 32
# Official BiT constants: weight standardisation epsilon, GroupNorm.
_WS_EPS = 1e-10
_GN_GROUPS = 32
_GN_EPSILON = 1e-5


def _std_conv(filters, kernel_size, strides=1, dtype=None, name=None):
    return vit_layers.StdConv2D(
        filters, kernel_size, strides=strides, padding="valid",
        use_bias=False, standardization="var", eps=_WS_EPS,
        kernel_initializer="lecun_normal", dtype=dtype, name=name)


def _group_norm(groups, epsilon, dtype=None, name=None):
    return layers.GroupNormalization(groups=groups, epsilon=epsilon,
                                     dtype=dtype, name=name)


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class PreActBottleneck(layers.Layer):
    """The BiT pre-activation bottleneck unit (ResNet v2, stride on the 3x3).

    ``pre = relu(GN_a(x))``; the shortcut is ``x``, or a strided 1x1
    projection of ``pre`` when the channels or the resolution change; then
    1x1 -> GN/ReLU -> 3x3 (``strides``) -> GN/ReLU -> 1x1 (``4 * filters``),
    added to the shortcut.
    """

    def __init__(self, filters, strides=1, groups=_GN_GROUPS,
                 epsilon=_GN_EPSILON, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = vit_layers.check_remat(remat)
        self.filters = check_int("filters", filters, low=1)
        self.strides = check_int("strides", strides, low=1)
        self.groups = check_int("groups", groups, low=1)
        self.epsilon = float(epsilon)
        out = 4 * self.filters
        dt = self.dtype_policy
        self.norm_a = _group_norm(self.groups, self.epsilon, dt, "norm_a")
        self.conv_a = _std_conv(self.filters, 1, dtype=dt, name="conv_a")
        self.norm_b = _group_norm(self.groups, self.epsilon, dt, "norm_b")
        self.conv_b = _std_conv(self.filters, 3, self.strides, dt, "conv_b")
        self.norm_c = _group_norm(self.groups, self.epsilon, dt, "norm_c")
        self.conv_c = _std_conv(out, 1, dtype=dt, name="conv_c")
        self.proj = None

    def build(self, input_shape):
        in_channels = int(input_shape[-1])
        out = 4 * self.filters
        for c in (in_channels, self.filters):
            if c % self.groups:
                raise ValueError(
                    f"{self.name}: {c} channels are not divisible by "
                    f"groups={self.groups}")
        if in_channels != out or self.strides != 1:
            self.proj = _std_conv(out, 1, self.strides, self.dtype_policy,
                                  "proj")
            self.proj.build(input_shape)
        self.norm_a.build(input_shape)
        self.conv_a.build(input_shape)
        mid = tuple(input_shape[:-1]) + (self.filters,)
        self.norm_b.build(mid)
        padded = tuple(None if d is None else d + 2 for d in mid[1:3])
        self.conv_b.build((mid[0],) + padded + (self.filters,))
        out_shape = self.compute_output_shape(input_shape)
        mid_out = tuple(out_shape[:-1]) + (self.filters,)
        self.norm_c.build(mid_out)
        self.conv_c.build(mid_out)
        self.built = True

    def call(self, x, training=None):
        if self.remat and training is True:
            return vit_layers.rematerialized(self, self._forward, x)
        return self._forward(x)

    def _forward(self, x):
        pre = ops.relu(self.norm_a(x))
        shortcut = x if self.proj is None else self.proj(pre)
        y = self.conv_a(pre)
        y = ops.relu(self.norm_b(y))
        # Explicit padding and VALID: TF "SAME" differs at stride 2.
        y = ops.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)))
        y = self.conv_b(y)
        y = self.conv_c(ops.relu(self.norm_c(y)))
        return y + shortcut

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.strides

        def down(n):
            return None if n is None else (n - 1) // s + 1

        return (b, down(h), down(w), 4 * self.filters)

    def get_config(self):
        return dict(super().get_config(), filters=self.filters,
                    strides=self.strides, groups=self.groups,
                    epsilon=self.epsilon, remat=self.remat)


def _block_units(value):
    ok = (isinstance(value, (tuple, list)) and len(value) == _NUM_STAGES
          and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                  for v in value))
    if not ok:
        raise ValueError(
            f"block_units must be {_NUM_STAGES} positive integers (units per "
            f"stage, e.g. {BIT_DEPTHS[50]}); received block_units={value!r}")
    return tuple(value)


def stage_widths(width_factor, num_stages=_NUM_STAGES):
    """(root, [bottleneck width of each stage]) channels for a width factor:
    ``64 * width_factor`` and ``64 * 2**s * width_factor``."""
    if (not isinstance(width_factor, numbers.Real)
            or isinstance(width_factor, bool) or not width_factor > 0):
        raise ValueError("width_factor must be positive; received "
                         f"width_factor={width_factor!r}")
    return geometry.bit_widths(width_factor, num_stages)


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class ResNetV2(QuantizeMixin, ConstructorConfig, FeaturesMixin,
               CompiledModelMixin, keras.Model):
    """BiT ResNet-v2 of "Big Transfer (BiT): General Visual Representation
    Learning".

    Build it with :func:`keras_vit.models.resnet_v2.resnet_v2`;
    ``get_config`` returns exactly the constructor arguments.
    """

    def __init__(self, image_size=224, block_units=BIT_DEPTHS[50],
                 width_factor=1, num_classes=1000, include_top=True,
                 pooling=None, include_preprocessing=False,
                 classifier_activation=None, return_stages=False,
                 num_channels=3, label_names=None, dynamic_image_size=False,
                 remat=False, input_normalization=None, name="resnet_v2",
                 **kwargs):
        image_hw = check_image_size(image_size)
        if min(image_hw) < _MIN_IMAGE_SIZE:
            raise ValueError(
                f"image_size must be at least {_MIN_IMAGE_SIZE}; received "
                f"image_size={image_size!r}")
        units = _block_units(block_units)
        root, mids = stage_widths(width_factor)
        for c in [root] + mids:
            if c % _GN_GROUPS:
                raise ValueError(
                    f"width_factor={width_factor!r} gives {c} channels, which "
                    f"GroupNorm cannot split into {_GN_GROUPS} groups; the "
                    f"widths 64 * 2**s * width_factor must be multiples of "
                    f"{_GN_GROUPS} (e.g. width_factor 0.5, 1, 1.5, 2, 3, 4)")
        num_channels = check_int("num_channels", num_channels, low=1)
        check_choice("pooling", pooling, _POOLINGS)
        include_top = flag("include_top", include_top)
        return_stages = flag("return_stages", return_stages)
        if include_top:
            num_classes = check_int("num_classes", num_classes, low=1)
        label_names = check_label_names(label_names, num_classes,
                                        include_top)
        dtype = kwargs.pop("dtype", None)
        remat = vit_layers.check_remat(remat)
        check_dynamic_image_size(dynamic_image_size, None)

        inputs, x, input_normalization = image_input(
            (None, None) if dynamic_image_size else image_hw, num_channels,
            include_preprocessing, dtype, input_normalization)
        x = layers.ZeroPadding2D(3, dtype=dtype, name="root_pad")(x)
        x = _std_conv(root, 7, 2, dtype, "root_conv")(x)
        x = layers.ZeroPadding2D(1, dtype=dtype, name="root_pool_pad")(x)
        x = layers.MaxPooling2D(3, strides=2, padding="valid", dtype=dtype,
                                name="root_pool")(x)
        stages = {}
        for s, (n_units, mid) in enumerate(zip(units, mids)):
            for u in range(n_units):
                strides = 2 if (s > 0 and u == 0) else 1
                x = PreActBottleneck(
                    mid, strides, _GN_GROUPS, _GN_EPSILON, dtype=dtype,
                    remat=remat, name=f"stage_{s + 1}_unit_{u + 1}")(x)
            stages[f"stage_{s + 1}"] = x

        x = _group_norm(_GN_GROUPS, _GN_EPSILON, dtype, "final_norm")(x)
        x = layers.Activation("relu", dtype=dtype, name="final_relu")(x)
        x = classification_head(
            x, layers.GlobalAveragePooling2D(dtype=dtype, name="pooling")
            if include_top or pooling == "avg" else None,
            include_top, None, num_classes, "zeros", classifier_activation,
            dtype)
        outputs = {"output": x, **stages} if return_stages else x
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        carry_policy(self, dtype)
        self.block_units = list(units)
        self.num_channels, self.num_classes = num_channels, num_classes
        self.label_names = label_names
        self.remat = remat
        self.input_normalization = input_normalization


def resnet_v2(image_size, block_units, width_factor, num_classes, **kwargs):
    """Builds a BiT ResNet-v2 of any depth and width.

    Args:
        image_size: input resolution, an int or (height, width), at least 32.
        block_units: units in each of the four stages, e.g.
            ``BIT_DEPTHS[50] == (3, 4, 6, 3)``.
        width_factor: channel multiplier (1 for R50x1, 3 for R50x3, ...);
            every width must stay a multiple of the 32 GroupNorm groups.
        num_classes: size of the classification head.
        **kwargs: ``include_top``, ``pooling`` (with ``include_top=False``:
            None returns the final feature map, ``"avg"`` its mean),
            ``include_preprocessing``, ``classifier_activation``,
            ``return_stages`` (the model returns ``{"output": ...,
            "stage_1": ..., ..., "stage_4": ...}``), ``num_channels``,
            ``name``, ``dtype``.

    Returns:
        A :class:`ResNetV2` (a ``keras.Model``).

    Example:

    >>> import numpy as np
    >>> from keras_vit.models.resnet_v2 import resnet_v2
    >>> model = resnet_v2(image_size=32, block_units=(1, 1, 1, 1),
    ...                   width_factor=0.5, num_classes=10)
    >>> tuple(model(np.zeros((2, 32, 32, 3), "float32")).shape)
    (2, 10)
    """
    # Recipes set dropout_rate for every model: only a null one is taken.
    if kwargs.get("dropout_rate", 0.0) not in (0, 0.0, None):
        raise ValueError("BiT ResNet-v2 has no dropout; received dropout_rate="
                         f"{kwargs['dropout_rate']!r} (use 0 or None)")
    kwargs.pop("dropout_rate", None)
    check_keywords("resnet_v2()", kwargs, ResNetV2.__init__)
    return ResNetV2(image_size, block_units, width_factor, num_classes,
                    **kwargs)
