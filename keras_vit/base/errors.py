"""The errors keras_vit raises on purpose, under one root:
:class:`KerasVitError`. Each also derives from the builtin of its kind.
"""

from __future__ import annotations

import os


class KerasVitError(Exception):
    """The root of every error keras_vit raises on purpose. Each subclass
    also derives from the builtin a caller expects of its kind.

    >>> from keras_vit.base.variants import parse
    >>> try:
    ...     parse("ViT-Q/99")
    ... except KerasVitError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    UnknownModelError True
    """


class MissingDependencyError(KerasVitError, ImportError):
    """An optional package is not installed: ``package`` is the name pip
    installs, ``pip_command`` the whole command that fixes it."""

    def __init__(self, package, purpose=None, pip_spec=None):
        self.package = package
        self.pip_command = f"pip install '{pip_spec or package}'"
        what = f"{purpose} needs" if purpose else "keras_vit needs"
        super().__init__(
            f"{what} the package {package!r}, which is not installed: "
            f"{self.pip_command}", name=package)


class UnexpectedKeywordError(KerasVitError, TypeError, ValueError):
    """A keyword argument that nothing takes: a TypeError as Python's own,
    and a ValueError so that the command line reports it as bad input."""


class ConfigError(KerasVitError, ValueError):
    """A file keras-vit reads but the user did not write is malformed;
    ``path`` and ``field`` (None for the whole file) name where."""

    def __init__(self, path, field, problem):
        self.path = os.fspath(path)
        self.field = field
        where = f" field {field}:" if field else ""
        super().__init__(f"{self.path}{where} {problem}")


class ArgumentTypeError(KerasVitError, TypeError):
    """A public function's argument is of a type it cannot take
    (:func:`keras_vit.base.checks.check_type`)."""
