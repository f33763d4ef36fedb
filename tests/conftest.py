import functools
import json
import os
import re
import signal
import sys

# Quiet TF's C++ start-up banner; set before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

# torchvision (which timm imports) crashes with a segmentation fault when it
# is imported after TensorFlow (TF 2.21, torchvision 0.29.1, seen here), and
# pytest imports every test module at collection: load timm before any test
# module can import TensorFlow.
try:  # noqa: SIM105
    import timm  # noqa: F401,E402
except ImportError:  # timm is a test extra; its tests skip without it
    pass

sys.path.insert(0, os.path.dirname(__file__))


def _enable_onednn_as_keras_vit_does():
    """keras_vit turns TensorFlow's oneDNN rewrites on just before
    TensorFlow loads (keras_vit.runtime.hardware.enable_onednn, which
    ``import keras_vit`` arranges); a test module that imports TensorFlow
    before keras_vit would run the suite without them on CPUs where
    TensorFlow's default is off (AVX2-only). So the choice is made here,
    before any test module (and before the Keras backend is chosen below:
    ``import keras_vit`` imports no Keras)."""
    from keras_vit.runtime import hardware

    hardware.enable_onednn()


_enable_onednn_as_keras_vit_does()

# The Keras backend under test. Keras reads KERAS_BACKEND once, at its first
# import, so the choice is made here (conftest loads before any test module).
# With no choice ("all"), this process runs the whole suite on TensorFlow and
# re-runs the same command once per other backend in child pytests (started
# with it, at a lower priority: CHILD_NICENESS), where only the tests
# marked `backends` are collected: models, zoo,
# analysis, training, export and the timm parity run everywhere; what is
# TensorFlow's own (tf.distribute, SavedModel internals) runs once.
BACKENDS = ("tensorflow", "jax", "torch")


def pytest_addoption(parser):
    parser.addoption(
        "--backend", choices=BACKENDS + ("all",), default=None,
        help="Keras backend to test: one of tensorflow, jax, torch, or 'all' "
             "(TensorFlow suite, then the `backends` tests on jax and torch "
             "in child processes). Default: $KERAS_BACKEND if set, else all.")
    parser.addoption(
        "--record-durations", action="store_true",
        help="after a full run, also write the seconds per test file to "
             "tests/file_durations.json, the order in which a clean checkout "
             "hands the files out (a full run always keeps them in pytest's "
             "cache)")


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def _worker_share():
    """The cores of this xdist worker's share (usable cores / workers, at
    least one); None outside xdist."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    return max(1, _usable_cores() // int(workers)) if workers else None


def _share_torch_threads():
    """An xdist worker of the TensorFlow run gives torch (imported above,
    with timm) its share of the cores, not all of them: torch's OpenMP
    threads spin between parallel regions, and with every worker running
    one per core they take the CPU from the other workers. The children
    get the same through OMP_NUM_THREADS (pytest_sessionfinish): on 2
    cores, test_bit, test_hybrid, test_vit and test_zoo on jax and
    torch at once, 2 workers each, took 146 s and 120 s, then 117 s and
    70 s. A thread count the user set (OMP_NUM_THREADS) is kept."""
    share = _worker_share()
    if share is None or "OMP_NUM_THREADS" in os.environ:
        return
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(share)


_share_torch_threads()


def _share_tensorflow_threads():
    """An xdist worker of the TensorFlow run gives TensorFlow its share of
    the cores too (intra-op and inter-op pools; TensorFlow sizes both to
    every core): the suite's models are small, so a pool of two threads
    per worker mostly hands ops back and forth, and on 2 cores the two
    workers' pools take turns on the same cores. Two ``keras-vit demo``
    runs at once on 2 cores: 219 CPU-s with TensorFlow's pools, 176 CPU-s
    with one thread each, in the same wall time; the whole suite (2
    workers): 24:43 -> 24:17 and 45.6 -> 44.8 CPU-minutes. Only this
    process: the processes its tests start (the demo, the examples, the
    CLI) keep TensorFlow's default, so the figures they print are the ones
    a user sees (the thread count moves float32 training: the demo's
    0.9800 / 0.9689 became 0.9822 / 0.9600 with one thread). A thread
    count the user set (TF_NUM_INTRAOP_THREADS) is kept."""
    share = _worker_share()
    if share is None or "TF_NUM_INTRAOP_THREADS" in os.environ:
        return
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(share)
    tf.config.threading.set_inter_op_parallelism_threads(share)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (setup.cfg): one worker per core, at most 4 (each holds
    TensorFlow and builds models up to ViT-H; more would contend for memory
    bandwidth and RAM), and at least 4 GiB of memory each."""
    # keras_vit.runtime.hardware imports no Keras (xdist asks from
    # pytest_cmdline_main, before pytest_configure has chosen KERAS_BACKEND).
    from keras_vit.runtime import hardware

    cores = _usable_cores()
    available = hardware.available_memory()
    # Not Linux (unknown): trust the core count.
    by_memory = cores if available is None else available // (4 << 30)
    return max(1, min(cores, 4, by_memory))


def _backend_option(config):
    chosen = config.getoption("--backend")
    if chosen is None:
        chosen = os.environ.get("KERAS_BACKEND") or "all"
    if chosen not in BACKENDS + ("all",):
        raise pytest.UsageError(
            f"KERAS_BACKEND={chosen!r} is not a backend this suite tests; "
            f"use one of {', '.join(BACKENDS)}.")
    return chosen


def pytest_configure(config):
    # OpenVINO's converter and NNCF send usage telemetry unless CI=true (the
    # one switch they read): dozens of events a conversion, each from a
    # fork of the whole test process that then fails offline (3.2 CPU-s a
    # tiny conversion, 0.6 without). Set before anything imports them, and
    # inherited by every process the tests start.
    os.environ.setdefault("CI", "true")
    chosen = _backend_option(config)
    config._keras_vit_children = chosen == "all"
    backend = "tensorflow" if chosen == "all" else chosen
    if "keras" in sys.modules:
        import keras
        if keras.backend.backend() != backend:
            raise pytest.UsageError(
                f"Keras was imported with the {keras.backend.backend()!r} "
                f"backend before --backend {backend} could take effect.")
    os.environ["KERAS_BACKEND"] = backend
    config._keras_vit_backend = backend
    if config.pluginmanager.hasplugin("xdist"):
        import worker_memory  # tests/worker_memory.py

        config.pluginmanager.register(worker_memory, "keras_vit_worker_memory")
    if backend == "jax":
        _share_jax_compilations(config)
        _quick_jax_compilations()
    elif backend == "tensorflow":
        _share_tensorflow_threads()


def _share_jax_compilations(config):
    """One JAX compilation cache for this run: its xdist workers and the
    processes its tests start reuse what another compiled (a Trainer's
    step, a model's predict, each eager op: the same programs, rebuilt
    test after test). On 2 cores, tests/train/test_trainer_backends.py on jax
    (-n 0) took 82 s of CPU without it and 62 s with it. Set before any
    test module imports JAX (which reads these at import); a cache the
    user named is kept, and the run's own is removed at its end."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # the user's, or this run's, set by its main process
    import tempfile

    folder = tempfile.mkdtemp(prefix="keras_vit_jax_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    config._keras_vit_jax_cache = folder


def _quick_jax_compilations():
    """XLA:CPU's LLVM back end at -O0 for this run and the processes its
    tests start: the suite's models are tiny, so JAX's time goes to
    compiling (each eager op, each jitted step), not to running what it
    compiled. The HLO passes (fusion, simplification) still run; only
    LLVM's machine-code optimisation is skipped. On 2 cores (-n 0, CPU
    seconds): tests/models/test_bit.py 68 -> 47, test_keras_features.py
    95 -> 72, tests/train/test_trainer_backends.py 72 -> 58. Set before
    any test module imports JAX; an optimisation level the user chose
    is kept. A test that sets XLA_FLAGS for a JAX child of its own adds
    the same (quick_xla_flags). Not for the TensorFlow run: its training
    steps run XLA element-wise programs for hundreds of steps (the demo,
    the examples), and with -O0 there the whole suite had done 30% of
    its TensorFlow tests after 15 minutes, against half without."""
    os.environ["XLA_FLAGS"] = quick_xla_flags(os.environ.get("XLA_FLAGS", ""))


def quick_xla_flags(flags=""):
    """``flags`` (an XLA_FLAGS value) with XLA:CPU's LLVM back end at -O0
    (_quick_jax_compilations), unless they choose a level, and without
    XLA:CPU's fusion emitters unless they choose: for the JAX run and the
    JAX children (and smoke-run benchmarks) that tests start, which build
    tiny models and spend their time compiling them. The fusion emitters
    are most of a small gradient program's compile time (a BiT gradient:
    3.4 s with them, 0.7 s without; tests/models/test_keras_features.py,
    test_remat.py and test_mixed_precision_gradients.py on jax: 132 ->
    80 CPU-s)."""
    if "xla_backend_optimization_level" not in flags:
        flags = f"{flags} --xla_backend_optimization_level=0"
    if ("xla_cpu_use_fusion_emitters" not in flags
            and xla_knows("xla_cpu_use_fusion_emitters")):
        flags = f"{flags} --xla_cpu_use_fusion_emitters=false"
    return flags.strip()


_XLA_ANSWERS = "KERAS_VIT_TEST_XLA_FLAGS_KNOWN"


def xla_knows(flag):
    """Whether this jaxlib's XLA takes ``flag``: XLA stops the process at
    a flag it does not know (jaxlib 0.11.2 on the GPU machines dropped
    ``xla_cpu_use_fusion_emitters``). Asked of a child process once a
    run; the answer travels to the run's workers and children in the
    environment."""
    import json

    answers = json.loads(os.environ.get(_XLA_ANSWERS, "{}"))
    if flag not in answers:
        import subprocess
        import sys

        env = dict(os.environ, XLA_FLAGS=f"--{flag}=false",
                   JAX_PLATFORMS="cpu")
        answers[flag] = subprocess.run(
            [sys.executable, "-c", "import jax; jax.numpy.zeros(1)"],
            env=env, capture_output=True, timeout=300).returncode == 0
        os.environ[_XLA_ANSWERS] = json.dumps(answers)
    return answers[flag]


def two_jax_cpu_devices_flags():
    """XLA_FLAGS for a JAX child process that sees two simulated CPU
    devices, compiling as quickly as the JAX run (quick_xla_flags): these
    children train ViTs of up to 12 layers for a few steps, and compiling
    the steps is most of what they do."""
    return quick_xla_flags("--xla_force_host_platform_device_count=2")


def pytest_unconfigure(config):
    folder = getattr(config, "_keras_vit_jax_cache", None)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        del os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_report_header(config):
    return f"keras backend: {config._keras_vit_backend}"


# The order in which xdist hands the test files out (setup.cfg: -n auto
# --dist loadfile --no-loadscope-reorder): longest first, so that no worker
# ends on a long file while the others sit idle, from the last full run's
# seconds per file (setup, call and teardown of its tests), kept per run
# kind ("tensorflow", "jax", "torch": the children run only the `backends`
# tests, so other files lead). A full run records them in pytest's cache;
# `--record-durations` also writes DURATIONS_FILE, the committed copy a
# clean checkout (CI's) starts from. Files with no figure (new ones) go out
# first, then the rest by their seconds; stale names are ignored.
DURATIONS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "file_durations.json")
_DURATIONS_KEY = "keras_vit/file_durations"


def _recorded_durations(config):
    """``{kind: {file relative to tests/: seconds}}`` of the last full
    run: pytest's cache when it holds one, else DURATIONS_FILE."""
    cache = getattr(config, "cache", None)
    found = cache.get(_DURATIONS_KEY, None) if cache is not None else None
    if not found:
        try:
            with open(DURATIONS_FILE, encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError):
            found = {}
    return found if isinstance(found, dict) else {}


def longest_first(durations):
    """The files of ``durations`` (file -> seconds), longest first."""
    return tuple(sorted(durations, key=lambda name: (-durations[name], name)))


def _run_kind(config):
    return getattr(config, "_keras_vit_backend", "tensorflow")


def _is_full_run(config):
    """No file, -k or -m narrowed this run."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.option.keyword and not config.option.markexpr)


@pytest.fixture(scope="module", autouse=True)
def _jax_forgets_its_programs(request):
    """On JAX, each module's compiled programs are let go at its end: a
    worker kept every eager op and jitted step of the modules before
    (the position-resize properties alone grew one by 1.9 GiB). What a
    later module needs again comes from the run's compilation cache on
    disk (_share_jax_compilations)."""
    yield
    if request.config._keras_vit_backend == "jax":
        import jax

        jax.clear_caches()


#: This run's seconds per test file (relative to tests/), so far.
_FILE_SECONDS = {}


def pytest_runtest_logreport(report):
    """Sums each file's seconds (in the controller: xdist hands its
    workers' reports back to it)."""
    name = report.nodeid.split("::")[0]
    if name.startswith("tests/"):
        name = name[len("tests/"):]
    _FILE_SECONDS[name] = (_FILE_SECONDS.get(name, 0.0)
                           + float(report.duration or 0.0))


def _record_durations(config, exitstatus):
    """After a full run that ran its tests (passed or failed), this run
    kind's seconds per file replace the recorded ones; the other kinds'
    are kept (the backend children record theirs themselves, one at a
    time: a lock beside DURATIONS_FILE)."""
    if (hasattr(config, "workerinput") or not _is_full_run(config)
            or exitstatus not in (0, 1) or not _FILE_SECONDS):
        return
    import fcntl

    with open(DURATIONS_FILE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = dict(_recorded_durations(config))
        found[_run_kind(config)] = {name: round(sec, 1) for name, sec in
                                    sorted(_FILE_SECONDS.items())}
        if getattr(config, "cache", None) is not None:
            config.cache.set(_DURATIONS_KEY, found)
        if config.getoption("--record-durations"):
            with open(DURATIONS_FILE, "w", encoding="utf-8") as f:
                json.dump(found, f, indent=1, sort_keys=True)
                f.write("\n")


def _longest_first(order):
    """Sort key: a file's place in ``order`` (paths relative to tests/);
    files not in it (no figure yet) first. Stable: a file's tests keep
    their order."""
    tests = os.path.dirname(os.path.abspath(__file__))
    place = {name: i for i, name in enumerate(order)}

    def key(item):
        name = os.path.relpath(str(item.path), tests).replace(os.sep, "/")
        return place.get(name, -1)
    return key


def _runs_on_backend(item, backend):
    """Marked `backends` (itself or its module), and not one of that file's
    `backend_independent` tests (a download served over HTTP is the same
    download on jax; what differs, the model it fills, is checked by the
    tests each such mark names). ``@pytest.mark.backends("tensorflow",
    "jax")`` names the backends a test runs on, where the others share
    the code under test (the reason in a comment beside the mark)."""
    mark = item.get_closest_marker("backends")
    if mark is None or item.get_closest_marker("backend_independent"):
        return False
    return not mark.args or backend in mark.args


def _check_backend_independent_marks(items):
    for item in items:
        mark = item.get_closest_marker("backend_independent")
        if mark is None:
            continue
        if not item.get_closest_marker("backends"):
            raise pytest.UsageError(
                f"{item.nodeid}: backend_independent marks a test of a "
                "`backends` file; this one runs on TensorFlow only anyway")
        if len(mark.args) != 1 or len(str(mark.args[0]).split()) < 5:
            raise pytest.UsageError(
                f"{item.nodeid}: backend_independent needs one reason naming "
                f"the tests that check its per-backend part, got {mark.args!r}")


def _skip_gpu_tests_without_an_accelerator(items):
    """Tests marked `gpu` run where Keras' backend computes on a GPU or TPU
    (the package's own reading of the machine) and are skipped elsewhere;
    ACCELERATOR_CHECK_ON_CPU=1 runs them on the CPU, for the rehearsal of
    benchmarks/accelerator.py (--cpu)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu or os.environ.get("ACCELERATOR_CHECK_ON_CPU") == "1":
        return
    from keras_vit import hardware

    if hardware.detect().accelerator == "cpu":
        skip = pytest.mark.skip(reason="needs a GPU: run benchmarks/"
                                "accelerator.py on a GPU machine "
                                "(docs/guides/speed.md)")
        for item in gpu:
            item.add_marker(skip)


#: How a test file marks tests `backends` (``@pytest.mark.backends``,
#: ``pytestmark = pytest.mark.backends``): the other backends' runs import
#: only the files whose text says it.
_BACKENDS_MARK = re.compile(r"\bmark\.backends\b")


@functools.lru_cache(maxsize=None)
def _may_mark_backends(path):
    with open(path, encoding="utf-8") as f:
        return bool(_BACKENDS_MARK.search(f.read()))


def pytest_ignore_collect(collection_path, config):
    """The jax and torch runs leave out the test files that mark no test
    `backends`: importing them (TensorFlow-only modules, hypothesis
    strategies, 200 files) cost each of their workers a quarter of its
    collection, 21 -> 16 CPU-s, for tests it then deselects. The
    TensorFlow run collects everything and checks that no `backends` test
    sits in a file this would leave out (_check_backends_files)."""
    if (getattr(config, "_keras_vit_backend", "tensorflow") != "tensorflow"
            and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and not _may_mark_backends(str(collection_path))):
        return True
    return None


def _check_backends_files(items):
    for item in items:
        if (item.get_closest_marker("backends")
                and not _may_mark_backends(str(item.path))):
            raise pytest.UsageError(
                f"{item.nodeid}: marked `backends` in a way the jax and torch "
                f"runs do not see (they collect files whose text matches "
                f"{_BACKENDS_MARK.pattern!r}): mark it with "
                "@pytest.mark.backends or pytestmark in its own file")


def pytest_collection_modifyitems(config, items):
    _check_backend_independent_marks(items)
    _skip_gpu_tests_without_an_accelerator(items)
    durations = _recorded_durations(config).get(_run_kind(config), {})
    items.sort(key=_longest_first(longest_first(durations)))
    if config._keras_vit_backend == "tensorflow":
        _check_backends_files(items)
        return
    backend = config._keras_vit_backend
    keep = [item for item in items if _runs_on_backend(item, backend)]
    dropped = [item for item in items
               if not _runs_on_backend(item, backend)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _child_args(args):
    """The user's pytest arguments without any --backend choice."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--backend":
            skip = True
        elif not arg.startswith("--backend="):
            out.append(arg)
    return out


#: How much lower the other backends' runs are scheduled than this one's
#: (os.nice). They start with this run, not after it: the TensorFlow run
#: leaves the cores idle about a sixth of its time (its tests wait on
#: subprocesses, servers and venv installs), and the children fill that
#: time; at a lower priority they yield the cores back whenever this run's
#: tests can use them. On 2 cores they used to start when this run ended
#: and add 5-6 minutes after it.
CHILD_NICENESS = 5


def _children_wanted(config):
    return (getattr(config, "_keras_vit_children", False)
            and not hasattr(config, "workerinput"))  # not an xdist worker


def pytest_sessionstart(session):
    config = session.config
    if os.environ.get("KERAS_VIT_TEST_NICENESS"):
        # A backend child (or a worker of one): lower its priority.
        try:
            os.nice(int(os.environ["KERAS_VIT_TEST_NICENESS"]))
        except (AttributeError, OSError, ValueError):
            pass  # not POSIX, or not permitted: run at the normal priority
        if not hasattr(config, "workerinput"):
            _stop_when_orphaned(int(os.environ.get("KERAS_VIT_TEST_PARENT",
                                                   "0")))
    if _children_wanted(config):
        config._keras_vit_child_runs = _start_children(config)


def _stop_when_orphaned(parent):
    """A backend child whose TensorFlow run was killed (kill -9, an OOM
    kill) would run its tests to the end with nobody to read them: it
    interrupts itself once its parent is gone (its xdist workers end with
    it), and exits if that did not end it within 30 s."""
    import signal
    import threading
    import time

    if not parent:
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        os._exit(1)

    threading.Thread(target=watch, daemon=True,
                     name="stop-when-orphaned").start()


def _start_children(config):
    """Starts one pytest per other backend (tests marked `backends`), at a
    lower priority (CHILD_NICENESS); returns (the backends not installed,
    [(backend, process, log)])."""
    import importlib.util
    import subprocess
    import tempfile

    args = _child_args(list(config.invocation_params.args))
    missing, children = [], []
    # The two children run at once, each with its workers: their torch
    # (OpenMP) threads share the cores (see _share_torch_threads).
    workers = getattr(config.option, "numprocesses", None) or 1
    if not isinstance(workers, int):  # "auto" or "logical", unresolved
        workers = pytest_xdist_auto_num_workers(config)
    threads = str(max(1, _usable_cores() // (workers * len(BACKENDS[1:]))))
    for backend in BACKENDS[1:]:
        if importlib.util.find_spec(backend) is None:
            # Not a skip: the dev extras install both backends, so a missing
            # one is a broken set-up that would otherwise hide failures.
            missing.append(backend)
            continue
        env = dict(os.environ, KERAS_BACKEND=backend,
                   KERAS_VIT_TEST_NICENESS=str(CHILD_NICENESS),
                   KERAS_VIT_TEST_PARENT=str(os.getpid()))
        env.setdefault("OMP_NUM_THREADS", threads)
        # Their output is kept apart in files and printed whole, in order,
        # at the end.
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--backend", backend, *args],
            env=env, cwd=str(config.invocation_params.dir), stdout=log,
            stderr=subprocess.STDOUT, text=True)
        children.append((backend, proc, log))
    return missing, children


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    runs = getattr(config, "_keras_vit_child_runs", None)
    if runs is None:
        _record_durations(config, exitstatus)
        return
    missing, children = runs
    failed = [f"{backend} (not installed)" for backend in missing]
    for backend in missing:
        print(f"\n===== backend {backend}: not installed; "
              f"`pip install -e \".[dev]\"` installs it =====", flush=True)
    try:
        if children:
            print("\n===== waiting for the other backends' runs: "
                  f"{', '.join(b for b, _, _ in children)} =====", flush=True)
        for backend, proc, log in children:
            code = proc.wait()
            log.seek(0)
            print(f"\n===== backend {backend}: tests marked `backends` "
                  "=====", flush=True)
            print(log.read(), end="", flush=True)
            # 5: nothing selected for this backend (a TensorFlow-only file).
            if code not in (0, 5):
                failed.append(f"{backend} (exit {code})")
    finally:  # interrupted: no child left running
        for _, proc, log in children:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    _record_durations(config, exitstatus)
    if failed:
        print(f"\nbackend runs failed: {', '.join(failed)}", flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: Ctrl-C's handler in this process before any test ran.
_SIGINT_HANDLER = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def _signals_still_work():
    """A test (or a module fixture set up or torn down just before it)
    that breaks signal handling for the tests after it fails here, and the
    damage is undone: the process's Ctrl-C handler replaced (a training
    run's ends the process on a second Ctrl-C), or the main thread's
    signal stack pointing at freed memory (the next Ctrl-C is a
    segmentation fault that takes the xdist worker down)."""
    yield
    found = signal.getsignal(signal.SIGINT)
    if found is not _SIGINT_HANDLER:
        signal.signal(signal.SIGINT, _SIGINT_HANDLER)
        pytest.fail(f"Ctrl-C (SIGINT) is handled by {found!r} after this "
                    f"test, not {_SIGINT_HANDLER!r}", pytrace=False)
    freed = _freed_signal_stack()
    if freed:
        pytest.fail(f"the main thread's signal stack (sigaltstack) was at "
                    f"{freed:#x}, memory no longer mapped, after this test: "
                    "a library set it and freed it; it is switched off",
                    pytrace=False)


def _freed_signal_stack():
    """The address of this thread's signal stack if it points at memory
    that is no longer mapped, after switching that stack off (signals are
    then handled on the thread's own stack); None otherwise, and off
    Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import errno

    class Stack(ctypes.Structure):  # stack_t
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int),
                    ("ss_size", ctypes.c_size_t)]

    disable = 2  # SS_DISABLE
    libc = ctypes.CDLL(None, use_errno=True)
    now = Stack()
    if (libc.sigaltstack(None, ctypes.byref(now)) != 0 or not now.ss_sp
            or now.ss_flags & disable):
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    start = now.ss_sp // page * page
    length = now.ss_sp + now.ss_size - start
    pages = (ctypes.c_ubyte * (length // page + 1))()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p]
    if (libc.mincore(start, length, pages) == 0
            or ctypes.get_errno() != errno.ENOMEM):
        return None  # mapped (mincore fails with ENOMEM where it is not)
    libc.sigaltstack(ctypes.byref(Stack(None, disable, 0)), None)
    return now.ss_sp


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's cache, and none goes online."""
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KERAS_VIT_MIRROR", raising=False)
    monkeypatch.delenv("KERAS_VIT_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def tiny_keras(tmp_path_factory):
    """A tiny ViT (tests/testkit.py's ``tiny``) saved as a .keras
    file, once per test module: the model the hostile-input tests of the
    command line, the image readers and the .keras checks hand over."""
    from testkit import tiny  # imports Keras: not before configure

    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    tiny().save(path)
    return path


TINY = dict(patch=8, hidden=32, layers=2, heads=4, mlp=64, grid=4)


def tiny_builder_kwargs(classifier="token", representation_size=None,
                        num_classes=7, grid=4):
    return dict(image_size=TINY["patch"] * grid, patch_size=TINY["patch"],
                hidden_size=TINY["hidden"], num_layers=TINY["layers"],
                num_heads=TINY["heads"], mlp_dim=TINY["mlp"],
                num_classes=num_classes, classifier=classifier,
                representation_size=representation_size)


def count_params(build, allocate=False):
    """``build().count_params()``; with ``allocate=False`` the model is built
    inside a ``keras.StatelessScope`` that leaves its variables as shapes
    only, so a 400M-parameter model is counted in a second on every backend
    instead of drawing 1.5 GB of random numbers (20 s on torch). The count
    reads the same variables either way; tests that check a family's count
    also count its smallest member with ``allocate=True`` to keep the two
    equal."""
    if allocate:
        return build().count_params()
    return shapes_only(build).count_params()


def shapes_only(build):
    """``build()`` inside a ``keras.StatelessScope`` that leaves its
    variables as shapes only (count_params): what a model's config makes
    of it (its ``count_params()``, its grid) without drawing its weights;
    the model cannot be called."""
    import keras
    from keras.src.backend.common import global_state

    pending = "uninitialized_variables"
    before = list(global_state.get_global_attribute(pending, []) or [])
    with keras.StatelessScope(initialize_variables=False):
        model = build()
    # Forget this model's never-initialized variables: left registered, the
    # next StatelessScope to close in this process would initialize them.
    global_state.set_global_attribute(pending, before)
    return model
