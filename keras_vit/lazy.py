"""The ``keras-vit`` command's fast start: names of a package that import
their module on first use (PEP 562). (The one import that registers the
package's Keras classes is :mod:`keras_vit.keras_classes`.)

The ``keras-vit`` command builds its parser from every component's
subcommands; with the components' ``__init__`` modules importing their
Keras code, ``keras-vit --help`` would load TensorFlow. A package lists its
public names here instead. In the command (:func:`is_command_line`),
``from pkg import name`` or ``pkg.name`` imports the module holding
``name`` when it is first used; in any other process every module is
imported with the package, as before, so a library user's ``import
keras_vit`` still registers every Keras class before a file is loaded.
"""

from __future__ import annotations

import importlib
import os
import sys


def attach(package, names, modules=(), eager=None):
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``), where
    ``names`` maps each public name to the module (relative to the package,
    e.g. ``".attention"``) that defines it, and ``modules`` names the
    submodules reachable as attributes (``pkg.data``). ``eager`` (default:
    unless this process is the ``keras-vit`` command) imports them all now.

    >>> getattr_, dir_ = attach("keras_vit.train", {"Recipe": ".recipes"},
    ...                         eager=False)
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

    if eager is None:
        eager = not is_command_line()
    if eager:
        for name in (*modules, *names):
            getattr_(name)
    return getattr_, dir_


def names_of(modules):
    """``{name: module}`` from ``{module: (name, ...)}``."""
    return {name: module for module, names in modules.items()
            for name in names}


# The modules ``python -m`` runs as the ``keras-vit`` command.
COMMAND_MODULES = ("keras_vit.cli", "keras_vit.train", "keras_vit.train.cli",
                   "keras_vit.analysis.cli", "keras_vit.export.cli")


def is_command_line():
    """Whether this process is the ``keras-vit`` command (the console
    script or ``python -m keras_vit...``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    # Only the command-line modules: the package's own worker processes
    # (``python -m keras_vit.export._tf_worker``) load models as a library.
    as_module = any(a == "-m" and b in COMMAND_MODULES
                    for a, b in zip(argv, argv[1:]))
    return script in ("keras-vit", "keras-vit.exe") or as_module
