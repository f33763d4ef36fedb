"""keras_vit.train: strategies, pipelines, recipes, the training loop,
checkpoint/resume, multi-worker runs, few-shot evaluation and the
fine-tune / evaluate / fewshot commands (several devices and killed runs:
test_trainer_backends.py).

Multi-worker runs and an interrupted command happen in subprocesses (a
worker is a process), each bounded by a timeout. Nothing goes online.
"""

import glob
import importlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import official
from test_trainer_backends import HOLD, finish_together, logged

import keras
import keras_vit
from keras_vit import cli
from keras_vit import train as kt
from keras_vit.train import few_shot
from keras_vit.train import recipes

SUBPROCESS_TIMEOUT = 240
# A tiny ViT at 16x16 (patch 4, width 32, one block): steps take
# milliseconds, so the tests exercise the machinery, not the model.
TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
QUICK = dict(batch_size=32, crop_area=None, log_every=5, verbose=False)


def tiny(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    tiny().save(path)
    return str(path)


def _env(**extra):
    env = dict(os.environ, KERAS_VIT_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(metrics):
    return [row["loss"] for row in metrics["history"]]


def _assert_falls(losses):
    assert len(losses) >= 3, losses
    first, last = np.mean(losses[:2]), np.mean(losses[-2:])
    assert last < first - 0.05, losses


def _error_lines(text):
    return [ln for ln in text.splitlines() if ln.startswith("keras-vit: error:")]


# --------------------------------------------------------------------------
# docstring examples (the project's doctest list does not know this package)


# --------------------------------------------------------------------------
# recipes


def test_recipes_hold_the_papers_values():
    ft = recipes.get("finetune")
    assert (ft.optimizer, ft.momentum, ft.schedule) == ("sgd", 0.9, "cosine")
    assert (ft.batch_size, ft.grad_clip_norm, ft.weight_decay) == (512, 1.0, 0.0)
    assert ft.image_size == 384 and ft.total_steps == 2500
    assert ft.learning_rate == 0.01
    assert recipes.get("finetune-imagenet").total_steps == 20_000
    assert recipes.get("finetune-imagenet").ema_decay == 0.9999
    assert recipes.get("finetune-cifar").total_steps == 10_000
    assert recipes.get("finetune-pets-flowers").total_steps == 500
    pt = recipes.get("pretrain")
    assert (pt.optimizer, pt.beta_1, pt.beta_2) == ("adam", 0.9, 0.999)
    assert (pt.batch_size, pt.warmup_steps, pt.image_size) == (4096, 10_000, 224)
    assert (pt.weight_decay, pt.dropout_rate, pt.schedule) == (0.03, 0.1, "linear")
    inet = recipes.get("pretrain-imagenet")
    assert (inet.learning_rate, inet.weight_decay, inet.schedule,
            inet.grad_clip_norm, inet.epochs) == (3e-3, 0.3, "cosine", 1.0, 300)
    assert recipes.get("pretrain-jft").weight_decay == 0.1


def test_recipe_overrides_and_errors():
    r = recipes.get("finetune", epochs=3, learning_rate=0.003)
    assert r.total_steps is None and r.epochs == 3
    assert r.steps_for(1000) == 6  # ceil(3 * 1000 / 512)
    with pytest.raises(ValueError, match="learning_rat.*did you mean 'learning_rate'"):
        recipes.get("finetune", learning_rat=0.1)
    with pytest.raises(ValueError, match=r"warmup_steps=300 \(--warmup-steps\)"
                                         r" must be smaller than "
                                         r"total_steps=200"):
        recipes.get("finetune", total_steps=200, warmup_steps=300)
    with pytest.raises(ValueError, match="momentum=1.5"):
        recipes.get("finetune", momentum=1.5)
    with pytest.raises(ValueError, match="Unknown recipe='fintune'.*'finetune'"):
        recipes.get("fintune")
    assert recipes.parse_value("crop_area", "none") is None
    assert recipes.parse_value("crop_area", "0.5,1") == (0.5, 1.0)
    assert recipes.parse_value("flip", "false") is False


def test_schedule_warmup_then_decay_to_zero():
    cos = recipes.learning_rate_schedule(
        recipes.get("finetune", total_steps=100, warmup_steps=10), 100)
    values = [float(cos(s)) for s in range(0, 101)]
    assert values[0] == pytest.approx(0.001)  # (0 + 1) / 10 of the peak
    assert values[9] == pytest.approx(0.01)
    assert values[55] == pytest.approx(0.005, abs=1e-6)  # half-way: cos = 0
    assert values[100] == pytest.approx(0.0, abs=1e-9)
    assert all(a >= b for a, b in zip(values[9:], values[10:]))
    lin = recipes.learning_rate_schedule(
        recipes.get("pretrain", total_steps=100, warmup_steps=10,
                    learning_rate=1.0), 100)
    assert float(lin(55)) == pytest.approx(0.5, abs=1e-6)


# --------------------------------------------------------------------------
# strategies


def test_strategy_auto_falls_back_quickly_and_names_are_checked(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    t0 = time.perf_counter()
    s = kt.strategy("auto")
    assert time.perf_counter() - t0 < 15  # no TPU here: quick fallback
    info = kt.describe(s)
    assert info["name"] == "default" and info["replicas"] == 1
    assert info["is_chief"]
    with pytest.raises(kt.StrategyError, match="strategy='tpu' but no TPU"):
        kt.strategy("tpu")
    port = _free_port()  # nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(kt.StrategyError, match=f"grpc://127.0.0.1:{port}"):
        kt.strategy("tpu", tpu=f"grpc://127.0.0.1:{port}")
    assert time.perf_counter() - t0 < 15
    with pytest.raises(kt.StrategyError, match="strategy='gpus'"):
        kt.strategy("gpus")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(kt.StrategyError, match="TF_CONFIG is not valid JSON"):
        kt.strategy("auto")


@pytest.mark.backends
def test_tf_distribute_names_name_the_backend_and_the_way_out():
    strategy_lib = importlib.import_module("keras_vit.train.distribute")
    backend = keras.backend.backend()
    for name in ("auto", "default"):
        strategy_lib.check_backend(name)
    if backend == "tensorflow":
        strategy_lib.check_backend("tpu")
        return
    for name in ("tpu", "mirrored", "multi_worker"):
        with pytest.raises(kt.StrategyError, match=(
                f"strategy='{name}' is a tf.distribute strategy, which the "
                f"'{backend}' Keras backend cannot run.*"
                "KERAS_BACKEND=tensorflow")) as caught:
            strategy_lib.check_backend(name)
        if backend == "jax" and name == "tpu":
            # What JAX sees here, and its own way to train on a TPU.
            assert "JAX sees no TPU here (1 cpu device)" in str(caught.value)
            assert "strategy='data_parallel'" in str(caught.value)
    with pytest.raises(kt.StrategyError, match=f"'{backend}' Keras backend"):
        kt.evaluate(tiny(), "digits:test", strategy="tpu", verbose=False)


@pytest.mark.backends
def test_evaluate_counts_every_image_once():
    # A zero head gives uniform probabilities: loss ln(10) on every image,
    # and argmax 0, so the accuracy is the share of zeros. 450 images in
    # batches of 64 leave a padded last batch that must not count.
    labels = kt.digits("test").labels()
    r = kt.evaluate(tiny(), "digits:test", batch_size=64, verbose=False)
    assert r["num_examples"] == 450
    assert r["loss"] == pytest.approx(np.log(10.0), abs=1e-5)
    assert r["accuracy"] == pytest.approx(np.mean(labels == 0), abs=1e-9)


def test_cpu_devices_cannot_change_after_start():
    import tensorflow as tf

    tf.constant(1.0)  # TensorFlow is running in this process
    with pytest.raises(kt.StrategyError, match="cpu_devices=3 must be "
                                               "configured before"):
        kt.configure_cpu_devices(3)


# --------------------------------------------------------------------------
# pipelines


def _epoch(source, epoch, **kw):
    ds = kt.dataset(source, 16, 8, training=True, seed=3, epoch=epoch,
                    crop_area=(0.5, 1.0), **kw)
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_digits_pipeline_is_deterministic_and_resumable():
    train = kt.digits("train")
    assert (train.num_examples, train.num_classes) == (1347, 10)
    assert kt.digits("test").num_examples == 450
    assert not train.flip_ok
    a, b = _epoch(train, 0), _epoch(train, 0)
    assert len(a) == 1347 // 8
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    c = _epoch(train, 1)
    assert not np.array_equal(a[0][1], c[0][1])  # a new order per epoch
    x = np.concatenate([x for x, _ in a])
    assert x.shape[1:] == (16, 16, 3)
    assert -1.0 <= x.min() < -0.9 and 0.9 < x.max() <= 1.0
    # Resuming mid-epoch: skipping 5 batches gives exactly the rest.
    tail = _epoch(train, 0, skip=40)
    assert len(tail) == len(a) - 5
    for (xa, ya), (xt, yt) in zip(a[5:], tail):
        np.testing.assert_array_equal(xa, xt)
        np.testing.assert_array_equal(ya, yt)
    # Two shards split an epoch without overlap.
    ys = [np.concatenate([y for _, y in _epoch(train, 0, shard=(2, i),
                                               take=600)])
          for i in (0, 1)]
    labels = np.concatenate(ys)
    assert len(labels) == 1200
    assert abs(np.bincount(labels, minlength=10)
               - np.bincount(np.concatenate([y for _, y in a])[:1200],
                             minlength=10)).max() < 30


def test_eval_pipeline_and_arrays():
    images = np.random.default_rng(0).integers(0, 256, (10, 20, 24, 3), "uint8")
    source = kt.ArraySource(images, np.arange(10) % 3)
    assert source.num_classes == 3
    (x, y), = list(kt.dataset(source, 8, 16, training=False))
    assert x.shape == (10, 8, 8, 3)  # the ragged batch is kept for eval
    ref = keras.ops.image.resize(images.astype("float32"), (8, 8),
                                 interpolation="bilinear")
    np.testing.assert_allclose(x.numpy(), np.asarray(ref) / 127.5 - 1.0,
                               atol=1e-5)
    with pytest.raises(kt.DataError, match=r"labels must lie in \[0, "
                                           r"num_classes=2\)"):
        kt.ArraySource(images, np.arange(10) % 3, num_classes=2)
    with pytest.raises(kt.DataError, match=r"images.shape=\(10, 20\)"):
        kt.ArraySource(np.zeros((10, 20)), np.zeros(10, int))


def _write_image(path, seed, fmt="PNG", size=(12, 10)):
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, size + (3,), "uint8")).save(path, fmt)


@pytest.fixture
def messy_folder(tmp_path):
    """Two classes of good images, plus: a corrupt PNG, a truncated JPEG
    (passes the header check, fails to decode), a text file and an empty
    class folder."""
    root = tmp_path / "images"
    for c, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(12):
            _write_image(root / cls / f"{i:02d}.png", seed=10 * c + i)
    (root / "emu").mkdir()
    (root / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (root / "dog" / "notes.txt").write_text("not an image")
    _write_image(root / "dog" / "cut.jpg", 99, "JPEG", (64, 64))
    data = (root / "dog" / "cut.jpg").read_bytes()
    (root / "dog" / "cut.jpg").write_bytes(data[:int(len(data) * 0.8)])
    return root


def test_image_folder_with_bad_files_trains_with_a_warning(messy_folder):
    with pytest.warns(UserWarning) as record:
        source = kt.load_data(str(messy_folder))
    text = " ".join(str(w.message) for w in record)
    assert "broken.png (is a damaged PNG (its first chunk is not IHDR))" \
        in text
    assert "notes.txt (not an image extension .txt)" in text
    assert "['emu'] have no images" in text
    assert source.class_names == ["cat", "dog", "emu"]
    assert source.num_classes == 3
    # The truncated JPEG has a valid header but not a valid body: found
    # at load and named with the others.
    assert "cut.jpg (" in text and "is a JPEG cut short" in text
    assert source.num_examples == 24
    assert len(source.skipped) == 3
    run = kt.Trainer(tiny(num_classes=3), source, source, recipe="finetune",
                     total_steps=6, warmup_steps=1, strategy="default",
                     **dict(QUICK, batch_size=8, flip=True,
                            crop_area=(0.3, 1.0))).fit()
    assert run.metrics["final_step"] == 6
    assert run.metrics["eval"]["num_examples"] == 24


def test_data_errors_are_clear_and_fast(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        kt.load_data(str(missing))
    (tmp_path / "flat").mkdir()
    _write_image(tmp_path / "flat" / "a.png", 0)
    with pytest.raises(kt.DataError, match="no class sub-folders"):
        kt.load_data(str(tmp_path / "flat"))
    with pytest.raises(kt.DataError, match="Cannot read data='digitz'"):
        kt.load_data("digitz")
    # A mistyped folder name: the folder that exists comes first.
    (tmp_path / "digits_train" / "zero").mkdir(parents=True)
    with pytest.raises(kt.DataError, match="Did you mean the folder "
                                           "'digits_train', or 'digits:train'"):
        kt.load_data("digits_trian")
    with pytest.raises(FileNotFoundError, match="does not exist;.* Did you "
                       f"mean the folder '{tmp_path}/digits_train'"):
        kt.load_data(f"{tmp_path}/digits_trian")
    t0 = time.perf_counter()
    with pytest.raises(kt.DataError, match="Unknown tfds dataset "
                                           "name='cifar1O'.*'cifar10'"):
        kt.load_data("tfds:cifar1O")
    # Offline and not prepared: fails at once and says how to prepare it.
    with pytest.raises(FileNotFoundError, match="`tfds build cifar10`"):
        kt.load_data("tfds:cifar10", data_dir=str(tmp_path / "tfds"))
    assert time.perf_counter() - t0 < 60


@pytest.mark.slow
def test_tfds_source_reads_a_prepared_dataset(tmp_path):
    import tensorflow_datasets as tfds

    class KerasVitTinyDigits(tfds.core.GeneratorBasedBuilder):
        """Twenty 8x8 digits as PNGs, prepared offline."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(8, 8, 3)),
                    "label": tfds.features.ClassLabel(num_classes=10)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0),
                    "test": self._generate_examples(1)}

        def _generate_examples(self, offset):
            from sklearn.datasets import load_digits

            d = load_digits()
            for i in range(offset * 20, offset * 20 + 20):
                img = (d.images[i] * 15).astype("uint8")
                yield i, {"image": np.repeat(img[..., None], 3, -1),
                          "label": int(d.target[i])}

    KerasVitTinyDigits(data_dir=str(tmp_path)).download_and_prepare()
    name = "keras_vit_tiny_digits"
    train = kt.load_data(f"tfds:{name}", data_dir=str(tmp_path))
    assert (train.num_examples, train.num_classes) == (20, 10)
    test = kt.load_data(f"tfds:{name}:test", data_dir=str(tmp_path))
    from sklearn.datasets import load_digits

    # tfds stores examples in its own (hashed-key) order: same multiset,
    # and the same order on every read.
    np.testing.assert_array_equal(np.sort(test.labels()),
                                  np.sort(load_digits().target[20:40]))
    again = kt.load_data(f"tfds:{name}:test", data_dir=str(tmp_path))
    np.testing.assert_array_equal(again.labels(), test.labels())
    batches = list(kt.dataset(train, 16, 4, training=True, epoch=0))
    assert len(batches) == 5 and batches[0][0].shape == (4, 16, 16, 3)
    sub = train.subset([3, 7])
    assert sub.labels().tolist() == train.labels()[[3, 7]].tolist()


# --------------------------------------------------------------------------
# the training loop


def test_xla_train_step_matches_the_graph_step(monkeypatch):
    from keras_vit.runtime import hardware
    from keras_vit.train.distribute import step_uses_xla

    kw = dict(recipe="pretrain", total_steps=4, warmup_steps=1,
              learning_rate=1e-2, strategy="default", **QUICK)
    graph = kt.Trainer(tiny(), "digits", jit_compile=False, **kw)
    xla = kt.Trainer(tiny(), "digits", jit_compile=True, **kw)
    accumulated = kt.Trainer(tiny(), "digits", jit_compile=True,
                             micro_batch_size=16, **kw)
    assert (graph.jit_compile, xla.jit_compile) == (False, True)
    assert "XLA" in xla.describe() and "XLA" not in graph.describe()
    graph, xla, accumulated = graph.fit(), xla.fit(), accumulated.fit()
    # The same updates, with gradient accumulation inside XLA too.
    for a, b, c in zip(graph.model.get_weights(), xla.model.get_weights(),
                       accumulated.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=5e-5)
        np.testing.assert_allclose(a, c, atol=5e-5)
    assert xla.metrics["jit_compile"] is True
    default = kt.strategy("default")
    assert step_uses_xla(default, "auto", "float32") is False
    # "auto" follows the machine's plan: XLA for bf16 where oneDNN's bf16
    # is not faster than float32 (forced here), the graph where it is.
    assert step_uses_xla(default, "auto", "mixed_bfloat16") is \
        hardware.plan("mixed_bfloat16").train_jit
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2")
    assert step_uses_xla(default, "auto", "mixed_bfloat16") is True
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx512f,amx_bf16,amx_tile")
    assert step_uses_xla(default, "auto", "mixed_bfloat16") is False
    monkeypatch.delenv("KERAS_VIT_CPU_FLAGS")
    assert step_uses_xla(default, False, "mixed_bfloat16") is False
    with pytest.raises(ValueError, match="jit_compile='yes'"):
        kt.recipes.get("finetune", jit_compile="yes")
    assert kt.recipes.parse_value("jit_compile", "auto") == "auto"
    assert kt.recipes.parse_value("jit_compile", "false") is False


def test_run_directory_tensorboard_metrics_and_ema(tmp_path):
    import tensorflow as tf

    out = tmp_path / "run"
    run = kt.Trainer(tiny(), "digits", "digits:test", recipe="pretrain",
                     out_dir=out, total_steps=40, warmup_steps=4,
                     learning_rate=3e-3, ema_decay=0.9, strategy="default",
                     checkpoint_every=20, **QUICK).fit()
    m = json.loads((out / "metrics.json").read_text())
    assert m["final_step"] == 40 and m["complete"]
    assert m["model_holds"] == "ema weights"
    assert 0.0 <= m["eval"]["accuracy"] <= 1.0 and "eval_ema" in m
    assert m["eval"]["num_examples"] == 450
    assert [r["step"] for r in m["history"]] == list(range(5, 45, 5))
    _assert_falls(_losses(m))
    assert sorted(os.listdir(out / "checkpoints")) == [
        "ckpt-20.npz", "ckpt-40.npz", "manifest.json"]
    # TensorBoard scalars, written without the tensorboard package.
    tags = {}
    for path in glob.glob(str(out / "logs" / "train" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                tags.setdefault(v.tag, []).append(
                    float(tf.make_ndarray(v.tensor)))
                assert v.metadata.plugin_data.plugin_name == "scalars"
    assert set(tags) >= {"loss", "accuracy", "learning_rate"}
    assert tags["loss"] == pytest.approx(_losses(m), abs=1e-5)
    assert glob.glob(str(out / "logs" / "eval_ema" / "events.*"))
    # model.keras holds the EMA weights, which differ from the raw ones.
    saved = keras.saving.load_model(out / "model.keras")
    for a, b in zip(saved.get_weights(), run.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fine_tune_a_zoo_name_at_a_higher_resolution(tmp_path):
    ckpt = official.write(tmp_path / "tiny1000.npz", official.vit_arrays(
        patch=8, hidden=32, layers=1, heads=2, mlp=64, grid=2,
        num_classes=1000))
    trainer = kt.Trainer(
        "ViT-Ti/8", "digits", weights=str(ckpt), image_size=32,
        model_options=dict(hidden_size=32, num_layers=1, num_heads=2,
                           mlp_dim=64),
        total_steps=3, warmup_steps=1, strategy="default", **QUICK)
    model = trainer.model
    assert trainer.image_size == 32
    # A new zero-initialised head for 10 classes, position embeddings of the
    # 2x2 checkpoint grid resized to 4x4 (+ class token).
    assert not model.get_layer("head").kernel.numpy().any()
    assert model.get_layer("head").kernel.shape == (32, 10)
    assert model.get_layer("position_embedding").pos_embedding.shape == (
        1, 17, 32)
    assert trainer.recipe.optimizer == "sgd"
    assert trainer.fit().metrics["final_step"] == 3
    # A trained ViT on a task with other classes: same body, new zero head.
    three = kt.ArraySource(np.zeros((40, 8, 8)), np.arange(40) % 3)
    trained = trainer.model
    again = kt.Trainer(trained, three, total_steps=2, warmup_steps=0,
                       strategy="default", **QUICK).model
    assert again.get_layer("head").kernel.shape == (32, 3)
    assert not again.get_layer("head").kernel.numpy().any()
    np.testing.assert_array_equal(
        again.get_layer("encoder_block_0").get_weights()[0],
        trained.get_layer("encoder_block_0").get_weights()[0])
    dense = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="has 10 outputs but the data has 3"):
        kt.Trainer(dense, three, total_steps=2, warmup_steps=0,
                   strategy="default", **QUICK)


@pytest.mark.backends
def test_compile_for_finetune_makes_model_fit_follow_the_recipe():
    model = tiny()
    r = kt.compile_for_finetune(model, total_steps=8, warmup_steps=2,
                                batch_size=32, micro_batch_size=16,
                                label_smoothing=0.1)
    opt = model.optimizer
    assert isinstance(opt, keras.optimizers.SGD)
    assert opt.momentum == 0.9 and opt.global_clipnorm == 1.0
    assert opt.gradient_accumulation_steps == 2
    ds = kt.dataset("digits", 16, r.micro_batch_size, crop_area=None)
    history = model.fit(ds, steps_per_epoch=16, epochs=1, verbose=0)
    # 16 micro-batches are 8 optimizer steps: the schedule (which Keras
    # drives with the micro-batch counter) has reached its end, not half-way.
    assert int(keras.ops.convert_to_numpy(opt.iterations)) == 8
    assert float(opt.learning_rate) == pytest.approx(0.0, abs=1e-9)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="pass steps_per_epoch"):
        kt.compile_for_finetune(tiny(), "pretrain")


def test_model_fit_never_runs_an_empty_epoch():
    # 160 images and the paper's batch of 512: drop_remainder would give
    # no batch at all, and model.fit an epoch that trains nothing.
    rng = np.random.default_rng(0)
    small = kt.load_data((rng.integers(0, 255, (160, 8, 8, 3), "uint8"),
                          np.arange(160) % 4))
    with pytest.raises(ValueError, match=r"batch_size=512 .*\(160 images.*"
                                         r"batch_size=160 or less"):
        kt.dataset(small, 16, 512)
    with pytest.raises(ValueError, match=r"batch_size=100 .*\(80 images in "
                                         r"each of 2 shards"):
        kt.dataset(small, 16, 100, shard=(2, 0))
    # Evaluation keeps the ragged batch: one batch of 160.
    (images, _), = kt.dataset(small, 16, 512, training=False)
    assert images.shape[0] == 160


def test_compile_for_finetune_checks_the_steps_memory(monkeypatch):
    from keras_vit.models import memory

    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    monkeypatch.setattr(memory, "available_memory", lambda: 2**20)
    with pytest.raises(ValueError, match=r"64 images .* GiB.*"
                                         r"micro_batch_size=.*check_memory"):
        kt.compile_for_finetune(tiny(), total_steps=4, warmup_steps=1,
                                batch_size=64)
    r = kt.compile_for_finetune(tiny(), total_steps=4, warmup_steps=1,
                                batch_size=64, check_memory=False)
    assert r.batch_size == 64


# --------------------------------------------------------------------------
# few-shot


@pytest.mark.backends
def test_fewshot_least_squares_matches_sklearn_ridge_classifier():
    from sklearn.linear_model import RidgeClassifier

    model = tiny()
    fn = few_shot.feature_function(model)
    train = kt.digits("train")
    y_tr = train.labels()
    # Features of the training images the draws below use (up to 25 a
    # class, seeds 0 and 1; kt.fewshot reads no others), rows in place.
    needed = np.unique(np.concatenate(
        [p[:25] for seed in (0, 1)
         for p in few_shot._class_orders(y_tr, 10, seed)]))
    x_needed, y_needed = few_shot.extract_features(
        fn, train.subset(needed), 16, verbose=False)
    x_te, y_te = few_shot.extract_features(fn, "digits:test", 16,
                                              verbose=False)
    assert x_needed.shape == (len(needed), 32) and x_te.shape == (450, 32)
    np.testing.assert_array_equal(y_needed, y_tr[needed])
    x_tr = np.full((len(y_tr), 32), np.nan)
    x_tr[needed] = x_needed
    x_te = x_te.astype("float64")
    np.testing.assert_array_equal(y_te, kt.digits("test").labels())
    orders = few_shot._class_orders(y_tr, 10, seed=0)
    for k in (1, 5, 25):  # 10 < 32 features (dual form) and 250 > 32
        idx = np.concatenate([o[:k] for o in orders])
        for l2 in (0.5, 1024.0):
            raw = few_shot.fit_least_squares(x_tr[idx], y_tr[idx], 10, l2,
                                                standardize=False)
            sk = RidgeClassifier(alpha=l2).fit(x_tr[idx], y_tr[idx])
            np.testing.assert_array_equal(few_shot.predict(raw, x_te),
                                          sk.predict(x_te))
            # Standardised features (the default): the same as sklearn on
            # features standardised with the k-shot set's statistics.
            mean = x_tr[idx].mean(0)
            std = x_tr[idx].std(0) + 1e-5
            std_sol = few_shot.fit_least_squares(x_tr[idx], y_tr[idx], 10,
                                                    l2)
            sk = RidgeClassifier(alpha=l2).fit((x_tr[idx] - mean) / std,
                                               y_tr[idx])
            np.testing.assert_array_equal(
                few_shot.predict(std_sol, x_te),
                sk.predict((x_te - mean) / std))
    result = kt.fewshot(model, "digits:train", "digits:test",
                        shots=(1, 5, 10, 25), num_seeds=2, verbose=False)
    for k in (1, 5, 10, 25):
        want = []
        for seed in (0, 1):
            o = few_shot._class_orders(y_tr, 10, seed)
            idx = np.concatenate([p[:k] for p in o])
            mean, std = x_tr[idx].mean(0), x_tr[idx].std(0) + 1e-5
            sk = RidgeClassifier(alpha=few_shot.L2_REG).fit(
                (x_tr[idx] - mean) / std, y_tr[idx])
            want.append(np.mean(sk.predict((x_te - mean) / std) == y_te))
        assert result["per_seed"][k] == pytest.approx(want, abs=1e-12)
    assert result["accuracy"][25] > result["accuracy"][1] > 0.1


# --------------------------------------------------------------------------
# command line


def test_cli_fine_tune_evaluate_fewshot(tmp_path, tiny_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["fine-tune", tiny_path, "--data", "digits", "--recipe",
                     "pretrain", "--steps", "30", "--batch-size", "32",
                     "--warmup-steps", "3", "--lr", "0.003", "--set",
                     "crop_area=none", "--set", "log_every=10", "--out",
                     str(out), "--strategy", "default", "-q",
                     "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["final_step"] == 30 and printed["eval_data"] == "digits:test"
    assert printed["recipe"]["optimizer"] == "adam"
    assert printed["recipe"]["learning_rate"] == 0.003
    assert cli.main(["evaluate", str(out), "--data", "digits",
                     "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["data"] == "digits:test" and ev["num_examples"] == 450
    assert ev["accuracy"] == pytest.approx(printed["eval"]["accuracy"])
    assert cli.main(["fewshot", str(out / "model.keras"), "--data", "digits",
                     "--shots", "1,5", "--seeds", "1"]) == 0
    text = capsys.readouterr().out
    assert "1-shot" in text and "5-shot" in text and "digits:test" in text
    # Resuming a finished run does no more steps.
    assert cli.main(["fine-tune", tiny_path, "--data", "digits", "--recipe",
                     "pretrain", "--steps", "30", "--batch-size", "32",
                     "--warmup-steps", "3", "--lr", "0.003", "--set",
                     "crop_area=none", "--out", str(out), "--strategy",
                     "default"]) == 0
    assert "resumed from step 30" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.backends
def test_cli_jobs_on_this_backend(tmp_path, tiny_path, capsys):
    # fine-tune -> evaluate -> fewshot, and pretrain, as a user runs them
    # under KERAS_BACKEND=tensorflow|jax|torch (few steps: the engines
    # themselves are tested in test_trainer_backends; batches of 32: the
    # evaluation after fine-tune runs in batches of the training's size).
    backend = keras.backend.backend()
    out = tmp_path / "run"
    assert cli.main(["fine-tune", tiny_path, "--data", "digits", "--steps",
                     "2", "--batch-size", "32", "--warmup-steps", "1",
                     "--image-size", "16", "--set", "crop_area=none",
                     "--out", str(out), "-q", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["final_step"] == 2 and printed["backend"] == backend
    assert cli.main(["evaluate", str(out), "--data", "digits",
                     "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["num_examples"] == 450
    assert ev["accuracy"] == pytest.approx(printed["eval"]["accuracy"])
    assert ev["loss"] == pytest.approx(printed["eval"]["loss"], rel=1e-5)
    assert cli.main(["fewshot", str(out), "--data", "digits:test",
                     "--eval-data", "digits:test",
                     "--shots", "2", "--seeds", "1", "--json"]) == 0
    few = json.loads(capsys.readouterr().out)
    assert (few["num_test"], few["feature_dim"]) == (450, 32)
    assert list(few["accuracy"]) == ["2"] and len(few["per_seed"]["2"]) == 1
    assert cli.main(["pretrain", tiny_path, "--data", "digits", "--steps",
                     "2", "--batch-size", "16", "--warmup-steps", "1",
                     "--image-size", "16", "--out", str(tmp_path / "pre"),
                     "-q", "--json"]) == 0
    pre = json.loads(capsys.readouterr().out)
    assert pre["final_step"] == 2 and pre["backend"] == backend
    assert pre["recipe"]["name"] == "mpp" and np.isfinite(pre["train_loss"])
    # What this backend cannot run: one line naming it and the way out.
    name = "data_parallel" if backend != "jax" else "mirrored"
    for argv in (["evaluate", str(out), "--data", "digits"],
                 ["fine-tune", tiny_path, "--data", "digits"],
                 ["pretrain", tiny_path, "--data", "digits"]):
        assert cli.main(argv + ["--strategy", name]) == 2, argv
        lines = _error_lines(capsys.readouterr().err)
        assert len(lines) == 1, (argv, lines)
        assert f"strategy={name!r}" in lines[0] and (
            f"'{backend}'" in lines[0]) and "KERAS_BACKEND=" in lines[0]


def test_fine_tune_on_a_folder_holds_out_a_tenth_for_evaluation(
        tmp_path, tiny_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(("cat", "dog", "fox")):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(10 + 5 * c):  # 10, 15, 20 images
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), "uint8")).save(
                tmp_path / "data" / name / f"{i}.png")
    out = tmp_path / "run"
    argv = ["fine-tune", tiny_path, "--data", str(tmp_path / "data"),
            "--steps", "2", "--warmup-steps", "0", "--batch-size", "8",
            "--strategy", "default", "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    assert "holding out 10% of" in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    # A tenth of each class, rounded, at least one: 1 + 2 + 2 (the same
    # images on every run: a resumed run evaluates on the same ones).
    assert m["eval"]["num_examples"] == 5
    assert m["epochs_seen"] == pytest.approx(2 * 8 / 40, abs=1e-3)
    # --no-eval still trains on all of it.
    assert cli.main(argv[:-2] + ["--no-eval", "--out",
                                 str(tmp_path / "all")]) == 0
    m = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert "eval" not in m
    assert m["epochs_seen"] == pytest.approx(2 * 8 / 45, abs=1e-3)


def test_cli_errors_are_one_line(tmp_path, tiny_path, capsys):
    cases = [
        (["fine-tune", tiny_path, "--data", str(tmp_path / "missing")],
         "missing"),
        (["fine-tune", tiny_path, "--data", "tfds:no_such_dataset_x"],
         "Unknown tfds dataset"),
        (["fine-tune", tiny_path, "--data", "digits", "--recipe", "fast"],
         "Unknown recipe='fast'"),
        (["fine-tune", tiny_path, "--data", "digits", "--set", "lr=1"],
         "unknown recipe field(s) ['lr']"),
        (["fine-tune", tiny_path, "--data", "digits", "--batch-size", "4096",
          "--strategy", "default", "--out", str(tmp_path / "r")],
         "batch_size=4096 is larger than the training data"),
        (["evaluate", str(tmp_path), "--data", "digits"],
         "without model.keras"),
        (["fewshot", tiny_path, "--data", str(tmp_path)],
         "--eval-data is needed"),
        (["fewshot", tiny_path, "--data", "digits:test"],
         "pass the training split (e.g. digits:train) as --data"),
    ]
    for argv, needle in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = _error_lines(err)
        assert len(lines) == 1 and needle in lines[0], (argv, err)
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "fine-tune" in text and "fewshot" in text


# --------------------------------------------------------------------------
# several workers, Ctrl-C (subprocesses)


def _train_command(model_path, out, steps, *extra):
    return [sys.executable, "-m", "keras_vit.train", "fine-tune", model_path,
            "--data", "digits", "--recipe", "pretrain", "--steps", str(steps),
            "--batch-size", "32", "--warmup-steps", "3", "--lr", "0.003",
            "--set", "crop_area=none", "--set", "log_every=5",
            "--out", str(out), *extra]


# worker.py MODEL TOTAL RUN...: one worker of a two-worker job in each run
# folder RUN in turn (from its last checkpoint, if it has one); "hold:STEP"
# among them holds the runs after it at STEP (HOLD).
MULTI_WORKER_SCRIPT = HOLD + textwrap.dedent("""
    import json, sys
    import numpy as np, keras
    import keras_vit.train as kt
    from keras_vit.runtime import compat

    model, total = sys.argv[1], int(sys.argv[2])
    # strategy="auto" reads TF_CONFIG; made once, as a worker's server
    # starts once, and handed to each run.
    strategy = kt.strategy("auto")
    # Keras' own reduction of a scalar log still fails on two workers (it
    # averages over axis 0): the day it does not, the repair can go.
    broken = compat.multi_worker_fit_is_broken(strategy)
    if kt.describe(strategy)["is_chief"]:
        print("RESULT " + json.dumps({"broken": broken}), flush=True)
    for out in sys.argv[3:]:
        if out.startswith("hold:"):
            hold(int(out[len("hold:"):]))
            continue
        keras.utils.set_random_seed(1)
        trainer = kt.Trainer(model, "digits", "digits:test",
                             recipe="pretrain", total_steps=total,
                             batch_size=32, warmup_steps=3,
                             learning_rate=3e-3, crop_area=None, log_every=5,
                             checkpoint_every=10, strategy=strategy,
                             out_dir=out, verbose=True)
        run = trainer.fit()
        if trainer.is_chief:
            np.savez(out + "/final.npz", *run.model.get_weights())
""")


def _start_workers(script, args, tmp_path):
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(TF_CONFIG=json.dumps({
            "cluster": cluster, "task": {"type": "worker", "index": i}})),
        cwd=tmp_path, start_new_session=True) for i in range(2)]


@pytest.mark.slow
def test_two_workers_killed_and_restarted_end_at_the_uninterrupted_weights(
        tmp_path, tiny_path):
    from keras_vit.train import checkpoints

    script = tmp_path / "worker.py"
    script.write_text(MULTI_WORKER_SCRIPT)
    total, held = 30, 15
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # The job, uninterrupted; then the same job in the same workers, its
    # second worker killed after step 15 (past the checkpoint of step 10).
    # The chief cannot go on without it and is stopped too.
    procs = _start_workers(script, (tiny_path, total, whole, f"hold:{held}",
                                    killed), tmp_path)
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    try:
        while not logged(killed, held):
            assert all(p.poll() is None for p in procs), \
                procs[0].communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no step {held} in time"
            time.sleep(0.05)
        os.kill(procs[1].pid, 9)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        out = procs[0].communicate()[0]
        procs[1].communicate()
    result = json.loads(out.split("RESULT ", 1)[1].split("\n", 1)[0])
    assert result["broken"] is True
    m = json.loads((whole / "metrics.json").read_text())
    assert m["strategy"]["name"] == "multi_worker"
    assert m["strategy"]["workers"] == 2 and m["strategy"]["replicas"] == 2
    assert m["strategy"]["is_chief"] and m["final_step"] == total
    _assert_falls(_losses(m))
    assert m["eval"]["num_examples"] == 450
    # The chief writes the checkpoints; the other worker holds the same
    # values and writes nothing.
    assert sorted(os.listdir(whole / "checkpoints")) == [
        "ckpt-10.npz", "ckpt-20.npz", "ckpt-30.npz", "manifest.json"]
    saved = checkpoints.latest(str(killed / "checkpoints"))[0]
    assert saved == 10 and not (killed / "metrics.json").exists()
    # The killed job, restarted in new workers.
    finish_together(_start_workers(script, (tiny_path, total, killed),
                                   tmp_path))
    again = json.loads((killed / "metrics.json").read_text())
    assert again["resumed_from_step"] == saved
    assert again["final_step"] == total and again["complete"]
    steps = [row["step"] for row in again["history"]]
    assert steps == list(range(5, total + 5, 5))  # none lost or repeated
    with np.load(whole / "final.npz") as a, \
            np.load(killed / "final.npz") as b:
        for key in a.files:
            np.testing.assert_allclose(a[key], b[key], atol=1e-6)


def test_the_summary_line_is_not_glued_to_a_progress_bar(
        tmp_path, tiny_path, monkeypatch):
    import io

    # Both streams into one buffer, in the order they are written (what a
    # log file or CI keeps, "\r" included). Batches of 8: the evaluation
    # of 450 images draws its bar; the summary comes right after it.
    merged = io.StringIO()
    monkeypatch.setattr(sys, "stdout", merged)
    monkeypatch.setattr(sys, "stderr", merged)
    command = _train_command(tiny_path, tmp_path / "run", 2, "--strategy",
                             "default", "--warmup-steps", "0")
    command[command.index("--batch-size") + 1] = "8"
    assert cli.main(command[3:]) == 0, merged.getvalue()[-3000:]
    out = merged.getvalue()
    assert "evaluate:" in out  # the bar was drawn
    (line,) = [line for line in out.split("\n") if "done:" in line]
    assert line.startswith("done: step 2"), repr(line)


@pytest.mark.slow
def test_ctrl_c_saves_the_current_step_and_prints_the_resume_command(
        tmp_path, tiny_path, capsys):
    import shlex
    import signal

    out = tmp_path / "run"
    # 200 steps: far more than the test waits for, fewer than the
    # recipe's checkpoint_every (1000), and not many more (the input
    # pipeline is built for every step of the run: 6 s of CPU for 5000).
    # No evaluation: what is checked is the stop and the resume.
    total = 200
    command = _train_command(tiny_path, out, total, "--strategy", "default",
                             "--no-eval", "--restart")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(),
                            cwd=tmp_path)
    history = out / "history.jsonl"
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    try:
        # Some steps logged: well past the start, far from checkpoint_every.
        while not (history.exists() and len(
                history.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no progress in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr[-3000:]
    assert took < 15, took
    step = int(re.search(rf"interrupted at step (\d+) of {total}",
                         stderr)[1])
    assert 10 <= step < total
    from keras_vit.train import checkpoints

    # This step's checkpoint, not step 0's or the last checkpoint_every's.
    assert checkpoints.latest(str(out / "checkpoints"))[0] == step
    # The command printed resumes; it drops --restart, which would delete
    # the checkpoint.
    resume = shlex.split(stderr.split("Resume with:")[1].strip())
    assert resume[:3] == ["python", "-m", "keras_vit.train"]
    assert resume[3:] == command[3:-1] and "--restart" not in resume
    # (Run here, with fewer steps: the total may change on a resume.)
    resume[resume.index("--steps") + 1] = str(step + 5)
    assert cli.main(resume[3:]) == 0
    assert f"resumed from step {step} " in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed_from_step"] == step and m["final_step"] == step + 5


def test_a_second_ctrl_c_exits_at_once(monkeypatch, capsys):
    import signal

    from keras_vit.train.interrupt import StopOnInterrupt

    def exit_now(code):  # os._exit, which would end pytest too
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    with StopOnInterrupt() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested  # the first: stop after this step
        with pytest.raises(SystemExit) as e:
            signal.raise_signal(signal.SIGINT)
    assert e.value.code == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    err = capsys.readouterr().err
    assert "saving a checkpoint after this step" in err
    assert "exiting now, without saving" in err


def test_a_failed_run_gives_ctrl_c_back(tmp_path, monkeypatch):
    """Keras calls no ``on_train_end`` when ``fit`` raises: the run's Ctrl-C
    handler (whose second Ctrl-C ends the process at once) must not
    outlive the run, or the user's next Ctrl-C in that Python would not
    interrupt and the one after would kill it."""
    import signal

    from keras_vit.train import callbacks, loop

    class FailMidRun(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("failed mid-run")

    real = loop._callbacks
    made = []

    def failing(*args, **kwargs):
        callbacks, *rest = real(*args, **kwargs)
        made.extend(callbacks)
        return (callbacks + [FailMidRun()], *rest)

    monkeypatch.setattr(loop, "_callbacks", failing)
    before = signal.getsignal(signal.SIGINT)
    trainer = kt.Trainer(tiny(), "digits", total_steps=3, warmup_steps=1,
                         out_dir=str(tmp_path / "run"), **QUICK)
    with pytest.raises(RuntimeError, match="failed mid-run"):
        trainer.fit()
    assert signal.getsignal(signal.SIGINT) is before
    # and its progress bar is closed (tqdm's monitor thread and the
    # bar's line do not outlive it either)
    logs = [c for c in made if isinstance(c, callbacks.StepLog)]
    assert logs and all(c._bar is None for c in logs)
