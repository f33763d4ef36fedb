"""``inspect``: every figure of section 4.5 for one model and some images."""

from __future__ import annotations

import os
import re

import numpy as np

from keras_vit.base import atomic
from keras_vit.analysis.attention import (attention_model,
                                          attention_rollout,
                                          mean_attention_distance,
                                          rollout_map, token_geometry,
                                          uniform_attention_distance)
from keras_vit.analysis.embeddings import (embedding_filter_components,
                                           neighbour_similarity,
                                           position_embedding_similarity)
from keras_vit.data.normalization import model_input
from keras_vit.models.memory import infer
from keras_vit.zoo.preprocessing import head_probabilities, model_labels

FILES = {
    "filters": "embedding_filters.png",
    "position": "position_embedding_similarity.png",
    "distance": "attention_distance.png",
    "json": "analysis.json",
}


def load_images(paths, image_size, channels=3):
    """Image files as float32 (B, H, W, C) pixels in [0, 255].

    Decoded by :mod:`keras_vit.data.images`, reduced to greyscale for
    ``channels=1`` (as Pillow's ``"L"``) and resized bilinearly without
    antialiasing or crop, as the official evaluation does.

    >>> import tempfile, os
    >>> from PIL import Image
    >>> path = os.path.join(tempfile.mkdtemp(), "a.png")
    >>> Image.new("RGB", (5, 3), (255, 0, 0)).save(path)
    >>> x = load_images([path], 4)
    >>> x.shape, x[0, 0, 0].tolist()
    ((1, 4, 4, 3), [255.0, 0.0, 0.0])
    """
    import keras

    from keras_vit.data import images

    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3; received "
                         f"channels={channels!r}")
    out = []
    for path in paths:
        _check_image_file(path)
        pixels = images.read(path).astype("float32")
        if channels == 1:
            pixels = _luma(pixels)[..., None]
        resized = keras.ops.image.resize(
            pixels[None], tuple(image_size), interpolation="bilinear",
            antialias=False)
        out.append(np.asarray(resized)[0])
    return np.stack(out)


def _luma(rgb):
    """ITU-R 601-2 luma of uint8-valued RGB, rounded as Pillow's
    ``convert("L")`` rounds (a grey image keeps its values)."""
    r, g, b = (rgb[..., i].astype("int64") for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(
        "float32")


def _check_image_file(path):
    from keras_vit.base.archives import special_file

    kind = special_file(path)  # opening a FIFO blocks until it is written
    if kind is not None:
        raise ValueError(f"image {path!r} is {kind}, not a regular file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path!r}")


def _image_paths(images):
    if isinstance(images, (str, os.PathLike)):
        images = [images]
    try:
        paths = [os.fspath(p) for p in images]
    except TypeError:
        raise ValueError("images must be image file paths; received "
                         f"images={images!r}") from None
    if not paths:
        raise ValueError("images must name at least one image file; "
                         f"received images={images!r}")
    for path in paths:
        _check_image_file(path)
    return paths


def _load_model(model_or_name, weights, image_size):
    """Returns ``(model returning attention scores, description)``."""
    from keras_vit.base import variants
    from keras_vit.zoo.resolve import model_path, resolve_model

    if isinstance(model_or_name, (str, os.PathLike)) and model_path(
            model_or_name, "model_or_name") is None:
        value = os.fspath(model_or_name)
        if variants.parse(value).family == "bit":
            raise ValueError(f"model_or_name={value!r} is a BiT ResNet: it "
                             "has no attention to inspect")
        # Built with the extra output: no second copy of the weights.
        model = resolve_model(value, weights=weights, image_size=image_size,
                              return_attention_scores=True,
                              argument="model_or_name")
        record = getattr(model, "zoo_weights", None)
        tag = record.tag if record is not None else weights
        return model, f"{model.zoo_name} ({tag or 'random init'})"
    model = resolve_model(model_or_name, weights=weights,
                          argument="model_or_name")
    if model is model_or_name:
        description = getattr(model, "zoo_name", model.name)
    else:
        description = os.path.basename(os.path.normpath(model_or_name))
    return attention_model(model, image_size), description


def _round(value, digits=6):
    """Nested lists of floats with ``digits`` significant digits."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_round(v, digits) for v in value]
    return float(f"{float(value):.{digits}g}")


def _safe_stem(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)[:40] or "image"


def inspect(model_or_name, images, out_dir, *, weights="auto",
            image_size=None, batch_size=8):
    """Writes the figures of section 4.5 / Appendix D.7-D.8 as PNGs + JSON.

    Files in ``out_dir``: ``embedding_filters.png`` (Figure 7 left; not for
    hybrids), ``position_embedding_similarity.png`` (Figure 7 centre),
    ``attention_distance.png`` (Figure 7 right, averaged over ``images``),
    one ``rollout_NN_<name>.png`` per image (Figure 6) and
    ``analysis.json`` with the numbers.

    Args:
        model_or_name: a VisionTransformer, a zoo name (``"ViT-B/16"``) or a
            ``.keras`` path.
        images: image file paths (any size; resized to the model's).
        out_dir: output directory (created).
        weights: for a zoo name, as in :func:`keras_vit.zoo.load`.
        image_size: inspect at this resolution (position embeddings are
            resized); default: the model's.
        batch_size: images per forward pass. One batch's attention takes
            batch_size x layers x heads x N^2 x 4 bytes (ViT-L/16 at 224:
            60 MB per image); lower it for large models.

    Returns:
        The dict written to ``analysis.json``, plus ``"out_dir"``.
    """
    # Without matplotlib this raises MissingDependencyError.
    from keras_vit.analysis import plots

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or (
            batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer; received "
                         f"batch_size={batch_size!r}")
    paths = _image_paths(images)
    model, description = _load_model(model_or_name, weights, image_size)
    g = token_geometry(model)
    pixels = load_images(paths, g.image_size, channels=model.num_channels)
    inputs = model_input(model, pixels)

    distances, maps, outputs = [], [], []
    for start in range(0, len(inputs), batch_size):
        result = infer(model, inputs[start:start + batch_size])
        scores = np.asarray(result["attention_scores"], dtype="float32")
        distances.append(mean_attention_distance(
            scores, g.grid_size, g.patch_pixels, g.num_prefix_tokens,
            per_image=True))
        maps.append(rollout_map(g, attention_rollout(scores)))
        outputs.append(np.asarray(result["output"]))
        del scores  # (B, L, H, N, N) is the big one for large models
    distance = np.concatenate(distances).mean(axis=0)
    maps = np.concatenate(maps)
    outputs = np.concatenate(outputs)

    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    files = []

    def out(name):
        files.append(name)
        return os.path.join(out_dir, name)

    hw = f"{g.image_size[0]}x{g.image_size[1]}"
    reference = uniform_attention_distance(g.grid_size, g.patch_pixels)
    plots.plot_attention_distance(
        distance, out(FILES["distance"]), image_size=g.image_size[1],
        reference=reference,
        title=f"{description}, {hw}, {len(paths)} image(s)")

    similarity = position_embedding_similarity(model)
    plots.plot_position_similarity(
        similarity, out(FILES["position"]),
        title=f"Position embedding similarity, {description}")

    try:
        pcs = embedding_filter_components(model)
    except ValueError as e:  # hybrids: the filters act on ResNet features
        filters = {"skipped": str(e)}
    else:
        plots.plot_filters(
            pcs.images, out(FILES["filters"]),
            explained_variance_ratio=pcs.explained_variance_ratio,
            title=f"Embedding filters (top {len(pcs.images)} principal "
                  f"components), {description}")
        filters = {"file": FILES["filters"],
                   "explained_variance_ratio": _round(
                       pcs.explained_variance_ratio)}

    labels = probs = None
    if model.include_top:
        probs = head_probabilities(model, outputs)
        _, labels = model_labels(model, probs.shape[-1], by_head=False)

    per_image = []
    for i, path in enumerate(paths):
        name = f"rollout_{i + 1:02d}_{_safe_stem(path)}.png"
        entry = {"path": path, "file": name}
        title = os.path.basename(path)
        if probs is not None:
            k = int(np.argmax(probs[i]))
            label = labels[k][1] if labels else f"class {k}"
            entry["prediction"] = {"index": k, "label": label,
                                   "probability": _round(probs[i, k])}
            title += f": predicted {label} ({probs[i, k]:.0%})"
        display = np.clip(np.round(pixels[i]), 0, 255).astype("uint8")
        plots.plot_rollout(display, maps[i], out(name), title=title)
        entry["rollout"] = _round(maps[i])
        per_image.append(entry)

    pair = neighbour_similarity(similarity)
    result = {
        "model": {
            "description": description,
            "image_size": list(g.image_size),
            "patch_size": model.patch_size,
            "effective_stride": g.patch_pixels,
            "grid_size": list(g.grid_size),
            "classifier": model.classifier,
            "pooling": g.pooling,
            "hybrid": bool(model.resnet),
            "num_layers": model.num_layers,
            "num_heads": model.num_heads,
        },
        "num_images": len(paths),
        "mean_attention_distance": {
            "file": FILES["distance"],
            "pixels": _round(distance),
            "per_layer_mean": _round(distance.mean(axis=1)),
            "uniform_attention_reference": _round(reference),
            "definition": "per layer (rows) and head (columns): attention-"
                          "weighted Euclidean distance in input pixels "
                          "between query and key patch centres, class token "
                          "excluded and patch weights renormalised per "
                          "query, averaged over query patches and images",
        },
        "position_embedding_similarity": {
            "file": FILES["position"],
            "mean_adjacent": _round(pair["adjacent"])
            if pair["adjacent"] is not None else None,
            "mean_other": _round(pair["other"])
            if pair["other"] is not None else None,
        },
        "embedding_filters": filters,
        "rollout": {
            "definition": "attention rollout: heads averaged, identity "
                          "added, rows renormalised, layers multiplied; "
                          "class-token row (token models) or mean row (gap "
                          "models), patch columns on the grid, not rescaled",
        },
        "images": per_image,
        "files": files + [FILES["json"]],
    }
    atomic.write_json(out(FILES["json"]), result, indent=1)
    return dict(result, out_dir=out_dir)
