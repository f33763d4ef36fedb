"""transformers' SigLIP2 image towers (``Siglip2VisionModel``, and a whole
``Siglip2Model``'s), which transformers holds as NaFlex models: folders
its ``save_pretrained`` wrote, read as keras_vit models with the
``naflex`` option, against transformers' own forward on one batch of
images of mixed grids and padding; written back as transformers reads
them; settings keras_vit cannot compute refused in one line. Tiny random
models, every parameter random."""

import json

import numpy as np
import pytest

# torch and transformers before TensorFlow (tests/conftest.py: the other
# order crashes here).
import torch
import transformers

from keras_vit import zoo  # noqa: E402
from keras_vit.data import naflex  # noqa: E402
from keras_vit.zoo.formats import FormatError  # noqa: E402
from testkit import (  # noqa: E402
    assert_config_refused, assert_relative, forward, randomise_torch)

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, patch_size=4, num_patches=16)
# Grids below, at and above the table's 4 x 4, of other aspect ratios:
# the table is shrunk, kept and enlarged; padding after each.
GRIDS = ((3, 5), (6, 2), (4, 4), (1, 7))


def _batch():
    rng = np.random.default_rng(3)
    images = [rng.uniform(-1, 1, (4 * r, 4 * c, 3)).astype("float32")
              for r, c in GRIDS]
    return naflex.patchify(images, 4, max_patches=20, resize=False)


def _theirs(model, batch):
    shapes = np.max(batch["patch_coords"] * batch["patch_mask"][..., None],
                    axis=1) + 1
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(batch["patches"]),
                     pixel_attention_mask=torch.from_numpy(
                         batch["patch_mask"]),
                     spatial_shapes=torch.from_numpy(shapes))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A Siglip2VisionModel with and without its head, and a whole
    Siglip2Model: id -> (folder, its image tower in torch)."""
    out = {}
    for seed, (key, head) in enumerate((("head", True), ("tokens", False))):
        config = transformers.Siglip2VisionConfig(**VISION,
                                                  vision_use_head=head)
        model = randomise_torch(transformers.Siglip2VisionModel(config),
                                seed)
        path = tmp_path_factory.mktemp("hf") / key
        model.save_pretrained(path, safe_serialization=True)
        out[key] = path, model
    config = transformers.Siglip2Config(
        vision_config=VISION, text_config=dict(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, vocab_size=64))
    whole = randomise_torch(transformers.Siglip2Model(config), 2)
    path = tmp_path_factory.mktemp("hf") / "whole"
    whole.save_pretrained(path, safe_serialization=True)
    out["whole"] = path, whole.vision_model
    return out


@pytest.mark.backends
@pytest.mark.parametrize("key", ["head", "tokens", "whole"])
def test_folder_loads_with_transformers_outputs_on_mixed_grids(folders,
                                                               key):
    path, theirs = folders[key]
    model = zoo.load(str(path))
    config = model.get_config()
    assert config["naflex"] is True and config["image_size"] == 16
    batch = _batch()
    expected = _theirs(theirs, batch)
    if key == "tokens":  # no head: the tokens, padding included
        assert_relative(forward(model, batch),
                        expected.last_hidden_state.numpy())
        return
    assert_relative(forward(model, batch), expected.pooler_output.numpy())
    tokens = zoo.load(str(path), include_top=False, pooling=None)
    assert_relative(forward(tokens, batch),
                    expected.last_hidden_state.numpy())


@pytest.mark.parametrize("key", ["head", "whole"])
def test_folder_writes_back_as_transformers_reads_it(folders, key, tmp_path):
    path, theirs = folders[key]
    out = zoo.save_pretrained(zoo.load(str(path)), tmp_path / "back",
                              layout="transformers")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "siglip2_vision_model"
    assert config["num_patches"] == VISION["num_patches"]
    loaded, info = transformers.Siglip2VisionModel.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                     "mismatched_keys")), info
    batch = _batch()
    assert_relative(_theirs(loaded.eval(), batch).pooler_output.numpy(),
                    _theirs(theirs, batch).pooler_output.numpy())


def test_a_table_that_is_not_square_is_refused(folders, tmp_path):
    from testkit import transformers_folder_with

    folder = transformers_folder_with(folders["head"][0], tmp_path,
                                      num_patches=12)
    assert_config_refused(folder, FormatError, "num_patches=12")


def test_the_image_classifier_is_refused(folders, tmp_path):
    from testkit import transformers_folder_with

    folder = transformers_folder_with(
        folders["head"][0], tmp_path,
        architectures=["Siglip2ForImageClassification"])
    assert_config_refused(folder, FormatError, "Siglip2VisionModel")
