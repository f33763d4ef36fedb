"""Module boundaries: imports flow down the floors of the package, there is
no import cycle, and no private (underscore) name of one keras_vit module is
used by another.

A private name is free to change with its module; a caller elsewhere turns
it into an unwritten API. This walks the source of the three
components with ``ast``: ``from keras_vit.x import _name`` and
``module._name`` (``module`` bound by importing a keras_vit module) count.

The floors are the package's folders, in the order ``keras_vit.FLOORS``
gives them: every import, at any depth (inside a function too), points to
the module's own floor or one below. Some decisions live on one floor
only: which backend runs, Keras' private modules and ``/proc`` in
``runtime/``; environment variables in ``base/environment.py`` and
``runtime/``; every cap (``MAX_*``) in ``base/limits.py``.
"""

import ast
import builtins
import fnmatch
import json
import re
from pathlib import Path

import pytest

import keras_vit

ROOT = Path(__file__).resolve().parents[2]
# Folder -> the package it installs as (setup.cfg's package_dir).
COMPONENTS = {"keras_vit": "keras_vit", "zoo": "keras_vit.zoo",
              "export": "keras_vit.export"}


def _module_name(path):
    rel = path.relative_to(ROOT).with_suffix("").parts
    parts = COMPONENTS[rel[0]].split(".") + list(rel[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def cross_module_private_uses(path):
    """``[(line, "module._name")]`` of ``path``'s uses of other modules'
    private names."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    modules, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            if not source.startswith("keras_vit"):
                continue
            for alias in node.names:
                if _private(alias.name) and source != me:
                    found.append((node.lineno, f"{source}.{alias.name}"))
                modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_vit"):
                    bound = alias.asname or alias.name.split(".")[0]
                    modules[bound] = alias.name if alias.asname else bound
    # A function argument of the same name (``data`` the argument, not
    # ``keras_vit.train.data``) is not the module.
    arguments = {arg.arg for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                      ast.Lambda))
                 for arg in (node.args.posonlyargs + node.args.args
                             + node.args.kwonlyargs)}
    for name in arguments:
        modules.pop(name, None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                owner = ".".join([modules[value.id], *reversed(chain)])
                if owner != me:
                    found.append((node.lineno, f"{owner}.{node.attr}"))
    return found


def test_no_private_name_crosses_a_module_boundary():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for folder in COMPONENTS
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 for line, name in cross_module_private_uses(path)]
    assert not offenders, (
        "private names used outside their module (make them public in one "
        "home, or move the code):\n" + "\n".join(offenders))


def test_the_walker_sees_both_kinds_of_use(tmp_path, monkeypatch):
    # The check above would pass vacuously if the walker found nothing.
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    source = tmp_path / "keras_vit" / "train" / "thing.py"
    source.parent.mkdir(parents=True)
    source.write_text("from keras_vit.models.vit import _pair\n"
                      "from keras_vit.train import data\n"
                      "from keras_vit.train.thing import _mine\n"
                      "data._import_tfds()\n")
    assert cross_module_private_uses(source) == [
        (1, "keras_vit.models.vit._pair"),
        (4, "keras_vit.train.data._import_tfds")]


# The floors, bottom to top, are the folders of the package in the order
# keras_vit.FLOORS gives them (folders on one floor may import each other).
# A module may import its own floor and the floors below it, never above,
# at any depth. The front door (keras_vit/__init__.py and registration.py,
# which imports the model classes when Keras is imported) is above them all.
# So are the entry scripts, ``python -m keras_vit.train`` (fnmatch
# patterns): a process starts there, as at the console script, and nothing
# imports them; they run a command of the cli/ floor from their folder.
FLOORS = keras_vit.FLOORS
FRONT_DOOR = ("keras_vit", "keras_vit.registration", "keras_vit.*.__main__")
# (importer, imported, why): imports that go up anyway. Keep it empty.
ALLOWED = []
# (modules, why): import cycles left to break. Keep it empty.
ALLOWED_CYCLES = []


def floor_of(module):
    """The index in FLOORS of ``module``'s floor (its folder's), or
    ``len(FLOORS)`` for the front door."""
    if any(fnmatch.fnmatchcase(module, door) for door in FRONT_DOOR):
        return len(FLOORS)
    folder = module.split(".")[1] if module.count(".") else None
    for index, folders in enumerate(FLOORS):
        if folder in folders:
            return index
    raise LookupError(f"{module} is on no floor: move it into the folder "
                      f"of its floor (keras_vit.FLOORS)")


def _modules():
    """``{module name: path}`` of every module of the three components."""
    return {_module_name(path): path for folder in COMPONENTS
            for path in sorted((ROOT / folder).rglob("*.py"))}


def _owner(name, modules):
    """The module that ``name`` (a module, or a module's attribute) is in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path, modules):
    """``[(line, module)]``: every keras_vit module ``path`` imports, at any
    depth: ``import``, ``from ... import`` (relative too),
    ``importlib.import_module("...")`` and the lazy names of
    ``lazy.attach``/``lazy.names_of`` (``".module"`` strings)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module
                                          else []))
            # ``from pkg import sub``: the submodule when there is one.
            names = [f"{source}.{alias.name}"
                     if f"{source}.{alias.name}" in modules else source
                     for alias in node.names]
        elif isinstance(node, ast.Call):
            func = node.func
            called = getattr(func, "attr", getattr(func, "id", None))
            if (called == "import_module" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                target = node.args[0].value
                if target.startswith(".") and len(node.args) > 1:
                    target = package + target
                names = [target]
            elif (called == "names_of" and node.args
                  and isinstance(node.args[0], ast.Dict)):
                names = [package + key.value for key in node.args[0].keys
                         if isinstance(key, ast.Constant)]
            elif called == "attach":
                for kw in node.keywords:
                    if kw.arg != "modules":
                        continue
                    if isinstance(kw.value, ast.Dict):  # {name: ".module"}
                        names += [package + v.value for v in kw.value.values
                                  if isinstance(v, ast.Constant)]
                    names += [f"{package}.{elt.value}"
                              for elt in getattr(kw.value, "elts", ())
                              if isinstance(elt, ast.Constant)]
        for name in names:
            if not isinstance(name, str) or not name.startswith("keras_vit"):
                continue
            owner = _owner(name, modules)
            if owner and owner != me:
                found.append((node.lineno, owner))
    return found


def _graph(modules):
    return {me: {(line, other) for line, other in imports_of(path, modules)}
            for me, path in modules.items()}


def test_the_folders_are_the_floors():
    """Every folder of the package is on exactly one floor, every floor
    names folders that exist, and every module is in one of them."""
    named = [folder for folders in FLOORS for folder in folders]
    assert len(named) == len(set(named)), FLOORS
    folders = {p.parent.name for p in (ROOT / "keras_vit").glob("*/__init__.py")}
    folders |= {"zoo", "export"}  # top-level folders (setup.cfg package_dir)
    assert folders == set(named), (folders ^ set(named))
    loose = sorted(p.name for p in (ROOT / "keras_vit").glob("*.py")
                   if f"keras_vit.{p.stem}" not in FRONT_DOOR
                   and p.name != "__init__.py")
    assert not loose, f"modules beside the floors' folders: {loose}"
    for module in _modules():
        floor_of(module)


def test_floor_of_reads_the_folder():
    assert floor_of("keras_vit.base.errors") == 0
    assert floor_of("keras_vit.zoo.api") > floor_of("keras_vit.models.vit")
    assert floor_of("keras_vit.models.vit") == floor_of("keras_vit.data.images")
    assert floor_of("keras_vit.cli.train") == len(FLOORS) - 1
    assert floor_of("keras_vit.cli.train") > floor_of("keras_vit.train.loop")
    assert floor_of("keras_vit.train.__main__") == len(FLOORS)
    assert floor_of("keras_vit") == len(FLOORS)
    for stray in ("keras_vit.nowhere.thing", "keras_vit.loose"):
        with pytest.raises(LookupError, match="on no floor"):
            floor_of(stray)


def test_imports_point_down_the_floors():
    modules = _modules()
    allowed = {(a, b) for a, b, _ in ALLOWED}
    upward = []
    def name(index):
        return "/".join(FLOORS[index]) if index < len(FLOORS) else "front door"

    for me, edges in _graph(modules).items():
        mine = floor_of(me)
        for line, other in sorted(edges):
            theirs = floor_of(other)
            if theirs > mine and (me, other) not in allowed:
                upward.append(
                    f"{modules[me].relative_to(ROOT)}:{line}: {me} "
                    f"({name(mine)}) imports {other} ({name(theirs)})")
    assert not upward, (
        "imports that point up the floors (move the code to the floor that "
        "needs it):\n" + "\n".join(upward))


def import_cycles(graph):
    """The strongly connected components of more than one module
    (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def cycle_through(graph, component):
    """One import cycle inside ``component`` (a strongly connected set of
    modules), as ``[a, b, ..., a]``: the shortest way from its first
    module back to itself (breadth first)."""
    start, members = component[0], set(component)
    came_from, frontier = {}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise ValueError(f"{component} is not a cycle")


def test_no_import_cycles():
    modules = _modules()
    edges = _graph(modules)
    graph = {me: {other for _, other in found}
             for me, found in edges.items()}
    allowed = [sorted(modules) for modules, _ in ALLOWED_CYCLES]
    cycles = [c for c in import_cycles(graph) if c not in allowed]

    def step(a, b):
        line = min(line for line, other in edges[a] if other == b)
        return f"  {a} imports {b} ({modules[a].relative_to(ROOT)}:{line})"

    report = []
    for component in cycles:
        path = cycle_through(graph, component)
        report.append(" -> ".join(path) + "\n" + "\n".join(
            step(a, b) for a, b in zip(path, path[1:])))
    assert not cycles, (
        "import cycles (move what both need down a floor; an import inside "
        "a function counts too):\n" + "\n".join(report))


# Modules that may import a module by a computed name: the command lines
# (fnmatch patterns). Everywhere else an import names its module in the
# source, so that the walker above sees every edge.
COMPUTED_IMPORTS_ALLOWED = ["keras_vit.cli", "keras_vit.cli.options",
                            "keras_vit.cli.train", "keras_vit.cli.analysis",
                            "keras_vit.cli.export"]
# Helpers that import what their caller names, ``(module, function)``; the
# walker reads their names at the call sites instead, where each must be a
# literal (CALLER_NAMED): the lazy tables, and require() of an optional
# third-party package.
IMPORTING_HELPERS = {("keras_vit.base.lazy", "attach"),
                     ("keras_vit.base.checks", "require")}
CALLER_NAMED = ("require", "names_of", "attach")


def _literal(node):
    """Whether ``node`` is a string, or a dict, tuple or list of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(
            _literal(v) for v in node.values)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal(e) for e in node.elts)
    return False


def computed_imports(path):
    """``[(line, what)]``: ``path``'s imports by a name that is not written
    in the source: ``importlib.import_module(x)`` or ``__import__(x)`` with
    ``x`` not a string literal (outside IMPORTING_HELPERS), and the
    importing helpers (CALLER_NAMED) called with anything but literals."""
    me = _module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = function or node.name
        if isinstance(node, ast.Call):
            func = node.func
            called = getattr(func, "attr", getattr(func, "id", None))
            first = node.args[0] if node.args else None
            if called in ("import_module", "__import__"):
                if not (first is not None and _literal(first)) and (
                        (me, function) not in IMPORTING_HELPERS):
                    shown = ast.unparse(first) if first else ""
                    found.append((node.lineno, f"{called}({shown})"))
            elif (called in ("require", "names_of") and first is not None
                  and not _literal(first)):
                found.append((node.lineno,
                              f"{called}({ast.unparse(first)})"))
            elif called == "attach":
                for kw in node.keywords:
                    if kw.arg == "modules" and not _literal(kw.value):
                        found.append((node.lineno,
                                      f"attach(modules={ast.unparse(kw.value)})"))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_no_import_by_a_computed_name():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for module, path in _modules().items()
        if not any(fnmatch.fnmatchcase(module, p)
                   for p in COMPUTED_IMPORTS_ALLOWED)
        for line, what in computed_imports(path)]
    assert not offenders, (
        "imports by a computed name (import the module by name, e.g. a "
        "table of `from keras_vit.export import onnx` branches):\n"
        + "\n".join(offenders))


def _fake_module(tmp_path, monkeypatch, text):
    """keras_vit/models/thing.py holding ``text`` in a package tree rooted
    at ``tmp_path``, which the checks above then read instead of ours."""
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    source = tmp_path / "keras_vit" / "models" / "thing.py"
    source.parent.mkdir(parents=True)
    source.write_text(text)
    return source


def test_the_computed_import_finder(tmp_path, monkeypatch):
    # The check above would pass vacuously if the finder found nothing.
    source = _fake_module(
        tmp_path, monkeypatch,
        "import importlib\n"
        "importlib.import_module('keras_vit.layers')\n"
        "def f(fmt):\n"
        "    return importlib.import_module(f'keras_vit.export.{fmt}')\n"
        "__import__(name)\n"
        "require('onnx')\n"
        "require(name)\n"
        "names_of({'.a': ('b',)})\n"
        "attach(__name__, modules=MODULES)\n")
    assert computed_imports(source) == [
        (4, "import_module(f'keras_vit.export.{fmt}')"),
        (5, "__import__(name)"), (7, "require(name)"),
        (9, "attach(modules=MODULES)")]


def test_the_import_walker_sees_every_form(tmp_path, monkeypatch):
    # The checks above would pass vacuously if the walker found nothing.
    source = _fake_module(
        tmp_path, monkeypatch,
        "import importlib\n"
        "from . import vit\n"
        "from ..zoo import api\n"
        "def f():\n"
        "    import keras_vit.train.loop\n"
        "    from keras_vit.export.graph import ServingGraph\n"
        "    importlib.import_module('keras_vit.cli')\n"
        "x = names_of({'.axial': ('axial_vit',)})\n")
    modules = ["keras_vit.models.thing", "keras_vit.models.vit",
               "keras_vit.models.axial", "keras_vit.zoo.api",
               "keras_vit.train.loop", "keras_vit.export.graph",
               "keras_vit.cli"]
    assert sorted(imports_of(source, modules)) == [
        (2, "keras_vit.models.vit"), (3, "keras_vit.zoo.api"),
        (5, "keras_vit.train.loop"), (6, "keras_vit.export.graph"),
        (7, "keras_vit.cli"), (8, "keras_vit.models.axial")]


@pytest.mark.parametrize("graph, cycles", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_cycle_finder(graph, cycles):
    assert import_cycles(graph) == cycles
    for component in cycles:
        path = cycle_through(graph, component)
        assert path[0] == path[-1] and set(path) == set(component)
        assert all(b in graph[a] for a, b in zip(path, path[1:]))


def test_the_committed_durations_give_every_run_kind_an_order():
    # tests/conftest.py hands the files out longest first from the last
    # full run's seconds per file; a clean checkout (CI's) starts from
    # tests/file_durations.json (`python -m pytest --record-durations`).
    import conftest

    with open(conftest.DURATIONS_FILE, encoding="utf-8") as f:
        recorded = json.load(f)
    assert set(recorded) == {"tensorflow", "jax", "torch"}
    for seconds in recorded.values():
        assert len(seconds) >= 20 and all(
            isinstance(v, (int, float)) and v >= 0 for v in seconds.values())
        assert any((ROOT / "tests" / name).is_file() for name in seconds)


def test_files_without_a_figure_go_first_then_the_longest():
    from types import SimpleNamespace

    import conftest

    order = conftest.longest_first({"a/test_short.py": 1.0,
                                    "b/test_long.py": 90.0,
                                    "c/test_mid.py": 30.0})
    assert order == ("b/test_long.py", "c/test_mid.py", "a/test_short.py")
    names = ["a/test_short.py", "c/test_mid.py", "d/test_new.py",
             "b/test_long.py"]
    items = [SimpleNamespace(path=ROOT / "tests" / n) for n in names]
    items.sort(key=conftest._longest_first(order))
    assert [str(i.path.relative_to(ROOT / "tests")) for i in items] == [
        "d/test_new.py", "b/test_long.py", "c/test_mid.py",
        "a/test_short.py"]


class _Worker:
    """What xdist's scheduler asks of a worker: the indices it is sent."""

    shutting_down = False

    def __init__(self, name):
        self.sent = []
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def test_xdist_hands_out_the_files_longest_first(pytestconfig):
    """conftest's order reaches the workers: the collection is sorted
    longest first, and setup.cfg's --no-loadscope-reorder keeps xdist from
    re-sorting the files by how many tests each holds (its default, which
    sent the 4-test, 3-minute demo file out last and left a worker idle
    for 84 s at the end of the TensorFlow run)."""
    from types import SimpleNamespace

    from xdist.scheduler import LoadFileScheduling

    import conftest

    order = conftest.longest_first({"cli/test_demo.py": 185.0,
                                    "train/test_train.py": 120.0,
                                    "export/test_export.py": 108.0,
                                    "test_aaa_many.py": 4.0})
    # Alphabetical, as pytest collects: a file of many quick tests first,
    # then the longest files with one, two and three tests.
    nodeids = [f"tests/test_aaa_many.py::test_{i}" for i in range(40)]
    for size, name in enumerate(sorted(order[:3]), start=1):
        nodeids += [f"tests/{name}::test_{i}" for i in range(size)]
    items = [SimpleNamespace(path=ROOT / n.split("::")[0], nodeid=n)
             for n in nodeids]
    items.sort(key=conftest._longest_first(order))
    collection = [item.nodeid for item in items]

    # This run's own options (--no-loadscope-reorder among them), with two
    # local workers whatever -n this process was started with.
    config = SimpleNamespace(
        option=pytestconfig.option, hook=pytestconfig.hook,
        getvalue=lambda name: ["2*popen"] if name == "tx"
        else pytestconfig.getvalue(name))
    scheduler = LoadFileScheduling(config)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first = [collection[w.sent[0]].split("::")[0] for w in workers]
    assert first == [f"tests/{order[0]}", f"tests/{order[1]}"], (
        "xdist reordered the files: is --no-loadscope-reorder still in "
        "setup.cfg's addopts?")


# Exceptions every Python program knows: an error class of the package
# derives from one of these (what a caller expects of its kind) and from
# KerasVitError (so one `except` catches every error the package raises).
_BUILTIN_ERRORS = {name for name in dir(builtins) if name.endswith("Error")}


def _exception_classes():
    """``{name: (path, bases)}`` of every class in the three components
    whose bases, followed through the package's own classes, reach a
    builtin exception."""
    classes = {}
    for folder in COMPONENTS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr
                             for b in node.bases
                             if isinstance(b, (ast.Name, ast.Attribute))]
                    classes[node.name] = (path.relative_to(ROOT), bases)

    def reaches_builtin(name, seen=()):
        if name in _BUILTIN_ERRORS or name in ("Exception", "BaseException"):
            return True
        if name not in classes or name in seen:
            return False
        return any(reaches_builtin(b, seen + (name,))
                   for b in classes[name][1])

    return {name: value for name, value in classes.items()
            if name != "KerasVitError" and any(
                reaches_builtin(b) for b in value[1])}


def test_every_error_derives_from_the_root_and_a_builtin():
    found = _exception_classes()
    assert {"CheckpointError", "ExportError", "DataError",
            "DownloadError"} <= set(found), sorted(found)

    def derives(name, target, seen=()):
        bases = found.get(name, (None, []))[1]
        return target in bases or any(
            derives(b, target, seen + (name,)) for b in bases
            if b not in seen)

    no_root = [f"{p}: {n}" for n, (p, _) in found.items()
               if not derives(n, "KerasVitError")]
    assert not no_root, "error classes outside KerasVitError: " + ", ".join(
        no_root)

    def builtin(name, seen=()):
        bases = found.get(name, (None, []))[1]
        return any(b in _BUILTIN_ERRORS for b in bases) or any(
            builtin(b, seen + (name,)) for b in bases if b not in seen)

    bare = [f"{p}: {n}" for n, (p, _) in found.items() if not builtin(n)]
    assert not bare, ("error classes with no builtin kind (ValueError, "
                      "OSError, ...) beside KerasVitError: " + ", ".join(bare))


# Decisions kept on one floor. Each finder returns ``[(line, what)]`` for
# one module's source.
def backend_questions(tree):
    """Calls of ``keras.backend.backend()``, imports of ``keras.src`` and
    ``/proc`` paths: what only runtime/ asks."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "backend"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "backend"):
            found.append((node.lineno, "backend()"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras.src"):
            found.append((node.lineno, "keras.src"))
        elif isinstance(node, ast.Import) and any(
                a.name.startswith("keras.src") for a in node.names):
            found.append((node.lineno, "keras.src"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith("/proc")):
            found.append((node.lineno, "/proc"))
    return found


def environment_uses(tree):
    """Reads and writes of the process environment: ``os.environ``,
    ``os.getenv``, ``os.putenv``."""
    return [(node.lineno, f"os.{node.attr}") for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv", "unsetenv")
            and isinstance(node.value, ast.Name) and node.value.id == "os"]


def caps(tree):
    """Module-level ``MAX_*`` (or ``*_MAX_*``) constants."""
    return [(node.lineno, target.id) for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign)
                           else [node.target])
            if isinstance(target, ast.Name)
            and re.search(r"(^|_)MAX(_|$)", target.id)]


def openvino_cores(tree):
    """Calls of ``<anything>.Core()``. An OpenVINO Core is made only by
    keras_vit.export.openvino_core: each Core's CPU plugin gives its thread
    a signal stack that Cores ending out of order leave freed (the next
    Ctrl-C is then a segmentation fault)."""
    return [(node.lineno, "Core()") for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Core"]


# Where each decision may be made, and the modules that still make it
# elsewhere (they move to their floor when their folders are next
# reorganised; a listed module that no longer needs its place fails below,
# so the lists only shrink).
RULES = {
    "backend": (backend_questions, ("keras_vit.runtime.*",), set()),
    "environment": (environment_uses, (
        "keras_vit.base.environment", "keras_vit.runtime.*"), set()),
    "caps": (caps, ("keras_vit.base.limits",), set()),
    "openvino core": (openvino_cores, ("keras_vit.export.openvino_core",),
                      set()),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_decision_lives_on_its_floor(rule):
    finder, homes, elsewhere = RULES[rule]
    found = {}
    for module, path in _modules().items():
        if any(fnmatch.fnmatchcase(module, home) for home in homes):
            continue
        hits = finder(ast.parse(path.read_text(), str(path)))
        if hits:
            found[module] = [f"{path.relative_to(ROOT)}:{line}: {what}"
                             for line, what in hits]
    new = sorted(line for module in set(found) - elsewhere
                 for line in found[module])
    assert not new, (f"{rule} outside {', '.join(homes)} (move it there):\n"
                     + "\n".join(new))
    assert not elsewhere - set(found), (
        f"no longer outside {', '.join(homes)}: remove from RULES "
        f"{sorted(elsewhere - set(found))}")


def test_the_decision_finders_see_what_they_look_for():
    tree = ast.parse("import os\nimport keras\n"
                     "from keras.src import ops\n"
                     "MAX_SIDE = 3\nNPZ_MAX_NDIM = 5\nMAXIMUM = 1\n"
                     "def f():\n"
                     "    if keras.backend.backend() == 'jax':\n"
                     "        return open('/proc/meminfo')\n"
                     "    return os.environ.get('X'), os.getenv('Y')\n")
    assert sorted(backend_questions(tree)) == [
        (3, "keras.src"), (8, "backend()"), (9, "/proc")]
    assert sorted(environment_uses(tree)) == [(10, "os.environ"),
                                              (10, "os.getenv")]
    assert caps(tree) == [(4, "MAX_SIDE"), (5, "NPZ_MAX_NDIM")]
    assert openvino_cores(ast.parse(
        "import openvino as ov\ncore = ov.Core()\nov.Core().read_model(p)\n"
        "core.compile_model(m)\n")) == [(2, "Core()"), (3, "Core()")]


def test_scripts_make_no_openvino_core_of_their_own():
    """The benchmarks, tests and examples share the package's one Core too
    (a test's own Cores once left its worker a freed signal stack)."""
    found = [f"{path.relative_to(ROOT)}:{line}"
             for folder in ("benchmarks", "tests", "examples")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line, _ in openvino_cores(ast.parse(path.read_text(),
                                                     str(path)))]
    assert not found, ("OpenVINO Cores made outside keras_vit.export."
                       "openvino_core (call its core()):\n"
                       + "\n".join(found))


# docs/architecture.md: the floors as the folders' docstrings describe them.
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _purpose(folder):
    """The first sentence of a floor folder's ``__init__`` docstring, on
    one line, Sphinx roles as code spans."""
    path = (ROOT / folder if folder in ("zoo", "export")
            else ROOT / "keras_vit" / folder) / "__init__.py"
    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(text.split("\n\n")[0].split())
    first = re.split(r"(?<=\.) ", first)[0]
    return re.sub(r":\w+:`~?([^`]+)`|``([^`]+)``", r"`\1\2`", first)


def architecture_page():
    """The text of docs/architecture.md."""
    rows = []
    for index in reversed(range(len(FLOORS))):
        for folder in FLOORS[index]:
            where = (f"`{folder}/` (as `keras_vit.{folder}`)"
                     if folder in ("zoo", "export") else f"`keras_vit/{folder}/`")
            rows.append(f"| {index} | {where} | {_purpose(folder)} |")
    return "\n".join([
        "# Architecture",
        "",
        "<!-- Written by `python tests/contracts/test_structure.py` from",
        "keras_vit.FLOORS and each folder's docstring; a test checks it. -->",
        "",
        "The package is built in floors, and each floor is a folder. A module",
        "imports its own floor and the floors below it, never one above, inside",
        "functions too; folders on one floor may import each other. The front",
        "door, `keras_vit/__init__.py` (with `registration.py`, which registers",
        "the model classes with Keras when Keras is imported), stands above",
        "them all and imports no framework: every name loads on first use.",
        "",
        "| floor | folder | what it holds |",
        "|---|---|---|",
        *rows,
        "",
        "Some decisions are made on one floor only: which Keras backend runs,",
        "Keras' private modules (`keras.src`) and `/proc` in `runtime/`;",
        "environment variables in `base/environment.py` and `runtime/`; every",
        "cap (`MAX_*`) in `base/limits.py`. `tests/contracts/test_structure.py`",
        "checks the floors and these homes, and lists the modules that still",
        "make one of these decisions elsewhere.",
        ""])


def test_the_architecture_page_is_the_folders_docstrings():
    assert ARCHITECTURE.read_text() == architecture_page(), (
        "docs/architecture.md is stale: run python "
        "tests/contracts/test_structure.py")


if __name__ == "__main__":
    ARCHITECTURE.write_text(architecture_page())


def test_each_importable_test_and_script_name_is_one_file():
    """pytest imports a test file by its file name, tests/conftest.py puts
    tests/ on ``sys.path`` for the shared helpers, and the benchmark and
    example scripts put their own folder there when the tests load them.
    Two files of one name then shadow each other, and which one an import
    finds depends on the order the tests ran in (a helper here and a
    benchmark of the same name once failed five tests only in the full
    run)."""
    seen = {}
    folders = [ROOT / "tests", ROOT / "benchmarks", ROOT / "examples"]
    for folder in folders:
        for path in folder.rglob("*.py"):
            if path.name in ("__init__.py", "conftest.py"):
                continue
            top_level = path.parent in folders
            if not (top_level or path.name.startswith("test_")):
                continue
            seen.setdefault(path.stem, []).append(
                str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, clashes
