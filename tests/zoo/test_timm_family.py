"""The ViT family members timm defines as its one VisionTransformer with
options (DeiT, DeiT-III, DINOv2 with and without registers, CLIP image
towers, the average-pool models, SigLIP's towers with their attention
pool), built by timm itself at depth 1 with
random weights, written by timm's ``save_for_hf``, loaded by keras_vit with
timm's logits, and written back so that timm loads the same logits."""

import json

import numpy as np
import pytest

import torch
import timm

from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from keras_vit.data.normalization import of_model  # noqa: E402
from testkit import (assert_close_to_timm, random_images,  # noqa: E402
                     random_timm_model, timm_forward, timm_from_file)

CLASSES = 5
# timm architecture -> (image size, patch size, what keras_vit builds).
FAMILY = {
    # Options given as timm's model_args rather than by an architecture.
    "vit_small_patch16_224": (32, 16, dict(
        class_token=False, classifier="avgmax", num_registers=2,
        qk_norm=True, fc_norm=True)),
    "deit_tiny_patch16_224": (32, 16, dict(classifier="token")),
    "deit_tiny_distilled_patch16_224": (32, 16, dict(distilled=True)),
    "deit3_small_patch16_224": (32, 16, dict(posemb_includes_prefix=False,
                                             layer_scale=1e-6)),
    "vit_small_patch14_dinov2": (28, 14, dict(layer_scale=1e-5)),
    "vit_small_patch14_reg4_dinov2": (28, 14, dict(num_registers=4)),
    # DINOv2-g's SiLU-gated packed MLP (timm's SwiGLUPacked), narrowed.
    "vit_giant_patch14_dinov2": (28, 14, dict(mlp="swiglu", mlp_dim=128,
                                              layer_scale=1e-5)),
    "vit_base_patch16_clip_quickgelu_224": (32, 16, dict(
        pre_norm=True, patch_bias=False, gelu="quick")),
    "vit_medium_patch16_gap_256": (32, 16, dict(class_token=False,
                                                classifier="gap",
                                                qkv_bias=False)),
    # SigLIP's image towers: the attention pool ("map"), no class token;
    # SigLIP 2's run the tanh GELU (their architecture says so).
    "vit_base_patch16_siglip_224": (32, 16, dict(
        classifier="map", class_token=False, gelu="exact")),
    "vit_base_patch32_siglip_256": (64, 32, dict(
        classifier="map", class_token=False, gelu="tanh")),
    "vit_base_patch16_siglip_gap_224": (32, 16, dict(
        classifier="gap", class_token=False)),
    # Post-norm blocks (timm's ResPostBlock; init_values only starts
    # their norms' scales, no layer scale).
    "vit_base_patch16_rpn_224": (32, 16, dict(
        post_norm=True, class_token=False, classifier="gap",
        layer_scale=None, qkv_bias=False)),
    # The attention pool beside a class token and registers (timm pools
    # the patches only), asked for by timm's model_args.
    "vit_tiny_patch16_224": (32, 16, dict(
        classifier="map", class_token=True, num_registers=1)),
    # Differential attention (its lambda_init depends on the block: three
    # blocks), in timm's Block and in its fused parallel block.
    "vit_dwee_patch16_reg1_gap_256": (32, 16, dict(
        differential="vectors", parallel=None, layer_scale=1e-5)),
    "vit_dpwee_patch16_reg1_gap_256": (32, 16, dict(
        differential="vectors", parallel="fused", num_registers=1)),
    # Parallel blocks with their output projections apart; with RMSNorm,
    # q/k norms, no q/k/v bias (the MLP's first bias on its own).
    "vit_pwee_patch16_reg1_gap_256": (32, 16, dict(
        parallel="split", differential=None, classifier="gap")),
    "vit_base_patch16_xp_224": (32, 16, dict(
        parallel="split", norm="rms", qk_norm=True, qkv_bias=False)),
    # MobileCLIP's ViT-B: timm's ConvStem (three convolutions, two
    # BatchNorms with their running statistics) cuts the patches; its
    # function fixes the width at 768.
    "vit_base_mci_224": (32, 16, dict(conv_stem=True,
                                      posemb_includes_prefix=False)),
}
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


# timm's own arguments beyond the architecture's, per test case.
TIMM_ARGS = {"vit_small_patch16_224": dict(
    class_token=False, global_pool="avgmax", reg_tokens=2, qk_norm=True),
    "vit_giant_patch14_dinov2": dict(embed_dim=48, num_heads=2),
    "vit_tiny_patch16_224": dict(global_pool="map", reg_tokens=1),
    **dict.fromkeys(("vit_dwee_patch16_reg1_gap_256",
                     "vit_dpwee_patch16_reg1_gap_256",
                     "vit_pwee_patch16_reg1_gap_256", "vit_base_patch16_xp_224"),
                    dict(embed_dim=64, num_heads=2, depth=3))}










@pytest.mark.parametrize("arch", sorted(FAMILY))
def test_timm_family_member_loads_with_timm_logits(arch, tmp_path):
    size, _, expected = FAMILY[arch]
    theirs = random_timm_model(arch, size, CLASSES, **TIMM_ARGS.get(arch, {}))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    x = random_images(size)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    for key, value in expected.items():
        assert config[key] == value, key
    assert_close_to_timm(ours(x), timm_forward(theirs, x))
    # timm reads the repository keras_vit writes, with the same logits.
    again, _ = _written_and_read_by_timm(ours, tmp_path / "back")
    assert_close_to_timm(timm_forward(again, x), timm_forward(theirs, x))


def _written_and_read_by_timm(model, folder):
    """``(timm's model of the repository keras_vit writes at folder, its
    config.json)``."""
    zoo.save_pretrained(model, folder)
    written = json.loads((folder / "config.json").read_text())
    return timm_from_file(written["architecture"], folder,
                          written["num_classes"],
                          **written["model_args"]), written


def test_swiglu_without_layer_scale_is_written_so_timm_loads_it(tmp_path):
    """timm's one SwiGLU ViT with LayerNorm is DINOv2-g's, which always
    has layer scale (timm drops an ``init_values`` of None and builds its
    1e-5 scales): a keras_vit SwiGLU model without layer scale is written
    with scales of one, so timm and keras_vit load it with its logits."""
    import keras_vit

    ours = keras_vit.vit(28, 14, 48, 1, 2, 128, CLASSES, mlp="swiglu")
    assert ours.get_config()["layer_scale"] is None
    rng = np.random.default_rng(0)
    for w in ours.weights:
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    x = random_images(28)
    want = np.asarray(ours(x))
    theirs, written = _written_and_read_by_timm(ours, tmp_path / "back")
    assert written["architecture"] == "vit_giant_patch14_dinov2"
    assert written["model_args"]["init_values"] == 1.0
    assert_close_to_timm(timm_forward(theirs, x), want)
    again = zoo.load(str(tmp_path / "back"))
    np.testing.assert_array_equal(np.asarray(again(x)), want)


def test_imagenet_normalised_deit_loads_and_keeps_its_normalisation(
        tmp_path):
    theirs = random_timm_model("deit_tiny_patch16_224", 32, CLASSES)
    theirs.pretrained_cfg = dict(theirs.pretrained_cfg, **IMAGENET)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    normalisation = of_model(ours).to_config()
    assert ours.get_config()["input_normalization"] == normalisation
    np.testing.assert_allclose(normalisation["mean"], IMAGENET["mean"])
    np.testing.assert_allclose(normalisation["std"], IMAGENET["std"])
    x = random_images(32)
    assert_close_to_timm(ours(x), timm_forward(theirs, x))
    zoo.save_pretrained(ours, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["pretrained_cfg"]["mean"] == IMAGENET["mean"]
    assert written["pretrained_cfg"]["std"] == IMAGENET["std"]


@pytest.mark.parametrize("dropped", [("mean",), ("std",), ("mean", "std")])
def test_a_missing_mean_or_std_is_timms_default(dropped, tmp_path):
    """A ``pretrained_cfg`` field naming no mean or std: ImageNet's, per
    field, as timm's ``resolve_data_config``."""
    theirs = random_timm_model("deit_tiny_patch16_224", 32, CLASSES)
    theirs.pretrained_cfg = dict(theirs.pretrained_cfg, mean=[0.5] * 3,
                                 std=[0.3] * 3)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    config = json.loads((tmp_path / "repo" / "config.json").read_text())
    for key in dropped:
        del config["pretrained_cfg"][key]
    (tmp_path / "repo" / "config.json").write_text(json.dumps(config))
    want = timm.data.resolve_data_config(model=timm.create_model(
        f"local-dir:{tmp_path / 'repo'}", pretrained=True))
    got = of_model(zoo.load(str(tmp_path / "repo"))).to_config()
    for key in ("mean", "std"):
        np.testing.assert_allclose(got[key], want[key], err_msg=key)


def test_timm_settings_keras_vit_lacks_are_refused_by_name(tmp_path):
    theirs = random_timm_model("vit_small_patch16_224", 32, CLASSES, global_pool="prr")
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    with pytest.raises(ValueError, match="global_pool='prr'"):
        zoo.load(str(tmp_path / "repo"))


def test_attention_pools_keras_vit_lacks_are_refused_by_name(tmp_path):
    """timm's AttentionPoolLatent can hold several latent queries or a
    position table; keras_vit's MAP head has neither, and says so in one
    line naming the parameter."""
    from safetensors.numpy import load_file, save_file

    theirs = random_timm_model("vit_base_patch16_siglip_224", 32, CLASSES)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    weights = tmp_path / "repo" / "model.safetensors"
    state = load_file(str(weights))
    for name, value, match in (
            ("attn_pool.latent", np.zeros((1, 2, 768), "float32"),
             "latent_len=2"),
            ("attn_pool.pos_embed", np.zeros((4, 768), "float32"),
             r"lacks: \['attn_pool.pos_embed'\]")):
        save_file(dict(state, **{name: value}), str(weights))
        with pytest.raises(ValueError, match=match) as info:
            zoo.load(str(tmp_path / "repo"))
        assert "\n" not in str(info.value)


def test_headless_siglip_returns_timms_pooled_embedding(tmp_path):
    """num_classes=0: the attention pool's output is the model's, and
    the folder keras_vit writes gives timm the same embedding."""
    torch.manual_seed(0)
    theirs = timm.create_model("vit_base_patch16_siglip_224",
                               pretrained=False, depth=1, img_size=32,
                               num_classes=0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    theirs.eval()
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    assert ours.get_config()["num_classes"] == 0
    x = random_images(32)
    out = np.asarray(ours(x))
    assert out.shape == (2, 768)
    assert_close_to_timm(out, timm_forward(theirs, x))
    zoo.save_pretrained(ours, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["global_pool"] == "map" and written["num_classes"] == 0
    again = timm_from_file(written["architecture"], tmp_path / "back", 0,
                           **written["model_args"])
    assert_close_to_timm(timm_forward(again, x), timm_forward(theirs, x))


def test_headless_timm_model_returns_its_pooled_features(tmp_path):
    torch.manual_seed(0)
    theirs = timm.create_model("vit_medium_patch16_gap_256",
                               pretrained=False, depth=1, img_size=32,
                               num_classes=0).eval()
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    x = random_images(32)
    out = np.asarray(ours(x))
    assert out.shape == (2, 512)
    assert_close_to_timm(out, timm_forward(theirs, x))


@pytest.mark.parametrize("arch", ["deit_tiny_distilled_patch16_224",
                                  "vit_medium_patch16_gap_256",
                                  "vit_small_patch16_224",
                                  "vit_base_patch16_siglip_224"])
def test_pre_logits_features_are_timms_head_input(arch, tmp_path):
    """The features a classifier's head reads, as timm's
    ``forward_head(pre_logits=True)`` returns them: after ``fc_norm``, and
    the mean of the class and distillation tokens for distilled DeiT."""
    size = FAMILY[arch][0]
    theirs = random_timm_model(arch, size, CLASSES, **TIMM_ARGS.get(arch, {}))
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    x = random_images(size)
    ours = zoo.load(str(tmp_path / "repo")).feature_model("pre_logits")
    with torch.no_grad():
        want = theirs.forward_head(theirs.forward_features(
            torch.from_numpy(x.transpose(0, 3, 1, 2))), pre_logits=True)
    assert_close_to_timm(ours(x), want.numpy())


@pytest.mark.parametrize("options, named", [
    (dict(parallel="split", differential="vectors"), "parallel='split'"),
    (dict(parallel="fused"), "differential=None"),
    (dict(parallel="split", mlp_norm=True), "mlp_norm=True"),
    (dict(differential="dual"), "differential='dual'")])
def test_blocks_timm_does_not_build_are_refused_in_one_line(options, named,
                                                            tmp_path):
    """A parallel block or differential attention no timm class builds
    (the split projections with differential attention, the dual lambda
    no timm config names) is refused before any file is written."""
    import keras_vit

    model = keras_vit.vit(image_size=32, patch_size=16, hidden_size=32,
                          num_layers=1, num_heads=2, mlp_dim=64,
                          num_classes=CLASSES, gelu="exact", **options)
    with pytest.raises(ValueError, match=named) as refused:
        zoo.save_pretrained(model, tmp_path / "out")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_an_integer_tensor_bound_for_a_weight_is_refused_naming_it(tmp_path):
    """A safetensors file may hold int64 counts (a BatchNorm's batches
    seen, a scalar the reader passes over), never an integer weight: that
    one is refused naming the file and the tensor, not cast."""
    from safetensors.numpy import load_file, save_file

    theirs = random_timm_model("vit_base_mci_224", 32, CLASSES)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    path = tmp_path / "repo" / "model.safetensors"
    state = load_file(str(path))
    assert state["patch_embed.backbone.0.bn.num_batches_tracked"].dtype \
        == np.int64
    state["patch_embed.backbone.0.bn.running_var"] = np.ones(192, np.int64)
    save_file(state, str(path))
    with pytest.raises(ValueError, match=r"backbone\.0\.bn\.running_var"
                       r"\.dtype: dtype I64 of shape \[192\]") as refused:
        zoo.load(str(tmp_path / "repo"))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("arch, kwargs", [
    ("vit_dpwee_patch16_reg1_gap_256", dict(embed_dim=64, num_heads=2)),
    ("vit_dwee_patch16_reg1_gap_256", dict(embed_dim=64, num_heads=2)),
    ("vit_base_mci_224", {})])
def test_the_new_blocks_and_stem_give_timms_intermediate_features(
        arch, kwargs, tmp_path):
    """forward_intermediates of differential attention, parallel blocks
    and the conv stem: the blocks' NHWC maps and their prefix tokens are
    timm's."""
    from testkit import assert_features_are_timms

    theirs = random_timm_model(arch, 32, CLASSES, depth=2, **kwargs)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    ours = zoo.load(str(tmp_path / "repo"))
    assert_features_are_timms(ours, theirs, random_images(32))


# model_args keys (each branch of keras_vit's arguments.honoured) with a
# value timm builds otherwise than the written model, the top-level
# fields left as written: where timm's create_model loads the folder,
# keras_vit computes what timm does, or refuses naming the field.
MODEL_ARGS = [
    ("global_pool", "max"), ("global_pool", "avgmax"), ("global_pool", "x"),
    ("global_pool", ""), ("global_pool", "prr"), ("global_pool", "token"),
    ("num_classes", 0), ("num_classes", 7), ("in_chans", 1),
    ("num_heads", 3), ("embed_dim", 96), ("depth", 2), ("mlp_ratio", 2.0),
    ("drop_rate", 0.1), ("attn_drop_rate", 0.1), ("drop_path_rate", 0.1),
    ("act_layer", "gelu_tanh"), ("act_layer", "quick_gelu"),
    ("act_layer", "silu"), ("act_layer", "relu"),
    ("norm_layer", "rmsnorm"), ("embed_norm_layer", "layernorm"),
    ("block_fn", "NoBlock"), ("class_token", False), ("fc_norm", False),
    ("final_norm", False), ("no_embed_class", True), ("qkv_bias", False),
    ("proj_bias", False), ("init_values", 0.1), ("dynamic_img_size", True),
    ("pos_embed", "none"), ("mlp_layer", "SwiGLUPacked"),
    ("weight_init", "jax"), ("no_such_argument", 1)]


@pytest.fixture(scope="module")
def gap_repo(tmp_path_factory):
    """timm's average-pool ViT at 32 pixels written by timm: top-level
    ``global_pool`` "avg", ``model_args`` with the same."""
    path = tmp_path_factory.mktemp("gap") / "repo"
    theirs = random_timm_model("vit_small_patch16_224", 32, CLASSES,
                               global_pool="avg", embed_dim=48, num_heads=2)
    save_for_hf(theirs, path, safe_serialization=True)
    return path


@pytest.mark.parametrize("key, value", MODEL_ARGS)
def test_every_model_args_key_is_timms_or_refused(key, value, gap_repo,
                                                  tmp_path):
    import shutil

    folder = tmp_path / "repo"
    shutil.copytree(gap_repo, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["global_pool"] == "avg"
    config["model_args"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    x = random_images(32)
    try:
        theirs = timm.create_model(f"local-dir:{folder}",
                                   pretrained=True).eval()
    except Exception:  # timm builds nothing of the folder either
        theirs = None
    try:
        ours = zoo.load(str(folder))
    except ValueError as refused:
        message = str(refused)
        assert theirs is None or (
            f"model_args.{key}" in message and f"{key}={value!r}" in message
            and "\n" not in message), message
        return
    assert theirs is not None, f"keras_vit loads what timm refuses: {key}"
    want, got = timm_forward(theirs, x), np.asarray(ours(x))
    assert got.shape == want.shape
    if key == "num_classes" and value:  # timm's new head is random
        with torch.no_grad():
            want = theirs.forward_head(theirs.forward_features(
                torch.from_numpy(x.transpose(0, 3, 1, 2))), pre_logits=True)
        want, got = want.numpy(), ours.feature_model("pre_logits")(x)
    assert_close_to_timm(got, want)
