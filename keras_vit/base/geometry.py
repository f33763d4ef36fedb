"""What a model config implies, from its numbers alone: the hybrids' ResNet
stages, strides and widths, the token grid, the prefix tokens and the
parameter count. Plain arithmetic, no framework.

>>> config = {"patch_size": 16, "resnet": {"num_layers": (3, 4, 9)}}
>>> effective_stride(config)
256
>>> hybrid_stride({"num_layers": (3, 4, 9)})
16
>>> prefix_tokens({"classifier": "token", "num_registers": 4})
5
"""

from __future__ import annotations

from keras_vit.base import options


def hybrid_stages(resnet):
    """The stage depths a hybrid builds: option (ii) of the paper (section
    4.1) folds the last stage's units into the one before it.

    >>> hybrid_stages({"num_layers": (3, 4, 6, 3), "fold_last_stage": True})
    [3, 4, 9]
    """
    depths = list(resnet["num_layers"])
    if resnet.get("fold_last_stage") and len(depths) > 1:
        depths = depths[:-2] + [depths[-2] + depths[-1]]
    return depths


def hybrid_stride(resnet):
    """Input pixels per feature-map pixel of a hybrid's ResNet (1 without
    one): the root conv and max-pool divide by 4, every stage after the
    first by 2."""
    if resnet is None:
        return 1
    return 4 * 2 ** max(len(hybrid_stages(resnet)) - 1, 0)


def hybrid_width(resnet):
    """The channels of a hybrid's root conv (stage ``s``'s bottleneck
    width over ``2**s``)."""
    return int(round(64 * resnet.get("width_factor", 1)))


def bit_widths(width_factor, num_stages=4):
    """``(root, [bottleneck width of each stage])`` of a BiT ResNet-v2."""
    return (int(round(64 * width_factor)),
            [int(round(64 * 2 ** s * width_factor))
             for s in range(num_stages)])


def effective_stride(config):
    """Input pixels per token side: the patch size times the ResNet stride
    (BiT: 32).

    >>> effective_stride({"patch_size": 1, "resnet": {"num_layers": (3, 4, 9)}})
    16
    >>> effective_stride({"patch_size": 8, "resnet": {"num_layers": ()}})
    32
    """
    if "block_units" in config:
        return 32
    return _patch_side(config) * hybrid_stride(config.get("resnet"))


def _patch_side(config):
    patch = config.get("patch_size", 32)
    return patch[0] if isinstance(patch, (tuple, list)) else patch


def grid_side(config, image_size):
    """Tokens along one side of ``image_size`` pixels: a hybrid's stem
    halves with TF 'SAME' rounding (up), then the patches cut without
    padding (down)."""
    side = image_size
    resnet = config.get("resnet")
    if resnet is not None:
        for _ in range(2 + max(len(hybrid_stages(resnet)) - 1, 0)):
            side = -(-side // 2)  # root conv, max-pool, then each stage
    return side // _patch_side(config)


def check_grid(config, image_size, where):
    """Refuses, in one ``ValueError`` naming ``where`` (a model name) and
    ``image_size``, a size the model's patches do not tile, as the builder
    refuses it. BiT takes any size.

    >>> check_grid({"patch_size": 300}, 224, "ViT-B/300")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ViT-B/300 at image_size=224: ... larger than the image; ...
    >>> check_grid({"patch_size": 15}, 224, "ViT-B/15")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ... name a multiple of 15, e.g. 'ViT-B/15-225'
    """
    if "block_units" in config:
        return
    stride = effective_stride(config)
    sides = (tuple(image_size) if isinstance(image_size, (tuple, list))
             else (image_size, image_size))
    patch = config.get("patch_size", 32)
    what = f"patch_size={patch}" if stride == patch else (
        f"ResNet stride {stride // patch} x patch_size={patch}")
    # The nearest size that works, as a name takes it ("ViT-B/15-225").
    fit = -(-max(sides) // stride) * stride
    if min(sides) < stride:
        raise ValueError(
            f"{where} at image_size={image_size}: its patches are {stride} "
            f"pixels a side ({what}), larger than the image; name a size of "
            f"at least {stride}, e.g. '{where}-{fit}'")
    if any(side % stride for side in sides):
        raise ValueError(
            f"{where} at image_size={image_size}: the image is not tiled by "
            f"its {stride}-pixel patches ({what}); name a multiple of "
            f"{stride}, e.g. '{where}-{fit}'")


def class_token(config):
    """Whether the model has a class token (``class_token=None``: as
    ``classifier`` says, one for ``"token"`` and ``"token_gap"`` only)."""
    token = config.get("class_token")
    if token is None:
        return (config.get("classifier") or "token") in (
            options.CLASS_TOKEN_POOLINGS)
    return bool(token)


def prefix_tokens(config):
    """Tokens before the patches, as the option rows put them."""
    return options.prefix_tokens(_option_values(config))


def _option_values(config):
    """Every option row's value in ``config``, defaults filled in, checked,
    and the class token resolved."""
    values = options.checked(dict(options.DEFAULTS, **{
        k: config[k] for k in config if k in options.ROWS}))
    values["class_token"] = class_token(config)
    return values


def _conv(k, c_in, c_out, bias=False):
    return k * k * c_in * c_out + (c_out if bias else 0)


#: timm's ResNet-D deep stem: (channels, stride) of its 3x3 convolutions.
RESNET_D_STEM = ((32, 2), (32, 1), (64, 1))


def _resnet_v1_params(resnet, channels):
    """``(parameters, output channels)`` of the hybrids' post-activation
    ResNet: StdConv root + GroupNorm (timm's ResNet-D: its deep stem, and a
    BatchNorm, four values a channel, after every convolution), then
    bottleneck units."""
    width, d = hybrid_width(resnet), resnet.get("variant") == "d"
    norm = 4 if d else 2
    if d:
        total = 0
        for out, _ in RESNET_D_STEM:
            total += _conv(3, channels, out) + 4 * out
            channels = out
    else:
        total = _conv(7, channels, width) + 2 * width
        channels = width
    for s, depth in enumerate(resnet["num_layers"] if d
                              else hybrid_stages(resnet)):
        mid = width * 2 ** s
        out = 4 * mid
        for u in range(depth):
            total += (_conv(1, channels, mid) + _conv(3, mid, mid)
                      + _conv(1, mid, out) + norm * (mid + mid + out))
            if channels != out or (u == 0 and (d or s > 0)):
                total += _conv(1, channels, out) + norm * out
            channels = out
    return total, channels


def _bit_params(config, channels, classes):
    """BiT's pre-activation ResNet-v2, its last GroupNorm and the head."""
    root, mids = bit_widths(config.get("width_factor", 1))
    total = _conv(7, channels, root)
    channels = root
    for s, (depth, mid) in enumerate(zip(config["block_units"], mids)):
        out = 4 * mid
        for u in range(depth):
            total += (2 * channels + _conv(1, channels, mid) + 2 * mid
                      + _conv(3, mid, mid) + 2 * mid + _conv(1, mid, out))
            if channels != out or (s > 0 and u == 0):
                total += _conv(1, channels, out)
            channels = out
    return total + 2 * channels + channels * classes + classes


# Config keys that change no parameter count.
_NO_PARAMETERS = {
    "name", "dtype", "trainable", "dropout_rate", "attention_dropout_rate",
    "include_preprocessing", "classifier_activation",
    "return_attention_scores", "label_names", "dynamic_image_size", "remat",
    "gelu", "layer_norm_epsilon", "head_bias_init", "input_normalization",
    "pooling", "image_size", "return_stages",
    *(o.name for o in options.OPTIONS if not o.parameters)}
# Keys the count below reads.
_COUNTED = {
    "hidden_size", "mlp_dim", "num_heads", "num_layers", "patch_size",
    "resnet", "classifier", "representation_size", "num_classes",
    "include_top", "num_channels", "position_embedding",
    "position_embedding_placement", "block_units", "width_factor",
    *(o.name for o in options.OPTIONS if o.parameters)}


def mlp_first_width(mlp_dim, kind="gelu"):
    """The width of an encoder MLP's first projection: ``mlp_dim``, or
    twice that for a packed gated MLP.

    >>> mlp_first_width(4096), mlp_first_width(4096, "swiglu")
    (4096, 8192)
    """
    return mlp_dim * (1 if kind == "gelu" else 2)


def norm_params(config, width):
    """The parameters of one of the model's norms over ``width``
    features.

    >>> norm_params({}, 8), norm_params({"norm": "rms"}, 8)
    (16, 8)
    """
    return width * (1 if config.get("norm", "layer") == "rms" else 2)


def attention_pool_params(config):
    """The parameters of the attention-pool head (``classifier="map"``, or
    ``pooling="map"`` without the head; 0 for any other pooling).

    >>> attention_pool_params(dict(classifier="map", hidden_size=8,
    ...                            mlp_dim=16))
    592
    >>> attention_pool_params(dict(classifier="map", hidden_size=8,
    ...                            mlp_dim=16, pool_form="aimv2"))
    224
    """
    if _pooling(config) != "map":
        return 0
    d, mlp = config["hidden_size"], config["mlp_dim"]
    if config.get("pool_form", "map") == "aimv2":
        return d + 2 * (d * d + d * config.get("qkv_bias", True)) + (
            d * d + d)
    return (d + 4 * (d * d + d) + norm_params(config, d)
            + (d * mlp + mlp) + (mlp * d + d))


def merged_widths(config):
    """``(merged, pooled)``: the width of a token after the patch merger
    and the width the pooling and head read.

    >>> merged_widths({"hidden_size": 8, "merge_size": 2})
    (32, 32)
    """
    merge = config.get("merge_size") or 1
    merged = merge * merge * config["hidden_size"]
    # "token_gap" reads the class token and the patches' mean side by side.
    return merged, (config.get("merge_width") or config.get("neck")
                    or merged) * (
        1 + (_pooling(config) == "token_gap"))


def _pooling(config):
    """How the model pools: its classifier, or without its head its
    ``pooling``."""
    if config.get("include_top", True):
        return config.get("classifier", "token")
    return config.get("pooling")


def parameter_count(config, image_size=None, num_classes=None,
                    representation_size=None):
    """The parameters of the model ``config`` builds (a registry config or
    a model's ``get_config()``), at ``image_size`` with ``num_classes``
    and ``representation_size`` when given, from the shapes alone. None
    for a config with options it does not know.

    >>> from keras_vit.base import variants
    >>> parameter_count(variants.parse("ViT-B/16").config)  # paper: 86M
    86567656
    >>> parameter_count(variants.parse("ViT-L/16").config)
    304326632
    """
    if set(config) - _COUNTED - _NO_PARAMETERS:
        return None
    image_size = image_size or config.get("image_size", 224)
    if isinstance(image_size, (tuple, list)):
        image_size = tuple(image_size)
    classes = config.get("num_classes", 1000) if num_classes is None \
        else num_classes
    if not config.get("include_top", True):
        classes = 0
    if not isinstance(classes, int):  # None: the builder says what it takes
        return None
    channels = config.get("num_channels", 3)
    if "block_units" in config:
        return _bit_params(config, channels, classes)
    embedding = config.get("position_embedding", "learned_1d")
    if (embedding not in ("learned_1d", "sincos_2d", "none")
            or config.get("position_embedding_placement", "stem") != "stem"):
        return None
    d, mlp = config["hidden_size"], config["mlp_dim"]
    total = 0
    if config.get("resnet") is not None:
        total, channels = _resnet_v1_params(config["resnet"], channels)
    patch = config.get("patch_size", 32)
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    rows, cols = (image_size if isinstance(image_size, tuple)
                  else (image_size, image_size))
    grid = (grid_side(config, rows),
            grid_side(dict(config, patch_size=pw), cols))
    representation_size = (representation_size
                           or config.get("representation_size"))
    merged, pooled = merged_widths(config)
    width = representation_size or pooled
    first = mlp_first_width(mlp, config.get("mlp", "gelu"))
    # The 2020 ViT without its options; each option row adds its own.
    total += (ph * pw * channels * d
              + grid[0] * grid[1] * d * (embedding == "learned_1d"))
    total += config["num_layers"] * (2 * norm_params(config, d) + 4 * d * d
                                     + d * first + mlp * d)
    total += attention_pool_params(config) + width * classes + classes
    if representation_size:
        total += pooled * representation_size + representation_size
    try:
        values = _option_values(config)
    except ValueError:  # a value no row takes: the builder names it
        return None
    shape = options.Shape(
        width=d, head_width=d // config["num_heads"], mlp_first=first,
        mlp=mlp, norm=lambda w: norm_params(config, w),
        prefix=options.prefix_tokens(values),
        table=embedding == "learned_1d", head=width * classes + classes,
        merged=merged, final=pooled if config.get("fc_norm") else d,
        heads=config["num_heads"],
        bias_rows=(2 * grid[0] - 1) * (2 * grid[1] - 1) + 3, values=values,
        patch=(ph, pw), channels=channels, grid=grid,
        depth=config["num_layers"])
    for row in options.OPTIONS:
        if row.params is not None:
            per_block, once = row.params(values[row.name], shape)
            total += config["num_layers"] * per_block + once
    return total
