"""keras_vit.export: every format and TFLite variant, run in its runtime.

Tiny models (ViT token and gap, a hybrid, BiT) with random non-trivial
weights are exported; each test then runs the artifact itself, at a batch
size the exporter did not use, and compares it with Keras. Bad inputs and
failed verifications must leave nothing that looks finished.

Each model's default export to each format is made once for the module
(``exported``): the tests of that export read it, and a test that needs an
earlier export at its own path (to overwrite, fail over, link to) copies it
there (``_place``).
"""

import argparse
import inspect
import json
import shutil
import typing
import os

import numpy as np
import pytest

import tensorflow as tf
import onnxruntime as ort
import ai_edge_litert.interpreter as litert

import keras  # noqa: E402

from testkit import cached_tiny_vit as _tiny_model  # noqa: E402
from testkit import bad_calls_test  # noqa: E402
from testkit import killed_when_ready, wait_until  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.cli import export as export_cli  # noqa: E402
from keras_vit.export import common, formats  # noqa: E402
from keras_vit.export import memory as export_memory  # noqa: E402

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=5)
SECOND_BATCH = 3  # not one of the exporter's (4, 1)


@pytest.mark.parametrize("fmt", common.FORMATS)
def test_each_format_module_provides_the_format_interface(fmt):
    """What pipeline.run reads on a format module (formats.FormatModule):
    every attribute there, the functions callable with the Protocol's
    arguments, the constants of their type."""
    module = formats.format_module(fmt)
    assert module.__name__ == f"keras_vit.export.{fmt}"
    hints = typing.get_type_hints(formats.FormatModule)
    members = set(hints) | {
        name for name, value in vars(formats.FormatModule).items()
        if callable(value) and not name.startswith("_")}
    assert {"RUNTIME_NEEDS_TENSORFLOW", "convert", "finish",
            "open_artifact"} <= members
    for name in sorted(members):
        assert hasattr(module, name), f"keras_vit.export.{fmt} lacks {name}"
        expected = getattr(formats.FormatModule, name, None)
        if callable(expected):
            got = getattr(module, name)
            assert callable(got), f"keras_vit.export.{fmt}.{name}"
            wanted = list(inspect.signature(expected).parameters)[1:]
            params = inspect.signature(got).parameters
            assert list(params)[:len(wanted)] == wanted, (fmt, name)
            assert all(p.default is not inspect.Parameter.empty
                       for p in list(params.values())[len(wanted):])
        else:
            assert isinstance(getattr(module, name), hints[name]), (fmt, name)
    with pytest.raises(ValueError, match="format"):
        formats.format_module("h5")


def _perturbed(model, seed=0, scale=0.1):
    """Random non-trivial weights: every weight (zero head included) plus
    noise, so outputs differ per class and per image."""
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, scale, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _build(kind):
    # Seeded: quantized variants of random models vary with the weights.
    # The gap ViT and the hybrid have one block: what they add to the token
    # ViT (two blocks) is the classifier and the stem, and one block
    # converts in about 70% of the time of two.
    keras.utils.set_random_seed(1234)
    if kind == "vit_token":
        return keras_vit.models.vit(**TINY)
    if kind == "vit_gap":
        return keras_vit.models.vit(**dict(TINY, num_layers=1),
                                    classifier="gap")
    if kind == "hybrid":
        return keras_vit.models.vit(
            32, 1, 32, 1, 4, 64, 5,
            resnet=dict(num_layers=(1,), width_factor=0.5))
    if kind == "bit":
        return keras_vit.models.resnet_v2(64, (1, 1, 1, 1), 0.5, 5)
    raise AssertionError(kind)


KINDS = ("vit_token", "vit_gap", "hybrid", "bit")
_MODELS = {}


@pytest.fixture(params=KINDS)
def model(request):
    if request.param not in _MODELS:
        _MODELS[request.param] = _perturbed(_build(request.param))
    return _MODELS[request.param]


@pytest.fixture
def vit():
    if "vit_token" not in _MODELS:
        _MODELS["vit_token"] = _perturbed(_build("vit_token"))
    return _MODELS["vit_token"]


# A smaller ViT (16 pixels, one block, five classes like the others): it
# converts in about 65% of the tiny ViT's time.
SMALL = dict(TINY, image_size=16, hidden_size=16, num_layers=1, num_heads=2,
             mlp_dim=32)


@pytest.fixture
def small():
    """The :data:`SMALL` ViT, for the tests whose subject is not the
    model's numbers (what an export leaves on disk after a failure, through
    a link, in new folders; the command line's options; the benchmark's
    rows; the int8 weight range; what an int8 export calibrates on)."""
    if "small" not in _MODELS:
        keras.utils.set_random_seed(1234)
        _MODELS["small"] = _perturbed(keras_vit.models.vit(**SMALL))
    return _MODELS["small"]


_NAMES = {"saved_model": "m", "onnx": "m.onnx", "tflite": "m.tflite"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(model, fmt)``: ``(path, report)`` of ``model`` exported to
    ``fmt`` with every option its default, once for the module (on first
    use), alone in a folder of its own as :data:`_NAMES` names it. Tests
    only read it; :func:`_place` copies it where one will change it."""
    root = tmp_path_factory.mktemp("exported")
    done = {}

    def get(model, fmt):
        key = (id(model), fmt)
        if key not in done:
            folder = root / f"{len(done)}"
            folder.mkdir()
            path = str(folder / _NAMES[fmt])
            done[key] = (model, path, export.export(model, path, format=fmt))
        return done[key][1:]

    return get


def _place(source, path):
    """A copy of the export at ``source`` (artifact and report) at
    ``path``: an earlier export there, as a user would have left it."""
    path = str(path)
    if os.path.isdir(source):  # a SavedModel holds its report
        shutil.copytree(source, path)
        return
    for suffix in ("", common.REPORT_SUFFIX):
        shutil.copyfile(source + suffix, path + suffix)


def _images(model, n, seed=7, uint8=False):
    shape = (n,) + tuple(model.inputs[0].shape[1:])
    rng = np.random.default_rng(seed)
    if uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.uniform(-1, 1, shape).astype("float32")


def _keras(model, x):
    logits = np.asarray(model(x, training=False), dtype=np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return {"logits": logits, "probabilities": e / e.sum(-1, keepdims=True)}


def _check_report(report, fmt, path):
    assert report["format"] == fmt
    assert report["verified"] is True
    assert report["batch_sizes"] == [4, 1]
    assert report["top1_agreement"] is not None
    assert set(report["max_abs_diff"]) == {"logits", "probabilities"}
    for key in ("options", "file_size", "tolerance", "conversion_seconds",
                "verification_seconds", "peak_rss_mb", "versions"):
        assert key in report, key
    assert report["file_size"] > 0 and report["peak_rss_mb"] > 0
    # The same report is on disk beside (or inside) the artifact.
    assert common.read_report(path)["max_abs_diff"] == report["max_abs_diff"]


def _leftovers(directory):
    return sorted(os.listdir(directory))


# --------------------------------------------------------------------------
# SavedModel


def test_saved_model_every_model(model, exported):
    path, report = exported(model, "saved_model")
    _check_report(report, "saved_model", path)
    assert report["verification"]["passed"]
    # Variables stored once: the checkpoint is about the weights' size
    # (Keras' model.export writes them twice).
    var_bytes = export_memory.path_size(os.path.join(path, "variables"))
    weight_bytes = sum(w.numpy().nbytes for w in model.weights)
    assert var_bytes < 1.3 * weight_bytes + 32_000

    x = _images(model, SECOND_BATCH)
    loaded = tf.saved_model.load(path)
    fn = loaded.signatures["serving_default"]
    out = fn(images=tf.constant(x))
    want = _keras(model, x)
    for name in ("logits", "probabilities"):
        np.testing.assert_allclose(out[name].numpy(), want[name], atol=1e-4)
    assert fn.structured_input_signature[1]["images"].shape.as_list() == [
        None] + list(x.shape[1:])


def test_saved_model_uint8_input_and_named_outputs(vit, tmp_path):
    path = str(tmp_path / "served")
    outputs = ("logits", "probabilities", "pre_logits", "attention_maps")
    report = export.to_saved_model(vit, path, uint8_input=True,
                                   outputs=outputs)
    assert report["input"]["dtype"] == "uint8"
    assert report["outputs"]["attention_maps"] == [None, 2, 4, 17, 17]
    assert report["outputs"]["pre_logits"] == [None, 32]

    pixels = _images(vit, SECOND_BATCH, uint8=True)
    loaded = tf.saved_model.load(path)
    fn = loaded.signatures["serving_default"]
    assert fn.structured_input_signature[1]["images"].dtype == tf.uint8
    out = fn(images=tf.constant(pixels))
    assert set(out) == set(outputs)
    x = pixels.astype("float32") / 127.5 - 1.0
    np.testing.assert_allclose(out["logits"].numpy(),
                               _keras(vit, x)["logits"], atol=1e-4)
    # Attention maps are softmax rows: they sum to one over the keys.
    maps = out["attention_maps"].numpy()
    assert maps.shape == (SECOND_BATCH, 2, 4, 17, 17)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    pre = keras_vit.models.feature_model(vit, "pre_logits")(x)
    np.testing.assert_allclose(out["pre_logits"].numpy(), pre, atol=1e-4)


# --------------------------------------------------------------------------
# TFLite


def _run_tflite(path, x):
    interpreter = litert.Interpreter(model_path=path)
    runner = interpreter.get_signature_runner("serving_default")
    return runner(images=x)


# float32 (the module's shared export) on every model; the variants that
# quantize only the weights (float16, dynamic int8) on the token ViT and
# BiT, whose weights are of every kind the other two have (dense and
# attention; convolutions and GroupNorm): the gap ViT adds a pooling and
# the hybrid joins the two, neither a weight of its own to quantize.
TFLITE_VARIANTS = [(kind, "float32") for kind in KINDS] + [
    (kind, quantization) for kind in ("vit_token", "bit")
    for quantization in ("float16", "dynamic_int8")]


@pytest.mark.parametrize("model, quantization", TFLITE_VARIANTS,
                         indirect=["model"])
def test_tflite_float_and_dynamic(model, quantization, tmp_path, exported):
    if quantization == "float32":  # the default
        path, report = exported(model, "tflite")
    else:
        path = str(tmp_path / "m.tflite")
        report = export.to_tflite(model, path, quantization=quantization)
    _check_report(report, "tflite", path)
    assert report["options"]["quantization"] == quantization

    x = _images(model, SECOND_BATCH)
    out = _run_tflite(path, x)
    want = _keras(model, x)
    atol = {"float32": 1e-4, "float16": 5e-2, "dynamic_int8": None}[
        quantization]
    if atol is not None:
        np.testing.assert_allclose(out["logits"], want["logits"], atol=atol)
    else:
        rel = np.sqrt(np.mean((out["logits"] - want["logits"]) ** 2)
                      / np.mean(want["logits"] ** 2))
        assert rel < 0.2
    # Smaller files for the quantized variants (weights in fp16 / int8);
    # tiny models are mostly graph, so only the trend is checked.
    if quantization != "float32" and model.count_params() > 50_000:
        assert report["file_size"] < report["weights_mb"] * 2**20


# Not the gap ViT: full int8 of it is the token ViT's with one block and
# a mean over the tokens (MEAN, in the float ops below) for the class
# token; the hybrid's stem is BiT's convolutions feeding the tokens.
@pytest.mark.slow
@pytest.mark.parametrize("model", ["vit_token", "hybrid", "bit"],
                         indirect=True)
def test_tflite_full_int8(model, tmp_path):
    path = str(tmp_path / "m.tflite")
    # Random weights and five classes: agreement is lower than for trained
    # models (the default bar is 0.8); a broken artifact agrees at ~0.2.
    report = export.to_tflite(model, path, quantization="int8",
                              representative_samples=24,
                              tolerance={"top1_agreement": 0.6})
    _check_report(report, "tflite", path)
    assert report["top1_agreement"] >= 0.6
    assert report["tolerance"]["top1_agreement"] == 0.6
    options = report["options"]
    assert "sample photos" in options["representative_data"]
    assert any("representative_data" in n for n in report["notes"])
    # The default keeps LayerNorm, the attention core and the residual adds
    # in float; the projections, MLP and convolutions are int8.
    assert options["float_ops"] == ["MEAN", "SQUARED_DIFFERENCE", "RSQRT",
                                    "SOFTMAX", "BATCH_MATMUL", "ADD"]
    dtypes = options["op_dtypes"]
    assert "int8" in dtypes.get("FULLY_CONNECTED", []) + dtypes.get(
        "CONV_2D", [])
    assert dtypes.get("ADD") == ["float32"]
    if "BATCH_MATMUL" in dtypes:  # the ViTs' attention, not in BiT
        assert dtypes["BATCH_MATMUL"] == ["float32"]
    # The artifact runs at another batch size with float input and output.
    out = _run_tflite(path, _images(model, SECOND_BATCH))
    assert out["logits"].shape == (SECOND_BATCH, 5)
    assert np.all(np.isfinite(out["logits"]))


@pytest.mark.slow
def test_tflite_int8_from_a_training_pipeline(small, tmp_path):
    """A tf.data pipeline of (images, labels) batches calibrates directly;
    float_ops=None quantizes every op that has an int8 kernel."""
    rng = np.random.default_rng(3)
    images = rng.uniform(-1, 1, (20, 16, 16, 3)).astype("float32")
    labels = rng.integers(0, 5, 20)
    pipeline = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    path = str(tmp_path / "full.tflite")
    report = export.to_tflite(small, path, quantization="int8",
                              representative_data=pipeline, float_ops=None,
                              verify_data="noise", agreement_samples=16)
    assert report["options"]["representative_data"] == (
        "20 images from representative_data")
    assert report["options"]["float_ops"] == []
    assert report["options"]["op_dtypes"]["SOFTMAX"] == ["int8"]
    assert not any("representative_data" in n for n in report["notes"])


def test_representative_data_must_match_the_input_range(vit, tmp_path):
    pixels = np.full((4, 32, 32, 3), 300.0, "float32")
    with pytest.raises(ValueError, match=r"spans \[300, 300\]: neither "
                                         r"\[0, 255\] pixels.*\[-1, 1\]"):
        export.to_tflite(vit, str(tmp_path / "m.tflite"),
                         quantization="int8", representative_data=pixels)
    with pytest.raises(ValueError, match="representative_data"):
        export.to_tflite(vit, str(tmp_path / "m.tflite"),
                         quantization="float16", representative_data=pixels)
    assert _leftovers(tmp_path) == []


# --------------------------------------------------------------------------
# ONNX


def test_onnx_every_model(model, exported):
    import onnx

    path, report = exported(model, "onnx")
    _check_report(report, "onnx", path)
    assert report["options"]["opset"] == 17
    assert report["options"]["external_data"] is False
    assert report["files"] == ["m.onnx"]

    proto = onnx.load(path)
    assert proto.opset_import[0].version == 17
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == (
        "batch")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = _images(model, SECOND_BATCH)
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, {"images": x})))
    want = _keras(model, x)
    for name in ("logits", "probabilities"):
        np.testing.assert_allclose(out[name], want[name], atol=1e-4)


@pytest.mark.slow
def test_onnx_in_a_child_process_with_external_data(vit, small, tmp_path):
    """The low-memory route (a child process, the route of models over
    64 MiB) on a tiny model, with the weights in an external data file."""
    path = str(tmp_path / "big.onnx")
    report = export.to_onnx(vit, path, isolate=True, external_data=True,
                            uint8_input=True,
                            outputs=("logits", "attention_maps"))
    assert report["files"] == ["big.onnx", "big.onnx.data"]
    assert report["options"]["converter_process"] == "child"
    assert report["peak_rss_mb_converter_process"] > 0
    assert _leftovers(tmp_path) == ["big.onnx", "big.onnx.data",
                                    "big.onnx.report.json"]
    assert os.path.getsize(path + ".data") > 20_000  # the weights are there
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    pixels = _images(vit, SECOND_BATCH, uint8=True)
    logits, maps = session.run(["logits", "attention_maps"],
                               {"images": pixels})
    want = _keras(vit, pixels.astype("float32") / 127.5 - 1.0)["logits"]
    np.testing.assert_allclose(logits, want, atol=1e-4)
    assert maps.shape == (SECOND_BATCH, 2, 4, 17, 17)

    # Re-exported without external data (another model: the files are the
    # subject), the stale data file goes away.
    export.to_onnx(small, path)
    assert _leftovers(tmp_path) == ["big.onnx", "big.onnx.report.json"]


def test_onnx_bad_options(vit, tmp_path):
    for kwargs, match in ((dict(opset=30), "opset"),
                          (dict(external_data="yes"), "external_data"),
                          (dict(isolate="maybe"), "isolate"),
                          (dict(outputs=("logits", "scores")), "outputs"),
                          (dict(batch_sizes=(0,)), "batch_sizes")):
        with pytest.raises(ValueError, match=match):
            export.to_onnx(vit, str(tmp_path / "m.onnx"), **kwargs)
    assert _leftovers(tmp_path) == []


# What each ONNX precision must contain: float16 weights read through
# casts; int8 weights with integer kernels (dynamic: activations quantized
# per call; static: calibrated QLinear ops).
ONNX_PRECISION_OPS = {"float16": "Cast",
                      "dynamic_int8": "DynamicQuantizeLinear",
                      "int8": "QLinearMatMul"}


@pytest.mark.parametrize("flags, widest", [("avx2,fma", 64),
                                            ("avx2,avx512_vnni", 127)])
def test_onnx_int8_weights_fit_the_cpus_kernels(small, tmp_path, monkeypatch,
                                                flags, widest):
    # Without VNNI onnxruntime's u8 x s8 kernels saturate, so int8 weights
    # keep to 7 bits there (reduce_range); with VNNI the full 8 bits.
    import onnx
    from onnx import numpy_helper

    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", flags)
    path = str(tmp_path / "m.onnx")
    export.to_onnx(small, path, quantization="dynamic_int8")
    weights = [numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and t.dims]
    assert weights
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == widest


@pytest.mark.parametrize("quantization", sorted(ONNX_PRECISION_OPS))
def test_onnx_precisions(vit, tmp_path, quantization):
    import onnx

    path = str(tmp_path / "m.onnx")
    report = export.to_onnx(vit, path, quantization=quantization)
    _check_report(report, "onnx", path)
    assert report["options"]["quantization"] == quantization
    assert report["tolerance"] == dict(
        common.TOLERANCES[f"onnx/{quantization}"],
        max_abs_diff_limits=report["tolerance"]["max_abs_diff_limits"])
    # Only the artifact and its report: the float32 file it was made from
    # stayed in the staging directory.
    assert _leftovers(tmp_path) == ["m.onnx", "m.onnx.report.json"]
    proto = onnx.load(path)
    ops = {n.op_type for n in proto.graph.node}
    assert ONNX_PRECISION_OPS[quantization] in ops
    if quantization == "float16":
        halves = [t for t in proto.graph.initializer
                  if t.data_type == onnx.TensorProto.FLOAT16]
        assert sum(onnx.numpy_helper.to_array(t).size for t in halves) > (
            0.9 * vit.count_params())
    else:
        assert report["verification"]["data"].endswith(
            "scikit-learn/scikit-image")  # photos, not noise
        # Every weight of a MatMul/Gemm/Conv is int8 (dynamic int8 keeps
        # the attention's activation-by-activation matmuls float).
        weights = {t.name for t in proto.graph.initializer}
        assert not [n.name for n in proto.graph.node
                    if n.op_type in ("MatMul", "Gemm", "Conv")
                    and weights & set(n.input)]
    if quantization == "int8":
        assert "representative_data" in report["options"]
        assert any("calibrated on" in n for n in report["notes"])

    # Run it here at a batch size the exporter did not use.
    x = _images(vit, SECOND_BATCH)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, {"images": x})))
    want = _keras(vit, x)["logits"]
    if quantization == "float16":
        np.testing.assert_allclose(out["logits"], want, atol=5e-2)
    else:
        rel = np.sqrt(np.mean((out["logits"] - want) ** 2)
                      / np.mean(want ** 2))
        assert rel < common.TOLERANCES[f"onnx/{quantization}"][
            "rel_rms_error"]
    # The weights take half (float16) or about a quarter (int8) of their
    # float32 bytes.
    stored = sum(len(t.raw_data) for t in proto.graph.initializer)
    assert stored < 0.55 * 4 * vit.count_params()


def test_onnx_int8_calibrates_on_representative_data(small, tmp_path):
    path = str(tmp_path / "m.onnx")
    data = _images(small, 6, seed=3)
    report = export.to_onnx(small, path, quantization="int8",
                            representative_data=[(data, np.zeros(6))])
    assert report["options"]["representative_data"] == (
        "6 images from representative_data")
    assert not any("calibrated on" in n for n in report["notes"])
    with pytest.raises(ValueError, match=r"model's inputs, which span "
                                         r"\[-1, 1\]"):
        export.to_onnx(small, str(tmp_path / "x.onnx"), quantization="int8",
                       representative_data=data * 300)
    assert not os.path.exists(tmp_path / "x.onnx")


def test_onnx_bad_quantization(vit, tmp_path):
    with pytest.raises(ValueError, match=(
            r"quantization must be one of \('float32', 'float16', "
            r"'dynamic_int8', 'int8'\); received quantization='uint4'")):
        export.to_onnx(vit, str(tmp_path / "m.onnx"), quantization="uint4")
    with pytest.raises(ValueError, match="representative_data is only used"):
        export.to_onnx(vit, str(tmp_path / "m.onnx"),
                       quantization="dynamic_int8",
                       representative_data=_images(vit, 2))
    with pytest.raises(ValueError, match="representative_samples"):
        export.to_onnx(vit, str(tmp_path / "m.onnx"), quantization="int8",
                       representative_samples=0)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("quantization", ["float16", "int8"])
def test_onnx_failed_verification_of_a_precision_leaves_nothing(
        small, tmp_path, monkeypatch, quantization):
    import keras_vit.export.onnx as onnx_export

    monkeypatch.setattr(onnx_export, "open_artifact", _Garbage)
    with pytest.raises(export.ExportError, match="does not match Keras") as e:
        export.to_onnx(small, str(tmp_path / "m.onnx"),
                       quantization=quantization)
    assert e.value.report["options"]["quantization"] == quantization
    assert e.value.report["verification"]["failures"]
    # Neither the artifact, nor the float32 file it was made from, nor a
    # staging directory.
    assert _leftovers(tmp_path) == []


# --------------------------------------------------------------------------
# Bad inputs: clear errors and no partial artifacts


def test_unknown_format_and_wrong_extension(vit, tmp_path):
    with pytest.raises(ValueError, match="format must be one of.*'coreml'"):
        export.export(vit, str(tmp_path / "m.mlmodel"), format="coreml")
    with pytest.raises(ValueError, match="cannot tell the format"):
        export.export(vit, str(tmp_path / "m.pt"))
    with pytest.raises(ValueError, match=r"ending with \.onnx.*m\.tflite"):
        export.to_onnx(vit, str(tmp_path / "m.tflite"))
    with pytest.raises(ValueError, match=r"ending with \.tflite"):
        export.to_tflite(vit, str(tmp_path / "m.onnx"))
    with pytest.raises(ValueError, match="SavedModel is a directory"):
        export.to_saved_model(vit, str(tmp_path / "m.onnx"))
    with pytest.raises(ValueError, match="quantization must be one of"):
        export.to_tflite(vit, str(tmp_path / "m.tflite"),
                         quantization="int4")
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("tflite", "m.tflite"),
                                      ("saved_model", "m")])
def test_unwritable_destination(vit, tmp_path, fmt, name):
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    with pytest.raises(export.ExportError, match="is not a directory"):
        export.export(vit, str(not_a_dir / name), format=fmt)
    with pytest.raises(export.ExportError, match="file.txt.*not a direc"):
        export.export(vit, str(not_a_dir / "v1" / name), format=fmt)
    assert _leftovers(tmp_path) == ["file.txt"]


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("saved_model", "m")])
def test_missing_folders_are_created_and_removed_on_failure(
        small, tmp_path, monkeypatch, fmt, name):
    path = tmp_path / "deploy" / "v1" / name
    export.export(small, str(path), format=fmt)
    assert common.read_report(str(path))["verified"] is True
    # A failed export takes back the folders it created, and only those.
    module = formats.format_module(fmt)
    monkeypatch.setattr(module, "open_artifact", _Garbage)
    with pytest.raises(export.ExportError, match="does not match Keras"):
        export.export(small, str(tmp_path / "deploy" / "v2" / "a" / name),
                      format=fmt)
    assert _leftovers(tmp_path / "deploy") == ["v1"]


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("tflite", "m.tflite"),
                                      ("saved_model", "m")])
def test_read_only_directory(vit, tmp_path, fmt, name):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores the mode bits
            pytest.skip("running as a user that can write anywhere")
        with pytest.raises(export.ExportError, match="cannot write"):
            export.export(vit, str(locked / name), format=fmt)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)
    assert _leftovers(tmp_path) == ["locked"]


def _bf16_vit():
    # The SMALL ViT: what is checked is how a bf16 model is exported (a
    # float32 copy, its difference from the bf16 model reported), and one
    # block has every layer the bf16 policy changes; its ONNX export takes
    # about 40% of the CPU time of the tiny ViT's.
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras_vit.models.vit(**SMALL)
    finally:
        keras.config.set_dtype_policy("float32")
    return _perturbed(model)


def test_bf16_model_exports_a_float32_copy_or_says_why_not(tmp_path):
    model = _bf16_vit()
    assert export.graph.low_precision_dtype(model) == "bfloat16"
    with pytest.raises(ValueError, match="bfloat16.*cast_to_float32=True"):
        export.to_tflite(model, str(tmp_path / "m.tflite"),
                         cast_to_float32=False)
    with pytest.raises(ValueError, match="bfloat16"):
        export.to_onnx(model, str(tmp_path / "m.onnx"),
                       cast_to_float32=False)
    assert _leftovers(tmp_path) == []

    report = export.to_onnx(model, str(tmp_path / "m.onnx"))
    assert report["model"]["source_dtype"] == "bfloat16"
    assert any("float32 copy" in note for note in report["notes"])
    # Against the bf16 model itself the float32 artifact differs by bf16's
    # rounding, which the report states.
    assert 0 < report["verification"][
        "max_abs_diff_vs_bfloat16_model"] < 0.5
    session = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)"


class _Garbage:
    """A runtime that returns random outputs of the right shapes."""

    def __init__(self, path):
        self.rng = np.random.default_rng(0)

    def __call__(self, images):
        n = len(images)
        logits = self.rng.normal(0, 5, (n, 5)).astype("float32")
        return {"logits": logits,
                "probabilities": np.full((n, 5), 0.2, "float32")}


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("tflite", "m.tflite"),
                                      ("saved_model", "m")])
def test_failed_verification_raises_and_keeps_the_old_artifact(
        vit, small, exported, tmp_path, monkeypatch, fmt, name):
    path = str(tmp_path / name)
    module = formats.format_module(fmt)
    _place(exported(vit, fmt)[0], path)
    first = common.read_report(path)
    before = _leftovers(tmp_path)

    # The new export is of the small ViT: what a failure leaves is the
    # subject, not the model.
    monkeypatch.setattr(module, "open_artifact", _Garbage)
    with pytest.raises(export.ExportError, match="does not match Keras") as e:
        export.export(small, path, format=fmt)
    assert e.value.report["verification"]["passed"] is False
    assert e.value.report["verification"]["failures"]
    # Nothing new, no partial directory; the earlier export is intact.
    assert _leftovers(tmp_path) == before
    assert common.read_report(path)["created"] == first["created"]


def test_interrupted_export_leaves_nothing(vit, tmp_path, monkeypatch):
    from keras_vit.export.graph import ServingGraph

    def interrupted(self, directory):
        os.makedirs(os.path.join(directory, "variables"))
        raise KeyboardInterrupt

    monkeypatch.setattr(ServingGraph, "save", interrupted)
    for fmt, name in (("saved_model", "m"), ("tflite", "m.tflite")):
        with pytest.raises(KeyboardInterrupt):
            export.export(vit, str(tmp_path / name), format=fmt)
    assert _leftovers(tmp_path) == []


def test_no_overwrite_and_no_replacing_foreign_directories(vit, exported,
                                                           tmp_path):
    path = str(tmp_path / "m.onnx")
    _place(exported(vit, "onnx")[0], path)
    with pytest.raises(export.ExportError, match="exists"):
        export.to_onnx(vit, path, overwrite=False)
    # A SavedModel replaces an old SavedModel, never a directory of other
    # files (replacing a directory deletes it).
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(export.ExportError, match="holds no SavedModel"):
        export.to_saved_model(vit, str(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert _leftovers(tmp_path) == ["m.onnx", "m.onnx.report.json",
                                    "notes.txt"]


# --------------------------------------------------------------------------
# An export owns only its files: what else is in the folder stays, and no
# staging entry outlives the export (symlinks, a full disk, Ctrl-C, kill -9).


def test_reexporting_a_saved_model_keeps_the_users_files(vit, small, exported,
                                                        tmp_path):
    path = tmp_path / "m"
    _place(exported(vit, "saved_model")[0], path)
    first = common.read_report(str(path))
    # TF Serving reads warm-up requests from assets.extra, which the user
    # adds to the export folder.
    warmup = path / "assets.extra" / "tf_serving_warmup_requests"
    warmup.parent.mkdir()
    warmup.write_bytes(b"requests")
    (path / "NOTES.md").write_text("mine")
    second = export.to_saved_model(small, str(path), uint8_input=True)
    # The second report replaced the first (not a second-resolution clock).
    assert (first["input"]["dtype"], second["input"]["dtype"]) == (
        "float32", "uint8")
    assert warmup.read_bytes() == b"requests"
    assert (path / "NOTES.md").read_text() == "mine"
    assert common.read_report(str(path))["input"]["dtype"] == "uint8"
    assert sorted(os.listdir(path)) == [
        "NOTES.md", "assets", "assets.extra", "export_report.json",
        "fingerprint.pb", "saved_model.pb", "variables"]
    assert _leftovers(tmp_path) == ["m"]


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("saved_model", "m")])
def test_exporting_onto_a_symlink_writes_where_it_points(vit, small, exported,
                                                         tmp_path, fmt, name):
    real = tmp_path / "builds"
    real.mkdir()
    _place(exported(vit, fmt)[0], real / name)
    link = tmp_path / ("current" + os.path.splitext(name)[1])
    link.symlink_to(real / name)
    report = export.export(small, str(link), format=fmt, uint8_input=True)
    # The link still points at the artifact, now the new one; nothing
    # (no staging or swapped-out entry) is left beside either.
    assert link.is_symlink() and os.readlink(link) == str(real / name)
    assert common.read_report(str(link))["created"] == report["created"]
    assert common.read_report(str(real / name))["input"]["dtype"] == "uint8"
    assert _leftovers(tmp_path) == ["builds", link.name]
    assert _leftovers(real) == ([name] if fmt == "saved_model" else
                                [name, name + ".report.json"])
    if fmt == "onnx":  # it runs through the link
        session = ort.InferenceSession(str(link),
                                       providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].type == "tensor(uint8)"


@pytest.mark.parametrize("fmt,name", [("onnx", "m.onnx"),
                                      ("saved_model", "m")])
def test_a_full_disk_or_ctrl_c_keeps_the_old_artifact_and_leaves_nothing(
        vit, small, exported, tmp_path, monkeypatch, fmt, name):
    import errno

    from keras_vit.export import pipeline

    path = str(tmp_path / name)
    _place(exported(vit, fmt)[0], path)
    first = common.read_report(path)
    before = _leftovers(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    # The report is the last file written before the artifact moves in.
    for stop, error in ((full, OSError), (ctrl_c, KeyboardInterrupt)):
        monkeypatch.setattr(pipeline.common, "write_json", stop)
        with pytest.raises(error):
            export.export(small, path, format=fmt)
        assert _leftovers(tmp_path) == before
        assert common.read_report(path)["created"] == first["created"]


_EXPORT_THEN_WAIT = r"""
import os, sys, time
import keras_vit
from keras_vit import export
from keras_vit.export import common

fmt, path = sys.argv[1], sys.argv[2]
model = keras_vit.models.vit(32, 8, 16, 1, 2, 32, 3)
real = common.write_json

def slow_report(p, data):
    real(p, data)
    print("staged", flush=True)  # the artifact is built, not yet in place
    time.sleep(120)

common.write_json = slow_report
export.export(model, path, format=fmt)
"""


_EXPORT_WITH_A_HANGING_CONVERTER = r"""
import sys
from keras_vit import export, models
from keras_vit.export import pipeline

# A converter process that writes its pid, then hangs.
hang = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid()))"
        "; time.sleep(300)")
pipeline.child_command = lambda module, job: [sys.executable, "-c", hang,
                                              sys.argv[2]]
model = models.vit(32, 8, 16, 1, 2, 32, 3)
export.to_onnx(model, sys.argv[1], isolate=True)
"""


def test_a_killed_export_stops_its_converter_process(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "out"
    folder.mkdir()
    pid_file = tmp_path / "converter.pid"
    # The exporter runs Keras on TensorFlow: isolate=True saves the
    # serving graph and starts the ONNX converter process with
    # pipeline.run_child, which also starts (and the watcher stops) the
    # TensorFlow converter process of an export from JAX or PyTorch. It is
    # the cheaper exporter to start: a JAX process imports TensorFlow too
    # (Keras' .keras saving) and compiles each weight's initializer with
    # XLA, about 7 CPU-seconds before its converter starts against 4.
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXPORT_WITH_A_HANGING_CONVERTER,
         str(folder / "m.onnx"), str(pid_file)],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                 KERAS_BACKEND="tensorflow"))
    deadline = time.monotonic() + 120
    try:
        while not (pid_file.exists() and pid_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        converter = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The watcher stops the converter (it would write into the staging
    # directory again), then removes the directory.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
            os.listdir(folder) or _alive(converter)):
        time.sleep(0.1)
    assert not _alive(converter)
    assert os.listdir(folder) == []


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by init) counts as stopped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_export_leaves_no_staging_entry(tmp_path):
    import subprocess
    import sys

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "other.txt").write_text("mine")
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXPORT_THEN_WAIT, "onnx",
         str(folder / "m.onnx")], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    with killed_when_ready(proc, "staged", timeout=60):
        assert len(os.listdir(folder)) == 2  # the staging directory
    # Removed, once the process is gone, by the watcher it started.
    wait_until(lambda: len(os.listdir(folder)) <= 1, poll=0.1)
    assert _leftovers(folder) == ["other.txt"]


# --------------------------------------------------------------------------
# command line


def _cli(argv):
    parser = argparse.ArgumentParser(prog="keras-vit")
    parser.add_argument("--traceback", action="store_true")
    export_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_export_keras_file_and_zoo_name(small, tmp_path, capsys):
    keras_file = str(tmp_path / "tiny.keras")
    small.save(keras_file)
    out = str(tmp_path / "tiny.tflite")
    assert _cli(["export", keras_file, "--format", "tflite", "-q",
                 "float16", "-o", out]) == 0
    printed = capsys.readouterr().out
    assert "| tflite | float16 | tiny.tflite |" in printed
    assert json.load(open(out + ".report.json"))["verified"] is True

    out = str(tmp_path / "ti")
    assert _cli(["export", "ViT-Ti/16", "--weights", "none", "--image-size",
                 "32", "--num-classes", "3", "-f", "saved_model", "-o",
                 out, "--uint8-input"]) == 0
    report = common.read_report(out)
    assert report["input"]["dtype"] == "uint8"
    assert report["outputs"]["logits"] == [None, 3]

    with pytest.raises(ValueError, match=r"ending with \.onnx"):
        _cli(["export", keras_file, "-f", "onnx", "-o",
              str(tmp_path / "x.tflite")])
    with pytest.raises(ValueError, match="--quantization"):
        _cli(["export", keras_file, "-f", "saved_model", "-q", "int8", "-o",
              str(tmp_path / "x_dir")])
    # Missing folders are created.
    out = str(tmp_path / "deploy" / "v1" / "tiny.onnx")
    assert _cli(["export", keras_file, "-f", "onnx", "-q", "dynamic_int8",
                 "-o", out]) == 0
    assert "| onnx | dynamic_int8 | tiny.onnx |" in capsys.readouterr().out
    assert common.read_report(out)["options"]["quantization"] == (
        "dynamic_int8")
    with pytest.raises(ValueError, match="tiny.keras.*not a directory"):
        _cli(["export", keras_file, "-f", "onnx", "-o",
              str(tmp_path / "tiny.keras" / "x.onnx")])
    with pytest.raises(ValueError, match="--outputs must be distinct names"):
        _cli(["export", keras_file, "-f", "onnx", "--outputs", "logits,cls",
              "-o", str(tmp_path / "x.onnx")])
    assert not any(p.name.startswith("x.") for p in tmp_path.iterdir())


def test_cli_int8_calibrates_on_a_data_spec(small, tmp_path, monkeypatch,
                                           capsys):
    keras_file = str(tmp_path / "tiny.keras")
    small.save(keras_file)
    out = str(tmp_path / "tiny.tflite")
    with pytest.raises(ValueError, match="--calibration-data applies to "
                                         "--quantization int8"):
        _cli(["export", keras_file, "-f", "tflite", "-q", "float16",
              "--calibration-data", "digits:train", "-o", out])
    with pytest.raises(ValueError, match="digits_trian"):
        _cli(["export", keras_file, "-f", "tflite", "-q", "int8",
              "--calibration-data", "digits_trian", "-o", out])
    # A tiny random model: its int8 agreement is not what is tested here.
    monkeypatch.setitem(common.TOLERANCES["tflite/int8"], "top1_agreement",
                        0.0)
    assert _cli(["export", keras_file, "-f", "tflite", "-q", "int8",
                 "--calibration-data", "digits:train", "-o", out]) == 0
    report = common.read_report(out)
    assert report["options"]["representative_data"] == (
        "100 images of digits:train")
    assert not any("no representative_data" in n for n in report["notes"])
    assert "| tflite | int8 |" in capsys.readouterr().out


def test_a_failed_int8_verification_names_the_remedies(small, tmp_path,
                                                       monkeypatch):
    import keras_vit.export.tflite as tflite_export

    monkeypatch.setattr(tflite_export, "open_artifact", _Garbage)
    with pytest.raises(export.ExportError, match=r"top-1 agreement.*"
                       r"representative_data=.*--calibration-data.*"
                       r"dynamic_int8"):
        export.to_tflite(small, str(tmp_path / "m.tflite"),
                         quantization="int8", representative_samples=8)
    assert _leftovers(tmp_path) == []


def test_cli_export_failure_is_one_line(small, tmp_path, monkeypatch, capsys):
    import keras_vit.export.onnx as onnx_export

    keras_file = str(tmp_path / "tiny.keras")
    small.save(keras_file)
    monkeypatch.setattr(onnx_export, "open_artifact", _Garbage)
    assert _cli(["export", keras_file, "-f", "onnx", "-o",
                 str(tmp_path / "x.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("keras-vit: error: the ONNX file")
    assert not os.path.exists(tmp_path / "x.onnx")


@pytest.mark.slow
def test_cli_benchmark(small, tmp_path, capsys):
    keras_file = str(tmp_path / "tiny.keras")
    small.save(keras_file)
    assert _cli(["benchmark", keras_file, "--runtimes", "keras,onnx,tflite",
                 "--batch", "1,2", "--runs", "2", "--no-bf16"]) == 0
    out = capsys.readouterr().out
    assert "| runtime | dtype | batch 1 img/s | batch 2 img/s |" in out
    for runtime in ("keras", "onnx", "tflite"):
        assert f"| {runtime} | float32 |" in out
    with pytest.raises(ValueError, match="runtimes"):
        _cli(["benchmark", "ViT-Ti/16", "--runtimes", "keras,coreml"])


def test_benchmark_bf16_rows(small):
    from keras_vit.export import benchmark

    result = benchmark.run(small, runtimes=("keras",), batch_sizes=(2,),
                           runs=1, bf16=True)
    rows = {(r["runtime"], r["dtype"]) for r in result["rows"]}
    assert rows == {("keras", "float32"), ("keras", "mixed_bfloat16")}
    assert all(r["images_per_s"] > 0 and r["peak_rss_mb"] > 0
               for r in result["rows"])
    table = benchmark.markdown_table(result)
    assert "| keras | mixed_bfloat16 |" in table
    supported, why = benchmark.cpu_bf16_support()
    assert isinstance(supported, bool) and why


# --------------------------------------------------------------------------



# Bad arguments to export and to_onnx, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("export format", lambda: keras_vit.export.export(
        _tiny_model(), "m.onnx", format="onx"), "format", "'onx'", "onnx"),
    ("export quantization", lambda: keras_vit.export.to_onnx(
        _tiny_model(), "m.onnx", quantization="in8"), "quantization",
     "'in8'", "int8"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)


# --------------------------------------------------------------------------
# What an export serves is the model's own output, whatever its head


# Every kind of head a model's output can come from (SMALL models):
# "logits" is the model's output, "probabilities" the softmax of a head
# without activation, else what the model's activation gives.
HEADS = {
    "plain": {},
    "distilled": {"distilled": True},
    "projection": {"head_type": "projection"},
    "softmax": {"classifier_activation": "softmax"},
    "distilled_sigmoid": {"distilled": True,
                          "classifier_activation": "sigmoid"},
}


def _head_model(head):
    """The SMALL ViT with ``HEADS[head]`` and random non-trivial weights."""
    key = f"head:{head}"
    if key not in _MODELS:
        keras.utils.set_random_seed(1234)
        _MODELS[key] = _perturbed(keras_vit.models.vit(**SMALL,
                                                       **HEADS[head]),
                                  scale=0.3)
    return _MODELS[key]


def _own_outputs(model, x):
    """What the artifact of ``model`` must return for ``x``: its own
    call's output, as ``logits`` (a classifier, with ``probabilities``) or
    ``features`` (a projection head)."""
    from keras_vit.models.features import is_classifier

    own = np.asarray(model(x, training=False), np.float64)
    if not is_classifier(model):
        return {"features": own}
    if model.classifier_activation is None:
        return dict(_keras(model, x))
    return {"logits": own, "probabilities": own}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_the_serving_graph_and_its_check_are_the_models_call(head):
    """The serving computation and the reference the verification
    compares an artifact with are both the model's own call (eager, no
    conversion), for the images and the image_bytes signatures."""
    from keras_vit.export import serving
    from keras_vit.export.graph import ServingGraph

    model = _head_model(head)
    x = _images(model, SECOND_BATCH)
    want = _own_outputs(model, x)
    graph = ServingGraph(model)
    assert sorted(graph.outputs) == sorted(want)
    served = {k: np.asarray(v) for k, v in graph.serve(x).items()}
    for got in (served, graph.reference(x)):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], atol=1e-5,
                                       err_msg=f"{head}: {name}")
    files = serving.as_batch([serving.encode(p) for p in
                              _images(model, 2, uint8=True)])
    top_k = {"top_k": 2} if "probabilities" in want else {}
    graph = serving.ImageBytesGraph(model, **top_k)
    x = graph.preprocess(files)
    want = _own_outputs(model, x)
    name = "logits" if "logits" in want else "features"
    for got in (graph.serve(tf.constant(files)), graph.reference(files)):
        np.testing.assert_allclose(np.asarray(got[name]), want[name],
                                   atol=1e-5, err_msg=head)
        if "probabilities" in want:
            np.testing.assert_allclose(
                np.asarray(got["scores"]),
                -np.sort(-want["probabilities"])[:, :2], atol=1e-5,
                err_msg=head)


@pytest.mark.parametrize("fmt", sorted(_NAMES))
@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_format_returns_the_models_own_output(head, fmt, exported):
    """Each format's artifact returns the model's own output (a distilled
    model's mean of its two heads, a projection, after the model's
    classifier_activation), run in its runtime at another batch size."""
    model = _head_model(head)
    path, report = exported(model, fmt)
    assert report["verified"]
    x = _images(model, SECOND_BATCH)
    got = formats.format_module(fmt).open_artifact(path)(x)
    want = _own_outputs(model, x)
    assert sorted(got) == sorted(want), head
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4,
                                   err_msg=f"{head}: {name}")


def test_probabilities_of_an_activation_without_them_are_refused():
    """A head whose activation gives no probabilities (relu) exports its
    output as logits; asking for probabilities is refused by name."""
    from keras_vit.export import serving
    from keras_vit.export.graph import ServingGraph

    model = keras_vit.models.vit(**SMALL, classifier_activation="relu")
    assert ServingGraph(model).outputs == ("logits",)
    with pytest.raises(ValueError) as info:
        ServingGraph(model, outputs=("logits", "probabilities"))
    message = str(info.value)
    assert "\n" not in message and "classifier_activation='relu'" in message
    assert "probabilities" in message, message
    with pytest.raises(ValueError, match=r"'scores'.*activation='relu'"):
        serving.ImageBytesGraph(model)  # it ranks probabilities


# --------------------------------------------------------------------------
# Every argument of the exporters is checked, and refused by name


_DESTINATIONS = {"to_onnx": "m.onnx", "to_tflite": "m.tflite",
                 "to_saved_model": "m", "to_openvino": "m.xml",
                 "export": "m.onnx"}


def _bad_arguments():
    """``(exporter, argument, bad value)`` for every argument of each
    exporter's signature that a type decides: the model, each boolean
    option, each count, the tolerance's values."""
    rows = []
    for name in _DESTINATIONS:
        for arg, param in inspect.signature(
                getattr(export, name)).parameters.items():
            default = param.default
            if arg == "model":
                bad = ["ViT-B/16", None]
            elif isinstance(default, bool):
                bad = ["no", None]
            elif arg.endswith("_samples") or isinstance(default, int):
                bad = ["abc", 2.5, -5]
            elif arg == "tolerance":
                bad = [{"max_abs_diff": "big"}, {"max_abs_diff": -1},
                       {"top1_agreement": 1.5}]
            else:
                continue
            rows += [(name, arg, value) for value in bad]
    return rows


@pytest.mark.parametrize("exporter, arg, value", _bad_arguments(),
                         ids=[f"{f}-{a}-{v!r}" for f, a, v in
                              _bad_arguments()])
def test_every_exporter_argument_is_refused_by_name(exporter, arg, value,
                                                    tmp_path):
    """A wrong type or range is one line naming the argument and echoing
    the value, before anything is written."""
    model = value if arg == "model" else _tiny_model()
    kwargs = {} if arg == "model" else {arg: value}
    echoed = (repr(next(iter(value.values()))) if isinstance(value, dict)
              else repr(value))
    with pytest.raises((ValueError, TypeError)) as info:
        getattr(export, exporter)(model, str(tmp_path / _DESTINATIONS[
            exporter]), **kwargs)
    message = str(info.value)
    assert "\n" not in message and f"{arg}" in message, message
    assert echoed in message, message
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("arg", ["representative_samples",
                                 "agreement_samples"])
def test_too_many_samples_name_their_argument(arg, tmp_path):
    with pytest.raises(ValueError) as info:
        export.to_tflite(_tiny_model(), str(tmp_path / "m.tflite"),
                         quantization="int8", **{arg: 10**9})
    message = str(info.value)
    assert f"{arg}=" in message and "batch_sizes" not in message, message
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("float_ops, hint", [
    ("sensitiv", "sensitive"), ("softmaxx", "SOFTMAX"),
    (["layer_norm", "atention"], "attention")])
def test_unknown_float_ops_are_refused_listing_the_known(float_ops, hint,
                                                         tmp_path):
    with pytest.raises(ValueError) as info:
        export.to_tflite(_tiny_model(), str(tmp_path / "m.tflite"),
                         quantization="int8", float_ops=float_ops)
    message = str(info.value)
    assert "\n" not in message and f"float_ops={float_ops!r}" in message
    assert f"Did you mean {hint!r}" in message, message
    assert "'attention', 'layer_norm', 'residual_add'" in message, message
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("quantization", ["float32", "float16",
                                          "dynamic_int8"])
def test_float_ops_apply_to_full_int8_only(quantization, tmp_path):
    """As representative_data: an option of quantization='int8' only."""
    with pytest.raises(ValueError) as info:
        export.to_tflite(_tiny_model(), str(tmp_path / "m.tflite"),
                         quantization=quantization, float_ops=["layer_norm"])
    message = str(info.value)
    assert "float_ops" in message, message
    assert f"quantization={quantization!r}" in message, message
    assert _leftovers(tmp_path) == []


def test_verify_data_is_read_as_representative_data_is():
    """Pixels given as verify_data are normalised as the model says, as
    representative_data's are; model inputs are taken as given; an
    artifact that takes pixels is checked on the pixels."""
    from keras_vit.export import samples, verify
    from keras_vit.export.graph import ServingGraph

    model = keras_vit.models.vit(**SMALL, input_normalization="imagenet")
    graph = ServingGraph(model)
    pixels = _images(model, 4, uint8=True)
    normalised = np.asarray(graph.normalization(pixels.astype("float32")))
    for data in (pixels, pixels.astype("float32"), normalised):
        images, note = verify.verification_images(graph, (4, 1), data)
        np.testing.assert_allclose(images, normalised, atol=1e-5)
        np.testing.assert_allclose(
            images, samples.calibration_images(graph, data, 10)[0],
            atol=1e-5)
        assert "4 images given as verify_data (" in note, note
    uint8 = ServingGraph(model, uint8_input=True)
    images, _ = verify.verification_images(uint8, (4, 1), pixels)
    assert images.dtype == np.uint8 and np.array_equal(images, pixels)
    with pytest.raises(ValueError, match=r"verify_data spans \[300, 300\]"):
        verify.verification_images(graph, (4, 1),
                                   np.full((2, 16, 16, 3), 300.0))


@pytest.mark.parametrize("activation", [
    None, "linear", "softmax", "sigmoid", keras.activations.sigmoid,
    {"module": "keras.activations", "class_name": "function",
     "config": "sigmoid", "registered_name": None}, "log_softmax", "relu"])
def test_the_export_reads_a_head_as_predict_does(activation):
    """The export's probabilities and predict's ranking decide from one
    reading of classifier_activation (a name, a function or a saved
    function's config)."""
    import types

    from keras_vit.export.graph import probabilities_inside
    from keras_vit.zoo.preprocessing import head_probabilities, softmax

    model = types.SimpleNamespace(classifier_activation=activation)
    z = np.array([[0.2, 0.7, 0.1]])
    inside = probabilities_inside(model)
    if inside is None:  # neither logits nor probabilities: not exported
        assert activation in ("log_softmax", "relu")
        return
    want = z if inside else softmax(z)
    np.testing.assert_allclose(head_probabilities(model, z), want)
