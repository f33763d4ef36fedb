"""What the ``gpu`` tests share: the figures they hand to
benchmarks/accelerator.py's table."""

import json
import os


def record(name, values):
    """Writes one test's figures as ``NAME.json`` under
    ``ACCELERATOR_CHECK_OUT`` (set by benchmarks/accelerator.py), for its
    table; nothing elsewhere."""
    folder = os.environ.get("ACCELERATOR_CHECK_OUT")
    if folder:
        with open(os.path.join(folder, name + ".json"), "w",
                  encoding="utf-8") as f:
            json.dump(values, f, indent=1)
