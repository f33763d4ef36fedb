"""Layer-wise learning-rate decay, the fine-tuning rule of BEiT and MAE
(timm's ``layer_decay``): the deeper a variable, the larger its rate.

Each trainable variable of a ViT gets a layer id, as timm 1.0's
``param_groups_layer_decay`` assigns them, and the scale
``decay ** (num_layers + 1 - layer_id)`` of the learning rate:

- 0: the embeddings (and a hybrid's ResNet stem);
- ``i + 1``: encoder block ``i``;
- ``num_layers``: also the final LayerNorm, which timm groups "with the
  last block" (BEiT's and MAE's code give it the head's id instead);
- ``num_layers + 1`` (scale 1): everything else, the head and what
  leads to it.

The scale applies to the whole update of the variable, decoupled weight
decay included.

With ``model.fit``::

    model = keras_vit.train.build_model(
        "ViT-B/16", num_classes=10, model_options={"drop_path_rate": 0.1})
    optimizer = with_layer_decay(keras.optimizers.AdamW(1e-3), model, 0.75)
    model.compile(optimizer=optimizer, loss=...)
    model.fit(...)

>>> import keras_vit
>>> model = keras_vit.vit(image_size=16, patch_size=4, hidden_size=32,
...                       num_layers=2, num_heads=2, mlp_dim=64,
...                       num_classes=3)
>>> scales = layer_scales(model, 0.5)
>>> [scales[p] for p in ("class_token/cls", "encoder_block_0/norm_1/gamma",
...                      "encoder_block_1/norm_1/gamma", "encoder_norm/gamma",
...                      "head/kernel")]
[0.125, 0.25, 0.5, 0.5, 1.0]
"""

from __future__ import annotations

import re

from keras_vit.base.checks import check_number

# The layers (by name) of keras_vit's ViT that timm's group_matcher puts
# in the stem group.
EMBEDDING_LAYERS = ("patch_embedding", "class_token", "distillation_token",
                    "register_tokens", "position_embedding", "pre_norm")
# A hybrid ViT's ResNet stem lives inside timm's patch_embed.
EMBEDDING_PREFIXES = ("resnet_",)
BLOCK = re.compile(r"encoder_block_(\d+)$")
FINAL_NORM = "encoder_norm"


def check_decay(decay, name="layer_decay"):
    """``decay`` as a float in (0, 1], else a ValueError naming ``name``.

    >>> check_decay(0.0)
    Traceback (most recent call last):
    ValueError: layer_decay must be a number in (0.0, 1.0]; received layer_decay=0.0
    """
    return float(check_number(name, decay, low=0.0, high=1.0,
                              low_open=True))


def _walk(layers, found):
    # Top-level layers of a ViT by name; a nested model is searched too.
    import keras

    for layer in layers:
        match = BLOCK.match(layer.name)
        if match:
            found.append((int(match.group(1)) + 1, layer))
        elif layer.name in EMBEDDING_LAYERS or layer.name.startswith(
                EMBEDDING_PREFIXES):
            found.append((0, layer))
        elif layer.name == FINAL_NORM:
            found.append(("final", layer))
        elif isinstance(layer, keras.Model):
            _walk(layer.layers, found)


def layer_ids(model):
    """``({variable path: layer id}, num_layers)`` for the trainable
    variables of a keras_vit ViT ``model`` (see the module's docstring).

    >>> import keras_vit
    >>> model = keras_vit.vit(image_size=16, patch_size=4, hidden_size=32,
    ...                       num_layers=1, num_heads=2, mlp_dim=64,
    ...                       num_classes=3)
    >>> ids, num_layers = layer_ids(model)
    >>> ids["position_embedding/pos_embedding"], ids["head/bias"], num_layers
    (0, 2, 1)
    """
    found = []
    _walk(model.layers, found)
    blocks = sorted({i for i, _ in found if i not in (0, "final")})
    if not blocks:
        raise ValueError(
            f"layer decay needs a ViT's encoder blocks (layers named "
            f"encoder_block_0, encoder_block_1, ...); model "
            f"{model.name!r} has none")
    num_layers = len(blocks)
    if blocks != list(range(1, num_layers + 1)):
        raise ValueError(
            f"model {model.name!r} has encoder blocks "
            f"{[i - 1 for i in blocks]}, not 0 to {num_layers - 1}")
    by_variable = {}
    for layer_id, layer in found:
        layer_id = num_layers if layer_id == "final" else layer_id
        for variable in layer.trainable_variables:
            by_variable.setdefault(id(variable), layer_id)
    ids = {}
    for variable in model.trainable_variables:
        if variable.path in ids:
            raise ValueError(
                f"model {model.name!r} has two trainable variables at the "
                f"path {variable.path!r}: their rates cannot be told apart")
        ids[variable.path] = by_variable.get(id(variable), num_layers + 1)
    return ids, num_layers


def layer_scales(model, decay):
    """``{variable path: learning-rate scale}`` for each trainable
    variable of ``model``.

    >>> layer_scales(object(), 1.5)
    Traceback (most recent call last):
    ValueError: layer_decay must be a number in (0.0, 1.0]; received layer_decay=1.5
    """
    decay = check_decay(decay)
    ids, num_layers = layer_ids(model)
    return {path: decay ** (num_layers + 1 - layer_id)
            for path, layer_id in ids.items()}


def with_layer_decay(optimizer, model, decay):
    """A copy of the unbuilt Keras ``optimizer`` that trains each variable
    of ``model`` at the learning rate times its :func:`layer_scales`
    scale.

    >>> import keras, keras_vit
    >>> model = keras_vit.vit(image_size=16, patch_size=4, hidden_size=32,
    ...                       num_layers=1, num_heads=2, mlp_dim=64,
    ...                       num_classes=3)
    >>> opt = with_layer_decay(keras.optimizers.AdamW(1e-3), model, 0.75)
    >>> type(opt).__name__, opt.variable_scales["patch_embedding/conv/kernel"]
    ('PerVariableRateAdamW', 0.5625)
    """
    from keras_vit.runtime.compat import per_variable_learning_rates

    return per_variable_learning_rates(optimizer, layer_scales(model, decay))
