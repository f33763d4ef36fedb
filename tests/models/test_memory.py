"""keras_vit.models.memory: the estimates of a training step's and a forward
pass's memory, and the bounds that refuse, before allocating, what cannot
fit this machine (a predict at 4000 px, a .keras file asking for 100 GB of
weights, an export batch of 1e8 images), saying what to lower."""

import json

import numpy as np
import pytest

from testkit import TINY, tiny as _tiny
import keras_vit
from keras_vit.base.options import OPTIONS
from keras_vit.models.memory import step_memory_estimate


def test_memory_estimate_covers_hybrids_bit_and_mpp():
    from keras_vit.train import mpp

    vit = keras_vit.vit(image_size=64, patch_size=16, hidden_size=64,
                        num_layers=2, num_heads=2, mlp_dim=128, num_classes=10)
    hybrid = keras_vit.vit(image_size=64, patch_size=1, hidden_size=64,
                           num_layers=2, num_heads=2, mlp_dim=128,
                           num_classes=10,
                           resnet=dict(num_layers=(1, 1, 1),
                                       width_factor=0.5))
    bit = keras_vit.models.resnet_v2(64, (1, 1, 1, 1), 0.5, 10)
    bit_big = keras_vit.models.resnet_v2(128, (1, 1, 1, 1), 0.5, 10)
    estimate = step_memory_estimate
    # Same 4x4 token grid (stride 16): the hybrid adds its ResNet.
    assert hybrid.grid_size == vit.grid_size
    assert estimate(hybrid, 1) > estimate(vit, 1) > 0
    assert estimate(bit, 8) == 8 * estimate(bit, 1) > 0
    assert 3.9 < estimate(bit_big, 1) / estimate(bit, 1) < 4.1  # pixels
    wrapped = mpp.MaskedPatchPrediction(vit)
    head = 3 * 16 * 512 * 4  # logits, softmax, gradient of 512 colours
    assert estimate(wrapped, 1) - head == pytest.approx(
        estimate(vit, 1), rel=1e-9)


@pytest.mark.parametrize("row", [row.name for row in OPTIONS
                                 if row.block_copies])
def test_a_row_that_copies_the_block_multiplies_its_memory(row):
    # Read from the row's column, not from the option's name. Training:
    # each copy of a block keeps its own 12 N*D + 5 N*mlp + 3 heads*N^2
    # values. Forward: the peak is one block's, so two copies side by
    # side hold twice its larger phase (attention or MLP).
    from keras_vit.models.memory import forward_estimate

    size = dict(image_size=32, patch_size=16, hidden_size=64, num_layers=2,
                num_heads=2, mlp_dim=128, num_classes=10)
    one = keras_vit.vit(**size)
    two = keras_vit.vit(**size, **{row: 2})
    n, d, mlp, heads = 2 * 2 + 1, 64, 128, 2
    per_block = 12 * n * d + 5 * n * mlp + 3 * heads * n * n
    assert step_memory_estimate(two, 3) - step_memory_estimate(one, 3) == (
        3 * 4 * 2 * per_block)
    peak = max(2 * heads * n * n + 6 * n * d, 2 * n * mlp + 3 * n * d)
    assert forward_estimate(two, 3) - forward_estimate(one, 3) == (
        3 * 4 * peak)


def test_predict_refuses_an_image_size_whose_attention_cannot_fit(
        tmp_path, monkeypatch, capsys):
    """A memory bound: `predict ViT-Ti/16 --image-size 4000` asked ~88 GiB of
    attention maps for one image and failed on TensorFlow's OOM (31 s, 3.9
    GB peak for ViT-B/16) with a hint about --batch-size, which predict does
    not have. Now it is refused from the architecture before the images
    are read, naming the option."""
    from PIL import Image

    from keras_vit import cli
    from keras_vit.models import memory

    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8), (10, 20, 30)).save(image)
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    monkeypatch.setattr(memory, "available_memory", lambda: 16 * 2**30)
    status = cli.main(["predict", "ViT-Ti/16", str(image), "--image-size",
                       "4000", "--weights", "none"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "ViT-Ti/16 at 4000x4000 (62,501 tokens)" in err
    assert "16.0 GiB of memory available here; lower --image-size" in err


@pytest.mark.backends
def test_forward_memory_picks_a_batch_or_refuses(monkeypatch):
    from keras_vit.models import memory

    model = _tiny()
    per_image = memory.forward_estimate(model, 1)
    assert memory.forward_estimate(model, 8) == 8 * per_image > 0
    # The attention maps grow with the square of the tokens: 4x the side,
    # 257 tokens instead of 17, about 70x the estimate.
    big = _tiny(image_size=4 * TINY["image_size"])
    assert memory.forward_estimate(big, 1) > 50 * per_image
    # predict's own batch: as many as fit in half the memory, at most 16.
    assert memory.forward_batch(model, 16, available=7 * per_image) == 3
    assert memory.forward_batch(model, 16, available=1e12) == 16
    assert memory.forward_batch(model, 16, available=per_image) == 1
    with pytest.raises(ValueError, match="lower --image-size"):
        memory.forward_batch(model, 16, available=per_image / 2)
    # Every inference batch (predict, evaluate, few-shot, attention maps)
    # passes through memory.infer, which refuses a batch clearly too big.
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * per_image)
    images = np.zeros((64,) + model.inputs[0].shape[1:], "float32")
    with pytest.raises(ValueError, match=r"a batch of at most 2 image\(s\)"):
        memory.infer(model, images)
    assert memory.infer(model, images[:4]).shape == (4, TINY["num_classes"])
    # On an accelerator host memory does not hold the activations.
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "gpu")
    assert memory.forward_batch(model, 16) == 16
    assert memory.check_forward(model, 64) is None


def test_forward_estimate_counts_stacked_attention_outputs():
    from keras_vit.models import memory

    plain = _tiny()
    scores = _tiny(return_attention_scores=True)
    layers, heads = TINY["num_layers"], TINY["num_heads"]
    tokens = plain.grid_size[0] * plain.grid_size[1] + 1
    extra = memory.forward_estimate(scores, 1) - memory.forward_estimate(
        plain, 1)
    assert extra == 4 * layers * heads * tokens * tokens
    bit = keras_vit.models.resnet_v2(64, (1, 1, 1, 1), 0.5, 10)
    bit_big = keras_vit.models.resnet_v2(128, (1, 1, 1, 1), 0.5, 10)
    ratio = memory.forward_estimate(bit_big, 1) / memory.forward_estimate(
        bit, 1)
    assert 3.9 < ratio < 4.1  # pixels


@pytest.mark.parametrize("sizes,field", [
    (dict(hidden_size=4096, num_layers=200, num_heads=16, mlp_dim=16384),
     "num_layers=200"),
    (dict(hidden_size=1_000_000, num_heads=1), "hidden_size=1000000"),
])
def test_a_keras_file_with_absurd_sizes_is_refused_before_allocating(
        tmp_path, sizes, field):
    """A memory bound: a small .keras whose config asks for ~100 GB of
    weights is refused from its numbers, in one line, with the process's
    peak memory far below the model's size (measured on the child's own
    rusage)."""
    import os
    import subprocess
    import sys
    import zipfile

    from PIL import Image

    good = tmp_path / "tiny.keras"
    _tiny(num_classes=3).save(good)
    hostile = tmp_path / "hostile.keras"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(hostile, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                config["config"].update(sizes)
                data = json.dumps(config).encode()
            dst.writestr(item, data)
    # ~1 KB of HDF5 metadata per layer group: the q/k/v/out sublayers of
    # the attention took the file from 95 to 104 KB.
    assert hostile.stat().st_size < 120_000
    Image.new("RGB", (20, 20)).save(tmp_path / "x.png")
    # The command runs under a small launcher that reports its ru_maxrss:
    # on Linux a child's ru_maxrss starts at its parent's RSS, and this
    # test process can hold gigabytes late in a run, the launcher ~10 MB.
    peak_file = tmp_path / "peak"
    launcher = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:]);"
                " _, status, usage = os.wait4(p.pid, 0); "
                "open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); "
                "sys.exit(os.waitstatus_to_exitcode(status))")
    proc = subprocess.run(
        [sys.executable, "-c", launcher, str(peak_file), "keras-vit",
         "predict", str(hostile), str(tmp_path / "x.png")],
        capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    err = proc.stderr
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], err
    # Refused by the model's memory bound, or before it by the bounds of
    # the file's format (hidden_size at most 16384).
    assert ("GiB of weights" in lines[0] or "expected an integer in [1, "
            in lines[0]) and str(hostile) in lines[0]
    # ru_maxrss is in KiB on Linux: the import of TensorFlow and Keras, not
    # the model (tens of GiB).
    peak = int(peak_file.read_text())
    assert peak < 3 * 2**20, peak


@pytest.mark.parametrize("argv", [
    ["export", "MODEL", "--format", "onnx", "-o", "OUT.onnx",
     "--batch-sizes", "4,100000000"],
    ["benchmark", "MODEL", "--runtimes", "keras", "--batch", "100000000"],
])
def test_export_batch_sizes_beyond_memory_are_refused_first(
        tmp_path, capsys, argv):
    """A memory bound: a verification or benchmark batch is bounded by memory
    before its images are drawn (1e8 images of 32x32x3: 1.1 TiB)."""
    import tracemalloc

    from keras_vit import cli

    path = tmp_path / "tiny.keras"
    _tiny(num_classes=3).save(path)
    argv = [str(path) if a == "MODEL" else str(tmp_path / "out.onnx")
            if a == "OUT.onnx" else a for a in argv]
    tracemalloc.start()
    try:
        status = cli.main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert status == 2, err
    # Refused by the memory bound, or before it by the option's own bounds.
    assert ("a batch of 100000000 images" in err and "GiB" in err) or (
        "must be an integer in [1, " in err and "100000000" in err), err
    assert len(err.strip().splitlines()) == 1, err
    assert peak < 2**30, peak
    assert not (tmp_path / "out.onnx").exists()


def test_a_verification_batch_beyond_memory_is_refused_before_drawing(
        tmp_path):
    """The memory bound itself, where no option bound answers first: the
    Python exporter's batch sizes (1e8 images of 32x32x3: 1.1 TiB)."""
    import tracemalloc

    from keras_vit import export

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="a batch of 100000000 images"):
            export.to_onnx(_tiny(num_classes=3), str(tmp_path / "out.onnx"),
                           batch_sizes=(4, 100000000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**30, peak
    assert not (tmp_path / "out.onnx").exists()


def test_a_naflex_tables_grid_is_no_image_the_load_runs():
    """A NaFlex model's image_size is its table's grid (C-RADIO's 128 x
    128 patches: 2048 px); no forward runs at that size, so loading
    counts its weights and table, not 16k tokens of activations, while
    the same grid of images is still refused."""
    from keras_vit.models import memory

    config = dict(image_size=2048, patch_size=16, hidden_size=1024,
                  num_layers=24, num_heads=16, mlp_dim=4096,
                  num_classes=0, classifier="gap")
    memory.check_config(dict(config, naflex=True), "config.json",
                        available=2 ** 34)
    naflex = memory.config_estimate(dict(config, naflex=True))
    assert naflex["activations"] == 0
    assert naflex["position table"] == memory.config_estimate(
        config)["position table"] > 0
    with pytest.raises(ValueError, match="config.json: .* at 2048x2048"):
        memory.check_config(config, "config.json", available=2 ** 34)


def test_a_naflex_batch_is_bounded_by_its_patches_not_the_tables_grid():
    """A NaFlex call of 64 patches an image through a model whose table
    is C-RADIO's 128 x 128 grid fits where the grid's 16k tokens would
    not; infer runs it."""
    import numpy as np

    import keras_vit
    from keras_vit.models import memory

    model = keras_vit.vit(image_size=2048, patch_size=16, hidden_size=16,
                          num_layers=1, num_heads=2, mlp_dim=32,
                          num_classes=0, classifier="gap", naflex=True)
    memory.check_forward(model, 2, available=2 ** 30, patches=64)
    with pytest.raises(ValueError, match="a forward pass of 2 image"):
        memory.check_forward(model, 2, available=2 ** 30)
    batch = {"patches": np.zeros((2, 64, 16 * 16 * 3), "float32"),
             "patch_coords": np.zeros((2, 64, 2), "int32"),
             "patch_mask": np.ones((2, 64), "int32")}
    assert memory.infer(model, batch).shape == (2, 16)
