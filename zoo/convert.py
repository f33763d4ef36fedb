"""Reading the official ``.npz`` checkpoints and copying them into Keras models.

The released files are flat ``.npz`` archives of '/'-joined Flax paths, in
vit_jax's numbering or big_vision's (rewritten to vit_jax's first).
"""

from __future__ import annotations

import functools
import os
import re
import zipfile

import numpy as np

from keras_vit.base import archives, atomic
from keras_vit.base.checks import check_path
from keras_vit.base.limits import MAX_LAYERS as MAX_BLOCKS
from keras_vit.zoo import checkpoints, layouts
from keras_vit.zoo.checkpoints import CheckpointError, as_array, check_model
from keras_vit.zoo.layouts import Layout, Rule
from keras_vit.zoo.official import npz as lazy_npz


def read_npz(path, lazy=False) -> dict:
    """Reads a flat ``.npz`` checkpoint into ``{key: array}``.

    Never unpickles; a corrupt or truncated file raises
    :class:`CheckpointError` naming the path. ``lazy=True`` returns
    :class:`~keras_vit.zoo.official.npz.LazyArray` values, read when
    converted.
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
        return archives.read_npz(path)  # every header bounded first
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"Could not read the checkpoint path={path!r}: it is not a valid "
            f".npz archive (corrupt or truncated download?). {type(e).__name__}"
            f": {e}") from e


_NEW_TO_OLD_BLOCK = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def normalize_keys(arrays: dict, max_blocks=None) -> dict:
    """Rewrites any released ViT layout to the original vit_jax key names.

    ``max_blocks``: the most encoder blocks a stacked member may declare
    (default :data:`MAX_BLOCKS`).
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
        # GroupNorm parameters are (1, 1, 1, C) in some released hybrids.
        if _GN_KEY_RE.search(key) and out[key].ndim > 1:
            out[key] = out[key].reshape(-1)

    stacked = [k for k in out if k.startswith("Transformer/encoderblock/")]
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

    # The blocks' numbering tells (a MAP head's attention is "_0" in both).
    if any(k.startswith("Transformer/encoderblock_")
           and "MultiHeadDotProductAttention_0" in k for k in out):
        renamed = {}
        for key, value in out.items():
            parts = key.split("/")
            if (len(parts) > 2 and parts[0] == "Transformer"
                    and parts[1].startswith("encoderblock_")):
                parts[2] = _NEW_TO_OLD_BLOCK.get(parts[2], parts[2])
            renamed["/".join(parts)] = value
        out = renamed
    return out


# The official layout's rules.
_ATT = "MultiHeadDotProductAttention_1/"
#: The attention-pool head (``classifier="map"``): big_vision's names.
MAP_HEAD = "MAPHead_0/"
POSEMB_KEY = "Transformer/posembed_input/pos_embedding"


def _pairs(names, path, key):
    """The rules of a layer whose variables ``names`` (model, source)
    are under ``path`` in the model and ``key`` in the source."""
    return [Rule(f"{path}/{p}", f"{key}/{q}") for p, q in names]


_norm = functools.partial(_pairs, (("gamma", "scale"), ("beta", "bias")))
_dense = functools.partial(_pairs, (("kernel", "kernel"), ("bias", "bias")))
_batch_norm = functools.partial(_pairs, (
    ("gamma", "scale"), ("beta", "bias"), ("moving_mean", "mean"),
    ("moving_variance", "var")))


def _attention(path, key):
    return [r for n in ("query", "key", "value", "out")
            for r in _dense(f"{path}/{n}", f"{key}/{n}")]


_BLOCK, _TBLOCK = "encoder_block_{i}/", "Transformer/encoderblock_{i}/"
_UNIT, _OUNIT = "resnet_block{s}_unit{u}/", "block{s}/unit{u}/"
_RULES = [
    *layouts.option_rules("official", _norm, _dense, _dense, _batch_norm),
    *_dense("patch_embedding/conv", "embedding"),
    *[Rule(f"{path}/{n}", f"{key}posembed_input/{n}")
      for path, key in (("position_embedding", "Transformer/"),
                        ("position_embedding_{i}", _TBLOCK))
      for n in ("pos_embedding", "pos_embedding_x", "pos_embedding_y",
                "rel_embedding")],
    *_norm(_BLOCK + "norm_1", _TBLOCK + "LayerNorm_0"),
    *_norm(_BLOCK + "norm_2", _TBLOCK + "LayerNorm_2"),
    *_dense(_BLOCK + "mlp/dense_0", _TBLOCK + "MlpBlock_3/Dense_0"),
    *_dense(_BLOCK + "mlp/dense_1", _TBLOCK + "MlpBlock_3/Dense_1"),
    *_attention(_BLOCK + "attention", _TBLOCK + _ATT[:-1]),
    *_norm("encoder_norm", "Transformer/encoder_norm"),
    *_dense("pre_logits", "pre_logits"),
    *_dense("head", "head"),
    Rule("pooling/probe", MAP_HEAD + "probe"),
    *_attention("pooling", MAP_HEAD + "MultiHeadDotProductAttention_0"),
    *_norm("pooling/norm", MAP_HEAD + "LayerNorm_0"),
    *_dense("pooling/mlp/dense_0", MAP_HEAD + "MlpBlock_0/Dense_0"),
    *_dense("pooling/mlp/dense_1", MAP_HEAD + "MlpBlock_0/Dense_1"),
    # The hybrids' ResNet (vit_jax models_resnet): unprefixed keys.
    Rule("resnet_root_conv/kernel", "conv_root/kernel"),
    *_norm("resnet_root_norm", "gn_root"),
    *[Rule(f"{_UNIT}{c}/kernel", f"{_OUNIT}{c}/kernel")
      for c in ("conv1", "conv2", "conv3", "conv_proj")],
    *[r for g in ("gn1", "gn2", "gn3", "gn_proj")
      for r in _norm(_UNIT + g, _OUNIT + g)],
]
#: The official ``.npz`` layout of a ViT or hybrid.
OFFICIAL = Layout("ViT", _RULES)
_GN_KEY_RE = re.compile(r"(^|/)gn_?\w*/(scale|bias)$")


def checkpoint_key(variable_path: str) -> str | None:
    """Maps a Keras variable path of a ViT or hybrid to its checkpoint key.

    >>> checkpoint_key("encoder_block_3/attention/query/kernel")
    'Transformer/encoderblock_3/MultiHeadDotProductAttention_1/query/kernel'
    """
    return OFFICIAL.key_of(variable_path)


def model_variables(model) -> dict:
    """``{checkpoint key: keras Variable}`` for every weight of a ViT or
    hybrid (:func:`checkpoint_key`); raises for a weight with no official
    equivalent."""
    return {checkpoint_key(path): v for path, v in layouts.variables(
        model, OFFICIAL, skip=()).items()}


def export_arrays(model) -> dict:
    """The model's weights as ``{checkpoint key: array}`` (official layout)."""
    return OFFICIAL.write(layouts.model_arrays(model, OFFICIAL.name))


def official_refusal(model):
    """Why the official layout cannot hold ``model``, in one line, or None
    (timm's ResNet-D has no keys there)."""
    resnet = getattr(model, "get_config", dict)().get("resnet") or {}
    if resnet.get("variant") == "d":
        return ("save_npz writes the official layout, whose hybrids hold "
                "the paper's ResNet (BiT's); model has resnet variant 'd' "
                "(timm's ResNet-D), which it has no keys for: "
                "model.save('model.keras') keeps it")
    return None


def save_npz(model, path):
    """Writes the model's weights as an official-layout ``.npz``, atomically."""
    check_model(model)
    reason = official_refusal(model)
    if reason is not None:
        raise ValueError(reason)
    path = os.fspath(check_path("path", path))
    if not path:
        raise ValueError("path must name a file; received path=''")
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"path={path!r} is a directory; pass a file name, e.g. "
            f"{os.path.join(path, 'weights.npz')!r}")
    with atomic.atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **export_arrays(model))
    return path


def source_arrays(source):
    """``source`` (a dict or an ``.npz`` path) as ``{key: array}``."""
    return dict(source) if isinstance(source, dict) else read_npz(source,
                                                                  lazy=True)


def describe(source):
    """How errors name ``source`` by default."""
    return "<arrays>" if isinstance(source, dict) else repr(os.fspath(source))


def load_weights(model, source, *, keep_pre_logits=None, source_name=None,
                 source_grid=None, fresh_head=True):
    """Loads an official-layout checkpoint into a model, strictly.

    Args:
        model: a model built by :func:`keras_vit.models.vit` (any resolution).
        source: path to a ``.npz`` or a ``{key: array}`` dict.
        keep_pre_logits: when the head is replaced, the checkpoint's
            ``pre_logits`` is dropped unless this is True and the model has
            one.
        source_name: how errors name the source (default: its path).
        source_grid: the (rows, cols) patch grid of the source's position
            table, when it is not square.
        fresh_head: True (a new head asked, as ``to_classifier`` does): a
            checkpoint without a head leaves the model's zero-initialised;
            False (:func:`keras_vit.zoo.load_weights`): refused.

    Position embeddings of another grid are resized; a head of another
    ``num_classes`` is replaced by zeros; a model without a head ignores the
    checkpoint's; anything else missing, unexpected or mis-shaped (a head
    of as many classes in another shape) is one error listing every problem.

    Returns:
        A dict report: ``{"resized_posemb": (old, new) or None,
        "head": "loaded" | "replaced" | "dropped", "pre_logits": ...}``.
    """
    depth = len({m.group(1) for v in checkpoints.check_model(model).weights
                 if (m := re.match(r"encoder_block_(\d+)/", v.path))})
    arrays = normalize_keys(source_arrays(source), max_blocks=depth)
    return layouts.load(model, OFFICIAL, arrays,
                        source_name=source_name or describe(source),
                        keep_pre_logits=keep_pre_logits,
                        source_grid=source_grid, fresh_head=fresh_head)
