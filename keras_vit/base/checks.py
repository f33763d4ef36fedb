"""Argument checks shared by every module and command, and the check for
an optional package.

A missing optional package has one error type and one way to raise it:

>>> from keras_vit.base.checks import require
>>> from keras_vit.base.errors import MissingDependencyError
>>> require("json").__name__
'json'
>>> try:
...     require("no_such_module_xyz", package="no-such-package",
...             purpose="this example")
... except MissingDependencyError as e:
...     print(e)
this example needs the package 'no-such-package', which is not installed: pip install 'no-such-package'

Bad arguments go through :func:`check_choice`, :func:`check_int` and
:func:`check_number`: the error names the argument, echoes the value and
suggests the nearest valid one.

>>> check_choice("classifier", "tokn", ("token", "gap"))
Traceback (most recent call last):
ValueError: classifier must be one of ('token', 'gap'); received classifier='tokn'. Did you mean 'token'?
>>> check_int("num_layers", 0, low=1)
Traceback (most recent call last):
ValueError: num_layers must be a positive integer; received num_layers=0
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os

from keras_vit.base import environment
from keras_vit.base.errors import MissingDependencyError, UnexpectedKeywordError
# closest is imported from here by the readers of names (re-exported).
from keras_vit.base.suggestions import closest as closest, did_you_mean


# Optional modules and their pip names: the command line turns a
# ModuleNotFoundError for any of these into the same one-line error.
PACKAGES = {"matplotlib": "matplotlib", "skimage": "scikit-image",
            "tensorflow_datasets": "tensorflow-datasets",
            "tf2onnx": "tf2onnx", "onnx": "onnx", "onnxruntime": "onnxruntime",
            "ai_edge_litert": "ai-edge-litert", "tensorboard": "tensorboard",
            "keras_hub": "keras-hub", "huggingface_hub": "huggingface_hub",
            "safetensors": "safetensors", "timm": "timm", "torch": "torch",
            "scipy": "scipy", "sklearn": "scikit-learn", "PIL": "pillow",
            # Keras backends (KERAS_BACKEND) that may not be installed.
            "jax": "jax", "openvino": "openvino"}


def missing_dependency(exc):
    """The :class:`MissingDependencyError` that a ``ModuleNotFoundError``
    for a known optional package stands for, else None.

    >>> missing_dependency(ModuleNotFoundError("x", name="skimage.data")).package
    'scikit-image'
    >>> missing_dependency(ModuleNotFoundError("x", name="keras_vit.nope"))
    """
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    backend = environment.keras_backend() or "tensorflow"
    if top == backend and backend in KERAS_BACKENDS:
        # Keras imports its backend's module first: the setting is at fault.
        return MissingDependencyError(
            PACKAGES.get(top, top),
            f"importing Keras (backend {backend!r}, KERAS_BACKEND)")
    package = PACKAGES.get(top)
    return MissingDependencyError(package) if package else None


def require(module, package=None, purpose=None, pip_spec=None):
    """Imports and returns ``module``; raises :class:`MissingDependencyError`
    naming ``package`` (default: the module's top-level name) and the pip
    command when it is not installed (an import error from inside an
    installed package is not hidden)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise
        raise MissingDependencyError(package or PACKAGES.get(top, top),
                                     purpose, pip_spec) from e


def check_choice(name, value, choices, *, error=ValueError, extra=""):
    """``value`` if it is one of ``choices``, else ``error`` naming the
    argument, echoing the value and suggesting the nearest choice.

    Args:
        name: what the user typed it as (``"pooling"``, ``"--recipe"``).
        error: the exception class to raise.
        extra: text appended to the message.

    >>> check_choice("pooling", "gap", ("token", "gap"))
    'gap'
    """
    choices = tuple(choices)
    try:
        if value in choices:
            return value
    except TypeError:  # an unhashable value is no choice
        pass
    hint = did_you_mean(value, choices) if isinstance(value, str) else ""
    raise error(f"{name} must be one of {choices!r}; received "
                f"{name}={value!r}.{hint}{extra}")


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _integer(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if getattr(value, "dtype", None) is not None and getattr(
            value, "shape", None) == () and value.dtype.kind in "iu":
        return int(value)  # a NumPy integer scalar
    return None


def check_int(name, value, *, low=None, high=None, error=ValueError):
    """``value`` as an ``int`` if it is an integer in ``[low, high]``, else
    ``error`` naming the argument, echoing the value and giving the range.

    >>> check_int("top", 3, low=1)
    3
    >>> check_int("steps", 2.5, low=1)
    Traceback (most recent call last):
    ValueError: steps must be a positive integer; received steps=2.5
    >>> check_int("layer", 12, low=0, high=11)
    Traceback (most recent call last):
    ValueError: layer must be an integer in [0, 11]; received layer=12
    """
    number = _integer(value)
    ok = number is not None and (low is None or number >= low) and (
        high is None or number <= high)
    if ok:
        return number
    if high is not None:
        what = (f"an integer in [{low}, {high}]" if low is not None
                else f"an integer <= {high}")
    elif low == 1:
        what = "a positive integer"
    elif low == 0:
        what = "a non-negative integer"
    elif low is not None:
        what = f"an integer >= {low}"
    else:
        what = "an integer"
    raise error(f"{name} must be {what}; received {name}={value!r}")


def check_pair(name, value):
    """``(h, w)`` from an int or a pair of positive ints.

    >>> check_pair("patch_size", 16)
    (16, 16)
    >>> check_pair("image_size", (224, 0))
    Traceback (most recent call last):
    ValueError: image_size must be positive integers; received image_size=(224, 0)
    """
    def integer(v):  # NumPy's integers too, never a bool
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if integer(value):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = tuple(value)
    else:
        raise ValueError(f"{name} must be an int or a pair of ints; received "
                         f"{name}={value!r}")
    if not all(integer(v) and v > 0 for v in pair):
        raise ValueError(f"{name} must be positive integers; received "
                         f"{name}={value!r}")
    return int(pair[0]), int(pair[1])


def check_number(name, value, *, low=None, high=None, low_open=False,
                 high_open=False, error=ValueError):
    """``value`` if it is a finite number in the range (``low_open`` /
    ``high_open`` exclude the ends), else ``error`` naming the argument,
    echoing the value and giving the range.

    >>> check_number("dropout_rate", 1.5, low=0, high=1, high_open=True)
    Traceback (most recent call last):
    ValueError: dropout_rate must be a number in [0, 1); received dropout_rate=1.5
    """
    ok = _is_number(value) and (
        low is None or (value > low if low_open else value >= low)) and (
        high is None or (value < high if high_open else value <= high))
    if ok:
        return value
    lo = "(" if low_open or low is None else "["
    hi = ")" if high_open or high is None else "]"
    span = (f"{lo}{low if low is not None else '-inf'}, "
            f"{high if high is not None else 'inf'}{hi}")
    raise error(f"{name} must be a number in {span}; received "
                f"{name}={value!r}")


# The dtype names users type; Keras accepts any float dtype or mixed policy.
DTYPES = ("float32", "float16", "bfloat16", "float64", "mixed_float16",
          "mixed_bfloat16")


def check_dtype(name, value):
    """``value`` if Keras takes it as a dtype policy (a name, a
    ``DTypePolicy`` or None), else a ValueError.

    >>> check_dtype("dtype", "bfloat16")
    'bfloat16'
    >>> check_dtype("dtype", "flaot32")
    Traceback (most recent call last):
    ValueError: dtype must be one of ('float32', 'float16', 'bfloat16', 'float64', 'mixed_float16', 'mixed_bfloat16'); received dtype='flaot32'. Did you mean 'float32'? (A keras.DTypePolicy also works.)
    """
    if value is None or not isinstance(value, str):
        return value
    import keras

    try:
        keras.dtype_policies.get(value)
    except (ValueError, TypeError):
        check_choice(name, value, DTYPES,
                     extra=" (A keras.DTypePolicy also works.)")
    return value


# What keras.Model's own constructor takes besides a subclass' arguments.
MODEL_KEYWORDS = ("name", "trainable", "dtype")


def check_type(name, value, types, what):
    """``value`` if it is an instance of ``types``, else an
    :class:`~keras_vit.base.errors.ArgumentTypeError`.

    >>> check_type("path", 5, (str, os.PathLike), "a path")
    Traceback (most recent call last):
    keras_vit.base.errors.ArgumentTypeError: path must be a path; received path=5 (int)
    """
    if isinstance(value, types):
        return value
    from keras_vit.base.errors import ArgumentTypeError

    raise ArgumentTypeError(f"{name} must be {what}; received {name}="
                            f"{shown(value)} ({type(value).__name__})")


def check_path(name, value):
    """``value`` if it is a path (``str`` or ``os.PathLike``)."""
    return check_type(name, value, (str, os.PathLike), "a path (a str or "
                      "os.PathLike)")


def check_model(name, value):
    """``value`` if it is a ``keras.Model`` (imports Keras)."""
    import keras

    return check_type(name, value, keras.Model, "a keras.Model")


def as_array(name, value, dtype="float32"):
    """``value`` as a NumPy array of ``dtype``, or an
    :class:`~keras_vit.base.errors.ArgumentTypeError`."""
    import numpy as np

    try:
        return np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as e:
        from keras_vit.base.errors import ArgumentTypeError

        raise ArgumentTypeError(
            f"{name} must be an array of numbers; received {name}="
            f"{shown(value)} ({type(value).__name__}: {e})") from None


def check_keywords(where, kwargs, accepted):
    """Refuses keyword arguments that ``where`` would silently drop
    (``keras.Model`` ignores unknown ones). ``accepted`` is a list of names
    or a class/function whose signature gives them.

    >>> try:
    ...     check_keywords("vit()", {"num_clases": 3}, ["num_classes"])
    ... except TypeError as e:
    ...     print(e)
    vit() got an unexpected keyword argument 'num_clases'. Did you mean 'num_classes'?
    """
    if callable(accepted):
        params = inspect.signature(accepted).parameters.values()
        accepted = [p.name for p in params if p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] + list(MODEL_KEYWORDS)
    for key in kwargs:
        if key not in accepted:
            raise UnexpectedKeywordError(f"{where} got an unexpected keyword argument "
                            f"{key!r}.{did_you_mean(key, accepted)}")


def shown(value, limit=80):
    """``repr(value)`` cut to ``limit`` characters.

    >>> shown("x" * 100, limit=12)
    "'xxxxxxxxx...(100 characters)"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"({len(value)} characters)" if isinstance(value, str) else (
        f"({type(value).__name__} of {len(value)})" if hasattr(
            value, "__len__") else "")
    return text[:limit - 2] + "..." + size


def printable(text):
    """``text`` with control and format characters escaped, for printing
    names that came from a file the user did not write.

    >>> printable("tabby\\n\\x1b[31mcat")
    'tabby\\\\n\\\\x1b[31mcat'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode(
        "unicode_escape").decode("ascii") for c in text)


# What Keras 3 imports for KERAS_BACKEND (keras/src/backend/__init__.py).
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")


def check_keras_backend():
    """A ValueError naming ``KERAS_BACKEND`` when it is set to a name Keras
    has no backend for (Keras fails inside ``import keras`` naming no
    setting).

    >>> import os
    >>> os.environ.get("KERAS_BACKEND", "tensorflow") in KERAS_BACKENDS
    True
    """
    value = environment.keras_backend()
    if value:
        check_choice("KERAS_BACKEND", value, KERAS_BACKENDS,
                     extra=" (Or leave it unset for Keras' default.)")
