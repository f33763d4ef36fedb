"""How fast the ``keras-vit`` command starts: CPU and wall time of the
commands that need no model (``--help``, ``list``, ``info``, every
``COMMAND --help``), each in a fresh process, against ``import keras_vit``
(what every command paid before the command line loaded Keras lazily).

    python benchmarks/cli_startup.py            # median of 5 runs each
    python benchmarks/cli_startup.py --runs 3 --out /tmp/cli.md

The figures are per process: user+sys CPU seconds of the child (from
``os.wait4``) and its wall time. The goal: under 0.5 s of CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

# The benchmarks' shared --out writer, a sibling module (this folder is
# sys.path[0] when run as a script, not when loaded by path from a test).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from speed_tables import emit  # noqa: E402

GOAL_CPU_S = 0.5
# This process reads the parser (importing the package, and so Keras).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def cpu_features():
    """The CPU's model name and the flags that decide its speed."""
    from keras_vit.runtime import hardware

    flags, name = hardware.cpu_flags(), hardware.cpu_model()
    if not flags or not name:
        return platform.machine()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    have = ", ".join(flag for flag in wanted if flag in flags) or "none"
    return f"{name} ({have})"


def measure(argv, runs):
    """Median (cpu seconds, wall seconds) of ``argv`` over ``runs``."""
    cpu, wall = [], []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall.append(time.perf_counter() - start)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): "
                             f"{err[-500:]}")
        cpu.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(cpu), statistics.median(wall)


def commands():
    """The model-free commands: ``--help``, ``list``, ``info`` and every
    subcommand's ``--help`` (read from the parser itself)."""
    import argparse as ap

    from keras_vit import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions  # noqa: SLF001 - argparse's API
               if isinstance(a, ap._SubParsersAction))  # noqa: SLF001
    names = sorted(sub.choices)
    return ([["--help"], ["list"], ["info", "ViT-B/16"]]
            + [[name, "--help"] for name in names])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5,
                        help="fresh processes per command (default 5)")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.runs > 100:
        parser.error(f"--runs must be in 1..100, got {args.runs}")
    exe = shutil.which("keras-vit")
    if exe is None:
        parser.error("the keras-vit command is not on PATH: "
                     "pip install -e . first")
    rows = []
    cpu, wall = measure([sys.executable, "-c", "import keras_vit"],
                        args.runs)
    rows.append(("python -c 'import keras_vit' (the old start-up)", cpu,
                 wall))
    for extra in commands():
        cpu, wall = measure([exe, *extra], args.runs)
        rows.append(("keras-vit " + " ".join(extra), cpu, wall))
    lines = [
        "# keras-vit start-up",
        "",
        f"- CPU: {cpu_features()}, {len(os.sched_getaffinity(0))} usable "
        "cores",
        f"- median of {args.runs} fresh processes per row; goal: under "
        f"{GOAL_CPU_S} s of CPU",
        "",
        "| command | CPU s | wall s | goal met |",
        "|---|---|---|---|",
    ]
    for i, (name, cpu, wall) in enumerate(rows):
        met = "-" if i == 0 else ("yes" if cpu < GOAL_CPU_S else "no")
        lines.append(f"| `{name}` | {cpu:.3f} | {wall:.3f} | {met} |")
    emit("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
