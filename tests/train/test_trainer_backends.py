"""The Trainer (``model.fit`` with the recipe's optimizer options and the
callbacks of keras_vit.train.callbacks) on every Keras backend: under
TensorFlow (tf.distribute), JAX (one device, keras.distribution
DataParallel or ModelParallel) and torch.

The tests marked `backends` run once per backend (tests/conftest.py). The
reference for a run is Keras' own loop on the same backend
(``compile_for_finetune`` + ``train_on_batch`` on the same batches), and
the hand computations are written in NumPy. Several devices and killed runs
happen in subprocesses.
"""

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import keras
import keras_vit
from keras import ops
from keras_vit import cli
from keras_vit import train as kt
from keras_vit.train import checkpoints
from keras_vit.train.placement import Placement
from keras_vit.train.run_dir import append_jsonl

from conftest import quick_xla_flags, two_jax_cpu_devices_flags

SUBPROCESS_TIMEOUT = 300
TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
QUICK = dict(batch_size=32, crop_area=None, log_every=1, verbose=False,
             strategy="default")


def tiny(seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


def _weights(model):
    return [ops.convert_to_numpy(v) for v in model.trainable_variables]


def _env(**extra):
    env = dict(os.environ, KERAS_VIT_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def kill_once(command, ready, *, env, cwd=None):
    """Starts ``command``, waits until ``ready()`` (the run past a
    checkpoint), and kills it with SIGKILL mid-run; fails if it ends or
    stalls first."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True)
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    try:
        while not ready():
            assert proc.poll() is None, "the run ended before a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # mid-epoch, mid-run
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL


# Prepended to the scripts of killed runs: ``hold(step)`` makes every
# Trainer's input run dry after optimizer step ``step``, so that the run
# waits there, mid-fit, past its last checkpoint and with rows logged after
# it, until the test's kill -9 (the kill needs no race against the run's
# last steps, and the runs can be short).
HOLD = textwrap.dedent("""
    def hold(step):
        import threading
        import tensorflow as tf
        import keras_vit.train as kt

        feed = kt.Trainer.training_batches

        def held(self, dataset, first_step, shard):
            dataset = feed(self, dataset, first_step, shard)

            def never():
                threading.Event().wait()
                yield

            dry = tf.data.Dataset.from_generator(
                never, output_signature=dataset.element_spec)
            return dataset.take((step - first_step) * self.accum
                                ).concatenate(dry)

        kt.Trainer.training_batches = held
""")


def logged(out, step):
    """Whether the run in ``out`` has logged the row of ``step`` (its
    checkpoints up to ``step`` are written by then)."""
    try:
        lines = (out / "history.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            if json.loads(line)["step"] == step:
                return True
        except ValueError:  # the last line, still being written
            pass
    return False


def held_cli(argv, step):
    """The command of ``python -m keras_vit.train *argv`` whose input runs
    dry after ``step`` (HOLD)."""
    return [sys.executable, "-c", HOLD + textwrap.dedent(f"""
        hold({step})
        import runpy
        runpy.run_module("keras_vit.train", run_name="__main__",
                         alter_sys=True)
    """), *argv]


def finish_together(procs):
    """``[(stdout, stderr)]`` of processes that work together (workers of
    one job), each asserted to end well; all are killed if one stalls."""
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=SUBPROCESS_TIMEOUT))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    return outputs


# --------------------------------------------------------------------------
# numerics on each backend


@pytest.mark.backends
def test_a_run_equals_keras_own_loop_on_the_same_batches():
    kw = dict(recipe="finetune", total_steps=4, warmup_steps=1,
              learning_rate=0.05, grad_clip_norm=1.0, batch_size=32,
              crop_area=None)
    run = kt.Trainer(tiny(), "digits", **dict(QUICK, **kw))
    r = run.recipe
    assert run.info["backend"] == keras.backend.backend()
    run = run.fit()
    # The reference: Keras' own train step with the recipe's optimizer,
    # schedule and clipping (compile_for_finetune), fed the batches the
    # Trainer's pipeline yields for epoch 0.
    ref = tiny()
    kt.compile_for_finetune(ref, **kw)
    batches = kt.dataset("digits", 16, 32, training=True, seed=r.seed,
                         epoch=0, crop_area=None, flip=r.flip)
    losses, rates = [], []
    for images, labels in batches.take(4).as_numpy_iterator():
        ref.reset_metrics()  # the loss of this batch, not a running mean
        logs = ref.train_on_batch(images, labels, return_dict=True)
        losses.append(float(logs["loss"]))
        rates.append(float(ops.convert_to_numpy(ref.optimizer.learning_rate)))
    got = [row["loss"] for row in run.metrics["history"]]
    assert [row["step"] for row in run.metrics["history"]] == [1, 2, 3, 4]
    np.testing.assert_allclose(got, losses, rtol=1e-4, atol=1e-5)
    # The logged rate is the one the optimizer holds after each step.
    np.testing.assert_allclose(
        [row["learning_rate"] for row in run.metrics["history"]], rates,
        rtol=1e-6)
    assert len(set(rates)) > 1  # warm-up then decay: the rows differ
    for a, b in zip(_weights(run.model), _weights(ref)):
        np.testing.assert_allclose(a, b, atol=2e-5)
    assert run.metrics["history"][-1]["loss"] < 2.3


# Three Adam steps of 32 images, the run the accumulation tests share.
THREE_STEPS = dict(QUICK, recipe="pretrain", total_steps=3, warmup_steps=1,
                   learning_rate=1e-2)


@pytest.fixture(scope="module")
def in_micro_batches():
    """THREE_STEPS in two micro-batches of 16 a step, stopped after each
    step: ``(its Trainer, the trainable weights after each step, the loss
    logged for each step)``."""
    trainer = kt.Trainer(tiny(), "digits", micro_batch_size=16,
                         **THREE_STEPS)
    weights, losses = [], []
    for t in (1, 2, 3):
        run = trainer.fit(stop_at_step=t)
        weights.append(_weights(run.model))
        losses += [row["loss"] for row in run.metrics["history"]]
    return trainer, weights, losses


@pytest.mark.backends
def test_two_micro_batches_equal_one_full_batch(in_micro_batches):
    full = kt.Trainer(tiny(), "digits", **THREE_STEPS).fit()
    accumulated, weights, losses = in_micro_batches
    assert accumulated.accum == 2
    for a, b in zip(_weights(full.model), weights[-1], strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)  # Adam: m / sqrt(v)
    np.testing.assert_allclose(
        [row["loss"] for row in full.metrics["history"]], losses, atol=1e-5)


@pytest.mark.backends
def test_clipping_scales_the_summed_gradient_to_the_global_norm():
    # SGD's first step moves the weights by lr * gradient: with a clip far
    # below the gradient's norm the step is exactly lr * clip long.
    clip = 1e-3
    tr = kt.Trainer(tiny(), "digits", recipe="finetune", total_steps=2,
                    warmup_steps=1, learning_rate=0.5, grad_clip_norm=clip,
                    micro_batch_size=16, **QUICK)
    lr = float(ops.convert_to_numpy(tr.optimizer.learning_rate))
    before = _weights(tr.model)
    tr.fit(stop_at_step=1)
    moved = np.sqrt(sum(((a - b) ** 2).sum()
                        for a, b in zip(_weights(tr.model), before)))
    assert moved == pytest.approx(lr * clip, rel=1e-3)


@pytest.mark.backends
def test_ema_moves_once_per_optimizer_step_with_accumulation(
        in_micro_batches):
    # Keras' EMA (use_ema, ema_momentum) with two micro-batches a step:
    # the average of the weights after each step, e1 = w1 (a copy), then
    # e = m * e + (1 - m) * w; Keras alone would average every micro-batch.
    # (m's horizon, 1 / (1 - m) steps, fits half of the three-step run.)
    m = 0.3
    _, steps, _ = in_micro_batches
    ema = steps[0]
    for w in steps[1:]:
        ema = [m * e + (1.0 - m) * v for e, v in zip(ema, w)]
    averaged = kt.Trainer(tiny(), "digits", ema_decay=m,
                          micro_batch_size=16, **THREE_STEPS)
    assert averaged.optimizer.use_ema and averaged.accum == 2
    stopped = averaged.fit(stop_at_step=2)
    # A run stopped early keeps training its own weights, not the average.
    for a, b in zip(_weights(stopped.model), steps[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    result = averaged.fit()  # the end: the model holds the EMA weights
    assert result.metrics["final_step"] == 3
    for got, want in zip(_weights(result.model), ema):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ema[0], steps[2][0])  # the average lags


@pytest.mark.slow  # three runs, each compiled: about 30 s on jax
@pytest.mark.backends
def test_resume_mid_epoch_with_dropout_equals_an_uninterrupted_run(tmp_path):
    # Dropout draws from seed generators whose states are checkpointed.
    kw = dict(QUICK, recipe="finetune", total_steps=8, warmup_steps=2,
              learning_rate=0.05, ema_decay=0.5, checkpoint_every=3,
              batch_size=32, log_every=2)  # EMA's horizon fits 8 steps
    whole = kt.Trainer(tiny(dropout_rate=0.1), "digits",
                       out_dir=tmp_path / "a", **kw).fit()
    kt.Trainer(tiny(dropout_rate=0.1), "digits", out_dir=tmp_path / "b",
               **kw).fit(stop_at_step=5)  # mid-epoch
    again = kt.Trainer(tiny(seed=7, dropout_rate=0.1), "digits",
                       out_dir=tmp_path / "b", **kw)
    assert again.resumed_from == 5
    rest = again.fit()
    assert rest.metrics["final_step"] == 8
    for a, b in zip(whole.model.get_weights(), rest.model.get_weights()):
        np.testing.assert_array_equal(a, b)

    # Rows over the same steps agree (the stopped run also logged step 5).
    def rows(run):
        return {r["step"]: r["loss"] for r in run.metrics["history"]
                if r["step"] in (2, 4, 8)}

    assert sorted(rows(whole)) == sorted(rows(rest)) == [2, 4, 8]
    np.testing.assert_allclose([rows(whole)[k] for k in (2, 4, 8)],
                               [rows(rest)[k] for k in (2, 4, 8)], atol=1e-4)


# --------------------------------------------------------------------------
# checkpoints; the history log


def test_a_killed_checkpoint_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    folder = str(tmp_path)
    checkpoints.save(folder, 5, {"model": [np.ones(3, "float32")]},
                     {"epoch": 0, "batch_in_epoch": 5})

    def dies_mid_write(path, **arrays):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(np, "savez", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(folder, 10, {"model": [np.zeros(3, "float32")]},
                         {"epoch": 0, "batch_in_epoch": 10})
    monkeypatch.undo()
    # A process killed outright leaves its temporary file behind.
    (tmp_path / ".ckpt-10.npz.123.abcd.partial.npz").write_bytes(b"PK\x03")
    assert checkpoints.steps(folder) == [5]
    step, path = checkpoints.latest(folder)
    groups, meta = checkpoints.load(path, {"model": [((3,), "float32")]})
    assert step == 5 and meta["step"] == 5 and groups["model"][0].sum() == 3


def test_a_checkpoint_is_checked_whole_before_anything_is_assigned(tmp_path):
    expected = {"model": [((2, 2), "float32"), ((3,), "float32")],
                "ema": [((2, 2), "float32")]}
    checkpoints.save(str(tmp_path), 1, {"model": [np.ones((2, 3), "float32"),
                                                  np.ones(3, "int32")]},
                     {"epoch": 0, "batch_in_epoch": 1})
    with pytest.raises(ValueError) as e:
        checkpoints.load(checkpoints.path_for(str(tmp_path), 1), expected)
    text = str(e.value)
    assert "model/00000: shape (2, 3) in the file, (2, 2) in this run" in text
    assert "model/00001: dtype int32 in the file, float32" in text
    assert "ema: 0 arrays in the file, 1 in this run" in text
    bad = tmp_path / "ckpt-2.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="cannot be read"):
        checkpoints.load(str(bad), expected)


@pytest.mark.backends
def test_a_checkpoint_of_another_model_is_refused_before_assigning(tmp_path):
    kw = dict(QUICK, recipe="pretrain", total_steps=2, warmup_steps=1)
    kt.Trainer(tiny(), "digits", out_dir=tmp_path, **kw).fit()
    other = tiny(mlp_dim=48)
    before = other.get_weights()
    with pytest.raises(ValueError, match="does not fit this"):
        kt.Trainer(other, "digits", out_dir=tmp_path, **kw)
    for a, b in zip(before, other.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_history_line_cut_by_a_kill_is_dropped_not_glued(tmp_path):
    path = str(tmp_path / "history.jsonl")
    append_jsonl(path, {"step": 1, "loss": 2.0})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 2, "loss": 1.9')  # the kill, mid-line
    append_jsonl(path, {"step": 2, "loss": 1.8})
    append_jsonl(path, {"step": 3, "loss": 1.7})
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.8},
                    {"step": 3, "loss": 1.7}]
    # A file holding only a cut line.
    only = str(tmp_path / "only.jsonl")
    with open(only, "w", encoding="utf-8") as f:
        f.write('{"st')
    append_jsonl(only, {"step": 1})
    assert open(only, encoding="utf-8").read() == '{"step": 1}\n'


@pytest.mark.backends
def test_strategy_names_per_backend():
    backend = keras.backend.backend()
    if backend == "tensorflow":
        assert Placement("default").info["name"] == "default"
        return
    assert Placement("auto").info["backend"] == backend
    if backend == "jax":
        e = Placement("data_parallel")
        assert e.info["name"] == "data_parallel"
        assert e.replicas == len(keras.distribution.list_devices())
    else:
        with pytest.raises(kt.StrategyError,
                           match="runs on the 'jax' Keras backend"):
            kt.Trainer(tiny(), "digits",
                       **dict(QUICK, strategy="data_parallel"))
    with pytest.raises(kt.StrategyError, match="KERAS_BACKEND=tensorflow"):
        kt.Trainer(tiny(), "digits", **dict(QUICK, strategy="mirrored"))


# --------------------------------------------------------------------------
# two simulated devices (TensorFlow, JAX) and killed runs (every backend)


# Two logical CPUs under TensorFlow (MirroredStrategy): a run of 40 steps,
# its first 8 next to the same 8 steps on one device, a batch the replicas
# cannot share; then what configure_cpu_devices says once TensorFlow runs.
MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import keras_vit.train as kt
    kt.configure_cpu_devices(2)   # before TensorFlow starts
    import numpy as np, keras, keras_vit, tensorflow as tf

    def tiny():
        keras.utils.set_random_seed(1)
        return keras_vit.vit(16, 4, 32, 1, 2, 64, 10)

    kw = dict(recipe="finetune", batch_size=32, micro_batch_size=8,
              learning_rate=0.1, warmup_steps=3, crop_area=None,
              log_every=5, verbose=False, total_steps=40)
    out = {}
    two = kt.Trainer(tiny(), "digits", "digits:test", strategy="mirrored",
                     out_dir=sys.argv[1], **kw)
    # Its first 8 steps, and the same 8 steps on one device: the
    # cross-replica sum must equal the single-device gradient (a double
    # sum or a per-replica clip would not).
    a = two.fit(stop_at_step=8).model.get_weights()
    b = kt.Trainer(tiny(), "digits", strategy="default",
                   **kw).fit(stop_at_step=8).model.get_weights()
    out["max_diff"] = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    out["metrics"] = two.fit().metrics
    try:
        kt.Trainer(tiny(), "digits", strategy="mirrored",
                   **dict(kw, batch_size=33, micro_batch_size=None))
    except ValueError as e:
        out["error"] = str(e)
    devices = out["cpu_devices"] = {
        "devices": len(tf.config.list_logical_devices("CPU"))}
    try:
        kt.configure_cpu_devices(2)  # the same again: fine
        kt.configure_cpu_devices(3)  # too late
    except kt.StrategyError as e:
        devices["error"] = str(e)
    print("RESULT " + json.dumps(out, default=str))
""")


def run_script(path, *args, **env):
    """The RESULT dict that the script at ``path`` prints, run with
    ``args`` and ``env`` (on top of this process's environment)."""
    proc = subprocess.run(
        [sys.executable, str(path), *map(str, args)], capture_output=True,
        text=True, timeout=SUBPROCESS_TIMEOUT, env=_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def mirrored_run(tmp_path_factory):
    """The RESULT dict of MIRRORED_SCRIPT (run once, for the tests that
    read it) and the run folder it wrote."""
    folder = tmp_path_factory.mktemp("mirrored")
    script = folder / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    return dict(run_script(script, folder / "run",
                           KERAS_BACKEND="tensorflow"), out=folder / "run")


@pytest.mark.slow
def test_mirrored_strategy_on_two_logical_cpus(mirrored_run):
    out = mirrored_run
    m = out["metrics"]
    assert m["strategy"]["name"] == "mirrored"
    assert m["strategy"]["replicas"] == 2 and m["accumulation_steps"] == 2
    assert m["final_step"] == 40 and m["eval"]["num_examples"] == 450
    losses = [row["loss"] for row in m["history"]]
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.05, losses
    assert out["max_diff"] < 1e-5
    assert "batch_size=33 is not divisible by the 2 replicas" in out["error"]
    assert os.path.isfile(out["out"] / "model.keras")


# One jax process seeing two simulated CPU devices runs the same 6 steps
# on one device, data parallel and model parallel (stopped after step 3
# and resumed by a new Trainer), and reports each parallel run (``two``)
# next to the one-device run (``one``), whose weights it saves for the
# two-process test. Every run makes a step of 32 images in two
# micro-batches: of 16 on one device, of 8 on each of two (data
# parallel), of 16 split by weights (model parallel).
TWO_DEVICE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, jax, keras, keras_vit
    import keras_vit.train as kt
    from keras_vit.train.placement import Placement

    def tiny():
        keras.utils.set_random_seed(1)
        return keras_vit.vit(16, 4, 32, 1, 2, 64, 10)

    def compare(two, one):
        return {
            "accumulation": two.metrics["accumulation_steps"],
            "losses": [[r["loss"] for r in m.metrics["history"]]
                       for m in (two, one)],
            "eval": two.metrics["eval"]["num_examples"],
            "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(
                two.model.get_weights(), one.model.get_weights()))}

    kw = dict(recipe="pretrain", batch_size=32, learning_rate=3e-3,
              warmup_steps=2, crop_area=None, log_every=1, total_steps=6,
              verbose=False)
    one = kt.Trainer(tiny(), "digits", strategy="default",
                     micro_batch_size=16, **kw).fit()
    np.savez(sys.argv[2], *one.model.get_weights())
    data = kt.Trainer(tiny(), "digits", "digits:test",
                      strategy="data_parallel", micro_batch_size=8,
                      **kw).fit()
    # What a Trainer's strategy="auto" resolves to (its Placement's name).
    auto = Placement("auto").info["name"]

    out = sys.argv[1]
    first = kt.Trainer(tiny(), "digits", model_parallel=2, out_dir=out,
                       micro_batch_size=16, **kw)
    first.fit(stop_at_step=3)
    spec = lambda v: [str(a) for a in v.value.sharding.spec]
    kernel = next(v for v in first.model.trainable_variables
                  if v.path == "encoder_block_0/mlp/dense_0/kernel")
    slots = [v for v in first.optimizer.variables if v.name.startswith(
        "encoder_block_0_mlp_dense_0_kernel_")]
    again = kt.Trainer(tiny(), "digits", "digits:test", model_parallel=2,
                       out_dir=out, micro_batch_size=16, **kw)
    model = again.fit()
    print("RESULT " + json.dumps({
        "one": {"losses": [r["loss"] for r in one.metrics["history"]],
                "weights": sys.argv[2]},
        "data_parallel": {
            "devices": jax.device_count(), "auto": auto,
            "replicas": data.metrics["strategy"]["replicas"],
            **compare(data, one)},
        "model_parallel": {
            "info": again.info, "resumed": again.resumed_from,
            "kernel_spec": spec(kernel),
            "slot_specs": [spec(v) for v in slots],
            **compare(model, one)}}))
""")


@pytest.fixture(scope="module")
def two_jax_devices(tmp_path_factory):
    """The RESULT dict of TWO_DEVICE_SCRIPT, run once for the tests that
    read it (one process: one start of jax, one one-device run)."""
    folder = tmp_path_factory.mktemp("two_devices")
    path = folder / "two_devices.py"
    path.write_text(TWO_DEVICE_SCRIPT)
    return run_script(path, folder / "run", folder / "one.npz",
                      KERAS_BACKEND="jax",
                      XLA_FLAGS=two_jax_cpu_devices_flags())


@pytest.mark.slow
def test_jax_data_parallel_on_two_devices_equals_one_device(two_jax_devices):
    out = two_jax_devices["data_parallel"]
    assert out["devices"] == 2 and out["auto"] == "data_parallel"
    assert out["replicas"] == 2 and out["accumulation"] == 2
    two, one = out["losses"]
    assert len(two) == 6
    np.testing.assert_allclose(two, one, atol=1e-5)
    assert out["max_diff"] < 1e-5 and out["eval"] == 450


# JAX's CPU devices (TensorFlow's: MIRRORED_SCRIPT).
CPU_DEVICES_SCRIPT = textwrap.dedent("""
    import json
    import keras
    from keras_vit import train as kt

    out = {}
    try:
        kt.configure_cpu_devices(2)  # before the backend makes its devices
        import jax, keras_vit
        keras_vit.vit(16, 4, 32, 1, 2, 64, 10)(keras.ops.zeros((1, 16, 16, 3)))
        out["devices"] = len(jax.devices())
        kt.configure_cpu_devices(2)  # the same again: fine
        kt.configure_cpu_devices(3)  # too late
    except kt.StrategyError as e:
        out["error"] = str(e)
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.backends
def test_cpu_devices_on_this_backend(tmp_path, request):
    backend = keras.backend.backend()
    if backend == "torch":
        # One device: asking for two is refused at once, whether torch
        # has started or not (here it has), so this process can ask.
        with pytest.raises(kt.StrategyError) as refused:
            kt.configure_cpu_devices(2)
        assert "cpu_devices=2 splits the CPU" in str(refused.value)
        assert "KERAS_BACKEND=jax" in str(refused.value)
        return
    if backend == "tensorflow":
        out = request.getfixturevalue("mirrored_run")["cpu_devices"]
    else:
        path = tmp_path / "cpu_devices.py"
        path.write_text(CPU_DEVICES_SCRIPT)
        out = run_script(path, KERAS_BACKEND=backend)
    assert out["devices"] == 2
    assert out["error"].startswith(
        f"cpu_devices=3 must be configured before the '{backend}' backend")


@pytest.mark.backends
def test_model_parallel_is_refused_clearly_where_it_cannot_run():
    backend = keras.backend.backend()
    if backend == "jax":
        # One device here (tests/conftest.py); two in the test below.
        with pytest.raises(ValueError, match="does not divide the 1 devices"):
            kt.Trainer(tiny(), "digits", model_parallel=2,
                       **dict(QUICK, strategy="auto"))
        with pytest.raises(ValueError, match="leave strategy='auto'"):
            kt.Trainer(tiny(), "digits", model_parallel=2, **QUICK)
        return
    hint = {"tensorflow": "tf.distribute strategy",
            "torch": "runs on one device"}[backend]
    with pytest.raises(kt.StrategyError,
                       match=f"'jax' Keras backend; under '{backend}'.*{hint}"):
        kt.Trainer(tiny(), "digits", model_parallel=2,
                   **dict(QUICK, strategy="auto"))


@pytest.mark.slow
def test_jax_model_parallel_on_two_devices_equals_one_device(
        two_jax_devices):
    out = two_jax_devices["model_parallel"]
    assert out["info"]["name"] == "model_parallel"
    assert out["info"]["model_parallel"] == 2
    assert out["info"]["replicas"] == 1 and out["accumulation"] == 2
    assert out["resumed"] == 3
    # The MLP's first kernel is split on its output (Megatron), and so are
    # its Adam slots and its gradient accumulator; the run still equals one
    # device's.
    assert out["kernel_spec"] == ["None", "model"]
    assert len(out["slot_specs"]) == 3
    assert all(s == ["None", "model"] for s in out["slot_specs"])
    two, one = out["losses"]
    assert len(two) == 6
    np.testing.assert_allclose(two, one, atol=1e-5)
    assert out["max_diff"] < 1e-5 and out["eval"] == 450


TWO_PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras
    keras.distribution.initialize(f"127.0.0.1:{sys.argv[1]}",
                                  num_processes=2,
                                  process_id=int(sys.argv[2]))
    import numpy as np, keras_vit
    import keras_vit.train as kt
    from keras_vit.runtime.backend import variable_to_numpy

    def tiny():
        keras.utils.set_random_seed(1)
        return keras_vit.vit(16, 4, 32, 1, 2, 64, 10)

    # TWO_DEVICE_SCRIPT's run and its one-device weights (sys.argv[3]).
    kw = dict(recipe="pretrain", batch_size=32, micro_batch_size=16,
              learning_rate=3e-3, warmup_steps=2, crop_area=None,
              log_every=1, total_steps=6, verbose=False)
    with np.load(sys.argv[3]) as saved:
        one = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    runs = {"data": kt.Trainer(tiny, "digits", strategy="auto", **kw),
            "model": kt.Trainer(tiny, "digits", model_parallel=2, **kw)}
    out = {}
    for name, trainer in runs.items():
        run = trainer.fit()
        # Gathered on both processes (a collective), compared on each.
        out[name] = {"info": trainer.info,
                     "losses": [r["loss"] for r in run.metrics["history"]],
                     "weights": [variable_to_numpy(v)
                                 for v in run.model.weights]}
    kernel = next(v for v in runs["model"].model.trainable_variables
                  if v.path == "encoder_block_0/mlp/dense_0/kernel")
    print("RESULT " + json.dumps({
        "devices": [jax.device_count(), jax.local_device_count()],
        "info": {k: out[k]["info"] for k in ("data", "model")},
        "kernel_spec": [str(a) for a in kernel.value.sharding.spec],
        "losses": {k: v["losses"] for k, v in out.items()},
        "max_diff": {k: max(float(np.abs(a - b).max()) for a, b in zip(
            out[k]["weights"], one, strict=True))
            for k in ("data", "model")}}))
""")


@pytest.mark.slow
def test_two_jax_processes_train_as_one(tmp_path, two_jax_devices):
    # keras.distribution across two processes (CPU collectives over gloo):
    # DataParallel splits each batch, ModelParallel each weight, between
    # the processes; both reach the weights of the same run on one device
    # (two_jax_devices's).
    one = two_jax_devices["one"]
    script = tmp_path / "two_processes.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, str(script), str(port), str(i), one["weights"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(KERAS_BACKEND="jax", XLA_FLAGS=quick_xla_flags()))
        for i in range(2)]
    results = [json.loads(stdout.split("RESULT ", 1)[1])
               for stdout, _ in finish_together(procs)]
    first, second = results
    assert first["devices"] == [2, 1]
    assert first["info"]["data"]["workers"] == 2
    assert first["info"]["data"]["is_chief"]
    assert not second["info"]["data"]["is_chief"]
    assert first["info"]["model"]["name"] == "model_parallel"
    assert first["kernel_spec"] == ["None", "model"]
    for result in results:
        for name in ("data", "model"):
            np.testing.assert_allclose(result["losses"][name],
                                       one["losses"], atol=1e-5)
            assert result["max_diff"][name] < 1e-5, name


# Steps of the killed run (a checkpoint every 10, killed after 15, mid-epoch):
# enough for its loss to fall.
KILLED_TOTAL = 40


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """The command line (dropout, micro-batches, EMA) killed with SIGKILL
    after step 15 (HOLD): the checkpoint of step 10 is its last, and the
    row of step 15 was logged after it. Then, run here (the killed process
    is gone, the resume reads its files), the same command again and the
    same run uninterrupted. Returns the two run folders and what each step
    left."""
    folder = tmp_path_factory.mktemp("killed")
    model = folder / "tiny.keras"
    tiny(dropout_rate=0.1).save(model)
    killed, whole = folder / "killed", folder / "whole"

    def argv(out):
        return ["fine-tune", str(model), "--data", "digits", "--steps",
                str(KILLED_TOTAL), "--batch-size", "32",
                "--micro-batch-size", "16", "--lr", "0.05", "--warmup-steps",
                "3", "--ema", "0.9", "--checkpoint-every", "10", "--set",
                "crop_area=none", "--set", "log_every=5", "--strategy",
                "default", "--no-eval", "--out", str(out)]

    kill_once(held_cli(argv(killed), 15), lambda: logged(killed, 15),
              env=_env(KERAS_BACKEND=keras.backend.backend()))
    after_kill = dict(
        checkpoints=checkpoints.steps(str(killed / "checkpoints")),
        metrics=(killed / "metrics.json").exists())
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        resumed = cli.main(argv(killed))
    uninterrupted = cli.main(argv(whole))
    return dict(killed=killed, whole=whole, after_kill=after_kill,
                exit_codes=(resumed, uninterrupted),
                printed=printed.getvalue())


@pytest.mark.slow
@pytest.mark.backends("tensorflow", "jax")  # where killed_and_resumed runs
def test_a_killed_run_resumes_from_its_last_checkpoint(killed_and_resumed):
    run = killed_and_resumed
    assert run["after_kill"] == dict(checkpoints=[10], metrics=False)
    assert run["exit_codes"][0] == 0
    assert "resumed from step 10 " in run["printed"]
    m = json.loads((run["killed"] / "metrics.json").read_text())
    assert m["resumed_from_step"] == m["start_step"] == 10
    assert m["final_step"] == KILLED_TOTAL and m["complete"]
    # Every row once: the one of step 15 the killed run logged past its
    # checkpoint is not kept twice.
    assert [r["step"] for r in m["history"]] == list(
        range(5, KILLED_TOTAL + 5, 5))
    losses = [r["loss"] for r in m["history"]]
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.05, losses


@pytest.mark.slow
# Every backend writes the same checkpoints (StepCheckpoints); torch's own
# random state across a resume is
# test_resume_mid_epoch_with_dropout_equals_an_uninterrupted_run's.
@pytest.mark.backends("tensorflow", "jax")
def test_kill_9_and_resume_equals_an_uninterrupted_run(killed_and_resumed):
    run = killed_and_resumed
    assert run["exit_codes"] == (0, 0)
    m = json.loads((run["killed"] / "metrics.json").read_text())
    w = json.loads((run["whole"] / "metrics.json").read_text())
    assert m["resumed_from_step"] == 10 and w["resumed_from_step"] is None
    assert m["final_step"] == w["final_step"] == KILLED_TOTAL
    # The rows are means of fit's running means over different spans, so
    # equal to float32 rounding; the weights (the EMA's) are equal exactly.
    assert [r["step"] for r in m["history"]] == [
        r["step"] for r in w["history"]]
    np.testing.assert_allclose([r["loss"] for r in m["history"]],
                               [r["loss"] for r in w["history"]], atol=1e-4)
    a = keras.saving.load_model(run["killed"] / "model.keras").get_weights()
    b = keras.saving.load_model(run["whole"] / "model.keras").get_weights()
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.backends
def test_the_checkpoint_records_the_settings_it_was_made_with(tmp_path):
    """A hostile run folder: resuming is checked against the checkpoint's
    own record of the settings, so editing or deleting run.json lets
    nothing through."""
    out = tmp_path / "run"
    kw = dict(QUICK, recipe="finetune", out_dir=str(out), total_steps=3,
              warmup_steps=1, learning_rate=0.01, checkpoint_every=1)
    kt.Trainer(tiny(), "digits", **kw).fit(stop_at_step=1)
    run_json = out / "run.json"
    edited = json.loads(run_json.read_text())
    edited["recipe"]["learning_rate"] = 0.05
    run_json.write_text(json.dumps(edited))
    with pytest.raises(ValueError,
                       match=r"recipe\.learning_rate: 0\.01 -> 0\.05"):
        kt.Trainer(tiny(), "digits", **dict(kw, learning_rate=0.05))
    run_json.unlink()
    with pytest.raises(ValueError,
                       match=r"recipe\.learning_rate: 0\.01 -> 0\.05"):
        kt.Trainer(tiny(), "digits", **dict(kw, learning_rate=0.05))
    # The original settings resume, without run.json; resume='force' takes
    # the new ones, and its later checkpoints record those.
    assert kt.Trainer(tiny(), "digits", **kw).resumed_from == 1
    forced = kt.Trainer(tiny(), "digits", resume="force",
                        **dict(kw, learning_rate=0.05))
    assert forced.resumed_from == 1
    forced.fit(stop_at_step=2)
    assert kt.Trainer(tiny(), "digits", **dict(
        kw, learning_rate=0.05)).resumed_from == 2
    with pytest.raises(ValueError, match=r"0\.05 -> 0\.01"):
        kt.Trainer(tiny(), "digits", **kw)


def test_an_npz_checkpoint_keeps_its_settings_as_bytes(tmp_path):
    settings = json.dumps({"recipe": {"learning_rate": 0.01}, "é": "ü"})
    path = checkpoints.save(str(tmp_path), 3, {"model": [np.zeros(2)]},
                            {"epoch": 0, "batch_in_epoch": 3},
                            settings=settings)
    with np.load(path, allow_pickle=False) as archive:
        assert archive["meta/settings"].dtype == np.uint8
    _, meta = checkpoints.load(path, {"model": [((2,), "float64")]})
    assert meta["settings"] == settings
    old = checkpoints.save(str(tmp_path), 4, {"model": [np.zeros(2)]},
                           {"epoch": 0, "batch_in_epoch": 4})
    assert checkpoints.load(old, {"model": [((2,), "float64")]})[1][
        "settings"] is None
    # A record that is not UTF-8 bytes is refused, naming the field.
    arrays = dict(np.load(old, allow_pickle=False))
    arrays["meta/settings"] = np.array([1.5, 2.5])
    bad = tmp_path / "ckpt-9.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match="meta/settings: unreadable"):
        checkpoints.load(str(bad), {"model": [((2,), "float64")]})
