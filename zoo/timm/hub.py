"""timm's ViT weights, from the Hugging Face Hub or local files, both ways.

A timm repository is a ``config.json`` (architecture, num_classes, input
size, mean/std, optionally label names) and a ``model.safetensors``, read
with ``huggingface_hub`` and ``safetensors``' NumPy reader (no torch); the
tensors go onto the model's variables by timm's own names
(:mod:`keras_vit.zoo.timm.layout`; a hybrid keeps timm's ResNet numerics:
weights standardised with sqrt(var + 1e-8), GroupNorm epsilon 1e-5).
:mod:`keras_vit.zoo.timm.writer` writes the reverse. The config's
arguments map onto keras_vit's by :mod:`keras_vit.zoo.timm.arguments`.

timm runs the exact (erf) GELU, the official code the tanh form, so models
built from timm weights default to ``gelu="exact"``.

Sources: ``"hf-hub:<repo>[@revision]"``, a local repository folder (with
``config.json`` and ``model.safetensors``) or a ``.safetensors`` file (the
``config.json`` beside it is read when there is one).
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.base import schema
from keras_vit.base import variants
from keras_vit.base.limits import MAX_CONFIG_BYTES
from keras_vit.data.normalization import (NAMED, check_normalization,
                                         config_value)
from keras_vit.models.hybrid import TIMM_RESNET_NUMERICS
from keras_vit.zoo import checkpoints, formats, hub_files
from keras_vit.zoo.download import http as http_fetch
from keras_vit.zoo.timm import arguments as timm_arguments
from keras_vit.zoo.timm import layout as timm_layout
from keras_vit.zoo.timm import (deepseek, eva, gemma, naflex, relpos,
                                  resnet_d, sam)
from keras_vit.zoo.timm.layout import TIMM, TIMM_BIT, TIMM_EVA, check_state
from keras_vit.zoo.hub_files import (CONFIG_FILE, HUB_PREFIX, WEIGHTS_FILE,
                                     hub_download, read_safetensors)


def is_timm_source(value, *, progress=None):
    """True for what this module reads: an ``hf-hub:`` handle, a
    ``.safetensors`` file or a folder holding ``model.safetensors``
    (``progress`` is unused).

    >>> is_timm_source("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    True
    >>> is_timm_source("ViT-B_16.npz")
    False
    """
    if not isinstance(value, (str, os.PathLike)):
        return False
    value = os.fspath(value)
    return (value.startswith(HUB_PREFIX) or value.endswith(".safetensors")
            or os.path.isfile(os.path.join(value, WEIGHTS_FILE)))


def parse_handle(value):
    """``(repo, revision or None)`` of an ``hf-hub:`` handle."""
    repo, _, revision = value[len(HUB_PREFIX):].partition("@")
    if not repo or repo.count("/") != 1:
        raise ValueError("an hf-hub: handle is hf-hub:<owner>/<name>"
                         f"[@revision]; received {value!r}")
    return repo, revision or None


def fetch(source, progress=None, *, timeout=60.0,
          deadline=http_fetch.DEFAULT_DEADLINE):
    """``(config dict, local .safetensors path)`` of ``source``; Hub files
    come through ``huggingface_hub``'s cache within ``timeout`` per wait
    and ``deadline`` in all (see :func:`hub_download`)."""
    source = os.fspath(source)
    if source.startswith(HUB_PREFIX):
        repo, revision = parse_handle(source)
        config_path, path = hub_download(
            repo, revision, progress=progress, timeout=timeout,
            deadline=deadline)
    elif os.path.isdir(source):
        config_path = os.path.join(source, CONFIG_FILE)
        path = os.path.join(source, WEIGHTS_FILE)
    else:
        if not os.path.isfile(source):
            raise FileNotFoundError(f"No such .safetensors file: {source!r}")
        path = source
        config_path = os.path.join(os.path.dirname(source), CONFIG_FILE)
    config = read_config(config_path) if os.path.isfile(config_path) else {}
    return config, path


def _pair(size):
    """A size as ``(height, width)``: an int, ``[h, w]`` or timm's
    ``[channels, h, w]``."""
    return (size, size) if isinstance(size, int) else tuple(size[-2:])


def validate_config(config, path):
    """A timm ``config.json``'s content checked against
    :data:`keras_vit.zoo.formats.TIMM_CONFIG` (a FormatError naming
    ``path`` and the field otherwise), with image sizes as ``(height,
    width)`` tuples and ``label_names`` checked against the head."""
    config = formats.check(formats.TIMM_CONFIG, config, path)
    for key, size_key in (("model_args", "img_size"),
                          ("pretrained_cfg", "input_size")):
        section = config.get(key)
        if section is not None and section.get(size_key) is not None:
            config[key] = dict(section, **{size_key: _pair(section[size_key])})
    formats.check_labels(config.get("label_names"), config.get("num_classes"),
                         path, "label_names")
    return config


def read_config(path):
    """A timm ``config.json``, validated (:func:`validate_config`); a
    FormatError naming the file for one that is not sound JSON."""
    path = os.fspath(path)
    return validate_config(schema.read_json(
        path, "timm config.json", max_bytes=MAX_CONFIG_BYTES,
        error=formats.FormatError), path)


def _architecture(config, name):
    """``(Arch, the architecture's own timm arguments)`` of the name the
    caller or the config gives."""
    arch_name = name or config.get("architecture")
    if not arch_name:
        raise ValueError("the timm weights carry no config.json naming the "
                         "architecture; pass it: zoo.load('ViT-B/16', "
                         "weights='model.safetensors')")
    timm_arguments.check_module(arch_name)
    found = (timm_arguments.architecture(arch_name)
             or resnet_d.architecture(arch_name))
    if found is not None:
        return found
    backbone = timm_arguments.backbone(arch_name)
    if backbone not in (None, "ResNetV2", "Sequential"):
        raise ValueError(
            f"backbone={backbone!r} (timm's {arch_name} sets it) is a timm "
            "setting keras_vit cannot honour: of timm's hybrids, the "
            "ResNetV2 ones (vit_*_r*_s*, e.g. vit_base_r50_s16_384) load")
    arch = variants.parse(arch_name)
    if arch.family not in ("vit", "bit", "hybrid"):
        raise ValueError(
            f"timm weights of the {arch.family} family ({arch_name}) are not "
            "supported: ViT (vit_*_patch*), ResNet+ViT hybrids (vit_*_r*_s*) "
            "and BiT (resnetv2_*_bit) checkpoints load from timm files")
    return arch, {}


def input_normalization(config):
    """``{"mean": [...], "std": [...]}`` of ``pretrained_cfg``, each field
    it names none of ImageNet's, as timm's ``resolve_data_config``.

    >>> input_normalization({"pretrained_cfg": {"std": [0.5] * 3}})["mean"]
    [0.485, 0.456, 0.406]
    """
    pretrained = config.get("pretrained_cfg") or {}
    imagenet = NAMED["imagenet"]
    return {key: [float(v) for v in pretrained.get(key)
                  or getattr(imagenet, key)] for key in ("mean", "std")}


def load(source, name=None, image_size=None, num_classes=None, *,
         progress=None, **kwargs):
    """A keras_vit model with timm's weights from ``source``.

    The architecture, head size and input size come from the repository's
    ``config.json`` (``name`` overrides the architecture, refused where
    the config's ``model_args`` size it otherwise; ``image_size``
    resizes the position embeddings; another ``num_classes`` gives a new
    zero head). ``**kwargs`` go to :func:`keras_vit.zoo.load`.

    Example (a repository written by :func:`save_pretrained`):

    >>> import tempfile, numpy as np, keras_vit
    >>> from keras_vit.zoo.timm import hub as timm_hub
    >>> m = keras_vit.zoo.load("ViT-Ti/16", weights=None, image_size=32,
    ...                        num_classes=3, gelu="exact")
    >>> repo = keras_vit.zoo.save_pretrained(m, tempfile.mkdtemp())
    >>> m2 = timm_hub.load(repo)
    >>> x = np.random.rand(1, 32, 32, 3).astype("float32")
    >>> bool(np.allclose(m(x), m2(x), atol=1e-6))
    True
    """
    from keras_vit.zoo import build, settle

    return build.build_settled(
        read_checkpoint(source, name, progress=progress),
        settle.request(image_size=image_size, num_classes=num_classes,
                       **kwargs))


def _num_classes(config):
    """The head's size, as timm's create_model takes it: ``model_args``'
    ``num_classes``, else the config's (0: no head, the model returns the
    pooled embedding, as timm's), else 1000."""
    value = (config.get("model_args") or {}).get(
        "num_classes", config.get("num_classes"))
    return 1000 if value is None else value


def _check_name(name, wanted, found, where, architecture):
    """Refuses, in one line naming both, a ``name`` whose sizes (amended
    by the caller's, ``wanted``) are not those of the file's config
    (``found``), as the name of a .keras file of another size is."""
    keys = (*timm_arguments.MODULE_SIZES.values(), "mlp_dim")
    other = [f"{k}={wanted[k]} vs {found[k]}" for k in keys
             if k in wanted and k in found and wanted[k] != found[k]]
    if other:
        raise checkpoints.CheckpointError(
            f"name={name!r} is another architecture than {where} "
            f"({architecture} with its model_args): {', '.join(other)}; "
            "load the file without a name, or pass its sizes as keywords")


def _head_type(config, build_config, arrays, head, labels):
    """``{"head_type": "projection"}`` where the head is an embedding, not
    classes: as the config's ``head_type`` says, else for a CLIP tower's
    head (``pre_norm``) without label names whose bias is zero
    throughout (how timm holds CLIP's image-text projection)."""
    kind = config.get("head_type")
    bias_key = TIMM.key_of("head/bias")
    if kind is None and head and labels is None and build_config.get(
            "pre_norm") and bias_key in arrays:
        bias = np.asarray(arrays[bias_key])
        kind = "projection" if not np.any(bias) else None
    return {"head_type": kind} if kind and kind != "classifier" else {}


def read_checkpoint(source, name=None, *, progress=None, prefer_size=None,
                    sizes=None, argument=None):
    """This source's reader (:mod:`keras_vit.zoo.sources`): the
    :class:`~keras_vit.zoo.build.Checkpoint` of the repository
    ``source``."""
    from keras_vit.zoo import build

    config, path = fetch(source, progress=progress)
    model_args = config.get("model_args") or {}
    where = os.path.join(os.path.dirname(os.fspath(path)), CONFIG_FILE)
    arch, defaults = _architecture(config, name)
    state = read_safetensors(path)
    resnet = arch.config.get("resnet") or {}
    if resnet.get("variant") == "d":  # its stages are the file's
        arch = resnet_d.with_stages(arch, state, os.fspath(path))
    tokens = False  # a tower whose output is its tokens (no head)
    is_bit = arch.family == "bit"
    # The file's architecture where the name is none of timm's (a named
    # member, EVA02-S/14).
    entry = (timm_arguments.table_entry(arch.name)
             or timm_arguments.table_entry(str(config.get("architecture")
                                               or "")))
    module = args = None
    if entry is not None:  # the table's arguments, the config's over them
        # timm's create_model: model_args decide; the top-level
        # global_pool is what timm's save writes for information.
        module, args = entry["module"], dict(entry["args"], **model_args)
    layout = TIMM_EVA if module in ("eva", "beit", "gemma4_vit",
                                    "qwen3_vit") else TIMM
    if module in ("eva", "beit"):
        honoured = eva.honoured(args, where)
        state = eva.with_key_biases(state)
    elif module == "naflexvit":
        honoured = naflex.honoured(args, where, set(model_args))
        state = naflex.naflex_state(state, honoured)
    elif module == "vision_transformer_sam":
        honoured = sam.honoured(args, where)
        state = sam.sam_state(state)
    elif module == "vision_transformer_relpos":
        honoured = relpos.honoured(args, where)
    elif module == "deepseek_vit":
        honoured = deepseek.honoured(args, where, state)
        state = deepseek.deepseek_state(state)
    elif module == "gemma4_vit":
        honoured, tokens = gemma.honoured(args, where, state)
        state = gemma.gemma_state(state, honoured)
    elif module == "qwen3_vit":
        honoured, tokens = eva.qwen_honoured(args, where, state)
        state = eva.qwen_state(state, honoured)
    else:
        honoured = timm_arguments.honoured(config, arch, where, defaults)
        layout = TIMM_BIT if is_bit else TIMM
        if "branches" in honoured:  # the file's blocks decide how many
            honoured["branches"], state = timm_layout.branches(state)
            if not honoured["branches"]:
                field = ("model_args.block_fn" if "block_fn" in model_args
                         else "architecture")
                raise formats.fail(
                    where, field, "block_fn='ParallelThingsBlock' keeps "
                    "each block's branches under blocks.<i>.attns.<b> and "
                    f"ffns.<b>, and {os.fspath(path)} has none")
    build_config = dict(arch.config, **honoured)
    if name is not None:
        _check_name(name, dict(arch.config, **(sizes or {})), build_config,
                    where, config.get("architecture"))
    if not is_bit:
        build_config.setdefault("position_resize",
                                timm_arguments.TABLE_RESIZE)
    try:
        check_state(state, layout, "BiT ResNetV2" if is_bit else "ViT")
    except ValueError as e:  # parameters keras_vit lacks: name the file
        raise checkpoints.CheckpointError(f"{os.fspath(path)}: {e}") from None
    arrays, head_key = state, layout.key_of("head/kernel")
    if arch.family == "hybrid" and "variant" not in resnet:
        # timm's ResNet standardises and normalises with other epsilons.
        build_config["resnet"] = dict(arch.config["resnet"],
                                      **TIMM_RESNET_NUMERICS)
    # timm's GELU, unless the architecture or its act_layer names another
    # (quick GELU: OpenAI's CLIP towers; tanh: SigLIP 2's).
    if not is_bit and "gelu" not in honoured and "gelu" not in arch.config:
        build_config["gelu"] = "exact"
    # The data config's size, else model_args'; the latter first where
    # the file's table is of its grid.
    sizes = [size for size in (
        (config.get("pretrained_cfg") or {}).get("input_size"),
        model_args.get("img_size")) if size]
    table = arrays.get(layout.key_of("position_embedding/pos_embedding"))
    patch = build_config.get("patch_size", arch.config.get("patch_size"))
    if len(sizes) == 2 and table is not None and isinstance(patch, int):
        grid = (sizes[1][0] // patch) * (sizes[1][1] // patch)
        if 0 <= int(np.prod(table.shape[:-1])) - grid <= 8:  # + prefix
            sizes.reverse()
    if sizes:
        height, width = sizes[0]
        image_size = height if height == width else (height, width)
    else:
        image_size = arch.image_size or 224
    # A NaFlex model's size is its table's grid, whatever the images.
    image_size = honoured.pop("image_size", image_size)
    head = int(arrays[head_key].shape[0]) if head_key in arrays else None
    num_classes = _num_classes(config)
    if "num_classes" in model_args and num_classes != head:
        head = None  # timm's create_model drops the file's head too: a
        # new zero head, or none
    labels = formats.check_labels(config.get("label_names"), head, where,
                                  "label_names") if head else None
    normalization = check_normalization("pretrained_cfg mean/std",
                                        input_normalization(config))
    build_config.update(input_normalization=config_value(normalization))
    build_config.update(image_size=image_size,
                        num_classes=num_classes,
                        name=build.model_name(arch.name))
    return build.Checkpoint(
        build_config, arrays, source_name=repr(os.fspath(source)),
        family="bit" if is_bit else "vit", head=head, label_names=labels,
        layout=layout,
        head_config=_head_type(config, build_config, arrays, head, labels),
        include_top=not tokens,
        tags={"zoo_name": (hub_files.zoo_name(build_config) if honoured
                           and not is_bit and "resnet" not in build_config
                           else arch.name), "zoo_weights": None,
              "zoo_source": os.fspath(source)})
