"""Module boundaries: no private (underscore) name of one keras_vit module
is used by another.

A private name is free to change with its module; a caller elsewhere turns
it into an unwritten API (issue 17). This walks the source of the three
components with ``ast``: ``from keras_vit.x import _name`` and
``module._name`` (``module`` bound by importing a keras_vit module) count.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    # A function argument of the same name (``engine`` the object, not
    # ``keras_vit.train.engine``) is not the module.
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


def test_the_longest_first_schedule_names_test_files():
    # tests/conftest.py runs these files first under xdist; a renamed or
    # deleted file would silently drop out of the schedule.
    import conftest

    names = conftest.LONGEST_FIRST
    assert len(set(names)) == len(names)
    missing = [n for n in names if not (ROOT / "tests" / n).is_file()]
    assert not missing, missing
