"""keras-vit: the Vision Transformer family for Keras 3.

>>> import keras_vit
>>> model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
...                            num_classes=10)

``import keras_vit`` is light and does the same in every process: it
imports no Keras, TensorFlow, JAX or torch, and prints nothing. Each name
imports its module on first use (``keras_vit.zoo``, ``keras_vit.vit``,
...). Every layer and model class registers with Keras as soon as Keras is
imported (before or after this package, :mod:`keras_vit.registration`),
so a ``.keras`` file loads with ``keras.saving.load_model`` after
``import keras_vit``.
"""

from keras_vit import registration
from keras_vit.runtime import hardware
from keras_vit.base import lazy
from keras_vit.base.version import __version__

# TensorFlow's oneDNN CPU rewrites (the fused matmul + bias + GELU), where
# TensorFlow would leave them off, are chosen just before TensorFlow is
# first imported (by this package, Keras or the user): an environment
# variable TensorFlow reads then. Nothing is read or set now.
lazy.when_imported("tensorflow", before=hardware.enable_onednn)

# The model classes register with Keras when Keras is (or gets) imported,
# so that keras.saving.load_model reads a keras_vit file.
registration.arrange()

__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    # The root of every error the package raises on purpose.
    ".base.errors": ("KerasVitError",),
    ".models": ("AxialVisionTransformer", "VisionTransformer", "axial_vit",
                "vit"),
    # Getting and copying models is the zoo's (keras_vit.zoo.resolve).
    ".zoo.resolve": ("rebuild", "resolve_model"),
    # TensorFlow's C++ start-up lines off stderr, as the command does.
    ".runtime.quiet": ("hide_tensorflow_logs",),
}), modules={
    "analysis": ".analysis", "export": ".export", "layers": ".layers",
    "models": ".models", "train": ".train", "zoo": ".zoo",
    # Modules users name at the package's top, kept there as they moved
    # into their floors.
    "images": ".data.images", "variants": ".base.variants"})

# The floors, bottom to top: the folders of the package (zoo/ and export/
# live beside it and install as keras_vit.zoo and keras_vit.export). A
# module imports its own floor and the ones below, never above
# (tests/contracts/test_structure.py); each folder's docstring says what it
# holds (docs/architecture.md lists them).
FLOORS = (("base",), ("runtime",), ("layers",), ("models", "data"),
          ("zoo",), ("train", "analysis", "export"), ("cli",))

__all__ = ["AxialVisionTransformer", "KerasVitError", "VisionTransformer",
           "__version__",
           "analysis", "axial_vit", "export", "hide_tensorflow_logs",
           "layers", "models", "rebuild",
           "resolve_model", "train", "variants", "vit", "zoo"]
