import os
import sys

# Quiet TF's C++ start-up banner; set before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

# torchvision (which timm imports) crashes with a segmentation fault when it
# is imported after TensorFlow (TF 2.21, torchvision 0.29.1, seen here), and
# pytest imports every test module at collection: load timm before any test
# module can import TensorFlow.
try:  # noqa: SIM105
    import timm  # noqa: F401,E402
except ImportError:  # timm is a test extra; its tests skip without it
    pass

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's cache, and none goes online."""
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KERAS_VIT_MIRROR", raising=False)
    monkeypatch.delenv("KERAS_VIT_OFFLINE", raising=False)


TINY = dict(patch=8, hidden=32, layers=2, heads=4, mlp=64, grid=4)


def tiny_builder_kwargs(classifier="token", representation_size=None,
                        num_classes=7, grid=4):
    return dict(image_size=TINY["patch"] * grid, patch_size=TINY["patch"],
                hidden_size=TINY["hidden"], num_layers=TINY["layers"],
                num_heads=TINY["heads"], mlp_dim=TINY["mlp"],
                num_classes=num_classes, classifier=classifier,
                representation_size=representation_size)
