"""Attention maps, attention rollout and mean attention distance (numpy).

The paper's section 4.5 and Appendix D.7/D.8: Figure 6 (rollout maps),
Figure 7 right and Figure 11 (mean attention distance per head and layer).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from keras_vit.models.memory import infer
from keras_vit.base import geometry
from keras_vit.base.checks import check_choice, check_pair


class TokenGeometry(NamedTuple):
    """How a model's token sequence maps onto its input image.

    Attributes:
        grid_size: (rows, cols) of the patch grid.
        patch_pixels: input pixels per patch side: the patch size, or for a
            hybrid the ResNet stride x patch size (the effective stride).
        num_prefix_tokens: 1 with a class token, else 0.
        image_size: (height, width) of the input.
        pooling: ``"token"`` if the output is read from the class token,
            ``"gap"`` if it is the mean of the tokens.
    """

    grid_size: tuple
    patch_pixels: int
    num_prefix_tokens: int
    image_size: tuple
    pooling: str


def token_geometry(model_or_config):
    """The :class:`TokenGeometry` of a VisionTransformer or its config dict.

    >>> g = token_geometry(dict(image_size=32, patch_size=8, resnet=None,
    ...                         classifier="token"))
    >>> g.grid_size, g.patch_pixels, g.num_prefix_tokens, g.pooling
    ((4, 4), 8, 1, 'token')
    >>> token_geometry(dict(image_size=64, patch_size=1, classifier="gap",
    ...     resnet=dict(num_layers=[1, 1]))).patch_pixels
    8
    """
    if isinstance(model_or_config, dict):
        config = model_or_config
    elif hasattr(model_or_config, "get_config") and hasattr(
            model_or_config, "grid_size"):
        config = model_or_config.get_config()
    else:
        raise ValueError(
            "model_or_config must be a keras_vit VisionTransformer or its "
            f"get_config() dict; received model_or_config={model_or_config!r}")
    missing = [k for k in ("image_size", "patch_size") if k not in config]
    if missing:
        raise ValueError(f"model_or_config lacks {missing}; received "
                         f"model_or_config={config!r}")
    image_hw = check_pair("image_size", config["image_size"])
    check_pair("patch_size", config["patch_size"])
    stride = geometry.effective_stride(config)
    classifier = config.get("classifier", "token")
    prefix = geometry.prefix_tokens(config)
    # Without a head, `pooling` decides (None returns all tokens).
    pooling = classifier
    if not config.get("include_top", True) and config.get("pooling"):
        pooling = {"avg": "gap"}.get(config["pooling"], config["pooling"])
    return TokenGeometry((image_hw[0] // stride, image_hw[1] // stride),
                         stride, prefix, image_hw, pooling)


def _is_vision_transformer(model):
    from keras_vit.models.vit import VisionTransformer

    return isinstance(model, VisionTransformer)


def attention_model(model, image_size=None):
    """The same model (same weights) also returning its attention maps.

    Args:
        model: a :class:`keras_vit.VisionTransformer` (plain or hybrid).
        image_size: optional new resolution (int or pair); position
            embeddings are resized as when loading a checkpoint (paper
            section 3.2). Default: the model's own.

    Returns:
        ``model`` itself if it already returns attention scores at that
        resolution, else a rebuilt model returning ``{"output": ...,
        "attention_scores": (B, layers, heads, N, N)}``.

    >>> import keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> sorted(attention_model(m).output)
    ['attention_scores', 'output']
    """
    if not _is_vision_transformer(model):
        raise ValueError(
            "model must be a keras_vit VisionTransformer (a ViT or a hybrid; "
            f"BiT ResNets have no attention); received model={model!r}")
    from keras_vit.models import lora
    from keras_vit.zoo import rebuild

    if any(getattr(layer, "lora_enabled", False)
           for layer in model._flatten_layers()):
        # The config rebuilds no adapters: merge them first.
        model = lora.merge(model)
    if image_size is not None:
        image_size = list(check_pair("image_size", image_size))
    rebuilt = rebuild(model, image_size=image_size,
                      return_attention_scores=True, copy=False)
    if rebuilt is model:
        return model
    for attr in ("zoo_name", "zoo_weights"):
        if hasattr(model, attr):
            setattr(rebuilt, attr, getattr(model, attr))
    return rebuilt


def _check_images(model, images):
    images = np.asarray(images)
    want = tuple(model.inputs[0].shape[1:])
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
        raise ValueError(
            f"images must have shape (batch,) + {want}; received "
            f"images.shape={images.shape}")
    return images.astype("float32", copy=False)


def attention_maps(model, images, batch_size=8):
    """Attention probabilities of every layer and head, as numpy.

    Args:
        model: a VisionTransformer (rebuilt by :func:`attention_model` if
            it does not return attention scores).
        images: (B, H, W, C) model inputs (already preprocessed).
        batch_size: images per forward pass.

    Returns:
        float32 array (B, layers, heads, N, N); rows (queries) sum to 1.

    >>> import numpy as np, keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 2, 2, 32, 3)
    >>> attention_maps(m, np.zeros((3, 32, 32, 3))).shape
    (3, 2, 2, 17, 17)
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or (
            batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer; received "
                         f"batch_size={batch_size!r}")
    model = attention_model(model)
    images = _check_images(model, images)
    out = []
    for start in range(0, len(images), batch_size):
        result = infer(model, images[start:start + batch_size])
        out.append(np.asarray(result["attention_scores"], dtype="float32"))
    return np.concatenate(out)


def _check_scores(scores, name="scores"):
    scores = np.asarray(scores)
    if scores.ndim not in (4, 5) or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(
            f"{name} must have shape (B, layers, heads, N, N) or (layers, "
            f"heads, N, N); received {name}.shape={scores.shape}")
    if not np.all(np.isfinite(scores)) or np.any(scores < 0):
        raise ValueError(f"{name} must be finite non-negative attention "
                         f"weights; received min {np.min(scores)!r}")
    return scores


_FUSIONS = ("mean", "max", "min")


def attention_rollout(scores, residual=True, head_fusion="mean"):
    """Attention rollout (Abnar & Zuidema, 2020), as in Appendix D.8.

    For each layer: fuse the heads (the paper averages them), add the
    identity for the residual connection, renormalise every row to sum to 1,
    then multiply the layers: ``joint = A_L @ ... @ A_2 @ A_1``. Row ``q``
    of ``joint`` is how much output token ``q`` draws from each input token.

    Args:
        scores: attention probabilities (B, L, H, N, N) or (L, H, N, N).
        residual: add the identity before renormalising (the residual path
            carries the token itself through every block).
        head_fusion: ``"mean"`` (the paper), ``"max"`` or ``"min"``.

    Returns:
        float64 (B, N, N), or (N, N) for unbatched ``scores``; rows sum to 1.

    >>> eye = np.broadcast_to(np.eye(3), (2, 4, 3, 3))  # 2 layers, 4 heads
    >>> attention_rollout(eye)
    array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]])
    >>> attention_rollout(np.full((1, 1, 2, 2), 0.5))  # (I + U) / 2
    array([[0.75, 0.25],
           [0.25, 0.75]])
    """
    scores = _check_scores(scores)
    check_choice("head_fusion", head_fusion, _FUSIONS)
    batched = scores.ndim == 5
    if not batched:
        scores = scores[None]
    # Reduce the heads before going to float64, to save memory.
    if head_fusion == "mean":
        fused = scores.mean(axis=2, dtype="float64")
    else:
        fused = getattr(np, head_fusion)(scores, axis=2).astype("float64")
    n = fused.shape[-1]
    if residual:
        fused = fused + np.eye(n)
    sums = fused.sum(axis=-1, keepdims=True)
    fused = fused / np.maximum(sums, np.finfo("float64").tiny)
    joint = np.broadcast_to(np.eye(n), fused[:, 0].shape).copy()
    for layer in range(fused.shape[1]):
        joint = fused[:, layer] @ joint
    return joint if batched else joint[0]


def rollout_map(model_or_config, joint):
    """The rollout heat map on the patch grid.

    Takes the class-token row of ``joint`` (the output token of a
    ``"token"`` model) or the mean of all rows (a ``"gap"`` model pools all
    tokens), keeps the columns of the patch tokens (dropping the class
    token's own share, so a map sums to less than 1) and reshapes them to
    the (rows, cols) grid. Values are not rescaled.

    Args:
        model_or_config: the model, its ``get_config()`` dict, or a
            :class:`TokenGeometry`.
        joint: (B, N, N) or (N, N) from :func:`attention_rollout`.

    Returns:
        (B, rows, cols) or (rows, cols).

    >>> cfg = dict(image_size=2, patch_size=1, classifier="token")
    >>> joint = np.eye(5)
    >>> joint[0] = [0.2, 0.1, 0.2, 0.3, 0.2]
    >>> rollout_map(cfg, joint)
    array([[0.1, 0.2],
           [0.3, 0.2]])
    """
    g = (model_or_config if isinstance(model_or_config, TokenGeometry)
         else token_geometry(model_or_config))
    joint = np.asarray(joint)
    n = g.num_prefix_tokens + g.grid_size[0] * g.grid_size[1]
    if joint.ndim not in (2, 3) or joint.shape[-2:] != (n, n):
        raise ValueError(
            f"joint must have shape (B, {n}, {n}) or ({n}, {n}) for a "
            f"{g.grid_size[0]}x{g.grid_size[1]} grid with "
            f"{g.num_prefix_tokens} prefix token(s); received "
            f"joint.shape={joint.shape}")
    if g.pooling == "token" and g.num_prefix_tokens:
        rows = joint[..., 0, :]
    else:
        rows = joint.mean(axis=-2)
    patches = rows[..., g.num_prefix_tokens:]
    return patches.reshape(patches.shape[:-1] + tuple(g.grid_size))


def upsample(heatmap, size):
    """Bilinear resize of a 2-D map to ``size`` = (height, width).

    >>> upsample(np.array([[0.0, 1.0]]), (1, 4))
    array([[0.  , 0.25, 0.75, 1.  ]], dtype=float32)
    """
    from PIL import Image

    heatmap = np.asarray(heatmap, dtype="float32")
    if heatmap.ndim != 2:
        raise ValueError(f"heatmap must be 2-D (rows, cols); received "
                         f"heatmap.shape={heatmap.shape}")
    h, w = check_pair("size", size)
    # PIL's float images resize with half-pixel centres, as tf.image does.
    return np.asarray(Image.fromarray(heatmap).resize(
        (w, h), Image.Resampling.BILINEAR), dtype="float32")


def unit_image(image):
    """``image`` ((H, W), (H, W, 1) or (H, W, 3)) as float32 in [0, 1]."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"image must be (H, W), (H, W, 1) or (H, W, 3); "
                         f"received image.shape={image.shape}")
    if image.dtype == np.uint8:
        return image.astype("float32") / 255.0
    image = image.astype("float32")
    lo, hi = float(image.min()), float(image.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            "image must be uint8 pixels or floats in [0, 1]; received floats "
            f"in [{lo:.3g}, {hi:.3g}]")
    return image


def overlay(image, heatmap):
    """The image weighted by the heat map, as in the paper's Figure 6.

    The map is upsampled (bilinear) to the image size and divided by its
    maximum, then multiplies the pixels: unattended regions go dark.

    Args:
        image: (H, W, 3) or (H, W) uint8 pixels, or floats in [0, 1].
        heatmap: (rows, cols) non-negative map, e.g. from :func:`rollout_map`.

    Returns:
        float32 (H, W, C) in [0, 1].

    >>> overlay(np.full((1, 4), 255, np.uint8), [[2.0, 0.0]])[..., 0]
    array([[1.  , 0.75, 0.25, 0.  ]], dtype=float32)
    """
    image = unit_image(image)
    mask = upsample(heatmap, image.shape[:2])
    peak = float(mask.max())
    mask = mask / peak if peak > 0 else np.zeros_like(mask)
    return np.clip(image * mask[..., None], 0.0, 1.0)


def patch_distances(grid_size, patch_pixels):
    """Euclidean distances in pixels between patch centres, (P, P) for the
    P = rows * cols patches in row-major (token) order.

    >>> patch_distances((1, 3), 4)
    array([[0., 4., 8.],
           [4., 0., 4.],
           [8., 4., 0.]])
    """
    rows, cols = check_pair("grid_size", grid_size)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    centres = np.stack([r.ravel(), c.ravel()], axis=-1) * float(patch_pixels)
    diff = centres[:, None, :] - centres[None, :, :]
    return np.sqrt((diff ** 2).sum(axis=-1))


def mean_attention_distance(scores, grid_size, patch_pixels,
                            num_prefix_tokens=1, per_image=False):
    """Mean attention distance in input pixels per layer and head (Fig. 11).

    For a query patch q the distance is ``sum_k w[q, k] * d(q, k)`` over key
    patches k, with ``d`` the Euclidean distance between the patch centres
    in input pixels (``patch_pixels`` per patch, so a hybrid's distances are
    in image pixels, not ResNet feature pixels). It is then averaged over
    the query patches and the images.

    The class token (and any prefix token) is left out on both sides: it has
    no place in the image. Its rows are dropped, and in every patch row the
    weights on the patches are renormalised to sum to 1, i.e. ``w[q, k] =
    a[q, k] / sum_k' a[q, k']`` over patches only. Without the
    renormalisation a head that parks most of its weight on the class token
    would look local (near 0) whatever its spatial spread. A row with no
    weight on any patch counts as distance 0.

    The paper (Figure 11 caption) weights distances between query *pixels*
    and all other pixels; here a patch stands for all its pixels, so a head
    attending only to its own patch scores 0 (the paper's pixel version
    would give the mean in-patch distance, about half a patch).

    Args:
        scores: attention (B, L, H, N, N) or (L, H, N, N), N = prefix +
            rows * cols.
        grid_size: (rows, cols) of the patch grid (or an int).
        patch_pixels: input pixels per patch side (the effective stride).
        num_prefix_tokens: 1 with a class token, else 0.
        per_image: return (B, L, H) instead of the mean over images.

    Returns:
        float64 (L, H) (or (B, L, H) with ``per_image``), in pixels.

    Uniform attention over a 2x2 grid of 1-pixel patches: each query sees
    distances 0, 1, 1 and sqrt(2).

    >>> d = mean_attention_distance(np.full((1, 1, 4, 4), 0.25), (2, 2), 1,
    ...                             num_prefix_tokens=0)
    >>> bool(np.isclose(d[0, 0], (2 + np.sqrt(2)) / 4))
    True
    """
    scores = _check_scores(scores)
    rows, cols = check_pair("grid_size", grid_size)
    if not isinstance(patch_pixels, (int, float, np.integer, np.floating)) or (
            isinstance(patch_pixels, bool) or not patch_pixels > 0):
        raise ValueError(f"patch_pixels must be a positive number; received "
                         f"patch_pixels={patch_pixels!r}")
    if not isinstance(num_prefix_tokens, (int, np.integer)) or (
            num_prefix_tokens < 0):
        raise ValueError(f"num_prefix_tokens must be a non-negative integer; "
                         f"received num_prefix_tokens={num_prefix_tokens!r}")
    n = num_prefix_tokens + rows * cols
    if scores.shape[-1] != n:
        raise ValueError(
            f"scores have N={scores.shape[-1]} tokens but grid_size="
            f"{(rows, cols)} with num_prefix_tokens={num_prefix_tokens} means "
            f"N={n}; received scores.shape={scores.shape}")
    batched = scores.ndim == 5
    if not batched:
        scores = scores[None]
    p = num_prefix_tokens
    dist = patch_distances((rows, cols), patch_pixels)
    tiny = np.finfo("float64").tiny
    per_img = np.empty(scores.shape[:3])
    # One layer at a time: float64 temporaries of a whole batch are large.
    for layer in range(scores.shape[1]):
        w = scores[:, layer, :, p:, p:].astype("float64")  # (B, H, q, k)
        mass = w.sum(axis=-1)
        per_query = (w * dist).sum(axis=-1) / np.maximum(mass, tiny)
        per_img[:, layer] = per_query.mean(axis=-1)
    if per_image:
        return per_img if batched else per_img[0]
    return per_img.mean(axis=0)


def uniform_attention_distance(grid_size, patch_pixels):
    """The mean attention distance of a head attending uniformly to every
    patch: the level of fully global attention on this grid.

    >>> round(uniform_attention_distance((2, 2), 1), 4)
    0.8536
    """
    d = patch_distances(grid_size, patch_pixels)
    return float(d.mean()) if d.size else math.nan
