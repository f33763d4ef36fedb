"""Errors, checks, schemas, every cap, settings and safe files: plain Python, no Keras.

The lowest floor: everything above may import it, and it imports nothing
of the package but itself. It also holds what ``import keras_vit`` runs
(the lazy names, the version) and the table of named architectures, which
the command line reads without loading a framework.
"""
