"""The argument checks every encoder model (ViT, hybrids, Axial-ViT)
shares, each error naming the argument.

>>> check_patch_grid(224, 16)
((224, 224), 16, (14, 14))
>>> check_patch_grid(224, 16, stem_stride=16)
Traceback (most recent call last):
ValueError: image_size must be divisible by 256 (ResNet stride 16 x patch_size=16); received image_size=224
"""

from __future__ import annotations

from keras_vit.base import geometry
from keras_vit.base import options as options_table
from keras_vit.base.checks import (check_choice, check_int, check_number,
                                   check_pair, shown)
from keras_vit.layers.image_sizes import check_image_size
from keras_vit.models.hybrid import check_resnet
from keras_vit.models.memory import check_weights_fit

POSITION_EMBEDDINGS = ("learned_1d", "none", "learned_2d", "relative",
                       "sincos_2d")
PLACEMENTS = ("stem", "every_layer", "every_layer_shared")
# How the head pools the tokens ("avg" is another name for "gap").
CLASSIFIERS = ("token", "gap", "avg", "max", "avgmax", "map", "token_gap")
POOLINGS = (None, *CLASSIFIERS)


def check_position_embedding(kind, placement, hidden_size, num_heads):
    """Validates ``position_embedding`` and ``position_embedding_placement``."""
    check_choice("position_embedding", kind, POSITION_EMBEDDINGS)
    check_choice("position_embedding_placement", placement, PLACEMENTS)
    if kind == "none" and placement != "stem":
        raise ValueError(
            "position_embedding='none' adds nothing anywhere, so it takes no "
            "placement other than 'stem'; received "
            f"position_embedding_placement={placement!r}")
    if kind == "learned_2d" and hidden_size % 2:
        raise ValueError(
            "position_embedding='learned_2d' needs an even hidden_size (X and "
            f"Y tables of D/2 each); received hidden_size={hidden_size}")
    if kind == "sincos_2d" and (hidden_size % 4 or hidden_size < 8):
        raise ValueError(
            "position_embedding='sincos_2d' needs a hidden_size that is a "
            f"multiple of 4 and at least 8; received hidden_size={hidden_size}")
    return kind, placement


def check_patch_grid(image_size, patch_size, stem_stride=1):
    """Checks that square ``patch_size`` patches tile ``image_size`` after a
    stem that divides it by ``stem_stride`` (a hybrid's ResNet; 1: none).
    Returns ``((height, width), patch, (rows, cols))``."""
    image_hw = check_image_size(image_size)
    patch_hw = check_pair("patch_size", patch_size)
    if patch_hw[0] != patch_hw[1]:
        raise ValueError(
            f"patch_size must be square; received patch_size={patch_size!r}")
    patch = patch_hw[0]
    stride = stem_stride * patch
    if image_hw[0] % stride or image_hw[1] % stride:
        what = (f"patch_size={patch}" if stem_stride == 1 else
                f"{stride} (ResNet stride {stem_stride} x "
                f"patch_size={patch})")
        raise ValueError(
            f"image_size must be divisible by {what}; received "
            f"image_size={image_size!r}")
    return image_hw, patch, (image_hw[0] // stride, image_hw[1] // stride)


# What check_encoder_args returns, kept by the models as attributes.
NORMALISED = ("hidden_size", "num_layers", "num_heads", "mlp_dim",
              "num_channels", "representation_size", "num_classes",
              "dropout_rate", "attention_dropout_rate")


def _rate(value, name):
    return float(check_number(name, value, low=0, high=1, high_open=True))


def check_encoder_args(hidden_size, num_layers, num_heads, mlp_dim,
                       num_channels, pooling, poolings, representation_size,
                       include_top, num_classes, dropout_rate,
                       attention_dropout_rate, *, image_size=None, tokens=0):
    """The argument checks every encoder model shares; returns the
    arguments named in :data:`NORMALISED`, normalised, as a dict.
    ``tokens``: the position table's rows, counted in the weight check."""
    options_table.flag("include_top", include_top)
    hidden_size = check_int("hidden_size", hidden_size, low=1)
    num_layers = check_int("num_layers", num_layers, low=0)
    num_heads = check_int("num_heads", num_heads, low=1)
    mlp_dim = check_int("mlp_dim", mlp_dim, low=1)
    num_channels = check_int("num_channels", num_channels, low=1)
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size must be divisible by num_heads={num_heads}; "
            f"received hidden_size={hidden_size}")
    check_choice("pooling", pooling, poolings)
    if representation_size is not None:
        representation_size = check_int(
            "representation_size", representation_size, low=1)
    if include_top:
        num_classes = check_int("num_classes", num_classes, low=1)
    # A lower bound of the weights, before any is allocated: image_size=10**6
    # asked ViT-Ti for a 2.7 TiB table, which failed inside the allocation.
    check_weights_fit(
        num_layers * (4 * hidden_size * hidden_size
                      + 2 * hidden_size * mlp_dim)
        + (num_classes or 0) * hidden_size * bool(include_top)
        + tokens * hidden_size,
        (f"image_size={image_size!r} ({tokens:,} tokens of position "
         "embedding), " if tokens else "")
        + f"hidden_size={hidden_size}, num_layers={num_layers}, "
        f"mlp_dim={mlp_dim}" + (f", num_classes={num_classes}"
                                if include_top else ""))
    rates = dict(dropout_rate=_rate(dropout_rate, "dropout_rate"),
                 attention_dropout_rate=_rate(attention_dropout_rate,
                                              "attention_dropout_rate"))
    check_remat_scope(**rates)
    return dict(
        hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        mlp_dim=mlp_dim, num_channels=num_channels,
        representation_size=representation_size, num_classes=num_classes,
        **rates)


def check_remat_scope(dropout_rate, attention_dropout_rate):
    """Refuses to build a model inside ``keras.RematScope`` where the
    scope's per-layer remat goes wrong, naming ``remat=True``: on JAX it
    traces each Dropout's Python ``training`` flag and fails; on
    TensorFlow with dropout each recomputation draws a new mask (gradients
    off by 0.24 on a tiny ViT, silently). torch's checkpoint works.
    """
    from keras_vit.runtime import compat
    from keras_vit.runtime.backend import name as backend_name

    backend = backend_name()
    mode = compat.current_remat_mode()
    if mode is None or backend == "torch":
        return
    if backend == "tensorflow" and not (dropout_rate
                                        or attention_dropout_rate):
        return
    why = ("traces the dropout layers' training flag and fails"
           if backend == "jax" else
           "recomputes every dropout layer with a new mask (wrong "
           "gradients)")
    raise ValueError(
        f"keras.RematScope(mode={mode!r}) {why} on {backend}: build the "
        "model with remat=True instead, which rematerialises each block and "
        "keeps its masks" + (", or with dropout_rate=0 and "
                             "attention_dropout_rate=0" if backend ==
                             "tensorflow" else "")
        + f"; received dropout_rate={dropout_rate}, attention_dropout_rate="
        f"{attention_dropout_rate}")


# The ViT family's options with their defaults (the paper's ViT).
FAMILY_DEFAULTS = options_table.DEFAULTS


def check_family_options(options, classifier, pooling, include_top,
                         position_embedding, placement):
    """The family options ``options`` (a dict of :data:`FAMILY_DEFAULTS`'
    keys) checked and normalised by their rows' checks, ``class_token`` a
    bool (None: as ``classifier`` says), then the checks between options.
    ``classifier`` and ``pooling`` are normalised (``"avg"`` is ``"gap"``).
    """
    out = options_table.checked(options)
    token = out["class_token"]
    if token is None:
        token = classifier in options_table.CLASS_TOKEN_POOLINGS
    out["class_token"] = token
    for row in options_table.OPTIONS:  # the checks the rows declare
        need = (row.requires and out[row.name] != row.default
                and row.requires(out[row.name], out))
        if need:
            raise ValueError(f"{row.name}={out[row.name]!r} needs {need}")
    method = classifier if include_top else pooling
    # The argument that chose the pooling, as the messages name it.
    chosen = f"{'classifier' if include_top else 'pooling'}={method!r}"
    if method in options_table.CLASS_TOKEN_POOLINGS and not token:
        raise ValueError(
            f"{chosen} takes the class token, but class_token=False builds "
            "the model without one; pool by 'gap', 'max', 'avgmax' or "
            f"'map' or keep the class token; received {chosen}, "
            "class_token=False")
    if out["fc_norm"] and not out["final_norm"]:
        raise ValueError(
            "fc_norm=True moves the final norm after the pooling, and "
            "final_norm=False builds none; received fc_norm=True, "
            "final_norm=False")
    if out["fc_norm"] and method in (None, "token", "token_gap"):
        raise ValueError(
            "fc_norm=True normalises the pooled patch tokens (after 'gap', "
            "'max', 'avgmax' or 'map' pooling); received fc_norm=True with "
            + chosen)
    if out["distilled"] and (method not in (None, "token")
                             or out["num_registers"] or not token):
        raise ValueError(
            "distilled=True reads the class and distillation tokens (DeiT): "
            "it needs the class token, token pooling and no register "
            f"tokens; received {chosen}, class_token={token}, num_registers="
            f"{out['num_registers']}")
    unused = [f"{name}={options[name]!r}" for name in (
        "rope_temperature", "rope_offset", "rope_indexing", "rope_halves")
        if out[name] != FAMILY_DEFAULTS[name]]
    if unused and out["rope"] is None:
        raise ValueError(
            f"{', '.join(unused)} set the rotary embeddings, and rope=None "
            "builds none; received rope=None, " + ", ".join(unused))
    if out["merge_size"] and (out["merge_size"] < 2 or token
                              or out["num_registers"] or out["distilled"]
                              or method == "map"):
        raise ValueError(
            "merge_size merges k x k blocks (k of 2 or more) of the patch "
            "tokens alone and the pooling reads the merged tokens: it "
            "needs no class, register or distillation token and pooling "
            "by 'gap', 'max' or 'avgmax'; received merge_size="
            f"{out['merge_size']}, class_token={token}, num_registers="
            f"{out['num_registers']}, distilled={out['distilled']}, {chosen}")
    if out["relative_bias"] is not None and (
            not token or out["num_registers"] or out["distilled"]):
        raise ValueError(
            "relative_bias adds BEiT's bias over the class token and the "
            "patches: it needs the class token and no register or "
            f"distillation token; received relative_bias="
            f"{out['relative_bias']!r}, class_token={token}, num_registers="
            f"{out['num_registers']}, distilled={out['distilled']}")
    if out["pool_heads"] is not None and method != "map":
        raise ValueError(
            "pool_heads sets the attention-pool head's heads "
            "(classifier='map'); received pool_heads="
            f"{out['pool_heads']}, {chosen}")
    if out["naflex"] and (
            out["rope"] is not None or out["relative_bias"] is not None
            or out["merge_size"] or position_embedding not in (
                "learned_1d", "none") or placement != "stem"):
        what = ", ".join(
            [f"{name}={out[name]!r}" for name in ("rope", "relative_bias",
                                                  "merge_size")
             if out[name] != FAMILY_DEFAULTS[name]]
            + [f"position_embedding={position_embedding!r}",
               f"position_embedding_placement={placement!r}"])
        raise ValueError(
            "naflex=True resizes a learned table at the stem to each "
            "image's grid (or takes none), and nothing else ties the "
            "tokens to their grid; received naflex=True, " + what)
    if not out["posemb_includes_prefix"] and (
            position_embedding not in ("learned_1d", "learned_2d",
                                       "sincos_2d") or placement != "stem"):
        raise ValueError(
            "posemb_includes_prefix=False adds the position table to the "
            "patches before the class and register tokens join them: it "
            "needs an additive table at the stem; received "
            f"position_embedding={position_embedding!r}, "
            f"position_embedding_placement={placement!r}")
    return out


def check_vit_args(image_size, patch_size, hidden_size, num_layers,
                   num_heads, mlp_dim, num_classes, classifier,
                   representation_size, dropout_rate, attention_dropout_rate,
                   include_top, pooling, num_channels, resnet,
                   position_embedding, position_embedding_placement, family):
    """Checks a ViT's arguments (each error names the argument) and returns
    what the graph builders need, normalised, as a dict. ``family``: the
    family options (:data:`FAMILY_DEFAULTS`)."""
    options_table.flag("include_top", include_top)
    given, resnet = resnet, check_resnet(resnet)
    if resnet is not None and "num_layers" not in given:
        raise ValueError(
            "resnet must give num_layers, the depth of each stage ([] for "
            f"the root alone); received resnet={shown(given)}")
    stem_stride = 1
    if resnet is not None:
        stem_stride = geometry.hybrid_stride(resnet)
    if resnet is not None and family.get("naflex"):
        raise ValueError(
            "naflex=True takes patches cut from the pixels: a ResNet stem "
            f"does not apply; received naflex=True, resnet={shown(resnet)}")
    image_hw, patch, grid = check_patch_grid(image_size, patch_size,
                                             stem_stride)
    # num_classes=0 with the head asked for: the pooled embedding, no head.
    headless = (include_top and isinstance(num_classes, int)
                and not isinstance(num_classes, bool) and num_classes == 0)
    head = include_top and not headless
    spec = check_encoder_args(
        hidden_size, num_layers, num_heads, mlp_dim, num_channels,
        pooling, POOLINGS, representation_size, head,
        num_classes, dropout_rate, attention_dropout_rate,
        image_size=image_size, tokens=grid[0] * grid[1] + 1)
    check_choice("classifier", classifier, CLASSIFIERS)
    if classifier in ("gap", "map") and pooling == "token" and (
            family["class_token"] is None):
        raise ValueError(
            f"pooling='token' takes the class token, but classifier="
            f"{classifier!r} builds the model without one; use pooling="
            f"{classifier!r} or classifier='token'; received "
            f"classifier={classifier!r}, pooling={pooling!r}")
    check_position_embedding(position_embedding,
                             position_embedding_placement,
                             spec["hidden_size"], spec["num_heads"])
    method = {"avg": "gap"}.get(classifier, classifier)
    pool = {"avg": "gap"}.get(pooling, pooling)
    family = check_family_options(
        family, method, method if headless else pool, include_top,
        position_embedding, position_embedding_placement)
    if family["distilled"] and spec["representation_size"] is not None:
        raise ValueError(
            "distilled=True puts its two heads on the tokens themselves "
            "(DeiT has no pre_logits layer); received distilled=True, "
            f"representation_size={spec['representation_size']}")
    beyond = [i for i in family["global_blocks"] or ()
              if i >= spec["num_layers"]]
    if beyond:
        raise ValueError(
            f"global_blocks names block {beyond[0]}, and the model's blocks "
            f"are 0 to {spec['num_layers'] - 1}; received global_blocks="
            f"{family['global_blocks']}, num_layers={spec['num_layers']}")
    spec.update(image_hw=image_hw, patch=patch, resnet=resnet, grid=grid,
                stride=stem_stride * patch, head=head, family=family,
                method=method if include_top else pool)
    return spec


def check_head_outputs(spec, include_top, label_names, classifier_activation,
                       return_attention_scores):
    """Refuses head arguments that ``spec`` (:func:`check_vit_args`'
    result) cannot honour, naming them."""
    options_table.flag("return_attention_scores", return_attention_scores)
    family = spec["family"]
    if include_top and not spec["head"] and (
            label_names is not None or classifier_activation is not None):
        what = ("label_names" if label_names is not None
                else "classifier_activation")
        raise ValueError(
            f"{what} belongs to a head, and num_classes=0 builds none "
            "(the model returns the pooled embedding); received "
            f"num_classes=0, {what}="
            f"{label_names if what == 'label_names' else classifier_activation!r}")
    if family["head_type"] == "projection" and (
            not spec["head"] or label_names is not None
            or classifier_activation is not None):
        what = ("num_classes=0" if include_top and not spec["head"]
                else "include_top=False" if not include_top
                else f"label_names={shown(label_names)}"
                if label_names is not None
                else f"classifier_activation={classifier_activation!r}")
        raise ValueError(
            "head_type='projection' makes the head an embedding (the "
            "image-text projection of CLIP's towers): it needs the head "
            "and has no classes to name or score; received "
            f"head_type='projection', {what}")
    if return_attention_scores and family["window_size"]:
        raise ValueError(
            "return_attention_scores=True returns each block's maps over "
            "all the tokens, and window_size attends within windows; "
            f"received window_size={family['window_size']}, "
            "return_attention_scores=True")
