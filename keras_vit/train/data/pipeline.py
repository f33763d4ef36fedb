"""The ``tf.data`` input pipelines: a source -> batches of images,
with the paper's preprocessing (inception crop and flip for training, a
central crop and resize for evaluation), seeded per epoch and per example
so that a resumed run rebuilds the batches it stopped in.
"""

from __future__ import annotations

import functools

from keras_vit.base.checks import check_int
from keras_vit.data.normalization import check_normalization, pipeline_options
from keras_vit.data.normalization import takes_raw_pixels  # noqa: F401
from keras_vit.train.data.augment import make_augment, make_batch_augment
from keras_vit.train.data.load import load_data

# Streams (tfds) are shuffled through a buffer of this many records.
SHUFFLE_BUFFER = 10_000
# Paper / official input pipeline: inception crop of 5%-100% of the area.
INCEPTION_AREA = (0.05, 1.0)
INCEPTION_ASPECT = (3 / 4, 4 / 3)


def scale(images, input_normalization=None):
    """[0, 255] -> the model's input range (``input_normalization``, as
    :mod:`keras_vit.data.normalization` reads it; None: the official
    [-1, 1])."""
    return check_normalization("input_normalization",
                               input_normalization)(images)


def _mix(seed, epoch):
    # A distinct, reproducible stream per (seed, epoch), well inside int64.
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 17) % (2 ** 31 - 1)


def inception_box(shape, seed, area_range=INCEPTION_AREA,
                  aspect_range=INCEPTION_ASPECT):
    """``(begin, size)`` of a random box covering ``area_range`` of an
    image of ``shape`` (height, width, channels) with an aspect ratio in
    ``aspect_range``: the "inception crop" of the official training
    pipeline. ``seed`` is a stateless seed (shape (2,))."""
    import tensorflow as tf

    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.zeros([1, 0, 4]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=aspect_range,
        area_range=area_range, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, size


def eval_resize(image, size, crop_fraction=1.0):
    """Central crop of ``crop_fraction`` of each side (1.0: none), then a
    bilinear resize to ``size``."""
    import tensorflow as tf

    if crop_fraction < 1.0:
        image = tf.image.central_crop(image, crop_fraction)
    return tf.image.resize(image, (size, size), method="bilinear")


def _is_model(value):
    import keras

    return isinstance(value, keras.layers.Layer)


def model_image_size(model):
    """The side of the square images ``model`` takes (its input's fixed
    size), or a ValueError."""
    shape = model.inputs[0].shape
    if shape[1] is None or shape[1] != shape[2]:
        raise ValueError(
            f"model={model.name!r} must take square images of a fixed size "
            f"(else pass image_size=); its input shape is {tuple(shape)}")
    return int(shape[1])


def model_inputs(image_size, model=None, *, raw_pixels=None,
                 input_normalization=None):
    """``(image_size, raw_pixels, normalization)`` of a pipeline:
    ``image_size`` an int or a model (then ``model``), ``model`` (or
    None) what the batches feed. The model gives the size when
    ``image_size`` is None or the model, and decides the normalisation
    (:func:`keras_vit.data.normalization.pipeline_options`)."""
    if _is_model(image_size):
        if model is not None and model is not image_size:
            raise ValueError(
                f"image_size is the model {image_size.name!r} and model= "
                f"is another one ({getattr(model, 'name', model)!r}); pass "
                "the model once")
        model, image_size = image_size, None
    if model is not None and not _is_model(model):
        raise ValueError("model must be a Keras model (what the batches "
                         f"feed); received model={model!r}")
    if image_size is None and model is not None:
        image_size = model_image_size(model)
    if not isinstance(image_size, int) or isinstance(image_size, bool) or (
            image_size < 1):
        raise ValueError(f"image_size must be a positive integer or a model; "
                         f"received image_size={image_size!r}")
    options = pipeline_options(model, raw_pixels=raw_pixels,
                               input_normalization=input_normalization)
    return image_size, options["raw_pixels"], options["input_normalization"]


def _examples(source, training, seed, epoch):
    """(index, record, label, epoch_seed) in this epoch's order
    (``epoch=None``: a new order each iteration)."""
    import tensorflow as tf

    if epoch is None:
        seeds = tf.data.Dataset.random(
            seed=seed, rerandomize_each_iteration=True).take(1)
    else:
        seeds = tf.data.Dataset.from_tensors(
            tf.constant(_mix(seed, epoch), tf.int64))
    if source.in_memory:
        records, labels = source.table()
        records = tf.constant(records)
        labels = tf.constant(labels, tf.int64)
        n = source.num_examples

        def order(s):
            idx = tf.range(n, dtype=tf.int64)
            if training:
                idx = tf.random.experimental.stateless_shuffle(
                    idx, seed=tf.stack([s, tf.constant(seed, tf.int64)]))
            return tf.data.Dataset.from_tensor_slices(idx).map(
                lambda i: (i, tf.gather(records, i), tf.gather(labels, i), s))

        return seeds.flat_map(order)
    stream = source.stream().enumerate()
    if epoch is None:
        ds = tf.data.Dataset.zip(stream, tf.data.Dataset.random(
            seed=seed, rerandomize_each_iteration=True))
        ds = ds.map(lambda i_ex, s: (i_ex[0], i_ex[1][0], i_ex[1][1], s))
    else:
        s = tf.constant(_mix(seed, epoch), tf.int64)
        ds = stream.map(lambda i, ex: (i, ex[0], ex[1], s))
    if training:
        ds = ds.shuffle(min(SHUFFLE_BUFFER, source.num_examples),
                        seed=_mix(seed, epoch or 0),
                        reshuffle_each_iteration=epoch is None)
    return ds


def _preprocess(source, image_size, training, crop_area, flip, eval_crop,
                raw_pixels, normalize, augment=None, draws=False):
    """The per-example map: ``(image, label)`` scaled by ``normalize``
    (unless ``raw_pixels``), or ``(image, label, draws)`` with ``draws``
    (RandAugment's, made by ``augment``) for the batch stage, which then
    scales the pixels."""
    import tensorflow as tf

    flip = flip and source.flip_ok

    def fn(index, record, label, epoch_seed):
        if training:
            seed = tf.stack([epoch_seed, index])
            crop_seed, flip_seed = tf.unstack(
                tf.random.experimental.stateless_split(seed, 2))
            if crop_area is not None:
                # A JPEG decodes only the box.
                image = source.decode_crop(record, lambda shape: (
                    inception_box(shape, crop_seed, tuple(crop_area))))
            else:
                image = source.decode(record)
            image = tf.image.resize(image, (image_size, image_size),
                                    method="bilinear")
            if flip:
                image = tf.image.stateless_random_flip_left_right(
                    image, flip_seed)
            if augment is not None:
                # A third stream: the crop and flip draw as without it.
                image = augment(tf.ensure_shape(
                    image, (image_size, image_size, 3)),
                    tf.random.experimental.stateless_fold_in(seed, 2))
        else:
            image = eval_resize(source.decode(record), image_size, eval_crop)
        # With RandAugment on, augment gave its draws with the image.
        image, made = image if isinstance(image, tuple) else (image, None)
        image = tf.ensure_shape(image, (image_size, image_size, 3))
        if draws:  # the batch stage augments and scales
            return image, label, (tf.zeros([0, 3]) if made is None
                                  else made)
        return (image if raw_pixels else normalize(image)), label

    return fn


def steps_per_epoch(source, global_batch_size, *, shards=1):
    """Full batches in one epoch (the ragged remainder is dropped); a
    ValueError when that is none at all. ``shards``: the epoch is split
    into that many parts, each batched by itself."""
    per_shard = source.num_examples // shards
    if per_shard < global_batch_size:
        where = (f"{per_shard} images in each of {shards} shards of "
                 if shards > 1 else f"{source.num_examples} images in ")
        raise ValueError(
            f"batch_size={global_batch_size} is larger than the training "
            f"data ({where}{source.name!r}): an epoch would hold no full "
            f"batch; pass batch_size={per_shard} or less (or more data)")
    return per_shard // global_batch_size


def dataset(source, image_size, batch_size, *, model=None, training=True,
            seed=0, epoch=None, crop_area=INCEPTION_AREA, flip=True,
            eval_crop=1.0, shard=(1, 0), skip=0, take=None,
            drop_remainder=None, prefetch=True, raw_pixels=None,
            input_normalization=None, randaugment=None, random_erasing=0.0,
            three_augment=False, color_jitter=0.0, mixing=None):
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches.

    Pass the model the batches feed (``dataset(data, model, batch_size)``,
    or ``model=`` beside an explicit ``image_size``): it gives the image
    size and decides the pixels' normalisation.

    Args:
        source: an
            :class:`~keras_vit.train.data.sources.ImageSource` or a spec
            for :func:`~keras_vit.train.data.load.load_data`.
        image_size: output resolution (square), or the model (its input
            size).
        batch_size: images per batch.
        model: the model the batches feed, when ``image_size`` is a
            number.
        training: augment (inception crop, flip) and shuffle, and drop the
            ragged last batch (a source with fewer images than one batch
            is refused); else resize only, in order.
        seed: seeds the shuffle and the augmentation.
        epoch: None reshuffles each time the dataset is iterated (for
            ``model.fit``); an int fixes that epoch's order.
        crop_area: inception-crop area range, or None for a plain resize.
        flip: random horizontal flips (only if ``source.flip_ok``).
        eval_crop: central-crop fraction before the evaluation resize.
        shard: ``(num_shards, index)``: this pipeline's part of each epoch.
        skip: examples of this shard to skip first (resuming mid-epoch).
        take: examples of this shard to yield at most.
        drop_remainder: default: ``training``.
        prefetch: overlap input with compute.
        raw_pixels: yield [0, 255] pixels (with a model: leave it out,
            the model says; a contradicting value stops).
        input_normalization: else, the normalisation the model's weights
            expect (with a model: leave it out); default: [-1, 1].
        randaugment, random_erasing, three_augment, color_jitter: more
            training augmentation, each off by default
            (:mod:`keras_vit.train.data.augment`).
        mixing: a :class:`keras_vit.train.mixing.BatchMixer` for the
            training batches, which then carry soft targets
            ``(batch, num_classes)``; None: off.

    Every option of a recipe at once:
    ``dataset(source, model, r.batch_size,
    **recipes.pipeline_options(r, num_classes))``.

    >>> import keras_vit
    >>> m = keras_vit.vit(16, 8, 8, 1, 1, 8, 10, input_normalization="clip")
    >>> images, _ = next(iter(dataset("digits", m, 4, training=False)))
    >>> tuple(images.shape)
    (4, 16, 16, 3)
    >>> round(float(images.numpy().min()), 3)  # black, CLIP's red channel
    -1.792
    """
    import tensorflow as tf

    image_size, raw_pixels, normalize = model_inputs(
        image_size, model, raw_pixels=raw_pixels,
        input_normalization=input_normalization)
    source = load_data(source)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; received "
                         f"batch_size={batch_size!r}")
    augment = make_augment(randaugment, three_augment, color_jitter)
    # Batch stage, before the scaling; the fill is the mean pixel (timm).
    batch_augment = make_batch_augment(
        randaugment, random_erasing, seed=seed,
        fill=tuple(min(255, round(255 * m)) for m in normalize.mean)
    ) if training else None
    if mixing is not None:
        from keras_vit.train.mixing import BatchMixer

        if not isinstance(mixing, BatchMixer):
            raise ValueError("mixing must be None or a BatchMixer "
                             "(keras_vit.train.mixing); received "
                             f"mixing={mixing!r}")
        if not training:
            raise ValueError("mixing mixes training batches; received "
                             f"mixing={mixing!r} with training=False")
        if mixing.num_classes != source.num_classes:
            raise ValueError(
                f"mixing has num_classes={mixing.num_classes} but the data "
                f"{source.name!r} has {source.num_classes} classes")
    ds = _examples(source, training, seed, epoch)
    num_shards, index = shard
    if training and epoch is not None:
        # Files failing to decode are dropped below; repeating fills the
        # gap so every shard yields exactly `take` (bounded, never spins).
        ds = ds.repeat(3)
    if num_shards > 1:
        ds = ds.shard(num_shards, index)
    if skip:
        ds = ds.skip(skip)
    ds = ds.map(_preprocess(source, image_size, training, crop_area, flip,
                            eval_crop, raw_pixels, normalize,
                            augment if training else None,
                            draws=batch_augment is not None),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)
    if take is not None:
        ds = ds.take(take)
    elif training and epoch is not None:
        ds = ds.take(max(0, source.num_examples // num_shards - skip))
    if drop_remainder is None:
        drop_remainder = training
    if drop_remainder:  # no full batch: refused, not an empty epoch
        steps_per_epoch(source, batch_size, shards=num_shards)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if batch_augment is not None:
        @tf.autograph.experimental.do_not_convert
        def augment_batch(images, labels, draws):
            images = batch_augment(images, draws)
            return (images if raw_pixels else normalize(images)), labels

        ds = ds.map(augment_batch, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
    if mixing is not None:
        ds = mixing.map(ds, seed=(int(seed) * 31 + index) % (2 ** 31 - 1),
                        epoch=epoch)
    options = tf.data.Options()
    options.deterministic = True
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def steps_dataset(source, image_size, batch_size, *, start, end,
                  steps_per_epoch, images_per_step, shard=(1, 0), **options):
    """The training batches of optimizer steps ``start`` to ``end`` of a
    run: each epoch's examples in its fixed order, ``images_per_step`` of
    this shard's examples a step, in batches of ``batch_size``. A
    function of the step alone, so a resumed run sees what the
    uninterrupted one saw. ``options``: more :func:`dataset` keywords.

    >>> ds = steps_dataset("digits", 16, 8, start=40, end=43,
    ...                    steps_per_epoch=42, images_per_step=32,
    ...                    crop_area=None)
    >>> sum(1 for _ in ds)  # 2 steps of epoch 0, 1 of epoch 1; 4 each
    12
    """
    check_int("start", start, low=0)
    check_int("end", end, low=start + 1)
    parts = []
    step = start
    while step < end:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        count = min(steps_per_epoch - in_epoch, end - step)
        parts.append(dataset(
            source, image_size, batch_size, training=True, epoch=epoch,
            shard=shard, skip=in_epoch * images_per_step,
            take=count * images_per_step, **options))
        step += count
    return functools.reduce(lambda a, b: a.concatenate(b), parts)


def padded_eval_dataset(source, image_size, batch_size, *, num_batches,
                        model=None, shard=(1, 0), eval_crop=1.0,
                        raw_pixels=None, input_normalization=None):
    """Evaluation batches of ``(images, labels, mask)`` padded with masked
    blank images to exactly ``num_batches`` full batches (the same steps
    on static shapes for every replica)."""
    import tensorflow as tf

    image_size, raw_pixels, normalize = model_inputs(
        image_size, model, raw_pixels=raw_pixels,
        input_normalization=input_normalization)
    ds = dataset(source, image_size, batch_size, training=False,
                 shard=shard, eval_crop=eval_crop, drop_remainder=False,
                 prefetch=False, raw_pixels=raw_pixels,
                 input_normalization=normalize).unbatch()
    ds = ds.map(lambda x, y: (x, y, tf.constant(1.0)))
    blank = tf.data.Dataset.from_tensors(
        (tf.zeros((image_size, image_size, 3)), tf.constant(0, tf.int64),
         tf.constant(0.0))).repeat()
    ds = ds.concatenate(blank).take(num_batches * batch_size)
    return ds.batch(batch_size, drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)
