"""zoo.load end to end: tags, URLs, the mirror, AugReg index, offline mode.

Released files are served from a local HTTP server on 127.0.0.1 standing in
for the official bucket (KERAS_VIT_MIRROR), holding random checkpoints in the
official layout. No test touches the internet.
"""

import csv
import functools
import http.server
import threading

import numpy as np
import pytest

import official
from testkit import bad_calls_test

import keras_vit
from keras_vit import zoo
from keras_vit.runtime.backend import to_numpy
from keras_vit.zoo import registry

# Runs on every Keras backend (tests/conftest.py).
pytestmark = pytest.mark.backends

TI = dict(patch=16, hidden=192, layers=12, heads=3, mlp=768)
HYBRID_FT = ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.03-res_384.npz")
AUGREG_FT = ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.03-res_384.npz")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A directory served over HTTP laid out like storage.googleapis.com."""
    root = tmp_path_factory.mktemp("bucket")
    augreg = root / "vit_models" / "augreg"
    augreg.mkdir(parents=True)
    official.write(augreg / AUGREG_FT,
                   official.vit_arrays(**TI, grid=24, num_classes=1000, seed=11))
    official.write(augreg / "Ti_16-other--imagenet2012-res_224.npz",
                   official.vit_arrays(**TI, grid=14, num_classes=1000, seed=12))
    # R+ViT-Ti/16: root-only ResNet (64 channels), 8x8 patches, stride 32.
    stem, channels = official.hybrid_arrays(num_layers=(), width=64, seed=14)
    hybrid = official.vit_arrays(**dict(TI, patch=8), grid=12,
                                 num_classes=1000, channels=channels, seed=14)
    hybrid.update(stem)
    official.write(augreg / HYBRID_FT, hybrid)
    with open(augreg / "index.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "ds", "epochs", "lr", "aug", "wd", "do", "sd",
                    "best_val", "final_val", "final_test", "adapt_ds",
                    "adapt_lr", "adapt_steps", "adapt_res", "adapt_final_val",
                    "adapt_final_test", "params", "infer_samples_per_sec",
                    "filename", "adapt_filename"])
        w.writerow(["Ti/16".replace("/", "_"), "i21k", 300, 0.001, "none", 0.03,
                    0.0, 0.0, 0.4, 0.4, 0.4, "imagenet2012", 0.03, 20000, 384,
                    0.78, 0.78, 5.7e6, 600, "Ti_16-i21k-up",
                    AUGREG_FT[:-4]])
        w.writerow(["Ti_16", "i21k", 300, 0.001, "none", 0.03, 0.0, 0.0, 0.4,
                    0.4, 0.4, "imagenet2012", 0.01, 20000, 224, 0.71, 0.71,
                    5.7e6, 600, "Ti_16-i21k-up",
                    "Ti_16-other--imagenet2012-res_224"])
        w.writerow(["Ti_16", "i21k", 300, 0.001, "none", 0.03, 0.0, 0.0, 0.4,
                    0.4, 0.4, "imagenet2012", 0.01, 20000, 224, 0.69, 0.69,
                    5.7e6, 600, "Ti_16-i21k-up", "Ti_16-worse"])
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(bucket, monkeypatch):
    root, url = bucket
    monkeypatch.setenv("KERAS_VIT_MIRROR", url)
    return root, url


def _x(side, n=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, side, side, 3)).astype(
        "float32")


@pytest.mark.slow
@pytest.mark.backend_independent(
    "the tag's download and cache are the same on every backend; on jax and "
    "torch, test_pre_logits_kept_with_head_and_dropped_with_new_head loads "
    "the official layout through zoo.load and test_resolve's "
    "test_image_size_resizes_the_position_embeddings resizes it")
def test_load_tag_through_mirror_matches_direct_load(mirror, tmp_path):
    root, _ = mirror
    model = zoo.load("ViT-Ti/16", weights="augreg")
    assert model.get_config()["image_size"] == 384  # the checkpoint's own
    assert model.zoo_weights.tag == "augreg" and model.zoo_weights.labels == (
        "imagenet2012")
    ref = keras_vit.vit(384, 16, 192, 12, 3, 768, 1000)
    zoo.load_weights(ref, root / "vit_models" / "augreg" / AUGREG_FT)
    x = _x(384, 1)
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(ref(x)))
    assert np.abs(to_numpy(model(x))).max() > 1e-3

    # Another resolution resizes the position embeddings; a new head is zero.
    small = zoo.load("vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                     num_classes=10)
    assert small.get_config()["image_size"] == 224
    assert small.get_layer("position_embedding").pos_embedding.shape == (
        1, 197, 192)
    np.testing.assert_array_equal(to_numpy(small(_x(224, 1))), 0.0)


@pytest.mark.slow
@pytest.mark.backend_independent(
    "on jax and torch, test_hybrid's test_logits_match_timm loads the "
    "official hybrid layout and test_hybrid_posemb_resize resizes its grid")
def test_load_hybrid_tag_through_mirror(mirror):
    root, _ = mirror
    model = zoo.load("R+ViT-Ti/16", weights="augreg")
    assert model.get_config()["image_size"] == 384
    assert model.get_config()["resnet"] == {"num_layers": [], "width_factor": 1}
    assert model.grid_size == (12, 12)
    ref = keras_vit.vit(384, 8, 192, 12, 3, 768, 1000,
                        resnet=dict(num_layers=(), width_factor=1))
    zoo.load_weights(ref, root / "vit_models" / "augreg" / HYBRID_FT)
    x = _x(384, 1)
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(ref(x)))
    small = zoo.load("vit_tiny_r_s16_p8_224.augreg_in21k_ft_in1k")
    assert small.grid_size == (7, 7)  # posemb resized 12x12 -> 7x7


@pytest.mark.slow
@pytest.mark.backend_independent(
    "on jax and torch, test_bit's test_logits_match_timm loads the official "
    "BiT layout and test_replaced_head_is_zero_and_features_match_timm "
    "checks a new head is zero")
def test_load_bit_tag_through_mirror(mirror):
    """BiT-S-R50x1 in the official layout, served as the bucket would."""
    root, _ = mirror
    from keras_vit.zoo.official import bit as bit_layout
    src = keras_vit.models.resnet_v2(64, (3, 4, 6, 3), 1, 1000)
    rng = np.random.default_rng(0)
    for w in src.weights:
        w.assign((rng.standard_normal(w.shape) * 0.05).astype("float32"))
    bucket = root / "bit_models"
    bucket.mkdir(exist_ok=True)
    official.write(bucket / "BiT-S-R50x1.npz", bit_layout.export_arrays(src))
    model = zoo.load("BiT-S-R50x1", image_size=64)
    assert model.zoo_weights.tag == "BiT-S"
    x = _x(64)
    np.testing.assert_allclose(to_numpy(model(x)), to_numpy(src(x)),
                               atol=1e-6)
    new_head = zoo.load("resnetv2_50x1_bits", image_size=64, num_classes=4)
    np.testing.assert_array_equal(to_numpy(new_head(x)), 0.0)


def test_pre_logits_kept_with_head_and_dropped_with_new_head(tmp_path):
    path = official.write(tmp_path / "i21k.npz", official.vit_arrays(
        **TI, grid=2, num_classes=50, representation_size=192, seed=13))
    kept = zoo.load("ViT-Ti/16", weights=str(path))
    assert kept.get_config()["image_size"] == 32  # inferred from the grid
    assert kept.get_config()["representation_size"] == 192
    assert kept.get_config()["num_classes"] == 50
    new = zoo.load("ViT-Ti/16", weights=str(path), num_classes=3)
    assert new.get_config()["representation_size"] is None
    keep = zoo.load("ViT-Ti/16", weights=str(path), num_classes=3,
                    keep_pre_logits=True)
    assert keep.get_config()["representation_size"] == 192
    feats = zoo.load("ViT-Ti/16", weights=str(path), include_top=False,
                     pooling="token")
    assert tuple(feats(_x(32)).shape) == (2, 192)


def test_https_url_and_file_url(bucket, tmp_path):
    root, url = bucket
    full = url + "vit_models/augreg/Ti_16-other--imagenet2012-res_224.npz"
    a = zoo.load("ViT-Ti/16", weights=full, image_size=32)
    b = zoo.load("ViT-Ti/16", weights="file://" + str(
        root / "vit_models/augreg/Ti_16-other--imagenet2012-res_224.npz"),
        image_size=32)
    np.testing.assert_array_equal(to_numpy(a(_x(32))), to_numpy(b(_x(32))))


def test_augreg_index_and_named_file(mirror):
    rows = zoo.augreg_index()
    assert len(rows) == 3 and rows[0]["name"] == "Ti_16"
    assert zoo.find_augreg("ViT-Ti/16", adapt_res=224) == (
        "Ti_16-other--imagenet2012-res_224")
    assert zoo.find_augreg("ViT-Ti/16") == AUGREG_FT[:-4]
    name = zoo.find_augreg("ViT-Ti/16", adapt_res=224)
    model = zoo.load("ViT-Ti/16", weights=f"augreg:{name}")
    assert model.get_config()["image_size"] == 224
    with pytest.raises(ValueError, match="adapt_res=999"):
        zoo.find_augreg("ViT-Ti/16", adapt_res=999)


def test_offline_error_names_file_url_and_place(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    with pytest.raises(zoo.OfflineError) as e:
        zoo.load("ViT-B/16")
    msg = str(e.value)
    record = registry.select("ViT-B/16", "imagenet21k+imagenet2012", None)
    assert "ViT-B_16.npz" in msg
    assert "storage.googleapis.com/vit_models/imagenet21k%2Bimagenet2012" in msg
    assert str(zoo.cache_dir()) in msg
    assert record.image_size == 384


def test_resolution_picks_the_matching_release(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    with pytest.raises(zoo.OfflineError, match="ViT-B_16-224.npz"):
        zoo.load("ViT-B/16", image_size=224)
    with pytest.raises(zoo.OfflineError, match=r"imagenet21k/ViT-L_32\.npz"):
        zoo.load("ViT-L/32", weights="imagenet21k")


def test_bad_weights_arguments(tmp_path):
    with pytest.raises(ValueError) as e:
        zoo.load("ViT-B/16", weights="imagenet")
    assert "weights='imagenet'" in str(e.value) and "imagenet21k" in str(e.value)
    with pytest.raises(ValueError, match="No released weights"):
        zoo.load("ViT-B/14")
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        zoo.load("ViT-Ti/16", weights=str(tmp_path / "nope.npz"))
    with pytest.raises(zoo.UnknownModelError, match="Did you mean"):
        zoo.load("ViT-Q/16", weights=None)


def test_random_init_and_image_size_checks():
    model = zoo.load("ViT-B/14", weights=None, image_size=28, num_classes=4)
    assert model.get_config()["patch_size"] == 14
    with pytest.raises(ValueError, match="image_size=30"):
        zoo.load("ViT-Ti/16", weights=None, image_size=30)


def test_info_and_list():
    names = zoo.list_models()
    assert "ViT-H/14" in names and "R50+ViT-B/16" in names
    assert len(names) == len(set(names)) >= 14
    assert zoo.list_models("vit-b_*") == ["ViT-B/16", "ViT-B/32", "ViT-B/8"]
    info = zoo.info("vit_base_patch16_224")
    assert info["name"] == "ViT-B/16" and info["default_weights"] == (
        "imagenet21k+imagenet2012")
    tags = set(info["weights"])
    assert {"imagenet21k", "imagenet21k+imagenet2012", "augreg", "augreg-i21k",
            "sam"} <= tags
    i21k = info["weights"]["imagenet21k"][0]
    assert i21k["num_classes"] == 21843 and i21k["representation_size"] == 768
    assert i21k["url"].endswith("vit_models/imagenet21k/ViT-B_16.npz")
    assert "Apache" in i21k["license"]
    assert {w["image_size"] for w in info["weights"]["imagenet21k+imagenet2012"]
            } == {224, 384}


def test_hybrid_info_and_urls():
    info = zoo.info("R+ViT-Ti/16")
    assert info["effective_stride"] == 32 and "effective stride is 32" in (
        info["notes"][0])
    r50 = zoo.info("vit_base_r50_s16_384")
    assert r50["name"] == "R50+ViT-B/16" and r50["effective_stride"] == 16
    urls = {w["url"] for ws in r50["weights"].values() for w in ws}
    assert ("https://storage.googleapis.com/vit_models/imagenet21k/"
            "R50%2BViT-B_16.npz") in urls
    assert zoo.info("R26+ViT-S/32")["weights"]["augreg"][0]["url"].endswith(
        "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
        "--imagenet2012-steps_20k-lr_0.01-res_384.npz")


def test_bit_names_and_info():
    info = zoo.info("BiT-M-R50x1")
    assert info["name"] == "BiT-R50x1" and info["family"] == "bit"
    assert info["config"] == {"block_units": [3, 4, 6, 3], "width_factor": 1}
    urls = {t: ws[0]["url"] for t, ws in info["weights"].items()}
    assert urls["BiT-M"] == "https://storage.googleapis.com/bit_models/BiT-M-R50x1.npz"
    assert urls["BiT-S"].endswith("BiT-S-R50x1.npz")
    assert urls["BiT-M-ILSVRC2012"].endswith("BiT-M-R50x1-ILSVRC2012.npz")
    assert info["weights"]["BiT-M"][0]["num_classes"] == 21843
    assert zoo.list_models("BiT-R152*") == ["BiT-R152x2", "BiT-R152x4"]


def test_bit_name_selects_its_tag(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    with pytest.raises(zoo.OfflineError, match=r"bit_models/BiT-M-R101x3\.npz"):
        zoo.load("BiT-M-R101x3")
    with pytest.raises(zoo.OfflineError, match=r"BiT-S-R50x1\.npz"):
        zoo.load("BiT-S-R50x1")


def test_label_lists_ship_with_the_package():
    assert len(zoo.labels("imagenet2012")) == 1000
    assert len(zoo.labels("imagenet21k")) == 21843
    assert zoo.labels("imagenet2012")[0][1].startswith("tench")
    ids = [i for i, _ in zoo.labels("imagenet21k")]
    assert ids == sorted(ids)
    with pytest.raises(ValueError, match="name='coco'"):
        zoo.labels("coco")


def test_headless_checkpoint_needs_num_classes(tmp_path):
    path = official.write(tmp_path / "headless.npz", official.vit_arrays(
        **TI, grid=2, num_classes=0, seed=15))
    with pytest.raises(ValueError, match="has no head; pass num_classes"):
        zoo.load("ViT-Ti/16", weights=str(path))
    model = zoo.load("ViT-Ti/16", weights=str(path), num_classes=4)
    np.testing.assert_array_equal(to_numpy(model(_x(32))), 0.0)
    feats = zoo.load("ViT-Ti/16", weights=str(path), include_top=False,
                     pooling="token")
    assert tuple(feats(_x(32)).shape) == (2, 192)


def test_mismatch_error_names_the_file(tmp_path):
    path = official.write(tmp_path / "wrong.npz", official.vit_arrays(
        patch=16, hidden=192, layers=2, heads=3, mlp=768, grid=2,
        num_classes=10))
    with pytest.raises(zoo.CheckpointError) as e:
        zoo.load("ViT-Ti/16", weights=str(path))
    assert "wrong.npz" in str(e.value)
    assert "encoder blocks: checkpoint 2, model 12" in str(e.value)


@pytest.mark.parametrize("config,image_size,num_classes,extra", [
    (dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
          patch_size=8), 32, 5, {}),
    (dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
          patch_size=8, classifier="gap"), 40, 3, {}),
    (dict(hidden_size=32, mlp_dim=40, num_heads=2, num_layers=2,
          patch_size=8, mlp="swiglu"), 32, 5, {}),
    (dict(hidden_size=32, mlp_dim=40, num_heads=2, num_layers=1,
          patch_size=8, mlp="swiglu", proj_bias=False), 32, 5, {}),
    (dict(hidden_size=32, mlp_dim=48, num_heads=2, num_layers=1,
          patch_size=4), 32, 7, {"representation_size": 24}),
    (dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
          patch_size=1, resnet=dict(num_layers=(1, 2), width_factor=0.5)),
     40, 4, {}),
    (dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
          patch_size=2, resnet=dict(num_layers=(), width_factor=0.5)),
     32, 4, {}),
    (dict(block_units=(1, 2, 1, 1), width_factor=0.5), 64, 6, {}),
])
def test_parameter_count_from_the_config_matches_the_built_model(
        config, image_size, num_classes, extra):
    """`keras-vit info` counts parameters without building the model."""
    if "block_units" in config:
        model = keras_vit.models.resnet_v2(
            image_size, config["block_units"], config["width_factor"],
            num_classes)
    else:
        model = keras_vit.models.vit(image_size=image_size,
                                     num_classes=num_classes,
                                     **config, **extra)
    assert registry.parameter_count(
        config, image_size, num_classes, **extra) == model.count_params()


def test_parameter_counts_of_the_paper():
    # FACTS.md: params at 224 with 1000 classes.
    from keras_vit.base import variants

    for name, count in (("ViT-Ti/16", 5_717_416), ("ViT-B/16", 86_567_656),
                        ("ViT-L/16", 304_326_632), ("ViT-H/14", 632_045_800),
                        ("R50+ViT-B/16", 98_659_112),
                        ("R26+ViT-S/32", 36_431_912)):
        assert registry.parameter_count(variants.parse(name).config) == count
    # Another option than those it counts: no figure rather than a wrong one.
    assert registry.parameter_count(dict(variants.parse("ViT-B/16").config,
                                         position_embedding="relative")) is None

@pytest.mark.backend_independent(
    "which names a released head gets is decided before anything runs on "
    "a backend")
def test_a_released_head_names_its_classes(mirror):
    """Official weights with their head kept carry the registry's class
    names (two classes that share a name get their WordNet id); a new
    head has none; the command line still shows the WordNet ids."""
    from keras_vit.zoo.preprocessing import model_labels

    model = zoo.load("ViT-Ti/16", weights="augreg", image_size=224)
    names = registry.label_names("imagenet2012")
    assert model.label_names == tuple(names) and len(set(names)) == 1000
    assert "crane (n02012849)" in names and "crane (n03126707)" in names
    source, rows = model_labels(model, 1000)
    assert source == "imagenet2012" and rows[0][0] == "n01440764"
    assert zoo.load("ViT-Ti/16", weights="augreg", image_size=224,
                    num_classes=10).label_names is None


# Bad arguments to zoo.load, zoo.labels and zoo.info, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("zoo.load name", lambda: zoo.load("ViT-Bx/16", weights=None),
     "name", "'ViT-Bx/16'", "Did you mean"),
    ("zoo.load weights tag", lambda: zoo.load(
        "ViT-B/16", weights="imagenet21", image_size=32),
     "weights", "'imagenet21'", "imagenet21k"),
    ("zoo.load image_size", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=0), "image_size", "0",
     "positive"),
    # 0 is no head (the pooled embedding), as in timm.
    ("zoo.load num_classes", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=32, num_classes=-1),
     "num_classes", "-1", "non-negative integer"),
    ("zoo.load keyword", lambda: zoo.load(
        "ViT-Ti/16", weights=None, image_size=32, include_tp=False),
     "keyword argument", "'include_tp'", "include_top"),
    ("zoo.load BiT keyword", lambda: zoo.load(
        "BiT-M-R50x1", weights=None, image_size=32, num_clases=3),
     "keyword argument", "'num_clases'", "num_classes"),
    ("zoo.labels", lambda: zoo.labels("imagenet2021"), "name",
     "'imagenet2021'", "imagenet2012"),
    ("zoo.info", lambda: zoo.info("ViT-L/61x"), "name", "'ViT-L/61x'",
     "Did you mean"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)


def test_timm_keywords_are_understood_or_refused_before_any_download(
        monkeypatch):
    """timm habits: pretrained=False is weights=None, img_size is
    image_size, features_only is refused naming the way here; offline,
    so that any attempt to download would fail differently."""
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    model = zoo.load("ViT-Ti/16", pretrained=False, img_size=32,
                     num_classes=3)
    assert model.input_shape[1:3] == (32, 32)
    assert model.output_shape == (None, 3)
    with pytest.raises(ValueError, match=r"features_only=True is timm's; "
                       r"here model\.intermediate_model"):
        zoo.load("ViT-B/16", features_only=True)
    with pytest.raises(ValueError, match="pretrained=False and "
                       "weights='augreg' disagree"):
        zoo.load("ViT-B/16", pretrained=False, weights="augreg")
    with pytest.raises(ValueError, match="pretrained must be True or False"):
        zoo.load("ViT-B/16", pretrained="yes")
    with pytest.raises(ValueError, match="img_size=32 .* and image_size=64 "
                       "disagree"):
        zoo.load("ViT-B/16", img_size=32, image_size=64)
