"""zoo.load's pipeline (zoo/sources.py): one model written in each layout
it reads (official .npz, timm folder, transformers folder, keras-hub
preset, .keras file) loads back with the same logits, and every source keeps the same
rules: a missing or an unexpected array is refused, listed by name, in an
error naming the file. Random weights at 32x32; nothing leaves the disk."""

import io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from keras_vit import zoo
from keras_vit.zoo import sources

SIZE = 32
NAME = "ViT-Ti/16"  # timm's writer takes the standard sizes only


@pytest.fixture(scope="module")
def model():
    model = zoo.load(NAME, weights=None, image_size=SIZE, num_classes=3,
                     gelu="exact")
    rng = np.random.default_rng(0)
    for w in model.weights:  # every weight, LayerNorms and the head too
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _images(n=2):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, SIZE, SIZE, 3)).astype("float32")


def _official(model, path):
    zoo.save_npz(model, path / "vit.npz")
    return path / "vit.npz", path / "vit.npz", (NAME,), {
        "weights": str(path / "vit.npz"), "gelu": "exact"}


def _timm(model, path):
    zoo.save_pretrained(model, path)
    return path, path / "model.safetensors", (str(path),), {}


def _transformers(model, path):
    zoo.save_pretrained(model, path, layout="transformers")
    return path, path / "model.safetensors", (str(path),), {}


def _keras_hub(model, path):
    zoo.to_keras_hub(model).save_to_preset(str(path))
    return path, path / "model.weights.h5", (str(path),), {}


def _keras(model, path):
    model.save(path / "model.keras")
    return path / "model.keras", path / "model.keras", (
        str(path / "model.keras"),), {}


# source -> (writer, an array to drop from its file, how the error names
# it missing).
LAYOUTS = {
    "official": (_official, "Transformer/encoder_norm/scale",
                 "Transformer/encoder_norm/scale"),
    "timm": (_timm, "norm.weight", "norm.weight"),
    "transformers": (_transformers, "vit.layernorm.weight",
                     "vit.layernorm.weight"),
    "keras-hub": (_keras_hub, "layers/vi_t_encoder/layer_norm/vars/0",
                  "vit_encoder/ln/gamma"),
    # Keras' own error names the layer whose weight is missing.
    "keras": (_keras, "layers/layer_normalization/vars/0", "encoder_norm"),
}
EXTRA = "extra_parameter"


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def written(request, model, tmp_path_factory):
    """``(kind, folder or file, weights file, load args, load kwargs)``."""
    path = tmp_path_factory.mktemp(request.param.replace("-", "_"))
    return (request.param, *LAYOUTS[request.param][0](model, path))


def test_every_source_loads_the_same_model(written, model):
    kind, where, _, args, kwargs = written
    source, value, _ = sources.find(*args, kwargs.get("weights", "auto"))
    assert source.name == kind
    loaded = zoo.load(*args, **kwargs)
    np.testing.assert_allclose(np.asarray(loaded(_images())),
                               np.asarray(model(_images())), atol=1e-5,
                               rtol=0)
    assert loaded.zoo_name == NAME
    # Another size and head, through the same build step.
    other = zoo.load(*args, image_size=48, num_classes=5, **kwargs)
    out = np.asarray(other(np.zeros((1, 48, 48, 3), "float32")))
    assert out.shape == (1, 5)
    np.testing.assert_array_equal(out, 0.0)


def _edit_keras_member(path, member, change):
    """Rewrites the member ``member`` of the ``.keras`` archive ``path`` as
    ``change(its bytes)`` returns it (stored uncompressed, as Keras
    writes)."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members[member] = change(members[member])
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _edit_h5(file, drop=None, add=None, spoil=False):
    """Edits a Keras weights file (a path or a file object): without the
    dataset ``drop``, with a float array ``add``, or (``spoil``) with
    strings in its first."""
    import h5py

    with h5py.File(file, "a") as f:
        if drop:
            del f[drop]
        if add:
            f.create_dataset(f"layers/{add}/vars/0",
                             data=np.zeros(4, "float32"))
        if spoil:
            names = []
            f.visititems(lambda n, o: names.append(n)
                         if isinstance(o, h5py.Dataset) else None)
            shape = f[names[0]].shape
            del f[names[0]]
            f.create_dataset(names[0], shape=shape, dtype=h5py.string_dtype())


def _edited_h5(data, **edits):
    """The bytes of a Keras weights file ``data`` edited by :func:`_edit_h5`."""
    buffer = io.BytesIO(data)
    _edit_h5(buffer, **edits)
    return buffer.getvalue()


def _edit(src, dst, drop=None, add=None):
    """A copy of the file ``src`` at ``dst`` without the array ``drop`` and
    with a float array ``add``, in its own format."""
    shutil.copy(src, dst)
    suffix = os.path.splitext(dst)[1]
    if suffix == ".keras":
        _edit_keras_member(dst, "model.weights.h5", lambda data: _edited_h5(
            data, drop=drop, add=add))
        return
    if suffix == ".h5":
        _edit_h5(dst, drop=drop, add=add)
        return
    if suffix == ".npz":
        with np.load(src) as archive:
            arrays = dict(archive)
    else:
        from safetensors.numpy import load_file

        arrays = load_file(str(src))
    if drop:
        del arrays[drop]
    if add:
        arrays[add] = np.zeros(4, "float32")
    if suffix == ".npz":
        np.savez(dst, **arrays)
    else:
        from safetensors.numpy import save_file

        save_file(arrays, str(dst))


def _moved(where, path, args, kwargs):
    """``zoo.load``'s arguments naming the file ``path`` instead of
    ``where``, as a name (a .keras file) or as weights (an .npz)."""
    if "weights" in kwargs:
        return args, dict(kwargs, weights=str(path))
    return tuple(str(path) if a == str(where) else a for a in args), kwargs


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_every_source_refuses_what_does_not_fit(written, tmp_path, change):
    kind, where, weights_file, args, kwargs = written
    _, drop, missing_name = LAYOUTS[kind]
    folder = tmp_path / "bad"
    if os.path.isdir(where):
        shutil.copytree(where, folder)
        bad_file = folder / weights_file.name
        args = tuple(str(folder) if a == str(where) else a for a in args)
    else:
        folder.mkdir()
        bad_file = folder / weights_file.name
        args, kwargs = _moved(where, bad_file, args, kwargs)
    _edit(weights_file, bad_file, drop=drop if change == "missing" else None,
          add=EXTRA if change == "unexpected" else None)
    with pytest.raises(ValueError) as info:
        zoo.load(*args, **kwargs)
    message = str(info.value)
    assert str(folder) in message, message  # the file, or its folder
    assert (missing_name if change == "missing" else EXTRA) in message, \
        message
    assert isinstance(info.value, zoo.CheckpointError)


def test_registry_order_and_default():
    assert [s.name for s in sources.SOURCES] == [
        "transformers", "timm", "keras-hub", "keras"]
    source, value, arch_name = sources.find("ViT-B/16", None)
    assert (source, value, arch_name) == (sources.OFFICIAL, None, "ViT-B/16")
    # The weights argument is asked about with the name as architecture.
    assert sources.find("ViT-B/16", "x.safetensors")[0].name == "timm"
    assert sources.find("ViT-B/16", "x.safetensors")[2] == "ViT-B/16"


def _spoil(src, dst, how):
    """A copy of the weights file ``src`` at ``dst``, spoiled in its own
    format: ``"dtype"`` gives one array a type no reader should take (an
    unknown safetensors dtype, a pickled object array in an .npz, strings
    in an .h5), ``"short"`` cuts the file's tail off."""
    data = src.read_bytes()
    if how == "short":
        dst.write_bytes(data[:len(data) - 512])
        return
    suffix = dst.suffix
    if suffix == ".keras":
        shutil.copy(src, dst)
        _edit_keras_member(dst, "model.weights.h5",
                           lambda h5: _edited_h5(h5, spoil=True))
    elif suffix == ".safetensors":
        import struct

        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        first = next(k for k in header if k != "__metadata__")
        header[first]["dtype"] = "X9"
        raw = json.dumps(header).encode()
        dst.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    elif suffix == ".npz":
        with np.load(src) as archive:
            arrays = dict(archive)
        first = sorted(arrays)[0]
        arrays[first] = np.array([object()] * 4, dtype=object)
        np.savez(dst, **arrays)  # the object array is pickled inside
    else:
        shutil.copy(src, dst)
        _edit_h5(dst, spoil=True)


@pytest.mark.parametrize("how", ["dtype", "short"])
def test_every_source_refuses_a_spoiled_weights_file(written, tmp_path, how,
                                                     monkeypatch):
    """Every source, the same rule: its weights file with a foreign
    dtype (a pickle in the .npz: never unpickled) or cut short is refused by a
    CheckpointError naming the file, before a model is built."""
    kind, where, weights_file, args, kwargs = written
    folder = tmp_path / "bad"
    if os.path.isdir(where):
        shutil.copytree(where, folder)
        args = tuple(str(folder) if a == str(where) else a for a in args)
    else:
        folder.mkdir()
        args, kwargs = _moved(where, folder / weights_file.name, args, kwargs)
    bad_file = folder / weights_file.name
    _spoil(weights_file, bad_file, how)

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built from a spoiled file")

    monkeypatch.setattr(sources, "build", no_build)
    with pytest.raises(zoo.CheckpointError) as info:
        zoo.load(*args, **kwargs)
    message = str(info.value)
    assert str(folder) in message, message


def _absurd_config(kind, folder):
    """Sets an image side of a million pixels where ``kind`` keeps its
    sizes: the config file it reads (returned), or None for the official
    .npz, whose sizes come from the name and the ``image_size`` argument."""
    config_file = folder / "config.json"
    if kind == "official":
        return None
    if kind == "keras":  # the config.json inside the archive
        config_file = folder / "model.keras"

        def absurd(data):
            config = json.loads(data)
            config["config"]["image_size"] = 10**6
            return json.dumps(config).encode()

        _edit_keras_member(config_file, "config.json", absurd)
        return config_file
    data = json.loads(config_file.read_text())
    if kind == "timm":
        data["model_args"]["img_size"] = 10**6
    elif kind == "transformers":
        data["image_size"] = 10**6
    else:  # keras-hub: the backbone's config
        data["config"]["image_shape"] = [10**6, 10**6, 3]
    config_file.write_text(json.dumps(data))
    return config_file


def test_every_source_refuses_absurd_sizes_before_building(written, tmp_path,
                                                           monkeypatch):
    """Every source, the same rule: a config (or argument) asking for a
    10^6-pixel side is refused by a ValueError naming the file (or the argument) and
    the field, before anything is allocated for it: the readers refuse it
    before a model is built; the official .npz, whose sizes are the
    name's and the argument's, is refused by the model's own size check."""
    kind, where, _, args, kwargs = written
    folder = tmp_path / "bad"
    if os.path.isdir(where):
        shutil.copytree(where, folder)
        args = tuple(str(folder) if a == str(where) else a for a in args)
    elif kind == "keras":
        folder.mkdir()
        shutil.copy(where, folder / where.name)
        args, kwargs = _moved(where, folder / where.name, args, kwargs)
    config_file = _absurd_config(kind, folder)
    if config_file is None:
        kwargs = dict(kwargs, image_size=10**6)

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built from an absurd config")

    if config_file is not None:  # the reader refuses it
        monkeypatch.setattr(sources, "build", no_build)
    # else: the model's own check, from its sizes, before any weight exists
    with pytest.raises(ValueError) as info:
        zoo.load(*args, **kwargs)
    message = str(info.value)
    assert str(config_file or "image_size=1000000") in message, message
    assert "1000000" in message.replace(",", ""), message


def test_a_path_no_source_reads_is_not_called_a_model_name(tmp_path):
    """zoo.load of an empty folder, a folder with weights but no config,
    or a path to nothing says what is missing; it once reached the name
    parser as "Unknown model name='/tmp/...'"."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="cannot read.*model.keras"):
        zoo.load(str(empty))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="no config.json"):
        zoo.load(str(bare))  # timm's reader claims it, and says what
    for missing in (str(tmp_path / "nowhere"), "./no/such/run"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            zoo.load(missing)
    with pytest.raises(zoo.UnknownModelError):
        zoo.load("ViT-Q/16")


@pytest.mark.parametrize("name", ["vit.npz", "v1.2/weights.npz",
                                  "config.json", "notes", "relative.npz"])
def test_a_file_no_source_reads_is_not_called_a_model_name(
        tmp_path, monkeypatch, name):
    """A file that is no model (an official .npz, a folder's config.json)
    passed as the name once reached the name parser: "Unknown weights tag
    'npz' ... known timm tags"."""
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"not read")
    if name.startswith("relative"):
        monkeypatch.chdir(tmp_path)
        path = name
    with pytest.raises(ValueError) as e:
        zoo.load(str(path))
    message = str(e.value)
    assert f"name={str(path)!r} is a file" in message, message
    assert f"weights={str(path)!r}" in message and "tag" not in message
