"""How a classifier is measured: its loss and hits on a training batch
(:func:`classification_terms`, the Trainer's objective), its accuracy and
loss on held-out data (:func:`evaluate`), and what the training code reads
off a model (its image size, classes and classifier).

:func:`evaluate` runs under a ``tf.distribute`` strategy on TensorFlow and
on one device on jax and torch; the Trainer's engines
(:mod:`~keras_vit.train.engine_tf`, :mod:`~keras_vit.train.engine_keras`)
call it for their evaluations.
"""

from __future__ import annotations

import numpy as np

from keras_vit.train import data as data_lib
from keras_vit.train import distribute as strategy_lib
from keras_vit.train import recipes as recipes_lib


def model_image_size(model):
    """The side of the square images ``model`` takes (its input's fixed
    size), or a ValueError."""
    shape = model.inputs[0].shape
    if shape[1] is None or shape[1] != shape[2]:
        raise ValueError(
            f"model={model.name!r} must take square images of a fixed size; "
            f"its input shape is {tuple(shape)}")
    return int(shape[1])


def model_classes(model):
    """How many outputs (classes) ``model`` has."""
    return int(model.outputs[0].shape[-1])


def classifier_of(model):
    """``"token"`` or ``"gap"`` for a ViT, else None (BiT, other models)."""
    head = getattr(model, "classifier", None)
    return head if head in recipes_lib.CLASSIFIERS else None


def classification_terms(logits, labels, num_classes, *,
                         label_smoothing=0.0):
    """The softmax cross-entropy of ``logits`` against the integer
    ``labels`` (targets smoothed by ``label_smoothing``) summed over the
    batch, and how many of its images were right, both float32 scalars.
    Written with ``keras.ops``: it runs inside every backend's step.

    >>> import numpy as np
    >>> loss, right = classification_terms(
    ...     np.zeros((2, 4), "float32"), np.array([1, 3]), 4)
    >>> round(float(loss) / 2, 4), float(right)  # chance: log(4)
    (1.3863, 0.0)
    """
    from keras import ops

    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    target = ops.one_hot(labels, num_classes)
    if label_smoothing:
        target = (target * (1.0 - label_smoothing)
                  + label_smoothing / num_classes)
    per_example = -ops.sum(target * ops.log_softmax(logits, axis=-1),
                           axis=-1)
    correct = ops.sum(ops.cast(
        ops.equal(ops.cast(ops.argmax(logits, axis=-1), "int32"), labels),
        "float32"))
    return ops.sum(per_example), correct


def evaluate(model, data, *, image_size=None, batch_size=64,
             strategy="default", eval_crop=1.0, verbose=True, _cache=None):
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``data``.

    Every image is counted once: the last batch is padded with masked
    blanks, so all replicas and workers run the same steps.

    >>> import keras_vit, keras_vit.train as kt
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)  # zero head: chance
    >>> r = kt.evaluate(model, "digits:test", verbose=False)
    >>> r["num_examples"], round(r["loss"], 4)
    (450, 2.3026)
    """
    import keras
    import tensorflow as tf
    from tqdm.auto import tqdm

    on_tf = keras.backend.backend() == "tensorflow"
    if not on_tf:
        strategy_lib.check_backend(strategy)
    source = data_lib.load_data(data, split="test", verbose=verbose)
    size = image_size or model_image_size(model)
    if model_classes(model) < source.num_classes:
        raise ValueError(
            f"model={model.name!r} has {model_classes(model)} outputs but "
            f"data={source.name!r} has {source.num_classes} classes")
    if not on_tf:
        return _evaluate_one_device(model, source, size, batch_size,
                                    eval_crop)
    strategy_ = strategy_lib.strategy(strategy)
    replicas = strategy_.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"batch_size={batch_size} is not divisible by the "
                         f"{replicas} replicas")
    per_replica = batch_size // replicas
    steps = -(-source.num_examples // batch_size)

    def fn(ctx):
        local = replicas // ctx.num_input_pipelines
        return data_lib.padded_eval_dataset(
            source, size, per_replica, num_batches=steps * local,
            shard=(ctx.num_input_pipelines, ctx.input_pipeline_id),
            eval_crop=eval_crop, raw_pixels=data_lib.takes_raw_pixels(model))

    dist = strategy_.distribute_datasets_from_function(fn)
    cache = _cache if _cache is not None else {}
    key = (id(model), id(strategy_))
    if key not in cache:
        def replica_fn(images, labels, mask):
            logits = tf.cast(model(images, training=False), tf.float32)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, logits)
            correct = tf.cast(tf.equal(tf.argmax(logits, -1), labels),
                              tf.float32)
            return (tf.reduce_sum(per_example * mask),
                    tf.reduce_sum(correct * mask), tf.reduce_sum(mask))

        @tf.function
        def step_fn(iterator):
            out = strategy_.run(replica_fn, args=next(iterator))
            return [strategy_.reduce(tf.distribute.ReduceOp.SUM, o, axis=None)
                    for o in out]

        cache[key] = step_fn
    step_fn = cache[key]
    totals = np.zeros(3)
    iterator = iter(dist)
    # leave=None: a bar of its own stays, ending its line (cleared, it left
    # a carriage return that the next printed line was glued to in logs);
    # one under the training bar (eval_every) is cleared.
    for _ in tqdm(range(steps), desc="evaluate", unit="batch", leave=None,
                  disable=not verbose or steps < 20):
        totals += [float(v) for v in step_fn(iterator)]
    loss, correct, count = (float(v) for v in totals)
    return {"accuracy": correct / max(count, 1.0),
            "loss": loss / max(count, 1.0), "num_examples": int(count)}


def _evaluate_one_device(model, source, size, batch_size, eval_crop):
    """:func:`evaluate` on the jax and torch backends: the same padded,
    masked batches (tf.data stays the input pipeline), the model run eagerly
    on NumPy without gradients, the sums taken in float64."""
    import keras

    from keras_vit.backend import infer

    if keras.backend.backend() == "jax":
        # Keras' compiled predict step: op-by-op eager jax is many times
        # slower, and the padded batches all have one shape.
        def infer(model, images):  # noqa: F811 - the jax way
            out = model.predict_on_batch(images)
            return np.asarray(out[0] if isinstance(out, (list, tuple))
                              else out)

    steps = -(-source.num_examples // batch_size)
    loss = correct = count = 0.0
    for images, labels, mask in data_lib.padded_eval_dataset(
            source, size, batch_size, num_batches=steps,
            eval_crop=eval_crop, raw_pixels=data_lib.takes_raw_pixels(model)
    ).as_numpy_iterator():
        logits = infer(model, images).astype("float64")
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, labels[:, None], -1)[:, 0]
        loss -= float((picked * mask).sum())
        correct += float(((logits.argmax(-1) == labels) * mask).sum())
        count += float(mask.sum())
    return {"accuracy": correct / max(count, 1.0),
            "loss": loss / max(count, 1.0), "num_examples": int(count)}
