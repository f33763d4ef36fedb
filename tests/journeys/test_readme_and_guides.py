"""A new user's first hour: the README's install in a fresh venv, then the
README's tour and every Python block and ``keras-vit`` command of the
guides, as written, on that install.

The venv sees nothing of this one (no ``--system-site-packages``, no
extras: no matplotlib, jax, torch, timm, transformers or keras-hub). Each
documentation block runs with the textual substitutions listed for it in
``SNIPPETS`` (sizes and steps made tiny; each ``old`` text must still be
in the block, so a doc edit that outdates the table fails here) after a
``setup`` that makes what the doc leaves to the reader (a ``photo``, a
``pets/`` folder). ``journey_runner.py`` makes every run offline and small
in the same way for all: "ViT-B/16" keeps its name, patches, resolution
and head but is 32 wide and 1 layer deep, and a released checkpoint's URL
gives a random checkpoint in that file's official layout. Hub files are
written by timm, transformers and keras-hub themselves (in this
environment, where they are test extras) and served by a local
stand-in for the Hub (tests/_fake_hub.py).

A block that needs an extra (keras-hub) or another backend (JAX) runs in
this suite's environment instead, and its table entry says why.

The venv is built once per test run (tests/readme_install.py); the
README's first command, ``keras-vit demo``, runs on it in full in
tests/cli/test_demo.py.
"""

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import quick_xla_flags
from readme_install import clean_env, readme_venv, venv_env

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("journey_runner.py")
DOCS = ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "guides").glob("*.md"))]
TF_LOG = re.compile(r"^[IWEF]\d{4} |I0000|E0000|cuInit|absl::InitializeLog",
                    re.M)
FRAMEWORKS = ("tensorflow", "keras", "jax", "torch")


# --------------------------------------------------------------------------
# The documentation's blocks and commands


def fenced_blocks(text, language):
    return [m.group(1) for m in re.finditer(
        rf"^```{language}\n(.*?)^```", text, re.M | re.S)]


def python_blocks():
    """``{(file, first code line): code}`` for every ```python block."""
    blocks = {}
    for doc in DOCS:
        for code in fenced_blocks((ROOT / doc).read_text(), "python"):
            first = next(line.strip() for line in code.splitlines()
                         if line.strip())
            key = (doc, first)
            assert key not in blocks, f"two blocks of {doc} start {first!r}"
            blocks[key] = code
    return blocks


def command_lines():
    """``{command: file}`` for every ``keras-vit ...`` line of a ```bash
    block (continuations joined, comments dropped) and every inline
    `` `keras-vit ...` `` of the README and the guides."""
    found = {}
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for block in fenced_blocks(text, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("#", 1)[0].split("&&"):
                    part = " ".join(part.split())
                    if part.startswith("keras-vit"):
                        found.setdefault(part, doc)
        for span in re.findall(r"`(keras-vit(?: [^`]*)?)`", text):
            found.setdefault(" ".join(span.split()), doc)
    return found


# --------------------------------------------------------------------------
# The table: per block, what makes it tiny and offline, and what must hold


@dataclass
class Snippet:
    subs: tuple = ()          # (old, new): old must be in the block
    setup: str = ""           # Python run first, in the block's namespace
    expect: tuple = ()        # expressions true after the block
    files: dict = field(default_factory=dict)  # dest -> hub_files path
    where: str = "venv"       # "venv", or "suite"/"jax" with a reason
    reason: str = ""


PHOTO = "photo = journey.photo()\n"
ZOO = "from keras_vit import zoo   # the page's first block\n"
TINY_RUN = ", total_steps=2, batch_size=4, image_size=64)"
# The README's training blocks, cut to two steps of four images.
README_TWO_STEPS = (("total_steps=500)", "total_steps=2, batch_size=4)"),
                    ("steps_per_epoch=500", "steps_per_epoch=2"))

SNIPPETS = {
    ("README.md", "import keras_vit"): Snippet(
        subs=README_TWO_STEPS,
        setup="train_ds = journey.dataset(384, 10)\n",
        expect=("model.output_shape == (None, 10)",
                "model.optimizer.iterations.numpy() == 2")),
    ("README.md", "from keras_vit import analysis, export, train, zoo"):
        Snippet(
            subs=README_TWO_STEPS,
            setup=PHOTO + "journey.image_folder('pets')\n",
            expect=("rollout.shape[0] == 1",
                    "model.output_shape == (None, 37)",
                    "recipe.batch_size == 4",
                    "os.path.isfile('vit_serving/saved_model.pb')",
                    # decode_predictions printed WordNet ids and names
                    "re.search(r\"\\('n\\d{8}', '\\w\", out) is not None"),
        ),
    ("docs/guides/export.md", "from keras_vit import export"): Snippet(
        setup="model = journey.tiny_model()\n",
        expect=("os.path.isdir('vit_savedmodel')",
                "os.path.isfile('vit.tflite')",
                "os.path.isfile('vit.onnx')")),
    ("docs/guides/models.md", "import keras_vit"): Snippet(
        subs=(("hidden_size=768, num_layers=12",
               "hidden_size=32, num_layers=1"),
              ("num_heads=12, mlp_dim=3072", "num_heads=2, mlp_dim=64")),
        expect=("model.output_shape == (None, 1000)",
                "len(features.outputs) == 2")),
    ("docs/guides/models.md",
     "import numpy as np, keras_vit  # the ViT family"): Snippet(
        expect=("tuple(embedding.shape) == (1, 32)",
                "dinov2_reg.get_config()['num_registers'] == 4")),
    ("docs/guides/models.md",
     'model = keras_vit.resolve_model("runs/cifar10", image_size=384)  '
     '# or a name, a file'): Snippet(
        setup=("import keras_vit\n"
               "os.makedirs('runs/cifar10')\n"
               "journey.tiny_model(10).save('runs/cifar10/model.keras')\n"),
        expect=("model.input_shape == (None, 384, 384, 3)",
                "copy.output_shape == (None, 100)",
                "copy.dtype_policy.name == 'mixed_bfloat16'",
                "len(parts.outputs) == 3")),
    ("docs/guides/models.md",
     'model = keras_vit.zoo.load("ViT-B/16", dynamic_image_size=True)  '
     '# 384 table'): Snippet(
        setup=("import keras_vit, numpy as np\n"
               "x_384x512 = np.zeros((1, 384, 512, 3), 'float32')\n"),
        expect=("model.predict(x_384x512, verbose=0).shape == (1, 1000)",
                "model.input_shape == (None, None, None, 3)")),
    ("docs/guides/models.md", "model = keras_vit.models.vit("): Snippet(
        subs=(("hidden_size=768, num_layers=12",
               "hidden_size=32, num_layers=1"),
              ("num_heads=12, mlp_dim=3072", "num_heads=2, mlp_dim=64")),
        setup="import keras_vit   # the page's first block\n",
        expect=("model.output_shape == (None, 1000)",
                "axial.output_shape == (None, 1000)")),
    ("docs/guides/training.md", "from keras_vit import train"): Snippet(
        subs=(('out_dir="runs/pets")', 'out_dir="runs/pets"' + TINY_RUN),),
        setup="journey.image_folder('path/to/images')\n",
        expect=("run.metrics['final_step'] == 2",
                "os.path.isfile('runs/pets/model.keras')",
                "'accuracy' in out")),
    ("docs/guides/training.md", "import keras_vit"): Snippet(
        subs=(("total_steps=500,", "total_steps=2, batch_size=4,"),
              ("steps_per_epoch=500", "steps_per_epoch=2")),
        setup="journey.image_folder('path/to/images')\n",
        expect=("model.output_shape == (None, 2)",
                "model.optimizer.iterations.numpy() == 2")),
    ("docs/guides/training.md",
     'run = train.pretrain_mpp("ViT-B/16", "path/to/photos", '
     'out_dir="runs/mpp")'): Snippet(
        subs=(('out_dir="runs/mpp")', 'out_dir="runs/mpp"' + TINY_RUN),
              ('recipe="finetune-pets-flowers")',
               'recipe="finetune-pets-flowers"' + TINY_RUN)),
        setup=("from keras_vit import train   # the page's first block\n"
               "journey.image_folder('path/to/photos', flat=True)\n"
               "journey.image_folder('path/to/labelled')\n"),
        expect=("classifier.output_shape == (None, 37)",
                "os.path.isfile('runs/mpp/model.keras')")),
    ("docs/guides/training.md",
     "# DeiT on the digits through model.fit; run it again to resume"):
        Snippet(
            subs=(("total_steps=120,", "total_steps=4,"),
                  ("every=20", "every=2")),
            expect=("model.optimizer.iterations.numpy() == 4",
                    "os.path.isfile('runs/deit-fit/ckpt-4.npz')",
                    "os.path.isfile('deit-digits.keras')")),
    ("docs/guides/training.md", "import keras, keras_vit"): Snippet(
        subs=(("train.distribution(8,", "train.distribution(2,"),),
        setup=("from keras_vit import train\n"
               "train.configure_cpu_devices(2)\n"),
        expect=("keras.distribution.distribution().device_mesh.shape "
                "== (1, 2)",
                "model.output_shape == (None, 10)"),
        where="jax", reason="keras.distribution is JAX's; the base "
                            "install has no jax"),
    ("docs/guides/zoo.md", "from keras_vit import zoo"): Snippet(
        expect=("model.input_shape == (None, 224, 224, 3)",)),
    ("docs/guides/zoo.md", "import numpy as np"): Snippet(
        # Random weights at 56 px (a 4x4 grid): the page's calls, offline.
        subs=(('zoo.load("DINOv2-reg-S/14")',
               'zoo.load("DINOv2-reg-S/14", weights=None, image_size=56)'),
              ("(2, 518, 518, 3)", "(2, 56, 56, 3)")),
        expect=("embedding.shape == (2, 384)",
                "tuple(maps['block_11'].shape) == (2, 4, 4, 384)",
                "sorted(maps) == ['block_10', 'block_11', 'block_8', "
                "'block_9']")),
    ("docs/guides/zoo.md",
     'model = zoo.load("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_'
     'ft_in1k")'): Snippet(
        setup=ZOO,
        files={"path/to/repo": "timm-ft", "model.safetensors":
               "timm-ft/model.safetensors"},
        expect=("os.path.isfile('my-vit/model.safetensors')",
                "model.output_shape == (None, 1000)")),
    ("docs/guides/zoo.md",
     'model = zoo.load("hf-hub:google/vit-base-patch16-224")  '
     '# the Hub cache, HF_HUB_OFFLINE, HF_TOKEN'): Snippet(
        setup=ZOO,
        files={"path/to/folder": "transformers",
               "path/to/model.safetensors":
               "transformers/model.safetensors"},
        expect=("model.output_shape == (None, 5)",)),
    ("docs/guides/zoo.md",
     'model = zoo.load("path/to/preset")          '
     '# a directory save_to_preset wrote'): Snippet(
        setup=ZOO + (
            "import keras_hub\n"
            "hub_classifier = keras_hub.models.ViTImageClassifier(\n"
            "    backbone=keras_hub.models.ViTBackbone(\n"
            "        image_shape=(32, 32, 3), patch_size=8, num_layers=1,\n"
            "        num_heads=2, hidden_dim=32, mlp_dim=64),\n"
            "    num_classes=3)\n"
            "hub_classifier.save_to_preset('path/to/preset')\n"
            "keras_hub.models.DINOV2Backbone(\n"
            "    image_shape=(16, 16, 3), patch_size=8, num_layers=1,\n"
            "    num_heads=2, hidden_dim=32, intermediate_dim=64,\n"
            "    position_embedding_shape=(16, 16, 3)\n"
            ").save_to_preset('path/to/dinov2_preset')\n"),
        expect=("model.output_shape == (None, 3)",
                "os.path.isdir('vit_b16_preset')",
                "type(dino).__name__ == 'DINOV2Backbone'"),
        where="suite", reason="needs keras-hub, an extra"),
    ("docs/guides/zoo.md",
     "x = zoo.preprocess_input(image, 384)        "
     "# (H, W, 3) in [0, 255], any size"): Snippet(
        setup=ZOO + "image = journey.photo(100, 70)\n"
                    "model = zoo.load('ViT-B/16')   # the page's\n",
        expect=("x.shape == (384, 384, 3)",
                "-1 <= x.min() and x.max() <= 1",
                "zoo.decode_predictions(preds, top=5)[0][0][0]"
                ".startswith('n')")),
}


# --------------------------------------------------------------------------
# Commands: each keras-vit line of the docs is checked against the parser;
# these run, in order, in one folder per page (a page's commands build on
# each other: fine-tune, then evaluate or export its run).


@dataclass
class Command:
    add: str = ""             # options appended: tiny sizes, few steps
    subs: tuple = ()
    setup: str = ""
    expect: tuple = ("status == 0",)


TINY_FIT = " --steps 2 --batch-size 4 --image-size 64"
ONE_ERROR_LINE = ("len(err.strip().splitlines()) == 1",
                  "err.startswith('keras-vit: error: ')")

COMMANDS = {
    "README.md": {
        "keras-vit list": Command(expect=("status == 0",
                                          "'ViT-B/16' in out")),
        "keras-vit predict ViT-B/16 photo.jpg": Command(
            setup="journey.image_file('photo.jpg')\n"
                  "journey.image_folder('pets')\n",
            expect=("status == 0", "re.search(r'n\\d{8}', out)")),
        "keras-vit fine-tune ViT-B/16 --data pets/ --recipe finetune "
        "--out runs/pets": Command(
            add=TINY_FIT, expect=("status == 0",
                                  "os.path.isfile('runs/pets/model.keras')")),
        "keras-vit export runs/pets --format onnx -o vit.onnx": Command(
            expect=("status == 0", "os.path.isfile('vit.onnx')")),
        # The base install has no matplotlib: one line naming it and pip.
        "keras-vit inspect runs/pets photo.jpg --out inspect/": Command(
            expect=("status == 2", *ONE_ERROR_LINE, "'matplotlib' in err",
                    "'pip install' in err")),
    },
    "docs/guides/training.md": {
        "keras-vit fine-tune ViT-B/16 --data path/to/images --recipe "
        "finetune --out runs/pets": Command(
            add=TINY_FIT,
            setup="journey.image_folder('path/to/images')\n"
                  "journey.image_folder('path/to/test_images', per_class=2)\n"
                  "journey.image_folder('path/to/photos', flat=True)\n"
                  "journey.image_folder('path/to/labelled')\n"),
        "keras-vit evaluate runs/pets --data path/to/test_images": Command(
            expect=("status == 0", "'accuracy' in out + err")),
        "keras-vit fewshot runs/pets --data digits --eval-data digits:test":
            Command(add=" --shots 1,5 --seeds 1"),
        "keras-vit pretrain ViT-B/16 --objective mpp --data path/to/photos "
        "--out runs/mpp": Command(
            add=TINY_FIT, expect=("status == 0",
                                  "os.path.isfile('runs/mpp/model.keras')")),
        "keras-vit fine-tune runs/mpp/model.keras --data path/to/labelled "
        "--recipe finetune": Command(add=TINY_FIT),
        # Offline, with no VTAB data prepared: stops at once, naming the
        # tfds command that prepares it. (The data folder is one that holds
        # nothing on any machine, not the user's ~/tensorflow_datasets.)
        "keras-vit vtab ViT-B/16 --tasks natural,clevr_count --data-dir "
        "~/tensorflow_datasets --out runs/vtab": Command(
            subs=(("~/tensorflow_datasets", "no_tfds_here"),),
            expect=("status == 2", *ONE_ERROR_LINE, "'tfds build' in err")),
    },
    "docs/guides/cli.md": {
        # A fine-tuned model names its classes after its data's folders.
        "keras-vit predict runs/pets photo.jpg": Command(
            setup="import keras_vit, numpy as np\n"
                  "os.makedirs('runs/pets', exist_ok=True)\n"
                  "m = keras_vit.vit(32, 8, 32, 1, 2, 64, num_classes=2,\n"
                  "                  label_names=['cat', 'dog'])\n"
                  "# Trained: a zero head ranks nothing (predict says so).\n"
                  "m.get_layer('head').kernel.assign(np.random.default_rng(\n"
                  "    0).normal(size=(32, 2)).astype('float32'))\n"
                  "m.save('runs/pets/model.keras')\n"
                  "journey.image_file('photo.jpg')\n",
            expect=("status == 0", "'cat' in out and 'dog' in out")),
    },
    "docs/guides/export.md": {
        "keras-vit export ViT-B/16 --format onnx -o deploy/v1/vit.onnx":
            Command(add=" --image-size 32",
                    expect=("status == 0",
                            "os.path.isfile('deploy/v1/vit.onnx')")),
        "keras-vit export runs/flowers --format tflite -q int8 "
        "--calibration-data flowers/ -o vit_int8.tflite": Command(
            setup="import keras_vit\n"
                  "os.makedirs('runs/flowers', exist_ok=True)\n"
                  "keras_vit.vit(32, 8, 32, 1, 2, 64, num_classes=2).save(\n"
                  "    'runs/flowers/model.keras')\n"
                  "journey.image_folder('flowers', per_class=2)\n",
            expect=("status == 0", "os.path.isfile('vit_int8.tflite')")),
        "keras-vit export ViT-B/16 -f saved_model -o vit_serving --input "
        "image_bytes --top-k 3 --labels my_classes.txt": Command(
            add=" --image-size 32",
            setup="Path('my_classes.txt').write_text(''.join(\n"
                  "    f'class {i}\\n' for i in range(1000)))\n",
            expect=("status == 0",
                    "os.path.isfile('vit_serving/saved_model.pb')")),
    },
}

# The README's inspect line again where matplotlib is installed (this
# suite's environment): the figures are drawn.
WITH_MATPLOTLIB = {
    "README.md": {
        "keras-vit inspect runs/pets photo.jpg --out inspect/": Command(
            setup="os.makedirs('runs/pets')\n"
                  "journey.tiny_model(37, 64).save('runs/pets/model.keras')\n"
                  "journey.image_file('photo.jpg')\n",
            expect=("status == 0", "os.path.isfile('inspect/analysis.json')",
                    "len(list(Path('inspect').glob('*.png'))) >= 4")),
    },
}

# keras-vit lines that name real values but do not run here, and why.
NOT_RUN = {
    "keras-vit demo": "the README's first command runs in full on this "
                      "same install (tests/readme_install.py) in tests/cli/"
                      "test_demo.py, which checks its figures and files",
    "keras-vit benchmark ViT-B/16 --runtimes keras,xla,onnx,tflite "
    "--batch 1,8": "a measurement (minutes at its size); tests/"
                   "test_export.py runs the benchmark command on a tiny "
                   "model with the same runtimes",
}

# A synopsis names its arguments in capitals (MODEL, IMAGE...) or brackets.
SYNOPSIS = re.compile(r"\b[A-Z]{3,}\b|\[")


# --------------------------------------------------------------------------
# Meta-tests: the tables cover the docs, and the docs still hold the table.


def test_every_python_block_has_a_table_entry():
    blocks = python_blocks()
    missing = sorted(set(blocks) - set(SNIPPETS))
    stale = sorted(set(SNIPPETS) - set(blocks))
    assert not missing, f"python blocks with no SNIPPETS entry: {missing}"
    assert not stale, f"SNIPPETS entries no doc block starts so: {stale}"
    for key, snippet in SNIPPETS.items():
        for old, _ in snippet.subs:
            assert old in blocks[key], f"{key}: {old!r} is no longer there"
        assert snippet.where == "venv" or snippet.reason, key


def test_every_command_is_run_or_says_why_not():
    lines = command_lines()
    run = {cmd: doc for doc, table in COMMANDS.items() for cmd in table}
    for cmd, doc in run.items():
        assert cmd in lines, f"{doc}: {cmd!r} is no longer in the docs"
        for old, _ in COMMANDS[doc][cmd].subs:
            assert old in cmd
    for cmd in NOT_RUN:
        assert cmd in lines, f"NOT_RUN: {cmd!r} is no longer in the docs"
    for cmd, doc in lines.items():
        words = cmd.split()
        if cmd in run or cmd in NOT_RUN or SYNOPSIS.search(cmd):
            continue
        # A mention: a command name, maybe with an option (`keras-vit
        # pretrain --objective mpp`), but nothing to run it on.
        positional = [w for w in words[2:] if not w.startswith("-")]
        options_values = [w for i, w in enumerate(words[2:], 2)
                          if words[i - 1].startswith("-")]
        assert not set(positional) - set(options_values), \
            f"{doc}: {cmd!r} looks runnable: add it to COMMANDS or NOT_RUN"


def _subparsers(parser):
    return next(a for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)).choices


def test_every_documented_command_and_option_exists():
    from keras_vit import cli

    parser = cli.build_parser()
    commands = _subparsers(parser)
    bad = []
    for cmd, doc in command_lines().items():
        words = shlex.split(cmd)
        if len(words) < 2 or words[1].isupper():  # `keras-vit COMMAND`
            continue
        sub = commands.get(words[1])
        if sub is None:
            bad.append(f"{doc}: {cmd!r}: no command {words[1]!r}")
            continue
        known = dict(parser._option_string_actions,
                     **sub._option_string_actions)
        for word, value in zip(words[2:], words[3:] + [""]):
            option = word.strip("[]").split("=")[0]
            if not re.fullmatch(r"--?[A-Za-z][\w-]*", option):
                continue
            if option not in known:
                bad.append(f"{doc}: {cmd!r}: {words[1]} has no {option}")
                continue
            # A synopsis lists the choices as a|b|c.
            choices = known[option].choices
            values = value.strip("[]").split("|")
            wrong = [v for v in values if choices and v not in choices]
            if wrong:
                bad.append(f"{doc}: {cmd!r}: {option} takes none of {wrong}")
    assert not bad, "\n".join(bad)


def script_lines():
    """``{line: file}`` for every ``python SCRIPT.py ...`` line of a
    ```bash block."""
    found = {}
    for doc in DOCS:
        for block in fenced_blocks((ROOT / doc).read_text(), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                line = " ".join(line.split("#", 1)[0].split())
                if re.match(r"python [\w/]+\.py\b", line):
                    found.setdefault(line, doc)
    return found


def test_every_documented_script_and_option_exists():
    """The measuring scripts the guides quote (benchmarks/*.py) exist and
    take every option the quoted line gives them."""
    lines = script_lines()
    assert lines, "no python SCRIPT.py line found in the guides"
    for line, doc in lines.items():
        words = shlex.split(line)
        script = ROOT / words[1]
        assert script.is_file(), f"{doc}: {line!r}: no {words[1]}"
        proc = subprocess.run([sys.executable, str(script), "--help"],
                              capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env=dict(os.environ,
                                                 PYTHONPATH=str(ROOT)))
        assert proc.returncode == 0, proc.stderr[-2000:]
        known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)",
                               proc.stdout))
        missing = [w for w in words[2:] if w.startswith("-")
                   and w.split("=")[0] not in known]
        assert not missing, f"{doc}: {line!r}: {words[1]} has no {missing}"


# --------------------------------------------------------------------------
# The fresh venv of the README's install


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    """The python of ``pip install -e .`` in a venv that sees nothing of
    this one: one per test run (tests/readme_install.py), which the
    demo's test (tests/cli/test_demo.py) runs the README's first command
    on too."""
    python = readme_venv(tmp_path_factory)
    if python is None:
        pytest.skip("PyPI (pypi.org:443) is unreachable: the install "
                    "needs it")
    return python


@pytest.mark.slow
def test_readme_install_in_a_fresh_venv(fresh_venv, venv_results, tmp_path):
    """No ``[dev]`` extra: every runtime package imports (the first job of
    the journeys' process, which imports them anyway), the command starts
    without TensorFlow's C++ log lines, and ``keras_vit`` is this checkout
    (the editable install)."""
    env = venv_env(fresh_venv, PATH=f"{fresh_venv.parent}{os.pathsep}"
                                    f"{os.environ.get('PATH', '')}")
    proc = subprocess.run(["keras-vit", "--help"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo" in proc.stdout and not TF_LOG.search(proc.stderr)
    _check_ran(venv_results, IMPORTS_JOB["id"])


@pytest.mark.slow
def test_import_keras_vit_prints_nothing_and_loads_no_framework(
        fresh_venv, tmp_path):
    """A library process: ``import keras_vit`` writes nothing to stdout or
    stderr and imports no framework, and the extras the README's install
    leaves out are indeed absent (so the journeys below prove something)."""
    report = tmp_path / "modules.json"
    code = ("import sys, json, importlib.util, keras_vit\n"
            f"json.dump({{'modules': sorted(sys.modules), 'extras': {{m: "
            f"importlib.util.find_spec(m) is not None for m in ("
            f"'matplotlib', 'jax', 'torch', 'timm', 'transformers', "
            f"'keras_hub')}}}}, open({str(report)!r}, 'w'))\n")
    proc = subprocess.run([str(fresh_venv), "-c", code], capture_output=True,
                          text=True, env=venv_env(fresh_venv),
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout, proc.stderr) == ("", "")
    got = json.loads(report.read_text())
    loaded = sorted(m for m in got["modules"]
                    if m.split(".")[0] in FRAMEWORKS)
    assert not loaded, loaded
    assert not any(got["extras"].values()), got["extras"]


# --------------------------------------------------------------------------
# Running the blocks


def _substituted(code, subs):
    for old, new in subs:
        code = code.replace(old, new)
    return code


def _job_id(key):
    doc, first = key
    return f"{doc}: {first}"


def _folder(key):
    return re.sub(r"[^\w]+", "_", _job_id(key))[:80]


def _python_jobs(where, hub_files):
    blocks = python_blocks()
    jobs = []
    for key, snippet in SNIPPETS.items():
        if snippet.where != where:
            continue
        jobs.append({
            "id": _job_id(key), "cwd": _folder(key),
            "code": _substituted(blocks[key], snippet.subs),
            "setup": snippet.setup,
            "expect": list(snippet.expect),
            "files": {dest: str(hub_files / src)
                      for dest, src in snippet.files.items()}})
    return jobs


def _command_jobs(tables):
    jobs = []
    for doc, table in tables.items():
        for cmd, command in table.items():
            line = _substituted(cmd, command.subs) + command.add
            jobs.append({
                "id": f"{doc}: {cmd}", "cwd": _folder((doc, "shell")),
                "argv": shlex.split(line),
                "setup": command.setup,
                "expect": list(command.expect)})
    return jobs


def _run_jobs(python, jobs, root, env, timeout=900):
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "jobs.json"
    results = root / "results.json"
    spec.write_text(json.dumps({"root": str(root / "work"), "jobs": jobs}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([str(python), str(RUNNER), str(spec), str(results)],
                          capture_output=True, text=True, env=env, cwd=root,
                          timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    got = json.loads(results.read_text()) if results.exists() else {}
    # The suite's time budget is planned from these (pytest -s shows them).
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime +
                                               before.ru_stime)
    print(f"\n{root.name}: {len(jobs)} jobs, {cpu:.0f} s of CPU")
    for job, result in sorted(got.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"{result['seconds']:7.1f} s, {result.get('cpu', 0):5.1f} s "
              f"of CPU  {job}")
    for job in jobs:  # a crash of the process fails the jobs it did not run
        got.setdefault(job["id"], {
            "ok": False, "seconds": 0, "stdout": "",
            "stderr": "", "error": f"the runner exited with {proc.returncode} "
                                   f"before this job:\n{proc.stderr[-3000:]}"})
    return got


def write_hub_files(root):
    """Repositories written by the libraries that define their layouts,
    as tiny as the runner's shrunk "ViT-B/16" (32 wide, 1 layer, 2 heads,
    MLP 64), so that the names the docs use load them."""
    import timm
    import torch
    import transformers
    from timm.models import save_for_hf

    torch.manual_seed(0)
    for folder, arch in (("timm-ft", "vit_base_patch16_224.augreg2_in21k_"
                                     "ft_in1k"),
                         ("timm-i21k", "vit_base_patch16_224.augreg_in21k")):
        model = timm.create_model(arch, pretrained=False, embed_dim=32,
                                  depth=1, num_heads=2, mlp_ratio=2.0)
        save_for_hf(model, root / folder, safe_serialization=True)
        # timm records the widths it was asked for; a Hub repository of
        # vit_base_patch16_224 has none (its name fixes them), and the
        # runner's shrunk ViT-B/16 is what the name means there.
        config = json.loads((root / folder / "config.json").read_text())
        for key in ("embed_dim", "depth", "num_heads", "mlp_ratio"):
            config["model_args"].pop(key, None)
        (root / folder / "config.json").write_text(json.dumps(config))
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, image_size=224, patch_size=16,
        id2label={i: f"class {i}" for i in range(5)},
        label2id={f"class {i}": i for i in range(5)})
    transformers.ViTForImageClassification(config).save_pretrained(
        root / "transformers", safe_serialization=True)
    return root


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    return write_hub_files(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="module")
def hub(hub_files):
    from _fake_hub import FakeHub

    with FakeHub({
            "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k":
                hub_files / "timm-ft",
            "timm/vit_base_patch16_224.augreg_in21k": hub_files / "timm-i21k",
            "google/vit-base-patch16-224": hub_files / "transformers"}) \
            as server:
        yield server


def _runner_env(tmp, hub, **extra):
    # Not KERAS_VIT_OFFLINE: it keeps the Hub route offline too, and the
    # Hub blocks download from the local stand-in; the runner's fake fetch
    # already refuses every bucket URL but the zoo's own files.
    return dict(KERAS_VIT_CACHE=str(tmp / "cache"),
                HF_HOME=str(tmp / "hf"), HF_ENDPOINT=hub.url,
                HF_HUB_DISABLE_TELEMETRY="1", TF_CPP_MIN_LOG_LEVEL="3",
                MPLBACKEND="Agg", **extra)


@pytest.fixture(scope="module")
def venv_results(fresh_venv, hub, hub_files, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("journeys")
    jobs = ([IMPORTS_JOB] + _python_jobs("venv", hub_files)
            + _command_jobs(COMMANDS) + [FIGURES_JOB])
    env = venv_env(fresh_venv, **_runner_env(tmp, hub))
    return _run_jobs(fresh_venv, jobs, tmp, env)


@pytest.fixture(scope="module")
def suite_results(hub, hub_files, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    env = clean_env(**_runner_env(tmp, hub), PYTHONPATH=str(ROOT),
                     KERAS_BACKEND="tensorflow")
    jobs = _python_jobs("suite", hub_files) + _command_jobs(WITH_MATPLOTLIB)
    return _run_jobs(sys.executable, jobs, tmp, env)


@pytest.fixture(scope="module")
def jax_results(hub, hub_files, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jax")
    # XLA at -O0 (conftest.quick_xla_flags): the block trains a tiny
    # model, and compiling its step is most of the run.
    env = clean_env(**_runner_env(tmp, hub), PYTHONPATH=str(ROOT),
                     KERAS_BACKEND="jax",
                     XLA_FLAGS=quick_xla_flags(os.environ.get("XLA_FLAGS",
                                                              "")))
    return _run_jobs(sys.executable, _python_jobs("jax", hub_files), tmp, env)


def _report(result):
    return (f"{result['error']}\n--- stdout ---\n{result['stdout']}"
            f"\n--- stderr ---\n{result['stderr']}")


def _check_ran(results, job):
    """The job of id ``job`` in ``results`` passed; else its report."""
    result = results[job]
    assert result["ok"], _report(result)


def _blocks_run(where):
    """Parametrizes a test over the doc blocks that run ``where`` (see
    ``SNIPPETS``), each named by its job id."""
    return pytest.mark.parametrize(
        "key", [k for k, s in SNIPPETS.items() if s.where == where],
        ids=_job_id)


# Every runtime package of the README's install imports, and keras_vit is
# this checkout (the editable install): the first job of the journeys'
# process, which imports them anyway, before any other job has run.
IMPORTS_JOB = {
    "id": "runtime packages import", "cwd": "imports", "setup": "",
    "code": "import tf2onnx, onnxruntime, onnx, tensorflow_datasets, "
            "ai_edge_litert.interpreter, huggingface_hub, safetensors, "
            "keras_vit\nprint(keras_vit.__file__)\n",
    "expect": [f"out.strip() == "
               f"{str(ROOT / 'keras_vit' / '__init__.py')!r}"]}


# In the base install: the numbers of the analysis work, a figure stops
# with one line naming matplotlib and the pip command.
FIGURES_WITHOUT_MATPLOTLIB = """\
import numpy as np
from keras_vit import analysis
from keras_vit.base import errors
scores = analysis.attention_maps(model, np.zeros((1, 32, 32, 3)))
rollout = analysis.attention_rollout(scores)
assert rollout.shape[0] == 1, rollout.shape
try:
    analysis.plot_rollout
except errors.MissingDependencyError as e:
    message = str(e)
else:
    raise AssertionError("plot_rollout resolved without matplotlib")
assert len(message.splitlines()) == 1, message
assert "'matplotlib'" in message and "pip install" in message, message
"""
FIGURES_JOB = {"id": "figures without matplotlib", "cwd": "figures",
               "code": FIGURES_WITHOUT_MATPLOTLIB,
               "setup": "model = journey.tiny_model()\n", "expect": []}


@pytest.mark.slow
@_blocks_run("venv")
def test_doc_block_runs_on_the_readme_install(venv_results, key):
    _check_ran(venv_results, _job_id(key))


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [(doc, cmd) for doc, table in
                                 COMMANDS.items() for cmd in table],
                         ids=lambda d: f"{d[0]}: {d[1]}")
def test_doc_command_runs_on_the_readme_install(venv_results, cmd):
    _check_ran(venv_results, f"{cmd[0]}: {cmd[1]}")


@pytest.mark.slow
def test_hub_blocks_went_through_the_hub(venv_results, hub):
    """The hf-hub: names of the zoo guide were downloaded by
    huggingface_hub from the endpoint (not found in some cache), each
    repository's two files."""
    got = {}
    for path in hub.gets:
        repo, _, rest = path.lstrip("/").partition("/resolve/")
        got.setdefault(repo, set()).add(rest.rsplit("/", 1)[-1])
    for repo in ("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
                 "timm/vit_base_patch16_224.augreg_in21k",
                 "google/vit-base-patch16-224"):
        assert got.get(repo) == {"config.json", "model.safetensors"}, got


@pytest.mark.slow
def test_figures_name_matplotlib_on_the_readme_install(venv_results):
    _check_ran(venv_results, "figures without matplotlib")


@pytest.mark.slow
@_blocks_run("suite")
def test_doc_block_with_an_extra_runs(suite_results, key):
    _check_ran(suite_results, _job_id(key))


@pytest.mark.slow
def test_inspect_draws_its_figures_with_matplotlib(suite_results):
    (doc, table), = WITH_MATPLOTLIB.items()
    (cmd,) = table
    _check_ran(suite_results, f"{doc}: {cmd}")


@pytest.mark.slow
@_blocks_run("jax")
def test_doc_block_on_jax_runs(jax_results, key):
    _check_ran(jax_results, _job_id(key))
