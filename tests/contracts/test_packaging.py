"""The built wheel, installed into a fresh virtual environment, works.

An editable install can hide packaging mistakes (a folder missing from
``packages``, label lists not declared as package data), so this builds the
wheel and imports the three components from a new venv. The venv reuses the
heavy dependencies already installed (TensorFlow) through a ``.pth`` line, not
``--system-site-packages``, so that the editable install's import hook is not
inherited.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_imports_in_a_fresh_venv(tmp_path):
    # From a copy of the sources: setuptools writes build/ and *.egg-info
    # into the tree it builds, and another test (test_readme_and_guides.py,
    # perhaps in a parallel worker) pip-installs the checkout itself.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache",
        ".venv*", ".benchmarks"))
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
         "--no-build-isolation", "-w", str(dist), "-q"],
        check=True, timeout=600, cwd=tmp_path)
    (wheel,) = dist.glob("keras_vit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("keras_vit/zoo/labels/imagenet2012.txt",
                     "keras_vit/zoo/labels/imagenet21k.txt",
                     "keras_vit/zoo/timm/architectures.json",
                     "keras_vit/zoo/download/fetch.py", "keras_vit/export/__init__.py",
                     "keras_vit/models/vit.py", "keras_vit/cli/analysis.py",
                     "keras_vit/train/loop.py",
                     "keras_vit/train/data/pipeline.py"):
        assert required in names, required
    assert not any(n.startswith(("tests/", "zoo/", "export/")) for n in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    # Dependencies from the current interpreter (its venv and, for a venv
    # with system site-packages, the system's), without its .pth hooks.
    import site as site_module

    dirs = dict.fromkeys([sysconfig.get_paths()["purelib"],
                          *site_module.getsitepackages()])
    Path(site, "deps.pth").write_text("".join(d + "\n" for d in dirs))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install",
         "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, timeout=600)

    code = (
        "import keras_vit, keras_vit.zoo, keras_vit.export\n"
        "print(keras_vit.zoo.__file__)\n"
        "print(keras_vit.export.__file__)\n"
        "print(len(keras_vit.zoo.labels('imagenet21k')))\n"
        "m = keras_vit.zoo.load('ViT-Ti/16', weights=None, image_size=32,"
        " num_classes=3)\n"
        "print(m.count_params())\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    zoo_file, export_file, n_labels, params = out.stdout.split()
    assert zoo_file.startswith(site) and export_file.startswith(site)
    assert int(n_labels) == 21843
    assert int(params) > 5_000_000
    assert (env_dir / "bin" / "keras-vit").exists()


def test_every_package_folder_is_listed_in_setup_cfg():
    """setup.cfg names its packages one by one (three folders map to one
    package): a sub-package made by a split must be added there, or the
    wheel ships without it."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    found = set()
    for folder, package in (("keras_vit", "keras_vit"),
                            ("zoo", "keras_vit.zoo"),
                            ("export", "keras_vit.export")):
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            if init.parent.is_symlink() or any(
                    p in ("zoo", "export") for p in parts[:1]
                    if folder == "keras_vit"):
                continue
            found.add(".".join((package, *parts)))
    assert found == listed, (sorted(found - listed), sorted(listed - found))


def _extras():
    """setup.cfg's extras: ``{name: requirement lines}``."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    section = config["options.extras_require"]
    return {name: [line.strip() for line in section[name].splitlines()
                   if line.strip() and not line.strip().startswith("#")]
            for name in section}


def test_every_extra_a_pip_install_line_names_exists():
    """An extra the README or a page names in a ``pip install`` of this
    package (``.[jax]``, ``keras-vit[data]``) is one setup.cfg declares:
    pip only warns about an unknown extra and installs without it."""
    declared = _extras()
    named = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for line in doc.read_text().splitlines():
            if "pip install" not in line:
                continue
            for extras in re.findall(r"(?:\.|keras[-_]vit)\[([^\]]+)\]", line):
                for extra in extras.split(","):
                    named.setdefault(extra.strip(), str(doc.relative_to(ROOT)))
    assert {"dev", "jax", "torch"} <= set(named), named
    missing = {extra: doc for extra, doc in named.items()
               if extra not in declared}
    assert not missing, f"extras named in docs but not in setup.cfg: {missing}"


def test_the_backend_extras_install_the_backend_the_suite_runs_on():
    """``.[jax]`` and ``.[torch]`` bring the backend itself, at the versions
    ``dev`` (the suite) installs."""
    extras = _extras()
    assert [r for r in extras["jax"] if re.split(r"[\[<>=]", r)[0] == "jax"]
    assert [r for r in extras["torch"] if re.split(r"[<>=]", r)[0] == "torch"]
    for backend in ("jax", "torch"):
        assert set(extras[backend]) <= set(extras["dev"]), backend
