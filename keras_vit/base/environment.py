"""Every ``KERAS_VIT_*`` environment variable, declared and read in one place.

Each variable is a :class:`Variable` of :data:`VARIABLES`; :func:`read`
returns the parsed value or raises :class:`SettingError` naming the
variable and echoing the value, the same way wherever the package reads
it. Outside ``runtime/``, other programs' variables (``KERAS_BACKEND``,
``TF_CONFIG``, ...), a child process's environment, the cache folders and
proxies are read through the functions here as well
(tests/contracts/test_structure.py).

>>> read("KERAS_VIT_EXPORT_TIMEOUT", {})
3600.0
>>> read("KERAS_VIT_OFFLINE", {"KERAS_VIT_OFFLINE": "yes"})
True
>>> try:
...     read("KERAS_VIT_EXPORT_TIMEOUT", {"KERAS_VIT_EXPORT_TIMEOUT": "abc"})
... except SettingError as e:
...     print(e.name, e.value, str(e).split(",")[0])
KERAS_VIT_EXPORT_TIMEOUT abc KERAS_VIT_EXPORT_TIMEOUT must be a positive number of seconds
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import urllib.parse

from keras_vit.base.errors import KerasVitError
from keras_vit.base.suggestions import did_you_mean

TRUE = ("1", "true", "yes", "on")
#: Both bounds of a ``"seconds"`` value (1e308 s overflowed the socket's).
MIN_SECONDS, MAX_SECONDS = 0.1, 7 * 24 * 3600.0
FALSE = ("0", "false", "no", "off")


class SettingError(KerasVitError, ValueError):
    """An environment variable holds a value it cannot take; ``name`` and
    ``value`` are the variable and what it held."""

    def __init__(self, name, value, expected):
        self.name, self.value = name, value
        super().__init__(f"{name} must be {expected}; received "
                         f"{name}={value!r}")


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: ``kind`` is ``"seconds"``, ``"flag"``,
    ``"choice"`` (one of ``choices``), ``"folder"`` (``~`` expanded),
    ``"url"`` or ``"names"`` (comma-separated, as a frozenset)."""

    name: str
    kind: str
    default: object
    help: str
    choices: tuple = ()


VARIABLES = {v.name: v for v in (
    Variable("KERAS_VIT_CACHE", "folder", None,
             "the download cache (default: $XDG_CACHE_HOME/keras_vit or "
             "~/.cache/keras_vit)"),
    Variable("KERAS_VIT_OFFLINE", "flag", False,
             "never download; a missing file is an error saying where to "
             "put it"),
    Variable("KERAS_VIT_MIRROR", "url", None,
             "a base URL that replaces https://storage.googleapis.com/ for "
             "the official checkpoints"),
    Variable("KERAS_VIT_DOWNLOAD_STALL_S", "seconds", 300.0,
             "a download that receives less than 64 KiB in this many "
             "seconds stops"),
    Variable("KERAS_VIT_EXPORT_TIMEOUT", "seconds", 3600.0,
             "an export's converter process is stopped after this many "
             "seconds"),
    Variable("KERAS_VIT_ACCELERATOR", "choice", None,
             "the machine the speed plan assumes, instead of the one "
             "detected", ("cpu", "gpu", "tpu")),
    Variable("KERAS_VIT_CPU_FLAGS", "names", None,
             "the CPU flags the speed plan assumes (comma-separated, as in "
             "/proc/cpuinfo), instead of the ones detected"),
    Variable("KERAS_VIT_ATTENTION", "choice", None,
             "the attention computation, instead of the speed plan's "
             "(padded: JAX's kernel over tokens padded to a multiple of 64 "
             "with a key mask, which cuDNN's flash attention trains on)",
             ("fused", "einsum", "padded")),
    Variable("KERAS_VIT_ONEDNN", "flag", True,
             "off: keras_vit leaves TensorFlow's oneDNN setting "
             "alone"),
)}

_NAME = re.compile(r"[a-z0-9_.]+\Z")
# A DNS name, an IPv4 address, or an IPv6 one (a zone follows a %).
_HOST = re.compile(r"[a-z0-9_.\-]+\Z|[0-9a-f:.]*:[0-9a-f:.]*(%[\w.\-]+)?\Z")


def read(name, environ=None):
    """The value of the variable ``name`` in ``environ`` (default
    ``os.environ``), parsed; its default when it is unset or blank."""
    var = VARIABLES[name]
    text = (os.environ if environ is None else environ).get(name)
    if text is None or not text.strip():
        return var.default
    value = text.strip()
    return _PARSERS[var.kind](var, value, text)


def raw(name, environ=None):
    """The text of the variable ``name`` as set (None when unset)."""
    VARIABLES[name]  # noqa: B018 - only declared names
    return (os.environ if environ is None else environ).get(name)


# -- variables other programs define, which keras_vit only reads ---------------


def keras_backend():
    """``KERAS_BACKEND`` as set (``""`` when unset)."""
    return os.environ.get("KERAS_BACKEND", "")


def tf_config():
    """``TF_CONFIG`` as set, stripped (``""`` when unset)."""
    return os.environ.get("TF_CONFIG", "").strip()


def tpu_name():
    """``TPU_NAME`` (None when unset or empty)."""
    return os.environ.get("TPU_NAME") or None


def xdg_cache_home():
    """``XDG_CACHE_HOME`` as set (None when unset or empty)."""
    return os.environ.get("XDG_CACHE_HOME") or None


# huggingface_hub's variables that the hf-hub: downloads read.
HUGGINGFACE_HUB = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
                   "HUGGINGFACE_HUB_CACHE")


def huggingface_hub(name):
    """huggingface_hub's variable ``name`` as set, None when unset."""
    if name not in HUGGINGFACE_HUB:
        raise KeyError(f"{name} is not one of {HUGGINGFACE_HUB}")
    return os.environ.get(name)


def proxy_for(url, environ=None):
    """``(host, port)`` of the proxy a connection to ``url`` goes through,
    as urllib, requests and huggingface_hub pick it from ``environ``, or
    None for a direct connection.

    >>> proxy_for("https://huggingface.co/x", {"HTTPS_PROXY": "proxy:3128"})
    ('proxy', 3128)
    >>> print(proxy_for("https://huggingface.co/x", {
    ...     "https_proxy": "http://proxy:3128", "no_proxy": "huggingface.co"}))
    None
    """
    import urllib.request

    environ = os.environ if environ is None else environ
    proxies, names = {}, {}
    # Upper-case names first, so that the lower-case ones win, as in urllib.
    for name in sorted(environ, key=str.islower):
        if name.lower().endswith("_proxy") and environ[name]:
            scheme = name[:-len("_proxy")].lower()
            proxies[scheme], names[scheme] = environ[name], name
    parts = urllib.parse.urlsplit(url)
    proxy = proxies.get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(
            parts.hostname or "", proxies):
        return None
    return _proxy_address(names[parts.scheme], proxy)


def _proxy_address(name, value):
    """``(host, port)`` of the proxy variable ``name``'s ``value``, or
    :class:`SettingError` naming both (the URL parser's own error names
    neither).

    >>> _proxy_address("HTTPS_PROXY", "proxy:99999")
    Traceback (most recent call last):
    ...
    keras_vit.base.environment.SettingError: HTTPS_PROXY must be a proxy \
URL such as http://proxy:3128: a host, and a port from 1 to 65535 \
(Port out of range 0-65535); received HTTPS_PROXY='proxy:99999'
    """
    expected = ("a proxy URL such as http://proxy:3128: a host, and a port "
                "from 1 to 65535")
    try:
        parts = urllib.parse.urlsplit(value if "://" in value
                                      else "http://" + value)
        port, host = parts.port, parts.hostname
    except ValueError as e:  # "proxy:abc", "proxy:99999", "http://[::1"
        raise SettingError(name, value, f"{expected} ({e})") from None
    if not host or port == 0:
        raise SettingError(name, value, expected)
    return host, port or (443 if parts.scheme == "https" else 80)


def any_set(names):
    """Whether any of the variables ``names`` holds a non-empty value."""
    return any(os.environ.get(name) for name in names)


def for_child():
    """A copy of this process's environment, to hand to a child process."""
    return dict(os.environ)


# TensorFlow's C++ log threshold: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR.
TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: The threshold of a TensorFlow process keras_vit quiets.
QUIET_TF_LOG_LEVEL = "2"


def quiet_tensorflow(environ):
    """Sets :data:`TF_LOG_LEVEL` to :data:`QUIET_TF_LOG_LEVEL` in the
    mapping ``environ`` unless it holds a value already; returns the value
    it holds.

    >>> quiet_tensorflow({}), quiet_tensorflow({"TF_CPP_MIN_LOG_LEVEL": "0"})
    ('2', '0')
    """
    if not environ.get(TF_LOG_LEVEL):
        environ[TF_LOG_LEVEL] = QUIET_TF_LOG_LEVEL
    return environ[TF_LOG_LEVEL]


def for_quiet_child():
    """:func:`for_child` with TensorFlow's C++ logging quieted
    (:func:`quiet_tensorflow`).

    >>> env = for_quiet_child()
    >>> env["TF_CPP_MIN_LOG_LEVEL"] == (os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    ...                                 or QUIET_TF_LOG_LEVEL)
    True
    """
    env = for_child()
    quiet_tensorflow(env)
    return env


def _seconds(var, value, text):
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:  # NaN too
        raise SettingError(var.name, text, "a positive number of seconds, "
                           f"from {MIN_SECONDS:g} to {MAX_SECONDS:g}")
    return seconds


def _flag(var, value, text):
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise _not_one_of(var, value.lower(), text, TRUE + FALSE)


def _choice(var, value, text):
    if value in var.choices:
        return value
    raise _not_one_of(var, value, text, var.choices)


def _not_one_of(var, value, text, choices):
    """The refusal of a value that is none of ``choices``."""
    return SettingError(var.name, text, f"one of {choices} (or unset)."
                        f"{did_you_mean(value, choices)}".rstrip("."))


def _folder(var, value, text):
    from pathlib import Path

    if "\0" in value:  # no system call takes it; pathlib says "not there"
        raise SettingError(var.name, text, "a folder path without a NUL "
                           "character")
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # "~user" for a user that does not exist
        raise SettingError(var.name, text, "a folder whose ~user exists"
                           ) from None
    try:
        a_file = path.exists() and not path.is_dir()
    except OSError as e:  # a name too long, a loop of links, ...
        raise SettingError(var.name, text, "a folder path this system "
                           f"accepts ({e.strerror or e})") from None
    if a_file:
        raise SettingError(var.name, text, "a folder (it names a file)")
    return path


def _url(var, value, text):
    """The URL, checked as far as every later reader of it goes, so that
    a value they would refuse is refused here, naming the variable."""
    expected = "an http:// or https:// URL with a host"
    if not (value.isascii() and value.isprintable()) or " " in value:
        raise SettingError(var.name, text, f"{expected}, in printable ASCII "
                           "without spaces (percent-encode the others)")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # raises for a port that is no number or > 65535
        host = parts.hostname
    except ValueError as e:  # "http://[::1": Invalid IPv6 URL
        raise SettingError(var.name, text, f"{expected} ({e})") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise SettingError(var.name, text, expected)
    if not _HOST.match(host) or port == 0 or not _dns_name(host):
        raise SettingError(var.name, text, f"{expected}: a host name or "
                           "address, and a port from 1 to 65535")
    return value


def _dns_name(host):
    """Whether the socket library takes ``host``: its IDNA encoding
    refuses an empty label or one over 63 characters."""
    if ":" in host:  # an IPv6 address
        return True
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True


def _names(var, value, text):
    names = frozenset(n.strip().lower() for n in value.split(",")
                      if n.strip())
    if not all(_NAME.match(n) for n in names):
        raise SettingError(var.name, text,
                           "comma-separated names such as avx512f,amx_bf16")
    return names


_PARSERS = {"seconds": _seconds, "flag": _flag, "choice": _choice,
            "folder": _folder, "url": _url, "names": _names}


def table():
    """The variables as a Markdown table (docs/reference/environment.md)."""
    rows = ["| variable | value | default | what it does |",
            "|---|---|---|---|"]
    kinds = {"seconds": f"seconds, {MIN_SECONDS:g} to {MAX_SECONDS:g}",
             "flag": "1/0, true/false, yes/no, "
             "on/off", "folder": "a path", "url": "http(s) URL",
             "names": "comma-separated flags"}
    for var in VARIABLES.values():
        value = ("/".join(var.choices) if var.kind == "choice"
                 else kinds[var.kind])
        default = "unset" if var.default is None else (
            ("on" if var.default else "off") if var.kind == "flag"
            else f"{var.default:g}")
        rows.append(f"| `{var.name}` | {value} | {default} | {var.help} |")
    return "\n".join(rows) + "\n"
