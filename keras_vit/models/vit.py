"""The Vision Transformer as a Keras functional model."""

from __future__ import annotations

import keras
from keras import layers, ops

from keras_vit import layers as vit_layers
from keras_vit.base import geometry, options
from keras_vit.base.checks import check_choice, check_dtype, check_keywords, shown
from keras_vit.models.common import (carry_policy, check_label_names,
                                     classification_head,
                                     image_input, pooling_layer)
from keras_vit.models.compiled import CompiledModelMixin
from keras_vit.models.encoder import (FAMILY_DEFAULTS, NORMALISED,
                                      check_encoder_args,
                                      check_family_options, check_patch_grid,
                                      check_position_embedding)
from keras_vit.models.config import ConstructorConfig
from keras_vit.models.features import FeaturesMixin
from keras_vit.models.quantization import QuantizeMixin

# How the head pools the tokens ("avg" is another name for "gap"; the
# methods are keras_vit.layers.TokenPooling's, and "map" is
# keras_vit.layers.AttentionPoolHead).
_CLASSIFIERS = ("token", "gap", "avg", "max", "avgmax", "map")
_POOLINGS = (None, *_CLASSIFIERS)


def _resnet_config(resnet):
    """Validates the ``resnet=`` option of a hybrid; returns a plain dict."""
    if resnet is None:
        return None
    if not isinstance(resnet, dict):
        raise ValueError(
            "resnet must be None or a dict like dict(num_layers=(3, 4, 9), "
            f"width_factor=1); received resnet={resnet!r}")
    unknown = set(resnet) - {"num_layers", "width_factor", "fold_last_stage",
                             *_RESNET_NUMERICS}
    if unknown:
        raise ValueError(
            f"resnet has unknown keys {sorted(unknown)}; received "
            f"resnet={resnet!r}")
    num_layers = resnet.get("num_layers", ())
    if not isinstance(num_layers, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0
            for n in num_layers):
        raise ValueError(
            "resnet['num_layers'] must be a sequence of positive ints; "
            f"received resnet={resnet!r}")
    width_factor = resnet.get("width_factor", 1)
    if (not isinstance(width_factor, (int, float)) or width_factor <= 0
            or int(round(64 * width_factor)) % 32):
        raise ValueError(
            "resnet['width_factor'] must make 64 * width_factor a positive "
            f"multiple of 32 (GroupNorm groups); received resnet={resnet!r}")
    fold = bool(resnet.get("fold_last_stage", False))
    if fold and len(num_layers) < 2:
        raise ValueError(
            "resnet['fold_last_stage'] needs at least two stages; received "
            f"resnet={resnet!r}")
    config = {"num_layers": list(num_layers), "width_factor": width_factor}
    if fold:
        config["fold_last_stage"] = True
    if resnet.get("standardization", "std") not in ("std", "var"):
        raise ValueError(
            "resnet['standardization'] must be 'std' or 'var'; received "
            f"resnet={resnet!r}")
    for key in ("std_eps", "norm_epsilon"):
        value = resnet.get(key, 1.0)
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not value > 0):
            raise ValueError(f"resnet[{key!r}] must be a positive number; "
                             f"received resnet={resnet!r}")
    # Stored only when given: official configs stay as they were.
    config.update({k: resnet[k] for k in _RESNET_NUMERICS if k in resnet})
    return config


# The ResNet's numerics, official (vit_jax) by default: kernels
# standardised as (w - mean) / (std + 1e-5), GroupNorm epsilon 1e-6. timm's
# port computes (w - mean) / sqrt(var + 1e-8) and GroupNorm epsilon 1e-5.
_RESNET_NUMERICS = {"standardization": "std", "std_eps": 1e-5,
                    "norm_epsilon": 1e-6}
TIMM_RESNET_NUMERICS = {"standardization": "var", "std_eps": 1e-8,
                        "norm_epsilon": 1e-5}


def _resnet_stem(x, resnet, dtype, remat=False):
    """The hybrids' ResNet: StdConv root, GN, ReLU, max-pool, stages."""
    width = geometry.hybrid_width(resnet)
    num = {k: resnet.get(k, v) for k, v in _RESNET_NUMERICS.items()}
    x = vit_layers.StdConv2D(
        width, 7, strides=2, padding="same", use_bias=False,
        standardization=num["standardization"], eps=num["std_eps"],
        kernel_initializer="lecun_normal", dtype=dtype,
        name="resnet_root_conv")(x)
    x = layers.GroupNormalization(32, epsilon=num["norm_epsilon"],
                                  dtype=dtype, name="resnet_root_norm")(x)
    x = layers.ReLU(dtype=dtype, name="resnet_root_relu")(x)
    # TF 'SAME' max-pool pads with -inf, as flax's max_pool does.
    x = layers.MaxPooling2D(3, 2, padding="same", dtype=dtype,
                            name="resnet_root_pool")(x)
    for s, depth in enumerate(geometry.hybrid_stages(resnet)):
        for u in range(depth):
            x = vit_layers.ResidualUnit(
                width * 2 ** s, strides=2 if (s > 0 and u == 0) else 1,
                epsilon=num["norm_epsilon"],
                standardization=num["standardization"],
                std_eps=num["std_eps"], remat=remat, dtype=dtype,
                name=f"resnet_block{s + 1}_unit{u + 1}")(x)
    return x


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class RelativePositionEmbedding(layers.Layer):
    """The learned table of ``position_embedding="relative"``.

    One embedding per 1D (raster-order) offset between two patches, split
    into heads, (2P - 1 [+ 1], heads, D / heads); the extra last row, present
    with a class token, is shared by every pair that involves it (the class
    token has no offset to anything). Called on the tokens, it returns the
    table, which :class:`keras_vit.layers.EncoderBlock` turns into attention
    logits; one layer feeding several blocks shares its table between them.
    """

    kind = "relative"

    def __init__(self, grid_size, num_heads, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        dim = int(input_shape[-1])
        if dim % self.num_heads:
            raise ValueError(
                f"hidden size {dim} is not divisible by "
                f"num_heads={self.num_heads}")
        rows = vit_layers.relative_table_rows(self.num_patches,
                                              self.num_prefix_tokens)
        self.rel_embedding = self.add_weight(
            name="rel_embedding",
            shape=(rows, self.num_heads, dim // self.num_heads),
            initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.built = True

    def call(self, x):
        return ops.cast(self.rel_embedding, x.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(self.rel_embedding.shape)

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), num_heads=self.num_heads,
                      num_prefix_tokens=self.num_prefix_tokens)
        return config


def _encoder(x, blocks, kind, placement, grid, prefix, num_heads, dropout,
             dtype, return_attention_scores=False, images=None, stride=None,
             prepend=None, pre_norm=None):
    """Position embedding + encoder blocks, for every kind and placement.

    ``"stem"`` puts position information in once: the additive kinds before
    the embedding dropout (the original layout), ``"relative"`` into the
    first block's attention only. ``"every_layer"`` gives every block its
    own table (layers ``position_embedding_{i}``), ``"every_layer_shared"``
    one table (layer ``position_embedding``) used by every block; both add
    it right before the block (or into its attention, for ``"relative"``).
    With ``images`` and ``stride`` (a dynamic-size model), each additive
    table follows the grid of ``images`` (``PositionEmbedding``'s stride).
    ``prepend`` (a function of the tokens), when given, adds the prefix
    tokens after the stem table, which then covers the patches only;
    ``pre_norm`` (a layer) normalises the tokens before the first block.
    Returns the encoded tokens and the list of attention maps.
    """
    def make(name):
        if kind == "relative":
            return RelativePositionEmbedding(grid, num_heads, prefix,
                                             dtype=dtype, name=name)
        return vit_layers.PositionEmbedding(grid, prefix, kind=kind,
                                            stride=stride, dtype=dtype,
                                            name=name)

    def add(layer, x):
        return layer(x) if images is None else layer(x, images=images)

    shared = None
    if kind != "none" and placement != "every_layer":
        shared = make("position_embedding")
    if kind in vit_layers.ADDITIVE_POSITION_EMBEDDINGS and placement == "stem":
        x = add(shared, x)
    if prepend is not None:
        x = prepend(x)
    x = dropout(x)
    if pre_norm is not None:
        x = pre_norm(x)
    scores = []
    for i, block in enumerate(blocks):
        if kind == "none" or (placement == "stem" and
                              (kind != "relative" or i > 0)):
            layer = None
        elif placement == "every_layer":
            layer = make(f"position_embedding_{i}")
        else:
            layer = shared
        kwargs = {}
        if layer is not None and kind == "relative":
            kwargs["relative_embedding"] = layer(x)
        elif layer is not None:
            x = add(layer, x)
        if return_attention_scores:
            x, s = block(x, return_attention_scores=True, **kwargs)
            scores.append(s)
        else:
            x = block(x, **kwargs)
    return x, scores


def check_dynamic_image_size(dynamic_image_size, position_embedding):
    """``dynamic_image_size`` as a bool, or a ValueError naming it: the
    relative position table holds one row per 1D offset of the grid it was
    built for, which no resize in the graph can extend faithfully."""
    if not isinstance(dynamic_image_size, bool):
        raise ValueError("dynamic_image_size must be True or False; "
                         f"received dynamic_image_size={dynamic_image_size!r}")
    if dynamic_image_size and position_embedding == "relative":
        raise ValueError(
            "dynamic_image_size=True resizes additive position tables in the "
            "graph; position_embedding='relative' has none (its table is per "
            "1D offset of the built grid): build the size you need with "
            "keras_vit.rebuild(model, image_size=...) instead; received "
            "position_embedding='relative', dynamic_image_size=True")
    return dynamic_image_size


def _vit_spec(image_size, patch_size, hidden_size, num_layers, num_heads,
              mlp_dim, num_classes, classifier, representation_size,
              dropout_rate, attention_dropout_rate, include_top, pooling,
              num_channels, resnet, position_embedding,
              position_embedding_placement, family):
    """Checks a ViT's arguments (each error names the argument) and returns
    what the graph builders need, normalised, as a dict. ``family``: the
    family options (:data:`~keras_vit.models.encoder.FAMILY_DEFAULTS`)."""
    resnet = _resnet_config(resnet)
    # A hybrid's patches are cut from the ResNet feature map: the root
    # divides by 4, every further stage by 2.
    stem_stride = 1
    if resnet is not None:
        stem_stride = geometry.hybrid_stride(resnet)
    image_hw, patch, grid = check_patch_grid(image_size, patch_size,
                                             stem_stride)
    # num_classes=0 with the head asked for: the pooled embedding, no head.
    headless = (include_top and isinstance(num_classes, int)
                and not isinstance(num_classes, bool) and num_classes == 0)
    head = include_top and not headless
    spec = check_encoder_args(
        hidden_size, num_layers, num_heads, mlp_dim, num_channels,
        pooling, _POOLINGS, representation_size, head,
        num_classes, dropout_rate, attention_dropout_rate,
        image_size=image_size, tokens=grid[0] * grid[1] + 1)
    check_choice("classifier", classifier, _CLASSIFIERS)
    if classifier in ("gap", "map") and pooling == "token" and (
            family["class_token"] is None):
        raise ValueError(
            f"pooling='token' takes the class token, but classifier="
            f"{classifier!r} builds the model without one; use pooling="
            f"{classifier!r} or classifier='token'; received "
            f"classifier={classifier!r}, pooling={pooling!r}")
    check_position_embedding(position_embedding,
                             position_embedding_placement,
                             spec["hidden_size"], spec["num_heads"])
    method = {"avg": "gap"}.get(classifier, classifier)
    pool = {"avg": "gap"}.get(pooling, pooling)
    family = check_family_options(
        family, method, method if headless else pool, include_top,
        position_embedding, position_embedding_placement)
    if family["distilled"] and spec["representation_size"] is not None:
        raise ValueError(
            "distilled=True puts its two heads on the tokens themselves "
            "(DeiT has no pre_logits layer); received distilled=True, "
            f"representation_size={spec['representation_size']}")
    spec.update(image_hw=image_hw, patch=patch, resnet=resnet, grid=grid,
                stride=stem_stride * patch, head=head, family=family,
                method=method if include_top else pool)
    return spec


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


def _model_norm(kind, epsilon, dtype, name):
    """A norm of the model outside the blocks (``pre_norm``,
    ``encoder_norm``, ``fc_norm``): Keras' LayerNormalization, as these
    have always been, or for ``kind="rms"`` the package's RMSNorm."""
    return vit_layers.make_norm(kind, epsilon, dtype, name, fused=False)


# The constructor arguments that VisionTransformer keeps normalised (the
# rest are kept as given; see keras_vit.models.config).
_NORMALISED = (*NORMALISED, "resnet")


@keras.saving.register_keras_serializable(package=vit_layers.PACKAGE)
class VisionTransformer(QuantizeMixin, ConstructorConfig, FeaturesMixin,
                        CompiledModelMixin, keras.Model):
    """Vision Transformer (ViT) of "An Image is Worth 16x16 Words".

    Build it with :func:`keras_vit.models.vit` or, with released weights,
    ``keras_vit.zoo.load("ViT-B/16")``. The constructor arguments are those of
    :func:`vit`; ``get_config`` returns exactly them, so a saved ``.keras``
    file rebuilds the same graph.
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        mlp_dim=3072,
        num_classes=1000,
        classifier="token",
        representation_size=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        include_top=True,
        pooling=None,
        include_preprocessing=False,
        classifier_activation=None,
        return_attention_scores=False,
        num_channels=3,
        layer_norm_epsilon=1e-6,
        head_bias_init=0.0,
        resnet=None,
        position_embedding="learned_1d",
        position_embedding_placement="stem",
        gelu="tanh",
        label_names=None,
        dynamic_image_size=False,
        remat=False,
        class_token=None,
        num_registers=0,
        posemb_includes_prefix=True,
        fc_norm=False,
        final_norm=True,
        pre_norm=False,
        layer_scale=None,
        qk_norm=False,
        qkv_bias=True,
        proj_bias=True,
        patch_bias=True,
        drop_path_rate=0.0,
        distilled=False,
        mlp="gelu",
        norm="layer",
        patch_norm=False,
        head_type="classifier",
        input_normalization=None,
        name="vision_transformer",
        **kwargs,
    ):
        given = dict(locals())
        spec = _vit_spec(
            image_size, patch_size, hidden_size, num_layers, num_heads,
            mlp_dim, num_classes, classifier, representation_size,
            dropout_rate, attention_dropout_rate, include_top, pooling,
            num_channels, resnet, position_embedding,
            position_embedding_placement,
            {key: given[key] for key in FAMILY_DEFAULTS})
        family = spec["family"]
        if include_top and not spec["head"] and (
                label_names is not None or classifier_activation is not None):
            what = ("label_names" if label_names is not None
                    else "classifier_activation")
            raise ValueError(
                f"{what} belongs to a head, and num_classes=0 builds none "
                "(the model returns the pooled embedding); received "
                f"num_classes=0, {what}="
                f"{label_names if what == 'label_names' else classifier_activation!r}")
        if family["head_type"] == "projection" and (
                not spec["head"] or label_names is not None
                or classifier_activation is not None):
            what = ("num_classes=0" if include_top and not spec["head"]
                    else "include_top=False" if not include_top
                    else f"label_names={shown(label_names)}"
                    if label_names is not None
                    else f"classifier_activation={classifier_activation!r}")
            raise ValueError(
                "head_type='projection' makes the head an embedding (the "
                "image-text projection of CLIP's towers): it needs the head "
                "and has no classes to name or score; received "
                f"head_type='projection', {what}")
        label_names = check_label_names(label_names, spec["num_classes"],
                                        spec["head"])
        dtype = check_dtype("dtype", kwargs.pop("dtype", None))
        has_token = family["class_token"]
        distilled = family["distilled"]
        prefix = int(has_token) + int(distilled) + family["num_registers"]
        dynamic = check_dynamic_image_size(dynamic_image_size,
                                           position_embedding)

        inputs, x, input_normalization = image_input(
            (None, None) if dynamic else spec["image_hw"],
            spec["num_channels"], include_preprocessing, dtype,
            input_normalization)
        remat = vit_layers.check_remat(remat)
        if spec["resnet"] is not None:
            x = _resnet_stem(x, spec["resnet"], dtype, remat)
        norm = family["norm"]
        x = vit_layers.PatchEmbedding(
            spec["hidden_size"], spec["patch"],
            use_bias=family["patch_bias"],
            norm=norm if family["patch_norm"] else None,
            norm_epsilon=layer_norm_epsilon, dtype=dtype,
            name="patch_embedding")(x)

        def prepend(x):
            # [class token, registers, patches], as timm and DINOv2 order
            # them.
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
        # timm's stochastic depth: the rate grows linearly with depth,
        # from 0 at the first block to drop_path_rate at the last.
        depth = spec["num_layers"]
        rates = [family["drop_path_rate"] * i / max(depth - 1, 1)
                 for i in range(depth)]
        blocks = [
            vit_layers.EncoderBlock(
                spec["num_heads"], spec["mlp_dim"], spec["dropout_rate"],
                spec["attention_dropout_rate"], layer_norm_epsilon,
                gelu=vit_layers.check_gelu(gelu), remat=remat,
                layer_scale=family["layer_scale"],
                qk_norm=family["qk_norm"], qkv_bias=family["qkv_bias"],
                proj_bias=family["proj_bias"], drop_path_rate=rates[i],
                mlp=family["mlp"], norm=norm, dtype=dtype,
                name=f"encoder_block_{i}")
            for i in range(depth)]
        x, scores = _encoder(
            x, blocks, position_embedding, position_embedding_placement,
            spec["grid"], prefix if table_covers_prefix else 0,
            spec["num_heads"],
            layers.Dropout(spec["dropout_rate"], dtype=dtype,
                           name="embedding_dropout"),
            dtype, return_attention_scores,
            images=inputs if dynamic else None,
            stride=spec["stride"] if dynamic else None,
            prepend=None if table_covers_prefix else prepend,
            pre_norm=_model_norm(norm, layer_norm_epsilon, dtype,
                                 "pre_norm")
            if family["pre_norm"] else None)
        if family["final_norm"] and not family["fc_norm"]:
            x = _model_norm(norm, layer_norm_epsilon, dtype,
                            "encoder_norm")(x)
        method = spec["method"]
        if distilled and method is not None:
            x = _distilled_head(x, spec, head_bias_init,
                                classifier_activation, dtype)
        else:
            x = classification_head(
                x, pooling_layer(method, prefix, spec["num_heads"],
                                 spec["mlp_dim"], gelu, layer_norm_epsilon,
                                 dtype, norm),
                spec["head"], spec["representation_size"],
                spec["num_classes"],
                keras.initializers.Constant(head_bias_init),
                classifier_activation, dtype,
                pooled_norm=_model_norm(
                    norm, layer_norm_epsilon, dtype, "fc_norm")
                if family["fc_norm"] else None)
        outputs = x
        if return_attention_scores:
            if not scores:
                raise ValueError(
                    "return_attention_scores=True needs num_layers > 0; "
                    f"received num_layers={num_layers}")
            outputs = {
                "output": x,
                "attention_scores": vit_layers.StackScores(
                    dtype=dtype, name="attention_scores")(scores),
            }
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        carry_policy(self, dtype)
        for key in _NORMALISED:
            setattr(self, key, spec[key])
        self.grid_size = spec["grid"]
        self.label_names = label_names
        self.head_type = family["head_type"]
        self.input_normalization = input_normalization
        self.dynamic_image_size = dynamic
        self.remat = remat


def vit(
    image_size,
    patch_size,
    hidden_size,
    num_layers,
    num_heads,
    mlp_dim,
    num_classes,
    classifier="token",
    representation_size=None,
    position_embedding="learned_1d",
    position_embedding_placement="stem",
    attention="global",
    **kwargs,
):
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
        position_embedding: the paper's Appendix D.4 ablation.
            ``"learned_1d"`` (default, the released models): a learned row
            per token, class token included. ``"none"``: a bag of patches.
            ``"learned_2d"``: learned X and Y tables of D/2 each,
            concatenated per patch. ``"sincos_2d"``: fixed 2D sin-cos (MoCo
            v3, big_vision). ``"relative"``: 1D relative attention, a
            learned embedding per query-key offset (per head) whose logits
            are added to the attention logits. The class token gets no
            embedding from the 2D kinds and one shared relative embedding
            for all its pairs (see ``keras_vit.layers.PositionEmbedding``).
        position_embedding_placement: ``"stem"`` (default): once, after
            the patch embedding (for ``"relative"``: in the first block's
            attention only); ``"every_layer"``: a table of its own before
            (in) every block; ``"every_layer_shared"``: one table before
            (in) every block.
        attention: ``"global"`` (default) or ``"axial"``, which returns
            :func:`keras_vit.models.axial_vit` (paper Appendix D.6) built
            from the same arguments; it pools by the mean of the grid, so it
            needs ``classifier="gap"``.
        **kwargs: ``dropout_rate``, ``attention_dropout_rate``,
            ``include_top`` (False drops the head), ``pooling`` (with
            ``include_top=False``: None returns all tokens (B, N, D);
            ``"token"`` or ``"gap"``/``"avg"`` return pooled pre-logits
            features), ``include_preprocessing`` (normalises [0, 255]
            pixels inside the model), ``input_normalization`` (what the
            weights expect: None is the official [-1, 1]; ``"imagenet"``,
            ``"clip"`` or ``{"mean": [...], "std": [...]}`` of [0, 1]
            pixels; every path that feeds the model, with or without
            ``include_preprocessing``, reads it), ``classifier_activation`` (e.g.
            ``"softmax"``), ``return_attention_scores`` (the model returns
            ``{"output": ..., "attention_scores": (B, L, heads, N, N)}``),
            ``num_channels``, ``name``, ``dtype``, ``gelu`` (``"tanh"``,
            the default, as the official code and its ``.npz`` files;
            ``"exact"``, erf, as timm and its Hub weights), and ``resnet``:
            a dict
            ``dict(num_layers=(3, 4, 9), width_factor=1)`` makes a hybrid
            whose patches are cut from the feature map of the vit_jax ResNet
            (``num_layers=()`` is the root-only stem of R+ViT-Ti/16;
            ``fold_last_stage=True`` is the paper's option (ii);
            ``standardization="var", std_eps=1e-8, norm_epsilon=1e-5``
            give timm's numerics instead of the official ones);
            ``dynamic_image_size``: True builds a model that takes any
            height and width its patch grid's stride divides, square or
            not: the position embedding is resized in the graph with the
            official resize from its ``image_size`` grid (the logits equal
            ``keras_vit.rebuild(model, image_size=(h, w))``'s);
            ``remat``: True rematerialises every encoder block (and a
            hybrid's ResNet units) in training: only each block's input is
            kept for the backward pass, which recomputes the rest (a
            training step's activation memory falls several-fold for
            about one more forward pass; the gradients are the same);
            ``label_names``: the class names of the head, one per class
            (they travel with the model: its config, ``.keras`` files,
            ``rebuild``, the zoo's writers and the exports keep them).

            ``classifier`` (and ``pooling``) also take ``"avg"``
            (``"gap"``), ``"max"`` and ``"avgmax"`` (mean + max) / 2,
            pooled over the patch tokens, and ``"map"``: multihead
            attention pooling of the patch tokens after the final norm by
            a learned probe, SigLIP's and big_vision's head
            (:class:`keras_vit.layers.AttentionPoolHead`);
            ``gelu="quick"``: x * sigmoid(1.702 x), OpenAI CLIP.
            ``num_classes=0`` builds no head: the model returns the pooled
            embedding.

            The ViT family's options, as DeiT, DeiT-III, DINOv2, CLIP's
            image towers and timm's other ViTs set them (one row each of
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
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        num_classes=num_classes,
        classifier=classifier,
        representation_size=representation_size,
        position_embedding=position_embedding,
        position_embedding_placement=position_embedding_placement,
        **kwargs,
    )


# The family's options are listed from their table, not written here twice
# (None under python -OO, which drops docstrings).
if vit.__doc__:
    vit.__doc__ = vit.__doc__.replace("{family_options}",
                                      options.described())
