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

import logging
import os
import re
import zipfile

import numpy as np

from keras_vit.base import archives, atomic
# Stacked (scanned) checkpoints hold one row per encoder block; no ViT has
# more than this many, whatever a file's header declares.
from keras_vit.base.limits import MAX_LAYERS as MAX_BLOCKS
from keras_vit.zoo import checkpoints
from keras_vit.zoo.official import npz as lazy_npz
from keras_vit.zoo.checkpoints import (CheckpointError, as_array, assign_all,
                                       check_model)
from keras_vit.zoo.position_tables import fit_position_tables

logger = logging.getLogger("keras_vit.zoo")


# --------------------------------------------------------------------------
# Reading


def read_npz(path, lazy=False) -> dict:
    """Reads a flat ``.npz`` checkpoint into ``{key: array}``.

    Never unpickles (``allow_pickle=False``); a corrupt or truncated file
    raises :class:`CheckpointError` naming the path. ``lazy=True`` reads
    only the headers and returns :class:`~keras_vit.zoo.official.npz.LazyArray`
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

    # The blocks' numbering tells (a MAP head's attention is "_0" in both).
    new_style = any(k.startswith("Transformer/encoderblock_")
                    and "MultiHeadDotProductAttention_0" in k for k in out)
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
    # The norm after the patch embedding (patch_norm=True, AIMv2).
    "patch_embedding/norm/gamma": "embedding_norm/scale",
    "patch_embedding/norm/beta": "embedding_norm/bias",
}

# The multihead attention-pool head (classifier="map", the layer named
# "pooling"): big_vision's MAPHead names.
MAP_HEAD = "MAPHead_0/"
_TOP_MAP["pooling/probe"] = MAP_HEAD + "probe"
for _n in ("query", "key", "value", "out"):
    for _p in ("kernel", "bias"):
        _TOP_MAP[f"pooling/{_n}/{_p}"] = (
            f"{MAP_HEAD}MultiHeadDotProductAttention_0/{_n}/{_p}")
for _p, _q in (("gamma", "scale"), ("beta", "bias")):
    _TOP_MAP[f"pooling/norm/{_p}"] = f"{MAP_HEAD}LayerNorm_0/{_q}"
for _i in (0, 1):
    for _p in ("kernel", "bias"):
        _TOP_MAP[f"pooling/mlp/dense_{_i}/{_p}"] = (
            f"{MAP_HEAD}MlpBlock_0/Dense_{_i}/{_p}")

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
#: An encoder block's key in the official layout: groups (block number,
#: the parameter's path inside the block). Every reader and writer of
#: another layout matches block keys with it.
BLOCK_KEY = re.compile(r"^Transformer/encoderblock_(\d+)/(.+)$")
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


def model_variables(model) -> dict:
    """``{checkpoint key: keras Variable}`` for every weight of a ViT or
    hybrid (:func:`checkpoint_key`); raises for a weight with no official
    equivalent."""
    return checkpoints.model_variables(model, checkpoint_key, "ViT")


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


def _returns_tokens(model):
    """True for a model built without a head or pooling (all tokens)."""
    config = model.get_config() if hasattr(model, "get_config") else {}
    return (isinstance(config, dict) and not config.get("include_top", True)
            and config.get("pooling") is None)


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
          (:func:`keras_vit.zoo.position_tables.resize_posemb`);
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

    # A model that returns the tokens ignores an attention-pool head (part
    # of the head, as pre_logits is) where it has none of its own.
    if not any(k.startswith(MAP_HEAD) for k in targets) and (
            _returns_tokens(model)):
        pool = [k for k in arrays if k.startswith(MAP_HEAD)]
        for key in pool:
            arrays.pop(key)
        if pool:
            report["attention_pool"] = "dropped"

    problems = []
    missing = [k for k in targets if k not in arrays
               and not (head_replaced and k in head_keys)]
    unexpected = [k for k in arrays if k not in targets]

    # Position embeddings: resize when only the grid differs.
    fit_position_tables(model, arrays, targets, checkpoint_key, report,
                        problems, source_grid)

    mis_shaped = []
    for key, var in targets.items():
        if key in arrays and tuple(arrays[key].shape) != tuple(var.shape):
            mis_shaped.append(
                f"{key}: checkpoint {tuple(arrays[key].shape)} vs model "
                f"{tuple(var.shape)}")
    def blocks(keys):
        return {int(m.group(1)) for k in keys
                if (m := BLOCK_KEY.match(k))}

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
