"""A NaFlex model's inputs (the ``naflex`` option): images of any sizes
and aspect ratios as one batch of patches with their coordinates and a
padding mask.

Each image is resized to the largest grid of ``patch_size`` squares
within ``max_patches`` that keeps its aspect ratio (SigLIP2's rule), cut
into patches row by row and padded with zeros to the batch's length.

>>> import numpy as np
>>> batch = patchify([np.zeros((30, 60, 3)), np.zeros((64, 32, 3))],
...                  patch_size=16, max_patches=8)
>>> batch["patches"].shape, batch["patch_mask"].sum(axis=1).tolist()
((2, 8, 768), [8, 8])
>>> grid_for(30, 60, 16, 8), grid_for(64, 32, 16, 8)
((2, 4), (4, 2))
"""

from __future__ import annotations

import math

import numpy as np

from keras_vit.base.checks import check_int

#: A NaFlex model's inputs: patches flattened (B, N, P * P * C) as
#: SigLIP2's processor and timm cut them, each patch's row and column in
#: its image's grid, and 1 for a patch, 0 for padding.
PATCH_INPUTS = ("patches", "patch_coords", "patch_mask")


def grid_for(height, width, patch_size, max_patches):
    """The grid (rows, columns) an image of ``height`` x ``width`` pixels
    is resized to: both sides scaled by the largest factor (to 1e-5) that
    keeps ``ceil(side * factor / patch_size)`` patches a side within
    ``max_patches`` in all, at least one a side."""
    def grid(scale):
        return (max(1, math.ceil(height * scale / patch_size)),
                max(1, math.ceil(width * scale / patch_size)))

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        scale = (low + high) / 2
        rows, cols = grid(scale)
        if rows * cols <= max_patches:
            low = scale
        else:
            high = scale
    return grid(low)


def _resize(image, height, width):
    """``image`` (H, W, C) resized to ``height`` x ``width`` (bilinear
    with antialiasing, float32)."""
    if image.shape[:2] == (height, width):
        return image.astype("float32")
    import tensorflow as tf

    return tf.image.resize(image.astype("float32"), (height, width),
                           method="bilinear", antialias=True).numpy()


def patchify(images, patch_size, max_patches=256, resize=True):
    """``images`` (a list of (H, W, C) arrays of any sizes, or one
    (B, H, W, C) array) as a NaFlex batch: a dict of ``patches`` (B,
    max_patches, P * P * C) float32, ``patch_coords`` (B, max_patches, 2)
    and ``patch_mask`` (B, max_patches) int32, the model's inputs.

    ``resize=True`` resizes each image to its grid (:func:`grid_for`);
    ``resize=False`` cuts each as it is, which needs sides that are
    multiples of ``patch_size`` and at most ``max_patches`` patches.
    Pixels are passed as they are."""
    patch_size = check_int("patch_size", patch_size, low=1)
    max_patches = check_int("max_patches", max_patches, low=1)
    images = list(images)
    if not images:
        raise ValueError("images must hold at least one image; received "
                         "an empty list")
    channels = None
    out = {"patches": [], "patch_coords": [], "patch_mask": []}
    for i, image in enumerate(images):
        image = np.asarray(image)
        if image.ndim != 3 or channels not in (None, image.shape[-1]):
            raise ValueError(
                f"images[{i}] must be (height, width, channels) with the "
                "channels of the others; received shape "
                f"{tuple(image.shape)}")
        channels = image.shape[-1]
        height, width = image.shape[:2]
        if resize:
            rows, cols = grid_for(height, width, patch_size, max_patches)
            image = _resize(image, rows * patch_size, cols * patch_size)
        else:
            rows, cols = height // patch_size, width // patch_size
            if (height % patch_size or width % patch_size
                    or rows * cols > max_patches or not rows * cols):
                raise ValueError(
                    f"images[{i}] of {height} x {width} pixels is not a grid "
                    f"of at most max_patches={max_patches} patches of "
                    f"{patch_size} pixels; pass resize=True to resize it")
        patches = image.astype("float32").reshape(
            rows, patch_size, cols, patch_size, channels).transpose(
                0, 2, 1, 3, 4).reshape(rows * cols, -1)
        coords = np.stack(np.meshgrid(np.arange(rows), np.arange(cols),
                                      indexing="ij"), -1).reshape(-1, 2)
        pad = max_patches - rows * cols
        out["patches"].append(np.pad(patches, ((0, pad), (0, 0))))
        out["patch_coords"].append(np.pad(coords, ((0, pad), (0, 0))))
        out["patch_mask"].append(np.arange(max_patches) < rows * cols)
    return {"patches": np.stack(out["patches"]).astype("float32"),
            "patch_coords": np.stack(out["patch_coords"]).astype("int32"),
            "patch_mask": np.stack(out["patch_mask"]).astype("int32")}


def model_inputs(model, images):
    """``images`` (any sizes) as NaFlex ``model`` takes them: each within
    as many patches as its position table holds."""
    rows, cols = model.grid_size
    return patchify(images, model.patch_stride, rows * cols)
