"""The process's one OpenVINO ``Core``, through which every OpenVINO file
the package reads, exports, verifies or times goes.

Why one: each Core's CPU plugin gives the thread that compiles with it a
signal stack of its own and, when the Core ends, puts back the stack it
found there. Cores that end in another order than they began (two opened
files let go by the garbage collector) leave the thread a freed stack, and
the next signal (Ctrl-C) ends the process with a segmentation fault
instead of a KeyboardInterrupt (OpenVINO 2026.4.1, seen here). One Core
that lasts as long as the process ends in no wrong order.
"""

from __future__ import annotations

import functools

from keras_vit.base.checks import require


@functools.lru_cache(maxsize=None)
def core():
    """The shared ``openvino.Core`` (made on first use; OpenVINO is
    imported then, not with this module).

    >>> core() is core()
    True
    """
    ov = require("openvino", purpose="reading and running OpenVINO files")
    return ov.Core()
