"""Random checkpoints written in the official vit_jax ``.npz`` layout.

The key names and shapes are transcribed from the released files (see
shared/FACTS.md), not derived from keras_vit, so that a loader bug cannot
hide behind a generator that shares it. Every array is random, LayerNorm
scales, class token and position embeddings included.
"""

import numpy as np


def vit_arrays(*, patch, hidden, layers, heads, mlp, grid, num_classes,
               classifier="token", representation_size=None, channels=3,
               seed=0, layout="old"):
    """Returns ``{key: float32 array}`` for a ViT.

    layout: "old" (vit_jax numbering), "new" (big_vision numbering, params/
    prefix, top-level pos_embedding) or "stacked" (new numbering with every
    block stacked under Transformer/encoderblock).
    """
    rng = np.random.default_rng(seed)

    def w(*shape, fan_in=None):
        scale = 1.0 / np.sqrt(fan_in) if fan_in else 0.5
        return (rng.standard_normal(shape) * scale).astype("float32")

    def ln():
        return {"scale": (1.0 + 0.2 * rng.standard_normal(hidden)).astype("float32"),
                "bias": w(hidden) * 0.2}

    dh = hidden // heads
    tokens = grid * grid + (1 if classifier == "token" else 0)
    a = {
        "embedding/kernel": w(patch, patch, channels, hidden,
                              fan_in=patch * patch * channels),
        "embedding/bias": w(hidden) * 0.2,
        "Transformer/posembed_input/pos_embedding": w(1, tokens, hidden) * 0.4,
    }
    if classifier == "token":
        a["cls"] = w(1, 1, hidden) * 0.4
    new = layout in ("new", "stacked")
    names = (("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1",
              "MlpBlock_0") if new else
             ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2",
              "MlpBlock_3"))
    blocks = []
    for _ in range(layers):
        b = {}
        for k, v in ln().items():
            b[f"{names[0]}/{k}"] = v
        for proj in ("query", "key", "value"):
            b[f"{names[1]}/{proj}/kernel"] = w(hidden, heads, dh, fan_in=hidden)
            b[f"{names[1]}/{proj}/bias"] = w(heads, dh) * 0.2
        b[f"{names[1]}/out/kernel"] = w(heads, dh, hidden, fan_in=hidden)
        b[f"{names[1]}/out/bias"] = w(hidden) * 0.2
        for k, v in ln().items():
            b[f"{names[2]}/{k}"] = v
        b[f"{names[3]}/Dense_0/kernel"] = w(hidden, mlp, fan_in=hidden)
        b[f"{names[3]}/Dense_0/bias"] = w(mlp) * 0.2
        b[f"{names[3]}/Dense_1/kernel"] = w(mlp, hidden, fan_in=mlp)
        b[f"{names[3]}/Dense_1/bias"] = w(hidden) * 0.2
        blocks.append(b)
    if layout == "stacked":
        for k in blocks[0]:
            a[f"Transformer/encoderblock/{k}"] = np.stack([b[k] for b in blocks])
    else:
        for i, b in enumerate(blocks):
            for k, v in b.items():
                a[f"Transformer/encoderblock_{i}/{k}"] = v
    for k, v in ln().items():
        a[f"Transformer/encoder_norm/{k}"] = v
    width = hidden
    if representation_size:
        a["pre_logits/kernel"] = w(hidden, representation_size, fan_in=hidden)
        a["pre_logits/bias"] = w(representation_size) * 0.2
        width = representation_size
    if num_classes:
        a["head/kernel"] = w(width, num_classes, fan_in=width)
        a["head/bias"] = w(num_classes) * 0.2
    if new:
        a["pos_embedding"] = a.pop("Transformer/posembed_input/pos_embedding")
        a = {f"params/{k}": v for k, v in a.items()}
    return a


def write(path, arrays):
    np.savez(path, **arrays)
    return path


def hybrid_arrays(*, num_layers, width, seed=0, gn_4d=False, channels=3):
    """The vit_jax hybrid ResNet keys (unprefixed; combine with vit_arrays).

    conv_root, gn_root, block{s}/unit{u}/{conv1,conv2,conv3,conv_proj}/kernel
    and {gn1,gn2,gn3,gn_proj}/{scale,bias}, units numbered from 1 without
    zero padding; GroupNorm arrays stored (1, 1, 1, C) when gn_4d.
    """
    rng = np.random.default_rng(seed + 1000)

    def conv(k, cin, cout):
        return (rng.standard_normal((k, k, cin, cout)) * 0.3).astype("float32")

    def gn(prefix, c):
        shape = (1, 1, 1, c) if gn_4d else (c,)
        return {f"{prefix}/scale": (1 + 0.3 * rng.standard_normal(shape)).astype("float32"),
                f"{prefix}/bias": (0.3 * rng.standard_normal(shape)).astype("float32")}

    a = {"conv_root/kernel": conv(7, channels, width)}
    a.update(gn("gn_root", width))
    units, out_channels = resnet_units(num_layers, width)
    for s, u, cin, mid, out in units:
        # Post-activation: every convolution's output has its GroupNorm.
        convs = [("conv_proj", 1, cin, out, "gn_proj")] if u == 1 else []
        convs += [("conv1", 1, cin, mid, "gn1"), ("conv2", 3, mid, mid, "gn2"),
                  ("conv3", 1, mid, out, "gn3")]
        for name, size, c_in, c_out, norm in convs:
            a[f"block{s}/unit{u}/{name}/kernel"] = conv(size, c_in, c_out)
            a.update(gn(f"block{s}/unit{u}/{norm}", c_out))
    return a, out_channels


def resnet_units(depths, width):
    """``([(stage, unit, in, mid, out)], out_channels)``: the bottleneck
    units of a ResNet whose stages hold ``depths`` units after a root of
    ``width`` channels, stage ``s`` ``width * 2 ** (s - 1)`` wide inside
    and four times that outside (vit_jax's hybrids and BiT alike); stages
    and units count from 1, the first unit of a stage projects its input.
    """
    units, cin = [], width
    for s, depth in enumerate(depths, start=1):
        mid = width * 2 ** (s - 1)
        for u in range(1, depth + 1):
            units.append((s, u, cin, mid, 4 * mid))
            cin = 4 * mid
    return units, cin
