"""The two ends every model class of the package (ViT and its hybrids,
Axial-ViT, BiT) builds the same way: the image input with its optional
rescaling, and the classification head.

The layer names here (``images``, ``preprocessing``, ``pooling``,
``pre_logits``, ``head``, ``predictions``) are those of every checkpoint
written so far: the zoo's converters and saved ``.keras`` files find the
weights by them.
"""

from __future__ import annotations

import keras
from keras import layers

from keras_vit.base.names import class_names
from keras_vit.data.normalization import check_normalization, config_value
from keras_vit.layers.dense import FusedDense


def image_input(image_hw, num_channels, include_preprocessing, dtype,
                input_normalization=None):
    """The ``images`` input of shape (height, width, channels); returns
    ``(inputs, x, input_normalization)``: ``x`` normalised when
    ``include_preprocessing`` (as ``input_normalization`` says: see
    :mod:`keras_vit.data.normalization`; None is the official [-1, 1]),
    and the normalisation as the model's config keeps it (None for the
    official one, else ``{"mean": [...], "std": [...]}``)."""
    normalization = check_normalization("input_normalization",
                                        input_normalization, num_channels)
    inputs = keras.Input(shape=(*image_hw, num_channels), name="images")
    x = inputs
    if include_preprocessing:
        x = normalization.layer(dtype=dtype, name="preprocessing")(x)
    return inputs, x, config_value(normalization)


def patch_input(patch_size, num_channels, include_preprocessing, dtype,
                input_normalization=None):
    """:func:`image_input` for a NaFlex model: ``(inputs, x,
    input_normalization)``, ``inputs`` the dict of
    :data:`keras_vit.data.naflex.PATCH_INPUTS`
    (any number of patches), ``x`` the patches, normalised per channel
    when ``include_preprocessing``."""
    normalization = check_normalization("input_normalization",
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
    own. A functional model reports the global policy whatever its layers
    got, and Keras' ``compile`` decides loss scaling (``mixed_float16``) from
    the model's own policy: without this, float16 training ran unscaled."""
    if dtype is not None:
        model.dtype_policy = dtype


def classification_head(x, pooling_layer, include_top, representation_size,
                        num_classes, bias_initializer, classifier_activation,
                        dtype, pooled_norm=None, padding_bias=None):
    """``pooling_layer`` (or none), then ``pooled_norm`` (a layer, or
    none: the ViT family's ``fc_norm``), the optional ``pre_logits`` Dense +
    tanh, and, with ``include_top``, the zero-initialised ``head`` (its bias
    from ``bias_initializer``) and its activation. ``padding_bias``: a
    NaFlex model's, which the pooling leaves out. Both Dense layers are
    :class:`~keras_vit.layers.FusedDense`: their bias gradients sum over
    the batch in float32 under mixed precision on TensorFlow too."""
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
    :class:`~keras_vit.layers.TokenPooling` (the patch tokens after the
    ``num_prefix_tokens`` class and register tokens, or for ``"token"``
    the class token), or for ``"map"`` the attention-pool head
    (:class:`~keras_vit.layers.AttentionPoolHead`), which has weights of
    its own: its MLP as wide as the blocks' (``mlp_dim``), its GELU, norm
    kind (``norm``) and epsilon the model's, as SigLIP's, timm's and
    big_vision's heads are; ``form="aimv2"``, AIMv2's head, without them
    (its key and value biased where ``qkv_bias`` says)."""
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
    head, or None. The names travel with the model: its config holds them,
    so ``.keras`` files, :func:`keras_vit.rebuild`, the zoo's writers and
    the exporters carry them, and ``predict``/``evaluate`` speak them.

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
    # One spelling per name (NFC), so that names that read the same are
    # the same name here, in the data's folders and in every file written.
    label_names = class_names(label_names)
    seen = set()
    for name in label_names:
        if name in seen:
            raise ValueError(
                f"label_names must be distinct (evaluation maps classes by "
                f"name); {name!r} appears twice in label_names={shown}")
        seen.add(name)
    return tuple(label_names)


def set_remat(model, remat):
    """Turns rematerialisation on (``remat=True``) or off in every block of
    a built model (encoder blocks, a hybrid's ResNet units, BiT's units),
    as the builders' ``remat`` option does, and in its config (a saved
    file keeps the setting); ``None`` changes nothing. Returns ``model``.
    The next training function Keras (or the Trainer) builds uses it.

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

    blocks = [layer for layer in compat.flatten_layers(model)
              if layer is not model and hasattr(layer, "remat")
              and hasattr(layer, "_forward")]
    if not blocks:
        raise ValueError(
            f"model={model.name!r} has no block that can be rematerialised "
            "(keras_vit's ViT, hybrid, BiT and Axial-ViT models do)")
    for layer in compat.flatten_layers(model):
        if hasattr(layer, "remat"):
            layer.remat = remat
    return model


def remat_of(model):
    """Whether ``model``'s blocks are rematerialised in training (all of
    them: :func:`set_remat` and the builders switch them together)."""
    from keras_vit.runtime import compat

    flags = [layer.remat for layer in compat.flatten_layers(model)
             if layer is not model and hasattr(layer, "_forward")
             and hasattr(layer, "remat")]
    return bool(flags) and all(flags)
