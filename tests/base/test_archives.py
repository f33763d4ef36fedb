"""keras_vit.base.archives: a path is checked to be the archive its reader
expects (a cut-short zip, a FIFO) before the reader opens it, naming the
argument."""

import pytest

from testkit import fifo as _fifo
from testkit import odd_image as _odd_image
from testkit import one_error_line as _one_error_line


@pytest.mark.parametrize("command", [
    ["predict", "{model}", "{image}"],
    ["evaluate", "{model}", "--data", "digits"],
])
def test_a_corrupt_keras_file_is_named_not_missing(tmp_path, capsys,
                                                  command):
    from keras_vit import cli

    model = tmp_path / "cut.keras"
    model.write_bytes(b"PK\x03\x04 cut short")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    argv = [a.format(model=model, image=image) for a in command]
    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    assert f"MODEL={str(model)!r} is not a .keras model" in line
    assert "File not found" not in line


def test_a_fifo_where_an_archive_belongs_is_named(tmp_path, capsys):
    from keras_vit import cli
    from keras_vit import train as kt

    fifo = _fifo(tmp_path / "m.keras")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(fifo), str(image)]) == 2
    assert (f"MODEL={str(fifo)!r} is a FIFO (named pipe), not a .keras "
            "model") in _one_error_line(capsys)
    data = _fifo(tmp_path / "d.npz")
    with pytest.raises(ValueError, match="is a FIFO"):
        kt.load_data(str(data))
