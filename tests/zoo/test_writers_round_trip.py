"""What the package writes, it and the target library read back.

Generated tiny models of the ViT family (a member's options, then up to
two options changed) go through each writer of ``zoo.save_pretrained``
(timm, transformers and keras-hub layouts). Each folder is read back by
``zoo.load`` and by the library itself (``timm.create_model``,
transformers' class from ``from_pretrained``, keras-hub's
``from_preset``), with the model's outputs; or the writer refuses in
one line before any file is written. And every reader refuses weights
that lack the head their file declares, unless a new head is asked for.
"""

import json
import os

import numpy as np
import pytest

import torch
import timm  # noqa: F401 (before TensorFlow: tests/conftest.py)
import transformers
import keras_hub
import hypothesis
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import zoo  # noqa: E402
from testkit import (assert_relative, random_images,  # noqa: E402
                     timm_from_file)

SIZES = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1,
             num_heads=2, mlp_dim=32)
# The members each library holds (their options over the paper's ViT),
# so that the writers are tried on what they write as well as on what
# they refuse.
MEMBERS = (
    dict(),
    dict(gelu="exact"),
    dict(gelu="exact", distilled=True),
    dict(gelu="exact", num_registers=1),
    dict(gelu="exact", layer_scale=0.5, num_classes=0),
    dict(gelu="exact", layer_scale=0.5, num_registers=1,
         posemb_includes_prefix=False, num_classes=0),
    dict(gelu="exact", layer_scale=0.5, mlp="swiglu", num_classes=0),
    dict(gelu="quick", pre_norm=True, patch_bias=False,
         layer_norm_epsilon=1e-5, num_classes=0),
    dict(classifier="map", class_token=False, num_classes=0),
    dict(classifier="gap", class_token=False, fc_norm=True),
    dict(gelu="exact", include_top=False),
    dict(gelu="exact", layer_scale=0.5, include_top=False),
)
# The family's options (keras_vit.models.encoder.FAMILY_DEFAULTS) and the
# head's, each with the values tried.
OPTIONS = dict(
    classifier=["token", "gap", "map"], class_token=[None, True, False],
    num_registers=[0, 1], posemb_includes_prefix=[True, False],
    fc_norm=[False, True], layer_scale=[None, 0.5], qk_norm=[False, True],
    qkv_bias=[True, False], proj_bias=[True, False],
    pre_norm=[False, True], patch_bias=[True, False],
    final_norm=[True, False], mlp=["gelu", "swiglu", "geglu"],
    sandwich_norm=[False, True], value_norm=[False, True],
    position_axes=[0, 4], mlp_bias=[None, False], pooled_norm=[False, True],
    norm=["layer", "rms"], patch_norm=[False, True],
    distilled=[False, True], gelu=["exact", "tanh", "quick"],
    layer_norm_epsilon=[1e-6, 1e-5], num_classes=[3, 0],
    head_type=["classifier", "projection"],
    include_top=[True, False])
_CHANGE = st.sampled_from(sorted(OPTIONS)).flatmap(
    lambda key: st.tuples(st.just(key), st.sampled_from(OPTIONS[key])))
CONFIGS = st.builds(lambda member, changes: {**member, **dict(changes)},
                    st.sampled_from(MEMBERS),
                    st.lists(_CHANGE, max_size=2))
X = random_images(16)


def _model(config):
    """The tiny model of ``config``, every weight random; None for options
    the model itself refuses."""
    try:
        model = keras_vit.vit(**dict(dict(SIZES, num_classes=3), **config))
    except ValueError:
        return None
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(rng.normal(0, 0.2, w.shape).astype("float32"))
    return model


def _nchw():
    return torch.from_numpy(np.ascontiguousarray(X.transpose(0, 3, 1, 2)))


def _timm(folder, ours):
    written = json.loads((folder / "config.json").read_text())
    model = timm_from_file(written["architecture"], folder,
                           written["num_classes"], **written["model_args"])
    with torch.no_grad():
        return model(_nchw()).numpy()


def _transformers(folder, ours):
    written = json.loads((folder / "config.json").read_text())
    name = written["architectures"][0]
    kwargs = {}
    if name == "ViTModel" and "pooler_output_size" not in written:
        kwargs["add_pooling_layer"] = False  # as the writer documents
    model, info = getattr(transformers, name).from_pretrained(
        folder, output_loading_info=True, **kwargs)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    with torch.no_grad():
        out = model.eval()(pixel_values=_nchw())
    if getattr(out, "logits", None) is not None:
        return out.logits.numpy()
    return (out.last_hidden_state if ours.ndim == 3
            else out.pooler_output).numpy()


def _keras_hub(folder, ours):
    task = (folder / "task.json").exists()
    cls = (keras_hub.models.ImageClassifier if task
           else keras_hub.models.Backbone)
    return np.asarray(cls.from_preset(str(folder))(X))


TARGETS = {"timm": _timm, "transformers": _transformers,
           "keras-hub": _keras_hub}


@pytest.mark.parametrize("layout", sorted(TARGETS))
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(config=CONFIGS)
# The finding: an attention pool with a SwiGLU MLP was written as a
# folder neither timm nor keras_vit loads (timm's pool gates by SiLU).
@example(config=dict(classifier="map", mlp="swiglu"))
@example(config=dict(gelu="exact", include_top=False))
# AIMv2's tower: its attention pool (pool_form="aimv2"), RMSNorm, the
# patch norm and the gated MLP.
@example(config=dict(classifier="map", class_token=False, num_classes=0,
                     norm="rms", patch_norm=True, mlp="swiglu",
                     pool_form="aimv2", qkv_bias=False, proj_bias=False))
@example(config=dict(gelu="exact", layer_scale=0.5, include_top=False))
def test_each_writer_writes_what_it_and_its_library_read_back(
        layout, config, tmp_path_factory):
    model = _model(config)
    hypothesis.assume(model is not None)
    folder = tmp_path_factory.mktemp("written") / "out"
    want = np.asarray(model(X))
    try:
        zoo.save_pretrained(model, folder, layout=layout)
    except ValueError as e:
        # A refusal: one line, and nothing written (no scratch left).
        assert "\n" not in str(e)
        assert not folder.exists(), os.listdir(folder)
        assert os.listdir(folder.parent) == []
        return
    assert os.listdir(folder.parent) == ["out"]
    assert_relative(zoo.load(str(folder))(X), want)
    assert_relative(TARGETS[layout](folder, want), want)


# -- readers refuse weights without the head their file declares ----------

def _drop(path, names):
    """Rewrites the safetensors file ``path`` without the tensors
    ``names``."""
    from safetensors.numpy import load_file, save_file

    state = load_file(str(path))
    assert set(names) <= set(state)
    save_file({k: v for k, v in state.items() if k not in names}, str(path),
              metadata={"format": "pt"})


def _drop_h5(path, names):
    """Takes the datasets ``names`` (the head's kernel and bias) out of
    keras-hub's ``task.weights.h5``."""
    import h5py

    with h5py.File(path, "r+") as f:
        assert all(name in f for name in names)
        for name in names:
            del f[name]


# Each layout's file of the head and the names of the head's arrays in
# it, for the paper's ViT and for a DeiT classifier (the family's
# readers: DeiTForImageClassification, DeiTImageClassifier).
HEADS = {
    "timm": ("model.safetensors", ["head.weight", "head.bias"]),
    "transformers": ("model.safetensors",
                     ["classifier.weight", "classifier.bias"]),
    "keras-hub": ("task.weights.h5", ["layers/dense/vars/0",
                                      "layers/dense/vars/1"])}
DEIT = dict(gelu="exact", num_registers=1)
# What each refusal names: the missing arrays, in the reader's words.
NAMED = {("timm", False): "head.weight, head.bias",
         ("transformers", False): "classifier.bias",
         ("keras-hub", False): "predictions/kernel",
         ("timm", True): "head.weight, head.bias",
         ("transformers", True): "classifier.weight, classifier.bias",
         ("keras-hub", True): "layers/dense/vars/0, layers/dense/vars/1"}


@pytest.mark.parametrize("deit", [False, True], ids=["vit", "deit"])
@pytest.mark.parametrize("layout", sorted(HEADS))
def test_readers_refuse_a_file_without_its_head(layout, deit, tmp_path):
    """A folder that declares a head of 3 classes and holds none is
    refused naming what is missing (it used to load as a zero head, or
    as a feature model) and the remedy; asking for a new head
    (num_classes) gives a zero head on the file's encoder."""
    model = _model(DEIT if deit else dict(gelu="exact"))
    folder = tmp_path / "out"
    zoo.save_pretrained(model, folder, layout=layout)
    name, keys = HEADS[layout]
    if name.endswith(".h5"):
        _drop_h5(folder / name, keys)
    else:
        _drop(folder / name, keys)
    with pytest.raises(ValueError) as info:
        zoo.load(str(folder))
    message = str(info.value)
    assert "\n" not in message and NAMED[layout, deit] in message, message
    assert "num_classes" in message, message
    new = zoo.load(str(folder), num_classes=4)
    np.testing.assert_array_equal(np.asarray(new(X)), 0.0)
    # The encoder is the file's: its embedding equals the one of a copy
    # written with its head.
    whole = tmp_path / "whole"
    zoo.save_pretrained(model, whole, layout=layout)
    np.testing.assert_array_equal(
        np.asarray(zoo.load(str(folder), num_classes=0)(X)),
        np.asarray(zoo.load(str(whole), num_classes=0)(X)))
