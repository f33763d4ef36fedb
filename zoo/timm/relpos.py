"""timm's relative-position ViTs (``vision_transformer_relpos.py``:
``vit_relpos_*``, ``vit_srelpos_*``) as keras_vit's ViT: no position
table, a relative position MLP in every block or one shared
(``relative_mlp``, its width ``relative_mlp_width``), pre-norm blocks
with layer scale or post-norm blocks (``ResPostRelPosBlock``).

>>> args = {"patch_size": 16, "embed_dim": 64, "depth": 2, "num_heads": 2,
...         "qkv_bias": False, "fc_norm": True, "init_values": 1e-6,
...         "shared_rel_pos": True, "rel_pos_dim": 32}
>>> out = honoured(args, "config.json")
>>> [out[k] for k in ("relative_mlp", "relative_mlp_width", "classifier")]
['shared', 32, 'gap']
"""

from __future__ import annotations

from keras_vit.zoo.timm import arguments

# timm's argument -> (the one value keras_vit computes, what another
# builds).
_FIXED = {
    "rel_pos_type": ("mlp", "another relative position scheme than the "
                     "log-coordinate MLP"),
    "embed_layer": ("PatchEmbed", "another patch embedding"),
    "norm_layer": (None, "another norm than LayerNorm of epsilon 1e-6"),
    "act_layer": (None, "another activation than torch's GELU"),
    "fix_init": (False, "another initialisation (it rescales weights at "
                 "build, as a file does not)"),
}
# timm's blocks -> keras_vit's post_norm.
_BLOCKS = {"RelPosBlock": False, "ResPostRelPosBlock": True}
_POOLS = {"avg": "gap", "token": "token"}
# Read below, decided by the hub reader, or of no effect on the forward.
_READ = ("mlp_ratio", "qkv_bias", "qk_norm", "init_values", "class_token",
         "fc_norm", "rel_pos_dim", "shared_rel_pos", "block_fn",
         "global_pool", "img_size", "in_chans", "num_classes", "weight_init")


def honoured(args, path):
    """keras_vit's builder arguments of timm's relative-position ViT
    arguments ``args``, each refused (a FormatError naming ``path``'s
    field) where keras_vit's model would compute something else."""
    refuse, read, out = arguments.module_reader(
        args, path, "a timm relative-position ViT", _FIXED, _READ)
    pool = read("global_pool", arguments.choice_arg(
        _POOLS, "keras_vit pools by"), "avg")
    post = _BLOCKS.get(args.get("block_fn", "RelPosBlock"))
    if post is None:
        raise refuse("block_fn", f"keras_vit builds {', '.join(_BLOCKS)}")
    fc_norm = read("fc_norm", arguments.bool_arg, False)
    out.update(
        classifier=pool, position_embedding="none",
        class_token=read("class_token", arguments.bool_arg, False),
        fc_norm=fc_norm, qkv_bias=read("qkv_bias", arguments.bool_arg, True),
        qk_norm=read("qk_norm", arguments.bool_arg, False),
        # ResPostRelPosBlock has no layer scale.
        layer_scale=None if post else read(
            "init_values", arguments.optional_positive_arg, None),
        post_norm=post,
        relative_mlp="shared" if read("shared_rel_pos", arguments.bool_arg,
                                      False) else "block",
        relative_mlp_width=read("rel_pos_dim", arguments.or_default(
            arguments.count_arg, 128), None),
        layer_norm_epsilon=1e-6, gelu="exact",
        mlp_dim=int(out["hidden_size"] * read(
            "mlp_ratio", arguments.positive_arg, 4.0)))
    return out
