"""Where :func:`keras_vit.zoo.load` reads weights from, and the one place
that builds the model they fill.

``zoo.load(name, weights)`` is a pipeline of three steps:

1. **find** the source (:func:`find`): the first line of :data:`SOURCES`
   whose predicate claims ``name`` (then ``weights``, ``name`` naming the
   architecture); the official ``.npz`` files (:data:`OFFICIAL`: a tag, a
   path, a URL, or None for random weights) answer the rest;
2. **read** it: the source's reader returns a :class:`Checkpoint`, the
   builder's arguments the checkpoint fixes (its sizes, numerics, input
   size and head, as the caller's ``image_size`` / ``num_classes`` settle
   them) and its weights as ``{key: array}`` in the official ``.npz``
   layout (:mod:`keras_vit.zoo.convert`);
3. **build** (:func:`build`): the model, the caller's keywords over the
   checkpoint's arguments, the weights loaded strictly (missing,
   unexpected and mis-shaped arrays listed together in one error naming
   the file, nothing assigned before all fit; position embeddings resized
   to another grid, a head of another size replaced by zeros), then tagged
   (``zoo_name``, ``zoo_weights``, and the source's ``zoo_labels`` /
   ``zoo_source``).

A reader is ``read(value, name, image_size, num_classes, *,
keep_pre_logits, progress, **kwargs) -> Checkpoint`` and a predicate
``claims(value, *, progress) -> bool``; adding a source is one module
holding both and one line in :data:`SOURCES`. Lines name their module and
functions, so nothing is imported before a source is asked about.

>>> [source.name for source in SOURCES] + [OFFICIAL.name]
['transformers', 'timm', 'keras-hub', 'keras', 'official']
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import typing


@dataclasses.dataclass
class Checkpoint:
    """What a reader returns: enough to build and fill the model.

    Attributes:
        config: keyword arguments of the builder (:func:`keras_vit.vit`,
            or :func:`keras_vit.models.resnet_v2.resnet_v2` for
            ``family="bit"``) that the checkpoint fixes: sizes, numerics,
            ``image_size``, ``num_classes``, ``classifier``,
            ``representation_size``, a default ``name``, ... The caller's
            keywords win over them.
        arrays: the weights, ``{key: array}`` in the official ``.npz``
            layout (ViT, or BiT for ``family="bit"``); None for random
            initialisation.
        source_name: how errors name the checkpoint (its file).
        family: ``"vit"`` (ViT, hybrid, axial) or ``"bit"`` (a ResNetV2).
        keep_pre_logits: passed to
            :func:`keras_vit.zoo.convert.load_weights`.
        tags: attributes set on the model once loaded (``zoo_name``,
            ``zoo_weights``, ``zoo_labels``, ``zoo_source``).
    """

    config: dict
    arrays: typing.Mapping | None = None
    source_name: str | None = None
    family: str = "vit"
    keep_pre_logits: bool | None = None
    tags: dict = dataclasses.field(default_factory=dict)


def build(checkpoint, **kwargs):
    """The model ``checkpoint`` describes, with its weights loaded
    strictly: the builder gets ``checkpoint.config`` with ``**kwargs``
    over it; :func:`keras_vit.zoo.convert.load_weights` (ViT) or
    :func:`keras_vit.zoo.bit_layout.load_weights` (BiT) resize the
    position embeddings to the model's grid, replace a head of another
    size by zeros and list every missing, unexpected and mis-shaped array
    in one error naming ``checkpoint.source_name``, before anything is
    assigned. Then ``checkpoint.tags`` are set on the model.

    >>> import numpy as np
    >>> from keras_vit.zoo import sources
    >>> ckpt = sources.Checkpoint(dict(
    ...     image_size=32, patch_size=16, hidden_size=32, num_layers=1,
    ...     num_heads=2, mlp_dim=64, num_classes=3), tags={"zoo_name": "tiny"})
    >>> model = sources.build(ckpt, num_classes=5)
    >>> model.zoo_name, model.output_shape
    ('tiny', (None, 5))
    """
    from keras_vit.zoo import bit_layout, convert

    config = {**checkpoint.config, **kwargs}
    if checkpoint.family == "bit":
        from keras_vit.models.resnet_v2 import resnet_v2 as builder
    else:
        from keras_vit.models.vit import vit as builder
    model = builder(**config)
    if checkpoint.arrays is not None:
        if checkpoint.family == "bit":
            bit_layout.load_weights(model, checkpoint.arrays,
                                    source_name=checkpoint.source_name)
        else:
            convert.load_weights(model, checkpoint.arrays,
                                 keep_pre_logits=checkpoint.keep_pre_logits,
                                 source_name=checkpoint.source_name)
    for attr, value in checkpoint.tags.items():
        setattr(model, attr, value)
    return model


def model_name(arch_name):
    """The Keras model name a zoo name gives by default:
    ``"ViT-B/16"`` -> ``"vit_b_16"``.

    >>> model_name("R50+ViT-B/16")
    'r50_vit_b_16'
    """
    return (arch_name.replace("/", "_").replace("+", "_").lower()
            .replace("-", "_"))


class Source(typing.NamedTuple):
    """One line of the registry: a source's name, and its predicate and
    reader as functions of a ``keras_vit.zoo`` module (imported when the
    source is first asked about)."""

    name: str
    module: str
    claims_name: str | None
    read_name: str

    def _function(self, attr):
        return getattr(importlib.import_module(f"keras_vit.zoo.{self.module}"),
                       attr)

    def claims(self, value, *, progress=None):
        """True when this source reads ``value``."""
        if self.claims_name is None:
            return True
        return bool(self._function(self.claims_name)(value, progress=progress))

    def read(self, value, name, image_size=None, num_classes=None, *,
             keep_pre_logits=False, progress=None, **kwargs):
        """The :class:`Checkpoint` this source reads from ``value``."""
        return self._function(self.read_name)(
            value, name, image_size, num_classes,
            keep_pre_logits=keep_pre_logits, progress=progress, **kwargs)


# The sources zoo.load asks, in order; each is asked about `name`, then
# about `weights` (with `name` as the architecture).
SOURCES = (
    Source("transformers", "transformers_hub", "is_transformers_source",
           "read_checkpoint"),
    Source("timm", "timm_hub", "is_timm_source", "read_checkpoint"),
    Source("keras-hub", "keras_hub_io", "is_keras_hub_source",
           "read_checkpoint"),
    Source("keras", "keras_file", "is_keras_file", "read_checkpoint"),
)
# What no line claims: a zoo name with an official .npz (a tag, a path, a
# URL) or None for random weights.
OFFICIAL = Source("official", "api", None, "read_checkpoint")


def find(name, weights, *, progress=None):
    """``(source, value, arch_name)``: the :class:`Source` that reads what
    ``zoo.load(name, weights)`` asks for, the value it reads, and the
    architecture name that goes with it (None: the source's own).

    >>> source, value, arch_name = find("ViT-B/16", "auto")
    >>> source.name, value, arch_name
    ('official', 'auto', 'ViT-B/16')
    """
    for source in SOURCES:
        for value, arch_name in ((name, None), (weights, name)):
            if arch_name is not None and (weights is None or (
                    isinstance(weights, str) and weights == "auto")):
                continue
            if source.claims(value, progress=progress):
                return source, value, arch_name
    _refuse_unread_path(name)
    return OFFICIAL, weights, name


def _refuse_unread_path(name):
    """Raises FileNotFoundError for a ``name`` that is a folder no source
    reads, or a path (absolute, ``./``, ``../``, ``~``) to nothing: such a
    name otherwise reached the zoo's name parser and was called an
    unknown model. Zoo names never start with those."""
    if not isinstance(name, str):
        return
    if os.path.isdir(name):
        raise FileNotFoundError(
            f"name={name!r} is a folder keras_vit cannot read: a fine-tune "
            "run holds model.keras (written when it finishes), a timm or "
            "transformers repository config.json and model.safetensors, a "
            "keras-hub preset config.json and metadata.json")
    if name.startswith((os.sep, "./", "../", "~")) and not os.path.exists(
            name):
        raise FileNotFoundError(
            f"name={name!r} does not exist; zoo.load takes a zoo name "
            "(keras_vit.zoo.list_models()), a .keras file, a fine-tune "
            "run's folder, or a timm, transformers or keras-hub folder")
