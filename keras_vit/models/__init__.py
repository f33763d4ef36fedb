"""Model builders: :func:`vit` for any Vision Transformer or hybrid,
:func:`axial_vit` for Axial-ViT, :func:`resnet_v2` for BiT ResNetV2.

Importing this package registers every Keras class of the models (the
model classes and, through them, :mod:`keras_vit.layers`) with Keras, so a
``.keras`` file loads with ``keras.saving.load_model`` afterwards (``import
keras_vit`` arranges this as soon as Keras is imported):

>>> import keras, keras_vit.models
>>> keras.saving.get_registered_object("keras_vit>VisionTransformer")
<class 'keras_vit.models.vit.VisionTransformer'>

Names and their architectures (``parse("ViT-B/16")``) are
:mod:`keras_vit.base.variants`, which needs no Keras. :mod:`keras_vit.models.lora`
fine-tunes any model with Keras' LoRA.
"""

from keras_vit.models.axial import AxialVisionTransformer, axial_vit
from keras_vit.models.features import (available_features, feature_model,
                                       intermediate_model)
from keras_vit.models.resnet_v2 import ResNetV2, resnet_v2
from keras_vit.models.vit import VisionTransformer, vit

__all__ = ["AxialVisionTransformer", "ResNetV2", "VisionTransformer",
           "available_features", "axial_vit", "feature_model",
           "intermediate_model", "resnet_v2",
           "vit"]
