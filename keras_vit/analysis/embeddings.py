"""Position-embedding similarity and patch-embedding filters (numpy).

The paper's Figure 7 left (principal components of the embedding filters)
and centre / Figure 10 (cosine similarity of position embeddings).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from keras_vit.base.checks import as_array


def _layer_of_type(model, cls, what):
    for layer in getattr(model, "layers", ()):
        if isinstance(layer, cls):
            return layer
    raise ValueError(f"model={getattr(model, 'name', model)!r} has no {what} "
                     "layer; pass a keras_vit VisionTransformer")


def position_embedding_similarity(model):
    """Cosine similarity between the position embeddings of all patches.

    The class token's embedding is left out: it has no place on the grid.

    Args:
        model: a VisionTransformer (plain or hybrid).

    Returns:
        float64 (rows, cols, rows, cols): ``sim[r, c]`` is the tile of the
        paper's figure for the patch at row r, column c.

    >>> import keras_vit
    >>> sim = position_embedding_similarity(keras_vit.vit(32, 8, 16, 1, 2,
    ...                                                   32, 3))
    >>> sim.shape, bool(np.allclose(sim[1, 2, 1, 2], 1.0))
    ((4, 4, 4, 4), True)
    """
    from keras_vit.layers import PositionEmbedding

    layer = _layer_of_type(model, PositionEmbedding, "PositionEmbedding")
    table = np.asarray(layer.pos_embedding.numpy(), dtype="float64")[0]
    grid = table[layer.num_prefix_tokens:]
    norms = np.linalg.norm(grid, axis=-1, keepdims=True)
    unit = grid / np.maximum(norms, np.finfo("float64").tiny)
    sim = unit @ unit.T
    rows, cols = layer.grid_size
    return sim.reshape(rows, cols, rows, cols)


def neighbour_similarity(similarity):
    """Mean cosine similarity of 4-neighbour patches and of all other pairs.

    >>> sim = np.zeros((2, 2, 2, 2)); sim[0, 0, 0, 1] = sim[0, 1, 0, 0] = 1
    >>> neighbour_similarity(sim)
    {'adjacent': 0.25, 'other': 0.0}
    """
    sim = as_array("similarity", similarity, "float64")
    if sim.ndim != 4 or sim.shape[:2] != sim.shape[2:]:
        raise ValueError(f"similarity must have shape (rows, cols, rows, "
                         f"cols); received similarity.shape={sim.shape}")
    rows, cols = sim.shape[:2]
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    r, c = r.ravel(), c.ravel()
    steps = np.abs(r[:, None] - r[None]) + np.abs(c[:, None] - c[None])
    flat = sim.reshape(rows * cols, rows * cols)
    adjacent, other = flat[steps == 1], flat[steps > 1]
    return {"adjacent": float(adjacent.mean()) if adjacent.size else None,
            "other": float(other.mean()) if other.size else None}


class FilterComponents(NamedTuple):
    """Principal components of the patch-embedding filters.

    Attributes:
        images: (n, P, P, C) components rescaled to [0, 1] each, for display.
        explained_variance_ratio: (n,) share of the filters' variance.
        components: (n, P, P, C) unit-norm components, signed so that each
            one's largest-magnitude entry is positive.
    """

    images: np.ndarray
    explained_variance_ratio: np.ndarray
    components: np.ndarray


def embedding_filter_components(model, n=28):
    """Top principal components of the patch-embedding filters (Fig. 7 left).

    The kernel (P, P, C, D) holds D filters of P*P*C weights. PCA over the D
    filters: centre them, take the SVD, keep the top ``n`` right singular
    vectors, reshape them to P x P x C patches.

    Args:
        model: a VisionTransformer whose patches are cut from RGB (or
            single-channel) pixels. A hybrid's embedding acts on ResNet
            feature maps (hundreds of channels, 1x1 patches in the released
            models); its filters are not images, so it raises ValueError.
        n: components to return; at most min(D, P*P*C) are.

    Returns:
        a :class:`FilterComponents`.

    >>> import keras_vit
    >>> pcs = embedding_filter_components(keras_vit.vit(32, 8, 16, 1, 2,
    ...                                                 32, 3), n=4)
    >>> pcs.images.shape, bool(pcs.images.min() >= 0)
    ((4, 8, 8, 3), True)
    """
    from keras_vit.layers import PatchEmbedding

    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer; received n={n!r}")
    if getattr(model, "resnet", None):
        raise ValueError(
            f"model={model.name!r} is a hybrid: its patch embedding acts on "
            "ResNet feature maps, not RGB pixels, so its filters have no "
            "image to show (Figure 7 left is for plain ViTs only)")
    layer = _layer_of_type(model, PatchEmbedding, "PatchEmbedding")
    kernel = np.asarray(layer.conv.kernel.numpy(), dtype="float64")
    p_h, p_w, channels, dim = kernel.shape
    if channels not in (1, 3):
        raise ValueError(
            f"model={model.name!r} embeds {channels}-channel inputs; filters "
            "can only be drawn for RGB or single-channel images")
    filters = kernel.reshape(p_h * p_w * channels, dim).T  # (D, P*P*C)
    centred = filters - filters.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    k = min(int(n), vt.shape[0])
    comps = vt[:k]
    # SVD signs are arbitrary; fix them so results are reproducible.
    peak = comps[np.arange(k), np.abs(comps).argmax(axis=1)]
    comps = comps * np.where(peak < 0, -1.0, 1.0)[:, None]
    variance = singular ** 2
    total = variance.sum()
    ratio = variance[:k] / total if total > 0 else np.zeros(k)
    lo = comps.min(axis=1, keepdims=True)
    span = comps.max(axis=1, keepdims=True) - lo
    images = np.where(span > 0, (comps - lo) / np.where(span > 0, span, 1),
                      0.5)
    shape = (k, p_h, p_w, channels)
    return FilterComponents(images.reshape(shape), ratio,
                            comps.reshape(shape))
