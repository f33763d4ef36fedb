"""Model builders: :func:`vit` for any Vision Transformer or hybrid,
:func:`axial_vit` for Axial-ViT, :func:`resnet_v2` for BiT ResNetV2."""

from keras_vit.models.features import available_features, feature_model
from keras_vit.models.variants import Arch, UnknownModelError, parse
from keras_vit.models.resnet_v2 import ResNetV2, resnet_v2
from keras_vit.models.vit import VisionTransformer, vit
from keras_vit.models.axial import AxialVisionTransformer, axial_vit
from keras_vit.models.resolve import rebuild, resolve_model

__all__ = ["Arch", "AxialVisionTransformer", "ResNetV2", "UnknownModelError",
           "VisionTransformer", "available_features", "axial_vit",
           "feature_model", "parse", "rebuild", "resnet_v2", "resolve_model",
           "vit"]
