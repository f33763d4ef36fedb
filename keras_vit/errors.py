"""Errors shared by every part of keras_vit.

An optional package that is missing is the most common failure a new user
meets, so it has one error type and one way to raise it:

>>> from keras_vit.errors import MissingDependencyError, require
>>> require("json").__name__
'json'
>>> try:
...     require("no_such_module_xyz", package="no-such-package",
...             purpose="this example")
... except MissingDependencyError as e:
...     print(e)
this example needs the package 'no-such-package', which is not installed: pip install 'no-such-package'
"""

from __future__ import annotations

import importlib


class MissingDependencyError(ImportError):
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


# Optional modules whose pip name differs from the module name, and the ones
# a command may reach without going through require(): the command line turns
# a ModuleNotFoundError for any of these into the same one-line error.
PACKAGES = {"matplotlib": "matplotlib", "skimage": "scikit-image",
            "tensorflow_datasets": "tensorflow-datasets",
            "tf2onnx": "tf2onnx", "onnx": "onnx", "onnxruntime": "onnxruntime",
            "ai_edge_litert": "ai-edge-litert", "tensorboard": "tensorboard",
            "keras_hub": "keras-hub", "huggingface_hub": "huggingface_hub",
            "safetensors": "safetensors", "timm": "timm", "torch": "torch",
            "scipy": "scipy", "sklearn": "scikit-learn", "PIL": "pillow"}


def missing_dependency(exc):
    """The :class:`MissingDependencyError` that a ``ModuleNotFoundError``
    for a known optional package stands for, else None.

    >>> missing_dependency(ModuleNotFoundError("x", name="skimage.data")).package
    'scikit-image'
    >>> missing_dependency(ModuleNotFoundError("x", name="keras_vit.nope"))
    """
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    package = PACKAGES.get(exc.name.split(".")[0])
    return MissingDependencyError(package) if package else None


def require(module, package=None, purpose=None, pip_spec=None):
    """Imports and returns ``module``; raises :class:`MissingDependencyError`
    naming ``package`` (default: the module's top-level name) and the pip
    command when it is not installed. An import error from inside an
    installed package is not hidden: only the missing module itself is
    reported as missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise
        raise MissingDependencyError(package or PACKAGES.get(top, top),
                                     purpose, pip_spec) from e
