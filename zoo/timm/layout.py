"""timm's parameter names, as rules read both ways
(:class:`~keras_vit.zoo.layouts.Layout`): the ViT, the ResNetV2+ViT hybrids
and BiT, shared by the reader (:mod:`keras_vit.zoo.timm.hub`) and the
writer (:mod:`keras_vit.zoo.timm.writer`).
"""

from __future__ import annotations

import re

import numpy as np

from keras_vit.base import options
from keras_vit.zoo.layouts import (Layout, Rule, option_rules,
                                  torch_batch_norm)
from keras_vit.zoo.layouts import torch_module as _linear

# timm's names of the poolings and MLP activations -> keras_vit's.
TIMM_POOLS = {"token": "token", "avg": "gap", "max": "max",
              "avgmax": "avgmax", "map": "map"}
TIMM_ACTIVATIONS = {"gelu": "exact", "gelu_tanh": "tanh",
                    "quick_gelu": "quick"}
# timm's VisionTransformer arguments that are keras_vit's family options.
TIMM_OPTIONS = {
    **{o.timm.name: o.name for o in options.OPTIONS if o.timm},
    "global_pool": "classifier", "act_layer": "gelu",
    "pos_embed": "position_embedding"}

_B, _T = "encoder_block_{i}/", "blocks.{i}."


def _mlp(path, key):
    return [*_linear(f"{path}/dense_0", f"{key}.fc1"),
            *_linear(f"{path}/dense_1", f"{key}.fc2")]


def _projections(path, key, parts):
    """timm's packed projections (``qkv``, ``kv``): one Linear whose output
    stacks the model's ``parts``."""
    return [Rule([f"{path}/{p}/kernel" for p in parts], f"{key}.weight",
                 "linear"),
            Rule([f"{path}/{p}/bias" for p in parts], f"{key}.bias", "flat")]


_UNIT, _STAGE = "resnet_block{s}_unit{u}/", "stages.{s-1}.blocks.{u-1}."
_BACKBONE = "patch_embed.backbone."
_D_UNIT, _LAYER = "resnet_block{s}_unit{u}_", "layer{s}.{u-1}."

#: timm's ViT (``vision_transformer.py``) and its ResNetV2 hybrids
#: (``vision_transformer_hybrid.py``).
TIMM = Layout("timm", [
    *option_rules("timm", lambda path, key: _linear(path, key, "norm"),
                  _linear, lambda path, key: _linear(path, key, "conv"),
                  torch_batch_norm),
    *_linear("patch_embedding/conv", "patch_embed.proj", "conv"),
    # The conv stem's last convolution (its others: the row's weights).
    *_linear("patch_embedding/conv", "patch_embed.backbone.2.conv", "conv",
             "conv_stem"),
    Rule("position_embedding/pos_embedding", "pos_embed"),
    *_linear(_B + "norm_1", _T + "norm1", "norm"),
    *_projections(_B + "attention", _T + "attn.qkv",
                  ("query", "key", "value")),
    *_linear(_B + "attention/out", _T + "attn.proj", "linear_out"),
    *_linear(_B + "norm_2", _T + "norm2", "norm"),
    *_mlp(_B + "mlp", _T + "mlp"),
    # timm's unpacked SwiGLU: two Linears keras_vit packs, gate first.
    Rule(_B + "mlp/dense_0/kernel",
         (_T + "mlp.fc1_g.weight", _T + "mlp.fc1_x.weight"), "linear",
         variant="unpacked_glu"),
    Rule(_B + "mlp/dense_0/bias",
         (_T + "mlp.fc1_g.bias", _T + "mlp.fc1_x.bias"), "flat",
         variant="unpacked_glu"),
    *_linear("encoder_norm", "norm", "norm"),
    *_linear("head", "head"),
    # The attention pool (global_pool="map").
    Rule("pooling/probe", "attn_pool.latent"),
    *_projections("pooling", "attn_pool.q", ("query",)),
    *_projections("pooling", "attn_pool.kv", ("key", "value")),
    *_linear("pooling/out", "attn_pool.proj", "linear_out"),
    *_linear("pooling/norm", "attn_pool.norm", "norm"),
    *_mlp("pooling/mlp", "attn_pool.mlp"),
    # The hybrids' ResNetV2: the root (under "stem." when the backbone has
    # stages, alone in vit_tiny_r_s16_p8_*) and stage s, block b.
    Rule("resnet_root_conv/kernel", _BACKBONE + "stem.conv.weight", "conv"),
    *_linear("resnet_root_norm", _BACKBONE + "stem.norm", "norm"),
    Rule("resnet_root_conv/kernel", _BACKBONE + "conv.weight", "conv",
         variant="root_only"),
    *_linear("resnet_root_norm", _BACKBONE + "norm", "norm", "root_only"),
    *[Rule(f"{_UNIT}conv{n}/kernel", f"{_BACKBONE}{_STAGE}conv{n}.weight",
           "conv") for n in (1, 2, 3)],
    *[r for n in (1, 2, 3) for r in _linear(
        f"{_UNIT}gn{n}", f"{_BACKBONE}{_STAGE}norm{n}", "norm")],
    Rule(_UNIT + "conv_proj/kernel",
         f"{_BACKBONE}{_STAGE}downsample.conv.weight", "conv"),
    *_linear(_UNIT + "gn_proj", f"{_BACKBONE}{_STAGE}downsample.norm",
             "norm"),
    # The ResNet-D hybrids' backbone (timm's resnet26d/50d): the deep
    # stem, then stage s, block b.
    *[r for n, (conv, norm) in enumerate(
        (("conv1.0", "conv1.1"), ("conv1.3", "conv1.4"), ("conv1.6", "bn1")))
      for r in (Rule(f"resnet_stem_conv_{n}/kernel",
                     f"{_BACKBONE}{conv}.weight", "conv"),
                *torch_batch_norm(f"resnet_stem_norm_{n}", _BACKBONE + norm))],
    *[r for n in (1, 2, 3) for r in (
        Rule(f"{_D_UNIT}conv{n}/kernel", f"{_BACKBONE}{_LAYER}conv{n}.weight",
             "conv"),
        *torch_batch_norm(f"{_D_UNIT}norm{n}", f"{_BACKBONE}{_LAYER}bn{n}"))],
    Rule(_D_UNIT + "proj_conv/kernel",
         f"{_BACKBONE}{_LAYER}downsample.1.weight", "conv"),
    *torch_batch_norm(_D_UNIT + "proj_norm",
                      f"{_BACKBONE}{_LAYER}downsample.2"),
])


_THINGS = re.compile(r"^(blocks\.\d+\.)(attns|ffns)\.(\d+)\.(\w+)(\..*)$")
# The first branch's modules -> the plain block's.
_FIRST_BRANCH = {"attns": {"norm": "norm1", "attn": "attn", "ls": "ls1"},
                 "ffns": {"norm": "norm2", "mlp": "mlp", "ls": "ls2"}}


def branches(state):
    """``(branches, state)`` of a checkpoint of timm's ParallelThingsBlock:
    the branches its blocks hold, and its keys as the ``branches`` row
    reads them (the first branch's as the plain block's)."""
    out, count = {}, 0
    for key, value in state.items():
        m = _THINGS.match(key)
        if m is None:
            out[key] = value
            continue
        block, kind, b, module, rest = m.groups()
        count = max(count, int(b) + 1)
        if b == "0" and module in _FIRST_BRANCH[kind]:
            out[f"{block}{_FIRST_BRANCH[kind][module]}{rest}"] = value
        elif kind == "attns" and module == "attn" and rest.startswith(
                ".qkv."):
            for name, part in zip("qkv", np.split(np.asarray(value), 3)):
                out[f"{block}attns.{b}.attn.{name}{rest[4:]}"] = part
        else:
            out[key] = value
    return count, out


def _parallel_rules(rules):
    """timm's parallel blocks (``ParallelScalingBlock``,
    ``DiffParallelScalingBlock``): one norm and one Linear (``in_proj``)
    for the MLP's first projection and the query, key and value, the
    attention's own weights on the block itself; the output projections
    apart (``"parallel_split"``) or one (``"parallel_fused"``)."""
    attention = _T + "attn."
    own = [Rule([p.text for p in rule.model],
                [_T + k.text[len(attention):] for k in rule.keys],
                rule.form, "parallel") for rule in rules
           if all(p.text.startswith(_B + "attention/") for p in rule.model)
           and all(k.text.startswith(attention) for k in rule.keys)
           and not any(k.text.startswith((attention + "qkv",
                                          attention + "proj",
                                          attention + "norm."))
                       for k in rule.keys)]
    return [
        *own,
        *_linear(_B + "norm_1", _T + "in_norm", "norm", "parallel"),
        Rule(_B + "layer_scale_1", _T + "ls.gamma", variant="parallel"),
        Rule(_B + "mlp/dense_0/bias", _T + "mlp_bias",
             variant="parallel_no_qkv_bias"),
        *[Rule([_B + "mlp/dense_0/" + part] + [
            f"{_B}attention/{x}/{part}" for x in ("query", "key", "value")],
            f"{_T}in_proj.{key}", form, "parallel")
          for part, key, form in (("kernel", "weight", "linear"),
                                  ("bias", "bias", "flat"))],
        *_linear(_B + "attention/out", _T + "attn_out_proj", "linear_out",
                 "parallel_split"),
        *_linear(_B + "mlp/dense_1", _T + "mlp_out_proj", "linear_out",
                 "parallel_split"),
        Rule([_B + "attention/out/kernel", _B + "mlp/dense_1/kernel"],
             _T + "out_proj.weight", "linear_out", "parallel_fused", axis=1),
        Rule(_B + "attention/out/bias", _T + "out_proj.bias", "flat",
             "parallel_fused")]


def parallel_variants(config):
    """The variants of :data:`TIMM`'s rules a model of ``config`` (a
    model's config) is written in.

    >>> parallel_variants({"parallel": "fused", "qkv_bias": False})
    ('parallel', 'parallel_fused', 'parallel_no_qkv_bias')
    """
    form = config.get("parallel")
    if not form:
        return ()
    return ("parallel", f"parallel_{form}") + (
        () if config.get("qkv_bias", True) else ("parallel_no_qkv_bias",))


TIMM.rules += _parallel_rules(TIMM.rules)

#: timm's EVA (``eva.py``): the ViT's names, with EVA's layer scale names
#: and the query, key and value biases apart (EVA's key bias is a buffer of
#: zeros no file holds: the reader gives it), or the three projections
#: apart (``qkv_fused=False``).
TIMM_EVA = Layout("timm", [
    *TIMM.renamed({f"blocks.{{i}}.ls{n}.gamma": f"blocks.{{i}}.gamma_{n}"
                   for n in (1, 2)}).rules,
    *[Rule(f"{_B}attention/{part}/bias", f"{_T}attn.{part[0]}_bias", "flat")
      for part in ("query", "key", "value")],
    *[r for part in ("query", "key", "value")
      for r in _linear(f"{_B}attention/{part}", f"{_T}attn.{part[0]}_proj",
                       variant="unfused_qkv")]])


def check_state(state, layout, what="ViT"):
    """Refuses, in one line naming them, the parameters of a timm
    ``state_dict`` keras_vit's model (``what``) has no place for in
    ``layout``, and an attention pool of several latent queries."""
    unknown = layout.unknown(state)
    if unknown:
        raise ValueError(
            f"the timm checkpoint has parameters keras_vit's {what} lacks: "
            f"{sorted(unknown)[:12]}{' ...' if len(unknown) > 12 else ''}")
    latent = state.get("attn_pool.latent")
    if latent is not None and latent.shape[1:2] != (1,):
        raise ValueError(
            f"timm's attention pool with latent_len={latent.shape[1]} is not "
            "supported (keras_vit's MAP head has one probe); received "
            f"attn_pool.latent of shape {tuple(latent.shape)}")


_BIT_UNIT = "stage_{s}_unit_{u}/"
#: timm's BiT (``resnetv2_*_bit``): its stage s, block b is the model's
#: ``stage_{s+1}_unit_{b+1}``, its norm1/conv1 the unit's ``a``.
TIMM_BIT = Layout("timm", [
    Rule("root_conv/kernel", "stem.conv.weight", "conv"),
    *[Rule(f"{_BIT_UNIT}conv_{x}/kernel", f"{_STAGE}conv{n}.weight", "conv")
      for n, x in enumerate("abc", 1)],
    *[r for n, x in enumerate("abc", 1)
      for r in _linear(f"{_BIT_UNIT}norm_{x}", f"{_STAGE}norm{n}", "norm")],
    Rule(_BIT_UNIT + "proj/kernel", _STAGE + "downsample.conv.weight",
         "conv"),
    *_linear("final_norm", "norm", "norm"),
    Rule("head/kernel", "head.fc.weight", "torch_dense_1x1"),
    Rule("head/bias", "head.fc.bias"),
])
