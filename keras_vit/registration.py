"""The package's Keras classes, registered whenever Keras is in the process.

Keras finds the classes a ``.keras`` file names only once they are
registered. ``import keras_vit`` stays free of Keras, so it calls
:func:`arrange`, which registers them now or right after the first
``import keras``:

>>> import keras, keras_vit
>>> keras.saving.get_registered_object("keras_vit>VisionTransformer")
<class 'keras_vit.models.vit.VisionTransformer'>
"""

from __future__ import annotations

import sys

from keras_vit.base import lazy


def register():
    """Imports what defines every class a saved model or its compile
    config can name, which registers them with Keras. Only modules that
    import no :mod:`keras_vit.layers` name at their top: this runs inside
    ``import keras``, which ``keras_vit.layers`` itself starts."""
    import keras_vit.models  # noqa: F401 - imported to register
    import keras_vit.train.mixing  # noqa: F401 - imported to register
    import keras_vit.train.schedules  # noqa: F401 - imported to register


def arrange():
    """Registers the classes now if Keras is imported, else right after
    ``import keras``."""
    if "keras" in sys.modules:
        register()
    else:
        lazy.when_imported("keras", after=register)
