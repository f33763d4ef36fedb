"""The Vision Transformer as a Keras functional model."""

from __future__ import annotations

import functools

import keras
from keras import layers

from keras_vit import layers as vit_layers
from keras_vit.base import options
from keras_vit.base.checks import (check_choice, check_dtype, check_keywords,
                                   check_number)
from keras_vit.models.common import (carry_policy, check_label_names,
                                     classification_head, image_input,
                                     patch_input, pooling_layer)
from keras_vit.models.compiled import CompiledModelMixin
from keras_vit.models.config import ConstructorConfig
from keras_vit.models.encoder import (NORMALISED, check_head_outputs,
                                      check_vit_args)
from keras_vit.models.features import FeaturesMixin
from keras_vit.models.hybrid import resnet_stem
from keras_vit.models.positions import PositionScheme, check_dynamic_image_size
from keras_vit.models.quantization import QuantizeMixin


def _encode(x, blocks, scheme, prepend, dropout, pre_norm,
            return_attention_scores):
    """The tokens through the encoder blocks, position information put in
    where ``scheme`` says; ``prepend``, when given, adds the prefix tokens
    after the stem's table. Returns the tokens and the attention maps."""
    x = scheme.at_stem(x)
    if prepend is not None:
        x = prepend(x)
    x = dropout(x)
    if pre_norm is not None:
        x = pre_norm(x)
    scores = []
    for i, block in enumerate(blocks):
        x, kwargs = scheme.before_block(i, x)
        if return_attention_scores:
            x, s = block(x, return_attention_scores=True, **kwargs)
            scores.append(s)
        else:
            x = block(x, **kwargs)
    return x, scores


def _distilled_head(x, spec, head_bias_init, classifier_activation, dtype):
    """DeiT's two heads: ``head`` on the class token, ``head_dist`` on the
    distillation token, their logits averaged (as timm and transformers
    do at inference); without a head, the mean of the two tokens."""
    from keras_vit.layers.dense import FusedDense

    pooled = [vit_layers.TokenPooling("token", index=i, dtype=dtype,
                                      name=name)(x)
              for i, name in ((0, "pooling"), (1, "pooling_dist"))]
    if spec["head"]:
        pooled = [FusedDense(spec["num_classes"], kernel_initializer="zeros",
                             bias_initializer=keras.initializers.Constant(
                                 head_bias_init), dtype=dtype, name=name)(t)
                  for t, name in zip(pooled, ("head", "head_dist"))]
    x = layers.Average(dtype=dtype, name="distilled_average")(pooled)
    if spec["head"] and classifier_activation is not None:
        x = layers.Activation(classifier_activation, dtype="float32",
                              name="predictions")(x)
    return x


# The constructor arguments that VisionTransformer keeps normalised.
_NORMALISED = (*NORMALISED, "resnet")


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class VisionTransformer(QuantizeMixin, ConstructorConfig, FeaturesMixin,
                        CompiledModelMixin, keras.Model):
    """Vision Transformer (ViT) of "An Image is Worth 16x16 Words".

    Build it with :func:`keras_vit.models.vit`; ``get_config`` returns
    exactly the constructor arguments (those of :func:`vit`).
    """

    def __init__(self, image_size=224, patch_size=16, hidden_size=768,
                 num_layers=12, num_heads=12, mlp_dim=3072, num_classes=1000,
                 classifier="token", representation_size=None,
                 dropout_rate=0.0, attention_dropout_rate=0.0,
                 include_top=True, pooling=None, include_preprocessing=False,
                 classifier_activation=None, return_attention_scores=False,
                 num_channels=3, layer_norm_epsilon=1e-6, head_bias_init=0.0,
                 resnet=None, position_embedding="learned_1d",
                 position_embedding_placement="stem", gelu="tanh",
                 label_names=None, dynamic_image_size=False, remat=False,
                 input_normalization=None, name="vision_transformer",
                 **kwargs):
        # The family's options: one keyword per row, at its default.
        family = {o.name: kwargs.pop(o.name, o.default)
                  for o in options.OPTIONS}
        spec = check_vit_args(
            image_size, patch_size, hidden_size, num_layers, num_heads,
            mlp_dim, num_classes, classifier, representation_size,
            dropout_rate, attention_dropout_rate, include_top, pooling,
            num_channels, resnet, position_embedding,
            position_embedding_placement, family)
        family = spec["family"]
        check_head_outputs(spec, include_top, label_names,
                           classifier_activation, return_attention_scores)
        label_names = check_label_names(label_names, spec["num_classes"],
                                        spec["head"])
        layer_norm_epsilon = float(check_number(
            "layer_norm_epsilon", layer_norm_epsilon, low=0, low_open=True))
        head_bias_init = float(check_number("head_bias_init", head_bias_init))
        dtype = check_dtype("dtype", kwargs.pop("dtype", None))
        has_token = family["class_token"]
        distilled = family["distilled"]
        prefix = options.prefix_tokens(family)
        dynamic = check_dynamic_image_size(dynamic_image_size,
                                           position_embedding, family)

        naflex = family["naflex"]  # patches of any grid, not images
        inputs, x, input_normalization = (patch_input(
            spec["patch"], spec["num_channels"], include_preprocessing,
            dtype, input_normalization) if naflex else image_input(
                (None, None) if dynamic else spec["image_hw"],
                spec["num_channels"], include_preprocessing, dtype,
                input_normalization))
        remat = vit_layers.check_remat(remat)
        if spec["resnet"] is not None:
            x = resnet_stem(x, spec["resnet"], dtype, remat)
        norm = family["norm"]
        # The norms outside the blocks: Keras' LayerNormalization (as saved
        # files hold it), or for norm="rms" the package's RMSNorm.
        model_norm = functools.partial(vit_layers.make_norm, norm,
                                       layer_norm_epsilon, dtype, fused=False)
        x = vit_layers.PatchEmbedding(
            spec["hidden_size"], spec["patch"],
            use_bias=family["patch_bias"], stem=family["conv_stem"],
            norm=norm if family["patch_norm"] else None,
            norm_epsilon=layer_norm_epsilon, dtype=dtype,
            name="patch_embedding")(x)

        def prepend(x):  # [class token, registers, patches], as timm's
            if has_token:
                x = vit_layers.ClassToken(dtype=dtype, name="class_token")(x)
            if distilled:  # DeiT's distillation token, after the class token
                x = vit_layers.RegisterTokens(
                    1, index=1, dtype=dtype, name="distillation_token")(x)
            if family["num_registers"]:
                x = vit_layers.RegisterTokens(
                    family["num_registers"], index=int(has_token),
                    dtype=dtype, name="register_tokens")(x)
            return x

        table_covers_prefix = family["posemb_includes_prefix"]
        if table_covers_prefix:
            x = prepend(x)
        # timm's stochastic depth: linear from 0 to drop_path_rate.
        depth = spec["num_layers"]
        rates = [family["drop_path_rate"] * i / max(depth - 1, 1)
                 for i in range(depth)]
        blocks = [
            vit_layers.EncoderBlock(
                spec["num_heads"], spec["mlp_dim"], spec["dropout_rate"],
                spec["attention_dropout_rate"], layer_norm_epsilon,
                gelu=vit_layers.check_gelu(gelu), remat=remat,
                drop_path_rate=rates[i], norm=norm, dtype=dtype, index=i,
                grid_size=spec["grid"], name=f"encoder_block_{i}",
                **options.block_options(family, i))
            for i in range(depth)]
        scheme = PositionScheme(
            position_embedding, position_embedding_placement, spec["grid"],
            prefix if table_covers_prefix else 0, spec["num_heads"], dtype,
            images=inputs if dynamic else None,
            stride=spec["stride"] if dynamic else None, family=family,
            head_dim=spec["hidden_size"] // spec["num_heads"], depth=depth,
            patches=inputs if naflex else None, all_prefix=prefix)
        x, scores = _encode(
            x, blocks, scheme, None if table_covers_prefix else prepend,
            layers.Dropout(spec["dropout_rate"], dtype=dtype,
                           name="embedding_dropout"),
            model_norm("pre_norm") if family["pre_norm"] else None,
            return_attention_scores)
        if family["final_norm"] and not family["fc_norm"]:
            x = model_norm("encoder_norm")(x)
        if family["neck"]:
            x = vit_layers.Neck(spec["grid"], family["neck"], dtype=dtype,
                                name="neck")(x)
        if family["merge_size"]:
            x = vit_layers.PatchMerger(
                spec["grid"], family["merge_size"], family["merge_width"],
                norm, layer_norm_epsilon, spec["stride"] if dynamic
                else None, dtype=dtype, name="merger")(
                    x, *([inputs] if dynamic else []))
        if family["soft_pool"]:
            x = vit_layers.SoftTokenPool(
                spec["grid"], family["soft_pool"],
                family["soft_pool_standardize"], dtype=dtype,
                name="soft_pool")(x)
        method = spec["method"]
        if distilled and method is not None:
            x = _distilled_head(x, spec, head_bias_init,
                                classifier_activation, dtype)
        else:
            x = classification_head(
                x, pooling_layer(method, 0 if family["pool_prefix"]
                                 else prefix,
                                 family["pool_heads"] or spec["num_heads"],
                                 spec["mlp_dim"], gelu, layer_norm_epsilon,
                                 dtype, norm, family["pool_form"],
                                 family["qkv_bias"]),
                spec["head"], spec["representation_size"],
                spec["num_classes"],
                keras.initializers.Constant(head_bias_init),
                classifier_activation, dtype,
                pooled_norm=model_norm("fc_norm")
                if family["fc_norm"] else vit_layers.UnscaledNorm(
                    norm, layer_norm_epsilon, dtype=dtype, name="pooled_norm")
                if family["pooled_norm"] else None,
                padding_bias=scheme.padding)
        outputs = x
        if return_attention_scores:
            if not scores:
                raise ValueError(
                    "return_attention_scores=True needs num_layers > 0; "
                    f"received num_layers={num_layers}")
            outputs = {"output": x, "attention_scores": vit_layers.StackScores(
                dtype=dtype, name="attention_scores")(scores)}
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        carry_policy(self, dtype)
        for key in _NORMALISED:
            setattr(self, key, spec[key])
        self.grid_size = spec["grid"]
        self.label_names = label_names
        self.head_type = family["head_type"]
        self.input_normalization = input_normalization
        self.dynamic_image_size = dynamic
        self.naflex = naflex
        self.patch_stride = spec["patch"]
        self.remat = remat

    # The constructor's own arguments, then one keyword per option row.
    __init__.__signature__ = options.signature(__init__)


def vit(image_size, patch_size, hidden_size, num_layers, num_heads, mlp_dim,
        num_classes, classifier="token", representation_size=None,
        position_embedding="learned_1d", position_embedding_placement="stem",
        attention="global", **kwargs):
    """Builds a Vision Transformer of any size.

    Args:
        image_size: input resolution, an int or (height, width); must be a
            multiple of ``patch_size``.
        patch_size: side of the square patches.
        hidden_size: token width D.
        num_layers: number of encoder blocks.
        num_heads: attention heads per block (must divide ``hidden_size``).
        mlp_dim: hidden width of the MLP in each block.
        num_classes: size of the classification head.
        classifier: ``"token"`` (class token) or ``"gap"`` (mean of the
            tokens after the final LayerNorm, no class token).
        representation_size: if set, a ``pre_logits`` Dense + tanh of this
            width before the head (the original ImageNet-21k models have one).
        position_embedding: the paper's Appendix D.4 ablation:
            ``"learned_1d"`` (default), ``"none"``, ``"learned_2d"``,
            ``"sincos_2d"`` or ``"relative"`` (1D relative attention).
        position_embedding_placement: ``"stem"`` (default, once),
            ``"every_layer"`` (a table per block) or ``"every_layer_shared"``
            (one table before every block).
        attention: ``"global"`` (default) or ``"axial"``, which returns
            :func:`keras_vit.models.axial_vit` (needs ``classifier="gap"``).
        **kwargs: ``dropout_rate``, ``attention_dropout_rate``,
            ``include_top`` (False drops the head), ``pooling`` (with
            ``include_top=False``: None returns all tokens (B, N, D)),
            ``include_preprocessing`` (normalises [0, 255] pixels inside
            the model), ``input_normalization`` (None is the official [-1,
            1]; ``"imagenet"``, ``"clip"`` or ``{"mean": [...], "std":
            [...]}`` of [0, 1] pixels), ``classifier_activation``,
            ``return_attention_scores`` (the model returns ``{"output":
            ..., "attention_scores": (B, L, heads, N, N)}``),
            ``num_channels``, ``name``, ``dtype``, ``gelu`` (``"tanh"``,
            the official; ``"exact"``, timm's; ``"quick"``, OpenAI CLIP's),
            ``resnet`` (a dict such as ``dict(num_layers=(3, 4, 9),
            width_factor=1)`` makes a hybrid; ``num_layers=[]``, the root
            alone), ``dynamic_image_size`` (True
            takes any height and width the stride divides, the position
            embedding resized in the graph), ``remat`` (True
            rematerialises every block in training), ``label_names`` (the
            head's class names, kept with the model).

            ``classifier`` (and ``pooling``) also take ``"avg"``, ``"max"``,
            ``"avgmax"``, ``"token_gap"`` and ``"map"`` (attention pooling
            by a learned probe: :class:`keras_vit.layers.AttentionPoolHead`).
            ``num_classes=0`` builds no head.

            The ViT family's options (one row each of
            :data:`keras_vit.base.options.OPTIONS`; the defaults build the
            paper's ViT):

{family_options}

    Returns:
        A :class:`VisionTransformer` (a ``keras.Model``).

    Example:

    >>> import numpy as np, keras_vit
    >>> model = keras_vit.models.vit(image_size=32, patch_size=8,
    ...     hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     num_classes=10)
    >>> tuple(model(np.zeros((2, 32, 32, 3), "float32")).shape)
    (2, 10)
    >>> rel = keras_vit.models.vit(image_size=32, patch_size=8,
    ...     hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     num_classes=10, position_embedding="relative",
    ...     position_embedding_placement="every_layer_shared")
    >>> tuple(rel.get_layer("position_embedding").rel_embedding.shape)
    (32, 2, 8)
    >>> aim = keras_vit.models.vit(image_size=32, patch_size=8,
    ...     hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     num_classes=10, classifier="gap", norm="rms", patch_norm=True)
    >>> [w.path for w in aim.weights if "norm" in w.path][:2]
    ['patch_embedding/norm/gamma', 'encoder_block_0/norm_1/gamma']
    """
    check_choice("attention", attention, ("global", "axial"))
    if attention == "axial":
        from keras_vit.models.axial import axial_vit

        if classifier != "gap" or position_embedding_placement != "stem":
            raise ValueError(
                "attention='axial' pools the mean of the grid and adds the "
                "position embedding once: it needs classifier='gap' and "
                "position_embedding_placement='stem'; received "
                f"classifier={classifier!r}, position_embedding_placement="
                f"{position_embedding_placement!r}")
        return axial_vit(
            image_size, patch_size, hidden_size, num_layers, num_heads,
            mlp_dim, num_classes, representation_size=representation_size,
            position_embedding=position_embedding, **kwargs)
    check_keywords("vit()", kwargs, VisionTransformer.__init__)
    return VisionTransformer(
        image_size=image_size, patch_size=patch_size, hidden_size=hidden_size,
        num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim,
        num_classes=num_classes, classifier=classifier,
        representation_size=representation_size,
        position_embedding=position_embedding,
        position_embedding_placement=position_embedding_placement, **kwargs)


# The family's options from their table (no docstring under python -OO).
if vit.__doc__:
    vit.__doc__ = vit.__doc__.replace("{family_options}",
                                      options.described())
