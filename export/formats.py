"""The export formats by name, and what a format module gives the exporter
skeleton (:mod:`keras_vit.export.pipeline`): :class:`FormatModule`.

Each format is a module of this package that checks its arguments,
describes the export as an :class:`~keras_vit.export.pipeline.ExportJob`
and hands the job and itself to :func:`keras_vit.export.pipeline.run`.
"""

from __future__ import annotations

import typing

from keras_vit.base.checks import check_choice
from keras_vit.export.common import FORMATS


class FormatModule(typing.Protocol):
    """What :func:`keras_vit.export.pipeline.run` reads on a format module.
    The module's own attributes are read at each export, so that a
    replaced ``open_artifact`` is the one used."""

    #: Whether the artifact runs only in TensorFlow (a SavedModel): then the
    #: TensorFlow child process also runs the verification batches.
    RUNTIME_NEEDS_TENSORFLOW: bool

    def convert(self, graph, staged, workdir, params, arrays, rss) -> dict:
        """Writes the artifact at ``staged`` with TensorFlow and returns a
        JSON-able result: ``{"files": [...]}`` (names in ``workdir``),
        optionally ``"options"`` for the report."""

    def finish(self, staged, workdir, params, arrays, result) -> dict:
        """Work on the converted artifact that needs no TensorFlow (ONNX
        quantization, TFLite's op dtypes, OpenVINO's int8 weights), in the
        user's process; returns ``result``, updated (with
        ``"child_peak_rss"``, in bytes, when it ran a child process)."""

    def open_artifact(self, path) -> typing.Callable:
        """``images -> {name: array}``: the artifact at ``path`` in the
        runtime it is deployed with."""


def format_module(fmt) -> FormatModule:
    """The module of format ``fmt`` (one of
    :data:`keras_vit.export.common.FORMATS`), imported on first use."""
    check_choice("format", fmt, FORMATS)
    if fmt == "saved_model":
        from keras_vit.export import saved_model as module
    elif fmt == "tflite":
        from keras_vit.export import tflite as module
    elif fmt == "onnx":
        from keras_vit.export import onnx as module
    else:
        from keras_vit.export import openvino as module
    return module
