"""keras-vit: the Vision Transformer family for Keras 3.

>>> import keras_vit
>>> model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
...                            num_classes=10)

Importing the package registers every custom layer with Keras, so a saved
``.keras`` file loads with ``keras.saving.load_model`` after ``import
keras_vit`` and nothing else.
"""

import importlib
import sys

from keras_vit import _quiet, errors, hardware, keras_classes

# Before anything imports TensorFlow: its oneDNN CPU rewrites (the fused
# matmul + bias + GELU) where TensorFlow would leave them off.
hardware.enable_onednn()

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


# A library import registers every layer with Keras at once (the promise
# above). The ``keras-vit`` command skips it: --help, list and info then
# start without TensorFlow, and the commands that build or load a model
# import keras_vit.models themselves (through __getattr__ below or their
# own imports), which registers the layers before anything is loaded.
if not _quiet.is_command_line():
    keras_classes.import_models()
    from keras_vit.models import (  # noqa: E402
        AxialVisionTransformer, VisionTransformer, axial_vit, vit)

from keras_vit.version import __version__  # noqa: E402

# Components load on first use: `keras_vit.zoo`, `keras_vit.export`, ...
_LAZY = ("zoo", "export", "analysis", "cli")
_FROM_MODELS = ("AxialVisionTransformer", "VisionTransformer", "axial_vit",
                "vit")
# Getting and copying models is the zoo's (keras_vit.zoo.resolve): loaded on
# first use, as the zoo is.
_FROM_ZOO = ("rebuild", "resolve_model")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_vit.{name}")
    if name in ("layers", "models"):
        keras_classes.import_models()
        return importlib.import_module(f"keras_vit.{name}")
    if name in _FROM_MODELS:
        return getattr(keras_classes.import_models(), name)
    if name in _FROM_ZOO:
        return getattr(importlib.import_module("keras_vit.zoo.resolve"), name)
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")


__all__ = ["layers", "models", "vit", "VisionTransformer", "axial_vit",
           "AxialVisionTransformer", "resolve_model", "rebuild", "__version__"]
