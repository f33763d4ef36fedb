"""The machine and the backend: CPU features, Keras' private APIs, fused kernels, TF's logs.

The only floor that asks which Keras backend runs, reads ``/proc`` or
imports ``keras.src``; what it learns reaches the layers above as plain
choices (:func:`keras_vit.runtime.hardware.plan`). It imports only
:mod:`keras_vit.base`.
"""
