"""timm's ResNet-D hybrids (``vision_transformer_hybrid.py``:
``vit_small_resnet26d_224``, ``vit_small_resnet50d_s16_224``,
``vit_base_resnet26d_224``, ``vit_base_resnet50d_224``) as keras_vit's
hybrid with ``resnet=dict(variant="d")``; the ResNet's stage depths are
the file's, never the name's.

>>> arch, _ = architecture("vit_small_resnet26d_224")
>>> arch.config["hidden_size"], arch.config["mlp_dim"], arch.config["resnet"]
(768, 2304, {'num_layers': [], 'variant': 'd'})
>>> architecture("vit_base_r50_s16_384") is None
True
"""

from __future__ import annotations

import dataclasses
import re

from keras_vit.base import variants
from keras_vit.zoo import checkpoints
from keras_vit.zoo.timm import arguments as timm_arguments

NAME = re.compile(r"^vit_\w+_resnet\d+d")
_BACKBONE = "patch_embed.backbone."
_UNIT = re.compile(r"^patch_embed\.backbone\.layer(\d+)\.(\d+)\.conv1\.weight$")
#: What only a ResNet-D holds: keys that a ResNet of another stem or
#: shortcut (timm's resnet26, resnet50, ...) lacks.
_MARKS = {
    "conv1.6.weight": "the deep stem's third convolution",
    "layer1.0.downsample.1.weight": "the shortcut's projection after its "
                                    "average pool (index 1)",
}


def architecture(name):
    """``(Arch, timm's arguments)`` of the ResNet-D hybrid ``name`` (a tag
    after ``.`` ignored) from timm's table, the ResNet's stages left to
    the file (:func:`with_stages`); None for any other name."""
    base = name.partition(".")[0]
    entry = timm_arguments.table_entry(base)
    if not NAME.match(base) or entry is None:
        return None
    args = entry["args"]
    width, ratio = args["embed_dim"], args.get("mlp_ratio", 4.0)
    config = dict(patch_size=1, hidden_size=width, num_layers=args["depth"],
                  num_heads=args["num_heads"], mlp_dim=int(width * ratio),
                  classifier="token", representation_size=None,
                  resnet=dict(num_layers=[], variant="d"))
    return variants.Arch(name=base, family="hybrid", config=config,
                         image_size=args["img_size"], tag=None), {
                             "mlp_ratio": ratio}


def with_stages(arch, state, path):
    """``arch`` with the ResNet's stage depths the checkpoint ``state``
    holds (the file at ``path``); a state that is not timm's ResNet-D
    backbone, whole stages from the first, is refused naming the key."""
    units = {}
    for key in state:
        m = _UNIT.match(key)
        if m:
            units.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    stages = [len(units[s]) for s in sorted(units)]
    if (not units or sorted(units) != list(range(1, len(units) + 1))
            or any(units[s] != set(range(len(units[s]))) for s in units)):
        found = {s: sorted(u) for s, u in sorted(units.items())}
        raise checkpoints.CheckpointError(
            f"{path}: the ResNet-D backbone's blocks "
            f"({_BACKBONE}layer<stage>.<block>) are not whole stages from "
            f"the first; found blocks {found}")
    for key, what in _MARKS.items():
        if _BACKBONE + key not in state:
            raise checkpoints.CheckpointError(
                f"{path}: {_BACKBONE}{key} ({what}) is missing: the "
                f"backbone of {arch.name} is not timm's ResNet-D")
    resnet = dict(arch.config["resnet"], num_layers=stages)
    return dataclasses.replace(arch, config=dict(arch.config, resnet=resnet))
