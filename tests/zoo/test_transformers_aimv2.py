"""transformers' AIMv2 image towers (``model_type``
``"aimv2_vision_model"``; the image tower of a whole ``"aimv2"``), as
``Aimv2VisionModel.save_pretrained`` writes them, against transformers'
own ``last_hidden_state`` and ``pooler_output`` (the attention-pooling
head, ``use_head``); keras_vit writing them back; settings keras_vit
cannot compute refused in one line. Tiny random models, every parameter
random (RMSNorms and the head's query too)."""

import json

import numpy as np
import pytest

# torch and transformers before TensorFlow (tests/conftest.py: the other
# order crashes here).
import transformers

from keras_vit import zoo  # noqa: E402
from keras_vit.zoo.formats import FormatError  # noqa: E402
from testkit import (  # noqa: E402
    assert_config_refused, assert_relative, forward, random_images,
    randomise_keras, randomise_torch, transformers_folder_with,
    transformers_folders, transformers_forward)

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=48)
# id -> (config fields, the builder options they read as). AIMv2's
# qkv_bias biases the query, key, value and output projections (and the
# head's key and value), mlp_bias the MLP: either on turns both of
# keras_vit's rows on, zeros for the other field's biases.
CASES = {
    # Apple's: no biases, the head, RMSNorm epsilon 1e-5.
    "head": (dict(image_size=28, patch_size=14),
             dict(qkv_bias=False, proj_bias=False, classifier="map",
                  num_classes=0, layer_norm_epsilon=1e-5)),
    "biases": (dict(image_size=32, patch_size=8, qkv_bias=True,
                    mlp_bias=True),
               dict(qkv_bias=True, proj_bias=True, classifier="map",
                    num_classes=0)),
    "qkv_bias_no_head": (dict(image_size=32, patch_size=8, qkv_bias=True,
                              use_head=False),
                         dict(qkv_bias=True, proj_bias=True,
                              classifier="gap")),
    "mlp_bias": (dict(image_size=28, patch_size=7, mlp_bias=True,
                      rms_norm_eps=1e-6, hidden_act="swish"),
                 dict(qkv_bias=True, proj_bias=True, classifier="map",
                      layer_norm_epsilon=1e-6)),
}


_forward = transformers_forward


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each case saved by transformers: id -> (folder, torch model)."""
    return transformers_folders(tmp_path_factory, transformers.Aimv2VisionConfig,
                                transformers.Aimv2VisionModel, SIZES, CASES)


@pytest.mark.backends
@pytest.mark.parametrize("key", list(CASES))
def test_folder_loads_with_transformers_outputs(folders, key):
    path, theirs = folders[key]
    fields, options = CASES[key]
    tokens = zoo.load(str(path), include_top=False, pooling=None)
    config = tokens.get_config()
    want = dict(class_token=False, norm="rms", patch_norm=True,
                mlp="swiglu", mlp_dim=48, pool_form="aimv2",
                **{k: v for k, v in options.items() if k != "num_classes"})
    assert {k: config[k] for k in want} == want
    x = random_images(fields["image_size"])
    expected = _forward(theirs, x)
    # One compiled call a model on JAX (testkit.forward).
    assert_relative(forward(tokens, x), expected.last_hidden_state.numpy())
    if fields.get("use_head", True):
        pooled = zoo.load(str(path))
        assert pooled.get_config()["num_classes"] == 0
        assert_relative(forward(pooled, x), expected.pooler_output.numpy())
    else:  # no head: the tokens by default
        assert expected.pooler_output is None
        assert zoo.load(str(path)).output_shape == tokens.output_shape


@pytest.mark.parametrize("key", list(CASES))
def test_folder_writes_back_as_transformers_reads_it(folders, key,
                                                     tmp_path):
    from safetensors.numpy import load_file

    path, theirs = folders[key]
    out = zoo.save_pretrained(zoo.load(str(path)), tmp_path / "back",
                              layout="transformers")
    before = json.loads((path / "config.json").read_text())
    after = json.loads((tmp_path / "back" / "config.json").read_text())
    assert after["architectures"] == ["Aimv2VisionModel"]
    # A bias field that was off comes back off: its biases were zeros.
    fields = ("model_type", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size", "rms_norm_eps", "qkv_bias", "mlp_bias",
              "use_head", "is_native")
    assert {k: after[k] for k in fields} == {k: before[k] for k in fields}
    assert after["hidden_act"] in ("silu", before["hidden_act"])
    loaded, info = transformers.Aimv2VisionModel.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    x = random_images(before["image_size"])
    expected, got = _forward(theirs, x), _forward(loaded.eval(), x)
    assert_relative(got.last_hidden_state.numpy(),
                    expected.last_hidden_state.numpy())
    if before["use_head"]:
        assert_relative(got.pooler_output.numpy(),
                        expected.pooler_output.numpy())
    old = load_file(str(path / "model.safetensors"))
    new = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(new) == set(old)
    assert all(np.array_equal(new[k], old[k]) for k in old)


def test_aimv2_models_image_tower(tmp_path):
    """A whole Aimv2Model: its image tower's pooler_output and tokens; the
    text tower and projections are not read."""
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=48, vocab_size=100, eos_token_id=2,
                max_position_embeddings=16)
    vision = dict(SIZES, image_size=32, patch_size=8, qkv_bias=True)
    whole = randomise_torch(transformers.Aimv2Model(transformers.Aimv2Config(
        vision_config=vision, text_config=text, projection_dim=16)), 11)
    whole.save_pretrained(tmp_path / "aimv2", safe_serialization=True)
    x = random_images(32)
    expected = _forward(whole.vision_model, x)
    assert_relative(zoo.load(str(tmp_path / "aimv2"))(x),
                    expected.pooler_output.numpy())
    assert_relative(zoo.load(str(tmp_path / "aimv2"), include_top=False,
                             pooling=None)(x),
                    expected.last_hidden_state.numpy())


def _with_config(folders, key, tmp_path, **fields):
    return transformers_folder_with(folders[key][0], tmp_path / key,
                                    **fields)


@pytest.mark.parametrize("key, fields, error, match", [
    # Native-resolution towers' sin-cos table is not keras_vit's.
    ("head", dict(is_native=True), ValueError,
     "field is_native.*expected false.*sincos_2d.*received is_native=True"),
    # The gated MLP gates with hidden_act; keras_vit's SwiGLU with SiLU.
    ("head", dict(hidden_act="gelu"), ValueError,
     "field hidden_act.*SiLU.*'gelu'"),
    # Its position table is the square grid's (transformers builds no
    # other).
    ("biases", dict(image_size=[32, 24]), ValueError,
     r"field image_size.*square.*\(32, 24\)"),
    ("head", dict(num_attention_heads=3), ValueError,
     "field num_attention_heads.*divides hidden_size=32"),
    ("head", dict(architectures=["Aimv2TextModel"]), ValueError,
     "field architectures.*'Aimv2TextModel'.*Aimv2VisionModel"),
    ("head", dict(use_head="yes"), FormatError, "field use_head"),
    ("head", dict(rms_norm_eps=0), FormatError, "field rms_norm_eps"),
    ("head", dict(qkv_bias=1), FormatError, "field qkv_bias"),
])
def test_settings_keras_vit_lacks_are_refused_in_one_line(
        folders, tmp_path, key, fields, error, match):
    assert_config_refused(_with_config(folders, key, tmp_path, **fields),
                          error, match)


def test_keras_vit_model_writes_as_aimv2_or_names_what_it_lacks(tmp_path):
    import keras_vit

    kw = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
              num_heads=2, mlp_dim=48, class_token=False, norm="rms",
              patch_norm=True, mlp="swiglu", layer_norm_epsilon=1e-5,
              classifier="map", pool_form="aimv2", num_classes=0)
    model = randomise_keras(keras_vit.vit(**kw), 3)
    out = zoo.save_pretrained(model, tmp_path / "mine", layout="transformers")
    written = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert (written["architectures"], written["hidden_act"],
            written["qkv_bias"], written["mlp_bias"], written["use_head"]
            ) == (["Aimv2VisionModel"], "silu", True, True, True)
    theirs = transformers.Aimv2VisionModel.from_pretrained(out).eval()
    x = random_images(32)
    assert_relative(model.predict(x, verbose=0),
                    _forward(theirs, x).pooler_output.numpy())
    for changed, match in (
            # AIMv2's qkv_bias also biases the output projection.
            (dict(qkv_bias=True, proj_bias=False),
             r"Aimv2VisionModel \(it holds proj_bias=True, the model "
             "False"),
            (dict(classifier="gap"), "classifier='gap' .*by attention"),
            (dict(pool_heads=1), r"AIMv2's classes cannot hold this model: "
             r"the options pool_heads \(pool_heads=1\)"),
            # big_vision's pool, SigLIP's: AIMv2's class is nearer.
            (dict(pool_form="map"), r"Aimv2VisionModel \(it holds "
             "pool_form='aimv2', the model 'map'"),
            (dict(num_classes=3), "classification head")):
        bad = keras_vit.vit(**dict(kw, **changed))
        with pytest.raises(ValueError, match=match) as info:
            zoo.save_pretrained(bad, tmp_path / "x", layout="transformers")
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x" / "config.json").exists()
