"""Model builders: :func:`vit` for any Vision Transformer."""

from keras_vit.models.variants import Arch, UnknownModelError, parse
from keras_vit.models.vit import VisionTransformer, vit

__all__ = ["Arch", "UnknownModelError", "VisionTransformer", "parse", "vit"]
