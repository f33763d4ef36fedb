"""The official ``.npz`` files as a source of :func:`keras_vit.zoo.load`
(:mod:`keras_vit.zoo.sources`): a zoo name with a released tag, an
``augreg:`` file, a URL or a local ``.npz`` path, or None for random
initialisation.

The architecture is the name's, the input size and head the file's, the
label names the registry's list for a released head.

>>> ckpt = read_checkpoint(None, "ViT-Ti/16")
>>> ckpt.arrays, ckpt.config["image_size"], ckpt.config["num_classes"]
(None, 224, 1000)
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse

from keras_vit.base import variants
from keras_vit.zoo import build, convert, formats, registry
from keras_vit.zoo.download import fetch as download


@dataclasses.dataclass(frozen=True)
class ResolvedWeights:
    """Where a ``weights=`` argument points: a local file, and what it is."""

    path: str
    source: str
    record: registry.Weights | None = None


def is_url(value):
    """True for an http(s) or gs URL (downloaded through the cache)."""
    return isinstance(value, str) and value.split(":", 1)[0].lower() in (
        "http", "https", "gs")


def resolve_weights(name, weights, image_size=None, progress=None):
    """Turns a ``weights=`` argument into a local checkpoint file.

    ``weights`` may be a tag of ``name``, ``"augreg:<filename>"``, an
    http(s)/gs URL, or a local ``.npz`` path; downloads go through the cache.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a zoo name (str); received "
                        f"name={name!r}"[:300])
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            "weights must be a tag, a path, a URL or None; received "
            f"weights={weights!r}")
    value = os.fspath(weights)
    if value.startswith("file://"):
        value = urllib.parse.unquote(urllib.parse.urlparse(value).path)
    if value.startswith("augreg:"):
        value = registry.augreg_url(value[len("augreg:"):])
    if is_url(value):
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
    if record.url.startswith("hf-hub:"):
        raise ValueError(
            f"weights={value!r} of {name} is timm's repository {record.url}, "
            "not an official .npz file; zoo.load reads it (keras-vit "
            f"convert needs an .npz file): zoo.load({name!r}, "
            f"weights={value!r})")
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


def read_checkpoint(weights, name, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader: the :class:`~keras_vit.zoo.build.Checkpoint`
    of the zoo name ``name`` with ``weights`` (None: random
    initialisation). ``prefer_size`` picks among a tag's files released at
    several resolutions; ``sizes`` amend the name's sizes."""
    arch = variants.parse(name)
    if weights == "auto":
        weights = arch.tag or registry.default_tag(arch.name)
        if weights is None:
            raise ValueError(
                f"No released weights for name={name!r} ({arch.name}); pass "
                "weights=None for random initialisation, or a checkpoint path "
                "or URL.")
    config = dict(arch.config, **(sizes or {}))
    is_bit = arch.family == "bit"
    record = arrays = source_name = head = labels = None
    image_size = arch.image_size
    if weights is not None:
        resolved = resolve_weights(arch.name, weights, prefer_size, progress)
        record = resolved.record
        source_name = repr(resolved.path)
        raw = formats.check_npz(convert.read_npz(resolved.path, lazy=True),
                                resolved.path)
        if is_bit:
            arrays = raw
            if "resnet/head/conv2d/kernel" in arrays:
                head = int(arrays["resnet/head/conv2d/kernel"].shape[-1])
        else:
            arrays = convert.normalize_keys(raw)
            facts = _checkpoint_facts(arrays)
            config["classifier"] = facts["classifier"]
            head = facts.get("num_classes")
            if "representation_size" in facts:
                config["representation_size"] = facts["representation_size"]
            if image_size is None and "grid" in facts:
                image_size = facts["grid"] * registry.effective_stride(config)
        if record is not None:
            image_size = image_size or record.image_size
            if head == record.num_classes and record.labels:
                labels = registry.label_names(record.labels)
    random_head = registry.IMAGENET1K_CLASSES
    head_config = {}
    default = registry.hub_weights(arch.name, "auto")
    if default is not None:  # a family member: its release's head (or none)
        random_head = default.num_classes
        if default.head_type != "classifier" and arrays is None:
            head, head_config = random_head, {"head_type": default.head_type}
    config.update(image_size=image_size or 224,
                  # A file without a head asks the caller for one (settle).
                  num_classes=head or (random_head if arrays is None
                                       else None),
                  name=build.model_name(arch.name))
    return build.Checkpoint(
        config, arrays, source_name=source_name or f"name={name!r}",
        family="bit" if is_bit else "vit", head=head, label_names=labels,
        head_config=head_config, include_top=True,
        tags={"zoo_name": arch.name, "zoo_weights": record})
