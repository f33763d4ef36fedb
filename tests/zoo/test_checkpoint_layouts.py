"""The layouts are rules read both ways (zoo/layouts.py): what a layout
writes of a model it reads back onto the same variables, exactly, for every
option that adds weights; its names are patterns whose fields survive any
number; and a file that does not fit is named by the file's own keys."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_vit.models.resnet_v2 import resnet_v2
from keras_vit.models.vit import vit
from keras_vit.zoo import convert, layouts
from keras_vit.zoo.checkpoints import CheckpointError
from keras_vit.zoo.official.bit import BIT
from keras_vit.zoo.timm.layout import TIMM, TIMM_BIT
from keras_vit.zoo.layouts import Layout, Rule

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=2,
            num_heads=2, mlp_dim=16, num_classes=3)
# Between them, every option row whose weights are new, each pooling and
# the hybrid stem.
MODELS = {
    "family": dict(num_registers=2, layer_scale=0.1, qk_norm=True,
                   pre_norm=True, fc_norm=True, patch_norm=True,
                   classifier="gap", class_token=False),
    "swiglu_map": dict(mlp="swiglu", classifier="map"),
    "distilled": dict(distilled=True),
    "hybrid": dict(resnet=dict(num_layers=(1,), width_factor=0.5),
                   patch_size=1, image_size=32),
}


def _random(model, seed=0):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.standard_normal(tuple(v.shape)).astype("float32"))
    return {v.path: np.asarray(v.numpy()) for v in model.weights}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    m = vit(**{**TINY, **MODELS[request.param]})
    return m, _random(m)


@pytest.mark.parametrize("layout", [convert.OFFICIAL, TIMM],
                         ids=["official", "timm"])
def test_a_vit_layout_reads_back_what_it_writes(layout, model):
    """Every variable has a key, every key reads back onto its variable,
    the arrays equal to the bit, and the strict load assigns them."""
    m, arrays = model
    written = layout.write(arrays)
    assert not layout.unknown(written)
    back, names = layout.read(written, {p: a.shape for p, a in arrays.items()})
    assert sorted(back) == sorted(arrays)
    for path, value in arrays.items():
        np.testing.assert_array_equal(np.asarray(back[path]), value)
        assert names[path] == layout.key_of(path)
    copy = vit(**m.get_config())
    report = layouts.load(copy, layout, written, source_name="<written>")
    assert report["head"] == "loaded"
    for v in copy.weights:
        np.testing.assert_array_equal(np.asarray(v.numpy()), arrays[v.path])


def test_timms_unpacked_swiglu_is_a_variant_read_either_way():
    m = vit(**TINY, mlp="swiglu")
    arrays = _random(m, 1)
    packed, halves = TIMM.write(arrays), TIMM.write(arrays, ("unpacked_glu",))
    assert "blocks.0.mlp.fc1.weight" in packed
    assert {"blocks.0.mlp.fc1_g.weight", "blocks.0.mlp.fc1_x.weight"} <= set(
        halves) and "blocks.0.mlp.fc1.weight" not in halves
    # The gate is the first half of the packed layer.
    np.testing.assert_array_equal(halves["blocks.1.mlp.fc1_g.bias"],
                                  packed["blocks.1.mlp.fc1.bias"][:16])
    for state in (packed, halves):
        back, _ = TIMM.read(state, {p: a.shape for p, a in arrays.items()})
        for path, value in arrays.items():
            np.testing.assert_array_equal(back[path], value)
    # Both forms of one layer: named, never one of them silently taken.
    with pytest.raises(CheckpointError, match=(
            r"encoder_block_0/mlp/dense_0/kernel twice: in "
            r"blocks\.0\.mlp\.fc1\.weight and in blocks\.0\.mlp\.fc1_g")):
        TIMM.read({**packed, **halves})


@pytest.mark.parametrize("layout", [BIT, TIMM_BIT], ids=["official", "timm"])
def test_a_bit_layout_reads_back_what_it_writes(layout):
    m = resnet_v2(32, (1, 1, 1, 1), 0.5, 3)
    arrays = _random(m, 2)
    written = layout.write(arrays)
    back, _ = layout.read(written, {p: a.shape for p, a in arrays.items()})
    assert sorted(back) == sorted(arrays)
    for path, value in arrays.items():
        np.testing.assert_array_equal(back[path], value)


def test_a_file_that_does_not_fit_is_named_in_its_own_keys():
    m = vit(**TINY, qk_norm=True)
    state = TIMM.write(_random(m, 3))
    del state["blocks.1.attn.k_norm.bias"]
    state["blocks.0.attn.qkv.weight"] = state["blocks.0.attn.qkv.weight"][:3]
    state["blocks.0.ls1.gamma"] = np.ones(8, "float32")
    state["blocks.0.attn.rope.freqs"] = np.ones(4, "float32")
    before = [np.asarray(v.numpy()) for v in m.weights]
    with pytest.raises(CheckpointError) as info:
        layouts.load(m, TIMM, state, source_name="'x.safetensors'")
    message = str(info.value)
    assert "'x.safetensors'" in message
    assert "missing from the checkpoint (1): blocks.1.attn.k_norm.bias" in (
        message)
    assert ("unexpected in the checkpoint (2): blocks.0.attn.rope.freqs, "
            "blocks.0.ls1.gamma") in message
    # A packed array of the wrong size: named with its parts' shape.
    assert ("mis-shaped (3): blocks.0.attn.qkv.weight: checkpoint (8, 1) "
            "vs model (8, 2, 4)") in message
    for a, v in zip(before, m.weights):  # nothing was assigned
        np.testing.assert_array_equal(a, np.asarray(v.numpy()))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=3, max_size=3),
       st.sampled_from(["same", "flat", "linear", "linear_out"]))
def test_a_rules_fields_survive_any_number(numbers, form):
    """Fields shifted and zero-padded format and parse back to the same
    numbers; a name that only looks like the pattern matches nothing."""
    i, s, u = numbers
    rule = Rule("stage_{s}_unit_{u}/block_{i}/w",
                "stages.{s-1}.blocks.{u:03d}.{i}.weight", form)
    layout = Layout("toy", [rule])
    path = f"stage_{s + 1}_unit_{u}/block_{i}/w"
    key = layout.key_of(path)
    assert key == f"stages.{s}.blocks.{u:03d}.{i}.weight"
    value = np.arange(6, dtype="float32").reshape(2, 3)
    back, names = layout.read(layout.write({path: value}),
                              {path: value.shape})
    np.testing.assert_array_equal(back[path], value)
    assert names[path] == key
    assert layout.key_of(path + "x") is None
    assert layout.unknown([key + ".x", "prefix." + key]) == [
        key + ".x", "prefix." + key]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TIMM.write(_random(vit(**TINY, mlp="swiglu")))
                              )),
       st.lists(st.integers(0, 5), max_size=4))
def test_an_array_of_any_shape_loads_or_is_named(key, shape):
    """A timm file whose one array has a hostile shape (a scalar, an empty
    axis, another rank, another size) is refused by a CheckpointError
    naming that array, and the model keeps its weights (never an
    IndexError from a reshape), unless it is a head kernel of another
    number of classes, which a zero head replaces."""
    m = vit(**TINY, mlp="swiglu")
    state = TIMM.write(_random(m, 4))
    if int(np.prod(shape)) == state[key].size:
        return  # as many numbers: a form reshapes them (a bias into heads)
    state[key] = np.zeros(shape, "float32")
    before = [np.asarray(v.numpy()) for v in m.weights]
    try:
        report = layouts.load(m, TIMM, state, source_name="'hostile'")
    except CheckpointError as e:
        assert key in str(e)
        for a, v in zip(before, m.weights):  # nothing was assigned
            np.testing.assert_array_equal(a, np.asarray(v.numpy()))
        return
    # Loaded: only as a head of another number of classes, which a new
    # zero head replaces (the model's own size decides).
    assert key == "head.weight" and report["head"] == "replaced", report
    np.testing.assert_array_equal(m.get_layer("head").kernel.numpy(), 0)


# A model-side shape for each form, built from hypothesis' sizes: the
# shapes the model's variables have where a rule of that form reads.
_MODEL_SHAPES = {
    "same": lambda a, b, c, d: (a, b, c),
    "flat": lambda a, b, c, d: (a, b),
    "linear": lambda a, b, c, d: (a, b, c),
    "linear_out": lambda a, b, c, d: (a, b, c),
    "table": lambda a, b, c, d: (1, a, b),
    "patch_linear": lambda a, b, c, d: (a, a, b, c),
    "conv": lambda a, b, c, d: (a, b, c, d),
    "dense_1x1": lambda a, b, c, d: (a, b),
    "torch_dense_1x1": lambda a, b, c, d: (a, b),
}


def _reshaped(shape, how):
    """Another arrangement of as many numbers as ``shape`` holds."""
    return {"reversed": shape[::-1], "flat": (int(np.prod(shape)),),
            "rows": (shape[0] * (shape[1] if len(shape) > 1 else 1),
                     *shape[2:]),
            "unit": (1, *shape)}[how]


def test_every_form_has_a_model_shape_in_the_test():
    assert sorted(_MODEL_SHAPES) == sorted(layouts.FORMS)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(_MODEL_SHAPES)),
       st.lists(st.integers(1, 4), min_size=4, max_size=4),
       st.sampled_from(["reversed", "flat", "rows", "unit"]))
def test_a_rearranged_array_reads_back_or_is_refused(form, sizes, how):
    """A file whose array holds the right numbers in another arrangement
    (a header that says (in, out) for a Linear's (out, in), a weight
    flattened) either reads back as the model's exact array, or is a
    shape the strict load names as mis-shaped, or is refused naming its
    key: never the numbers reshaped into the model's shape, scrambled."""
    model_shape = _MODEL_SHAPES[form](*sizes)
    value = np.arange(int(np.prod(model_shape)), dtype="float32").reshape(
        model_shape)
    layout = Layout("toy", [Rule("w", "blocks.0.w", form)])
    stored = layout.write({"w": value})["blocks.0.w"]
    other = _reshaped(stored.shape, how)
    if tuple(other) == stored.shape:
        return
    try:
        back, _ = layout.read({"blocks.0.w": stored.reshape(other)},
                              {"w": model_shape})
    except CheckpointError as e:
        assert "blocks.0.w" in str(e) and str(tuple(other)) in str(e)
        return
    read = np.asarray(back["w"])
    if read.shape == model_shape:
        np.testing.assert_array_equal(read, value)


@pytest.mark.parametrize("dtype", ["bool", "int32", "uint8", "complex64",
                                   "object", "U3"])
def test_an_array_of_other_numbers_than_floats_is_refused(dtype):
    """Only floating-point arrays load as weights: booleans, integers,
    complex numbers and strings are refused naming the key and dtype."""
    m = vit(**TINY)
    state = TIMM.write(_random(m, 5))
    key = "blocks.0.mlp.fc1.weight"
    state[key] = np.ones(state[key].shape, dtype)
    with pytest.raises(CheckpointError, match=re.escape(f"{key} holds {np.dtype(dtype)} ")):
        layouts.load(m, TIMM, state, source_name="'x'")
