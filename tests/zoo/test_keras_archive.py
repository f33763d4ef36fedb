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
