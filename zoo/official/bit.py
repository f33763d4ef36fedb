"""The BiT checkpoint layout: official ``.npz`` keys <-> ResNetV2 variables.

The released big_transfer files have '/'-joined keys under ``resnet/``::

    resnet/root_block/standardized_conv2d/kernel           (7, 7, 3, W)
    resnet/block{s}/unit{NN}/{a,b,c}/standardized_conv2d/kernel
    resnet/block{s}/unit{NN}/{a,b,c}/group_norm/{gamma,beta}
    resnet/block{s}/unit01/a/proj/standardized_conv2d/kernel
    resnet/group_norm/{gamma,beta}
    resnet/head/conv2d/{kernel (1, 1, C, K), bias (K,)}

with ``s`` = 1..4 and ``NN`` the unit number on two digits. The GroupNorm
before conv ``x`` of a unit is stored under ``x/group_norm``.

>>> checkpoint_key("stage_2_unit_1/proj/kernel")
'resnet/block2/unit01/a/proj/standardized_conv2d/kernel'
"""

from __future__ import annotations

from keras_vit.zoo import convert, layouts
from keras_vit.zoo.layouts import Layout, Rule

PREFIX = "resnet/"
HEAD_KERNEL = PREFIX + "head/conv2d/kernel"
HEAD_BIAS = PREFIX + "head/conv2d/bias"

_UNIT, _KEY = "stage_{s}_unit_{u}/", PREFIX + "block{s}/unit{u:02d}/"
#: The official BiT layout; GroupNorm arrays read as (C,) or (1, 1, 1, C),
#: the head kernel as (C, K) or (1, 1, C, K).
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


def export_arrays(model) -> dict:
    """The model's weights as ``{key: array}`` in the official layout
    (GroupNorm arrays as (C,), the head kernel as (1, 1, C, K))."""
    return BIT.write(layouts.model_arrays(model, BIT.name))


def load_weights(model, arrays_or_path, *, num_classes_changed_ok=True,
                 source_name=None):
    """Loads an official BiT checkpoint into a ResNetV2 model, strictly.

    Args:
        model: a model built by :func:`keras_vit.models.resnet_v2.resnet_v2`.
        arrays_or_path: a ``{key: array}`` dict or the path of a ``.npz``.
        num_classes_changed_ok: if True, a checkpoint head of another number
            of classes is replaced by zeros; if False, that is an error.
        source_name: how errors name the source (default: its path).

    Returns:
        ``{"head": "loaded" | "replaced" | "dropped" | None}``.
    """
    source = arrays_or_path
    report = layouts.load(model, BIT, convert.source_arrays(source),
                          source_name=source_name or convert.describe(source),
                          replace_head=num_classes_changed_ok)
    return {"head": report["head"]}
