"""Model builders: :func:`vit` for any Vision Transformer or hybrid,
:func:`axial_vit` for Axial-ViT, :func:`resnet_v2` for BiT ResNetV2."""

from keras_vit import lazy
# Names and their architectures: no Keras needed (the command's list/info).
from keras_vit.models.variants import Arch, UnknownModelError, parse

# The builders import Keras: loaded with the package, except in the
# ``keras-vit`` command, where they load on first use.
__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    ".features": ("available_features", "feature_model"),
    ".resnet_v2": ("ResNetV2", "resnet_v2"),
    ".vit": ("VisionTransformer", "vit"),
    ".axial": ("AxialVisionTransformer", "axial_vit"),
}))

__all__ = ["Arch", "AxialVisionTransformer", "ResNetV2", "UnknownModelError",
           "VisionTransformer", "available_features", "axial_vit",
           "feature_model", "parse", "resnet_v2", "vit"]
