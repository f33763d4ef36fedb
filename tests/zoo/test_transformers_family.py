"""transformers' DeiT, DINOv2 (with registers too, each with its GELU or
its SwiGLU MLP) and CLIP image-tower folders, as their ``save_pretrained``
writes them, against transformers' own forward; and keras_vit writing
them back. Tiny random models, every parameter random (LayerNorms and
layer scales too: a unit scale would hide a swap); never the real Hub."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# torch and transformers before TensorFlow (tests/conftest.py: the other
# order crashes here).
import torch
import transformers

from keras_vit import zoo  # noqa: E402
from testkit import (  # noqa: E402
    OPTION_EXAMPLES, assert_config_refused, assert_relative, randomise_torch,
    transformers_folder_with)
from keras_vit.zoo import checkpoints  # noqa: E402

LABELS = {i: name for i, name in enumerate(
    ["tabby", "tiger cat", "lynx", "puma", "ocelot"])}
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)


def _deit(**kw):
    return transformers.DeiTConfig(
        **SIZES, intermediate_size=64, num_labels=5, id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()}, **kw)


def _clip_vision(**kw):
    return transformers.CLIPVisionConfig(**SIZES, intermediate_size=64,
                                         image_size=32, patch_size=16, **kw)


# id -> (class, config, image side, transformers output compared).
CASES = {
    "deit_teacher": (transformers.DeiTForImageClassificationWithTeacher,
                     lambda: _deit(image_size=32, patch_size=16), 32,
                     "logits"),
    "deit_classifier": (transformers.DeiTForImageClassification,
                        lambda: _deit(image_size=32, patch_size=8), 32,
                        "logits"),
    "deit_model": (transformers.DeiTModel,
                   lambda: _deit(image_size=32, patch_size=16), 32,
                   "pooler_output"),
    "dinov2": (transformers.Dinov2Model,
               lambda: transformers.Dinov2Config(**SIZES, image_size=28,
                                                 patch_size=14), 28,
               "pooler_output"),
    "dinov2_registers": (transformers.Dinov2WithRegistersModel,
                         lambda: transformers.Dinov2WithRegistersConfig(
                             **SIZES, image_size=32, patch_size=8,
                             num_register_tokens=3), 32, "pooler_output"),
    "clip_vision": (transformers.CLIPVisionModel, _clip_vision, 32,
                    "pooler_output"),
    # MetaCLIP 2's tower is CLIP's under its own model type.
    "metaclip2_vision": (
        transformers.MetaClip2VisionModel,
        lambda: transformers.MetaClip2VisionConfig(
            **_clip_vision().to_dict() | {"model_type":
                                          "metaclip_2_vision_model"}),
        32, "pooler_output"),
    # DINOv2-g's SwiGLU MLP (weights_in: gate rows, then value rows): two
    # thirds of hidden_size * mlp_ratio, rounded up to a multiple of 8
    # (32 * 4 -> 88; 32 * 2 -> 48).
    "dinov2_swiglu": (transformers.Dinov2Model,
                      lambda: transformers.Dinov2Config(
                          **SIZES, image_size=28, patch_size=14,
                          use_swiglu_ffn=True), 28, "pooler_output"),
    "dinov2_registers_swiglu": (
        transformers.Dinov2WithRegistersModel,
        lambda: transformers.Dinov2WithRegistersConfig(
            **SIZES, image_size=32, patch_size=8, num_register_tokens=2,
            mlp_ratio=2, use_swiglu_ffn=True), 32, "pooler_output"),
    # DINOv2's classifiers: the class token beside the patches' mean.
    "dinov2_classifier": (
        transformers.Dinov2ForImageClassification,
        lambda: transformers.Dinov2Config(
            **SIZES, image_size=28, patch_size=14, num_labels=5,
            id2label=LABELS, label2id={v: k for k, v in LABELS.items()}),
        28, "logits"),
    "dinov2_registers_classifier": (
        transformers.Dinov2WithRegistersForImageClassification,
        lambda: transformers.Dinov2WithRegistersConfig(
            **SIZES, image_size=32, patch_size=8, num_register_tokens=2,
            num_labels=5, id2label=LABELS,
            label2id={v: k for k, v in LABELS.items()}), 32, "logits"),
}




def _images(side, n=3):
    return np.random.default_rng(1).uniform(
        -1, 1, (n, side, side, 3)).astype("float32")


def _forward(model, x, **kwargs):
    """transformers' output on NHWC images (NCHW for torch)."""
    pixels = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    with torch.no_grad():
        return model(pixel_values=pixels, **kwargs)




@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each case saved by transformers: id -> (folder, torch model)."""
    out = {}
    for seed, (key, (cls, config, _, _)) in enumerate(CASES.items()):
        model = randomise_torch(cls(config()), seed)
        path = tmp_path_factory.mktemp("hf") / key
        model.save_pretrained(path, safe_serialization=True)
        out[key] = path, model
    return out


def _tokens(key, path, model, x):
    """keras_vit's counterpart of transformers' last_hidden_state: the
    tokens after the final norm (the folder at ``path`` loaded without
    pooling); CLIP's are before post_layernorm, ``model``'s last block's
    output."""
    if "clip" not in key:
        return zoo.load(str(path), include_top=False, pooling=None)(x)
    blocks = model.intermediate_model(1, output_format="NLC",
                                      prefix_tokens=True)(x)
    return np.concatenate([blocks["block_1_prefix"], blocks["block_1"]], 1)


@pytest.mark.parametrize("key", list(CASES))
def test_folder_loads_with_transformers_outputs_and_writes_back(
        folders, key, tmp_path):
    from safetensors.numpy import load_file

    cls, _, side, output = CASES[key]
    path, theirs = folders[key]
    x = _images(side)
    expected = _forward(theirs, x)
    model = zoo.load(str(path))
    assert_relative(model(x), getattr(expected, output).numpy())
    config = model.get_config()
    want = {"deit_teacher": dict(distilled=True, num_classes=5),
            "deit_classifier": dict(num_registers=1, num_classes=5),
            "deit_model": dict(num_registers=1, representation_size=32),
            "dinov2": dict(layer_scale=1.0, num_classes=0, num_registers=0),
            "dinov2_registers": dict(num_registers=3, num_classes=0,
                                     posemb_includes_prefix=False),
            "clip_vision": dict(pre_norm=True, patch_bias=False,
                                gelu="quick", num_classes=0),
            "metaclip2_vision": dict(pre_norm=True, patch_bias=False,
                                     gelu="quick", num_classes=0),
            "dinov2_swiglu": dict(mlp="swiglu", mlp_dim=88, layer_scale=1.0,
                                  num_classes=0, num_registers=0),
            "dinov2_registers_swiglu": dict(
                mlp="swiglu", mlp_dim=48, num_registers=2, num_classes=0,
                posemb_includes_prefix=False),
            "dinov2_classifier": dict(classifier="token_gap",
                                      num_classes=5, class_token=True),
            "dinov2_registers_classifier": dict(
                classifier="token_gap", num_classes=5, num_registers=2,
                posemb_includes_prefix=False)}[key]
    assert {k: config[k] for k in want} == want
    if key == "deit_teacher" or key.endswith("_classifier"):
        assert model.zoo_labels == list(LABELS.values())
    if output == "pooler_output":  # the tokens too
        assert_relative(_tokens(key, path, model, x),
                         expected.last_hidden_state.numpy())

    # And back: transformers reads keras_vit's folder whole, with the
    # same outputs and tensors (DINOv2's unused mask token is written as
    # zeros; with registers, the class token's table row is folded into
    # it, so that row is written as zeros).
    out = zoo.save_pretrained(model, tmp_path / "back", layout="transformers")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    # MetaCLIP 2's tower is written as the CLIP tower it is, which its
    # class reads tensor for tensor.
    assert written["architectures"] == [
        "CLIPVisionModel" if key == "metaclip2_vision" else cls.__name__]
    if key.startswith("dinov2"):
        assert written["use_swiglu_ffn"] is key.endswith("_swiglu")
        assert written["mlp_ratio"] == theirs.config.mlp_ratio
    loaded, info = cls.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    assert_relative(getattr(_forward(loaded.eval(), x), output).numpy(),
                     getattr(expected, output).numpy())
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(after) == set(before)
    # (the classifiers hold the encoder under their model type's name)
    changed = {k.split(".", 1)[1] if k.startswith("dinov2") else k
               for k in before if not np.array_equal(after[k], before[k])}
    assert changed == {
        "dinov2": {"embeddings.mask_token"},
        "dinov2_registers": {"embeddings.mask_token", "embeddings.cls_token",
                             "embeddings.position_embeddings"}}.get(
                                 key.removesuffix("_swiglu").removesuffix(
                                     "_classifier"), set())


@pytest.mark.parametrize("cls, config", [
    (transformers.CLIPModel, transformers.CLIPConfig),
    (transformers.MetaClip2Model, transformers.MetaClip2Config)])
def test_clip_models_image_tower(tmp_path, cls, config):
    """A whole CLIPModel (or MetaCLIP 2's): its image tower's
    pooler_output; the text tower and projections are not read."""
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, vocab_size=100, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    vision = {k: v for k, v in _clip_vision().to_dict().items()
              if k != "model_type"}
    whole = randomise_torch(cls(config(vision_config=vision,
                                       text_config=text)), 11)
    whole.save_pretrained(tmp_path / "clip", safe_serialization=True)
    x = _images(32)
    expected = _forward(whole.vision_model, x).pooler_output.numpy()
    assert_relative(zoo.load(str(tmp_path / "clip"))(x), expected)


@pytest.mark.parametrize("key, side", [
    ("deit_teacher", 48), ("deit_teacher", 16), ("dinov2", 42),
    ("dinov2_registers", 16), ("clip_vision", 64), ("metaclip2_vision", 48),
    ("dinov2_classifier", 42), ("dinov2_registers_classifier", 16)])
def test_at_another_size_the_table_is_resized_as_transformers_does(
        folders, key, side):
    """Another image_size resizes the table as transformers'
    interpolate_pos_encoding does (bicubic, a=-0.75, no antialiasing, but
    antialiased with DINOv2's registers; DeiT's two prefix rows and
    DINOv2's class row kept), shrunk and
    enlarged: transformers' own forward at that size. keras_vit's own
    bilinear rule misses it by far more than 1e-5."""
    _, _, _, output = CASES[key]
    path, theirs = folders[key]
    x = _images(side)
    kwargs = {} if key.startswith("dinov2") else dict(
        interpolate_pos_encoding=True)  # DINOv2 always interpolates
    expected = getattr(_forward(theirs, x, **kwargs), output).numpy()
    ours = zoo.load(str(path), image_size=side)
    # DINOv2 with registers' own interpolate_pos_encoding antialiases.
    assert ours.get_config()["position_resize"] == (
        "bicubic_aa" if key.startswith("dinov2_registers") else "bicubic")
    assert_relative(ours(x), expected)
    official = zoo.load(str(path), image_size=side,
                        position_resize="bilinear_corners")
    assert np.abs(np.asarray(official(x)) - expected).max() > 1e-4 * np.abs(
        expected).max()


def test_dinov2s_classifier_pooling_is_refused_where_a_library_lacks_it(
        folders, tmp_path):
    """timm and keras-hub pool no class token beside the patches' mean:
    their writers refuse a Dinov2ForImageClassification's model in one
    line naming the classifier."""
    model = zoo.load(str(folders["dinov2_classifier"][0]), gelu="exact")
    for layout, match in (("timm", "classifier='token_gap'"),
                          ("keras-hub", "layer_scale=1.0")):
        with pytest.raises(ValueError, match=match) as info:
            zoo.save_pretrained(model, tmp_path / layout, layout=layout)
        assert "\n" not in str(info.value)
        assert not (tmp_path / layout).exists()


def _with_config(folders, key, tmp_path, **fields):
    return transformers_folder_with(folders[key][0], tmp_path / key,
                                    **fields)


@pytest.mark.parametrize("key, fields, match", [
    ("dinov2_registers", dict(layerscale_value=0), "field layerscale_value"),
    ("clip_vision", dict(hidden_act="relu"), "field hidden_act"),
    ("clip_vision", dict(qkv_bias=False), "field qkv_bias"),
    ("deit_model", dict(architectures=["DeiTForMaskedImageModeling"]),
     "field architectures.*DeiTForImageClassificationWithTeacher"),
])
def test_settings_keras_vit_lacks_are_refused_in_one_line(
        folders, tmp_path, key, fields, match):
    assert_config_refused(_with_config(folders, key, tmp_path, **fields),
                          ValueError, match)


def test_mismatched_tensors_and_unwritable_models_are_refused(folders,
                                                              tmp_path):
    import keras_vit

    # A config of more registers than the file holds: listed, not guessed.
    bad = _with_config(folders, "dinov2_registers", tmp_path,
                       num_register_tokens=4)
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"'embeddings.register_tokens': \[1, 3, 32\] "
                       r"\(expected \[1, 4, 32\]\)"):
        zoo.load(str(bad))
    # A SwiGLU config over a GELU MLP's tensors: SwiGLU's names missing.
    bad = _with_config(folders, "dinov2", tmp_path, use_swiglu_ffn=True)
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"encoder\.layer\.0\.mlp\.weights_in\.weight"):
        zoo.load(str(bad))
    kw = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
              num_heads=2, mlp_dim=64)
    for model, match in (
            (keras_vit.vit(num_classes=3, layer_scale=1.0, **kw),
             r"Dinov2Model \(it holds no classification head.*num_classes=0"),
            (keras_vit.vit(num_classes=0, layer_scale=1.0, num_registers=2,
                           **kw), "Dinov2WithRegistersModel.*"
             r"posemb_includes_prefix=False, the model True"),
            (keras_vit.vit(num_classes=3, num_registers=2, **kw),
             r"DeiTForImageClassification.*num_registers=1, the model "
             r"2"),
            (keras_vit.vit(num_classes=3, qk_norm=True, **kw),
             "options qk_norm"),
            # No integer mlp_ratio gives a SwiGLU MLP 50 wide at width 32
            # (transformers computes the width from the ratio).
            (keras_vit.vit(num_classes=0, layer_scale=1.0, mlp="swiglu",
                           **dict(kw, mlp_dim=50)),
             "mlp_ratio.*mlp_dim=50")):
        with pytest.raises(ValueError, match=match):
            zoo.save_pretrained(model, tmp_path / "x", layout="transformers")
    assert not (tmp_path / "x" / "config.json").exists()


# Models a transformers class holds (DeiT, DINOv2, DINOv2 with registers,
# DINOv3, CLIP's, SigLIP's and AIMv2's image towers, ViT), to which the
# property below adds other options.
_HELD = {
    "aimv2": dict(class_token=False, norm="rms", patch_norm=True,
                  mlp="swiglu", classifier="map", pool_form="aimv2",
                  num_classes=0),
    "deit": dict(num_registers=1, num_classes=3),
    "dinov2": dict(layer_scale=1.0, num_classes=0),
    "dinov3": dict(layer_scale=1.0, rope="dinov3", position_embedding="none",
                   num_classes=0),
    "dinov2_registers": dict(layer_scale=1.0, num_registers=2,
                             posemb_includes_prefix=False, num_classes=0),
    "clip": dict(pre_norm=True, patch_bias=False, num_classes=0),
    "siglip": dict(classifier="map", class_token=False, num_classes=0),
    "vit": dict(num_classes=3),
}


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(sorted(_HELD)),
       chosen=st.sets(st.sampled_from(sorted(OPTION_EXAMPLES)), min_size=1,
                      max_size=2))
def test_what_the_writer_writes_holds_every_option_or_it_names_one(
        tmp_path, base, chosen):
    """Any option on top of a model a transformers class holds: the folder
    save_pretrained writes loads back with the model's every option value
    and outputs, or nothing is written and one line names an option (or
    the head) the nearest class holds otherwise. The writer's class
    choice reads the option rows and the classes' tables, so an option
    added as a row is covered here by its example."""
    import keras
    from hypothesis import assume

    import keras_vit
    from keras_vit.zoo.transformers.family import model_options

    kwargs = dict(image_size=32, patch_size=16, hidden_size=32,
                  num_layers=1, num_heads=2, mlp_dim=64, **_HELD[base])
    for name in sorted(chosen):
        value, needs = OPTION_EXAMPLES[name]
        kwargs.update(needs, **{name: value})
    keras.utils.set_random_seed(3)
    try:
        model = keras_vit.vit(**kwargs)
    except ValueError:  # a mix the checks between options refuse
        assume(False)
    folder = tmp_path / f"{base}-{'-'.join(sorted(chosen))}"
    try:
        zoo.save_pretrained(model, folder, layout="transformers")
    except ValueError as error:
        message = str(error)
        assert "\n" not in message
        assert any(name in message for name in
                   [*kwargs, "head", "mlp_ratio"]), message
        assert not (folder / "config.json").exists()
        return
    back = zoo.load(str(folder))
    assert model_options(back.get_config()) == model_options(
        model.get_config())
    images = np.random.default_rng(0).uniform(
        -1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(back.predict(images, verbose=0),
                               model.predict(images, verbose=0),
                               atol=1e-5)


# Each class the writer chooses: _HELD's models and DINOv2's classifiers.
_CLASSES = {**_HELD, "dinov2_classifier": dict(
    layer_scale=1.0, classifier="token_gap", num_classes=3),
    "dinov2_registers_classifier": dict(
        layer_scale=1.0, num_registers=2, posemb_includes_prefix=False,
        classifier="token_gap", num_classes=3)}


@pytest.mark.parametrize("base", sorted(_CLASSES))
def test_a_non_square_model_is_written_as_a_class_that_runs_it_or_refused(
        tmp_path, base):
    """A non-square model (32 x 48 pixels): transformers' class runs the
    folder written with the model's outputs, or nothing is written and one
    line names the images (DINOv2's classes interpolate a square table,
    CLIP's and AIMv2's configs have one side)."""
    import keras

    import keras_vit

    keras.utils.set_random_seed(3)
    model = keras_vit.vit(image_size=(32, 48), patch_size=16, hidden_size=32,
                          num_layers=1, num_heads=2, mlp_dim=64,
                          **_CLASSES[base])
    folder = tmp_path / "out"
    try:
        zoo.save_pretrained(model, folder, layout="transformers")
    except ValueError as error:
        message = str(error)
        assert "non-square" in message and "32, 48" in message, message
        assert "\n" not in message and not (folder / "config.json").exists()
        return
    name = json.loads((folder / "config.json").read_text())[
        "architectures"][0]
    theirs = getattr(transformers, name).from_pretrained(folder).eval()
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 48, 3)).astype(
        "float32")
    out = _forward(theirs, x)
    want = out.logits if "logits" in out else out.pooler_output
    assert_relative(np.asarray(model(x)), want.numpy(), 1e-4, 1e-5)
