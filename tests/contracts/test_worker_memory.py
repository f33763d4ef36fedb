"""tests/worker_memory.py: a worker the machine's memory cannot carry
finishes the files it holds, then a fresh one takes its place; no file is
split and nothing is replaced while memory is left. The scheduler is
xdist's own ``loadfile`` one, driven here as xdist's controller drives
it, with stand-in workers that record what they are sent."""

import types

import pytest

import worker_memory
from worker_memory import (GIB, RecyclingLoadFileScheduling,
                           should_make_way)


class Worker:
    """What the scheduler asks of xdist's WorkerController."""

    def __init__(self, name):
        self.gateway = types.SimpleNamespace(id=name)
        self.sent = []  # the test indices of each runtest command
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True


def config(workers):
    option = types.SimpleNamespace(loadscopereorder=False)
    return types.SimpleNamespace(
        option=option, getvalue=lambda name: {"tx": [f"{workers}*popen"]}[
            name])


FILES = {f"tests/test_{i}.py": 2 for i in range(12)}
COLLECTION = [f"{name}::test_{j}" for name, n in FILES.items()
              for j in range(n)]


def started(workers=2):
    replaced = []
    scheduler = RecyclingLoadFileScheduling(
        config(workers), replace=replaced.append)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    return scheduler, nodes, replaced


def run_test(scheduler, node):
    """The worker runs the first test it holds that it can run (one it
    knows the next of, or any once shut down)."""
    pending = [nodeid for unit in scheduler.assigned_work[node].values()
               for nodeid, done in unit.items() if not done]
    assert len(pending) > 1 or node.shutting_down, pending
    scheduler.mark_test_complete(node, COLLECTION.index(pending[0]))


def files_sent(node):
    return [COLLECTION[indices[0]].split("::")[0] for indices in node.sent]


def test_a_worker_making_way_finishes_its_files_and_is_replaced():
    scheduler, (gw0, gw1), replaced = started()
    held = files_sent(gw0)
    assert len(held) == 2  # one running, one queued (xdist's low mark)
    scheduler.make_way(gw0, resident_mb=5000)
    while scheduler._pending_of(scheduler.assigned_work[gw0]):
        assert not replaced or gw0.shutting_down
        run_test(scheduler, gw0)
    assert gw0.shutting_down
    assert files_sent(gw0) == held  # no new file, none split
    assert replaced == [gw0]
    assert scheduler.replaced == [("gw0", 5000)]
    # Its successor joins as xdist joins one: and gets the next files.
    gw2 = Worker("gw2")
    scheduler.remove_node(gw0)
    scheduler.add_node(gw2)
    scheduler.add_node_collection(gw2, COLLECTION)
    scheduler.schedule()
    assert files_sent(gw2) and not set(files_sent(gw2)) & set(
        held + files_sent(gw1))


def test_no_successor_once_every_file_is_handed_out():
    scheduler, (gw0, gw1), replaced = started()
    while scheduler.workqueue:
        run_test(scheduler, gw1)
    scheduler.make_way(gw0)
    while scheduler._pending_of(scheduler.assigned_work[gw0]):
        run_test(scheduler, gw0)
    assert gw0.shutting_down and replaced == []


def test_a_worker_that_does_not_make_way_runs_on():
    scheduler, (gw0, _), replaced = started()
    for _ in range(5):
        run_test(scheduler, gw0)
    assert not gw0.shutting_down and replaced == []
    assert len(files_sent(gw0)) > 2


@pytest.mark.parametrize("resident, available, total, makes_way", [
    (6 * GIB, 2 * GIB, 23 * GIB, True),  # the machine is nearly out
    (6 * GIB, 5 * GIB, 23 * GIB, False),  # memory to spare
    (2 * GIB, 1 * GIB, 23 * GIB, False),  # a fresh worker: frees nothing
    (6 * GIB, 10 * GIB, 128 * GIB, True),  # a tenth of a large machine
    (None, 1 * GIB, 23 * GIB, False),  # not Linux: unknown, never
    (6 * GIB, None, None, False),
])
def test_a_worker_makes_way_only_where_it_frees_memory_that_is_short(
        resident, available, total, makes_way):
    assert should_make_way(resident, available, total) is makes_way


def test_the_suite_runs_with_the_plugin(pytestconfig):
    """tests/conftest.py registers it wherever xdist runs the suite."""
    if not pytestconfig.pluginmanager.hasplugin("xdist"):
        pytest.fail("pytest-xdist is a dev dependency; it is missing")
    assert pytestconfig.pluginmanager.get_plugin(
        "keras_vit_worker_memory") is worker_memory


def test_xdist_runs_every_test_once_while_workers_make_way(tmp_path):
    """A real run: six files on two workers, every worker making way after
    each test (floor above any machine, nothing too small to replace).
    Each file runs whole in one process, every test once, and later
    files run in workers started in place of the first two."""
    import os
    import subprocess
    import sys

    ran = tmp_path / "ran"
    ran.mkdir()
    for i in range(6):
        (tmp_path / f"test_{i}.py").write_text(
            "import os\n\n"
            "def ran(name):\n"
            f"    open(os.path.join({str(ran)!r}, f'{i}-{{name}}-'\n"
            "         f'{os.getpid()}'), 'w').close()\n\n"
            "def test_a(): ran('a')\n\n"
            "def test_b(): ran('b')\n")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tests, os.environ.get("PYTHONPATH", "")]),
        **{worker_memory.FLOOR_ENV: str(1 << 40),
           worker_memory.WORTH_ENV: "0"})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "worker_memory",
         "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "2",
         "--dist", "loadfile", "-q", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "12 passed" in run.stdout, run.stdout[-3000:]
    assert "workers replaced when memory ran short: gw" in run.stdout
    marks = sorted(path.name.split("-") for path in ran.iterdir())
    assert [(f, t) for f, t, _ in marks] == [
        (str(i), t) for i in range(6) for t in "ab"]
    pids = {f: {pid for g, _, pid in marks if g == f} for f, _, _ in marks}
    assert all(len(p) == 1 for p in pids.values()), pids  # never split
    assert len(set().union(*pids.values())) > 2, pids  # successors ran
