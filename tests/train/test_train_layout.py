"""The training code's rooms: a Trainer short enough to read, callbacks
and placement that sit below the loop (any Keras user's ``fit`` can take
the callbacks), and modules whose first line says what they hold."""

import ast
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "keras_vit" / "train"
ROOMS = ("loop", "settings", "run_dir", "progress", "evaluation",
         "fit", "build", "checkpoints", "callbacks", "placement")


def _tree(name):
    path = TRAIN / f"{name}.py"
    return ast.parse(path.read_text(), str(path))


def _imported(tree):
    """The ``keras_vit.train`` modules ``tree`` imports, inside functions
    too (``from keras_vit.train import x`` counts ``x``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "keras_vit.train":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("keras_vit.train."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names
                         if alias.name.startswith("keras_vit.train."))
    return found


def test_the_trainer_class_stays_under_250_lines():
    (trainer,) = [node for node in _tree("loop").body
                  if isinstance(node, ast.ClassDef) and node.name == "Trainer"]
    lines = trainer.end_lineno - trainer.lineno + 1
    assert lines < 250, (
        f"Trainer is {lines} lines; move a cohesive part (settings, run "
        "directory, progress, evaluation) into its own module")


@pytest.mark.parametrize("name", ["callbacks", "placement"])
def test_a_piece_of_the_loop_imports_from_below_never_from_the_loop(name):
    above = _imported(_tree(name)) & {"loop", "settings", "run_dir", "mpp"}
    assert not above, f"{name} imports {sorted(above)}"


def test_the_custom_loops_are_gone():
    # One loop: Keras' own. No module of ours writes a train step.
    for path in TRAIN.rglob("*.py"):
        text = path.read_text()
        for needle in ("GradientTape", "stateless_apply", ".backward()",
                       "strategy.run("):
            assert needle not in text, f"{path.name} has {needle}"


@pytest.mark.parametrize("name", ROOMS)
def test_a_room_says_what_it_holds_on_its_first_line(name):
    doc = ast.get_docstring(_tree(name), clean=False)
    assert doc and len(doc.splitlines()[0].split()) >= 4, (
        f"keras_vit/train/{name}.py needs a docstring whose first line "
        "says what the module holds")


def test_the_import_walker_sees_both_forms():
    # The import check above would pass vacuously if it found nothing.
    tree = ast.parse("from keras_vit.train import loop\n"
                     "def f():\n    import keras_vit.train.build\n"
                     "from keras_vit.train.run_dir import open_run\n")
    assert _imported(tree) == {"loop", "build", "run_dir"}
