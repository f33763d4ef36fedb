"""BiT ResNet-v2: parameter counts, parity with timm, the checkpoint layout.

Random checkpoints are written by ``bit_arrays`` below, whose keys and shapes
are transcribed from the official big_transfer layout (not derived from
keras_vit), then loaded by timm's own npz loader and by keras_vit.
"""

import functools
import importlib

import keras
import numpy as np
import pytest

import published_counts
import official
from conftest import count_params
from flax_init import check_init as _check_init
from testkit import bad_calls_test
import keras_vit

from keras_vit.models.resnet_v2 import (BIT_DEPTHS, BIT_VARIANTS,
                                        PreActBottleneck, ResNetV2, resnet_v2)
from keras_vit.runtime.backend import to_numpy
from keras_vit.layers import StdConv2D
from keras_vit.zoo.official import bit as bit_layout
from keras_vit.zoo.checkpoints import CheckpointError

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends

# timm's counts (tests/published_counts.py), keyed R50x1, ...
PARAMS_224_1000 = published_counts.of_family("BiT-", strip=True)
# Built in Keras by test_parameter_count; R152x4 (66 s, 5 GB to build) is
# checked through _formula_count only, which the built ones verify.
BUILT = {"R50x1": False, "R101x1": False, "R50x3": True, "R101x3": True,
         "R152x2": True}

TINY_UNITS = (2, 1, 1, 1)
TINY_WIDTH = 0.5  # the smallest width whose channels 32 groups divide
TINY_IMAGE = 64


def _variant(name):
    depth, width = name[1:].split("x")
    return BIT_DEPTHS[int(depth)], int(width)


def _formula_count(units, width, classes=1000, channels=3):
    root = round(64 * width)
    total = 7 * 7 * channels * root
    blocks, cin = official.resnet_units(units, root)
    for _, u, unit_in, mid, out in blocks:
        # GN a, conv a, GN b, conv b (3x3), GN c, conv c, projection.
        total += (2 * unit_in + unit_in * mid + 2 * mid + 9 * mid * mid
                  + 2 * mid)
        total += mid * out + (unit_in * out if u == 1 else 0)
    return total + 2 * cin + cin * classes + classes


# --------------------------------------------------------------------------
# Official-layout random checkpoints


def bit_arrays(block_units, width_factor, num_classes, *, channels=3, seed=0,
               gn_shape="vector", head_shape="conv"):
    """``{key: float32 array}`` of a BiT checkpoint, every array random.

    gn_shape: "vector" stores GroupNorm arrays as (C,), "4d" as (1, 1, 1, C).
    head_shape: "conv" stores the head kernel (1, 1, C, K), "dense" (C, K).
    """
    rng = np.random.default_rng(seed)

    def conv(k, cin, cout):
        # A per-output-channel offset, which weight standardisation removes;
        # kept small like trained weights, since a mean far above the spread
        # costs float32 digits in the standardisation (on both sides).
        w = rng.standard_normal((k, k, cin, cout)) * 0.3
        w = w + 0.1 * rng.standard_normal((1, 1, 1, cout))
        return w.astype("float32")

    def gn(prefix, c):
        shape = (c,) if gn_shape == "vector" else (1, 1, 1, c)
        return {
            f"{prefix}/group_norm/gamma":
                (1.0 + 0.3 * rng.standard_normal(shape)).astype("float32"),
            f"{prefix}/group_norm/beta":
                (0.3 * rng.standard_normal(shape)).astype("float32"),
        }

    root = int(64 * width_factor)
    a = {"resnet/root_block/standardized_conv2d/kernel":
         conv(7, channels, root)}
    units, cin = official.resnet_units(block_units, root)
    for s, u, unit_in, mid, out in units:
        p = f"resnet/block{s}/unit{u:02d}"
        a.update(gn(f"{p}/a", unit_in))
        a[f"{p}/a/standardized_conv2d/kernel"] = conv(1, unit_in, mid)
        if u == 1:
            a[f"{p}/a/proj/standardized_conv2d/kernel"] = conv(1, unit_in, out)
        a.update(gn(f"{p}/b", mid))
        a[f"{p}/b/standardized_conv2d/kernel"] = conv(3, mid, mid)
        a.update(gn(f"{p}/c", mid))
        a[f"{p}/c/standardized_conv2d/kernel"] = conv(1, mid, out)
    a.update(gn("resnet", cin))
    if num_classes:
        k = rng.standard_normal((cin, num_classes)) / np.sqrt(cin)
        if head_shape == "conv":
            k = k[None, None]
        a["resnet/head/conv2d/kernel"] = k.astype("float32")
        a["resnet/head/conv2d/bias"] = (
            0.3 * rng.standard_normal(num_classes)).astype("float32")
    return a


def _write(path, arrays):
    np.savez(path, **arrays)
    return path


def _images(n=3, size=TINY_IMAGE, seed=1):
    h, w = (size, size) if isinstance(size, int) else size
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (n, h, w, 3)).astype("float32")


def _tiny(num_classes=11, **kwargs):
    kwargs.setdefault("image_size", TINY_IMAGE)
    return resnet_v2(block_units=TINY_UNITS, width_factor=TINY_WIDTH,
                     num_classes=num_classes, **kwargs)


def _timm_model(num_classes, path, units=TINY_UNITS, width=TINY_WIDTH):
    import torch
    import timm.layers as timm_layers
    import timm.models.resnetv2 as timm_resnetv2
    # timm's BiT builder, with the official weight-standardisation epsilon
    # (timm's own _create_resnetv2_bit uses 1e-8).
    model = timm_resnetv2.ResNetV2(
        layers=list(units), channels=(256, 512, 1024, 2048),
        num_classes=num_classes, stem_type="fixed",
        conv_layer=functools.partial(timm_layers.StdConv2d, eps=1e-10),
        norm_layer=functools.partial(timm_layers.GroupNormAct, num_groups=32),
        width_factor=width)
    if path is not None:
        model.load_pretrained(str(path))
    # Run timm in float64: in float32 it is itself ~6e-6 off the exact
    # logits on these checkpoints, which would leave the 1e-5 bound no margin.
    return model.double().eval(), torch


def _torch_run(fn, torch, x):
    with torch.no_grad():
        out = fn(torch.from_numpy(x).permute(0, 3, 1, 2).double())
    out = out.numpy()
    return out.transpose(0, 2, 3, 1) if out.ndim == 4 else out


# --------------------------------------------------------------------------
# Parameter counts


def test_formula_matches_pinned_timm_counts():
    assert set(PARAMS_224_1000) == set(BIT_VARIANTS)
    for name, count in PARAMS_224_1000.items():
        assert _formula_count(*_variant(name)) == count, name


def test_every_registered_bit_name_is_pinned():
    from keras_vit.base import variants
    from keras_vit.base.variants import parse
    names = [n for n in variants.REGISTERED if n.startswith("BiT-")]
    assert {n[len("BiT-"):] for n in names} == set(PARAMS_224_1000)
    for name in names:
        units, width = _variant(name[len("BiT-"):])
        config = parse(name).config
        assert config == {"block_units": list(units), "width_factor": width}


def test_r50x1_count_matches_timm_live():
    import timm
    ref = timm.create_model("resnetv2_50x1_bit", pretrained=False,
                            num_classes=1000)
    assert sum(p.numel() for p in ref.parameters()) == (
        PARAMS_224_1000["R50x1"])


@pytest.mark.backend_independent(
    "a count of the weights' shapes, which Keras builds alike on every "
    "backend; test_logits_match_timm checks the built model's numbers on "
    "each")
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if slow else n
    for n, slow in BUILT.items()])
def test_parameter_count(name):
    units, width = _variant(name)
    # R50x1 allocated for real (the stateless count must equal it); the
    # others counted as shapes only.
    count = count_params(functools.partial(resnet_v2, 224, units, width,
                                           1000), allocate=name == "R50x1")
    assert count == PARAMS_224_1000[name]
    # The formula that stands in for R152x4 is checked on every built model.
    assert count == _formula_count(units, width)


# --------------------------------------------------------------------------
# StdConv2D against NumPy


def _np_conv_valid(x, w, stride):
    kh, kw = w.shape[:2]
    oh = (x.shape[1] - kh) // stride + 1
    ow = (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, i, j] = np.einsum("bhwc,hwco->bo", patch, w)
    return out


@pytest.mark.parametrize("standardization,eps", [("var", 1e-10),
                                                 ("std", 1e-5)])
@pytest.mark.parametrize("stride", [1, 2])
def test_std_conv_matches_numpy(standardization, eps, stride):
    rng = np.random.default_rng(0)
    # A small kernel scale makes eps matter: the two formulas then differ by
    # about 1 %, so a mix-up cannot pass at 1e-6.
    w = (rng.standard_normal((3, 3, 4, 5)) * 1e-3).astype("float32")
    x = rng.standard_normal((2, 9, 8, 4)).astype("float32")
    layer = StdConv2D(5, 3, strides=stride, padding="valid", use_bias=False,
                      standardization=standardization, eps=eps)
    layer.build(x.shape)
    layer.kernel.assign(w)
    got = to_numpy(layer(x))

    w64 = w.astype("float64")
    centred = w64 - w64.mean(axis=(0, 1, 2), keepdims=True)
    var = (centred ** 2).mean(axis=(0, 1, 2), keepdims=True)
    if standardization == "var":
        ws = centred / np.sqrt(var + eps)
        other = centred / (np.sqrt(var) + 1e-5)
    else:
        ws = centred / (np.sqrt(var) + eps)
        other = centred / np.sqrt(var + 1e-10)
    want = _np_conv_valid(x.astype("float64"), ws, stride)
    # Outputs reach about 14; torch's float32 convolution sums in another
    # order (1.7e-6 off seen), still far below the 1 % of a mix-up.
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-6)
    wrong = _np_conv_valid(x.astype("float64"), other, stride)
    assert np.abs(wrong - want).max() > 1e-3


# --------------------------------------------------------------------------
# Parity with timm


@pytest.mark.parametrize("image_size", [64, (65, 49)])
def test_logits_match_timm(tmp_path, image_size):
    arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 11, seed=3)
    path = _write(tmp_path / "bit.npz", arrays)
    ref, torch = _timm_model(11, path)
    x = _images(size=image_size)
    ours = _tiny(11, image_size=image_size)
    report = bit_layout.load_weights(ours, path)
    assert report == {"head": "loaded"}
    got = np.asarray(ours.predict(x, verbose=0))
    want = _torch_run(ref, torch, x)
    assert got.shape == want.shape == (3, 11)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # Guard against a vacuous pass: logits must differ between images.
    assert np.abs(want[0] - want[1]).max() > 1e-2


def test_stage_outputs_and_features_match_timm(tmp_path):
    arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 5, seed=4)
    path = _write(tmp_path / "bit.npz", arrays)
    ref, torch = _timm_model(5, path)
    x = _images()
    ours = _tiny(5, return_stages=True)
    bit_layout.load_weights(ours, path)
    got = ours.predict(x, verbose=0)
    assert sorted(got) == ["output", "stage_1", "stage_2", "stage_3",
                           "stage_4"]
    with torch.no_grad():
        t = ref.stem(torch.from_numpy(x).permute(0, 3, 1, 2).double())
        for s, stage in enumerate(ref.stages, start=1):
            t = stage(t)
            want = t.numpy().transpose(0, 2, 3, 1)
            side = TINY_IMAGE // 2 ** (s + 1)
            assert got[f"stage_{s}"].shape == (
                3, side, side, int(256 * 2 ** (s - 1) * TINY_WIDTH))
            scale = np.abs(want).max()
            np.testing.assert_allclose(got[f"stage_{s}"], want,
                                       atol=1e-5 * max(1.0, scale), rtol=0)
    np.testing.assert_allclose(got["output"], _torch_run(ref, torch, x),
                               atol=1e-5, rtol=0)

    fmap = _tiny(include_top=False)
    assert bit_layout.load_weights(fmap, path) == {"head": "dropped"}
    want = _torch_run(ref.forward_features, torch, x)
    got = np.asarray(fmap.predict(x, verbose=0))
    assert got.shape == want.shape == (3, 2, 2, 1024)
    # Unpooled, the float32 rounding of the last stage (values ~70, see
    # above) shows through the final GroupNorm at ~2e-5; pooling averages
    # it down for the logits.
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)


@pytest.mark.parametrize("classes", [11, 4])
def test_a_checkpoint_without_a_head_is_refused_not_zeroed(classes):
    """zoo.load_weights once left a zero head for a file without one."""
    arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 11, seed=5)
    del arrays[bit_layout.HEAD_KERNEL], arrays[bit_layout.HEAD_BIAS]
    with pytest.raises(CheckpointError,
                       match="missing from the checkpoint.*head/conv2d"):
        keras_vit.zoo.load_weights(_tiny(classes), arrays)


def test_replaced_head_is_zero_and_features_match_timm(tmp_path):
    arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 11, seed=5)
    path = _write(tmp_path / "bit.npz", arrays)
    x = _images()
    ours = _tiny(4)
    assert bit_layout.load_weights(ours, path) == {"head": "replaced"}
    np.testing.assert_array_equal(ours.predict(x, verbose=0),
                                  np.zeros((3, 4)))
    with pytest.raises(CheckpointError, match="mis-shaped"):
        bit_layout.load_weights(_tiny(4), path, num_classes_changed_ok=False)

    # timm keeps its own head when the sizes differ: compare pre-logits.
    ref, torch = _timm_model(0, path)
    pooled = _tiny(include_top=False, pooling="avg")
    bit_layout.load_weights(pooled, path)
    want = _torch_run(ref, torch, x)
    got = np.asarray(pooled.predict(x, verbose=0))
    assert got.shape == want.shape == (3, 1024)
    # predict runs XLA-compiled (fused kernels round differently): 1e-5
    # relative on features of scale ~1.5.
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_export_round_trips_through_timm(tmp_path):
    """Our export, read by timm's loader, gives our logits; and it loads
    back into a fresh keras model weight for weight."""
    rng = np.random.default_rng(6)
    model = _tiny(7)
    for v in model.weights:
        scale = 0.03 if v.path.startswith("head/") else 0.3
        v.assign(rng.standard_normal(v.shape).astype("float32") * scale
                 + (1.0 if v.path.endswith("gamma") else 0.0))
    arrays = bit_layout.export_arrays(model)
    assert set(arrays) == set(bit_arrays(TINY_UNITS, TINY_WIDTH, 7))
    assert arrays["resnet/head/conv2d/kernel"].shape == (1, 1, 1024, 7)
    assert arrays["resnet/group_norm/gamma"].shape == (1024,)
    path = _write(tmp_path / "export.npz", arrays)
    x = _images()
    ref, torch = _timm_model(7, path)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               _torch_run(ref, torch, x), atol=1e-5, rtol=0)
    again = _tiny(7)
    bit_layout.load_weights(again, path)
    for a, b in zip(model.weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# --------------------------------------------------------------------------
# The layout


def test_checkpoint_keys():
    assert bit_layout.checkpoint_key("root_conv/kernel") == (
        "resnet/root_block/standardized_conv2d/kernel")
    assert bit_layout.checkpoint_key("stage_3_unit_12/norm_b/gamma") == (
        "resnet/block3/unit12/b/group_norm/gamma")
    assert bit_layout.checkpoint_key("stage_1_unit_1/proj/kernel") == (
        "resnet/block1/unit01/a/proj/standardized_conv2d/kernel")
    assert bit_layout.checkpoint_key("final_norm/beta") == (
        "resnet/group_norm/beta")
    assert bit_layout.checkpoint_key("head/kernel") == (
        "resnet/head/conv2d/kernel")
    assert bit_layout.checkpoint_key("stage_1_unit_1/other/kernel") is None
    # Every weight of a model maps, one to one, onto the official key set.
    model = _tiny(3)
    keys = [bit_layout.checkpoint_key(v.path) for v in model.weights]
    assert sorted(keys) == sorted(bit_arrays(TINY_UNITS, TINY_WIDTH, 3))


def test_gn_4d_and_dense_head_shapes_are_accepted():
    x = _images()
    outs = []
    for gn_shape, head_shape in [("vector", "conv"), ("4d", "dense")]:
        arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 3, seed=7,
                            gn_shape=gn_shape, head_shape=head_shape)
        model = _tiny(3)
        assert bit_layout.load_weights(model, arrays) == {"head": "loaded"}
        outs.append(model.predict(x, verbose=0))
    np.testing.assert_array_equal(outs[0], outs[1])
    shapes = {v.path: tuple(v.shape) for v in model.weights}
    norm, _ = bit_layout.BIT.read(bit_arrays(TINY_UNITS, TINY_WIDTH, 3,
                                             gn_shape="4d"), shapes)
    assert norm["stage_2_unit_1/norm_c/beta"].shape == (64,)
    assert norm["head/kernel"].shape == (1024, 3)


def test_checkpoint_of_another_depth_lists_every_problem():
    model = _tiny(3)
    before = [v.numpy().copy() for v in model.weights]
    deeper = bit_arrays((3, 1, 1, 1), TINY_WIDTH, 3)
    del deeper["resnet/block4/unit01/c/group_norm/beta"]
    with pytest.raises(CheckpointError) as e:
        bit_layout.load_weights(model, deeper)
    msg = str(e.value)
    assert "unexpected in the checkpoint (9)" in msg
    assert "resnet/block1/unit03/a/standardized_conv2d/kernel" in msg
    assert "missing from the checkpoint (1)" in msg
    assert "resnet/block4/unit01/c/group_norm/beta" in msg
    wider = bit_arrays(TINY_UNITS, 1, 3)
    with pytest.raises(CheckpointError, match=r"mis-shaped.*root_block"):
        bit_layout.load_weights(model, wider)
    # Nothing was assigned.
    for a, v in zip(before, model.weights):
        np.testing.assert_array_equal(a, v.numpy())


def test_truncated_npz_names_the_path(tmp_path):
    path = _write(tmp_path / "bit.npz", bit_arrays(TINY_UNITS, TINY_WIDTH, 3))
    data = path.read_bytes()
    bad = tmp_path / "truncated.npz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.npz"):
        bit_layout.load_weights(_tiny(3), bad)
    with pytest.raises(CheckpointError, match="missing.npz"):
        bit_layout.load_weights(_tiny(3), tmp_path / "missing.npz")


def test_a_model_it_does_not_know_is_refused():
    vit = importlib.import_module("keras_vit.models.vit").vit(
        image_size=32, patch_size=16, hidden_size=8, num_layers=1,
        num_heads=2, mlp_dim=8, num_classes=2)
    with pytest.raises(CheckpointError, match="no BiT checkpoint equivalent"):
        bit_layout.load_weights(vit, bit_arrays(TINY_UNITS, TINY_WIDTH, 2))


# --------------------------------------------------------------------------
# The model: options, config, saving, errors


def test_options():
    x = _images(n=2)
    arrays = bit_arrays(TINY_UNITS, TINY_WIDTH, 6, seed=8)
    plain = _tiny(6)
    bit_layout.load_weights(plain, arrays)
    pre = _tiny(6, include_preprocessing=True, classifier_activation="softmax")
    bit_layout.load_weights(pre, arrays)
    probs = pre.predict((x + 1.0) * 127.5, verbose=0)
    logits = plain.predict(x, verbose=0)
    want = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, want, atol=1e-5)
    # The head is zero-initialised, as BiT fine-tuning starts.
    fresh = _tiny(6)
    assert not np.any(fresh.get_layer("head").kernel.numpy())
    # Only the first unit of each stage has a projection.
    projs = sorted(v.path for v in plain.weights if "/proj/" in v.path)
    assert projs == [f"stage_{s}_unit_1/proj/kernel" for s in range(1, 5)]
    assert _tiny(num_channels=1).input_shape == (None, 64, 64, 1)


@pytest.mark.parametrize("kwargs", [
    {}, {"include_top": False, "pooling": "avg"}, {"return_stages": True},
    {"image_size": (64, 96), "include_preprocessing": True,
     "classifier_activation": "softmax", "name": "bit_tiny"}])
def test_config_round_trip(kwargs):
    model = _tiny(5, **kwargs)
    config = model.get_config()
    again = ResNetV2.from_config(config)
    assert again.get_config() == config
    assert again.count_params() == model.count_params()
    assert [v.path for v in again.weights] == [v.path for v in model.weights]
    assert set(config) == set(ResNetV2.__init__.__code__.co_varnames[
        1:ResNetV2.__init__.__code__.co_argcount]) | {"dtype"}


def test_unit_config_round_trip():
    unit = PreActBottleneck(32, strides=2, groups=16, epsilon=1e-3,
                            name="u")
    config = unit.get_config()
    assert {k: config[k] for k in ("filters", "strides", "groups",
                                   "epsilon")} == {
        "filters": 32, "strides": 2, "groups": 16, "epsilon": 1e-3}
    assert PreActBottleneck.from_config(config).get_config() == config
    same = PreActBottleneck(32)
    same.build((None, 8, 8, 128))
    assert same.proj is None


@pytest.mark.parametrize("return_stages", [False, True])
def test_keras_save_and_load(tmp_path, return_stages):
    model = _tiny(4, return_stages=return_stages)
    bit_layout.load_weights(model, bit_arrays(TINY_UNITS, TINY_WIDTH, 4,
                                              seed=9))
    path = tmp_path / "bit.keras"
    model.save(path)
    import keras_vit  # noqa: F401  (registers the layers, as users do)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ResNetV2)
    x = _images(n=2)
    a, b = model.predict(x, verbose=0), loaded.predict(x, verbose=0)
    if return_stages:
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    ({"width_factor": 0}, r"width_factor must be positive; received "
                          r"width_factor=0"),
    ({"width_factor": -1.0}, "width_factor=-1.0"),
    ({"width_factor": True}, "width_factor=True"),
    ({"width_factor": "1"}, "width_factor='1'"),
    ({"width_factor": 0.25}, r"width_factor=0.25 gives 16 channels.*32 groups"),
    ({"width_factor": 0.75}, r"width_factor=0.75 gives 48 channels"),
    ({"image_size": 64.0}, r"image_size must be an int or a pair"),
    ({"image_size": "64"}, "image_size='64'"),
    ({"image_size": 31}, r"image_size must be at least 32; received "
                         r"image_size=31"),
    ({"image_size": (64, 16)}, r"image_size=\(64, 16\)"),
    ({"block_units": (3, 4, 6)}, r"block_units must be 4 positive integers"),
    ({"block_units": (3, 0, 6, 3)}, r"block_units=\(3, 0, 6, 3\)"),
    ({"num_classes": 0}, "num_classes=0"),
    ({"pooling": "max"}, "pooling='max'"),
    ({"num_channels": 0}, "num_channels=0"),
])
def test_bad_arguments(kwargs, match):
    args = dict(image_size=TINY_IMAGE, block_units=TINY_UNITS,
                width_factor=TINY_WIDTH, num_classes=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        resnet_v2(**args)


def test_feature_model_gives_stage_outputs_and_pre_logits():
    import keras_vit
    model = resnet_v2(64, (1, 1, 1, 1), 0.5, 3)
    feats = keras_vit.models.feature_model(
        model, ["stage_1", "stage_4", "feature_map", "pre_logits"])
    out = feats(np.zeros((2, 64, 64, 3), "float32"))
    assert tuple(out["stage_1"].shape) == (2, 16, 16, 128)
    assert tuple(out["stage_4"].shape) == (2, 2, 2, 1024)
    assert tuple(out["feature_map"].shape) == (2, 2, 2, 1024)
    assert tuple(out["pre_logits"].shape) == (2, 1024)
    staged = resnet_v2(64, (1, 1, 1, 1), 0.5, 3, return_stages=True)
    staged.set_weights(model.get_weights())
    x = np.random.default_rng(0).uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(keras_vit.models.feature_model(model, "stage_3")(x)),
        to_numpy(staged(x)["stage_3"]), atol=1e-6)
    with pytest.raises(ValueError, match="available: .*stage_1"):
        keras_vit.models.feature_model(model, "tokens")


# Initialisation equals big_transfer's in distribution (tests/flax_init.py).
def test_bit_init_matches_big_transfer():
    keras.utils.set_random_seed(0)
    model = keras_vit.models.resnet_v2(32, (1, 1, 1, 1), 1, 10)
    kinds = _check_init(model)
    assert "root_conv/kernel" in kinds and "stage_unit/proj/kernel" in kinds


# Bad arguments to the BiT builder, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("resnet_v2 pooling", lambda: keras_vit.models.resnet_v2(
        32, (1, 1, 1, 1), 0.5, 10, include_top=False, pooling="average"),
     "pooling", "'average'", "avg"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
