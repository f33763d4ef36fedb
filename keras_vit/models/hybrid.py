"""The hybrids' ResNet stem (the paper's R50+ViT): the ``resnet=``
argument's check and the stem's layers, in vit_jax's numerics or timm's.

>>> check_resnet(dict(num_layers=(3, 4, 9)))
{'num_layers': [3, 4, 9], 'width_factor': 1}
>>> check_resnet(dict(depth=3))
Traceback (most recent call last):
ValueError: resnet has unknown keys ['depth']; received resnet={'depth': 3}

Two ResNets: the paper's (``variant="bit"``, the default) and timm's
ResNet-D (``variant="d"``: resnet26d and resnet50d):

>>> check_resnet(dict(num_layers=(2, 2, 2, 2), variant="d"))
{'num_layers': [2, 2, 2, 2], 'width_factor': 1, 'variant': 'd'}
>>> check_resnet(dict(num_layers=(3, 4, 6), variant="d", width_factor=2))
... # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: resnet['width_factor'] must be 1 for variant 'd' (timm's ...
"""

from __future__ import annotations

from keras import layers

from keras_vit import layers as vit_layers
from keras_vit.base import geometry


def check_resnet(resnet):
    """Validates the ``resnet=`` option of a hybrid; returns a plain dict."""
    if resnet is None:
        return None
    if not isinstance(resnet, dict):
        raise ValueError(
            "resnet must be None or a dict like dict(num_layers=(3, 4, 9), "
            f"width_factor=1); received resnet={resnet!r}")
    unknown = set(resnet) - {"num_layers", "width_factor", "fold_last_stage",
                             "variant", *RESNET_NUMERICS}
    if unknown:
        raise ValueError(
            f"resnet has unknown keys {sorted(unknown)}; received "
            f"resnet={resnet!r}")
    num_layers = resnet.get("num_layers", ())
    if not isinstance(num_layers, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0
            for n in num_layers):
        raise ValueError(
            "resnet['num_layers'] must be a sequence of positive ints; "
            f"received resnet={resnet!r}")
    width_factor = resnet.get("width_factor", 1)
    if (not isinstance(width_factor, (int, float)) or width_factor <= 0
            or int(round(64 * width_factor)) % 32):
        raise ValueError(
            "resnet['width_factor'] must make 64 * width_factor a positive "
            f"multiple of 32 (GroupNorm groups); received resnet={resnet!r}")
    fold = bool(resnet.get("fold_last_stage", False))
    if fold and len(num_layers) < 2:
        raise ValueError(
            "resnet['fold_last_stage'] needs at least two stages; received "
            f"resnet={resnet!r}")
    config = {"num_layers": list(num_layers), "width_factor": width_factor}
    if fold:
        config["fold_last_stage"] = True
    if resnet.get("standardization", "std") not in ("std", "var"):
        raise ValueError(
            "resnet['standardization'] must be 'std' or 'var'; received "
            f"resnet={resnet!r}")
    for key in ("std_eps", "norm_epsilon"):
        value = resnet.get(key, 1.0)
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not value > 0):
            raise ValueError(f"resnet[{key!r}] must be a positive number; "
                             f"received resnet={resnet!r}")
    config.update({k: resnet[k] for k in RESNET_NUMERICS if k in resnet})
    variant = resnet.get("variant", "bit")
    if variant not in RESNET_VARIANTS:
        raise ValueError(
            f"resnet['variant'] must be one of {sorted(RESNET_VARIANTS)}; "
            f"received resnet={resnet!r}")
    if variant == "d":
        for key, why in (("width_factor", "must be 1"),
                         ("fold_last_stage", "cannot be set"),
                         ("standardization", "cannot be set"),
                         ("std_eps", "cannot be set")):
            if key in resnet and not (key == "width_factor"
                                      and resnet[key] == 1):
                raise ValueError(
                    f"resnet[{key!r}] {why} for variant 'd' (timm's "
                    f"resnet26d and resnet50d); received resnet={resnet!r}")
        config["variant"] = "d"
    return config


#: ``resnet["variant"]``: ``"bit"``, the paper's; ``"d"``, timm's ResNet-D.
RESNET_VARIANTS = ("bit", "d")


# The ResNet's numerics, official (vit_jax) by default, and timm's port's.
RESNET_NUMERICS = {"standardization": "std", "std_eps": 1e-5,
                   "norm_epsilon": 1e-6}
TIMM_RESNET_NUMERICS = {"standardization": "var", "std_eps": 1e-8,
                        "norm_epsilon": 1e-5}


def resnet_stem(x, resnet, dtype, remat=False):
    """The hybrids' ResNet: StdConv root, GN, ReLU, max-pool, stages (or
    timm's ResNet-D, ``variant="d"``)."""
    if resnet.get("variant") == "d":
        return resnet_d_stem(x, resnet, dtype)
    width = geometry.hybrid_width(resnet)
    num = {k: resnet.get(k, v) for k, v in RESNET_NUMERICS.items()}
    x = vit_layers.StdConv2D(
        width, 7, strides=2, padding="same", use_bias=False,
        standardization=num["standardization"], eps=num["std_eps"],
        kernel_initializer="lecun_normal", dtype=dtype,
        name="resnet_root_conv")(x)
    x = layers.GroupNormalization(32, epsilon=num["norm_epsilon"],
                                  dtype=dtype, name="resnet_root_norm")(x)
    x = layers.ReLU(dtype=dtype, name="resnet_root_relu")(x)
    # TF 'SAME' max-pool pads with -inf, as flax's max_pool does.
    x = layers.MaxPooling2D(3, 2, padding="same", dtype=dtype,
                            name="resnet_root_pool")(x)
    for s, depth in enumerate(geometry.hybrid_stages(resnet)):
        for u in range(depth):
            x = vit_layers.ResidualUnit(
                width * 2 ** s, strides=2 if (s > 0 and u == 0) else 1,
                epsilon=num["norm_epsilon"],
                standardization=num["standardization"],
                std_eps=num["std_eps"], remat=remat, dtype=dtype,
                name=f"resnet_block{s + 1}_unit{u + 1}")(x)
    return x


def resnet_d_stem(x, resnet, dtype):
    """timm's ResNet-D (``resnet26d``, ``resnet50d``; He et al. 2019), its
    first ``len(num_layers)`` stages: a deep stem of three 3x3
    convolutions, then bottleneck units whose first shortcut average-pools
    before its projection. 3x3 convolutions and the max-pool pad one pixel
    on every side, as PyTorch (TF's ``"same"`` pads a strided one at the
    end only)."""
    epsilon = resnet.get("norm_epsilon", 1e-5)

    def conv_norm(x, filters, kernel, strides, name, relu=True):
        if kernel == 3:
            x = layers.ZeroPadding2D(1, dtype=dtype, name=f"{name}_pad")(x)
        x = layers.Conv2D(filters, kernel, strides, use_bias=False,
                          dtype=dtype, name=name)(x)
        x = layers.BatchNormalization(
            epsilon=epsilon, momentum=0.9, dtype=dtype,
            name=name.replace("conv", "norm"))(x)
        return layers.ReLU(dtype=dtype, name=f"{name}_relu")(x) if relu \
            else x

    for n, (filters, strides) in enumerate(geometry.RESNET_D_STEM):
        x = conv_norm(x, filters, 3, strides, f"resnet_stem_conv_{n}")
    # After the ReLU, zero padding is as good as -inf for the maximum.
    x = layers.ZeroPadding2D(1, dtype=dtype, name="resnet_stem_pool_pad")(x)
    x = layers.MaxPooling2D(3, 2, dtype=dtype, name="resnet_stem_pool")(x)
    for s, depth in enumerate(resnet["num_layers"]):
        width = geometry.hybrid_width(resnet) * 2 ** s
        for u in range(depth):
            name, strides = f"resnet_block{s + 1}_unit{u + 1}", (
                2 if s > 0 and u == 0 else 1)
            y = conv_norm(x, width, 1, 1, f"{name}_conv1")
            y = conv_norm(y, width, 3, strides, f"{name}_conv2")
            y = conv_norm(y, 4 * width, 1, 1, f"{name}_conv3", relu=False)
            if u == 0:
                if strides > 1:
                    x = layers.AveragePooling2D(
                        2, 2, dtype=dtype, name=f"{name}_pool")(x)
                x = conv_norm(x, 4 * width, 1, 1, f"{name}_proj_conv",
                              relu=False)
            x = layers.Add(dtype=dtype, name=f"{name}_add")([y, x])
            x = layers.ReLU(dtype=dtype, name=f"{name}_relu")(x)
    return x
