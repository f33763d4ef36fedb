"""The fast defaults: compiled predict, batch-size buckets, bf16 in one
argument, and checkpoints read one array at a time."""

import zipfile

import numpy as np
import pytest

import official
from conftest import TINY, tiny_builder_kwargs

import keras
import keras_vit
from keras_vit import zoo
from keras_vit.models import compiled
from keras_vit.zoo import convert
from keras_vit.zoo.official import npz as lazy_npz


def _model(classifier="token", **kw):
    return keras_vit.models.vit(**tiny_builder_kwargs(classifier=classifier),
                                **kw)


def _loaded(seed=3, **kw):
    model = _model(**kw)
    zoo.load_weights(model, official.vit_arrays(
        **TINY, num_classes=7, seed=seed,
        classifier=kw.get("classifier", "token")))
    return model


def _x(n, side=32, seed=0):
    return np.random.default_rng(seed).uniform(
        -1, 1, (n, side, side, 3)).astype("float32")


def test_bucket_rounds_up_to_a_power_of_two_capped_at_the_batch():
    assert [compiled.bucket(n, 32) for n in (1, 2, 3, 5, 9, 31, 32)] == [
        1, 2, 4, 8, 16, 32, 32]
    assert compiled.bucket(5, 4) == 4
    assert compiled.bucket(100, 6) == 6


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_compiled_predict_matches_the_model(classifier):
    model = _loaded(classifier=classifier)
    assert model.compiled_predict is True
    model.predict_path = "xla"   # the path that pads to buckets
    x = _x(11)
    want = np.asarray(model(x, training=False))
    got = model.predict(x, batch_size=4, verbose=0)
    assert got.shape == (11, 7) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    # 11 images in batches of 4: 4, 4 and 3 (padded to 4).
    assert model.compiled_predict_sizes() == [4]
    # New input sizes reuse the compiled programs or add a power of two.
    for n in (1, 2, 3, 5, 7):
        out = model.predict(x[:n], batch_size=8, verbose=0)
        np.testing.assert_allclose(out, want[:n], atol=2e-5, rtol=0)
    assert model.compiled_predict_sizes() == [1, 2, 4, 8]


def test_compiled_predict_dict_outputs_and_uint8_input():
    model = _model(return_attention_scores=True)
    x = np.random.default_rng(1).integers(0, 255, (3, 32, 32, 3), np.uint8)
    out = model.predict(x, verbose=0)
    ref = model(x.astype("float32"), training=False)
    assert set(out) == {"output", "attention_scores"}
    assert out["attention_scores"].shape[0] == 3
    for key in out:
        np.testing.assert_allclose(out[key], np.asarray(ref[key]),
                                   atol=2e-5, rtol=0)


def test_keras_predict_is_used_when_asked_or_when_it_must():
    model = _loaded()
    x = _x(6)
    want = np.asarray(model(x, training=False))
    model.compiled_predict = False
    np.testing.assert_allclose(model.predict(x, verbose=0), want, atol=1e-5)
    assert model.compiled_predict_sizes() == []
    model.compiled_predict = True
    # A dataset goes through Keras' own loop.
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(x).batch(4)
    np.testing.assert_allclose(model.predict(ds, verbose=0), want, atol=2e-5)
    assert model.compiled_predict_sizes() == []
    with pytest.raises(ValueError, match="batch_size=0"):
        model.predict(x, batch_size=0)


def test_compiled_predict_on_bit_and_after_reload(tmp_path):
    from keras_vit.models.resnet_v2 import resnet_v2

    bit = resnet_v2(32, (1, 1, 1, 1), 0.5, 5)
    bit.predict_path = "xla"
    x = _x(3)
    np.testing.assert_allclose(bit.predict(x, verbose=0),
                               np.asarray(bit(x, training=False)), atol=2e-5)
    assert bit.compiled_predict_sizes() == [4]
    model = _loaded()
    path = tmp_path / "m.keras"
    model.save(path)
    back = keras.saving.load_model(path)
    model.predict_path = back.predict_path = "xla"
    np.testing.assert_allclose(back.predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=1e-6)
    assert back.compiled_predict_sizes() == [4]


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_bf16_is_one_argument(dtype):
    ref = _loaded(seed=4)
    # A head of some size, so the logits are not all zero.
    ref.get_layer("head").kernel.assign(
        np.random.default_rng(2).normal(0, 0.3, (TINY["hidden"], 7)))
    arrays = zoo.export_arrays(ref)
    low = _model(dtype=dtype)
    zoo.load_weights(low, arrays)
    x = _x(4)
    want = ref.predict(x, verbose=0)
    got = np.asarray(low.predict(x, verbose=0), "float32")
    scale = np.abs(want).max()
    assert scale > 0.1
    # bfloat16 has 8 bits of mantissa: a few per cent of the logit scale.
    assert np.abs(got - want).max() < 0.05 * scale + 0.02
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75


def test_lazy_npz_reads_each_member_once_and_matches(tmp_path, monkeypatch):
    arrays = official.vit_arrays(**TINY, num_classes=7, seed=5,
                                 layout="stacked")
    path = official.write(tmp_path / "stacked.npz", arrays)
    lazy = convert.read_npz(path, lazy=True)
    assert set(lazy) == set(arrays)
    for key, value in arrays.items():
        assert isinstance(lazy[key], lazy_npz.LazyArray)
        assert lazy[key].shape == value.shape
        assert lazy[key].dtype == value.dtype
    reads = []
    real_read = lazy_npz._Member.read

    def counting_read(member):
        if member._cached is None:
            reads.append(member.name)
        return real_read(member)

    monkeypatch.setattr(lazy_npz._Member, "read", counting_read)
    model = _model()
    zoo.load_weights(model, path)
    # Stacked blocks are sliced from one read of each member.
    assert sorted(reads) == sorted(f"{k}.npy" for k in arrays)
    eager = _model()
    zoo.load_weights(eager, arrays)
    for a, b in zip(model.weights, eager.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_lazy_array_reshape_index_and_errors(tmp_path):
    path = tmp_path / "a.npz"
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.savez(path, a=data)
    a = lazy_npz.open_npz(path)["a"]
    assert a.reshape(-1).shape == (24,)
    np.testing.assert_array_equal(np.asarray(a[1].reshape(-1)),
                                  data[1].reshape(-1))
    np.testing.assert_array_equal(a.astype(np.float64), data)
    with pytest.raises(IndexError, match="index 2"):
        a[2]
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, 5)


def test_a_member_corrupt_inside_the_archive_is_named(tmp_path):
    arrays = official.vit_arrays(**TINY, num_classes=7)
    path = official.write(tmp_path / "good.npz", arrays)
    # Flip bytes inside the largest member's data: the archive's directory
    # is intact, so only reading that member finds the damage (CRC).
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + 200
    data[start:start + 64] = bytes(64)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(zoo.CheckpointError) as e:
        zoo.load_weights(_model(), bad)
    assert info.filename in str(e.value) and "bad.npz" in str(e.value)
