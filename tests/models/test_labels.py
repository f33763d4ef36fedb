"""Class names travel with the model: ``label_names`` is a constructor
argument of every model class, kept in its config, so ``.keras`` files and
``rebuild`` carry it, and a head of another size drops it."""

import numpy as np
import pytest

import keras_vit
from keras_vit.models import axial_vit, resnet_v2, vit

TINY = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64)
# BiT at width 0.5, the narrowest resnet_v2 builds (a quarter of width 1's
# 8M parameters): the names ride on the config whatever the width.
BUILDERS = {
    "vit": lambda **kw: vit(num_classes=3, **TINY, **kw),
    "axial": lambda **kw: axial_vit(num_classes=3, **TINY, **kw),
    "bit": lambda **kw: resnet_v2(32, (1, 1, 1, 1), 0.5, num_classes=3,
                                  **kw),
}
NAMES = ["cat", "dog", "bird"]


@pytest.mark.parametrize("family", BUILDERS)
def test_label_names_survive_config_keras_file_and_rebuild(family, tmp_path):
    import keras

    model = BUILDERS[family](label_names=NAMES)
    assert model.label_names == tuple(NAMES)
    assert model.get_config()["label_names"] == NAMES
    path = tmp_path / "m.keras"
    model.save(path)
    assert keras.saving.load_model(path).label_names == tuple(NAMES)
    assert keras_vit.rebuild(model).label_names == tuple(NAMES)
    if family != "bit":  # BiT's input size is free; the ViTs' is rebuilt
        assert keras_vit.rebuild(model, image_size=48).label_names == tuple(
            NAMES)
    # Another head: other classes, whose names the old ones are not.
    assert keras_vit.rebuild(model, num_classes=5).label_names is None
    renamed = keras_vit.rebuild(model, num_classes=2, label_names=["a", "b"])
    assert renamed.label_names == ("a", "b")


@pytest.mark.parametrize("bad,message", [
    (["cat"], "must name each of the 3 classes"),
    (["cat", "dog", "cat"], "'cat' appears twice"),
    ("cat,dog,bird", "must be a list of class names"),
    (5, "must be a list of class names"),
    (["cat", "", "bird"], "non-empty strings"),
    (["cat", 2, "bird"], "non-empty strings"),
])
@pytest.mark.parametrize("family", BUILDERS)
def test_bad_label_names_are_refused_naming_the_argument(family, bad,
                                                         message):
    with pytest.raises(ValueError, match="label_names") as e:
        BUILDERS[family](label_names=bad)
    assert message in str(e.value)


def test_a_label_name_past_the_files_limit_is_refused():
    # A name of 2000 characters built and saved, and zoo.load refused the
    # file; the builder holds names to the limit the readers keep.
    from keras_vit.base.limits import MAX_LABEL_LENGTH

    long = "x" * (MAX_LABEL_LENGTH + 1)
    with pytest.raises(ValueError) as e:
        vit(num_classes=3, label_names=["cat", long, "bird"], **TINY)
    assert f"at most {MAX_LABEL_LENGTH} characters" in str(e.value)
    assert "label_names[1]" in str(e.value)
    assert vit(num_classes=3, label_names=["cat", long[1:], "bird"], **TINY
               ).label_names[1] == long[1:]


def test_label_names_need_a_head():
    with pytest.raises(ValueError, match="include_top=False"):
        vit(num_classes=3, include_top=False, label_names=NAMES, **TINY)


def test_decode_predictions_speaks_the_model_names():
    model = BUILDERS["vit"](label_names=NAMES)
    logits = np.array([[0.0, 3.0, 1.0]])
    top = keras_vit.zoo.decode_predictions(logits, top=2, labels=model)
    assert [name for _, name, _ in top[0]] == ["dog", "bird"]


# --------------------------------------------------------------------------
# One labelled model through every writer and reader outside the zoo: a run
# fine-tuned on a folder of cat/ and dog/, then its run directory, a resume,
# .keras, rebuild, SavedModel (both signatures), ONNX and TFLite. Each
# reader must give back the folder's names, in the head's order.

PETS = ("cat", "dog")
# A cat is a reddish square, a dog a bluish one: a tiny ViT tells them
# apart after a few steps.
_COLOURS = {"cat": (200, 40, 40), "dog": (40, 40, 200)}
RUN = dict(recipe="pretrain", total_steps=16, warmup_steps=1, batch_size=8,
           learning_rate=0.003, crop_area=None, flip=False, log_every=8,
           strategy="default", verbose=False)


def pet_image(path, kind, seed):
    """A 16x16 PNG of ``kind``: its colour plus noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(_COLOURS[kind]) + rng.normal(
        0, 25, (16, 16, 3)), 0, 255).astype("uint8")
    Image.fromarray(pixels).save(path)
    return path


def pet_folder(root, kinds=PETS, per_class=6):
    for kind in kinds:
        (root / kind).mkdir(parents=True)
        for i in range(per_class):
            pet_image(root / kind / f"{i}.png", kind, seed=hash(kind) % 97 + i)
    return root


@pytest.fixture(scope="module")
def pets_run(tmp_path_factory):
    """A tiny unnamed ViT fine-tuned on cat/ and dog/ into a run
    directory: ``(run_dir, folder)``."""
    import keras

    from keras_vit import train as kt

    root = tmp_path_factory.mktemp("pets")
    folder = pet_folder(root / "data")
    keras.utils.set_random_seed(0)
    unnamed = vit(num_classes=2, **dict(TINY, image_size=16, patch_size=4))
    unnamed.save(root / "unnamed.keras")
    kt.fine_tune(str(root / "unnamed.keras"), str(folder),
                 out_dir=str(root / "run"), **RUN)
    return root / "run", folder


def _saved_model_labels_file(path):
    with open(path / "assets" / "labels.txt", encoding="utf-8") as f:
        return tuple(f.read().split("\n")[:-1])


def _read_run_dir(model, run_dir, folder, tmp_path):
    import json

    from keras_vit.zoo import resolve_model

    with open(run_dir / "run.json", encoding="utf-8") as f:
        recorded = tuple(json.load(f)["label_names"])
    assert recorded == resolve_model(str(run_dir)).label_names
    return recorded


def _read_resumed(model, run_dir, folder, tmp_path):
    from keras_vit import train as kt

    # The same command again: the unnamed model is named after the data
    # again, and the checkpoint's weights go into it.
    trainer = kt.Trainer(str(run_dir.parent / "unnamed.keras"), str(folder),
                         out_dir=str(run_dir), **RUN)
    assert trainer.resumed_from == 16
    return trainer.model.label_names


def _read_keras_file(model, run_dir, folder, tmp_path):
    import keras

    model.save(tmp_path / "again.keras")
    return keras.saving.load_model(tmp_path / "again.keras").label_names


def _read_rebuilt(model, run_dir, folder, tmp_path):
    return keras_vit.rebuild(model, image_size=32).label_names


def _read_saved_model(model, run_dir, folder, tmp_path):
    from keras_vit.export import to_saved_model

    to_saved_model(model, str(tmp_path / "sm"))
    return _saved_model_labels_file(tmp_path / "sm")


def _read_saved_model_bytes(model, run_dir, folder, tmp_path):
    import tensorflow as tf

    from keras_vit.export import to_saved_model

    path = tmp_path / "bytes"
    report = to_saved_model(model, str(path), input="image_bytes",
                            verify_data="noise")
    assert report["options"]["labels"] == "label_names"
    loaded = tf.saved_model.load(str(path))
    signature = loaded.signatures["serving_default"]
    images = [open(pet_image(tmp_path / f"{k}.png", k, 1), "rb").read()
              for k in PETS]
    out = signature(image_bytes=tf.constant(images))
    classes = out["classes"].numpy()[:, 0]
    names = [n.decode() for n in out["labels"].numpy()[:, 0]]
    # The signature's labels are the head's names of its classes, and the
    # trained model tells the two apart.
    assert names == list(PETS) and classes.tolist() == [0, 1]
    assert _saved_model_labels_file(path) == PETS
    return tuple(names)


def _read_onnx(model, run_dir, folder, tmp_path):
    import onnxruntime

    from keras_vit.export import to_onnx

    to_onnx(model, str(tmp_path / "m.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    text = session.get_modelmeta().custom_metadata_map["label_names"]
    return tuple(text.split("\n")[:-1])


def _read_tflite(model, run_dir, folder, tmp_path):
    from ai_edge_litert.tools import flatbuffer_utils

    from keras_vit.export import to_tflite

    to_tflite(model, str(tmp_path / "m.tflite"))
    flat = flatbuffer_utils.read_model(str(tmp_path / "m.tflite"))
    (entry,) = [m for m in flat.metadata if m.name == b"label_names"]
    text = bytes(flat.buffers[entry.buffer].data).decode("utf-8")
    return tuple(text.split("\n")[:-1])


READERS = {"run_dir": _read_run_dir, "resume": _read_resumed,
           "keras_file": _read_keras_file, "rebuild": _read_rebuilt,
           "saved_model": _read_saved_model,
           "saved_model_image_bytes": _read_saved_model_bytes,
           "onnx": _read_onnx, "tflite": _read_tflite}


@pytest.mark.parametrize("reader", READERS)
def test_a_labelled_model_keeps_its_names_through_every_writer(
        reader, pets_run, tmp_path):
    from keras_vit.zoo import resolve_model

    run_dir, folder = pets_run
    model = resolve_model(str(run_dir))
    assert model.label_names == PETS
    assert READERS[reader](model, run_dir, folder, tmp_path) == PETS
    if reader in ("saved_model", "onnx", "tflite"):
        # keras_vit.export reads each format's record back.
        from keras_vit.export import read_label_names

        artifact = {"saved_model": "sm", "onnx": "m.onnx",
                    "tflite": "m.tflite"}[reader]
        assert read_label_names(str(tmp_path / artifact)) == PETS


@pytest.mark.parametrize("fmt,kwargs", [
    ("onnx", dict(external_data=True)),
    ("onnx", dict(quantization="dynamic_int8")),
    ("tflite", dict(quantization="dynamic_int8")),
])
def test_every_variant_of_a_format_records_the_names(fmt, kwargs, tmp_path):
    """The names are written after the variant is made (quantized, with
    external weights), and the file that carries them is the one
    verified."""
    from keras_vit import export

    model = BUILDERS["vit"](label_names=NAMES)
    path = str(tmp_path / f"m.{fmt}")
    report = export.export(model, path, **kwargs)
    assert report["verified"]
    assert report["options"]["label_names"]["count"] == 3
    assert export.read_label_names(path) == tuple(NAMES)


def test_unnamed_and_unwritable_names_record_nothing(tmp_path):
    from keras_vit import export

    unnamed = BUILDERS["vit"]()
    report = export.to_saved_model(unnamed, str(tmp_path / "plain"))
    assert report["options"]["label_names"] is None
    assert export.read_label_names(str(tmp_path / "plain")) is None
    # A line break cannot be one line of labels.txt: nothing is written,
    # and the export says so instead of shifting every later name.
    broken = BUILDERS["vit"](label_names=["cat", "d\nog", "bird"])
    with pytest.warns(UserWarning, match="not recorded"):
        report = export.to_onnx(broken, str(tmp_path / "b.onnx"))
    assert report["options"]["label_names"] is None
    assert any("line break" in note for note in report["notes"])
    assert export.read_label_names(str(tmp_path / "b.onnx")) is None


@pytest.mark.backends
def test_exports_from_this_backend_record_the_names(tmp_path):
    """Off TensorFlow the artifact is converted in a child process from
    the model's .keras file; the names are written in this one (the same
    step for every format: TFLite's, the most involved, stands for
    them)."""
    from keras_vit import export

    model = BUILDERS["vit"](label_names=NAMES)
    path = str(tmp_path / "m.tflite")
    export.to_tflite(model, path)
    assert export.read_label_names(path) == tuple(NAMES)


# --------------------------------------------------------------------------
# The command line speaks the names: fine-tune on cat/ dog/, predict prints
# them, evaluate maps a folder's classes to the model's by name.

def _cli(argv, capsys):
    from keras_vit import cli

    status = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def pets_cli_run(tmp_path_factory):
    """``keras-vit fine-tune`` of a tiny 10-class model on cat/ dog/ (a
    new head of 2): ``(run_dir, folder, printed)``."""
    import contextlib
    import io

    import keras

    from keras_vit import cli

    root = tmp_path_factory.mktemp("pets_cli")
    folder = pet_folder(root / "data")
    keras.utils.set_random_seed(0)
    vit(num_classes=10, **dict(TINY, image_size=16, patch_size=4)).save(
        root / "ten.keras")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main([
            "fine-tune", str(root / "ten.keras"), "--data", str(folder),
            "--recipe", "pretrain", "--steps", "16", "--batch-size", "8",
            "--warmup-steps", "1", "--lr", "0.003", "--set", "crop_area=none",
            "--set", "flip=false", "--out", str(root / "run"), "--strategy",
            "default"])
    assert status == 0
    return root / "run", folder, out.getvalue()


def test_fine_tune_names_the_classes_and_predict_prints_them(
        pets_cli_run, tmp_path, capsys):
    run_dir, folder, printed = pets_cli_run
    assert "2 classes: cat, dog" in printed
    images = [pet_image(tmp_path / f"{k}.png", k, seed=50) for k in PETS]
    status, out, err = _cli(["predict", run_dir, *images, "--top", "2"],
                            capsys)
    assert status == 0, err
    blocks = out.strip().split("\n\n")
    assert len(blocks) == 2
    for kind, block in zip(PETS, blocks):
        ranked = block.splitlines()[1:]
        # "   1  0.9731  dog  [1]": the best class first, by its name.
        assert ranked[0].split()[2] == kind, block
        assert {line.split()[2] for line in ranked} == set(PETS)
    assert "class 0" not in out and "class 1" not in out


def test_evaluate_maps_a_subset_folder_by_name(pets_cli_run, tmp_path,
                                              capsys):
    import json
    import shutil

    run_dir, folder, _ = pets_cli_run
    status, out, err = _cli(["evaluate", run_dir, "--data", folder,
                             "--json"], capsys)
    assert status == 0, err
    full = json.loads(out)
    assert set(full["per_class"]) == set(PETS) and "classes" not in full
    # Only dog/: its one class (label 0 in this folder) is the model's 1.
    dogs = tmp_path / "only_dogs"
    shutil.copytree(folder / "dog", dogs / "dog")
    status, out, err = _cli(["evaluate", run_dir, "--data", dogs, "--json"],
                            capsys)
    assert status == 0, err
    only = json.loads(out)
    assert only["num_examples"] == full["per_class"]["dog"]["num_examples"]
    assert only["accuracy"] == pytest.approx(
        full["per_class"]["dog"]["accuracy"])
    assert only["accuracy"] > 0.5  # the trained model tells dogs apart
    assert "matched by name" in only["classes"]
    status, out, err = _cli(["evaluate", run_dir, "--data", dogs], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert "top-1 accuracy" in lines[0]
    assert "matched by name to the model's 2: dog" in lines[1]
    assert lines[2].split()[0] == "dog"


def test_evaluate_refuses_classes_the_model_does_not_have(
        pets_cli_run, tmp_path, capsys):
    run_dir, _, _ = pets_cli_run
    cows = pet_folder(tmp_path / "farm", kinds=("cat",), per_class=2)
    pet_image(cows / "cat" / "extra.png", "cat", 9)
    (cows / "cow").mkdir()
    pet_image(cows / "cow" / "0.png", "dog", 3)
    status, out, err = _cli(["evaluate", run_dir, "--data", cows], capsys)
    assert status == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "['cow']" in line and "['cat', 'dog']" in line


def test_an_unnamed_model_maps_by_position_only_when_counts_match(
        tmp_path, capsys):
    unnamed = vit(num_classes=2, **dict(TINY, image_size=16, patch_size=4))
    unnamed.save(tmp_path / "two.keras")
    folder = pet_folder(tmp_path / "pets", per_class=2)
    status, out, err = _cli(["evaluate", tmp_path / "two.keras", "--data",
                             folder], capsys)
    assert status == 0, err
    assert "names no classes" in out and "by position" in out
    three = pet_folder(tmp_path / "more", kinds=("cat", "dog"), per_class=1)
    (three / "eel").mkdir()
    pet_image(three / "eel" / "0.png", "cat", 4)
    status, out, err = _cli(["evaluate", tmp_path / "two.keras", "--data",
                             three], capsys)
    assert status == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "names no classes" in line and "'eel'" in line


def test_a_named_head_is_not_renamed_by_other_data(pets_cli_run, tmp_path,
                                                  capsys):
    """Fine-tuning the cat/dog model on cat/ cow/ (same head size) would
    read its dog output as cow: refused, naming both."""
    run_dir, _, _ = pets_cli_run
    farm = pet_folder(tmp_path / "farm", kinds=("cat",), per_class=2)
    (farm / "cow").mkdir()
    for i in range(2):
        pet_image(farm / "cow" / f"{i}.png", "dog", i)
    status, out, err = _cli([
        "fine-tune", run_dir / "model.keras", "--data", farm, "--steps", "2",
        "--batch-size", "2", "--warmup-steps", "1", "--out",
        tmp_path / "run", "--strategy", "default", "-q"], capsys)
    assert status == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "['cat', 'dog']" in line and "['cat', 'cow']" in line


@pytest.mark.backends
def test_evaluate_by_name_agrees_with_the_models_own_answers():
    """The distributed (TensorFlow) and one-device (jax, torch) paths map
    the data's labels to the model's outputs by name, and count per
    class."""
    import keras

    from keras_vit import train as kt
    from keras_vit.models.memory import infer
    from keras_vit.train.data.sources import ArraySource

    labels = np.array([0, 1, 0, 1, 1, 0, 0, 1, 0])  # dog=0, cat=1 here
    wanted = np.array([2, 1])[labels]  # dog is output 2, cat output 1
    for seed in range(3, 30):  # random weights whose answers tell the two
        keras.utils.set_random_seed(seed)
        model = vit(num_classes=3, label_names=["bird", "cat", "dog"],
                    **dict(TINY, image_size=16, patch_size=4))
        rng = np.random.default_rng(seed)
        model.set_weights([w + rng.normal(0, 0.5, w.shape).astype(w.dtype)
                           for w in model.get_weights()])
        images = rng.uniform(0, 255, (9, 16, 16, 3)).astype("float32")
        predicted = infer(model, images / 127.5 - 1.0).argmax(-1)
        # By position the figure would differ: the test can tell the two.
        if np.mean(predicted == wanted) != np.mean(predicted == labels):
            break
    assert np.mean(predicted == wanted) != np.mean(predicted == labels)
    source = ArraySource(images, labels, class_names=["dog", "cat"])
    result = kt.evaluate(model, source, batch_size=4, verbose=False)
    assert result["accuracy"] == pytest.approx(np.mean(predicted == wanted))
    for label, name in enumerate(["dog", "cat"]):
        mine = labels == label
        assert result["per_class"][name]["num_examples"] == mine.sum()
        assert result["per_class"][name]["accuracy"] == pytest.approx(
            np.mean(predicted[mine] == wanted[mine]))


def test_resume_compares_the_names_a_run_recorded():
    """A run recorded before label_names existed resumes (its record says
    nothing of them); one whose data's names changed does not."""
    from keras_vit.train.run_dir import run_config_changes

    now = {"train_data": "pets", "label_names": ["cat", "dog"]}
    assert run_config_changes({"train_data": "pets"}, now) == []
    assert run_config_changes(
        {"train_data": "pets", "label_names": ["cat", "cow"]}, now) == [
        "label_names: ['cat', 'cow'] -> ['cat', 'dog']"]


def test_tfds_imagenet_classes_match_a_zoo_head_by_wordnet_id():
    """tfds names ImageNet's classes by WordNet id; a zoo head whose
    weights name the ImageNet list answers to those ids."""
    import types

    import numpy as np

    from keras_vit.train.data.sources import ArraySource
    from keras_vit.train.evaluation import class_mapping

    model = vit(num_classes=1000, **TINY)
    model.zoo_weights = types.SimpleNamespace(labels="imagenet2012")
    source = ArraySource(np.zeros((2, 32, 32, 3)), np.array([0, 1]),
                         class_names=["n01443537", "n01440764"])
    mapping, how = class_mapping(model, source)
    assert mapping.tolist() == [1, 0]  # goldfish, tench
    assert "matched by name" in how
