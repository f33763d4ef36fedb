"""Export to TFLite (LiteRT): float32, float16, dynamic-range int8, int8.

The route is ``TFLiteConverter.from_saved_model`` on the serving SavedModel
(``from_concrete_functions`` produced NaN outputs on this stack).
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from keras_vit.runtime import compat, quiet
from keras_vit.base.checks import require
from keras_vit.base.suggestions import did_you_mean
from keras_vit.export import common, pipeline, samples
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph


# The ops of the int8 model that stay float by default (float_ops=
# "sensitive"): LayerNorm, the attention core (in int8 the probabilities of
# a 197-token row fall on a 1/256 grid) and the residual ADDs. Measured
# (XNNPACK, 2 cores), logits' relative RMS error vs Keras: a digits ViT
# all-int8 0.049, these float 0.043 and 1.9x faster; ViT-Ti/16 0.101 with
# the attention matmuls float, 2-3x faster. The file grows by about 5%.
LAYER_NORM_OPS = ("MEAN", "SQUARED_DIFFERENCE", "RSQRT")
SENSITIVE_OPS = {
    "layer_norm": LAYER_NORM_OPS,
    "attention": ("SOFTMAX", "BATCH_MATMUL"),
    "residual_add": ("ADD",),
}
DEFAULT_FLOAT_OPS = LAYER_NORM_OPS + ("SOFTMAX", "BATCH_MATMUL", "ADD")
RUNTIME_NEEDS_TENSORFLOW = False


def _interpreter(path, **kwargs):
    return require("ai_edge_litert.interpreter",
                   purpose="running TFLite files").Interpreter(
                       model_path=path, **kwargs)


def open_artifact(path, num_threads=None):
    """Loads a ``.tflite`` file with ai_edge_litert and returns ``images ->
    {name: array}`` (a shape the file does not declare is refused)."""
    interpreter = _interpreter(path,
                               num_threads=num_threads or os.cpu_count())
    runner = interpreter.get_signature_runner("serving_default")
    # Each input's declared shape after the batch (-1: free).
    declared = {name: tuple(int(s) for s in details["shape_signature"][1:])
                for name, details in runner.get_input_details().items()}

    def run(images, _keep=interpreter):
        # The runner resizes its input to whatever it is given: another
        # size gives wrong numbers or crashes the process (0 pixels).
        feeds = (images if isinstance(images, dict)
                 else {next(iter(declared)): images})
        for name, value in feeds.items():
            shape, want = np.shape(value), declared.get(name, ())
            if any(d >= 0 and d != s for d, s in zip(want, shape[1:])) or (
                    len(shape) != len(want) + 1):
                what = "images" if len(declared) == 1 else name
                raise ValueError(
                    f"{os.path.basename(path)} takes inputs of shape "
                    f"(batch,) + {want}; received {what} of shape "
                    f"{tuple(shape)}")
        out = runner(**{k: np.ascontiguousarray(v) for k, v in feeds.items()})
        return {k: np.array(v) for k, v in out.items()}

    return run


def builtin_ops():
    """The names of TFLite's builtin ops (LiteRT's schema)."""
    schema = require("ai_edge_litert.schema_py_generated",
                     package="ai-edge-litert", purpose="checking float_ops")
    return {name for name in vars(schema.BuiltinOperator) if name.isupper()}


def _check_float_ops(float_ops, quantization):
    """The TFLite ops ``float_ops`` keeps float; a ValueError naming it
    for a name that is neither a group nor a builtin op, or for float_ops
    given with a quantization without int8 ops."""
    if quantization != "int8":
        if float_ops != "sensitive":  # not the default
            raise ValueError(
                "float_ops is only used with quantization='int8'; received "
                f"quantization={quantization!r}, float_ops={float_ops!r}")
        return ()
    if float_ops == "sensitive":
        return DEFAULT_FLOAT_OPS
    if float_ops is None:
        return ()
    names = float_ops if isinstance(float_ops, (list, tuple)) else (
        float_ops,)
    known = builtin_ops()
    ops = []
    for op in names:
        if isinstance(op, str) and op in SENSITIVE_OPS:
            ops.extend(SENSITIVE_OPS[op])
        elif isinstance(op, str) and op.upper() in known:
            ops.append(op.upper())
        else:
            raise ValueError(
                "float_ops must be 'sensitive', None or a list of the groups "
                f"{sorted(SENSITIVE_OPS)} and TFLite builtin op names (such "
                f"as {', '.join(DEFAULT_FLOAT_OPS)}); received float_ops="
                f"{float_ops!r}." + (did_you_mean(op, ["sensitive",
                                                      *SENSITIVE_OPS,
                                                      *sorted(known)])
                                     if isinstance(op, str) else ""))
    return tuple(dict.fromkeys(ops))


def _converter(saved_model_dir, quantization, representative=None):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(
        saved_model_dir, signature_keys=["serving_default"])
    if quantization != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif quantization == "int8":
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
            tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


def _convert_int8(saved_model_dir, representative, float_ops):
    """Full-int8 conversion; ``float_ops`` stay float (selective
    quantization through the documented QuantizationDebugger route)."""
    import tensorflow as tf

    converter = _converter(saved_model_dir, "int8", representative)
    if not float_ops:
        return converter.convert()
    options = tf.lite.experimental.QuantizationDebugOptions(
        denylisted_ops=list(float_ops))
    with warnings.catch_warnings():
        # The debugger's own tf.lite.Interpreter warns it is deprecated.
        warnings.filterwarnings(
            "ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=representative,
            debug_options=options)
        return debugger.get_nondebug_quantized_model()


def op_dtypes(path):
    """``{op name: sorted output dtypes}`` of a ``.tflite`` file: which ops
    run in int8 and which in float."""
    interpreter = _interpreter(path)
    tensors = {t["index"]: t["dtype"].__name__
               for t in interpreter.get_tensor_details()}
    ops = {}
    for op in compat.tflite_ops_details(interpreter):
        if op["op_name"] == "DELEGATE":
            continue
        for index in op["outputs"]:
            ops.setdefault(op["op_name"], set()).add(tensors.get(index))
    return {k: sorted(v - {None}) for k, v in sorted(ops.items())}


def to_tflite(model, path, *, quantization="float32",
              representative_data=None, representative_samples=None,
              float_ops="sensitive", uint8_input=False,
              outputs=None, verify=True, batch_sizes=(4, 1), tolerance=None,
              verify_data=None,
              agreement_samples=common.DEFAULT_AGREEMENT_SAMPLES,
              cast_to_float32=True, overwrite=True):
    """Exports ``model`` to a ``.tflite`` file and verifies it with LiteRT.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy).
        path: the file to write; must end with ``.tflite``.
        quantization: ``"float32"``; ``"float16"`` (weights in fp16, half
            the size); ``"dynamic_int8"`` (int8 weights, activations
            quantized on the fly, a quarter of the size); ``"int8"`` (weights
            and activations in int8, calibrated on ``representative_data``).
        representative_data: for ``"int8"``: as for
            :func:`~keras_vit.export.to_onnx`.
        representative_samples: images drawn for calibration (default 100).
        float_ops: for ``"int8"`` only: TFLite ops kept in float.
            ``"sensitive"`` (default): LayerNorm, the attention softmax and
            matmuls, and the residual adds (see DEFAULT_FLOAT_OPS); None:
            every op with an int8 kernel in int8; or a list of op names
            (``"SOFTMAX"``, TFLite's builtin ops) and groups
            (``"layer_norm"``, ``"attention"``, ``"residual_add"``); an
            unknown name is refused.
        uint8_input: take uint8 pixels and scale them inside.
        outputs: output names (see :class:`~keras_vit.export.graph.
            ServingGraph`).
        verify: run and compare the artifact.
        batch_sizes: batch sizes to run it at (the batch is dynamic).
        tolerance: overrides of the tolerance of the quantization.
        verify_data: ``"noise"``, ``"photos"`` or an array; as for
            :func:`~keras_vit.export.to_onnx`.
        agreement_samples: images compared for the int8 variants.
        cast_to_float32: export bf16/fp16 models as a float32 copy.
        overwrite: replace an existing file.

    Returns:
        The report (also written to ``path + ".report.json"``).

    Example:

    >>> import tempfile, os, keras_vit
    >>> from keras_vit.export import to_tflite
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> out = os.path.join(tempfile.mkdtemp(), "vit.tflite")
    >>> report = to_tflite(model, out, quantization="float16")
    >>> report["options"]["quantization"], report["top1_agreement"]
    ('float16', 1.0)
    """
    common.check_arguments(model, agreement_samples,
                           uint8_input=uint8_input, verify=verify,
                           cast_to_float32=cast_to_float32,
                           overwrite=overwrite)
    representative_samples = common.check_quantization(
        quantization, representative_data, representative_samples)
    common.refuse_keras_quantized(model, "tflite")
    dest = common.check_path(path, "tflite")
    if verify:  # before converting: the check runs the file with LiteRT
        require("ai_edge_litert.interpreter", package="ai-edge-litert",
                purpose="verifying TFLite files")
    float_ops = _check_float_ops(float_ops, quantization)
    tol = common.tolerance_for(f"tflite/{quantization}", tolerance)
    quantized = quantization in ("dynamic_int8", "int8")
    if verify_data is None and quantization == "dynamic_int8":
        verify_data = "photos"  # int8 weights: judged on images, not noise
    checks.check_options(batch_sizes, verify_data)
    dynamic = getattr(model, "dynamic_image_size", False)
    if dynamic:
        from keras_vit.zoo import rebuild

        model = rebuild(model, dynamic_image_size=False)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32)
    if dynamic:
        size = "x".join(str(s) for s in model.inputs[0].shape[1:3])
        graph.notes.append(f"TFLite takes fixed-size images: the dynamic-size"
                           f" model was exported at its built size, {size}")
    options = {"quantization": quantization,
               "uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs),
               "signature": "serving_default",
               "cast_to_float32": bool(cast_to_float32)}
    notes = []
    arrays = {}
    if quantization == "int8":
        images, verify_data = samples.int8_calibration(
            graph, representative_data, representative_samples, verify_data,
            agreement_samples, options, notes)
        arrays["calibration"] = images
        options["float_ops"] = list(float_ops)
    return pipeline.run(pipeline.ExportJob(
        "tflite", "the TFLite file", dest, graph, tol, options,
        params={"quantization": quantization, "float_ops": list(float_ops)},
        arrays=arrays, notes=notes, verify=verify, batch_sizes=batch_sizes,
        verify_data="noise" if verify_data is None else verify_data,
        samples=agreement_samples if quantized else None, seed=1,
        overwrite=overwrite), sys.modules[__name__])


def convert(graph, staged, workdir, params, arrays, rss):
    """Writes the ``.tflite`` file ``staged`` from the serving SavedModel
    (TensorFlow's converter)."""
    saved_model_dir = os.path.join(workdir, "saved_model")
    graph.save(saved_model_dir)
    quantization = params["quantization"]
    # The converter prints from C++ on success: shown only if it fails.
    with quiet.captured_output():
        if quantization == "int8":
            images = arrays["calibration"]

            def representative():
                for i in range(len(images)):
                    yield [images[i:i + 1]]

            content = _convert_int8(saved_model_dir, representative,
                                    tuple(params["float_ops"]))
        else:
            content = _converter(saved_model_dir, quantization).convert()
    with open(staged, "wb") as f:
        f.write(content)
    return {"files": [os.path.basename(staged)]}


def finish(staged, workdir, params, arrays, result):
    """Adds which ops run in int8 and which in float (LiteRT, no
    TensorFlow) to the report's options."""
    if params["quantization"] == "int8":
        result["options"] = {"op_dtypes": op_dtypes(staged)}
    return result
