"""timm's EVA model (``eva.py``: DINOv3, EVA-02, Perception Encoder, ...)
as keras_vit's ViT: its arguments mapped onto the builder's, each at a
value keras_vit computes or refused in one line naming it.

timm's ``Eva`` is the ViT with other names and defaults (average pooling,
biases on the query and value only, layer scales ``gamma_1``/``gamma_2``)
and options of its own: rotary embeddings, SwiGLU MLPs, norms inside
attention and MLP, post-norm blocks. The table of timm's architectures
(:mod:`keras_vit.zoo.timm.arguments`) holds every argument of an EVA
architecture, its function's and ``Eva``'s defaults, so each is read here.

>>> args = {"embed_dim": 64, "depth": 2, "num_heads": 4, "patch_size": 16,
...         "mlp_ratio": 4.0, "global_pool": "avg", "use_fc_norm": False,
...         "use_abs_pos_emb": False, "use_rot_pos_emb": True,
...         "rope_type": "dinov3", "rope_rotate_half": True,
...         "rope_temperature": 100, "num_reg_tokens": 4}
>>> out = honoured(args, "config.json")
>>> [out[k] for k in ("rope", "num_registers", "position_embedding",
...                   "classifier", "mlp_dim")]
['dinov3', 4, 'none', 'gap', 256]
"""

from __future__ import annotations

import numpy as np

from keras_vit.base.checks import shown
from keras_vit.base.options import optional_grid
from keras_vit.zoo import formats, layouts
from keras_vit.zoo.timm import arguments
from keras_vit.zoo.timm.arguments import norm_arg

# EVA's settings that keras_vit's model computes only at one value:
# timm's argument -> that value (None included).
_FIXED = {
    "num_kv_heads": None, "attn_only_layer_scale": False,
    "use_post_norm": False, "dynamic_img_pad": False,
    "patch_drop_rate": 0.0, "rope_shift_coords": None,
    "rope_jitter_coords": None, "rope_rescale_coords": None,
    "rope_mrope_section": None,
}
# What each of those is, for the refusal.
_WHAT = {
    "use_post_norm": "post-norm blocks", "num_kv_heads":
    "grouped queries", "patch_drop_rate": "patch dropout",
}
# The rotary forms keras_vit computes: timm's rope_type -> keras_vit's,
# and the pairs of features each turns (timm's rope_rotate_half).
_ROPE = {"dinov3": "dinov3", "cat": "eva02"}
_HALVES = {"dinov3": True, "eva02": False}
# timm's EVA poolings -> keras_vit's classifier.
_POOLS = {"avg": "gap", "token": "token", "avgmax": "avgmax", "max": "max",
          "map": "map"}
# Sizes, as the ViT reader reads them.
_SIZES = {"patch_size": "patch_size", "embed_dim": "hidden_size",
          "depth": "num_layers", "num_heads": "num_heads"}
_DROPS = {"drop_rate": "dropout_rate", "proj_drop_rate": "dropout_rate",
          "attn_drop_rate": "attention_dropout_rate",
          "drop_path_rate": "drop_path_rate", "pos_drop_rate": None}


# The other EVA arguments this reader reads (below), or that the hub
# reader and the file decide (img_size; qkv_fused: the layout reads the
# projections either way): any other is refused, never ignored.
_READ = (
    "global_pool", "class_token", "num_reg_tokens", "no_embed_class",
    "qkv_bias", "qk_norm", "use_pre_transformer_norm", "use_fc_norm",
    "use_post_transformer_norm", "norm_layer", "init_values",
    "use_abs_pos_emb", "use_rot_pos_emb", "rope_type", "rope_rotate_half",
    "rope_temperature", "ref_feat_shape", "rope_grid_offset",
    "rope_grid_indexing", "attn_type", "scale_mlp", "scale_attn_inner",
    "dynamic_img_size", "mlp_ratio", "swiglu_mlp", "swiglu_align_to",
    "attn_pool_num_heads", "attn_pool_mlp_ratio",
    "img_size", "in_chans", "num_classes", "qkv_fused")

# The checks of timm's ViT arguments, shared.
_flag, _count = arguments.bool_arg, arguments.count_arg


def _rate(value):
    if not arguments.is_rate(value):
        raise ValueError("it is not a rate in [0, 1)")
    return float(value)


def _positive(value):
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not value > 0):
        raise ValueError("it is not a positive number")
    return float(value)


def _optional_count(value):
    return None if value is None else _count(value)


def _optional_positive(value):
    return None if value is None else _positive(value)


def _finite(value):
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not np.isfinite(value)):
        raise ValueError("it is not a finite number")
    return float(value)


def _grid(value):
    return optional_grid("ref_feat_shape", value)


def _choice(table, what):
    def read(value):
        if not isinstance(value, str) or value not in table:
            raise ValueError(f"{what} {', '.join(map(repr, table))}")
        return table[value]
    return read


def honoured(args, path):
    """keras_vit's builder arguments of timm's EVA arguments ``args`` (the
    table's, overridden by a ``config.json``'s ``model_args``), each
    refused where keras_vit's model would compute something else: a
    FormatError naming ``path``'s field, the argument and its value."""

    def refuse(key, why):
        return formats.fail(path, f"model_args.{key}", f"{key}="
                            f"{shown(args.get(key), 60)} is a timm EVA "
                            f"setting keras_vit cannot honour ({why})")

    def read(key, convert, default):
        try:
            return convert(args.get(key, default))
        except ValueError as e:
            raise refuse(key, str(e)) from None

    known = (*_FIXED, *_SIZES, *_DROPS, *_READ)
    for key in args:
        if key not in known:
            raise refuse(key, "an argument keras_vit's reader does not "
                         "know, so cannot say what it computes")
    for key, value in _FIXED.items():
        if key in args and args[key] != value:
            raise refuse(key, "it builds " + _WHAT.get(
                key, f"something else than {key}={value!r}"))
    out = {ours: read(key, _count, None) for key, ours in _SIZES.items()}
    for key, ours in _DROPS.items():
        value = read(key, _rate, 0.0)
        if ours and value:
            out[ours] = value
    pool = read("global_pool", _choice(_POOLS, "it pools by"), "avg")
    out["classifier"] = pool
    out["class_token"] = read("class_token", _flag, True)
    out["num_registers"] = read("num_reg_tokens", _count, 0)
    out["posemb_includes_prefix"] = not read("no_embed_class", _flag, False)
    out["qkv_bias"] = read("qkv_bias", _flag, True)
    out["qk_norm"] = read("qk_norm", _flag, False)
    out["pre_norm"] = read("use_pre_transformer_norm", _flag, False)
    # timm's Eva drops the patch embedding's bias under the norm before
    # the blocks (Perception Encoder's ln_pre).
    out["patch_bias"] = not out["pre_norm"]
    fc_norm = args.get("use_fc_norm")
    fc_norm = pool == "gap" if fc_norm is None else read("use_fc_norm",
                                                         _flag, None)
    post = args.get("use_post_transformer_norm")
    post = not fc_norm if post is None else read(
        "use_post_transformer_norm", _flag, None)
    if fc_norm and post:
        raise refuse("use_post_transformer_norm", "keras_vit has one final "
                     "norm, before the pooling or after it")
    out["fc_norm"], out["final_norm"] = fc_norm, fc_norm or post
    kind, out["layer_norm_epsilon"] = read(
        "norm_layer", norm_arg, {"layer": "LayerNorm", "eps": 1e-6})
    if kind != "layer":
        out["norm"] = kind
    init = args.get("init_values")
    out["layer_scale"] = None if init is None else read("init_values",
                                                         _positive, None)
    out["position_embedding"] = ("learned_1d" if read(
        "use_abs_pos_emb", _flag, True) else "none")
    if read("use_rot_pos_emb", _flag, False):
        out["rope"] = read("rope_type", _choice(
            _ROPE, "of timm's rotary forms it computes"), "cat")
        halves = read("rope_rotate_half", _flag, False)
        if halves != _HALVES[out["rope"]]:
            out["rope_halves"] = halves
        out["rope_temperature"] = read("rope_temperature", _positive, 1e4)
        if out["rope"] == "eva02":  # DINOv3's ignores it, as timm's does
            out["rope_grid"] = read("ref_feat_shape", _grid, None)
        out["rope_offset"] = read("rope_grid_offset", _finite, 0.0)
        out["rope_indexing"] = read("rope_grid_indexing", _choice(
            {"ij": "ij", "xy": "xy"}, "it indexes the grid by"), "ij")
    # timm's RoPE attention (RoPE-ViT, Perception Encoder) is the ViT's:
    # one qkv projection with its biases (the layout reads either).
    read("attn_type", _choice({"eva": "eva", "rope": "rope"},
                              "it builds the attention"), "eva")
    out["mlp_norm"] = read("scale_mlp", _flag, False)
    out["attention_norm"] = read("scale_attn_inner", _flag, False)
    out["dynamic_image_size"] = read("dynamic_img_size", _flag, False)
    ratio = read("mlp_ratio", _positive, 4.0)
    width = int(out["hidden_size"] * ratio)
    if pool == "map":  # Eva's attention pool reads every token
        out["pool_prefix"] = True
        out["pool_heads"] = read("attn_pool_num_heads", _optional_count,
                                 None)
        pool_ratio = read("attn_pool_mlp_ratio", _optional_positive, None)
        if pool_ratio not in (None, ratio):
            raise refuse("attn_pool_mlp_ratio", "keras_vit's attention "
                         f"pool's MLP is the blocks' (mlp_ratio={ratio})")
    out["gelu"] = "exact"  # Eva's blocks: torch's GELU
    out["mlp_dim"] = width
    if read("swiglu_mlp", _flag, False):
        align = read("swiglu_align_to", _count, 0)
        out["mlp"] = "swiglu"
        out["mlp_dim"] = width + (-width % align if align else 0)
    return out


def with_key_biases(state):
    """timm's EVA ``state`` with each block's key bias, zeros, beside its
    query and value biases: EVA projects the keys without a bias (and
    keeps zeros in a buffer no file holds, or has no bias on ``k_proj``),
    where keras_vit's ``qkv_bias`` has one for each."""
    zeros = {}
    for key, value in state.items():
        for query, bias in ((".attn.q_bias", ".attn.k_bias"),
                            (".attn.q_proj.bias", ".attn.k_proj.bias")):
            if key.endswith(query):
                zeros[key[:-len(query)] + bias] = np.shape(value)
    return layouts.with_zeros(state, zeros)
