"""timm's Gemma 4 vision towers (``gemma4_vit.py``: ``gemma4_vit_*``) as
keras_vit's ViT: RMS norms before and after each branch
(``sandwich_norm``), q/k norms and a value norm without a scale
(``value_norm``), the GeGLU MLP (``mlp="geglu"``) and no biases, the
position table per axis (``position_axes``) and the 2D rotary form, the
patches' mean through an RMS norm without a scale.

What Gemma 4 computes that keras_vit's rows hold in another form, the
weights carry over exactly (:func:`gemma_state`):

- its patch projection reads ``2 * (x - 0.5)``: the patch convolution's
  kernel twice the Linear's, its bias ``-sum(W)`` (``patch_bias``);
- its rotary form turns, in each head, the first half of the features
  by the columns and the second half by the rows, each half's own two
  halves paired; keras_vit's ``rope="eva02"`` with ``rope_halves=True``
  and ``rope_indexing="xy"`` pairs feature ``k`` with ``k + head_dim /
  2``: the queries' and keys' middle quarters swapped, their dot
  products the same;
- its logits are not scaled (scale 1): the query norm's scale times
  ``sqrt(head_dim)``;
- its final norm has no scale: one of ones.

>>> args = {"embed_dim": 64, "depth": 2, "num_heads": 4, "head_dim": 16,
...         "patch_size": 16, "intermediate_size": 96, "global_pool": "avg",
...         "position_embedding_size": 32}
>>> out = honoured(args, "config.json")
>>> [out[k] for k in ("mlp", "position_axes", "rope", "sandwich_norm")]
['geglu', 32, 'eva02', True]
"""

from __future__ import annotations

import numpy as np

from keras_vit.zoo.timm import arguments

# Gemma 4's settings keras_vit computes at one value only: timm's argument
# -> (that value, what another builds).
_FIXED = {
    "num_kv_heads": (None, "grouped key and value heads"),
    "use_clipped_linears": (False, "projections that clamp their inputs "
                            "and outputs (the E2B/E4B tower's)"),
    "act_layer": (None, "another activation than the tanh GELU"),
    "encoder_pool": ("", "the soft-token pool before the classifier's"),
}
# Read below, decided by the file and the hub reader (img_size, in_chans,
# num_classes), of no effect on the forward (weight_init), or of the
# soft-token pool only, which a classifier does not run (standardize,
# pooling_kernel_size).
_READ = ("head_dim", "intermediate_size", "final_norm", "global_pool",
         "norm_eps", "rope_theta", "position_embedding_size", "img_size",
         "in_chans", "num_classes", "weight_init", "standardize",
         "pooling_kernel_size")


def honoured(args, path, state=None):
    """keras_vit's builder arguments of timm's Gemma 4 arguments ``args``
    (the table's, overridden by a ``config.json``'s ``model_args``), each
    refused where keras_vit's model would compute something else: a
    FormatError naming ``path``'s field, the argument and its value.
    ``state``'s names say the class: the classifier's (``encoder.``
    before the tower's) ends in its norm, the encoder's in its pool."""
    refuse, read, out = arguments.module_reader(
        args, path, "a timm Gemma 4 tower", _FIXED, _READ)
    classifier = state is None or any(k.startswith("encoder.")
                                      for k in state)
    pool = args.get("global_pool", "avg" if classifier else "soft")
    if pool != "avg":
        raise refuse("global_pool", "keras_vit reads Gemma 4's mean of the "
                     "patches only, not its soft-token pool or its tokens; "
                     "the closest it computes: global_pool='avg'")
    heads, width = out["num_heads"], out["hidden_size"]
    head_dim = read("head_dim", arguments.count_arg, 64)
    if head_dim * heads != width:
        raise refuse("head_dim", "keras_vit's heads are embed_dim / "
                     f"num_heads = {width // heads} wide; the closest it "
                     f"computes: head_dim={width // heads}")
    # The classifier's norm of the pooled features, without a scale.
    pooled_norm = classifier and read("final_norm", arguments.bool_arg, True)
    out.update(
        class_token=False, classifier="gap", final_norm=pooled_norm,
        fc_norm=pooled_norm, norm="rms",
        layer_norm_epsilon=read("norm_eps", arguments.positive_arg, 1e-6),
        qkv_bias=False, proj_bias=False, patch_bias=True, qk_norm=True,
        value_norm=True, sandwich_norm=True, mlp="geglu", gelu="tanh",
        mlp_dim=read("intermediate_size", arguments.count_arg, 3072),
        position_embedding="none",
        position_axes=read("position_embedding_size", arguments.count_arg,
                           10240),
        rope="eva02", rope_halves=True, rope_indexing="xy",
        rope_temperature=read("rope_theta", arguments.positive_arg, 100.0))
    return out


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
    """A Gemma 4 ``state`` (timm's classifier's, ``encoder.`` before the
    encoder's names) under timm's ViT names, in keras_vit's forms (see
    the module's docstring): the patch projection as a convolution with a
    bias, the queries' and keys' rotary pairs, the query norm's scale,
    the final norm's scale of ones; the soft-token pool's standardisation
    (unused by the classifier) dropped."""
    width, heads = honoured["hidden_size"], honoured["num_heads"]
    head_dim = width // heads
    patch = honoured["patch_size"]
    out = {}
    for key, value in state.items():
        key = key.removeprefix("encoder.").replace(".linear.", ".")
        if key in ("std_bias", "std_scale"):
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
    if honoured["final_norm"] and "fc_norm.weight" not in out:
        out["fc_norm.weight"] = np.ones((width,), np.float32)
    return out
