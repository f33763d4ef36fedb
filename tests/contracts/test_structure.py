"""Module boundaries: imports flow down the floors of the package, there is
no import cycle, and no private (underscore) name of one keras_vit module is
used by another.

A private name is free to change with its module; a caller elsewhere turns
it into an unwritten API. This walks the source of the three
components with ``ast``: ``from keras_vit.x import _name`` and
``module._name`` (``module`` bound by importing a keras_vit module) count.

The floors: every import, at any depth (inside a function too),
points to the module's own floor or one below; see ``FLOORS``.
"""

import ast
import builtins
import fnmatch
from pathlib import Path

import pytest

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


# The floors, bottom to top (docs: STYLE.md, "The house, floor by floor").
# A module may import its own floor and the floors below it, never above,
# at any depth. Patterns are fnmatch patterns of module names; the first
# that matches decides.
FLOORS = [
    # 0: plain Python, no keras_vit imports but each other (keras_vit/base/),
    # and the image decoder.
    ("base", ["keras_vit.base", "keras_vit.base.*", "keras_vit.data",
              "keras_vit.data.*"]),
    # 1: the machine and the backend.
    ("runtime", ["keras_vit.runtime", "keras_vit.runtime.*"]),
    # 2: pure keras.ops layers.
    ("layers", ["keras_vit.layers", "keras_vit.layers.*"]),
    # 3: builders and model classes, and what reads or runs a built model
    # (models/memory.py). Never the zoo.
    ("models", ["keras_vit.models", "keras_vit.models.*"]),
    # 4: names, weights, checkpoint conversion, resolve_model / rebuild.
    ("zoo", ["keras_vit.zoo", "keras_vit.zoo.*"]),
    # 5: jobs on a model.
    ("jobs", ["keras_vit.train.cli", "keras_vit.train.__main__",
              "keras_vit.analysis.cli", "keras_vit.export.cli"], "command"),
    ("jobs", ["keras_vit.train", "keras_vit.train.*", "keras_vit.analysis",
              "keras_vit.analysis.*", "keras_vit.export",
              "keras_vit.export.*"]),
    # 6: an end-to-end run.
    ("demo", ["keras_vit.cli.demo"]),
    # 7: the command lines.
    ("command", ["keras_vit.cli", "keras_vit.cli.options",
                 "keras_vit.cli.__main__"]),
    # 8: the package's front door (keras_vit/__init__.py) may name anything;
    # nothing else imports a name from it. registration.py imports the
    # modules that define the package's Keras classes when Keras is.
    ("package", ["keras_vit", "keras_vit.registration"]),
]
ORDER = ["base", "runtime", "layers", "models", "zoo", "jobs", "demo",
         "command", "package"]
# (importer, imported, why): imports that go up anyway. Keep it empty.
ALLOWED = []
# (modules, why): import cycles left to break. Keep it empty.
ALLOWED_CYCLES = []


def floor_of(module):
    for entry in FLOORS:
        name, patterns = entry[0], entry[1]
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return entry[2] if len(entry) > 2 else name
    raise LookupError(f"{module} is on no floor: add it to FLOORS")


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


def test_every_module_is_on_a_floor():
    for module in _modules():
        assert ORDER.index(floor_of(module)) >= 0


def test_imports_point_down_the_floors():
    modules = _modules()
    allowed = {(a, b) for a, b, _ in ALLOWED}
    upward = []
    for me, edges in _graph(modules).items():
        mine = ORDER.index(floor_of(me))
        for line, other in sorted(edges):
            theirs = ORDER.index(floor_of(other))
            if theirs > mine and (me, other) not in allowed:
                upward.append(
                    f"{modules[me].relative_to(ROOT)}:{line}: {me} "
                    f"({floor_of(me)}) imports {other} ({floor_of(other)})")
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
                            "keras_vit.*.cli"]
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


def test_the_longest_first_schedule_names_test_files():
    # tests/conftest.py runs these files first under xdist; a renamed or
    # deleted file would silently drop out of the schedule.
    import conftest

    assert set(conftest.LONGEST_FIRST) == {"tensorflow", "children"}
    for names in conftest.LONGEST_FIRST.values():
        assert len(set(names)) == len(names)
        missing = [n for n in names if not (ROOT / "tests" / n).is_file()]
        assert not missing, missing


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
    """conftest's order reaches the workers: the collection is sorted by
    LONGEST_FIRST, and setup.cfg's --no-loadscope-reorder keeps xdist from
    re-sorting the files by how many tests each holds (its default, which
    sent the 4-test, 3-minute demo file out last and left a worker idle
    for 84 s at the end of the TensorFlow run)."""
    from types import SimpleNamespace

    from xdist.scheduler import LoadFileScheduling

    import conftest

    order = conftest.LONGEST_FIRST["tensorflow"]
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
