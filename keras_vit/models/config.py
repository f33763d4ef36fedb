"""One ``get_config`` for the package's model classes.

A model of this package is described completely by the arguments of its
constructor: ``get_config()`` returns them (each the model's attribute of
the same name when the constructor set one, the normalised value) and
``from_config(config)`` calls the constructor with them.

Example:

>>> import keras, keras_vit
>>> from keras_vit.models.config import ConstructorConfig
>>> class Tiny(ConstructorConfig, keras.Model):
...     def __init__(self, width=4, name="tiny", **kwargs):
...         inputs = keras.Input((3,))
...         outputs = keras.layers.Dense(width)(inputs)
...         super().__init__(inputs=inputs, outputs=outputs, name=name,
...                          **kwargs)
>>> Tiny(width=5).get_config()
{'width': 5, 'name': 'tiny', 'dtype': None}
>>> Tiny.from_config(Tiny(width=6).get_config()).width
6
"""

import inspect

import numpy as np

__all__ = ["ConstructorConfig", "json_ready"]

# Keyword arguments of keras.Model that belong in every config.
_ALWAYS = ("name", "dtype")


def json_ready(value):
    """``value`` with tuples as lists and NumPy scalars as Python numbers
    (recursively through lists and dicts), as a Keras config needs."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _arguments(cls, args, kwargs):
    """The arguments of ``cls(*args, **kwargs)`` by name, defaults filled
    in (None if they do not fit: the constructor then raises its own
    error)."""
    signature = inspect.signature(cls.__init__)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    given = {}
    for key, parameter in list(signature.parameters.items())[1:]:
        if parameter.kind not in (parameter.VAR_POSITIONAL,
                                  parameter.VAR_KEYWORD):
            given[key] = bound.arguments[key]
    given["dtype"] = kwargs.get("dtype")
    return given


class ConstructorConfig:
    """Mixin for model classes: ``get_config()`` returns the constructor's
    arguments, ``from_config(config)`` is ``cls(**config)``. Put it before
    ``keras.Model``; the arguments are recorded in ``__new__``.
    """

    def __new__(cls, *args, **kwargs):
        # Plain object attributes: Keras' tracking is not set up yet.
        instance = super().__new__(cls, *args, **kwargs)
        given = _arguments(cls, args, kwargs)
        if given is not None:
            object.__setattr__(instance, "_constructor_arguments", given)
            for key, value in given.items():
                if key not in _ALWAYS:
                    object.__setattr__(instance, key, value)
        return instance

    def get_config(self):
        given = self._constructor_arguments
        config = {}
        for key, value in given.items():
            if key in _ALWAYS:
                continue
            # The constructor's own attribute, never keras.Model's.
            config[key] = vars(self).get(key, value)
        config["name"] = self.name
        config["dtype"] = given.get("dtype")
        return json_ready(config)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)
