"""Exporters to SavedModel, TFLite and ONNX (installed as keras_vit.export).

Each exporter runs its artifact and compares it with Keras before declaring
it good. The exporters land with the export issue; this package exists so
that the layout (and its packaging test) is in place from the start.
"""

__all__ = []
