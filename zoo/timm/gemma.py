"""timm's Gemma 4 vision towers (``gemma4_vit.py``: ``gemma4_vit_*``) as
keras_vit's ViT: RMS norms before and after each branch
(``sandwich_norm``), q/k norms and a value norm without a scale
(``value_norm``), the GeGLU MLP (``mlp="geglu"``) and no biases, the
position table per axis (``position_axes``) and the 2D rotary form, the
patches' mean through an RMS norm without a scale (``pooled_norm``).
What keras_vit holds in another form, the weights carry over exactly
(:func:`gemma_state`).

>>> args = {"embed_dim": 64, "depth": 2, "num_heads": 4, "head_dim": 16,
...         "patch_size": 16, "intermediate_size": 96, "global_pool": "avg",
...         "position_embedding_size": 32}
>>> out, tokens = honoured(args, "config.json")
>>> [out[k] for k in ("mlp", "position_axes", "rope", "sandwich_norm")]
['geglu', 32, 'eva02', True]
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.timm import arguments

# timm's argument -> (the one value keras_vit computes, what another
# builds).
_FIXED = {
    "num_kv_heads": (None, "grouped key and value heads"),
    "act_layer": (None, "another activation than the tanh GELU"),
}
# Read below, decided by the hub reader, or of no effect on the forward.
_READ = ("head_dim", "intermediate_size", "final_norm", "global_pool",
         "encoder_pool", "norm_eps", "rope_theta", "position_embedding_size",
         "img_size", "in_chans", "num_classes", "weight_init", "standardize",
         "pooling_kernel_size", "use_clipped_linears")


def honoured(args, path, state=None):
    """``(builder arguments, tokens)`` of timm's Gemma 4 arguments
    ``args``, each refused where keras_vit's model would compute
    something else: a FormatError naming ``path``'s field, the argument
    and its value. ``state``'s names say the class (``tokens`` True: the
    encoder returns its tokens, no pooling, no head)."""
    refuse, read, out = arguments.module_reader(
        args, path, "a timm Gemma 4 tower", _FIXED, _READ)
    classifier = arguments.is_classifier(state)
    pool = args.get("global_pool", "avg" if classifier else "soft")
    if pool not in (("avg",) if classifier else ("avg", "soft", "none", "")):
        raise refuse("global_pool", "keras_vit pools Gemma 4's classifier "
                     "by the tokens' mean; the closest it computes: "
                     "global_pool='avg'")
    soft = (args.get("encoder_pool", "") if classifier else pool) == "soft"
    if classifier and args.get("encoder_pool", "") not in ("", "none",
                                                           "soft"):
        raise refuse("encoder_pool", "keras_vit's classifier reads the "
                     "tokens or their soft-token pool")
    heads, width = out["num_heads"], out["hidden_size"]
    head_dim = read("head_dim", arguments.count_arg, 64)
    if head_dim * heads != width:
        raise refuse("head_dim", "keras_vit's heads are embed_dim / "
                     f"num_heads = {width // heads} wide; the closest it "
                     f"computes: head_dim={width // heads}")
    out.update(
        class_token=False, classifier="gap", final_norm=False,
        # The classifier's norm of the pooled features, without a scale.
        pooled_norm=classifier and read("final_norm", arguments.bool_arg,
                                        True), norm="rms",
        layer_norm_epsilon=read("norm_eps", arguments.positive_arg, 1e-6),
        qkv_bias=False, proj_bias=False, patch_bias=True, qk_norm=True,
        value_norm=True, sandwich_norm=True, mlp="geglu", gelu="tanh",
        mlp_dim=read("intermediate_size", arguments.count_arg, 3072),
        position_embedding="none",
        position_axes=read("position_embedding_size", arguments.count_arg,
                           10240),
        rope="eva02", rope_halves=True, rope_indexing="xy",
        rope_temperature=read("rope_theta", arguments.positive_arg, 100.0),
        clip_linears=read("use_clipped_linears", arguments.bool_arg, False),
        soft_pool=read("pooling_kernel_size", arguments.count_arg, 3)
        if soft else 0,
        soft_pool_standardize=soft and read("standardize",
                                            arguments.bool_arg, False))
    return out, not classifier and pool != "avg"


# The clamped projections' bounds, in the rows of keras_vit's clip
# weights: each block's attention's, then its MLP's projections.
_CLAMPED = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
            "mlp": ("gate_proj", "up_proj", "down_proj")}
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")

# Gemma 4's block names -> timm's ViT's, which keras_vit's layout reads.
_RENAMED = (("attn.o_proj.", "attn.proj."), ("mlp.gate_proj.", "mlp.fc1_g."),
            ("mlp.up_proj.", "mlp.fc1_x."), ("mlp.down_proj.", "mlp.fc2."),
            (".norm2.", ".post_norm1."), (".norm3.", ".norm2."),
            (".norm4.", ".post_norm2."))


def _quarters_swapped(array, head_dim):
    """``array`` (heads * head_dim, ...) with each head's second and third
    quarters of features swapped (Gemma 4's rotary pairs as keras_vit's
    ``rope_halves``'s)."""
    q = head_dim // 4
    order = np.concatenate([np.arange(q), np.arange(2 * q, 3 * q),
                            np.arange(q, 2 * q), np.arange(3 * q, head_dim)])
    shape = np.shape(array)
    heads = shape[0] // head_dim
    out = np.reshape(array, (heads, head_dim) + shape[1:])[:, order]
    return np.reshape(out, shape)


def gemma_state(state, honoured):
    """A Gemma 4 ``state`` under timm's ViT names, in keras_vit's forms:
    the patch projection as a convolution with a bias (Gemma reads ``2 *
    (x - 0.5)``), the queries' and keys' rotary pairs, the query norm's
    scale times ``sqrt(head_dim)`` (Gemma's logits are unscaled), the
    clamped projections' bounds as rows (a ValueError naming any missing);
    the soft-token pool's standardisation dropped where none runs."""
    width, heads = honoured["hidden_size"], honoured["num_heads"]
    head_dim = width // heads
    patch = honoured["patch_size"]
    out, bounds = {}, {}
    for key, value in state.items():
        key = key.removeprefix("encoder.").replace(".linear.", ".")
        module, _, bound = key.rpartition(".")
        if bound in _BOUNDS:  # a clamped projection's: into its rows
            bounds[module, bound] = value
            continue
        if key in ("std_bias", "std_scale") and not honoured[
                "soft_pool_standardize"]:
            continue
        if key == "patch_embed.input_proj.weight":
            kernel = np.reshape(value, (width, -1, patch, patch))
            out["patch_embed.proj.weight"] = 2 * kernel
            out["patch_embed.proj.bias"] = -np.sum(
                value.astype("float64"), axis=1).astype(value.dtype)
            continue
        for theirs, ours in _RENAMED:
            key = key.replace(theirs, ours)
        if key.endswith(("attn.q_proj.weight", "attn.k_proj.weight",
                         "attn.k_norm.weight")):
            value = _quarters_swapped(value, head_dim)
        elif key.endswith("attn.q_norm.weight"):
            value = _quarters_swapped(value, head_dim) * np.asarray(
                np.sqrt(head_dim), value.dtype)
        out[key] = value
    for block in sorted({m.rsplit(".", 2)[0] for m, _ in bounds}):
        for part, projections in _CLAMPED.items():
            names = [(f"{block}.{part}.{p}", b) for p in projections
                     for b in _BOUNDS]
            missing = [f"{m}.{b}" for m, b in names if (m, b) not in bounds]
            if missing:
                raise ValueError(
                    "the checkpoint's clamped projections lack their "
                    f"bounds {missing[:4]}")
            out[f"{block}.{part}.clip"] = np.reshape(np.array(
                [bounds[n] for n in names], np.float32), (-1, 4))
    return out
