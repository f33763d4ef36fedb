"""The image shapes every path of a model is tried on, legal and illegal
(0 and 1 pixel, under a patch, not a multiple of the patch, large, not
square), for a tiny ViT built for 32x32 and its dynamic-size twin:
tests/models/test_image_sizes.py (the call and the predict paths) and
tests/export/test_export_image_sizes.py (the exported artifacts)."""

import numpy as np

TINY = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32, num_classes=3)

# (height, width) -> taken? for each model.
FIXED = {(32, 32): True, (0, 32): False, (1, 1): False, (4, 4): False,
         (33, 32): False, (256, 256): False, (32, 64): False}
DYNAMIC = {(32, 32): True, (64, 32): True, (128, 128): True,
           (0, 32): False, (1, 1): False, (4, 4): False, (9, 8): False,
           (33, 32): False, (32, 36): False}
CASES = [("fixed", hw, ok) for hw, ok in FIXED.items()] + [
    ("dynamic", hw, ok) for hw, ok in DYNAMIC.items()]
PATHS = ("xla", "graph", "eager", "keras")


def images(hw, n=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (n,) + tuple(hw) + (3,)).astype("float32")
