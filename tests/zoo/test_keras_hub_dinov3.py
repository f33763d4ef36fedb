"""keras-hub's DINOV3Backbone (zoo/keras_hub/family.py): presets keras-hub
writes (save_to_preset) of tiny backbones with every weight random, one per
variant its constructor has (the gated MLP and the plain one, registers or
none, the five bias fields on, off and mixed, layer scale, rope_theta,
layer_norm_eps), loaded by zoo.load against keras-hub's own from_preset at
the config's image_shape and at another (DINOv3's rotary coordinates take
any multiple of the patch; keras-hub rebuilt with another image_shape);
written back by keras_vit (zoo.save_pretrained(..., layout="keras-hub")) and
loaded by keras-hub with the same outputs; what keras_vit cannot compute
refused in one line naming the file, the field and the value."""

import json
import shutil

import numpy as np
import pytest

import keras_hub

from keras_vit import zoo  # noqa: E402
from keras_vit.base.errors import ConfigError  # noqa: E402
from keras_vit.zoo import checkpoints  # noqa: E402
from testkit import random_images, randomise_keras, tiny_vit  # noqa: E402

SIZES = dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
             intermediate_dim=64, image_shape=(32, 32, 3))
_BIASES = ("use_query_bias", "use_key_bias", "use_value_bias",
           "use_proj_bias", "use_mlp_bias")
# id -> (DINOV3Backbone arguments, the builder options they read as, the
# bias fields keras_vit writes back).
CASES = {
    # keras-hub's converted presets: no key bias (Meta's), 4 registers (the
    # constructor's default), the exact GELU.
    "preset_like": (
        dict(use_key_bias=False),
        dict(mlp="gelu", gelu="exact", num_registers=4, qkv_bias=True,
             proj_bias=True, layer_scale=1.0, rope_temperature=100.0,
             layer_norm_epsilon=1e-5, mlp_dim=64),
        dict(use_key_bias=False)),
    # The larger DINOv3s' gated MLP: SiLU's gate times up_proj, keras_vit's
    # SwiGLU intermediate_dim wide.
    "gated": (
        dict(use_gated_mlp=True, hidden_activation="silu",
             num_register_tokens=2, rope_theta=1000.0,
             layer_scale_init_value=1e-5, layer_norm_eps=1e-6,
             use_key_bias=False),
        dict(mlp="swiglu", gelu="exact", num_registers=2, layer_scale=1e-5,
             rope_temperature=1000.0, layer_norm_epsilon=1e-6, mlp_dim=64),
        dict(use_key_bias=False)),
    # Every bias off: both rows off; no registers, no mask token;
    # the dropout rates act in training only.
    "no_biases": (
        dict(num_register_tokens=0, use_mask_token=False,
             attention_dropout=0.1, drop_path_rate=0.1,
             **dict.fromkeys(_BIASES, False)),
        dict(num_registers=0, qkv_bias=False, proj_bias=False,
             attention_dropout_rate=0.1, drop_path_rate=0.1),
        dict.fromkeys(_BIASES, False)),
    # Mixed: a row is on where any of its fields is, zeros for the rest
    # (written back on, but the key bias, off where it is zeros).
    "some_biases": (
        dict(use_gated_mlp=True, hidden_activation="swish",
             num_register_tokens=1, use_query_bias=False,
             use_proj_bias=False),
        dict(mlp="swiglu", num_registers=1, qkv_bias=True, proj_bias=True),
        dict.fromkeys(_BIASES, True)),
}


def _randomise(model, seed):
    rng = np.random.default_rng(seed)
    for w in model.weights:  # every weight: norms, layer scales, tokens
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _max_error(ours, theirs):
    """The largest difference to keras-hub's outputs ``theirs``, which
    must say something; at most 1e-5."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and np.abs(theirs).max() > 0.1
    error = float(np.abs(ours - theirs).max())
    assert error <= 1e-5, error
    return error


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """Each case saved by keras-hub: id -> (folder, its from_preset)."""
    out = {}
    for seed, (key, (kw, _, _)) in enumerate(CASES.items()):
        hub = _randomise(keras_hub.models.DINOV3Backbone(**SIZES, **kw), seed)
        folder = tmp_path_factory.mktemp("hub") / key
        hub.save_to_preset(str(folder))
        out[key] = folder, keras_hub.models.Backbone.from_preset(str(folder))
    return out


@pytest.mark.parametrize("key", list(CASES))
def test_preset_loads_and_writes_back_with_keras_hubs_outputs(
        presets, key, tmp_path):
    folder, theirs = presets[key]
    model = zoo.load(str(folder))
    config = model.get_config()
    want = dict(rope="dinov3", position_embedding="none", class_token=True,
                dynamic_image_size=True, include_top=False, **CASES[key][1])
    assert {k: config[k] for k in want} == want
    assert model.zoo_name.startswith("DINOv3 ")
    # Every token after the final LayerNorm (DINOV3Backbone pools nothing),
    # at the preset's image_shape and, keras-hub rebuilt at another (not
    # square), the same model at that size.
    x = random_images(32)
    errors = [_max_error(model(x), theirs(x))]
    other = keras_hub.models.DINOV3Backbone.from_preset(
        str(folder), image_shape=(48, 40, 3))
    x_other = random_images(48, width=40)
    errors.append(_max_error(model(x_other), other(x_other)))
    # Written back as keras-hub's class, which loads it as its own.
    zoo.save_pretrained(model, str(tmp_path / "back"), layout="keras-hub")
    back = keras_hub.models.DINOV3Backbone.from_preset(str(tmp_path / "back"))
    errors.append(_max_error(back(x), theirs(x)))
    before = json.loads((folder / "config.json").read_text())["config"]
    after = json.loads((tmp_path / "back" / "config.json").read_text())[
        "config"]
    same = ("num_register_tokens", "use_gated_mlp", "rope_theta",
            "layer_scale_init_value", "layer_norm_eps", "intermediate_dim",
            "image_shape", "attention_dropout", "drop_path_rate")
    assert {k: after[k] for k in same} == {k: before[k] for k in same}
    assert {k: after[k] for k in CASES[key][2]} == CASES[key][2]
    assert after["hidden_activation"] == (
        "silu" if before["use_gated_mlp"] else "gelu")
    assert max(errors) <= 1e-5


def test_keras_vit_model_writes_as_dinov3_or_names_what_it_lacks(tmp_path):
    """A DINOv3 keras_vit builds (random key biases: the field on) written
    as a DINOV3Backbone, and the live keras-hub object read back; its GELU
    form serves no layer of a SwiGLU backbone. What the class does not
    compute is refused in one line naming the option and the class."""
    kw = dict(image_size=32, patch_size=8, num_layers=2, rope="dinov3",
              position_embedding="none", layer_scale=0.1, num_registers=4,
              include_top=False)
    model = randomise_keras(tiny_vit(mlp="swiglu", gelu="tanh", **kw), 3)
    zoo.save_pretrained(model, str(tmp_path / "mine"), layout="keras-hub")
    theirs = keras_hub.models.Backbone.from_preset(str(tmp_path / "mine"))
    assert type(theirs).__name__ == "DINOV3Backbone"
    assert (theirs.use_gated_mlp, theirs.hidden_activation,
            theirs.use_key_bias, theirs.num_register_tokens) == (
                True, "silu", True, 4)
    x = random_images(32)
    _max_error(model(x), theirs(x))
    # The live object reads the same (through its own preset).
    _max_error(zoo.from_keras_hub(theirs)(x), theirs(x))
    for changed, option in ((dict(rope_offset=1.0), "rope_offset=1.0"),
                            (dict(layer_scale=None), "layer_scale=None")):
        bad = tiny_vit(gelu="exact", **dict(kw, **changed))
        with pytest.raises(ValueError) as info:
            zoo.save_pretrained(bad, str(tmp_path / "no"),
                                layout="keras-hub")
        message = str(info.value)
        assert "DINOV3Backbone" in message and option in message, message
        assert "\n" not in message
    assert not (tmp_path / "no").exists()


# -- refused presets ----------------------------------------------------------

def _edit(src, dst, **fields):
    shutil.copytree(src, dst)
    data = json.loads((dst / "config.json").read_text())
    data["config"].update(fields)
    (dst / "config.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("key,fields,field,value", [
    ("preset_like", dict(hidden_activation="relu"), "hidden_activation",
     "relu"),
    # keras_vit's SwiGLU gates with SiLU; its plain MLP is a GELU's.
    ("gated", dict(hidden_activation="gelu"), "hidden_activation", "gelu"),
    ("preset_like", dict(hidden_activation="silu"), "hidden_activation",
     "silu"),
    # Heads 2 wide: the rotary pairs, by rows and columns, need 4.
    ("preset_like", dict(num_heads=16), "num_heads", "16"),
    ("preset_like", dict(rope_theta=0), "rope_theta", "0"),
    ("preset_like", dict(image_shape=[None, None, 3]), "image_shape",
     "None"),
    ("preset_like", dict(patch_size=[8, 4]), "patch_size", "[8, 4]"),
    ("preset_like", dict(use_layer_norm_v2=True), "use_layer_norm_v2",
     "use_layer_norm_v2"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_what_keras_vit_lacks_is_refused_naming_file_field_value(
        presets, tmp_path, key, fields, field, value):
    folder = _edit(presets[key][0], tmp_path / "bad", **fields)
    (folder / "model.weights.h5").unlink()  # refused from the config
    with pytest.raises(ConfigError) as info:
        zoo.load(str(folder))
    message = str(info.value)
    assert str(folder / "config.json") in message, message
    assert f"config.{field}" in message and value in message, message
    assert "\n" not in message


@pytest.mark.parametrize("key,fields,missing", [
    ("preset_like", dict(use_gated_mlp=True, hidden_activation="silu"),
     "mlp/gate_proj/vars/0"),
    ("preset_like", dict(use_key_bias=True), "key_dense/vars/1"),
    ("no_biases", dict(num_register_tokens=2), "dinov3_embedding/vars/1"),
])
def test_weights_the_config_does_not_describe_are_refused(
        presets, tmp_path, key, fields, missing):
    folder = _edit(presets[key][0], tmp_path / "bad", **fields)
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"missing.*{missing}"):
        zoo.load(str(folder))
