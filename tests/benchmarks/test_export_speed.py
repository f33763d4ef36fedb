"""benchmarks/export_speed.py --quick end to end (a tiny model; it checks
the script and its table, not the speed). In its own file rather than
test_speed.py, which covers benchmarks/speed.py."""

import os
import subprocess
import sys

import pytest

from conftest import quick_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "export_speed.py")


def _table(text):
    rows, head = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if head is None:
            head = cells
        elif not set(line) <= set("|-"):
            rows.append(dict(zip(head, cells)))
    return rows


@pytest.mark.slow
def test_quick_run_prints_the_table():
    # XLA at -O0, as for the other smoke runs: the digits model's training
    # step compiles its elementwise pieces with XLA (hardware.plan's
    # elementwise="xla"), and only the script is under test.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS=quick_xla_flags(os.environ.get("XLA_FLAGS", "")))
    proc = subprocess.run([sys.executable, SCRIPT, "--quick"], cwd=ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for flag in ("avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"):
        assert f"{flag} yes" in out or f"{flag} no" in out
    assert "threads: " in out
    rows = _table(out)
    assert [(r["format"], r["precision"]) for r in rows] == [
        (fmt, p) for fmt in ("onnx", "tflite")
        for p in ("float32", "float16", "dynamic_int8", "int8")]
    for r in rows:
        for column in ("file MiB", "img/s b1", "img/s b8", "x fp32 b1",
                       "x fp32 b8"):
            assert float(r[column]) > 0, (column, r)
        assert 0 <= float(r["top-1 (random model)"]) <= 1
        assert 0 <= float(r["top-1 (trained digits)"]) <= 1
        assert float(r["rel RMS"]) < 0.5  # every artifact was verified
        if r["precision"] == "float32":
            assert r["x fp32 b1"] == r["x fp32 b8"] == "1.00"


def test_bad_runtime_is_refused():
    proc = subprocess.run([sys.executable, SCRIPT, "--runtimes", "coreml"],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "--runtimes coreml" in proc.stderr
