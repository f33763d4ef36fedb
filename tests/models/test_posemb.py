"""Position-embedding ablations (paper Appendix D.4): every kind and
placement builds, trains, saves, exports and changes resolution; the
relative attention bias and the 2D tables match independent NumPy code."""

import functools
import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers as vit_layers
from keras_vit import zoo
from keras_vit.cli.demo import load_digits_images
from keras_vit.models import vit
from keras_vit.models.encoder import PLACEMENTS, POSITION_EMBEDDINGS
from keras_vit.models.positions import RelativePositionEmbedding
from keras_vit.zoo import checkpoints, convert, position_tables

# Every accepted (kind, placement): "none" has nothing to place.
COMBOS = [(k, p) for k in POSITION_EMBEDDINGS for p in PLACEMENTS
          if k != "none" or p == "stem"]
# Exported to ONNX in the default (not slow) run: one of each mechanism.
QUICK_ONNX = {("relative", "every_layer_shared"), ("learned_2d", "every_layer"),
              ("sincos_2d", "stem")}

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=10)
GRID = 4  # 16 / 4


def _tiny(kind, placement="stem", classifier="token", **kwargs):
    kw = dict(TINY, classifier=classifier, position_embedding=kind,
              position_embedding_placement=placement)
    kw.update(kwargs)
    return vit(**kw)


def _randomize(model, seed=0, scale=0.1):
    """Random weights everywhere (the head starts at zero otherwise)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.standard_normal(w.shape).astype("float32") * scale)


def _position_params(kind, placement, classifier, layers=2, grid=GRID,
                     dim=32):
    tables = layers if placement == "every_layer" else 1
    prefix = int(classifier == "token")
    patches = grid * grid
    per_table = {"learned_1d": (prefix + patches) * dim,
                 "learned_2d": 2 * grid * dim // 2,
                 "relative": (2 * patches - 1 + prefix) * dim,
                 "sincos_2d": 0, "none": 0}[kind]
    return tables * per_table


@pytest.fixture(scope="module")
def digits():
    x_tr, y_tr, x_te, _ = load_digits_images(16, subset=(64, 64))
    return x_tr, y_tr, x_te


# ---------------------------------------------------------------- default


def test_default_layout_is_unchanged():
    model = vit(**TINY)
    assert model.get_config()["position_embedding"] == "learned_1d"
    assert model.get_config()["position_embedding_placement"] == "stem"
    posemb = [w.path for w in model.weights if "position" in w.path]
    assert posemb == ["position_embedding/pos_embedding"]
    # The table is added once, before the embedding dropout and block 0.
    names = [layer.name for layer in model.layers]
    assert names.index("position_embedding") < names.index(
        "embedding_dropout") < names.index("encoder_block_0")
    assert convert.checkpoint_key(posemb[0]) == convert.POSEMB_KEY


@functools.cache
def _base_count(classifier):
    """Parameters of the model without position embedding (built once per
    classifier, not once per kind)."""
    return _tiny("none", classifier=classifier).count_params()


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("kind,placement", COMBOS)
def test_parameter_count_follows_from_the_kind(kind, placement, classifier):
    base = _base_count(classifier)
    model = _tiny(kind, placement, classifier)
    assert model.count_params() - base == _position_params(
        kind, placement, classifier)
    config = model.get_config()
    clone = keras_vit.VisionTransformer.from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()


# ------------------------------------------------- train, save, export


@pytest.mark.parametrize("kind,placement", COMBOS)
def test_trains_saves_and_reloads(kind, placement, digits, tmp_path):
    x_tr, y_tr, x_te = digits
    keras.utils.set_random_seed(0)
    model = _tiny(kind, placement)
    # Eager: two steps of a tiny model cost less than tracing the step
    # (each eager step costs 0.17 s). One batch, twice: the second loss is
    # that batch's after one update. train_on_batch runs the train step
    # fit runs (the same losses and weights as fit over two one-batch
    # epochs) without fit's epoch loop, about a third of fit's CPU here.
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True), run_eagerly=True)
    before = [np.array(w) for w in model.trainable_weights]
    losses = [float(model.train_on_batch(x_tr, y_tr)) for _ in range(2)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    # Every position table took part in training.
    for w, b in zip(model.trainable_weights, before):
        if "position_embedding" in w.path:
            assert np.abs(np.array(w) - b).max() > 0, w.path
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x_te)),
                                  keras.ops.convert_to_numpy(model(x_te)))


@pytest.mark.parametrize("kind,placement", [
    c if c in QUICK_ONNX else pytest.param(*c, marks=pytest.mark.slow)
    for c in COMBOS])
def test_exports_to_onnx(kind, placement, tmp_path):
    from keras_vit.export import to_onnx

    # At placement "stem" an added table (or none) comes once, in front of
    # block 0: a one-block graph holds it all, and a second block would
    # only add converter work (about 40% of the export's CPU time). The
    # relative bias at the stem is a property of the blocks (block 0 has
    # it, block 1 not), so that model keeps both, as the other placements
    # do.
    one_block = placement == "stem" and kind != "relative"
    model = _tiny(kind, placement,
                  num_layers=1 if one_block else TINY["num_layers"])
    _randomize(model)
    # to_onnx runs the file with onnxruntime and compares it with Keras at
    # two batch sizes; it raises if they differ.
    report = to_onnx(model, str(tmp_path / "model.onnx"))
    assert (tmp_path / "model.onnx").is_file()
    assert report["files"] == ["model.onnx"]


# ------------------------------------------------------- relative bias


def _reference_relative_bias(q, table, num_prefix):
    """Loop over every (query, key) pair: q_i . E[offset(i, j)] / sqrt(d)."""
    b, n, h, d = q.shape
    patches = n - num_prefix
    out = np.zeros((b, h, n, n))
    for i in range(n):
        for j in range(n):
            if i < num_prefix or j < num_prefix:
                row = table.shape[0] - 1  # the class-token row
            else:
                row = (i - j) + patches - 1  # offset -(P-1) at row 0
            out[:, :, i, j] = np.einsum("bhk,hk->bh", q[:, i], table[row])
    return out / math.sqrt(d)


@pytest.mark.parametrize("num_prefix", [0, 1])
def test_relative_bias_matches_numpy(num_prefix):
    rng = np.random.default_rng(0)
    patches, heads, head_dim = 5, 2, 3
    n = patches + num_prefix
    q = rng.standard_normal((2, n, heads, head_dim)).astype("float32")
    rows = vit_layers.relative_table_rows(patches, num_prefix)
    assert rows == 2 * patches - 1 + num_prefix
    table = rng.standard_normal((rows, heads, head_dim)).astype("float32")
    got = np.asarray(vit_layers.relative_attention_bias(q, table))
    np.testing.assert_allclose(
        got, _reference_relative_bias(q, table, num_prefix), atol=1e-5)


def _layer_norm(x, layer):
    gamma, beta = (np.asarray(w) for w in layer.weights)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * gamma + beta


def test_relative_attention_in_a_block_matches_numpy():
    """The block adds the relative logits to the content logits before the
    softmax, with the attention's own queries, on both attention paths."""
    rng = np.random.default_rng(1)
    patches, prefix, heads, dim = 6, 1, 2, 8
    n = patches + prefix
    block = vit_layers.EncoderBlock(heads, 16)
    x = rng.standard_normal((2, n, dim)).astype("float32")
    table = rng.standard_normal(
        (vit_layers.relative_table_rows(patches, prefix), heads,
         dim // heads)).astype("float32")
    block(x)
    for w in block.weights:
        w.assign(rng.standard_normal(w.shape).astype("float32") * 0.5)
    y, probs = block(x, return_attention_scores=True,
                     relative_embedding=table)

    att = block.attention
    h = _layer_norm(x, block.norm_1)
    q, k = (np.einsum("btd,dhk->bthk", h, np.asarray(getattr(att, p).kernel))
            + np.asarray(getattr(att, p).bias) for p in ("query", "key"))
    content = np.einsum("bqhk,bvhk->bhqv", q, k) / math.sqrt(dim // heads)
    logits = content + _reference_relative_bias(q, table, prefix)
    want = np.exp(logits - logits.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(probs), want, atol=2e-5)
    # The fused path (no scores asked) computes the same output.
    np.testing.assert_allclose(
        np.asarray(block(x, relative_embedding=table)), np.asarray(y),
        atol=2e-5)
    # And without the table the attention differs: the bias is used.
    assert np.abs(np.asarray(block(x)) - np.asarray(y)).max() > 1e-3


@pytest.mark.parametrize("placement,with_bias", [
    ("stem", [True, False, False]),
    ("every_layer", [True, True, True]),
    ("every_layer_shared", [True, True, True])])
def test_relative_placement_decides_which_blocks_see_positions(
        placement, with_bias):
    model = _tiny("relative", placement, num_layers=3,
                  return_attention_scores=True)
    _randomize(model, scale=0.3)
    # With every content weight of a block's queries and keys at zero, its
    # attention is uniform unless a relative bias is added.
    for i in range(3):
        att = model.get_layer(f"encoder_block_{i}").attention
        for var in (att.key.kernel, att.key.bias):
            var.assign(np.zeros(var.shape))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
    scores = np.asarray(model(x)["attention_scores"])
    assert [not np.allclose(scores[:, i], 1.0 / scores.shape[-1], atol=1e-6,
                            rtol=0) for i in range(3)] == with_bias
    tables = {w.path for w in model.weights if "rel_embedding" in w.path}
    assert len(tables) == (3 if placement == "every_layer" else 1)


# -------------------------------------------------------------- 2D tables


def test_learned_2d_concatenates_x_and_y_tables():
    layer = vit_layers.PositionEmbedding((3, 4), 1, kind="learned_2d")
    layer(np.zeros((1, 13, 8), "float32"))
    _x, _y = (np.asarray(w) for w in (layer.pos_embedding_x,
                                      layer.pos_embedding_y))
    assert _x.shape == (4, 4) and _y.shape == (3, 4)
    table = np.asarray(layer.table())[0]
    np.testing.assert_array_equal(table[0], 0.0)  # class token: nothing
    for r in range(3):
        for c in range(4):
            np.testing.assert_array_equal(table[1 + r * 4 + c],
                                          np.concatenate([_x[c], _y[r]]))


def test_sincos_2d_is_big_vision_table():
    rows, cols, dim = 3, 5, 16
    y, x = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    omega = 1.0 / 10000 ** np.linspace(0, 1, dim // 4)
    ang_x = x.reshape(-1)[:, None] * omega
    ang_y = y.reshape(-1)[:, None] * omega
    want = np.concatenate([np.sin(ang_x), np.cos(ang_x), np.sin(ang_y),
                           np.cos(ang_y)], axis=1)
    np.testing.assert_allclose(vit_layers.sincos_2d_table((rows, cols), dim),
                               want, atol=1e-6)
    model = _tiny("sincos_2d")
    table = np.asarray(model.get_layer("position_embedding").table())[0]
    np.testing.assert_array_equal(table[0], 0.0)
    np.testing.assert_allclose(table[1:],
                               vit_layers.sincos_2d_table((GRID, GRID), 32),
                               atol=1e-6)
    assert not model.get_layer("position_embedding").weights


def test_every_layer_adds_a_table_before_each_block():
    """With all blocks zeroed out (identity), the encoder output is the
    patch tokens plus the sum of the tables added on the way."""
    for placement, factor in (("stem", 1), ("every_layer_shared", 2)):
        model = _tiny("sincos_2d", placement, classifier="gap",
                      include_top=False)
        _randomize(model)
        for w in model.weights:
            if w.path.startswith("encoder_block_") and (
                    "/out/" in w.path or "dense_1" in w.path):
                w.assign(np.zeros(w.shape))
        x = np.random.default_rng(0).uniform(-1, 1, (1, 16, 16, 3))
        patches = np.asarray(model.get_layer("patch_embedding")(x))
        tokens = patches + factor * vit_layers.sincos_2d_table((GRID, GRID),
                                                                32)
        want = _layer_norm(tokens, model.get_layer("encoder_norm"))
        np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-4)


@pytest.mark.parametrize("layer,shape", [
    (vit_layers.PositionEmbedding((2, 3), 1, kind="learned_2d"), (2, 7, 8)),
    (vit_layers.PositionEmbedding((2, 3), 0, kind="sincos_2d"), (2, 6, 8)),
    (RelativePositionEmbedding((2, 3), 2, 1), (2, 7, 8))])
def test_layer_config_round_trip(layer, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    y = layer(x)
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(np.asarray(clone(x)), np.asarray(y))


# ------------------------------------------------------ resolution change


def _checkpoint(kind, placement, classifier="token"):
    model = _tiny(kind, placement, classifier)
    _randomize(model)
    return model, convert.export_arrays(model)


@pytest.mark.parametrize("kind,placement", COMBOS)
def test_loads_at_another_resolution(kind, placement):
    small, arrays = _checkpoint(kind, placement)
    big = _tiny(kind, placement, image_size=24)  # grid 4x4 -> 6x6
    report = convert.load_weights(big, arrays)
    tables = [k for k in arrays if "posembed" in k]
    assert (report["resized_posemb"] is None) == (not tables)
    for key, var in convert.model_variables(big).items():
        if "posembed" not in key:
            np.testing.assert_array_equal(np.asarray(var), arrays[key])
    x = np.random.default_rng(0).uniform(-1, 1, (2, 24, 24, 3))
    assert np.all(np.isfinite(np.asarray(big(x))))
    if kind == "sincos_2d":  # recomputed for the new grid
        table = np.asarray(big.get_layer(
            "position_embedding" if placement != "every_layer"
            else "position_embedding_0").table())[0, 1:]
        np.testing.assert_allclose(
            table, vit_layers.sincos_2d_table((6, 6), 32), atol=1e-6)
    for key in tables:
        old, new = arrays[key], np.asarray(convert.model_variables(big)[key])
        if kind == "learned_1d":
            np.testing.assert_allclose(new, position_tables.resize_posemb(old, (6, 6)),
                                       atol=1e-6)
        elif kind == "learned_2d":
            # Linear with aligned corners: ends kept, each column of the
            # table interpolated on its own.
            assert new.shape == (6, 16)
            pos = np.linspace(0, GRID - 1, 6)
            want = np.stack([np.interp(pos, np.arange(GRID), old[:, c])
                             for c in range(old.shape[1])], axis=1)
            np.testing.assert_allclose(new, want, atol=1e-6)
        else:  # relative: offsets -15..15 -> -35..35, clipped, + cls row
            assert old.shape[0] == 32 and new.shape[0] == 72
            np.testing.assert_array_equal(new[20:51], old[:31])
            np.testing.assert_array_equal(new[:20], np.repeat(old[:1], 20, 0))
            np.testing.assert_array_equal(new[51:71],
                                          np.repeat(old[30:31], 20, 0))
            np.testing.assert_array_equal(new[71], old[31])


def test_relative_table_shrinks_to_the_central_offsets():
    table = np.arange(2 * 9 - 1 + 1)[:, None, None] * np.ones((1, 2, 3))
    got = position_tables.resize_relative_posemb(table, 4, num_prefix_tokens=1)
    np.testing.assert_array_equal(got[:, 0, 0], list(range(5, 12)) + [17])


def test_zoo_load_with_another_image_size(tmp_path):
    small, arrays = _checkpoint("learned_2d", "every_layer")
    path = tmp_path / "ckpt.npz"
    np.savez(path, **arrays)
    model = zoo.load("ViT-Ti/16", weights=str(path), image_size=32,
                     patch_size=4, hidden_size=32, num_layers=2, num_heads=4,
                     mlp_dim=64, position_embedding="learned_2d",
                     position_embedding_placement="every_layer")
    assert model.grid_size == (8, 8)
    for i in range(2):
        got = np.asarray(model.get_layer(f"position_embedding_{i}")
                         .pos_embedding_y)
        want = position_tables.resize_posemb_axis(
            arrays[f"Transformer/encoderblock_{i}/posembed_input/"
                   "pos_embedding_y"], 8)
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_another_kind_is_an_error_naming_the_kind():
    _, arrays = _checkpoint("learned_1d", "stem")
    model = _tiny("learned_2d", "every_layer_shared")
    with pytest.raises(checkpoints.CheckpointError) as e:
        convert.load_weights(model, arrays)
    msg = str(e.value)
    assert "position_embedding='learned_2d'" in msg
    assert "position_embedding_placement='every_layer_shared'" in msg
    assert "pos_embedding_x" in msg  # listed as missing


def test_a_table_that_cannot_be_resized_names_the_kind():
    _, arrays = _checkpoint("learned_1d", "every_layer", classifier="gap")
    key = "Transformer/encoderblock_1/posembed_input/pos_embedding"
    arrays[key] = arrays[key][:, :15]  # 15 tokens: no square grid
    with pytest.raises(checkpoints.CheckpointError) as e:
        convert.load_weights(_tiny("learned_1d", "every_layer", "gap",
                                   image_size=24), arrays)
    assert f"{key} (position_embedding='learned_1d'" in str(e.value)


# ------------------------------------------------------------- arguments


@pytest.mark.parametrize("kwargs,needle", [
    (dict(position_embedding="foo"), "position_embedding='foo'"),
    (dict(position_embedding_placement="input"),
     "position_embedding_placement='input'"),
    (dict(position_embedding="none",
          position_embedding_placement="every_layer"),
     "position_embedding_placement='every_layer'"),
    (dict(position_embedding="learned_2d", hidden_size=27, num_heads=3),
     "hidden_size=27"),
    (dict(position_embedding="sincos_2d", hidden_size=30, num_heads=3),
     "hidden_size=30"),
    (dict(attention="diagonal"), "attention='diagonal'"),
    (dict(attention="axial"), "classifier='token'"),
])
def test_bad_arguments_name_the_argument(kwargs, needle):
    kw = dict(TINY)
    kw.update(kwargs)
    with pytest.raises(ValueError) as e:
        vit(**kw)
    assert needle in str(e.value)
