"""The two ends every model class of the package builds the same way: the
image input with its optional rescaling, and the classification head (whose
layer names the converters and saved files find the weights by)."""

from __future__ import annotations

import keras
from keras import layers

from keras_vit.base.limits import MAX_LABEL_LENGTH
from keras_vit.base.options import flag
from keras_vit.base.names import class_names
from keras_vit.data.normalization import check_normalization, config_value
from keras_vit.layers.dense import FusedDense


def _normalization(include_preprocessing, input_normalization,
                   num_channels):
    """The checked ``input_normalization`` (and ``include_preprocessing``
    a flag: the string "false" is true)."""
    flag("include_preprocessing", include_preprocessing)
    return check_normalization("input_normalization", input_normalization,
                               num_channels)


def image_input(image_hw, num_channels, include_preprocessing, dtype,
                input_normalization=None):
    """The ``images`` input of shape (height, width, channels); returns
    ``(inputs, x, input_normalization)``: ``x`` normalised when
    ``include_preprocessing``, and the normalisation as the model's config
    keeps it."""
    normalization = _normalization(include_preprocessing,
                                   input_normalization, num_channels)
    inputs = keras.Input(shape=(*image_hw, num_channels), name="images")
    x = inputs
    if include_preprocessing:
        x = normalization.layer(dtype=dtype, name="preprocessing")(x)
    return inputs, x, config_value(normalization)


def patch_input(patch_size, num_channels, include_preprocessing, dtype,
                input_normalization=None):
    """:func:`image_input` for a NaFlex model: ``inputs`` the dict of
    :data:`keras_vit.data.naflex.PATCH_INPUTS`, ``x`` the patches."""
    normalization = _normalization(include_preprocessing,
                                   input_normalization, num_channels)
    width = patch_size * patch_size * num_channels
    inputs = {
        "patches": keras.Input(shape=(None, width), name="patches"),
        "patch_coords": keras.Input(shape=(None, 2), dtype="int32",
                                    name="patch_coords"),
        "patch_mask": keras.Input(shape=(None,), dtype="int32",
                                  name="patch_mask"),
    }
    x = inputs["patches"]
    if include_preprocessing:  # each pixel's channels, P * P of them
        per_patch = type(normalization)(
            tuple(normalization.mean) * patch_size ** 2,
            tuple(normalization.std) * patch_size ** 2)
        x = per_patch.layer(dtype=dtype, name="preprocessing")(x)
    return inputs, x, config_value(normalization)


def carry_policy(model, dtype):
    """Gives a model built from layers in ``dtype`` that dtype policy as its
    own: Keras' ``compile`` decides loss scaling from it (without this,
    float16 training ran unscaled)."""
    if dtype is not None:
        model.dtype_policy = dtype


def classification_head(x, pooling_layer, include_top, representation_size,
                        num_classes, bias_initializer, classifier_activation,
                        dtype, pooled_norm=None, padding_bias=None):
    """``pooling_layer`` (or none), then ``pooled_norm`` (or none), the
    optional ``pre_logits`` Dense + tanh, and, with ``include_top``, the
    zero-initialised ``head`` and its activation. ``padding_bias``: a
    NaFlex model's, which the pooling leaves out."""
    if pooling_layer is not None:
        x = (pooling_layer(x) if padding_bias is None
             else pooling_layer(x, padding_bias=padding_bias))
        if pooled_norm is not None:
            x = pooled_norm(x)
        if representation_size is not None:
            x = FusedDense(representation_size, activation="tanh",
                           kernel_initializer="lecun_normal",
                           dtype=dtype, name="pre_logits")(x)
    if include_top:
        x = FusedDense(num_classes, kernel_initializer="zeros",
                       bias_initializer=bias_initializer, dtype=dtype,
                       name="head")(x)
        if classifier_activation is not None:
            # Float32 so that softmax stays exact under mixed precision.
            x = layers.Activation(classifier_activation, dtype="float32",
                                  name="predictions")(x)
    return x


def pooling_layer(method, num_prefix_tokens, num_heads, mlp_dim, gelu,
                  layer_norm_epsilon, dtype, norm="layer", form="map",
                  qkv_bias=True):
    """The ViT's ``pooling`` layer for ``method`` (None: none): a
    :class:`~keras_vit.layers.TokenPooling`, or for ``"map"`` a
    :class:`~keras_vit.layers.AttentionPoolHead`."""
    from keras_vit import layers as vit_layers

    if method is None:
        return None
    if method == "map":
        return vit_layers.AttentionPoolHead(
            num_heads, mlp_dim, gelu=gelu,
            layer_norm_epsilon=layer_norm_epsilon,
            num_prefix_tokens=num_prefix_tokens, norm=norm, form=form,
            qkv_bias=qkv_bias, dtype=dtype, name="pooling")
    return vit_layers.TokenPooling(
        method, num_prefix_tokens=num_prefix_tokens if method != "token"
        else 0, dtype=dtype, name="pooling")


def check_label_names(label_names, num_classes, include_top):
    """``label_names`` as a tuple of class names, one per output of the
    head, or None.

    >>> check_label_names(["cat", "dog"], 2, True)
    ('cat', 'dog')
    >>> check_label_names(["cat"], 3, True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: label_names must name each of the 3 classes ...
    """
    if label_names is None:
        return None
    shown = repr(label_names)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    if isinstance(label_names, (str, bytes)) or not isinstance(
            label_names, (list, tuple)):
        raise ValueError("label_names must be a list of class names (str) "
                         f"or None; received label_names={shown}")
    if not include_top:
        raise ValueError("label_names names the classes of a head, and "
                         "include_top=False builds none; received "
                         f"label_names={shown}")
    bad = [n for n in label_names if not isinstance(n, str) or not n.strip()]
    if bad:
        raise ValueError("label_names must hold non-empty strings; received "
                         f"{bad[0]!r} in label_names={shown}")
    if len(label_names) != num_classes:
        count = len(label_names)
        raise ValueError(
            f"label_names must name each of the {num_classes} classes "
            f"(num_classes={num_classes}); received {count} "
            f"name{'s' * (count != 1)}: label_names={shown}")
    # One spelling per name (NFC): names that read the same are the same.
    label_names = class_names(label_names)
    seen = set()
    for i, name in enumerate(label_names):
        if len(name) > MAX_LABEL_LENGTH:  # as every file's reader holds
            raise ValueError(
                f"label_names must hold names of at most {MAX_LABEL_LENGTH} "
                f"characters; received label_names[{i}]={name[:40]!r}... "
                f"({len(name)} characters)")
        if name in seen:
            raise ValueError(
                f"label_names must be distinct (evaluation maps classes by "
                f"name); {name!r} appears twice in label_names={shown}")
        seen.add(name)
    return tuple(label_names)


def set_remat(model, remat):
    """Turns rematerialisation on (``remat=True``) or off in every block of
    a built model and in its config; ``None`` changes nothing. Returns
    ``model``.

    >>> import keras_vit
    >>> m = set_remat(keras_vit.vit(16, 8, 16, 2, 2, 32, 2), True)
    >>> m.get_config()["remat"], m.get_layer("encoder_block_1").remat
    (True, True)
    """
    if remat is None:
        return model
    if not isinstance(remat, bool):
        raise ValueError(f"remat must be True, False or None; received "
                         f"remat={remat!r}")
    from keras_vit.runtime import compat

    if not _remat_blocks(model):
        raise ValueError(
            f"model={model.name!r} has no block that can be rematerialised "
            "(keras_vit's ViT, hybrid, BiT and Axial-ViT models do)")
    for layer in compat.flatten_layers(model):
        if hasattr(layer, "remat"):
            layer.remat = remat
    return model


def _remat_blocks(model):
    from keras_vit.runtime import compat

    return [layer for layer in compat.flatten_layers(model)
            if layer is not model and hasattr(layer, "remat")
            and hasattr(layer, "_forward")]


def remat_of(model):
    """Whether ``model``'s blocks are rematerialised in training."""
    flags = [layer.remat for layer in _remat_blocks(model)]
    return bool(flags) and all(flags)
