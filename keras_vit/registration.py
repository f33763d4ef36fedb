"""The package's Keras classes, registered whenever Keras is in the process.

A ``.keras`` file names its classes (``keras_vit>VisionTransformer``) and
Keras finds them only once they are registered, which importing
:mod:`keras_vit.models` (and, for a model a training run compiled, the
modules of its schedule and loss) does. ``import keras_vit`` must stay
free of Keras, so it calls :func:`arrange`: with Keras already imported
the classes are registered at once; otherwise they are registered right
after the first ``import keras`` finishes. Either way ``import keras_vit`` followed by
``keras.saving.load_model("model.keras")`` works, in either order:

>>> import keras, keras_vit
>>> keras.saving.get_registered_object("keras_vit>VisionTransformer")
<class 'keras_vit.models.vit.VisionTransformer'>
"""

from __future__ import annotations

import sys

from keras_vit.base import lazy


def register():
    """Imports what defines every class a saved model or its compile
    config can name, :mod:`keras_vit.models` and the training's
    schedules, losses and metrics (:mod:`keras_vit.train.schedules`,
    :mod:`keras_vit.train.mixing`), which registers the classes with
    Keras (this imports Keras). Only modules that import no
    :mod:`keras_vit.layers` name at their top: this runs inside
    ``import keras``, which ``keras_vit.layers`` itself starts. MPP's
    training wrapper registers with :mod:`keras_vit.train.mpp`."""
    import keras_vit.models  # noqa: F401 - imported to register
    import keras_vit.train.mixing  # noqa: F401 - imported to register
    import keras_vit.train.schedules  # noqa: F401 - imported to register


def arrange():
    """Registers the classes now if Keras is imported, else right after
    ``import keras`` (:func:`keras_vit.base.lazy.when_imported`)."""
    if "keras" in sys.modules:
        register()
    else:
        lazy.when_imported("keras", after=register)
