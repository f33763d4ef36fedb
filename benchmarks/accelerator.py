"""The prepared accelerator check: one command on a bare GPU machine that
runs the suite's ``gpu`` tests on the JAX and torch backends and measures
ViT-B/16 beside timm on the same GPU, ending with one table.

    python benchmarks/accelerator.py --out DIR          # on a GPU machine
    python benchmarks/accelerator.py --cpu --out DIR    # rehearsal, tiny sizes

What it does, each part in a child process with its own time limit (a
part that fails or runs out of time is a row saying so; the rest still
run and the table still prints):

1. ``tests-jax``, ``tests-torch``: ``pytest -m gpu tests/gpu`` on each
   backend (mixed-precision training steps against float32, the fused
   attention kernel against the einsum path, XLA's compiled memory of a
   ViT-L/16 step at 384 px with and without remat).
2. ``jax``, ``torch``: keras_vit's ViT-B/16 at 224 under ``mixed_bfloat16``:
   inference images/s at batch 256 (the jitted forward on JAX, the eager
   forward under ``torch.no_grad`` on torch) and the training step at
   batch 128 through Keras' own ``train_on_batch`` with AdamW (what
   ``model.fit`` runs).
3. ``timm``: the same architecture in timm with bf16 autocast and fused
   AdamW, eager and ``torch.compile``; and a bf16 matmul of 8192^3 through
   torch, the measured ceiling that model FLOP utilisation is taken
   against (FLOPs from the configuration, benchmarks/speed_peers.py; a
   training step counts 3x the forward).
4. ``roundtrip``: a small ViT trained a few steps with ``model.fit`` on the
   accelerator (JAX) and saved as ``.keras``, with its input and logits,
   under ``--out``: tests/gpu/test_trained_on_gpu.py checks such a file on
   the CPU (``--keep-roundtrip`` there names where to copy it).

``--cpu`` runs the same parts on the CPU with a tiny model and the ``gpu``
tests forced on (ACCELERATOR_CHECK_ON_CPU=1), so that a GPU session meets
only the device as new. TensorFlow is never imported (the GPU machines
have none): the parts run with it blocked.

The GPU machines carry Keras and this package as wheels; the command the
speed guide gives installs them first (docs/guides/speed.md, "On a GPU").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from speed_peers import TINY, VIT_B16, forward_flops  # noqa: E402

# The measured configurations: ViT-B/16 at 224 on an accelerator, a tiny
# stand-in at 32 px for the CPU rehearsal.
SIZES = {
    "gpu": dict(arch=VIT_B16, image=224, classes=1000, infer_batch=256,
                train_batch=128, rounds=5, steps=10, timm="vit_base_patch16_224",
                matmul=8192),
    "cpu": dict(arch=TINY, image=32, classes=10, infer_batch=8,
                train_batch=8, rounds=2, steps=2, timm="vit_base_patch16_224",
                matmul=256),
}
# The models ``--model`` measures on an accelerator: the architecture and
# timm's name for it (ViT-L/16 at the same batches).
MODELS = {
    "B/16": (VIT_B16, "vit_base_patch16_224"),
    "L/16": (dict(patch_size=16, hidden_size=1024, num_layers=24,
                  num_heads=16, mlp_dim=4096), "vit_large_patch16_224"),
}


def sizes(args):
    """The measured configuration: the CPU rehearsal's, or the GPU's with
    ``--model``'s architecture."""
    if args.cpu:
        return SIZES["cpu"]
    arch, timm_name = MODELS[args.model]
    return dict(SIZES["gpu"], arch=arch, timm=timm_name)


# How long each part may take (seconds) on the accelerator; the rehearsal
# gets the same limits.
# The order is the order they run in: the figures beside timm first.
PART_LIMITS = {"jax": 120, "timm": 180, "tests-jax": 150, "torch": 90,
               "roundtrip": 60, "tests-torch": 90}
PARTS = tuple(PART_LIMITS)
# Where a figure misses its goal, these say which ops take the step's time
# (``--parts profile-jax,profile-torch``): kernels grouped by kind from
# JAX's profiler and torch's, and A/B timings of the JAX step.
PROFILE_LIMITS = {"profile-jax": 200, "profile-torch": 120}
PART_LIMITS.update(PROFILE_LIMITS)
# The candidates for the JAX step (``--parts ab-jax``): each set of XLA
# flags runs in a child of its own, since XLA reads them once a process.
# Each child times keras_vit's step with the fused and the padded
# attention (KERAS_VIT_ATTENTION=padded: cuDNN's flash kernel, forward and
# backward), the bare JAX step of benchmarks/bare_jax_vit.py (what XLA
# itself costs) with XLA's and cuDNN's attention, and both forwards.
# "cublas": cuBLAS for every matmul, no Triton GEMM fusions; "cublaslt":
# that and cuBLASLt's fused epilogues.
AB_FLAGS = {
    "default": "",
    "cublas": "--xla_gpu_enable_triton_gemm=false",
    "cublaslt": "--xla_gpu_enable_triton_gemm=false "
                "--xla_gpu_enable_cublaslt=true",
}
AB_LIMIT = 130
PART_LIMITS["ab-jax"] = AB_LIMIT * len(AB_FLAGS)
# keras_vit on the torch backend without Keras' per-op dispatch: its
# forward and train step captured as CUDA graphs, and compiled with
# ``jit_compile=True`` (Keras' torch.compile of the train and predict
# steps).
PART_LIMITS["torch-graph"] = 120
PART_LIMITS["torch-jit"] = 180


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ab-flags", default=",".join(AB_FLAGS),
                   help="comma-separated sets of XLA flags the ab-jax part "
                        f"tries, of {','.join(AB_FLAGS)}")
    p.add_argument("--model", default="B/16", choices=sorted(MODELS),
                   help="the ViT measured on an accelerator (default B/16)")
    p.add_argument("--cpu", action="store_true",
                   help="rehearse on the CPU with a tiny model")
    p.add_argument("--out", required=True,
                   help="folder for the table, the logs and the .keras file")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated subset of {','.join(PART_LIMITS)}"
                        ", run in the order given")
    p.add_argument("--deadline", type=float, default=480.0,
                   help="seconds for the whole check: a part gets what is "
                        "left, and one that would start later is skipped")
    p.add_argument("--part", help=argparse.SUPPRESS)  # a child's own part
    args = p.parse_args(argv)
    args.parts = tuple(x for x in args.parts.split(",") if x)
    args.ab_flags = tuple(x for x in args.ab_flags.split(",") if x)
    if set(args.ab_flags) - set(AB_FLAGS):
        p.error(f"--ab-flags: unknown "
                f"{', '.join(sorted(set(args.ab_flags) - set(AB_FLAGS)))}; "
                f"choose from {', '.join(AB_FLAGS)}")
    unknown = sorted(set(args.parts) - set(PART_LIMITS))
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)}; "
                f"choose from {', '.join(PART_LIMITS)}")
    return args


# --------------------------------------------------------------------------
# Child processes: one part each, results as JSON on the last stdout line


def _block_tensorflow():
    """The GPU machines have no TensorFlow: a part that imports it fails
    here as it would there."""
    sys.modules["tensorflow"] = None


def _timed(fn, sync, steps, rounds, warmup=1):
    """Median seconds per call of ``fn`` over ``rounds`` rounds of
    ``steps`` calls, after ``warmup`` calls (compiles)."""
    for _ in range(warmup):
        sync(fn())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        out = None
        for _ in range(steps):
            out = fn()
        sync(out)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def _measure(found, job, impl, make, sync, size, batch, warmup=0):
    """Times the function ``make()`` returns into ``found`` (``{"rows":
    [...], "errors": {...}}``): a row with its first call (the compile)
    apart, or the error that stopped it, since a candidate's failure is
    its finding, not its part's end."""
    start = time.perf_counter()
    try:
        fn = make()
        first = time.perf_counter()
        sync(fn())
        first = time.perf_counter() - first
        seconds = _timed(fn, sync, size["steps"], size["rounds"],
                         warmup=warmup)
    except Exception as e:
        found["errors"][f"{job}, {impl}"] = f"{type(e).__name__}: {e}"[:300]
        return
    found["rows"].append(dict(job=job, impl=impl, batch=batch,
                              seconds=seconds, first_call_s=first,
                              wall_s=time.perf_counter() - start))


def _keras_model(size, dtype, remat=False):
    import keras_vit

    arch = dict(size["arch"])
    return keras_vit.vit(size["image"], arch["patch_size"],
                         arch["hidden_size"], arch["num_layers"],
                         arch["num_heads"], arch["mlp_dim"], size["classes"],
                         dtype=dtype, remat=remat)


def _compile_for_adamw(model, optimizer=None, **options):
    """Keras' compile with sparse cross-entropy on logits and AdamW (lr
    1e-4, weight decay 0.05), or ``optimizer``; ``options``: compile's
    others (``jit_compile``)."""
    import keras

    model.compile(
        optimizer=optimizer or keras.optimizers.AdamW(learning_rate=1e-4,
                                                      weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **options)


def _torch_sync(device):
    """Waits for ``device``'s queued work (a no-op on the CPU)."""
    import torch

    def sync(_=None):
        if device == "cuda":
            torch.cuda.synchronize()
    return sync


def _timm_model(size, device):
    """timm's model of ``size``'s configuration on ``device``, with fused
    AdamW where the device is a GPU."""
    import timm
    import torch

    arch = size["arch"]
    model = timm.create_model(
        size["timm"], pretrained=False, num_classes=size["classes"],
        img_size=size["image"], patch_size=arch["patch_size"],
        embed_dim=arch["hidden_size"], depth=arch["num_layers"],
        num_heads=arch["num_heads"],
        mlp_ratio=arch["mlp_dim"] / arch["hidden_size"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                  weight_decay=0.05, fused=device == "cuda")
    return model, optimizer


def part_keras(size, backend):
    """keras_vit under ``mixed_bfloat16``: forward and training step."""
    import numpy as np

    rng = np.random.default_rng(0)
    model = _keras_model(size, "mixed_bfloat16")
    _compile_for_adamw(model)
    shape = (size["image"], size["image"], 3)
    xi = rng.uniform(-1, 1, (size["infer_batch"],) + shape).astype("float32")
    xt = rng.uniform(-1, 1, (size["train_batch"],) + shape).astype("float32")
    yt = rng.integers(0, size["classes"], size["train_batch"]).astype("int32")
    if backend == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        other = [v.value for v in model.non_trainable_variables]
        forward = jax.jit(lambda t, o, x: model.stateless_call(
            t, o, x, training=False)[0])
        xi, xt, yt = (jax.device_put(a) for a in (xi, xt, yt))

        def infer():
            return forward(trainable, other, xi)

        def sync(out):
            jax.block_until_ready(out)
        impl = "keras_vit, JAX (XLA)"
    else:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        xi, xt, yt = (torch.as_tensor(a, device=device)
                      for a in (xi, xt, yt))

        def infer():
            with torch.no_grad():
                return model(xi, training=False)

        def sync(out):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        impl = "keras_vit, torch backend (eager)"

    def train():
        return model.train_on_batch(xt, yt)

    rows = []
    for job, fn, batch in (("inference", infer, size["infer_batch"]),
                           ("training step", train, size["train_batch"])):
        start = time.perf_counter()
        seconds = _timed(fn, sync, size["steps"], size["rounds"])
        rows.append(dict(job=job, impl=impl, batch=batch, seconds=seconds,
                         first_call_s=None,
                         wall_s=time.perf_counter() - start))
    return {"rows": rows}


def _timm_rows(size, compiled, device, data):
    """timm's model of ``size``'s configuration, eager or through
    ``torch.compile``: forward and AdamW training step under bf16
    autocast."""
    import torch

    xi, xt, yt = data
    model, optimizer = _timm_model(size, device)
    runner = torch.compile(model) if compiled else model
    impl = "timm + torch.compile" if compiled else "timm, eager"
    sync = _torch_sync(device)

    def infer():
        model.eval()
        with torch.inference_mode(), torch.autocast(
                device, dtype=torch.bfloat16):
            return runner(xi)

    def train():
        model.train()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(runner(xt), yt)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    rows = []
    for job, fn, batch in (("inference", infer, size["infer_batch"]),
                           ("training step", train, size["train_batch"])):
        start = time.perf_counter()
        # Three warm-up calls: with torch.compile the first training steps
        # ran 10x slower than the fourth (seen on a CPU, no recompiles).
        seconds = _timed(fn, sync, size["steps"], size["rounds"], warmup=3)
        rows.append(dict(job=job, impl=impl, batch=batch, seconds=seconds,
                         wall_s=time.perf_counter() - start))
    return rows


def _matmul_ceiling(n, device):
    """FLOP/s of a bf16 n x n x n matmul through torch: the measured
    ceiling that model FLOP utilisation is taken against."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n ** 3 / _timed(lambda: a @ b, _torch_sync(device), 10, 3)


def part_timm(size):
    """timm's model of the same configuration, eager and torch.compile;
    the bf16 matmul ceiling."""
    import numpy as np
    import timm
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    ceiling = _matmul_ceiling(size["matmul"], device)
    rng = np.random.default_rng(0)
    shape = (3, size["image"], size["image"])
    data = (torch.as_tensor(rng.uniform(-1, 1, (size["infer_batch"],) + shape),
                            dtype=torch.float32, device=device),
            torch.as_tensor(rng.uniform(-1, 1, (size["train_batch"],) + shape),
                            dtype=torch.float32, device=device),
            torch.as_tensor(rng.integers(0, size["classes"],
                                         size["train_batch"]), device=device))
    rows = _timm_rows(size, False, device, data) + _timm_rows(
        size, True, device, data)
    return {"rows": rows, "ceiling_flops": ceiling, "matmul": size["matmul"],
            "versions": {"torch": torch.__version__,
                         "timm": timm.__version__}}


def part_roundtrip(size, out):
    """A small ViT trained with ``model.fit`` here, saved with its input
    and logits for the CPU test (tests/gpu/test_trained_on_gpu.py)."""
    import jax
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.vit(32, 8, 32, 2, 2, 64, 5)
    _compile_for_adamw(model)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (64, 32, 32, 3)).astype("float32")
    y = (np.arange(64) % 5).astype("int32")
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    folder = os.path.join(out, "trained_on_accelerator")
    os.makedirs(folder, exist_ok=True)
    model.save(os.path.join(folder, "model.keras"))
    probe = x[:4]
    logits = np.asarray(model.predict_on_batch(probe), "float32")
    np.save(os.path.join(folder, "inputs.npy"), probe)
    np.save(os.path.join(folder, "logits.npy"), logits)
    device = str(jax.devices()[0].device_kind)
    with open(os.path.join(folder, "made_on.json"), "w") as f:
        json.dump({"device": device, "keras": keras.__version__,
                   "jax": jax.__version__,
                   "loss": [float(v) for v in history.history["loss"]]}, f)
    return {"device": device, "loss": history.history["loss"],
            "files": sorted(os.listdir(folder))}


def kernel_kind(name):
    """A GPU kernel's kind from its name: matmul, attention, copy or
    element-wise (the fusions and everything else)."""
    low = name.lower()
    if any(w in low for w in ("fmha", "flash", "attention", "sdpa")):
        return "attention"
    if any(w in low for w in ("gemm", "cutlass", "nvjet", "xmma", "cublas",
                              "matmul", "dot", "gemv", "wgmma", "aten::mm",
                              "addmm", "bmm", "convolution", "fprop",
                              "dgrad", "wgrad")):
        return "matmul"
    if any(w in low for w in ("memcpy", "memset", "copy")):
        return "copy"
    return "element-wise"


def _kernel_summary(times, steps, step_s):
    """``{kind: ms a step}``, the 12 costliest kernels and the share of the
    step the GPU was busy, from ``{kernel name: total ns}``."""
    kinds = {}
    for name, ns in times.items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + ns / 1e6 / steps
    busy = sum(kinds.values())
    top = sorted(times.items(), key=lambda kv: -kv[1])[:12]
    # Every attention kernel too: whether a fused one ran is the question.
    top += [(n, ns) for n, ns in times.items()
            if kernel_kind(n) == "attention" and (n, ns) not in top]
    return {"ms_per_step": {k: round(v, 3) for k, v in kinds.items()},
            "busy_ms": busy, "step_ms": 1e3 * step_s,
            "top": [(n[:90], kernel_kind(n), round(ns / 1e6 / steps, 3))
                    for n, ns in top]}


def _jax_gpu_kernels(fn, steps):
    """``{kernel name: total ns}`` on the accelerator over ``steps`` calls
    of ``fn``, from JAX's profiler."""
    import glob
    import tempfile

    import jax
    from jax.profiler import ProfileData

    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        for _ in range(steps):
            out = fn()
        jax.block_until_ready(out)
    path = glob.glob(os.path.join(folder, "**", "*.xplane.pb"),
                     recursive=True)[0]
    times = {}
    for plane in ProfileData.from_file(path).planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if "stream" not in line.name.lower():
                continue
            for event in line.events:
                times[event.name] = times.get(event.name, 0.0) + \
                    event.duration_ns
    return times


def profile_jax(size):
    """The JAX training step's GPU time by kernel kind, and A/B timings:
    AdamW vs SGD (the optimizer's share), fused vs einsum attention, and
    Keras' train step vs a bare ``jax.value_and_grad`` (the trainer's
    share)."""
    import jax
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (size["train_batch"], size["image"], size["image"], 3)
    x = jax.device_put(rng.uniform(-1, 1, shape).astype("float32"))
    y = jax.device_put(rng.integers(0, size["classes"], shape[0])
                       .astype("int32"))
    sync = jax.block_until_ready
    out = {}

    def keras_step(optimizer, attention=None):
        if attention:
            os.environ["KERAS_VIT_ATTENTION"] = attention
        model = _keras_model(size, "mixed_bfloat16")
        _compile_for_adamw(model, optimizer)
        step = _timed(lambda: model.train_on_batch(x, y, return_dict=True),
                      lambda _: None, size["steps"], size["rounds"])
        os.environ.pop("KERAS_VIT_ATTENTION", None)
        return model, step

    model, adamw = keras_step(keras.optimizers.AdamW(1e-4, weight_decay=0.05))
    out["profile"] = _kernel_summary(_jax_gpu_kernels(
        lambda: model.train_on_batch(x, y, return_dict=True), 5), 5, adamw)
    _, sgd = keras_step(keras.optimizers.SGD(1e-4))
    _, einsum = keras_step(keras.optimizers.AdamW(1e-4, weight_decay=0.05),
                           attention="einsum")
    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]

    def loss(t, o):
        logits, _ = model.stateless_call(t, o, x, training=True)
        logp = jax.nn.log_softmax(logits.astype("float32"))
        return -jax.numpy.mean(jax.numpy.take_along_axis(
            logp, y[:, None], axis=1))
    # The bare JAX step of the same model (benchmarks/bare_jax_vit.py):
    # what XLA runs where Keras and keras_vit add nothing.
    import bare_jax_vit as bare
    from keras_vit.runtime import hardware

    arch = size["arch"]
    step = bare.make_step(arch["num_heads"], arch["patch_size"], "bfloat16",
                          "cudnn" if hardware.cudnn_flash_attention()
                          else "xla")
    params = bare.params_from_keras(model)
    state = [params, bare.adamw_init(params)]

    def bare_step():
        state[0], state[1], value = step(state[0], state[1], x, y)
        return value
    bare_s = _timed(bare_step, sync, size["steps"], size["rounds"])
    out["profile_bare"] = _kernel_summary(_jax_gpu_kernels(bare_step, 5), 5,
                                          bare_s)
    grad = jax.jit(jax.value_and_grad(loss))
    bare = _timed(lambda: grad(trainable, other), sync, size["steps"],
                  size["rounds"])
    out["ab_ms"] = {"keras train_on_batch, AdamW": 1e3 * adamw,
                    "keras train_on_batch, SGD": 1e3 * sgd,
                    "keras train_on_batch, AdamW, einsum attention":
                        1e3 * einsum,
                    "jax.value_and_grad alone (no optimizer, no trainer)":
                        1e3 * bare}
    return out


def profile_torch(size):
    """GPU time by kernel kind of a training step: keras_vit on the torch
    backend beside timm eager (the same eager regime)."""
    import numpy as np
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    activities = [torch.profiler.ProfilerActivity.CUDA if device == "cuda"
                  else torch.profiler.ProfilerActivity.CPU]
    rng = np.random.default_rng(0)
    b, s = size["train_batch"], size["image"]
    y = torch.as_tensor(rng.integers(0, size["classes"], b), device=device)
    nhwc = torch.as_tensor(rng.uniform(-1, 1, (b, s, s, 3)),
                           dtype=torch.float32, device=device)
    model = _keras_model(size, "mixed_bfloat16")
    _compile_for_adamw(model)
    peer, optimizer = _timm_model(size, device)
    nchw = nhwc.permute(0, 3, 1, 2).contiguous()

    def timm_step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(peer(nchw), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = _torch_sync(device)
    out = {}
    for name, fn in (("keras_vit, torch backend",
                      lambda: model.train_on_batch(nhwc, y)),
                     ("timm, eager", timm_step)):
        step = _timed(fn, sync, size["steps"], size["rounds"], warmup=3)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(5):
                fn()
            sync()
        # On the CPU, self time: the CPU events nest.
        times = {e.key: 1e3 * (e.device_time_total if device == "cuda"
                               else e.self_cpu_time_total)
                 for e in prof.key_averages()}
        times = {k: ns for k, ns in times.items() if ns > 0}
        out[name] = _kernel_summary(times, 5, step)
    return out


def part_ab_jax(size, label):
    """One set of XLA flags (the child's environment): keras_vit's step
    and forward (fused and padded attention) beside the bare JAX step
    and forward; each job's failure is a line, not the part's."""
    import jax
    import numpy as np

    import bare_jax_vit as bare

    rng = np.random.default_rng(0)
    shape = (size["image"], size["image"], 3)
    xi = jax.device_put(rng.uniform(-1, 1, (size["infer_batch"],) + shape)
                        .astype("float32"))
    xt = jax.device_put(rng.uniform(-1, 1, (size["train_batch"],) + shape)
                        .astype("float32"))
    yt = jax.device_put(rng.integers(0, size["classes"], size["train_batch"])
                        .astype("int32"))
    arch = size["arch"]
    heads, patch = arch["num_heads"], arch["patch_size"]
    found = {"rows": [], "errors": {}}

    def measure(job, impl, fn, batch):
        _measure(found, job, impl, lambda: fn, jax.block_until_ready, size,
                 batch)

    model = None
    for attention in ("fused", "padded"):
        os.environ["KERAS_VIT_ATTENTION"] = attention
        model = _keras_model(size, "mixed_bfloat16")
        _compile_for_adamw(model)
        what = ("keras_vit, JAX" if attention == "fused"
                else "keras_vit, JAX, padded cuDNN attention")
        if attention == "fused":
            trainable = [v.value for v in model.trainable_variables]
            other = [v.value for v in model.non_trainable_variables]
            forward = jax.jit(lambda t, o, x, m=model: m.stateless_call(
                t, o, x, training=False)[0])
            measure("inference", what,
                    lambda f=forward, t=trainable, o=other: f(t, o, xi),
                    size["infer_batch"])
        measure("training step", what,
                lambda m=model: m.train_on_batch(xt, yt, return_dict=True),
                size["train_batch"])
    os.environ.pop("KERAS_VIT_ATTENTION", None)
    params = bare.params_from_keras(model)
    for attention in ("xla", "cudnn"):
        step = bare.make_step(heads, patch, "bfloat16", attention)
        state = [jax.tree_util.tree_map(jax.numpy.copy, params), None]
        state[1] = bare.adamw_init(state[0])

        def train(step=step, state=state):
            state[0], state[1], loss = step(state[0], state[1], xt, yt)
            return loss
        measure("training step", f"bare JAX step, {attention} attention",
                train, size["train_batch"])
    forward_bare = bare.make_forward(heads, patch, "bfloat16", "xla")
    measure("inference", "bare JAX forward",
            lambda: forward_bare(params, xi), size["infer_batch"])
    for row in found["rows"]:  # the errors are labelled by run_ab
        row["impl"] += f" [{label}]"
    return dict(found, xla_flags=os.environ.get("XLA_FLAGS", ""))


def _pinned_as_tensor():
    """A stand-in for ``torch.as_tensor`` during a capture: a Python number
    (or list) bound for the GPU goes through pinned memory, the only host
    memory a CUDA graph may copy from. Keras' train step turns seven such
    numbers into tensors on the way (its loss reduction, metric count,
    AdamW's decay and betas, the iteration counter), each a constant of
    the step. Returns ``torch.as_tensor`` itself, the stand-in, and the
    list that keeps the pinned buffers alive for the graph's life."""
    import torch

    original = torch.as_tensor
    kept = []

    def as_tensor(data, dtype=None, device=None):
        if (isinstance(data, torch.Tensor) or device is None
                or torch.device(device).type != "cuda"):
            return original(data, dtype=dtype, device=device)
        host = original(data, dtype=dtype, device="cpu").pin_memory()
        kept.append(host)
        return host.to(device, non_blocking=True)
    return original, as_tensor, kept


def _cuda_graphed(fn, pinned=False):
    """``fn`` captured once as a CUDA graph (after three warm-up calls on
    a side stream, as torch asks): a call replays its kernels without
    Python and returns the capture's outputs, rewritten in place.
    ``pinned``: Python numbers turned into GPU tensors during the capture
    go through pinned memory (:func:`_pinned_as_tensor`)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    original, as_tensor, kept = _pinned_as_tensor()
    if pinned:
        torch.as_tensor = as_tensor
    try:
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        torch.as_tensor = original
    graph.kept = kept

    def replay():
        graph.replay()
        return out
    return replay


def part_torch_jit(size, kind):
    """keras_vit on the torch backend without Keras' per-op dispatch in
    the step: ``kind`` "graph", the forward and Keras' own ``train_step``
    captured as CUDA graphs; "jit", Keras' ``jit_compile=True``
    (torch.compile of its predict and train steps)."""
    import numpy as np
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    shape = (size["image"], size["image"], 3)
    xi, xt, yt = (torch.as_tensor(a, device=device) for a in (
        rng.uniform(-1, 1, (size["infer_batch"],) + shape).astype("float32"),
        rng.uniform(-1, 1, (size["train_batch"],) + shape).astype("float32"),
        rng.integers(0, size["classes"], size["train_batch"])
        .astype("int64")))
    sync = _torch_sync(device)
    found = {"rows": [], "errors": {}}

    def measure(job, impl, make, batch):
        _measure(found, job, impl, make, sync, size, batch, warmup=2)

    def needs_cuda(fn, pinned=False):
        if device != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        return _cuda_graphed(fn, pinned)

    if kind == "jit":
        model = _keras_model(size, "mixed_bfloat16")
        _compile_for_adamw(model, jit_compile=True)
        impl = "keras_vit, torch backend, jit_compile (torch.compile)"
        measure("inference", impl,
                lambda: lambda: model.predict_on_batch(xi),
                size["infer_batch"])
        measure("training step", impl, lambda: lambda: model.train_on_batch(
            xt, yt), size["train_batch"])
        return found
    model = _keras_model(size, "mixed_bfloat16")
    _compile_for_adamw(model)

    def forward():
        with torch.no_grad():
            return model(xi, training=False)
    impl = "keras_vit, torch backend, CUDA graph"
    measure("inference", impl, lambda: needs_cuda(forward),
            size["infer_batch"])
    measure("training step", impl,
            lambda: needs_cuda(lambda: model.train_step((xt, yt))),
            size["train_batch"])
    model = _keras_model(size, "mixed_bfloat16")
    _compile_for_adamw(model)
    measure("training step", impl + ", pinned constants",
            lambda: needs_cuda(lambda: model.train_step((xt, yt)),
                               pinned=True), size["train_batch"])
    return found


def run_part(args):
    _block_tensorflow()
    size = sizes(args)
    backend = os.environ.get("KERAS_BACKEND")
    if args.part in ("jax", "torch"):
        result = part_keras(size, backend)
    elif args.part == "timm":
        result = part_timm(size)
    elif args.part == "roundtrip":
        result = part_roundtrip(size, args.out)
    elif args.part == "profile-jax":
        result = profile_jax(size)
    elif args.part == "profile-torch":
        result = profile_torch(size)
    elif args.part == "ab-jax":
        result = part_ab_jax(size, os.environ["ACCELERATOR_AB_LABEL"])
    elif args.part in ("torch-graph", "torch-jit"):
        result = part_torch_jit(size, args.part.split("-")[1])
    else:
        raise SystemExit(f"unknown part {args.part!r}")
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------
# The parent: starts the parts, reads their results, prints the table


def _child_env(backend, cpu, out):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONUNBUFFERED="1")
    # Two parts never share the GPU, but a test's child or a second
    # process must not find it held whole by JAX's preallocation.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if cpu:
        env["ACCELERATOR_CHECK_ON_CPU"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
    env["ACCELERATOR_CHECK_OUT"] = out
    return env


def _command(part, args):
    if part.startswith("tests-"):
        backend = part.split("-", 1)[1]
        # -P: not the working folder first on the path, where the source
        # tree's keras_vit/ holds no zoo/ or export/ (the installed package
        # maps them in). TensorFlow blocked as in the parts.
        return backend, [sys.executable, "-P", "-c",
                         "import sys; sys.modules['tensorflow'] = None; "
                         "import pytest; sys.exit(pytest.main())",
                         "-o", "addopts=", "-p", "no:cacheprovider",
                         "-p", "no:benchmark", "-q", "-rA", "-m", "gpu",
                         "--backend", backend,
                         os.path.join(ROOT, "tests", "gpu")]
    backend = {"timm": "torch", "roundtrip": "jax", "profile-jax": "jax",
               "profile-torch": "torch", "ab-jax": "jax",
               "torch-graph": "torch", "torch-jit": "torch"}.get(part, part)
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part,
           "--out", args.out]
    return backend, cmd + (["--cpu"] if args.cpu else
                           ["--model", args.model])


def run_ab(args, seconds):
    """The ``ab-jax`` part: one child a set of XLA flags (AB_FLAGS), their
    rows together."""
    start = time.perf_counter()
    rows, errors, children = [], {}, {}
    for i, label in enumerate(args.ab_flags):
        flags = AB_FLAGS[label]
        left = seconds - (time.perf_counter() - start)
        if left < 20:
            errors[label] = "not started: the part's time ran out"
            continue
        extra = {"ACCELERATOR_AB_LABEL": label,
                 "XLA_FLAGS": " ".join(
                     x for x in (os.environ.get("XLA_FLAGS", ""), flags)
                     if x)}
        r = run_child("ab-jax", args, min(AB_LIMIT, left), extra,
                      log_name=f"ab-jax-{i}")
        children[label] = {"exit": r["exit"], "wall_s": r["wall_s"]}
        rows += r.get("rows", [])
        errors.update({f"{k} [{label}]": v
                       for k, v in r.get("errors", {}).items()})
        if r["exit"] != 0:
            errors[label] = r.get("error", "?")
    return {"part": "ab-jax", "exit": 0 if children else "skipped",
            "wall_s": time.perf_counter() - start, "rows": rows,
            "errors": errors, "children": children}


def run_child(part, args, seconds, extra_env=None, log_name=None):
    backend, cmd = _command(part, args)
    log = os.path.join(args.out, f"{log_name or part}.log")
    env = _child_env(backend, args.cpu, args.out)
    env.update(extra_env or {})
    if part == "tests-jax":
        # Compiling, not timing: XLA's GEMM autotuning would only slow the
        # ViT-L programs whose memory the tests read.
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                            + " --xla_gpu_autotune_level=0").strip()
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              cwd=ROOT, timeout=seconds)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code = "timeout"
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (
            e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (
            e.stderr or "")
    wall = time.perf_counter() - start
    with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n# exit {code}, {wall:.0f} s\n"
                f"--- stdout\n{stdout}\n--- stderr\n{stderr}")
    result = {"part": part, "exit": code, "wall_s": wall}
    if part.startswith("tests-"):
        result["summary"] = _pytest_summary(stdout)
    elif code == 0:
        result.update(json.loads(stdout.strip().splitlines()[-1]))
    else:
        result["error"] = (stderr.strip().splitlines() or ["?"])[-1][:200]
    print(f"[{part}] exit {code} in {wall:.0f} s", file=sys.stderr,
          flush=True)
    return result


def _pytest_summary(stdout):
    """pytest's closing line (``3 passed, 1 skipped in 12.3s``)."""
    lines = [line.strip("= ") for line in stdout.splitlines()
             if " in " in line and any(w in line for w in (
                 "passed", "failed", "error", "skipped", "deselected"))]
    return lines[-1] if lines else "no summary (see the log)"


def machine():
    """The accelerator, its driver and the library versions, without
    importing a framework into this process."""
    info = {"cpu": platform.processor() or platform.machine(),
            "python": platform.python_version()}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            line = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total",
                 "--format=csv,noheader"], capture_output=True, text=True,
                timeout=30).stdout.strip().splitlines()[0]
            info["gpu"], info["driver"], info["gpu_memory"] = (
                s.strip() for s in line.split(","))
        except (OSError, subprocess.SubprocessError, IndexError, ValueError):
            pass
    from keras_vit.runtime import hardware

    info["cpu"] = hardware.cpu_model() or info["cpu"]
    from importlib import metadata

    for name in ("jax", "jaxlib", "torch", "timm", "keras", "keras-vit",
                 "numpy"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    return info


def flops_per_image(size):
    return forward_flops(size["image"], num_classes=size["classes"],
                         **size["arch"])


def table(results, size, info, cpu, out):
    """The report: the machine, the tests' outcome, and images/s with model
    FLOP utilisation beside timm."""
    forward = flops_per_image(size)
    timm_part = results.get("timm", {})
    ceiling = timm_part.get("ceiling_flops")
    where = (f"{info.get('gpu', 'no GPU')} (driver "
             f"{info.get('driver', '?')}, {info.get('gpu_memory', '?')})")
    lines = [f"Accelerator check{' (CPU rehearsal, tiny model)' if cpu else ''}"
             f": {where}; CPU {info['cpu']}.",
             "Versions: " + ", ".join(
                 f"{k} {info[k]}" for k in ("python", "jax", "jaxlib",
                                            "torch", "timm", "keras",
                                            "keras-vit", "numpy")) + ".",
             ""]
    arch = size["arch"]
    lines.append(
        f"Model: ViT with patch {arch['patch_size']}, width "
        f"{arch['hidden_size']}, depth {arch['num_layers']}, at "
        f"{size['image']} px ({forward / 1e9:.2f} GFLOP a forward; a "
        "training step counts 3x); bf16 (keras_vit `mixed_bfloat16`, timm "
        "bf16 autocast), AdamW. MFU: model FLOPs/s over the measured bf16 "
        + (f"matmul ceiling ({ceiling / 1e12:.3g} TFLOP/s, "
           f"{timm_part.get('matmul')}^3 through torch)." if ceiling else
           "matmul ceiling (not measured)."))
    lines += ["", "| job | implementation | batch | images/s | ms/step | "
              "MFU | vs timm eager | vs timm + torch.compile |",
              "|---|---|---|---|---|---|---|---|"]
    rows = [r for part in ("jax", "torch", "timm", "ab-jax", "torch-graph",
                           "torch-jit")
            for r in results.get(part, {}).get("rows", [])]
    by = {(r["job"], r["impl"]): r for r in rows}
    for job in ("inference", "training step"):
        per_image = forward * (3 if job == "training step" else 1)
        for r in (r for r in rows if r["job"] == job):
            rate = r["batch"] / r["seconds"]
            mfu = (f"{100 * rate * per_image / ceiling:.1f}%"
                   if ceiling else "")
            peers = []
            for peer in ("timm, eager", "timm + torch.compile"):
                p = by.get((job, peer))
                peers.append(f"{rate / (p['batch'] / p['seconds']):.2f}x"
                             if p and p is not r else "")
            lines.append(f"| {job} | {r['impl']} | {r['batch']} | "
                         f"{rate:,.0f} | {1e3 * r['seconds']:.1f} | {mfu} | "
                         f"{peers[0]} | {peers[1]} |")
    lines += ["", "| part | exit | seconds | outcome |", "|---|---|---|---|"]
    for part, r in results.items():
        outcome = r.get("summary") or r.get("error") or (
            f"trained on {r['device']}, loss "
            f"{r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}; "
            f"{', '.join(r['files'])}" if part == "roundtrip" and "device" in r
            else "measured")
        lines.append(f"| {part} | {r['exit']} | {r['wall_s']:.0f} | "
                     f"{outcome} |")
    for part in ("ab-jax", "torch-graph", "torch-jit"):
        for what, error in results.get(part, {}).get("errors", {}).items():
            lines.append(f"- {part}, {what}: {error}")
    lines += _profile_lines(results)
    extra = os.path.join(out, "remat_memory.json")
    if os.path.exists(extra):
        with open(extra, encoding="utf-8") as f:
            memory = json.load(f)
        lines += ["", _memory_line(memory)]
    return "\n".join(lines)


def _profile_lines(results):
    """The profile parts' findings: accelerator time a step by kernel kind,
    the costliest kernels, and the JAX A/B timings."""
    summaries = {}
    if "profile" in results.get("profile-jax", {}):
        summaries["keras_vit, JAX (XLA)"] = results["profile-jax"]["profile"]
    if "profile_bare" in results.get("profile-jax", {}):
        summaries["bare JAX step"] = results["profile-jax"]["profile_bare"]
    for name, value in results.get("profile-torch", {}).items():
        if isinstance(value, dict) and "top" in value:
            summaries[name] = value
    lines = []
    if summaries:
        kinds = ("matmul", "attention", "element-wise", "copy")
        lines += ["", "Training step, accelerator time by kernel kind (ms a "
                  "step; busy = the sum, step = wall time):", "",
                  "| implementation | " + " | ".join(kinds)
                  + " | busy | step |", "|---" * (len(kinds) + 3) + "|"]
        for name, summ in summaries.items():
            per = summ["ms_per_step"]
            lines.append(f"| {name} | " + " | ".join(
                f"{per.get(k, 0):.1f}" for k in kinds)
                + f" | {summ['busy_ms']:.1f} | {summ['step_ms']:.1f} |")
        for name, summ in summaries.items():
            lines += ["", f"Costliest kernels, {name} (ms a step):", ""]
            lines += [f"- {ms:.2f} {kind}: `{kernel}`"
                      for kernel, kind, ms in summ["top"]]
    ab = results.get("profile-jax", {}).get("ab_ms")
    if ab:
        lines += ["", "JAX training step A/B (ms a step): " + "; ".join(
            f"{k} {v:.1f}" for k, v in ab.items()) + "."]
    return lines


def _memory_line(m):
    return (f"Remat ({m['model']} at {m['image']} px, XLA compiled training "
            f"step on {m['device']}): {m['plain_per_image'] / 2**20:.0f} MiB "
            f"per image without, {m['remat_per_image'] / 2**20:.0f} MiB "
            f"with; in {m['budget_gib']:.0f} GiB a batch of "
            f"{m['plain_fits']} without and {m['remat_fits']} with remat "
            f"({m['ratio']:.1f}x).")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.part:
        return run_part(args)
    start = time.perf_counter()
    info = machine()
    print(json.dumps(info), file=sys.stderr, flush=True)
    results = {}
    for part in args.parts:  # in the order given
        left = args.deadline - (time.perf_counter() - start)
        if left < 20:
            results[part] = {"part": part, "exit": "skipped", "wall_s": 0,
                             "error": f"not started: {args.deadline:.0f} s "
                                      "deadline reached"}
            continue
        limit = min(PART_LIMITS[part], left)
        results[part] = (run_ab(args, limit) if part == "ab-jax"
                         else run_child(part, args, limit))
        # What has been measured so far survives a kill of the whole run.
        with open(os.path.join(args.out, "accelerator.json"), "w",
                  encoding="utf-8") as f:
            json.dump({"machine": info, "results": results}, f, indent=1,
                      default=str)
    size = sizes(args)
    report = table(results, size, info, args.cpu, args.out)
    report += f"\n\nTotal: {time.perf_counter() - start:.0f} s.\n"
    with open(os.path.join(args.out, "accelerator.md"), "w",
              encoding="utf-8") as f:
        f.write(report)
    with open(os.path.join(args.out, "accelerator.json"), "w",
              encoding="utf-8") as f:
        json.dump({"machine": info, "results": results}, f, indent=1,
                  default=str)
    print(report)
    failed = [p for p, r in results.items() if r["exit"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
