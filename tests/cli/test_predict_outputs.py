"""What ``keras-vit predict`` gives for every kind of model: a classifier's
class probabilities, a feature extractor's embeddings (DINOv2, SigLIP and
CLIP towers, ``num_classes=0``, ``include_top=False``), the same numbers
on the screen, in ``--json`` and in every ``--out`` format; and help text
that says what the command does.

Each model is a tiny ViT saved as a ``.keras`` file; the expected numbers
come from the model on pixels prepared here, independently of the CLI
(bilinear resize without a crop, then the model's own normalisation).
"""

import csv
import json
import re

import numpy as np
import pytest

from testkit import one_error_line

import keras
import keras_vit
from keras_vit import cli

TINY = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32)
# Not the official [-1, 1]: a path that assumed it would be caught.
MEAN, STD = (0.25, 0.5, 0.75), (0.2, 0.3, 0.4)

# name: builder keywords, how the reference prepares pixels.
HEADLESS = {
    # DINOv2/SigLIP/CLIP towers as the zoo builds them: no head.
    "num_classes_0": (dict(num_classes=0, input_normalization={
        "mean": MEAN, "std": STD}), "mean_std"),
    # A model that normalises [0, 255] pixels itself.
    "raw_pixels": (dict(num_classes=0, include_preprocessing=True), "raw"),
    # The SigLIP shape: no class token, the attention-pool head.
    "map_pool": (dict(num_classes=0, classifier="map", class_token=False,
                      input_normalization="clip"), "clip"),
    # CLIP's towers as timm holds them: the head is the image-text
    # projection (head_type="projection"), its output the embedding.
    "projection": (dict(num_classes=12, head_type="projection",
                        pre_norm=True, input_normalization="clip"), "clip"),
    # include_top=False: the tokens, not a vector.
    "tokens": (dict(num_classes=10, include_top=False), "official"),
}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _reference_input(path, size, how):
    """The documented preprocessing, written independently of the CLI."""
    import tensorflow as tf
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"), "float32")
    x = tf.image.resize(rgb[None], (size, size), method="bilinear").numpy()
    if how == "raw":
        return x
    if how == "official":
        return (x - 127.5) / 127.5
    mean, std = (MEAN, STD) if how == "mean_std" else (CLIP_MEAN, CLIP_STD)
    return (x / 255.0 - np.array(mean)) / np.array(std)


def _softmax(z):
    z = np.asarray(z, "float64") - np.max(z, axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Three PNGs of odd sizes (none the model's), one with alpha."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("img")
    rng = np.random.default_rng(7)
    paths = []
    for i, (h, w, mode) in enumerate([(45, 61, "RGB"), (32, 32, "RGBA"),
                                      (70, 20, "RGB")]):
        path = folder / f"im{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), "uint8"),
                        mode).save(path)
        paths.append(str(path))
    return paths


def _save(model, folder, name):
    path = folder / f"{name}.keras"
    model.save(path)
    return str(path)


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """{name: (.keras path, model, preprocessing)} of HEADLESS."""
    folder = tmp_path_factory.mktemp("headless")
    out = {}
    for name, (kwargs, how) in HEADLESS.items():
        keras.utils.set_random_seed(3)
        model = keras_vit.vit(**TINY, **kwargs)
        out[name] = (_save(model, folder, name), model, how)
    return out


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A 5-class tiny ViT with a random (non-zero) head, as a .keras file."""
    keras.utils.set_random_seed(4)
    model = keras_vit.vit(**TINY, num_classes=5)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(
        size=head.kernel.shape).astype("float32"))
    return _save(model, tmp_path_factory.mktemp("cls"), "cls"), model


def _expected_embeddings(model, paths, how):
    x = np.concatenate([_reference_input(p, 32, how) for p in paths])
    return keras.ops.convert_to_numpy(model(x, training=False))


def _run_json(capsys, *argv):
    assert cli.main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------
# A feature extractor: embeddings, not probabilities


@pytest.mark.parametrize("name", list(HEADLESS))
def test_a_headless_model_gives_its_embeddings(headless, images, name,
                                               capsys):
    path, model, how = headless[name]
    want = _expected_embeddings(model, images, how)
    out = _run_json(capsys, path, *images)
    assert out["output"] == "embedding"
    assert out["shape"] == list(want.shape[1:])
    assert [p["image"] for p in out["predictions"]] == images
    assert all("top" not in p for p in out["predictions"])
    got = np.array([p["embedding"] for p in out["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

    # The screen: one header, then one line per image naming its shape and
    # norm; no class, no probability.
    assert cli.main(["predict", path, *images]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + len(images), lines
    assert "no classification head" in lines[0]
    assert "class" not in "\n".join(lines[1:])
    for line, image, vector in zip(lines[1:], images, want):
        assert line.startswith(f"{image}: ")
        shape = "x".join(map(str, vector.shape))
        assert f" {shape} " in line or f" {vector.size} values" in line
        norm = float(re.search(r"norm ([0-9.]+)", line).group(1))
        assert abs(norm - np.linalg.norm(vector)) < 1e-3
        first = float(re.search(r"\[(-?[0-9.]+)", line).group(1))
        assert abs(first - vector.ravel()[0]) < 1e-4


def test_top_is_refused_for_a_headless_model(headless, images, capsys):
    path = headless["num_classes_0"][0]
    assert cli.main(["predict", path, images[0], "--top", "3"]) == 2
    line = one_error_line(capsys)
    assert "--top 3" in line and "no classification head" in line


# --------------------------------------------------------------------------
# --out: the whole vectors, in the format the file's extension names


def _load(path):
    """(images, vectors, labels) from a file of --out, by its format."""
    if path.endswith(".npz"):
        with np.load(path) as data:
            key = "embeddings" if "embeddings" in data else "probabilities"
            labels = list(data["labels"]) if "labels" in data else None
            return list(data["images"]), data[key], labels
    if path.endswith(".json"):
        with open(path) as f:
            data = json.load(f)
        key = "embeddings" if "embeddings" in data else "probabilities"
        return data["images"], np.array(data[key]), data.get("labels")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert header[0] == "image"
    return ([r[0] for r in body], np.array([[float(v) for v in r[1:]]
                                            for r in body]), header[1:])


@pytest.mark.parametrize("suffix", [".npz", ".json", ".csv"])
def test_out_saves_the_embeddings(headless, images, tmp_path, suffix,
                                  capsys):
    path, model, how = headless["num_classes_0"]
    want = _expected_embeddings(model, images, how)
    dest = tmp_path / "sub" / f"emb{suffix}"
    assert cli.main(["predict", path, *images, "--out", str(dest)]) == 0
    assert str(dest) in capsys.readouterr().out
    names, got, labels = _load(str(dest))
    assert names == images
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    if suffix == ".csv":
        assert labels == [str(i) for i in range(want.shape[1])]


@pytest.mark.parametrize("suffix", [".npz", ".json", ".csv"])
def test_out_saves_a_classifiers_probabilities(classifier, images, tmp_path,
                                               suffix, capsys):
    path, model = classifier
    want = _softmax(_expected_embeddings(model, images, "official"))
    dest = tmp_path / f"probs{suffix}"
    out = _run_json(capsys, path, *images, "--out", str(dest))
    assert out["output"] == "classes"
    names, got, labels = _load(str(dest))
    assert names == images
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert labels == [f"class {i}" for i in range(5)]
    # The file holds what the screen ranks.
    for pred, row in zip(out["predictions"], got):
        assert pred["top"][0]["index"] == int(np.argmax(row))


def test_tokens_refuse_csv_and_keep_their_shape(headless, images, tmp_path,
                                                capsys):
    path, model, how = headless["tokens"]
    want = _expected_embeddings(model, images[:1], how)
    assert want.ndim == 3
    dest = tmp_path / "tokens.npz"
    assert cli.main(["predict", path, images[0], "--out", str(dest)]) == 0
    capsys.readouterr()
    _, got, _ = _load(str(dest))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    dest = tmp_path / "tokens.csv"
    assert cli.main(["predict", path, images[0], "--out", str(dest)]) == 2
    line = one_error_line(capsys)
    assert "tokens.csv" in line and "17x16" in line and ".npz" in line
    assert not dest.exists()


@pytest.mark.parametrize("name, needle", [
    ("x.txt", "'.txt'"), ("x.npy", "'.npy'"), ("x", "no extension"),
])
def test_out_refuses_an_unknown_format_before_the_model_loads(
        tmp_path, images, name, needle, capsys):
    # MODEL does not exist: the format is checked first.
    dest = tmp_path / name
    assert cli.main(["predict", str(tmp_path / "none.keras"), images[0],
                     "--out", str(dest)]) == 2
    line = one_error_line(capsys)
    assert f"--out {str(dest)!r}" in line and needle in line
    assert ".npz, .json or .csv" in line
    assert not dest.exists()


def test_out_refuses_a_folder(tmp_path, images, capsys):
    folder = tmp_path / "emb.npz"
    folder.mkdir()
    assert cli.main(["predict", "ViT-Ti/16", images[0], "--out",
                     str(folder)]) == 2
    assert "is a folder" in one_error_line(capsys)


# --------------------------------------------------------------------------
# A head that cannot rank: its scores do not depend on the image


@pytest.mark.parametrize("bias", [0.0, 1.0])
def test_a_zero_head_prints_no_ranking(tmp_path, images, bias, capsys):
    """A zero-initialised head (a checkpoint without its head, a new head
    before fine-tuning) gives every image the same scores: uniform ones
    with a zero bias, the bias's order with another. Either way the
    command says so instead of ranking classes."""
    keras.utils.set_random_seed(5)
    model = keras_vit.vit(**TINY, num_classes=4)
    head = model.get_layer("head")
    head.bias.assign(np.arange(4, dtype="float32") * bias)
    path = _save(model, tmp_path, "zero")
    out = _run_json(capsys, path, *images)
    for pred in out["predictions"]:
        assert pred["top"] == []
        assert "same scores for every image" in pred["no_ranking"]
    assert cli.main(["predict", path, images[0]]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "no ranking" in lines[1], lines
    # The probabilities are still saved: they are what the model says.
    dest = tmp_path / "p.npz"
    assert cli.main(["predict", path, images[0], "--out", str(dest)]) == 0
    np.testing.assert_allclose(_load(str(dest))[1][0],
                               _softmax(np.arange(4) * bias), atol=1e-6)


def test_a_trained_head_still_ranks(classifier, images, capsys):
    path, model = classifier
    out = _run_json(capsys, path, images[0], "--top", "5")
    (pred,) = out["predictions"]
    assert pred["no_ranking"] is None and len(pred["top"]) == 5


# --------------------------------------------------------------------------
# Every input geometry a model can have

# name: builder keywords, more predict arguments, the (height, width) images
# are resized to (None: NaFlex, each image within the model's patches).
GEOMETRIES = {
    "square": (dict(), [], (32, 32)),
    "non_square": (dict(image_size=(32, 48)), [], (32, 48)),
    # DINOv3's shape: inputs of any size; predict takes the built size.
    "dynamic": (dict(image_size=(32, 48), dynamic_image_size=True), [],
                (32, 48)),
    "dynamic_image_size_option": (dict(dynamic_image_size=True),
                                  ["--image-size", "48"], (48, 48)),
    "naflex": (dict(naflex=True, classifier="map", class_token=False), [],
               None),
}


def _geometry_input(model, path, size):
    """The documented preprocessing of ``path`` for a model whose images
    are resized to ``size``, or for NaFlex (``size`` None) each within its
    patch table."""
    import tensorflow as tf
    from PIL import Image

    from keras_vit.data import naflex

    with Image.open(path) as im:
        x = np.asarray(im.convert("RGB"), "float32")
    if size is not None:
        x = tf.image.resize(x[None], size, method="bilinear").numpy()[0]
    x = ((x / 255.0 - np.array(MEAN)) / np.array(STD)).astype("float32")
    return naflex.model_inputs(model, [x]) if size is None else x[None]


@pytest.mark.parametrize("head", ["classes", "embedding"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_predict_takes_every_input_geometry(tmp_path, images, geometry, head,
                                            capsys):
    """Fixed square or not, any size (resized to the size the model was
    built at, or --image-size) and NaFlex: predict prints what the model
    gives on the documented input."""
    kwargs, argv, size = GEOMETRIES[geometry]
    keras.utils.set_random_seed(6)
    model = keras_vit.vit(**dict(TINY, **kwargs), num_classes=(
        5 if head == "classes" else 0), input_normalization={
            "mean": MEAN, "std": STD})
    if head == "classes":
        kernel = model.get_layer("head").kernel
        kernel.assign(np.random.default_rng(2).normal(
            size=kernel.shape).astype("float32"))
    path = _save(model, tmp_path, geometry)
    if argv:  # --image-size: the model as predict builds it
        from keras_vit.zoo import resolve_model

        model = resolve_model(model, image_size=int(argv[-1]))
    assert cli.main(["predict", path, *images, *argv]) == 0, geometry
    lines = capsys.readouterr().out.strip().splitlines()
    shown = "any size" if size is None else f"{size[0]}x{size[1]}"
    assert shown in lines[0], lines[0]
    for image in images:
        want = keras.ops.convert_to_numpy(model(_geometry_input(
            model, image, size), training=False))[0]
        if head == "embedding":
            line = next(ln for ln in lines if ln.startswith(f"{image}: "))
            norm = float(re.search(r"norm ([0-9.]+)", line).group(1))
            assert abs(norm - np.linalg.norm(want)) < 1e-3, (image, line)
            continue
        at = lines.index(next(ln for ln in lines
                              if ln.startswith(f"{image}: ")))
        assert shown in lines[at]
        p = _softmax(want)
        rows = [ln.split() for ln in lines[at + 1:at + 6]]
        assert [int(r[-1].strip("[]")) for r in rows] == list(
            np.argsort(-p, kind="stable")[:5]), (image, lines[at:at + 6])
        np.testing.assert_allclose([float(r[1]) for r in rows],
                                   np.sort(p)[::-1], atol=2e-4)


# name: classifier_activation, what its outputs are as probabilities.
ACTIVATIONS = {
    "none": (None, _softmax),
    "linear": ("linear", _softmax),
    "softmax": ("softmax", lambda y: y),
    # Multi-label heads: each class its own probability.
    "sigmoid": ("sigmoid", lambda y: y),
    "hard_sigmoid": ("hard_sigmoid", lambda y: y),
    "sigmoid_function": (keras.activations.sigmoid, lambda y: y),
    # Log-probabilities.
    "log_softmax": ("log_softmax", np.exp),
    "log_sigmoid": ("log_sigmoid", np.exp),
    # Scores of the head's own making: as they are, never a softmax.
    "relu": ("relu", lambda y: y),
    "tanh": ("tanh", lambda y: y),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_predict_gives_the_models_own_probabilities(tmp_path, images, name,
                                                    capsys):
    activation, as_probabilities = ACTIVATIONS[name]
    keras.utils.set_random_seed(4)
    model = keras_vit.vit(**TINY, num_classes=5,
                          classifier_activation=activation)
    kernel = model.get_layer("head").kernel
    kernel.assign(np.random.default_rng(1).normal(
        size=kernel.shape).astype("float32"))
    path = _save(model, tmp_path, name)
    want = as_probabilities(_expected_embeddings(model, images, "official")
                            .astype("float64"))
    dest = tmp_path / "p.npz"
    out = _run_json(capsys, path, *images, "--out", str(dest))
    np.testing.assert_allclose(_load(str(dest))[1], want, atol=1e-5, rtol=0,
                               err_msg=name)
    for pred, row in zip(out["predictions"], want):
        assert pred["top"][0]["index"] == int(np.argmax(row)), name
        assert abs(pred["top"][0]["probability"] - row.max()) < 1e-5, name


# --------------------------------------------------------------------------
# Help text and docs that say what is so


def _help(capsys, *argv):
    assert cli.main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_family_lists_are_the_registrys(capsys):
    from keras_vit.zoo import registry

    families = registry.families()
    text = _help(capsys, "list")
    listed = re.search(r"one family only: ([a-z0-9_, ]+)", text).group(1)
    assert [f.strip() for f in listed.split(",")] == families
    import pathlib

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "guides"
           / "cli.md").read_text()
    listed = re.search(r"lists one\s+family \(([^);]*)", doc).group(1)
    assert re.findall(r"`([^`]+)`", listed) == families


def test_predict_help_names_the_models_own_normalisation(capsys):
    text = _help(capsys, "predict")
    assert "[-1, 1]" not in text.replace("official [-1, 1]", "")
    assert "the model's own input normalisation" in text
    assert "--out" in text and ".npz, .json or .csv" in text
    assert "feature extractor" in text
