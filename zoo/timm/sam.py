"""timm's SAM image encoders (``vision_transformer_sam.py``:
``samvit_*``) as keras_vit's ViT: windowed attention with global blocks
(``window_size``, ``global_blocks``), the decomposed relative positions
(``decomposed_bias``) and the convolutional neck (``neck``), over the
patches alone (no class token), pooled by timm's classifier head.

>>> args = {"patch_size": 16, "embed_dim": 64, "depth": 4, "num_heads": 2,
...         "global_attn_indexes": [1, 3], "window_size": 4,
...         "use_rel_pos": True, "neck_chans": 32,
...         "norm_layer": {"layer": "LayerNorm", "eps": 1e-05}}
>>> out = honoured(args, "config.json")
>>> [out[k] for k in ("window_size", "global_blocks", "neck", "classifier")]
[4, [1, 3], 32, 'gap']
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.timm import arguments

# timm's argument -> (the one value keras_vit computes, what another
# builds).
_FIXED = {
    "embed_layer": ({"layer": "PatchEmbed", "output_fmt": "NHWC",
                     "strict_img_size": False}, "another patch embedding"),
    "act_layer": ("GELU", "another activation than torch's GELU"),
    "block_fn": ("Block", "another block"),
    "mlp_layer": ("Mlp", "another MLP"),
    "use_rope": (False, "rotary embeddings over windows"),
    "ref_feat_shape": (None, "rotary embeddings over windows"),
    "head_hidden_size": (None, "an MLP head (NormMlpClassifierHead)"),
    "patch_drop_rate": (0.0, "patch dropout"),
}
# timm's classifier head's poolings -> keras_vit's classifier.
_POOLS = {"avg": "gap", "max": "max", "avgmax": "avgmax"}
# Read below, decided by the hub reader, or of no effect on the forward.
_READ = ("global_attn_indexes", "window_size", "use_rel_pos", "mlp_ratio",
         "qkv_bias", "qk_norm", "init_values", "pre_norm", "norm_layer",
         "use_abs_pos", "neck_chans", "global_pool", "img_size", "in_chans",
         "num_classes", "weight_init", "pos_drop_rate")


def honoured(args, path):
    """keras_vit's builder arguments of timm's SAM arguments ``args``,
    each refused where keras_vit's model would compute something else: a
    FormatError naming ``path``'s field, the argument and its value."""
    _, read, out = arguments.module_reader(
        args, path, "a timm SAM", _FIXED, _READ)
    window = read("window_size", arguments.count_arg, 14)
    blocks = read("global_attn_indexes", _indices, ())
    neck = read("neck_chans", _neck, 256)
    pool = read("global_pool", arguments.choice_arg(
        _POOLS, "keras_vit pools the neck's map by"), "avg")
    kind, epsilon = read("norm_layer", arguments.norm_arg,
                         {"layer": "LayerNorm", "eps": 1e-5})
    pre_norm = read("pre_norm", arguments.bool_arg, False)
    out.update(
        class_token=False, classifier=pool, final_norm=False,
        window_size=window,
        # timm's global blocks mean nothing without windows.
        global_blocks=[i for i in blocks if i < out["num_layers"]]
        if window else None,
        decomposed_bias=read("use_rel_pos", arguments.bool_arg, False),
        position_embedding="learned_1d" if read(
            "use_abs_pos", arguments.bool_arg, True) else "none",
        neck=neck, qkv_bias=read("qkv_bias", arguments.bool_arg, True),
        qk_norm=read("qk_norm", arguments.bool_arg, False),
        layer_scale=read("init_values", arguments.optional_positive_arg,
                         None),
        pre_norm=pre_norm, patch_bias=not pre_norm,
        layer_norm_epsilon=epsilon, gelu="exact",
        mlp_dim=int(out["hidden_size"] * read(
            "mlp_ratio", arguments.positive_arg, 4.0)))
    if kind != "layer":
        out["norm"] = kind
    return out


def _indices(value):
    if not isinstance(value, (list, tuple)) or any(
            not isinstance(i, int) or isinstance(i, bool) or i < 0
            for i in value):
        raise ValueError("it is not a list of block indices")
    return sorted(set(value))


def _neck(value):
    """timm's ``neck_chans``: the neck's channels."""
    if not value:
        raise ValueError("without it timm's SAM ends in a LayerNorm of "
                         "epsilon 1e-6 beside the blocks' own, which "
                         "keras_vit's final norm is not; the closest it "
                         "computes: neck_chans=256")
    return arguments.count_arg(value)


def sam_state(state):
    """A SAM ``state`` under the ViT's names: the position table (1, rows,
    cols, D) as its (1, rows * cols, D) rows, the classifier head's
    ``head.fc`` as ``head``."""
    out = {}
    for key, value in state.items():
        if key == "pos_embed" and np.ndim(value) == 4:
            value = np.reshape(value, (1, -1, np.shape(value)[-1]))
        out[key.replace("head.fc.", "head.", 1)
            if key.startswith("head.fc.") else key] = value
    return out
