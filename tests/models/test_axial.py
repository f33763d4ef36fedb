"""Axial-ViT (paper Appendix D.6): row then column attention checked
against NumPy, parameter counts, the zoo names, saving and export."""

import math
import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import zoo
from keras_vit.cli.demo import load_digits_images
from keras_vit.models import AxialVisionTransformer, axial_vit
from keras_vit.base.variants import parse
from keras_vit.models.axial import AxialEncoderBlock

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=10)


def _randomize(weights, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    for w in weights:
        w.assign(rng.standard_normal(w.shape).astype("float32") * scale)


# ------------------------------------------------------- NumPy reference


def _ln(x, layer):
    gamma, beta = (np.asarray(w, dtype="float64") for w in layer.weights)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + layer.epsilon) * (
        gamma) + beta


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _encoder_block(x, block):
    """One pre-LN block on sequences x (S, N, D), from the block's weights."""
    att = block.attention
    w = {"_".join(v.path.split("/")[-2:]): np.asarray(v, "float64")
         for v in att.weights}
    h = _ln(x, block.norm_1)
    q, k, v = (np.einsum("snd,dhk->snhk", h, w[f"{p}_kernel"]) + w[f"{p}_bias"]
               for p in ("query", "key", "value"))
    logits = np.einsum("sqhk,svhk->shqv", q, k) / math.sqrt(q.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = np.einsum("shqv,svhk->sqhk", p, v)
    x = x + np.einsum("sqhk,hkd->sqd", ctx, w["out_kernel"]) + w["out_bias"]
    d0, d1 = block.mlp.dense_0, block.mlp.dense_1
    h = _gelu(_ln(x, block.norm_2) @ np.asarray(d0.kernel, "float64")
              + np.asarray(d0.bias, "float64"))
    return x + h @ np.asarray(d1.kernel, "float64") + np.asarray(d1.bias,
                                                                 "float64")


def _axial_reference(grid, block):
    """Every row as its own sequence, then every column."""
    b, rows, cols, d = grid.shape
    x = np.stack([_encoder_block(grid[:, r], block.row)
                  for r in range(rows)], axis=1)
    return np.stack([_encoder_block(x[:, :, c], block.column)
                     for c in range(cols)], axis=2)


def test_axial_block_matches_numpy():
    rng = np.random.default_rng(0)
    grid = rng.standard_normal((2, 3, 4, 8)).astype("float32")
    block = AxialEncoderBlock(num_heads=2, mlp_dim=16)
    block(grid)
    _randomize(block.weights)
    np.testing.assert_allclose(np.asarray(block(grid)),
                               _axial_reference(grid.astype("float64"), block),
                               atol=1e-4)


def _identity(sub_block):
    """Zeroes the residual branches' last layers: the block returns its input."""
    for w in sub_block.weights:
        if any(s in w.path for s in ("out/kernel", "out/bias", "dense_1")):
            w.assign(np.zeros(w.shape))


@pytest.mark.parametrize("keep", ["row", "column"])
def test_a_token_reaches_only_its_row_then_its_column(keep):
    """With the other half made an identity, changing one token changes
    only its own row (row attention) or its own column (column attention)."""
    rng = np.random.default_rng(1)
    grid = rng.standard_normal((1, 3, 4, 8)).astype("float32")
    block = AxialEncoderBlock(num_heads=2, mlp_dim=16)
    block(grid)
    _randomize(block.weights)
    _identity(block.column if keep == "row" else block.row)
    moved = grid.copy()
    # Not a constant shift: LayerNorm would remove it before attention.
    moved[0, 1, 2] += rng.standard_normal(8).astype("float32")
    changed = np.abs(np.asarray(block(moved)) - np.asarray(block(grid))).max(-1)[0]
    reached = changed > 1e-6
    want = np.zeros((3, 4), bool)
    if keep == "row":
        want[1, :] = True
    else:
        want[:, 2] = True
    np.testing.assert_array_equal(reached, want)


# ---------------------------------------------------------- parameters


def _formula_count(c, image=224, classes=1000, channels=3):
    d, m, p, n = c["hidden_size"], c["mlp_dim"], c["patch_size"], c["num_layers"]
    tokens = (image // p) ** 2  # no class token
    block = 2 * 2 * d + 4 * (d * d + d) + (d * m + m) + (m * d + d)
    return ((p * p * channels * d + d) + tokens * d + n * 2 * block + 2 * d
            + (d * classes + classes))


@pytest.mark.parametrize("name,image,count", [
    ("Axial-ViT-B/16", 224, 171_620_584),
    ("Axial-ViT-B/32", 224, 173_277_160),
])
def test_registered_variants_build_with_formula_counts(name, image, count):
    arch = parse(name)
    assert arch.name == name and arch.family == "axial"
    assert _formula_count(arch.config) == count
    model = zoo.load(name, weights=None)
    assert isinstance(model, AxialVisionTransformer)
    assert model.count_params() == count
    assert model.num_layers == 12 and model.grid_size == (
        224 // arch.config["patch_size"],) * 2
    assert name in zoo.list_models()


def test_tiny_count_and_names():
    model = axial_vit(**TINY)
    assert model.count_params() == _formula_count(
        dict(TINY), image=16, classes=10)
    assert parse("axial_vit_b16").name == "Axial-ViT-B/16"
    with pytest.raises(ValueError, match="No released weights"):
        zoo.load("Axial-ViT-B/32")


# ---------------------------------------------------- train, save, export


def test_trains_saves_reloads_and_exports(tmp_path):
    from keras_vit.export import to_onnx

    x_tr, y_tr, x_te, _ = load_digits_images(16, subset=(256, 64))
    keras.utils.set_random_seed(0)
    model = axial_vit(**TINY, position_embedding="learned_2d")
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    losses = model.fit(x_tr, y_tr, batch_size=64, epochs=3,
                       verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    path = tmp_path / "axial.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is AxialVisionTransformer
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(loaded.predict(x_te, verbose=0),
                                  model.predict(x_te, verbose=0))
    report = to_onnx(model, str(tmp_path / "axial.onnx"))
    assert report["files"] == ["axial.onnx"]


def test_features_and_config_round_trip():
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
    grid = axial_vit(**TINY, include_top=False)(x)
    assert tuple(grid.shape) == (2, 4, 4, 32)
    pooled = axial_vit(**TINY, include_top=False, pooling="avg")(x)
    assert tuple(pooled.shape) == (2, 32)
    model = axial_vit(**TINY, representation_size=12, dropout_rate=0.1)
    config = model.get_config()
    clone = AxialVisionTransformer.from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()
    block = model.get_layer("axial_block_0")
    again = AxialEncoderBlock.from_config(block.get_config())
    assert again.get_config() == block.get_config()


def test_pooling_is_the_mean_of_the_grid():
    x = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
    tokens = axial_vit(**TINY, include_top=False)
    pooled = axial_vit(**TINY, include_top=False, pooling="gap")
    pooled.set_weights(tokens.get_weights())
    np.testing.assert_allclose(np.asarray(pooled(x)),
                               np.asarray(tokens(x)).mean(axis=(1, 2)),
                               atol=1e-6)


def test_vit_builder_routes_axial():
    model = keras_vit.vit(**TINY, classifier="gap", attention="axial")
    assert isinstance(model, AxialVisionTransformer)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(position_embedding="relative"), "position_embedding='relative'"),
    (dict(pooling="token"), "pooling='token'"),
    (dict(image_size=18), "image_size=18"),
    (dict(num_heads=5), "num_heads=5"),
])
def test_bad_arguments_name_the_argument(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        axial_vit(**{**TINY, **kwargs})

