"""Keras' global dtype policy, set for a block and put back: the one place
the package swaps it (rebuilding a model in another precision, building a
training model under the run's policy, a float32 copy for export).

>>> import keras
>>> with dtype_policy_scope("mixed_bfloat16"):
...     keras.config.dtype_policy().name
'mixed_bfloat16'
>>> keras.config.dtype_policy().name
'float32'
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def dtype_policy_scope(policy):
    """Layers built inside get ``policy`` (a name or a Keras
    ``DTypePolicy``) as their dtype policy; the previous global policy
    comes back on exit, whatever happened inside."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
