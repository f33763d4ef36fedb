"""Export to ONNX through tf2onnx, verified with onnxruntime: float32,
float16 weights, dynamic int8 and static (calibrated) int8.

Large models convert in a child process (see ``onnx_worker.py`` for why
and for the measurements): ViT-B/16 peaked at 15.3 GiB with a plain
``tf2onnx.convert.from_function`` and peaks at 2.9 GiB this way.

The precisions other than float32 are made from the float32 file, which
stays in the staging directory: float16 stores the weights in half
precision (``float16_weights``); the int8 variants go through
``onnxruntime.quantization``. Measured on ViT-B/16 at 224 (random weights,
2 Zen 4 cores with AVX512-VNNI, one interleaved run; see
benchmarks/export_speed.py), images/s relative to the float32 file at batch
1 / 8:
  dynamic int8 (int8 weights, activations quantized per call): 1.69 / 1.60
  static int8 QOperator, U8 activations, per-channel S8 weights: 1.71 / 1.72
  static int8 QDQ, S8 activations, per-channel weights: 0.90 / 1.24
so static int8 is written in the QOperator format (QLinearMatMul,
QLinearConv; ORT's fused QDQ kernels were slower here). Only MatMul, Gemm
and Conv are quantized: LayerNorm, softmax, GELU and the residual adds stay
float, as in the TFLite int8 export.
"""

from __future__ import annotations

import os
import sys

from keras_vit.base.checks import require
from keras_vit.export import onnx_worker as worker
from keras_vit.export import common, pipeline, samples
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph

# tf2onnx 1.17 writes opsets up to 18; onnxruntime 1.31 runs up to 23.
# 17 is the first with LayerNormalization and runs on onnxruntime >= 1.11.
DEFAULT_OPSET = 17
# Its runtime is onnxruntime: exported from JAX or PyTorch, only the
# conversion runs in the TensorFlow process.
RUNTIME_NEEDS_TENSORFLOW = False
MIN_OPSET = 13
# Models with more weights than this convert in a child process; smaller
# ones convert in this process, where tf2onnx's overhead is negligible and
# the child's start-up (importing TensorFlow again) would dominate.
ISOLATE_ABOVE_BYTES = 64 * 2**20
# The ops whose weights (and, for static int8, inputs) are quantized.
INT8_OPS = ("MatMul", "Gemm", "Conv")
# Calibration keeps every calibrated tensor of this many images in memory
# before reducing them to ranges (ViT-B/16: about 160 MB per image).
_CALIBRATION_CHUNK = 4


def max_opset():
    """The newest opset tf2onnx can write (and onnx knows)."""
    onnx = require("onnx", purpose="ONNX export")
    constants = require("tf2onnx.constants", purpose="ONNX export")

    return min(max(constants.OPSET_TO_IR_VERSION),
               onnx.defs.onnx_opset_version())


def open_artifact(path, num_threads=None):
    """Loads an ``.onnx`` file (external data beside it) with onnxruntime
    on the CPU and returns ``images -> {name: array}`` (a NaFlex
    model's: a dict of its inputs by name)."""
    ort = require("onnxruntime", purpose="running ONNX files")

    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    session = ort.InferenceSession(path, options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]

    def run(images):
        feeds = dict(images) if isinstance(images, dict) else {name: images}
        return dict(zip(names, session.run(None, feeds)))

    return run


def float16_weights(proto, min_elements=16):
    """Stores the float32 initializers of ``proto`` in float16, each read
    through a ``Cast`` back to float32; returns how many were converted.

    The file halves; onnxruntime folds the casts when it loads the model,
    so it computes in float32 as fast as the float32 file (onnxruntime has
    few float16 kernels on x86 CPUs; a graph computing in float16 would
    run slower there). Tensors under ``min_elements`` values and tensors
    with values beyond float16's range (65504) stay float32.

    >>> import numpy as np, onnx
    >>> from onnx import helper, numpy_helper
    >>> w = numpy_helper.from_array(np.full((4, 8), 0.1, np.float32), "w")
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
    ...                                    [1, 4])],
    ...     [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
    ...                                    [1, 8])], [w])
    >>> proto = helper.make_model(graph)
    >>> float16_weights(proto)
    1
    >>> [n.op_type for n in proto.graph.node]
    ['Cast', 'MatMul']
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    casts = []
    for tensor in proto.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(tensor)
        if values.size < min_elements or not np.all(
                np.abs(values) <= np.finfo(np.float16).max):
            continue
        name = tensor.name
        tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float16),
                                                f"{name}/float16"))
        casts.append(helper.make_node("Cast", [tensor.name], [name],
                                      name=f"{name}/to_float32",
                                      to=onnx.TensorProto.FLOAT))
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(casts + nodes)
    return len(casts)


def _quantize(source, quantization, images, work, external=False):
    """The ModelProto of the ``quantization`` variant of the float32 file
    ``source`` (``external``: its weights are in an external data file);
    ``images`` calibrate static int8. Scratch files go to the directory
    ``work``."""
    import onnx

    if quantization == "float16":
        proto = onnx.load(source)
        float16_weights(proto)
        return proto
    from onnxruntime import quantization as q

    # Shape inference and ORT's basic fusions first (onnxruntime's
    # recommended step); tf2onnx's dynamic reshapes defeat the symbolic
    # shape inference, which is skipped.
    prepared = os.path.join(work, "prepared.onnx")
    q.quant_pre_process(source, prepared, skip_symbolic_shape=True,
                        save_as_external_data=external)
    out = os.path.join(work, "quantized.onnx")
    reduce = int8_reduce_range()
    if quantization == "dynamic_int8":
        q.quantize_dynamic(prepared, out, weight_type=q.QuantType.QInt8,
                           op_types_to_quantize=list(INT8_OPS),
                           reduce_range=reduce)
    else:
        session_input = onnx.load(prepared, load_external_data=False
                                  ).graph.input[0].name
        q.quantize_static(
            prepared, out, _Calibration(session_input, images),
            quant_format=q.QuantFormat.QOperator,
            activation_type=q.QuantType.QUInt8,
            weight_type=q.QuantType.QInt8, per_channel=True,
            reduce_range=reduce, op_types_to_quantize=list(INT8_OPS),
            calibrate_method=q.CalibrationMethod.MinMax,
            extra_options={"CalibStridedMinMax": _stride(len(images))})
    return onnx.load(out)


def int8_reduce_range():
    """Whether int8 weights keep to 7 bits on this machine.

    onnxruntime's x86 int8 kernels without VNNI (AVX2 / AVX-512 F) multiply
    uint8 activations by int8 weights with VPMADDUBSW, whose int16 pair sums
    saturate; onnxruntime's documentation prescribes ``reduce_range`` (7-bit
    weights) there. Measured on an AMD EPYC without VNNI: a digits ViT's
    dynamic-int8 logits 0.64 relative RMS off Keras with 8-bit weights.
    With VNNI or AMX int8 (``keras_vit.runtime.hardware``) the full 8 bits are kept.
    ``KERAS_VIT_CPU_FLAGS`` forces a machine, as for every speed decision.

    >>> int8_reduce_range() in (True, False)
    True
    """
    from keras_vit.runtime import hardware

    return hardware.detect().int8_units is None


def _stride(count):
    """Images per calibration round: at most _CALIBRATION_CHUNK, and a
    divisor of ``count`` (onnxruntime's CalibStridedMinMax requires one;
    its CalibMaxIntermediateOutputs drops every full round's data in 1.31,
    so it is not used)."""
    return max(c for c in range(1, _CALIBRATION_CHUNK + 1) if count % c == 0)


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over an array: one
    image per call, within the range of images set by ``set_range``."""

    def __init__(self, name, images):
        self.name = name
        self.images = images
        self.index, self.end = 0, len(images)

    def __len__(self):
        return len(self.images)

    def set_range(self, start_index, end_index):
        self.index, self.end = start_index, min(end_index, len(self.images))

    def get_next(self):
        if self.index >= self.end:
            return None
        self.index += 1
        return {self.name: self.images[self.index - 1:self.index]}


def _check_opset(opset, newest=True):
    """The opset to write (default 17); ``newest``: also check that tf2onnx
    can write it (which imports TensorFlow; a JAX or PyTorch process leaves
    that check to the converter process)."""
    if opset is None:
        return DEFAULT_OPSET
    top = max_opset() if newest else None
    if (not isinstance(opset, int) or isinstance(opset, bool)
            or opset < MIN_OPSET or (top is not None and opset > top)):
        bound = (f"to {top} (tf2onnx's newest)" if top is not None
                 else "to tf2onnx's newest")
        raise ValueError(f"opset must be an integer from {MIN_OPSET} {bound}"
                         f"; received opset={opset!r}")
    return opset


def _convert_here(graph, path, opset, external_data):
    """Converts in this process (small models)."""
    tf2onnx = require("tf2onnx", purpose="ONNX export")

    proto, _ = tf2onnx.convert.from_function(
        graph.function(), input_signature=graph.input_specs(), opset=opset)
    worker.name_batch_dimension(proto)
    worker.guard_zero_pad_before_max_pool(proto)
    files, total, external = worker.write_model(proto, None, path,
                                                external_data)
    return {"files": [os.path.basename(f) for f in files],
            "tensor_bytes": total, "external_data": external}


def _convert_in_child(saved_model_dir, path, opset, external_data, workdir,
                      rss):
    """Converts in a child process (``python -m
    keras_vit.export.onnx_worker``); returns the worker's result."""
    job = {"saved_model": saved_model_dir, "output": path, "opset": opset,
           "external_data": external_data}
    # The pure-Python protobuf must be chosen before protobuf is imported.
    return pipeline.run_child(
        "keras_vit.export.onnx_worker", job, workdir, rss,
        what="the ONNX converter process (tf2onnx)",
        env={"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})


def to_onnx(model, path, *, quantization="float32",
            representative_data=None, representative_samples=None,
            opset=None, external_data=None,
            uint8_input=False, outputs=None, verify=True,
            batch_sizes=(4, 1), tolerance=None, verify_data=None,
            agreement_samples=common.DEFAULT_AGREEMENT_SAMPLES,
            cast_to_float32=True, overwrite=True, isolate="auto"):
    """Exports ``model`` to an ``.onnx`` file and verifies it with
    onnxruntime.

    The graph takes ``images`` (batch dimension ``"batch"``, dynamic) and
    returns the named ``outputs`` (default: a classifier's ``logits`` and
    ``probabilities``, a feature extractor's embedding ``pre_logits``).

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy).
        path: the file to write; must end with ``.onnx``.
        quantization: ``"float32"``; ``"float16"`` (weights stored in
            fp16, half the size, computed in float32, see
            :func:`float16_weights`); ``"dynamic_int8"`` (int8 weights of
            the MatMul/Gemm/Conv ops, their inputs quantized per call, a
            quarter of the size); ``"int8"`` (static: activation ranges
            calibrated on ``representative_data``, QOperator format,
            per-channel weights). The names and their meaning follow
            :func:`~keras_vit.export.to_tflite`.
        representative_data: for ``"int8"``: the user's images: a folder
            of image files (decoded and resized as ``keras-vit predict``
            does), or an array, an iterable or ``tf.data.Dataset`` of
            images, batches or ``(images, labels)`` pairs, or a callable
            returning one, as [0, 255] pixels (integers always are) or as
            the model's own inputs (see
            :func:`~keras_vit.export.samples.read_as_input`); the export
            normalises pixels as the model's ``input_normalization`` says.
            The images beyond the first ``representative_samples`` (up to
            ``agreement_samples``) verify the file, else the calibration
            images themselves. Default: crops of the sample photos of
            scikit-learn/scikit-image, which the report notes.
        representative_samples: images drawn for calibration (default 100).
        opset: ONNX opset, 13 to 18 (default 17).
        external_data: store the weights in ``path + ".data"`` (None: only
            when they exceed the 2 GiB protobuf limit, e.g. ViT-H/14).
        uint8_input: take uint8 pixels and scale them inside.
        outputs: output names (see :class:`~keras_vit.export.graph.
            ServingGraph`).
        verify: run and compare the artifact.
        batch_sizes: batch sizes to run it at.
        tolerance: overrides of the tolerance of the quantization.
        verify_data: ``"noise"``, ``"photos"`` or an array of images;
            default noise for float32/float16, photos for dynamic int8,
            and for int8 the images of ``representative_data`` (photos
            without it): activations were calibrated for images, not
            noise.
        agreement_samples: images compared for the int8 variants.
        cast_to_float32: export bf16/fp16 models as a float32 copy.
        overwrite: replace existing files.
        isolate: convert in a child process: True, False, or ``"auto"``
            (when the weights exceed 64 MiB; much lower peak memory, see the
            module docstring).

    Returns:
        The report, also written beside the model as
        ``path + ".report.json"``: the files written (the model, and its
        ``.data`` file with ``external_data``), the options and the
        checks' results.

    Example:

    >>> import tempfile, os, keras_vit
    >>> from keras_vit.export import to_onnx
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> folder = tempfile.mkdtemp()
    >>> report = to_onnx(model, os.path.join(folder, "vit.onnx"),
    ...                  external_data=True)
    >>> sorted(os.listdir(folder))
    ['vit.onnx', 'vit.onnx.data', 'vit.onnx.report.json']
    >>> small = os.path.join(folder, "vit_int8.onnx")
    >>> report = to_onnx(model, small, quantization="dynamic_int8")
    >>> report["options"]["quantization"], report["verified"]
    ('dynamic_int8', True)
    """
    representative_samples = common.check_quantization(
        quantization, representative_data, representative_samples)
    common.refuse_keras_quantized(model, "onnx")
    dest = common.check_path(path, "onnx")
    # Before any work: the conversion may run in a child process, whose
    # ImportError would arrive as a worker failure, not as this one line.
    # Found, not imported: tf2onnx imports TensorFlow.
    for module in ("tf2onnx", "onnx", "onnxruntime"):
        common.require_installed(module, purpose="ONNX export")
    opset = _check_opset(opset, newest=pipeline.tensorflow_here())
    if external_data not in (None, True, False):
        raise ValueError("external_data must be None (automatic), True or "
                         f"False; received external_data={external_data!r}")
    if isolate not in ("auto", True, False):
        raise ValueError("isolate must be 'auto', True or False; received "
                         f"isolate={isolate!r}")
    tol = common.tolerance_for(
        "onnx" if quantization == "float32" else f"onnx/{quantization}",
        tolerance)
    quantized = quantization in ("dynamic_int8", "int8")
    if verify_data is None and quantization == "dynamic_int8":
        verify_data = "photos"  # int8 weights: judged on images, not noise
    checks.check_options(batch_sizes, verify_data)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32)
    if isolate == "auto":
        isolate = graph.weights_bytes() > ISOLATE_ABOVE_BYTES
    options = {"quantization": quantization, "opset": opset,
               "uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs),
               "cast_to_float32": bool(cast_to_float32),
               "converter_process": "this process" if (
                   pipeline.tensorflow_here() and not isolate) else "child"}
    notes = []
    images = None
    if quantization == "int8":
        # Before anything is converted: data the export cannot read as
        # the model's inputs fails here.
        images, verify_data = samples.int8_calibration(
            graph, representative_data, representative_samples, verify_data,
            agreement_samples, options, notes)
        options["int8"] = {"format": "QOperator", "activations": "uint8",
                           "weights": "int8 per channel",
                           "ops": list(INT8_OPS)}
    elif quantization == "dynamic_int8":
        options["int8"] = {"format": "dynamic (MatMulInteger, "
                                     "DynamicQuantizeLinear)",
                           "weights": "int8 per tensor",
                           "ops": list(INT8_OPS)}
    return pipeline.run(pipeline.ExportJob(
        "onnx", "the ONNX file", dest, graph, tol, options,
        params={"quantization": quantization, "opset": opset,
                "external_data": external_data, "isolate": bool(isolate)},
        arrays={} if images is None else {"calibration": images},
        notes=notes, verify=verify, batch_sizes=batch_sizes,
        verify_data="noise" if verify_data is None else verify_data,
        samples=agreement_samples if quantized else None,
        seed=1 if quantized else 0, overwrite=overwrite,
        side_files=(".data",)), sys.modules[__name__])


def convert(graph, staged, workdir, params, arrays, rss):
    """Writes the float32 ONNX file (tf2onnx, TensorFlow): ``staged``
    itself, or the source of the quantized variant that :func:`finish`
    makes."""
    opset = _check_opset(params["opset"])
    # The float32 file is the artifact, or the source of the variant.
    converted = staged if params["quantization"] == "float32" else (
        os.path.join(workdir, "float32.onnx"))
    if params["isolate"]:
        saved_model_dir = os.path.join(workdir, "saved_model")
        graph.save(saved_model_dir)
        return _convert_in_child(saved_model_dir, converted, opset,
                                 params["external_data"], workdir, rss)
    return _convert_here(graph, converted, opset, params["external_data"])


def finish(staged, workdir, params, arrays, result):
    """The quantized variant (onnxruntime, no TensorFlow) of the float32
    file that :func:`convert` wrote."""
    quantization = params["quantization"]
    if quantization != "float32":
        work = os.path.join(workdir, "quantization")
        os.mkdir(work)
        proto = _quantize(os.path.join(workdir, "float32.onnx"),
                          quantization, arrays.get("calibration"), work,
                          result["external_data"])
        written, total, external = worker.write_model(
            proto, None, staged, params["external_data"])
        del proto
        result = {"files": [os.path.basename(f) for f in written],
                  "tensor_bytes": total, "external_data": external}
    result["options"] = {"external_data": result["external_data"]}
    return result
