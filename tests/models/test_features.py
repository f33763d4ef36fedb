"""keras_vit.models.features: feature_model refuses what it does not
offer, naming it."""

import pytest

from testkit import cached_tiny_vit as _tiny_model
from testkit import bad_calls_test

import keras_vit


# Bad arguments to feature_model, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("feature_model outputs", lambda: keras_vit.models.feature_model(
        _tiny_model(), "tokns"), "outputs", "'tokns'", "tokens"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)


# Every kind of head a model's output can come from.
HEADS = {
    "plain": {},
    "distilled": {"distilled": True},
    "projection": {"head_type": "projection"},
    "sigmoid": {"classifier_activation": "sigmoid"},
    "distilled_softmax": {"distilled": True,
                          "classifier_activation": "softmax"},
    "attention_scores": {"distilled": True, "return_attention_scores": True},
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_logits_are_the_models_own_output(head):
    """``logits`` is what the model returns (a distilled model's mean of
    its two heads, after its classifier_activation), never one layer."""
    import numpy as np

    model = keras_vit.vit(16, 8, 16, 1, 2, 32, 5, **HEADS[head])
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    x = rng.uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    want = model(x)
    want = np.asarray(want["output"] if isinstance(want, dict) else want)
    np.testing.assert_allclose(
        np.asarray(keras_vit.models.feature_model(model, "logits")(x)),
        want, atol=1e-6)


# --------------------------------------------------------------------------
# intermediate_model: the outputs of chosen blocks, as timm's
# forward_intermediates gives them


def _dinov2_reg_pair(tmp_path):
    """timm's DINOv2 with 4 registers (class token + registers as prefix,
    layer scale, patch 14) at 3 blocks, random, written by timm and loaded
    here: (timm's model, ours)."""
    from timm.models import save_for_hf

    from testkit import random_timm_model

    theirs = random_timm_model("vit_base_patch14_reg4_dinov2", 28, 5,
                               depth=3)
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True)
    return theirs, keras_vit.zoo.load(str(tmp_path / "repo"))


def test_intermediates_equal_timms_forward_intermediates(tmp_path):
    import numpy as np
    import torch

    from testkit import random_images

    theirs, ours = _dinov2_reg_pair(tmp_path)
    x = random_images(28)
    tx = torch.from_numpy(x.transpose(0, 3, 1, 2))
    for indices, norm in ((None, False), (2, True), ([0, -1], False)):
        with torch.no_grad():
            want = theirs.forward_intermediates(
                tx, indices=indices, norm=norm, return_prefix_tokens=True,
                intermediates_only=True)
        got = ours.intermediate_model(indices, norm=norm,
                                      prefix_tokens=True)(x)
        blocks = [k for k in got if not k.endswith("_prefix")]
        assert len(blocks) == len(want), (indices, sorted(got))
        for key, (maps, prefix) in zip(blocks, want):
            scale = float(maps.abs().max())
            # timm's NCHW is our NHWC transposed.
            np.testing.assert_allclose(
                np.asarray(got[key]), maps.numpy().transpose(0, 2, 3, 1),
                atol=1e-5 * scale, err_msg=f"{indices} {key}")
            np.testing.assert_allclose(
                np.asarray(got[key + "_prefix"]), prefix.numpy(),
                atol=1e-5 * scale, err_msg=f"{indices} {key}")
    # The sequence form is the map's tokens in row order.
    seq = ours.intermediate_model([1], output_format="NLC")(x)["block_1"]
    grid = ours.intermediate_model([1])(x)["block_1"]
    np.testing.assert_allclose(np.asarray(seq),
                               np.asarray(grid).reshape(2, 4, -1))


def test_intermediates_follow_a_dynamic_image_size():
    import numpy as np

    m = keras_vit.vit(32, 8, 16, 2, 2, 32, 5, dynamic_image_size=True,
                      num_registers=2)
    f = m.intermediate_model(np.int64(1), prefix_tokens=True)
    out = f(np.zeros((1, 48, 64, 3), "float32"))
    assert tuple(out["block_1"].shape) == (1, 6, 8, 16)
    assert tuple(out["block_1_prefix"].shape) == (1, 3, 16)


def test_intermediates_of_a_model_that_returns_attention_scores():
    import numpy as np

    plain = keras_vit.vit(32, 8, 16, 2, 2, 32, 5)
    scored = keras_vit.vit(32, 8, 16, 2, 2, 32, 5,
                           return_attention_scores=True)
    scored.set_weights(plain.get_weights())
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype(
        "float32")
    want = plain.intermediate_model(list(np.arange(2)))(x)
    got = scored.intermediate_model([0, 1])(x)
    for key in ("block_0", "block_1"):
        np.testing.assert_allclose(np.asarray(got[key]),
                                   np.asarray(want[key]), atol=1e-6)


def test_intermediates_export_as_block_outputs(tmp_path):
    """``block_<i>`` outputs reach the artifact: the ONNX file returns what
    the Keras intermediate model returns (the export verifies against
    Keras before it is written)."""
    import numpy as np

    import onnxruntime as ort
    from testkit import tiny
    from keras_vit import export

    m = tiny(num_layers=2, image_size=32, patch_size=8)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(
        "float32")
    want = m.intermediate_model([0, 1])(x)
    export.to_onnx(m, str(tmp_path / "m.onnx"),
                   outputs=("logits", "block_0", "block_-1"))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(
        None, {session.get_inputs()[0].name: x})))
    assert got["block_0"].shape == (2, 4, 4, 32)
    np.testing.assert_allclose(got["block_0"], np.asarray(want["block_0"]),
                               atol=1e-4)
    np.testing.assert_allclose(got["block_-1"], np.asarray(want["block_1"]),
                               atol=1e-4)


# Bad arguments to intermediate_model: the argument and the value, in one
# line.
INTERMEDIATE_CALLS = [
    ("intermediate indices too many", lambda: _tiny_model()
     .intermediate_model(9), "indices", "9", "1 to 1"),
    ("intermediate index out of range", lambda: _tiny_model()
     .intermediate_model([0, 5]), "indices", "[0, 5]", "[-1, 0]"),
    ("intermediate index twice", lambda: _tiny_model()
     .intermediate_model([0, -1]), "indices", "[0, -1]",
     "each block once"),
    ("intermediate indices type", lambda: _tiny_model()
     .intermediate_model("last"), "indices", "'last'", "a list of ints"),
    ("intermediate output_format", lambda: _tiny_model()
     .intermediate_model(output_format="NCHW"), "output_format", "'NCHW'",
     "NHWC"),
]

test_intermediate_model_refuses_bad_arguments = bad_calls_test(
    INTERMEDIATE_CALLS)


@pytest.mark.parametrize("include_preprocessing", [False, True])
def test_feature_models_keep_the_input_convention_of_their_model(
        include_preprocessing):
    """A feature or intermediate model is a plain functional model; every
    path that feeds it pixels asks it how (keras_vit.data.normalization),
    so it must answer as the model it reads, not as the official [-1, 1]."""
    from keras_vit.data import normalization

    model = keras_vit.vit(16, 8, 8, 1, 1, 8, 2, input_normalization="clip",
                          include_preprocessing=include_preprocessing)
    for derived in (keras_vit.models.feature_model(model, "tokens"),
                    keras_vit.models.intermediate_model(model, 1)):
        assert normalization.same(normalization.of_model(derived),
                                  normalization.NAMED["clip"])
        assert (normalization.takes_raw_pixels(derived)
                is include_preprocessing)
