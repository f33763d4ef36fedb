"""transformers' DINOv3 ViT folders (``model_type`` ``"dinov3_vit"``), as
``DINOv3ViTModel.save_pretrained`` writes them, against transformers' own
forward at the size in the config and at others (DINOv3's rotary
coordinates take any multiple of the patch); keras_vit writing them back;
settings keras_vit cannot compute refused in one line. Tiny random
models, every parameter random (LayerNorms and layer scales too)."""

import json

import numpy as np
import pytest

# torch and transformers before TensorFlow (tests/conftest.py: the other
# order crashes here).
import transformers

import keras  # noqa: E402
from keras_vit import zoo  # noqa: E402
from keras_vit.zoo.formats import FormatError  # noqa: E402
from testkit import (  # noqa: E402
    assert_config_refused, assert_relative, forward, random_images,
    randomise_keras, transformers_folder_with,
    transformers_folders, transformers_forward)

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, patch_size=4, image_size=32)
# id -> (config fields, the builder options they read as).
CASES = {
    # Meta's biases: the query's and value's, no key bias (zeros here).
    "gelu": (dict(num_register_tokens=2),
             dict(mlp="gelu", gelu="exact", num_registers=2, qkv_bias=True,
                  proj_bias=True, rope_temperature=100.0)),
    # The gated MLP of the larger DINOv3s: SiLU's gate, keras_vit's SwiGLU.
    "gated": (dict(num_register_tokens=4, use_gated_mlp=True,
                   hidden_act="silu", rope_theta=1000.0),
              dict(mlp="swiglu", mlp_dim=64, num_registers=4,
                   rope_temperature=1000.0)),
    # A bias row is on where any of its fields is: zeros for the others.
    "some_biases": (dict(num_register_tokens=0, query_bias=False,
                         key_bias=True, proj_bias=False),
                    dict(num_registers=0, qkv_bias=True, proj_bias=True)),
    "no_biases": (dict(num_register_tokens=1, query_bias=False,
                       value_bias=False, proj_bias=False, mlp_bias=False),
                  dict(qkv_bias=False, proj_bias=False)),
}


_forward = transformers_forward


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each case saved by transformers: id -> (folder, torch model)."""
    return transformers_folders(tmp_path_factory, transformers.DINOv3ViTConfig,
                                transformers.DINOv3ViTModel, SIZES, CASES)


@pytest.mark.backends
@pytest.mark.parametrize("key", list(CASES))
def test_folder_loads_with_transformers_outputs_at_any_size(folders, key):
    path, theirs = folders[key]
    pooled = zoo.load(str(path))
    tokens = zoo.load(str(path), include_top=False, pooling=None)
    config = pooled.get_config()
    want = dict(rope="dinov3", position_embedding="none", layer_scale=1.0,
                num_classes=0, dynamic_image_size=True, **CASES[key][1])
    assert {k: config[k] for k in want} == want
    # The config's 32, then sizes it was not built at (any multiple of
    # the patch, not square too).
    for height, width in ((32, 32), (48, 48), (32, 44)):
        x = random_images(height, 2, width)
        expected = _forward(theirs, x)
        # One compiled call a model and size on JAX (testkit.forward).
        assert_relative(forward(pooled, x), expected.pooler_output.numpy())
        assert_relative(forward(tokens, x),
                        expected.last_hidden_state.numpy())


@pytest.mark.parametrize("key", list(CASES))
def test_folder_writes_back_as_transformers_reads_it(folders, key,
                                                     tmp_path):
    from safetensors.numpy import load_file

    path, theirs = folders[key]
    out = zoo.save_pretrained(zoo.load(str(path)), tmp_path / "back",
                              layout="transformers")
    before = json.loads((path / "config.json").read_text())
    after = json.loads((tmp_path / "back" / "config.json").read_text())
    assert after["architectures"] == ["DINOv3ViTModel"]
    fields = ("num_register_tokens", "use_gated_mlp", "hidden_act",
              "rope_theta", "intermediate_size", "layerscale_value",
              "key_bias", "value_bias", "mlp_bias")
    assert {k: after[k] for k in fields} == {k: before[k] for k in fields}
    loaded, info = transformers.DINOv3ViTModel.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    x = random_images(40)
    expected = _forward(theirs, x).last_hidden_state.numpy()
    assert_relative(_forward(loaded.eval(), x).last_hidden_state.numpy(),
                    expected)
    # The same tensors, but the unused mask token (zeros) and, where a
    # field of a bias row that is on was off, its biases written as zeros
    # under the field on (the key bias, off in the defaults, stays off
    # where it is zeros).
    old = load_file(str(path / "model.safetensors"))
    new = load_file(str(tmp_path / "back" / "model.safetensors"))
    added = {f"layer.{i}.attention.{p}_proj.bias"
             for i in range(2) for p in "qo"} if key == "some_biases" else set()
    assert set(new) - set(old) == added and set(old) <= set(new)
    assert not any(np.any(new[k]) for k in added)
    assert {k for k in old if not np.array_equal(new[k], old[k])} == {
        "embeddings.mask_token"}


def _with_config(folders, key, tmp_path, **fields):
    return transformers_folder_with(folders[key][0], tmp_path / key,
                                    **fields)


@pytest.mark.parametrize("key, fields, match", [
    ("gelu", dict(hidden_act="relu"), "field hidden_act.*'relu'"),
    # The gated MLP gates with hidden_act; keras_vit's SwiGLU with SiLU.
    ("gated", dict(hidden_act="gelu"), "field hidden_act.*SiLU"),
    ("gelu", dict(layerscale_value=0), "field layerscale_value"),
    # Heads 2 wide: the rotary pairs need a width divisible by 4.
    ("gelu", dict(num_attention_heads=16),
     "field num_attention_heads.*divisible by 4.*16"),
    ("gelu", dict(rope_theta=0), "field rope_theta"),
    ("gelu", dict(patch_size=[4, 8]), "field patch_size"),
    ("gelu", dict(architectures=["DINOv3ViTBackbone"]),
     "field architectures.*DINOv3ViTModel.from_pretrained"),
])
def test_settings_keras_vit_lacks_are_refused_in_one_line(
        folders, tmp_path, key, fields, match):
    assert_config_refused(_with_config(folders, key, tmp_path, **fields),
                          FormatError, match)


def test_training_only_coordinate_moves_are_not_read(folders, tmp_path):
    """pos_embed_shift, _jitter and _rescale move the rotary coordinates
    in training only: transformers' forward in eval mode is the same."""
    path, theirs = folders["gelu"]
    moved = _with_config(folders, "gelu", tmp_path, pos_embed_shift=0.5,
                         pos_embed_jitter=1.5, pos_embed_rescale=4.0)
    x = random_images(32)
    assert_relative(keras.ops.convert_to_numpy(zoo.load(str(moved))(x)),
                    _forward(theirs, x).pooler_output.numpy())


def test_keras_vit_model_writes_as_dinov3_or_names_what_it_lacks(tmp_path):
    import keras_vit

    kw = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2,
              num_heads=2, mlp_dim=64, layer_scale=0.1, num_registers=4,
              rope="dinov3", position_embedding="none", num_classes=0)
    model = randomise_keras(keras_vit.vit(mlp="swiglu", **kw), 3)
    out = zoo.save_pretrained(model, tmp_path / "mine", layout="transformers")
    written = json.loads((tmp_path / "mine" / "config.json").read_text())
    # Random key biases: the field on.
    assert (written["use_gated_mlp"], written["hidden_act"],
            written["key_bias"]) == (True, "silu", True)
    theirs = transformers.DINOv3ViTModel.from_pretrained(out).eval()
    for side in (32, 40):  # the model's own size; any, read back
        x = random_images(side)
        ours = model if side == 32 else zoo.load(out)
        assert_relative(ours.predict(x, verbose=0),
                        _forward(theirs, x).pooler_output.numpy())
    for changed, match in (
            (dict(position_embedding="learned_1d"),
             "position_embedding='learned_1d' .*rope='dinov3'"),
            (dict(num_classes=3), r"DINOv3ViTModel \(it holds no "
             "classification head"),
            (dict(rope_offset=1.0), r"options rope_offset \(rope_offset="
             r"1.0\)")):
        bad = keras_vit.vit(**dict(kw, **changed))
        with pytest.raises(ValueError, match=match) as info:
            zoo.save_pretrained(bad, tmp_path / "x", layout="transformers")
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x" / "config.json").exists()
