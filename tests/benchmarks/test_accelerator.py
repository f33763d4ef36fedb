"""benchmarks/accelerator.py, the prepared GPU check: its kernel kinds,
its table from a run's results, and one part end to end on the CPU (the
rehearsal the GPU sessions rely on; the full ``--cpu`` run takes minutes)."""

import json
import os
import subprocess
import sys

import pytest

from testkit import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "accelerator.py")


def _module():
    return load_script(SCRIPT)


@pytest.mark.parametrize("name, kind", [
    # Kernel names seen in the H200 profiles (docs/benchmarks-gpu.md).
    ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_splitK_NTN", "matmul"),
    ("gemm_fusion_dot_292", "matmul"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_64x128_nn>",
     "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16",
     "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>",
     "attention"),
    ("loop_convert_multiply_fusion", "element-wise"),
    ("input_add_reduce_fusion", "element-wise"),
    ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
     "copy"),
    ("aten::addmm", "matmul"),
])
def test_kernels_are_grouped_by_what_they_compute(name, kind):
    assert _module().kernel_kind(name) == kind


def test_the_table_compares_each_row_with_timm_on_the_same_run(tmp_path):
    acc = _module()
    size = acc.SIZES["gpu"]
    rows = [dict(job="inference", impl=impl, batch=256, seconds=s)
            for impl, s in (("keras_vit, JAX (XLA)", 0.025),
                            ("timm, eager", 0.030),
                            ("timm + torch.compile", 0.020))]
    results = {"jax": {"part": "jax", "exit": 0, "wall_s": 40,
                       "rows": rows[:1]},
               "timm": {"part": "timm", "exit": 0, "wall_s": 60,
                        "rows": rows[1:], "ceiling_flops": 7.7e14,
                        "matmul": 8192},
               "tests-jax": {"part": "tests-jax", "exit": 1, "wall_s": 70,
                             "summary": "1 failed, 4 passed in 66.0s"}}
    info = {"cpu": "a CPU", "gpu": "NVIDIA H200", "driver": "580",
            "gpu_memory": "143771 MiB", "python": "3.12", "jax": "0.11",
            "jaxlib": "0.11", "torch": "2.11", "timm": "1.0", "keras": "3.15",
            "keras-vit": "0.1", "numpy": "2.5"}
    text = acc.table(results, size, info, False, str(tmp_path))
    line = next(x for x in text.splitlines() if "keras_vit, JAX" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    # 256 / 0.025 = 10,240 img/s; 256 / 0.030 and 256 / 0.020 beside it.
    assert cells[3] == "10,240"
    assert cells[6:8] == ["1.20x", "0.80x"]
    mfu = 100 * 10240 * acc.flops_per_image(size) / 7.7e14
    assert cells[5] == f"{mfu:.1f}%"
    assert "| tests-jax | 1 | 70 | 1 failed, 4 passed in 66.0s |" in text


def test_a_part_runs_end_to_end_on_the_cpu(tmp_path):
    """The parent starts the part in a child process with TensorFlow
    blocked (the GPU machines have none) and reads its figures back."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--cpu", "--parts", "torch", "--out",
         str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "accelerator.json").read_text())
    rows = report["results"]["torch"]["rows"]
    assert [r["job"] for r in rows] == ["inference", "training step"]
    assert all(r["seconds"] > 0 for r in rows)
    assert "keras_vit, torch backend (eager)" in proc.stdout


def test_unknown_parts_are_refused_naming_the_choices():
    proc = subprocess.run([sys.executable, SCRIPT, "--out", "x", "--parts",
                           "jax,tpu"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--parts: unknown tpu; choose from jax, timm" in proc.stderr


def test_the_ab_part_adds_each_flag_sets_rows_and_failures_to_the_table():
    acc = _module()
    size = acc.SIZES["gpu"]
    rows = [dict(job="training step", impl=f"keras_vit, JAX [{label}]",
                 batch=128, seconds=s)
            for label, s in (("default", 0.056),
                             ("cublas", 0.058))]
    peer = dict(job="training step", impl="timm + torch.compile", batch=128,
                seconds=0.038)
    results = {"timm": {"part": "timm", "exit": 0, "wall_s": 70,
                        "rows": [peer], "ceiling_flops": 7.7e14,
                        "matmul": 8192},
               "ab-jax": {"part": "ab-jax", "exit": 0, "wall_s": 200,
                          "rows": rows, "errors": {
                              "training step, bare JAX step, cudnn "
                              "attention [default]":
                              "RuntimeError: cuDNN is not detected."}}}
    info = {k: "?" for k in ("cpu", "python", "jax", "jaxlib", "torch",
                             "timm", "keras", "keras-vit", "numpy")}
    report = acc.table(results, size, info, False, "/nonexistent")
    assert "| training step | keras_vit, JAX [cublas] | 128 | 2,207" \
        in report
    assert "| 0.68x |" in report  # 38 / 56 ms against timm + compile
    assert ("- ab-jax, training step, bare JAX step, cudnn attention "
            "[default]: RuntimeError: cuDNN is not detected.") in report
