"""The machine and the backend: CPU features, Keras' private APIs, the kernel seam, TF's logs.

The only floor that asks which Keras backend runs, reads ``/proc`` or
imports ``keras.src``; what it learns reaches the layers above as plain
choices (:func:`keras_vit.runtime.hardware.plan`), and the layers' math
runs through one seam (:mod:`keras_vit.runtime.kernels`: each backend's
spelling of dense, LayerNorm and attention). It imports only
:mod:`keras_vit.base`.
"""
