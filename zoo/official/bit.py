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
arrays may come as (C,) or (1, 1, 1, C); :func:`normalize` reshapes them to
(C,) and the head kernel to (C, K), the shapes of the Keras model.

>>> checkpoint_key("stage_2_unit_1/proj/kernel")
'resnet/block2/unit01/a/proj/standardized_conv2d/kernel'
"""

from __future__ import annotations

import os
import re

import numpy as np

from keras_vit.zoo import checkpoints
from keras_vit.zoo.checkpoints import CheckpointError, as_array, assign_all
from keras_vit.zoo.convert import read_npz

PREFIX = "resnet/"
HEAD_KERNEL = PREFIX + "head/conv2d/kernel"
HEAD_BIAS = PREFIX + "head/conv2d/bias"

_UNIT_RE = re.compile(r"^stage_(\d+)_unit_(\d+)/(.+)$")
_UNIT_MAP = {}
for _x in ("a", "b", "c"):
    _UNIT_MAP[f"conv_{_x}/kernel"] = f"{_x}/standardized_conv2d/kernel"
    for _p in ("gamma", "beta"):
        _UNIT_MAP[f"norm_{_x}/{_p}"] = f"{_x}/group_norm/{_p}"
_UNIT_MAP["proj/kernel"] = "a/proj/standardized_conv2d/kernel"
_TOP_MAP = {
    "root_conv/kernel": PREFIX + "root_block/standardized_conv2d/kernel",
    "final_norm/gamma": PREFIX + "group_norm/gamma",
    "final_norm/beta": PREFIX + "group_norm/beta",
    "head/kernel": HEAD_KERNEL,
    "head/bias": HEAD_BIAS,
}


def checkpoint_key(variable_path: str) -> str | None:
    """Maps a Keras variable path of a ResNetV2 to its official BiT key."""
    if variable_path in _TOP_MAP:
        return _TOP_MAP[variable_path]
    m = _UNIT_RE.match(variable_path)
    if m and m.group(3) in _UNIT_MAP:
        stage, unit = int(m.group(1)), int(m.group(2))
        return f"{PREFIX}block{stage}/unit{unit:02d}/{_UNIT_MAP[m.group(3)]}"
    return None


def model_variables(model) -> dict:
    """``{checkpoint key: keras Variable}`` for every weight of a ResNetV2;
    raises for a weight with no BiT equivalent."""
    return checkpoints.model_variables(model, checkpoint_key, "BiT")


def _is_group_norm(key):
    return key.endswith(("/group_norm/gamma", "/group_norm/beta"))


def normalize(arrays: dict) -> dict:
    """Reshapes a BiT checkpoint's arrays to the Keras model's shapes.

    GroupNorm gamma/beta (1, 1, 1, C) -> (C,); the head kernel
    (1, 1, C, K) -> (C, K). Arrays of any other shape are left as they are,
    for the loader to report.
    """
    out = {}
    for key, value in arrays.items():
        value = as_array(value)
        if (_is_group_norm(key) and value.ndim > 1
                and all(d == 1 for d in value.shape[:-1])):
            value = value.reshape(value.shape[-1])
        elif key == HEAD_KERNEL and value.ndim == 4 and value.shape[:2] == (1, 1):
            value = value.reshape(value.shape[2:])
        out[key] = value
    return out


def export_arrays(model) -> dict:
    """The model's weights as ``{key: array}`` in the official layout.

    GroupNorm arrays are written as (C,) and the head kernel as (1, 1, C, K),
    the shapes the released files have (and timm's npz loader expects).
    """
    out = {}
    for key, var in model_variables(model).items():
        value = np.asarray(var.numpy())
        if key == HEAD_KERNEL:
            value = value.reshape((1, 1) + value.shape)
        out[key] = value
    return out


def _describe(source):
    return "<arrays>" if isinstance(source, dict) else repr(os.fspath(source))


def _problem_list(label, items, sep=", "):
    return (f"{label} ({len(items)}): " + sep.join(items[:20])
            + (" ..." if len(items) > 20 else ""))


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
    if isinstance(source, dict):
        arrays = normalize(source)
    else:
        arrays = normalize(read_npz(source, lazy=True))
    targets = model_variables(model)
    report = {"head": None}

    has_head_ckpt = HEAD_KERNEL in arrays or HEAD_BIAS in arrays
    has_head_model = HEAD_KERNEL in targets
    head_replaced = False
    if has_head_ckpt and not has_head_model:
        arrays.pop(HEAD_KERNEL, None)
        arrays.pop(HEAD_BIAS, None)
        report["head"] = "dropped"
    elif has_head_ckpt and has_head_model and num_classes_changed_ok:
        want = targets[HEAD_KERNEL].shape[-1]
        got = arrays.get(HEAD_KERNEL, arrays.get(HEAD_BIAS)).shape[-1:]
        if tuple(got) != (want,):
            # Only the number of classes differs, or so the last axis says;
            # an input width mismatch is still caught below.
            head_replaced = True
            arrays.pop(HEAD_KERNEL, None)
            arrays.pop(HEAD_BIAS, None)
            report["head"] = "replaced"
        else:
            report["head"] = "loaded"
    elif has_head_ckpt and has_head_model:
        report["head"] = "loaded"

    missing = [k for k in targets if k not in arrays
               and not (head_replaced and k in (HEAD_KERNEL, HEAD_BIAS))]
    unexpected = [k for k in arrays if k not in targets]
    mis_shaped = [
        f"{k}: checkpoint {tuple(arrays[k].shape)} vs model {tuple(v.shape)}"
        for k, v in targets.items()
        if k in arrays and tuple(arrays[k].shape) != tuple(v.shape)]
    problems = []
    if missing:
        problems.append(_problem_list("missing from the checkpoint", missing))
    if unexpected:
        problems.append(_problem_list("unexpected in the checkpoint",
                                      unexpected))
    if mis_shaped:
        problems.append(_problem_list("mis-shaped", mis_shaped, "; "))
    if problems:
        raise CheckpointError(
            f"The BiT checkpoint source={source_name or _describe(source)} "
            f"does not fit model={model.name!r} (another depth or width?):"
            "\n  "
            + "\n  ".join(problems))

    assign_all([(var, None if head_replaced and key in (HEAD_KERNEL,
                                                         HEAD_BIAS)
                  else arrays[key]) for key, var in targets.items()],
               source_name or _describe(source))
    return report
