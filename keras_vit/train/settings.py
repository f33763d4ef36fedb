"""A run's settings: the recipe fitted to the data, the devices and the
model, each checked before anything is trained, with errors that name the
setting.
"""

from __future__ import annotations

import dataclasses

from keras_vit.base.checks import printable
from keras_vit.train.data import pipeline
from keras_vit.train import recipes as recipes_lib
from keras_vit.train.evaluation import classifier_of, model_classes


def split_batch(batch_size, micro_batch_size, replicas, strategy_name):
    """``(per_replica, micro, accumulation_steps)``: ``batch_size`` split
    over ``replicas``, and each replica's share into micro-batches of
    ``micro_batch_size`` (None: one micro-batch).

    >>> split_batch(512, 64, 4, "mirrored")
    (128, 64, 2)
    """
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by the "
            f"{replicas} replicas of the {strategy_name} strategy; "
            f"use a multiple of {replicas}")
    per_replica = batch_size // replicas
    micro = micro_batch_size or per_replica
    if per_replica % micro:
        raise ValueError(
            f"micro_batch_size={micro_batch_size} must divide the "
            f"per-replica batch {per_replica} (batch_size="
            f"{batch_size} over {replicas} replicas)")
    return per_replica, micro, per_replica // micro


@dataclasses.dataclass(frozen=True)
class Plan:
    """The recipe fitted to the data and the devices (:func:`plan`)."""

    recipe: recipes_lib.Recipe
    per_replica: int
    micro: int
    accum: int
    steps_per_epoch: int
    total_steps: int


def plan(recipe, train, eval_=None, *, replicas, strategy_name,
         named=False, overrides=()):
    """The :class:`Plan` of ``recipe`` on the data ``train`` (and
    ``eval_``) over ``replicas`` devices; ``named`` and ``overrides`` as
    :func:`~keras_vit.train.recipes.fit_to_run` takes them."""
    if eval_ is not None and eval_.num_classes != train.num_classes:
        raise ValueError(
            f"eval_data has {eval_.num_classes} classes but "
            f"train_data has {train.num_classes}; received "
            f"eval_data={eval_.name!r}")
    if (eval_ is not None and eval_.class_names and train.class_names
            and list(eval_.class_names) != list(train.class_names)):
        raise ValueError(
            f"eval_data has the classes {eval_.class_names[:10]} but "
            f"train_data has {train.class_names[:10]}; received "
            f"eval_data={eval_.name!r}")
    r = recipe
    per_replica, micro, accum = split_batch(
        r.batch_size, r.micro_batch_size, replicas, strategy_name)
    steps_per_epoch = pipeline.steps_per_epoch(train, r.batch_size)
    total_steps = r.steps_for(train.num_examples)
    r = recipes_lib.fit_to_run(r, total_steps, named=named,
                               overrides=overrides)
    return Plan(r, per_replica, micro, accum, steps_per_epoch, total_steps)


def check_head(model, num_classes):
    """A ValueError unless ``model`` has ``num_classes`` outputs."""
    if model_classes(model) != num_classes:
        raise ValueError(
            f"model={model.name!r} has {model_classes(model)} outputs "
            f"but the data has {num_classes} classes; pass a "
            "zoo name or a VisionTransformer (they get a new "
            "zero-initialised head of the right size)")


def model_settings(model, recipe, overrides=()):
    """The resolution and dropout to build ``model`` with: the recipe's for
    a zoo name; a given model (a ``.keras`` path, a ``keras.Model``, a
    function) keeps its own (None) unless ``overrides`` names them."""
    given = not isinstance(model, str) or model.endswith(".keras")
    out = {key: (getattr(recipe, key) if key in overrides or not given
                 else None)
           for key in ("image_size", "dropout_rate")}
    # Stochastic depth is the recipe's whenever it has one (DeiT's 0.1).
    out["drop_path_rate"] = (recipe.drop_path_rate if recipe.drop_path_rate
                             or "drop_path_rate" in overrides else None)
    return out


def fit_to_model(recipe, model, *, image_size, name=None, overrides=()):
    """``recipe`` with the built ``model``'s ``image_size`` and dropout,
    and for a recipe asked for by ``name``, the learning rate of its head
    unless ``overrides`` sets one."""
    head = classifier_of(model)
    if head and name is not None and "learning_rate" not in overrides:
        recipe = recipe.replace(learning_rate=recipes_lib.head_learning_rate(
            name, head, batch_size=recipe.batch_size))
    return recipe.replace(
        image_size=image_size,
        dropout_rate=float(getattr(model, "dropout_rate",
                                   recipe.dropout_rate)))


def model_name(given, model):
    """The name a run records for its model: the zoo name or path it was
    ``given``, else the built ``model``'s zoo name or Keras name."""
    return (given if isinstance(given, str)
            else getattr(model, "zoo_name", None) or model.name)


def record(run):
    """The settings of ``run`` (a :class:`~keras_vit.train.Trainer`) as
    ``run.json`` and its checkpoints record them."""
    names = getattr(run.model, "label_names", None)
    return {
        "model": run.model_name,
        "train_data": run.train.name,
        "eval_data": None if run.eval is None else run.eval.name,
        "num_classes": run.train.num_classes,
        "label_names": None if names is None else list(names),
        "image_size": run.image_size,
        "recipe": run.recipe.to_dict(),
        "total_steps": run.total_steps,
        "steps_per_epoch": run.steps_per_epoch,
        "strategy": run.info,
        "backend": run.placement.backend,
        "precision": run.precision,
        "jit_compile": run.jit_compile,
        "micro_batch_size": run.micro,
        "accumulation_steps": run.accum,
    }


def classes_text(source, limit=5):
    """``"N classes"``, with the first ``limit`` names when ``source``
    has them.

    >>> from keras_vit.train.data.sources import ArraySource
    >>> import numpy as np
    >>> classes_text(ArraySource(np.zeros((2, 4, 4, 3)), np.array([0, 1]),
    ...                          class_names=["cat", "dog"]))
    '2 classes: cat, dog'
    """
    text = f"{source.num_classes} classes"
    names = source.class_names
    if not names:
        return text
    more = ", ..." if len(names) > limit else ""
    return text + ": " + ", ".join(printable(n) for n in names[:limit]) + more


def describe(run):
    """One paragraph on what ``run`` (a :class:`~keras_vit.train.Trainer`)
    does."""
    r = run.recipe
    accum = (f", {run.accum} accumulation steps of {run.micro}"
             if run.accum > 1 else "")
    backend = ("" if run.placement.backend == "tensorflow"
               else f" on {run.placement.backend}")
    return (
        f"{run.model_name} ({run.model.count_params():,} parameters) "
        f"at {run.image_size}x{run.image_size} on {run.train.name} "
        f"({run.train.num_examples} images, {classes_text(run.train)}): "
        f"recipe {r.name}, {r.optimizer} lr {r.learning_rate:g} "
        f"{r.schedule} (warmup {r.warmup_steps}), {run.total_steps} "
        f"steps of {r.batch_size} images ({run.steps_per_epoch} per "
        f"epoch; {run.placement.replicas} replica(s) x "
        f"{run.per_replica}{accum}), strategy {run.info['name']}"
        f"{backend}, {run.precision}"
        f"{', XLA' if run.jit_compile else ''}")
