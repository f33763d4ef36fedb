"""The ``KERAS_VIT_*`` environment variables: declared once, read through
one function, every hostile value either parsed or refused in one line
naming the variable and the value; no module reads one by itself."""

import ast
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit import check_error as _check
import keras_vit
from keras_vit import cli
from keras_vit.base import environment
from keras_vit.base.environment import VARIABLES, SettingError, read
from keras_vit.zoo.download import fetch as download

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("keras_vit", "zoo", "export")
           for p in sorted((ROOT / d).rglob("*.py"))
           if not p.is_symlink() and "keras_vit/zoo" not in str(p)
           and "keras_vit/export" not in str(p)]

TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["abc", "-1", "0", "nan", "inf", "1e400", " 5 ", "1,2",
                     "ftp://x/", "http://", "YES", "Off", "fused ",
                     "avx512f, amx_bf16", "a b", "/etc/passwd", "~", "~0",
                     "~no_such_user_xyz/cache"]))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(VARIABLES)), text=TEXT)
def test_every_value_is_parsed_or_refused_naming_it(name, text):
    var = VARIABLES[name]
    try:
        value = read(name, {name: text})
    except SettingError as e:
        assert str(e).startswith(f"{name} must be "), e
        assert f"{name}={text!r}" in str(e) and "\n" not in str(e)
        assert isinstance(e, ValueError) and (e.name, e.value) == (name, text)
        return
    if not text.strip():
        assert value == var.default
    elif var.kind == "seconds":
        # str.strip (the parser's) knows more whitespace than float() does.
        assert 0 < value < math.inf and value == float(text.strip())
    elif var.kind == "flag":
        assert value is (text.strip().lower() in environment.TRUE)
    elif var.kind == "choice":
        assert value in var.choices
    elif var.kind == "names":
        assert isinstance(value, frozenset) and all(
            n in text.lower() for n in value)
    elif var.kind == "url":
        assert value.split("://")[0].lower() in ("http", "https")


def test_a_cache_that_names_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SettingError, match="KERAS_VIT_CACHE must be a folder"):
        read("KERAS_VIT_CACHE", {"KERAS_VIT_CACHE": str(tmp_path / "f")})
    assert read("KERAS_VIT_CACHE", {"KERAS_VIT_CACHE": str(tmp_path)}) == (
        tmp_path)


def _environ_lookups(tree):
    """The first argument of every ``os.environ.get(...)``,
    ``os.environ[...]``, ``os.getenv(...)`` and ``environ.get(...)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            chain = ast.unparse(f)
            if (chain.endswith(("environ.get", "environ.pop",
                                "environ.setdefault")) or chain in (
                    "os.getenv",)) and node.args:
                yield node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(
                node.value).endswith("environ"):
            yield node.slice


def test_no_module_reads_a_keras_vit_variable_by_itself():
    """Only keras_vit/base/environment.py looks a ``KERAS_VIT_`` name up in the
    environment (by literal or by a module constant holding one)."""
    found = []
    for path in SOURCES:
        if path.name == "environment.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        constants = {t.id: n.value.value for n in tree.body
                     if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant)
                     for t in n.targets if isinstance(t, ast.Name)}
        for arg in _environ_lookups(tree):
            value = (arg.value if isinstance(arg, ast.Constant) else
                     constants.get(arg.id) if isinstance(arg, ast.Name)
                     else None)
            if isinstance(value, str) and value.startswith("KERAS_VIT_"):
                found.append(f"{path.relative_to(ROOT)}:{arg.lineno} {value}")
    assert not found, found


def test_every_variable_named_in_the_code_is_declared():
    named = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith("KERAS_VIT_")
                    and node.value.replace("_", "").isalnum()
                    and node.value.isupper()):
                named.add(node.value)
    assert named <= set(VARIABLES), sorted(named - set(VARIABLES))


def test_the_reference_page_lists_every_variable():
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert environment.table() in page


def test_an_export_checks_its_timeout_before_any_work(monkeypatch, tmp_path):
    """On TensorFlow the SavedModel is written in this process (no child to
    time out), and a bad timeout is still refused, before a file exists."""
    import keras_vit
    from keras_vit import export

    monkeypatch.setenv("KERAS_VIT_EXPORT_TIMEOUT", "abc")
    model = keras_vit.vit(16, 8, 8, 1, 1, 16, num_classes=2)
    with pytest.raises(SettingError, match="KERAS_VIT_EXPORT_TIMEOUT='abc'"):
        export.to_saved_model(model, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------
# Environment variables: a clear error naming the variable and its value.
# ---------------------------------------------------------------------------


def test_bad_environment_variables_are_named(tmp_path, monkeypatch):
    from keras_vit.zoo.download import fetch as download

    monkeypatch.setenv("KERAS_VIT_OFFLINE", "maybe")
    with pytest.raises(ValueError, match="KERAS_VIT_OFFLINE='maybe'"):
        download.is_offline()
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "off")
    assert download.is_offline() is False
    monkeypatch.setenv("KERAS_VIT_MIRROR", "ftp://mirror/")
    with pytest.raises(ValueError, match="KERAS_VIT_MIRROR='ftp://mirror/'"):
        download.resolve_url("gs://vit_models/x.npz")
    monkeypatch.delenv("KERAS_VIT_MIRROR")
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("KERAS_VIT_CACHE", str(afile))
    with pytest.raises(ValueError, match="KERAS_VIT_CACHE must be a folder"):
        download.fetch("http://127.0.0.1:9/x.npz", timeout=1)


def test_hostile_environment_for_downloads(tmp_path, monkeypatch):
    from keras_vit.zoo.download import fetch as download
    from keras_vit.zoo.download import cache as download_cache

    monkeypatch.setenv("KERAS_VIT_MIRROR", "http://")
    with pytest.raises(ValueError, match="with a host; received "
                                         "KERAS_VIT_MIRROR='http://'"):
        download.resolve_url("gs://vit_models/x.npz")
    monkeypatch.delenv("KERAS_VIT_MIRROR")
    # A cache folder that cannot be created (even by root): /proc.
    monkeypatch.setenv("KERAS_VIT_CACHE", "/proc/keras_vit_cache")
    with pytest.raises(download_cache.DownloadError,
                       match="cannot create the cache folder .* check "
                             "KERAS_VIT_CACHE='/proc/keras_vit_cache'"):
        download.fetch("http://127.0.0.1:9/x.npz", timeout=1)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    from keras_vit import train as kt

    with pytest.raises(kt.StrategyError, match="TF_CONFIG is not valid "
                                               "JSON"):
        kt.strategy("auto")


ENVIRONMENT = [
    ("KERAS_VIT_OFFLINE", "ture", lambda: download.is_offline(), "true"),
    ("KERAS_VIT_ACCELERATOR", "gpuu",
     lambda: keras_vit.runtime.hardware.detect(), "gpu"),
    ("KERAS_VIT_MIRROR", "ftp://mirror/",
     lambda: download.resolve_url("gs://vit_models/x.npz"), None),
]


@pytest.mark.parametrize("variable, value, call, hint", ENVIRONMENT,
                         ids=[row[0] for row in ENVIRONMENT])
def test_environment_variables_name_echo_and_suggest(monkeypatch, variable,
                                                     value, call, hint):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        call()
    _check(str(info.value), variable, repr(value), hint)


def test_environment_variable_through_the_command_line(monkeypatch, capsys,
                                                       tmp_path):
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path))
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "ture")
    assert cli.main(["convert", "imagenet21k", "-m", "ViT-B/16", "-o",
                     str(tmp_path / "m.keras")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "KERAS_VIT_OFFLINE='ture'" in err and "Did you mean 'true'" in err


def test_other_programs_variables_are_read_here(monkeypatch):
    """KERAS_BACKEND, TF_CONFIG and TPU_NAME, read through named functions
    (tests/contracts/test_structure.py keeps os.environ here)."""
    for name in ("KERAS_BACKEND", "TF_CONFIG", "TPU_NAME", "TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert (environment.keras_backend(), environment.tf_config(),
            environment.tpu_name()) == ("", "", None)
    assert not environment.any_set(("TPU_NAME", "TPU_CONFIG"))
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("TF_CONFIG", '  {"cluster": {}} ')
    monkeypatch.setenv("TPU_NAME", "")
    monkeypatch.setenv("TPU_CONFIG", "x")
    assert environment.keras_backend() == "jax"
    assert environment.tf_config() == '{"cluster": {}}'
    assert environment.tpu_name() is None
    assert environment.any_set(("TPU_NAME", "TPU_CONFIG"))
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    assert environment.tpu_name() == "my-tpu"


def test_a_child_environment_is_a_copy(monkeypatch):
    import os

    monkeypatch.setenv("CHILD_ENVIRONMENT_TEST", "1")
    env = environment.for_child()
    assert env["CHILD_ENVIRONMENT_TEST"] == "1"
    env["CHILD_ENVIRONMENT_TEST"] = "2"
    assert os.environ["CHILD_ENVIRONMENT_TEST"] == "1"
