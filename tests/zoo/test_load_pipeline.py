"""One load pipeline: the same checkpoint through ``zoo.load``,
``resolve_model`` and the command line's model resolution gives the same
model (config and weights) for every source kind, and the same refusal
for what none may read (an ambiguous folder, an argument a source cannot
honour). Tiny random models at 32x32, written by each layout's own
writer; nothing leaves the disk."""

import argparse
import os
import shutil

import numpy as np
import pytest

from keras_vit import zoo
from keras_vit.zoo import resolve_model

NAME = "ViT-Ti/16"
NAMES = ["cat", "dog", "bird"]
TINY = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64)


@pytest.fixture(scope="module")
def model():
    import keras_vit

    model = keras_vit.vit(**TINY, num_classes=3, gelu="exact",
                          label_names=NAMES)
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _timm(model, path):
    return str(zoo.save_pretrained(model, path / "timm"))


def _transformers(model, path):
    return str(zoo.save_pretrained(model, path / "hf", layout="transformers"))


def _keras_hub(model, path):
    return str(zoo.save_pretrained(model, path / "kh", layout="keras-hub"))


def _keras(model, path):
    model.save(path / "model.keras")
    return str(path / "model.keras")


def _run_dir(model, path):
    (path / "run").mkdir()
    model.save(path / "run" / "model.keras")
    return str(path / "run")


WRITERS = {"timm": _timm, "transformers": _transformers,
           "keras-hub": _keras_hub, "keras": _keras, "run": _run_dir}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def written(request, model, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param.replace("-", "_"))
    return request.param, WRITERS[request.param](model, path)


def _cli(spec, weights=None, image_size=None):
    """The model ``keras-vit predict`` resolves for MODEL ``spec``."""
    from keras_vit import cli

    args = argparse.Namespace(model=spec, weights=weights,
                              image_size=image_size)
    return cli._load_for_predict(args)[0]


def _same(a, b, what):
    config_a, config_b = a.get_config(), b.get_config()
    assert config_a == config_b, what
    assert len(a.weights) == len(b.weights), what
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                      err_msg=f"{what}: {x.path}")


@pytest.mark.parametrize("size", [None, 48])
def test_every_path_loads_the_same_model(written, model, size):
    kind, spec = written
    loaded = zoo.load(spec, image_size=size)
    _same(loaded, resolve_model(spec, image_size=size), f"{kind} resolve")
    _same(loaded, _cli(spec, image_size=size), f"{kind} cli")
    assert loaded.image_size == (size or 32)
    assert loaded.label_names == tuple(NAMES), kind  # every writer kept them
    if size is None:
        x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3))
        np.testing.assert_allclose(np.asarray(loaded(x)),
                                   np.asarray(model(x)), atol=1e-5, rtol=0)


def test_a_new_head_drops_the_names_on_every_path(written):
    kind, spec = written
    for got in (zoo.load(spec, num_classes=5),
                resolve_model(spec, num_classes=5)):
        assert got.num_classes == 5 and got.label_names is None, kind
    renamed = zoo.load(spec, num_classes=2, label_names=["a", "b"])
    assert renamed.label_names == ("a", "b")


def test_weights_a_source_holds_itself(written):
    """weights= other than 'auto' with a file or folder is refused by name
    (it was ignored); None is the architecture, randomly initialised."""
    kind, spec = written
    for call in (lambda: zoo.load(spec, weights="augreg"),
                 lambda: resolve_model(spec, weights="augreg"),
                 lambda: _cli(spec, weights="augreg")):
        with pytest.raises(Exception, match="weights") as e:
            call()
        assert "augreg" in str(e.value)
    trained = zoo.load(spec)
    for how, random in (("zoo.load", zoo.load(spec, weights=None)),
                        ("resolve_model", resolve_model(spec, weights=None))):
        assert random.label_names is None  # random classes have no names
        assert random.get_config() == dict(trained.get_config(),
                                           label_names=None), (kind, how)
        # Fresh weights, not the file's (a .keras file once gave its own).
        kept = [w.path for w, t in zip(random.weights, trained.weights)
                if np.array_equal(np.asarray(w), np.asarray(t))]
        assert not kept, f"{kind} {how} weights=None kept the file's {kept}"


def test_a_dtype_asked_on_every_path_survives_save_and_reload(
        written, tmp_path):
    """The policy a copy is built under is in its config, so that
    model.save and a reload keep it (a .keras file's copy and rebuild
    once said dtype=None and came back float32). A mixed policy takes the
    same path: its name is what the config keeps."""
    import keras

    kind, spec = written
    dtype = "mixed_bfloat16"
    for how, got in (
            ("zoo.load", zoo.load(spec, dtype=dtype)),
            ("weights=None", zoo.load(spec, weights=None, dtype=dtype)),
            ("resolve_model", resolve_model(spec, dtype=dtype)),
            ("rebuild", zoo.rebuild(zoo.load(spec), dtype=dtype))):
        assert got.dtype_policy.name == dtype, (kind, how)
        got.save(tmp_path / "copy.keras")
        back = keras.saving.load_model(str(tmp_path / "copy.keras"))
        assert (back.dtype_policy.name, back.get_config()["dtype"]) == (
            dtype, dtype), f"{kind} {how} then save"


@pytest.fixture(scope="module")
def ambiguous(model, tmp_path_factory):
    """A folder holding a fine-tune run's model.keras and a transformers
    repository."""
    path = tmp_path_factory.mktemp("both")
    zoo.save_pretrained(model, path, layout="transformers")
    model.save(path / "model.keras")
    return str(path)


def test_an_ambiguous_folder_is_refused_everywhere(ambiguous):
    from keras_vit.zoo.resolve import model_path

    for call in (lambda: zoo.load(ambiguous),
                 lambda: resolve_model(ambiguous),
                 lambda: _cli(ambiguous),
                 lambda: model_path(ambiguous)):
        with pytest.raises(ValueError, match="is ambiguous.*transformers"
                           ".*keras"):
            call()


def test_the_command_line_reads_a_keras_hub_preset(model, tmp_path):
    """The CLI once refused a preset zoo.load reads."""
    preset = _keras_hub(model, tmp_path)
    _same(_cli(preset), zoo.load(preset), "keras-hub cli")


def test_a_pickle_only_folder_says_how_to_convert(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"never read")
    (tmp_path / "config.json").write_text('{"architecture": '
                                          '"vit_tiny_patch16_224"}')
    for call in (lambda: zoo.load(str(tmp_path)),
                 lambda: resolve_model(str(tmp_path))):
        with pytest.raises(OSError) as e:
            call()
        assert "pytorch_model.bin" in str(e.value)
        assert "save_for_hf" in str(e.value)
        assert "safe_serialization=True" in str(e.value)


def test_a_foreign_keras_model_is_not_changed_silently(tmp_path):
    import keras

    seq = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="image_size=48"):
        zoo.rebuild(seq, image_size=48)
    with pytest.raises(TypeError, match="model=None"):
        zoo.rebuild(None)
    seq.save(tmp_path / "seq.keras")
    assert isinstance(resolve_model(str(tmp_path / "seq.keras")),
                      keras.Sequential)
    with pytest.raises(ValueError, match="num_classes=4"):
        resolve_model(str(tmp_path / "seq.keras"), num_classes=4)


def test_what_timm_writes_keras_vit_reads(tmp_path):
    """timm's own writer (save_for_hf with safetensors) records
    model_args such as in_chans and depth: each honoured, the logits
    timm's."""
    import timm
    import torch
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False,
                            img_size=32, num_classes=3, depth=2).eval()
    timm.models.save_for_hf(net, str(tmp_path), safe_serialization=True)
    ours = zoo.load(str(tmp_path))
    assert ours.num_layers == 2 and ours.image_size == 32
    x = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3))
    with torch.no_grad():
        want = net(torch.tensor(x.transpose(0, 3, 1, 2),
                                dtype=torch.float32)).numpy()
    np.testing.assert_allclose(np.asarray(ours(x.astype("float32"))), want,
                               atol=2e-5, rtol=0)
    # A block whose weights the file cannot hold is refused naming the
    # setting (blocks of several branches); one it honours but whose
    # weights the file lacks (q/k norm) or holds beside (parallel blocks
    # have no second norm) is refused naming those arrays.
    import json

    written = (tmp_path / "config.json").read_text()
    for key, value, needle in (
            ("block_fn", "ParallelThingsBlock",
             r"field model_args\.block_fn: block_fn='ParallelThingsBlock' "
             r"keeps each block's branches under blocks\.<i>\.attns\.<b> "
             r"and ffns\.<b>, and .*model\.safetensors has none"),
            ("block_fn", "ParallelScalingBlock",
             r"unexpected in the checkpoint .*blocks\.0\.norm2\.bias"),
            ("qk_norm", True, r"missing .*blocks\.0\.attn\.q_norm\.weight")):
        config = json.loads(written)
        config["model_args"][key] = value
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=needle):
            zoo.load(str(tmp_path))


@pytest.mark.parametrize("call, needle", [
    (lambda: zoo.list_models(5), "pattern=5"),
    (lambda: zoo.labels("../../x"), "name='../../x'"),
    (lambda: zoo.labels(5), "name=5"),
    (lambda: zoo.save_pretrained(_model3(), "/tmp/never", labels=5),
     "labels=5"),
    (lambda: zoo.save_pretrained(_model3(), "/tmp/never", labels=["a"]),
     "labels has 1 name for a head of 3 classes"),
    (lambda: zoo.save_pretrained(_model3(), ""), "directory=''"),
    (lambda: zoo.save_npz(_model3(), ""), "path=''"),
    (lambda: zoo.save_npz(_model3(), None), "path=None"),
    (lambda: zoo.load(NAME, weights=None, image_size=100000),
     "image_size=100000"),
    (lambda: zoo.load(NAME, weights=None, image_size=14000),
     "image_size=14000"),
])
def test_public_functions_check_their_arguments(call, needle):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert needle in str(e.value), str(e.value)
    assert not os.path.exists("/tmp/never")


@pytest.mark.parametrize("then", ["timm", "transformers", "keras-hub"])
@pytest.mark.parametrize("first", ["timm", "transformers", "keras-hub",
                                   "keras"])
def test_save_pretrained_into_a_used_folder(model, tmp_path, first, then):
    """A save over one of its own layout replaces it; over another model's
    files it is refused naming the folder and what it holds (both once
    stayed, a folder zoo.load refuses as ambiguous)."""
    folder = tmp_path / "out"
    if first == "keras":
        folder.mkdir()
        model.save(folder / "model.keras")
    else:
        zoo.save_pretrained(model, folder, layout=first)
    before = sorted(os.listdir(folder))
    if first == then:
        zoo.save_pretrained(model, folder, layout=then)
        _same(zoo.load(str(folder)), zoo.load(str(folder)), then)
        return
    with pytest.raises(ValueError) as e:
        zoo.save_pretrained(model, folder, layout=then)
    assert f"directory={str(folder)!r} holds" in str(e.value), str(e.value)
    assert first in str(e.value), str(e.value)
    assert sorted(os.listdir(folder)) == before
    _same(zoo.load(str(folder)), zoo.load(str(folder)), first)


@pytest.mark.parametrize("layout", ["timm", "transformers", "keras-hub"])
def test_a_folder_named_like_a_keras_file_is_a_folder(model, tmp_path,
                                                      layout):
    """A folder's name is no file's: zoo.load once said it held a .keras
    file."""
    folder = str(tmp_path / "export.keras")
    zoo.save_pretrained(model, folder, layout=layout)
    assert zoo.load(folder).label_names == tuple(NAMES)


def _model3():
    import keras_vit

    return keras_vit.vit(**TINY, num_classes=3, gelu="exact")


def test_a_keras_file_deeper_than_its_weights_is_refused_before_building(
        tmp_path, model, monkeypatch):
    """num_layers=2000 in a small file's config once built for minutes
    before failing for another reason."""
    import json
    import zipfile

    src = tmp_path / "m.keras"
    model.save(src)
    with zipfile.ZipFile(src) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    config = json.loads(members["config.json"])
    bad = tmp_path / "bad.keras"
    for layers, needle in ((2000, "num_layers=2000"),
                          (200, "num_layers=200 needs")):
        config["config"]["num_layers"] = layers
        members["config.json"] = json.dumps(config).encode()
        with zipfile.ZipFile(bad, "w") as archive:
            for name, raw in members.items():
                archive.writestr(name, raw)
        import keras

        def never(*args, **kwargs):
            raise AssertionError("Keras was asked to build it")

        monkeypatch.setattr(keras.saving, "load_model", never)
        with pytest.raises(ValueError, match=needle) as e:
            zoo.load(str(bad))
        assert str(bad) in str(e.value)
        monkeypatch.undo()
    shutil.rmtree(tmp_path)


def _public_functions():
    import inspect

    out = []
    for name in sorted(zoo.__all__):
        value = getattr(zoo, name)
        if isinstance(value, type) or not callable(value):
            continue
        params = [p for p in inspect.signature(value).parameters.values()
                  if p.kind == p.POSITIONAL_OR_KEYWORD]
        if params and name not in ("augreg_index", "cache_dir",
                                   "preprocess_input", "preprocessing_layer",
                                   "decode_predictions"):
            out.append((name, params[0].name, sum(
                p.default is p.empty for p in params)))
    return out


def test_public_functions_refuse_hostile_arguments_by_name(monkeypatch,
                                                            tmp_path):
    """Every public function of the zoo, given a value of the wrong type
    or a hostile string as its first argument, raises one of the
    package's errors naming that argument (or echoing the value), never
    a raw AttributeError / KeyError from inside."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    functions = _public_functions()
    assert {"load", "rebuild", "save_pretrained", "list_models", "labels",
            "resolve_model", "export_arrays"} <= {f[0] for f in functions}
    missing = str(tmp_path / "nothing")

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(st.sampled_from(functions), st.sampled_from(
        [None, 5, 2.5, True, [], {}, b"x", "", "\x00", "../../x", -1,
         ["a"], {"a": 1}, float("nan")]))
    def check(function, value):
        name, argument, required = function
        args = [value] + [missing] * (required - 1)
        try:
            getattr(zoo, name)(*args)
        except (TypeError, ValueError, OSError) as e:
            assert argument in str(e) or repr(value)[:20] in str(e), (
                f"{name}({value!r}): {type(e).__name__}: {e}")

    check()


def test_every_source_line_has_its_module_and_functions():
    """The sources list is an explicit registry: each line's module is
    imported by its written name, and has the predicate and the reader
    the line names."""
    import inspect

    from keras_vit.zoo import sources

    for source in sources.SOURCES + (sources.OFFICIAL,):
        module = sources.reader_module(source.name)
        read = getattr(module, source.read_name)
        assert {"progress", "prefer_size", "sizes", "argument"} <= set(
            inspect.signature(read).parameters), source.name
        if source.claims_name is not None:
            assert callable(getattr(module, source.claims_name))
    with pytest.raises(ValueError, match="no source is named 'x'"):
        sources.reader_module("x")


def test_a_model_too_large_for_memory_is_refused_before_building(
        monkeypatch, written):
    """The settled config is bounded by one estimate (weights, position
    table, one image's activations) before anything is built, for every
    source; the error names the field and its value."""
    from keras_vit.models import memory
    from keras_vit.zoo import sources

    kind, spec = written
    monkeypatch.setattr(memory, "available_memory", lambda: 8 << 30)

    def never(*args, **kwargs):
        raise AssertionError("built")

    monkeypatch.setattr(sources, "build", never)
    for call in (lambda: zoo.load(spec, image_size=4000),
                 lambda: zoo.load(NAME, weights=None, image_size=4000)):
        with pytest.raises(ValueError, match=r"at 4000x4000 \(62,501 tokens"
                           r"\) needs about .*lower --image-size"):
            call()
