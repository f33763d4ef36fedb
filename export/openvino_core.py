"""The process's one OpenVINO ``Core``, through which every OpenVINO file
the package reads, exports, verifies or times goes.

Why one: Cores that end in another order than they began leave the
thread a freed signal stack, and the next signal (Ctrl-C) ends the process
with a segmentation fault (OpenVINO 2026.4.1).
"""

from __future__ import annotations

import functools

from keras_vit.base.checks import require


@functools.lru_cache(maxsize=None)
def core():
    """The shared ``openvino.Core``, made on first use.

    >>> core() is core()
    True
    """
    ov = require("openvino", purpose="reading and running OpenVINO files")
    return ov.Core()
