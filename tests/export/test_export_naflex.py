"""A NaFlex model (``naflex=True``) exported with its three named inputs,
the batch and the patch count free: each format's artifact loaded in its
runtime and run on a batch of mixed grids with padding at two patch
counts against Keras; an artifact that froze the patch count or ignored
the mask is not written; what a runtime cannot take is refused in one
line."""

import os

import numpy as np
import pytest
import torch  # noqa: F401 - before TensorFlow (tests/conftest.py)

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.data import naflex  # noqa: E402
from keras_vit.export import formats, saved_model  # noqa: E402
from testkit import randomise_keras  # noqa: E402

TINY = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32, naflex=True)
SUFFIX = {"saved_model": "", "onnx": ".onnx", "tflite": ".tflite",
          "openvino": ".xml"}
INPUTS = {"patches": [None, None, 48], "patch_coords": [None, None, 2],
          "patch_mask": [None, None]}


@pytest.fixture(scope="module")
def models():
    """A MAP head without a class token; a class token and mean pooling
    (whose padding the pooling leaves out), each image's table resized
    with its aspect ratio kept (RADIO's)."""
    return {
        "map": randomise_keras(keras_vit.vit(**TINY, num_classes=3,
                                             classifier="map")),
        "gap": randomise_keras(keras_vit.vit(**TINY, num_classes=3,
                                             classifier="gap",
                                             class_token=True,
                                             position_aspect=True), 1),
    }


def _mixed(seed, grids, max_patches):
    rng = np.random.default_rng(seed)
    return naflex.patchify([rng.uniform(-1, 1, (4 * r, 4 * c, 3))
                            for r, c in grids], 4, max_patches=max_patches,
                           resize=False)


@pytest.mark.parametrize("fmt", list(SUFFIX))
@pytest.mark.parametrize("pooling", ["map", "gap"])
def test_each_format_takes_patches_of_any_count(models, fmt, pooling,
                                                tmp_path):
    model = models[pooling]
    path = os.fspath(tmp_path / f"flex{SUFFIX[fmt] or '_sm'}")
    report = export.export(model, path, format=fmt, batch_sizes=(3, 1))
    assert report["verified"]
    assert report["input"]["shapes"] == INPUTS
    # Verified on mixed grids padded to the table's 16 patches, then to
    # 25 and 8.
    assert report["verification"]["patch_counts"] == [16, 25, 8]
    assert "mixed grids" in report["verification"]["data"]
    run = formats.format_module(fmt).open_artifact(path)
    limit = report["tolerance"]["max_abs_diff"]
    for seed, grids, count in ((0, [(4, 4), (2, 3), (1, 7)], 16),
                               (1, [(3, 9), (6, 2)], 27)):
        batch = _mixed(seed, grids, count)
        want = np.asarray(model(batch))
        got = run(batch)["logits"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=limit * max(
            1.0, np.abs(want).max()), rtol=0)


def test_onnx_names_the_patch_count(models, tmp_path):
    import onnx

    path = os.fspath(tmp_path / "flex.onnx")
    export.to_onnx(models["map"], path, quantization="dynamic_int8")
    dims = {i.name: [d.dim_param or d.dim_value
                     for d in i.type.tensor_type.shape.dim]
            for i in onnx.load(path).graph.input}
    assert dims == {"patches": ["batch", "num_patches", 48],
                    "patch_coords": ["batch", "num_patches", 2],
                    "patch_mask": ["batch", "num_patches"]}


def _wrapped(change):
    """A SavedModel runtime whose inputs ``change`` alters first."""
    real = saved_model.open_artifact

    def open_artifact(path):
        run = real(path)
        return lambda inputs: run(change(dict(inputs)))
    return open_artifact


def _ignores_the_mask(inputs):
    inputs["patch_mask"] = np.ones_like(inputs["patch_mask"])
    return inputs


def _froze_the_patch_count(inputs):
    """As a graph traced at 16 patches would: cut or padded to 16."""
    count = inputs["patch_mask"].shape[1]
    for name, value in inputs.items():
        if count >= 16:
            inputs[name] = value[:, :16]
        else:
            pad = [(0, 0), (0, 16 - count)] + [(0, 0)] * (value.ndim - 2)
            inputs[name] = np.pad(value, pad)
    return inputs


@pytest.mark.parametrize("change, where", [
    (_ignores_the_mask, "logits"), (_froze_the_patch_count, "25 patches")])
def test_an_artifact_that_ignores_the_mask_or_froze_n_is_not_written(
        models, monkeypatch, tmp_path, change, where):
    monkeypatch.setattr(saved_model, "open_artifact", _wrapped(change))
    path = tmp_path / "flex"
    with pytest.raises(export.ExportError, match=where) as info:
        export.to_saved_model(models["map"], os.fspath(path))
    assert "nothing was written" in str(info.value)
    assert not path.exists()


def test_given_patches_verify_the_artifact(models, tmp_path):
    batch = _mixed(3, [(5, 5), (1, 2), (3, 1)], 30)
    report = export.to_saved_model(models["gap"], os.fspath(tmp_path / "sm"),
                                   verify_data=batch, batch_sizes=(2, 1))
    assert report["verification"]["data"] == (
        "3 images given as verify_data (30 patches)")


@pytest.mark.parametrize("call, match", [
    (lambda m, p: export.to_saved_model(m, p, input="image_bytes"),
     "input='image_bytes'"),
    (lambda m, p: export.to_onnx(m, p + ".onnx", uint8_input=True),
     "uint8_input=True"),
    (lambda m, p: export.to_onnx(m, p + ".onnx", quantization="int8"),
     "quantization='int8'"),
    (lambda m, p: export.to_tflite(m, p + ".tflite", quantization="int8"),
     "quantization='int8'"),
    (lambda m, p: export.to_saved_model(m, p, outputs=("block_0",)),
     "outputs 'block_0'"),
    (lambda m, p: export.to_onnx(m, p + ".onnx",
                                 verify_data=np.zeros((2, 16, 16, 3))),
     "verify_data"),
])
def test_what_a_runtime_cannot_take_is_refused_in_one_line(
        models, tmp_path, call, match):
    path = os.fspath(tmp_path / "flex")
    with pytest.raises(ValueError, match=match) as info:
        call(models["map"], path)
    message = str(info.value)
    assert "\n" not in message
    assert "naflex=True" in message
    assert not os.listdir(tmp_path)
