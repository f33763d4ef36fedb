"""The gradients of a model's loss w.r.t. every trainable variable, on
whichever Keras backend the run uses: one helper for the tests that
compare two models' gradients (remat twins, mixed precision against
float32)."""

import keras
import numpy as np


def gradients(model, x, loss, training=True):
    """d ``loss(model(x, training=training))`` / d every trainable
    variable, as float64 arrays; ``loss`` is written with ``keras.ops``.
    The global seeds are set first: torch's unseeded dropout draws from
    torch's global generator, so twins compare only from the same state."""
    import testkit

    x = testkit.model_input(model, x)
    keras.utils.set_random_seed(11)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = loss(model(x, training=training))
        grads = tape.gradient(value, model.trainable_variables)
        # A table read by a gather (BEiT's relative position bias) gets an
        # IndexedSlices, which tf.cast keeps as one: densified first.
        return [np.asarray(tf.cast(tf.convert_to_tensor(g), "float64"))
                for g in grads]
    if backend == "torch":
        import torch

        for v in model.trainable_variables:
            v.value.grad = None
        x = ({k: torch.as_tensor(v) for k, v in x.items()}
             if isinstance(x, dict) else torch.as_tensor(x))
        loss(model(x, training=training)).backward()
        return [v.value.grad.double().cpu().numpy()
                for v in model.trainable_variables]
    import jax

    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]

    def value(trainable):
        y, _ = model.stateless_call(trainable, other, x, training=training)
        return loss(y)

    # Compiled as one program, as a training step is: op by op, JAX
    # compiles every primitive of the backward pass on its own (a ResNet
    # unit's gradient took ~10x the CPU).
    return [np.asarray(g, "float64")
            for g in jax.jit(jax.grad(value))(trainable)]
