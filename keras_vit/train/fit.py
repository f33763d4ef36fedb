"""Keras' own loop (``model.fit``) following a recipe: the optimizer,
schedule, clipping, gradient accumulation and loss of
:mod:`~keras_vit.train.recipes` on one device.
"""

from __future__ import annotations

import math

from keras_vit.train import recipes as recipes_lib
from keras_vit.train.evaluation import classifier_of, model_classes
from keras_vit.base.checks import check_model


def compile_for_finetune(model, recipe="finetune", *, steps_per_epoch=None,
                         check_memory=True, label_names=None, remat=None,
                         **overrides):
    """Compiles ``model`` for ``model.fit`` with a recipe's optimizer,
    schedule, clipping, gradient accumulation and loss (one device; use
    :class:`Trainer` for distributed runs). Returns the :class:`Recipe`.

    Feed it batches of ``recipe.micro_batch_size or recipe.batch_size``
    (e.g. from :func:`~keras_vit.train.dataset`) for ``total_steps``
    optimizer steps (times the accumulation steps when accumulating).

    On a CPU, a step that clearly cannot fit the memory available (ViT-B/16
    at 224 needs about 143 GiB of activations for 512 images) is refused,
    naming a ``micro_batch_size`` that fits; ``check_memory=False`` skips
    the check.

    ``remat``: True rematerialises every block of ``model`` in training
    (less memory, about one more forward pass a step); False turns it off;
    None keeps the model's own setting.

    ``label_names``: the classes the model learns: a list of names, or the
    data source itself (its ``class_names``). A head whose names differ is
    refused (:func:`~keras_vit.train.build.name_classes`).

    >>> import keras, keras_vit, keras_vit.train as kt
    >>> keras.utils.set_random_seed(0)
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
    >>> source = kt.load_data("digits")
    >>> r = kt.compile_for_finetune(model, total_steps=6, warmup_steps=1,
    ...                             batch_size=32, learning_rate=0.03,
    ...                             label_names=source)
    >>> ds = kt.dataset(source, 16, r.batch_size, crop_area=None)
    >>> h = model.fit(ds, steps_per_epoch=6, epochs=1, verbose=0)
    >>> h.history["loss"][0] < 2.31, model.label_names[:3]
    (True, ('0', '1', '2'))
    """
    check_model("model", model)
    from keras_vit.train.build import name_classes

    if label_names is not None and not isinstance(label_names, (list,
                                                                tuple)):
        if not hasattr(label_names, "class_names"):
            raise ValueError(
                "label_names must be a list of class names or a data source "
                "with class_names; received label_names of type "
                f"{type(label_names).__name__}")
        label_names = label_names.class_names
    if label_names is not None and len(label_names) != model_classes(model):
        raise ValueError(
            f"label_names names {len(label_names)} classes but model="
            f"{model.name!r} has {model_classes(model)} outputs; received "
            f"label_names={list(label_names)[:10]}")
    name_classes(model, label_names, argument="label_names")
    r = recipes_lib.get(recipe, classifier=classifier_of(model),
                        **overrides)
    if r.total_steps is None:
        if steps_per_epoch is None:
            raise ValueError(
                f"recipe {r.name!r} counts epochs={r.epochs}; pass "
                "steps_per_epoch=... (or total_steps=...) so the learning-"
                "rate schedule knows the run's length")
        total = max(1, math.ceil(r.epochs * steps_per_epoch))
    else:
        total = r.total_steps
    r = recipes_lib.fit_to_run(r, total, named=isinstance(recipe, str),
                               overrides=overrides)
    accum = 1
    if r.micro_batch_size:
        if r.batch_size % r.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={r.micro_batch_size} must divide "
                f"batch_size={r.batch_size}")
        accum = r.batch_size // r.micro_batch_size
    from keras_vit.models.common import set_remat

    set_remat(model, remat)
    if check_memory:
        _check_step_memory(model, r)
    recipes_lib.compile_model(model, r, total, accumulation_steps=accum,
                              jit_compile=_fit_jit(model, r))
    return r


def _check_step_memory(model, recipe):
    """:func:`keras_vit.models.memory.check_step` for the step ``model.fit``
    will run, split over the replicas of an active strategy."""
    from keras_vit.models.memory import check_step
    from keras_vit.runtime.backend import is_tensorflow

    replicas = 1
    if is_tensorflow():
        import tensorflow as tf

        if tf.distribute.has_strategy():
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
    per_replica = max(1, recipe.batch_size // replicas)
    images = max(1, (recipe.micro_batch_size or recipe.batch_size)
                 // replicas)
    check_step(model, images, per_replica=per_replica,
               batch_size=recipe.batch_size)


def _fit_jit(model, recipe):
    """``jit_compile`` for ``model.fit``: on TensorFlow the Trainer's
    decision (:func:`keras_vit.train.distribute.step_uses_xla`; Keras' own
    "auto" never uses XLA on a CPU); elsewhere the recipe's, or "auto"."""
    from keras_vit.runtime.backend import is_tensorflow

    if not is_tensorflow():
        return (recipe.jit_compile if recipe.jit_compile in (True, False)
                else "auto")
    import tensorflow as tf

    from keras_vit.models.compiled import model_compute_dtype
    from keras_vit.train.distribute import step_uses_xla

    return step_uses_xla(tf.distribute.get_strategy(), recipe.jit_compile,
                         model_compute_dtype(model))


def smoothed_sparse_crossentropy(label_smoothing=0.0):
    """Cross-entropy from logits for integer labels, with label smoothing
    (Keras' sparse loss has none; its dense one needs one-hot labels)."""
    import keras

    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return recipes_lib.smoothed_loss(label_smoothing)
