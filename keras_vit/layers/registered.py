"""The name every keras_vit class registers with Keras under (``keras_vit>ClassName``).

Saved ``.keras`` files name their classes by it; a module free of Keras.
"""

PACKAGE = "keras_vit"
"""The Keras registration package of every keras_vit class."""
