"""How a classifier is measured: its accuracy and
loss on held-out data (:func:`evaluate`), and what the training code reads
off a model (its image size, classes and classifier).
"""

from __future__ import annotations

import numpy as np

from keras_vit.base.checks import printable
from keras_vit.base.names import class_name, shown_apart
from keras_vit.train.data.load import load_data
# model_image_size: where the training code has always read it.
from keras_vit.train.data.pipeline import (  # noqa: F401
    model_image_size, padded_eval_dataset)
from keras_vit.train import distribute as strategy_lib
from keras_vit.train import recipes as recipes_lib


def model_classes(model):
    """How many outputs (classes) ``model`` has."""
    return int(model.outputs[0].shape[-1])


def model_label_names(model):
    """The class names ``model``'s head carries, as a tuple, or None."""
    names = (getattr(model, "label_names", None)
             or getattr(model, "zoo_labels", None))
    return tuple(names) if names else None


def shown_names(names, limit=10):
    """``names`` for a message: the first ``limit`` and how many more."""
    names = list(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return "[" + ", ".join(repr(printable(n)) for n in names[:limit]) + (
        f"]{more}")


def _apart(names, others, limit=10):
    """``names`` for a message, each one that looks like one of
    ``others`` followed by its code points (:func:`shown_apart`)."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return "[" + ", ".join(shown_apart(printable(n), others)
                           for n in names[:limit]) + f"]{more}"


def _output_keys(model, count):
    """For each of ``model``'s ``count`` outputs, the names it answers
    to: its class name and, where known, its WordNet id. None when the
    model names no classes."""
    from keras_vit.zoo.preprocessing import model_labels

    keys = None
    names = model_label_names(model)
    if names is not None and len(names) == count:
        keys = [[class_name(n)] for n in names]
    _, rows = model_labels(model, count, by_head=False)
    if rows is not None:
        if keys is None:
            keys = [[] for _ in range(count)]
        for key, (wnid, name) in zip(keys, rows):
            key.extend(class_name(k) for k in (name, wnid)
                       if k and class_name(k) not in key)
    return keys


def class_mapping(model, source):
    """How the classes of ``source`` (an ImageSource) are read off
    ``model``'s outputs: ``(mapping, how)``, ``mapping`` an int64 array
    (data label -> output index) or None for "label i is output i",
    ``how`` a sentence for the output (None when there is nothing to say).

    By name when both name their classes (a name the model does not have
    is refused). A model without names takes named data by position only
    when the class counts match. Data without names is read by position.

    >>> import keras_vit
    >>> from keras_vit.train.data.sources import ArraySource
    >>> import numpy as np
    >>> model = keras_vit.vit(16, 8, 16, 1, 2, 32, 3,
    ...                       label_names=["bird", "cat", "dog"])
    >>> dogs = ArraySource(np.zeros((2, 16, 16, 3)), np.array([0, 0]),
    ...                    class_names=["dog"])
    >>> mapping, how = class_mapping(model, dogs)
    >>> mapping.tolist(), how
    ([2], "the data's 1 class matched by name to the model's 3: dog")
    """
    count = model_classes(model)
    data_names = source.class_names
    if not data_names:
        return None, None
    keys = _output_keys(model, count)
    if keys is None:
        if count == source.num_classes:
            return None, (
                f"the model names no classes: the data's classes "
                f"{shown_names(data_names)} are taken as its outputs 0-"
                f"{count - 1} by position")
        raise ValueError(
            f"model={model.name!r} names no classes and has {count} "
            f"outputs, and data={source.name!r} has {source.num_classes} "
            f"named classes {shown_names(data_names)}: they match neither by "
            "name nor by position. Evaluate a model that names its "
            "classes (a fine-tune run names them after its data)")
    index, taken = {}, set()
    for position, names in enumerate(keys):
        for key in names:
            if key in index and index[key] != position:
                taken.add(key)  # two outputs answer to it: not a key
            index.setdefault(key, position)
    model_names = [k[0] if k else str(i) for i, k in enumerate(keys)]
    missing = [n for n in data_names if n not in index]
    if missing:
        alike = [n for n in model_names
                 if shown_apart(n, missing) != repr(n)]
        raise ValueError(
            f"data={source.name!r} has the classes "
            f"{_apart(missing, model_names)} that model={model.name!r} does "
            f"not have; the model's classes are {shown_names(model_names)}"
            + (f", of them {_apart(alike, missing)} only look alike"
               if alike else ""))
    twice = [n for n in data_names if n in taken]
    if twice:
        raise ValueError(
            f"data={source.name!r} has the classes {shown_names(twice)}, "
            f"which more than one output of model={model.name!r} answers "
            f"to; the model's classes are {shown_names(model_names)}")
    mapping = np.asarray([index[n] for n in data_names], "int64")
    if count == len(data_names) and (mapping == np.arange(count)).all():
        return None, None
    n = len(data_names)
    shown = ", ".join(printable(name) for name in data_names[:5]) + (
        ", ..." if n > 5 else "")
    return mapping, (
        f"the data's {n} class{'es' * (n != 1)} matched by name to the "
        f"model's {count}: {shown}")


def classifier_of(model):
    """``"token"`` or ``"gap"`` for a ViT, else None (BiT, other models)."""
    head = getattr(model, "classifier", None)
    return head if head in recipes_lib.CLASSIFIERS else None


def evaluate(model, data, *, image_size=None, batch_size=64,
             strategy="default", eval_crop=1.0, verbose=True, _cache=None):
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``data``,
    overall and per class (``per_class``, keyed by class name).

    Every image is counted once (the last batch is padded with masked
    blanks). Classes are matched as :func:`class_mapping` says.

    >>> import keras_vit, keras_vit.train as kt
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)  # zero head: chance
    >>> r = kt.evaluate(model, "digits:test", verbose=False)
    >>> r["num_examples"], round(r["loss"], 4)
    (450, 2.3026)
    """
    import tensorflow as tf
    from tqdm.auto import tqdm

    from keras_vit.runtime.backend import is_tensorflow

    on_tf = is_tensorflow()
    if not on_tf:
        strategy_lib.check_backend(strategy)
    source = load_data(data, split="test", verbose=verbose)
    size = image_size or model_image_size(model)
    mapping, how = class_mapping(model, source)
    if mapping is None and model_classes(model) < source.num_classes:
        raise ValueError(
            f"model={model.name!r} has {model_classes(model)} outputs but "
            f"data={source.name!r} has {source.num_classes} classes")
    outputs = model_classes(model)
    table = (np.arange(source.num_classes, dtype="int64") if mapping is None
             else mapping)
    if not on_tf:
        totals = _evaluate_one_device(model, source, size, batch_size,
                                      eval_crop, table, outputs)
        return _result(totals, model, source, table, how)
    strategy_ = strategy_lib.strategy(strategy)
    replicas = strategy_.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"batch_size={batch_size} is not divisible by the "
                         f"{replicas} replicas")
    per_replica = batch_size // replicas
    steps = -(-source.num_examples // batch_size)

    def fn(ctx):
        local = replicas // ctx.num_input_pipelines
        return _to_outputs(padded_eval_dataset(
            source, size, per_replica, num_batches=steps * local,
            shard=(ctx.num_input_pipelines, ctx.input_pipeline_id),
            eval_crop=eval_crop, model=model),
            table)

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
            seen = tf.math.unsorted_segment_sum(mask, labels, outputs)
            hits = tf.math.unsorted_segment_sum(correct * mask, labels,
                                                outputs)
            return (tf.reduce_sum(per_example * mask),
                    tf.reduce_sum(correct * mask), tf.reduce_sum(mask),
                    seen, hits)

        @tf.function
        def step_fn(iterator):
            out = strategy_.run(replica_fn, args=next(iterator))
            return [strategy_.reduce(tf.distribute.ReduceOp.SUM, o, axis=None)
                    for o in out]

        cache[key] = step_fn
    step_fn = cache[key]
    totals = [0.0, 0.0, 0.0, np.zeros(outputs), np.zeros(outputs)]
    iterator = iter(dist)
    # leave=None: a bar of its own stays (cleared, it left a carriage
    # return the next line was glued to); one under the training bar goes.
    for _ in tqdm(range(steps), desc="evaluate", unit="batch", leave=None,
                  disable=not verbose or steps < 20):
        for i, v in enumerate(step_fn(iterator)):
            totals[i] = totals[i] + np.asarray(v, "float64")
    return _result(totals, model, source, table, how)


def _to_outputs(batches, table):
    """``(images, labels, mask)`` batches with the data's labels turned
    into the model's output indices (``table[label]``)."""
    import tensorflow as tf

    table = tf.constant(table, tf.int64)
    return batches.map(lambda x, y, m: (x, tf.gather(table, y), m))


def _result(totals, model, source, table, how):
    """The figures of :func:`evaluate` from the sums ``(loss, correct,
    count, images per output, hits per output)``."""
    loss, correct, count = (float(v) for v in totals[:3])
    seen, hits = totals[3], totals[4]
    model_names = model_label_names(model)
    per_class = {}
    for label, output in enumerate(table):
        if source.class_names:
            name = source.class_names[label]
        elif model_names is not None and len(model_names) == len(seen):
            name = model_names[output]
        else:
            name = f"class {label}"
        n = int(seen[output])
        per_class[str(name)] = {
            "accuracy": float(hits[output]) / n if n else None,
            "num_examples": n}
    result = {"accuracy": correct / max(count, 1.0),
              "loss": loss / max(count, 1.0), "num_examples": int(count),
              "per_class": per_class}
    if how is not None:
        result["classes"] = how
    return result


#: Up to this many classes, the command line prints a line per class.
PER_CLASS_LINES = 20


def result_lines(result, limit=PER_CLASS_LINES):
    """The lines the command line prints under an evaluation's headline
    (each class's accuracy when there are at most ``limit``).

    >>> result_lines({"classes": "matched by name", "per_class": {
    ...     "dog": {"accuracy": 0.5, "num_examples": 4},
    ...     "cat": {"accuracy": None, "num_examples": 0}}})
    ['  matched by name', '  dog  0.5000  (4 images)', '  cat  no images']
    """
    lines = []
    if result.get("classes"):
        lines.append(f"  {printable(result['classes'])}")
    per_class = result.get("per_class") or {}
    if len(per_class) > limit:
        return lines
    width = max((len(printable(n)) for n in per_class), default=0)
    for name, row in per_class.items():
        if row["accuracy"] is None:
            figure = "no images"
        else:
            n = row["num_examples"]
            figure = (f"{row['accuracy']:.4f}  ({n} image"
                      f"{'s' * (n != 1)})")
        lines.append(f"  {printable(name):<{width}}  {figure}")
    return lines


def _evaluate_one_device(model, source, size, batch_size, eval_crop, table,
                         outputs):
    """:func:`evaluate` on the jax and torch backends, the sums taken in
    float64."""
    from keras_vit.models.memory import infer
    from keras_vit.runtime.backend import is_jax

    if is_jax():
        # Keras' compiled predict step: op-by-op eager jax is many times
        # slower.
        def infer(model, images):  # noqa: F811 - the jax way
            out = model.predict_on_batch(images)
            return np.asarray(out[0] if isinstance(out, (list, tuple))
                              else out)

    steps = -(-source.num_examples // batch_size)
    loss = correct = count = 0.0
    seen, hits = np.zeros(outputs), np.zeros(outputs)
    for images, labels, mask in _to_outputs(padded_eval_dataset(
            source, size, batch_size, num_batches=steps,
            eval_crop=eval_crop, model=model
    ), table).as_numpy_iterator():
        logits = infer(model, images).astype("float64")
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, labels[:, None], -1)[:, 0]
        right = (logits.argmax(-1) == labels) * mask
        loss -= float((picked * mask).sum())
        correct += float(right.sum())
        count += float(mask.sum())
        np.add.at(seen, labels, mask)
        np.add.at(hits, labels, right)
    return loss, correct, count, seen, hits
