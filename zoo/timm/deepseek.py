"""timm's DeepSeek vision towers (``deepseek_vit.py``: ``deepseek_vit_*``)
as keras_vit's ViT: pre-norm blocks of RMS norms, biased attention
beside a bias-free packed SwiGLU MLP, the axial rotary form as the only
position information, a final RMS norm on the tokens; the classifier pools
the tokens' mean through an RMS norm without a scale (``pooled_norm``).

>>> args = {"patch_size": 14, "embed_dim": 64, "depth": 2, "num_heads": 4,
...         "mlp_ratio": 2.75, "global_pool": "avg"}
>>> out = honoured(args, "config.json")
>>> [out[k] for k in ("mlp", "mlp_bias", "mlp_dim", "pooled_norm")]
['swiglu', False, 176, True]
"""

from __future__ import annotations

from keras_vit.zoo.timm import arguments

# timm's argument -> (the one value keras_vit computes, what another
# builds).
_FIXED = {
    "encoder_pool": ("", "the aligner (3 x 3 pixel-unshuffle and its MLP "
                     "to the language model's width)"),
    "dynamic_img_pad": (False, "images padded to the patch grid"),
}
# Read below, decided by the hub reader, or of the aligner only.
_READ = ("mlp_ratio", "rope_temperature", "norm_eps", "final_norm",
         "global_pool", "img_size", "in_chans", "num_classes",
         "out_features", "downsample_ratio")


def honoured(args, path, state=None):
    """keras_vit's builder arguments of timm's DeepSeek arguments
    ``args``, each refused (a FormatError naming ``path``'s field) where
    keras_vit's model would compute something else. ``state``'s names say
    the class: the classifier pools through its norm."""
    refuse, read, out = arguments.module_reader(
        args, path, "a timm DeepSeek tower", _FIXED, _READ)
    classifier = arguments.is_classifier(state)
    pool = args.get("global_pool", "avg" if classifier else "align")
    if pool != "avg":
        raise refuse("global_pool", "keras_vit pools DeepSeek's tokens by "
                     "their mean, without the aligner; the closest it "
                     "computes: global_pool='avg'")
    out.update(
        class_token=False, classifier="gap", position_embedding="none",
        norm="rms", layer_norm_epsilon=read("norm_eps",
                                            arguments.positive_arg, 1e-6),
        qkv_bias=True, proj_bias=True, mlp="swiglu", mlp_bias=False,
        mlp_dim=int(out["hidden_size"] * read(
            "mlp_ratio", arguments.positive_arg, 2816 / 1024)),
        pooled_norm=classifier and read("final_norm", arguments.bool_arg,
                                        True),
        rope="eva02", rope_halves=True,
        rope_temperature=read("rope_temperature", arguments.positive_arg,
                              10000.0),
        dynamic_image_size=True)
    return out


def deepseek_state(state):
    """A DeepSeek ``state`` (timm's classifier's, ``encoder.`` before the
    tower's) under timm's ViT names."""
    return {key.removeprefix("encoder."): value
            for key, value in state.items()}
