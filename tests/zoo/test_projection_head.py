"""CLIP's image towers as timm holds them: the head is the image-text
projection (timm writes OpenAI's bias-free ``proj`` as ``head.weight``
beside a zero ``head.bias``), so the model is a feature extractor
(``head_type="projection"``): ``predict``, the exports' default outputs
and the serving signature give the embedding, not class scores. The
file's contents decide: a fine-tune of the same architecture (a trained
bias, or label names) stays a classifier, and keras_vit's own timm
writer records what the head is."""

import json

import numpy as np
import pytest

import torch
from timm.models import save_for_hf

import keras_vit
from keras_vit import zoo
from keras_vit.export.graph import check_head, default_outputs
from keras_vit.models.features import is_classifier
from testkit import (assert_close_to_timm, random_images, random_timm_model,
                     timm_forward)

ARCH = "vit_base_patch16_clip_quickgelu_224"
SIZE = 32


def _clip_repo(folder, zero_bias=True, labels=None):
    theirs = random_timm_model(ARCH, SIZE, 12)
    if zero_bias:
        with torch.no_grad():
            theirs.head.bias.zero_()
    save_for_hf(theirs, folder, safe_serialization=True)
    if labels is not None:
        config = json.loads((folder / "config.json").read_text())
        config["label_names"] = labels
        (folder / "config.json").write_text(json.dumps(config))
    return theirs


def test_a_clip_towers_projection_loads_as_its_embedding(tmp_path):
    theirs = _clip_repo(tmp_path / "clip")
    model = zoo.load(str(tmp_path / "clip"))
    x = random_images(SIZE)
    assert_close_to_timm(model(x), timm_forward(theirs, x))
    assert model.get_config()["head_type"] == "projection"
    assert not is_classifier(model)
    assert default_outputs(model) == ("features",)
    with pytest.raises(ValueError, match="head_type='projection'"):
        check_head(model, ("probabilities",))
    # A new head is a classifier; no head is the pooled embedding.
    assert zoo.load(str(tmp_path / "clip"), num_classes=4).head_type == (
        "classifier")
    pooled = zoo.load(str(tmp_path / "clip"), num_classes=0)
    assert pooled.head_type == "classifier" and pooled.output_shape == (
        None, 768)


@pytest.mark.parametrize("how", ["trained_bias", "labels"])
def test_a_fine_tune_of_the_same_architecture_stays_a_classifier(tmp_path,
                                                                  how):
    _clip_repo(tmp_path / "ft", zero_bias=how != "trained_bias",
               labels=[f"c{i}" for i in range(12)] if how == "labels"
               else None)
    model = zoo.load(str(tmp_path / "ft"))
    assert model.get_config()["head_type"] == "classifier"
    assert is_classifier(model)


def test_the_timm_writer_records_the_head_type(tmp_path):
    # Not a CLIP tower (no pre_norm) and a trained bias: only the written
    # field can say the head is a projection.
    model = keras_vit.vit(image_size=SIZE, patch_size=16, hidden_size=32,
                          num_layers=1, num_heads=2, mlp_dim=64,
                          num_classes=6, head_type="projection",
                          gelu="exact")
    model.get_layer("head").bias.assign(np.linspace(-1, 1, 6))
    folder = zoo.save_pretrained(model, str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["head_type"] == "projection"
    again = zoo.load(folder)
    assert again.head_type == "projection"
    x = random_images(SIZE)
    np.testing.assert_allclose(again(x), model(x), atol=1e-5)


def test_the_registry_row_gives_the_projection_to_a_random_tower():
    tower = zoo.load("CLIP-B/16", weights=None, image_size=SIZE)
    assert tower.head_type == "projection" and tower.output_shape == (
        None, 512)
    assert zoo.load("CLIP-B/16", weights=None, image_size=SIZE,
                    num_classes=7).head_type == "classifier"


@pytest.mark.parametrize("bad, what", [
    (dict(num_classes=0), "num_classes=0"),
    (dict(include_top=False), "include_top=False"),
    (dict(label_names=["a", "b", "c"]), "label_names="),
    (dict(classifier_activation="softmax"), "classifier_activation="),
])
def test_a_projection_refuses_what_belongs_to_classes(bad, what):
    kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
              num_heads=1, mlp_dim=8, num_classes=3, head_type="projection")
    with pytest.raises(ValueError, match=f"head_type='projection', {what}"):
        keras_vit.vit(**dict(kw, **bad))
