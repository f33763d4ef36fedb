"""timm's NaFlexVit (``naflexvit.py``: NaFlex ViTs of timm's own training,
SigLIP 2's NaFlex towers) as keras_vit's ViT with the ``naflex`` option:
its arguments (the fields of timm's ``NaFlexVitCfg``) mapped onto the
builder's, each at a value keras_vit computes or refused in one line
naming it and the closest setting keras_vit computes.

timm's ``patches``, ``patch_coord`` and ``patch_valid`` are keras_vit's
``patches``, ``patch_coords`` and ``patch_mask``; the learned table (no
row for the prefix tokens) is resized to each image's grid with the
kernel ``pos_embed_interp_mode`` names.

>>> out = honoured({"patch_size": 16, "embed_dim": 64, "depth": 2,
...                 "num_heads": 4, "mlp_ratio": 4.0, "reg_tokens": 1,
...                 "global_pool": "avg", "fc_norm": True,
...                 "pos_embed_grid_size": [6, 8]}, "config.json")
>>> [out[k] for k in ("naflex", "position_resize", "image_size",
...                   "classifier", "num_registers", "fc_norm")]
[True, 'bicubic_aa', (96, 128), 'gap', 1, True]
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.timm import arguments
from keras_vit.zoo.timm.arguments import (optional_positive_arg as
                                          _optional_positive,
                                          positive_arg as _positive,
                                          rate_arg as _rate)
from keras_vit.zoo.timm.layout import TIMM_ACTIVATIONS, TIMM_POOLS

_choice = arguments.choice_arg

# timm's argument -> (the values keras_vit computes, what the others
# build, the closest setting keras_vit computes).
_FIXED = {
    "pos_embed_use_grid_sample": (
        (False,), "a table sampled at each patch (grid_sample, no "
        "antialiasing)", "pos_embed_use_grid_sample=False"),
    "rope_type": (
        ("", "none"), "rotary embeddings on NaFlex patches (EVA's blocks)",
        "rope_type='' (the learned table alone)"),
    "attn_type": (
        ("standard",), "EVA's attention blocks", "attn_type='standard'"),
    "swiglu_mlp": ((False,), "EVA's blocks with a SwiGLU MLP",
                   "swiglu_mlp=False"),
    "attn_gated": ((False,), "a sigmoid gate on the attention's output",
                   "attn_gated=False"),
    "attn_only_layer_scale": ((False,), "a layer scale on the attention "
                              "branch alone", "attn_only_layer_scale=False"),
    "num_kv_heads": ((None,), "grouped queries", "num_kv_heads=None"),
    "patch_drop_rate": ((0, 0.0), "patch dropout", "patch_drop_rate=0"),
    "patchify_channels_last": (
        (True,), "patches flattened channels first (C, P, P)",
        "patchify_channels_last=True (keras_vit's patches are (P, P, C) "
        "row by row)"),
    "input_norm_layer": ((None,), "a norm of each patch's pixels before "
                         "the projection", "input_norm_layer=None"),
    "block_fn": ((None, "Block"), "another block", "block_fn=None"),
    "mlp_layer": ((None, "Mlp"), "another MLP", "mlp_layer=None"),
    "attn_layer": ((None,), "another attention", "attn_layer=None"),
}
# The settings that change nothing keras_vit's model computes on its
# inputs (initialisation, padding, settings of forms refused above).
_NO_EFFECT = (
    "weight_init", "fix_init", "dynamic_img_pad", "qkv_fused",
    "swiglu_align_to", "enable_patch_interpolator", "use_key_only_attn_mask",
    "rope_temperature", "rope_ref_feat_shape", "rope_grid_offset",
    "rope_grid_indexing", "rope_rotate_half", "rope_shift_coords",
    "rope_jitter_coords", "rope_rescale_coords", "rope_mrope_section",
    "num_classes", "pos_drop_rate")
_SIZES = {"embed_dim": "hidden_size", "depth": "num_layers",
          "num_heads": "num_heads"}
_DROPS = arguments.MODULE_DROPS
_FLAGS = {"qkv_bias": ("qkv_bias", True), "qk_norm": ("qk_norm", False),
          "proj_bias": ("proj_bias", True),
          "scale_mlp_norm": ("mlp_norm", False),
          "scale_attn_inner_norm": ("attention_norm", False),
          "class_token": ("class_token", False),
          "pre_norm": ("pre_norm", False),
          "pool_include_prefix": ("pool_prefix", False)}
_READ = ("patch_size", "mlp_ratio", "img_size", "in_chans", "reg_tokens",
         "init_values", "pos_embed", "pos_embed_grid_size",
         "pos_embed_antialias", "pos_embed_align_corners",
         "pos_embed_ar_preserving",
         "pos_embed_interp_mode", "final_norm", "fc_norm", "global_pool",
         "attn_pool_num_heads", "attn_pool_mlp_ratio", "embed_proj_type",
         "embed_norm_layer", "norm_layer", "act_layer")
#: timm's interpolation modes keras_vit resizes a NaFlex table with.
INTERP_MODES = ("bicubic", "bilinear")
# timm's resize of a NaFlex table (pos_embed_interp_mode,
# pos_embed_antialias, pos_embed_align_corners) -> keras_vit's kernel.
_KERNELS = {("bicubic", True, False): "bicubic_aa",
            ("bilinear", True, False): "bilinear_aa",
            ("bicubic", False, False): "bicubic",
            ("bilinear", False, False): "bilinear",
            ("bilinear", False, True): "bilinear_corners"}


def _side(value):
    """A square patch's side: an int or two equal ints."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and (
            value[0] == value[1]):
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("keras_vit's patches are square: one positive "
                         "side")
    return value


def _grid(value):
    sides = [value] * 2 if isinstance(value, int) else value
    if (not isinstance(sides, (list, tuple)) or len(sides) != 2 or any(
            not isinstance(s, int) or isinstance(s, bool) or s < 1
            for s in sides)):
        raise ValueError("it is not a grid of positive rows and columns")
    return tuple(sides)


def honoured(args, path, given=None):
    """keras_vit's builder arguments of timm's NaFlexVit arguments
    ``args``, each refused where keras_vit's model would compute something
    else: a FormatError naming ``path``'s field (``model_args.<key>`` for
    a key of ``given``, the config's own; ``architecture`` for the
    table's), the argument, its value and the closest setting."""
    refuse, read = arguments.refusing(args, path, "a timm NaFlexVit",
                                      given)
    known = (*_FIXED, *_NO_EFFECT, *_SIZES, *_DROPS, *_FLAGS, *_READ)
    for key in args:
        if key not in known:
            raise refuse(key, "an argument keras_vit's reader does not "
                         "know, so cannot say what it computes")
    kind = args.get("pos_embed", "learned")
    if kind not in ("learned", "none", ""):
        raise refuse("pos_embed", "keras_vit's NaFlex model resizes one "
                     "learned table of the grid, not a factorized row and "
                     "column table; the closest it computes: "
                     "pos_embed='learned'")
    for key, (values, builds, closest) in _FIXED.items():
        if key in args and not any(_same(args[key], v) for v in values):
            raise refuse(key, f"it builds {builds}; the closest keras_vit "
                         f"computes: {closest}")
    out = {ours: read(key, arguments.count_arg, None)
           for key, ours in _SIZES.items()}
    out["patch_size"] = read("patch_size", _side, 16)
    for key, ours in _DROPS.items():
        value = read(key, _rate, 0.0)
        if value:
            out[ours] = value
    for key, (ours, default) in _FLAGS.items():
        out[ours] = read(key, arguments.bool_arg, default)
    out["num_registers"] = read("reg_tokens", arguments.count_arg, 0)
    out["layer_scale"] = read("init_values", _optional_positive, None)
    out["naflex"] = True
    out["num_channels"] = read("in_chans", arguments.count_arg, 3)
    if kind in ("none", ""):
        out["position_embedding"] = "none"
    else:
        out["posemb_includes_prefix"] = False  # no row for the prefix
        mode = read("pos_embed_interp_mode", _choice(
            INTERP_MODES, "keras_vit resizes a NaFlex table by"), "bicubic")
        form = (mode, read("pos_embed_antialias", arguments.bool_arg, True),
                read("pos_embed_align_corners", arguments.bool_arg, False))
        if form not in _KERNELS:
            raise refuse("pos_embed_align_corners" if form[2] else
                         "pos_embed_antialias", "keras_vit resizes a NaFlex "
                         "table with " + ", ".join(
                             f"{m} (antialias={a}, align_corners={c})"
                             for m, a, c in _KERNELS))
        out["position_resize"] = _KERNELS[form]
        out["position_aspect"] = read("pos_embed_ar_preserving",
                                      arguments.bool_arg, False)
    # The table's grid: the model's image size, one patch a cell.
    grid = args.get("pos_embed_grid_size", (16, 16))
    if grid is None:
        grid = read("img_size", _grid_of_size(out["patch_size"]), None)
    else:
        grid = read("pos_embed_grid_size", _grid, None)
    rows, cols = (g * out["patch_size"] for g in grid)
    out["image_size"] = rows if rows == cols else (rows, cols)
    out["patch_bias"] = not out["pre_norm"]
    read("embed_proj_type", _choice(("linear", "conv"),
                                    "it projects the patches by"), "linear")
    pool = read("global_pool", _choice(
        tuple(TIMM_POOLS), "keras_vit pools by (no pooling, '', is not "
        "one of them)"), "map")
    out["classifier"] = TIMM_POOLS[pool]
    if pool == "token" and not out["class_token"]:
        raise refuse("global_pool", "token pooling needs class_token=True")
    fc_norm = read("fc_norm", arguments.or_default(arguments.bool_arg,
                                                   pool == "avg"), None)
    final = read("final_norm", arguments.bool_arg, True)
    if final and fc_norm and pool == "token":
        raise refuse("fc_norm", "keras_vit's norm after the pooling "
                     "follows 'avg', 'max', 'avgmax' or 'map' pooling; the "
                     "closest it computes: fc_norm=False")
    out["fc_norm"], out["final_norm"] = final and fc_norm, final
    kind, out["layer_norm_epsilon"] = read(
        "norm_layer", _norm, None)
    if kind != "layer":
        out["norm"] = kind
    embed_norm = args.get("embed_norm_layer")
    if embed_norm not in (None, ""):
        if read("embed_norm_layer", _norm, None) != (
                kind, out["layer_norm_epsilon"]):
            raise refuse("embed_norm_layer", "keras_vit's patch norm is of "
                         "the kind and epsilon of the model's norm_layer")
        out["patch_norm"] = True
    gelus = _choice(TIMM_ACTIVATIONS, "keras_vit's GELU forms are")
    # None: timm's nn.GELU.
    out["gelu"] = read("act_layer", arguments.or_default(gelus, "exact"), None)
    ratio = read("mlp_ratio", _positive, 4.0)
    out["mlp_dim"] = int(out["hidden_size"] * ratio)  # timm's Mlp
    if pool == "map":
        heads = args.get("attn_pool_num_heads")
        if heads is not None:
            out["pool_heads"] = read("attn_pool_num_heads",
                                     arguments.count_arg, None)
        pool_ratio = read("attn_pool_mlp_ratio", _optional_positive, None)
        if pool_ratio not in (None, ratio):
            raise refuse("attn_pool_mlp_ratio", "keras_vit's attention "
                         f"pool's MLP is the blocks' (mlp_ratio={ratio}); "
                         "the closest it computes: attn_pool_mlp_ratio="
                         "None")
    return out


def _same(value, want):
    """``value`` is ``want``: equal, and a number for a number, a flag
    for a flag (``1 == True`` does not count)."""
    def kind(v):
        return (bool if isinstance(v, bool) else float
                if isinstance(v, (int, float)) else type(v))
    return value == want and kind(value) is kind(want)


def _norm(value):
    """timm's norm (None: its LayerNorm, epsilon 1e-6) -> (kind, eps)."""
    if value is None:
        return "layer", 1e-6
    try:
        return arguments.norm_arg(value)
    except ValueError as e:
        raise ValueError(f"it {e}") from None


def _grid_of_size(patch):
    def read(value):
        if value is None:
            raise ValueError("neither pos_embed_grid_size nor img_size "
                             "gives the table's grid")
        rows, cols = _grid(value)
        return rows // patch, cols // patch
    return read


def naflex_state(state, honoured):
    """timm's NaFlexVit ``state`` under its ViT's names: ``embeds.`` taken
    off, the table's grid as rows, the patch embedding's Linear over (P, P,
    C) patches as the convolution's (D, C, P, P) kernel."""
    out = {}
    for key, value in state.items():
        if key == "embeds.pos_embed":
            value = np.asarray(value)
            value = value.reshape(1, -1, value.shape[-1])
            key = "pos_embed"
        elif key == "embeds.proj.weight" and np.ndim(value) == 2:
            patch = honoured["patch_size"]
            value = np.asarray(value)
            value = value.reshape(value.shape[0], patch, patch,
                                  -1).transpose(0, 3, 1, 2)
            key = "patch_embed.proj.weight"
        elif key.startswith(("embeds.proj.", "embeds.norm.")):
            key = "patch_embed." + key.removeprefix("embeds.")
        elif key in ("embeds.cls_token", "embeds.reg_token"):
            key = key.removeprefix("embeds.")
        out[key] = value
    return out
