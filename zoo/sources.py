"""Where :func:`keras_vit.zoo.load` reads weights from, and the one
pipeline every load goes through.

Every load runs five steps (:func:`load`): **find** the source
(:func:`find`: the line of :data:`SOURCES` that claims ``name``, then
``weights``; else a family member's timm repository; else :data:`OFFICIAL`),
**read** it into a :class:`~keras_vit.zoo.build.Checkpoint`, **settle** what
the caller asks (:mod:`keras_vit.zoo.settle`), **bound** it against memory
(:func:`keras_vit.models.memory.check_config`), **build** (:func:`build`).
Adding a source is one module holding a reader and a predicate, and one
line in :data:`SOURCES`.

>>> [source.name for source in SOURCES] + [OFFICIAL.name]
['transformers', 'timm', 'keras-hub', 'keras', 'official']
"""

from __future__ import annotations

import dataclasses
import os
import typing

from keras_vit.base import variants
from keras_vit.zoo import registry, settle
from keras_vit.zoo.build import build, build_settled


def reader_module(name):
    """The reader module of a source, imported when first asked about
    (the readers import Keras and NumPy; ``keras-vit list`` needs
    neither)."""
    if name == "transformers":
        from keras_vit.zoo.transformers import hub as module
    elif name == "timm":
        from keras_vit.zoo.timm import hub as module
    elif name == "keras-hub":
        from keras_vit.zoo.keras_hub import io as module
    elif name == "keras":
        from keras_vit.zoo import keras_file as module
    elif name == "official":
        from keras_vit.zoo.official import release as module
    else:
        raise ValueError(f"no source is named {name!r}")
    return module


class Source(typing.NamedTuple):
    """One line of the registry: a source's name, and its predicate and
    reader, functions of its module (:func:`reader_module`)."""

    name: str
    claims_name: str | None
    read_name: str

    def claims(self, value, *, progress=None):
        """True when this source reads ``value``."""
        if self.claims_name is None:
            return True
        return bool(getattr(reader_module(self.name), self.claims_name)(
            value, progress=progress))

    def read(self, value, name=None, *, progress=None, prefer_size=None,
             sizes=None, argument=None):
        """The :class:`~keras_vit.zoo.build.Checkpoint` this source reads from ``value``
        (``name``: the architecture, for weights that do not say;
        ``prefer_size``: the resolution to prefer; ``sizes``: the caller's
        size keywords; ``argument``: what errors call ``value``)."""
        return getattr(reader_module(self.name), self.read_name)(
            value, name, progress=progress, prefer_size=prefer_size,
            sizes=sizes, argument=argument)


SOURCES = (
    Source("transformers", "is_transformers_source", "read_checkpoint"),
    Source("timm", "is_timm_source", "read_checkpoint"),
    Source("keras-hub", "is_keras_hub_source", "read_checkpoint"),
    Source("keras", "is_keras_file", "read_checkpoint"),
)
# What no line claims: a zoo name with an official .npz, or None.
OFFICIAL = Source("official", None, "read_checkpoint")


def claims(value, progress=None):
    """The sources that claim ``value`` (timm's claim yields to
    transformers', whose folders are timm's files plus a ``model_type``)."""
    found = [s for s in SOURCES if s.claims(value, progress=progress)]
    names = [s.name for s in found]
    if "transformers" in names and "timm" in names:
        found = [s for s in found if s.name != "timm"]
    # A model.safetensors without config.json is no second claim.
    if len(found) > 1 and isinstance(value, (str, os.PathLike)) and (
            os.path.isdir(value)) and not os.path.isfile(
                os.path.join(value, "config.json")):
        found = [s for s in found if s.name != "timm"]
    return found


def find(name, weights, *, progress=None):
    """``(source, value, arch_name)``: the :class:`Source` that reads what
    ``zoo.load(name, weights)`` asks for, the value it reads, and the
    architecture name that goes with it (None: the source's own). A local
    folder or file two sources claim is refused (ValueError naming both).

    >>> source, value, arch_name = find("ViT-B/16", "auto")
    >>> source.name, value, arch_name
    ('official', 'auto', 'ViT-B/16')
    """
    for value, arch_name in ((name, None), (weights, name)):
        if arch_name is not None and (weights is None or (
                isinstance(weights, str) and weights == "auto")):
            continue
        found = claims(value, progress)
        if len(found) > 1 and isinstance(value, (str, os.PathLike)) and (
                os.path.exists(value)):
            argument = "name" if arch_name is None else "weights"
            raise ValueError(
                f"{argument}={os.fspath(value)!r} is ambiguous: it holds "
                f"the files of {' and of '.join(s.name for s in found)}; "
                "keras_vit reads one model from a folder, so name the file "
                "(the .keras file itself) or move one model out")
        if found:
            return found[0], value, arch_name
    _refuse_unread_path(name)
    record = registry.hub_weights(name, weights)
    if record is not None:  # a family member's release: timm's files
        timm = next(s for s in SOURCES if s.name == "timm")
        return timm, record.url, name
    return OFFICIAL, weights, name


def _refuse_unread_path(name):
    """Raises FileNotFoundError for a ``name`` that is a folder no source
    reads, or a path (absolute, ``./``, ``../``, ``~``) to nothing; and
    ValueError for a file no source reads (weights need a zoo name)."""
    if not isinstance(name, (str, os.PathLike)):
        return
    name = os.fspath(name)
    if os.path.isdir(name):
        from keras_vit.zoo import hub_files

        raise FileNotFoundError(
            f"name={name!r} is a folder keras_vit cannot read: a fine-tune "
            "run holds model.keras (written when it finishes), a timm or "
            "transformers repository config.json and model.safetensors, a "
            "keras-hub preset config.json and metadata.json"
            + hub_files.pickle_hint(name))
    if os.path.isfile(name):
        folder = os.path.dirname(os.path.abspath(name))
        held = [s.name for s in claims(folder)]
        raise ValueError(
            f"name={name!r} is a file that holds no model zoo.load reads (a "
            ".keras file, or a timm, transformers or keras-hub folder"
            + (f": its folder holds a {held[0]} model, zoo.load({folder!r})"
               if held else "")
            + "); weights alone (an official .npz) need the zoo name of "
            f"their architecture: zoo.load('ViT-B/16', weights={name!r})")
    if name.startswith((os.sep, "./", "../", "~")) and not os.path.exists(
            name):
        raise FileNotFoundError(
            f"name={name!r} does not exist; zoo.load takes a zoo name "
            "(keras_vit.zoo.list_models()), a .keras file, a fine-tune "
            "run's folder, or a timm, transformers or keras-hub folder")


def _honoured(source, value, arch_name, weights):
    """``weights`` when ``source`` can honour it for ``value``: a source
    claimed from ``name`` takes only ``"auto"`` or None."""
    if arch_name is None and source is not OFFICIAL and not (
            weights is None or (isinstance(weights, str)
                                and weights == "auto")):
        raise ValueError(
            f"weights applies to zoo names only; received weights="
            f"{weights!r} with the {source.name} source name="
            f"{os.fspath(value)!r}, which holds its own weights (pass "
            "weights='auto' for them or None for random initialisation)")
    return weights


# The keywords that size an architecture, amending a name's sizes.
_SIZES = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size",
          "resnet")


def load(name, weights="auto", request=None, *, progress=None,
         argument=None):
    """The model ``zoo.load(name, weights, ...)`` returns (see the module;
    ``request``: a :class:`~keras_vit.zoo.settle.Request`). ``argument``
    is what errors call ``name``."""
    request = request or settle.Request()
    source, value, arch_name = find(name, weights, progress=progress)
    _honoured(source, value, arch_name, weights)
    if source is not OFFICIAL and arch_name is None and weights is None:
        request = dataclasses.replace(request, random=True)
    sizes = {k: request.options[k] for k in _SIZES if k in request.options}
    checkpoint = source.read(value, arch_name, progress=progress,
                             prefer_size=request.image_size,
                             sizes=sizes if arch_name is not None else None,
                             argument=argument if arch_name is None else None)
    if arch_name is not None:
        _name_release(checkpoint, arch_name, value)
    # `build` is looked up here, so that a test can watch it.
    return build_settled(checkpoint, request, builder=build)


def _name_release(checkpoint, name, value):
    """A family member's release read from the Hub, named as the registry
    names it, and given the release's label list where the repository
    names no classes."""
    if not (isinstance(name, str) and isinstance(value, str)
            and value.startswith("hf-hub:")):
        return
    try:
        canonical = variants.parse(name).name
    except ValueError:
        return
    records = [w for w in registry.weights_for(canonical) if w.url == value]
    if not records:
        return
    checkpoint.tags.update(zoo_name=canonical, zoo_weights=records[0])
    if (checkpoint.label_names is None and records[0].labels
            and checkpoint.head == records[0].num_classes):
        checkpoint.label_names = registry.label_names(records[0].labels)
