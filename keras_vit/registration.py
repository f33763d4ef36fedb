"""The package's Keras classes, registered whenever Keras is in the process.

A ``.keras`` file names its classes (``keras_vit>VisionTransformer``) and
Keras finds them only once they are registered, which importing
:mod:`keras_vit.models` (and :mod:`keras_vit.train.schedules`, for a
compiled model) does. ``import keras_vit`` must stay free of Keras, so it
calls :func:`arrange`: with Keras already imported the classes are
registered at once; otherwise they are registered right after the first
``import keras`` finishes. Either way ``import keras_vit`` followed by
``keras.saving.load_model("model.keras")`` works, in either order:

>>> import keras, keras_vit
>>> keras.saving.get_registered_object("keras_vit>VisionTransformer")
<class 'keras_vit.models.vit.VisionTransformer'>
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

def register():
    """Imports what defines every class a saved model or its compile
    config can name, :mod:`keras_vit.models` and
    :mod:`keras_vit.train.schedules`, which registers the classes with
    Keras (this imports Keras)."""
    import keras_vit.models  # noqa: F401 - imported to register
    import keras_vit.train.schedules  # noqa: F401 - imported to register


class _Loader(importlib.abc.Loader):
    """Keras' own loader, then :func:`register` once Keras has run."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        register()


class _AfterKeras(importlib.abc.MetaPathFinder):
    """Finds ``keras`` as the other finders would, with :class:`_Loader`.
    It stays until Keras is imported (a mere ``find_spec("keras")``, as
    TensorFlow does to see whether Keras is installed, does not use it up).
    """

    searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec("keras")
        finally:
            self.searching = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self)
        return spec


def arrange():
    """Registers the classes now if Keras is imported, else right after
    ``import keras`` (a finder on ``sys.meta_path``, removed when used)."""
    if "keras" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterKeras())
