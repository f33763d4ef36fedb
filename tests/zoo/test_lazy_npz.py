"""keras_vit.zoo.official.npz, the .npz reader behind load_weights and
zoo.load: nothing half loaded. A checkpoint is validated whole (CRCs,
dtypes, declared shapes against the data) before the first variable is
assigned, and declared shapes are bounded before any allocation."""

import re

import numpy as np
import pytest

from testkit import tiny as _tiny
import keras_vit


def _tiny_checkpoint(tmp_path, compress=False, num_classes=10, **extra):
    import official

    arrays = official.vit_arrays(patch=4, grid=4, num_classes=num_classes,
                                 seed=5,
                                 hidden=32, layers=1, heads=2, mlp=64)
    arrays.update(extra)
    path = tmp_path / "ckpt.npz"
    (np.savez_compressed if compress else np.savez)(path, **arrays)
    return path, arrays


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


def _assert_unchanged(model, before):
    for a, b in zip(before, _weights(model)):
        np.testing.assert_array_equal(a, b)


def test_crc_error_in_the_last_member_changes_no_weight(tmp_path):
    import zipfile

    # 100 classes: the head (read last) is larger than zipfile's 4 KiB
    # read-ahead, so opening the archive does not check its CRC already.
    path, _ = _tiny_checkpoint(tmp_path, num_classes=100)
    with zipfile.ZipFile(path) as z:
        # The member a loader that assigns as it goes would read last.
        last = max(z.infolist(), key=lambda i: i.filename)
        offset = last.header_offset
    data = bytearray(path.read_bytes())
    # Flip the last byte of its data (past the zip and npy headers).
    name_len, extra_len = np.frombuffer(data, "<u2", 2, offset + 26)
    pos = offset + 30 + int(name_len) + int(extra_len) + last.file_size - 1
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    model = _tiny(num_classes=100)
    before = _weights(model)
    with pytest.raises(keras_vit.zoo.CheckpointError,
                       match="CRC.*|corrupt"):
        keras_vit.zoo.load_weights(model, str(path))
    _assert_unchanged(model, before)


@pytest.mark.parametrize("dtype", ["<U4", "complex64", "V4"])
def test_member_of_a_foreign_dtype_is_refused_before_loading(tmp_path, dtype):
    import official

    arrays = official.vit_arrays(patch=4, grid=4, num_classes=10, seed=5,
                                 hidden=32, layers=1, heads=2, mlp=64)
    key = "Transformer/encoder_norm/scale"
    arrays[key] = np.zeros(arrays[key].shape, dtype)
    path = tmp_path / "foreign.npz"
    np.savez(path, **arrays)
    model = _tiny()
    before = _weights(model)
    with pytest.raises(keras_vit.zoo.CheckpointError,
                       match=re.escape(np.dtype(dtype).str)):
        keras_vit.zoo.load_weights(model, str(path))
    _assert_unchanged(model, before)
    # The same from in-memory arrays.
    with pytest.raises(keras_vit.zoo.CheckpointError, match="not a number"):
        keras_vit.zoo.load_weights(model, arrays)
    _assert_unchanged(model, before)


def _npz_with_header(path, name, shape, descr="<f4", payload=b""):
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name, buf.getvalue() + payload)


def test_tiny_file_declaring_ten_million_rows_is_refused_at_once(tmp_path):
    import time
    import tracemalloc

    path = tmp_path / "bomb.npz"
    _npz_with_header(path, "Transformer/encoderblock/LayerNorm_0/scale.npy",
                     (10 ** 7, 32))
    assert path.stat().st_size < 400
    tracemalloc.start()
    start = time.perf_counter()
    for call in (lambda: keras_vit.zoo.load_weights(_tiny(), str(path)),
                 lambda: keras_vit.zoo.load("ViT-Ti/16", weights=str(path))):
        with pytest.raises(keras_vit.zoo.CheckpointError,
                           match=r"declares shape \(10000000, 32\)"):
            call()
    assert time.perf_counter() - start < 5.0
    assert tracemalloc.get_traced_memory()[1] < 200e6
    tracemalloc.stop()


def test_truncated_and_lying_members_are_refused(tmp_path):
    path = tmp_path / "short.npz"
    _npz_with_header(path, "embedding/kernel.npy", (4, 4, 3, 32),
                     payload=b"\0" * 100)
    with pytest.raises(keras_vit.zoo.CheckpointError, match="declares shape"):
        keras_vit.zoo.load_weights(_tiny(), str(path))
    path.write_bytes(path.read_bytes()[:150])
    with pytest.raises(keras_vit.zoo.CheckpointError, match="not a valid"):
        keras_vit.zoo.load_weights(_tiny(), str(path))
