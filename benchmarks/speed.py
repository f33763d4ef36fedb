"""ViT-B/16 speed, side by side with timm and keras-hub, in one run on one
machine: inference, a fine-tuning step, checkpoint loading, and the
machine's matrix-multiply ceiling; keras_vit's rows on each Keras backend
(TensorFlow here, JAX and PyTorch in a child process each). Prints markdown
tables and writes them to docs/benchmarks.md.

    python benchmarks/speed.py                      # the full run
    python benchmarks/speed.py --sizes 224 --batches 1 --runs 5 --skip-train
    python benchmarks/speed.py --backend-rows-only --sizes 224 --batches 8
    python benchmarks/speed.py --quick --out /tmp/speed.md   # smoke test

Every timed figure is the median of ``--runs`` calls after the first call
(reported apart as "first call": tracing, XLA compilation, allocation) and
``--warmup`` more untimed calls. The machine is shared and noisy, so the
calls are interleaved: each round calls every path of one configuration
once, in turn, and the ratios within one run are what count.

Models have random weights (``keras_vit.zoo.load("ViT-B/16",
weights=None)``, ``timm.create_model(..., pretrained=False)``); speed does
not depend on the values. ``--quick`` shrinks the model (patch 8, width 32,
1 layer at 32x32) to test the script itself in seconds; its numbers say
nothing about ViT-B/16.

torch and timm are imported before TensorFlow: torchvision (imported by
timm) crashes when it is loaded after TensorFlow 2.21.

This file is the runner: the command line, the cases and their interleaved
rounds, and the report. Beside it: speed_peers.py (the model configurations,
their FLOPs, and timm and keras-hub), speed_backends.py (keras_vit's timed
calls and the child process per other Keras backend), speed_loading.py (the
checkpoint-loading children) and speed_tables.py (the report's tables).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

import numpy as np

# The sibling modules, wherever this file runs from: as a script (its folder
# is then sys.path[0]), loaded by path (the tests) or as a child of itself.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from speed_backends import (  # noqa: E402
    BACKENDS, DTYPES, BackendChild, backend_child, fit_call, images, labels,
    predict_call)
from speed_loading import load_child, measure_loading  # noqa: E402
from speed_peers import (  # noqa: E402
    PEERS, TINY, VIT_B16, forward_flops, import_peers, keras_hub_backbone,
    keras_vit_model, threads, timm_model, versions)
from speed_tables import (  # noqa: E402
    backend_rows, backend_table, ceiling_table, ceilings, exit_now, fmt,
    loading_rows, loading_table, model_table, targets_table)

# What the measured paths turned out to be (e.g. whether Keras compiled
# with XLA), collected while building them and printed under the tables.
NOTES = {}


_T0 = time.perf_counter()


def say(*args):
    """Progress on stderr, with the seconds since the start."""
    print(f"[{time.perf_counter() - _T0:6.0f}s]", *args, flush=True,
          file=sys.stderr)


# --------------------------------------------------------------------------
# timing: every case of one configuration in turn, round after round


class Case:
    """One measured path: ``fn()`` runs one call (and waits for it)."""

    def __init__(self, section, framework, path, dtype, size, batch,
                 flops, make, backend=None):
        self.section, self.framework, self.path = section, framework, path
        # The Keras backend of a keras_vit / keras-hub row; None for timm
        # and the matmuls.
        self.backend = backend
        self.dtype, self.size, self.batch = dtype, size, batch
        self.flops = flops  # per call
        self.make = make
        self.fn = None
        self.first_s = None
        self.times = []
        self.error = None

    @property
    def key(self):
        return (self.section, self.framework, self.path, self.dtype)

    def row(self):
        median = statistics.median(self.times) if self.times else None
        return {"section": self.section, "framework": self.framework,
                "backend": self.backend,
                "path": self.path, "dtype": self.dtype, "size": self.size,
                "batch": self.batch, "first_call_s": self.first_s,
                "median_s": median, "runs": len(self.times),
                "images_per_s": self.batch / median if median else None,
                "gflops_per_s": self.flops / median / 1e9 if median else None,
                "error": self.error}


def run_cases(cases, runs, warmup):
    """First call and warm-up of each case, then ``runs`` rounds in which
    every case is called once, in turn (so that a noisy minute on the
    shared machine slows every path, not one)."""
    live = []
    for case in cases:
        where = f" {case.size}px batch {case.batch}" if case.size else ""
        on = f" on {case.backend}" if case.framework == "keras_vit" else ""
        say(f"  first call: {case.framework}{on} {case.path} {case.dtype}"
            + where)
        try:
            if case.fn is None:
                case.fn = case.make()
            start = time.perf_counter()
            case.fn()
            case.first_s = time.perf_counter() - start
            for _ in range(warmup):
                case.fn()
            live.append(case)
        except Exception as e:  # noqa: BLE001 - reported in the table
            case.error = f"{type(e).__name__}: {str(e)[:200]}"
            say(f"    failed: {case.error}")
    for i in range(runs):
        for case in list(live):
            start = time.perf_counter()
            try:
                case.fn()
            except Exception as e:  # noqa: BLE001 - reported in the table
                case.error = f"{type(e).__name__}: {str(e)[:200]}"
                case.times = []
                live.remove(case)
                continue
            case.times.append(time.perf_counter() - start)
        say(f"  round {i + 1}/{runs} done")
    for case in cases:
        case.fn = None
    return [c.row() for c in cases]


# --------------------------------------------------------------------------
# environment


def onednn_line():
    """Whether TensorFlow ran its CPU graphs through oneDNN, and who
    decided (keras_vit.runtime.hardware.enable_onednn)."""
    from keras_vit.runtime import hardware

    return hardware.onednn_note()


def cpu_model():
    from keras_vit.runtime import hardware

    return hardware.cpu_model() or platform.processor() or "unknown"


def matrix_units():
    """The CPU features the speed decisions hinge on, as
    keras_vit.runtime.hardware reads them (/proc/cpuinfo)."""
    from keras_vit.runtime import hardware

    hw = hardware.detect()
    wanted = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16",
              "avx512_vnni", "avx_vnni", "avx512f")
    have = [f for f in wanted if f in hw.cpu_flags]
    return (", ".join(have) or "none of " + ", ".join(wanted)) + (
        f" (bf16 units: {hw.bf16_units or 'none'}, int8 units: "
        f"{hw.int8_units or 'none'})") + isa_caps()


# Variables that make oneDNN (TensorFlow's and torch's), torch's own kernels
# and MKL use fewer instructions than the CPU has: how to time a CPU's
# older siblings (AVX2-only kernels) on a newer one.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
            "MKL_ENABLE_INSTRUCTIONS")


def isa_caps(environ=None):
    """The kernel caps set in ``environ`` (default: this process's), as a
    note for the report's header; the flags above are the CPU's, not what
    its kernels were allowed to use.

    >>> isa_caps({})
    ''
    >>> isa_caps({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    '; kernels capped by ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2'
    """
    environ = os.environ if environ is None else environ
    caps = [f"{k}={environ[k]}" for k in ISA_CAPS if environ.get(k)]
    return "; kernels capped by " + ", ".join(caps) if caps else ""


def plan_note():
    from keras_vit.runtime import hardware

    parts = []
    for dtype in ("float32", "bfloat16"):
        p = hardware.plan(dtype)
        parts.append(f"{dtype}: predict {p.predict}, training XLA "
                     f"{p.train_jit} ({p.reason})")
    return "; ".join(parts)


# --------------------------------------------------------------------------
# inference


def _xla(model):
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=False), jit_compile=True)


def inference_cases(size, batches, arch, classes, peers, exports, tmp,
                    children=(), backend_rows_only=False, dtypes=DTYPES):
    import tensorflow as tf

    flops = forward_flops(size, num_classes=classes, **arch)
    cases, keep = [], {}

    def add(framework, path, dtype, make_for_batch):
        backend = None if framework == "timm" else "tensorflow"
        for b in batches:
            cases.append(Case("inference", framework, path, dtype, size, b,
                              flops * b, lambda b=b: make_for_batch(b),
                              backend))

    def model(dtype):
        if dtype not in keep:
            keep[dtype] = keras_vit_model(size, arch, classes, dtype)
        return keep[dtype]

    def predict(dtype, path="auto"):
        def make(b):
            fn, resolved = predict_call(model(dtype), b, size, path)
            NOTES[f"keras_vit {dtype or 'float32'} model, predict_path="
                  f"{path!r}"] = f"runs the {resolved!r} path"
            return fn
        return make

    from keras_vit.runtime import hardware

    for dtype in dtypes:
        chosen = hardware.plan(dtype).predict
        add("keras_vit", f"model.predict (auto: {chosen})", dtype,
            predict(None if dtype == "float32" else dtype))
        for child in [c for c in children if dtype in c.dtypes]:
            for b in batches:
                cases.append(child.case(Case(
                    "inference", "keras_vit", "model.predict (auto)", dtype,
                    size, b, flops * b, None, child.backend)))
        for other in ("xla", "graph"):
            if (other != chosen and dtype != "mixed_bfloat16"
                    and not backend_rows_only):
                add("keras_vit", f"model.predict, predict_path={other!r}",
                    dtype, predict(None if dtype == "float32" else dtype,
                                   other))
    for runtime in exports:
        add("keras_vit", {"onnx": "onnxruntime", "tflite": "LiteRT"}[runtime],
            "float32", _export_runner(runtime, model, keep, size, tmp))
    if "torch" in peers:
        torch = peers["torch"]

        def tm():
            if "timm" not in keep:
                keep["timm"] = timm_model(peers["timm"], size, arch,
                                          classes).eval()
            return keep["timm"]

        def timm_run(bf16):
            def make(b):
                m, x = tm(), torch.from_numpy(
                    images(b, size).transpose(0, 3, 1, 2).copy())

                def fn():
                    with torch.inference_mode():
                        if bf16:
                            with torch.autocast("cpu", dtype=torch.bfloat16):
                                return m(x)
                        return m(x)
                return fn
            return make

        if "float32" in dtypes:
            add("timm", "eager, inference_mode", "float32", timm_run(False))
        if set(dtypes) - {"float32"}:
            add("timm", "eager, inference_mode", "bf16 autocast",
                timm_run(True))
    if "keras_hub" in peers and not backend_rows_only:
        def bb():
            if "hub" not in keep:
                keep["hub"] = keras_hub_backbone(peers["keras_hub"], size,
                                                 arch)
            return keep["hub"]

        def hub_predict(b):
            m, x = bb(), images(b, size)
            NOTES["keras_hub ViTBackbone"] = (
                f"model.jit_compile = {m.jit_compile}")
            return lambda: m.predict(x, batch_size=b, verbose=0)

        def hub_xla(b):
            f = keep.setdefault("hub_xla", _xla(bb()))
            x = tf.constant(images(b, size))
            return lambda: f(x).numpy()

        # The backbone has no head: (B, N, D) out, 0.77M MACs less than
        # keras_vit and timm (0.004% of ViT-B/16).
        add("keras_hub", "ViTBackbone.predict", "float32", hub_predict)
        add("keras_hub", "tf.function(jit_compile=True)", "float32",
            hub_xla)
    return cases, keep


def _export_runner(runtime, model, keep, size, tmp):
    """onnxruntime / LiteRT through keras_vit.export.benchmark's runners
    (export, verify, open), once per size."""
    def make(b):
        if runtime not in keep:
            from keras_vit.export import benchmark
            from keras_vit.export.graph import ServingGraph

            graph = ServingGraph(model(None), outputs=("features",))
            keep[runtime], _ = benchmark._runner(runtime, graph.model, graph,
                                                 tmp, say)
        fn, x = keep[runtime], images(b, size)
        return lambda: fn(x)
    return make


# --------------------------------------------------------------------------
# training


def training_cases(size, batch, arch, classes, peers, children=(),
                   backend_rows_only=False, dtypes=DTYPES):
    import keras
    import tensorflow as tf

    from keras_vit.runtime import hardware

    flops = 3 * batch * forward_flops(size, num_classes=classes, **arch)
    x = images(batch, size)
    y = labels(batch, classes)
    cases = []

    def add(framework, path, dtype, make):
        backend = None if framework == "timm" else "tensorflow"
        cases.append(Case("training", framework, path, dtype, size, batch,
                          flops, make, backend))

    def trainer_step(precision, jit="auto"):
        def make():
            from keras_vit.train import Trainer
            from keras_vit.train.data.sources import ArraySource

            pixels = ((x + 1) * 127.5).astype("uint8")
            trainer = Trainer(
                "ViT-B/16", ArraySource(pixels, y, classes), recipe="finetune",
                weights=None, strategy="default", verbose=False,
                batch_size=batch, total_steps=10**6, warmup_steps=1,
                image_size=size, precision=precision, model_options=arch,
                jit_compile=jit)
            NOTES[f"keras_vit Trainer train step, {precision}, jit_compile="
                  f"{jit!r}"] = ("XLA forward/backward" if trainer.jit_compile
                                 else "tf.function graph, no XLA")
            # The step fit runs for the Trainer (its compiled model, on one
            # fixed batch: the data pipeline's decoding and augmentation
            # are not timed).
            images, labels = tf.constant(x), tf.constant(y)
            return lambda: trainer.model.train_on_batch(images, labels)
        return make

    def fit_step(dtype=None):
        def make():
            fn, jit = fit_call(size, batch, arch, classes, dtype)
            NOTES[f"keras_vit compile_for_finetune, {dtype or 'float32'}"] = (
                f"model.jit_compile = {jit}")
            return fn
        return make

    # The default (jit_compile="auto": keras_vit.runtime.hardware.plan) and the
    # other choice for each precision, to show why "auto" picks it.
    if not backend_rows_only:
        add("keras_vit", "Trainer train step (default)", "float32",
            trainer_step("float32"))
        add("keras_vit", "Trainer train step, XLA", "float32",
            trainer_step("float32", True))
        add("keras_vit", "Trainer train step (default)", "mixed_bfloat16",
            trainer_step("mixed_bfloat16"))
        mixed_jit = hardware.plan("mixed_bfloat16").train_jit
        add("keras_vit", "Trainer train step, " + ("no XLA" if mixed_jit
                                                  else "XLA"),
            "mixed_bfloat16", trainer_step("mixed_bfloat16", not mixed_jit))
    for dtype in [d for d in ("float32", "mixed_bfloat16") if d in dtypes]:
        add("keras_vit", "compile_for_finetune + train_on_batch", dtype,
            fit_step(None if dtype == "float32" else dtype))
        for child in [c for c in children if dtype in c.dtypes]:
            cases.append(child.case(Case(
                "training", "keras_vit", "compile_for_finetune + "
                "train_on_batch", dtype, size, batch, flops, None,
                child.backend)))
    if "torch" in peers:
        torch = peers["torch"]

        def timm_step(bf16):
            def make():
                model = timm_model(peers["timm"], size, arch, classes).train()
                opt = torch.optim.SGD(model.parameters(), lr=0.01,
                                      momentum=0.9)
                xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
                yt = torch.from_numpy(y)

                def fn():
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast("cpu", dtype=torch.bfloat16,
                                        enabled=bf16):
                        logits = model(xt)
                    loss = torch.nn.functional.cross_entropy(logits.float(),
                                                             yt)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    return float(loss.detach())
                return fn
            return make

        if "float32" in dtypes:
            add("timm", "loss.backward + SGD step", "float32",
                timm_step(False))
        if "mixed_bfloat16" in dtypes:
            add("timm", "loss.backward + SGD step", "bf16 autocast",
                timm_step(True))
    if "keras_hub" in peers and not backend_rows_only:
        def hub_step():
            backbone = keras_hub_backbone(peers["keras_hub"], size, arch)
            inputs = keras.Input((size, size, 3))
            tokens = backbone(inputs)
            logits = keras.layers.Dense(classes, kernel_initializer="zeros")(
                tokens[:, 0])
            model = keras.Model(inputs, logits)
            model.compile(
                optimizer=keras.optimizers.SGD(0.01, momentum=0.9,
                                               global_clipnorm=1.0),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
            NOTES["keras_hub training model"] = (
                f"model.jit_compile = {model.jit_compile}")
            return lambda: model.train_on_batch(x, y)

        add("keras_hub", "ViTBackbone + Dense, train_on_batch", "float32",
            hub_step)
    return cases


# --------------------------------------------------------------------------
# matmul ceiling


def ceiling_cases(n, mlp_shape, peers):
    """Square n x n matmuls and one of the model's MLP shape, fp32 and
    bf16, in TF (graph and XLA) and torch."""
    import tensorflow as tf

    cases = []
    shapes = [("square", (n, n, n))]
    if mlp_shape:
        shapes.append(("MLP", mlp_shape))
    for label, (m, k, p) in shapes:
        flops = 2 * m * k * p
        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k)).astype("float32")
        b = rng.standard_normal((k, p)).astype("float32")
        name = f"{label} {m}x{k} @ {k}x{p}"
        for dtype, tf_dtype in (("float32", tf.float32),
                                ("bfloat16", tf.bfloat16)):
            for jit in (False, True):
                # Defaults bind this shape's arrays: the cases are made
                # later, when the loop has moved on to the next shape.
                def make(tf_dtype=tf_dtype, jit=jit, a=a, b=b):
                    ta = tf.cast(tf.constant(a), tf_dtype)
                    tb = tf.cast(tf.constant(b), tf_dtype)
                    # The whole product is returned: from a slice or a sum
                    # of it, Grappler and XLA could shrink the matmul.
                    f = tf.function(tf.matmul, jit_compile=jit)
                    return lambda: f(ta, tb)
                cases.append(Case("ceiling", "tensorflow",
                                  f"{name}, {'XLA' if jit else 'graph'}",
                                  dtype, None, 1, flops, make))
            if "torch" in peers:
                torch = peers["torch"]

                def make_t(dtype=dtype, a=a, b=b, torch=torch):
                    td = torch.float32 if dtype == "float32" else \
                        torch.bfloat16
                    ta, tb = (torch.from_numpy(a).to(td),
                              torch.from_numpy(b).to(td))

                    def fn():
                        with torch.inference_mode():
                            return torch.matmul(ta, tb)
                    return fn
                cases.append(Case("ceiling", "torch", name, dtype, None, 1,
                                  flops, make_t))
    return cases


# --------------------------------------------------------------------------


def parse_args(argv):
    # The command line's own argparse types: the same messages as
    # keras-vit's options.
    from keras_vit.cli.options import int_list, positive_int as positive

    ints = int_list(kind=list)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=ints, help="inference image sizes "
                   "(default 224,384; --quick: 32)")
    p.add_argument("--batches", type=ints, help="inference batch sizes "
                   "(default 1,8; --quick: 2)")
    p.add_argument("--runs", type=positive, help="timed calls per "
                   "measurement (default 10; --quick: 3)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed calls after the first (default 1)")
    p.add_argument("--train-sizes", type=ints, help="training image sizes "
                   "(default 224; 224,384 is slow)")
    p.add_argument("--train-batch", type=positive, default=8)
    p.add_argument("--classes", type=positive, default=1000,
                   help="classes of the head (default 1000, ImageNet)")
    p.add_argument("--skip-inference", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--skip-ceiling", action="store_true")
    p.add_argument("--load-repeats", type=positive, help="fresh processes "
                   "per loading measurement (default 3; --quick: 1)")
    p.add_argument("--matmul", type=positive, help="side of the square "
                   "ceiling matmul (default 4096; --quick: 256)")
    p.add_argument("--exports", default="", help="also onnx,tflite "
                   "(exports ViT-B/16 first: ONNX takes ~90 s and 13-15 GB)")
    p.add_argument("--skip-peers", default="", help="comma-separated: "
                   "timm,keras_hub")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="Keras backends whose keras_vit rows are measured "
                   "(default tensorflow,jax,torch; tensorflow is this "
                   "process, the others run in one child process each)")
    p.add_argument("--backend-dtypes", default=",".join(DTYPES),
                   help="dtypes of the keras_vit rows on the child backends "
                   "(default float32,bfloat16,mixed_bfloat16; training "
                   "rows: float32 and mixed_bfloat16); with "
                   "--backend-rows-only, of every row")
    p.add_argument("--backend-rows-only", action="store_true",
                   help="only the rows the backend comparison needs: "
                   "model.predict and compile_for_finetune + train_on_batch "
                   "per backend, and timm")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model and short runs, to test the script")
    p.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
        "benchmarks.md"))
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--load-child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--backend-child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.sizes = args.sizes or ([32] if q else [224, 384])
    args.batches = args.batches or ([2] if q else [1, 8])
    args.runs = args.runs or (3 if q else 10)
    args.train_sizes = args.train_sizes or ([32] if q else [224])
    args.load_repeats = args.load_repeats or (1 if q else 3)
    args.matmul = args.matmul or (256 if q else 4096)
    if args.quick and args.classes == 1000:
        args.classes = 10
    args.exports = [e for e in args.exports.split(",") if e]
    bad = [e for e in args.exports if e not in ("onnx", "tflite")]
    if bad:
        p.error(f"--exports takes onnx and/or tflite; received {bad}")
    args.backends = [b for b in args.backends.split(",") if b]
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad or "tensorflow" not in args.backends:
        p.error(f"--backends takes {', '.join(BACKENDS)} and always "
                "includes tensorflow (this process); received "
                f"--backends={','.join(args.backends)}")
    args.backends = [b for b in BACKENDS if b in args.backends]
    args.backend_dtypes = [d for d in args.backend_dtypes.split(",") if d]
    bad = [d for d in args.backend_dtypes if d not in DTYPES]
    if bad or not args.backend_dtypes:
        p.error(f"--backend-dtypes takes {', '.join(DTYPES)}; received "
                f"--backend-dtypes={','.join(args.backend_dtypes)}")
    args.skip_peers = {s.replace("-", "_") for s in
                       args.skip_peers.split(",") if s}
    bad = sorted(args.skip_peers - set(PEERS))
    if bad:
        p.error(f"--skip-peers takes {', '.join(PEERS)}; received {bad}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.load_child:
        mode, path, arch, size = args.load_child
        exit_now(load_child(mode, path, arch, int(size)))
    if args.backend_child:
        exit_now(backend_child(*args.backend_child))
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        say(f"KERAS_BACKEND={os.environ['KERAS_BACKEND']} is set: this "
            "process measures the tensorflow rows, --backends the others")
    # The rows of this process (tf.function, the Trainer) are TensorFlow's.
    os.environ["KERAS_BACKEND"] = "tensorflow"
    command = "python benchmarks/speed.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()
    peers, skipped = import_peers(args.skip_peers)
    arch = TINY if args.quick else VIT_B16
    env = versions(peers)
    thread_note = threads(peers)
    say(f"{cpu_model()}, {os.cpu_count()} cores; {thread_note}")
    if not args.quick:
        say("note: the full run takes tens of minutes; --quick tests the "
            "script")
    tmp = tempfile.mkdtemp(prefix="keras_vit_speed_")
    results = {"inference": [], "training": [], "ceiling": [],
               "loading": None}
    import shutil

    children = [BackendChild(b, arch, args.classes, tmp,
                             args.backend_dtypes, notes=NOTES)
                for b in args.backends if b != "tensorflow"]
    only = args.backend_rows_only
    try:
        for child in children:
            say(f"keras_vit on {child.backend}: child process "
                f"{child.proc.pid}")
            env.update(child.hello())
        if not args.skip_ceiling and not only:
            say("matmul ceiling")
            tokens = (args.sizes[0] // arch["patch_size"]) ** 2 + 1
            mlp = (max(args.batches) * tokens, arch["hidden_size"],
                   arch["mlp_dim"])
            results["ceiling"] = run_cases(
                ceiling_cases(args.matmul, mlp, peers), args.runs,
                args.warmup)
        # The backend comparison measures the --backend-dtypes only, on
        # every framework: on a CPU without bf16 units one bf16 training
        # round of TensorFlow and timm takes tens of minutes.
        dtypes = args.backend_dtypes if only else DTYPES
        for size in [] if args.skip_inference else args.sizes:
            say(f"inference at {size}")
            cases, keep = inference_cases(size, args.batches, arch,
                                          args.classes, peers, args.exports,
                                          tmp, children, only, dtypes)
            results["inference"] += run_cases(cases, args.runs, args.warmup)
            del cases, keep
            _reset(children)
        if not args.skip_train:
            for size in args.train_sizes:
                say(f"training at {size}, batch {args.train_batch}")
                cases = training_cases(size, args.train_batch, arch,
                                       args.classes, peers, children, only,
                                       dtypes)
                results["training"] += run_cases(cases, args.runs,
                                                 args.warmup)
                del cases
                _reset(children)
        if not args.skip_load and not only:
            say("checkpoint loading (fresh processes)")
            results["loading"] = measure_loading(
                args.sizes[0] if args.quick else 224, arch, args.classes,
                args.load_repeats, tmp, say, one_process=args.quick)
    finally:
        for child in children:
            child.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    duration = time.perf_counter() - _T0
    text = report(args, command, started, env, thread_note, skipped,
                  results, (load_before, load_after), arch, duration)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    say(f"wrote {args.out}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in results.items()}, f, indent=2,
                      default=str)
    return 0


def _reset(children):
    """Frees this process's and the children's models between sections."""
    gc.collect()
    for child in children:
        try:
            child.request(op="reset")
        except RuntimeError as e:
            say(f"  {child.backend} child: {e}")


def report(args, command, started, env, thread_note, skipped, results,
           loads, arch, duration):
    best = ceilings(results["ceiling"])
    lines = ["# Speed: keras_vit, timm and keras-hub side by side", ""]
    if args.quick:
        lines += ["**Smoke run (`--quick`): a tiny stand-in model (patch "
                  f"{arch['patch_size']}, width {arch['hidden_size']}, "
                  f"{arch['num_layers']} "
                  f"layer{'' if arch['num_layers'] == 1 else 's'}) at "
                  f"{','.join(map(str, args.sizes))} px. These numbers test "
                  "the script; they say nothing about ViT-B/16.**", ""]
    lines += [
        f"- command: `{command}`",
        f"- date: {started.strftime('%Y-%m-%d %H:%M %Z')}; the run took "
        f"{duration / 60:.1f} min",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores "
        f"({len(os.sched_getaffinity(0))} usable)",
        f"- matrix units: {matrix_units()}",
        f"- keras_vit's plan here: {plan_note()}",
        f"- TensorFlow's oneDNN CPU rewrites: {onednn_line()}",
        f"- load average (1 min) at start and end: {loads[0][0]:.2f}, "
        f"{loads[1][0]:.2f}",
        f"- threads: {thread_note}",
        f"- Keras backends: {', '.join(args.backends)} (tensorflow in this "
        "process, each other backend in its own child process called in "
        "the same interleaved rounds)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        f"- model: {'tiny stand-in' if args.quick else 'ViT-B/16'} "
        f"({', '.join(f'{k}={v}' for k, v in arch.items())}), random "
        f"weights, {args.classes}-class head",
        f"- every figure: median of {args.runs} calls, interleaved (each "
        "round calls every path of one configuration once), after the first"
        f" call and {args.warmup} warm-up call(s)",
        ""]
    if skipped:
        lines += ["Skipped:", ""] + [f"- {s}" for s in skipped] + [""]
    if results["ceiling"]:
        lines += ["## Matrix-multiply ceiling", "",
                  ceiling_table(results["ceiling"]), "",
                  "Ceiling = the best of these per dtype: "
                  + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in
                              best.items())
                  + ". \"% of ceiling\" below compares each row with the "
                  "ceiling of its compute dtype (bf16 for bfloat16, "
                  "mixed_bfloat16 and bf16 autocast).", ""]
    flops = {s: forward_flops(s, num_classes=args.classes, **arch) / 1e9
             for s in sorted({*args.sizes, *args.train_sizes})}
    lines += ["FLOPs per image (forward, from the configuration: patch "
              "embedding, QKV/out projections, QK^T and AV, MLP, head): "
              + ", ".join(f"{v:.2f} GFLOP at {s}" for s, v in flops.items())
              + ". A training step counts 3x the forward.", ""]
    if results["inference"] or results["training"]:
        lines += ["## Speed targets", "", targets_table(results, best),
                  "", "## Backends", "",
                  backend_table(backend_rows(results, args.backends),
                                args.backends), "",
                  "keras_vit's default path for each job on each Keras "
                  "backend (`KERAS_BACKEND`): `model.predict` as built by "
                  "`zoo.load(..., dtype=)`, and `compile_for_finetune` + "
                  "`train_on_batch` (one `model.fit` step). timm: float32 "
                  "beside float32 rows, bf16 autocast beside bfloat16 and "
                  "mixed_bfloat16. The rows behind each figure, with their "
                  "first calls, are in the tables below.", ""]
    if results["inference"]:
        lines += ["## Inference", "", model_table(results["inference"], best),
                  "", "- keras_vit model.predict: "
                  "`keras_vit.zoo.load(\"ViT-B/16\", weights=None, "
                  "image_size=S).predict(x, batch_size=b)` (whatever the "
                  "library's default path compiles); bfloat16 and "
                  "mixed_bfloat16 are the same built with `dtype=`.",
                  "- keras_vit tf.function(jit_compile=True): "
                  "`model(x, training=False)` compiled by XLA.",
                  "- keras_vit model.predict (auto: P): the default path "
                  "`keras_vit.runtime.hardware.plan` picks on this machine; "
                  "predict_path='xla'/'graph': the other paths, forced.",
                  "- timm: `timm.create_model(\"vit_base_patch16_S\", "
                  "pretrained=False)` in eval mode under "
                  "`torch.inference_mode()` (bf16: inside "
                  "`torch.autocast(\"cpu\", dtype=torch.bfloat16)`); timm's "
                  "default exact GELU (keras_vit: the tanh form).",
                  "- keras_hub: `keras_hub.models.ViTBackbone` of the same "
                  "configuration (no head), predict and XLA.",
                  "- first call s: the first call (tracing, XLA compilation,"
                  " allocation), not in img/s.", ""]
    if results["training"]:
        lines += ["## Fine-tuning step", "",
                  model_table(results["training"], best), "",
                  f"One optimizer step on a batch of {args.train_batch} with "
                  f"a {args.classes}-class head: forward, softmax "
                  "cross-entropy, backward, gradient clipping at global "
                  "norm 1, SGD momentum 0.9 (the paper's fine-tuning).",
                  "",
                  "- keras_vit Trainer train step: the compiled step of "
                  "`keras_vit.train.Trainer` (recipe `finetune`, "
                  "precision float32 or mixed_bfloat16), fed one fixed "
                  "batch already in [-1, 1] (the input pipeline is not "
                  "timed).",
                  "- keras_vit compile_for_finetune + train_on_batch: what "
                  "`model.fit` runs after "
                  "`keras_vit.train.compile_for_finetune(model)`.",
                  "- timm: `loss.backward()`, `clip_grad_norm_(1.0)`, "
                  "`SGD(momentum=0.9).step()`; bf16: forward and loss "
                  "under `torch.autocast(\"cpu\", dtype=torch.bfloat16)`.",
                  "- keras_hub: ViTBackbone + Dense on the class token, "
                  "`compile(SGD(momentum=0.9, global_clipnorm=1.0))` and "
                  "`train_on_batch`.", ""]
    if NOTES:
        lines += ["Notes:", ""] + [f"- {k}: {v}" for k, v in NOTES.items()]
        lines.append("")
    if results["loading"]:
        rows, baseline = loading_rows(results["loading"])
        size = results["loading"]["bytes"]
        lines += ["## Loading a checkpoint", "",
                  loading_table(rows), "",
                  f"A random official-layout checkpoint written by "
                  f"`keras_vit.zoo.save_npz` ({fmt(size / 2**20)} MiB). Each "
                  "figure is the median over "
                  f"{args.load_repeats} fresh processes; peak RSS is the "
                  "child's own peak (VmHWM) minus that of a child that "
                  "imported the same libraries and did nothing "
                  f"({baseline / 2**20:.0f} MiB)."
                  + (" --quick ran the four measurements of a round in "
                     "one fresh process, in turn (only the script is under "
                     "test): each peak RSS there includes the measurements "
                     "before it."
                     if results["loading"]["one_process"] else ""), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    exit_now(main())
