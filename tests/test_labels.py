"""Class names travel with the model: ``label_names`` is a constructor
argument of every model class, kept in its config, so ``.keras`` files and
``rebuild`` carry it, and a head of another size drops it."""

import numpy as np
import pytest

import keras_vit
from keras_vit.models import axial_vit, resnet_v2, vit

TINY = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64)
BUILDERS = {
    "vit": lambda **kw: vit(num_classes=3, **TINY, **kw),
    "axial": lambda **kw: axial_vit(num_classes=3, **TINY, **kw),
    "bit": lambda **kw: resnet_v2(32, (1, 1, 1, 1), 1, num_classes=3, **kw),
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
