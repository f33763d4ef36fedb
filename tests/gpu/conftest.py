"""The ``gpu`` tests run where Keras' backend sees an accelerator, and are
skipped elsewhere; ``ACCELERATOR_CHECK_ON_CPU=1`` runs them on the CPU at
the same sizes, for the rehearsal of benchmarks/accelerator.py (``--cpu``),
so that a GPU session meets only the device as new."""

import os

import pytest


def on_accelerator():
    """True where Keras' backend computes on a GPU or TPU (the package's
    own reading of the machine)."""
    from keras_vit import hardware

    return hardware.detect().accelerator != "cpu"


@pytest.fixture(autouse=True)
def _needs_an_accelerator(request):
    if request.node.get_closest_marker("gpu") is None:
        return
    if os.environ.get("ACCELERATOR_CHECK_ON_CPU") == "1":
        return
    if not on_accelerator():
        pytest.skip("needs a GPU: run benchmarks/accelerator.py on a GPU "
                    "machine (docs/guides/speed.md)")

