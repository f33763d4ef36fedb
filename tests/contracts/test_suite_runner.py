"""The suite's own runner (tests/conftest.py and setup.cfg's options): the
other backends' runs it starts beside the TensorFlow run end with it, a
worker that dies ends the run instead of hanging it, and each worker's
TensorFlow runs on its share of the cores."""

import os
import subprocess
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A backend child as conftest starts it, reduced to the watchdog: it
# stops itself once the process that started it is gone.
CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import conftest
conftest._stop_when_orphaned({parent})
print("watching", flush=True)
time.sleep(120)
"""

# The TensorFlow run, killed: it starts the child, then dies at once.
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1].format(
    tests=sys.argv[2], parent=os.getpid())], stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL, text=True)
assert child.stdout.readline().strip() == "watching"
print(child.pid, flush=True)
os._exit(0)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line
                           for line in f)
    except FileNotFoundError:
        return False


def test_a_backend_run_stops_once_its_parent_is_killed():
    if not os.path.isdir("/proc"):
        import pytest
        pytest.skip("reads /proc to see the orphan")
    out = subprocess.run([sys.executable, "-c", PARENT, CHILD, TESTS],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    # Orphaned, it interrupts itself within a second of noticing (its
    # sleep would have lasted two minutes).
    assert not _alive(pid), f"the orphaned child {pid} still runs"


# Four files of three tests; a worker dies in the middle of the third.
_DYING = """
import os, time
def test_1(): time.sleep(0.2)
def test_2():
    if {dies}: os._exit(1)
def test_3(): time.sleep(0.2)
"""


def test_a_worker_that_dies_ends_the_run_naming_its_test(tmp_path):
    """With setup.cfg's options, a worker that dies mid-run ends the run
    with the test it was running named, instead of leaving the run waiting
    for the dead worker's file (the xdist loadfile scheduler's hang: the
    run would stop only at CI's time limit)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(TESTS), "setup.cfg"))
    addopts = " ".join(cfg["tool:pytest"]["addopts"].split())
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts}\n")
    for name in "abcd":
        (tmp_path / f"test_{name}.py").write_text(
            _DYING.format(dies=name == "c"))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "2", "-p",
             "no:cacheprovider", "-q"], cwd=tmp_path, capture_output=True,
            text=True, timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("the run still waited 90 s after its worker "
                             "died") from None
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "crashed while running 'test_c.py::test_2'" in out.stdout


def test_a_tensorflow_worker_runs_on_its_share_of_the_cores():
    """Under xdist, TensorFlow in this process has cores / workers threads
    in each pool (conftest's _share_tensorflow_threads), not one per core
    in every worker; a run without workers, or a thread count the user
    set in TF_NUM_INTRAOP_THREADS, leaves TensorFlow's setting alone (0:
    its default)."""
    import tensorflow as tf

    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    want = 0
    if workers and "TF_NUM_INTRAOP_THREADS" not in os.environ:
        cores = (len(os.sched_getaffinity(0))
                 if hasattr(os, "sched_getaffinity") else os.cpu_count())
        want = max(1, cores // int(workers))
    assert tf.config.threading.get_intra_op_parallelism_threads() == want
    assert tf.config.threading.get_inter_op_parallelism_threads() == want


def test_the_other_backends_import_only_files_that_mark_backends(tmp_path):
    """The jax and torch runs skip the test files whose text marks no test
    `backends`; the TensorFlow run, which imports them all, stops on a
    `backends` test that such a file holds (a mark made by another name),
    so no test leaves the other backends' runs unseen."""
    from pathlib import Path
    from types import SimpleNamespace

    import pytest

    import conftest

    marked, hidden, plain = (tmp_path / f"test_{n}.py" for n in
                             ("marked", "hidden", "plain"))
    marked.write_text("import pytest\npytestmark = pytest.mark.backends\n")
    hidden.write_text("import pytest\n"
                      "pytestmark = getattr(pytest.mark, 'backends')\n")
    plain.write_text("def test_x(): pass\n")
    for backend, want in (("jax", {marked: None, hidden: True, plain: True}),
                          ("tensorflow", dict.fromkeys((marked, hidden,
                                                        plain)))):
        config = SimpleNamespace(_keras_vit_backend=backend)
        got = {path: conftest.pytest_ignore_collect(Path(path), config)
               for path in want}
        assert got == want, backend

    def item(path):
        return SimpleNamespace(
            nodeid=f"{path.name}::test_x", path=path,
            get_closest_marker=lambda name: name == "backends" or None)

    conftest._check_backends_files([item(marked)])
    with pytest.raises(pytest.UsageError, match="test_hidden.py::test_x"):
        conftest._check_backends_files([item(marked), item(hidden)])
