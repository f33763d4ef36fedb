"""The name every keras_vit class registers with Keras under (``keras_vit>ClassName``).

Saved ``.keras`` files name their classes by it, so it never changes. It is
a module of its own, free of Keras, so that the package ``keras_vit.layers``
holds it before it imports Keras (see the package's ``__init__``).
"""

PACKAGE = "keras_vit"
"""The Keras registration package of every keras_vit class."""
