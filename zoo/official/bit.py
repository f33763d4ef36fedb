"""The BiT checkpoint layout: official ``.npz`` keys <-> ResNetV2 variables.

The released big_transfer files are flat ``.npz`` archives with '/'-joined
keys under ``resnet/``::

    resnet/root_block/standardized_conv2d/kernel           (7, 7, 3, W)
    resnet/block{s}/unit{NN}/{a,b,c}/standardized_conv2d/kernel
    resnet/block{s}/unit{NN}/{a,b,c}/group_norm/{gamma,beta}
    resnet/block{s}/unit01/a/proj/standardized_conv2d/kernel
    resnet/group_norm/{gamma,beta}
    resnet/head/conv2d/{kernel (1, 1, C, K), bias (K,)}

with ``s`` = 1..4 and ``NN`` the unit number on two digits. The GroupNorm
before conv ``x`` of a unit is stored under ``x/group_norm``. GroupNorm
arrays may come as (C,) or (1, 1, 1, C), the head kernel as (C, K) or
(1, 1, C, K); :data:`BIT` reads them into the Keras model's shapes.

>>> checkpoint_key("stage_2_unit_1/proj/kernel")
'resnet/block2/unit01/a/proj/standardized_conv2d/kernel'
"""

from __future__ import annotations

import os

from keras_vit.zoo import checkpoints, layouts
from keras_vit.zoo.convert import read_npz
from keras_vit.zoo.layouts import Layout, Rule

PREFIX = "resnet/"
HEAD_KERNEL = PREFIX + "head/conv2d/kernel"
HEAD_BIAS = PREFIX + "head/conv2d/bias"

_UNIT, _KEY = "stage_{s}_unit_{u}/", PREFIX + "block{s}/unit{u:02d}/"
#: The official BiT layout; GroupNorm arrays read as (C,) or (1, 1, 1, C),
#: the head kernel as (C, K) or (1, 1, C, K), and are written as the
#: released files have them ((C,), (1, 1, C, K)).
BIT = Layout("BiT", [
    Rule("root_conv/kernel", PREFIX + "root_block/standardized_conv2d/kernel"),
    *[Rule(f"{_UNIT}conv_{x}/kernel", f"{_KEY}{x}/standardized_conv2d/kernel")
      for x in "abc"],
    *[Rule(f"{_UNIT}norm_{x}/{p}", f"{_KEY}{x}/group_norm/{p}", "flat")
      for x in "abc" for p in ("gamma", "beta")],
    Rule(_UNIT + "proj/kernel", _KEY + "a/proj/standardized_conv2d/kernel"),
    *[Rule(f"final_norm/{p}", f"{PREFIX}group_norm/{p}", "flat")
      for p in ("gamma", "beta")],
    Rule("head/kernel", HEAD_KERNEL, "dense_1x1"),
    Rule("head/bias", HEAD_BIAS),
])


def checkpoint_key(variable_path: str) -> str | None:
    """Maps a Keras variable path of a ResNetV2 to its official BiT key."""
    return BIT.key_of(variable_path)


def model_variables(model) -> dict:
    """``{checkpoint key: keras Variable}`` for every weight of a ResNetV2;
    raises for a weight with no BiT equivalent."""
    return checkpoints.model_variables(model, checkpoint_key, "BiT")


def export_arrays(model) -> dict:
    """The model's weights as ``{key: array}`` in the official layout.

    GroupNorm arrays are written as (C,) and the head kernel as (1, 1, C, K),
    the shapes the released files have (and timm's npz loader expects).
    """
    return BIT.write(layouts.model_arrays(model, BIT.name))


def _describe(source):
    return "<arrays>" if isinstance(source, dict) else repr(os.fspath(source))


def load_weights(model, arrays_or_path, *, num_classes_changed_ok=True,
                 source_name=None):
    """Loads an official BiT checkpoint into a ResNetV2 model, strictly.

    Args:
        model: a model built by :func:`keras_vit.models.resnet_v2.resnet_v2`
            (any resolution: a ResNet has no position-dependent weights).
        arrays_or_path: a ``{key: array}`` dict or the path of a ``.npz``
            (read without unpickling).
        num_classes_changed_ok: if True, a checkpoint head of another number
            of classes is replaced by zeros (BiT fine-tuning starts from a
            zero head); if False, that is an error.
        source_name: how errors name the source (default: its path).

    Rules:
        * a model without a head (``include_top=False``) ignores the
          checkpoint's head;
        * anything else missing, unexpected or mis-shaped is a
          :class:`~keras_vit.zoo.checkpoints.CheckpointError` listing every
          problem at once, and nothing is assigned.

    Returns:
        ``{"head": "loaded" | "replaced" | "dropped" | None}``.
    """
    source = arrays_or_path
    arrays = (dict(source) if isinstance(source, dict)
              else read_npz(source, lazy=True))
    report = layouts.load(model, BIT, arrays,
                          source_name=source_name or _describe(source),
                          replace_head=num_classes_changed_ok)
    return {"head": report["head"]}
