"""The models benchmarks/speed.py measures and the peers it measures them
beside: ViT-B/16's configuration (and the tiny stand-in of ``--quick``)
with its FLOP count; importing timm (and torch) and keras-hub, or saying
why not; building keras_vit's, timm's and keras-hub's model of one
configuration; and the peers' versions and thread settings for the
report's header.

torch and timm are imported before TensorFlow: torchvision (imported by
timm) crashes when it is loaded after TensorFlow 2.21.
"""

from __future__ import annotations

import os
import platform

import numpy as np

# ViT-B/16 (paper Table 1) and the tiny stand-in of --quick, both written as
# zoo.load overrides; timm and keras-hub get the same numbers.
VIT_B16 = dict(patch_size=16, hidden_size=768, num_layers=12, num_heads=12,
               mlp_dim=3072)
TINY = dict(patch_size=8, hidden_size=32, num_layers=1, num_heads=4,
            mlp_dim=64)
TIMM_NAMES = {224: "vit_base_patch16_224", 384: "vit_base_patch16_384"}
PEERS = ("timm", "keras_hub")


# --------------------------------------------------------------------------
# FLOPs from the configuration


def forward_flops(image_size, patch_size, hidden_size, num_layers, num_heads,
                  mlp_dim, num_classes=1000, class_token=True):
    """Multiply-adds x 2 of one image's forward pass: the patch embedding,
    per block the Q, K, V and output projections, the two attention
    matmuls (QK^T and AV) and the MLP, and the head. LayerNorm, softmax,
    GELU and the adds are left out (under 1% for ViT-B/16).

    >>> round(forward_flops(224, **VIT_B16) / 2e9, 2)   # GMACs
    17.56
    >>> round(forward_flops(384, **VIT_B16) / 2e9, 1)
    55.5
    """
    del num_heads  # the head split does not change the count
    grid = (image_size // patch_size) ** 2
    n = grid + int(class_token)
    d, m = hidden_size, mlp_dim
    macs = grid * patch_size * patch_size * 3 * d  # patch embedding
    macs += num_layers * (4 * n * d * d          # Q, K, V, out
                          + 2 * n * n * d        # QK^T and AV
                          + 2 * n * d * m)       # MLP
    macs += d * num_classes
    return 2 * macs


# --------------------------------------------------------------------------
# importing the peers


def import_peers(skip):
    """torch/timm (before TensorFlow) and keras_hub, or why not."""
    found, skipped = {}, []
    if "timm" in skip:
        skipped.append("timm: disabled with --skip-peers")
    else:
        try:
            import timm
            import torch

            torch.set_num_threads(len(os.sched_getaffinity(0)))
            found["torch"], found["timm"] = torch, timm
        except ImportError as e:
            skipped.append(f"timm: not installed ({e})")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # After torch (see the module docstring); keras_vit before TensorFlow,
    # as a user's script would, so that its oneDNN switch applies.
    import keras_vit  # noqa: F401
    import tensorflow  # noqa: F401

    if "keras_hub" in skip:
        skipped.append("keras-hub: disabled with --skip-peers")
    else:
        try:
            import keras_hub

            found["keras_hub"] = keras_hub
        except ImportError as e:
            skipped.append(f"keras-hub: not installed ({e}); "
                           "pip install keras-vit[bench]")
    return found, skipped


def versions(peers):
    import keras
    import tensorflow as tf

    import keras_vit

    out = {"python": platform.python_version(), "numpy": np.__version__,
           "tensorflow": tf.__version__, "keras": keras.__version__,
           "keras_vit": keras_vit.__version__}
    if "torch" in peers:
        out["torch"] = peers["torch"].__version__
        out["timm"] = peers["timm"].__version__
    if "keras_hub" in peers:
        out["keras_hub"] = peers["keras_hub"].__version__
    for name in ("onnxruntime", "ai_edge_litert"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            pass
    return out


def threads(peers):
    import tensorflow as tf

    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    text = (f"TensorFlow intra-op {intra or 'default (all cores)'}, inter-op "
            f"{inter or 'default'}")
    if "torch" in peers:
        text += (f"; torch.set_num_threads({peers['torch'].get_num_threads()})"
                 " (the core count)")
    return text


# --------------------------------------------------------------------------
# the models


def keras_vit_model(size, arch, classes, dtype=None):
    import keras_vit

    kwargs = dict(arch)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return keras_vit.zoo.load("ViT-B/16", weights=None, image_size=size,
                              num_classes=classes, **kwargs)


def timm_model(timm, size, arch, classes):
    if arch is VIT_B16 and size in TIMM_NAMES:
        return timm.create_model(TIMM_NAMES[size], pretrained=False,
                                 num_classes=classes)
    return timm.create_model(
        "vit_base_patch16_224", pretrained=False, num_classes=classes,
        img_size=size, patch_size=arch["patch_size"],
        embed_dim=arch["hidden_size"], depth=arch["num_layers"],
        num_heads=arch["num_heads"],
        mlp_ratio=arch["mlp_dim"] / arch["hidden_size"])


def keras_hub_backbone(keras_hub, size, arch):
    return keras_hub.models.ViTBackbone(
        image_shape=(size, size, 3), patch_size=arch["patch_size"],
        num_layers=arch["num_layers"], num_heads=arch["num_heads"],
        hidden_dim=arch["hidden_size"], mlp_dim=arch["mlp_dim"])
