"""Every number a user can pass has both bounds, and a value past them is
one line naming where it came from: the sizes parsed out of a model name
(``keras-vit info ViT-B/<patch>``), each numeric option of every
``keras-vit`` command, and every ``KERAS_VIT_*`` variable, including the
readers that take a variable's value after it was parsed (the URL
parser, ``http.client``, the socket's timeout, the file system)."""

import argparse
import contextlib
import http.client
import io
import math
import os
import socket
import urllib.request

import pytest
from hypothesis import given, settings, strategies as st

from keras_vit import cli, zoo
from keras_vit.base import environment, limits, variants
from keras_vit.base.environment import VARIABLES, SettingError
from keras_vit.cli import options
from keras_vit.zoo.download import fetch as download

BIG = st.one_of(st.integers(0, 5000), st.integers(0, 10 ** 40),
                st.sampled_from([0, 1, 7, 14, 16, 224, 300, 4096, 4097]))
TEMPLATES = ("ViT-{s}/{a}", "ViT-{s}/{a}-{b}", "vit_base_patch{a}_{b}",
             "Axial-ViT-{s}/{a}", "R50+ViT-{s}/{a}", "R+ViT-{s}/{a}",
             "R{a}+ViT-B/16", "BiT-R50x{a}", "resnetv2_50x{a}_bitm_{b}",
             "vit_small_r26_s{a}_{b}", "BiT-R{a}x1")


def _run(argv):
    """``keras-vit ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=60, deadline=None)
@given(template=st.sampled_from(TEMPLATES), a=BIG, b=BIG,
       s=st.sampled_from(["Ti", "S", "B", "L", "H"]))
def test_a_name_gives_a_model_that_builds_or_one_line(template, a, b, s):
    """``zoo.info`` and ``keras-vit info`` count only a model whose sizes
    are in bounds and whose patches tile its image; any other name is one
    line naming it, exit status 2 (once: a 52-digit count, exit 0)."""
    name = template.format(a=a, b=b, s=s)
    try:
        meta = zoo.info(name)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and (repr(name)[:40] in message
                                        or variants.parse(name).name
                                        in message), message
        code, out, err = _run(["info", name])
        assert code == 2 and out == "", (code, out)
        assert err.count("\n") == 1 and err.startswith("keras-vit: error:")
        return
    size = meta["image_size"]
    assert 1 <= size <= limits.MAX_IMAGE_SIDE
    stride = meta["effective_stride"]
    if meta["family"] != "bit":
        assert size % stride == 0 and size // stride >= 1, (name, size, stride)
    count = meta["parameters"]
    assert count is None or 0 < count["count"] < 10 ** 12, (name, count)
    arch = variants.parse(name)
    assert arch.image_size is None or arch.image_size == size


def test_info_refuses_a_patch_larger_than_the_image_in_one_line():
    code, out, err = _run(["info", "ViT-B/300"])
    assert (code, out) == (2, "")
    assert "ViT-B/300 at image_size=224" in err and "larger than the image" \
        in err and "'ViT-B/300-300'" in err and err.count("\n") == 1
    assert _run(["info", "ViT-B/300-300"])[0] == 0


def _numeric_options():
    """``(command, flag, type)`` of every option of every command whose
    type gives a number or a list of numbers."""
    found = []

    def walk(parser, path):
        for action in parser._actions:  # noqa: SLF001 - argparse has no API
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])
            elif action.type is not None and action.option_strings:
                try:
                    value = action.type("1")
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                if values and all(isinstance(v, (int, float))
                                  and not isinstance(v, bool) for v in values):
                    flag = max(action.option_strings, key=len)
                    found.append((path, flag, action.type))

    walk(cli.build_parser(), [])
    return found


NUMERIC = _numeric_options()


def test_every_numeric_option_of_every_command_has_a_declared_range():
    assert len(NUMERIC) > 40
    missing = [f"{' '.join(p)} {flag}" for p, flag, kind in NUMERIC
               if getattr(kind, "bound", None) is not options.BOUNDS.get(flag)
               or flag not in options.BOUNDS]
    assert not missing, missing


def _outside(bound):
    below = [bound.low - 1, -1e300, bound.low] if bound.low_open else [
        bound.low - 1, -1e300]
    return st.sampled_from(below + [bound.high + 1, bound.high * 10 ** 6,
                                    "inf", "nan", "-inf", "1e400"])


@settings(max_examples=80, deadline=None)
@given(data=st.data(), row=st.sampled_from(NUMERIC))
def test_a_value_past_either_bound_exits_2_naming_the_option(data, row):
    path, flag, kind = row
    bound = kind.bound
    value = data.draw(_outside(bound))
    text = str(int(value)) if isinstance(value, float) and value.is_integer(
    ) and abs(value) < 1e30 else str(value)
    code, out, err = _run(path + [flag, text])
    assert code == 2 and out == "", (code, out)
    assert err.count("\n") == 1 and f"argument {flag}" in err, err


@settings(max_examples=60, deadline=None)
@given(data=st.data(), row=st.sampled_from(NUMERIC))
def test_a_value_within_the_bounds_is_never_refused_for_its_range(data, row):
    path, flag, kind = row
    bound = kind.bound
    low = max(math.ceil(bound.low + (1 if bound.low_open else 0)), 1)
    value = data.draw(st.integers(low, int(bound.high)))
    assert kind(str(value)) is not None


# -- environment variables --------------------------------------------------

HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from([
        "1e308", "1e-320", "0.01", "604801", "9" * 400, "nan", "-0", "0x10",
        "http://[::1", "http://h:abc/", "http://h:70000/", "http://h:0/",
        "http://a..b/", "http://" + "a" * 64 + ".com/", "https://é.com/",
        "http://h h/", "http://h/\x00", "http://h/\udcff", "http://[::1]:8/m",
        "https://mirror.example.com/vit/", "a\x00b", "/" + "x" * 5000,
        "~no_such_user_xyz/c", "avx512f,\x00", "on\n", "FUSED"]),
    st.builds(lambda a, b: f"http://{a}:{b}/", st.text(max_size=8),
              st.text(max_size=6)))


def _usable(name, value):
    """What each later reader does with an accepted value, without
    raising."""
    kind = VARIABLES[name].kind
    if kind == "seconds":
        socket.socket().settimeout(value)  # overflowed at 1e308
        assert environment.MIN_SECONDS <= value <= environment.MAX_SECONDS
    elif kind == "url":
        request = urllib.request.Request(value.rstrip("/") + "/x.npz")
        http.client.HTTPConnection(request.host)  # host and port parse
        request.host.encode("idna") if ":" not in request.host else None
    elif kind == "folder":
        try:
            os.stat(value)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            pass


@settings(max_examples=250, deadline=None)
@given(name=st.sampled_from(sorted(VARIABLES)), text=HOSTILE)
def test_every_variable_is_usable_or_refused_naming_it(name, text):
    try:
        value = environment.read(name, {name: text})
    except SettingError as e:
        message = str(e)
        assert message.startswith(f"{name} must be ") and "\n" not in message
        assert f"{name}={text!r}" in message
        return
    if value is not None and text.strip():
        _usable(name, value)


@pytest.mark.parametrize("value", ["http://[::1", "http://h:abc/",
                                   "http://a..b/", "http://h:99999/"])
def test_a_mirror_the_url_parser_rejects_is_named(monkeypatch, value):
    """Once a mirror the URL parser rejects reached the user as "Invalid
    IPv6 URL", naming no variable."""
    monkeypatch.setenv("KERAS_VIT_MIRROR", value)
    with pytest.raises(SettingError) as info:
        download.resolve_url("gs://vit_models/x.npz")
    assert f"KERAS_VIT_MIRROR={value!r}" in str(info.value)


# -- the proxy variables of other programs ---------------------------------

PROXY_VALUES = st.one_of(
    HOSTILE,
    st.builds(lambda host, port: f"{host}:{port}",
              st.sampled_from(["proxy", "http://proxy", "https://10.0.0.1",
                               "http://u:pw@proxy", "http://[::1]", ""]),
              st.one_of(st.integers(-5, 10 ** 6).map(str),
                        st.sampled_from(["", "abc", "3128x", " 80", "0x50",
                                         "99999", "0", "65536"]))))


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(["HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                             "http_proxy"]), value=PROXY_VALUES)
def test_a_proxy_variable_is_a_usable_address_or_refused_naming_it(name,
                                                                   value):
    """Once ``HTTPS_PROXY=proxy:abc`` (or a port past 65535) reached the
    user as the URL parser's ValueError, naming neither the variable nor
    its value."""
    url = ("https" if name.lower().startswith("https") else "http") + (
        "://huggingface.co/x")
    try:
        found = environment.proxy_for(url, {name: value})
    except SettingError as e:
        message = str(e)
        assert message.startswith(f"{name} must be ") and "\n" not in message
        assert f"{name}={value!r}" in message, message
        return
    if found is None:  # an empty value: no proxy
        assert not value
        return
    host, port = found
    assert isinstance(host, str) and host, found
    assert isinstance(port, int) and 1 <= port <= 65535, found


@pytest.mark.parametrize("value", ["proxy:abc", "proxy:99999", "proxy:0",
                                   "http://[::1"])
def test_the_connection_check_names_a_proxy_with_a_bad_port(monkeypatch,
                                                            value):
    """``zoo.download.fetch.unreachable`` (the check the Hub and tfds routes run
    first) refuses the variable in one line before any connection."""
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", value)
    with pytest.raises(SettingError) as info:
        download.unreachable("https://huggingface.co/api", 0.5)
    assert f"HTTPS_PROXY={value!r}" in str(info.value)
    assert "\n" not in str(info.value)
