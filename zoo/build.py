"""Steps 3 to 5 of every load (:mod:`keras_vit.zoo.sources`): settle,
bound, build; and what a reader returns (:class:`Checkpoint`). Nothing here
imports the readers.
"""

from __future__ import annotations

import dataclasses
import typing

import numpy as np

from keras_vit.base.checks import did_you_mean
from keras_vit.base.errors import UnexpectedKeywordError
from keras_vit.runtime.policy import dtype_policy_scope
from keras_vit.zoo import convert, layouts, position_tables, settle
from keras_vit.zoo.official import bit as bit_layout


@dataclasses.dataclass
class Checkpoint:
    """What a reader returns: what its files say about the model.

    Attributes:
        config: keyword arguments of the builder (:func:`keras_vit.vit`,
            or :func:`keras_vit.models.resnet_v2.resnet_v2` for
            ``family="bit"``) that the checkpoint fixes.
        arrays: the weights, ``{key: array}`` in ``layout``; None for
            random initialisation.
        layout: the :class:`~keras_vit.zoo.layouts.Layout` of ``arrays``;
            None for the official ``.npz`` layout (or BiT's).
        source_name: how errors name the checkpoint (its file).
        family: ``"vit"`` (ViT, hybrid, axial) or ``"bit"`` (a ResNetV2).
        head: the number of classes of the head the weights hold, or None.
        label_names: the names of that head's classes, or None.
        head_config: builder arguments that go with that head.
        include_top: whether the model has a head unless the caller says
            (None: when the weights have one or ``num_classes`` is asked).
        tags: attributes set on the model once loaded.
        keep_pre_logits: for callers that build a checkpoint themselves.
        model: a built model whose weights the build step copies instead
            of ``arrays`` (with ``family="foreign"``, the result); its
            class alone for random initialisation (``weights=None``).
        head_names: the head's keys in ``arrays`` -> the file's names.
    """

    config: dict
    arrays: typing.Mapping | None = None
    source_name: str | None = None
    family: str = "vit"
    head: int | None = None
    label_names: list | None = None
    head_config: dict = dataclasses.field(default_factory=dict)
    include_top: bool | None = None
    tags: dict = dataclasses.field(default_factory=dict)
    keep_pre_logits: bool | None = None
    model: typing.Any = None
    head_names: dict = dataclasses.field(default_factory=dict)
    layout: typing.Any = None


def build(checkpoint, **kwargs):
    """The model ``checkpoint`` describes (its config with ``**kwargs``
    over it), its weights loaded strictly and ``checkpoint.tags`` set.

    >>> import numpy as np
    >>> from keras_vit.zoo import build as zoo_build
    >>> ckpt = zoo_build.Checkpoint(dict(
    ...     image_size=32, patch_size=16, hidden_size=32, num_layers=1,
    ...     num_heads=2, mlp_dim=64, num_classes=3), tags={"zoo_name": "tiny"})
    >>> model = zoo_build.build(ckpt, num_classes=5)
    >>> model.zoo_name, model.output_shape
    ('tiny', (None, 5))
    """
    config = {**checkpoint.config, **kwargs}
    if isinstance(checkpoint.model, type):  # fresh weights, its class
        return _tagged(checkpoint.model.from_config(config), checkpoint.tags)
    if checkpoint.model is not None:
        return _tagged(copy_model(checkpoint.model, config,
                                  bool(checkpoint.keep_pre_logits)),
                       checkpoint.tags)
    if checkpoint.family == "bit":
        from keras_vit.models.resnet_v2 import resnet_v2 as builder
    else:
        from keras_vit.models.vit import vit as builder
    model = builder(**config)
    # A head other than the weights' was asked (settled): a new one.
    fresh_head = config.get("num_classes") != checkpoint.head
    if checkpoint.arrays is not None:
        if checkpoint.layout is not None:
            layouts.load(model, checkpoint.layout, checkpoint.arrays,
                         source_name=checkpoint.source_name,
                         keep_pre_logits=checkpoint.keep_pre_logits,
                         fresh_head=fresh_head)
        elif checkpoint.family == "bit":
            bit_layout.load_weights(model, checkpoint.arrays,
                                    source_name=checkpoint.source_name)
        else:
            convert.load_weights(model, checkpoint.arrays,
                                 keep_pre_logits=checkpoint.keep_pre_logits,
                                 source_name=checkpoint.source_name,
                                 fresh_head=fresh_head)
    return _tagged(model, checkpoint.tags)


def _tagged(model, tags):
    for attr, value in tags.items():
        setattr(model, attr, value)
    names = getattr(model, "label_names", None)
    model.zoo_labels = list(names) if names else None
    return model


def model_name(arch_name):
    """The Keras model name a zoo name gives by default:
    ``"ViT-B/16"`` -> ``"vit_b_16"``.

    >>> model_name("R50+ViT-B/16")
    'r50_vit_b_16'
    """
    return (arch_name.replace("/", "_").replace("+", "_").lower()
            .replace("-", "_"))


def is_keras_vit_model(model):
    """True for the models keras_vit builds (and rebuilds with changes)."""
    from keras_vit.models.axial import AxialVisionTransformer
    from keras_vit.models.resnet_v2 import ResNetV2
    from keras_vit.models.vit import VisionTransformer

    return isinstance(model, (VisionTransformer, AxialVisionTransformer,
                              ResNetV2))


def copy_model(model, config, keep_pre_logits=False):
    """``model`` itself when ``config`` is its own, else a model of its
    class built from ``config`` (``dtype``: the copy's policy, in its
    config so that a save keeps it) with ``model``'s weights copied."""
    import keras

    config = dict(config)
    dtype = config.pop("dtype", None)
    own = model.get_config()
    if dtype == own.get("dtype"):  # the model's own, as its config says it
        dtype = None
    if dtype is not None and keras.dtype_policies.get(
            dtype).name == model.dtype_policy.name:
        dtype = None
    unknown = sorted(set(config) - set(own))
    if unknown:
        raise UnexpectedKeywordError(
            f"{type(model).__name__} got an unexpected keyword argument "
            f"{unknown[0]!r}.{did_you_mean(unknown[0], sorted(own))}")
    if dtype is None and all(own[k] == v for k, v in config.items()):
        return model
    config["dtype"] = dtype if dtype is not None else own.get("dtype")
    with dtype_policy_scope(dtype or model.dtype_policy):
        rebuilt = type(model).from_config(config)
    copy_weights(model, rebuilt, keep_pre_logits)
    return rebuilt


def copy_weights(source, target, keep_pre_logits):
    """``source``'s weights into ``target``: one to one where the weight
    lists line up, else by variable path."""
    shapes = [tuple(w.shape) for w in source.weights]
    # A position table of another grid of as many patches must be resized.
    same_grid = (getattr(source, "grid_size", None)
                 == getattr(target, "grid_size", None))
    if same_grid and shapes == [tuple(w.shape) for w in target.weights]:
        import keras

        for variable, value in zip(target.weights, source.weights):
            variable.assign(keras.ops.cast(value.value, variable.dtype))
        return
    from keras_vit.models.axial import AxialVisionTransformer

    if isinstance(source, AxialVisionTransformer):
        _copy_by_path(source, target)
        return
    layouts.load(target, layouts.BY_PATH, layouts.model_arrays(
        source, "keras_vit"), source_name=f"<model {source.name!r}>",
                 keep_pre_logits=keep_pre_logits or None,
                 source_grid=getattr(source, "grid_size", None),
                 fresh_head=True)  # a head the copy adds starts at zero


def _copy_by_path(source, target):
    """For a model with no checkpoint layout (Axial-ViT): weights by their
    Keras path."""
    given = {w.path: w for w in source.weights}
    owners = {w.path: layer for layer in target.layers for w in layer.weights}
    problems = []
    for variable in target.weights:
        value = given.get(variable.path)
        want = tuple(variable.shape)
        if value is not None:
            value = np.asarray(value.numpy())
        if value is not None and value.shape == want:
            variable.assign(value)
            continue
        layer = owners.get(variable.path)
        if variable.path.startswith("head/"):
            continue  # zero-initialised, as a new head is
        if (value is not None and getattr(layer, "kind", None) == "learned_1d"
                and value.ndim == 3):
            variable.assign(position_tables.resize_posemb(
                value, layer.grid_size, layer.num_prefix_tokens,
                kernel=layer.resize))
            continue
        have = None if value is None else value.shape
        problems.append(f"{variable.path}: {have} vs {want}")
    if problems:
        raise ValueError(f"cannot copy the weights of model={source.name!r} "
                         f"into its rebuilt copy: {'; '.join(problems[:10])}")


def build_settled(checkpoint, request, builder=None):
    """Steps 3 to 5 (settle, bound, build) for a checkpoint already read;
    ``builder`` (default :func:`build`) builds the settled checkpoint."""
    from keras_vit.models import memory

    if checkpoint.family == "foreign":
        return _as_it_is(checkpoint, request)
    settled = settle.settle(checkpoint, request)
    where = checkpoint.source_name or "the model"
    memory.check_config(settled.config, where,
                        name=checkpoint.tags.get("zoo_name"))
    model = checkpoint.model
    if request.random and model is not None:
        model = type(model)  # its architecture, not its weights
    return (builder or build)(dataclasses.replace(
        checkpoint, config=settled.config, arrays=settled.arrays, model=model,
        keep_pre_logits=settled.keep_pre_logits, tags=settled.tags))


def _as_it_is(checkpoint, request):
    """A model that is no keras_vit model, returned as it is (any change
    but ``dtype`` refused by name)."""
    asked = {"image_size": request.image_size,
             "num_classes": request.num_classes,
             **{k: v for k, v in request.options.items() if k != "dtype"}}
    if request.label_names is not settle.UNSET:
        asked["label_names"] = request.label_names
    asked = {k: v for k, v in asked.items() if v is not None}
    model = checkpoint.model
    if asked or request.random:
        what = ("weights=None" if not asked else
                f"{next(iter(asked))}={next(iter(asked.values()))!r}")
        raise ValueError(
            f"{what} cannot be applied to {checkpoint.source_name}: it holds "
            f"a {type(model).__name__}, and only a keras_vit model "
            "(VisionTransformer, AxialVisionTransformer, ResNetV2) is "
            "rebuilt with changes")
    dtype = request.options.get("dtype")
    if dtype is not None:
        import keras

        if keras.dtype_policies.get(dtype).name != model.dtype_policy.name:
            with dtype_policy_scope(dtype):
                copy = keras.models.clone_model(model)
            copy_weights(model, copy, False)
            model = copy
    return model
