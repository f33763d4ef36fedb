"""Position tables of a checkpoint fitted to a model of another patch grid.

A learned 1D table (the paper's) is resized as in the paper (section 3.2)
and the official code: its prefix (class token) rows kept, its grid rows
interpolated bilinearly with aligned corners. The interpolation is the
model's own (:func:`keras_vit.layers.embeddings.resize_grid_table`, which
also follows a dynamic-size model's input), run here on NumPy float64 and
rounded once to the table's dtype, as ``scipy.ndimage.zoom(order=1)``
computes it. A learned 2D table is resized per axis the same way; a
relative table keeps, or clips to, its trained offsets.
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.checkpoints import CheckpointError


def resize_posemb(posemb, new_grid, num_prefix_tokens=1, old_grid=None):
    """Resizes a (1, prefix + h*w, D) position-embedding table to a new grid.

    As in the paper (section 3.2) and the official code: the prefix (class
    token) rows are kept, the grid rows are interpolated in 2D with
    ``scipy.ndimage.zoom(order=1)`` semantics (bilinear, aligned corners).

    Args:
        posemb: array (1, N, D).
        new_grid: (rows, cols) of the target patch grid.
        num_prefix_tokens: rows before the grid (1 with a class token).
        old_grid: (rows, cols) of the source grid; inferred as square if None.
    """
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise CheckpointError(
            f"posemb must have shape (1, N, D); received shape={posemb.shape}")
    prefix, grid = posemb[0, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    n = grid.shape[0]
    if old_grid is None:
        side = int(round(np.sqrt(n)))
        if side * side != n:
            raise CheckpointError(
                f"cannot infer a square grid from {n} position embeddings "
                f"(num_prefix_tokens={num_prefix_tokens}); pass old_grid")
        old_grid = (side, side)
    old_grid = tuple(old_grid)
    new_grid = tuple(int(g) for g in new_grid)
    if old_grid[0] * old_grid[1] != n:
        raise CheckpointError(
            f"old_grid={old_grid} does not match {n} grid position embeddings")
    # Imported here: the layer module loads Keras, which reading a
    # checkpoint without resizing it does not need.
    from keras_vit.layers.embeddings import resize_grid_table

    g = resize_grid_table(grid.astype(np.float64), old_grid, new_grid)
    return np.concatenate([prefix, g.astype(posemb.dtype)], axis=0)[None]


def resize_posemb_axis(table, new_len):
    """Resizes one axis table (len, D/2) of ``position_embedding="learned_2d"``
    by linear interpolation with aligned corners, the 1D case of
    :func:`resize_posemb`."""
    table = np.asarray(table)
    if table.ndim != 2:
        raise CheckpointError(
            "a learned_2d axis table must have shape (len, D/2); received "
            f"shape={table.shape}")
    from keras_vit.layers.embeddings import resize_axis  # loads Keras

    return resize_axis(table.astype(np.float64), int(new_len),
                       0).astype(table.dtype)


def resize_relative_posemb(table, new_num_patches, num_prefix_tokens=0):
    """Fits a ``position_embedding="relative"`` table to another sequence.

    The table holds one embedding per 1D offset -(P-1) .. P-1 (plus a last
    row for class-token pairs when ``num_prefix_tokens``). For a longer
    sequence, offsets beyond the trained range take the embedding of the
    farthest trained offset of the same sign (clipping, as Shaw et al. 2018
    do for distances beyond k); a shorter one keeps the central offsets.
    Offsets are in raster order, so on a grid of another width an offset of
    +cols no longer means "one row down": expect to fine-tune, as after any
    resolution change.
    """
    table = np.asarray(table)
    extra = 1 if num_prefix_tokens else 0
    offsets = table.shape[0] - extra
    if table.ndim != 3 or offsets < 1 or offsets % 2 == 0:
        raise CheckpointError(
            "a relative position table must have shape (2P - 1 [+ 1], heads, "
            f"head_dim); received shape={table.shape} with num_prefix_tokens="
            f"{num_prefix_tokens}")
    old = (offsets + 1) // 2
    wanted = np.arange(-(new_num_patches - 1), new_num_patches)
    rows = np.clip(wanted, -(old - 1), old - 1) + old - 1
    return np.concatenate([table[rows], table[offsets:]], axis=0)


def fit_position_tables(model, arrays, targets, key_fn, report, problems,
                        source_grid=None, names=None):
    """Resizes every position table of the checkpoint ``arrays`` (``{key:
    array}``, changed in place) to the model's grid; ``targets`` are the
    model's variables by key, ``key_fn`` maps a variable path to its key;
    the first resize goes to ``report["resized_posemb"]`` as ``(old, new)``
    token counts, a table that cannot be resized to ``problems``.

    A 1D table is resized whenever its grid differs from the model's, also
    when both hold as many tokens (a 4x4 table into an 8x2 model): the rows
    would otherwise land on the wrong patches. The checkpoint's grid is
    ``source_grid`` when known (a model being copied), else square (every
    released checkpoint is). ``names``: how a problem names a key (the
    source's own name of it)."""
    for layer in model.layers:
        kind = getattr(layer, "kind", None)
        if not layer.name.startswith("position_embedding") or kind is None:
            continue
        for var in layer.weights:
            key = key_fn(var.path)
            if key not in arrays or key not in targets:
                continue
            src, want = np.asarray(arrays[key]), tuple(var.shape)
            # Only the grid (token, row or offset) axis may differ; anything
            # else is mis-shaped and reported as such.
            grid_axis = 1 if kind == "learned_1d" else 0
            others = [a for a in range(len(want)) if a != grid_axis]
            if src.ndim != len(want) or any(
                    src.shape[a] != want[a] for a in others):
                continue
            old_grid = None
            if kind == "learned_1d":
                old_grid = _table_grid(src.shape[1] - layer.num_prefix_tokens,
                                       source_grid)
            if src.shape == want and old_grid in (None, layer.grid_size):
                continue
            name = var.path.split("/")[-1]
            try:
                if kind == "learned_1d":
                    arrays[key] = resize_posemb(src, layer.grid_size,
                                                layer.num_prefix_tokens,
                                                old_grid=old_grid)
                    old = src.shape[1] - layer.num_prefix_tokens
                    new = want[1] - layer.num_prefix_tokens
                elif kind == "learned_2d":
                    arrays[key] = resize_posemb_axis(src, want[0])
                    old, new = src.shape[0], want[0]
                elif kind == "relative":
                    arrays[key] = resize_relative_posemb(
                        src, layer.num_patches, layer.num_prefix_tokens)
                    old = (src.shape[0] + 1) // 2
                    new = layer.num_patches
                else:
                    raise CheckpointError(
                        f"position_embedding={kind!r} has no resize rule")
            except CheckpointError as e:
                problems.append(f"{(names or {}).get(key, key)} "
                                f"(position_embedding={kind!r}, "
                                f"{name}): {e}")
                continue
            if report["resized_posemb"] is None:
                report["resized_posemb"] = (int(old), int(new))


def _table_grid(tokens, source_grid=None):
    """The (rows, cols) grid of a 1D table of ``tokens`` patch rows:
    ``source_grid`` when given (and it fits), else the square one, else
    None (a table whose grid cannot be told)."""
    if source_grid is not None:
        grid = tuple(int(g) for g in source_grid)
        if grid[0] * grid[1] == tokens:
            return grid
    side = int(round(tokens ** 0.5))
    return (side, side) if side * side == tokens else None
