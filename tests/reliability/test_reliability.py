"""Correctness from scratch and reliability under bad input and faults.

The audit's cases live here: random initialisation against the
official (flax) initialisers, the correctness bugs found in the audit, and
the red-team cases (hostile checkpoints, misbehaving servers on 127.0.0.1,
writers killed mid-write, undecodable image folders, CLI misuse).
"""

import json
import math
import re
import time

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models.memory import step_memory_estimate

# ---------------------------------------------------------------------------
# Initialisation equals the official one in distribution.
#
# vit_jax models_vit.py / models_resnet.py and big_transfer bit_jax/models.py:
# MLP Dense kernels xavier_uniform, biases N(0, 1e-6); attention
# (DenseGeneral) kernels xavier_uniform on the flattened (D, D) fans, biases
# zeros; patch conv, pre_logits and every ResNet conv flax's default
# lecun_normal (truncated, std 1/sqrt(fan_in)) with zero biases; position
# embedding N(0, 0.02); class token and head zeros; LayerNorm / GroupNorm
# scale ones and bias zeros, except the hybrid unit's gn3 (scale zeros).
# ---------------------------------------------------------------------------


def _fans(shape):
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def _expected(path, shape):
    """(std, exact_value) the official code would draw for this variable."""
    name = path.split("/")[-1]
    if re.search(r"attention/(query|key|value)/kernel$", path):
        dim = shape[0]
        return math.sqrt(2.0 / (dim + dim)), None
    if path.endswith("attention/out/kernel"):
        dim = shape[-1]
        return math.sqrt(2.0 / (dim + dim)), None
    if re.search(r"attention/\w+/bias$", path):
        return 0.0, 0.0
    if "/mlp/" in path:
        if name == "kernel":
            return math.sqrt(2.0 / sum(shape)), None
        return 1e-6, None
    if path.startswith("head/"):
        return 0.0, 0.0
    if name == "pos_embedding":
        return 0.02, None
    if name == "cls":
        return 0.0, 0.0
    if name == "kernel":  # patch conv, pre_logits, every ResNet conv
        return math.sqrt(1.0 / _fans(shape)[0]), None
    if name == "bias":
        return 0.0, 0.0
    if name == "gamma":
        zero = path.endswith("gn3/gamma")
        return 0.0, 0.0 if zero else 1.0
    if name == "beta":
        return 0.0, 0.0
    raise AssertionError(f"no official initialiser known for {path}")


def _check_init(model):
    kinds = set()
    for var in model.weights:
        value = keras.ops.convert_to_numpy(var.value).astype("float64")
        std, exact = _expected(var.path, tuple(var.shape))
        if exact is not None:
            np.testing.assert_array_equal(value, exact, err_msg=var.path)
        else:
            # 25% covers sampling error for the smallest (bias) tensors here.
            assert abs(value.std() / std - 1.0) < 0.25, (
                var.path, value.std(), std)
            assert abs(value.mean()) < 3 * std / math.sqrt(value.size) + 1e-12
        kinds.add(re.sub(r"_\d+", "", var.path))
    return kinds


def test_vit_init_matches_flax_for_every_parameter_kind():
    keras.utils.set_random_seed(0)
    model = keras_vit.models.vit(
        image_size=32, patch_size=4, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10, representation_size=32)
    kinds = _check_init(model)
    for kind in ("patch_embedding/conv/kernel", "class_token/cls",
                 "position_embedding/pos_embedding", "pre_logits/kernel",
                 "encoder_block/attention/query/kernel",
                 "encoder_block/attention/out/kernel",
                 "encoder_block/mlp/dense/bias", "encoder_norm/gamma",
                 "head/kernel"):
        assert kind in kinds, kind


def test_attention_kernels_at_vit_b_width_match_flax():
    # The audit's figures: Keras' 3-D glorot gave q/k/v std 0.0058 and out
    # 0.014 at D=768; flax's flattened DenseGeneral fans give 0.036.
    keras.utils.set_random_seed(0)
    layer = keras_vit.layers.MultiHeadSelfAttention(num_heads=12)
    layer.build((None, 5, 768))
    for var in layer.weights:
        if var.path.endswith("kernel"):
            std = float(np.std(keras.ops.convert_to_numpy(var.value)))
            assert abs(std - 0.0361) < 0.001, (var.path, std)


def test_hybrid_and_axial_init_match_flax():
    keras.utils.set_random_seed(0)
    hybrid = keras_vit.models.vit(
        image_size=32, patch_size=1, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10,
        resnet=dict(num_layers=(1,), width_factor=0.5))
    kinds = _check_init(hybrid)
    assert any(k.endswith("gn3/gamma") for k in kinds)
    assert "resnet_root_conv/kernel" in kinds
    axial = keras_vit.models.vit(
        image_size=32, patch_size=4, hidden_size=64, num_layers=1,
        num_heads=4, mlp_dim=128, num_classes=10, classifier="gap",
        attention="axial")
    kinds = _check_init(axial)
    assert "axial_block/column/attention/value/kernel" in kinds


def test_bit_init_matches_big_transfer():
    keras.utils.set_random_seed(0)
    model = keras_vit.models.resnet_v2(32, (1, 1, 1, 1), 1, 10)
    kinds = _check_init(model)
    assert "root_conv/kernel" in kinds and "stage_unit/proj/kernel" in kinds


# ---------------------------------------------------------------------------
# Correctness bugs of the audit.
# ---------------------------------------------------------------------------

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
QUICK = dict(batch_size=8, crop_area=None, flip=False, log_every=1,
             verbose=False, strategy="default")


def _tiny(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


def test_hybrid_checkpoint_by_path_gets_the_resnet_stride(tmp_path):
    import official

    res, channels = official.hybrid_arrays(num_layers=(1,), width=32, seed=3)
    arrays = official.vit_arrays(patch=1, grid=8, num_classes=6, seed=3,
                                 channels=channels, hidden=32, layers=1,
                                 heads=4, mlp=64)
    arrays.update(res)
    path = tmp_path / "hybrid.npz"
    np.savez(path, **arrays)
    model = keras_vit.zoo.load(
        "R26+ViT-S/32", weights=str(path), patch_size=1, hidden_size=32,
        num_layers=1, num_heads=4, mlp_dim=64,
        resnet=dict(num_layers=(1,), width_factor=0.5))
    # grid 8 x (patch 1 x ResNet stride 4): 32 pixels, not 8.
    assert model.input_shape[1:3] == (32, 32)
    pos = model.get_layer("position_embedding").weights[0]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(pos),
                                  arrays["Transformer/posembed_input/pos_embedding"])


def test_gap_classifier_refuses_token_pooling():
    with pytest.raises(ValueError, match=r"pooling='token'.*classifier='gap'"):
        keras_vit.vit(**dict(TINY, classifier="gap", include_top=False,
                             pooling="token"))
    model = keras_vit.vit(**dict(TINY, classifier="gap", include_top=False,
                                 pooling="gap"))
    assert tuple(model.output_shape) == (None, 32)


def test_trainer_feeds_raw_pixels_to_a_preprocessing_model():
    from keras_vit.train.data.pipeline import dataset, takes_raw_pixels

    plain, raw = _tiny(), _tiny(include_preprocessing=True)
    assert not takes_raw_pixels(plain)
    assert takes_raw_pixels(raw)
    images, _ = next(iter(dataset(
        "digits", 16, 64, training=False, raw_pixels=True)))
    assert float(images.numpy().max()) > 100.0  # [0, 255], not [-1, 1]
    # Same weights: the same evaluation whether the model or the pipeline
    # scales the pixels.
    raw.set_weights(plain.get_weights())
    for layer in (plain.get_layer("head"), raw.get_layer("head")):
        kernel = np.random.default_rng(0).normal(size=(32, 10)) * 0.5
        layer.kernel.assign(kernel.astype("float32"))
    a = keras_vit.train.evaluate(plain, "digits:test", verbose=False)
    b = keras_vit.train.evaluate(raw, "digits:test", verbose=False)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    assert a["accuracy"] == pytest.approx(b["accuracy"])


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_label_smoothing_matches_a_hand_computation():
    from keras_vit.train.fit import smoothed_sparse_crossentropy

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)).astype("float32")
    labels = np.array([0, 3, 1, 1, 2])
    eps, k = 0.1, 4
    target = np.full((5, k), eps / k)
    target[np.arange(5), labels] += 1.0 - eps
    expected = float(np.mean(-(target * _log_softmax(logits)).sum(-1)))
    loss = smoothed_sparse_crossentropy(eps)
    assert float(loss(labels, logits)) == pytest.approx(expected, rel=1e-5)
    # The training loop's own loss (summed over the batch).
    tr = keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                 total_steps=2, warmup_steps=1,
                                 label_smoothing=eps, **QUICK)
    images = rng.uniform(-1, 1, size=(5, 16, 16, 3)).astype("float32")
    digits = np.array([0, 9, 3, 3, 7])
    model_logits = keras.ops.convert_to_numpy(tr.model(images))
    target = np.full((5, 10), eps / 10)
    target[np.arange(5), digits] += 1.0 - eps
    want = float(-(target * _log_softmax(model_logits)).sum())
    got, correct = tr.compute_loss(images, digits, np.zeros(2, "int64"))
    assert float(got) == pytest.approx(want, rel=1e-5)
    assert float(correct) == float(
        (model_logits.argmax(-1) == digits).sum())


@pytest.mark.slow
def test_ema_matches_a_hand_computation():
    decay_cap = 0.2
    tr = keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                 total_steps=3, warmup_steps=1,
                                 learning_rate=1e-2, ema_decay=decay_cap,
                                 **QUICK)

    def current():
        return [v.numpy().copy() for v in tr.model.trainable_variables]

    ema = current()
    for t in (1, 2):
        tr.fit(stop_at_step=t)
        now = current()
        decay = min(decay_cap, (1.0 + t) / (10.0 + t))  # 2/11, then 0.2
        ema = [decay * e + (1.0 - decay) * v for e, v in zip(ema, now)]
        for e, want in zip(tr.ema, ema):
            np.testing.assert_allclose(e.numpy(), want, rtol=1e-5,
                                       atol=1e-7)
    assert not np.allclose(ema[0], now[0])  # the average lags the weights


# ---------------------------------------------------------------------------
# Nothing half loaded: a checkpoint is validated whole before the first
# variable is assigned; declared shapes are bounded before any allocation.
# ---------------------------------------------------------------------------


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


def test_compressed_stack_of_many_blocks_is_bounded_by_the_model(tmp_path):
    import time

    # 10**6 rows of zeros deflate to ~4 KB: the header is honest, the depth
    # is not; the model's depth bounds it before any slice is made.
    path = tmp_path / "deep.npz"
    np.savez_compressed(
        path, **{"Transformer/encoderblock/LayerNorm_0/scale":
                 np.zeros((10 ** 6, 1), "float32")})
    start = time.perf_counter()
    with pytest.raises(keras_vit.zoo.CheckpointError,
                       match="stacks 1000000 encoder blocks; the model has 1"):
        keras_vit.zoo.load_weights(_tiny(), str(path))
    assert time.perf_counter() - start < 5.0


def test_truncated_and_lying_members_are_refused(tmp_path):
    path = tmp_path / "short.npz"
    _npz_with_header(path, "embedding/kernel.npy", (4, 4, 3, 32),
                     payload=b"\0" * 100)
    with pytest.raises(keras_vit.zoo.CheckpointError, match="declares shape"):
        keras_vit.zoo.load_weights(_tiny(), str(path))
    path.write_bytes(path.read_bytes()[:150])
    with pytest.raises(keras_vit.zoo.CheckpointError, match="not a valid"):
        keras_vit.zoo.load_weights(_tiny(), str(path))


# ---------------------------------------------------------------------------
# Downloads: an overall deadline, a stall timeout, a bounded lock wait that
# names the holder; a body that is not a whole checkpoint is never cached.
# Servers on 127.0.0.1 only, in a thread, shut down after the module.
# ---------------------------------------------------------------------------


def _npz_bytes():
    import io

    buf = io.BytesIO()
    np.savez(buf, a=np.arange(5000, dtype="float32"))
    return buf.getvalue()


NPZ = _npz_bytes()


class _BadServer:
    """Each path misbehaves in its own way (see ``do_GET``)."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                name = self.path.rsplit("/", 1)[-1]
                if name == "slow_headers.npz":  # a header byte every 0.2 s
                    head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(NPZ)}"
                            "\r\n" + "X-Pad: " + "x" * 200 + "\r\n\r\n")
                    for byte in head.encode():
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.2)
                    self.wfile.write(NPZ)
                    self.close_connection = True
                elif name == "trickle.npz":  # a byte every 0.2 s, 40 s worth
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(NPZ)))
                    self.end_headers()
                    for i in range(200):
                        try:
                            self.wfile.write(NPZ[i:i + 1])
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.2)
                elif name == "short.npz":  # no Content-Length, half a file
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(NPZ[:len(NPZ) // 2])
                    self.close_connection = True
                elif name == "lying.npz":  # Content-Length below the body
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(NPZ) - 500))
                    self.end_headers()
                    self.wfile.write(NPZ)
                elif name == "html.npz":  # a login page served with 200
                    self._send(b"<html><body>Please sign in</body></html>",
                               {"Content-Type": "text/html"})
                elif name == "html_octet.npz":  # HTML that claims bytes
                    self._send(b"<!doctype html><p>moved</p>")
                else:
                    self._send(NPZ)

            def _send(self, body, headers=()):
                """A well-formed 200: ``headers``, the right
                Content-Length, then ``body``."""
                self.send_response(200)
                for key, value in dict(headers).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def bad_server():
    server = _BadServer()
    yield server.base
    server.stop()



def _cached_files(cache):
    return sorted(p.name for p in cache.rglob("*") if p.is_file()
                  and not p.name.endswith(".lock"))


def test_trickling_server_hits_the_overall_deadline(bad_server, tmp_path):
    from keras_vit.zoo import download

    start = time.monotonic()
    with pytest.raises(download.DownloadError,
                       match=r"did not finish within 1 s"):
        download.fetch(bad_server + "trickle.npz", cache_dir=tmp_path,
                       timeout=2.0, deadline=1.0, progress=False)
    assert time.monotonic() - start < 5.0
    assert _cached_files(tmp_path) == []


def test_trickled_headers_hit_the_overall_deadline(bad_server, tmp_path):
    # Each header byte comes well within the 2 s stall timeout, so only an
    # overall deadline that covers connect + headers stops it.
    from keras_vit.zoo import download

    start = time.monotonic()
    with pytest.raises(download.DownloadError,
                       match=r"did not finish within 1 s \(before its "
                             r"response headers"):
        download.fetch(bad_server + "slow_headers.npz", cache_dir=tmp_path,
                       timeout=2.0, deadline=1.0, progress=False)
    assert time.monotonic() - start < 3.0
    assert _cached_files(tmp_path) == []


@pytest.mark.parametrize("name, match", [
    ("short.npz", "not send a complete .npz"),
    ("lying.npz", "not send a complete .npz"),
    ("html.npz", "HTML page"),
    ("html_octet.npz", "not send a complete .npz"),
])
def test_a_body_that_is_not_a_checkpoint_is_never_cached(
        bad_server, tmp_path, name, match):
    from keras_vit.zoo import download

    with pytest.raises(download.DownloadError, match=match):
        download.fetch(bad_server + name, cache_dir=tmp_path, timeout=5.0,
                       progress=False)
    assert _cached_files(tmp_path) == []
    good = download.fetch(bad_server + "good.npz", cache_dir=tmp_path,
                          timeout=5.0, progress=False)
    assert good.read_bytes() == NPZ


def test_lock_wait_has_a_deadline_and_names_the_holder(bad_server, tmp_path):
    import os

    from keras_vit.zoo import download

    url = bad_server + "good.npz"
    final = download.cache_path_for(url, tmp_path)
    final.parent.mkdir(parents=True)
    lock = final.with_name(final.name + ".lock")
    start = time.monotonic()
    with download._exclusive_lock(lock):  # another download in progress
        with pytest.raises(download.DownloadError,
                           match=rf"held by pid {os.getpid()} since"):
            download.fetch(url, cache_dir=tmp_path, timeout=0.5,
                           deadline=0.5, progress=False)
    assert time.monotonic() - start < 5.0
    assert download.fetch(url, cache_dir=tmp_path, progress=False).is_file()


@pytest.mark.parametrize("arg", ["timeout", "deadline"])
def test_download_bounds_must_be_positive(tmp_path, arg):
    from keras_vit.zoo import download

    with pytest.raises(ValueError, match=rf"{arg}=0"):
        download.fetch("http://127.0.0.1:9/x.npz", cache_dir=tmp_path,
                       **{arg: 0})


# ---------------------------------------------------------------------------
# Data: no hang on images TensorFlow cannot decode; each dropped one named.
# ---------------------------------------------------------------------------


def _truncated_jpeg(path, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
        path, "JPEG")
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * 0.8)])  # passes PIL's verify()


def test_folder_of_undecodable_images_fails_fast_naming_it(tmp_path):
    from keras_vit import train as kt

    root = tmp_path / "bad"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            _truncated_jpeg(root / c / f"{i}.jpg", i)
    start = time.monotonic()
    with pytest.raises(kt.DataError, match=re.escape(repr(str(root)))
                       + r" has no images TensorFlow can read"):
        kt.load_data(str(root))
    with pytest.raises(kt.DataError, match="cannot be decoded"):
        kt.Trainer(_tiny(num_classes=2), str(root), **QUICK)
    assert time.monotonic() - start < 20.0


def _class_folders(root, per_class):
    """``root/a`` and ``root/b`` with ``per_class`` tiny PNGs each."""
    from PIL import Image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(root / c / f"{i}.png")
    return root


def test_each_dropped_image_is_named_once(tmp_path):
    from keras_vit import train as kt

    root = _class_folders(tmp_path / "mixed", 4)
    _truncated_jpeg(root / "b" / "cut.jpg", 7)
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(root))
    text = " ".join(str(w.message) for w in record)
    assert text.count("cut.jpg") == 1
    assert source.num_examples == 8
    batches = list(kt.dataset(source, 16, 4, training=True, epoch=0))
    assert sum(int(b[0].shape[0]) for b in batches) == 8


# ---------------------------------------------------------------------------
# No loss: every file the package writes appears complete or not at all.
# ---------------------------------------------------------------------------

_KILLED_WRITER = r"""
import importlib.util, sys, time
# keras_vit/base/atomic.py alone (stdlib only): no Keras start-up to wait for.
spec = importlib.util.spec_from_file_location("atomic", sys.argv[3])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
path, old = sys.argv[1], sys.argv[2]
with atomic.atomic_path(path) as tmp:
    with open(tmp, "w") as f:
        f.write("{" + "x" * 1_000_000)  # half a JSON document
        f.flush()
        print("writing", flush=True)
        time.sleep(60)  # killed here, mid-write
        f.write("}")
"""


@pytest.mark.parametrize("old", [None, '{"complete": true}\n'])
def test_writer_killed_mid_write_leaves_old_file_or_none(tmp_path, old):
    import json
    import os
    import signal
    import subprocess
    import sys

    from keras_vit.base import atomic

    path = tmp_path / "metrics.json"
    if old is not None:
        path.write_text(old)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path), str(old),
         atomic.__file__],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        assert proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    if old is None:
        assert not path.exists()
    else:
        assert json.loads(path.read_text()) == {"complete": True}
    strays = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    assert all(".partial" in name for name in strays), strays


class _BoomError(Exception):
    pass


def _half_then_boom(path, *args, **kwargs):
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 half")
    raise _BoomError("killed mid-write")


@pytest.mark.slow
def test_every_writer_goes_through_the_atomic_helper(tmp_path, monkeypatch):
    """Each writer, interrupted after writing part of its file, leaves
    nothing under the final name (the old file where there was one)."""
    import json
    import os

    import keras_vit.train
    from keras_vit.base import atomic
    from keras_vit.export import common
    from keras_vit.zoo import convert, download

    model = _tiny()
    monkeypatch.setattr(np, "savez", _half_then_boom)
    with pytest.raises(_BoomError):
        convert.save_npz(model, tmp_path / "w.npz")
    monkeypatch.undo()

    real_dumps = json.dumps

    def dumps_then_boom(*args, **kwargs):
        real_dumps(*args, **kwargs)
        raise _BoomError("killed mid-write")

    monkeypatch.setattr(json, "dumps", dumps_then_boom)
    for write in (lambda p: atomic.write_json(p, {"a": 1}),
                  lambda p: common.write_json(p, {"a": 1}),
                  lambda p: download._write_sidecar(p, "0" * 64)):
        target = tmp_path / "old.json"
        target.write_text("old")
        with pytest.raises(_BoomError):
            write(target)
        assert target.read_text() == "old"
    monkeypatch.undo()

    # model.keras of a run: the Trainer's save.
    monkeypatch.setattr(keras.Model, "save",
                        lambda self, path, **kw: _half_then_boom(path))
    out = tmp_path / "run"
    with pytest.raises(_BoomError):
        keras_vit.train.Trainer(_tiny(), "digits", recipe="pretrain",
                                out_dir=out, total_steps=1, warmup_steps=0,
                                **QUICK).fit()
    assert not (out / "model.keras").exists()
    assert not (out / "metrics.json").exists()
    assert all(".partial" not in n for n in os.listdir(out))


# ---------------------------------------------------------------------------
# CLI: one line, never a traceback (2 bad input, 1 failure) unless --debug;
# a resumed run with other settings is refused listing the differences.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("error, status, text", [
    (RuntimeError("kaboom"), 1, "RuntimeError: kaboom (an unexpected"),
    (KeyError("weights"), 1, "KeyError: 'weights'"),
    (MemoryError(), 1, "out of memory (MemoryError). Lower --batch-size"),
    (ValueError("bad --lr"), 2, "error: bad --lr"),
    (FileNotFoundError("no such file"), 2, "error: no such file"),
])
def test_cli_turns_every_error_into_one_line(monkeypatch, capsys, error,
                                             status, text):
    from keras_vit import cli

    def fail(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_list", fail)
    assert cli.main(["list"]) == status
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    for argv in (["list", "--debug"], ["--debug", "list"]):
        with pytest.raises(type(error)):
            cli.main(argv)


@pytest.mark.slow
def test_resumed_run_with_other_settings_is_refused(tmp_path, capsys):
    from keras_vit.train import cli as train_cli

    out = tmp_path / "run"
    kw = dict(recipe="pretrain", out_dir=out, total_steps=2, warmup_steps=1,
              learning_rate=1e-3, **QUICK)
    keras_vit.train.Trainer(_tiny(), "digits", **kw).fit(stop_at_step=1)
    with pytest.raises(ValueError) as info:
        keras_vit.train.Trainer(_tiny(), "digits:test", **dict(
            kw, learning_rate=3e-3, seed=4))
    message = str(info.value)
    for change in ("recipe.learning_rate: 0.001 -> 0.003",
                   "recipe.seed: 0 -> 4",
                   "train_data: 'digits:train' -> 'digits:test'"):
        assert change in message
    assert "--resume-anyway" in message
    # The checkpoint itself records the settings: neither deleting run.json
    # nor editing it to the new settings lets them through.
    run_json = out / "run.json"
    saved = run_json.read_text()
    run_json.unlink()
    with pytest.raises(ValueError, match=r"recipe\.learning_rate: 0\.001 -> "
                                         r"0\.003; recipe\.seed: 0 -> 4"):
        keras_vit.train.Trainer(_tiny(), "digits", **dict(
            kw, learning_rate=3e-3, seed=4))
    edited = json.loads(saved)
    edited["recipe"].update(learning_rate=3e-3, seed=4)
    run_json.write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r"recipe\.learning_rate: 0\.001 -> "
                                         r"0\.003"):
        keras_vit.train.Trainer(_tiny(), "digits", **dict(
            kw, learning_rate=3e-3, seed=4))
    run_json.write_text(saved)
    run = keras_vit.train.Trainer(_tiny(), "digits", resume="force", **dict(
        kw, learning_rate=3e-3))
    assert run.resumed_from == 1
    # The CLI refuses in one line.
    status = train_cli.main([
        "fine-tune", str(tmp_path / "m.keras"), "--data", "digits",
        "--restart", "--resume-anyway", "--out", str(out)])
    assert status == 2
    assert "exclude each other" in capsys.readouterr().err


def test_a_step_that_cannot_fit_memory_says_what_to_change(
        tmp_path, monkeypatch, capsys):
    from keras_vit.train import cli as train_cli

    # The audit's case: ViT-Ti/16 at the fine-tune recipe's 384 px and
    # batch 512 needs far more than a 24 GB machine (~150 GiB estimated).
    model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=384,
                               num_classes=10)
    assert step_memory_estimate(model, 512) > 100 * 2**30
    assert step_memory_estimate(model, 16) < 8 * 2**30
    path = tmp_path / "tiny.keras"
    _tiny().save(path)
    monkeypatch.setattr(keras_vit.models.memory, "available_memory", lambda: 2**20)
    argv = ["fine-tune", str(path), "--data", "digits", "--batch-size", "64",
            "--steps", "1", "--warmup-steps", "0", "--no-eval", "--quiet",
            "--out", str(tmp_path / "run")]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "available; set --micro-batch-size" in err
    assert "lower --batch-size (now 64)" in err and "Traceback" not in err


def test_memory_check_is_for_host_memory_only(monkeypatch):
    import types

    from keras_vit.train import cli as train_cli

    trainer = types.SimpleNamespace(
        model=_tiny(), micro=64, per_replica=64,
        recipe=types.SimpleNamespace(image_size=16, batch_size=64))
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    with pytest.raises(ValueError, match="GiB of activations"):
        train_cli.check_fits_memory(trainer, available=2**16)
    # On an accelerator (asked of the current Keras backend, or forced as
    # here) host memory does not hold the activations: no refusal.
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "gpu")
    assert train_cli.check_fits_memory(trainer, available=2**16) is None


def test_pretrain_refuses_a_step_that_cannot_fit_memory(
        tmp_path, monkeypatch, capsys):
    from keras_vit.train import cli as train_cli
    from keras_vit.train import mpp

    path = tmp_path / "tiny.keras"
    _tiny().save(path)
    per_image = step_memory_estimate(
        mpp.MaskedPatchPrediction(_tiny()), 1)
    available = 2**20
    monkeypatch.setattr(keras_vit.models.memory, "available_memory", lambda: available)
    argv = ["pretrain", str(path), "--data", "digits", "--batch-size", "64",
            "--image-size", "16", "--steps", "1", "--warmup-steps", "0",
            "--quiet", "--strategy", "default", "--out", str(tmp_path / "r")]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    micro = int(re.search(r"set --micro-batch-size (\d+)", err).group(1))
    assert 64 % micro == 0 and micro * per_image <= available / 2
    assert (micro * 2 * per_image > available / 2
            or 64 % (micro * 2) != 0)  # the largest that fits
    assert "lower --batch-size (now 64)" in err
    assert not (tmp_path / "r" / "model.keras").exists()


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


# ---------------------------------------------------------------------------
# Environment variables: a clear error naming the variable and its value.
# ---------------------------------------------------------------------------


def test_bad_environment_variables_are_named(tmp_path, monkeypatch):
    from keras_vit.zoo import download

    monkeypatch.setenv("KERAS_VIT_OFFLINE", "maybe")
    with pytest.raises(ValueError, match="KERAS_VIT_OFFLINE='maybe'"):
        download.is_offline()
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "off")
    assert download.is_offline() is False
    monkeypatch.setenv("KERAS_VIT_MIRROR", "ftp://mirror/")
    with pytest.raises(ValueError, match="KERAS_VIT_MIRROR='ftp://mirror/'"):
        download.resolve_url("gs://vit_models/x.npz")
    monkeypatch.delenv("KERAS_VIT_MIRROR")
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("KERAS_VIT_CACHE", str(afile))
    with pytest.raises(ValueError, match="KERAS_VIT_CACHE must be a folder"):
        download.fetch("http://127.0.0.1:9/x.npz", timeout=1)


# ---------------------------------------------------------------------------
# Red team, second pass: hostile files, paths, images and settings. Each
# case fails in one line naming what is wrong, or works.
# ---------------------------------------------------------------------------


def _one_error_line(capsys):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny_keras(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    _tiny().save(path)
    return path


def _odd_image(path, kind):
    from PIL import Image

    if kind == "text":
        path.write_text("not an image")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder":
        path.mkdir()
    else:
        mode, size = {"gray16": ("I;16", 20), "rgba": ("RGBA", 20),
                      "cmyk": ("CMYK", 20), "palette": ("P", 20),
                      "one_pixel": ("RGB", 1)}[kind]
        Image.new(mode, (size, size)).save(
            path, "JPEG" if kind == "cmyk" else "PNG")


@pytest.mark.parametrize("kind, status, needle", [
    ("text", 2, "(12 bytes) is not a JPEG, PNG, GIF, BMP or WebP file"),
    ("empty", 2, "is empty"),
    ("folder", 2, "is a directory; pass image files"),
    ("gray16", 0, None), ("rgba", 0, None), ("cmyk", 0, None),
    ("palette", 0, None), ("one_pixel", 0, None),
])
def test_predict_on_odd_images(tiny_keras, tmp_path, capsys, kind, status,
                               needle):
    from keras_vit import cli

    image = tmp_path / f"{kind}.png"
    _odd_image(image, kind)
    assert cli.main(["predict", str(tiny_keras), str(image), "--json"]) == (
        status)
    if needle:
        assert needle in _one_error_line(capsys)
    else:
        import json

        out = json.loads(capsys.readouterr().out)
        assert len(out["predictions"][0]["top"]) == 5


@pytest.mark.parametrize("command", [
    ["predict", "{model}", "{image}"],
    ["evaluate", "{model}", "--data", "digits"],
])
def test_a_corrupt_keras_file_is_named_not_missing(tmp_path, capsys,
                                                  command):
    from keras_vit import cli

    model = tmp_path / "cut.keras"
    model.write_bytes(b"PK\x03\x04 cut short")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    argv = [a.format(model=model, image=image) for a in command]
    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    assert f"MODEL={str(model)!r} is not a .keras model" in line
    assert "File not found" not in line


def test_directories_where_a_file_belongs(tmp_path, capsys):
    from keras_vit import cli, zoo

    model = _tiny()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        zoo.save_npz(model, tmp_path)
    assert [p.name for p in tmp_path.parent.iterdir()
            if ".partial" in p.name] == []  # nothing written beside it
    with pytest.raises(zoo.CheckpointError, match="is a directory, not an"):
        zoo.load_weights(model, tmp_path)
    with pytest.raises(IsADirectoryError, match=r"weights=.* is a directory"):
        zoo.load("ViT-Ti/16", weights=str(tmp_path), image_size=16)
    zoo.save_npz(model, tmp_path / "w.npz")
    (tmp_path / "out.keras").mkdir()
    assert cli.main(["convert", str(tmp_path / "w.npz"), "-m", "ViT-Ti/16",
                     "--image-size", "16", "-o",
                     str(tmp_path / "out.keras")]) == 2
    assert "is a directory; pass a file name" in _one_error_line(capsys)


@pytest.mark.parametrize("case, needle", [
    ("not_a_zip", "is not an .npz archive (not a zip archive"),
    ("nan_pixels", "NaN or infinite pixels in 2 of 4 images"),
    ("negative_labels", "labels must be >= 0; received labels in [-1, 1]"),
    ("object_arrays", "is not a readable .npz of arrays"),
])
def test_hostile_npz_data(tmp_path, case, needle):
    from keras_vit import train as kt

    path = tmp_path / "data.npz"
    x = np.zeros((4, 8, 8, 3), "float32")
    y = np.array([0, 1, 0, 1])
    if case == "not_a_zip":
        path.write_text("x,y\n1,2\n")
    elif case == "nan_pixels":
        x[1, 0, 0, 0] = np.nan
        x[3, 2, 2, 2] = np.inf
        np.savez(path, x=x, y=y)
    elif case == "negative_labels":
        np.savez(path, x=x, y=np.array([0, -1, 1, 0]))
    else:  # a pickle inside: never loaded
        np.savez(path, x=np.array([object()] * 4, dtype=object), y=y)
    with pytest.raises(kt.DataError) as info:
        kt.load_data(str(path))
    assert needle in str(info.value)


def test_settings_refused_before_any_work(tmp_path, capsys):
    from keras_vit.train import cli as train_cli

    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["fine-tune", "ViT-Ti/16", "--data", "digits"]
    start = time.monotonic()
    for extra, needle in (
            (["--set", "crop_area=abc", "--out", str(tmp_path / "r")],
             "crop_area must be numbers separated by commas; received "
             "crop_area='abc'"),
            (["--out", str(afile)], "is a file; the run needs a folder"),
            (["--out", str(afile / "runs" / "r")],
             "afile' is a file, not a folder")):
        assert train_cli.main(base + extra) == 2
        assert needle in _one_error_line(capsys)
    # Refused before the model was built or the data read.
    assert time.monotonic() - start < 10


def test_odd_inputs_to_preprocessing_and_labels():
    from keras_vit import zoo

    with pytest.raises(ValueError, match=r"height and width >= 1; received "
                                         r"images of shape \(0, 8, 3\)"):
        zoo.preprocess_input(np.zeros((0, 8, 3)), 16)
    with pytest.raises(ValueError, match=r"labels has 2 names but preds "
                                         r"have 10 classes; received "
                                         r"labels=\['a', 'b'\]"):
        zoo.decode_predictions(np.zeros((1, 10)), labels=["a", "b"])


def test_hostile_environment_for_downloads(tmp_path, monkeypatch):
    from keras_vit.zoo import download

    monkeypatch.setenv("KERAS_VIT_MIRROR", "http://")
    with pytest.raises(ValueError, match="with a host; received "
                                         "KERAS_VIT_MIRROR='http://'"):
        download.resolve_url("gs://vit_models/x.npz")
    monkeypatch.delenv("KERAS_VIT_MIRROR")
    # A cache folder that cannot be created (even by root): /proc.
    monkeypatch.setenv("KERAS_VIT_CACHE", "/proc/keras_vit_cache")
    with pytest.raises(download.DownloadError,
                       match="cannot create the cache folder .* check "
                             "KERAS_VIT_CACHE='/proc/keras_vit_cache'"):
        download.fetch("http://127.0.0.1:9/x.npz", timeout=1)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    from keras_vit import train as kt

    with pytest.raises(kt.StrategyError, match="TF_CONFIG is not valid "
                                               "JSON"):
        kt.strategy("auto")


_FULL_DISK_WRITER = r"""
import importlib.util, resource, signal, sys
spec = importlib.util.spec_from_file_location("atomic", sys.argv[2])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
# The disk is "full" after 4 KiB: writes past it fail with EFBIG (the
# signal that would kill the process instead is ignored).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    atomic.write_json(sys.argv[1], {"weights": "x" * 100_000})
except OSError as e:
    print("refused", e.errno, flush=True)
"""


def test_a_full_disk_leaves_the_old_file_and_no_partial(tmp_path):
    import errno
    import json
    import subprocess
    import sys

    from keras_vit.base import atomic

    path = tmp_path / "report.json"
    path.write_text('{"complete": true}\n')
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_WRITER, str(path),
         atomic.__file__], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["refused", str(errno.EFBIG)], proc.stderr
    assert json.loads(path.read_text()) == {"complete": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_ctrl_c_waits_for_the_renames_that_must_happen_together(tmp_path):
    import signal

    from keras_vit.base import atomic

    done = []
    with pytest.raises(KeyboardInterrupt):
        with atomic.interrupts_deferred():
            signal.raise_signal(signal.SIGINT)  # Ctrl-C mid-commit
            done.append("renamed")  # still runs
    assert done == ["renamed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_watcher_removes_scratch_when_its_owner_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from keras_vit.base import atomic

    scratch = tmp_path / ".m.partial-x"
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import importlib.util, os, sys, time\n"
         "spec = importlib.util.spec_from_file_location('atomic', sys.argv[2])"
         "\natomic = importlib.util.module_from_spec(spec)\n"
         "spec.loader.exec_module(atomic)\n"
         "os.mkdir(sys.argv[1])\n"
         "watcher = atomic.ScratchWatcher(sys.argv[1])\n"
         "print('ready', flush=True)\ntime.sleep(120)\n",
         str(scratch), atomic.__file__], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        assert scratch.is_dir()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=30)
    deadline = time.monotonic() + 20
    while scratch.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scratch.exists()


def test_save_npz_on_a_full_disk_keeps_the_old_checkpoint(tmp_path):
    import resource
    import signal

    from keras_vit import zoo

    model = _tiny()
    path = tmp_path / "w.npz"
    path.write_bytes(b"old")
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, hard))
    try:
        with pytest.raises(OSError):
            zoo.save_npz(model, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]


def test_unicode_paths_round_trip(tmp_path, capsys):
    from keras_vit import cli, zoo

    folder = tmp_path / "modèles 模型"
    model = _tiny()
    path = zoo.save_npz(model, folder / "vit ü.npz")
    other = _tiny(seed=2)
    zoo.load_weights(other, path)
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)
    keras_file = folder / "vit ü.keras"
    model.save(keras_file)
    image = folder / "图像 é.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(keras_file), str(image)]) == 0
    assert str(image) in capsys.readouterr().out


# ---------------------------------------------------------------------------
# Hostile sizes, servers and files: bounded, never stuck, always clear.
# ---------------------------------------------------------------------------


class _HubServer:
    """A Hub endpoint on 127.0.0.1 that trickles a byte every 2 s (HEAD
    and GET alike), and a listener that accepts and never answers."""

    def __init__(self):
        import http.server
        import socket
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if "/missing/" in self.path or "/resolve/" not in self.path:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.send_header("X-Repo-Commit", "a" * 40)
                self.send_header("ETag", '"abc"')
                self.end_headers()
                for _ in range(100):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(2)

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.silent = socket.socket()
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(16)  # the kernel accepts; nobody answers
        self.trickle = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.mute = f"http://127.0.0.1:{self.silent.getsockname()[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.silent.close()


@pytest.fixture(scope="module")
def hub_server():
    pytest.importorskip("huggingface_hub")
    server = _HubServer()
    yield server
    server.stop()


@pytest.mark.parametrize("endpoint", ["trickle", "mute"])
def test_hub_download_has_an_overall_deadline(hub_server, tmp_path,
                                              monkeypatch, endpoint):
    from keras_vit.zoo import download, timm_hub

    monkeypatch.setenv("HF_ENDPOINT", getattr(hub_server, endpoint))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(download.DownloadError,
                       match=r"hf-hub:timm/vit_x did not finish within 2 s"):
        timm_hub.fetch("hf-hub:timm/vit_x", progress=False, timeout=60,
                       deadline=2)
    assert time.monotonic() - start < 5.0


def test_hub_failure_is_a_download_error_naming_the_repo(
        hub_server, tmp_path, monkeypatch):
    from keras_vit.zoo import download, timm_hub

    monkeypatch.setenv("HF_ENDPOINT", hub_server.trickle)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(download.DownloadError,
                       match=r"could not download hf-hub:timm/missing@v1: "):
        timm_hub.fetch("hf-hub:timm/missing@v1", progress=False, timeout=5,
                       deadline=60)
    with pytest.raises(ValueError, match="deadline=0"):
        timm_hub.fetch("hf-hub:timm/vit_x", deadline=0)


def _fifo(path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(path)
    return path


def test_a_fifo_in_an_image_folder_is_skipped_and_named(tmp_path):
    from keras_vit import train as kt

    root = _class_folders(tmp_path / "data", 2)
    _fifo(root / "a" / "x.png")  # opening it would block forever
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"x\.png \(a FIFO \(named pipe\), "
                                         r"not a regular file\)"):
        source = kt.load_data(str(root))
    assert source.num_examples == 4
    assert time.monotonic() - start < 20.0


def test_predict_names_a_fifo_and_a_missing_image(tiny_keras, tmp_path,
                                                   capsys):
    from keras_vit import analysis, cli

    fifo = _fifo(tmp_path / "x.png")
    assert cli.main(["predict", str(tiny_keras), str(fifo)]) == 2
    assert (f"IMAGE={str(fifo)!r} is a FIFO (named pipe), not a regular "
            "file") in _one_error_line(capsys)
    assert cli.main(["predict", str(tiny_keras), str(tmp_path / "no.png")]
                    ) == 2
    assert "no.png' does not exist" in _one_error_line(capsys)
    with pytest.raises(ValueError, match="is a FIFO"):
        analysis.load_images([str(fifo)], 8)


def test_cpu_devices_are_bounded(capsys):
    from keras_vit import train as kt
    from keras_vit.train import cli as train_cli

    start = time.monotonic()
    assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                           "--cpu-devices", "100000"]) == 2
    assert ("--cpu-devices must be an integer in [1, 64]; received "
            "--cpu-devices=100000") in _one_error_line(capsys)
    with pytest.raises(kt.StrategyError, match="cpu_devices=100000"):
        kt.configure_cpu_devices(100000)
    assert time.monotonic() - start < 10


def test_predict_on_a_run_directory_and_a_missing_path(tiny_keras, tmp_path,
                                                       capsys):
    import json
    import shutil

    from keras_vit import cli

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_keras, run / "model.keras")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(run), str(image), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "run" and len(out["predictions"]) == 1
    for missing in (tmp_path / "nope", "./nope-x"):
        assert cli.main(["predict", str(missing), str(image)]) == 2
        assert (f"MODEL={str(missing)!r} does not exist"
                in _one_error_line(capsys))


_LOCK_HOLDER = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("atomic", sys.argv[2])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
lock = atomic.FileLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_run_folder_belongs_to_one_process(tmp_path, capsys):
    import gc
    import os
    import subprocess
    import sys

    from keras_vit.base import atomic
    from keras_vit.train import cli as train_cli
    from keras_vit.train.run_dir import RUN_LOCK, lock_run_dir

    out = tmp_path / "run"
    out.mkdir()
    lock = out / RUN_LOCK
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(lock), atomic.__file__],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                               "--out", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"is in use by pid {holder.pid} since" in line
        assert f"delete {lock}" in line
        assert time.monotonic() - start < 20  # before the model is built
    finally:
        holder.kill()
        holder.wait()
    # Its process is gone: the lock is taken over; one process may hold
    # it for several owners (a resumed Trainer), and it names this pid.
    class Owner:
        pass

    first, second = Owner(), Owner()
    lock_run_dir(first, out)
    lock_run_dir(second, out)
    assert lock.read_text().startswith(f"pid {os.getpid()} since")
    del first, second
    gc.collect()
    atomic.FileLock(lock).acquire().release()  # released with its owners


def _safetensors(path, header, data=b"\0" * 24, length=None):
    import json
    import struct

    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length)
                     + raw + data)
    return path


_TENSOR = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}


@pytest.mark.parametrize("header, length, data, needle", [
    (_TENSOR, 2 ** 63 - 1, b"\0" * 24, "declares a 9223372036854775807-byte "
                                       "header in a"),
    (b"not json!!", None, b"", "is not valid JSON"),
    ([1, 2], None, b"", "is a JSON list, not an object"),
    ({"w": dict(_TENSOR, data_offsets=[0, 10 ** 12])}, None, b"\0" * 24,
     "field w: data_offsets=[0, 1000000000000] is not a byte range"),
    ({"w": dict(_TENSOR, dtype="Q99")}, None, b"\0" * 24,
     "field w.dtype: expected one of"),
    ({"w": dict(_TENSOR, shape="abc")}, None, b"\0" * 24,
     "field w.shape: expected a list"),
    ({"w": _TENSOR}, None, b"\0" * 10, "inside the file's 10 bytes of data "
                                       "(truncated?)"),
    ({"w": dict(_TENSOR, shape=[5, 5])}, None, b"\0" * 24,
     "hold 24 bytes; dtype F32 and shape [5, 5] need 100"),
    ({"w": 7}, None, b"", "field w: expected a tensor entry"),
], ids=["length_2^63-1", "not_json", "a_list", "offsets_out_of_range",
        "unknown_dtype", "shape_a_string", "short_data", "size_mismatch",
        "entry_a_number"])
def test_hostile_safetensors_headers_name_the_file_and_tensor(
        tmp_path, header, length, data, needle):
    pytest.importorskip("safetensors")
    from keras_vit import zoo
    from keras_vit.zoo import timm_hub

    path = _safetensors(tmp_path / "model.safetensors",
                        {"w": header} if header is _TENSOR else header,
                        data, length)
    with pytest.raises(zoo.CheckpointError) as info:
        timm_hub.read_safetensors(path)
    assert str(info.value).startswith(f"{path} ")
    assert needle in str(info.value)


def test_a_valid_safetensors_file_still_reads(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    from keras_vit.zoo import timm_hub

    path = tmp_path / "ok.safetensors"
    st.save_file({"w": np.arange(6, dtype="float32").reshape(2, 3),
                  "e": np.zeros((0, 4), "float16")}, str(path))
    got = timm_hub.read_safetensors(path)
    np.testing.assert_array_equal(got["w"], np.arange(6).reshape(2, 3))
    assert got["e"].shape == (0, 4)


@pytest.mark.parametrize("text, needle", [
    ("[1, 2, 3]", "config.json is a JSON list, not an object"),
    ("[" * 100000 + "]" * 100000, "config.json is nested too deeply"),
    (b"\xff\xfe{", "config.json is not UTF-8 text"),
    ('{"architecture": ', "config.json is not valid JSON"),
    ('{"architecture": 5}', "field architecture: expected a string; "
                            "received architecture=5"),
    ('{"pretrained_cfg": "x"}', "field pretrained_cfg: expected a JSON "
                                "object; received pretrained_cfg='x'"),
    ('{"pretrained_cfg": {"input_size": "224"}}',
     "field pretrained_cfg.input_size: expected a size in pixels"),
    ('{"pretrained_cfg": {"input_size": [3, 1000000, 1000000]}}',
     "received pretrained_cfg.input_size=[3, 1000000, 1000000]"),
    ('{"pretrained_cfg": {"mean": "abc"}}',
     "field pretrained_cfg.mean: expected a list of 3 numbers"),
    ('{"model_args": [1]}', "field model_args: expected a JSON object"),
    ('{"model_args": {"img_size": true}}', "field model_args.img_size"),
    ('{"num_classes": "3"}', "field num_classes: expected an integer in "
                             "[0, 1000000]; received num_classes='3'"),
    ('{"label_names": {"a": 1}}', "field label_names: expected a list of "
                                  "strings"),
])
def test_malformed_timm_configs_name_the_file_and_field(tmp_path, text,
                                                        needle):
    from keras_vit.base.errors import ConfigError
    from keras_vit.zoo import timm_hub

    _safetensors(tmp_path / "model.safetensors", {"w": _TENSOR})
    config = tmp_path / "config.json"
    (config.write_bytes if isinstance(text, bytes) else config.write_text)(
        text)
    with pytest.raises(ConfigError) as info:
        timm_hub.fetch(str(tmp_path))
    assert str(info.value).startswith(str(config))
    assert needle in str(info.value)


def test_an_oversized_timm_config_is_refused_before_reading(tmp_path,
                                                            monkeypatch):
    from keras_vit.base.errors import ConfigError
    from keras_vit.zoo import timm_hub

    monkeypatch.setattr(timm_hub, "MAX_CONFIG_BYTES", 1000)
    config = tmp_path / "config.json"
    config.write_text('{"label_names": ["' + "x" * 2000 + '"]}')
    with pytest.raises(ConfigError, match="is 2021 bytes; a timm config"):
        timm_hub.read_config(config)


@pytest.fixture(scope="module")
def hostile_labels_repo(tmp_path_factory):
    pytest.importorskip("safetensors")
    from keras_vit import zoo

    model = zoo.load("ViT-Ti/16", weights=None, image_size=32,
                     num_classes=3, gelu="exact")
    import pathlib

    return pathlib.Path(zoo.save_pretrained(
        model, tmp_path_factory.mktemp("hub") / "repo",
        labels=["tabby\ncat", "\x1b[31mred", "\u202eevil"]))


def test_labels_from_a_repository_are_printed_escaped(hostile_labels_repo,
                                                      tmp_path, capsys):
    from keras_vit import cli

    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(hostile_labels_repo), str(image),
                     "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert len(out.strip().splitlines()) == 4  # a header, three labels
    for shown in (r"tabby\ncat", r"\x1b[31mred", r"\u202eevil"):
        assert shown in out


def test_hostile_repository_files_exit_2_with_one_line(hostile_labels_repo,
                                                       tmp_path, capsys):
    import shutil

    from keras_vit import cli

    repo = tmp_path / "repo"
    shutil.copytree(hostile_labels_repo, repo)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    (repo / "config.json").write_text('{"architecture": ["vit"]}')
    assert cli.main(["predict", str(repo), str(image)]) == 2
    assert "config.json field architecture: expected a string" in (
        _one_error_line(capsys))
    shutil.copy(hostile_labels_repo / "config.json", repo)
    data = (repo / "model.safetensors").read_bytes()
    (repo / "model.safetensors").write_bytes(data[:len(data) // 2])
    assert cli.main(["predict", str(repo), str(image)]) == 2
    line = _one_error_line(capsys)
    assert "model.safetensors field " in line and "(truncated?)" in line


def test_an_unknown_keras_backend_is_one_line():
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jaxx")
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "list"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("keras-vit: error: KERAS_BACKEND must be one "
                               "of ('tensorflow', 'jax', 'torch'")
    assert "received KERAS_BACKEND='jaxx'. Did you mean 'jax'?" in lines[0]


def test_a_keras_backend_that_is_not_installed_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    # Keras' openvino backend, with the package hidden from the child
    # whether or not it is installed here (the `openvino` extra installs it).
    hidden = tmp_path / "hidden" / "openvino"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'openvino'\", "
        "name='openvino')\n")
    env = dict(os.environ, KERAS_BACKEND="openvino", PYTHONPATH=os.pathsep.join(
        [str(hidden.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # `list` needs no Keras (the command starts without it) and works.
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "list"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ViT-B/16" in proc.stdout, proc.stderr
    # A command that needs Keras says which module is missing.
    proc = subprocess.run([sys.executable, "-m", "keras_vit.cli", "demo",
                           "--quick", "--out", str(tmp_path / "demo")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("importing Keras (backend 'openvino', KERAS_BACKEND) needs the "
            "package 'openvino', which is not installed") in lines[0]


def test_a_short_run_scales_the_recipes_warmup(capsys):
    from keras_vit.train import cli as train_cli
    from keras_vit.train import recipes

    with pytest.warns(UserWarning, match=r"warmup_steps=250 do not fit a run "
                                         r"of total_steps=7; warming up for "
                                         r"1 steps instead \(10%\)"):
        recipe = recipes.get("finetune", total_steps=7)
    assert recipe.warmup_steps == 1
    with pytest.warns(UserWarning, match="warming up for 0 steps"):
        assert recipes.get("finetune", total_steps=1).warmup_steps == 0
    assert recipes.get("finetune", total_steps=500).warmup_steps == 250
    # A warmup the user chose is never changed: the error names options.
    with pytest.raises(ValueError, match=r"warmup_steps=5 \(--warmup-steps\) "
                                         r"must be smaller than total_steps=3 "
                                         r"\(--steps\)"):
        recipes.get("finetune", total_steps=3, warmup_steps=5)
    assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                           "--steps", "3", "--warmup-steps", "5"]) == 2
    assert "(--warmup-steps) must be smaller" in _one_error_line(capsys)


@pytest.mark.parametrize("argv, needle", [
    (["fewshot", "ViT-Ti/16", "--data", "digits:train", "--seeds",
      "100000"], "--seeds must be an integer in [1, 1000]; received "
                 "--seeds=100000"),
    (["benchmark", "ViT-Ti/16", "--runs", "100000000"],
     "--runs must be an integer in [1, 1000]; received --runs=100000000"),
])
def test_user_given_counts_are_bounded(capsys, argv, needle):
    from keras_vit import cli

    start = time.monotonic()
    assert cli.main(argv) == 2
    assert needle in _one_error_line(capsys)
    assert time.monotonic() - start < 10  # before the model is built


def test_fewshot_num_seeds_is_bounded():
    from keras_vit import train as kt

    with pytest.raises(ValueError, match="num_seeds=0"):
        kt.fewshot(_tiny(), "digits:train", "digits:test", num_seeds=0)
    with pytest.raises(ValueError, match=r"\[1, 1000\]; received "
                                         r"num_seeds=10000"):
        kt.fewshot(_tiny(), "digits:train", "digits:test", num_seeds=10000)


def _keras_with_config(tiny_keras, path, config, compress=False):
    import zipfile

    with zipfile.ZipFile(tiny_keras) as src, zipfile.ZipFile(
            path, "w", zipfile.ZIP_DEFLATED if compress else
            zipfile.ZIP_STORED) as out:
        for name in src.namelist():
            out.writestr(name, config if name == "config.json"
                         else src.read(name))
    return path


@pytest.mark.parametrize("config, compress, needle", [
    ("[" * 100000 + "]" * 100000, False, "config.json is nested too deeply"),
    (" " * (17 << 20) + "{}", True, f"config.json is {(17 << 20) + 2} bytes "
                                    "uncompressed"),
], ids=["deep_nesting", "zip_bomb"])
def test_hostile_keras_configs_are_one_line(tiny_keras, tmp_path, capsys,
                                            config, compress, needle):
    from keras_vit import cli

    model = _keras_with_config(tiny_keras, tmp_path / "m.keras", config,
                               compress)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(model), str(image)]) == 2
    line = _one_error_line(capsys)
    assert f"cannot load MODEL={str(model)!r} as a Keras model" in line
    assert needle in line


def test_a_keras_weights_bomb_is_refused_before_reading(
        tiny_keras, tmp_path, capsys, monkeypatch):
    """A 1.5 MB .keras whose model.weights.h5 inflates to 1.5 GB loaded, at
    3.6 GB of peak RSS: Keras reads the member whole and its own bomb check
    starts at 4 GiB (found by benchmarks/hostile_inputs.py). Scaled down
    here to a 1 MiB floor; an honest deflated archive still loads."""
    import zipfile

    from keras_vit import cli
    from keras_vit.zoo import keras_archive

    monkeypatch.setattr(keras_archive, "KERAS_BOMB_FLOOR", 1 << 20)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    for padding, status in ((0, 0), (4 << 20, 2)):
        path = tmp_path / f"deflated{padding}.keras"
        with zipfile.ZipFile(tiny_keras) as src, zipfile.ZipFile(
                path, "w", zipfile.ZIP_DEFLATED) as out:
            for name in src.namelist():
                data = src.read(name)
                if name == "model.weights.h5":
                    data += bytes(padding)
                out.writestr(name, data)
        assert cli.main(["predict", str(path), str(image)]) == status
    line = _one_error_line(capsys)
    assert f"cannot load MODEL={str(path)!r} as a Keras model" in line
    assert "its model.weights.h5 is " in line
    assert "bytes uncompressed from" in line and "zip bomb?" in line


def test_without_flock_the_pid_in_the_lock_decides(tmp_path, monkeypatch):
    import errno
    import os
    import subprocess
    import sys

    from keras_vit.base import atomic

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(atomic.fcntl, "flock", no_flock)
    lock = tmp_path / "run.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    lock.write_text(f"pid {dead} since 2020-01-01 00:00:00\n")
    taken = atomic.FileLock(lock).acquire()  # its process is gone
    assert lock.read_text().startswith(f"pid {os.getpid()} since")
    taken.release()
    assert lock.read_text() == ""
    lock.write_text(f"pid {os.getppid()} since 2020-01-01 00:00:00\n")
    with pytest.raises(atomic.LockHeldError, match=rf"held by pid "
                                                   rf"{os.getppid()} since"):
        atomic.FileLock(lock).acquire()


def test_a_fifo_where_an_archive_belongs_is_named(tmp_path, capsys):
    from keras_vit import cli
    from keras_vit import train as kt

    fifo = _fifo(tmp_path / "m.keras")
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(fifo), str(image)]) == 2
    assert (f"MODEL={str(fifo)!r} is a FIFO (named pipe), not a .keras "
            "model") in _one_error_line(capsys)
    data = _fifo(tmp_path / "d.npz")
    with pytest.raises(ValueError, match="is a FIFO"):
        kt.load_data(str(data))


def _two_class_folder(tmp_path):
    """``tmp_path/data`` with classes a and b, two 20x20 PNGs each."""
    from PIL import Image

    root = tmp_path / "data"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 20), (i * 40, 0, 0)).save(
                root / c / f"{i}.png")
    return root


def test_oversized_images_are_skipped_in_training_folders(tmp_path,
                                                          monkeypatch):
    """The pixel budget is read from the header: a PNG over it is skipped
    by name, a JPEG over it kept (decoded at a reduced scale)."""
    from PIL import Image

    from keras_vit.data import images
    from keras_vit import train as kt

    root = _two_class_folder(tmp_path)
    Image.new("RGB", (40, 40)).save(root / "a" / "big.png")
    Image.new("RGB", (80, 80)).save(root / "b" / "big.jpg")
    # Scaled down: 16 million pixels in real life.
    monkeypatch.setattr(images, "PIXEL_BUDGET", 1000)
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(root))
    text = " ".join(str(w.message) for w in record)
    assert ("big.png (is a 40x40 PNG, over the 1,000-pixel budget for "
            "images decoded whole") in text
    assert "big.jpg" not in text
    assert source.num_examples == 5


def test_predict_reduces_large_jpegs_and_refuses_large_pngs(
        tiny_keras, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from keras_vit import cli
    from keras_vit.data import images

    png, jpeg = tmp_path / "i.png", tmp_path / "i.jpg"
    Image.new("RGB", (100, 100), (200, 10, 10)).save(png)
    Image.new("RGB", (100, 100), (200, 10, 10)).save(jpeg)
    monkeypatch.setattr(images, "PIXEL_BUDGET", 500)  # 16e6 in real life
    assert cli.main(["predict", str(tiny_keras), str(jpeg)]) == 0
    assert str(jpeg) in capsys.readouterr().out
    assert cli.main(["predict", str(tiny_keras), str(png)]) == 2
    assert (f"IMAGE={str(png)!r} is a 100x100 PNG, over the 500-pixel "
            "budget" in _one_error_line(capsys))


@pytest.mark.parametrize("argv", [
    ["fine-tune", "ViT-Ti/16", "--data", "digits", "--image-size", "100000"],
    ["predict", "ViT-Ti/16", "x.png", "--image-size", "100000"],
    ["convert", "ViT-Ti/16", "-o", "x.keras", "--image-size", "100000"],
])
def test_image_size_options_are_bounded(capsys, argv):
    from keras_vit import cli

    start = time.monotonic()
    assert cli.main(argv) == 2
    assert ("argument --image-size: must be <= 4096 pixels, got 100000"
            in _one_error_line(capsys))
    assert time.monotonic() - start < 5


def test_predict_refuses_nan_weights(tmp_path, capsys):
    from keras_vit import cli

    model = _tiny()
    weights = model.get_weights()
    weights[0] = np.full_like(weights[0], np.nan)
    model.set_weights(weights)
    path = tmp_path / "nan.keras"
    model.save(path)
    image = tmp_path / "i.png"
    _odd_image(image, "rgba")
    assert cli.main(["predict", str(path), str(image)]) == 2
    line = _one_error_line(capsys)
    assert "gives non-finite outputs (NaN or inf) for 1 of 1 image(s)" in line


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
    assert "a batch of 100000000 images" in err and "GiB" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert peak < 2**30, peak
    assert not (tmp_path / "out.onnx").exists()


def test_evaluate_prints_names_from_the_disk_escaped(tmp_path, capsys):
    """A data folder named with a newline and an ANSI escape is one line of
    output, the control characters shown escaped (no name read from the
    disk can forge or hide a line of output)."""
    from keras_vit.train import cli as train_cli

    model = tmp_path / "tiny.keras"
    _tiny(num_classes=2).save(model)
    root = _class_folders(tmp_path / "bad\nname\x1b[31m", 4)
    status = train_cli.main(["evaluate", str(model), "--data", str(root),
                             "--batch-size", "4"])
    out = capsys.readouterr().out
    assert status == 0
    line = next(x for x in out.splitlines() if "top-1 accuracy" in x)
    assert "bad\\nname\\x1b[31m" in line and "\x1b" not in out


# -- one pixel budget for every image reader --------------------------------

def test_decode_plan_bounds_what_any_header_can_ask_for():
    from keras_vit.data import images

    budget = images.PIXEL_BUDGET
    # JPEGs: the largest libjpeg scale that fits, whatever the header says.
    for width, height in [(4000, 4000), (4001, 4000), (12000, 9000),
                          (30000, 30000)]:
        plan = images.decode_plan("JPEG", width, height)
        kept = -(-width // plan.scale) * -(-height // plan.scale)
        assert kept <= budget
        smaller = plan.scale // 2
        assert smaller == 0 or (
            -(-width // smaller) * -(-height // smaller) > budget)
    assert images.decode_plan("JPEG", 4000, 4000).scale == 1
    refused = images.decode_plan("JPEG", 40000, 40000)
    assert refused.scale is None and "40000x40000 JPEG" in refused.refusal
    # Other formats decode whole: they must fit the budget as they are.
    assert images.decode_plan("PNG", 4000, 4000).scale == 1
    assert "16,000,000-pixel budget" in images.decode_plan(
        "PNG", 5000, 4000).refusal


def _jpeg(path, size, color=(200, 30, 30)):
    from PIL import Image

    Image.new("RGB", size, color).save(path, quality=90)


def test_training_decodes_large_jpegs_at_a_reduced_scale(tmp_path,
                                                         monkeypatch):
    import tensorflow as tf

    from keras_vit.data import images

    monkeypatch.setattr(images, "PIXEL_BUDGET", 1000)
    decode = tf.function(lambda data: images.decode(data, "x"))
    for size, expected in [((30, 20), (20, 30)), ((64, 48), (24, 32)),
                           ((200, 100), (13, 25))]:
        path = tmp_path / f"{size[0]}.jpg"
        _jpeg(path, size)
        image = decode(tf.io.read_file(str(path)))
        assert tuple(image.shape) == expected + (3,)
        assert image.shape[0] * image.shape[1] <= 1000
        # The rule inside the graph is decode_plan's.
        plan = images.decode_plan("JPEG", *size)
        assert image.shape[1] == -(-size[0] // plan.scale)
    from PIL import Image

    png = tmp_path / "p.png"
    Image.new("RGB", (40, 25)).save(png)  # 1000 pixels: at the budget
    image = decode(tf.io.read_file(str(png)))
    assert tuple(image.shape) == (25, 40, 3)
    Image.new("RGB", (40, 26)).save(png)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="x is a 40x26 PNG, over the 1,000-pixel"):
        decode(tf.io.read_file(str(png)))


def test_training_folders_keep_large_jpegs_and_skip_large_pngs(tmp_path,
                                                               monkeypatch):
    from PIL import Image

    from keras_vit.data import images
    from keras_vit import train as kt

    root = _two_class_folder(tmp_path)
    _jpeg(root / "a" / "photo.jpg", (64, 48))
    Image.new("RGB", (40, 40)).save(root / "b" / "wide.png")
    monkeypatch.setattr(images, "PIXEL_BUDGET", 1000)  # 16e6 in real life
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(root))
    text = " ".join(str(w.message) for w in record)
    assert ("wide.png (is a 40x40 PNG, over the 1,000-pixel budget for "
            "images decoded whole") in text
    assert "photo.jpg" not in text
    assert source.num_examples == 5
    batch, _ = next(iter(kt.dataset(source, image_size=16, batch_size=5,
                                     training=False)))
    assert tuple(batch.shape) == (5, 16, 16, 3)


def test_predict_refuses_what_it_cannot_decode_within_the_limits(
        tiny_keras, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from keras_vit import cli
    from keras_vit.data import images

    rgba = tmp_path / "alpha.png"
    Image.new("RGBA", (100, 100), (1, 2, 3, 4)).save(rgba)
    photo = tmp_path / "photo.jpg"
    _jpeg(photo, (160, 120))
    monkeypatch.setattr(images, "PIXEL_BUDGET", 2000)
    assert cli.main(["predict", str(tiny_keras), str(rgba)]) == 2
    line = _one_error_line(capsys)
    assert f"IMAGE={str(rgba)!r} is a 100x100 PNG, over the 2,000-pixel" \
        in line
    # A JPEG over the budget is decoded at a reduced scale, not refused.
    pixels = cli._read_image(str(photo))
    assert pixels.shape == (30, 40, 3)
    assert cli.main(["predict", str(tiny_keras), str(photo)]) == 0


def test_phone_photos_saved_as_mpo_are_kept_in_training_folders(tmp_path):
    """PIL names the JPEGs many phones write (a JPEG with a second picture
    after it) "MPO"; they were skipped as a format TensorFlow cannot read,
    which it can. They train, and count as JPEGs for the pixel budget."""
    from PIL import Image

    from keras_vit.data import images
    from keras_vit import train as kt

    root = _two_class_folder(tmp_path)
    photo = root / "a" / "phone.jpg"
    Image.new("RGB", (64, 48), (200, 10, 10)).save(
        photo, format="MPO", save_all=True,
        append_images=[Image.new("RGB", (32, 24))])
    with Image.open(photo) as im:
        assert im.format == "MPO"
    source = kt.load_data(str(root))
    assert source.num_examples == 5 and not source.skipped
    assert images.decode_plan("MPO", 12000, 9000).scale == 4
