"""The command line starts at once: the commands that need no model import
neither TensorFlow, Keras, JAX nor torch (checked in fresh processes),
argument errors are found before the heavy imports; ``import keras_vit``
is light and the same in every process, and each Keras class is
registered by importing the module that defines it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("tensorflow", "keras", "jax", "torch")

# What the console script does (argv[0] is the command), then the heavy
# modules loaded by the end, as JSON on the last line of stdout.
CHILD = """
import json, sys
sys.argv = ["keras-vit", *sys.argv[1:]]
from keras_vit.cli import main
try:
    code = main()
except SystemExit as e:
    code = e.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
print("\\n" + json.dumps({"code": code, "heavy": heavy}))
""" % (HEAVY,)


def run_command(*argv, env=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv],
                          capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, proc


# Several commands in one process, each run as CHILD runs one, with its
# own stdout and stderr (file descriptors 1 and 2, so that C-level output
# counts too) and warnings shown again as in a fresh process: a JSON line
# per command, with the heavy modules loaded by its end. A command that
# loads one ends the run, since the later ones would not start
# framework-free (run_commands starts another process for them).
MANY = """
import json, os, sys, tempfile, traceback, warnings
from keras_vit.cli import main
for argv in json.loads(sys.argv[1]):
    sys.argv = ["keras-vit", *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile("w+") as out, \\
            tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            with warnings.catch_warnings():
                code = main()
        except SystemExit as e:
            code = e.code
        except Exception:  # as an uncaught one ends a process
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        out.seek(0)
        err.seek(0)
        heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
        print(json.dumps({"argv": argv, "code": code, "heavy": heavy,
                          "stdout": out.read(), "stderr": err.read()}),
              flush=True)
    if heavy:
        break
""" % (HEAVY,)


def run_commands(cases):
    """``{argv: (result, proc)}`` for each argv tuple of ``cases``, as
    :func:`run_command` gives them, from as few processes as MANY allows.
    What a process writes to stderr after its last command (at exit)
    counts in that command's stderr."""
    ran = {}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    while len(ran) < len(set(cases)):
        todo = list(dict.fromkeys(c for c in cases if c not in ran))
        proc = subprocess.run([sys.executable, "-c", MANY, json.dumps(todo)],
                              capture_output=True, text=True, env=env,
                              timeout=300, cwd=ROOT)
        lines = [json.loads(line) for line in proc.stdout.splitlines()
                 if line.startswith('{"argv": ')]
        assert lines, f"exit code {proc.returncode}: {proc.stderr[-2000:]}"
        lines[-1]["stderr"] += proc.stderr
        for line in lines:
            argv = tuple(line["argv"])
            ran[argv] = ({"code": line["code"], "heavy": line["heavy"]},
                         subprocess.CompletedProcess(
                             argv, proc.returncode, line["stdout"],
                             line["stderr"]))
    return ran


def _python(code):
    """stdout of ``python -c code`` (TensorFlow's C++ logs off)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300, check=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return out.stdout


def _subcommands():
    # The parser itself, read in a child (this process has Keras already).
    code = ("import sys, argparse; sys.argv = ['keras-vit'];"
            "from keras_vit import cli; p = cli.build_parser();"
            "s = [a for a in p._actions"
            " if isinstance(a, argparse._SubParsersAction)][0];"
            "print(' '.join(sorted(s.choices)))")
    return _python(code).split()


MODEL_FREE = [("--help",), ("list",), ("info", "ViT-B/16"), ("list", "B/16")]

LIST_AND_INFO = [
    (("info", "ViT-B/16"), "hidden_size=768"),
    (("list", "Ti"), "ViT-Ti/16"),
]

ARGUMENT_ERRORS = [
    (("fine-tune", "ViT-Ti/16", "--image-size", "abc"), "--image-size"),
    (("predict", "ViT-Ti/16", "x.png", "--top", "0"), "--top"),
    (("info", "ViT-Q/99"), "ViT-Q/99"),
    (("list", "no-such-model"), "no-such-model"),
    (("export",), "required"),
    (("export", "ViT-Ti/16", "-f", "onnx", "-o", "v.onnx", "--input",
      "image_bytes"), "--input image_bytes applies to --format saved_model"),
    (("export", "ViT-Ti/16", "-f", "saved_model", "-o", "v", "--top-k",
      "3"), "--top-k apply to --input image_bytes only"),
    (("export", "ViT-Ti/16", "-f", "saved_model", "-o", "v", "--input",
      "image_bytes", "--labels", "no-such-list"), "--labels"),
    (("export", "ViT-Ti/16", "-f", "saved_model", "-o", "v", "--input",
      "image_bytes", "--top-k", "0"), "--top-k"),
]


@pytest.fixture(scope="module")
def framework_free():
    """``(subcommand names, {argv: (result, proc)})``: every command of the
    tests below that must load no framework, run by :func:`run_commands`
    (a fresh process each would cost a second of CPU each)."""
    names = _subcommands()
    cases = (MODEL_FREE + [(name, "--help") for name in names]
             + [argv for argv, _ in LIST_AND_INFO + ARGUMENT_ERRORS])
    return names, run_commands(cases)


def test_every_model_free_command_imports_no_framework(framework_free):
    names, ran = framework_free
    # Every component registered its commands (a lazy import that lost
    # one would shrink this list).
    for expected in ("list", "info", "predict", "convert", "demo",
                     "inspect", "export", "fine-tune", "pretrain"):
        assert expected in names, names
    cases = MODEL_FREE + [(name, "--help") for name in names]
    for case in cases:
        assert ran[case][0]["heavy"] == [], (
            f"`keras-vit {' '.join(case)}` imported a framework")
    codes = [ran[case][0]["code"] for case in cases]
    assert codes == [0] * len(cases), list(zip(cases, codes))


@pytest.mark.parametrize("argv,expected", LIST_AND_INFO)
def test_list_and_info_print_the_registry_without_keras(argv, expected,
                                                        framework_free):
    result, proc = framework_free[1][argv]
    assert result == {"code": 0, "heavy": []}, proc.stderr
    assert expected in proc.stdout


@pytest.mark.parametrize("argv,message", ARGUMENT_ERRORS)
def test_argument_errors_come_before_the_heavy_imports(argv, message,
                                                       framework_free):
    result, proc = framework_free[1][argv]
    assert result["code"] == 2, proc.stderr
    assert result["heavy"] == [], result
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr


def test_the_command_mirrors_the_exporters_constants():
    from keras_vit.cli import export as cli
    from keras_vit.export import graph, saved_model, serving

    assert cli.INPUTS == saved_model.INPUTS
    assert cli.OUTPUTS == graph.OUTPUTS
    assert cli.DEFAULT_TOP_K == serving.DEFAULT_TOP_K


@pytest.mark.parametrize("argv, name, value", [
    (["list"], "KERAS_BACKEND", "foo"),
    (["--help"], "KERAS_VIT_ONEDNN", "maybe"),
])
def test_a_bad_setting_is_one_line_before_any_import(argv, name, value):
    proc = subprocess.run(["keras-vit", *argv], capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, **{name: value}))
    assert proc.returncode == 2, proc.stderr
    assert name in proc.stderr and value in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_model_command_still_registers_the_classes(tmp_path):
    """A command that loads a file imports every class first: a .keras
    Axial-ViT (a class no other code path would import) loads."""
    import keras_vit
    from PIL import Image

    # Saved here: the file is the same from any process, and a child to
    # save it would pay another TensorFlow start-up.
    keras_vit.axial_vit(image_size=32, patch_size=8, hidden_size=32,
                        num_layers=2, num_heads=4, mlp_dim=64,
                        num_classes=3).save(str(tmp_path / "axial.keras"))
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "red.png")
    result, proc = run_command("predict", str(tmp_path / "axial.keras"),
                               str(tmp_path / "red.png"), "--json")
    assert result["code"] == 0, proc.stderr[-2000:]
    assert "keras" in result["heavy"]
    printed = json.loads(proc.stdout.strip().rsplit("\n", 1)[0])
    assert "red.png" in json.dumps(printed)


def test_importing_a_module_registers_its_keras_classes():
    """Every Keras class of the package is registered by importing the
    module that defines it: the models (and their layers) with
    ``keras_vit.models``, the schedule and loss that a model compiled by
    keras_vit.train saves in its .keras file with
    ``keras_vit.train.schedules``."""
    code = ("import keras_vit.models, keras_vit.train.schedules, keras;"
            "names = ['VisionTransformer', 'AxialVisionTransformer',"
            " 'ResNetV2', 'EncoderBlock', 'WarmupDecay', 'SmoothedSparseCE'];"
            "print([n for n in names if keras.saving.get_registered_object("
            "'keras_vit>' + n) is None])")
    assert _python(code).strip().splitlines()[-1] == "[]"


@pytest.fixture(scope="module")
def compiled_keras_file(tmp_path_factory):
    """A tiny ViT compiled with the package's WarmupDecay schedule, saved
    (in this process: the file is the same from any) as a .keras file."""
    import keras
    import keras_vit

    path = tmp_path_factory.mktemp("compiled") / "m.keras"
    m = keras_vit.vit(32, 8, 32, 1, 2, 64, num_classes=3)
    m.compile(optimizer=keras.optimizers.SGD(
        keras_vit.train.schedules.WarmupDecay(0.1, 2, 10)), loss="mse")
    m.save(str(path))
    return path


@pytest.mark.parametrize("first", [
    "import keras_vit; import keras",
    "import keras; import keras_vit",
    # TensorFlow imports Keras inside its own import (after probing it).
    "import keras_vit; import tensorflow; import keras",
])
def test_import_keras_vit_registers_the_classes_in_either_order(
        first, compiled_keras_file):
    """``import keras_vit`` (light, no Keras) and Keras in either order:
    ``keras.saving.load_model`` reads a model and a compiled model's
    schedule, which only the package's classes define (a fresh process per
    order: the order is what is tested)."""
    out = _python(f"{first}\n"
                  f"m = keras.saving.load_model({str(compiled_keras_file)!r})"
                  "\nprint(type(m).__name__, "
                  "m.optimizer.get_config()['learning_rate']['class_name'])")
    assert out.split()[-2:] == ["VisionTransformer", "WarmupDecay"]


def _registering_classes(path):
    """``(line, where)`` of each class decorated with
    ``register_keras_serializable`` in ``path``, where is ``"module"`` for a
    class at module level and ``"nested"`` for one inside a function or
    class (registered only when that code runs)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
                "register_keras_serializable" in ast.unparse(d)
                for d in node.decorator_list):
            found.append((node.lineno,
                          "module" if id(node) in top else "nested"))
    return found


def test_every_keras_class_is_defined_at_module_level():
    """A class defined inside a function is registered only once that
    function runs, so a .keras file naming it fails to load in a process
    that has not run it."""
    found = {f"{path.relative_to(ROOT)}:{line}": where
             for folder in ("keras_vit", "zoo", "export")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line, where in _registering_classes(path)}
    assert len(found) >= 15, found  # the walker sees the layers and models
    assert [k for k, v in found.items() if v != "module"] == []


def test_the_walker_tells_nested_classes(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import keras\n"
        "@keras.saving.register_keras_serializable(package='p')\n"
        "class A(keras.layers.Layer): pass\n"
        "def f():\n"
        "    @keras.saving.register_keras_serializable(package='p')\n"
        "    class B(keras.layers.Layer): pass\n")
    assert _registering_classes(source) == [(3, "module"), (6, "nested")]


# A process is the command line only through these modules' mains (and the
# package's worker processes through theirs): nowhere else may the library
# read its command line.
READS_ARGV = {"keras_vit/cli/__init__.py", "keras_vit/cli/options.py",
              "keras_vit/cli/train.py", "keras_vit/train/__main__.py",
              "keras_vit/cli/analysis.py", "keras_vit/cli/export.py",
              "export/_tf_worker.py", "export/onnx_worker.py",
              "export/openvino_worker.py"}


def test_only_the_command_line_reads_sys_argv():
    import ast

    readers = set()
    for folder in ("keras_vit", "zoo", "export"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute)
                        and node.attr in ("argv", "orig_argv")
                        and isinstance(node.value, ast.Name)
                        and node.value.id == "sys"):
                    readers.add(str(path.relative_to(ROOT)))
    assert readers <= READS_ARGV, sorted(readers - READS_ARGV)


# ``import keras_vit`` (and its heavier subpackages) in a process whose
# argv[0] is %r; prints the package and framework modules loaded.
IMPORT_AS = ("import sys; sys.argv[0] = %r\n"
             "import keras_vit, keras_vit.zoo, keras_vit.analysis, "
             "keras_vit.train\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('keras_vit', 'keras', 'tensorflow', 'jax', 'torch', "
             "'matplotlib')))")


@pytest.fixture(scope="module")
def imported_as_python_c():
    """The modules IMPORT_AS lists in a ``python -c`` process: what every
    other way of starting must match (one child for all of them)."""
    return _python(IMPORT_AS % "-c")


@pytest.mark.parametrize("argv0", ["-c", "keras-vit", "script.py"])
def test_import_keras_vit_is_the_same_in_every_process(argv0,
                                                       imported_as_python_c):
    """However the process was started, ``import keras_vit`` imports the
    same modules, no framework, and prints nothing."""
    code = IMPORT_AS % argv0
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    modules = json.loads(proc.stdout.replace("'", '"'))
    assert not [m for m in modules if not m.startswith("keras_vit")], modules
    assert proc.stdout == imported_as_python_c


def test_the_startup_benchmark_prints_its_table(tmp_path):
    out = tmp_path / "cli.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cli_startup.py"),
         "--runs", "1", "--out", str(out)], capture_output=True, text=True,
        timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
            if line.startswith("| `")]
    commands = [r[0].strip().strip("`") for r in rows]
    assert commands[0].startswith("python -c 'import keras_vit'")
    assert "keras-vit list" in commands and "keras-vit --help" in commands
    assert any(c.endswith("fine-tune --help") for c in commands)
    for _, cpu, wall, met in rows:
        assert float(cpu) > 0 and float(wall) > 0
        assert met.strip() in ("yes", "no", "-")
    assert "CPU:" in out.read_text()
    # The table's verdict follows its own figures.
    for name, cpu, _, met in rows[1:]:
        assert (met.strip() == "yes") == (float(cpu) < 0.5), name
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cli_startup.py"),
         "--runs", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--runs must be in 1..100, got 0" in (
        proc.stderr)
