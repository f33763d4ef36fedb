"""keras-vit: the Vision Transformer family for Keras 3.

>>> import keras_vit
>>> model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
...                            num_classes=10)

Importing the package registers every custom layer with Keras, so a saved
``.keras`` file loads with ``keras.saving.load_model`` after ``import
keras_vit`` and nothing else.
"""

import importlib
import os
import sys

from keras_vit import _quiet, errors

# The console script imports this package, and with it TensorFlow, before
# cli.main runs: its C++ log lines must be filtered from here.
_quiet.for_command_line()
# The same for a KERAS_BACKEND Keras cannot import: named in one line (the
# command's exit status 2), not a traceback from inside `import keras`.
try:
    errors.check_keras_backend()
except ValueError as _e:
    if not _quiet.is_command_line():
        raise
    print(f"keras-vit: error: {_e}", file=sys.stderr)
    raise SystemExit(2) from None

try:
    from keras_vit import layers, models  # noqa: E402
except ModuleNotFoundError as _e:  # KERAS_BACKEND=openvino, not installed
    if not _quiet.is_command_line():
        raise
    _backend = os.environ.get("KERAS_BACKEND") or "tensorflow"
    print(f"keras-vit: error: importing Keras (backend {_backend!r}, "
          f"KERAS_BACKEND) needs the module {_e.name!r}, which is not "
          f"installed: pip install '{errors.PACKAGES.get(_e.name, _e.name)}'"
          ", or set KERAS_BACKEND to an installed backend", file=sys.stderr)
    raise SystemExit(2) from None
from keras_vit.models import (  # noqa: E402
    AxialVisionTransformer, VisionTransformer, axial_vit, rebuild,
    resolve_model, vit)

__version__ = "0.1.0"

# Components load on first use: `keras_vit.zoo`, `keras_vit.export`, ...
_LAZY = ("zoo", "export", "analysis", "cli")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_vit.{name}")
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")


__all__ = ["layers", "models", "vit", "VisionTransformer", "axial_vit",
           "AxialVisionTransformer", "resolve_model", "rebuild", "__version__"]
