"""Hugging Face **transformers** ViT weights: ``config.json`` +
``model.safetensors`` as ``transformers.ViTForImageClassification`` and
``ViTModel`` write them, SigLIP's image towers
(:mod:`keras_vit.zoo.transformers.siglip`), and DeiT, DINOv2, DINOv3's ViT
and CLIP's and AIMv2's image towers
(:mod:`keras_vit.zoo.transformers.family`).

Sources: ``"hf-hub:<owner>/<name>[@revision]"`` whose ``config.json`` has a
``model_type`` (timm's have none), a local folder holding such a
``config.json`` and ``model.safetensors``, or a ``.safetensors`` file with
transformers' parameter names given as ``weights=`` for a ViT name.
Tensors are read as NumPy arrays, without torch, and never unpickled.

transformers' numerics are kept: LayerNorm epsilon from ``layer_norm_eps``
(1e-12 in Google's files) and the GELU of ``hidden_act``. A ``ViTModel``
becomes a feature model whose tanh ``pooler`` is the ``pre_logits`` layer,
so that it returns transformers' ``pooler_output``. Tensor names and
shapes are checked against the config before anything is allocated.
:mod:`keras_vit.zoo.transformers.writer` writes the reverse.
"""

from __future__ import annotations

import os

from keras_vit.base.limits import MAX_CLASSES
from keras_vit.data.normalization import check_normalization, config_value
from keras_vit.zoo import checkpoints, formats, hub_files
from keras_vit.zoo.timm.hub import parse_handle as _parse_handle
from keras_vit.zoo.transformers import family as transformers_family
from keras_vit.zoo.transformers import siglip as transformers_siglip
from keras_vit.zoo.transformers.layout import (
    HEAD_PARAMS, PREPROCESSOR_FILE, architecture, expected_shapes,
    shown_value as _shown, vit_layout)
from keras_vit.zoo.transformers.tables import TABLE_RESIZE

HUB_PREFIX = hub_files.HUB_PREFIX
CONFIG_FILE = hub_files.CONFIG_FILE
WEIGHTS_FILE = hub_files.WEIGHTS_FILE
PICKLE_FILE = "pytorch_model.bin"

# -- recognising a source ---------------------------------------------------

def read_json(path, what):
    """The JSON object in the file ``path`` (a ``what``, for errors): a
    FormatError naming the file for one that is not sound JSON or not an
    object."""
    path = os.fspath(path)
    value = formats.read_json(path, what)
    if not isinstance(value, dict):
        raise formats.fail(path, None, f"is a JSON {type(value).__name__}, "
                           "not an object of settings")
    return value


def is_transformers_config(config):
    """True for a transformers ``config.json`` (it names a ``model_type``;
    timm's name an ``architecture`` instead)."""
    return isinstance(config, dict) and "model_type" in config


def _sniff(path):
    """True when the ``config.json`` at ``path`` is transformers' (one
    that is no JSON object is left to the timm route to report)."""
    try:
        return is_transformers_config(
            read_json(path, "transformers config.json"))
    except (checkpoints.CheckpointError, OSError):
        return False


def is_transformers_source(value, *, progress=None):
    """True for what :func:`load` reads: a folder whose ``config.json`` is
    transformers', a ``.safetensors`` file with transformers' names, or
    an ``hf-hub:`` handle whose ``config.json`` is transformers' (it is
    downloaded to tell).

    >>> is_transformers_source("ViT-B/16")
    False
    """
    if not isinstance(value, (str, os.PathLike)):
        return False
    value = os.fspath(value)
    if value.startswith(HUB_PREFIX):
        repo, revision = _parse_handle(value)
        (config_path,) = hub_files.hub_download(
            repo, revision, files=(CONFIG_FILE,), progress=progress)
        return _sniff(config_path)
    if os.path.isdir(value):
        path = os.path.join(value, CONFIG_FILE)
        return os.path.isfile(path) and _sniff(path)
    if value.endswith(".safetensors") and os.path.isfile(value):
        try:
            return _is_transformers_state(_header(value))
        except (checkpoints.CheckpointError, OSError):
            return False  # the timm route reports a broken file
    return False


def _is_transformers_state(header):
    return any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings."))
               for k in header)


# -- tensors ------------------------------------------------------------------

def _header(path):
    """The checked ``.safetensors`` header of ``path``: tensor name ->
    entry; the data is not read."""
    header = dict(hub_files.check_safetensors(os.fspath(path)))
    header.pop("__metadata__", None)
    return header


def check_tensors(header, expected, path, optional=()):
    """One :class:`~keras_vit.zoo.checkpoints.CheckpointError` naming ``path``
    and listing every missing, unexpected and mis-shaped tensor (but those
    in ``optional``)."""
    hub_files.check_names({k: v.get("shape") for k, v in header.items()},
                          expected,
                f"{os.fspath(path)}: does not hold the transformers ViT its "
                "config describes", optional)


# -- loading ------------------------------------------------------------------

def fetch(source, progress=None):
    """``(config dict or None, config path, local .safetensors path)`` of
    ``source``. A folder or repository with only ``pytorch_model.bin`` is
    refused: keras_vit never unpickles."""
    source = os.fspath(source)
    way_out = (
        "keras_vit never unpickles a checkpoint; write model.safetensors "
        "with transformers: ViTForImageClassification.from_pretrained(src)"
        ".save_pretrained(dir, safe_serialization=True), then "
        "zoo.load(dir)")
    if source.startswith(HUB_PREFIX):
        repo, revision = _parse_handle(source)
        (config_path,) = hub_files.hub_download(
            repo, revision, files=(CONFIG_FILE,), progress=progress)
        try:  # optional: checked below when the repository has one
            hub_files.hub_download(repo, revision, files=(PREPROCESSOR_FILE,),
                                  progress=progress)
        except Exception:  # noqa: BLE001 - absent, or offline and not cached
            pass
        try:
            (path,) = hub_files.hub_download(
                repo, revision, files=(WEIGHTS_FILE,), progress=progress)
        except Exception as e:
            text = str(e)
            if "EntryNotFound" in text and "LocalEntryNotFound" not in text:
                raise type(e)(
                    f"{text}; {source} has no {WEIGHTS_FILE} (a repository "
                    f"with only {PICKLE_FILE}?): {way_out}") from e
            raise
    elif os.path.isdir(source):
        config_path = os.path.join(source, CONFIG_FILE)
        path = os.path.join(source, WEIGHTS_FILE)
        if not os.path.isfile(path):
            found = [n for n in (PICKLE_FILE, "model.safetensors.index.json")
                     if os.path.exists(os.path.join(source, n))]
            raise FileNotFoundError(
                f"{source!r} has no {WEIGHTS_FILE}"
                + (f" (it has {', '.join(found)})" if found else "")
                + f"; {way_out}")
    else:
        if not os.path.isfile(source):
            raise FileNotFoundError(f"No such .safetensors file: {source!r}")
        path = source
        config_path = os.path.join(os.path.dirname(source), CONFIG_FILE)
    check_preprocessor(os.path.join(os.path.dirname(config_path),
                                    PREPROCESSOR_FILE))
    config = None
    if os.path.isfile(config_path):
        config = read_json(config_path, "transformers config.json")
        if not is_transformers_config(config):
            config = None
    return config, config_path, path


def check_preprocessor(path):
    """The input normalisation the weights' ``preprocessor_config.json``
    (when there is one at ``path``) asks for: None for the official mean
    0.5 and std 0.5, else ``{"mean": [...], "std": [...]}``. Refuses,
    naming the file and fields, a preprocessor that does not rescale
    pixels to [0, 1] and normalise."""
    if path is None or not os.path.isfile(path):
        return None
    config = formats.check(formats.TRANSFORMERS_PREPROCESSOR, read_json(
        path, "transformers preprocessor_config.json"), path)
    problems = [f"{key}={config.get(key)!r}" for key in (
        "do_normalize", "do_rescale") if config.get(key, True) is not True]
    scale = config.get("rescale_factor", 1 / 255)
    if abs(scale - 1 / 255) > 1e-6:  # a number: checked by the format
        problems.append(f"rescale_factor={_shown(scale)}")
    if problems:
        raise checkpoints.CheckpointError(
            f"{path}: the weights expect inputs prepared with "
            f"{', '.join(problems)}; keras_vit takes pixels scaled to "
            "[0, 1] (rescale_factor 1/255) and then normalised by a mean "
            "and std")
    try:
        normalization = check_normalization("image_mean/image_std", {
            "mean": config.get("image_mean", [0.5] * 3),
            "std": config.get("image_std", [0.5] * 3)})
    except ValueError as e:
        raise checkpoints.CheckpointError(f"{path}: {e}") from None
    return config_value(normalization)


def load(source, name=None, image_size=None, num_classes=None, *,
         progress=None, **kwargs):
    """A keras_vit model with transformers' ViT weights from ``source``.

    The architecture comes from the ``config.json`` (``name``, a ViT name
    such as ``"ViT-B/16"``, overrides it); ``image_size`` resizes the
    position embeddings; another ``num_classes`` gives a new zero head.
    ``**kwargs`` go to :func:`keras_vit.models.vit`. The model's
    ``label_names`` hold ``id2label`` while the head is the checkpoint's.
    """
    from keras_vit.zoo import build, settle

    return build.build_settled(
        read_checkpoint(source, name, progress=progress),
        settle.request(image_size=image_size, num_classes=num_classes,
                       **kwargs))


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.build.Checkpoint` :func:`load` builds. ``sizes``
    (the caller's size keywords) amend ``name``'s sizes."""
    config, config_path, path = fetch(source, progress=progress)
    header = _header(path)
    if config is None and not _is_transformers_state(header):
        raise checkpoints.CheckpointError(
            f"{path}: has no transformers ViT tensor names "
            "(vit.embeddings.*, embeddings.*) and no transformers "
            f"{CONFIG_FILE} beside it")
    if config is None:
        config = {"model_type": "vit"}
    model_type = config.get("model_type")
    reader = (transformers_siglip if model_type in
              transformers_siglip.SIGLIP_TYPES else transformers_family
              if model_type in transformers_family.FAMILY_TYPES else None)
    if reader is not None:  # the ViT family's other towers
        return reader.read_checkpoint(
            config, config_path, path, header, source, name=name,
            sizes=sizes, input_normalization=check_preprocessor(
                os.path.join(os.path.dirname(config_path), PREPROCESSOR_FILE)))
    arch = architecture(config, config_path, header)
    if name is not None:
        arch.update(hub_files.name_sizes(name, "transformers'"),
                    **{k: v for k, v in (sizes or {}).items()
                       if k != "resnet"})
        arch["kind"] = ("classifier" if any(k.startswith("vit.")
                                            for k in header) else "model")
        if arch["kind"] == "model":
            arch["representation_size"] = (
                header.get("pooler.dense.weight", {}).get("shape") or [None])[0]
        posemb = (header.get("vit.embeddings.position_embeddings")
                  or header.get("embeddings.position_embeddings"))
        if posemb is not None:
            side = int(round((posemb["shape"][1] - 1) ** 0.5)) if len(
                posemb["shape"]) == 3 else 0
            if side > 0 and side * side == posemb["shape"][1] - 1:
                arch["image_size"] = side * arch["patch_size"]
    prefix = "vit." if arch["kind"] == "classifier" else ""
    labels = arch["labels"]
    num_labels = 0
    if arch["kind"] == "classifier":
        entry = header.get("classifier.weight")
        shape = entry["shape"] if entry else None
        # Without the head's tensors, the head id2label declares: the
        # settling step refuses the file unless a new head is asked for.
        num_labels = (shape[0] if shape and 1 <= shape[0] <= MAX_CLASSES
                      else len(labels or config.get("id2label") or ()))
    if arch["kind"] == "model" and arch["representation_size"] is not None \
            and not any(k.endswith("pooler.dense.weight") for k in header):
        arch["representation_size"] = None  # add_pooling_layer=False
    check_tensors(header, expected_shapes(arch, num_labels, prefix), path,
                  optional=HEAD_PARAMS)
    labels = formats.check_labels(labels, num_labels or None, config_path,
                                  "id2label") if num_labels else None
    arrays = hub_files.read_safetensors(path)
    defaults = {"name": "vit_transformers", "position_resize": TABLE_RESIZE}
    if not num_labels and (arch["representation_size"] is not None
                           or arch["kind"] == "classifier"):
        defaults["pooling"] = "token"  # the pooled class token
    defaults["input_normalization"] = check_preprocessor(os.path.join(
        os.path.dirname(config_path or path), PREPROCESSOR_FILE))
    return hub_files.vit_checkpoint(
        arch, arrays, head=num_labels or None, label_names=labels,
        source_name=repr(os.fspath(path)), layout=vit_layout(prefix),
        tags={"zoo_source": os.fspath(source)}, **defaults)
