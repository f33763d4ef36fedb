"""What differs between the Keras backends when running a model for output.

Keras keeps one model code for TensorFlow, JAX and PyTorch; what is left to
the caller is leaving autograd (torch records every op of a plain ``model(x)``
call and refuses ``numpy()`` on the result) and getting NumPy back, which
``keras.ops.convert_to_numpy`` does on all three.
:func:`keras_vit.models.memory.infer` runs a model with both.
"""

import contextlib

import keras


def no_grad():
    """Context in which model calls record no gradients (torch only).

    >>> with no_grad():
    ...     pass
    """
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def to_numpy(tree):
    """Backend tensors (in dicts, lists and tuples) as NumPy arrays.

    >>> import numpy as np
    >>> to_numpy({"a": keras.ops.ones((2,))})["a"].tolist()
    [1.0, 1.0]
    """
    return keras.tree.map_structure(keras.ops.convert_to_numpy, tree)
