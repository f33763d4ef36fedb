"""The training guide's TPU section as a user walks it, on the CPU.

The section gives one command per setup (JAX with ``keras.distribution``,
TensorFlow with ``TPUStrategy``); the tests read those lines from the page
and run them as written, made small: the JAX one on two simulated CPU
devices (a child process with ``--xla_force_host_platform_device_count``),
the TensorFlow one here, where no TPU exists, so it must be refused in one
line within seconds. The resolver's choices (the chips of a TPU VM, a
named TPU, none) are checked with TPU device files simulated.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import two_jax_cpu_devices_flags

import keras
from keras_vit import cli
from keras_vit import train as kt
from keras_vit.train import distribute

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "training.md"
# Seconds the refusal may take once TensorFlow is imported: it reads a few
# device paths and asks no server (TensorFlow's own lookup of a missing TPU
# could wait minutes). Generous for a loaded 2-core machine.
REFUSAL_SECONDS = 5.0
# What TensorFlow's TPU resolver reads to find a TPU: cleared, so that no
# TPU is named on this machine.
TPU_VARIABLES = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")


def guide_commands():
    """``{backend: (environment, argv)}`` of the ``keras-vit`` lines of the
    guide's "On a TPU" section, split as a shell splits them."""
    text = GUIDE.read_text()
    section = text.split("\n## On a TPU\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for block in re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line)
            env = {}
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            if words[:1] == ["keras-vit"]:
                found[env["KERAS_BACKEND"]] = (env, words[1:])
    assert sorted(found) == ["jax", "tensorflow"], found
    return found


def image_folder(path, classes=2, per_class=6):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(path / f"class_{c}", exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(
                path / f"class_{c}" / f"{i}.png")


def small(argv, add):
    """The guide's ``argv`` with a tiny model and run: the zoo name it
    gives (which must still be ViT-B/16) swapped for ViT-Ti/16 with one
    block, no download, ``add`` appended."""
    assert argv[:2] == ["fine-tune", "ViT-B/16"], argv
    return ["fine-tune", "ViT-Ti/16", *argv[2:], "--weights", "none",
            "--model-option", "num_layers=1", *add]


def test_the_guides_tensorflow_command_is_refused_at_once_without_a_tpu(
        tmp_path, monkeypatch, capsys):
    env, argv = guide_commands()["tensorflow"]
    assert keras.backend.backend() == "tensorflow"
    assert argv[argv.index("--strategy") + 1] == "tpu"
    for name in TPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "path" / "to" / "images")
    t0 = time.perf_counter()
    status = cli.main(small(argv, ["--steps", "2", "--batch-size", "4"]))
    seconds = time.perf_counter() - t0
    captured = capsys.readouterr()
    assert status == 2
    # One line, before any data is read (no hold-out note) or run started.
    assert captured.out == "", captured.out
    [line] = captured.err.strip().splitlines()
    assert line.startswith("keras-vit: error: strategy='tpu' but no TPU was "
                           "found: none is attached to this machine"), line
    assert seconds < REFUSAL_SECONDS, seconds
    assert not (tmp_path / "runs").exists()


def test_the_tpu_is_found_as_tensorflow_expects_and_refused_in_one_line(
        tmp_path, monkeypatch):
    for name in TPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # No TPU anywhere: refused without asking TensorFlow, and "auto" falls
    # back at once, silently.
    assert not distribute.attached_tpu()
    t0 = time.perf_counter()
    with pytest.raises(kt.StrategyError, match="no TPU was found"):
        kt.strategy("tpu")
    assert time.perf_counter() - t0 < REFUSAL_SECONDS
    assert kt.describe(kt.strategy("auto"))["name"] == "default"
    # Named, or in the environment: handed to the resolver as is.
    assert distribute.tpu_address("grpc://10.0.0.2:8470") == (
        "grpc://10.0.0.2:8470")
    monkeypatch.setenv("TPU_CONFIG", '{"tpu_node_name": "t"}')
    assert distribute.tpu_address() is None
    monkeypatch.delenv("TPU_CONFIG")
    # "local" on a machine without chips: said so, not TensorFlow's
    # missing-kernel text.
    with pytest.raises(kt.StrategyError, match=(
            r"tpu='local', but no TPU is attached to this machine")):
        kt.strategy("tpu", tpu="local")
    # A TPU VM (its device file simulated): the chips are looked for as
    # "local"; this TensorFlow, a CPU build, cannot drive them and says so.
    (tmp_path / "accel0").touch()
    monkeypatch.setattr(distribute, "TPU_DEVICE_FILES",
                        (str(tmp_path / "accel[0-9]*"),))
    assert distribute.attached_tpu()
    assert distribute.tpu_address() == "local"
    with pytest.raises(kt.StrategyError) as caught:
        kt.strategy("tpu")
    message = str(caught.value)
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith("strategy='tpu' with tpu='local': this "
                              "TensorFlow"), message
    assert "has no TPU support" in message and "tensorflow-tpu" in message
    # "auto" tries the attached TPU, warns that it did not start, trains
    # without it.
    with pytest.warns(UserWarning, match="trains without the TPU: .*local"):
        assert kt.describe(kt.strategy("auto"))["name"] == "default"


def test_a_named_tpu_that_does_not_start_is_refused_naming_it():
    # TensorFlow looks the name up on Google Cloud's metadata server, then
    # its TPU API; whatever fails first (off Google Cloud: the lookup), the
    # error names the TPU, in one line, within the timeout.
    t0 = time.perf_counter()
    with pytest.raises(kt.StrategyError) as caught:
        kt.strategy("tpu", tpu="my-tpu", timeout=10)
    message = str(caught.value)
    assert message.startswith("strategy='tpu' with tpu='my-tpu'"), message
    assert "\n" not in message and len(message) < 400, message
    assert time.perf_counter() - t0 < 15


JAX_CHILD_FLAGS = two_jax_cpu_devices_flags()


@pytest.mark.slow
def test_the_guides_jax_command_trains_on_two_simulated_devices(tmp_path):
    env, argv = guide_commands()["jax"]
    assert argv[argv.index("--strategy") + 1] == "data_parallel"
    image_folder(tmp_path / "path" / "to" / "images", per_class=10)
    command = [sys.executable, "-m", "keras_vit.cli", *small(argv, [
        "--steps", "2", "--batch-size", "4", "--warmup-steps", "1",
        "--image-size", "32", "--no-eval", "-q", "--json"])]
    child_env = dict(os.environ, **env, KERAS_VIT_OFFLINE="1",
                     TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=JAX_CHILD_FLAGS)
    proc = subprocess.run(command, cwd=tmp_path, env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert metrics["backend"] == "jax" and metrics["final_step"] == 2
    assert metrics["strategy"]["name"] == "data_parallel"
    assert metrics["strategy"]["replicas"] == 2
    assert metrics["precision"] == "mixed_bfloat16"
    assert (tmp_path / "runs" / "pets-tpu" / "model.keras").is_file()
