"""The errors keras_vit raises on purpose, under one root:
:class:`KerasVitError` (``except keras_vit.KerasVitError`` catches them
all). Each also derives from the builtin of its kind (ValueError, OSError,
ImportError, ...).

The checks that raise them live with what they check:
:mod:`keras_vit.base.checks` (arguments, optional packages, ``KERAS_BACKEND``),
:mod:`keras_vit.models.memory` (what fits this machine's memory) and
:mod:`keras_vit.base.archives` (zip archives, special files).
"""

from __future__ import annotations

import os


class KerasVitError(Exception):
    """The root of every error keras_vit raises on purpose:
    ``except keras_vit.KerasVitError`` catches them all. Each subclass also
    derives from the builtin a caller expects of its kind: ValueError for a
    bad argument or file content, OSError for a file or download,
    ImportError for a missing package, RuntimeError for a failed job.

    >>> from keras_vit.base.variants import parse
    >>> try:
    ...     parse("ViT-Q/99")
    ... except KerasVitError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    UnknownModelError True
    """


class MissingDependencyError(KerasVitError, ImportError):
    """An optional package is not installed.

    ``package`` is the name pip installs, ``pip_command`` the whole command
    that fixes it. The command line prints the message on one line and exits
    with status 2.
    """

    def __init__(self, package, purpose=None, pip_spec=None):
        self.package = package
        self.pip_command = f"pip install '{pip_spec or package}'"
        what = f"{purpose} needs" if purpose else "keras_vit needs"
        super().__init__(
            f"{what} the package {package!r}, which is not installed: "
            f"{self.pip_command}", name=package)


class UnexpectedKeywordError(KerasVitError, TypeError, ValueError):
    """A keyword argument that nothing takes: a TypeError as Python's own,
    and a ValueError so that the command line reports it as bad input (a
    misspelt ``--model-option``)."""


class ConfigError(KerasVitError, ValueError):
    """A file keras-vit reads but the user did not write (a downloaded
    ``config.json``, a checkpoint's header) is malformed. The message names
    the file and the field and echoes the value; ``path`` and ``field``
    hold them (``field`` None for the file as a whole). The command line
    prints it on one line, exit status 2."""

    def __init__(self, path, field, problem):
        self.path = os.fspath(path)
        self.field = field
        where = f" field {field}:" if field else ""
        super().__init__(f"{self.path}{where} {problem}")


class ArgumentTypeError(KerasVitError, TypeError):
    """A public function's argument is of a type it cannot take; the
    message names the argument, its value and what it must be
    (:func:`keras_vit.base.checks.check_type`)."""
