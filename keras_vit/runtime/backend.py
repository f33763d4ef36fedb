"""Which Keras backend runs, and what differs between them when running a
model for output.

:func:`name` (and :func:`is_tensorflow`, :func:`is_jax`, :func:`is_torch`)
is the package's one way to ask which backend runs.

>>> name() in ("tensorflow", "jax", "torch")
True
>>> [is_tensorflow(), is_jax(), is_torch()].count(True)
1
"""

import contextlib

# Keras is imported in the functions: importing it registers the model
# classes, whose layers import this module.


def name():
    """The name of the Keras backend this process runs: ``"tensorflow"``,
    ``"jax"`` or ``"torch"`` (``"numpy"`` and ``"openvino"`` too, which
    keras_vit does not support)."""
    import keras

    return keras.backend.backend()


def is_tensorflow():
    """Whether the Keras backend is TensorFlow."""
    return name() == "tensorflow"


def is_jax():
    """Whether the Keras backend is JAX."""
    return name() == "jax"


def is_torch():
    """Whether the Keras backend is PyTorch."""
    return name() == "torch"


def no_grad():
    """Context in which model calls record no gradients (torch only).

    >>> with no_grad():
    ...     pass
    """
    if is_torch():
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def seed_global_generator(seed):
    """Seeds torch's global generator, which the dropout of layers built
    without a seed draws from; elsewhere nothing (Keras' seed generators
    are variables).

    >>> seed_global_generator(3)
    """
    if is_torch():
        import torch

        torch.manual_seed(int(seed))


def variable_to_numpy(variable):
    """A Keras variable's value as a NumPy array, on every backend, under
    every ``tf.distribute`` strategy and ``keras.distribution`` (a weight
    split over jax processes is gathered: every process must call this).

    >>> import keras
    >>> variable_to_numpy(keras.Variable([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """
    import keras

    value = variable.value
    if is_tensorflow() and hasattr(value, "read_value"):
        value = value.read_value()
    if is_jax() and not getattr(value, "is_fully_addressable", True):
        from jax.experimental import multihost_utils

        value = multihost_utils.process_allgather(value, tiled=True)
    return keras.ops.convert_to_numpy(value)


def to_numpy(tree):
    """Backend tensors (in dicts, lists and tuples) as NumPy arrays.

    >>> import keras
    >>> to_numpy({"a": keras.ops.ones((2,))})["a"].tolist()
    [1.0, 1.0]
    """
    import keras

    return keras.tree.map_structure(keras.ops.convert_to_numpy, tree)
