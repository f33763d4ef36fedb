"""Every file format the zoo reads, mutated: only the package's own errors
come out, naming the file, and nothing is built past the memory bound.

The files are written by the libraries that write them in the wild (timm's
``save_for_hf``, transformers' ``save_pretrained``, keras-hub's
``save_to_preset``, Keras' ``model.save``, the official layout's ``.npz``),
then one field is changed by ``hypothesis``: a wrong type, a huge or
negative number, a field removed or added, a key given twice, a tensor of
another dtype or shape. ``zoo.load`` must then refuse the file with a
CheckpointError / ValueError / OSError naming it, or build a model whose
estimated size is within the bound; a raw KeyError, TypeError,
AttributeError or an allocation past the bound is a failure.
"""

import copy
import json
import os
import shutil
import struct
import tempfile
import zipfile

import numpy as np
import pytest

import hypothesis
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from keras_vit.models import memory  # noqa: E402
from keras_vit.base.limits import MEMORY_SLACK  # noqa: E402
from keras_vit.zoo import sources  # noqa: E402

# The memory the bound is checked against here: a model that reaches the
# build step must be estimated under MEMORY_SLACK times this.
AVAILABLE = 4 << 30
EXAMPLES = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


class BuiltError(Exception):
    """Raised instead of building: the file passed every check."""


@pytest.fixture
def bounded(monkeypatch):
    """zoo.load with the build replaced by a check of the bound, on a
    machine of AVAILABLE bytes."""
    monkeypatch.setattr(memory, "available_memory", lambda: AVAILABLE)

    def build(checkpoint, **kwargs):
        est = memory.config_estimate({**checkpoint.config, **kwargs})
        if est is not None:
            assert est["weights"] + est["activations"] <= (
                MEMORY_SLACK * AVAILABLE), est
        raise BuiltError

    monkeypatch.setattr(sources, "build", build)


# -- the files, written by their own libraries ------------------------------------

@pytest.fixture(scope="module")
def timm_folder(tmp_path_factory):
    import timm
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False,
                              img_size=32, num_classes=3, depth=1)
    path = tmp_path_factory.mktemp("timm")
    timm.models.save_for_hf(model, str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def transformers_folder(tmp_path_factory):
    import transformers
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, image_size=32, patch_size=16, num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "bird"},
        label2id={"cat": 0, "dog": 1, "bird": 2})
    path = tmp_path_factory.mktemp("transformers")
    transformers.ViTForImageClassification(config).save_pretrained(
        str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def keras_hub_folder(tmp_path_factory):
    import keras_hub
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=16, num_layers=1, num_heads=2,
        hidden_dim=32, mlp_dim=64)
    task = keras_hub.models.ViTImageClassifier(backbone=backbone,
                                               num_classes=3)
    path = tmp_path_factory.mktemp("keras_hub")
    task.save_to_preset(str(path))
    return path


def _tiny():
    import keras_vit

    return keras_vit.vit(image_size=32, patch_size=16, hidden_size=32,
                         num_layers=1, num_heads=2, mlp_dim=64, num_classes=3,
                         label_names=["cat", "dog", "bird"])


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keras") / "model.keras"
    _tiny().save(path)
    return path


@pytest.fixture(scope="module")
def npz_file(tmp_path_factory):
    from keras_vit import zoo

    path = tmp_path_factory.mktemp("npz") / "vit.npz"
    zoo.save_npz(_tiny(), path)
    return path


# -- mutations --------------------------------------------------------------------

HOSTILE = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([0, -1, -2**63, 2**31, 10**6, 10**9, 2**64, 1e308, -0.5,
                     1.5, float("nan"), float("inf"), "", "x" * 300, "3",
                     "LABEL_0", [], {}, [0], [-1, 3], [10**9, 10**9],
                     [3, 10**6, 10**6], {"a": 1}, [[[[]]]]]),
    st.integers(-2**70, 2**70), st.text(max_size=12),
    st.lists(st.integers(-3, 10**7), max_size=4))


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):
            yield from _paths(value, prefix + (i,))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _dumps(obj, dup):
    """JSON text of ``obj``; ``dup`` ``(dict, key, value)`` adds ``key``
    once more to that dict (JSON allows it; parsers keep the last)."""
    if isinstance(obj, dict):
        items = [f"{json.dumps(k)}: {_dumps(v, dup)}" for k, v in obj.items()]
        if dup is not None and dup[0] is obj:
            items.append(f"{json.dumps(dup[1])}: {json.dumps(dup[2])}")
        return "{" + ", ".join(items) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(_dumps(v, dup) for v in obj) + "]"
    return json.dumps(obj)


@st.composite
def json_mutation(draw, doc, skip=()):
    """The JSON text of ``doc`` with one change."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p and not any(
        p[:len(s)] == s for s in skip)]
    path = draw(st.sampled_from(paths))
    parent, key = _at(doc, path[:-1]), path[-1]
    action = draw(st.sampled_from(["set", "set", "delete", "extra",
                                   "duplicate"]))
    dup = None
    if action == "set":
        parent[key] = draw(HOSTILE)
    elif action == "delete":
        del parent[key]
    elif action == "extra" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(HOSTILE)
    elif action == "extra":
        parent.append(draw(HOSTILE))
    elif isinstance(parent, dict):
        dup = (parent, key, draw(HOSTILE))
    else:
        parent.append(parent[key])
    return _dumps(doc, dup)


def _event(name):
    """Counts an outcome in hypothesis' statistics (inside a test)."""
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        hypothesis.event(name)


def _outcome(load, where):
    """Runs ``load``; passes for Built or a refusal (CheckpointError,
    ValueError, OSError) naming ``where`` in one line. A raw KeyError,
    TypeError or AttributeError (a reader that trusted a field's presence
    or type) fails, as does loading without reaching the build step."""
    from keras_vit.zoo import CheckpointError

    try:
        load()
    except BuiltError:
        _event("built")
        return "built"
    except (CheckpointError, ValueError, OSError) as e:
        assert str(where) in str(e), f"{type(e).__name__}: {e}"
        assert "\n" not in str(e).strip(), str(e)
        _event(f"refused: {type(e).__name__}")
        return type(e).__name__
    except (KeyError, TypeError, AttributeError) as e:
        raise AssertionError(f"a raw {type(e).__name__} instead of a refusal "
                             f"naming {where}: {e!r}") from e
    raise AssertionError("loaded without reaching the build step")


def _copy(src):
    dst = tempfile.mkdtemp(prefix="mutated_")
    folder = os.path.join(dst, "repo")
    shutil.copytree(src, folder)
    return folder


def _run_json(src, name, text):
    from keras_vit import zoo

    folder = _copy(src)
    try:
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
        return _outcome(lambda: zoo.load(folder), folder)
    finally:
        shutil.rmtree(os.path.dirname(folder))


def _doc(folder, name):
    return json.loads((folder / name).read_text())


# -- the tests, one per format ------------------------------------------------------

def test_the_unmutated_files_load(bounded, timm_folder, transformers_folder,
                                  keras_hub_folder, keras_file, npz_file):
    """The base of every mutation reaches the build step."""
    from keras_vit import zoo

    for folder in (timm_folder, transformers_folder, keras_hub_folder,
                   keras_file):
        assert _outcome(lambda f=folder: zoo.load(str(f)), folder) == "built"
    assert _outcome(lambda: zoo.load("ViT-Ti/16", weights=str(npz_file),
                                     num_layers=1, hidden_size=32,
                                     num_heads=2, mlp_dim=64),
                    npz_file) == "built"


@EXAMPLES
@given(data=st.data())
def test_timm_config(bounded, timm_folder, data):
    text = data.draw(json_mutation(_doc(timm_folder, "config.json")))
    _run_json(timm_folder, "config.json", text)


@EXAMPLES
@given(data=st.data())
def test_transformers_config(bounded, transformers_folder, data):
    text = data.draw(json_mutation(_doc(transformers_folder, "config.json")))
    _run_json(transformers_folder, "config.json", text)


@EXAMPLES
@given(data=st.data(), name=st.sampled_from(
    ["config.json", "task.json", "metadata.json"]))
def test_keras_hub_preset_files(bounded, keras_hub_folder, data, name):
    text = data.draw(json_mutation(_doc(keras_hub_folder, name)))
    _run_json(keras_hub_folder, name, text)


def _safetensors_parts(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


@st.composite
def tensor_mutation(draw, header):
    """A header with one tensor entry changed (or the text with a tensor
    named twice)."""
    header = copy.deepcopy(header)
    name = draw(st.sampled_from(sorted(k for k in header
                                       if k != "__metadata__")))
    entry = header[name]
    action = draw(st.sampled_from(["dtype", "shape", "offsets", "twice",
                                   "json"]))
    dup = None
    if action == "dtype":
        entry["dtype"] = draw(st.sampled_from(
            ["I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "X9", 7]))
    elif action == "shape":
        entry["shape"] = draw(st.one_of(
            st.lists(st.integers(-2, 2**40), max_size=9), HOSTILE))
    elif action == "offsets":
        entry["data_offsets"] = draw(st.one_of(
            st.lists(st.integers(-1, 2**63), min_size=2, max_size=2),
            HOSTILE))
    elif action == "twice":
        other = draw(st.sampled_from(sorted(k for k in header
                                            if k != "__metadata__")))
        dup = (header, other, dict(entry))
    else:
        return draw(json_mutation(header))
    return _dumps(header, dup)


@EXAMPLES
@given(data=st.data(), which=st.sampled_from(["timm", "transformers"]))
def test_safetensors_headers(bounded, timm_folder, transformers_folder, data,
                             which):
    from keras_vit import zoo

    src = timm_folder if which == "timm" else transformers_folder
    header, body = _safetensors_parts(src / "model.safetensors")
    raw = data.draw(tensor_mutation(header)).encode()
    folder = _copy(src)
    try:
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw + body)
        _outcome(lambda: zoo.load(folder), folder)
    finally:
        shutil.rmtree(os.path.dirname(folder))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_keras_file_config(bounded, keras_file, data):
    from keras_vit import zoo

    with zipfile.ZipFile(keras_file) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    doc = json.loads(members["config.json"])
    # The model config's fields; the outer ones name the class Keras
    # deserialises (checked too, but mostly refused by Keras itself).
    text = data.draw(json_mutation(doc, skip=(("build_config",),
                                              ("compile_config",))))
    folder = tempfile.mkdtemp(prefix="mutated_")
    path = os.path.join(folder, "model.keras")
    try:
        with zipfile.ZipFile(path, "w") as archive:
            for name, raw in members.items():
                archive.writestr(name, text if name == "config.json" else raw)
        _outcome(lambda: zoo.load(path), path)
    finally:
        shutil.rmtree(folder)


@EXAMPLES
@given(key=st.integers(0, 100), change=st.sampled_from(
    ["int32", "int64", "bool", "complex64", "U3", "float16", "ndim",
     "extra", "drop", "twice"]))
def test_official_npz(bounded, npz_file, key, change):
    from keras_vit import zoo

    with np.load(npz_file) as archive:
        arrays = dict(archive)
    name = sorted(arrays)[key % len(arrays)]
    folder = tempfile.mkdtemp(prefix="mutated_")
    path = os.path.join(folder, "vit.npz")
    try:
        if change in ("int32", "int64", "bool", "complex64", "U3",
                      "float16"):
            arrays[name] = arrays[name].astype(change)
        elif change == "ndim":
            arrays[name] = arrays[name].reshape((1,) * 6 + arrays[name].shape)
        elif change == "extra":
            arrays["extra/kernel"] = np.zeros(3, "float32")
        elif change == "drop":
            del arrays[name]
        np.savez(path, **arrays)
        if change == "twice":  # a second member of the same name
            with zipfile.ZipFile(path, "a") as archive, \
                    pytest.warns(UserWarning):
                archive.writestr(name + ".npy", b"\x93NUMPY" + b"\0" * 64)
        _outcome(lambda: zoo.load(
            "ViT-Ti/16", weights=path, num_layers=1, hidden_size=32,
            num_heads=2, mlp_dim=64), path)
    finally:
        shutil.rmtree(folder)


def test_safetensors_holes_are_refused_by_name(tmp_path):
    """An integer tensor where weights are floats (int32 ones were cast
    into the model silently), and a header naming one tensor twice
    (readers would disagree on which one counts)."""
    from safetensors.numpy import save_file

    from keras_vit.zoo import formats, hub_files

    ints = tmp_path / "ints.safetensors"
    save_file({"a": np.zeros(2, "float32"), "b": np.zeros(2, "int32")},
              str(ints))
    with pytest.raises(formats.FormatError, match=r"field b.dtype: .*'I32'"):
        hub_files.check_safetensors(ints)
    header, body = _safetensors_parts(ints)
    twice = tmp_path / "twice.safetensors"
    raw = (_dumps({"a": header["a"]}, None)[:-1]
           + f", {json.dumps('a')}: {json.dumps(header['a'])}}}").encode()
    twice.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    with pytest.raises(formats.FormatError, match="field a: is given twice"):
        hub_files.check_safetensors(twice)


def test_the_examples_once_accepted_are_refused_by_name(
        timm_folder, keras_hub_folder, transformers_folder, tmp_path):
    """A label list shorter than the head, a keras-hub task.json whose
    preprocessor config is a list (a raw AttributeError once), an int64
    tensor: each refused with the file and the field named."""
    from safetensors.numpy import load_file, save_file

    from keras_vit import zoo
    from keras_vit.zoo import formats

    short = _copy(timm_folder)
    config = json.loads(open(os.path.join(short, "config.json")).read())
    config["label_names"] = ["cat", "dog"]  # the head has 3 classes
    with open(os.path.join(short, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(formats.FormatError, match="field label_names: names "
                       "2 classes for a head of 3") as e:
        zoo.load(short)
    assert os.path.join(short, "config.json") in str(e.value)

    listed = _copy(keras_hub_folder)
    task = json.loads(open(os.path.join(listed, "task.json")).read())
    task["config"]["preprocessor"] = {"class_name": "x", "config": [1, 2]}
    with open(os.path.join(listed, "task.json"), "w") as f:
        json.dump(task, f)
    with pytest.raises(formats.FormatError,
                       match="field config.preprocessor.config") as e:
        zoo.load(listed)
    assert os.path.join(listed, "task.json") in str(e.value)

    ints = _copy(transformers_folder)
    path = os.path.join(ints, "model.safetensors")
    arrays = load_file(path)
    arrays["classifier.bias"] = arrays["classifier.bias"].astype("int64")
    save_file(arrays, path)
    with pytest.raises(formats.FormatError,
                       match="field classifier.bias.dtype") as e:
        zoo.load(ints)
    assert path in str(e.value)
