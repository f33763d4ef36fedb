"""Work put off until it is needed: names of a package that import their
module on first use (PEP 562), and steps that run when a module is first
imported (:func:`when_imported`).

``import keras_vit`` imports no Keras, TensorFlow, JAX or torch. A package
lists its public names here, each with the module that defines it; the
first ``pkg.name`` (or ``from pkg import name``) imports that module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


def attach(package, names, modules=()):
    """``(__getattr__, __dir__)`` for ``package``, where ``names`` maps
    each public name to the module (relative, ``".attention"``) that
    defines it, and ``modules`` names the submodules reachable as
    attributes: a tuple of names, or a dict of each name to its module.

    >>> getattr_, dir_ = attach("keras_vit.train", {"Recipe": ".recipes"})
    >>> getattr_("Recipe").__name__, "Recipe" in dir_()
    ('Recipe', True)
    >>> getattr_("Recipes")
    Traceback (most recent call last):
    ...
    AttributeError: module 'keras_vit.train' has no attribute 'Recipes'
    """
    if not isinstance(modules, dict):
        modules = {name: f".{name}" for name in modules}

    def getattr_(name):
        if name in modules:
            value = importlib.import_module(modules[name], package)
        elif name in names:
            value = getattr(importlib.import_module(names[name], package),
                            name)
        else:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}")
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


class _Loader(importlib.abc.Loader):
    """The module's own loader, with the finder's ``before`` and ``after``
    steps."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        if self.finder.before is not None:
            self.finder.before()
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        if self.finder.after is not None:
            self.finder.after()

    def __getattr__(self, name):  # get_filename, is_package, ...
        return getattr(self.loader, name)


class _FirstImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` as the other finders would, with :class:`_Loader`.
    It stays until the module is imported (a mere ``find_spec``, as
    TensorFlow does to see whether Keras is installed, does not use it
    up)."""

    searching = False

    def __init__(self, name, before, after):
        self.name, self.before, self.after = name, before, after
        # The same steps asked for twice run once.
        self.key = (name, *(step and (step.__module__, step.__qualname__)
                             for step in (before, after)))

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self)
        return spec


def when_imported(name, before=None, after=None):
    """Runs ``before()`` just before the top-level module ``name`` is first
    imported, and ``after()`` right after it has run; nothing when
    ``name`` is imported already.

    >>> seen = []
    >>> when_imported("this", before=lambda: seen.append("before"),
    ...               after=lambda: seen.append("after"))
    >>> import this as _  # doctest: +ELLIPSIS
    The Zen of Python...
    >>> seen
    ['before', 'after']
    """
    finder = _FirstImport(name, before, after)
    if name not in sys.modules and not any(
            getattr(f, "key", None) == finder.key for f in sys.meta_path):
        sys.meta_path.insert(0, finder)
