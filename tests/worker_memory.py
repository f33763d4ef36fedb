"""A worker that the machine's memory cannot carry any further is replaced.

The suite's test processes keep memory that no garbage collection gives
back: TensorFlow's traced functions and converters, the timm walk's
models, JAX's compiled programs. A full run on 2 cores and 23 GiB grew
its two TensorFlow xdist workers to 6.7 and 7.4 GiB and its two JAX
workers to 4.6 and 5.1 GiB by the middle of the run (growth per file,
the largest: the timm walk 2.3-2.6 GiB, the JAX position-resize
properties 1.9 GiB, the export family 0.8-1.0 GiB, with or without
``malloc_trim`` and a fixed mmap threshold); the machine then ran out of
memory and the run stalled until CI's time was up.

So after each test a worker reports its resident memory with the test's
report (``worker_resident_mb``), and where the machine's available memory
has fallen below :data:`FLOOR` (4 GiB) and the worker holds more than
:data:`WORTH_REPLACING` of it, the controller's scheduler
(:class:`RecyclingLoadFileScheduling`, pytest-xdist's ``loadfile``
scheduler) gives that worker no further file: once it holds only the
test it cannot run without knowing the next one, it is told to shut down
(it runs that test and tears its module down) and a fresh worker takes
its place. A file is never split (its module fixtures run once); on a
machine with memory to spare nothing is ever replaced. xdist replaces
only workers that crashed, and a crash fails the test it was running:
this is the orderly way out it lacks.
"""

import os

import pytest
from xdist.scheduler import LoadFileScheduling

from keras_vit.runtime import hardware

GIB = 1 << 30
#: Below this much available memory (or a tenth of the machine, if more)
#: the largest workers make way: room for one file's growth (the timm
#: walk's 2.6 GiB) and the processes the tests start (a demo's training
#: run, a fresh venv's import).
FLOOR = 4 * GIB
#: A fresh worker after collection holds 1.5-1.9 GiB (TensorFlow, torch,
#: timm and every test module): replacing a worker this small frees
#: nothing.
WORTH_REPLACING = 2.5 * GIB
#: Both in MiB, where set (the test of this plugin's run in xdist).
FLOOR_ENV = "KERAS_VIT_TEST_MEMORY_FLOOR_MB"
WORTH_ENV = "KERAS_VIT_TEST_WORTH_REPLACING_MB"


def should_make_way(resident, available, total):
    """Whether a worker holding ``resident`` bytes makes way, with
    ``available`` of the machine's ``total`` bytes left (None: unknown,
    never)."""
    if resident is None or available is None:
        return False
    floor = max(FLOOR, (total or 0) // 10)
    worth = WORTH_REPLACING
    if os.environ.get(FLOOR_ENV):
        floor = int(os.environ[FLOOR_ENV]) << 20
    if os.environ.get(WORTH_ENV):
        worth = int(os.environ[WORTH_ENV]) << 20
    return available < floor and resident > worth


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a worker: the teardown's report carries the worker's resident
    memory and whether it should make way (xdist sends a report's
    attributes to the controller)."""
    outcome = yield
    if call.when == "teardown" and hasattr(item.config, "workerinput"):
        resident = hardware.resident_memory()
        report = outcome.get_result()
        report.worker_resident_mb = (None if resident is None
                                     else resident >> 20)
        report.worker_makes_way = should_make_way(
            resident, hardware.available_memory(), hardware.memory_total())


def pytest_runtest_logreport(report):
    """In the controller: a worker whose report says so makes way."""
    node = getattr(report, "node", None)
    if node is None or not getattr(report, "worker_makes_way", False):
        return
    dsession = node.config.pluginmanager.getplugin("dsession")
    scheduler = getattr(dsession, "sched", None)
    if isinstance(scheduler, RecyclingLoadFileScheduling):
        scheduler.make_way(node, report.worker_resident_mb)


def pytest_terminal_summary(terminalreporter, config):
    """The workers replaced, with the memory each held, in the run's
    summary."""
    dsession = config.pluginmanager.getplugin("dsession")
    scheduler = getattr(dsession, "sched", None)
    replaced = getattr(scheduler, "replaced", None)
    if replaced:
        terminalreporter.write_line(
            "workers replaced when memory ran short: " + ", ".join(
                f"{name} ({mb} MiB)" for name, mb in replaced))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    dsession = config.pluginmanager.getplugin("dsession")
    return RecyclingLoadFileScheduling(
        config, log, replace=getattr(dsession, "_clone_node", None))


class RecyclingLoadFileScheduling(LoadFileScheduling):
    """xdist's ``loadfile`` scheduling, where a worker marked by
    :meth:`make_way` finishes the files it holds and is replaced by a
    fresh one (``replace(node)``: xdist's DSession._clone_node, the
    start of a worker like ``node``) while files are left to run."""

    def __init__(self, config, log=None, replace=None):
        super().__init__(config, log)
        self.replace = replace
        self.making_way = {}  # node -> its resident MiB when marked
        self.replaced = []  # (worker id, resident MiB), in order

    def make_way(self, node, resident_mb=None):
        if node in self.assigned_work and node not in self.making_way:
            self.making_way[node] = resident_mb
            self._reschedule(node)

    def _reschedule(self, node):
        if node not in self.registered_collections:
            # A successor still collecting: a successor that finished
            # before it reschedules every node (xdist's own scheduler
            # assumes all nodes collected by then).
            return
        if node not in self.making_way:
            super()._reschedule(node)
            return
        # A worker runs a test once it knows the next one (or that there
        # is none): the last test it holds waits for the shutdown.
        if (node.shutting_down
                or self._pending_of(self.assigned_work[node]) > 1):
            return
        node.shutdown()
        if self.workqueue and self.replace is not None:
            self.replaced.append((node.gateway.id, self.making_way[node]))
            self.replace(node)
