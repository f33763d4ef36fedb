"""Feature extraction from a built model, sharing its weights."""

from __future__ import annotations

import operator

import keras

from keras_vit.base import geometry
from keras_vit.base.checks import check_choice, check_model, did_you_mean
from keras_vit.data.normalization import record_inputs


def _resnet_output(model):
    stem = [layer for layer in model.layers
            if layer.name.startswith("resnet_block")
            or layer.name == "resnet_root_pool"]
    if not stem:
        raise ValueError(
            f"model={model.name!r} has no ResNet stem (not a hybrid); "
            "available features: " + ", ".join(available_features(model)))
    return stem[-1].output


def available_features(model):
    """Names accepted by :func:`feature_model` for this model."""
    check_model("model", model)
    names = []
    layer_names = {layer.name for layer in model.layers}
    if any(n.startswith("resnet_") for n in layer_names):
        names.append("resnet")
    for feature, layer in _LAYER_FEATURES.items():
        if layer in layer_names or (feature == "pre_logits"
                                    and "pooling" in layer_names):
            names.append(feature)
    names.extend(sorted(_stage_outputs(model)))
    return names


def is_classifier(model):
    """Whether ``model`` ends in a classification head (its outputs are
    class scores); False for a feature extractor (``num_classes=0``,
    ``include_top=False``, ``head_type="projection"``).

    >>> import keras_vit
    >>> kw = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
    ...           num_heads=1, mlp_dim=8)
    >>> is_classifier(keras_vit.vit(**kw, num_classes=3))
    True
    >>> is_classifier(keras_vit.vit(**kw, num_classes=0))
    False
    >>> is_classifier(keras_vit.vit(**kw, num_classes=4,
    ...                             head_type="projection"))
    False
    """
    return ("logits" in available_features(model)
            and getattr(model, "head_type", "classifier") == "classifier")


def why_features(model):
    """Why ``model`` is not a classifier, in its arguments' words."""
    if getattr(model, "head_type", "classifier") != "classifier":
        return f"head_type={model.head_type!r}"
    try:
        config = model.get_config()
    except (AttributeError, NotImplementedError, TypeError):
        config = {}
    if config.get("include_top") is False:
        return "include_top=False"
    if config.get("num_classes") == 0:
        return "num_classes=0"
    return "no classification head"


def _stage_outputs(model):
    """BiT stage outputs: the last unit of each ``stage_{s}_unit_{u}``."""
    last = {}
    for layer in model.layers:
        parts = layer.name.split("_")
        if len(parts) == 4 and parts[0] == "stage" and parts[2] == "unit":
            last[f"stage_{parts[1]}"] = layer
    return {name: layer.output for name, layer in last.items()}


# Feature name -> the layer whose output it is ("logits": the layer that
# makes it available; its tensor is the model's own output).
_LAYER_FEATURES = {
    "feature_map": "final_relu",  # BiT: after the final GroupNorm + ReLU
    "tokens": "encoder_norm",
    "pooled": "pooling",
    "pre_logits": "pre_logits",
    "logits": "head",
    "attention_scores": "attention_scores",  # return_attention_scores=True
}


def model_output(model):
    """The symbolic tensor ``model`` returns: its output, or the
    ``"output"`` of a model that returns a dict (attention scores, BiT
    stages)."""
    out = model.output
    return out["output"] if isinstance(out, dict) else out


def feature_model(model, outputs="pre_logits"):
    """A model that returns intermediate features of ``model`` (same weights).

    Args:
        model: a keras_vit model.
        outputs: a feature name or a list of them: ``"resnet"`` (a hybrid's
            ResNet feature map), ``"tokens"`` (after the final norm),
            ``"pooled"``, ``"pre_logits"`` (what the head reads),
            ``"logits"`` (the model's own output: a distilled model's mean
            of its two heads, after ``classifier_activation`` if the
            model has one), for BiT ``"stage_1"`` ... ``"stage_4"`` and
            ``"feature_map"``, and ``"attention_scores"`` for a model built
            with ``return_attention_scores=True``.

    Returns:
        A ``keras.Model`` returning one array, or a dict for several names.

    >>> import numpy as np, keras_vit
    >>> m = keras_vit.vit(32, 1, 32, 1, 4, 64, 5,
    ...                   resnet=dict(num_layers=(1,), width_factor=0.5))
    >>> f = keras_vit.models.feature_model(m, ["resnet", "tokens"])
    >>> {k: tuple(v.shape) for k, v in f(np.zeros((1, 32, 32, 3))).items()}
    {'resnet': (1, 8, 8, 128), 'tokens': (1, 65, 32)}
    """
    check_model("model", model)
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    tensors = {name: feature_tensor(model, name) for name in names}
    out = tensors[names[0]] if isinstance(outputs, str) else tensors
    # It keeps the input convention of the model it reads.
    return record_inputs(
        keras.Model(model.input, out, name=f"{model.name}_features"), model)


def feature_tensor(model, name):
    """The symbolic tensor of feature ``name`` in ``model``'s graph."""
    layer_names = {layer.name for layer in model.layers}
    if name == "resnet":
        return _resnet_output(model)
    if (name == "pre_logits" and "pre_logits" not in layer_names) or (
            name == "pooled" and "pooling_dist" in layer_names):
        return _head_input(model, layer_names)
    if name in _LAYER_FEATURES:
        tensor = _layer_output(model, _LAYER_FEATURES[name], name)
        return model_output(model) if name == "logits" else tensor
    if name in _stage_outputs(model):
        return _stage_outputs(model)[name]
    known = available_features(model)
    raise ValueError(
        f"Unknown feature outputs={name!r} for model={model.name!r}; "
        f"available: {', '.join(known)}.{did_you_mean(name, known)}")


def _head_input(model, layer_names):
    """What a head reads when the model has no ``pre_logits`` layer (timm's
    ``forward_head(pre_logits=True)``): after ``fc_norm`` if any, a
    distilled model's mean of its two tokens, else the pooled tokens."""
    if "fc_norm" in layer_names:
        return model.get_layer("fc_norm").output
    if "pooling_dist" in layer_names:
        tokens = [model.get_layer(n).output for n in ("pooling",
                                                       "pooling_dist")]
        return keras.layers.Average(dtype=model.get_layer(
            "pooling").dtype_policy)(tokens)
    return _layer_output(model, "pooling", "pre_logits")


def _layer_output(model, layer_name, feature):
    try:
        return model.get_layer(layer_name).output
    except ValueError:
        raise ValueError(
            f"model={model.name!r} has no {feature!r} output (built with "
            "include_top=False or pooling=None?); available: "
            + ", ".join(available_features(model))) from None


def _blocks(model):
    """The encoder blocks of a ViT, in order (``encoder_block_{i}``)."""
    blocks = {}
    for layer in model.layers:
        name = layer.name
        if name.startswith("encoder_block_") and name[14:].isdigit():
            blocks[int(name[14:])] = layer
    return [blocks[i] for i in sorted(blocks)]


def encoder_depth(model):
    """The number of encoder blocks of ``model`` (0 for a model without
    them, e.g. a ResNetV2)."""
    return len(_blocks(model))


def _block_number(value):
    """``value`` as an int when it is an integer (not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _block_indices(indices, depth):
    """timm's rule: None all blocks, an int n the last n, a list those
    (negative from the end); sorted, each once."""
    if indices is None:
        return list(range(depth))
    count = _block_number(indices)
    if count is not None:
        if not 1 <= count <= depth:
            raise ValueError(f"indices={count} asks for the last {count} "
                             f"blocks of {depth}; give 1 to {depth}")
        return list(range(depth - count, depth))
    if not isinstance(indices, (list, tuple)):
        raise ValueError(f"indices must be None, an int or a list of ints; "
                         f"received indices={indices!r}")
    chosen = [_block_number(i) for i in indices]
    if any(i is None or not -depth <= i < depth for i in chosen):
        raise ValueError(f"indices must be block numbers in [{-depth}, "
                         f"{depth - 1}] for a model of {depth} blocks; "
                         f"received indices={list(indices)!r}")
    chosen = [i % depth for i in chosen]
    if not chosen or len(set(chosen)) != len(chosen):
        raise ValueError("indices must name each block once; received "
                         f"indices={list(indices)!r}")
    return sorted(chosen)


def intermediate_tensors(model, indices=None, *, output_format="NHWC",
                         prefix_tokens=False, norm=False):
    """The symbolic tensors :func:`intermediate_model` returns, on
    ``model``'s graph: a dict ``{"block_{i}": ...}``."""
    from keras_vit.layers.embeddings import PatchTokens

    check_model("model", model)
    blocks = _blocks(model)
    if not blocks or not hasattr(model, "grid_size"):
        raise ValueError(
            f"intermediate_model needs a VisionTransformer with encoder "
            f"blocks; model={model.name!r} has none (a ResNetV2's stages "
            "are feature_model(model, ['stage_1', ...]))")
    check_choice("output_format", output_format, ("NHWC", "NLC"))
    naflex = getattr(model, "naflex", False)
    if naflex and output_format == "NHWC":
        raise ValueError(
            f"output_format='NHWC' maps one grid of patches, and model="
            f"{model.name!r} takes NaFlex patches (naflex=True), each image "
            "a grid of its own: ask output_format='NLC' (the tokens in the "
            "order of patch_coords, padding included), or use a fixed-size "
            "copy, keras_vit.rebuild(model, naflex=False, image_size=...)")
    config = model.get_config()
    stride = geometry.effective_stride(config)
    prefix = geometry.prefix_tokens(config)
    names = {layer.name for layer in model.layers}
    final_norm = (model.get_layer("encoder_norm")
                  if norm and "encoder_norm" in names else None)
    images = model.input["patches"] if naflex else model.input
    outputs = {}
    for i in _block_indices(indices, len(blocks)):
        tokens = blocks[i].output
        if isinstance(tokens, (list, tuple)):
            tokens = tokens[0]  # built with return_attention_scores=True
        if final_norm is not None:
            tokens = final_norm(tokens)
        split = PatchTokens(prefix, stride, output_format,
                            return_prefix=bool(prefix_tokens),
                            dtype=blocks[i].dtype_policy,
                            name=f"block_{i}_patches")([tokens, images])
        if prefix_tokens:
            outputs[f"block_{i}"], outputs[f"block_{i}_prefix"] = split
        else:
            outputs[f"block_{i}"] = split
    return outputs


def intermediate_model(model, indices=None, *, output_format="NHWC",
                       prefix_tokens=False, norm=False):
    """A model returning the outputs of chosen encoder blocks of a ViT
    (same weights), as timm's ``forward_intermediates`` does.

    Args:
        model: a keras_vit VisionTransformer.
        indices: which blocks: None every block, an int ``n`` the last
            ``n``, a list of block numbers (negative count from the end).
        output_format: ``"NHWC"`` patch tokens as a (B, h, w, D) map, or
            ``"NLC"`` a (B, h*w, D) sequence.
        prefix_tokens: also return each block's prefix tokens, (B, P, D),
            under ``"block_{i}_prefix"``.
        norm: pass each output through the model's final norm, if any.

    Returns:
        A ``keras.Model`` whose output is a dict ``{"block_{i}": ...}``.

    >>> import numpy as np, keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 3, 2, 32, 5)
    >>> f = keras_vit.models.intermediate_model(m, indices=2)
    >>> {k: tuple(v.shape) for k, v in f(np.zeros((1, 32, 32, 3))).items()}
    {'block_1': (1, 4, 4, 16), 'block_2': (1, 4, 4, 16)}
    """
    outputs = intermediate_tensors(  # checks the arguments first
        model, indices, output_format=output_format,
        prefix_tokens=prefix_tokens, norm=norm)
    return record_inputs(keras.Model(model.input, outputs,
                                     name=f"{model.name}_intermediates"),
                         model)


class FeaturesMixin:
    """The named parts of a keras_vit model, so that no caller needs its
    layer names.

    >>> import keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> m.available_features()
    ['tokens', 'pooled', 'pre_logits', 'logits']
    >>> tuple(m.feature_model("tokens").output.shape)
    (None, 17, 16)
    """

    def feature_model(self, outputs="pre_logits"):
        """:func:`feature_model` of this model."""
        return feature_model(self, outputs)

    def available_features(self):
        """:func:`available_features` of this model."""
        return available_features(self)

    def intermediate_model(self, indices=None, **options):
        """:func:`intermediate_model` of this model."""
        return intermediate_model(self, indices, **options)
