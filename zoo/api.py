"""``zoo.load``, ``zoo.info``, ``zoo.load_weights``: named models with weights."""

from __future__ import annotations

import csv
import dataclasses
import functools
import os
import urllib.parse
from pathlib import Path

from keras_vit.errors import did_you_mean
from keras_vit import variants
from keras_vit.models.resnet_v2 import ResNetV2
from keras_vit.zoo import bit_layout, convert, download, registry, sources

_LABELS_DIR = Path(__file__).resolve().parent / "labels"


@dataclasses.dataclass(frozen=True)
class ResolvedWeights:
    """Where a ``weights=`` argument points: a local file, and what it is."""

    path: str
    source: str
    record: registry.Weights | None = None


def _is_url(value):
    return isinstance(value, str) and value.split(":", 1)[0].lower() in (
        "http", "https", "gs")


def resolve_weights(name, weights, image_size=None, progress=None):
    """Turns a ``weights=`` argument into a local checkpoint file.

    ``weights`` may be a tag of ``name`` (``zoo.info(name)["weights"]``),
    ``"augreg:<filename>"`` (any file of the AugReg bucket, see
    :func:`augreg_index`), an http(s)/gs URL, or a local ``.npz`` path.
    Downloads go through the cache (``KERAS_VIT_CACHE``, ``KERAS_VIT_MIRROR``,
    ``KERAS_VIT_OFFLINE``).
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            "weights must be a tag, a path, a URL or None; received "
            f"weights={weights!r}")
    value = os.fspath(weights)
    if value.startswith("file://"):
        value = urllib.parse.unquote(urllib.parse.urlparse(value).path)
    if value.startswith("augreg:"):
        url = registry.augreg_url(value[len("augreg:"):])
        path = download.fetch(url, progress=progress)
        return ResolvedWeights(os.fspath(path), url)
    if _is_url(value):
        return ResolvedWeights(
            os.fspath(download.fetch(value, progress=progress)), value)
    if os.path.exists(value) or value.endswith(".npz") or os.sep in value:
        if os.path.isdir(value):
            raise IsADirectoryError(
                f"weights={value!r} is a directory, not a checkpoint file "
                "(a timm repository folder needs config.json and "
                "model.safetensors)")
        if not os.path.isfile(value):
            raise FileNotFoundError(
                f"No checkpoint file at weights={value!r}")
        return ResolvedWeights(value, value)
    record = registry.select(name, value, image_size)
    path = download.fetch(record.url, sha256=record.sha256, progress=progress)
    return ResolvedWeights(os.fspath(path), record.url, record)


def _checkpoint_facts(arrays):
    """What a (normalised) checkpoint says about the model it belongs to."""
    facts = {"classifier": "token" if "cls" in arrays else "gap"}
    if "head/kernel" in arrays:
        facts["num_classes"] = int(arrays["head/kernel"].shape[-1])
    if "pre_logits/kernel" in arrays:
        facts["representation_size"] = int(arrays["pre_logits/kernel"].shape[-1])
    if convert.POSEMB_KEY in arrays:
        n = arrays[convert.POSEMB_KEY].shape[1] - (
            1 if facts["classifier"] == "token" else 0)
        side = int(round(n ** 0.5))
        if side * side == n:
            facts["grid"] = side
    return facts


def load(
    name,
    weights="auto",
    image_size=None,
    num_classes=None,
    *,
    keep_pre_logits=False,
    progress=None,
    **kwargs,
):
    """Builds a named model and loads its released weights.

    Args:
        name: e.g. ``"ViT-B/16"``, ``"ViT-B_16"``, ``"vit_base_patch16_224"``;
            any patch size parses (``"ViT-B/14"``). See :func:`list_models`.
        weights: ``"auto"`` (the paper's ImageNet fine-tune where released,
            else the recommended AugReg one), a tag listed by
            ``info(name)["weights"]``, ``"augreg:<filename>"``, a local
            ``.npz`` path, an http(s) URL, ``"hf-hub:<repo>"`` or a timm
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

    timm's weights on the Hugging Face Hub, or in local ``.safetensors``
    files, load by their handle as ``name`` or ``weights`` (see
    :mod:`keras_vit.zoo.timm_hub`; they default to ``gelu="exact"``, timm's
    GELU, where the official ``.npz`` files keep the tanh form):
    ``zoo.load("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")``.

    Hugging Face transformers' ViT weights (``config.json`` with a
    ``model_type`` + ``model.safetensors``: a folder, an ``hf-hub:`` handle,
    or a ``.safetensors`` file as ``weights=``) load the same way, with
    transformers' numerics and ``id2label`` (see
    :mod:`keras_vit.zoo.transformers_hub`):
    ``zoo.load("hf-hub:google/vit-base-patch16-224")``.

    keras-hub's ViT presets (a directory ``save_to_preset`` wrote) load the
    same way, with keras-hub's numerics, as
    :func:`keras_vit.zoo.from_keras_hub` reads them:
    ``zoo.load("vit_b16_preset")``.

    A keras_vit ``.keras`` file (or a fine-tuning run directory holding
    ``model.keras``) loads the same way, checked as
    :func:`keras_vit.resolve_model` checks it (see
    :mod:`keras_vit.zoo.keras_file`):
    ``zoo.load("runs/cifar", image_size=384, num_classes=10)``.

    Whatever the source, the steps are those of
    :mod:`keras_vit.zoo.sources`: find the source, read its architecture
    and weights (in the official layout), build the model and load them
    strictly.
    """
    # 1. The source: the first registry line that claims `name` (or
    # `weights`); the official .npz files otherwise.
    source, value, arch_name = sources.find(name, weights, progress=progress)
    # 2. Its facts and weights (official layout), the head settled.
    checkpoint = source.read(value, arch_name, image_size, num_classes,
                             keep_pre_logits=keep_pre_logits,
                             progress=progress, **kwargs)
    # 3. Built, weights loaded strictly (position embeddings resized, a
    # head of another size replaced), tagged.
    return sources.build(checkpoint, **kwargs)


def read_checkpoint(weights, name, image_size=None, num_classes=None, *,
                    keep_pre_logits=False, progress=None, **kwargs):
    """The official source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.sources.Checkpoint` of the zoo name ``name``
    with ``weights`` (a tag, ``"auto"``, ``"augreg:<filename>"``, a URL, a
    ``.npz`` path, or None for random initialisation), its input size and
    head settled as :func:`load` documents.

    >>> ckpt = read_checkpoint(None, "ViT-Ti/16", image_size=64)
    >>> ckpt.arrays, ckpt.config["image_size"], ckpt.config["num_classes"]
    (None, 64, 1000)
    """
    arch = variants.parse(name)
    if image_size is None:
        image_size = arch.image_size
    if weights == "auto":
        weights = arch.tag or registry.default_tag(arch.name)
        if weights is None:
            raise ValueError(
                f"No released weights for name={name!r} ({arch.name}); pass "
                "weights=None for random initialisation, or a checkpoint path "
                "or URL.")
    config = dict(arch.config)
    is_bit = arch.family == "bit"
    record = None
    arrays = None
    source_name = None
    if weights is not None:
        resolved = resolve_weights(arch.name, weights, image_size, progress)
        record = resolved.record
        source_name = repr(resolved.path)
        raw = convert.read_npz(resolved.path, lazy=True)
        if is_bit:
            arrays = bit_layout.normalize(raw)
            facts = {}
            if "resnet/head/conv2d/kernel" in arrays:
                facts["num_classes"] = int(
                    arrays["resnet/head/conv2d/kernel"].shape[-1])
        else:
            arrays = convert.normalize_keys(
                raw, max_blocks=kwargs.get("num_layers", config.get(
                    "num_layers")))
            facts = _checkpoint_facts(arrays)
            config["classifier"] = facts["classifier"]
        if image_size is None:
            if record is not None:
                image_size = record.image_size
            elif "grid" in facts:
                image_size = facts["grid"] * effective_stride(
                    {**config, **kwargs})
        ckpt_classes = facts.get("num_classes")
        if num_classes is None:
            num_classes = ckpt_classes
            if num_classes is None and kwargs.get("include_top", True):
                raise ValueError(
                    f"The checkpoint weights={weights!r} has no head; pass "
                    "num_classes=... for a new zero-initialised head, or "
                    "include_top=False for features.")
        head_kept = (num_classes == ckpt_classes
                     and kwargs.get("include_top", True))
        if "representation_size" in facts and (
                head_kept or keep_pre_logits
                or not kwargs.get("include_top", True)):
            config["representation_size"] = facts["representation_size"]
    if image_size is None:
        image_size = 224
    if num_classes is None:
        num_classes = registry.IMAGENET1K_CLASSES
    config.update(image_size=image_size, num_classes=num_classes,
                  name=sources.model_name(arch.name))
    return sources.Checkpoint(
        config, arrays, source_name=source_name,
        family="bit" if is_bit else "vit", keep_pre_logits=keep_pre_logits,
        tags={"zoo_name": arch.name, "zoo_weights": record})


def load_weights(model, path_or_url, *, sha256=None, keep_pre_logits=None,
                 progress=None):
    """Loads an official-layout ``.npz`` (path, URL or ``{key: array}``) into
    a built model.

    Strict: missing, unexpected and mis-shaped arrays are listed together in
    one error. Position embeddings are resized to the model's grid and a head
    of another size is replaced by zeros (see
    :func:`keras_vit.zoo.convert.load_weights`).
    """
    source = path_or_url
    if not isinstance(path_or_url, dict):
        source = os.fspath(path_or_url)
        if _is_url(source):
            source = os.fspath(download.fetch(source, sha256=sha256,
                                              progress=progress))
        elif (sha256 is not None
              and download.sha256_file(source) != sha256.lower()):
            raise download.ChecksumError(
                f"sha256 of path_or_url={source!r} does not match {sha256}")
    if isinstance(model, ResNetV2):
        return bit_layout.load_weights(model, source)
    return convert.load_weights(model, source, keep_pre_logits=keep_pre_logits)


# The registry's questions answered without Keras (the command line's
# `list` and `info`), re-exported here.
info = registry.info
effective_stride = registry.effective_stride
list_models = registry.list_models


@functools.lru_cache(maxsize=None)
def labels(name):
    """A label list that ships with the package: ``"imagenet2012"`` (1000
    classes) or ``"imagenet21k"`` (21843), as ``[(wordnet_id, names)]``."""
    path = _LABELS_DIR / f"{name}.txt"
    if not path.is_file():
        known = sorted(p.stem for p in _LABELS_DIR.glob("*.txt"))
        raise ValueError(f"Unknown label list name={name!r}; known: {known}."
                         f"{did_you_mean(str(name), known)}")
    with open(path, encoding="utf-8") as f:
        return tuple(tuple(line.rstrip("\n").split("\t", 1)) for line in f)


def augreg_index(progress=None):
    """The rows of the AugReg bucket's ``index.csv`` (downloaded and cached).

    Each row is a dict with the official columns (``name``, ``ds``,
    ``filename``, ``adapt_ds``, ``adapt_res``, ``adapt_filename``,
    ``adapt_final_test``, ...). Pick a file and pass
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
