"""timm's parallel ViTs (``vit_small_patch16_18x2_224``,
``vit_base_patch16_18x2_224``: ``ParallelThingsBlock``, Touvron et al.
2022): each block two attentions, then two MLPs, side by side, each with
its own norm and layer scale, summed; keras_vit's ``branches`` row.
Built by timm at two blocks with random weights, written by timm's
``save_for_hf`` and loaded with timm's outputs."""

import pytest

import torch  # noqa: F401 (before TensorFlow: tests/conftest.py)

import keras  # noqa: E402
from timm.models import save_for_hf  # noqa: E402

from keras_vit import zoo  # noqa: E402
from keras_vit.base import geometry  # noqa: E402
from testkit import (assert_close_to_timm, assert_features_are_timms,  # noqa: E402
                     random_images, random_timm_model, timm_forward,
                     timm_from_file)

ARCH = "vit_small_patch16_18x2_224"
SMALL = dict(embed_dim=64, num_heads=4)


def _things(folder, num_classes=5):
    theirs = random_timm_model(ARCH, 32, num_classes, depth=2, **SMALL)
    save_for_hf(theirs, folder, safe_serialization=True)
    return theirs


@pytest.mark.backends
@pytest.mark.parametrize("num_classes", [5, 0])
def test_parallel_things_blocks_load_with_timms_outputs(num_classes,
                                                        tmp_path):
    theirs = _things(tmp_path / "repo", num_classes)
    ours = zoo.load(str(tmp_path / "repo"))
    config = ours.get_config()
    assert (config["branches"], config["layer_scale"]) == (2, 1e-5)
    assert ours.count_params() == geometry.parameter_count(config)
    x = random_images(32)
    out = (keras.ops.convert_to_numpy(ours(x)) if num_classes
           else ours.predict(x, verbose=0))
    assert_close_to_timm(out, timm_forward(theirs, x))


def test_a_parallel_vit_at_another_size_is_timms(tmp_path):
    _things(tmp_path / "repo")
    ours = zoo.load(str(tmp_path / "repo"), image_size=48)
    theirs = timm_from_file(ARCH, tmp_path / "repo", 5, img_size=48,
                            depth=2, **SMALL)
    x = random_images(48)
    want = timm_forward(theirs, x)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)), want)
    # One model for every size: the table resized in its graph.
    dynamic = zoo.load(str(tmp_path / "repo"), dynamic_image_size=True)
    assert_close_to_timm(keras.ops.convert_to_numpy(dynamic(x)), want)


def test_parallel_things_block_features_are_timms(tmp_path):
    theirs = _things(tmp_path / "repo", num_classes=0)
    ours = zoo.load(str(tmp_path / "repo"))
    assert_features_are_timms(ours, theirs, random_images(32))


def test_a_third_branch_in_the_file_is_read_as_a_third(tmp_path):
    """The file's blocks decide the count: timm's block holds as many
    branches as its num_parallel (its architectures: two), which no
    config.json field records."""
    import functools

    import timm
    from timm.models.vision_transformer import ParallelThingsBlock

    from testkit import randomise_torch

    args = dict(depth=1, img_size=32, num_classes=5, **SMALL)
    theirs = randomise_torch(timm.create_model(
        ARCH, block_fn=functools.partial(ParallelThingsBlock,
                                         num_parallel=3), **args))
    # timm records its block by the class's name: the count is lost.
    save_for_hf(theirs, tmp_path / "repo", safe_serialization=True,
                model_args=dict(args, block_fn="ParallelThingsBlock"))
    ours = zoo.load(str(tmp_path / "repo"))
    assert ours.get_config()["branches"] == 3
    x = random_images(32)
    assert_close_to_timm(keras.ops.convert_to_numpy(ours(x)),
                         timm_forward(theirs, x))


def test_a_branch_missing_from_the_file_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    _things(tmp_path / "repo")
    path = tmp_path / "repo" / "model.safetensors"
    state = load_file(str(path))
    for key in [k for k in state if k.startswith("blocks.1.ffns.1.")]:
        del state[key]
    save_file(state, str(path))
    with pytest.raises(ValueError, match=r"missing from the checkpoint "
                       r"\(7\): blocks\.1\.ffns\.1\."):
        zoo.load(str(tmp_path / "repo"))
