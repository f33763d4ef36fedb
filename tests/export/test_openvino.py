"""keras_vit.export.to_openvino: each precision, run in OpenVINO and
compared with Keras.

Tiny models with random non-trivial weights are exported; each test then
runs the artifact itself with OpenVINO's runtime (at a batch size the
exporter did not use, compiled with the precision hint the file records)
and compares it with Keras within the tolerance of its precision. Bad
arguments are refused in one line before anything is written.

The tiny ViT is exported once per precision for the module (``exported``):
the tests that read a default export share it, and a test that needs one
in its own folder copies it there.
"""

import hashlib
import os
import shutil
import sys

import numpy as np
import pytest

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.export import common  # noqa: E402
from keras_vit.export import openvino as ov_export  # noqa: E402


TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=5)
SECOND_BATCH = 3  # not one of the exporter's (4, 1)
LABELS = ["cat", "dog", "a fox", "bird \"b\"", "<eel>"]
HINTS = {"float32": "f32", "bfloat16": "bf16", "int8": "f32"}
# Weights of the 2-block tiny ViT that the int8 export stores in int8: per
# block the q, k, v, out and two MLP matrices, plus the patch embedding
# and the head.
TINY_INT8_LAYERS = 2 * 6 + 2


def _perturbed(model, seed=0, scale=0.1):
    """Every weight (the zero head included) plus noise, so that outputs
    differ per class and per image."""
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, scale, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


_MODELS = {}


def _model(kind):
    if kind not in _MODELS:
        keras.utils.set_random_seed(1234)
        if kind == "vit":
            model = keras_vit.models.vit(**TINY, label_names=LABELS)
        elif kind == "dynamic":
            model = keras_vit.models.vit(**TINY, dynamic_image_size=True)
        elif kind == "small":  # for a test of files, not numbers
            model = keras_vit.models.vit(16, 8, 16, 1, 2, 32, 5)
        elif kind == "hybrid":  # one block: the stem is what it adds
            model = keras_vit.models.vit(
                32, 1, 32, 1, 4, 64, 5,
                resnet=dict(num_layers=(1,), width_factor=0.5))
        else:
            model = keras_vit.models.resnet_v2(64, (1, 1, 1, 1), 0.5, 5)
        _MODELS[kind] = _perturbed(model)
    return _MODELS[kind]


@pytest.fixture
def vit():
    return _model("vit")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(precision)``: ``(path, report)`` of the tiny ViT exported
    at ``precision`` with every other option its default, once for the
    module (on first use), alone in a folder of its own (``m.xml``). The
    tests only read it; one that changes files copies it first."""
    root = tmp_path_factory.mktemp("openvino")
    done = {}

    def get(precision):
        if precision not in done:
            folder = root / precision
            folder.mkdir()
            path = str(folder / "m.xml")
            done[precision] = (path, export.to_openvino(
                _model("vit"), path, precision=precision))
        return done[precision]

    return get


def _images(shape, n, seed=7, uint8=False):
    rng = np.random.default_rng(seed)
    if uint8:
        return rng.integers(0, 256, (n,) + tuple(shape), dtype=np.uint8)
    return rng.uniform(-1, 1, (n,) + tuple(shape)).astype("float32")


def _keras_logits(model, x):
    return np.asarray(model(x, training=False), dtype=np.float64)


def _run_openvino(path, x):
    """The artifact's outputs, compiled here for the CPU with the hint it
    records, and that hint as the compiled model reports it."""
    core = ov_export.core()
    model = core.read_model(path)
    hint = model.get_rt_info(ov_export.RT_HINT).astype(str)
    compiled = core.compile_model(model, "CPU",
                                  {"INFERENCE_PRECISION_HINT": hint})
    out = compiled(x)
    return ({o.get_any_name(): np.asarray(out[o], np.float64)
             for o in compiled.outputs},
            str(compiled.get_property("INFERENCE_PRECISION_HINT")))


def _assert_within(got, want, tol):
    """``got`` against ``want`` within a tolerance of
    :data:`keras_vit.export.TOLERANCES` (the same criteria the exporter
    checks; top-1 is left out at three images)."""
    assert np.all(np.isfinite(got))
    scale = max(1.0, float(np.max(np.abs(want))))
    if tol["max_abs_diff"] is not None:
        assert np.max(np.abs(got - want)) <= tol["max_abs_diff"] * scale
    if tol["rel_rms_error"] is not None:
        rms = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
        assert rms <= tol["rel_rms_error"]


def _constants(path, element_type):
    """Values held in constants of ``element_type`` (``"f32"``, ``"f16"``,
    ``"u8"``) in the IR at ``path``."""
    model = ov_export.core().read_model(path)
    return sum(int(np.prod(list(op.get_output_shape(0))))
               for op in model.get_ops() if op.get_type_name() == "Constant"
               and op.get_output_element_type(0).get_type_name()
               == element_type)


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --------------------------------------------------------------------------
# each precision


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_each_precision_runs_in_openvino_and_matches_keras(
        vit, exported, precision):
    path, report = exported(precision)
    kind = "openvino" if precision == "float32" else f"openvino/{precision}"
    tol = common.TOLERANCES[kind]
    assert report["format"] == "openvino" and report["verified"] is True
    assert report["batch_sizes"] == [4, 1]
    assert report["options"]["precision"] == precision
    assert report["options"]["compile_config"] == {
        "INFERENCE_PRECISION_HINT": HINTS[precision]}
    assert {k: report["tolerance"][k] for k in tol} == tol
    assert sorted(os.listdir(os.path.dirname(path))) == [
        "m.bin", "m.xml", "m.xml.report.json"]
    assert common.read_report(path)["max_abs_diff"] == report["max_abs_diff"]
    assert export.read_label_names(path) == tuple(LABELS)

    # The weights are stored as the precision says.
    params = vit.count_params()
    if precision == "float32":
        assert _constants(path, "f32") >= params
        assert _constants(path, "f16") == _constants(path, "u8") == 0
    elif precision == "bfloat16":
        assert _constants(path, "f16") >= 0.95 * params
        assert _constants(path, "f32") < 0.05 * params
    else:
        assert report["options"]["int8_layers"] == TINY_INT8_LAYERS
        assert _constants(path, "u8") >= 0.9 * params
    weights = os.path.getsize(common.weights_file(path))
    assert weights < 4 * params * (1.1 if precision == "float32" else 0.6)

    x = _images(vit.inputs[0].shape[1:], SECOND_BATCH)
    out, computed = _run_openvino(path, x)
    want = _keras_logits(vit, x)
    _assert_within(out["logits"], want, tol)
    assert set(out) == {"logits", "probabilities"}
    np.testing.assert_allclose(out["probabilities"].sum(-1), 1, atol=1e-3)
    expected = {"f32": "<Type: 'float32'>", "bf16": "<Type: 'bfloat16'>"}
    if precision == "bfloat16" and not ov_export.cpu_has_bf16(ov_export.core()):
        assert computed == expected["f32"] and report["notes"]
    else:
        assert computed == expected[HINTS[precision]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hybrid", "bit", "dynamic"])
def test_convolutions_and_dynamic_sizes_in_float32(kind, tmp_path):
    model = _model(kind)
    path = str(tmp_path / f"{kind}.xml")
    report = export.to_openvino(model, path)
    assert report["verified"] is True
    shape = tuple(model.inputs[0].shape[1:])
    if kind == "dynamic":
        # Checked by the exporter at other sizes too, and here at one more.
        assert len(report["verification"]["image_sizes"]) == 3
        shape = (48, 32, 3)
    x = _images(shape, SECOND_BATCH)
    out, _ = _run_openvino(path, x)
    _assert_within(out["logits"], _keras_logits(model, x),
                   common.TOLERANCES["openvino"])


def test_uint8_input_and_every_output(vit, tmp_path):
    """All five outputs, two of them one tensor (``features`` is
    ``logits`` for a classifier), each under its own name."""
    path = str(tmp_path / "u8.xml")
    outputs = ("logits", "probabilities", "pre_logits", "attention_maps",
               "features")
    report = export.to_openvino(vit, path, uint8_input=True,
                                outputs=outputs)
    assert report["input"]["dtype"] == "uint8"
    x = _images(vit.inputs[0].shape[1:], SECOND_BATCH, uint8=True)
    out, _ = _run_openvino(path, x)
    assert set(out) == set(outputs)
    want = _keras_logits(vit, x.astype("float32") / 127.5 - 1)
    for name in ("logits", "features"):
        _assert_within(out[name], want, common.TOLERANCES["openvino"])
    assert out["attention_maps"].shape == (SECOND_BATCH, 2, 4, 17, 17)


@pytest.mark.parametrize("head", [
    {"distilled": True}, {"distilled": True, "classifier_activation":
                          "sigmoid"}, {"head_type": "projection"}],
    ids=["distilled", "distilled_sigmoid", "projection"])
def test_the_ir_returns_the_models_own_output(head, tmp_path):
    """A distilled model's mean of its two heads, after its sigmoid, or a
    projection head: the IR's outputs are the model's own output."""
    keras.utils.set_random_seed(1234)
    model = _perturbed(keras_vit.models.vit(16, 8, 16, 1, 2, 32, 5, **head),
                       scale=0.3)
    path = str(tmp_path / "m.xml")
    report = export.to_openvino(model, path)
    x = _images(model.inputs[0].shape[1:], SECOND_BATCH)
    out, _ = _run_openvino(path, x)
    want = _keras_logits(model, x)
    assert sorted(out) == sorted(report["outputs"])
    for name in sorted(out):  # logits, probabilities; or features
        np.testing.assert_allclose(out[name], want, atol=1e-4, err_msg=name)
        if name == "logits" and "classifier_activation" not in head:
            e = np.exp(want - want.max(-1, keepdims=True))
            want = e / e.sum(-1, keepdims=True)  # then probabilities


@pytest.mark.slow
def test_keras_onnx_and_openvino_agree_on_the_same_images(vit, exported,
                                                          tmp_path):
    """One batch through three runtimes: Keras, onnxruntime on the ONNX
    export and OpenVINO on the (float32) OpenVINO export."""
    import onnxruntime as ort

    onnx_path = str(tmp_path / "m.onnx")
    ov_path, _ = exported("float32")
    export.to_onnx(vit, onnx_path, outputs=("logits",))
    x = _images(vit.inputs[0].shape[1:], SECOND_BATCH, seed=11)
    session = ort.InferenceSession(onnx_path,
                                   providers=["CPUExecutionProvider"])
    results = {"keras": _keras_logits(vit, x),
               "onnx": np.asarray(session.run(None, {"images": x})[0],
                                  np.float64),
               "openvino": _run_openvino(ov_path, x)[0]["logits"]}
    tol = common.TOLERANCES["openvino"]
    for a in results:
        for b in results:
            _assert_within(results[a], results[b], tol)
    assert len({tuple(r.argmax(-1)) for r in results.values()}) == 1


# --------------------------------------------------------------------------
# failures


def test_bad_arguments_are_refused_before_anything_is_written(vit,
                                                              tmp_path):
    path = str(tmp_path / "m.xml")
    with pytest.raises(ValueError, match="precision.*'bf16'.*'bfloat16'"):
        export.to_openvino(vit, path, precision="bf16")
    with pytest.raises(ValueError, match=r"ending with \.xml.*m\.onnx"):
        export.to_openvino(vit, str(tmp_path / "m.onnx"))
    with pytest.raises(ValueError, match=r"\.xml \(lower case\).*M\.XML"):
        export.to_openvino(vit, str(tmp_path / "M.XML"))
    with pytest.raises(ValueError, match="tolerance"):
        export.to_openvino(vit, path, tolerance={"max_abs": 1})
    with pytest.raises(ValueError, match="verify_data"):
        export.to_openvino(vit, path, verify_data="pictures")
    quantized = keras_vit.models.vit(**TINY)
    with pytest.warns(UserWarning, match="quantize"):
        quantized.quantize("int8")
    with pytest.raises(export.ExportError, match="precision='int8'"):
        export.to_openvino(quantized, path)
    # A weights file that is not this export's is not replaced.
    open(tmp_path / "m.bin", "w").close()
    with pytest.raises(export.ExportError, match=r"m\.bin.*overwrite"):
        export.to_openvino(vit, path, overwrite=False)
    assert sorted(os.listdir(tmp_path)) == ["m.bin"]


class _Garbage:
    """A runtime that returns random outputs of the right shapes."""

    def __init__(self, path):
        self.rng = np.random.default_rng(0)

    def __call__(self, images):
        logits = self.rng.normal(0, 5, (len(images), 5)).astype("float32")
        return {"logits": logits,
                "probabilities": np.full_like(logits, 0.2)}


@pytest.mark.slow
def test_failed_verification_keeps_the_old_artifact(exported, tmp_path,
                                                    monkeypatch):
    # The old artifact: the module's float32 export, copied here.
    source, _ = exported("float32")
    for name in os.listdir(os.path.dirname(source)):
        shutil.copy(os.path.join(os.path.dirname(source), name), tmp_path)
    path = str(tmp_path / "m.xml")
    before = {name: _digest(tmp_path / name)
              for name in sorted(os.listdir(tmp_path))}
    # The new export is of a smaller ViT: what a failure leaves is the
    # subject, not the model.
    monkeypatch.setattr(ov_export, "open_artifact", _Garbage)
    with pytest.raises(export.ExportError,
                       match="does not match Keras.*precision='float32'"):
        export.to_openvino(_model("small"), path, precision="bfloat16")
    assert {name: _digest(tmp_path / name)
            for name in sorted(os.listdir(tmp_path))} == before


@pytest.mark.parametrize("module,precision", [("openvino", "float32"),
                                              ("nncf", "int8")])
def test_a_missing_package_is_one_line(vit, tmp_path, monkeypatch, capsys,
                                       module, precision):
    from keras_vit import cli

    keras_file = str(tmp_path / "tiny.keras")
    vit.save(keras_file)
    monkeypatch.setitem(sys.modules, module, None)  # import raises
    out = tmp_path / "m.xml"
    assert cli.main(["export", keras_file, "-f", "openvino", "--precision",
                     precision, "-o", str(out)]) == 2
    assert f"package '{module}', which is not installed: pip install " \
           f"'{module}'" in _one_error_line(capsys)
    assert not out.exists()


# --------------------------------------------------------------------------
# command line and benchmark


def test_cli_export_openvino(vit, tmp_path, capsys):
    from keras_vit import cli

    keras_file = str(tmp_path / "tiny.keras")
    vit.save(keras_file)
    out = str(tmp_path / "deploy" / "tiny.xml")
    assert cli.main(["export", keras_file, "-f", "openvino", "--precision",
                     "bfloat16", "-o", out, "--batch-sizes", "2,1"]) == 0
    printed = capsys.readouterr().out
    assert "| openvino | bfloat16 | tiny.xml |" in printed
    report = common.read_report(out)
    assert report["options"]["precision"] == "bfloat16"
    assert report["batch_sizes"] == [2, 1]
    assert export.read_label_names(out) == tuple(LABELS)

    # Mistakes: status 2, one line naming the option, nothing written.
    bad = {("-f", "openvino", "-q", "int8"):
               "--quantization applies to --format tflite and onnx only; "
               "received --format openvino; OpenVINO takes --precision",
           ("-f", "openvino", "--calibration-data", "digits:train"):
               "--calibration-data applies to --quantization int8",
           ("-f", "openvino", "--opset", "17"): "--opset",
           ("-f", "onnx", "--precision", "int8"):
               "--precision applies to --format openvino only",
           ("-f", "openvino", "--precision", "fp8"): "--precision"}
    for extra, message in bad.items():
        name = "x.onnx" if "onnx" in extra else "x.xml"
        assert cli.main(["export", keras_file, *extra, "-o",
                         str(tmp_path / name)]) == 2, extra
        assert message in _one_error_line(capsys)
    assert cli.main(["export", keras_file, "-f", "openvino", "-o",
                     str(tmp_path / "x.XML")]) == 2
    assert ".xml (lower case)" in _one_error_line(capsys)
    assert not any(p.name.startswith("x.") for p in tmp_path.iterdir())


def test_the_process_has_one_openvino_core():
    """Each OpenVINO Core's CPU plugin gives the thread that compiles with
    it a signal stack of its own and, when the Core ends, puts back the one
    it found; Cores that end in another order than they began (as the
    garbage collector may end them) left the test worker's main thread a
    freed stack, and its next Ctrl-C was a segmentation fault. One Core,
    never ended early (tests/contracts/test_structure.py finds any other
    ``Core()`` in the package, its benchmarks, tests and examples)."""
    assert ov_export.core() is ov_export.core()


@pytest.mark.slow
def test_benchmark_times_openvino_in_float32_and_bfloat16():
    from keras_vit.export import benchmark

    result = benchmark.run(_model("small"), runtimes=("openvino",), batch_sizes=(2,),
                           runs=1, bf16=True)
    rows = {(r["runtime"], r["dtype"]): r for r in result["rows"]}
    assert set(rows) == {("openvino", "float32"), ("openvino", "bfloat16")}
    assert all(r["images_per_s"] > 0 for r in rows.values())
    assert rows[("openvino", "float32")]["max_abs_diff"] < 1e-4
    assert "| openvino | bfloat16 |" in benchmark.markdown_table(result)
