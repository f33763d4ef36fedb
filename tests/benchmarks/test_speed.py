"""benchmarks/speed.py: the FLOP count, and a --quick run end to end (a
tiny model; it checks the script, not the speed), with keras_vit's float32
rows on the jax and torch backends (child processes) beside TensorFlow's."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from conftest import quick_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "speed.py")
HAS_TIMM = importlib.util.find_spec("timm") is not None


def _speed_module(name="speed"):
    """benchmarks/speed.py, or one of its sibling modules (``speed_peers``,
    ...), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_forward_flops_match_the_published_gmacs():
    peers = _speed_module("speed_peers")
    # ViT-B/16: 17.56 GMACs at 224, 55.5 at 384 (timm's and fvcore's count).
    assert peers.forward_flops(224, **peers.VIT_B16) / 2e9 == pytest.approx(
        17.56, abs=0.01)
    assert peers.forward_flops(384, **peers.VIT_B16) / 2e9 == pytest.approx(
        55.5, abs=0.1)


def _tables(text):
    """``{section heading: [row dicts]}`` of the markdown tables."""
    tables, heading, head = {}, None, None
    for line in text.splitlines():
        if line.startswith("## "):
            heading, head = line[3:].strip(), None
        elif line.startswith("|") and heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if head is None:
                head = cells
                tables[heading] = []
            elif not set(line) <= set("|-"):
                tables[heading].append(dict(zip(head, cells)))
        else:
            head = None
    return tables


def _positive(cell):
    return float(cell) > 0


@pytest.mark.slow
def test_quick_run_writes_the_tables(tmp_path):
    out = tmp_path / "speed.md"
    # XLA at -O0 (TensorFlow's XLA rows and the JAX child): the tiny
    # model's time is its compilation, and only the script is under test.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS=quick_xla_flags(os.environ.get("XLA_FLAGS", "")))
    # One dtype on the other backends: their first calls (imports, JIT
    # compilation) are what the backend column costs. One timed round and
    # no warm-up call: every row still gets a first call and a time, which
    # is all the tables below are checked for (the quick defaults, 3 rounds
    # after a warm-up, cost ~6 s of CPU more).
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--skip-peers", "keras_hub",
         "--backends", "tensorflow,jax,torch", "--backend-dtypes", "float32",
         "--runs", "1", "--warmup", "0",
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.strip() in proc.stdout
    assert "Smoke run" in text
    assert "- keras-hub: disabled with --skip-peers" in text
    for key in ("command:", "CPU:", "cores", "tensorflow 2.", "threads:",
                "oneDNN CPU rewrites: ",
                "jax 0.", "torch 2.", "Keras backends: tensorflow, jax, "
                "torch"):
        assert key in text

    tables = _tables(text)
    assert set(tables) == {"Matrix-multiply ceiling",
                           "Speed targets",
                           "Backends", "Inference", "Fine-tuning step",
                           "Loading a checkpoint"}
    # Every speed goal with a row and a verdict (the quick run measures
    # the ceiling, so no verdict waits for it).
    targets = tables["Speed targets"]
    goals = {r["goal"] for r in targets}
    assert len(goals) == 6, goals
    assert {r["met"] for r in targets} <= {"yes", "no", "-"}
    assert tables["Inference"] and tables["Fine-tuning step"]
    assert all(_positive(r["GFLOP/s"]) for r in
               tables["Matrix-multiply ceiling"])

    # The rows follow the machine's plan: its choice, labelled, and the
    # path it did not choose beside it. The plan is the one the script
    # printed: on a CPU without AMX the bfloat16 plan rests on a timed
    # probe (hardware.bf16_matmul_speedup) that the script's process and
    # this one can answer differently on a loaded machine. The float32
    # plan involves no timing, so it must match this process's.
    from keras_vit.runtime import hardware

    printed = {dtype: (predict, xla == "True") for dtype, predict, xla in
               re.findall(r"(float32|bfloat16): predict (\w+), training "
                          r"XLA (True|False)", text)}
    assert set(printed) == {"float32", "bfloat16"}, printed
    assert {p for p, _ in printed.values()} <= {"graph", "xla"}, printed
    float32 = hardware.plan("float32", backend="tensorflow")
    assert printed["float32"] == (float32.predict, float32.train_jit)
    # A mixed policy computes in bfloat16: it has bfloat16's plan.
    printed["mixed_bfloat16"] = printed["bfloat16"]

    tf_rows = "keras_vit", "tensorflow"
    inference = set()
    for dtype in ("float32", "bfloat16", "mixed_bfloat16"):
        chosen = printed[dtype][0]
        inference.add((*tf_rows, f"model.predict (auto: {chosen})", dtype))
        if dtype != "mixed_bfloat16":
            other = "graph" if chosen == "xla" else "xla"
            inference.add((*tf_rows,
                           f"model.predict, predict_path='{other}'", dtype))
    # The path each backend's predict resolves to: JAX compiles (no
    # TensorFlow graph there), torch runs eagerly under no_grad.
    jax_path = {"graph": "xla"}.get(printed["float32"][0],
                                    printed["float32"][0])
    inference |= {
        ("keras_vit", "jax", f"model.predict (auto: {jax_path})", "float32"),
        ("keras_vit", "torch", "model.predict (auto: eager)", "float32")}
    mixed_jit = printed["mixed_bfloat16"][1]
    fit = "compile_for_finetune + train_on_batch"
    expected = {
        "Inference": inference,
        "Fine-tuning step": {
            (*tf_rows, "Trainer train step (default)", "float32"),
            (*tf_rows, "Trainer train step, XLA", "float32"),
            (*tf_rows, "Trainer train step (default)", "mixed_bfloat16"),
            (*tf_rows, "Trainer train step, "
             + ("no XLA" if mixed_jit else "XLA"), "mixed_bfloat16"),
            (*tf_rows, fit, "float32"), (*tf_rows, fit, "mixed_bfloat16"),
            ("keras_vit", "jax", fit, "float32"),
            ("keras_vit", "torch", fit, "float32")},
    }
    if HAS_TIMM:
        expected["Inference"] |= {
            ("timm", "-", "eager, inference_mode", "float32"),
            ("timm", "-", "eager, inference_mode", "bf16 autocast")}
        expected["Fine-tuning step"] |= {
            ("timm", "-", "loss.backward + SGD step", "float32"),
            ("timm", "-", "loss.backward + SGD step", "bf16 autocast")}
    for section, keys in expected.items():
        rows = tables[section]
        assert {(r["framework"], r["backend"], r["path"], r["dtype"])
                for r in rows} == keys
        for r in rows:
            assert r["image"] == "32"
            for column in ("img/s", "first call s", "GFLOP/s",
                           "% of ceiling"):
                assert _positive(r[column]), (section, r)
            if HAS_TIMM:
                assert _positive(r["x timm fp32"]), (section, r)
                assert _positive(r["x timm bf16"]), (section, r)

    # The backend column: each job's default path on the three backends
    # side by side with timm, float32 on all three, the rest on TensorFlow.
    backends = {(r["job"], r["dtype"]): r for r in tables["Backends"]}
    assert set(backends) == {
        ("inference (model.predict)", "float32"),
        ("inference (model.predict)", "bfloat16"),
        ("inference (model.predict)", "mixed_bfloat16"),
        ("training step (model.fit)", "float32"),
        ("training step (model.fit)", "mixed_bfloat16")}
    names = ("tensorflow", "jax", "torch")
    for (_job, dtype), r in backends.items():
        speeds = {b: r[f"{b} img/s"] for b in names}
        assert _positive(speeds["tensorflow"]), r
        others = [speeds[b] for b in names[1:]]
        if dtype == "float32":
            assert all(_positive(v) for v in others), r
        else:
            assert others == ["-", "-"], r
        best = max((b for b in names if speeds[b] != "-"),
                   key=lambda b: float(speeds[b]))
        assert r["fastest"] == best, r
        assert float(r["fastest / tensorflow"]) == pytest.approx(
            float(speeds[best]) / float(speeds["tensorflow"]), rel=0.02)
        if HAS_TIMM:
            assert _positive(r["timm img/s"]), r

    loading = tables["Loading a checkpoint"]
    assert len(loading) == 4
    assert all(_positive(r["seconds"]) for r in loading)
    assert loading[0]["x np.load"] == "1.00"


def test_the_onednn_comparison_prints_its_table(tmp_path):
    """benchmarks/onednn_ab.py: both settings take effect in their child
    processes (the script checks) and the table has one row per job."""
    out = tmp_path / "ab.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "onednn_ab.py"),
         "--quick", "--rounds", "1", "--out", str(out)], cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "- CPU: " in text and "flags: " in text
    rows = [line for line in text.splitlines()
            if line.startswith(("| predict |", "| train |"))]
    assert len(rows) == 2, text
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[4]) > 0
        assert cells[5].endswith("x") and cells[8].endswith("x")


def test_the_hostile_inputs_report_prints_its_table(tmp_path):
    """benchmarks/hostile_inputs.py --quick on two cheap cases: the
    baseline row, one row per case with its first-measured "before"
    beside the measurement, and both within the bound."""
    script = os.path.join(ROOT, "benchmarks", "hostile_inputs.py")
    out = tmp_path / "hostile.md"
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--cases",
         "finetune_image_size,keras_zip_bomb", "--out", str(out)], cwd=ROOT,
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for key in ("- CPU: ", "flags: ", "- date: ", "keras 3.", "tensorflow ",
                "Smoke run"):
        assert key in text, key
    rows = {r["case"]: r for r in _tables(text)["tensorflow"]}
    assert list(rows) == ["baseline", "finetune_image_size",
                          "keras_zip_bomb"]
    assert rows["baseline"]["exit"] == "0"
    assert float(rows["baseline"]["peak RSS MiB"]) > 0
    before = "before (first measured)"
    assert rows["keras_zip_bomb"][before] == "1.6 MB .keras: loads, 3.9 GB"
    for name in ("finetune_image_size", "keras_zip_bomb"):
        row = rows[name]
        assert row["verdict"] == "met", row
        assert row["exit"] == "2" and float(row["wall s"]) > 0, row
        assert float(row["over baseline MiB"]) < 1024, row
    assert "--image-size: must be <= 4096" in rows["finetune_image_size"][
        "message"]
    assert "config.json is 50331648 bytes uncompressed" in rows[
        "keras_zip_bomb"]["message"]


def _script_module(name):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up by name while being defined.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_a_hostile_case_that_fails_inside_the_code_is_not_met():
    """A clear exit status is not enough: a message naming an internal
    exception (the Hub route once ended every case with 'AttributeError:
    No huggingface_hub attribute constants', exit 2) or lacking the
    refusal the case expects fails the case."""
    hostile = _script_module("hostile_inputs")
    case = next(c for c in hostile.CASES if c.name == "hub_config_400mb")
    assert case.says

    def result(message):
        return hostile.Result(case, [], 2, 1.0, 100.0, message, False, False)

    good = f"keras-vit: error: config.json is 400000000 bytes; {case.says}"
    assert hostile.verdict(result(good), 100.0, 120) == "met"
    broken = ("keras-vit: error: could not download hf-hub:x/y: "
              "AttributeError: No huggingface_hub attribute constants")
    assert "AttributeError" in hostile.verdict(result(broken), 100.0, 120)
    assert "lacks" in hostile.verdict(result("keras-vit: error: no"), 100.0,
                                      120)


def test_speed_reports_kernel_caps_beside_the_cpu_flags():
    speed = _speed_module()
    assert speed.isa_caps({}) == ""
    note = speed.isa_caps({"ONEDNN_MAX_CPU_ISA": "AVX2",
                           "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert note == ("; kernels capped by ONEDNN_MAX_CPU_ISA=AVX2, "
                    "MKL_ENABLE_INSTRUCTIONS=AVX2")


def test_the_remat_benchmark_prints_its_table(tmp_path):
    """benchmarks/remat.py on a tiny model (ViT-Ti/16 cut to 2 blocks at
    32 px): the activations each setting keeps for the backward pass (remat
    keeps fewer), and the step-time ratio from the PyTorch child, in one
    table naming the CPU."""
    out = tmp_path / "remat.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "remat.py"),
         "--model", "ViT-Ti/16", "--image-size", "32", "--num-classes", "10",
         "--num-layers", "2", "--rounds", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        # XLA at -O0: compiling the two gradients is most of the run; the
        # figures checked below come from shapes and torch's clock.
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                 XLA_FLAGS=quick_xla_flags(os.environ.get("XLA_FLAGS", ""))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "CPU: " in text and "without remat | with remat" in text
    assert "Training step of ViT-Ti/16 (2 blocks) at 32 px" in text

    def cells(prefix):
        row = next(line for line in text.splitlines()
                   if line.startswith(prefix))
        return [c.strip() for c in row.strip("|").split("|")]

    kept = cells("| kept for backward")
    assert float(kept[1]) >= float(kept[2]) and kept[3].endswith("x less")
    fits = cells("| largest batch")
    assert int(fits[2]) > int(fits[1]) > 0
    step = cells("| step time")
    assert float(step[1]) > 0 and float(step[2]) > 0
    assert step[3].endswith("x")
