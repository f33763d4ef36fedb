"""Declarative checks of the files keras_vit reads but did not write.

A format is described once, field by field, as a tree of the checkers
below; :func:`check` walks a parsed document against it and returns it
(normalised), or raises one error naming the file, the field (dotted:
``model_args.img_size``, ``label_names[3]``) and the value found.

>>> spec = Object({"num_layers": Int(1, 1024), "name": Str()},
...               required=("num_layers",))
>>> check(spec, {"num_layers": 12, "name": "b16"}, "config.json")
{'num_layers': 12, 'name': 'b16'}
>>> try:
...     check(spec, {"num_layers": 2000}, "config.json")
... except ValueError as e:
...     print(e)
config.json field num_layers: expected an integer in [1, 1024]; received num_layers=2000

:func:`read_json` reads such a file: bounded in size and depth, UTF-8,
and a key given twice in one object is refused (JSON parsers keep the
last one silently).
"""

from __future__ import annotations

import json
import math
import os

from keras_vit.base.archives import special_file
from keras_vit.base.checks import shown
from keras_vit.base.errors import ConfigError, KerasVitError
from keras_vit.base.limits import MAX_CONFIG_BYTES, MAX_JSON_DEPTH


class Spec:
    """One field's description: ``expected`` says what it must be;
    :meth:`parse` returns the value (normalised) or raises
    :class:`_MismatchError`."""

    expected = "a value"

    def parse(self, value, where):
        return value


class _MismatchError(KerasVitError, ValueError):
    """Raised inside :func:`check` with the field and what it expected."""

    def __init__(self, where, expected, value):
        super().__init__(where)
        self.where, self.expected, self.value = where, expected, value


def _fail(spec, where, value):
    raise _MismatchError(where, spec.expected, value)


class Any(Spec):
    """Anything (a field read elsewhere, or not at all)."""


class Int(Spec):
    """An integer (not a bool) in ``[low, high]``."""

    def __init__(self, low=None, high=None):
        self.low, self.high = low, high
        if low is not None and high is not None:
            self.expected = f"an integer in [{low}, {high}]"
        elif low is not None:
            self.expected = f"an integer >= {low}"
        else:
            self.expected = "an integer"

    def parse(self, value, where):
        if not (isinstance(value, int) and not isinstance(value, bool)
                and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high)):
            _fail(self, where, value)
        return value


class Number(Spec):
    """A finite number (not a bool) between ``low`` and ``high``; ``open``
    excludes both ends."""

    def __init__(self, low=None, high=None, *, open=False):  # noqa: A002
        self.low, self.high, self.open = low, high, open
        brackets = "()" if open else "[]"
        self.expected = (f"a number in {brackets[0]}{low}, {high}{brackets[1]}"
                         if low is not None or high is not None
                         else "a number")

    def parse(self, value, where):
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value))
        if ok and self.low is not None:
            ok = value > self.low if self.open else value >= self.low
        if ok and self.high is not None:
            ok = value < self.high if self.open else value <= self.high
        if not ok:
            _fail(self, where, value)
        return value


class Bool(Spec):
    expected = "true or false"

    def parse(self, value, where):
        if not isinstance(value, bool):
            _fail(self, where, value)
        return value


class Str(Spec):
    """A string, one of ``choices`` when given, at most ``max_len`` long
    (a longer one is refused stating the limit)."""

    def __init__(self, choices=None, max_len=4096):
        self.choices, self.max_len = choices, max_len
        self.expected = (f"one of {list(choices)}" if choices is not None
                         else "a string")

    def parse(self, value, where):
        if not isinstance(value, str) or (
                self.choices is not None and value not in self.choices):
            _fail(self, where, value)
        if len(value) > self.max_len:
            raise _MismatchError(where, f"{self.expected} of at most "
                                 f"{self.max_len} characters", value)
        return value


class Nullable(Spec):
    """None (JSON null), or what ``spec`` takes."""

    def __init__(self, spec):
        self.spec = spec
        self.expected = f"null or {spec.expected}"

    def parse(self, value, where):
        return None if value is None else self.spec.parse(value, where)


class OneOf(Spec):
    """The first of ``specs`` that takes the value."""

    def __init__(self, *specs, expected=None):
        self.specs = specs
        self.expected = expected or " or ".join(s.expected for s in specs)

    def parse(self, value, where):
        for spec in self.specs:
            try:
                return spec.parse(value, where)
            except _MismatchError:
                continue
        _fail(self, where, value)


class List(Spec):
    """A list of ``item``: ``lengths`` a set of allowed lengths, else at
    most ``max_len``; ``unique`` refuses repeats."""

    def __init__(self, item, *, lengths=None, max_len=None, min_len=0,
                 unique=False, as_tuple=False, expected=None):
        self.item, self.lengths, self.max_len = item, lengths, max_len
        self.min_len, self.unique, self.as_tuple = min_len, unique, as_tuple
        count = (f"{' or '.join(map(str, sorted(lengths)))} "
                 if lengths else "")
        self.expected = expected or (
            f"a list of {count}{'distinct ' * unique}items, each "
            f"{item.expected}" + (f" (at most {max_len})" if max_len else ""))

    def parse(self, value, where):
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len \
                or (self.lengths and len(value) not in self.lengths) or (
                    self.max_len is not None and len(value) > self.max_len):
            _fail(self, where, value)
        out = [self.item.parse(v, f"{where}[{i}]")
               for i, v in enumerate(value)]
        if self.unique:
            seen = set()
            for i, v in enumerate(out):
                if v in seen:
                    raise _MismatchError(f"{where}[{i}]", f"a value not given "
                                    f"before in {where}", v)
                seen.add(v)
        return tuple(out) if self.as_tuple else out


class Object(Spec):
    """A JSON object: ``fields`` name -> spec; ``required`` must be there;
    ``extra``: ``"allow"`` keeps other keys unread, ``"refuse"`` names
    them. ``values`` checks every other value, ``keys`` every key."""

    def __init__(self, fields=None, *, required=(), extra="allow",
                 values=None, keys=None, max_len=None, what="a JSON object"):
        self.fields, self.required = dict(fields or {}), tuple(required)
        self.extra, self.values, self.keys = extra, values, keys
        self.max_len = max_len
        self.expected = f"{what}" + (
            f" with {', '.join(self.required)}" if self.required else "")

    def parse(self, value, where):
        if not isinstance(value, dict) or (
                self.max_len is not None and len(value) > self.max_len):
            _fail(self, where, value)
        out = dict(value)
        for key in self.required:
            if key not in value:
                raise _MismatchError(_join(where, key), "to be given (it is "
                                "missing)", _MISSING)
        for key, item in value.items():
            field = _join(where, key)
            if self.keys is not None:
                self.keys.parse(key, field)
            spec = self.fields.get(key, self.values)
            if spec is None:
                if self.extra == "refuse":
                    raise _MismatchError(field, "no such setting (keras_vit does "
                                    f"not know it; known: "
                                    f"{sorted(self.fields)})", item)
                continue
            out[key] = spec.parse(item, field)
        return out


class _Missing:
    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()


def _join(where, key):
    key = key if isinstance(key, str) else repr(key)
    return f"{where}.{key}" if where else key


def Size(high, *, channels=None):  # noqa: N802 - reads as a type
    """An image size: an integer in [1, ``high``], or ``[height, width]``
    of them (``[channels, height, width]`` too when ``channels`` is
    given, as timm writes ``input_size``)."""
    side = Int(1, high)
    lengths = {2} if channels is None else {2, 3}
    return OneOf(side, List(side, lengths=lengths, as_tuple=True),
                 expected=f"a size in pixels (an integer in [1, {high}], or "
                 "a list [channels,] height, width of them)")


def check(spec, value, path, field=None, *, error=ConfigError):
    """``value`` (a parsed document, or the part of one at ``field``)
    checked against ``spec`` and normalised; otherwise ``error(path,
    field, problem)`` naming the innermost field that does not fit."""
    try:
        return spec.parse(value, field or "")
    except _MismatchError as e:
        if not e.where and isinstance(spec, Object) and not isinstance(
                value, dict):
            raise error(path, None, f"is a JSON {_json_type(value)}, not an "
                        "object") from None
        name = e.where or None
        received = ("it is missing" if e.value is _MISSING
                    else f"received {e.where or 'value'}={shown(e.value)}")
        raise error(path, name, f"expected {e.expected}; {received}") from None
    except RecursionError:
        raise error(path, field, "is nested too deeply") from None


def _json_type(value):
    for kind, name in ((bool, "boolean"), (str, "string"), (list, "list"),
                       ((int, float), "number"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _pairs_without_repeats(path, error):
    def hook(pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                raise error(path, key, f"is given twice in one object "
                            f"({shown(out[key], 40)} and {shown(value, 40)}):"
                            " readers would disagree on which one counts")
            out[key] = value
        return out
    return hook


def _depth(value, limit):
    """True when ``value`` nests at most ``limit`` containers deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
    return True


def parse_json(raw, path, what, *, error=ConfigError):
    """The JSON document in the bytes ``raw`` of the file ``path`` (a
    ``what``): UTF-8, no key twice in an object, at most
    :data:`~keras_vit.base.limits.MAX_JSON_DEPTH` deep."""
    try:
        value = json.loads(raw.decode("utf-8"),
                           object_pairs_hook=_pairs_without_repeats(
                               path, error))
    except UnicodeDecodeError as e:
        raise error(path, None, f"is not UTF-8 text ({e})") from None
    except ValueError as e:
        if isinstance(e, error):
            raise
        raise error(path, None, f"is not valid JSON, so no {what} ("
                    f"{' '.join(str(e).split())[:200]})") from None
    except RecursionError:
        raise error(path, None, f"is nested too deeply to be a {what}"
                    ) from None
    if not _depth(value, MAX_JSON_DEPTH):
        raise error(path, None, f"is nested more than {MAX_JSON_DEPTH} deep;"
                    f" a {what} is not")
    return value


def read_json(path, what, spec=None, *, max_bytes=MAX_CONFIG_BYTES,
              error=ConfigError):
    """The JSON file ``path`` (a ``what``: ``"timm config.json"``),
    parsed by :func:`parse_json` and checked against ``spec`` when given;
    a file not regular or larger than ``max_bytes`` is refused unread."""
    path = os.fspath(path)
    kind = special_file(path)
    if kind is not None:
        raise error(path, None, f"is {kind}, not a regular file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise error(path, None, f"is {size} bytes; a {what} is a few KB (at "
                    f"most {max_bytes} bytes are read)")
    with open(path, "rb") as f:
        raw = f.read(max_bytes + 1)
    value = parse_json(raw, path, what, error=error)
    return value if spec is None else check(spec, value, path, error=error)
