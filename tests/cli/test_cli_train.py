"""keras_vit.cli.train, the training commands (fine-tune, pretrain,
evaluate): a step that cannot fit memory is refused saying what to change,
bad settings before any work, and names read from the disk are printed
escaped."""

import re
import time

import pytest

from testkit import class_folders as _class_folders
from testkit import one_error_line as _one_error_line
from testkit import tiny as _tiny
import keras_vit
from keras_vit.models.memory import step_memory_estimate


def test_a_step_that_cannot_fit_memory_says_what_to_change(
        tmp_path, monkeypatch, capsys):
    from keras_vit.cli import train as train_cli

    # The audit's case: ViT-Ti/16 at the fine-tune recipe's 384 px and
    # batch 512 needs far more than a 24 GB machine (~150 GiB estimated).
    model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=384,
                               num_classes=10)
    assert step_memory_estimate(model, 512) > 100 * 2**30
    assert step_memory_estimate(model, 16) < 8 * 2**30
    path = tmp_path / "tiny.keras"
    _tiny().save(path)
    monkeypatch.setattr(keras_vit.models.memory, "available_memory", lambda: 2**20)
    argv = ["fine-tune", str(path), "--data", "digits", "--batch-size", "64",
            "--steps", "1", "--warmup-steps", "0", "--no-eval", "--quiet",
            "--out", str(tmp_path / "run")]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "available; set --micro-batch-size" in err
    assert "lower --batch-size (now 64)" in err and "Traceback" not in err


def test_memory_check_is_for_host_memory_only(monkeypatch):
    import types

    from keras_vit.cli import train as train_cli

    model = _tiny()
    trainer = types.SimpleNamespace(
        trained_model=lambda: model, micro=64, per_replica=64,
        recipe=types.SimpleNamespace(image_size=16, batch_size=64))
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    with pytest.raises(ValueError, match="GiB of activations"):
        train_cli.check_fits_memory(trainer, available=2**16)
    # On an accelerator (asked of the current Keras backend, or forced as
    # here) host memory does not hold the activations: no refusal.
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "gpu")
    assert train_cli.check_fits_memory(trainer, available=2**16) is None


def test_pretrain_refuses_a_step_that_cannot_fit_memory(
        tmp_path, monkeypatch, capsys):
    from keras_vit.cli import train as train_cli
    from keras_vit.train import mpp

    path = tmp_path / "tiny.keras"
    _tiny().save(path)
    per_image = step_memory_estimate(
        mpp.MaskedPatchPrediction(_tiny()), 1)
    available = 2**20
    monkeypatch.setattr(keras_vit.models.memory, "available_memory", lambda: available)
    argv = ["pretrain", str(path), "--data", "digits", "--batch-size", "64",
            "--image-size", "16", "--steps", "1", "--warmup-steps", "0",
            "--quiet", "--strategy", "default", "--out", str(tmp_path / "r")]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    micro = int(re.search(r"set --micro-batch-size (\d+)", err).group(1))
    assert 64 % micro == 0 and micro * per_image <= available / 2
    assert (micro * 2 * per_image > available / 2
            or 64 % (micro * 2) != 0)  # the largest that fits
    assert "lower --batch-size (now 64)" in err
    assert not (tmp_path / "r" / "model.keras").exists()


def test_settings_refused_before_any_work(tmp_path, capsys):
    from keras_vit.cli import train as train_cli

    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["fine-tune", "ViT-Ti/16", "--data", "digits"]
    start = time.monotonic()
    for extra, needle in (
            (["--set", "crop_area=abc", "--out", str(tmp_path / "r")],
             "crop_area must be numbers separated by commas; received "
             "crop_area='abc'"),
            (["--out", str(afile)], "is a file; the run needs a folder"),
            (["--out", str(afile / "runs" / "r")],
             "afile' is a file, not a folder")):
        assert train_cli.main(base + extra) == 2
        assert needle in _one_error_line(capsys)
    # Refused before the model was built or the data read.
    assert time.monotonic() - start < 10


def test_evaluate_prints_names_from_the_disk_escaped(tmp_path, capsys):
    """A data folder named with a newline and an ANSI escape is one line of
    output, the control characters shown escaped (no name read from the
    disk can forge or hide a line of output)."""
    from keras_vit.cli import train as train_cli

    model = tmp_path / "tiny.keras"
    _tiny(num_classes=2).save(model)
    root = _class_folders(tmp_path / "bad\nname\x1b[31m", 4)
    status = train_cli.main(["evaluate", str(model), "--data", str(root),
                             "--batch-size", "4"])
    out = capsys.readouterr().out
    assert status == 0
    line = next(x for x in out.splitlines() if "top-1 accuracy" in x)
    assert "bad\\nname\\x1b[31m" in line and "\x1b" not in out


def test_quiet_hides_the_progress_and_keeps_the_final_line(tmp_path, capsys):
    """--quiet says it hides the progress: the run's last line (its
    metrics) still prints, and nothing before it."""
    from keras_vit.cli import train as train_cli

    path = tmp_path / "tiny.keras"
    _tiny().save(path)
    argv = ["fine-tune", str(path), "--data", "digits", "--batch-size", "8",
            "--steps", "2", "--warmup-steps", "0", "--image-size", "16",
            "--quiet", "--strategy", "default", "--out", str(tmp_path / "r")]
    assert train_cli.main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert [ln.split(":")[0] for ln in lines if ln.startswith("done")] == [
        "done"]
    assert lines[-1].startswith("done: step 2, train loss "), lines
    assert "eval accuracy" in lines[-1]
    assert not any(ln.startswith("step ") for ln in lines), lines
