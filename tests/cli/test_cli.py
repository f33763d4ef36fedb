"""The ``keras-vit`` command line, in-process (``main``) and as a process.

Checkpoints are random ones in the official layout (tests/official.py); no
test goes online.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import official
from testkit import fifo as _fifo
from testkit import odd_image as _odd_image
from testkit import one_error_line as _one_error_line
from testkit import tiny as _tiny

import keras
from keras_vit import cli, zoo

TI = dict(patch=16, hidden=192, layers=12, heads=3, mlp=768)
# "   1  0.0145  pizza, pizza pie  [963 n07873807]"
TOP_LINE = re.compile(r"^\s+(\d+)\s+([0-9.]+)\s+(.+?)\s+\[(\d+)(?: (n\d+))?\]$")


def _error_lines(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("keras-vit: error:")]


def _run(*args):
    """``keras-vit ARGS`` as a subprocess, offline."""
    env = dict(os.environ, KERAS_VIT_OFFLINE="1")
    return subprocess.run(list(args), capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def ti_1000(tmp_path_factory):
    """A ViT-Ti/16 checkpoint at 32x32 (2x2 grid) with a 1000-class head."""
    path = tmp_path_factory.mktemp("ckpt") / "ti_1000.npz"
    return official.write(path, official.vit_arrays(
        **TI, grid=2, num_classes=1000, seed=3))


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    """A random 45x61 RGBA PNG (not the model's size nor RGB on purpose)."""
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "noise.png"
    pixels = np.random.default_rng(5).integers(0, 256, (45, 61, 4), "uint8")
    Image.fromarray(pixels, "RGBA").save(path)
    return str(path)


def _reference_input(path, size):
    """The documented preprocessing, written independently of the CLI."""
    import tensorflow as tf
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"), "float32")
    x = tf.image.resize(rgb[None], (size, size), method="bilinear").numpy()
    return (x - 127.5) / 127.5


def _softmax(z):
    z = np.asarray(z, "float64") - np.max(z, axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------
# list / info / errors


def test_list_shows_every_model_with_its_tags(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for name in zoo.list_models():
        assert name in lines
    meta = zoo.info("ViT-B/16")
    for tag in meta["weights"]:
        assert re.search(rf"(^|\s){re.escape(tag)}\*? \(", lines["ViT-B/16"])
    assert f"{meta['default_weights']}*" in lines["ViT-B/16"]


def test_list_filters(capsys):
    assert cli.main(["list", "b16"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:-1]]
    assert "ViT-B/16" in names and "ViT-S/16" not in names
    assert cli.main(["list", "ViT-S*"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:-1]]
    assert names == zoo.list_models("ViT-S*")
    assert cli.main(["list", "nothing-like-this"]) == 2
    assert _error_lines(capsys.readouterr().err)


def test_info_json_and_text(capsys):
    assert cli.main(["info", "vit-b16", "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["name"] == "ViT-B/16"
    assert meta["config"]["hidden_size"] == 768
    assert meta == json.loads(json.dumps(zoo.info("ViT-B/16")))
    assert cli.main(["info", "ViT-B/16"]) == 0
    out = capsys.readouterr().out
    assert "hidden_size=768" in out and "imagenet21k+imagenet2012" in out
    # Counted for what zoo.load builds by default: the 384 px fine-tuned
    # weights (86,567,656 at 224 + 380 more position rows of 768).
    assert "parameters:     86,859,496 (at 384 px, 1000 classes)" in out
    assert meta["parameters"] == {"count": 86_859_496, "image_size": 384,
                                  "num_classes": 1000,
                                  "representation_size": None}


def test_unknown_name_is_one_clean_line(capsys):
    assert cli.main(["info", "ViT-B/16x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-vit: error:")
    assert "Did you mean" in lines[0] and "'ViT-B/16'" in lines[0]


def test_usage_errors_and_help(capsys):
    assert cli.main([]) == 2
    assert cli.main(["predict", "ViT-B/16", "img.png", "--top", "0"]) == 2
    assert "--top" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    assert "predict" in capsys.readouterr().out


def test_console_script_unknown_name_exits_2():
    proc = _run("keras-vit", "info", "ViT-Q/16")
    assert proc.returncode == 2
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "Did you mean" in errors[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_python_m_lists_models():
    proc = _run(sys.executable, "-m", "keras_vit.cli", "list", "ViT-B*")
    assert proc.returncode == 0, proc.stderr
    names = [ln.split()[0] for ln in proc.stdout.splitlines()[1:-1]]
    assert names == zoo.list_models("ViT-B*")


# --------------------------------------------------------------------------
# convert


def test_convert_at_another_resolution_matches_zoo_load(tmp_path, ti_1000,
                                                        capsys):
    out = tmp_path / "ti48.keras"
    assert cli.main(["convert", str(ti_1000), "--model", "ViT-Ti/16",
                     "--image-size", "48", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resized from 2x2 to 3x3" in printed
    assert "48x48" in printed and "from the checkpoint" in printed
    assert sorted(os.listdir(tmp_path)) == ["ti48.keras"]  # no partial file

    loaded = keras.saving.load_model(out)
    reference = zoo.load("ViT-Ti/16", weights=str(ti_1000), image_size=48)
    assert f"{reference.count_params():,}" in printed
    x = np.random.default_rng(0).uniform(-1, 1, (2, 48, 48, 3))
    x = x.astype("float32")
    got = np.asarray(loaded(x, training=False))
    want = np.asarray(reference(x, training=False))
    assert got.shape == (2, 1000)
    np.testing.assert_array_equal(got, want)
    # The checkpoint's position embeddings really were interpolated.
    posemb = loaded.get_layer("position_embedding").pos_embedding.numpy()
    assert posemb.shape == (1, 10, 192)


def test_convert_with_a_new_head(tmp_path, ti_1000, capsys):
    out = tmp_path / "models" / "v1" / "ti7.keras"  # folders created
    assert cli.main(["convert", str(ti_1000), "-m", "ViT-Ti/16",
                     "--num-classes", "7", "-o", str(out)]) == 0
    assert "zero-initialised" in capsys.readouterr().out
    loaded = keras.saving.load_model(out)
    kernel = loaded.get_layer("head").kernel.numpy()
    assert kernel.shape == (192, 7) and not kernel.any()


def test_convert_wrong_architecture_fails_cleanly(tmp_path, capsys):
    # A checkpoint of another architecture (hidden 32, 2 blocks, patch 8).
    ckpt = official.write(tmp_path / "tiny.npz", official.vit_arrays(
        patch=8, hidden=32, layers=2, heads=4, mlp=64, grid=4,
        num_classes=10))
    out = tmp_path / "out.keras"
    assert cli.main(["convert", str(ckpt), "--model", "ViT-Ti/16",
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("keras-vit: error:")
    assert "tiny.npz" in err[0] and "does not fit" in err[0]
    assert sorted(os.listdir(tmp_path)) == ["tiny.npz"]


def test_convert_argument_errors(tmp_path, ti_1000, capsys):
    missing = tmp_path / "missing.npz"
    assert cli.main(["convert", str(missing), "-m", "ViT-Ti/16",
                     "-o", str(tmp_path / "a.keras")]) == 2
    assert "missing.npz" in capsys.readouterr().err
    assert cli.main(["convert", str(ti_1000), "-m", "ViT-Ti/16",
                     "-o", str(tmp_path / "a.h5")]) == 2
    assert ".keras" in capsys.readouterr().err
    # 40 is not a multiple of the patch size 16: the builder's ValueError.
    assert cli.main(["convert", str(ti_1000), "-m", "ViT-Ti/16",
                     "--image-size", "40", "-o", str(tmp_path / "a.keras")]) == 2
    assert "divisible" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    (tmp_path / "notes").write_text("a file in the way of a folder")
    assert cli.main(["convert", str(ti_1000), "-m", "ViT-Ti/16",
                     "-o", str(tmp_path / "notes" / "a.keras")]) == 2
    assert "notes' is a file, not a folder" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["notes"]


# --------------------------------------------------------------------------
# predict


def test_predict_top5_with_imagenet_labels(ti_1000, image_path, capsys):
    assert cli.main(["predict", "ViT-Ti/16", image_path,
                     "--weights", str(ti_1000)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(image_path) and "imagenet2012" in lines[0]
    rows = [TOP_LINE.match(ln) for ln in lines[1:]]
    assert len(rows) == 5 and all(rows), lines
    labels = zoo.labels("imagenet2012")
    probs = [float(r.group(2)) for r in rows]
    assert probs == sorted(probs, reverse=True)
    for r in rows:
        idx = int(r.group(4))
        assert (r.group(5), r.group(3)) == labels[idx]

    # Independent computation: the model, the documented preprocessing.
    model = zoo.load("ViT-Ti/16", weights=str(ti_1000))
    p = _softmax(model.predict(_reference_input(image_path, 32), verbose=0))[0]
    assert int(rows[0].group(4)) == int(np.argmax(p))
    assert abs(probs[0] - p.max()) < 1e-4

    assert cli.main(["predict", "ViT-Ti/16", image_path, image_path,
                     "--weights", str(ti_1000), "--top", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["labels"] == "imagenet2012"
    assert result["image_size"] == [32, 32]
    assert len(result["predictions"]) == 2
    for pred in result["predictions"]:
        assert [t["index"] for t in pred["top"]] == list(np.argsort(-p)[:3])
        np.testing.assert_allclose([t["probability"] for t in pred["top"]],
                                   np.sort(p)[::-1][:3], atol=1e-5)


def test_predict_from_a_keras_file(tmp_path, ti_1000, image_path, capsys):
    model = zoo.load("ViT-Ti/16", weights=str(ti_1000), num_classes=10)
    # Give the new head a non-zero kernel so the ranking means something.
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(
        size=head.kernel.shape).astype("float32"))
    path = tmp_path / "ti10.keras"
    model.save(path)
    assert cli.main(["predict", str(path), image_path, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["labels"] is None  # 10 classes: indices, no label list
    p = _softmax(model.predict(_reference_input(image_path, 32), verbose=0))[0]
    top = result["predictions"][0]["top"]
    assert [t["index"] for t in top] == list(np.argsort(-p)[:5])
    assert top[0]["label"] == f"class {top[0]['index']}"


def test_predict_errors(tmp_path, ti_1000, image_path, capsys):
    assert cli.main(["predict", "ViT-Ti/16", str(tmp_path / "no.png"),
                     "--weights", str(ti_1000)]) == 2
    assert "no.png' does not exist" in capsys.readouterr().err
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    assert cli.main(["predict", "ViT-Ti/16", str(not_image),
                     "--weights", str(ti_1000)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.png" in err[0]
    assert cli.main(["predict", str(ti_1000), image_path]) == 2
    assert "--weights" in capsys.readouterr().err


def test_missing_optional_package_is_one_line_exit_2(monkeypatch, capsys):
    """A missing optional package prints its name and the pip command."""
    from keras_vit import cli
    from keras_vit.base.errors import MissingDependencyError

    def fails(args):
        raise MissingDependencyError("tf2onnx", "ONNX export")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    args = parser.parse_args(["list"])
    monkeypatch.setattr(args, "func", fails, raising=False)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("keras-vit: error: ONNX export needs the package "
                           "'tf2onnx', which is not installed: pip install "
                           "'tf2onnx'")


def test_warnings_print_one_line_without_source_paths(capsys):
    import warnings

    from keras_vit.cli import options

    def warns(args):
        # Raised by the package's own code (only that is labelled keras-vit:
        # tests/cli/test_options.py), as keras_vit.train.recipes does.
        exec("warnings.warn(\"the recipe's warmup_steps=250 do not fit a "
             "run\\n  of total_steps=30\", UserWarning, stacklevel=2)",
             {"__name__": "keras_vit.train.recipes", "warnings": warnings})
        return 0

    parser, sub = options.commands_parser("keras-vit", "test")
    options.command(sub, "go", warns, help="warn once")
    before = warnings.showwarning
    assert options.main(parser, ["go"]) == 0
    err = capsys.readouterr().err
    assert err == ("keras-vit: warning: the recipe's warmup_steps=250 do not "
                   "fit a run of total_steps=30\n")
    assert warnings.showwarning is before  # only during the command


# ---------------------------------------------------------------------------
# Hostile files, paths, images and settings given to predict and convert.
# Each case fails in one line naming what is wrong, or works.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind, status, needle", [
    ("text", 2, "(12 bytes) is not a JPEG, PNG, GIF, BMP or WebP file"),
    ("empty", 2, "is empty"),
    ("folder", 2, "is a folder with no image files"),
    ("gray16", 0, None), ("rgba", 0, None), ("cmyk", 0, None),
    ("palette", 0, None), ("one_pixel", 0, None),
])
def test_predict_on_odd_images(tiny_keras, tmp_path, capsys, kind, status,
                               needle):
    from keras_vit import cli

    image = tmp_path / f"{kind}.png"
    _odd_image(image, kind)
    assert cli.main(["predict", str(tiny_keras), str(image), "--json"]) == (
        status)
    if needle:
        assert needle in _one_error_line(capsys)
    else:
        import json

        out = json.loads(capsys.readouterr().out)
        (pred,) = out["predictions"]
        # tiny()'s head is zero-initialised: the same scores for every
        # image, so no ranking, and the reason instead.
        assert pred["top"] == [] and "all zeros" in pred["no_ranking"]


def test_predict_takes_folders_and_globs_and_spares_the_good_images(
        tiny_keras, tmp_path, capsys):
    """Folders (recursively) and glob patterns expand to their images;
    a file that cannot be read is named on its own line and the others
    are predicted, and the exit status says something failed."""
    import json

    from keras_vit import cli

    photos = tmp_path / "photos"
    (photos / "more").mkdir(parents=True)
    for name in ("a.png", "more/b.png", "c.png"):
        _odd_image(photos / name, "rgba")
    _odd_image(photos / "more" / "broken.png", "text")
    (photos / "notes.txt").write_text("not an image")  # not by extension
    status = cli.main(["predict", str(tiny_keras), str(photos), "--json"])
    captured = capsys.readouterr()
    assert status == 1
    out = json.loads(captured.out)
    assert [p["image"] for p in out["predictions"]] == [
        str(photos / n) for n in ("a.png", "c.png", "more/b.png")]
    assert [f["image"] for f in out["failed"]] == [
        str(photos / "more" / "broken.png")]
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and "broken.png" in errors[0], errors
    # A glob, quoted as a shell would pass it unexpanded; ** spans folders.
    assert cli.main(["predict", str(tiny_keras),
                     str(photos / "**" / "[ab].png"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["image"] for p in out["predictions"]] == [
        str(photos / "a.png"), str(photos / "more" / "b.png")]
    assert out["failed"] == []
    # A pattern that matches nothing stops before the model loads.
    assert cli.main(["predict", str(tiny_keras),
                     str(photos / "*.jpeg")]) == 2
    assert "*.jpeg' matches no file" in _one_error_line(capsys)


def test_unicode_paths_round_trip(tmp_path, capsys):
    from keras_vit import cli, zoo

    folder = tmp_path / "modèles 模型"
    model = _tiny()
    path = zoo.save_npz(model, folder / "vit ü.npz")
    other = _tiny(seed=2)
    zoo.load_weights(other, path)
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)
    keras_file = folder / "vit ü.keras"
    model.save(keras_file)
    image = folder / "图像 é.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(keras_file), str(image)]) == 0
    assert str(image) in capsys.readouterr().out


def test_predict_names_a_fifo_and_a_missing_image(tiny_keras, tmp_path,
                                                   capsys):
    from keras_vit import analysis, cli

    fifo = _fifo(tmp_path / "x.png")
    assert cli.main(["predict", str(tiny_keras), str(fifo)]) == 2
    assert (f"IMAGE={str(fifo)!r} is a FIFO (named pipe), not a regular "
            "file") in _one_error_line(capsys)
    assert cli.main(["predict", str(tiny_keras), str(tmp_path / "no.png")]
                    ) == 2
    assert "no.png' does not exist" in _one_error_line(capsys)
    with pytest.raises(ValueError, match="is a FIFO"):
        analysis.load_images([str(fifo)], 8)


def test_predict_on_a_run_directory_and_a_missing_path(tiny_keras, tmp_path,
                                                       capsys):
    import json
    import shutil

    from keras_vit import cli

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_keras, run / "model.keras")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(run), str(image), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "run" and len(out["predictions"]) == 1
    for missing in (tmp_path / "nope", "./nope-x"):
        assert cli.main(["predict", str(missing), str(image)]) == 2
        assert (f"MODEL={str(missing)!r} does not exist"
                in _one_error_line(capsys))


@pytest.fixture(scope="module")
def hostile_labels_repo(tmp_path_factory):
    from keras_vit import zoo

    model = zoo.load("ViT-Ti/16", weights=None, image_size=32,
                     num_classes=3, gelu="exact")
    # A trained head (a zero one ranks nothing, and prints no labels).
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(2).normal(
        size=head.kernel.shape).astype("float32"))
    import pathlib

    return pathlib.Path(zoo.save_pretrained(
        model, tmp_path_factory.mktemp("hub") / "repo",
        labels=["tabby\ncat", "\x1b[31mred", "\u202eevil"]))


def test_labels_from_a_repository_are_printed_escaped(hostile_labels_repo,
                                                      tmp_path, capsys):
    from keras_vit import cli

    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(hostile_labels_repo), str(image),
                     "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert len(out.strip().splitlines()) == 4  # a header, three labels
    for shown in (r"tabby\ncat", r"\x1b[31mred", r"\u202eevil"):
        assert shown in out


def test_hostile_repository_files_exit_2_with_one_line(hostile_labels_repo,
                                                       tmp_path, capsys):
    import shutil

    from keras_vit import cli

    repo = tmp_path / "repo"
    shutil.copytree(hostile_labels_repo, repo)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    (repo / "config.json").write_text('{"architecture": ["vit"]}')
    assert cli.main(["predict", str(repo), str(image)]) == 2
    assert "config.json field architecture: expected a string" in (
        _one_error_line(capsys))
    shutil.copy(hostile_labels_repo / "config.json", repo)
    data = (repo / "model.safetensors").read_bytes()
    (repo / "model.safetensors").write_bytes(data[:len(data) // 2])
    assert cli.main(["predict", str(repo), str(image)]) == 2
    line = _one_error_line(capsys)
    assert "model.safetensors field " in line and "(truncated?)" in line


def test_predict_refuses_nan_weights(tmp_path, capsys):
    from keras_vit import cli

    model = _tiny()
    weights = model.get_weights()
    weights[0] = np.full_like(weights[0], np.nan)
    model.set_weights(weights)
    path = tmp_path / "nan.keras"
    model.save(path)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(path), str(image)]) == 2
    line = _one_error_line(capsys)
    assert "gives non-finite outputs (NaN or inf) for 1 of 1 image(s)" in line
