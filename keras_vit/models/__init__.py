"""Model builders: :func:`vit` for any Vision Transformer or hybrid."""

from keras_vit.models.features import available_features, feature_model
from keras_vit.models.variants import Arch, UnknownModelError, parse
from keras_vit.models.vit import VisionTransformer, vit

__all__ = ["Arch", "UnknownModelError", "VisionTransformer",
           "available_features", "feature_model", "parse", "vit"]
