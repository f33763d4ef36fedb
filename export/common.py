"""What every exporter checks and reports: formats and destinations,
quantizations, tolerances, the error type and the JSON report.

Nothing here imports TensorFlow at module level, so the command line can
validate its arguments before paying for that import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import time

from keras_vit.base import atomic
from keras_vit.base import checks
from keras_vit.base.checks import (
    PACKAGES, check_choice, check_int, check_model, check_number)
from keras_vit.base.options import flag
from keras_vit.base.errors import KerasVitError, MissingDependencyError

FORMATS = ("saved_model", "tflite", "onnx", "openvino")
#: What an artifact can return (keras_vit.export.graph.ServingGraph), plus
#: ``block_<i>`` (BLOCK_OUTPUT): encoder block i's patch map.
OUTPUTS = ("logits", "probabilities", "pre_logits", "attention_maps",
           "features")
BLOCK_OUTPUT = re.compile(r"block_(0|-?[1-9]\d*)")


def check_outputs(outputs, name="outputs"):
    """``outputs`` (a name or names) as a tuple of distinct output names,
    or a ValueError naming the argument ``name`` and the value.

    >>> check_outputs(("logits", "block_11"))
    ('logits', 'block_11')
    """
    if isinstance(outputs, str):
        outputs = (outputs,)
    outputs = tuple(outputs or ())
    bad = [o for o in outputs
           if o not in OUTPUTS and not BLOCK_OUTPUT.fullmatch(str(o))]
    if not outputs or bad or len(set(outputs)) != len(outputs):
        raise ValueError(
            f"{name} must be distinct names from {', '.join(OUTPUTS)} or "
            f"block_<i> (an encoder block's patch map); received {name}="
            f"{','.join(map(str, outputs)) or repr(outputs)}")
    return outputs
# What a path of each format must end with (a SavedModel is a directory;
# an OpenVINO IR is the .xml file, its weights the .bin beside it).
EXTENSIONS = {"tflite": ".tflite", "onnx": ".onnx", "openvino": ".xml"}
# OpenVINO's writer takes ".xml" in lower case only.
_CASE_SENSITIVE_EXTENSIONS = ("openvino",)
_FILE_EXTENSIONS = (".tflite", ".onnx", ".xml", ".bin", ".keras", ".h5",
                    ".pb", ".json", ".npz", ".zip")
REPORT_SUFFIX = ".report.json"
SAVED_MODEL_REPORT = "export_report.json"


class ExportError(KerasVitError, RuntimeError):
    """The export could not produce an artifact that runs and matches Keras.

    ``error.report`` holds the measurements when the outputs are outside the
    tolerance of its format. Nothing that looks finished is left behind.
    """

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def check_format(format):
    """Returns ``format`` normalised (``"SavedModel"`` -> ``"saved_model"``)
    or raises ValueError naming the argument.

    >>> check_format("TFLite")
    'tflite'
    """
    value = str(format).lower().replace("-", "_")
    value = {"savedmodel": "saved_model", "tf_saved_model": "saved_model",
             "litert": "tflite", "openvino_ir": "openvino"}.get(value, value)
    if value not in FORMATS:
        check_choice("format", format, FORMATS)  # raises, with a suggestion
    return value


def require_installed(module, purpose):
    """Raises MissingDependencyError unless ``module`` can be imported;
    does not import it (tf2onnx imports TensorFlow, which a JAX or PyTorch
    process leaves to its converter process).

    >>> require_installed("json", "this example")
    """
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise MissingDependencyError(PACKAGES.get(top, top), purpose)


def check_path(path, format):
    """The absolute destination for ``format``; raises ValueError for a
    wrong extension.

    >>> check_path("/tmp/vit.onnx", "onnx")
    '/tmp/vit.onnx'
    >>> check_path("/tmp/vit.onnx", "tflite")
    Traceback (most recent call last):
    ...
    ValueError: format 'tflite' needs a path ending with .tflite; ...
    >>> check_path("/tmp/vit.XML", "openvino")
    Traceback (most recent call last):
    ...
    ValueError: format 'openvino' needs a path ending with .xml (lower ...
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"path must be a file or directory name; received "
                         f"path={path!r}")
    text = os.fspath(path)
    full = os.path.abspath(text)
    if format in EXTENSIONS:
        exact = format in _CASE_SENSITIVE_EXTENSIONS
        if not (full if exact else full.lower()).endswith(EXTENSIONS[format]):
            raise ValueError(
                f"format {format!r} needs a path ending with "
                f"{EXTENSIONS[format]}{' (lower case)' if exact else ''}; "
                f"received path={text!r}")
    elif full.lower().endswith(_FILE_EXTENSIONS):
        raise ValueError(
            "a SavedModel is a directory; its path must not end with a file "
            f"extension; received path={text!r}")
    return full


def weights_file(path):
    """The ``.bin`` file OpenVINO reads beside the IR ``.xml`` file
    ``path``.

    >>> weights_file("/srv/vit.v2.xml")
    '/srv/vit.v2.bin'
    """
    return os.path.splitext(os.fspath(path))[0] + ".bin"


# Layers quantized by Keras that round their inputs (int8) or cast them
# (float8) cannot go to these formats; weight-only layers go to every one,
# within its float bounds (at most 4e-6). Measured with Keras 3.15, TF
# 2.21, tf2onnx 1.17 / onnxruntime 1.31 and OpenVINO 2026.4.
_KERAS_QUANTIZED_REFUSED = {
    "int8": {
        "tflite": "the TFLite converter fails on their int8 x int8 matmuls "
                  "('tfl.fully_connected' op operand #0 must be float)",
        "onnx": "tf2onnx converts their matmuls to MatMulInteger, whose "
                "onnxruntime results differ from Keras' (tiny ViT: by 0.6% "
                "of the logits' largest magnitude)",
        "openvino": "OpenVINO's TensorFlow frontend converts them to a "
                    "graph whose logits differ from Keras' by about their "
                    "own size",
    },
    "float8": {
        "tflite": "the TFLite converter has no float8 type ('invalid "
                  "TFLite type: f8E4M3FN')",
        "onnx": "tf2onnx has no float8 type (it fails on "
                "tf.float8_e4m3fn)",
        "openvino": "OpenVINO's CPU plugin cannot run their float8 casts "
                    "('cpu_convert can't convert')",
    },
}
_ROUNDING_WORDS = {"int8": "round their inputs to int8",
                   "float8": "cast their inputs to float8"}


def input_rounding(layer):
    """How a layer quantized by Keras treats its inputs: ``"float8"``
    (cast to float8_e4m3fn and back), ``"int8"`` (rounded to int8 for an
    int8 x int8 matmul) or None (weight-only, or not quantized).

    An int8/int4 layer without ``inputs_quantizer`` (older Keras) counts as
    rounding its inputs, so that it is refused.
    """
    mode = getattr(layer, "quantization_mode", None)
    if mode == "float8":
        return "float8"
    if mode in ("int8", "int4") and getattr(
            layer, "inputs_quantizer", "unknown") is not None:
        return "int8"
    return None


def _rounding_layers(model):
    """``{rounding: {mode, ...}}`` of ``model``'s layers that round their
    inputs (:func:`input_rounding`)."""
    found = {}
    for layer in model._flatten_layers():
        rounding = input_rounding(layer)
        if rounding is not None:
            found.setdefault(rounding, set()).add(layer.quantization_mode)
    return found


def refuse_keras_quantized(model, format):
    """Raises :class:`ExportError` when ``model`` has layers quantized by
    Keras that round or cast their inputs, which ``format`` cannot carry
    (a SavedModel takes every mode)."""
    found = _rounding_layers(model)
    for rounding in ("float8", "int8"):
        if rounding not in found or format not in _KERAS_QUANTIZED_REFUSED[
                rounding]:
            continue
        own = ("precision='int8'" if format == "openvino"
               else "quantization='dynamic_int8' or 'int8'")
        raise ExportError(
            f"{format}: model={getattr(model, 'name', model)!r} is quantized "
            f"by Keras (mode={'/'.join(sorted(found[rounding]))}), whose "
            f"layers {_ROUNDING_WORDS[rounding]}: "
            f"{_KERAS_QUANTIZED_REFUSED[rounding][format]}; export the float "
            f"model with {own} (the format's own int8), or quantize it "
            "weight-only (model.quantize('int4')), or export this one with "
            "to_saved_model")


QUANTIZATIONS = ("float32", "float16", "dynamic_int8", "int8")
OPENVINO_PRECISIONS = ("float32", "bfloat16", "int8")
DEFAULT_REPRESENTATIVE_SAMPLES = 100
# Images the int8 variants are compared on.
DEFAULT_AGREEMENT_SAMPLES = 32


def check_arguments(model, agreement_samples=DEFAULT_AGREEMENT_SAMPLES,
                    **flags):
    """Refuses, naming it, a ``model`` that is not a ``keras.Model``, an
    ``agreement_samples`` that is not a positive integer and boolean
    options (``flags``, by name) that are not True or False.

    >>> check_arguments(None)
    Traceback (most recent call last):
    ...
    keras_vit.base.errors.ArgumentTypeError: model must be a keras.Model; \
received model=None (NoneType)
    """
    check_model("model", model)
    check_int("agreement_samples", agreement_samples, low=1)
    for name, value in flags.items():
        flag(name, value)


def check_quantization(quantization, representative_data,
                       representative_samples):
    """Validates the quantization arguments every exporter takes; returns
    the number of calibration images (default 100).

    >>> check_quantization("int8", None, None)
    100
    >>> check_quantization("int4", None, None)
    Traceback (most recent call last):
    ...
    ValueError: quantization must be one of ('float32', 'float16', \
'dynamic_int8', 'int8'); received quantization='int4'. Did you mean 'int8'?
    """
    check_choice("quantization", quantization, QUANTIZATIONS)
    if representative_samples is None:
        representative_samples = DEFAULT_REPRESENTATIVE_SAMPLES
    representative_samples = check_int("representative_samples",
                                       representative_samples, low=1)
    if representative_data is not None and quantization != "int8":
        raise ValueError(
            "representative_data is only used with quantization='int8'; "
            f"received quantization={quantization!r}")
    return representative_samples


def _tolerance(max_abs_diff, top1_agreement=None, rel_rms_error=None):
    return {"max_abs_diff": max_abs_diff, "top1_agreement": top1_agreement,
            "rel_rms_error": rel_rms_error}


# Per format/variant: the largest max-abs difference allowed, as a fraction
# of max(1, max|Keras output|), the smallest top-1 agreement and the largest
# relative RMS error. None: not a criterion (for float formats the max-abs
# bound already implies that any top-1 flip is a near-tie).
TOLERANCES = {
    "saved_model": _tolerance(1e-4),
    "onnx": _tolerance(5e-4),
    "tflite/float32": _tolerance(5e-4),
    "tflite/float16": _tolerance(5e-2, rel_rms_error=0.05),
    "tflite/dynamic_int8": _tolerance(None, 0.9, 0.25),
    # Measured: trained ViTs agree 0.95-0.996 in full int8; tiny random
    # ones 0.78-1.0. A broken artifact agrees at chance.
    "tflite/int8": _tolerance(None, 0.8, 0.5),
}
# Keras-quantized layers that round their inputs: last-bit float
# differences flip some roundings (ViT-Ti/16 int8: 5.4e-4 max abs diff).
TOLERANCES["saved_model/keras_quantized"] = _tolerance(
    1e-2, rel_rms_error=0.02)
# The ONNX variants take the TFLite ones' bounds: the same precisions.
TOLERANCES.update({f"onnx/{variant}": dict(TOLERANCES[f"tflite/{variant}"])
                   for variant in ("float16", "dynamic_int8", "int8")})
# OpenVINO bf16 as float16 (ViT-B/16 measured 0.023 max abs diff, 0.010
# rel RMS), int8 weights as dynamic int8 (0.039 / 0.017).
TOLERANCES.update({
    "openvino": dict(TOLERANCES["onnx"]),
    "openvino/bfloat16": dict(TOLERANCES["tflite/float16"]),
    "openvino/int8": dict(TOLERANCES["tflite/dynamic_int8"]),
})


# What to try when a quantized artifact fails its verification.
REMEDIES = {
    "int8/calibrated": "It was calibrated and checked on your "
                       "representative_data, so full int8 costs this much "
                       "on this model: export quantization='dynamic_int8' "
                       "(int8 weights, float activations), or "
                       "quantization='float16', or loosen tolerance= if "
                       "the agreement is good enough for you",
    "int8/calibrated_elsewhere": "It was calibrated on your "
                                 "representative_data but checked on other "
                                 "images (verify_data=): leave verify_data "
                                 "out to check it on images like the "
                                 "calibration ones, or export "
                                 "quantization='dynamic_int8', or loosen "
                                 "tolerance= if the agreement is good "
                                 "enough for you",
    "int8": "Full int8 needs calibration images like the ones it will "
            "see: pass representative_data= (command line: "
            "--calibration-data SPEC, e.g. a folder of your images or "
            "digits:train), or export quantization='dynamic_int8' (int8 "
            "weights, float activations: no calibration), or loosen "
            "tolerance= if the agreement is good enough for you",
    "dynamic_int8": "Export quantization='float16' (half the size, float "
                    "activations), or loosen tolerance= if the agreement "
                    "is good enough for you",
    "openvino/bfloat16": "Export precision='float32' (computed in f32), or "
                         "loosen tolerance= if the agreement is good "
                         "enough for you",
    "openvino/int8": "Export precision='bfloat16' (float16 weights) or "
                     "'float32', or loosen tolerance= if the agreement is "
                     "good enough for you",
}


def variant(options):
    """The precision of an artifact from its report's ``options``: the
    quantization of TFLite and ONNX, the precision of OpenVINO.

    >>> variant({"precision": "bfloat16"}), variant({})
    ('bfloat16', 'float32')
    """
    return options.get("quantization") or options.get("precision",
                                                      "float32")


def remedy(fmt, options):
    """What :data:`REMEDIES` says to try when an export of format ``fmt``
    with the report's ``options`` fails its verification, or None.

    >>> remedy("openvino", {"precision": "int8"}).startswith("Export")
    True
    >>> remedy("onnx", {"quantization": "int8"}).startswith("Full int8")
    True
    >>> remedy("onnx", {"quantization": "float32"}) is None
    True
    >>> remedy("tflite", {"quantization": "int8", "calibration_input":
    ...                   "[0, 255] pixels", "verify_data": "held out"})[:29]
    'It was calibrated and checked'
    """
    name = variant(options)
    if name == "int8" and options.get("calibration_input"):
        return REMEDIES["int8/calibrated" if options.get("verify_data")
                        else "int8/calibrated_elsewhere"]
    return REMEDIES.get(f"{fmt}/{name}") or REMEDIES.get(name)


def saved_model_tolerance(model):
    """The TOLERANCES key of a SavedModel of ``model``."""
    return ("saved_model/keras_quantized" if _rounding_layers(model)
            else "saved_model")


def tolerance_for(kind, override=None):
    """The tolerance of ``kind`` (a key of TOLERANCES) with ``override``
    (a dict with some of the same keys) applied."""
    tol = dict(TOLERANCES[kind])
    if override is not None:
        if not isinstance(override, dict) or set(override) - set(tol):
            raise ValueError(
                f"tolerance must be a dict with keys from {sorted(tol)}; "
                f"received tolerance={override!r}")
        for key, value in override.items():  # None: not a criterion
            if value is not None:
                check_number(f"tolerance[{key!r}]", value, low=0,
                             high=1 if key == "top1_agreement" else None)
        tol.update(override)
    return tol


def versions():
    """Versions of the libraries an artifact depends on (None if absent)."""
    import importlib.metadata as md

    out = {}
    for dist in ("keras-vit", "tensorflow", "keras", "tf2onnx", "onnx",
                 "onnxruntime", "ai-edge-litert", "openvino", "nncf",
                 "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def write_json(path, data):
    """Writes ``data`` as JSON through a temporary file and a rename."""
    atomic.write_json(path, data, strict=True)


def read_report(path):
    """The report of an artifact: ``path`` may be the artifact itself (a
    ``.tflite``/``.onnx`` file or a SavedModel directory) or the report."""
    checks.check_path("path", path)
    path = os.path.realpath(path)
    if os.path.isdir(path):
        path = os.path.join(path, SAVED_MODEL_REPORT)
    elif not path.endswith(".json"):
        path = path + REPORT_SUFFIX
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def timer(store, key):
    start = time.perf_counter()
    try:
        yield
    finally:
        store[key] = round(time.perf_counter() - start, 3)
