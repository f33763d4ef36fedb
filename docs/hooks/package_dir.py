"""MkDocs hook: the site's landing page is the README, and the API
reference reads the package as it is installed.

``keras_vit.zoo`` and ``keras_vit.export`` live in the top-level folders
``zoo/`` and ``export/`` (``package_dir`` in setup.cfg). mkdocstrings reads
source statically (griffe), walking folders, so it would find neither under
``keras_vit/``. This hook lays out the installed package once per build in a
temporary folder of symbolic links (``keras_vit/*`` plus one link per
``package_dir`` entry) and points the Python handler there: no import, no
TensorFlow, and setup.cfg stays the one place that says where a component
lives.
"""

from __future__ import annotations

import configparser
import re
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

_TREE = None


def package_dirs(root):
    """``{package: folder}`` from setup.cfg's ``[options] package_dir``."""
    parser = configparser.ConfigParser()
    parser.read(Path(root) / "setup.cfg")
    mapping = {}
    for line in parser["options"]["package_dir"].strip().splitlines():
        package, _, folder = (part.strip() for part in line.partition("="))
        mapping[package] = Path(root, folder).resolve()
    return mapping


def build_tree(root, dest):
    """Links every folder and file of each top-level package under ``dest``
    and mounts each subpackage's folder at its dotted place."""
    mapping = package_dirs(root)
    for package in sorted(mapping, key=lambda name: name.count(".")):
        target = Path(dest, *package.split("."))
        if "." not in package:
            target.mkdir(parents=True)
            for entry in mapping[package].iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            if target.exists() or target.is_symlink():
                raise RuntimeError(
                    f"package_dir maps {package!r} to {mapping[package]}, "
                    f"but {target} exists in its parent package too")
            target.symlink_to(mapping[package], target_is_directory=True)
    return dest


# Before mkdocstrings' own on_config, which creates the handler.
@event_priority(100)
def on_config(config):
    global _TREE
    on_shutdown()  # `mkdocs serve` reloads the configuration on a change
    root = Path(config.config_file_path).parent
    _TREE = tempfile.mkdtemp(prefix="keras_vit_docs_")
    build_tree(root, _TREE)
    handler = config.plugins["mkdocstrings"].config.handlers.setdefault(
        "python", {})
    handler["paths"] = [_TREE]
    return config


def on_shutdown():
    if _TREE:
        shutil.rmtree(_TREE, ignore_errors=True)


# README.md links into docs/ as a repository page does ("docs/guides/
# zoo.md"); as the site's index.md the same links are relative to docs/.
_DOCS_LINK = re.compile(r"\]\(docs/")


def landing_page(readme_text):
    """README.md's text with its ``docs/`` links made relative to docs/."""
    return _DOCS_LINK.sub("](", readme_text)


def on_files(files, config):
    root = Path(config.config_file_path).parent
    text = landing_page((root / "README.md").read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
