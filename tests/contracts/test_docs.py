"""The documentation: the site builds in strict mode, its API reference
holds every public name, and the README's and docs/' links and file names
point at files that exist.

The site (mkdocs.yml) is the README as landing page, the guides in
docs/guides/, the measured reports in docs/ and an API reference that
mkdocstrings reads from the docstrings without importing the package.
"""

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# The reference page of each public package, and the folder of its source
# (setup.cfg's package_dir puts keras_vit.zoo in zoo/, keras_vit.export in
# export/).
REFERENCE = {
    "keras_vit.models": ("models", ROOT / "keras_vit/models/__init__.py"),
    "keras_vit.layers": ("layers", ROOT / "keras_vit/layers/__init__.py"),
    "keras_vit.zoo": ("zoo", ROOT / "zoo/__init__.py"),
    "keras_vit.export": ("export", ROOT / "export/__init__.py"),
    "keras_vit.train": ("train", ROOT / "keras_vit/train/__init__.py"),
    "keras_vit.analysis": ("analysis", ROOT / "keras_vit/analysis/__init__.py"),
    "keras_vit.runtime.hardware": ("speed", ROOT / "keras_vit/runtime/hardware.py"),
    "keras_vit.runtime.graph_ops": ("speed", ROOT / "keras_vit/runtime/graph_ops.py"),
}
# The names a user reads about in the guides, on their reference pages.
DOCUMENTED = {
    "zoo": ["keras_vit.zoo.load", "keras_vit.zoo.list_models",
            "keras_vit.zoo.info", "keras_vit.zoo.preprocess_input",
            "keras_vit.zoo.decode_predictions", "keras_vit.zoo.save_pretrained",
            "keras_vit.zoo.load_weights", "keras_vit.zoo.save_npz",
            "keras_vit.zoo.resolve_model", "keras_vit.zoo.rebuild",
            # the readers the guide sends to for their bounds and options
            "keras_vit.zoo.timm.hub.fetch",
            "keras_vit.zoo.timm.writer.write",
            "keras_vit.zoo.transformers.writer.write",
            "keras_vit.zoo.keras_file.read_checkpoint"],
    "export": ["keras_vit.export.to_onnx", "keras_vit.export.to_saved_model",
               "keras_vit.export.to_tflite", "keras_vit.export.export",
               "keras_vit.export.ExportError",
               "keras_vit.export.read_label_names"],
    "train": ["keras_vit.train.compile_for_finetune", "keras_vit.train.Trainer",
              "keras_vit.train.fine_tune", "keras_vit.train.strategy",
              "keras_vit.train.distribution", "keras_vit.train.layout_map",
              "keras_vit.train.fewshot", "keras_vit.train.pretrain_mpp",
              "keras_vit.train.recipes.get", "keras_vit.train.vtab.run"],
    "models": ["keras_vit.models.vit.vit", "keras_vit.models.axial_vit",
               "keras_vit.models.resnet_v2.resnet_v2",
               "keras_vit.models.feature_model"],
    "analysis": ["keras_vit.analysis.attention_rollout",
                 "keras_vit.analysis.attention_maps",
                 "keras_vit.analysis.inspect"],
    "speed": ["keras_vit.runtime.hardware.plan", "keras_vit.runtime.graph_ops.op_counts",
              "keras_vit.runtime.fused_ops.dense_gelu_tanh"],
    "errors": ["keras_vit.base.checks.check_choice",
               "keras_vit.base.errors.KerasVitError",
               "keras_vit.models.memory.check_weights_fit",
               "keras_vit.models.memory.infer",
               "keras_vit.base.archives.check_archive"],
    "io": ["keras_vit.data.images.decode_plan", "keras_vit.data.images.DecodePlan",
           "keras_vit.runtime.backend.to_numpy"],
}


def _markdown_files():
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _public_names(path):
    """``__all__`` of a module, or its public top-level definitions."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "__all__"
                        for t in node.targets)):
            return ast.literal_eval(node.value)
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and not node.name.startswith("_")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Builds the site once with ``mkdocs build --strict``, in a child
    process that reports whether TensorFlow or Keras got imported."""
    out = tmp_path_factory.mktemp("site")
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('IMPORTED', 'tensorflow' in "
        "sys.modules, 'keras' in sys.modules))\n"
        "from mkdocs.__main__ import cli\n"
        f"cli(['build', '--strict', '-f', {str(ROOT / 'mkdocs.yml')!r}, "
        f"'-d', {str(out)!r}])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return out, proc


def test_site_builds_in_strict_mode_without_the_frameworks(site):
    out, proc = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The reference is read from the source: no TensorFlow, no Keras.
    assert "IMPORTED False False" in proc.stdout, proc.stdout[-2000:]
    landing = (out / "index.html").read_text()
    assert "A ten-line tour" in landing
    # README links into docs/ become site-relative on the landing page.
    assert 'href="guides/zoo/"' in landing or 'href="guides/zoo.html"' in landing


def test_reference_documents_every_public_name(site):
    out, proc = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    for package, (page, source) in REFERENCE.items():
        html = (out / "reference" / page / "index.html").read_text()
        ids = set(re.findall(r'id="([\w.]+)"', html))
        for name in _public_names(source):
            submodule = ((source.parent / f"{name}.py").exists()
                         or (source.parent / name / "__init__.py").exists())
            if submodule and source.name == "__init__.py":
                continue  # a submodule: its public names are listed too
            # A builder named like its module (models.vit, models.resnet_v2)
            # is documented at the function inside that module.
            assert (f"{package}.{name}" in ids
                    or f"{package}.{name}.{name}" in ids), (package, name)
    for page, names in DOCUMENTED.items():
        html = (out / "reference" / page / "index.html").read_text()
        for name in names:
            assert f'id="{name}"' in html, (page, name)
    # Docstrings are rendered as documentation, not as raw reST.
    zoo = (out / "reference" / "zoo" / "index.html").read_text()
    assert ":func:`" not in zoo
    assert "Builds a named model and loads its released weights" in zoo


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _links(text):
    return _LINK.findall(_FENCE.sub("", text))


def test_relative_links_point_to_files():
    broken = []
    for md in _markdown_files():
        for target in _links(md.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (md.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_file_names_in_the_docs_exist():
    """The tests, examples and scripts the README and guides cite as
    evidence (``tests/models/test_vit.py``, ``benchmarks/speed.py``) exist."""
    cited = re.compile(
        r"(?<![\w/.-])((?:tests|examples|benchmarks|keras_vit|zoo|export)"
        r"/[\w/.-]*\w\.(?:py|md))")
    missing = []
    for md in [ROOT / "README.md", *sorted((DOCS / "guides").glob("*.md"))]:
        for name in cited.findall(md.read_text()):
            if not (ROOT / name).exists():
                missing.append(f"{md.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_readme_keeps_the_two_commands_and_links_the_guides():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r'^pip install -e "\.\[dev\]" && python -m pytest ',
                     readme, re.M)
    assert 'pip install -e ".[dev]" && python -m pytest' in (
        ROOT / ".ci" / "run").read_text()
    linked = {Path(t).name for t in _links(readme)
              if t.startswith("docs/guides/")}
    guides = {p.name for p in (DOCS / "guides").glob("*.md")}
    assert guides <= linked, guides - linked


def _hook(name):
    spec = importlib.util.spec_from_file_location(
        f"docs_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstrings_become_markdown():
    markdown = _hook("griffe_lazy").markdown_docstring
    text = ("Uses :func:`vit` and :class:`~keras_vit.Foo`.\n\n"
            "    >>> f(1)\n    2\n\nEnd.")
    out = markdown(text)
    assert out == ("Uses `vit` and `Foo`.\n\n    ```pycon\n    >>> f(1)\n"
                   "    2\n    ```\n\nEnd.")
    assert markdown(out) == out  # a second pass changes nothing


def test_lazy_names_are_read_from_the_source():
    names = _hook("griffe_lazy").lazy_names(
        ast.parse((ROOT / "zoo" / "__init__.py").read_text()))
    assert names["load"] == ".api"
    assert names["save_pretrained"] == ".save"


def test_package_tree_follows_setup_cfg(tmp_path):
    hook = _hook("package_dir")
    mapping = hook.package_dirs(ROOT)
    assert mapping["keras_vit.zoo"] == (ROOT / "zoo").resolve()
    tree = Path(hook.build_tree(ROOT, tmp_path / "src"))
    assert (tree / "keras_vit" / "zoo" / "api.py").is_file()
    assert (tree / "keras_vit" / "export" / "saved_model.py").is_file()
    assert (tree / "keras_vit" / "train" / "loop.py").is_file()
    assert hook.landing_page("[a](docs/guides/zoo.md) [b](examples/x.py)") \
        == "[a](guides/zoo.md) [b](examples/x.py)"
