"""The model a training run trains, built in the run's placement scope
(:mod:`~keras_vit.train.placement`) under its dtype policy
(:func:`build_model`, :func:`dtype_policy`).
"""

from __future__ import annotations

import os

from keras_vit.runtime.policy import dtype_policy_scope
from keras_vit.train.evaluation import (model_classes, model_image_size,
                                        model_label_names, shown_names)


# Layers built inside get the named Keras dtype policy.
dtype_policy = dtype_policy_scope


def build_model(model, *, num_classes, image_size=None, weights="auto",
                dropout_rate=None, model_options=None, label_names=None,
                drop_path_rate=None, dtype=None):
    """A model for training, built in the current strategy scope.

    ``model`` is a zoo name (loaded with ``weights``), a ``.keras`` path, a
    ``keras.Model`` (a keras_vit model is rebuilt with the same weights
    when ``image_size``, ``num_classes``, ``dropout_rate``,
    ``drop_path_rate`` or the dtype policy differ), or a function returning
    a model. A new head is zero-initialised.

    ``label_names``: the class names of the data, or None
    (:func:`name_classes`). ``dtype``: the dtype policy the run trains in;
    None: Keras' global policy.
    """
    import keras

    dtype = dtype or keras.config.dtype_policy().name
    return name_classes(_build(model, num_classes, image_size, weights,
                               dropout_rate, model_options, drop_path_rate,
                               dtype), label_names)


def _build(model, num_classes, image_size, weights, dropout_rate,
           model_options, drop_path_rate, dtype):
    import keras

    from keras_vit.zoo.build import is_keras_vit_model
    from keras_vit.zoo.resolve import model_path, rebuild, resolve_model

    options = dict(model_options or {})
    options.setdefault("dtype", dtype)
    if isinstance(model, (str, os.PathLike)) and model_path(model) is None:
        if dropout_rate is not None:
            options.setdefault("dropout_rate", dropout_rate)
        if drop_path_rate is not None:
            options.setdefault("drop_path_rate", drop_path_rate)
        return resolve_model(model, weights=weights, image_size=image_size,
                             num_classes=num_classes, **options)
    if isinstance(model, (str, os.PathLike)):
        model = resolve_model(model)  # a .keras file or a run directory
    elif callable(model) and not isinstance(model, keras.Model):
        with dtype_policy_scope(dtype):  # its layers take the run's policy
            model = model()
    if hasattr(model, "to_classifier") and num_classes is not None:
        # A self-supervised model: its encoder with a new head.
        model = model.to_classifier(num_classes)
    if not isinstance(model, keras.Model):
        raise ValueError(
            "model must be a zoo name, a .keras path, a keras.Model or a "
            f"function returning one; received model={model!r}")
    changes = {}
    if image_size is not None and model_image_size(model) != image_size:
        changes["image_size"] = image_size
    if dropout_rate is not None and hasattr(model, "dropout_rate"):
        changes["dropout_rate"] = dropout_rate
    if drop_path_rate is not None:
        if "drop_path_rate" not in model.get_config():
            raise ValueError(
                f"drop_path_rate={drop_path_rate} (stochastic depth) needs a "
                "keras_vit ViT; model="
                f"{model.name!r} of type {type(model).__name__} has none")
        changes["drop_path_rate"] = drop_path_rate
    if not is_keras_vit_model(model):
        # Another Keras model is trained as it is.
        if changes.get("image_size") is not None:
            rebuild(model, image_size=image_size)
        return _copy_into_scope(model)
    rebuilt = rebuild(model, num_classes=num_classes, dtype=dtype,
                      copy=False, **changes)
    if rebuilt is not model:
        return rebuilt
    return _copy_into_scope(model)


def name_classes(model, label_names, *, argument="the data"):
    """``model`` with its head's classes named ``label_names`` (in place,
    in the model's config).

    None changes nothing; so does a model whose outputs are not one per
    name. A head that already has other names is refused (``argument``
    naming where the new ones come from). A model that is not a keras_vit
    model cannot keep names in its files: a warning says so.

    >>> import keras_vit
    >>> m = keras_vit.vit(16, 8, 16, 1, 2, 32, 2)
    >>> name_classes(m, ["cat", "dog"]).label_names
    ('cat', 'dog')
    >>> name_classes(m, ["dog", "cat"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: the model's head already names its classes ['cat', 'dog'] ...
    """
    import warnings

    from keras_vit.models.common import check_label_names

    if label_names is None:
        return model
    names = tuple(label_names)
    if model_classes(model) != len(names):
        return model
    have = model_label_names(model)
    if have is not None:
        if have != names:
            raise ValueError(
                f"the model's head already names its classes {shown_names(have)}"
                f" but {argument} has the classes {shown_names(names)}: its "
                "outputs would be read as other classes. Use data with the "
                "model's classes (same names, same order), or start from a "
                "model without them (a zoo name with another num_classes "
                "gets a new head)")
        if getattr(model, "label_names", None) is not None:
            return model
    from keras_vit.models import (AxialVisionTransformer, ResNetV2,
                                  VisionTransformer)

    if not isinstance(model, (VisionTransformer, AxialVisionTransformer,
                              ResNetV2)):
        warnings.warn(
            f"model={model.name!r} is a {type(model).__name__}, not a "
            f"keras_vit model: its files cannot keep the class names "
            f"{shown_names(names)}", UserWarning, stacklevel=2)
        return model
    try:
        checked = check_label_names(list(names), model_classes(model),
                                    getattr(model, "include_top", True))
    except ValueError as e:  # e.g. a dataset naming two classes alike
        raise ValueError(f"the class names of {argument} cannot name the "
                         f"model's classes: {e}") from None
    # The attribute the constructor sets, which the config returns.
    model.label_names = checked
    return model


def _copy_into_scope(model):
    """The same model with its variables created in the current strategy's
    scope (a no-op when they already are, and on jax and torch)."""
    from keras_vit.runtime.backend import is_tensorflow

    if not is_tensorflow():
        return model
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if all(strategy.extended.variable_created_in_scope(v.value)
           for v in model.variables):
        return model
    from keras_vit.zoo import rebuild

    return rebuild(model)
