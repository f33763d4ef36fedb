"""timm's ViT architectures as data, and timm's arguments as keras_vit's.

timm's hub files record only the arguments that differ from the
``architecture``. ``architectures.json`` beside this module holds, for
every architecture of timm's ViT modules, the keyword arguments its
function passes to timm's builder (written by
``benchmarks/timm_coverage.py --write-table``). One mapping turns timm's
arguments, from the table or a ``config.json``, into keras_vit's; any
other is refused in one line naming it and its value.

>>> arch, options = architecture("vit_base_patch16_clip_224.openai")
>>> arch.config["hidden_size"], options["norm_layer"]
(768, {'layer': 'LayerNorm', 'eps': 1e-05})
>>> honoured({}, arch, "config.json", options)["layer_norm_epsilon"]
1e-05
"""

from __future__ import annotations

import functools
import json
import os

from keras_vit.base import options as options_table
from keras_vit.base import variants
from keras_vit.base.checks import shown
from keras_vit.zoo import formats
from keras_vit.zoo.timm.layout import (TIMM_ACTIVATIONS, TIMM_OPTIONS,
                                       TIMM_POOLS)

#: How timm resizes a learned table to another grid (its
#: resample_abs_pos_embed: bicubic, antialiased).
TABLE_RESIZE = "bicubic_aa"
#: The table of timm's architectures, shipped with the package.
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "architectures.json")
_TABLE_SIZES = ("patch_size", "embed_dim", "depth", "num_heads",
                "img_size")


@functools.lru_cache(maxsize=1)
def table():
    """The table's content: ``timm`` (the version it was read from),
    ``modules`` and ``architectures`` (name -> ``{"module", "args"}``).

    >>> table()["architectures"]["vit_base_patch16_224"]["args"]["embed_dim"]
    768
    """
    with open(TABLE_PATH, encoding="utf-8") as f:
        return json.load(f)


# timm's modules whose architectures keras_vit builds, and what each of
# the others builds that keras_vit does not.
READ_MODULES = ("vision_transformer", "deit", "vision_transformer_hybrid",
                "eva", "beit", "qwen3_vit", "naflexvit",
                "vision_transformer_sam", "vision_transformer_relpos",
                "gemma4_vit", "deepseek_vit")
UNREAD_MODULES = {}


def refusing(args, path, what, given=None):
    """``(refuse, read)`` for a reader of timm's arguments ``args`` of a
    ``config.json`` at ``path``: ``refuse(key, why)`` is the FormatError
    naming ``model_args.<key>`` (``what``: the class, "a timm EVA"; a key
    not in ``given``, where given, is the architecture's);
    ``read(key, convert, default)`` converts the argument, its
    ValueError turned into that refusal."""
    def refuse(key, why):
        own = given is None or key in given
        return formats.fail(
            path, f"model_args.{key}" if own else "architecture",
            f"{key}={shown(args.get(key), 60)}"
            + ("" if own else " (timm's architecture sets it)")
            + f" is {what} setting keras_vit cannot honour ({why})")

    def read(key, convert, default):
        try:
            return convert(args.get(key, default))
        except ValueError as e:
            raise refuse(key, str(e)) from None

    return refuse, read


# timm's ViT size and dropout arguments -> the builder's.
MODULE_SIZES = {"patch_size": "patch_size", "embed_dim": "hidden_size",
                "depth": "num_layers", "num_heads": "num_heads"}
MODULE_DROPS = {"drop_rate": "dropout_rate", "proj_drop_rate": "dropout_rate",
                "attn_drop_rate": "attention_dropout_rate",
                "drop_path_rate": "drop_path_rate"}


def module_reader(args, path, what, fixed, known, closest=True):
    """``(refuse, read, sizes)`` of a reader of another ViT module's
    arguments ``args``: every argument neither in ``fixed`` (argument ->
    (the one value keras_vit computes, what another builds, the value
    named as the closest where ``closest``)), :data:`MODULE_SIZES`,
    :data:`MODULE_DROPS` nor ``known`` refused; ``sizes`` the builder's
    sizes and non-zero dropout rates."""
    refuse, read = refusing(args, path, what)
    for key in args:
        if key not in (*fixed, *MODULE_SIZES, *MODULE_DROPS, *known):
            raise refuse(key, "an argument keras_vit's reader does not "
                         "know, so cannot say what it computes")
    for key, (value, builds) in fixed.items():
        if key in args and args[key] != value:
            raise refuse(key, f"it builds {builds}" + (
                f"; the closest keras_vit computes: {key}={value!r}"
                if closest else ""))
    sizes = {ours: read(key, count_arg, None)
             for key, ours in MODULE_SIZES.items()}
    for key, ours in MODULE_DROPS.items():
        value = read(key, rate_arg, 0.0)
        if value:
            sizes[ours] = value
    return refuse, read, sizes


def is_classifier(state):
    """Whether a vision tower's ``state`` is timm's classifier's (names
    under ``encoder.``) rather than the encoder's own; None: the
    classifier."""
    return state is None or any(k.startswith("encoder.") for k in state)


def check_module(name):
    """Refuses, in one line naming them, timm's architecture ``name`` of
    a module keras_vit does not build (:data:`UNREAD_MODULES`).

    >>> check_module("deepseek_vit_412m")  # a module it reads: None
    """
    entry = table_entry(name)
    if entry is not None and entry["module"] not in READ_MODULES:
        raise ValueError(
            f"timm's {name.partition('.')[0]} ({entry['module']}.py) builds "
            f"{UNREAD_MODULES.get(entry['module'], 'another model')}, which "
            "keras_vit does not; the ViT family's modules it reads: "
            + ", ".join(READ_MODULES))


def architecture(name):
    """``(Arch, options)`` of timm's ViT architecture ``name`` (a tag
    after ``.`` is ignored) from the table: the sizes as an
    :class:`~keras_vit.base.variants.Arch` of family ``"vit"`` and its
    other arguments as timm names them (for :func:`honoured`). None for
    a name the table lacks or a hybrid (its backbone is read by name).

    >>> arch, options = architecture("vit_base_patch16_gap_224")
    >>> arch.config["num_heads"], options["global_pool"]
    (16, 'avg')
    >>> architecture("ViT-B/16") is None
    True
    """
    entry = table_entry(name)
    if entry is None or entry["args"].get("backbone") not in (
            None, *CONV_STEMS.get(name.partition(".")[0], ())):
        return None
    args = dict(entry["args"])
    if "backbone" in args:  # the conv stem's patches, set by its function
        args.setdefault("patch_size", 16)
        args.setdefault("mlp_ratio", 4.0)
    width = args["embed_dim"]
    config = dict(patch_size=args["patch_size"], hidden_size=width,
                  num_layers=args["depth"], num_heads=args["num_heads"],
                  mlp_dim=args.get("intermediate_size") or int(
                      width * args["mlp_ratio"]),
                  classifier="token", representation_size=None)
    size = args["img_size"]
    image_size = tuple(size) if isinstance(size, list) else size
    options = {k: v for k, v in args.items() if k not in _TABLE_SIZES}
    return variants.Arch(name=name.partition(".")[0], family="vit",
                         config=config, image_size=image_size,
                         tag=None), options


def table_entry(name):
    """The table's row of timm's architecture ``name`` (a tag after ``.``
    ignored): ``{"module": ..., "args": ...}``, or None.

    >>> table_entry("vit_small_patch16_dinov3")["module"]
    'eva'
    """
    return table()["architectures"].get(name.partition(".")[0])


def backbone(name):
    """The name of the backbone timm's hybrid architecture ``name`` builds
    its patches with (``"ResNetV2"``, ``"ConvStem"``, ...), or None for a
    plain ViT or a name the table lacks.

    >>> backbone("vit_base_r50_s16_384"), backbone("vit_base_patch16_224")
    ('ResNetV2', None)
    """
    entry = table_entry(name)
    return None if entry is None else entry["args"].get("backbone")


# -- timm's arguments -> keras_vit's ----------------------------------------

def bool_arg(value):
    if not isinstance(value, bool):
        raise ValueError("is not true or false")
    return value


def choice_arg(choices, what="is none of"):
    """One of ``choices`` (a dict's: its value), else a ValueError."""
    def convert(value):
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{what} {', '.join(map(repr, choices))}")
        return choices[value] if isinstance(choices, dict) else value
    return convert


def or_default(convert, default):
    """``convert``, reading None as ``default``."""
    def read(value):
        return default if value is None else convert(value)
    return read


def _layer_scale_arg(value):
    if value is None:
        return None
    if not _is_number(value) or not value > 0:
        raise ValueError("is not a positive number or null")
    return float(value)


def count_arg(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("is not a count")
    return value


# timm's norm classes and get_norm_layer names -> keras_vit's norm kind.
_NORM_CLASSES = {"LayerNorm": "layer", "RmsNorm": "rms"}
_NORM_NAMES = {"layernorm": "layer", "rmsnorm": "rms"}


def norm_arg(value):
    """timm's norm layer -> ``(keras_vit's norm kind, epsilon)``: the
    table's ``{"layer": "LayerNorm" or "RmsNorm", "eps": ...}`` or timm's
    names ``"layernorm"`` and ``"rmsnorm"`` (timm's classes at their
    default epsilon, 1e-6).

    >>> norm_arg({"layer": "RmsNorm", "eps": 1e-05}), norm_arg("layernorm")
    (('rms', 1e-05), ('layer', 1e-06))
    """
    if isinstance(value, str) and value.lower() in _NORM_NAMES:
        return _NORM_NAMES[value.lower()], 1e-6
    if (isinstance(value, dict) and value.get("layer") in _NORM_CLASSES
            and set(value) == {"layer", "eps"} and _is_number(value["eps"])
            and value["eps"] > 0):
        return _NORM_CLASSES[value["layer"]], float(value["eps"])
    raise ValueError("is not a LayerNorm or an RmsNorm of a given epsilon, "
                     "the norms keras_vit's ViT builds")


#: timm's unpacked SwiGLU MLP: its ``int(dim * mlp_ratio)`` hidden units
#: are the gated width itself (a packed GLU's are twice that).
UNPACKED_GLU = "SwiGLU"


def _mlp_layer_arg(value):
    """timm's ``mlp_layer`` -> keras_vit's ``mlp``: timm's Mlp, or its
    packed GLU with the gate first (``SwiGLUPacked``, or ``GluMlp`` with
    ``gate_last=False``), or its unpacked ``SwiGLU`` (the layout packs
    its two halves); the GLUs need ``act_layer`` SiLU (timm's block hands
    its ``act_layer`` to the MLP)."""
    if value in ("Mlp", None):
        return "gelu"
    if value in ("SwiGLUPacked", UNPACKED_GLU) or (
            isinstance(value, dict) and value.get("layer") == "GluMlp"
            and value.get("gate_last") is False
            and set(value) <= {"layer", "act_layer", "gate_last"}):
        return "swiglu"
    raise ValueError("is not timm's Mlp, its SwiGLU or its packed GLU with "
                     "the gate first (SwiGLUPacked), the MLPs keras_vit's "
                     "ViT builds")


def _is_silu(value):
    return isinstance(value, str) and value.lower() == "silu"


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_rate(value):
    return _is_number(value) and 0 <= value < 1


def rate_arg(value):
    """A timm rate argument as a float, else a ValueError saying why."""
    if not is_rate(value):
        raise ValueError("it is not a rate in [0, 1)")
    return float(value)


def positive_arg(value):
    """A positive number as a float, else a ValueError saying why."""
    if not _is_number(value) or not value > 0:
        raise ValueError("it is not a positive number")
    return float(value)


def optional_positive_arg(value):
    """None, or :func:`positive_arg`."""
    return None if value is None else positive_arg(value)


# How each of timm's family arguments (TIMM_OPTIONS) reads.
_TIMM_VALUES = {
    "class_token": bool_arg, "reg_tokens": count_arg,
    "no_embed_class": bool_arg,
    "global_pool": choice_arg(TIMM_POOLS),
    "fc_norm": or_default(bool_arg, None),
    "init_values": _layer_scale_arg, "qk_norm": bool_arg,
    "qkv_bias": bool_arg, "proj_bias": bool_arg, "pre_norm": bool_arg,
    "final_norm": bool_arg, "act_layer": choice_arg(TIMM_ACTIVATIONS),
    "pos_embed": choice_arg({"learn": "learned_1d", "none": "none"}),
    "drop_path_rate": lambda v: v if is_rate(v) else choice_arg({})(v),
}
# The arguments read but not written: timm's name -> (keras_vit's
# argument, the value's check and mapping).
_READ_ONLY = {
    "mlp_layer": ("mlp", _mlp_layer_arg),
    "dynamic_img_size": ("dynamic_image_size", bool_arg),
    "distilled": ("distilled", bool_arg),
}
#: timm's architectures whose patches its ConvStem cuts as the
#: conv_stem option does (its function fixes the stem: widths 192, 192,
#: 768, strides 4, 2, 2): architecture -> the backbone its table names.
CONV_STEMS = {"vit_base_mci_224": ("ConvStem",)}
#: timm's blocks (``block_fn``) as the options each sets: its pre-norm
#: Block, ResPostBlock (post-norm), the parallel blocks.
TIMM_BLOCKS = {"Block": {}, "ResPostBlock": {"post_norm": True},
               "ParallelScalingBlock": {"parallel": "split"},
               "DiffParallelScalingBlock": {"parallel": "fused",
                                            "differential": "vectors"},
               # Its branches are counted in the file (layout.branches).
               "ParallelThingsBlock": {"branches": 2}}
# timm's norm arguments: the model's norm and the one after the patch
# embedding (keras_vit's patch_norm, of the same kind and epsilon).
_NORM_ARGS = ("norm_layer", "embed_norm_layer")
_HONOURS = ("it honours img_size, in_chans, num_classes, the ViT's sizes "
            "patch_size, embed_dim, depth, num_heads, mlp_ratio, dropout "
            "rates, and for a ViT " + ", ".join(sorted(
                {*TIMM_OPTIONS, *_READ_ONLY, *_NORM_ARGS, "block_fn"}
                - {"drop_path_rate"})))


def _option(key, value):
    """``(keras_vit's argument, value)`` of timm's ViT family argument
    ``key``, None for an argument that is not one; a ValueError for a
    value keras_vit cannot build."""
    if key in TIMM_OPTIONS:
        ours = TIMM_OPTIONS[key]
        row = options_table.ROWS.get(ours)
        if key not in _TIMM_VALUES:  # a row's field: the row's check
            return ours, row.check(key, row.timm.read(value))
        value = _TIMM_VALUES[key](value)
        if row is not None:  # the row's value forms
            value = row.timm.read(value)
        return ours, value
    if key in _READ_ONLY:
        ours, convert = _READ_ONLY[key]
        return ours, convert(value)
    return None


def honoured(config, arch, path, defaults=None):
    """The builder arguments timm's ``config`` (a ``config.json``'s
    content) asks for: the architecture's own arguments ``defaults`` (from
    :func:`architecture`) overridden by the config's ``model_args`` (as
    timm's create_model: the top-level ``global_pool`` is what timm's save
    writes for information, not read), mapped onto keras_vit's; any other
    setting is refused in one line naming it, its value and where it came
    from (``path``'s field ``model_args.<key>``, or ``architecture``).

    >>> arch = variants.parse("vit_base_patch16_224")
    >>> honoured({"model_args": {"reg_tokens": 4}}, arch, "config.json")
    {'num_registers': 4}
    """
    given = dict(config.get("model_args") or {})
    args = dict(defaults or {}, **given)
    own = "avg" if arch.family == "bit" else "token"  # timm's default
    pool = args.pop("global_pool", own)
    if arch.family == "vit" and pool != own:
        args["global_pool"] = pool
    elif pool != own:
        raise formats.fail(path, "model_args.global_pool", f"timm "
                           f"global_pool={shown(pool)} is not supported for "
                           f"{arch.name}; it pools by global_pool={own!r}")

    def refuse(key, value, why):
        where = f"model_args.{key}" if key in given else None
        origin = f" (timm's {arch.name} sets it)" if where is None else ""
        where = where or "architecture"
        return formats.fail(path, where, f"{key}={shown(value, 60)}{origin} "
                            f"is a timm setting keras_vit cannot honour {why}")

    out, norms = {}, {}
    vit = arch.family in ("vit", "hybrid")
    for key, value in args.items():
        if key in ("img_size", "num_classes"):
            continue  # read with the config's own fields
        if key == "in_chans":
            out["num_channels"] = value
        elif key in MODULE_SIZES and vit:
            out[MODULE_SIZES[key]] = value
        elif key == "mlp_ratio" and vit:
            continue  # below, once the width is known
        elif (key in MODULE_DROPS and key != "drop_path_rate"
              and is_rate(value)):
            out[MODULE_DROPS[key]] = float(value)
        elif key == "act_layer" and _is_silu(value) and arch.family == "vit":
            continue  # the gate's activation, checked with the MLP below
        elif key in _NORM_ARGS and arch.family == "vit":
            if key == "embed_norm_layer" and value in (None, ""):
                continue  # none (timm's empty name too), as without it
            try:
                norms[key] = norm_arg(value)
            except ValueError as e:
                raise refuse(key, value, f"(it {e})") from None
        elif key == "backbone" and value in CONV_STEMS.get(arch.name, ()):
            out["conv_stem"] = True
        elif key == "embed_args" and value == {"proj": False} and (
                args.get("backbone") in CONV_STEMS.get(arch.name, ())):
            continue  # the stem's last convolution gives the tokens
        elif key == "block_fn" and arch.family == "vit":
            if not isinstance(value, str) or value not in TIMM_BLOCKS:
                raise refuse(key, value, f"(it is none of "
                             f"{', '.join(map(repr, TIMM_BLOCKS))})")
            out.update(TIMM_BLOCKS[value])
        elif arch.family == "vit" and (key in TIMM_OPTIONS
                                       or key in _READ_ONLY):
            try:
                ours, mapped = _option(key, value)
            except ValueError as e:
                raise refuse(key, value, f"(it {e})") from None
            out[ours] = mapped
        elif key in ("class_token", "qkv_bias") and value is True:
            continue  # a hybrid's defaults
        else:
            raise refuse(key, value, f"({_HONOURS})")
    if "norm_layer" in norms:
        kind, out["layer_norm_epsilon"] = norms["norm_layer"]
        if kind != "layer":
            out["norm"] = kind
    if "embed_norm_layer" in norms:
        if norms["embed_norm_layer"] != norms.get("norm_layer",
                                                  ("layer", 1e-6)):
            raise refuse("embed_norm_layer", args["embed_norm_layer"],
                         "(keras_vit's patch norm is of the kind and "
                         "epsilon of the model's norm_layer, "
                         f"{shown(args.get('norm_layer', 'layernorm'))})")
        out["patch_norm"] = True
    glu = out.get("mlp") == "swiglu"
    silu = _is_silu(args.get("act_layer"))
    if glu != silu:
        # A GLU gated by GELU (timm's default act_layer), or SiLU in
        # timm's plain MLP: neither is an MLP keras_vit builds.
        key = "mlp_layer" if glu else "act_layer"
        raise refuse(key, args[key], "(keras_vit gates with SiLU, in its "
                     "SwiGLU MLP only: mlp_layer SwiGLU or SwiGLUPacked "
                     "with act_layer 'silu')")
    if glu and out.get("classifier") == "map":
        raise refuse("act_layer", args["act_layer"], "(keras_vit's "
                     "attention pool takes a GELU, not SiLU)")
    if "mlp_ratio" in args and vit:
        ratio = args["mlp_ratio"]
        if not _is_number(ratio) or not ratio > 0:
            raise refuse("mlp_ratio", ratio, "(it is not a positive number)")
        # timm's Block: int(dim * mlp_ratio) hidden units; a packed
        # GLU's first layer is twice the width its gate leaves.
        width = int(out.get("hidden_size", arch.config["hidden_size"])
                    * ratio)
        packed = glu and args.get("mlp_layer") != UNPACKED_GLU
        if packed and width % 2:
            raise refuse("mlp_ratio", ratio, "(a packed GLU's projection "
                         f"must be even, and it gives {width} units)")
        out["mlp_dim"] = width // (2 if packed else 1)
    if out.get("post_norm") and "layer_scale" in out:
        # ResPostBlock has no layer scale: init_values only initialises
        # its norms' scales, which the file holds.
        del out["layer_scale"]
    options = dict(arch.config, **out)
    if arch.family == "vit":
        # timm's defaults that follow from other settings: the norm after
        # average pooling (fc_norm None), the patch bias off with pre_norm.
        if options.get("fc_norm", None) is None:
            options["fc_norm"] = options.get("classifier", "token") in (
                "gap", "max", "avgmax")
        if "pre_norm" in out:
            options["patch_bias"] = not out["pre_norm"]
        if (options.get("classifier", "token") != "token"
                and "class_token" not in options):
            options["class_token"] = True  # timm keeps it unless told
        out = {k: v for k, v in options.items()
               if k in out or k not in arch.config
               or arch.config[k] != v}
        if not out.get("fc_norm", True):
            out.pop("fc_norm")
    return out
