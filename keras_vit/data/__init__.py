"""Images into pixels: the one decoder of every path (predict, training, serving).

Beside the models on the floor above the layers: it imports only
:mod:`keras_vit.base`, and TensorFlow inside the functions that need it.
The training input pipeline (``keras_vit.train.data``) reads through it.
"""
