"""What every ``keras-vit`` command shares: argument types, the options
more than one command takes, the parser with one-line usage errors, and
how a failure is printed (one ``keras-vit: error: ...`` line and an exit
status, or the traceback with ``--debug``/``--traceback``). Nothing here
imports Keras: ``keras-vit --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys

from keras_vit.base import limits
from keras_vit.base.errors import KerasVitError

PROG = "keras-vit"


class UserError(KerasVitError, ValueError):
    """A problem with the command line or its files (printed, exit 2)."""


# --------------------------------------------------------------------------
# output paths


def check_output_folder(folder, flag, value):
    """Raises :class:`UserError` naming ``flag`` and its ``value`` if
    ``folder`` cannot be created or written (a file in the way, or its
    nearest existing folder read-only).

    >>> import os, tempfile
    >>> check_output_folder(os.path.join(tempfile.mkdtemp(), "a", "b"),
    ...                     "--out", "a/b")
    """
    import os

    folder = os.path.abspath(folder)
    while not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise UserError(f"{flag} {value!r}: {folder!r} is a file, not a "
                            "folder; pass another path")
        folder = os.path.dirname(folder)
    if not os.access(folder, os.W_OK):
        raise UserError(f"{flag} {value!r}: the folder {folder!r} is not "
                        "writable")


# --------------------------------------------------------------------------
# argument types


def _number(text, cast, noun):
    try:
        return cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {noun}, got {text!r}") from None


def positive_int(text):
    """argparse type: an integer >= 1 (shared by every component's commands)."""
    value = _number(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def image_side(text):
    """argparse type of ``--image-size``: an integer in [1,
    MAX_IMAGE_SIDE]."""
    value = positive_int(text)
    if value > limits.MAX_IMAGE_SIDE:
        raise argparse.ArgumentTypeError(
            f"must be <= {limits.MAX_IMAGE_SIDE} pixels, got {value}")
    return value


def positive_float(text):
    """argparse type: a number > 0."""
    value = _number(text, float, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


#: ``--ema none``: no weight average (a recipe's is turned off).
NO_EMA = "none"


def ema_decay(text):
    """argparse type of ``--ema``: a decay (a number), or ``none`` (no
    weight average).

    >>> ema_decay("0.999"), ema_decay("None")
    (0.999, 'none')
    """
    if text.strip().lower() in ("none", "off"):
        return NO_EMA
    return _number(text, float, "a number or none")


def int_list(example=None, kind=tuple):
    """argparse type: comma-separated integers >= 1, as a ``kind``; the
    errors quote ``example`` when given.

    >>> int_list()("4, 1")
    (4, 1)
    """
    def parse(text):
        like = f" like {example}" if example else ""
        try:
            values = kind(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected integers{like or ' separated by commas'}, got "
                f"{text!r}") from None
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(
                f"expected positive integers{like}, got {text!r}")
        return values

    return parse


def name_list(text):
    """argparse type: comma-separated names (``logits,probabilities``)."""
    return [v.strip() for v in text.split(",") if v.strip()]


_NUMBER = re.compile(r"^-?\d+(\.\d*)?([eE][-+]?\d+)?$")


def literal(text):
    """A ``--model-option`` value: a number, true/false, none/null (None),
    else the text.

    >>> [literal(t) for t in ("4", "0.5", "True", "none", "gelu")]
    [4, 0.5, True, None, 'gelu']
    """
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if _NUMBER.match(text):
        return float(text) if any(c in text for c in ".eE") else int(text)
    return text


def model_options(pairs):
    """The ``(key, value)`` pairs of ``--model-option`` as keywords, each
    value read by :func:`literal`."""
    return {key: literal(value) for key, value in pairs}


def weights_value(value, default="auto"):
    """``--weights`` as ``zoo.load`` takes it: ``default`` when not given,
    None for ``none`` in any case (random initialisation)."""
    value = default if value is None else value
    return None if str(value).lower() == "none" else value


def key_value(text):
    """argparse type of ``--set`` / ``--model-option``: ``KEY=VALUE`` as
    ``(key, value)``, dashes in the key read as underscores."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE, got {text!r}")
    return key.strip().replace("-", "_"), value.strip()


# --------------------------------------------------------------------------
# both bounds of every number the command line takes


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of a numeric option's values (of each value, for a
    comma-separated list): ``[low, high]``, ``low`` excluded when
    ``low_open``. ``high`` sits far past any real use, to stop a slip
    (``--steps 1e12``, ``--lr inf``) at the command line."""

    low: float
    high: float
    low_open: bool = False

    def refusal(self, value, flag="the value"):
        """Why ``value`` of option ``flag`` is out of range (NaN
        included), else None.

        >>> Bound(0, 2 ** 32 - 1).refusal(-3, "--seed")
        '--seed must be an integer in [0, 4294967295]; received --seed=-3'
        >>> Bound(0, 1).refusal(0.5, "--ema") is None
        True
        """
        above = value > self.low if self.low_open else value >= self.low
        if above and value <= self.high:
            return None
        lo = "(" if self.low_open else "["
        kind = "an integer" if isinstance(value, int) else "a number"
        return (f"{flag} must be {kind} in {lo}{_exact(self.low)}, "
                f"{_exact(self.high)}]; received {flag}={value}")


def _exact(number):
    """``number`` written in full (``4294967295``, not ``4.29497e+09``)."""
    return int(number) if float(number).is_integer() else number


# The bounds are the library's (keras_vit.base.limits).
_STEPS = limits.MAX_STEPS
_BATCH = limits.MAX_BATCH_SIZE
_EXAMPLES = limits.MAX_EXAMPLES

#: Every numeric option of every ``keras-vit`` command, by its long flag;
#: :class:`ArgumentParser` applies the row when the option is added.
BOUNDS = {
    "--steps": Bound(1, _STEPS),
    "--epochs": Bound(0, limits.MAX_EPOCHS, low_open=True),
    "--batch-size": Bound(1, _BATCH),
    "--micro-batch-size": Bound(1, _BATCH),
    "--batch": Bound(1, _BATCH),
    "--batch-sizes": Bound(1, _BATCH),
    "--lr": Bound(0, limits.MAX_LEARNING_RATE, low_open=True),
    "--warmup-steps": Bound(0, _STEPS),
    "--image-size": Bound(1, limits.MAX_IMAGE_SIDE),
    "--num-classes": Bound(1, limits.MAX_CLASSES),
    "--top": Bound(1, limits.MAX_CLASSES),
    "--top-k": Bound(1, limits.MAX_CLASSES),
    "--ema": Bound(0, 1),
    "--checkpoint-every": Bound(1, _STEPS),
    "--seed": Bound(0, limits.MAX_SEED),
    "--opset": Bound(1, 100),  # the exporter checks tf2onnx's own range
    "--runs": Bound(1, limits.MAX_RUNS),
    "--cpu-devices": Bound(1, limits.MAX_CPU_DEVICES),
    "--shots": Bound(1, _EXAMPLES),
    "--l2-reg": Bound(0, 1e12, low_open=True),
    "--seeds": Bound(1, limits.MAX_SEEDS),
    "--corruption-rate": Bound(0, 1),
    "--train-examples": Bound(1, _EXAMPLES),
    "--val-examples": Bound(1, _EXAMPLES),
    "--test-examples": Bound(1, _EXAMPLES),
}


def bounded(parse, bound, flag="the value"):
    """The argparse type ``parse`` with ``bound`` applied to the number(s)
    it returns."""
    def checked(text):
        value = parse(text)
        for number in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(number, str):  # a word the type allows: none
                continue
            why = bound.refusal(number, flag)
            if why is not None:
                raise argparse.ArgumentTypeError(why)
        return value

    checked.__name__ = getattr(parse, "__name__", "number")
    checked.bound = bound
    return checked


# --------------------------------------------------------------------------
# options more than one command takes


_COUNT = {"type": positive_int, "metavar": "N"}

# name: (flags, argparse keywords), added by add().
OPTIONS = {
    "model": (("model",), {"metavar": "MODEL"}),
    "data_dir": (("--data-dir",), {"metavar": "DIR"}),
    "eval_data": (("--eval-data",), {"metavar": "SPEC"}),
    "download": (("--download",), {"action": "store_true"}),
    "weights": (("--weights", "-w"), {"metavar": "W"}),
    "out": (("--out", "-o"), {"metavar": "DIR"}),
    "output": (("--output", "-o"), {"required": True, "metavar": "PATH"}),
    "restart": (("--restart",), {"action": "store_true"}),
    "steps": (("--steps",), _COUNT),
    "epochs": (("--epochs",), {"type": positive_float, "metavar": "N"}),
    "batch_size": (("--batch-size",), _COUNT),
    "micro_batch_size": (("--micro-batch-size",), _COUNT),
    "lr": (("--lr",), {"type": positive_float, "metavar": "X"}),
    "warmup_steps": (("--warmup-steps",), {"type": int, "metavar": "N"}),
    "image_size": (("--image-size",), {"type": image_side, "metavar": "N"}),
    "num_classes": (("--num-classes",), _COUNT),
    "ema": (("--ema",), {"type": ema_decay, "metavar": "DECAY"}),
    "precision": (("--precision",), {"metavar": "P"}),
    "checkpoint_every": (("--checkpoint-every",), _COUNT),
    "seed": (("--seed",), {"type": int, "metavar": "N"}),
    "set": (("--set",), {"action": "append", "type": key_value,
                         "default": [], "metavar": "FIELD=VALUE"}),
    "model_option": (("--model-option",), {"action": "append",
                                           "type": key_value, "default": [],
                                           "metavar": "KEY=VALUE"}),
    "quiet": (("--quiet", "-q"), {"action": "store_true"}),
    "json": (("--json",), {"action": "store_true", "help": "print JSON"}),
}


def add(parser, **options):
    """Adds the shared options named by keyword, in that order, each given
    its help text (a str), argparse keywords that override the shared ones
    (a dict), or ``None``.

    >>> p = argparse.ArgumentParser()
    >>> add(p, image_size="input resolution", batch_size={"default": 8})
    >>> p.parse_args(["--image-size", "32"])
    Namespace(image_size=32, batch_size=8)
    """
    for name, spec in options.items():
        flags, keywords = OPTIONS[name]
        if isinstance(spec, str):
            spec = {"help": spec}
        parser.add_argument(*flags, **{**keywords, **(spec or {})})


# --------------------------------------------------------------------------
# the parser


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line usage errors that suggest the nearest valid
    command, choice or option; exit status 2. An option whose long flag
    has a row in :data:`BOUNDS` gets that range on top of its type."""

    def add_argument(self, *flags, **kwargs):
        flag = next((f for f in flags if f in BOUNDS), None)
        if flag is not None and kwargs.get("type") is not None:
            kwargs["type"] = bounded(kwargs["type"], BOUNDS[flag], flag)
        return super().add_argument(*flags, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        # Kept for error(), which must find the sub-command in use.
        self._argv = [] if args is None else list(args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        parser = _command_in_use(self)
        message = _suggest(parser, message)
        self.exit(2, f"{self.prog}: error: {message} (`{parser.prog} "
                     "--help` shows the usage)\n")


def _subcommands(parser):
    for action in parser._actions:  # noqa: SLF001 - argparse has no API
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _command_in_use(parser):
    """The sub-command parser the command line chose (the deepest), else
    ``parser`` itself."""
    argv = getattr(parser, "_argv", [])
    while True:
        commands = _subcommands(parser)
        chosen = next((a for a in argv if a in commands), None)
        if chosen is None:
            return parser
        argv = argv[argv.index(chosen) + 1:]
        parser = commands[chosen]


def _suggest(parser, message):
    """``message`` with the nearest valid choice or option of ``parser``."""
    from keras_vit.base.checks import did_you_mean

    bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)",
                    message)
    if bad:
        choices = re.findall(r"'([^']*)'", bad.group(2))
        return f"{message}.{did_you_mean(bad.group(1), choices)}"
    bad = re.search(r"unrecognized arguments: (.*)", message)
    if bad:
        # The long option strings of ``parser`` itself.
        options = sorted({s for action in parser._actions  # noqa: SLF001
                          for s in action.option_strings
                          if s.startswith("--")})
        for token in bad.group(1).split():
            hint = did_you_mean(token.split("=")[0], options) if (
                token.startswith("--")) else ""
            if hint:
                return f"{message}.{hint}"
    return message


# --------------------------------------------------------------------------
# running a command


def one_line(exc, limit=600):
    """``exc``'s message on one line, cut at ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > limit:  # e.g. a checkpoint that mismatches in 200 arrays
        text = text[:limit].rstrip() + " ... (--debug shows it all)"
    return text


def run_command(func, args, debug=False):
    """Runs a subcommand: its exit status, or one line on stderr (``debug``
    re-raises): 2 for bad input, 1 for any other failure, 130 for Ctrl-C."""
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - triaged just below
        if debug:
            raise
        from keras_vit.base.checks import missing_dependency
        from keras_vit.base.errors import MissingDependencyError

        e = missing_dependency(e) or e
        if isinstance(e, MemoryError) or (
                type(e).__name__ == "ResourceExhaustedError"
                or " OOM " in f" {e} "):
            print(f"{PROG}: error: out of memory ({type(e).__name__}). "
                  "Lower --batch-size, or keep it and set --micro-batch-size "
                  "(gradient accumulation, same result), or lower "
                  "--image-size; --debug shows the traceback",
                  file=sys.stderr)
            return 1
        # ValueError covers UserError and the zoo's errors; OSError missing
        # files, PIL's UnidentifiedImageError and download errors.
        if isinstance(e, (ValueError, OSError, MissingDependencyError)):
            print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
            return 2
        print(f"{PROG}: error: {type(e).__name__}: {one_line(e)} (an "
              "unexpected failure; --debug shows the traceback)",
              file=sys.stderr)
        return 1


def failed(args, error):
    """A command's own failure: one line and exit status 1, or the
    traceback with ``--traceback``."""
    if getattr(args, "traceback", False):
        raise error
    text = " ".join(str(error).split())
    print(f"{PROG}: error: {text[:2000]}", file=sys.stderr)
    return 1


def debug_requested(argv):
    """``--debug`` (or ``--traceback``) anywhere on the command line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return any(a in ("--debug", "--traceback") for a in argv), [
        a for a in argv if a not in ("--debug", "--traceback")]


def main(parser, argv=None):
    """Parses ``argv`` (default: ``sys.argv[1:]``) with ``parser`` and runs
    the command it names (``args.func``); returns the exit status."""
    debug, argv = debug_requested(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None
                                                        else 2)
    # What was typed, for a command that prints how to run it again.
    args.command_line = parser.prog.split() + list(argv)
    # An abbreviation (--trace) reaches argparse, which sets it.
    traceback = debug or getattr(args, "traceback", False)
    with warnings_as_lines(debug):
        # A command's own argument checks (see :func:`command`) run first.
        check = getattr(args, "check", None)
        if check is not None:
            def checked(args):  # what the check returns is the command's
                check(args)

            code = run_command(checked, args, traceback)
            if code:
                return code
        return run_command(args.func, args, traceback)


# Deprecations raised by other libraries: the user can do nothing about them.
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
_WARNINGS_MODULES = ("warnings", "_py_warnings")


def _module_of(frame):
    """The name of the module ``frame`` runs in (``python -m``'s
    ``__main__`` by the module it runs)."""
    name = frame.f_globals.get("__name__") or ""
    spec = frame.f_globals.get("__spec__")
    if name == "__main__" and getattr(spec, "name", None):
        return spec.name
    return name


def warning_source(filename, frame=None):
    """The module that called ``warnings.warn`` for a warning being shown,
    found from a ``warnings.showwarning`` hook's ``frame`` (default: the
    caller's): ``filename`` is not used for that, since ``stacklevel``
    points it up the stack. Without such a frame, the module whose file is
    ``filename``; ``""`` when none is.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("always")
    ...     warnings.showwarning = lambda m, c, f, n, *a: print(
    ...         warning_source(f))
    ...     exec("import warnings; warnings.warn('x', stacklevel=2)",
    ...          {"__name__": "keras.src.ops.core"})
    keras.src.ops.core
    """
    frame = (sys._getframe(1) if frame is None else frame).f_back
    while frame is not None:
        if _module_of(frame) not in _WARNINGS_MODULES:
            return _module_of(frame)
        frame = frame.f_back
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return ""


def warning_line(message, category, source):
    """How the ``keras-vit`` command shows a Python warning raised by the
    module ``source`` (:func:`warning_source`), or None to drop it:

    ``keras-vit: warning: MESSAGE`` for the package's own, None for another
    library's deprecation (the user cannot change the call), else
    ``warning (PACKAGE): MESSAGE``; the message on one line.

    >>> warning_line("warmup_steps=250 do not fit", UserWarning,
    ...              "keras_vit.train.recipes")
    'keras-vit: warning: warmup_steps=250 do not fit'
    >>> warning_line("the mean of an empty slice", RuntimeWarning,
    ...              "numpy.core._methods")
    'warning (numpy): the mean of an empty slice'
    >>> warning_line("`foo` is deprecated", DeprecationWarning,
    ...              "tensorflow.python.util.deprecation") is None
    True
    """
    if source == "keras_vit" or source.startswith("keras_vit."):
        return f"{PROG}: warning: {one_line(message)}"
    if issubclass(category, _DEPRECATIONS):
        return None
    package = source.split(".")[0] or "python"
    return f"warning ({package}): {one_line(message)}"


@contextlib.contextmanager
def warnings_as_lines(debug=False):
    """Python warnings as one line each during the block, labelled by who
    raised them (:func:`warning_line`); ``debug`` keeps Python's format."""
    import warnings

    if debug:
        yield
        return

    def show(message, category, filename, lineno, file=None, line=None):
        text = warning_line(message, category,
                            warning_source(filename, sys._getframe()))
        if text is None:
            return
        out = sys.stderr if file is None else file
        try:
            print(text, file=out, flush=True)
        except (OSError, ValueError):  # stderr closed: nothing to say
            pass

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def start(main):
    """``main()`` as the entry point of a ``keras-vit`` process:
    TensorFlow's C++ start-up lines kept off stderr
    (:func:`keras_vit.runtime.quiet.filter_stderr`), the oneDNN choice made
    (:func:`keras_vit.runtime.hardware.enable_onednn`), and a bad
    ``KERAS_BACKEND`` or ``KERAS_VIT_ONEDNN`` one line and exit status 2,
    before anything imports Keras."""
    from keras_vit.runtime import hardware
    from keras_vit.runtime import quiet
    from keras_vit.base.checks import check_keras_backend

    quiet.filter_stderr()
    try:
        check_keras_backend()
        hardware.enable_onednn()
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return main()


def commands_parser(prog, description, traceback=("--traceback",),
                    traceback_help="show the Python traceback of errors",
                    version=None):
    """A command line of sub-commands, as ``(parser, subparsers)``."""
    parser = ArgumentParser(prog=prog, description=description)
    if version is not None:
        parser.add_argument("--version", action="version",
                            version=f"%(prog)s {version}")
    parser.add_argument(*traceback, dest="traceback", action="store_true",
                        help=traceback_help)
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND",
                                         required=True)


def command(subparsers, name, func, help, check=None):
    """Adds the sub-command ``name`` that runs ``func(args)``; ``help`` is
    its line in ``keras-vit --help`` and ``func``'s docstring its
    description. ``check(args)``, if given, validates what argparse cannot,
    before Keras is imported (raising ValueError/OSError). Returns the
    parser."""
    parser = subparsers.add_parser(name, help=help, description=func.__doc__)
    parser.set_defaults(func=func, check=check)
    return parser
