"""The one import that registers every Keras class of the package.

Keras loads a ``.keras`` file by the registered names of its classes: the
layers, the model classes, and what a model trained by ``keras_vit.train``
saves with it. A library ``import keras_vit`` calls :func:`import_models`;
the ``keras-vit`` command skips it at start-up (see :mod:`keras_vit.lazy`)
and calls :func:`load_keras_classes` once a command's arguments have
parsed. It sits above the models and the training code it imports, below
the command line and the package's ``__init__`` that call it.
"""

from __future__ import annotations

import importlib
import os
import sys

from keras_vit import errors, lazy


def import_models():
    """Imports Keras, the layers and every model module, which registers
    the package's classes with Keras (and the training schedule and loss
    that a compiled model's file names); returns ``keras_vit.models``. In the
    command, a Keras backend that is not installed is one line naming the
    pip command (exit status 2), not a traceback."""
    try:
        # By module path: ``from keras_vit import models`` would ask the
        # package's __getattr__, which calls this function.
        importlib.import_module("keras_vit.layers")
        models = importlib.import_module("keras_vit.models")
        for name in models.__all__:  # the command line's lazy names too
            getattr(models, name)
        # What a model compiled by keras_vit.train saves with it.
        importlib.import_module(
            "keras_vit.train.recipes").register_keras_classes()
    except ModuleNotFoundError as e:  # KERAS_BACKEND=openvino, not installed
        if not lazy.is_command_line():
            raise
        backend = os.environ.get("KERAS_BACKEND") or "tensorflow"
        print(f"keras-vit: error: importing Keras (backend {backend!r}, "
              f"KERAS_BACKEND) needs the module {e.name!r}, which is not "
              f"installed: pip install '{errors.PACKAGES.get(e.name, e.name)}'"
              ", or set KERAS_BACKEND to an installed backend",
              file=sys.stderr)
        raise SystemExit(2) from None
    return models


def load_keras_classes(args=None):
    """Imports Keras and every class the package registers with it, as a
    library ``import keras_vit`` does, plus the training classes a saved
    run may hold (the MPP model). The command skips that at start-up
    (``--help``, ``list`` and ``info`` need no Keras); every other command
    calls this once its arguments have parsed, before it loads a file.
    (``args``, the parsed arguments, is not used: it makes this a
    ``prepare`` hook of :func:`keras_vit.cli_options.main`.)"""
    import_models()
    importlib.import_module("keras_vit.train.mpp")
