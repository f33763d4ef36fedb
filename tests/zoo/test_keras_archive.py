"""keras_vit.zoo.keras_archive: a .keras file is checked before Keras
reads it. A config nested too deeply or inflating past its bound, and a
weights member that is a zip bomb, are refused in one line naming the
file."""

import pytest

from testkit import odd_image as _odd_image
from testkit import one_error_line as _one_error_line


def _keras_with_config(tiny_keras, path, config, compress=False):
    import zipfile

    with zipfile.ZipFile(tiny_keras) as src, zipfile.ZipFile(
            path, "w", zipfile.ZIP_DEFLATED if compress else
            zipfile.ZIP_STORED) as out:
        for name in src.namelist():
            out.writestr(name, config if name == "config.json"
                         else src.read(name))
    return path


@pytest.mark.parametrize("config, compress, needle", [
    ("[" * 100000 + "]" * 100000, False, "config.json is nested too deeply"),
    (" " * (17 << 20) + "{}", True, f"config.json is {(17 << 20) + 2} bytes "
                                    "uncompressed"),
], ids=["deep_nesting", "zip_bomb"])
def test_hostile_keras_configs_are_one_line(tiny_keras, tmp_path, capsys,
                                            config, compress, needle):
    from keras_vit import cli

    model = _keras_with_config(tiny_keras, tmp_path / "m.keras", config,
                               compress)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(model), str(image)]) == 2
    line = _one_error_line(capsys)
    assert f"cannot load MODEL={str(model)!r} as a Keras model" in line
    assert needle in line


def test_a_keras_weights_bomb_is_refused_before_reading(
        tiny_keras, tmp_path, capsys, monkeypatch):
    """A 1.5 MB .keras whose model.weights.h5 inflates to 1.5 GB loaded, at
    3.6 GB of peak RSS: Keras reads the member whole and its own bomb check
    starts at 4 GiB (found by benchmarks/hostile_inputs.py). Scaled down
    here to a 1 MiB floor; an honest deflated archive still loads."""
    import zipfile

    from keras_vit import cli
    from keras_vit.zoo import keras_archive

    monkeypatch.setattr(keras_archive, "KERAS_BOMB_FLOOR", 1 << 20)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    for padding, status in ((0, 0), (4 << 20, 2)):
        path = tmp_path / f"deflated{padding}.keras"
        with zipfile.ZipFile(tiny_keras) as src, zipfile.ZipFile(
                path, "w", zipfile.ZIP_DEFLATED) as out:
            for name in src.namelist():
                data = src.read(name)
                if name == "model.weights.h5":
                    data += bytes(padding)
                out.writestr(name, data)
        assert cli.main(["predict", str(path), str(image)]) == status
    line = _one_error_line(capsys)
    assert f"cannot load MODEL={str(path)!r} as a Keras model" in line
    assert "its model.weights.h5 is " in line
    assert "bytes uncompressed from" in line and "zip bomb?" in line


def _flags():
    """Every argument of the ViT builder that defaults to True or False."""
    import inspect

    import keras_vit

    return [name for name, p in inspect.signature(
        keras_vit.VisionTransformer.__init__).parameters.items()
        if isinstance(p.default, bool)]


# Hand-edited configs, each refused in one line naming the field and the
# value: a string for a flag ("false" built with the flag on), a resnet
# without its stage depths (a KeyError inside the parameter count) and a
# class name past the length a label may have.
_EDITS = ([(name, {name: "false"}, f"config.{name}", "'false'")
           for name in _flags()]
          + [("resnet", {"resnet": {}}, "config.resnet.num_layers",
              "it is missing"),
             ("long_label", {"label_names": ["x" * 2000] + ["y"] * 9},
              "config.label_names[0]", "at most 1024 characters")])


@pytest.mark.parametrize("fields, field, needle",
                         [row[1:] for row in _EDITS],
                         ids=[row[0] for row in _EDITS])
def test_a_hand_edited_config_is_refused_naming_the_field(
        tiny_keras, tmp_path, fields, field, needle):
    import json
    import zipfile

    from keras_vit import zoo

    with zipfile.ZipFile(tiny_keras) as src:
        doc = json.loads(src.read("config.json"))
    doc["config"].update(fields)
    path = _keras_with_config(tiny_keras, tmp_path / "m.keras",
                              json.dumps(doc))
    with pytest.raises(ValueError) as e:
        zoo.load(str(path))
    message = str(e.value)
    assert "\n" not in message and f"field {field}:" in message, message
    assert needle in message, message


@pytest.mark.parametrize("variant", ["bit", "d"])
def test_a_saved_hybrid_of_each_resnet_variant_loads(tmp_path, variant):
    # The config check once refused resnet.variant, which a ResNet-D
    # hybrid (timm's resnet26d stems) saves.
    import keras_vit
    from keras_vit import zoo

    model = keras_vit.vit(32, 1, 32, 1, 4, 64, 3, resnet=dict(
        num_layers=[1], variant=variant))
    model.save(tmp_path / "m.keras")
    assert zoo.load(str(tmp_path / "m.keras")).resnet == model.resnet
