"""keras_vit.analysis: section 4.5 and Appendix D.7/D.8 of the paper.

Rollout and attention distance are checked against values worked out by
hand on constructed attention matrices; the figures are rendered for tiny
random models and checked to be real, non-blank PNGs.
"""

import argparse
import itertools
import json
import math
import os

import numpy as np
import pytest

from testkit import bad_calls_test
import keras
import keras_vit
from keras_vit import analysis
from keras_vit.cli import analysis as analysis_cli
from keras_vit.runtime.backend import to_numpy

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
            num_heads=4, mlp_dim=64, num_classes=5)
HYBRID = dict(image_size=32, patch_size=1, hidden_size=32, num_layers=2,
              num_heads=4, mlp_dim=64, num_classes=5,
              resnet=dict(num_layers=(1,), width_factor=0.5))


@pytest.fixture(scope="module")
def tiny():
    keras.utils.set_random_seed(0)
    return keras_vit.vit(**TINY)


@pytest.fixture(scope="module")
def hybrid():
    keras.utils.set_random_seed(1)
    return keras_vit.vit(**HYBRID)


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    """Two PNGs of other sizes than the model's, one of them greyscale."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    rgb = folder / "noise rgb.png"
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), "uint8")).save(rgb)
    grey = folder / "ramp.png"
    ramp = np.tile(np.linspace(0, 255, 20).astype("uint8"), (20, 1))
    Image.fromarray(ramp, "L").save(grey)
    return [str(rgb), str(grey)]


def _random_attention(rng, shape):
    """Row-stochastic attention of ``shape`` (..., N, N)."""
    a = rng.random(shape) + 1e-3
    return a / a.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------
# attention rollout


def test_rollout_of_self_attention_is_the_identity():
    eye = np.broadcast_to(np.eye(6), (2, 3, 4, 6, 6))
    for residual in (True, False):
        joint = analysis.attention_rollout(eye, residual=residual)
        assert joint.shape == (2, 6, 6)
        np.testing.assert_allclose(joint, np.broadcast_to(np.eye(6),
                                                          (2, 6, 6)))


def test_rollout_of_uniform_attention_by_hand():
    n = 4
    uniform = np.full((n, n), 1.0 / n)
    one = analysis.attention_rollout(np.broadcast_to(uniform, (1, 3, n, n)))
    # (W + I) renormalised: rows of W + I sum to 2.
    np.testing.assert_allclose(one, 0.5 * np.eye(n) + 0.5 * uniform)
    # Two layers: (I/2 + U/2)^2 = I/4 + U/2 + U/4, since U @ U = U.
    two = analysis.attention_rollout(np.broadcast_to(uniform, (2, 3, n, n)))
    np.testing.assert_allclose(two, 0.25 * np.eye(n) + 0.75 * uniform)
    # Without the residual path, uniform stays uniform.
    np.testing.assert_allclose(
        analysis.attention_rollout(np.broadcast_to(uniform, (2, 3, n, n)),
                                   residual=False), uniform)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_two_layer_rollout_matches_explicit_loops(fusion):
    rng = np.random.default_rng(1)
    b, layers, heads, n = 2, 2, 3, 5
    scores = _random_attention(rng, (b, layers, heads, n, n))
    got = analysis.attention_rollout(scores, head_fusion=fusion)
    pick = {"mean": lambda v: sum(v) / len(v), "max": max, "min": min}[fusion]
    for i in range(b):
        per_layer = []
        for layer in range(layers):
            a = [[pick([scores[i, layer, h, q, k] for h in range(heads)])
                  + (1.0 if q == k else 0.0) for k in range(n)]
                 for q in range(n)]
            a = [[v / sum(row) for v in row] for row in a]
            per_layer.append(a)
        first, second = per_layer
        # The later layer mixes what the earlier one produced: A2 @ A1.
        want = [[sum(second[q][m] * first[m][k] for m in range(n))
                 for k in range(n)] for q in range(n)]
        np.testing.assert_allclose(got[i], want, rtol=1e-12)


def test_rollout_rows_sum_to_one_and_unbatched_shape():
    rng = np.random.default_rng(2)
    scores = _random_attention(rng, (3, 6, 4, 7, 7))
    for residual, fusion in itertools.product((True, False),
                                              ("mean", "max", "min")):
        joint = analysis.attention_rollout(scores, residual, fusion)
        np.testing.assert_allclose(joint.sum(axis=-1), 1.0, rtol=1e-12)
        assert (joint >= 0).all()
    single = analysis.attention_rollout(scores[1])
    assert single.shape == (7, 7)
    np.testing.assert_allclose(single, analysis.attention_rollout(scores)[1])


def test_rollout_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"scores\.shape=\(3, 3\)"):
        analysis.attention_rollout(np.eye(3))
    with pytest.raises(ValueError, match="head_fusion='median'"):
        analysis.attention_rollout(np.ones((1, 1, 2, 2)) / 2,
                                   head_fusion="median")
    with pytest.raises(ValueError, match="non-negative"):
        analysis.attention_rollout(-np.ones((1, 1, 2, 2)))


def test_rollout_map_token_row_and_gap_mean():
    token = dict(image_size=4, patch_size=2, classifier="token")
    joint = np.arange(25, dtype=float).reshape(5, 5)
    np.testing.assert_array_equal(analysis.rollout_map(token, joint),
                                  [[1, 2], [3, 4]])
    gap = dict(image_size=4, patch_size=2, classifier="gap")
    joint = np.arange(16, dtype=float).reshape(4, 4)
    np.testing.assert_array_equal(analysis.rollout_map(gap, joint[None])[0],
                                  [[6, 7], [8, 9]])
    with pytest.raises(ValueError, match=r"joint\.shape=\(4, 4\)"):
        analysis.rollout_map(token, joint)


def test_overlay_darkens_unattended_pixels():
    image = np.full((4, 4, 3), 200, "uint8")
    out = analysis.overlay(image, [[0.0, 0.0], [0.0, 3.0]])
    assert out.shape == (4, 4, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out[3, 3], 200 / 255)   # the peak keeps it
    np.testing.assert_allclose(out[0, 0], 0.0)         # no attention: black
    with pytest.raises(ValueError, match=r"floats in \[-1, -1\]"):
        analysis.overlay(np.full((4, 4, 3), -1.0), [[1.0]])


# --------------------------------------------------------------------------
# mean attention distance


def test_distance_of_self_attention_is_zero():
    scores = np.broadcast_to(np.eye(10), (2, 3, 4, 10, 10))
    d = analysis.mean_attention_distance(scores, (3, 3), 16,
                                         num_prefix_tokens=1)
    assert d.shape == (3, 4)
    np.testing.assert_array_equal(d, 0.0)


def test_distance_of_uniform_attention_by_hand():
    # 2x2 grid of 8-pixel patches: every query sees 0, 8, 8 and 8*sqrt(2).
    d = analysis.mean_attention_distance(np.full((1, 1, 4, 4), 0.25), 2, 8,
                                         num_prefix_tokens=0)
    np.testing.assert_allclose(d, [[8 * (2 + math.sqrt(2)) / 4]])
    # 3x3 grid with a class token: uniform over all 10 tokens. The class
    # token's share is dropped and the rest renormalised, so this equals
    # the mean centre-to-centre distance over all 81 patch pairs.
    cells = [(r, c) for r in range(3) for c in range(3)]
    want = sum(16 * math.hypot(r1 - r2, c1 - c2)
               for (r1, c1) in cells for (r2, c2) in cells) / 81
    scores = np.full((2, 1, 10, 10), 0.1)
    d = analysis.mean_attention_distance(scores, (3, 3), 16,
                                         num_prefix_tokens=1)
    np.testing.assert_allclose(d, [[want], [want]])  # 2 layers, 1 head
    assert want == pytest.approx(
        analysis.uniform_attention_distance((3, 3), 16))


def test_distance_ignores_the_class_token_share():
    # Every patch puts 0.9 on the class token and 0.1 on its right-hand
    # neighbour (the last column on itself): distances 8, 8, 0 per row.
    rows, cols, p = 2, 3, 8
    n = 1 + rows * cols
    a = np.zeros((n, n))
    a[0, 0] = 1.0
    for r in range(rows):
        for c in range(cols):
            q = 1 + r * cols + c
            a[q, 0] = 0.9
            a[q, 1 + r * cols + min(c + 1, cols - 1)] += 0.1
    d = analysis.mean_attention_distance(a[None, None, None], (rows, cols), p)
    np.testing.assert_allclose(d, [[2 * p / 3]])


def test_distance_per_image_and_mean_over_images():
    rng = np.random.default_rng(3)
    scores = _random_attention(rng, (4, 2, 3, 17, 17))
    per = analysis.mean_attention_distance(scores, (4, 4), 8, per_image=True)
    assert per.shape == (4, 2, 3)
    np.testing.assert_allclose(
        analysis.mean_attention_distance(scores, (4, 4), 8), per.mean(0))
    np.testing.assert_allclose(
        analysis.mean_attention_distance(scores[2], (4, 4), 8), per[2])
    with pytest.raises(ValueError, match=r"grid_size=\(3, 3\)"):
        analysis.mean_attention_distance(scores, (3, 3), 8)
    with pytest.raises(ValueError, match="patch_pixels=0"):
        analysis.mean_attention_distance(scores, (4, 4), 0)


# --------------------------------------------------------------------------
# models: attention maps, embeddings


def test_attention_model_shares_weights_and_outputs(tiny):
    x = np.random.default_rng(4).uniform(-1, 1, (3, 32, 32, 3))
    attn = analysis.attention_model(tiny)
    assert attn is not tiny and attn.return_attention_scores
    assert analysis.attention_model(attn) is attn
    out = attn(x)
    np.testing.assert_allclose(to_numpy(out["output"]), to_numpy(tiny(x)),
                               atol=1e-6)
    scores = analysis.attention_maps(tiny, x, batch_size=2)
    assert scores.shape == (3, 2, 4, 17, 17)
    np.testing.assert_allclose(scores, to_numpy(out["attention_scores"]),
                               atol=1e-6)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
    joint = analysis.attention_rollout(scores)
    np.testing.assert_allclose(joint.sum(-1), 1.0, atol=1e-9)
    # Another resolution: position embeddings resized, 6x6 grid.
    big = analysis.attention_model(tiny, image_size=48)
    assert big.grid_size == (6, 6)
    assert big(np.zeros((1, 48, 48, 3)))["attention_scores"].shape == (
        1, 2, 4, 37, 37)
    with pytest.raises(ValueError, match=r"images\.shape=\(32, 32, 3\)"):
        analysis.attention_maps(tiny, x[0])
    with pytest.raises(ValueError, match="model must be"):
        analysis.attention_model(keras.Sequential([keras.layers.Dense(2)]))


def test_hybrid_distances_are_in_input_pixels(hybrid):
    g = analysis.token_geometry(hybrid)
    assert g.grid_size == (8, 8) and g.patch_pixels == 4  # ResNet stride 4
    x = np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3))
    scores = analysis.attention_maps(hybrid, x)
    assert scores.shape == (2, 2, 4, 65, 65)
    in_pixels = analysis.mean_attention_distance(
        scores, g.grid_size, g.patch_pixels, g.num_prefix_tokens)
    in_features = analysis.mean_attention_distance(
        scores, g.grid_size, 1, g.num_prefix_tokens)
    np.testing.assert_allclose(in_pixels, 4 * in_features)
    assert (in_features > 0).all()
    with pytest.raises(ValueError, match="hybrid"):
        analysis.embedding_filter_components(hybrid)


def test_position_similarity_of_hand_set_embeddings():
    model = keras_vit.vit(**TINY)        # 4x4 grid, class token, D = 32
    layer = model.get_layer("position_embedding")
    table = np.zeros((1, 17, 32), "float32")
    table[0, 0] = 1.0                    # class token: must be left out
    table[0, 1:, :16] = np.eye(16)       # one-hot per patch
    layer.pos_embedding.assign(table)
    sim = analysis.position_embedding_similarity(model)
    np.testing.assert_allclose(sim, np.eye(16).reshape(4, 4, 4, 4),
                               atol=1e-12)
    # One direction per grid row: similar within a row, orthogonal across.
    table[0, 1:] = 0.0
    for r, c in itertools.product(range(4), range(4)):
        table[0, 1 + 4 * r + c, r] = 1.0 + c
    layer.pos_embedding.assign(table)
    sim = analysis.position_embedding_similarity(model)
    r = np.arange(4)
    want = (r[:, None, None, None] == r[None, None, :, None]) * np.ones(
        (4, 4, 4, 4))
    np.testing.assert_allclose(sim, want, atol=1e-12)
    assert analysis.neighbour_similarity(sim) == {
        "adjacent": pytest.approx(0.5), "other": pytest.approx(
            (want.reshape(16, 16).sum() - 16 - 24) / (256 - 16 - 48))}


def test_filter_components_match_an_eigendecomposition(tiny):
    pcs = analysis.embedding_filter_components(tiny, n=5)
    assert pcs.images.shape == pcs.components.shape == (5, 8, 8, 3)
    kernel = tiny.get_layer("patch_embedding").conv.kernel.numpy()
    filters = kernel.reshape(-1, kernel.shape[-1]).T.astype("float64")
    centred = filters - filters.mean(axis=0)
    # PCA another way: eigenvectors of the covariance of the 32 filters.
    values, vectors = np.linalg.eigh(centred.T @ centred)
    order = np.argsort(values)[::-1]
    want = vectors[:, order[:5]].T
    got = pcs.components.reshape(5, -1)
    for g, w in zip(got, want):
        np.testing.assert_allclose(abs(float(g @ w)), 1.0, atol=1e-6)
    np.testing.assert_allclose(pcs.explained_variance_ratio,
                               values[order[:5]] / values.sum(), rtol=1e-6)
    for img in pcs.images:  # each rescaled to exactly [0, 1]
        assert img.min() == pytest.approx(0) and img.max() == pytest.approx(1)
    assert len(analysis.embedding_filter_components(tiny, n=500).images) == 32
    with pytest.raises(ValueError, match="n=0"):
        analysis.embedding_filter_components(tiny, n=0)


# --------------------------------------------------------------------------
# figures


def _check_png(path, min_side=200):
    from PIL import Image

    assert os.path.isfile(path), path
    assert 5_000 < os.path.getsize(path) < 400_000, os.path.getsize(path)
    with Image.open(path) as im:
        assert im.format == "PNG"
        w, h = im.size
        pixels = np.asarray(im.convert("L"), "float32")
    assert min_side <= min(w, h) and max(w, h) <= 3000, im.size
    assert pixels.std() > 10, f"{path} looks blank"
    assert not any(n.endswith(".partial") for n in os.listdir(
        os.path.dirname(path)))


def test_every_figure_renders(tiny, tmp_path):
    from keras_vit.analysis import plots

    x = np.random.default_rng(6).uniform(-1, 1, (2, 32, 32, 3))
    scores = analysis.attention_maps(tiny, x)
    g = analysis.token_geometry(tiny)
    pcs = analysis.embedding_filter_components(tiny)
    maps = analysis.rollout_map(g, analysis.attention_rollout(scores))
    paths = [
        plots.plot_filters(pcs.images, tmp_path / "filters.png",
                           explained_variance_ratio=(
                               pcs.explained_variance_ratio)),
        plots.plot_position_similarity(
            analysis.position_embedding_similarity(tiny),
            tmp_path / "position.png", title="tiny"),
        plots.plot_attention_distance(
            analysis.mean_attention_distance(scores, g.grid_size,
                                             g.patch_pixels),
            tmp_path / "distance.png", image_size=32, reference=10.0),
        plots.plot_rollout(((x[0] + 1) * 127.5).astype("uint8"), maps[0],
                           tmp_path / "sub" / "rollout.png", title="t"),
    ]
    for path in paths:
        _check_png(path)
    with pytest.raises(ValueError, match="path must end with .png"):
        plots.plot_rollout(np.zeros((8, 8)), np.eye(2), tmp_path / "r.jpg")


def test_inspect_end_to_end_from_a_keras_file(tiny, image_files, tmp_path):
    path = str(tmp_path / "tiny.keras")
    tiny.save(path)
    out = tmp_path / "out"
    result = analysis.inspect(path, image_files, out, batch_size=1)
    with open(out / "analysis.json") as f:
        written = json.load(f)
    assert written == {k: v for k, v in result.items() if k != "out_dir"}
    assert written["model"]["grid_size"] == [4, 4]
    assert written["num_images"] == 2
    dist = np.array(written["mean_attention_distance"]["pixels"])
    assert dist.shape == (2, 4) and (dist > 0).all()
    assert len(written["embedding_filters"]["explained_variance_ratio"]) == 28
    names = [e["file"] for e in written["images"]]
    assert names == ["rollout_01_noise_rgb.png", "rollout_02_ramp.png"]
    for entry in written["images"]:
        assert np.array(entry["rollout"]).shape == (4, 4)
        assert 0 <= entry["prediction"]["index"] < 5
    assert sorted(written["files"]) == sorted(os.listdir(out))
    for name in written["files"]:
        if name.endswith(".png"):
            _check_png(str(out / name))
    # The same numbers as the numpy API on the same inputs.
    pixels = analysis.load_images(image_files, 32)
    scores = analysis.attention_maps(tiny, pixels / 127.5 - 1)
    np.testing.assert_allclose(
        dist, analysis.mean_attention_distance(scores, (4, 4), 8), rtol=1e-4)


def test_inspect_hybrid_at_another_resolution_skips_filters(hybrid,
                                                            image_files,
                                                            tmp_path):
    result = analysis.inspect(hybrid, image_files[:1], tmp_path,
                              image_size=48)
    assert result["model"]["grid_size"] == [12, 12]
    assert result["model"]["effective_stride"] == 4
    assert "hybrid" in result["embedding_filters"]["skipped"]
    assert "embedding_filters.png" not in os.listdir(tmp_path)
    assert np.array(result["images"][0]["rollout"]).shape == (12, 12)


def test_inspect_errors_name_the_argument(tiny, image_files, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.png"):
        analysis.inspect(tiny, [str(tmp_path / "nope.png")], tmp_path)
    with pytest.raises(ValueError, match="weights='x'"):
        analysis.inspect(tiny, image_files, tmp_path, weights="x")
    with pytest.raises(ValueError, match="batch_size=0"):
        analysis.inspect(tiny, image_files, tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="BiT"):
        analysis.inspect("BiT-R50x1", image_files, tmp_path, weights=None)


def test_inspect_a_zoo_name_with_random_weights(image_files, tmp_path):
    result = analysis.inspect("ViT-Ti/16", image_files[1:], tmp_path,
                              weights=None, image_size=32)
    assert result["model"]["description"] == "ViT-Ti/16 (random init)"
    assert result["model"]["grid_size"] == [2, 2]
    assert np.array(result["mean_attention_distance"]["pixels"]).shape == (
        12, 3)


def test_cli_run_through_argparse(tiny, image_files, tmp_path, capsys):
    path = str(tmp_path / "tiny.keras")
    tiny.save(path)
    parser = argparse.ArgumentParser(prog="keras-vit")
    analysis_cli.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "figs"
    args = parser.parse_args(["inspect", path, *image_files, "--out",
                              str(out), "--image-size", "48"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "tiny.keras: 48x48, grid 6x6 (stride 8)" in text
    assert "analysis.json" in text
    assert len(os.listdir(out)) == 6  # 3 figures + 2 rollouts + JSON
    with open(out / "analysis.json") as f:
        assert json.load(f)["model"]["grid_size"] == [6, 6]
    args = parser.parse_args(["inspect", path, *image_files, "--out",
                              str(out), "--weights", "x"])
    with pytest.raises(ValueError, match="holds its own weights"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["inspect", path, "a.png"])  # --out is required



# Bad arguments to attention_rollout, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("rollout head_fusion", lambda: analysis.attention_rollout(
        np.zeros((1, 1, 2, 5, 5)), head_fusion="maen"), "head_fusion",
     "'maen'", "mean"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
