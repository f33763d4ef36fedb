"""Reading the official ``.npz`` checkpoints and copying them into Keras models.

The released files are flat ``.npz`` archives whose keys are '/'-joined Flax
parameter paths. Two numberings exist: the original vit_jax files
(``MultiHeadDotProductAttention_1``, ``LayerNorm_2``, ``MlpBlock_3``) and the
newer big_vision ones (``..._0``, ``LayerNorm_1``, ``MlpBlock_0``, sometimes
a ``params/`` prefix and all blocks stacked under ``encoderblock`` with depth
as the leading axis). Both are first rewritten to the original numbering,
which is the canonical key set this module speaks.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import zipfile

import numpy as np

from keras_vit.base import atomic
from keras_vit.base.errors import KerasVitError
# Stacked (scanned) checkpoints hold one row per encoder block; no ViT has
# more than this many, whatever a file's header declares.
from keras_vit.base.limits import MAX_LAYERS as MAX_BLOCKS
from keras_vit.zoo import lazy_npz

logger = logging.getLogger("keras_vit.zoo")


class CheckpointError(KerasVitError, ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


# --------------------------------------------------------------------------
# Reading


def read_npz(path, lazy=False) -> dict:
    """Reads a flat ``.npz`` checkpoint into ``{key: array}``.

    Never unpickles (``allow_pickle=False``); a corrupt or truncated file
    raises :class:`CheckpointError` naming the path. ``lazy=True`` reads
    only the headers and returns :class:`~keras_vit.zoo.lazy_npz.LazyArray`
    values, read one at a time when converted (what the loaders use, to keep
    the memory peak near the model's size).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path; received path={path!r}"
                        [:300])
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"path={path!r} is a directory, not an .npz "
                              "checkpoint file")
    if not os.path.isfile(path):
        raise CheckpointError(f"Checkpoint not found: path={path!r}")
    try:
        if lazy:
            return lazy_npz.open_npz(path)
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"Could not read the checkpoint path={path!r}: it is not a valid "
            f".npz archive (corrupt or truncated download?). {type(e).__name__}"
            f": {e}") from e


def as_array(value):
    """``value`` as an array, leaving a lazily read one unread."""
    if isinstance(value, lazy_npz.LazyArray):
        return value
    return np.asarray(value)


# Checkpoints at least this big show a progress bar while they load (on a
# terminal): ViT-L and ViT-H files take tens of seconds to read.
PROGRESS_MIN_BYTES = 256 * 2**20


def assign_all(assignments, source_name, progress=None):
    """Assigns ``[(variable, array or None for zeros)]`` grouped by the
    checkpoint's archive member (so a stacked array is read once and dropped
    when all its slices are assigned), reading one array at a time.
    ``progress``: a bar of the bytes assigned (None: for checkpoints of
    ``PROGRESS_MIN_BYTES`` or more, on a terminal)."""
    from tqdm.auto import tqdm

    def source(item):
        return getattr(item[1], "source", "")

    # Nothing half loaded: every member is read through and checked (CRC,
    # length, number dtype) before the first variable changes.
    try:
        lazy_npz.verify(dict(enumerate(v for _, v in assignments)))
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise CheckpointError(
            f"The checkpoint source={source_name} is corrupt; no weight was "
            f"changed. {type(e).__name__}: {e}") from e
    for var, value in assignments:
        dtype = getattr(value, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind not in (
                lazy_npz.NUMBER_KINDS):
            raise CheckpointError(
                f"{source((var, value)) or var.path!r} of the checkpoint "
                f"source={source_name} has dtype {np.dtype(dtype).str!r}, not "
                "a number type; no weight was changed")
    sizes = [int(np.prod(var.shape)) * _itemsize(var.dtype)
             for var, _ in assignments]
    if progress is None:
        disable = None if sum(sizes) >= PROGRESS_MIN_BYTES else True
    else:
        disable = not progress
    bar = tqdm(total=sum(sizes), unit="B", unit_scale=True,
               unit_divisor=1024, desc=f"loading {source_name}"[:60],
               disable=disable)
    size_of = {id(var): size for (var, _), size in zip(assignments, sizes)}
    with bar:
        _assign_groups(assignments, source_name, source, bar, size_of)


def _itemsize(dtype):
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # bfloat16, which NumPy does not know by name
        return 2


def _assign_groups(assignments, source_name, source, bar, size_of):
    for _, group in itertools.groupby(sorted(assignments, key=source),
                                      key=source):
        for var, value in group:
            if value is None:
                var.assign(np.zeros(var.shape, dtype=var.dtype))
                bar.update(size_of[id(var)])
                continue
            try:
                var.assign(np.asarray(value, dtype=var.dtype))
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
                raise CheckpointError(
                    f"Could not read {source((var, value))!r} of the "
                    f"checkpoint source={source_name} (corrupt file?); the "
                    f"model's weights are partly overwritten. "
                    f"{type(e).__name__}: {e}") from e
            bar.update(size_of[id(var)])
        if isinstance(value, lazy_npz.LazyArray):
            value.release()  # every slice of this member is assigned


_NEW_TO_OLD_BLOCK = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}




def normalize_keys(arrays: dict, max_blocks=None) -> dict:
    """Rewrites any released ViT layout to the original vit_jax key names.

    ``max_blocks``: the most encoder blocks a stacked member may declare
    (the model's depth; default :data:`MAX_BLOCKS`), checked before any
    slice is made.
    """
    if not hasattr(arrays, "items"):
        raise TypeError("arrays must be a mapping {checkpoint key: array}; "
                        f"received arrays={arrays!r}"[:300])
    limit = MAX_BLOCKS if max_blocks is None else int(max_blocks)
    out = {}
    for key, value in arrays.items():
        if key.startswith("params/"):
            key = key[len("params/"):]
        if key == "pos_embedding":  # big_vision keeps it at the top level
            key = "Transformer/posembed_input/pos_embedding"
        out[key] = as_array(value)

    # GroupNorm parameters are stored (1, 1, 1, C) in some released hybrids.
    for key in out:
        if _GN_KEY_RE.search(key) and out[key].ndim > 1:
            out[key] = out[key].reshape(-1)

    stacked = [k for k in out if k.startswith("Transformer/encoderblock/")]
    if stacked:
        for key in stacked:
            rows = out[key].shape[0] if out[key].ndim else 0
            if rows > limit:
                raise CheckpointError(
                    f"{key!r} stacks {rows} encoder blocks; the model has "
                    f"{limit} (a corrupt or foreign checkpoint)")
        for key in stacked:
            value = out.pop(key)
            rest = key[len("Transformer/encoderblock/"):]
            for i in range(value.shape[0]):
                out[f"Transformer/encoderblock_{i}/{rest}"] = value[i]

    new_style = any("MultiHeadDotProductAttention_0" in k for k in out)
    if new_style:
        renamed = {}
        for key, value in out.items():
            parts = key.split("/")
            if (len(parts) > 2 and parts[0] == "Transformer"
                    and parts[1].startswith("encoderblock_")):
                parts[2] = _NEW_TO_OLD_BLOCK.get(parts[2], parts[2])
            renamed["/".join(parts)] = value
        out = renamed
    return out


# --------------------------------------------------------------------------
# Keras variable path <-> checkpoint key

_BLOCK_RE = re.compile(r"^encoder_block_(\d+)/(.*)$")
_BLOCK_MAP = {
    "norm_1/gamma": "LayerNorm_0/scale",
    "norm_1/beta": "LayerNorm_0/bias",
    "norm_2/gamma": "LayerNorm_2/scale",
    "norm_2/beta": "LayerNorm_2/bias",
    "mlp/dense_0/kernel": "MlpBlock_3/Dense_0/kernel",
    "mlp/dense_0/bias": "MlpBlock_3/Dense_0/bias",
    "mlp/dense_1/kernel": "MlpBlock_3/Dense_1/kernel",
    "mlp/dense_1/bias": "MlpBlock_3/Dense_1/bias",
}
for _n in ("query", "key", "value", "out"):
    for _p in ("kernel", "bias"):
        _BLOCK_MAP[f"attention/{_n}/{_p}"] = (
            f"MultiHeadDotProductAttention_1/{_n}/{_p}")
# The ViT family's block weights (no official checkpoint has them; the
# keys follow the official naming): layer scale, q/k LayerNorms.
_BLOCK_MAP["layer_scale_1"] = "LayerScale_0/scale"
_BLOCK_MAP["layer_scale_2"] = "LayerScale_2/scale"
for _n in ("query_norm", "key_norm"):
    for _p, _q in (("gamma", "scale"), ("beta", "bias")):
        _BLOCK_MAP[f"attention/{_n}/{_p}"] = (
            f"MultiHeadDotProductAttention_1/{_n}/{_q}")
_TOP_MAP = {
    "patch_embedding/conv/kernel": "embedding/kernel",
    "patch_embedding/conv/bias": "embedding/bias",
    "class_token/cls": "cls",
    "position_embedding/pos_embedding": "Transformer/posembed_input/pos_embedding",
    "encoder_norm/gamma": "Transformer/encoder_norm/scale",
    "encoder_norm/beta": "Transformer/encoder_norm/bias",
    "pre_logits/kernel": "pre_logits/kernel",
    "pre_logits/bias": "pre_logits/bias",
    "head/kernel": "head/kernel",
    "head/bias": "head/bias",
    # The ViT family's: register tokens, CLIP's norm before the blocks, the
    # norm after average pooling.
    "register_tokens/registers": "reg",
    # DeiT's distillation token and its head.
    "distillation_token/registers": "dist",
    "head_dist/kernel": "head_dist/kernel",
    "head_dist/bias": "head_dist/bias",
    "pre_norm/gamma": "Transformer/pre_norm/scale",
    "pre_norm/beta": "Transformer/pre_norm/bias",
    "fc_norm/gamma": "fc_norm/scale",
    "fc_norm/beta": "fc_norm/bias",
}

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# The position-embedding ablations (vit(position_embedding=...)): the stem or
# shared table under posembed_input, a per-layer one inside its block.
_POSEMB_RE = re.compile(
    r"^position_embedding(?:_(\d+))?/(pos_embedding(?:_[xy])?|rel_embedding)$")

# The hybrids' ResNet (vit_jax models_resnet): unprefixed keys.
_UNIT_RE = re.compile(r"^resnet_block(\d+)_unit(\d+)/(conv\w+|gn\w+)/(\w+)$")
_GN_PARAM = {"gamma": "scale", "beta": "bias"}
_GN_KEY_RE = re.compile(r"(^|/)gn_?\w*/(scale|bias)$")


def checkpoint_key(variable_path: str) -> str | None:
    """Maps a Keras variable path of a ViT or hybrid to its checkpoint key."""
    if variable_path in _TOP_MAP:
        return _TOP_MAP[variable_path]
    m = _POSEMB_RE.match(variable_path)
    if m:
        block, name = m.groups()
        where = ("posembed_input" if block is None else
                 f"encoderblock_{block}/posembed_input")
        return f"Transformer/{where}/{name}"
    m = _BLOCK_RE.match(variable_path)
    if m and m.group(2) in _BLOCK_MAP:
        return f"Transformer/encoderblock_{m.group(1)}/{_BLOCK_MAP[m.group(2)]}"
    if variable_path == "resnet_root_conv/kernel":
        return "conv_root/kernel"
    if variable_path.startswith("resnet_root_norm/"):
        param = _GN_PARAM.get(variable_path.split("/")[1])
        return f"gn_root/{param}" if param else None
    m = _UNIT_RE.match(variable_path)
    if m:
        stage, unit, layer, param = m.groups()
        if layer.startswith("gn"):
            param = _GN_PARAM.get(param)
        elif param != "kernel":
            param = None
        if param:
            return f"block{stage}/unit{unit}/{layer}/{param}"
    return None


def check_model(model, argument="model"):
    """``model`` if it is a Keras model, else a TypeError naming
    ``argument`` and echoing the value (not an AttributeError from deep
    inside a loader)."""
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"{argument} must be a keras.Model; received "
                        f"{argument}={model!r}"[:300])
    return model


def _check_plain(model, layout):
    """The checkpoint layouts hold one float kernel per projection: a model
    quantized by Keras or carrying LoRA adapters is refused in one line
    that says how to get that model (rather than as unknown weights)."""
    from keras_vit.runtime import compat

    layers = compat.flatten_layers(model)
    modes = sorted({layer.quantization_mode for layer in layers
                    if getattr(layer, "quantization_mode", None)})
    if modes:
        raise CheckpointError(
            f"model={model.name!r} is quantized by Keras (mode="
            f"{'/'.join(modes)}); the {layout} layout holds float weights: "
            "convert the float model, then quantize after loading")
    if any(getattr(layer, "lora_enabled", False) for layer in layers):
        raise CheckpointError(
            f"model={model.name!r} has LoRA adapters; the {layout} layout "
            "holds plain kernels: keras_vit.models.lora.merge(model) returns "
            "the model with the adapters merged into them")


def model_variables(model, key_fn=None, layout="ViT") -> dict:
    """``{checkpoint key: keras Variable}`` for every weight of a model.

    ``key_fn`` maps a Keras variable path to a checkpoint key (default: the
    ViT/hybrid layout). Raises if a weight has no checkpoint equivalent, so
    that a model this module does not understand is never half loaded.
    """
    check_model(model)
    key_fn = key_fn or checkpoint_key
    _check_plain(model, layout)
    out = {}
    unknown = []
    for v in model.weights:
        key = key_fn(v.path)
        if key is None:
            unknown.append(v.path)
        else:
            out[key] = v
    if unknown:
        raise CheckpointError(
            f"model={model.name!r} has weights with no {layout} checkpoint "
            f"equivalent: {unknown[:10]}")
    return out


def export_arrays(model) -> dict:
    """The model's weights as ``{checkpoint key: array}`` (official layout)."""
    return {k: np.asarray(v.numpy()) for k, v in model_variables(model).items()}


def save_npz(model, path):
    """Writes the model's weights as an official-layout ``.npz``, atomically."""
    check_model(model)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"path={path!r} is a directory; pass a file name, e.g. "
            f"{os.path.join(path, 'weights.npz')!r}")
    with atomic.atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **export_arrays(model))
    return path


# --------------------------------------------------------------------------
# Position-embedding resize


def _linear_resize_axis(x, new_len, axis):
    """Linear interpolation along one axis with aligned corners.

    This is what ``scipy.ndimage.zoom(order=1)`` does (its default
    ``grid_mode=False`` maps the first and last samples onto each other).
    """
    old_len = x.shape[axis]
    if new_len == old_len:
        return x
    if old_len == 1:
        return np.repeat(x, new_len, axis=axis)
    if new_len == 1:
        coords = np.zeros(1)
    else:
        coords = np.arange(new_len) * ((old_len - 1) / (new_len - 1))
    lo = np.clip(np.floor(coords).astype(int), 0, old_len - 2)
    frac = coords - lo
    shape = [1] * x.ndim
    shape[axis] = new_len
    frac = frac.reshape(shape)
    a = np.take(x, lo, axis=axis)
    b = np.take(x, lo + 1, axis=axis)
    return a * (1.0 - frac) + b * frac


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
    g = grid.reshape(old_grid[0], old_grid[1], -1).astype(np.float64)
    g = _linear_resize_axis(g, new_grid[0], 0)
    g = _linear_resize_axis(g, new_grid[1], 1)
    g = g.reshape(new_grid[0] * new_grid[1], -1).astype(posemb.dtype)
    return np.concatenate([prefix, g], axis=0)[None]


def resize_posemb_axis(table, new_len):
    """Resizes one axis table (len, D/2) of ``position_embedding="learned_2d"``
    by linear interpolation with aligned corners, the 1D case of
    :func:`resize_posemb`."""
    table = np.asarray(table)
    if table.ndim != 2:
        raise CheckpointError(
            "a learned_2d axis table must have shape (len, D/2); received "
            f"shape={table.shape}")
    return _linear_resize_axis(table.astype(np.float64), int(new_len),
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


def _fit_position_tables(model, arrays, targets, report, problems,
                         source_grid=None):
    """Resizes every position table of the checkpoint to the model's grid.

    A 1D table is resized whenever its grid differs from the model's, also
    when both hold as many tokens (a 4x4 table into an 8x2 model): the rows
    would otherwise land on the wrong patches. The checkpoint's grid is
    ``source_grid`` when known (a model being copied), else square (every
    released checkpoint is)."""
    for layer in model.layers:
        kind = getattr(layer, "kind", None)
        if not layer.name.startswith("position_embedding") or kind is None:
            continue
        for var in layer.weights:
            key = checkpoint_key(var.path)
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
                problems.append(f"{key} (position_embedding={kind!r}, "
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


def _position_hint(model, keys):
    """Names the model's position embedding when its keys are the problem."""
    if not any("posembed" in k for k in keys):
        return None
    kind = getattr(model, "position_embedding", "learned_1d")
    placement = getattr(model, "position_embedding_placement", "stem")
    return (f"position embeddings differ: the model has position_embedding="
            f"{kind!r}, position_embedding_placement={placement!r}; build it "
            "with the checkpoint's kind and placement (a table of one kind "
            "does not convert into another)")


# --------------------------------------------------------------------------
# Loading


def _source_arrays(source):
    if isinstance(source, dict):
        return dict(source)
    return read_npz(source, lazy=True)


def _describe(source):
    return "<arrays>" if isinstance(source, dict) else repr(os.fspath(source))


def load_weights(model, source, *, keep_pre_logits=None, source_name=None,
                 source_grid=None):
    """Loads an official-layout checkpoint into a model, strictly.

    Args:
        model: a model built by :func:`keras_vit.models.vit` (any resolution).
        source: path to a ``.npz`` or a ``{key: array}`` dict. (To load from
            a URL, use :func:`keras_vit.zoo.load_weights`, which downloads.)
        keep_pre_logits: only matters when the head is replaced: the
            checkpoint's ``pre_logits`` layer is dropped unless this is True
            and the model has one.
        source_name: how errors name the source (default: its path).
        source_grid: the (rows, cols) patch grid of the source's position
            table, when it is not square (a copied model's); released
            checkpoints are square.

    Rules:
        * position embeddings of another grid are resized
          (:func:`resize_posemb`);
        * a head of another ``num_classes`` is replaced by zeros (paper
          section 3.2), and then ``pre_logits`` is dropped unless asked for;
        * a model without a head (``include_top=False``) ignores the
          checkpoint's head;
        * anything else missing, unexpected or mis-shaped is an error that
          lists every problem at once.

    Returns:
        A dict report: ``{"resized_posemb": (old, new) or None,
        "head": "loaded" | "replaced" | "dropped", "pre_logits": ...}``.
    """
    targets = model_variables(model)
    depth = len({k.split("/")[1] for k in targets
                 if k.startswith("Transformer/encoderblock_")})
    arrays = normalize_keys(_source_arrays(source), max_blocks=depth)
    report = {"resized_posemb": None, "head": None, "pre_logits": None}

    has_head_ckpt = "head/kernel" in arrays
    has_head_model = "head/kernel" in targets
    head_replaced = False
    if has_head_model and has_head_ckpt:
        if tuple(arrays["head/kernel"].shape[-1:]) != tuple(
                targets["head/kernel"].shape[-1:]):
            head_replaced = True
    elif has_head_model:
        # A headless (feature) checkpoint: the model's head starts at zero,
        # as a new fine-tuning head does.
        head_replaced = True
    # DeiT's second head (head_dist) goes with the head.
    head_keys = ("head/kernel", "head/bias", "head_dist/kernel",
                 "head_dist/bias")
    if has_head_ckpt and not has_head_model:
        for key in head_keys:
            arrays.pop(key, None)
        report["head"] = "dropped"
    if head_replaced:
        for key in head_keys:
            arrays.pop(key, None)
        report["head"] = "replaced"
    elif has_head_model and has_head_ckpt:
        report["head"] = "loaded"

    # pre_logits: a checkpoint may carry one the model does not want.
    if "pre_logits/kernel" in arrays and "pre_logits/kernel" not in targets:
        if head_replaced or not has_head_model:
            arrays.pop("pre_logits/kernel")
            arrays.pop("pre_logits/bias", None)
            report["pre_logits"] = "dropped"
    elif "pre_logits/kernel" in arrays and head_replaced and (
            keep_pre_logits is False):
        raise CheckpointError(
            "keep_pre_logits=False but the model has a pre_logits layer; "
            "build it with representation_size=None")
    if "pre_logits/kernel" in targets and "pre_logits/kernel" in arrays:
        report["pre_logits"] = "loaded"

    problems = []
    missing = [k for k in targets if k not in arrays
               and not (head_replaced and k in head_keys)]
    unexpected = [k for k in arrays if k not in targets]

    # Position embeddings: resize when only the grid differs.
    _fit_position_tables(model, arrays, targets, report, problems,
                         source_grid)

    mis_shaped = []
    for key, var in targets.items():
        if key in arrays and tuple(arrays[key].shape) != tuple(var.shape):
            mis_shaped.append(
                f"{key}: checkpoint {tuple(arrays[key].shape)} vs model "
                f"{tuple(var.shape)}")
    def blocks(keys):
        return {int(m.group(1)) for k in keys
                if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}

    if blocks(arrays) != blocks(targets):
        problems.append(f"encoder blocks: checkpoint {len(blocks(arrays))}, "
                        f"model {len(blocks(targets))}")
    if missing:
        problems.append(f"missing from the checkpoint ({len(missing)}): "
                        + ", ".join(missing[:20])
                        + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        problems.append(f"unexpected in the checkpoint ({len(unexpected)}): "
                        + ", ".join(unexpected[:20])
                        + (" ..." if len(unexpected) > 20 else ""))
    if mis_shaped:
        problems.append(f"mis-shaped ({len(mis_shaped)}): "
                        + "; ".join(mis_shaped[:20])
                        + (" ..." if len(mis_shaped) > 20 else ""))
    hint = _position_hint(model, missing + unexpected)
    if hint:
        problems.append(hint)
    if problems:
        raise CheckpointError(
            f"The checkpoint source={source_name or _describe(source)} does "
            f"not fit model={model.name!r} (is it another architecture?):\n  "
            + "\n  ".join(problems))

    assign_all([(var, None if head_replaced and key in head_keys
                  else arrays[key]) for key, var in targets.items()],
               source_name or _describe(source))
    return report
