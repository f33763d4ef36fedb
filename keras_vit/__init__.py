"""keras-vit: the Vision Transformer family for Keras 3.

>>> import keras_vit
>>> model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
...                            num_classes=10)

``import keras_vit`` is light and does the same in every process: it
imports no Keras, TensorFlow, JAX or torch, and prints nothing. Each name
imports its module on first use (``keras_vit.zoo``, ``keras_vit.vit``,
...). Importing :mod:`keras_vit.models` (as any of its names does)
registers every layer and model class with Keras, so a ``.keras`` file
loads with ``keras.saving.load_model`` after ``import keras_vit.models``;
``keras_vit.zoo.load("model.keras")`` needs nothing more than this package.
"""

from keras_vit import hardware, lazy
from keras_vit.version import __version__

# Before anything imports TensorFlow: its oneDNN CPU rewrites (the fused
# matmul + bias + GELU) where TensorFlow would leave them off. Only an
# environment variable is set; TensorFlow reads it when it is imported.
hardware.enable_onednn()

__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    # The root of every error the package raises on purpose.
    ".errors": ("KerasVitError",),
    ".models": ("AxialVisionTransformer", "VisionTransformer", "axial_vit",
                "vit"),
    # Getting and copying models is the zoo's (keras_vit.zoo.resolve).
    ".zoo.resolve": ("rebuild", "resolve_model"),
}), modules=("analysis", "export", "layers", "models", "train", "variants",
             "zoo"))

__all__ = ["AxialVisionTransformer", "KerasVitError", "VisionTransformer",
           "__version__",
           "analysis", "axial_vit", "export", "layers", "models", "rebuild",
           "resolve_model", "train", "variants", "vit", "zoo"]
