"""timm's parameter names and the official ``.npz`` layout, both ways:
ViT (``blocks.{i}.attn.qkv`` split into query, key and value; the
attention pool ``attn_pool`` as big_vision's ``MAPHead_0``), the
ResNetV2+ViT hybrids (``patch_embed.backbone.stages.{s}.blocks.{b}``) and
BiT (``resnetv2_*_bit``). Plain functions of arrays, shared by the reader
(:mod:`keras_vit.zoo.timm.hub`) and the writer
(:mod:`keras_vit.zoo.timm.writer`); parameters with no official
counterpart raise a ValueError naming them.
"""

from __future__ import annotations

import re

import numpy as np

from keras_vit.base import options
from keras_vit.zoo import convert

# timm's names of the ViT family's poolings and MLP activations ->
# keras_vit's (VisionTransformer's classifier and gelu), for the reader and
# the writer.
TIMM_POOLS = {"token": "token", "avg": "gap", "max": "max",
              "avgmax": "avgmax", "map": "map"}
TIMM_ACTIVATIONS = {"gelu": "exact", "gelu_tanh": "tanh",
                    "quick_gelu": "quick"}
# timm's VisionTransformer arguments that are one of keras_vit's ViT family
# options: timm's name -> keras_vit's (the values' forms: the rows' timm
# Field, read by the reader and the writer).
TIMM_OPTIONS = {
    **{o.timm.name: o.name for o in options.OPTIONS if o.timm},
    "global_pool": "classifier", "act_layer": "gelu",
    "pos_embed": "position_embedding"}

_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
BLOCK_PARAMS = {
    "norm1.weight": "LayerNorm_0/scale", "norm1.bias": "LayerNorm_0/bias",
    "norm2.weight": "LayerNorm_2/scale", "norm2.bias": "LayerNorm_2/bias",
    "mlp.fc1.weight": "MlpBlock_3/Dense_0/kernel",
    "mlp.fc1.bias": "MlpBlock_3/Dense_0/bias",
    "mlp.fc2.weight": "MlpBlock_3/Dense_1/kernel",
    "mlp.fc2.bias": "MlpBlock_3/Dense_1/bias",
    "attn.qkv.weight": None, "attn.qkv.bias": None,  # split into q, k, v
    "attn.proj.weight": "MultiHeadDotProductAttention_1/out/kernel",
    "attn.proj.bias": "MultiHeadDotProductAttention_1/out/bias",
    # The ViT family's options: layer scale, q/k normalisation.
    "ls1.gamma": "LayerScale_0/scale", "ls2.gamma": "LayerScale_2/scale",
    "attn.q_norm.weight": "MultiHeadDotProductAttention_1/query_norm/scale",
    "attn.q_norm.bias": "MultiHeadDotProductAttention_1/query_norm/bias",
    "attn.k_norm.weight": "MultiHeadDotProductAttention_1/key_norm/scale",
    "attn.k_norm.bias": "MultiHeadDotProductAttention_1/key_norm/bias",
}
TOP_PARAMS = {
    "cls_token": "cls", "pos_embed": convert.POSEMB_KEY,
    "patch_embed.proj.weight": "embedding/kernel",
    "patch_embed.proj.bias": "embedding/bias",
    "norm.weight": "Transformer/encoder_norm/scale",
    "norm.bias": "Transformer/encoder_norm/bias",
    "head.weight": "head/kernel", "head.bias": "head/bias",
    "reg_token": "reg", "dist_token": "dist",
    "head_dist.weight": "head_dist/kernel", "head_dist.bias": "head_dist/bias",
    "norm_pre.weight": "Transformer/pre_norm/scale",
    "norm_pre.bias": "Transformer/pre_norm/bias",
    "fc_norm.weight": "fc_norm/scale", "fc_norm.bias": "fc_norm/bias",
    # timm's embed_norm_layer: the norm after the patch embedding (AIMv2).
    "patch_embed.norm.weight": "embedding_norm/scale",
    "patch_embed.norm.bias": "embedding_norm/bias",
}
# timm's unpacked SwiGLU (its SwiGLU class, AIMv2's MLP) projects the
# gate (fc1_g) and the value (fc1_x) with two Linears; keras_vit's
# "swiglu" MLP packs them into one Dense, gate first: the first layer's
# parameters of the two, concatenated [gate | value] on the output axis.
_GLU_HALVES = ("fc1_g", "fc1_x")
_GLU_KEY = re.compile(r"^mlp\.(fc1_g|fc1_x)\.(weight|bias)$")


# timm's attention pool (global_pool="map", AttentionPoolLatent with one
# latent) -> the official MAPHead names; q, kv and proj are split into
# heads by _attn_pool_to_official.
_POOL = "attn_pool."
_MAP_ATT = convert.MAP_HEAD + "MultiHeadDotProductAttention_0/"
POOL_PARAMS = {
    "latent": convert.MAP_HEAD + "probe",
    "proj.weight": _MAP_ATT + "out/kernel", "proj.bias": _MAP_ATT + "out/bias",
    "norm.weight": convert.MAP_HEAD + "LayerNorm_0/scale",
    "norm.bias": convert.MAP_HEAD + "LayerNorm_0/bias",
    "mlp.fc1.weight": convert.MAP_HEAD + "MlpBlock_0/Dense_0/kernel",
    "mlp.fc1.bias": convert.MAP_HEAD + "MlpBlock_0/Dense_0/bias",
    "mlp.fc2.weight": convert.MAP_HEAD + "MlpBlock_0/Dense_1/kernel",
    "mlp.fc2.bias": convert.MAP_HEAD + "MlpBlock_0/Dense_1/bias",
}
# The query and the stacked key/value projections: the parts of each.
_POOL_PROJECTIONS = {"q": ("query",), "kv": ("key", "value")}


def _attn_pool_to_official(param, value, num_heads, out):
    """Maps one ``attn_pool.`` parameter into ``out``; False for one
    keras_vit's attention-pool head has no counterpart of (a position
    table, q/k norms). A pool of several latent queries is refused."""
    if param == "latent" and value.shape[1:2] != (1,):
        raise ValueError(
            f"timm's attention pool with latent_len={value.shape[1]} is not "
            "supported (keras_vit's MAP head has one probe); received "
            f"attn_pool.latent of shape {tuple(value.shape)}")
    base, _, kind = param.rpartition(".")
    if base in _POOL_PROJECTIONS and kind in ("weight", "bias"):
        parts = _POOL_PROJECTIONS[base]
        for part, w in zip(parts, np.split(value, len(parts), axis=0)):
            key = f"{_MAP_ATT}{part}/{'kernel' if kind == 'weight' else 'bias'}"
            out[key] = (w.T.reshape(w.shape[1], num_heads, -1)
                        if kind == "weight" else w.reshape(num_heads, -1))
        return True
    if param not in POOL_PARAMS:
        return False
    if param == "proj.weight":  # (D, H*Dh) -> (H, Dh, D)
        value = value.T.reshape(num_heads, -1, value.shape[0])
    elif value.ndim == 2:  # Linear (out, in) -> Dense (in, out)
        value = value.T
    out[POOL_PARAMS[param]] = value
    return True


def to_official(state, num_heads):
    """Maps a timm ViT ``state_dict`` (NumPy) onto the official ``.npz``
    layout, with the keys of the ViT family's options (register tokens,
    layer scale, q/k norms, ``norm_pre``, ``fc_norm``). timm parameters
    with no keras_vit counterpart raise a ValueError naming them: loading
    without them would silently compute something else."""
    out, unknown, glu = {}, [], {}
    for name, value in state.items():
        value = np.asarray(value)
        m = _BLOCK_KEY.match(name)
        g = _GLU_KEY.match(m.group(2)) if m else None
        if g:
            glu.setdefault((m.group(1), g.group(2)), {})[g.group(1)] = value
            continue
        if m and m.group(2) in BLOCK_PARAMS:
            i, param = m.groups()
            prefix = f"Transformer/encoderblock_{i}/"
            if param.startswith("attn.qkv."):
                att = prefix + "MultiHeadDotProductAttention_1/"
                for part, w in zip(("query", "key", "value"),
                                   np.split(value, 3, axis=0)):
                    if param.endswith("weight"):  # (D_out, D_in)
                        d = w.shape[1]
                        out[att + f"{part}/kernel"] = w.T.reshape(
                            d, num_heads, d // num_heads)
                    else:
                        out[att + f"{part}/bias"] = w.reshape(num_heads, -1)
                continue
            key = prefix + BLOCK_PARAMS[param]
            if param == "attn.proj.weight":
                d = value.shape[0]
                value = value.T.reshape(num_heads, d // num_heads, d)
            elif value.ndim == 2:  # Linear (out, in) -> Dense (in, out)
                value = value.T
            out[key] = value
        elif name.startswith(_POOL) and _attn_pool_to_official(
                name[len(_POOL):], value, num_heads, out):
            continue
        elif name in TOP_PARAMS:
            if name == "patch_embed.proj.weight":  # OIHW -> HWIO
                value = value.transpose(2, 3, 1, 0)
            elif name in ("head.weight", "head_dist.weight"):
                value = value.T
            out[TOP_PARAMS[name]] = value
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"the timm checkpoint has parameters keras_vit's ViT lacks: "
            f"{sorted(unknown)[:12]}{' ...' if len(unknown) > 12 else ''}")
    _pack_glu(glu, out)
    return out


def _pack_glu(halves, out):
    """Writes timm's unpacked SwiGLU first layers (``halves``: (block,
    ``"weight"`` or ``"bias"``) -> {``fc1_g``, ``fc1_x``} -> array) into
    ``out`` as the packed Dense, gate first. A block with one half only,
    or with timm's packed ``fc1`` beside them, raises a ValueError naming
    the parameters."""
    for (i, kind), parts in sorted(halves.items()):
        names = [f"blocks.{i}.mlp.{h}.{kind}" for h in _GLU_HALVES]
        if set(parts) != set(_GLU_HALVES):
            raise ValueError(
                "timm's SwiGLU needs both halves of its first layer; the "
                f"checkpoint has {[n for n, h in zip(names, _GLU_HALVES) if h in parts]}"
                f" without {[n for n, h in zip(names, _GLU_HALVES) if h not in parts]}")
        key = (f"Transformer/encoderblock_{i}/MlpBlock_3/Dense_0/"
               + ("kernel" if kind == "weight" else "bias"))
        if key in out:
            raise ValueError(
                f"the timm checkpoint has both blocks.{i}.mlp.fc1.{kind} and "
                f"{names}: one MLP cannot be packed and unpacked")
        packed = np.concatenate([parts[h] for h in _GLU_HALVES], axis=0)
        out[key] = packed.T if kind == "weight" else packed


# timm's ResNetV2 names stage s, block b ``stages.{s}.blocks.{b}.<param>``,
# in BiT and in the hybrids' backbone alike.
_STAGE_UNIT = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.(.+)$")


def _resnet_to_official(state, unit_params, unit_key, top, what, prefix=""):
    """Maps timm ResNetV2 parameters: ``unit_key(stage, block)`` (1-based)
    plus ``unit_params[param]`` for the units, ``top`` for the rest; conv
    kernels OIHW -> HWIO. Unknown names raise a ValueError naming them."""
    out, unknown = {}, []
    for name, value in state.items():
        value = np.asarray(value)
        m = _STAGE_UNIT.match(name)
        if m and m.group(3) in unit_params:
            stage, block, param = m.groups()
            key = unit_key(int(stage) + 1, int(block) + 1) + unit_params[param]
        elif name in top:
            key = top[name]
        else:
            unknown.append(prefix + name)
            continue
        if value.ndim == 4:  # conv OIHW -> HWIO
            value = value.transpose(2, 3, 1, 0)
        out[key] = value
    if unknown:
        raise ValueError(
            f"the timm checkpoint has parameters keras_vit's {what} lacks: "
            f"{sorted(unknown)[:12]}{' ...' if len(unknown) > 12 else ''}")
    return out


_HYBRID_PREFIX = "patch_embed.backbone."
_HYBRID_UNIT_PARAMS = {"downsample.conv.weight": "conv_proj/kernel",
                       "downsample.norm.weight": "gn_proj/scale",
                       "downsample.norm.bias": "gn_proj/bias"}
for _i in (1, 2, 3):
    _HYBRID_UNIT_PARAMS[f"conv{_i}.weight"] = f"conv{_i}/kernel"
    _HYBRID_UNIT_PARAMS[f"norm{_i}.weight"] = f"gn{_i}/scale"
    _HYBRID_UNIT_PARAMS[f"norm{_i}.bias"] = f"gn{_i}/bias"
# The root: "stem." in front when the backbone has stages, none when timm
# builds the root alone (vit_tiny_r_s16_p8_*).
_HYBRID_ROOT = {"conv.weight": "conv_root/kernel",
                "norm.weight": "gn_root/scale", "norm.bias": "gn_root/bias"}
_HYBRID_ROOT.update({f"stem.{k}": v for k, v in _HYBRID_ROOT.items()})


def hybrid_to_official(state, num_heads):
    """Maps a timm ResNet+ViT hybrid ``state_dict`` (``vit_*_r*_s*``) onto
    the official hybrid ``.npz`` layout: timm's
    ``patch_embed.backbone.stages.{s}.blocks.{b}`` is ``block{s+1}/unit{b+1}``
    (norm1 -> gn1, downsample -> conv_proj/gn_proj), the rest as
    :func:`to_official`. Unknown parameters raise a ValueError naming them."""
    n = len(_HYBRID_PREFIX)
    backbone = {k[n:]: v for k, v in state.items()
                if k.startswith(_HYBRID_PREFIX)}
    rest = {k: v for k, v in state.items() if not k.startswith(_HYBRID_PREFIX)}
    return {**to_official(rest, num_heads), **_resnet_to_official(
        backbone, _HYBRID_UNIT_PARAMS, lambda s, b: f"block{s}/unit{b}/",
        _HYBRID_ROOT, "hybrid ResNet", prefix=_HYBRID_PREFIX)}


_BIT_UNIT_PARAMS = {"downsample.conv.weight": "a/proj/standardized_conv2d/kernel"}
for _i, _x in enumerate("abc", 1):
    _BIT_UNIT_PARAMS[f"conv{_i}.weight"] = f"{_x}/standardized_conv2d/kernel"
    _BIT_UNIT_PARAMS[f"norm{_i}.weight"] = f"{_x}/group_norm/gamma"
    _BIT_UNIT_PARAMS[f"norm{_i}.bias"] = f"{_x}/group_norm/beta"
_BIT_TOP = {"stem.conv.weight": "resnet/root_block/standardized_conv2d/kernel",
            "norm.weight": "resnet/group_norm/gamma",
            "norm.bias": "resnet/group_norm/beta",
            "head.fc.weight": "resnet/head/conv2d/kernel",
            "head.fc.bias": "resnet/head/conv2d/bias"}


def bit_to_official(state):
    """Maps a timm ``resnetv2_*_bit`` ``state_dict`` onto the official BiT
    ``.npz`` layout (timm's stage s, block b is ``block{s+1}/unit{b+1:02d}``;
    its norm1/conv1 are the official unit's ``a``, and so on). Parameters
    with no BiT counterpart raise a ValueError naming them."""
    return _resnet_to_official(
        state, _BIT_UNIT_PARAMS, lambda s, b: f"resnet/block{s}/unit{b:02d}/",
        _BIT_TOP, "BiT ResNetV2")


def from_official(arrays, unpacked_glu=False):
    """The inverse of :func:`to_official`: official-layout arrays (from
    :func:`keras_vit.zoo.export_arrays`) as a timm ViT ``state_dict``;
    ``unpacked_glu`` splits a SwiGLU MLP's packed first layer into timm's
    ``fc1_g`` (the gate half) and ``fc1_x`` (the value half), the layout
    of timm's ``SwiGLU`` (AIMv2), instead of ``SwiGLUPacked``'s ``fc1``."""
    arrays = convert.normalize_keys(arrays)
    extra = sorted(k for k in arrays if k.startswith("pre_logits/"))
    if extra:
        raise ValueError(f"timm's ViT has no pre_logits layer; the model has "
                         f"{extra}")
    top = {v: k for k, v in TOP_PARAMS.items()}
    block = {v: k for k, v in BLOCK_PARAMS.items() if v}
    state, qkv, pool_qkv = {}, {}, {}
    for key, value in arrays.items():
        value = np.asarray(value, dtype="float32")
        if key in top:
            name = top[key]
            if name == "patch_embed.proj.weight":
                value = value.transpose(3, 2, 0, 1)
            elif name in ("head.weight", "head_dist.weight"):
                value = value.T
            state[name] = value
            continue
        if key.startswith(convert.MAP_HEAD):
            _attn_pool_from_official(key, value, state, pool_qkv)
            continue
        m = convert.BLOCK_KEY.match(key)
        if not m:
            raise ValueError(f"no timm ViT parameter for {key!r}")
        i, rest = m.groups()
        att = "MultiHeadDotProductAttention_1/"
        part = rest[len(att):].split("/")[0] if rest.startswith(att) else None
        if part in ("query", "key", "value"):
            kind = rest.rsplit("/", 1)[1]
            flat = (value.reshape(value.shape[0], -1).T if kind == "kernel"
                    else value.reshape(-1))
            qkv.setdefault((i, kind), {})[part] = flat
            continue
        name = f"blocks.{i}.{block[rest]}"
        if rest == att + "out/kernel":
            value = value.reshape(-1, value.shape[-1]).T
        elif value.ndim == 2:
            value = value.T
        if unpacked_glu and block[rest].startswith("mlp.fc1."):
            kind = block[rest].rpartition(".")[2]
            for half, part in zip(_GLU_HALVES, np.split(value, 2, axis=0)):
                state[f"blocks.{i}.mlp.{half}.{kind}"] = part
            continue
        state[name] = value
    for (i, kind), parts in qkv.items():
        suffix = "weight" if kind == "kernel" else "bias"
        state[f"blocks.{i}.attn.qkv.{suffix}"] = np.concatenate(
            [parts["query"], parts["key"], parts["value"]], axis=0)
    for kind, parts in pool_qkv.items():
        suffix = "weight" if kind == "kernel" else "bias"
        for base, names in _POOL_PROJECTIONS.items():
            state[f"{_POOL}{base}.{suffix}"] = np.concatenate(
                [parts[n] for n in names], axis=0)
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def _attn_pool_from_official(key, value, state, projections):
    """One official ``MAPHead_0/`` array as timm's ``attn_pool.``
    parameter in ``state``; the query, key and value projections are
    gathered in ``projections`` (kind -> part -> flat array) for timm's
    ``q`` and stacked ``kv``."""
    if key.startswith(_MAP_ATT):
        part, kind = key[len(_MAP_ATT):].split("/")
        if part in ("query", "key", "value"):
            projections.setdefault(kind, {})[part] = (
                value.reshape(value.shape[0], -1).T if kind == "kernel"
                else value.reshape(-1))
            return
    names = {v: k for k, v in POOL_PARAMS.items()}
    if key not in names:
        raise ValueError(f"no timm attention-pool parameter for {key!r}")
    name = names[key]
    if name == "proj.weight":  # (H, Dh, D) -> (D, H*Dh)
        value = value.reshape(-1, value.shape[-1]).T
    elif value.ndim == 2:
        value = value.T
    state[_POOL + name] = value
