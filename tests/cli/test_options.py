"""keras_vit.cli.options: what every keras-vit command shares. A failure is
one line, never a traceback (exit 2 for bad input, 1 for a failure) unless
--debug; a misspelt command or option suggests the valid one; the counts
and sizes a user gives are bounded before any work."""

import time

import pytest

from testkit import one_error_line as _one_error_line
from keras_vit import cli


@pytest.mark.parametrize("error, status, text", [
    (RuntimeError("kaboom"), 1, "RuntimeError: kaboom (an unexpected"),
    (KeyError("weights"), 1, "KeyError: 'weights'"),
    (MemoryError(), 1, "out of memory (MemoryError). Lower --batch-size"),
    (ValueError("bad --lr"), 2, "error: bad --lr"),
    (FileNotFoundError("no such file"), 2, "error: no such file"),
])
def test_cli_turns_every_error_into_one_line(monkeypatch, capsys, error,
                                             status, text):
    from keras_vit import cli

    def fail(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_list", fail)
    assert cli.main(["list"]) == status
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    for argv in (["list", "--debug"], ["--debug", "list"]):
        with pytest.raises(type(error)):
            cli.main(argv)


# The command line: argv, what the one line must contain.
COMMAND_LINE = [
    (["fine-tun", "x"], ["'fine-tun'", "Did you mean 'fine-tune'"]),
    (["list", "--famly", "vit"], ["--famly", "Did you mean '--family'"]),
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
     ["--seed=-3", "[0, 4294967295]"]),
    (["fine-tune", "ViT-Ti/16", "--data", "digits", "--ema", "1.5"],
     ["--ema=1.5", "[0, 1]"]),
    (["pretrain", "ViT-Ti/16", "--data", "digits", "--target", "mean-colr"],
     ["target='mean-colr'", "Did you mean 'mean_color'"]),
    (["pretrain", "ViT-Ti/16", "--data", "digits", "--recipe", "mp"],
     ["recipe='mp'", "Did you mean 'mpp'"]),
    (["evaluate", "ViT-Ti/16", "--data", "digit"],
     ["data='digit'", "Did you mean 'digits'"]),
    (["vtab", "ViT-Ti/16", "--tasks", "cifar1000"],
     ["'cifar1000'", "Did you mean"]),
    # Suggestions come from the command in use, and the line points at
    # that command's help.
    (["predict", "ViT-B/16", "x.png", "--top-k", "2"],
     ["--top-k", "Did you mean '--top'?", "`keras-vit predict --help`"]),
    (["list", "--jsn"], ["--jsn", "`keras-vit list --help`"]),
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


def test_an_option_of_another_command_is_not_suggested(capsys):
    """convert has no --model-option (fine-tune has): the suggestion is
    one of convert's own options, never the option typed."""
    from keras_vit import cli

    assert cli.main(["convert", "x.npz", "-m", "ViT-B/16", "-o", "x.keras",
                     "--model-option", "a=1"]) == 2
    line = capsys.readouterr().err.strip()
    assert "unrecognized arguments: --model-option" in line
    assert "Did you mean '--model-option'" not in line
    assert "Did you mean '--model'?" in line  # convert's nearest
    assert line.endswith("(`keras-vit convert --help` shows the usage)")


@pytest.mark.parametrize("argv, needle", [
    (["fewshot", "ViT-Ti/16", "--data", "digits:train", "--seeds",
      "100000"], "--seeds must be an integer in [1, 1000]; received "
                 "--seeds=100000"),
    (["benchmark", "ViT-Ti/16", "--runs", "100000000"],
     "--runs must be an integer in [1, 1000]; received --runs=100000000"),
])
def test_user_given_counts_are_bounded(capsys, argv, needle):
    from keras_vit import cli

    start = time.monotonic()
    assert cli.main(argv) == 2
    assert needle in _one_error_line(capsys)
    assert time.monotonic() - start < 10  # before the model is built


@pytest.mark.parametrize("argv", [
    ["fine-tune", "ViT-Ti/16", "--data", "digits", "--image-size", "100000"],
    ["predict", "ViT-Ti/16", "x.png", "--image-size", "100000"],
    ["convert", "ViT-Ti/16", "-o", "x.keras", "--image-size", "100000"],
])
def test_image_size_options_are_bounded(capsys, argv):
    from keras_vit import cli

    start = time.monotonic()
    assert cli.main(argv) == 2
    assert ("argument --image-size: must be <= 4096 pixels, got 100000"
            in _one_error_line(capsys))
    assert time.monotonic() - start < 5


# The CLI's warnings: (module raising it, category, stacklevel, the line
# shown or None). stacklevel=2 points the warning's file at the caller (a
# function of the package here), which must not make it the package's.
WARNINGS = [
    ("keras_vit.train.recipes", UserWarning, 2,
     "keras-vit: warning: the message"),
    ("keras_vit.export.labels", DeprecationWarning, 1,
     "keras-vit: warning: the message"),
    ("tensorflow.lite.python.interpreter", UserWarning, 2,
     "warning (tensorflow): the message"),
    ("keras.src.layers.layer", RuntimeWarning, 1,
     "warning (keras): the message"),
    ("tensorflow.python.util.deprecation", DeprecationWarning, 2, None),
    ("keras.src.saving.saving_lib", FutureWarning, 1, None),
]


@pytest.mark.parametrize("module, category, stacklevel, shown", WARNINGS)
def test_only_the_packages_own_warnings_are_labelled_keras_vit(
        capsys, module, category, stacklevel, shown):
    """A warning raised by the package is ``keras-vit: warning: ...``;
    another library's names that library, or is dropped when it is a
    deprecation (about the package's call, which the user cannot change);
    --debug shows them all in Python's format."""
    import warnings

    from keras_vit.cli import options

    def warns(args):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            exec("warnings.warn('the message\\n  ', category, "
                 "stacklevel=stacklevel)",
                 {"__name__": module, "warnings": warnings,
                  "category": category, "stacklevel": stacklevel})
        return 0

    parser, sub = options.commands_parser("keras-vit", "test")
    options.command(sub, "go", warns, help="warn")
    assert options.main(parser, ["go"]) == 0
    err = capsys.readouterr().err
    assert err == ("" if shown is None else shown + "\n")
    with pytest.warns(category, match="the message"):  # Python's own
        assert options.main(parser, ["go", "--debug"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text, decay", [("none", None), ("None", None),
                                         ("off", None), ("0.99", 0.99)])
def test_ema_takes_none_as_its_refusal_offers(text, decay):
    """A decay too long for the run is refused with "set ema_decay (--ema)
    to at most ..., none, or train longer": --ema none turns the recipe's
    average off, and is an explicit choice (not fitted to the run)."""
    from keras_vit.cli.train import _recipe_overrides

    args = cli.build_parser().parse_args(
        ["fine-tune", "ViT-Ti/16", "--data", "digits", "--ema", text])
    assert _recipe_overrides(args)["ema_decay"] == decay
