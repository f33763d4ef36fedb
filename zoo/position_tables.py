"""Position tables of a checkpoint fitted to a model of another patch grid.

A learned table's grid rows are resized with the model's own kernel
(:func:`keras_vit.layers.embeddings.resize_grid_table`) on NumPy float64,
rounded once to the table's dtype; a relative table keeps, or clips to, its
trained offsets; BEiT's bias and SAM's decomposed tables are resampled as
their own code does.
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.checkpoints import CheckpointError


def resize_posemb(posemb, new_grid, num_prefix_tokens=1, old_grid=None,
                  kernel="bilinear_corners"):
    """Resizes a (1, prefix + h*w, D) position-embedding table to a new grid.

    The prefix rows are kept, the grid rows are resized in 2D with
    ``kernel`` (:data:`keras_vit.layers.embeddings.RESIZE_KERNELS`).

    Args:
        posemb: array (1, N, D).
        new_grid: (rows, cols) of the target patch grid.
        num_prefix_tokens: rows before the grid (1 with a class token).
        old_grid: (rows, cols) of the source grid; inferred as square if None.
        kernel: the resize (a model's ``position_resize``).

    >>> table = np.arange(4.0).reshape(1, 4, 1)  # a 2 x 2 grid
    >>> resize_posemb(table, (1, 1), 0).ravel().tolist()
    [0.0]
    >>> resize_posemb(table, (1, 1), 0, kernel="bicubic_aa").ravel().tolist()
    [1.5]
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
    from keras_vit.layers.embeddings import resize_grid_table  # loads Keras

    g = resize_grid_table(grid.astype(np.float64), old_grid, new_grid,
                          kernel)
    return np.concatenate([prefix, g.astype(posemb.dtype)], axis=0)[None]


def resize_posemb_axis(table, new_len, kernel="bilinear_corners"):
    """Resizes one axis table (len, D/2) of ``position_embedding="learned_2d"``
    with ``kernel``, the 1D case of :func:`resize_posemb`."""
    table = np.asarray(table)
    if table.ndim != 2:
        raise CheckpointError(
            "a learned_2d axis table must have shape (len, D/2); received "
            f"shape={table.shape}")
    return _resize_axis(table, new_len, kernel)


def _resize_axis(table, new_len, kernel):
    from keras_vit.layers.embeddings import resize_axis  # loads Keras

    return resize_axis(table.astype(np.float64), int(new_len), 0,
                       kernel).astype(table.dtype)


def resize_relative_posemb(table, new_num_patches, num_prefix_tokens=0):
    """Fits a ``position_embedding="relative"`` table to another sequence.

    Offsets beyond the trained range take the embedding of the farthest
    trained offset of the same sign (Shaw et al. 2018); a shorter sequence
    keeps the central offsets.
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


def resize_decomposed(table, new_len):
    """Fits a decomposed relative table (2 side - 1, head_dim) to
    ``new_len`` offsets as SAM's code does: torch's linear interpolation.

    >>> table = np.array([[0.0], [1.0], [2.0]])
    >>> np.round(resize_decomposed(table, 5), 6).ravel().tolist()
    [0.0, 0.4, 1.0, 1.6, 2.0]
    """
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[0] % 2 == 0:
        raise CheckpointError(
            "a decomposed relative table must have shape (2 side - 1, "
            f"head_dim); received shape={table.shape}")
    return _resize_axis(table, new_len, "bilinear")


# BEiT's 2D relative bias ends in three rows for the class token's pairs.
_CLASS_ROWS = 3


def resize_relative_bias(table, new_grid, old_grid=None):
    """Fits BEiT's relative position bias (``relative_bias``), a table
    ((2h - 1)(2w - 1) + 3, heads), to a ``new_grid`` of patches, as BEiT's
    fine-tuning code (unilm) and timm's ``checkpoint_filter_fn`` do.

    The class token's three rows are kept. Along each axis the trained
    offsets are spread geometrically, offset ``k`` to ``1 + q + ... +
    q**(k-1)`` (``q`` bisected in [1.01, 1.5] to 1e-6 to reach the new
    grid's farthest offset), and the new offsets read off bilinearly, in
    float64.

    Args:
        table: array ((2h - 1)(2w - 1) + 3, heads).
        new_grid: (rows, cols) of the target patch grid.
        old_grid: (rows, cols) the table was trained for; square if None.

    >>> table = np.arange(12.0)[:, None]  # 2 x 2 patches: 9 offsets, 3 rows
    >>> resize_relative_bias(table, (1, 1)).ravel().tolist()
    [4.0, 9.0, 10.0, 11.0]
    """
    table = np.asarray(table)
    new_grid = tuple(int(g) for g in new_grid)
    if table.ndim != 2:
        raise CheckpointError(
            "a relative_bias table must have shape ((2h - 1)(2w - 1) + 3, "
            f"heads); received shape={table.shape}")
    offsets = table.shape[0] - _CLASS_ROWS
    old_grid = _bias_grid(offsets) if old_grid is None else tuple(old_grid)
    if old_grid is None or _bias_rows(old_grid) != offsets:
        raise CheckpointError(
            f"cannot tell the patch grid of a relative_bias table of "
            f"{table.shape[0]} rows (old_grid={old_grid}): a square grid "
            "h x h has (2h - 1)**2 + 3")
    if old_grid == new_grid:
        return table
    weights = [_offset_weights(old, new) for old, new in zip(old_grid,
                                                              new_grid)]
    grid = table[:offsets].astype(np.float64).reshape(
        2 * old_grid[0] - 1, 2 * old_grid[1] - 1, -1)
    grid = np.einsum("ra,cb,abh->rch", weights[0], weights[1], grid)
    return np.concatenate([grid.reshape(-1, table.shape[1]).astype(
        table.dtype), table[offsets:]], axis=0)


def _bias_rows(grid):
    """Offset rows of a relative_bias table for a (rows, cols) grid."""
    return (2 * grid[0] - 1) * (2 * grid[1] - 1)


def _bias_grid(offsets, source_grid=None):
    """The (rows, cols) grid of a relative_bias table of ``offsets`` rows:
    ``source_grid`` when it fits, else the square one, else None."""
    side = (int(round(offsets ** 0.5)) + 1) // 2
    return _fitting_grid(offsets, _bias_rows, source_grid, side)


def _offset_weights(old, new):
    """(2 new - 1, 2 old - 1) weights that read the offsets of an axis of
    ``new`` patches off the geometric spread of its ``old`` offsets."""
    reach = new - 1  # the farthest new offset

    def spread(q):  # where the old offsets 1 .. old - 1 land
        return np.cumsum(q ** np.arange(old - 1, dtype=np.float64))

    low, high = 1.01, 1.5
    while high - low > 1e-6:
        q = (low + high) / 2
        if old > 1 and spread(q)[-1] > reach:
            high = q
        else:
            low = q
    points = spread(q)
    points = np.concatenate([-points[::-1], [0.0], points])
    targets = np.arange(-reach, reach + 1, dtype=np.float64)
    one_hot = np.eye(len(points))
    return np.stack([np.interp(targets, points, column)
                     for column in one_hot], axis=1)


def fit_position_tables(model, arrays, targets, key_fn, report, problems,
                        source_grid=None, names=None):
    """Resizes every position table of the checkpoint ``arrays`` (``{key:
    array}``, changed in place) to the model's grid; ``targets`` are the
    model's variables by key, ``key_fn`` maps a variable path to its key;
    the first resize goes to ``report["resized_posemb"]`` as ``(old, new)``
    token counts, a table that cannot be resized to ``problems``.

    A 1D table is resized whenever its grid differs, even of as many tokens.
    The checkpoint's grid is ``source_grid`` when known, else square."""
    for layer in model.layers:
        kind = _table_kind(layer)
        if kind is None:
            continue
        for var in layer.weights:
            if kind == "decomposed" and "/rel_pos_" not in var.path:
                continue  # the block's other weights
            key = key_fn(var.path)
            if key not in arrays or key not in targets:
                continue
            src, want = np.asarray(arrays[key]), tuple(var.shape)
            # Only the grid axis may differ; else it is mis-shaped.
            grid_axis = 1 if kind == "learned_1d" else 0
            others = [a for a in range(len(want)) if a != grid_axis]
            if src.ndim != len(want) or any(
                    src.shape[a] != want[a] for a in others):
                continue
            old_grid = None
            if kind == "learned_1d":
                old_grid = _table_grid(src.shape[1] - layer.num_prefix_tokens,
                                       source_grid)
            elif kind == "relative_bias":
                old_grid = _bias_grid(src.shape[0] - _CLASS_ROWS,
                                      source_grid)
                # A table of the model's shape, grid unknown: the model's.
                if old_grid is None and src.shape == want:
                    old_grid = layer.grid_size
            if src.shape == want and old_grid in (None, layer.grid_size):
                continue
            name = var.path.split("/")[-1]
            try:
                arrays[key], old, new = _resized(kind, layer, src, want,
                                                 old_grid)
            except CheckpointError as e:
                what = (kind if kind == "relative_bias"
                        else f"position_embedding={kind!r}")
                problems.append(f"{(names or {}).get(key, key)} ({what}, "
                                f"{name}): {e}")
                continue
            if report["resized_posemb"] is None:
                report["resized_posemb"] = (int(old), int(new))


def _table_kind(layer):
    """Which position table ``layer`` holds (its resize rule), or None."""
    from keras_vit.layers import EncoderBlock
    from keras_vit.models.positions import RelativePositionBias

    if isinstance(layer, RelativePositionBias):
        return "relative_bias"
    if isinstance(layer, EncoderBlock) and layer.decomposed_bias:
        return "decomposed"
    if layer.name.startswith("position_embedding"):
        return getattr(layer, "kind", None)
    return None


def _resized(kind, layer, src, want, old_grid):
    """``(table, old, new)``: the checkpoint's table ``src`` fitted to
    ``layer`` (shape ``want``), and the tokens of the old and new grid."""
    if kind == "learned_1d":
        new = want[1] - layer.num_prefix_tokens
        return (resize_posemb(src, layer.grid_size, layer.num_prefix_tokens,
                              old_grid=old_grid, kernel=layer.resize),
                src.shape[1] - layer.num_prefix_tokens, new)
    if kind == "learned_2d":
        return (resize_posemb_axis(src, want[0], layer.resize),
                src.shape[0], want[0])
    if kind == "relative":
        return (resize_relative_posemb(src, layer.num_patches,
                                       layer.num_prefix_tokens),
                (src.shape[0] + 1) // 2, layer.num_patches)
    if kind == "relative_bias":
        old = None if old_grid is None else old_grid[0] * old_grid[1]
        return (resize_relative_bias(src, layer.grid_size, old_grid), old,
                layer.grid_size[0] * layer.grid_size[1])
    if kind == "decomposed":
        return (resize_decomposed(src, want[0]), (src.shape[0] + 1) // 2,
                (want[0] + 1) // 2)
    raise CheckpointError(f"position_embedding={kind!r} has no resize rule")


def _table_grid(tokens, source_grid=None):
    """The (rows, cols) grid of a 1D table of ``tokens`` patch rows:
    ``source_grid`` when it fits, else the square one, else None."""
    return _fitting_grid(tokens, lambda g: g[0] * g[1], source_grid,
                         int(round(tokens ** 0.5)))


def _fitting_grid(rows, rows_of, source_grid, side):
    """``source_grid``, else the square grid of ``side``, when a table of
    that grid has ``rows`` rows (``rows_of(grid)``); else None."""
    for grid in (source_grid, (side, side)):
        if grid is not None and rows_of(tuple(int(g) for g in grid)) == rows:
            return tuple(int(g) for g in grid)
    return None
