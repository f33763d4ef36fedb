"""timm's EVA model (``eva.py``: DINOv3, EVA-02, Perception Encoder, ...),
BEiT (``beit.py``, EVA's ancestor, the same names) and Qwen's vision
towers (``qwen3_vit.py``, EVA's blocks) as keras_vit's ViT: its
arguments mapped onto the builder's, each at a value keras_vit computes
or refused in one line naming it.

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

import functools

import numpy as np

from keras_vit.base import geometry
from keras_vit.base.checks import shown
from keras_vit.base.options import ROPE_HALVES, optional_grid
from keras_vit.zoo import formats, layouts
from keras_vit.zoo.timm import arguments
from keras_vit.zoo.timm.arguments import (optional_positive_arg as
                                          _optional_positive,
                                          positive_arg as _positive,
                                          rate_arg as _rate, norm_arg)

# EVA's settings keras_vit computes at one value only, and what another
# builds.
_WHAT = {"num_kv_heads": "grouped queries",
         "patch_drop_rate": "patch dropout"}
_FIXED = {
    key: (value, _WHAT.get(key, f"something else than {key}={value!r}"))
    for key, value in {
        "num_kv_heads": None, "attn_only_layer_scale": False,
        "dynamic_img_pad": False, "patch_drop_rate": 0.0,
        "rope_shift_coords": None, "rope_jitter_coords": None,
        "rope_rescale_coords": None, "rope_mrope_section": None}.items()}
# timm's rope_type -> keras_vit's rope.
_ROPE = {"dinov3": "dinov3", "cat": "eva02", "mixed": "mixed"}
# timm's EVA poolings -> keras_vit's classifier.
_POOLS = {"avg": "gap", "token": "token", "avgmax": "avgmax", "max": "max",
          "map": "map"}
# The other EVA arguments this reader reads, or that the hub reader and
# the file decide: any other is refused, never ignored.
_READ = (
    "global_pool", "class_token", "num_reg_tokens", "no_embed_class",
    "qkv_bias", "qk_norm", "use_pre_transformer_norm", "use_fc_norm",
    "use_post_transformer_norm", "norm_layer", "init_values",
    "use_abs_pos_emb", "use_rot_pos_emb", "rope_type", "rope_rotate_half",
    "rope_temperature", "ref_feat_shape", "rope_grid_offset",
    "rope_grid_indexing", "attn_type", "scale_mlp", "scale_attn_inner",
    "dynamic_img_size", "mlp_ratio", "swiglu_mlp", "swiglu_align_to",
    "attn_pool_num_heads", "attn_pool_mlp_ratio", "use_rel_pos_bias",
    "use_shared_rel_pos_bias", "use_post_norm", "pos_drop_rate",
    "img_size", "in_chans", "num_classes", "qkv_fused")

# The checks of timm's ViT arguments, shared.
_flag, _count = arguments.bool_arg, arguments.count_arg
_choice, _or_default = arguments.choice_arg, arguments.or_default


def _finite(value):
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not np.isfinite(value)):
        raise ValueError("it is not a finite number")
    return float(value)


def honoured(args, path):
    """keras_vit's builder arguments of timm's EVA arguments ``args``,
    each refused where keras_vit's model would compute something else: a
    FormatError naming ``path``'s field, the argument and its value."""
    refuse, read, out = arguments.module_reader(
        args, path, "a timm EVA", _FIXED, _READ, closest=False)
    read("pos_drop_rate", _rate, 0.0)
    pool = read("global_pool", _choice(_POOLS, "it pools by"), "avg")
    out["classifier"] = pool
    out["class_token"] = read("class_token", _flag, True)
    out["num_registers"] = read("num_reg_tokens", _count, 0)
    out["posemb_includes_prefix"] = not read("no_embed_class", _flag, False)
    out["qkv_bias"] = read("qkv_bias", _flag, True)
    out["qk_norm"] = read("qk_norm", _flag, False)
    out["pre_norm"] = read("use_pre_transformer_norm", _flag, False)
    out["patch_bias"] = not out["pre_norm"]
    fc_norm = read("use_fc_norm", _or_default(_flag, pool == "gap"), None)
    post = read("use_post_transformer_norm",
                _or_default(_flag, not fc_norm), None)
    if fc_norm and post:
        raise refuse("use_post_transformer_norm", "keras_vit has one final "
                     "norm, before the pooling or after it")
    out["fc_norm"], out["final_norm"] = fc_norm, fc_norm or post
    kind, out["layer_norm_epsilon"] = read(
        "norm_layer", norm_arg, {"layer": "LayerNorm", "eps": 1e-6})
    if kind != "layer":
        out["norm"] = kind
    out["layer_scale"] = read("init_values", _optional_positive, None)
    out["position_embedding"] = ("learned_1d" if read(
        "use_abs_pos_emb", _flag, True) else "none")
    if read("use_rot_pos_emb", _flag, False):
        out["rope"] = read("rope_type", _choice(
            _ROPE, "of timm's rotary forms it computes"), "cat")
        halves = read("rope_rotate_half", _flag, False)
        if halves != ROPE_HALVES[out["rope"]]:
            out["rope_halves"] = halves
        out["rope_temperature"] = read("rope_temperature", _positive, 1e4)
        if out["rope"] == "eva02":  # DINOv3's ignores it, as timm's does
            out["rope_grid"] = read("ref_feat_shape", functools.partial(
                optional_grid, "ref_feat_shape"), None)
        out["rope_offset"] = read("rope_grid_offset", _finite, 0.0)
        out["rope_indexing"] = read("rope_grid_indexing", _choice(
            ("ij", "xy"), "it indexes the grid by"), "ij")
    read("attn_type", _choice(("eva", "rope"),
                              "it builds the attention"), "eva")
    # BEiT's relative position bias (timm's Beit shares EVA's names).
    if read("use_shared_rel_pos_bias", _flag, False):
        out["relative_bias"] = "shared"
    elif read("use_rel_pos_bias", _flag, False):
        out["relative_bias"] = "block"
    out["post_norm"] = read("use_post_norm", _flag, False)
    out["mlp_norm"] = read("scale_mlp", _flag, False)
    out["attention_norm"] = read("scale_attn_inner", _flag, False)
    out["dynamic_image_size"] = read("dynamic_img_size", _flag, False)
    ratio = read("mlp_ratio", _positive, 4.0)
    width = int(out["hidden_size"] * ratio)
    if pool == "map":  # Eva's attention pool reads every token
        out["pool_prefix"] = True
        out["pool_heads"] = read("attn_pool_num_heads",
                                 _or_default(_count, None), None)
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


# Qwen's vision towers' arguments: each is read or refused by name.
_QWEN = ("embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size",
         "img_size", "in_chans", "num_classes", "global_pool",
         "encoder_pool", "out_features", "merge_size", "pos_embed_grid_size",
         "rope_temperature", "norm_eps", "act_layer", "final_norm",
         "drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate")


def qwen_honoured(args, path, state):
    """``(builder arguments, tokens)`` of a timm Qwen vision tower
    (``qwen3_vit.py``) with arguments ``args`` and weights ``state``:
    EVA's blocks with a learned table and EVA-02's rotary coordinates, and
    the merger of ``merge_size`` patches where the tower has it
    (``tokens`` True: the encoder returns the merger's tokens).

    >>> out, tokens = qwen_honoured({"embed_dim": 64, "depth": 2,
    ...     "num_heads": 4, "mlp_ratio": 4.0, "patch_size": 16,
    ...     "global_pool": "avg", "encoder_pool": "", "final_norm": True},
    ...     "config.json", {})
    >>> [out[k] for k in ("rope", "rope_halves", "class_token", "fc_norm")]
    ['eva02', True, False, True]
    """
    def refuse(key, why):
        return formats.fail(path, f"model_args.{key}", f"{key}="
                            f"{shown(args.get(key), 60)} is a setting of "
                            f"timm's Qwen towers keras_vit cannot honour "
                            f"({why})")

    for key in args:
        if key not in _QWEN:
            raise refuse(key, "an argument keras_vit's reader does not "
                         "know, so cannot say what it computes")
    classifier = "encoder_pool" in args
    merger = args.get("encoder_pool" if classifier else "global_pool",
                      "merge") == "merge"
    pool = args.get("global_pool")
    if classifier and pool != "avg" or pool not in ("avg", "merge", ""):
        raise refuse("global_pool", "keras_vit pools the tokens' mean")
    if args.get("act_layer") is not None:
        raise refuse("act_layer", "keras_vit builds Qwen's tanh GELU")
    norm = classifier and args.get("final_norm", True)
    eva_args = {key: args[key] for key in (
        *arguments.MODULE_SIZES, "mlp_ratio", "rope_temperature", "img_size",
        "in_chans", *arguments.MODULE_DROPS) if key in args}
    eva_args.update(
        class_token=False, global_pool="avg", use_fc_norm=norm,
        use_post_transformer_norm=False, qkv_bias=True,
        norm_layer={"layer": "LayerNorm", "eps": args.get("norm_eps",
                                                          1e-6)},
        use_abs_pos_emb=True, use_rot_pos_emb=True, rope_type="cat",
        rope_rotate_half=True, attn_type="rope",
        dynamic_img_size=True)
    # Its table is resized bilinearly with aligned corners.
    out = dict(honoured(eva_args, path), gelu="tanh",
               position_resize="bilinear_corners")
    if merger:
        out["merge_size"] = read_merge(args, path)
        fc2 = next((v for k, v in state.items()
                    if k.endswith("merger.fc2.weight")), None)
        out["merge_width"] = None if fc2 is None else int(fc2.shape[0])
    return out, not classifier and pool in ("merge", "")


def read_merge(args, path):
    """The merger's block side, timm's ``merge_size``: a count of 2 or
    more, or the one line naming it."""
    value = args.get("merge_size", 2)
    if (not isinstance(value, int) or isinstance(value, bool)
            or value < 2):
        raise formats.fail(path, "model_args.merge_size", "merge_size="
                           f"{shown(value, 60)} is not a block side of 2 "
                           "or more")
    return value


def qwen_state(state, honoured):
    """A Qwen tower's ``state`` under EVA's names: the classifier's
    ``encoder.`` taken off, and its norm after the pooling (no scale or
    bias in timm's) as ones and zeros."""
    out = {key.removeprefix("encoder."): value
           for key, value in state.items()}
    if honoured["fc_norm"]:
        width = (geometry.merged_widths(honoured)[1],)
        out = layouts.with_zeros(out, {"fc_norm.bias": width})
        out.setdefault("fc_norm.weight", np.ones(width, "float32"))
    return out


def with_key_biases(state):
    """timm's EVA ``state`` with each block's key bias, zeros, beside its
    query and value biases (EVA projects the keys without a bias)."""
    zeros = {}
    for key, value in state.items():
        for query, bias in ((".attn.q_bias", ".attn.k_bias"),
                            (".attn.q_proj.bias", ".attn.k_proj.bias")):
            if key.endswith(query):
                zeros[key[:-len(query)] + bias] = np.shape(value)
    return layouts.with_zeros(state, zeros)
