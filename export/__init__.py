"""Exporters to SavedModel, TFLite, ONNX and OpenVINO IR (installed as
keras_vit.export).

Every exporter builds its artifact next to the destination, runs it in its
deployment runtime (``tf.saved_model.load``, ``ai_edge_litert``,
``onnxruntime``, OpenVINO) at two batch sizes, compares it with Keras and only then
moves it into place with a JSON report beside it (inside, for a SavedModel).
An artifact outside the tolerance of its format raises :class:`ExportError`
and leaves nothing that looks finished.

>>> import os, tempfile, keras_vit
>>> from keras_vit import export
>>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
>>> report = export.export(model, os.path.join(tempfile.mkdtemp(), "m.onnx"))
>>> report["format"], report["batch_sizes"], report["top1_agreement"]
('onnx', [4, 1], 1.0)

The heavy libraries (TensorFlow, tf2onnx, onnxruntime, ai_edge_litert,
openvino) are imported when an exporter runs, not with this package;
OpenVINO is an optional extra (``pip install 'keras-vit[openvino]'``).
"""

from keras_vit.export.common import (EXTENSIONS, FORMATS, TOLERANCES,
                                     ExportError, check_format, read_report)

from keras_vit.export.labels import (  # noqa: E402
    read_image_sizes, read_label_names)
from keras_vit.export.onnx import to_onnx  # noqa: E402
from keras_vit.export.openvino import to_openvino  # noqa: E402
from keras_vit.export.saved_model import to_saved_model  # noqa: E402
from keras_vit.export.tflite import to_tflite  # noqa: E402
from keras_vit.export.verify import verification_table  # noqa: E402

__all__ = ["FORMATS", "TOLERANCES", "ExportError", "export",
           "read_image_sizes", "read_label_names", "read_report", "to_onnx",
           "to_openvino", "to_saved_model", "to_tflite",
           "verification_table"]

_EXPORTERS = {"saved_model": to_saved_model, "tflite": to_tflite,
              "onnx": to_onnx, "openvino": to_openvino}


def export(model, path, format=None, **kwargs):
    """Exports ``model`` to ``path`` in ``format`` ("saved_model",
    "tflite", "onnx" or "openvino"; default: from the extension of
    ``path``, ``.xml`` being OpenVINO IR and a path without one a
    SavedModel directory) and returns the report. Keyword arguments go to
    the format's exporter."""
    import os

    from keras_vit.base.checks import check_model, check_path

    check_model("model", model)
    check_path("path", path)
    if format is None:
        ext = os.path.splitext(os.fspath(path))[1].lower()
        by_extension = {suffix: name for name, suffix in EXTENSIONS.items()}
        format = {**by_extension, "": "saved_model"}.get(ext)
        if format is None:
            raise ValueError(
                f"cannot tell the format from path={os.fspath(path)!r}; "
                f"pass format= one of {FORMATS} (.tflite, .onnx, .xml, or "
                "a directory for a SavedModel)")
    return _EXPORTERS[check_format(format)](model, path, **kwargs)
