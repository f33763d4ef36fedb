"""Writes a keras_vit ViT as a timm Hub repository: ``config.json`` and
``model.safetensors`` that ``timm.create_model(arch, pretrained=True,
pretrained_cfg_overlay=dict(file=...))`` loads and
:mod:`keras_vit.zoo.timm.hub` reads back.
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base import atomic
from keras_vit.base import options as options_table
from keras_vit.base import geometry, variants
from keras_vit.base.checks import require
from keras_vit.data.normalization import of_model
from keras_vit.zoo import layouts
from keras_vit.zoo.timm import arguments as timm_arguments
from keras_vit.zoo.timm.layout import (TIMM, TIMM_ACTIVATIONS, TIMM_POOLS,
                                       parallel_variants)
from keras_vit.zoo.hub_files import CONFIG_FILE, WEIGHTS_FILE

_TIMM_WORDS = {"Ti": "tiny", "S": "small", "B": "base", "L": "large",
               "H": "huge"}


def _options(config):
    """The family options of a builder ``config``, defaults filled in."""
    from keras_vit.models.encoder import FAMILY_DEFAULTS

    return dict(FAMILY_DEFAULTS, **{k: config[k] for k in FAMILY_DEFAULTS
                                    if k in config})


def _family_args(config):
    """``(base architecture, model_args)`` of the model's family options
    (``config``: its get_config()); a setting timm cannot take is refused
    by name."""
    options = _options(config)
    gelu = config.get("gelu", "tanh")
    epsilon = config.get("layer_norm_epsilon", 1e-6)
    pools = {ours: theirs for theirs, ours in TIMM_POOLS.items()}
    pools["avg"] = "avg"  # keras_vit's other name of "gap"
    classifier = config.get("classifier", "token")
    if classifier not in pools:
        raise ValueError(
            "save_pretrained(layout='timm'): timm's ViT pools by "
            f"{', '.join(map(repr, TIMM_POOLS))}, and the model has "
            f"classifier={classifier!r}")
    token = geometry.class_token(config)
    pooling = dict(class_token=token, global_pool=pools[classifier],
                   fc_norm=bool(options["fc_norm"]))
    args = {}
    if classifier != "token" or not token:
        args.update(global_pool=pools[classifier], class_token=token,
                    fc_norm=bool(options["fc_norm"]))
    # The other options with a timm argument, where the model differs
    # from the paper's ViT.
    for row in options_table.OPTIONS:
        if (row.timm is not None and row.timm.name not in args
                and options[row.name] != row.default):
            args[row.timm.name] = row.timm.write(options[row.name], row.name)
    if options["post_norm"]:
        return _post_norm_args(options, gelu, epsilon, args, **pooling)
    if options["parallel"]:
        return _parallel_args(options, gelu, epsilon, args, **pooling)
    # timm's default is the exact GELU: the others are named.
    glu = options["mlp"] == "swiglu"
    if glu:
        # timm's SwiGLU ViT is DINOv2-g's architecture.
        args.update(act_layer="silu", init_values=options["layer_scale"])
    elif gelu != "exact":
        args["act_layer"] = next(theirs for theirs, ours in
                                 TIMM_ACTIVATIONS.items() if ours == gelu)
    if options["patch_bias"] == options["pre_norm"]:
        raise ValueError(
            "timm's ViT has a patch embedding bias exactly when it has no "
            f"pre_norm; the model has patch_bias={options['patch_bias']}, "
            f"pre_norm={options['pre_norm']}")
    if options["norm"] == "rms" or options["patch_norm"]:
        return _norm_args(options, epsilon, args)
    if glu and (epsilon != 1e-6 or options["distilled"]
                or options["pre_norm"]):
        raise ValueError(
            "timm's SwiGLU ViT (vit_giant_patch14_dinov2) takes LayerNorm "
            "epsilon 1e-6, no pre_norm and no distillation token; the model "
            f"has mlp='swiglu', layer_norm_epsilon={epsilon}, pre_norm="
            f"{options['pre_norm']}, distilled={options['distilled']}")
    if glu:
        if args["init_values"] is None:
            # timm drops an init_values of None and builds 1e-5 scales;
            # scales of one (write adds them) multiply exactly.
            args["init_values"] = 1.0
        return DINOV2_G, args
    if options["distilled"] and epsilon != 1e-6:
        raise ValueError(
            "timm's distilled DeiT takes LayerNorm epsilon 1e-6; the model "
            f"has layer_norm_epsilon={epsilon}")
    if epsilon == 1e-5:  # CLIP's towers: their own architecture
        args["pre_norm"] = options["pre_norm"]
        return "vit_base_patch16_clip_224", args
    if epsilon != 1e-6:
        raise ValueError(
            "timm's ViT architectures take LayerNorm epsilon 1e-6 (1e-5: "
            f"CLIP's); the model has layer_norm_epsilon={epsilon}")
    return ("deit_base_distilled_patch16_224" if options["distilled"]
            else None), args


# timm's post-norm ViT (ResPostBlock).
POST_NORM = "vit_base_patch16_rpn_224"


def _post_norm_args(options, gelu, epsilon, args, **pooling):
    """``(POST_NORM, model_args)`` of a post-norm model (``pooling``: its
    class token, pooling and fc_norm, in timm's words)."""
    if (options["layer_scale"] is not None or options["mlp"] != "gelu"
            or options["norm"] != "layer" or options["patch_norm"]
            or options["distilled"] or epsilon != 1e-6 or gelu != "exact"):
        raise ValueError(
            "timm's post-norm blocks (ResPostBlock) have no layer scale, "
            "the exact GELU MLP and LayerNorm epsilon 1e-6, without a "
            "distillation token; the model has post_norm=True, layer_scale="
            f"{options['layer_scale']}, mlp={options['mlp']!r}, gelu="
            f"{gelu!r}, norm={options['norm']!r}, layer_norm_epsilon="
            f"{epsilon}, distilled={options['distilled']}")
    return POST_NORM, dict(args, **pooling, qkv_bias=options["qkv_bias"])


# (parallel, differential) -> timm's architecture of those blocks.
PARALLEL = {("split", None): "vit_pwee_patch16_reg1_gap_256",
            ("fused", "vectors"): "vit_dpwee_patch16_reg1_gap_256"}


def _base_rows(base, options, args):
    """``args`` with every option of timm's architecture ``base``'s own
    (those its function sets) written as the model's."""
    _, own = timm_arguments.architecture(base)
    for row in options_table.OPTIONS:
        if row.timm is not None and row.timm.name in own:
            args[row.timm.name] = row.timm.write(options[row.name], row.name)
    return args


# timm's one architecture whose patches a conv stem cuts.
CONV_STEM = "vit_base_mci_224"


def _conv_stem_args(config, base, args):
    """``(CONV_STEM, model_args)`` of a model with the conv stem, ``base``
    and ``args`` what its other options ask of timm."""
    if (base is not None or config["hidden_size"] != 768
            or config["patch_size"] != 16):
        raise ValueError(
            f"timm's conv stem ({CONV_STEM}) is built for a width of 768 "
            "and patches of 16 in a ViT of no other timm architecture; the "
            f"model has conv_stem=True, hidden_size={config['hidden_size']},"
            f" patch_size={config['patch_size']}"
            + (f", and needs timm's {base}" if base else ""))
    return CONV_STEM, _base_rows(CONV_STEM, _options(config), args)


def _parallel_args(options, gelu, epsilon, args, **pooling):
    """``(architecture, model_args)`` of a model with parallel blocks:
    the architecture of timm's that builds its blocks (:data:`PARALLEL`),
    every option its function sets written as the model's."""
    base = PARALLEL.get((options["parallel"], options["differential"]))
    if (base is None or options["mlp"] != "gelu" or options["mlp_norm"]
            or options["attention_norm"] or options["patch_norm"]
            or options["distilled"] or epsilon != 1e-6 or gelu != "exact"):
        raise ValueError(
            "timm's parallel blocks are ParallelScalingBlock (parallel="
            "'split', differential=None) and DiffParallelScalingBlock "
            "(parallel='fused', differential='vectors'), with the exact "
            "GELU MLP, norm epsilon 1e-6, no norm inside the attention or "
            "the MLP or after the patch embedding, no distillation token; "
            f"the model has parallel={options['parallel']!r}, differential="
            f"{options['differential']!r}, mlp={options['mlp']!r}, gelu="
            f"{gelu!r}, mlp_norm={options['mlp_norm']}, attention_norm="
            f"{options['attention_norm']}, patch_norm="
            f"{options['patch_norm']}, layer_norm_epsilon={epsilon}, "
            f"distilled={options['distilled']}")
    _base_rows(base, options, args)
    if args.get("init_values") is None:
        args["init_values"] = 1.0  # timm drops None: scales of one
    if options["norm"] == "rms":
        args["norm_layer"] = "rmsnorm"
    args.pop("attn_layer", None)  # the block's own attention
    return base, dict(args, **pooling)


# timm's one SwiGLU ViT with LayerNorm (the packed MLP).
DINOV2_G = "vit_giant_patch14_dinov2"
# The architectures that always have layer scale: a model without gets
# scales of one.
ALWAYS_SCALED = (DINOV2_G, *PARALLEL.values())
# timm's architecture with RMSNorm, a patch norm and unpacked SwiGLU.
AIMV2 = "aimv2_large_patch14_224"


def _norm_args(options, epsilon, args):
    """``(base architecture, model_args)`` of a model with RMSNorm or a
    patch norm, ``args`` its other family arguments: AIMv2's architecture
    for the SwiGLU MLP, else timm's ViT with the norm named (timm's
    classes at epsilon 1e-6, all a config.json can name)."""
    glu, rms = options["mlp"] == "swiglu", options["norm"] == "rms"
    native = glu and rms and epsilon == 1e-5  # AIMv2's own norms
    if options["distilled"] or (not native and epsilon != 1e-6) or (
            glu and not rms):
        raise ValueError(
            "timm names RMSNorm and the norm after the patch embedding in "
            "a config.json as AIMv2's (RMSNorm epsilon 1e-5, SwiGLU MLP) or "
            "as timm's 'rmsnorm'/'layernorm' (epsilon 1e-6, GELU MLP), "
            "without a distillation token; the model has norm="
            f"{options['norm']!r}, patch_norm={options['patch_norm']}, "
            f"mlp={options['mlp']!r}, layer_norm_epsilon={epsilon}, "
            f"distilled={options['distilled']}")
    name = "rmsnorm" if rms else "layernorm"
    if not native:
        args["norm_layer"] = name
    if glu:
        # AIMv2's architecture sets these: the model's own, written.
        args.setdefault("global_pool", "token")
        args.setdefault("class_token", True)
        args.setdefault("fc_norm", False)
        args.update(qkv_bias=options["qkv_bias"],
                    proj_bias=options["proj_bias"])
        if not options["patch_norm"]:
            # timm drops None arguments; its empty name is no norm.
            args["embed_norm_layer"] = ""
        elif not native:
            args["embed_norm_layer"] = name
        return AIMV2, args
    if options["patch_norm"]:
        args["embed_norm_layer"] = name
    return None, args


def timm_architecture(model):
    """``(name, model_args)``: timm's name for the model's architecture
    (``vit_base_patch16_224``) and the ``model_args`` that make timm build
    it: none for the standard sizes, else the sizes themselves on top of
    ``vit_base_patch16_224``, and the family's options as timm's."""
    names = {(row["hidden_size"], row["num_layers"], row["num_heads"]):
             _TIMM_WORDS[letter]
             for letter, row in variants.VIT_SIZES.items()
             if letter in _TIMM_WORDS}
    config = model.get_config()
    if (config.get("resnet") is not None
            or config.get("position_embedding", "learned_1d") != "learned_1d"
            or config.get("position_embedding_placement", "stem") != "stem"
            or config.get("representation_size")):
        raise ValueError(
            f"save_pretrained writes timm's ViT (a learned position table "
            f"at the stem, no ResNet stem, no pre_logits); "
            f"model={model.name!r} has position_embedding="
            f"{config.get('position_embedding')!r}, resnet="
            f"{config.get('resnet')!r}, representation_size="
            f"{config.get('representation_size')!r}")
    base, family = _family_args(config)
    if config.get("conv_stem"):
        base, family = _conv_stem_args(config, base, family)
    key = (config["hidden_size"], config["num_layers"], config["num_heads"])
    size = names.get(key)
    patch = config["patch_size"]
    if base is None and size is not None and config["mlp_dim"] == 4 * key[
            0] and patch in ((8, 16, 32) if size == "base" else (16, 32)
                             if size != "huge" else (14,)):
        return f"vit_{size}_patch{patch}_224", family
    first = (config["mlp_dim"] if base == AIMV2 else  # unpacked halves
             geometry.mlp_first_width(config["mlp_dim"],
                                      config.get("mlp", "gelu")))
    sizes = {"patch_size": patch, "embed_dim": key[0], "depth": key[1],
             "num_heads": key[2], "mlp_ratio": first / key[0]}
    if base == CONV_STEM:
        del sizes["patch_size"]  # the stem's, which its function sets
    return base or "vit_base_patch16_224", dict(sizes, **family)


def _unit_layer_scales(arrays, num_layers, scales=(1, 2)):
    """``arrays`` (by variable path) with a layer scale of ones in each of
    ``num_layers`` blocks that has none (``scales``: which).

    >>> arrays = {"encoder_block_0/norm_1/gamma": np.zeros(3, "float32")}
    >>> sorted(_unit_layer_scales(arrays, 1))  # doctest: +NORMALIZE_WHITESPACE
    ['encoder_block_0/layer_scale_1', 'encoder_block_0/layer_scale_2',
     'encoder_block_0/norm_1/gamma']
    """
    out = dict(arrays)
    for i in range(num_layers):
        like = arrays[f"encoder_block_{i}/norm_1/gamma"]
        for n in scales:
            out.setdefault(f"encoder_block_{i}/layer_scale_{n}",
                           np.ones_like(like))
    return out


# The model's arguments a timm config.json fixes, besides the options.
_READ_BACK = ("patch_size", "hidden_size", "num_layers", "num_heads",
              "mlp_dim", "num_channels", "layer_norm_epsilon", "gelu",
              "classifier")


def _resolved(config):
    """The arguments of :data:`_READ_BACK` and the family options of a
    builder ``config``, defaults filled in as the model resolves them."""
    out = _options(config)
    out.update({k: config.get(k) for k in _READ_BACK},
               num_channels=config.get("num_channels", 3),
               layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
               gelu=config.get("gelu", "tanh"))
    out["classifier"] = {"avg": "gap"}.get(out["classifier"] or "token",
                                            out["classifier"] or "token")
    out["class_token"] = geometry.class_token(out)
    if out["fc_norm"] is None:
        out["fc_norm"] = False
    if out["mlp"] == "swiglu" and out["classifier"] != "map":
        # The gate is SiLU's whatever the GELU.
        out["gelu"] = None
    return out


def check_read_back(model, written, arrays, state):
    """Refuses, in one line naming the argument, its value and timm's, a
    ``config.json`` (``written``) and tensors (``state``, of the model's
    ``arrays`` by variable path) that keras_vit's timm reader would read
    as another model than ``model``."""
    config = model.get_config()
    where = f"save_pretrained(layout='timm') of model={model.name!r}"
    if not config.get("include_top", True):
        raise ValueError(
            f"{where}: timm's ViT always pools (and classifies); the model "
            "returns every token (include_top=False): build it with "
            "num_classes=0 for the pooled embedding, or save_npz writes it")
    arch, defaults = timm_arguments.architecture(written["architecture"])
    try:
        read = timm_arguments.honoured(written, arch, "its config.json",
                                       defaults)
    except ValueError as e:
        raise ValueError(f"{where}: timm would build another model: {e}"
                         ) from None
    built = dict(arch.config, **read)
    built.setdefault("gelu", "exact")  # the reader's default: timm's GELU
    ours, theirs = _resolved(config), _resolved(built)
    if (written["architecture"] in ALWAYS_SCALED
            and ours["layer_scale"] is None):
        ours["layer_scale"] = 1.0  # the scales of one write adds
    # Training-only and other-size settings; head_type is its own field.
    skip = options_table.unwritten(ours) | {"head_type"}
    differ = [k for k in ours if k not in skip and ours[k] != theirs[k]]
    if differ:
        key = differ[0]
        raise ValueError(
            f"{where}: timm's {written['architecture']} as written computes "
            f"{key}={theirs[key]!r}, and the model has {key}={ours[key]!r}")
    shapes = {path: np.shape(value) for path, value in arrays.items()}
    lost = sorted(set(arrays) ^ set(TIMM.read(state, shapes)[0])) + TIMM.unknown(
        state)
    if lost:
        raise ValueError(f"{where}: timm's layout does not hold the "
                         f"model's arrays {lost[:6]}")


def write(model, directory, labels=None):
    """Writes ``model`` as a timm repository in ``directory`` with the
    class names ``labels`` (a checked list, or None); returns the
    folder. None is written for a model that timm would read as another
    (:func:`check_read_back`)."""
    st = require("safetensors.numpy", package="safetensors",
                 purpose="save_pretrained")
    arch, sizes = timm_architecture(model)
    arrays = layouts.model_arrays(model, "timm")
    own = model.get_config()
    if arch in ALWAYS_SCALED and own.get("layer_scale") is None:
        arrays = _unit_layer_scales(arrays, own["num_layers"],
                                    (1,) if own.get("parallel") else (1, 2))
    state = TIMM.write(arrays, ("unpacked_glu",) if arch == AIMV2
                       else ("conv_stem",) if arch == CONV_STEM
                       else parallel_variants(own))
    normalisation = of_model(model).to_config()
    size = model.image_size
    size = list(size) if isinstance(size, (tuple, list)) else [size, size]
    config = {
        "architecture": arch,
        "num_classes": int(model.num_classes),
        "num_features": int(model.hidden_size),
        "global_pool": sizes.get("global_pool", "token"),
        "model_args": {"img_size": size[0] if size[0] == size[1] else size,
                       "in_chans": int(own.get("num_channels", 3)),
                       **sizes},
        "pretrained_cfg": {
            "input_size": [3, *size], "fixed_input_size": True,
            "interpolation": "bilinear", "crop_pct": 1.0,
            "crop_mode": "center", "mean": normalisation["mean"],
            "std": normalisation["std"], "num_classes": int(model.num_classes),
            "first_conv": "patch_embed.proj", "classifier": "head"},
    }
    if labels is not None:
        config["label_names"] = list(labels)
    if getattr(model, "head_type", "classifier") != "classifier":
        config["head_type"] = model.head_type
    check_read_back(model, config, arrays, state)
    os.makedirs(directory, exist_ok=True)
    with atomic.atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp:
        st.save_file(state, tmp, metadata={"format": "pt"})
    atomic.write_json(os.path.join(directory, CONFIG_FILE), config)
    return os.fspath(directory)
