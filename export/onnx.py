"""Export to ONNX through tf2onnx, verified with onnxruntime: float32,
float16 weights, dynamic int8 and static (calibrated) int8.

Large models convert in a child process (``onnx_worker.py``): ViT-B/16
peaks at 2.9 GiB instead of 15.3 GiB.

The other precisions are made from the float32 file. Static int8 is
written in the QOperator format: on ViT-B/16 (2 Zen 4 cores, batch 1 / 8)
it ran 1.71 / 1.72 times the float32 file's images/s, QDQ 0.90 / 1.24.
Only MatMul, Gemm and Conv are quantized.
"""

from __future__ import annotations

import os
import sys

from keras_vit.base.checks import require
from keras_vit.export import onnx_worker as worker
from keras_vit.export import common, pipeline, samples
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph

# 17: the first opset with LayerNormalization (onnxruntime >= 1.11).
DEFAULT_OPSET = 17
RUNTIME_NEEDS_TENSORFLOW = False
MIN_OPSET = 13
# Smaller models convert in this process: a child's start-up would dominate.
ISOLATE_ABOVE_BYTES = 64 * 2**20
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
    """Loads an ``.onnx`` file with onnxruntime on the CPU and returns
    ``images -> {name: array}``."""
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

    onnxruntime folds the casts when it loads the model, so it computes in
    float32 as fast as the float32 file (it has few float16 kernels on
    x86). Tensors under ``min_elements`` values or beyond float16's range
    stay float32.

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
    ``source``; ``images`` calibrate static int8."""
    import onnx

    if quantization == "float16":
        proto = onnx.load(source)
        float16_weights(proto)
        return proto
    from onnxruntime import quantization as q

    # tf2onnx's dynamic reshapes defeat the symbolic shape inference.
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

    onnxruntime's x86 int8 kernels without VNNI saturate their int16 pair
    sums (a digits ViT's dynamic-int8 logits: 0.64 relative RMS off Keras
    with 8-bit weights); with VNNI or AMX int8 the full 8 bits are kept.

    >>> int8_reduce_range() in (True, False)
    True
    """
    from keras_vit.runtime import hardware

    return hardware.detect().int8_units is None


def _stride(count):
    """Images per calibration round: at most _CALIBRATION_CHUNK, and a
    divisor of ``count`` (onnxruntime's CalibStridedMinMax requires one;
    CalibMaxIntermediateOutputs drops every full round's data in 1.31)."""
    return max(c for c in range(1, _CALIBRATION_CHUNK + 1) if count % c == 0)


class _Calibration:
    """onnxruntime's CalibrationDataReader over an array, one image a
    call."""

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
    can write it (which imports TensorFlow)."""
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


def to_onnx(model, path, *, quantization="float32",
            representative_data=None, representative_samples=None,
            opset=None, external_data=None,
            uint8_input=False, outputs=None, verify=True,
            batch_sizes=(4, 1), tolerance=None, verify_data=None,
            agreement_samples=common.DEFAULT_AGREEMENT_SAMPLES,
            cast_to_float32=True, overwrite=True, isolate="auto"):
    """Exports ``model`` to an ``.onnx`` file and verifies it with
    onnxruntime.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy).
        path: the file to write; must end with ``.onnx``.
        quantization: ``"float32"``; ``"float16"`` (weights stored in
            fp16, computed in float32, see :func:`float16_weights`);
            ``"dynamic_int8"`` (int8 weights, inputs quantized per call);
            ``"int8"`` (static: activation ranges calibrated on
            ``representative_data``, QOperator format).
        representative_data: for ``"int8"``: a folder of image files, or
            an array, an iterable or ``tf.data.Dataset`` of images,
            batches or ``(images, labels)`` pairs, or a callable returning
            one, as [0, 255] pixels or as the model's own inputs (see
            :func:`~keras_vit.export.samples.read_as_input`). The images
            beyond the first ``representative_samples`` verify the file.
            Default: crops of the sample photos.
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
            and for int8 the held-out images of ``representative_data``
            (photos without it).
        agreement_samples: images compared for the int8 variants.
        cast_to_float32: export bf16/fp16 models as a float32 copy.
        overwrite: replace existing files.
        isolate: convert in a child process (lower peak memory): True,
            False, or ``"auto"`` (when the weights exceed 64 MiB).

    Returns:
        The report, also written to ``path + ".report.json"``.

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
    common.check_arguments(model, agreement_samples,
                           uint8_input=uint8_input, verify=verify,
                           cast_to_float32=cast_to_float32,
                           overwrite=overwrite)
    representative_samples = common.check_quantization(
        quantization, representative_data, representative_samples)
    common.refuse_keras_quantized(model, "onnx")
    dest = common.check_path(path, "onnx")
    # Before any work: a child process's ImportError would be less clear.
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
    """Writes the float32 ONNX file (tf2onnx): ``staged`` itself, or the
    source of the quantized variant that :func:`finish` makes."""
    opset = _check_opset(params["opset"])
    converted = staged if params["quantization"] == "float32" else (
        os.path.join(workdir, "float32.onnx"))
    external_data = params["external_data"]
    if params["isolate"]:  # in a child process: see onnx_worker
        saved_model_dir = os.path.join(workdir, "saved_model")
        graph.save(saved_model_dir)
        job = {"saved_model": saved_model_dir, "output": converted,
               "opset": opset, "external_data": external_data}
        return pipeline.run_child(
            "keras_vit.export.onnx_worker", job, workdir, rss,
            what="the ONNX converter process (tf2onnx)",
            env={"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})
    tf2onnx = require("tf2onnx", purpose="ONNX export")
    proto, _ = tf2onnx.convert.from_function(
        graph.function(), input_signature=graph.input_specs(), opset=opset)
    worker.name_batch_dimension(proto)
    worker.guard_zero_pad_before_max_pool(proto)
    return worker.write_model(proto, None, converted, external_data)


def finish(staged, workdir, params, arrays, result):
    """The quantized variant of the float32 file :func:`convert` wrote."""
    quantization = params["quantization"]
    if quantization != "float32":
        work = os.path.join(workdir, "quantization")
        os.mkdir(work)
        proto = _quantize(os.path.join(workdir, "float32.onnx"),
                          quantization, arrays.get("calibration"), work,
                          result["external_data"])
        result = worker.write_model(proto, None, staged,
                                    params["external_data"])
        del proto
    result["options"] = {"external_data": result["external_data"]}
    return result
