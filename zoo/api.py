"""``zoo.load``, ``zoo.info``, ``zoo.load_weights``: named models with weights."""

from __future__ import annotations

import csv
import os

from keras_vit.base import variants
from keras_vit.models.resnet_v2 import ResNetV2
from keras_vit.zoo import checkpoints, convert, registry, settle, sources
from keras_vit.zoo.official import bit as bit_layout
from keras_vit.zoo.download import fetch as download
from keras_vit.zoo.download import cache as download_cache
from keras_vit.zoo.official.release import is_url


def load(name, weights="auto", image_size=None, num_classes=None, *,
         keep_pre_logits=False, progress=None, **kwargs):
    """Builds a named model and loads its released weights.

    Args:
        name: e.g. ``"ViT-B/16"``, ``"ViT-B_16"``, ``"vit_base_patch16_224"``;
            any patch size parses (``"ViT-B/14"``). See :func:`list_models`.
        weights: ``"auto"`` (the paper's ImageNet fine-tune where released,
            else the recommended AugReg one), a tag listed by
            ``info(name)["weights"]``, ``"augreg:<filename>"``, a local
            ``.npz`` path, an http(s) URL, ``"hf-hub:<repo>"``, a timm
            ``.safetensors`` file, a transformers or keras-hub folder, a
            keras_vit ``.keras`` file, or None for random initialisation.
        image_size: input resolution; default: the checkpoint's. Position
            embeddings are resized for any other size (paper section 3.2).
        num_classes: size of the head; default: the checkpoint's. Another
            size gives a zero-initialised head (and drops ``pre_logits``
            unless ``keep_pre_logits=True``).
        keep_pre_logits: keep the checkpoint's ``pre_logits`` layer when the
            head is replaced.
        progress: show a download progress bar (default: when on a terminal).
        **kwargs: passed to :func:`keras_vit.models.vit` (``include_top``,
            ``pooling``, ``include_preprocessing``, ``dropout_rate``,
            ``return_attention_scores``, ``classifier_activation``, ...).

    Example:

    >>> import keras_vit
    >>> model = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=64,
    ...                            num_classes=10)
    >>> model.count_params()
    5491786

    timm's, transformers' and keras-hub's weights, and keras_vit ``.keras``
    files or run directories, load the same way, as ``name`` or
    ``weights``: ``zoo.load("hf-hub:google/vit-base-patch16-224")``,
    ``zoo.load("runs/cifar", image_size=384, num_classes=10)``. A source
    that holds its own weights takes ``weights="auto"`` (them) or None (its
    architecture, randomly initialised); a folder holding two sources'
    files is refused as ambiguous. timm's files default to
    ``gelu="exact"``, timm's GELU. The steps are those of
    :mod:`keras_vit.zoo.sources`. ``label_names=[...]`` names the head's
    classes (by default the checkpoint's while its head is kept).
    """
    weights, image_size = _timm_keywords(kwargs, weights, image_size)
    return sources.load(name, weights, settle.request(
        image_size=image_size, num_classes=num_classes,
        keep_pre_logits=keep_pre_logits, **kwargs), progress=progress)


def _timm_keywords(kwargs, weights, image_size):
    """timm's ``create_model`` keywords (``pretrained``, ``img_size``,
    ``features_only``), understood or refused before anything is read.
    Returns ``(weights, image_size)``; ``kwargs`` loses the keywords it
    took."""
    if "features_only" in kwargs:
        value = kwargs.pop("features_only")
        if value:
            raise ValueError(
                "features_only=True is timm's; here model.intermediate_model"
                "(indices) gives the outputs of chosen blocks as maps, "
                "num_classes=0 the pooled embedding, include_top=False the "
                f"tokens; received features_only={value!r}")
    if "pretrained" in kwargs:
        pretrained = kwargs.pop("pretrained")
        if not isinstance(pretrained, bool):
            raise ValueError(f"pretrained must be True or False (timm's "
                             f"keyword; here weights=); received "
                             f"pretrained={pretrained!r}")
        wanted = "auto" if pretrained else None
        if weights not in ("auto", wanted):
            raise ValueError(
                f"pretrained={pretrained} and weights={weights!r} disagree; "
                "pass one of them (weights= names which weights)")
        weights = weights if pretrained else None
    if "img_size" in kwargs:
        size = kwargs.pop("img_size")
        if image_size is not None and image_size != size:
            raise ValueError(f"img_size={size!r} (timm's keyword) and "
                             f"image_size={image_size!r} disagree; pass one")
        image_size = size
    return weights, image_size


def load_weights(model, path_or_url, *, sha256=None, keep_pre_logits=None,
                 progress=None):
    """Loads an official-layout ``.npz`` (path, URL or ``{key: array}``) into
    a built model.

    Strict, as :func:`keras_vit.zoo.convert.load_weights`: a checkpoint
    without a head is refused for a model with one (``zoo.load(name,
    weights=path, num_classes=...)`` gives a new head).
    """
    checkpoints.check_model(model)
    source = path_or_url
    if not isinstance(path_or_url, (dict, str, os.PathLike)):
        raise TypeError("path_or_url must be a path, a URL or a dict of "
                        f"arrays; received path_or_url={path_or_url!r}"[:300])
    if not isinstance(path_or_url, dict):
        source = os.fspath(path_or_url)
        if is_url(source):
            source = os.fspath(download.fetch(source, sha256=sha256,
                                              progress=progress))
        elif (sha256 is not None
              and download_cache.sha256_file(source) != sha256.lower()):
            raise download_cache.ChecksumError(
                f"sha256 of path_or_url={source!r} does not match {sha256}")
    if isinstance(model, ResNetV2):
        return bit_layout.load_weights(model, source)
    return convert.load_weights(model, source, keep_pre_logits=keep_pre_logits,
                                fresh_head=False)


info = registry.info
effective_stride = registry.effective_stride
list_models = registry.list_models
labels = registry.labels


def augreg_index(progress=None):
    """The rows of the AugReg bucket's ``index.csv`` (downloaded and cached).

    Each row is a dict with the official columns (``name``, ``ds``,
    ``filename``, ``adapt_filename``, ...); pass
    ``weights="augreg:<filename>"`` to :func:`load`.
    """
    path = download.fetch(registry.AUGREG_INDEX_URL, progress=progress)
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def find_augreg(name, *, pretrain_ds="i21k", adapt_ds="imagenet2012",
                adapt_res=None, progress=None):
    """The best AugReg fine-tune of ``name`` in ``index.csv``.

    Among rows of this architecture pre-trained on ``pretrain_ds`` and
    adapted to ``adapt_ds`` (at ``adapt_res`` if given), returns the
    ``adapt_filename`` with the highest ``adapt_final_val``; with
    ``adapt_ds=None``, the upstream ``filename`` with the best ``final_val``.
    """
    arch = variants.parse(name)
    short = arch.name.replace("ViT-", "").replace("+", "_").replace("/", "_")
    rows = [r for r in augreg_index(progress)
            if r.get("name") == short and r.get("ds") == pretrain_ds]
    if adapt_ds is None:
        if not rows:
            raise ValueError(f"No AugReg checkpoint of name={name!r} "
                             f"pre-trained on pretrain_ds={pretrain_ds!r}")
        best = max(rows, key=lambda r: float(r.get("final_val") or 0))
        return best["filename"]
    rows = [r for r in rows if r.get("adapt_ds") == adapt_ds
            and (adapt_res is None or int(r.get("adapt_res", 0)) == adapt_res)]
    if not rows:
        raise ValueError(
            f"No AugReg fine-tune of name={name!r} on adapt_ds={adapt_ds!r} "
            f"at adapt_res={adapt_res!r} in the index")
    best = max(rows, key=lambda r: float(r.get("adapt_final_val") or 0))
    return best["adapt_filename"]
