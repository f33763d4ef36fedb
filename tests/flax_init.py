"""What the official code would draw for each variable of a model, and
the check that a model's random initialisation matches it in distribution
(tests/models/test_vit.py and test_bit.py).

vit_jax models_vit.py / models_resnet.py and big_transfer bit_jax/models.py:
MLP Dense kernels xavier_uniform, biases N(0, 1e-6); attention
(DenseGeneral) kernels xavier_uniform on the flattened (D, D) fans, biases
zeros; patch conv, pre_logits and every ResNet conv flax's default
lecun_normal (truncated, std 1/sqrt(fan_in)) with zero biases; position
embedding N(0, 0.02); class token and head zeros; LayerNorm / GroupNorm
scale ones and bias zeros, except the hybrid unit's gn3 (scale zeros).
"""

import math
import re

import keras
import numpy as np


def fans(shape):
    """(fan_in, fan_out) of a kernel of ``shape``, as flax counts them."""
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def expected(path, shape):
    """(std, exact_value) the official code would draw for this variable."""
    name = path.split("/")[-1]
    if re.search(r"attention/(query|key|value)/kernel$", path):
        dim = shape[0]
        return math.sqrt(2.0 / (dim + dim)), None
    if path.endswith("attention/out/kernel"):
        dim = shape[-1]
        return math.sqrt(2.0 / (dim + dim)), None
    if re.search(r"attention/\w+/bias$", path):
        return 0.0, 0.0
    if "/mlp/" in path:
        if name == "kernel":
            return math.sqrt(2.0 / sum(shape)), None
        return 1e-6, None
    if path.startswith("head/"):
        return 0.0, 0.0
    if name == "pos_embedding":
        return 0.02, None
    if name == "cls":
        return 0.0, 0.0
    if name == "kernel":  # patch conv, pre_logits, every ResNet conv
        return math.sqrt(1.0 / fans(shape)[0]), None
    if name == "bias":
        return 0.0, 0.0
    if name == "gamma":
        zero = path.endswith("gn3/gamma")
        return 0.0, 0.0 if zero else 1.0
    if name == "beta":
        return 0.0, 0.0
    raise AssertionError(f"no official initialiser known for {path}")


def check_init(model):
    """Checks each variable of ``model`` against :func:`expected`: exact
    values equal, random ones of the official std and mean; returns the
    kinds of variable seen (their paths without the ``_N`` suffixes)."""
    kinds = set()
    for var in model.weights:
        value = keras.ops.convert_to_numpy(var.value).astype("float64")
        std, exact = expected(var.path, tuple(var.shape))
        if exact is not None:
            np.testing.assert_array_equal(value, exact, err_msg=var.path)
        else:
            # 25% covers sampling error for the smallest (bias) tensors here.
            assert abs(value.std() / std - 1.0) < 0.25, (
                var.path, value.std(), std)
            assert abs(value.mean()) < 3 * std / math.sqrt(value.size) + 1e-12
        kinds.add(re.sub(r"_\d+", "", var.path))
    return kinds
