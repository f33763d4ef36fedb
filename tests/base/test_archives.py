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


# -- every array header bounded before allocation, in every reader -----------
# A header claiming 2**40 elements in a file of a few hundred bytes: each
# reader of arrays the package has must refuse it with one line naming the
# file, before any allocation (a raw MemoryError naming no file, or 4 TiB
# asked of the allocator, is the failure). "deflated, lying directory": the
# zip's own directory claims the 1 GiB too, so only the compressed bytes
# can tell.

HUGE = 2 ** 40


def _npy(shape, dtype="<f4", payload=b"\0" * 16):
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def _array(value):
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(value), allow_pickle=False)
    return buf.getvalue()


def _lying_size(path, name, size):
    """Rewrites the uncompressed size the zip's local header and central
    directory give for the member ``name`` of ``path``."""
    import struct
    import zipfile

    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        local = archive.getinfo(name).header_offset
    struct.pack_into("<L", data, local + 22, size)
    central = data.find(b"PK\x01\x02" + data[local + 4:local + 6])
    while central >= 0:
        (length,) = struct.unpack_from("<H", data, central + 28)
        if data[central + 46:central + 46 + length] == name.encode():
            struct.pack_into("<L", data, central + 24, size)
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))


def _npz(path, members, lying=None):
    """An .npz of ``members`` (name -> bytes); ``lying``: that member is
    deflated and the directory claims 1 GiB of it as well."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, raw in members.items():
            archive.writestr(name, raw, zipfile.ZIP_DEFLATED
                             if name == lying else zipfile.ZIP_STORED)
    if lying is not None:
        _lying_size(path, lying, 1 << 30)
    return path


def _huge_member(lying):
    # Lying directory: 2**28 float32 (1 GiB, a size zip's 32 bits hold).
    return _npy((2 ** 28,) if lying else (HUGE,))


def _official(tmp_path, lying):
    name = "embedding/kernel.npy"
    return _npz(tmp_path / "vit.npz", {name: _huge_member(lying)},
                name if lying else None)


def _zoo_load(tmp_path, lying):
    from keras_vit import zoo

    path = _official(tmp_path, lying)
    return path, lambda: zoo.load("ViT-Ti/16", weights=str(path),
                                  num_layers=1, hidden_size=32, num_heads=2,
                                  mlp_dim=64)


def _read_npz(tmp_path, lying):
    from keras_vit import zoo

    path = _official(tmp_path, lying)
    return path, lambda: zoo.read_npz(path)


def _run_checkpoint(tmp_path, lying):
    from keras_vit.train import callbacks

    import keras

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    members = {f"meta/{k}.npy": _array(1 if k == "step" else 0)
               for k in ("step", "epoch", "batch_in_epoch")}
    members["model/00000.npy"] = _huge_member(lying)
    path = _npz(folder / "ckpt-1.npz", members,
                "model/00000.npy" if lying else None)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return path, lambda: callbacks.StepCheckpoints(folder, every=1).restore(
        model)


def _training_data(tmp_path, lying):
    from keras_vit import train as kt

    path = _npz(tmp_path / "data.npz", {"x.npy": _huge_member(lying),
                                        "y.npy": _array([0, 1])},
                "x.npy" if lying else None)
    return path, lambda: kt.load_data(str(path))


def _lora_adapters(tmp_path, lying):
    from keras_vit.models import lora

    path = _npz(tmp_path / "adapters.npz",
                {"dense/kernel.npy": _huge_member(lying)},
                "dense/kernel.npy" if lying else None)
    return path, lambda: lora.load_adapters(None, path)


def _safetensors(tmp_path, lying):
    from testkit import safetensors

    from keras_vit.zoo import hub_files

    path = safetensors(tmp_path / "model.safetensors", {"a": {
        "dtype": "F32", "shape": [HUGE], "data_offsets": [0, 4 * HUGE]}})
    return path, lambda: hub_files.read_safetensors(path)


def _safetensors_tensors(tmp_path, lying):
    from testkit import safetensors

    from keras_vit.zoo.transformers import layout as transformers_layout

    path = safetensors(tmp_path / "model.safetensors", {"a": {
        "dtype": "F32", "shape": [HUGE], "data_offsets": [0, 4 * HUGE]}})
    return path, lambda: transformers_layout.read_tensors(path, ["a"])


def _h5(path):
    import h5py
    with h5py.File(path, "w") as f:  # contiguous, never written: no bytes
        f.create_dataset("a", shape=(HUGE,), dtype="float32")
    return path


def _keras_hub_h5(tmp_path, lying):
    from keras_vit.zoo import h5_files

    path = _h5(tmp_path / "model.weights.h5")
    return path, lambda: h5_files.read_h5(str(path), {"a": "a"},
                                          {"a": (HUGE,)})


def _keras_archive(tmp_path, lying):
    import zipfile

    from keras_vit.zoo import keras_archive

    weights = _h5(tmp_path / "model.weights.h5").read_bytes()
    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", weights)
    return path, lambda: keras_archive.load_keras_file(str(path))


READERS = {"zoo.load .npz": _zoo_load, "zoo.read_npz": _read_npz,
           "run checkpoint": _run_checkpoint,
           "training data .npz": _training_data,
           "LoRA adapters": _lora_adapters,
           "safetensors": _safetensors,
           "safetensors tensors": _safetensors_tensors,
           "keras-hub .h5": _keras_hub_h5, ".keras archive": _keras_archive}
NPZ_READERS = ("zoo.load .npz", "zoo.read_npz", "run checkpoint",
               "training data .npz", "LoRA adapters")


@pytest.mark.parametrize("reader,lying", [
    (name, False) for name in READERS] + [
    (name, True) for name in NPZ_READERS])
def test_a_header_claiming_2_40_elements_is_refused_naming_the_file(
        tmp_path, reader, lying):
    import tracemalloc

    from keras_vit.base.errors import KerasVitError

    path, read = READERS[reader](tmp_path, lying)
    assert path.stat().st_size < 8000
    tracemalloc.start()
    try:
        with pytest.raises(Exception) as caught:
            read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    error = caught.value
    assert isinstance(error, KerasVitError), repr(error)
    assert str(path) in str(error), str(error)
    assert "\n" not in str(error), str(error)
    assert peak < 64 << 20, f"{peak} bytes allocated before the refusal"
