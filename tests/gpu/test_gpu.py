"""What only an accelerator can show, checked on each backend that has one
(JAX and torch on the GPU machines; benchmarks/accelerator.py runs these):

- a mixed-precision training step (bfloat16, and float16 with Keras' loss
  scaling) moves the weights as the float32 step does, to the tolerance
  the CPU tests hold the gradients to
  (tests/models/test_mixed_precision_gradients.py);
- the fused attention kernel (``keras.ops.dot_product_attention``: cuDNN
  flash attention on NVIDIA GPUs) gives the einsum path's logits, and is
  the kernel that actually runs;
- rematerialisation lets a ViT-L/16 training step at 384 px hold at least
  4x the batch in the same accelerator memory (XLA's compiled figures; on
  a CPU XLA folds the recomputation away, so only a device shows it).
"""

import importlib.util
import os

import keras
import numpy as np
import pytest

import keras_vit
from gpu_support import record

pytestmark = [pytest.mark.gpu, pytest.mark.backends]

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CLASSES = 6


def _on_device():
    return os.environ.get("ACCELERATOR_CHECK_ON_CPU") != "1"


def _vit(dtype):
    # 17 tokens of 256 images: 4,352 rows in every projection's bias sum,
    # enough to stall a running sum kept in 16 bits.
    return keras_vit.vit(16, 4, 32, 1, 2, 64, CLASSES,
                         representation_size=16, dtype=dtype)


def _random_head(model):
    """The paper's head starts at zero, which would leave the logits and
    every other gradient zero."""
    head = model.get_layer("head").kernel
    head.assign(np.random.default_rng(1).normal(0, 0.5, head.shape)
                .astype("float32"))


def _batch(size, count):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (count, size, size, 3)).astype("float32")
    return x, (np.arange(count) % CLASSES).astype("int32")


def _one_sgd_step(model, x, y, tries=1):
    """The weights' change from one applied SGD step. A loss-scaled step
    that overflows is skipped (Keras lowers the scale and leaves the
    weights alone), so a float16 model gets up to ``tries`` calls."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    before = [np.asarray(v.numpy(), "float64")
              for v in model.trainable_variables]
    for _ in range(tries):
        model.train_on_batch(x, y)
        after = [np.asarray(v.numpy(), "float64")
                 for v in model.trainable_variables]
        if any(np.any(a != b) for a, b in zip(after, before)):
            break
    return [a - b for a, b in zip(after, before)]


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_mixed_precision_training_step_moves_the_weights_as_float32_does(
        policy):
    keras.utils.set_random_seed(0)
    reference, mixed = _vit(None), _vit(policy)
    _random_head(reference)
    mixed.set_weights(reference.get_weights())
    x, y = _batch(16, 256)
    want = _one_sgd_step(reference, x, y)
    got = _one_sgd_step(mixed, x, y, tries=5)
    if policy == "mixed_float16":
        assert isinstance(mixed.optimizer, keras.optimizers.LossScaleOptimizer)
    errors = {}
    for v, g, r in zip(reference.trainable_variables, got, want):
        if not np.any(r):
            continue
        errors[v.path] = float(np.linalg.norm(g - r) / np.linalg.norm(r))
    # The CPU tests' bound on the row sums (biases, norms' betas; the key's
    # bias has a zero gradient in exact arithmetic, only noise here), and
    # the same bound on the median of every variable.
    sums = {p: e for p, e in errors.items()
            if p.endswith(("bias", "beta")) and not p.endswith("key/bias")}
    record(f"mixed_step_{BACKEND}_{policy}",
           {"worst": max(errors.values()), "median":
            float(np.median(list(errors.values()))),
            "worst_sum": max(sums.values())})
    assert len(sums) >= 6, sums
    worst = max(sums, key=sums.get)
    assert sums[worst] < 0.05, (worst, sums[worst])
    assert float(np.median(list(errors.values()))) < 0.05, errors


def _attention_kernels(model, x):
    """The names of the attention kernels the backend runs for the model's
    forward: cuDNN's fused attention custom call in the program XLA
    compiles (JAX), the kernels torch's profiler sees (torch)."""
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        other = [v.value for v in model.non_trainable_variables]
        text = jax.jit(lambda t, o, x: model.stateless_call(
            t, o, x, training=False)[0]).lower(
                trainable, other, x).compile().as_text()
        return sorted({word.strip('"(),') for word in text.split()
                       if "cudnn" in word.lower() and "fmha" in word.lower()})
    import torch

    with torch.profiler.profile(activities=[
            torch.profiler.ProfilerActivity.CUDA]) as prof, torch.no_grad():
        model(x, training=False)
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()
                   if any(w in e.key.lower() for w in (
                       "flash", "fmha", "efficient_attention", "cudnn"))})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_attention_kernel_gives_the_einsum_paths_logits(
        dtype, monkeypatch):
    keras.utils.set_random_seed(0)
    # ViT-B/16's head width (64) and token count (197 at 224 px).
    model = keras_vit.vit(224, 16, 128, 2, 2, 256, 10, dtype=dtype)
    _random_head(model)
    x, _ = _batch(224, 8)
    if BACKEND == "torch":
        import torch

        x = torch.as_tensor(x, device="cuda" if _on_device() else "cpu")
    out = {}
    for path in ("einsum", "fused"):
        monkeypatch.setenv("KERAS_VIT_ATTENTION", path)
        out[path] = np.asarray(keras.ops.convert_to_numpy(
            keras.ops.cast(model(x, training=False), "float32")))
    scale = float(np.abs(out["einsum"]).max())
    error = float(np.abs(out["fused"] - out["einsum"]).max()) / scale
    kernels = (_attention_kernels(model, x)
               if dtype == "bfloat16" and _on_device() else [])
    record(f"attention_{BACKEND}_{dtype}",
           {"relative_error": error, "kernels": kernels})
    # float32 matmuls may run as TF32 on the GPU (10-bit mantissa) in
    # either path; bfloat16 has 8 bits.
    assert error < (2e-2 if dtype == "bfloat16" else 5e-3), error
    if dtype == "bfloat16" and _on_device():
        assert kernels, (
            f"no fused attention kernel ran on {BACKEND} for bf16 "
            "(head width 64, 197 tokens)")


def _remat_module():
    spec = importlib.util.spec_from_file_location(
        "remat_benchmark", os.path.join(ROOT, "benchmarks", "remat.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_remat_holds_four_times_the_batch_of_a_vit_l_step():
    if BACKEND != "jax":
        pytest.skip("XLA's compiled memory is JAX's (torch's remat is "
                    "timed by benchmarks/remat.py)")
    import jax

    remat = _remat_module()
    on_device = _on_device()
    name, size = ("ViT-L/16", 384) if on_device else ("ViT-Ti/16", 64)
    batch = 8
    compiled = {}
    for setting in (False, True):
        model = keras_vit.zoo.load(name, weights=None, image_size=size,
                                   num_classes=1000, remat=setting)
        weights = sum(int(np.prod(v.shape)) * 4
                      for v in model.trainable_variables)
        compiled[setting] = remat.compiled_bytes(model, batch, size)
        del model
    stats = jax.devices()[0].memory_stats() or {}
    budget = stats.get("bytes_limit", 16 * 2**30)
    # Weights, their gradients and the batch are the same either way; what
    # grows with the batch is the rest of the compiled step.
    fixed = 2 * weights
    per_image = {k: max(1, (v - fixed) / batch) for k, v in compiled.items()}
    # Beside the batch: the weights, their gradients and AdamW's two moments.
    fits = {k: int((budget - 4 * weights) // v) for k, v in per_image.items()}
    ratio = fits[True] / max(1, fits[False])
    record("remat_memory", {
        "model": name, "image": size, "device": jax.devices()[0].device_kind,
        "budget_gib": budget / 2**30, "compiled_plain": compiled[False],
        "compiled_remat": compiled[True], "plain_per_image": per_image[False],
        "remat_per_image": per_image[True], "plain_fits": fits[False],
        "remat_fits": fits[True], "ratio": ratio})
    assert compiled[False] > fixed and compiled[True] > fixed
    if on_device:
        assert ratio >= 4, (fits, per_image)
