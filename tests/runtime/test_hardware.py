"""The execution plan follows the machine: each capability forced through
the environment, the path chosen checked, an explicit choice winning."""

import numpy as np
import pytest

import keras
import keras_vit
from keras_vit.runtime import hardware
from keras_vit.models import compiled

AMX = hardware.Hardware("cpu", frozenset({"avx512f", "amx_bf16", "amx_int8"}))
ZEN4 = hardware.Hardware("cpu", frozenset({"avx512f", "avx512_bf16",
                                           "avx512_vnni"}))
PLAIN = hardware.Hardware("cpu", frozenset({"avx2", "fma"}))
GPU = hardware.Hardware("gpu", frozenset({"avx2"}))


def test_units_are_read_from_the_flags():
    assert (AMX.bf16_units, AMX.int8_units) == ("amx", "amx")
    assert (ZEN4.bf16_units, ZEN4.int8_units) == ("avx512_bf16",
                                                  "avx512_vnni")
    assert (PLAIN.bf16_units, PLAIN.int8_units) == (None, None)
    assert "bf16: amx" in AMX.describe() and "bf16: none" in PLAIN.describe()


@pytest.mark.parametrize("machine,dtype,predict,train_jit", [
    (AMX, "bfloat16", "graph", False),
    (AMX, "mixed_bfloat16", "graph", False),
    (ZEN4, "bfloat16", "xla", True),
    (PLAIN, "bfloat16", "xla", True),
    (PLAIN, "float16", "xla", True),
    (AMX, "float16", "xla", True),
    (AMX, "float32", "graph", False),
    (PLAIN, "float32", "graph", False),
    (GPU, "bfloat16", "xla", True),
    (GPU, "float32", "xla", True),
])
def test_tensorflow_plan_per_machine(machine, dtype, predict, train_jit):
    plan = hardware.plan(dtype, machine, backend="tensorflow")
    assert (plan.predict, plan.train_jit) == (predict, train_jit), plan
    assert plan.attention == "einsum" and plan.reason
    # XLA programs for the element-wise chains exactly where the training
    # step itself is TensorFlow's graph (a compiled step fuses them anyway).
    assert plan.elementwise == ("graph" if train_jit else "xla"), plan


@pytest.mark.parametrize("backend,predict,train_jit", [
    ("jax", "xla", True), ("torch", "eager", False)])
def test_other_backends_plan(backend, predict, train_jit):
    for machine in (AMX, PLAIN, GPU):
        plan = hardware.plan("bfloat16", machine, backend=backend)
        assert (plan.predict, plan.train_jit, plan.attention,
                plan.elementwise) == (predict, train_jit, "fused", "graph")


def test_cpuinfo_is_parsed(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n"
                    "flags\t\t: fpu avx2 amx_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: something else\n")
    flags, model = hardware._read_cpuinfo(str(info))
    assert model == "Test CPU 9000"
    assert {"amx_bf16", "avx2"} <= flags and "something" not in flags
    assert hardware._read_cpuinfo(str(tmp_path / "missing")) == (
        frozenset(), "")
    fields = hardware.cpu_fields(str(info))
    assert fields["model name"] == "Test CPU 9000"
    assert fields["processor"] == "0"  # the first processor's
    assert hardware.cpu_fields(str(tmp_path / "missing")) == {}


def test_proc_files_are_read_in_one_place(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\tx kB\n")
    assert hardware.proc_text(str(status)).startswith("Name:")
    assert hardware.proc_text(str(tmp_path / "missing")) is None
    assert hardware.proc_bytes(str(status), "VmHWM") == 2 << 20
    assert hardware.proc_bytes(str(status), "VmRSS") is None
    assert hardware.proc_bytes(str(status), "VmPeak") is None
    assert hardware.proc_bytes(str(tmp_path / "missing"), "VmHWM") is None
    # This machine's own, where there is a /proc (Linux).
    if hardware.cpu_fields():
        assert hardware.memory_total() >= hardware.available_memory() > 0
        assert hardware.peak_resident_memory() >= (
            hardware.resident_memory() > 0)


def test_cpu_flags_honour_the_override(monkeypatch):
    from keras_vit.train import distribute

    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2, amx_bf16")
    assert hardware.cpu_flags() == {"avx2", "amx_bf16"}
    assert distribute.cpu_has_bf16()
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2")
    assert not distribute.cpu_has_bf16()
    monkeypatch.delenv("KERAS_VIT_CPU_FLAGS")
    assert hardware.cpu_flags() == hardware._read_cpuinfo()[0]


def test_environment_forces_a_machine(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2, amx_bf16")
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    assert hardware.detect().bf16_units == "amx"
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2")
    assert hardware.detect().bf16_units is None
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "quantum")
    with pytest.raises(ValueError, match="KERAS_VIT_ACCELERATOR='quantum'"):
        hardware.detect()


def _tiny(dtype=None):
    return keras_vit.vit(32, 8, 16, 1, 2, 32, 3, dtype=dtype)


@pytest.mark.parametrize("flags,dtype,want_tf", [
    ("avx2,amx_bf16", "bfloat16", "graph"),
    ("avx2", "bfloat16", "xla"),
    ("avx2,amx_bf16", None, "graph"),
])
def test_predict_follows_the_forced_machine(monkeypatch, flags, dtype,
                                            want_tf):
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", flags)
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    model = _tiny(dtype)
    want = {"tensorflow": want_tf, "jax": "xla",
            "torch": "eager"}[keras.backend.backend()]
    assert model.resolved_predict_path() == want
    x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3))
    ref = keras.ops.convert_to_numpy(model(x, training=False))
    out = model.predict(x, verbose=0)
    np.testing.assert_allclose(np.asarray(out, "float32"),
                               np.asarray(ref, "float32"), atol=2e-2)
    assert model.compiled_predict_sizes(want) in ([3], [4])
    assert compiled.model_compute_dtype(model) == (dtype or "float32")


def test_an_explicit_path_wins(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", "avx2,amx_bf16")
    model = _tiny("bfloat16")
    x = np.random.default_rng(1).uniform(-1, 1, (5, 32, 32, 3))
    outs = {}
    for path in ("xla", "graph", "eager", "keras"):
        model.predict_path = path
        outs[path] = np.asarray(model.predict(x, verbose=0), "float32")
    for path in ("xla", "graph", "eager"):
        np.testing.assert_allclose(outs[path], outs["keras"], atol=2e-2)
    if keras.backend.backend() == "tensorflow":
        assert model.compiled_predict_sizes("xla") == [8]   # padded bucket
        assert model.compiled_predict_sizes("graph") == [5]  # no padding
    model.predict_path = "fastest"
    with pytest.raises(ValueError, match="predict_path='fastest'"):
        model.predict(x)


@pytest.mark.parametrize("flags,want", [("avx2,amx_bf16", False),
                                         ("avx2", True)])
def test_training_compilation_follows_the_machine(monkeypatch, flags, want):
    from keras_vit import train as kt
    from keras_vit.train.distribute import step_uses_xla

    monkeypatch.setenv("KERAS_VIT_CPU_FLAGS", flags)
    monkeypatch.setenv("KERAS_VIT_ACCELERATOR", "cpu")
    model = _tiny("mixed_bfloat16")
    kt.compile_for_finetune(model, total_steps=4, warmup_steps=1,
                            batch_size=8)
    expected = {"tensorflow": want, "jax": True,
                "torch": False}[keras.backend.backend()]
    assert bool(model.jit_compile) is expected
    # An explicit choice wins.
    kt.compile_for_finetune(model, total_steps=4, warmup_steps=1,
                            batch_size=8, jit_compile=False)
    assert model.jit_compile is False
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
        assert step_uses_xla(strategy, "auto",
                                    "mixed_bfloat16") is want
        assert step_uses_xla(strategy, "auto", "float32") is False
        assert step_uses_xla(strategy, True, "float32") is True


def test_enable_onednn_leaves_every_stated_choice_alone():
    linux = ("x86_64", "Linux")
    for env in ({"TF_ENABLE_ONEDNN_OPTS": "0"}, {"TF_ENABLE_ONEDNN_OPTS": "1"},
                {"KERAS_VIT_ONEDNN": "0"}):
        before = dict(env)
        hardware.enable_onednn(env, {}, *linux)
        assert env == before
    env = {}
    assert "imported before" in hardware.enable_onednn(
        env, {"tensorflow": object()}, *linux)
    for machine, system in (("aarch64", "Linux"), ("x86_64", "Darwin"),
                            ("AMD64", "Windows")):
        assert "default on" in hardware.enable_onednn(env, {}, machine,
                                                      system)
    assert env == {}
    assert hardware.enable_onednn(env, {}, "AMD64", "Linux").startswith("on")
    assert env == {"TF_ENABLE_ONEDNN_OPTS": "1"}


def _onednn_in_child(code, **env):
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_ENABLE_ONEDNN_OPTS", "KERAS_VIT_ONEDNN")}
    environ.update(env, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    code += ("; from tensorflow.python.util import _pywrap_util_port as p"
             "; print(p.IsMklEnabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300, env=environ, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def _child(code, **env):
    """``python -c code`` with ``env`` and without the oneDNN variables of
    this process: its return code, stdout and stderr."""
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_ENABLE_ONEDNN_OPTS", "KERAS_VIT_ONEDNN")}
    environ.update(env, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, env=environ)
    return proc.returncode, proc.stdout, proc.stderr


def test_import_keras_vit_sets_and_reads_no_setting():
    """``import keras_vit`` leaves the environment as it found it, and a
    KERAS_VIT_ONEDNN it cannot read does not stop it: the oneDNN choice
    waits for TensorFlow's import."""
    code = ("import os; before = dict(os.environ); import keras_vit; "
            "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    for value in ("1", "maybe"):
        rc, out, err = _child(code, KERAS_VIT_ONEDNN=value)
        assert (rc, out.strip()) == (0, "[]"), err


def test_a_bad_onednn_setting_stops_tensorflow_import_in_one_line():
    rc, _, err = _child("import keras_vit\nimport tensorflow",
                        KERAS_VIT_ONEDNN="maybe")
    last = err.strip().splitlines()[-1]
    assert rc == 1 and "SettingError: KERAS_VIT_ONEDNN must be" in last, err
    assert "'maybe'" in last, err


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's switch")
def test_import_keras_vit_first_runs_tensorflow_through_onednn():
    """What a user's process gets: oneDNN on after ``import keras_vit`` on
    Linux x86-64 (this machine's TensorFlow default may be off: AVX2-only
    CPUs); TensorFlow's own default when it came first or the user said
    no."""
    import platform

    # TensorFlow's default, from the process where it came first: keras_vit
    # imported after it sets no environment variable (the child fails
    # otherwise), so TensorFlow, which reads its setting from there, runs
    # as it does alone (one TensorFlow import fewer than a child of its
    # own for the default: ~4.5 CPU-s).
    default = _onednn_in_child(
        "import os, tensorflow; before = dict(os.environ); import keras_vit"
        "; assert dict(os.environ) == before, 'keras_vit set a variable'")
    assert _onednn_in_child("import keras_vit", KERAS_VIT_ONEDNN="0") == (
        default)
    assert not _onednn_in_child("import keras_vit",
                                TF_ENABLE_ONEDNN_OPTS="0")
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert _onednn_in_child("import keras_vit")
