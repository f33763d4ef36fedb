"""PNG figures of section 4.5 of the paper, drawn with matplotlib.

Every function writes one PNG atomically and returns its path.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from keras_vit.base.checks import require

matplotlib = require("matplotlib", purpose="drawing the analysis figures")

# Render without a display, unless pyplot is in use (a notebook session).
if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from keras_vit.base import atomic  # noqa: E402

DPI = 150


def _save(fig, path, dpi):
    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise ValueError(f"path must end with .png; received path={path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight",
                    facecolor="white")
    return path


def _display_image(image):
    """uint8 or [0, 1] floats, (H, W) or (H, W, 1|3) -> something imshow
    draws in true colours."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8:
        image = np.clip(image.astype("float32"), 0.0, 1.0)
    return image


def plot_filters(images, path, *, explained_variance_ratio=None, columns=7,
                 title="Embedding filters (principal components)", dpi=DPI):
    """Tiles of the embedding-filter components, like Figure 7 (left).

    Args:
        images: (n, P, P, C) in [0, 1] (``embedding_filter_components(...)
            .images``).
        path: the ``.png`` to write.
        explained_variance_ratio: optional (n,) shares shown under tiles.
        columns: tiles per row (the paper shows 28 as 4 x 7).

    >>> import tempfile, os
    >>> p = plot_filters(np.random.default_rng(0).random((2, 4, 4, 3)),
    ...                  os.path.join(tempfile.mkdtemp(), "f.png"))
    >>> os.path.getsize(p) > 0
    True
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or not len(images):
        raise ValueError(f"images must have shape (n, P, P, 1 or 3); received "
                         f"images.shape={images.shape}")
    n = len(images)
    columns = max(1, min(int(columns), n))
    rows = math.ceil(n / columns)
    fig = Figure(figsize=(1.0 * columns, 1.0 * rows + 0.5))
    axes = fig.subplots(rows, columns, squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        ax.set_axis_off()
        if i >= n:
            continue
        tile = images[i]
        if tile.shape[-1] == 1:
            ax.imshow(tile[..., 0], cmap="gray", vmin=0, vmax=1,
                      interpolation="nearest")
        else:
            ax.imshow(np.clip(tile, 0, 1), interpolation="nearest")
        if explained_variance_ratio is not None:
            ax.set_title(f"{100 * float(explained_variance_ratio[i]):.1f}%",
                         fontsize=6, pad=2)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path, dpi)


def _mosaic(similarity, gap=1):
    """(rows, cols, rows, cols) -> one image of rows x cols tiles with a
    NaN gap between them (drawn white)."""
    rows, cols = similarity.shape[:2]
    h, w = rows * (rows + gap) - gap, cols * (cols + gap) - gap
    out = np.full((h, w), np.nan)
    for r in range(rows):
        for c in range(cols):
            y, x = r * (rows + gap), c * (cols + gap)
            out[y:y + rows, x:x + cols] = similarity[r, c]
    return out


def plot_position_similarity(similarity, path, *, title=None, dpi=DPI):
    """The grid of tiles of Figure 7 (centre) and Figure 10.

    Tile (r, c) shows the cosine similarity between the position embedding
    of the patch at row r, column c and those of all patches. One image
    with gaps is drawn instead of rows x cols subplots, which stays fast for
    a 24 x 24 grid.

    Args:
        similarity: (rows, cols, rows, cols) from
            ``position_embedding_similarity``.
        path: the ``.png`` to write.

    >>> import tempfile, os
    >>> sim = np.eye(4).reshape(2, 2, 2, 2)
    >>> p = plot_position_similarity(sim, os.path.join(tempfile.mkdtemp(),
    ...                                                "s.png"))
    >>> os.path.exists(p)
    True
    """
    sim = np.asarray(similarity, dtype="float64")
    if sim.ndim != 4 or sim.shape[:2] != sim.shape[2:]:
        raise ValueError(f"similarity must have shape (rows, cols, rows, "
                         f"cols); received similarity.shape={sim.shape}")
    rows, cols = sim.shape[:2]
    mosaic = _mosaic(sim)
    # Grow with the grid so that the gaps between tiles stay visible.
    size = min(10.0, max(5.0, 0.3 * max(rows, cols)))
    fig = Figure(figsize=(size * 1.2, size * rows / cols))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1,
                   interpolation="nearest")
    # Ticks at the tile centres, thinned out on large grids.
    step_r, step_c = max(1, rows // 8), max(1, cols // 8)
    ax.set_xticks([c * (cols + 1) + (cols - 1) / 2
                   for c in range(0, cols, step_c)])
    ax.set_xticklabels([str(c + 1) for c in range(0, cols, step_c)])
    ax.set_yticks([r * (rows + 1) + (rows - 1) / 2
                   for r in range(0, rows, step_r)])
    ax.set_yticklabels([str(r + 1) for r in range(0, rows, step_r)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    if title:
        ax.set_title(title, fontsize=10)
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label("Cosine similarity")
    return _save(fig, path, dpi)


def plot_attention_distance(distance, path, *, image_size=None,
                            reference=None, title=None, dpi=DPI):
    """Mean attention distance per head vs. layer, like Figures 7 (right)
    and 11: one dot per head and layer.

    Args:
        distance: (layers, heads) in pixels (``mean_attention_distance``).
        path: the ``.png`` to write.
        image_size: input width in pixels, named on the axis as in the
            paper ("image width is 224 pixels").
        reference: optional distance drawn as a dashed line, e.g. the
            uniform-attention level (``uniform_attention_distance``).

    >>> import tempfile, os
    >>> p = plot_attention_distance([[1.0, 2.0], [3.0, 4.0]],
    ...     os.path.join(tempfile.mkdtemp(), "d.png"), image_size=32)
    >>> os.path.exists(p)
    True
    """
    dist = np.asarray(distance, dtype="float64")
    if dist.ndim != 2 or not dist.size:
        raise ValueError(f"distance must have shape (layers, heads); "
                         f"received distance.shape={dist.shape}")
    layers, heads = dist.shape
    fig = Figure(figsize=(5.0, 3.6))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["tab20" if heads > 10 else "tab10"]
    depth = np.arange(1, layers + 1)
    for h in range(heads):
        ax.scatter(depth, dist[:, h], s=18, color=cmap(h % cmap.N),
                   label=f"Head {h + 1}", edgecolors="none")
    if reference is not None:
        ax.axhline(float(reference), color="0.5", linestyle="--",
                   linewidth=0.8, label="uniform")
    ax.set_xlabel("Network depth (layer)")
    ylabel = "Mean attention distance (pixels)"
    if image_size:
        ylabel += f"\nimage width {int(image_size)} pixels"
    ax.set_ylabel(ylabel)
    top = max(float(np.nanmax(dist)), float(reference or 0.0)) * 1.12
    ax.set_ylim(0, top if top > 0 else 1.0)
    ax.set_xlim(0.5, layers + 0.5)
    ax.set_xticks(depth if layers <= 12 else depth[::max(1, layers // 12)])
    ax.grid(True, linewidth=0.3, alpha=0.6)
    if heads <= 16:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5),
                  frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path, dpi)


def plot_rollout(image, heatmap, path, *, title=None, dpi=DPI):
    """Input, attention and heat map side by side, like Figure 6.

    The middle panel is the image multiplied by the upsampled rollout map
    (the paper's style); the right one the map in colour over a grey copy
    of the image.

    Args:
        image: (H, W, 3) or (H, W) uint8 pixels, or floats in [0, 1].
        heatmap: (rows, cols) from ``rollout_map``.
        path: the ``.png`` to write.

    >>> import tempfile, os
    >>> p = plot_rollout(np.zeros((8, 8, 3), np.uint8), np.eye(2),
    ...                  os.path.join(tempfile.mkdtemp(), "r.png"))
    >>> os.path.exists(p)
    True
    """
    from keras_vit.analysis.attention import unit_image, overlay, upsample

    unit = unit_image(image)
    attended = overlay(unit, heatmap)
    mask = upsample(heatmap, unit.shape[:2])
    peak = float(mask.max())
    mask = mask / peak if peak > 0 else mask
    grey = unit.mean(axis=-1)

    fig = Figure(figsize=(7.5, 2.9))
    axes = fig.subplots(1, 3)
    axes[0].imshow(_display_image(unit), interpolation="nearest")
    axes[0].set_title("Input", fontsize=9)
    axes[1].imshow(_display_image(attended), interpolation="nearest")
    axes[1].set_title("Attention (rollout)", fontsize=9)
    axes[2].imshow(grey, cmap="gray", vmin=0, vmax=1)
    im = axes[2].imshow(mask, cmap="jet", alpha=0.5, vmin=0, vmax=1)
    axes[2].set_title("Rollout heat map", fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    bar = fig.colorbar(im, ax=axes[2], fraction=0.046, pad=0.03)
    bar.set_label("relative attention", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path, dpi)
