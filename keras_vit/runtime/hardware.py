"""What the machine offers, and the execution plan chosen from it.

Decided once per process from what the hardware has:

* CPUs with AMX run bf16 matmuls through TensorFlow's oneDNN kernels 4-6x
  faster than float32 (XLA's CPU dots do not use the tiles): graph path.
* Other CPUs: bf16 takes the graph path when :func:`bf16_matmul_speedup`
  finds it at least ``BF16_GRAPH_MIN_SPEEDUP`` faster (a Zen 4 ran a
  ViT-B/16 bf16 forward 1.8x float32 through the graph, 0.97x through XLA;
  CPUs that only emulate bf16 are slower); otherwise XLA.
* float32 on any CPU: TensorFlow's graph (oneDNN fuses matmul, bias and
  GELU), as fast as XLA or faster, with no compile per batch size.
* :func:`enable_onednn` turns oneDNN on where TensorFlow would not
  (AVX2-only CPUs: 11-28% less CPU time per image in ``predict``, 15% per
  training step on a 2-core EPYC).
* GPUs and TPUs: XLA. JAX compiles with XLA, torch runs eagerly; both use
  the fused ``keras.ops.dot_product_attention``, which TensorFlow lacks.

``detect()`` reads ``/proc/cpuinfo`` (``KERAS_VIT_CPU_FLAGS`` and
``KERAS_VIT_ACCELERATOR`` force a machine); ``plan(dtype)`` turns it into the
paths used by ``predict`` and training; an explicit argument always wins.

>>> from keras_vit.runtime import hardware
>>> amx = hardware.Hardware("cpu", frozenset({"amx_bf16", "amx_tile"}))
>>> amx.bf16_units
'amx'
>>> p = hardware.plan("bfloat16", amx, backend="tensorflow")
>>> p.predict, p.train_jit
('graph', False)
>>> plain = hardware.Hardware("cpu", frozenset({"avx2"}))
>>> hardware.plan("bfloat16", plain, backend="tensorflow").predict
'xla'
>>> hardware.plan("float32", plain, backend="tensorflow").predict
'graph'
>>> hardware.plan("float32", plain, backend="torch").attention
'fused'
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import sys

from keras_vit.base import environment

ACCELERATORS = environment.VARIABLES["KERAS_VIT_ACCELERATOR"].choices
PREDICT_PATHS = ("xla", "graph", "eager")

# /proc/cpuinfo flag names, best first.
_BF16_UNITS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16"))
_INT8_UNITS = (("amx_int8", "amx"), ("avx512_vnni", "avx512_vnni"),
               ("avx_vnni", "avx_vnni"))


#: TensorFlow's switch for its oneDNN CPU graph rewrites, read once when
#: TensorFlow is imported.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
#: ``KERAS_VIT_ONEDNN=0`` keeps :func:`enable_onednn` from setting it.
KERAS_VIT_ONEDNN_ENV = "KERAS_VIT_ONEDNN"

_onednn_decision = None


def enable_onednn(environ=None, modules=None, machine=None, system=None):
    """Turns on TensorFlow's oneDNN CPU graph rewrites (sets
    ``TF_ENABLE_ONEDNN_OPTS=1``) where TensorFlow would leave them off,
    before TensorFlow is imported; returns why it did or did not, in words.

    TensorFlow enables them by itself only on CPUs with AVX512-VNNI,
    AVX512-BF16, AVX-VNNI or AMX. Nothing changes when the user set
    ``TF_ENABLE_ONEDNN_OPTS`` or ``KERAS_VIT_ONEDNN=0``, once TensorFlow is
    imported, or off Linux x86-64 (where it was measured). A bad
    ``KERAS_VIT_ONEDNN`` raises
    :class:`~keras_vit.base.environment.SettingError`. Without arguments
    the process decides once.

    >>> env = {}
    >>> enable_onednn(env, {}, "x86_64", "Linux")
    'on: keras_vit set TF_ENABLE_ONEDNN_OPTS=1'
    >>> env
    {'TF_ENABLE_ONEDNN_OPTS': '1'}
    >>> enable_onednn({"TF_ENABLE_ONEDNN_OPTS": "0"}, {}, "x86_64", "Linux")
    "as the user set it: TF_ENABLE_ONEDNN_OPTS='0'"
    >>> enable_onednn({}, {"tensorflow": object()}, "x86_64", "Linux")
    "TensorFlow's default: it was imported before keras_vit"
    """
    global _onednn_decision

    if environ is None and modules is None:  # this process: once
        if _onednn_decision is None:
            _onednn_decision = enable_onednn(os.environ, sys.modules,
                                             machine, system)
        return _onednn_decision
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    machine = platform.machine() if machine is None else machine
    system = platform.system() if system is None else system
    ours = environment.read(KERAS_VIT_ONEDNN_ENV, environ)  # checked first
    if ONEDNN_ENV in environ:
        return f"as the user set it: {ONEDNN_ENV}={environ[ONEDNN_ENV]!r}"
    if not ours:
        return f"TensorFlow's default: {KERAS_VIT_ONEDNN_ENV}=0"
    if "tensorflow" in modules:
        return "TensorFlow's default: it was imported before keras_vit"
    if system != "Linux" or machine.lower() not in ("x86_64", "amd64"):
        return f"TensorFlow's default on {system} {machine}"
    environ[ONEDNN_ENV] = "1"
    return f"on: keras_vit set {ONEDNN_ENV}=1"


def onednn_note():
    """What :func:`enable_onednn` decided for this process, and
    whether this TensorFlow runs its CPU graphs through oneDNN: one line
    for benchmark tables."""
    from keras_vit.runtime import compat

    state = "on" if compat.onednn_enabled() else "off"
    return f"{state} ({_onednn_decision or 'keras_vit made no decision'})"


@dataclasses.dataclass(frozen=True)
class Hardware:
    """The device keras_vit runs on: ``accelerator`` (``"cpu"``, ``"gpu"``
    or ``"tpu"``), the CPU's feature flags and its model name."""

    accelerator: str = "cpu"
    cpu_flags: frozenset = frozenset()
    cpu_model: str = ""

    @property
    def bf16_units(self):
        """``"amx"``, ``"avx512_bf16"`` or None: the CPU's bf16 matrix
        instructions."""
        return next((name for flag, name in _BF16_UNITS
                     if flag in self.cpu_flags), None)

    @property
    def int8_units(self):
        """``"amx"``, ``"avx512_vnni"``, ``"avx_vnni"`` or None."""
        return next((name for flag, name in _INT8_UNITS
                     if flag in self.cpu_flags), None)

    def describe(self):
        """One line for benchmark tables and logs."""
        units = [f"bf16: {self.bf16_units or 'none'}",
                 f"int8: {self.int8_units or 'none'}"]
        model = self.cpu_model or "unknown CPU"
        return (f"{self.accelerator}; {model} ({os.cpu_count()} logical "
                f"cores; {', '.join(units)})")


def proc_text(path):
    """The text of a Linux ``/proc`` file (``/proc/cpuinfo``,
    ``/proc/meminfo``, ``/proc/self/status``, ...), or None where it cannot
    be read (not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def cpu_fields(path="/proc/cpuinfo"):
    """``{field: value}`` of ``/proc/cpuinfo``, the first processor's;
    ``{}`` where the file cannot be read."""
    fields = {}
    for line in (proc_text(path) or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _read_cpuinfo(path="/proc/cpuinfo"):
    fields = cpu_fields(path)
    flags = fields.get("flags", fields.get("Features", ""))
    return frozenset(flags.split()), fields.get("model name", "")


def cpu_flags():
    """The CPU's feature flags: ``KERAS_VIT_CPU_FLAGS`` when set, else
    ``/proc/cpuinfo``'s; empty where neither says."""
    forced = environment.read("KERAS_VIT_CPU_FLAGS")
    return _read_cpuinfo()[0] if forced is None else forced


def cpu_model():
    """The CPU's model name from ``/proc/cpuinfo``, or ``""``."""
    return _read_cpuinfo()[1]


def _accelerator(forced):
    if forced:
        return forced
    import keras

    backend = keras.backend.backend()
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            for kind in ("tpu", "gpu"):
                if tf.config.list_logical_devices(kind.upper()):
                    return kind
        elif backend == "jax":
            import jax

            platform = jax.default_backend()
            return platform if platform in ACCELERATORS else (
                "gpu" if platform in ("cuda", "rocm") else "cpu")
        elif backend == "torch":
            import torch

            if torch.cuda.is_available():
                return "gpu"
    except Exception:  # a broken driver is a CPU machine to us
        pass
    return "cpu"


@functools.lru_cache(maxsize=None)
def _detect(flags, accelerator, backend):
    found, model = _read_cpuinfo()
    return Hardware(_accelerator(accelerator),
                    found if flags is None else flags, model)


def detect():
    """The :class:`Hardware` of this process (cached; the environment
    overrides ``KERAS_VIT_CPU_FLAGS`` and ``KERAS_VIT_ACCELERATOR`` are read
    on each call, so tests can change them)."""
    import keras

    return _detect(environment.read("KERAS_VIT_CPU_FLAGS"),
                   environment.read("KERAS_VIT_ACCELERATOR"),
                   keras.backend.backend())


#: bf16 takes TensorFlow's graph path on a CPU without AMX when a probe
#: finds oneDNN's bf16 matmul at least this much faster than float32 (Zen 4
#: measured about 2x; CPUs that only emulate bf16 below 1).
BF16_GRAPH_MIN_SPEEDUP = 1.3


@functools.lru_cache(maxsize=None)
def bf16_matmul_speedup():
    """How much faster TensorFlow's graph runs a ViT-sized bf16 matmul than
    the float32 one on this CPU (best of 5 each), measured once per process
    in about a second."""
    import time

    import tensorflow as tf

    with tf.init_scope():  # eager, even when first asked inside a trace
        rng = tf.random.Generator.from_seed(0)
        a = rng.uniform((512, 768))
        b = rng.uniform((768, 3072))
        best = {}
        for dtype in ("float32", "bfloat16"):
            x, y = tf.cast(a, dtype), tf.cast(b, dtype)
            fn = tf.function(lambda x, y: tf.reduce_sum(
                tf.cast(tf.linalg.matmul(x, y)[:1, :1], "float32")))
            fn(x, y).numpy()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                fn(x, y).numpy()
                times.append(time.perf_counter() - start)
            best[dtype] = min(times)
    return best["float32"] / max(best["bfloat16"], 1e-9)


def _onednn_bf16(hardware, probed):
    """Whether TensorFlow runs bf16 through oneDNN on ``hardware``: asked of
    TensorFlow when ``probed``, else read off its flags (bf16 units or
    AVX512F)."""
    if not probed:
        return hardware.bf16_units is not None or "avx512f" in \
            hardware.cpu_flags
    from keras_vit.runtime import compat

    return compat.onednn_supports("bfloat16")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to run a model of one dtype here.

    ``predict``: ``"xla"``, ``"graph"`` (a ``tf.function`` without XLA)
    or ``"eager"``; ``train_jit``: the ``jit_compile`` of training steps;
    ``attention``: ``"fused"`` (``keras.ops.dot_product_attention``) or
    ``"einsum"``; ``reason``: why, in words; ``softmax``: the einsum
    attention's softmax dtype, ``"float32"`` or ``"input"`` (bf16 into
    oneDNN's softmax, float32 inside); ``elementwise``: ``"xla"`` (the GELU
    and LayerNorm chains of a training step as small XLA programs,
    :func:`keras_vit.runtime.fused_ops.xla_gelu`) or ``"graph"``;
    ``train_attention``: ``"padded"`` where training pads the tokens to a
    multiple of 64 for cuDNN's flash attention
    (:func:`keras_vit.runtime.kernels.padded_attention`), else None.
    """

    predict: str
    train_jit: bool
    attention: str
    reason: str
    softmax: str = "float32"
    elementwise: str = "graph"
    train_attention: str | None = None


@functools.cache
def cudnn_flash_attention():
    """Whether JAX's first device runs cuDNN's flash attention: an NVIDIA
    GPU of compute capability 8.0 (Ampere) or later. Asked once."""
    import jax

    device = jax.devices()[0]
    try:
        return (device.platform == "gpu"
                and float(getattr(device, "compute_capability", 0)) >= 8.0)
    except (TypeError, ValueError):
        return False


def _dtype_name(dtype):
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("mixed_", "")


#: ``KERAS_VIT_ATTENTION=fused`` or ``einsum`` forces the attention path
#: of :func:`plan` (benchmarks/attention_paths.py times both this way).
ATTENTION_ENV = "KERAS_VIT_ATTENTION"


def plan(dtype="float32", hardware=None, backend=None):
    """The :class:`Plan` for a compute ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"``, or a mixed policy name) on ``hardware``
    (default: :func:`detect`) under ``backend`` (default: Keras').
    ``KERAS_VIT_ATTENTION`` (``fused``/``einsum``) overrides its
    ``attention``."""
    chosen = _plan(dtype, hardware, backend)
    forced = environment.read(ATTENTION_ENV)
    if not forced:
        return chosen
    return dataclasses.replace(chosen, attention=forced,
                               train_attention=None,
                               reason=f"{ATTENTION_ENV}={forced}")


def _plan(dtype, hardware, backend):
    import keras

    backend = backend or keras.backend.backend()
    # A Hardware passed in or forced is judged by its flags alone.
    probed = hardware is None and environment.read(
        "KERAS_VIT_CPU_FLAGS") is None
    hardware = hardware or detect()
    dtype = _dtype_name(dtype)
    if backend == "jax":
        if dtype == "float16" and hardware.accelerator == "cpu":
            # The fused kernel asks for a float16 dot accumulating in
            # float32, which XLA:CPU cannot compile.
            return Plan("xla", True, "einsum",
                        "JAX compiles with XLA; float16 on its CPU backend "
                        "has no fused attention")
        if (hardware.accelerator == "gpu" and dtype in ("bfloat16", "float16")
                and probed and cudnn_flash_attention()):
            # cuDNN's flash kernel refuses the backward pass of 197
            # tokens; padded to 256, ViT-B/16's bf16 AdamW step took 44.4
            # ms against 56.4 on an H200 (docs/benchmarks-gpu.md).
            return Plan("xla", True, "fused",
                        "JAX compiles with XLA; training pads the tokens "
                        "for cuDNN's flash attention",
                        train_attention="padded")
        return Plan("xla", True, "fused", "JAX compiles with XLA")
    if backend == "torch":
        return Plan("eager", False, "fused",
                    "torch runs eagerly with its fused attention")
    if hardware.accelerator != "cpu":
        return Plan("xla", True, "einsum",
                    f"XLA on the {hardware.accelerator.upper()}")
    if dtype == "bfloat16" and hardware.bf16_units == "amx":
        return Plan("graph", False, "einsum",
                    "CPU with AMX: TensorFlow's oneDNN kernels use its bf16 "
                    "tiles, XLA's CPU dots do not",
                    softmax=("input" if _onednn_bf16(hardware, probed)
                             else "float32"), elementwise="xla")
    if dtype == "bfloat16" and probed and _onednn_bf16(hardware, probed):
        speedup = bf16_matmul_speedup()
        if speedup >= BF16_GRAPH_MIN_SPEEDUP:
            return Plan("graph", False, "einsum",
                        f"bf16 matmuls through TensorFlow's oneDNN kernels "
                        f"ran {speedup:.2f}x float32 on this CPU (probed "
                        f"once; {hardware.bf16_units or 'no'} bf16 units)",
                        softmax="input", elementwise="xla")
    if dtype in ("bfloat16", "float16"):
        return Plan("xla", True, "einsum",
                    f"{dtype} on a CPU without AMX: XLA's fusions are the "
                    "faster path")
    return Plan("graph", False, "einsum",
                "float32 on CPU: TensorFlow's graph, whose oneDNN kernels "
                "fuse the MLP and bias adds (as fast as XLA or faster on "
                "the CPUs measured, without a compile per batch size)",
                elementwise="xla")


def proc_bytes(path, field):
    """The ``field`` of a Linux ``/proc`` file that counts kB
    (``MemAvailable:   123 kB``), in bytes; None where it is missing."""
    for line in (proc_text(path) or "").splitlines():
        if line.startswith(field + ":"):
            try:
                return int(line.split()[1]) * 1024
            except (ValueError, IndexError):
                return None
    return None


def available_memory():
    """Bytes of memory available to a new allocation on this machine
    (Linux ``MemAvailable``), or None where unknown."""
    return proc_bytes("/proc/meminfo", "MemAvailable")


def memory_total():
    """Bytes of memory this machine has (Linux ``MemTotal``), or None
    where unknown."""
    return proc_bytes("/proc/meminfo", "MemTotal")


def resident_memory():
    """Bytes of this process's resident memory now (Linux
    ``/proc/self/statm``), or None where unknown."""
    try:
        pages = int((proc_text("/proc/self/statm") or "").split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_memory():
    """Bytes of this process's peak resident memory since it started
    (Linux ``VmHWM``, which ``exec`` resets), or None where unknown."""
    return proc_bytes("/proc/self/status", "VmHWM")
