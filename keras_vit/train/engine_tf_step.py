"""The TensorFlow engine's train step: whether it compiles with XLA, and
the step itself (gradient accumulation over micro-batches, the
cross-replica sum, clipping, the optimizer update and the EMA).

:class:`~keras_vit.train.engine_tf.TFEngine` builds its step here once per
run; every ``tf.distribute`` strategy runs the same one.
"""

from __future__ import annotations

# step_uses_xla is decided in distribute, for model.fit and this step
# alike; imported here for the engine.
from keras_vit.train.distribute import describe, step_uses_xla  # noqa: F401


def make_train_step(engine):
    """The compiled train step of ``engine`` (a
    :class:`~keras_vit.train.engine_tf.TFEngine` set up for its trainer):
    a ``tf.function`` taking a distributed iterator and returning the
    step's loss, accuracy and gradient norm."""
    import tensorflow as tf

    t = engine.trainer
    strategy, model, opt = engine.strategy, engine.model, engine.optimizer
    r = t.recipe
    variables = model.trainable_variables
    global_batch = float(r.batch_size)
    accum, micro, size = t.accum, t.micro, t.image_size
    replicas = strategy.num_replicas_in_sync
    reg_scale = 1.0 / (replicas * accum)
    ema, ema_decay = engine.ema, r.ema_decay

    def seed_of(micro_index):
        # Stateless: a resumed run draws what the killed one would have.
        ctx = tf.distribute.get_replica_context()
        replica = tf.cast(ctx.replica_id_in_sync_group, tf.int64)
        counter = ((tf.cast(opt.iterations, tf.int64) * replicas
                    + replica) * accum
                   + tf.cast(micro_index, tf.int64))
        return tf.stack([tf.constant(r.seed, tf.int64), counter])

    def forward_backward(images, labels, seed):
        with tf.GradientTape() as tape:
            total, correct = t.compute_loss(images, labels, seed)
            # Summed over the replica's images and divided by the
            # global batch: the cross-replica sum is then the mean.
            loss = total / global_batch
            if model.losses:
                loss += tf.add_n(model.losses) * reg_scale
        grads = tape.gradient(loss, variables)
        grads = [tf.zeros_like(v) if g is None else g
                 for g, v in zip(grads, variables)]
        return loss, correct, grads

    if t.jit_compile:
        # XLA for the heavy part only: all-reduce, clipping and the
        # optimizer update stay in the strategy's graph.
        forward_backward = tf.function(forward_backward,
                                       jit_compile=True)

    def grads_of(images, labels, micro_index=0):
        return forward_backward(images, labels, seed_of(micro_index))

    def replica_step(images, labels):
        if accum == 1:
            loss, correct, grads = grads_of(images, labels)
        else:
            # Gradient accumulation: the replica's batch in `accum`
            # micro-batches, one forward/backward pass at a time.
            images = tf.reshape(images, (accum, micro, size, size, 3))
            labels = tf.reshape(labels, (accum, micro))

            def body(i, loss, correct, grads):
                l_, c_, g_ = grads_of(images[i], labels[i], i)
                return (i + 1, loss + l_, correct + c_,
                        [a + b for a, b in zip(grads, g_)])

            _, loss, correct, grads = tf.while_loop(
                lambda i, *_: i < accum, body,
                (tf.constant(0), tf.constant(0.0), tf.constant(0.0),
                 [tf.zeros_like(v) for v in variables]))
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if r.grad_clip_norm is not None:
            grads, norm = tf.clip_by_global_norm(grads, r.grad_clip_norm)
        else:
            norm = tf.linalg.global_norm(grads)
        opt.apply(grads, variables)
        if ema:
            # Polyak averaging with the usual warm-up of the decay, so
            # early steps are not dominated by the initial weights.
            t_ = tf.cast(opt.iterations, tf.float32)
            decay = tf.minimum(ema_decay, (1.0 + t_) / (10.0 + t_))
            for e, v in zip(ema, variables):
                e.assign(decay * e + (1.0 - decay) * v.value)
        return loss, correct, norm

    sum_ = tf.distribute.ReduceOp.SUM

    @tf.function
    def train_step(iterator):
        images, labels = next(iterator)
        loss, correct, norm = strategy.run(replica_step,
                                           args=(images, labels))
        return (strategy.reduce(sum_, loss, axis=None),
                strategy.reduce(sum_, correct, axis=None) / global_batch,
                strategy.reduce(tf.distribute.ReduceOp.MEAN, norm,
                                axis=None))

    return train_step
