"""Every bad input gets one clear error, from one set of argument checks.

Table-driven: each row calls a public entry point (Python API, environment
variable, command line) with one bad value and checks that the error names
the argument, echoes the value and, where a valid value is near, suggests
it; a number out of range states the range. The command line answers with
exit status 2 and one line, never a traceback.
"""

import numpy as np
import pytest

import keras_vit
from keras_vit import analysis, cli, zoo
from keras_vit.base import checks
from keras_vit import train as kt
from keras_vit.zoo import download

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)


def _vit(**kwargs):
    return keras_vit.vit(**dict(TINY, **kwargs))


def _tiny_model():
    if not hasattr(_tiny_model, "model"):
        _tiny_model.model = _vit()
    return _tiny_model.model


# (label, call, argument named, value echoed, suggestion or range text).
# A suggestion is checked as "Did you mean '<it>'"; other text verbatim.
PYTHON_API = [
    ("vit classifier", lambda: _vit(classifier="tokn"),
     "classifier", "'tokn'", "token"),
    ("vit pooling", lambda: _vit(include_top=False, pooling="tokn"),
     "pooling", "'tokn'", "token"),
    ("vit dtype", lambda: _vit(dtype="flaot32"), "dtype", "'flaot32'",
     "float32"),
    ("vit gelu", lambda: _vit(gelu="tahn"), "gelu", "'tahn'", "tanh"),
    ("export format", lambda: keras_vit.export.export(
        _tiny_model(), "m.onnx", format="onx"), "format", "'onx'", "onnx"),
    ("export quantization", lambda: keras_vit.export.to_onnx(
        _tiny_model(), "m.onnx", quantization="in8"), "quantization",
     "'in8'", "int8"),
    ("vit attention", lambda: _vit(attention="axail"), "attention",
     "'axail'", "axial"),
    ("vit position_embedding", lambda: _vit(position_embedding="learned1d"),
     "position_embedding", "'learned1d'", "learned_1d"),
    ("vit placement", lambda: _vit(position_embedding_placement="every"),
     "position_embedding_placement", "'every'", "every_layer"),
    ("vit num_layers", lambda: _vit(num_layers=-1), "num_layers", "-1",
     "a non-negative integer"),
    ("vit hidden_size", lambda: _vit(hidden_size=2.5), "hidden_size", "2.5",
     "a positive integer"),
    ("vit dropout_rate", lambda: _vit(dropout_rate=1.5), "dropout_rate",
     "1.5", "[0, 1)"),
    ("vit misspelt keyword", lambda: _vit(num_clases=3), "keyword argument",
     "'num_clases'", "num_classes"),
    ("resnet_v2 pooling", lambda: keras_vit.models.resnet_v2(
        32, (1, 1, 1, 1), 0.5, 10, include_top=False, pooling="average"),
     "pooling", "'average'", "avg"),
    ("zoo.load name", lambda: zoo.load("ViT-Bx/16", weights=None),
     "name", "'ViT-Bx/16'", "Did you mean"),
    ("zoo.load weights tag", lambda: zoo.load(
        "ViT-B/16", weights="imagenet21", image_size=32),
     "weights", "'imagenet21'", "imagenet21k"),
    ("zoo.load image_size", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=0), "image_size", "0",
     "positive"),
    ("zoo.load num_classes", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=32, num_classes=0),
     "num_classes", "0", "a positive integer"),
    ("zoo.load keyword", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=32, include_tp=False),
     "keyword argument", "'include_tp'", "include_top"),
    ("zoo.load BiT keyword", lambda: zoo.load(
        "BiT-M-R50x1", weights=None, image_size=32, num_clases=3),
     "keyword argument", "'num_clases'", "num_classes"),
    ("zoo.labels", lambda: zoo.labels("imagenet2021"), "name",
     "'imagenet2021'", "imagenet2012"),
    ("zoo.info", lambda: zoo.info("ViT-L/61x"), "name", "'ViT-L/61x'",
     "Did you mean"),
    ("preprocess_input image_size", lambda: zoo.preprocess_input(
        np.zeros((8, 8, 3)), 0), "image_size", "0", None),
    ("decode_predictions top", lambda: zoo.decode_predictions(
        np.zeros((1, 10)), top=0), "top", "0", None),
    ("save_npz to a folder", lambda: zoo.save_npz(_tiny_model(), "."),
     "path", "'.'", "weights.npz"),
    ("recipe name", lambda: kt.recipes.get("fintune"), "recipe",
     "'fintune'", "finetune"),
    ("recipe field", lambda: kt.recipes.get("finetune", learning_rat=1.0),
     "field", "'learning_rat'", "did you mean 'learning_rate'"),
    ("recipe optimizer", lambda: kt.recipes.get("finetune", optimizer="adm"),
     "optimizer", "'adm'", "adam"),
    ("recipe schedule", lambda: kt.recipes.get("finetune",
                                               schedule="cosin"),
     "schedule", "'cosin'", "cosine"),
    ("recipe precision", lambda: kt.recipes.get(
        "finetune", precision="mixed_bfloat"), "precision",
     "'mixed_bfloat'", "mixed_bfloat16"),
    ("recipe classifier", lambda: kt.recipes.get("finetune",
                                                 classifier="gpa"),
     "classifier", "'gpa'", "gap"),
    ("recipe learning_rate", lambda: kt.recipes.get(
        "finetune", learning_rate=-1.0), "learning_rate", "-1.0",
     "(0.0, inf)"),
    ("recipe label_smoothing", lambda: kt.recipes.get(
        "finetune", label_smoothing=2.0), "label_smoothing", "2.0",
     "[0.0, 1.0)"),
    ("recipe batch_size", lambda: kt.recipes.get("finetune", batch_size=0),
     "batch_size", "0", "a positive integer"),
    ("strategy", lambda: kt.strategy("mirored"), "strategy", "'mirored'",
     "mirrored"),
    ("load_data", lambda: kt.load_data("digit"), "data", "'digit'",
     "digits"),
    ("mpp target", lambda: kt.mpp.check_target("mean-colour"), "target",
     "'mean-colour'", "mean_color"),
    ("mpp objective", lambda: kt.mpp.check_objective("mppp"), "objective",
     "'mppp'", "mpp"),
    ("fewshot l2_reg", lambda: kt.fit_least_squares(
        np.zeros((4, 2)), np.zeros(4, int), 2, l2_reg=-1.0), "l2_reg",
     "-1.0", None),
    ("feature_model outputs", lambda: keras_vit.models.feature_model(
        _tiny_model(), "tokns"), "outputs", "'tokns'", "tokens"),
    ("rollout head_fusion", lambda: analysis.attention_rollout(
        np.zeros((1, 1, 2, 5, 5)), head_fusion="maen"), "head_fusion",
     "'maen'", "mean"),
    ("download timeout", lambda: zoo.download.fetch(
        "http://127.0.0.1:9/x.npz", timeout=-1), "timeout", "-1", "(0, inf)"),
]


def _check(message, name, echoed, hint):
    assert name in message, message
    assert echoed in message, message
    if hint is None:
        return
    if hint.startswith(("Did you", "did you")) or any(
            c in hint for c in " ([.") or hint == "positive":
        assert hint in message, message
    else:
        assert f"Did you mean {hint!r}" in message, message


@pytest.mark.parametrize("label, call, name, echoed, hint", PYTHON_API,
                         ids=[row[0] for row in PYTHON_API])
def test_python_api_errors_name_echo_and_suggest(label, call, name, echoed,
                                                 hint):
    with pytest.raises((ValueError, TypeError, OSError)) as info:
        call()
    _check(str(info.value), name, echoed, hint)


ENVIRONMENT = [
    ("KERAS_VIT_OFFLINE", "ture", lambda: download.is_offline(), "true"),
    ("KERAS_VIT_ACCELERATOR", "gpuu",
     lambda: keras_vit.runtime.hardware.detect(), "gpu"),
    ("KERAS_VIT_MIRROR", "ftp://mirror/",
     lambda: download.resolve_url("gs://vit_models/x.npz"), None),
]


@pytest.mark.parametrize("variable, value, call, hint", ENVIRONMENT,
                         ids=[row[0] for row in ENVIRONMENT])
def test_environment_variables_name_echo_and_suggest(monkeypatch, variable,
                                                     value, call, hint):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        call()
    _check(str(info.value), variable, repr(value), hint)


# The command line: argv, what the one line must contain.
COMMAND_LINE = [
    (["fine-tun", "x"], ["'fine-tun'", "Did you mean 'fine-tune'"]),
    (["list", "--jsn"], ["--jsn", "Did you mean '--json'"]),
    (["info", "ViT-B/16x"], ["'ViT-B/16x'", "Did you mean"]),
    (["predict", "ViT-B/16", "x.png", "--top", "0"], ["--top", "0"]),
    (["export", "m", "--format", "tflit", "-o", "x"],
     ["--format", "'tflit'", "Did you mean 'tflite'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--bach-size", "4"],
     ["--bach-size", "Did you mean '--batch-size'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--batch-size", "0"],
     ["--batch-size", "0"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--recipe", "fintune"],
     ["recipe='fintune'", "Did you mean 'finetune'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--strategy",
      "mirored"], ["strategy='mirored'", "Did you mean 'mirrored'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--precision",
      "float23"], ["precision='float23'", "Did you mean 'float32'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--set",
      "learning_rat=0.1"], ["'learning_rat'", "'learning_rate'"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--seed", "-3"],
     ["seed=-3", "non-negative"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--ema", "1.5"],
     ["ema_decay=1.5"]),
    (["pretrain", "ViT-Ti/16", "--data", "digits", "--target", "mean-colr"],
     ["target='mean-colr'", "Did you mean 'mean_color'"]),
    (["pretrain", "ViT-Ti/16", "--data", "digits", "--recipe", "mp"],
     ["recipe='mp'", "Did you mean 'mpp'"]),
    (["evaluate", "ViT-Ti/16", "--data", "digit"],
     ["data='digit'", "Did you mean 'digits'"]),
    (["vtab", "ViT-Ti/16", "--tasks", "cifar1000"],
     ["'cifar1000'", "Did you mean"]),
]


@pytest.mark.parametrize("argv, needles", COMMAND_LINE,
                         ids=[" ".join(row[0][:2] + row[0][-2:])
                              for row in COMMAND_LINE])
def test_command_line_errors_are_one_line_exit_2(capsys, tmp_path, argv,
                                                 needles):
    if argv[0] in ("fine-tune", "pretrain"):
        argv = argv + ["--out", str(tmp_path / "run")]
    if argv[0] == "vtab":
        argv = argv + ["--out", str(tmp_path / "vtab")]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert lines[0].startswith("keras-vit")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_environment_variable_through_the_command_line(monkeypatch, capsys,
                                                       tmp_path):
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path))
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "ture")
    assert cli.main(["convert", "imagenet21k", "-m", "ViT-B/16", "-o",
                     str(tmp_path / "m.keras")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "KERAS_VIT_OFFLINE='ture'" in err and "Did you mean 'true'" in err


def test_the_checks_share_one_helper():
    # One place for argument checks (keras_vit.base.checks): the helpers' own
    # contract.
    assert checks.closest("vitb16", ["ViT-B/16", "ViT-B/32"]) == ["ViT-B/16"]
    assert checks.check_choice("x", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"x must be one of \('a', 'b'\); "
                                         r"received x=\['a'\]\.$"):
        checks.check_choice("x", ["a"], ("a", "b"))
    assert checks.check_int("n", np.int64(3), low=1) == 3
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match=f"received n={bad!r}"):
            checks.check_int("n", bad, low=1)
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="must be a number in"):
            checks.check_number("p", bad, low=0, high=1)
    with pytest.raises(kt.StrategyError):
        checks.check_choice("strategy", "x", ("auto",),
                            error=kt.StrategyError)


@pytest.mark.parametrize("builder", ["vit", "axial_vit"])
def test_a_position_table_that_cannot_fit_is_refused_before_building(
        builder):
    # image_size=10**6 asked for a 3.9e9-token table (233 GiB here), which
    # both encoder models tried to allocate; the shared encoder check now
    # counts it, naming the image size.
    with pytest.raises(ValueError, match=r"image_size=1000000 \(3,906,250,"
                                         r"00[01] tokens of position "
                                         r"embedding\).*GiB of weights"):
        getattr(keras_vit, builder)(10**6, 16, 32, 1, 2, 64, 3)
