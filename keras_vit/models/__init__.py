"""Model builders: :func:`vit` for any Vision Transformer or hybrid,
:func:`axial_vit` for Axial-ViT, :func:`resnet_v2` for BiT ResNetV2.
:mod:`keras_vit.models.lora` fine-tunes any of them with Keras' LoRA."""

from keras_vit import lazy
# Names and their architectures: no Keras needed (the command's list/info).
from keras_vit.models.variants import Arch, UnknownModelError, parse

# The builders import Keras: loaded with the package, except in the
# ``keras-vit`` command, where they load on first use.
_builders, __dir__ = lazy.attach(__name__, lazy.names_of({
    ".features": ("available_features", "feature_model"),
    ".resnet_v2": ("ResNetV2", "resnet_v2"),
    ".vit": ("VisionTransformer", "vit"),
    ".axial": ("AxialVisionTransformer", "axial_vit"),
}))

# Moved up to the zoo's floor (they read checkpoints, and a model never
# imports the zoo): an old import gets the new place, not a bare miss.
MOVED = {"resolve_model": "keras_vit.zoo.resolve_model",
         "rebuild": "keras_vit.zoo.rebuild",
         "model_path": "keras_vit.zoo.resolve.model_path",
         "load_keras_file": "keras_vit.zoo.resolve.load_keras_file"}


def __getattr__(name):
    if name in MOVED:
        raise AttributeError(
            f"keras_vit.models.{name} moved to {MOVED[name]} (it reads "
            f"checkpoints, which is the zoo's work); import it from there")
    return _builders(name)


__all__ = ["Arch", "AxialVisionTransformer", "ResNetV2", "UnknownModelError",
           "VisionTransformer", "available_features", "axial_vit",
           "feature_model", "parse", "resnet_v2", "vit"]
