"""Export to OpenVINO IR (an ``.xml`` file and its ``.bin`` weights beside
it), verified with the OpenVINO runtime on the CPU: float32, bfloat16 and
int8 weights.

The route is OpenVINO's TensorFlow frontend (``openvino.convert_model``) on
the serving graph's ``tf.function``. Keras' own ``model.export(format=
"openvino")`` wrote an IR with unnamed extra outputs; going through the
ONNX file costs tf2onnx's time and memory (46 s against 3 s for ViT-B/16)
for the same logits at the same speed (OpenVINO 2026.4.1, TF 2.21).

Without a hint OpenVINO's CPU plugin computes in bf16 wherever it can
(ViT-B/16's logits then move by about 0.02), and OpenVINO 2026.4 ignores a
hint stored in ``runtime_options``: the file records the hint it was
verified with in its ``rt_info`` (:data:`RT_HINT`), :func:`open_artifact`
compiles with it, and a deployer passes it the same way::

    core.compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

``bfloat16`` stores the weights in float16 (bf16 arithmetic keeps 8 bits
of each weight's mantissa, float16 storage 11); ``int8`` compresses them
with NNCF in a child process (``keras_vit.export.openvino_worker``).
"""

from __future__ import annotations

import os
import sys

from keras_vit.base.checks import check_choice, require
from keras_vit.export import common, memory, pipeline
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph
from keras_vit.export.openvino_core import core

PRECISIONS = common.OPENVINO_PRECISIONS
#: The ``INFERENCE_PRECISION_HINT`` each precision is verified with.
HINTS = {"float32": "f32", "bfloat16": "bf16", "int8": "f32"}
#: Where the file's ``rt_info`` records that hint.
RT_HINT = ["keras_vit", "INFERENCE_PRECISION_HINT"]
RUNTIME_NEEDS_TENSORFLOW = False
DEVICE = "CPU"
WORKER = "keras_vit.export.openvino_worker"


def cpu_has_bf16(core):
    """Whether OpenVINO's CPU plugin computes in bf16 on this machine."""
    return "BF16" in core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")


def compile_config(model, core):
    """The properties an artifact is compiled with: the precision hint its
    ``rt_info`` records, left out where the CPU cannot compute in it."""
    if not model.has_rt_info(RT_HINT):
        return {}
    hint = model.get_rt_info(RT_HINT).astype(str)
    if hint == "bf16" and not cpu_has_bf16(core):
        return {}
    return {"INFERENCE_PRECISION_HINT": hint}


def open_artifact(path, num_threads=None):
    """Loads an OpenVINO ``.xml`` file, compiles it for the CPU with the
    precision hint it records and returns ``images -> {name: array}``."""
    runtime = core()
    model = runtime.read_model(path)
    config = compile_config(model, runtime)
    if num_threads:
        config["INFERENCE_NUM_THREADS"] = int(num_threads)
    compiled = runtime.compile_model(model, DEVICE, config)
    names = [output.get_any_name() for output in compiled.outputs]

    def run(images):
        out = compiled(images)
        return {name: out[output]
                for name, output in zip(names, compiled.outputs)}

    return run


def to_openvino(model, path, *, precision="float32", uint8_input=False,
                outputs=None, verify=True,
                batch_sizes=(4, 1), tolerance=None, verify_data=None,
                agreement_samples=common.DEFAULT_AGREEMENT_SAMPLES,
                cast_to_float32=True, overwrite=True):
    """Exports ``model`` to OpenVINO IR and verifies it with the OpenVINO
    runtime on the CPU.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy).
        path: the file to write; must end with ``.xml`` (the weights go to
            the ``.bin`` file beside it).
        precision: ``"float32"``; ``"bfloat16"`` (float16 weights, half the
            file, computed in bf16); ``"int8"`` (int8 weights from NNCF's
            weight compression, a quarter of the size, activations in f32;
            needs the ``nncf`` package). The hint each is computed with is
            recorded in the file (see the module docstring).
        tolerance: overrides of the tolerance of the precision.
        verify_data: ``"noise"``, ``"photos"`` or an array of images;
            default noise for float32/bfloat16, photos for int8.
        uint8_input: as for :func:`~keras_vit.export.to_onnx`.
        outputs: as for ``to_onnx``.
        verify: as for ``to_onnx``.
        batch_sizes: as for ``to_onnx``.
        agreement_samples: as for ``to_onnx`` (int8 only here).
        cast_to_float32: as for ``to_onnx``.
        overwrite: replace existing files.

    Returns:
        The report, also written beside the model as
        ``path + ".report.json"``.

    Example:

    >>> import tempfile, os, keras_vit
    >>> from keras_vit.export import to_openvino
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> folder = tempfile.mkdtemp()
    >>> report = to_openvino(model, os.path.join(folder, "vit.xml"))
    >>> sorted(os.listdir(folder))
    ['vit.bin', 'vit.xml', 'vit.xml.report.json']
    >>> report["options"]["compile_config"]
    {'INFERENCE_PRECISION_HINT': 'f32'}
    """
    common.check_arguments(model, agreement_samples,
                           uint8_input=uint8_input, verify=verify,
                           cast_to_float32=cast_to_float32,
                           overwrite=overwrite)
    check_choice("precision", precision, PRECISIONS)
    common.refuse_keras_quantized(model, "openvino")
    dest = common.check_path(path, "openvino")
    common.require_installed("openvino", purpose="OpenVINO export")
    if precision == "int8":
        common.require_installed(
            "nncf", purpose="precision='int8' (OpenVINO's weight "
                            "compression)")
    weights = common.weights_file(dest)
    if not overwrite and os.path.lexists(weights):
        raise common.ExportError(
            f"{weights!r} exists (the weights file of path="
            f"{os.fspath(path)!r}); pass overwrite=True to replace it")
    tol = common.tolerance_for(
        "openvino" if precision == "float32" else f"openvino/{precision}",
        tolerance)
    quantized = precision == "int8"
    if verify_data is None:
        verify_data = "photos" if quantized else "noise"
    checks.check_options(batch_sizes, verify_data)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32)
    hint = HINTS[precision]
    options = {"precision": precision,
               "weights": "float16" if precision == "bfloat16" else precision,
               "compile_config": {"INFERENCE_PRECISION_HINT": hint},
               "uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs),
               "cast_to_float32": bool(cast_to_float32),
               "converter": "openvino.convert_model (TensorFlow frontend)"}
    notes = []
    if hint == "bf16" and not cpu_has_bf16(core()):
        notes.append(
            "OpenVINO computes in f32 on this CPU (no bf16): the artifact "
            "was verified in f32 here, its bf16 numbers were not checked")
    if quantized:
        options["int8"] = {"method": "nncf.compress_weights (data-free)",
                           "weights": "int8 asymmetric, per output channel",
                           "activations": "float32"}
    return pipeline.run(pipeline.ExportJob(
        "openvino", "the OpenVINO file", dest, graph, tol, options,
        params={"precision": precision}, notes=notes, verify=verify,
        batch_sizes=batch_sizes, verify_data=verify_data,
        samples=agreement_samples if quantized else None,
        seed=1 if quantized else 0, overwrite=overwrite),
        sys.modules[__name__])


def _name_outputs(ov_model, names, inputs=1):
    """Gives each output of the converted model exactly its serving name,
    or raises ExportError when the converter's outputs are not the serving
    graph's.

    Serving outputs that are one tensor come out as results of one tensor
    carrying all their names; each but the first then reads it through a
    Convert, so that each result holds one name."""
    import openvino.opset13 as ops

    groups = {}
    for result in ov_model.get_results():
        source = result.input_value(0)
        mine = tuple(sorted(source.get_names() & set(names)))
        groups.setdefault(mine, []).append(result)
    found = []
    for mine, results in groups.items():
        if len(mine) != len(results):
            raise common.ExportError(
                f"OpenVINO's converter returned {len(results)} outputs named "
                f"{list(mine) or 'none of'} {list(names)}")
        for i, (name, result) in enumerate(zip(mine, results)):
            source = result.input_value(0)
            if i:
                source = ops.convert(source, source.get_element_type()
                                     ).output(0)
                result.input(0).replace_source_output(source)
            result.output(0).get_tensor().set_names({name})
            found.append(name)
    if sorted(found) != sorted(names) or len(ov_model.inputs) != inputs:
        raise common.ExportError(
            f"OpenVINO's converter returned outputs {found} and "
            f"{len(ov_model.inputs)} inputs; expected {list(names)} and "
            f"{inputs}")


def save(ov_model, path, precision):
    """Writes ``ov_model`` to ``path`` (and its ``.bin``) with the
    precision hint recorded; float16 weights for bfloat16 only
    (``save_model`` would halve them by default)."""
    ov = require("openvino", purpose="OpenVINO export")

    ov_model.set_rt_info(HINTS[precision], RT_HINT)
    ov.save_model(ov_model, path, compress_to_fp16=precision == "bfloat16")
    return _files(path)


def _files(path):
    """The names of the files an IR at ``path`` is."""
    return [os.path.basename(path),
            os.path.basename(common.weights_file(path))]


def convert(graph, staged, workdir, params, arrays, rss):
    """Converts the serving graph and writes ``staged`` (int8: the float32
    IR that :func:`finish` compresses)."""
    ov = require("openvino", purpose="OpenVINO export")

    ov_model = ov.convert_model(graph.function().get_concrete_function())
    _name_outputs(ov_model, graph.outputs, len(graph.input_specs()))
    precision = params["precision"]
    if precision == "int8":
        save(ov_model, _float32_source(workdir), "float32")
        return {"files": []}
    return {"files": save(ov_model, staged, precision)}


def _float32_source(workdir):
    """Where the float32 IR that int8 is made from is written (a folder of
    its own: no name of the user's can be the same file)."""
    folder = os.path.join(workdir, "float32")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, "model.xml")


def finish(staged, workdir, params, arrays, result):
    """int8: NNCF's weight compression of the float32 IR, in a child
    process."""
    if params["precision"] != "int8":
        return result
    child = memory.PeakRSS()
    done = pipeline.run_child(
        WORKER, {"source": _float32_source(workdir), "output": staged},
        workdir, child, what="the OpenVINO weight compression process "
                             "(nncf)")
    return {"files": _files(staged),
            "options": {"int8_layers": done["layers"]},
            "child_peak_rss": child.child_peak}
