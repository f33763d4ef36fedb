"""The layers' math in NumPy, float64, written from the papers and the
reference code: what tests/layers compares each Keras layer with. One
definition each, shared by the layer test files."""

import math

import numpy as np
from keras import ops


def to_numpy(x):
    return ops.convert_to_numpy(x)


def inputs(*shape, seed=0):
    """A float32 array of ``shape`` drawn from N(0, 1)."""
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def gelu_tanh(x):
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))


def gelu_exact(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_quick(x):
    return x / (1.0 + np.exp(-1.702 * x))


#: The package's GELU forms by their ``gelu=`` names.
GELU = {"tanh": gelu_tanh, "exact": gelu_exact, "quick": gelu_quick}


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layer_norm(x, gamma, beta, eps):
    x = np.asarray(x, "float64")
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x, gamma, eps):
    x = np.asarray(x, "float64")
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * gamma


def conv2d(x, kernel, stride, padding="valid"):
    """A channels-last convolution by loops (float64): ``"valid"``, or
    TensorFlow's ``"same"`` (the output ceil(in / stride) a side, the
    padding's odd pixel after)."""
    kh, kw, _, out = kernel.shape
    b, h, w, _ = x.shape
    if padding == "same":
        rows, cols = -(-h // stride), -(-w // stride)
        pad_h = max((rows - 1) * stride + kh - h, 0)
        pad_w = max((cols - 1) * stride + kw - w, 0)
        x = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                       (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    else:
        rows, cols = (h - kh) // stride + 1, (w - kw) // stride + 1
    y = np.zeros((b, rows, cols, out))
    for i in range(rows):
        for j in range(cols):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, i, j] = np.einsum("bhwc,hwco->bo", patch, kernel)
    return y


def norm(kind, x, w, eps=1e-6):
    """The package's norm of ``kind`` (``"layer"`` or ``"rms"``) with its
    layer's weights ``w`` (``gamma``; ``beta`` for LayerNorm)."""
    if kind == "rms":
        return rms_norm(x, w["gamma"], eps)
    return layer_norm(x, w["gamma"], w["beta"], eps)
