"""Names of a package that import their module on first use (PEP 562).

``import keras_vit`` imports no Keras, TensorFlow, JAX or torch, in every
process alike: the command line lists its commands without them, and a
library user pays for a framework when the first model is built. A package
lists its public names here, each with the module that defines it; the
first ``pkg.name`` (or ``from pkg import name``) imports that module. The
table is static: what a name resolves to never depends on how the process
was started.
"""

from __future__ import annotations

import importlib


def attach(package, names, modules=()):
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``), where
    ``names`` maps each public name to the module (relative to the package,
    e.g. ``".attention"``) that defines it, and ``modules`` names the
    submodules reachable as attributes (``pkg.data``).

    >>> getattr_, dir_ = attach("keras_vit.train", {"Recipe": ".recipes"})
    >>> getattr_("Recipe").__name__, "Recipe" in dir_()
    ('Recipe', True)
    >>> getattr_("Recipes")
    Traceback (most recent call last):
    ...
    AttributeError: module 'keras_vit.train' has no attribute 'Recipes'
    """
    def getattr_(name):
        if name in modules:
            value = importlib.import_module(f".{name}", package)
        elif name in names:
            value = getattr(importlib.import_module(names[name], package),
                            name)
        else:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}")
        # Cached in the package: the next access is a plain lookup.
        importlib.import_module(package).__dict__[name] = value
        return value

    def dir_():
        return sorted(set(importlib.import_module(package).__dict__)
                      | set(names) | set(modules))

    return getattr_, dir_


def names_of(modules):
    """``{name: module}`` from ``{module: (name, ...)}``."""
    return {name: module for module, names in modules.items()
            for name in names}
