"""The ViT family's options over the 2020 ViT, one row each.

Each row declares an option once (:class:`Option`): the builder's
defaults and checks, the parameter count (:mod:`keras_vit.base.geometry`,
no framework imported) and the readers and writers of timm's,
transformers' and keras-hub's configs are read from here.

>>> DEFAULTS["layer_scale"] is None, DEFAULTS["head_type"]
(True, 'classifier')
>>> ROWS["num_registers"].check("num_registers", 4)
4
>>> ROWS["norm"].check("norm", "rsm")
Traceback (most recent call last):
ValueError: norm must be one of ('layer', 'rms'); received norm='rsm'. Did you mean 'rms'?
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from keras_vit.base.checks import check_choice, check_int, check_number


def flag(name, value):
    """``value`` if it is True or False, else a ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; received "
                         f"{name}={value!r}")
    return value


def _optional(check):
    """A check accepting None (off, or another argument decides) or what
    ``check`` accepts."""
    return lambda name, value: None if value is None else check(name, value)


def count(name, value):
    """A non-negative integer."""
    return check_int(name, value, low=0)


def positive_count(name, value):
    """A positive integer."""
    return check_int(name, value, low=1)


def rate(name, value):
    """A probability in [0, 1), as a float."""
    return float(check_number(name, value, low=0, high=1, high_open=True))


def positive(name, value):
    """A positive number, as a float."""
    return float(check_number(name, value, low=0, low_open=True))


optional_flag = _optional(flag)
optional_positive_int = _optional(positive_count)
optional_positive = _optional(positive)


def number(name, value):
    """A finite number, as a float."""
    return float(check_number(name, value))


def optional_grid(name, value):
    """None, or a grid of patches: a positive integer (square) or two, as
    a [rows, columns] list (as a config holds it)."""
    if value is None:
        return None
    sides = [value] * 2 if isinstance(value, int) and not isinstance(
        value, bool) else value
    if (not isinstance(sides, (list, tuple)) or len(sides) != 2 or any(
            not isinstance(s, int) or isinstance(s, bool) or s < 1
            for s in sides)):
        raise ValueError(f"{name} must be None, a positive integer or two "
                         f"(rows, columns); received {name}={value!r}")
    return list(sides)


def choice(*choices):
    """A check accepting one of ``choices``."""
    def check(name, value):
        return check_choice(name, value, choices)
    check.choices = choices
    return check


class Field(NamedTuple):
    """An option's field in another library's config.

    Attributes:
        forms: their value -> ours (the writers invert it), or None where
            the values are the same.
        also: the field's names in other classes' configs of that library
            (transformers' DINOv3 ``use_gated_mlp``, DINOv2
            ``use_swiglu_ffn``).

    >>> swiglu = Field("use_swiglu_ffn", {True: "swiglu", False: "gelu"},
    ...                also=("use_gated_mlp",))
    >>> swiglu.read(True), swiglu.write("gelu")
    ('swiglu', False)
    >>> swiglu.named({"use_gated_mlp": False, "hidden_act": "silu"})
    'use_gated_mlp'
    """

    name: str
    forms: dict | None = None
    also: tuple = ()

    def named(self, fields):
        """The name this field has among ``fields`` (a config's), or None."""
        return next((n for n in (self.name, *self.also) if n in fields),
                    None)

    def read(self, value):
        """Our value of their ``value``; a ValueError for an unknown one."""
        if self.forms is None:
            return value
        if not isinstance(value, (str, int, float, type(None))) or (
                value not in self.forms):
            raise ValueError(f"it is none of {list(self.forms)}")
        return self.forms[value]

    def write(self, value, option="value"):
        """Their value of our ``value`` (of ``option``, which a refusal
        names); a ValueError for one they have no name for."""
        if self.forms is None:
            return value
        theirs = {ours: t for t, ours in reversed(self.forms.items())}
        if value not in theirs:
            raise ValueError(
                f"their field {self.name} has no value for {option}="
                f"{value!r}; it holds {option} of "
                f"{', '.join(map(repr, theirs))}")
        return theirs[value]


class Shape(NamedTuple):
    """What a row's parameter count reads (:func:`keras_vit.base.geometry.
    parameter_count` fills it from a config, no model built).

    Attributes:
        mlp: the width of the features an MLP's second projection reads.
        norm: ``norm(w)``: the parameters of one of the model's norms over
            ``w`` features.
        table: whether the position table is a learned row per token.
        head: the parameters of one classification head (0 without).
        bias_rows: the rows of a 2D relative bias table over the patch
            grid.
    """

    width: int
    head_width: int
    mlp_first: int
    mlp: int
    norm: Callable
    prefix: int
    table: bool
    head: int
    merged: int = 0
    final: int = 0
    heads: int = 0
    bias_rows: int = 0
    values: dict | None = None
    patch: tuple = (0, 0)
    channels: int = 0
    grid: tuple = (0, 0)
    depth: int = 0


class Weight(NamedTuple):
    """A layer of weights an option adds, and its names in the files that
    name it one way for every model (transformers' and keras-hub's names
    differ per model type: their family tables hold them).

    Attributes:
        path: the layer's path in the model, ``{i}`` for each block's.
        kind: ``"norm"``, ``"dense"``, ``"dense_out"`` (a Dense whose
            kernel's leading axes are its input, an attention's output
            projection), ``"conv"``, ``"batch_norm"`` or ``"vector"`` (one
            array).
        timm: its key in timm's ``state_dict`` (a module's name for a norm
            or dense layer).
        official: its key in the official ``.npz`` layout.
    """

    path: str
    kind: str
    timm: str
    official: str


class Option(NamedTuple):
    """One option of the family.

    Attributes:
        default: its value in the paper's ViT.
        check: ``check(name, value)`` -> the normalised value, or a
            ValueError naming the argument and value.
        parameters: whether its value changes the model's weights.
        timm: its :class:`Field` among timm's ``VisionTransformer``
            arguments, or None; ``transformers`` and ``keras_hub``
            likewise in those libraries' configs.
        params: ``params(value, shape)`` -> ``(per block, once)``: the
            parameters the option adds at ``value`` (a :class:`Shape`
            describes the model); None where it adds none of its own.
        tokens: ``tokens(value)`` -> the tokens the option puts before the
            patches, or None.
        block: whether every encoder block takes it, as a keyword
            (:class:`~keras_vit.layers.blocks.EncoderBlock`).
        at_other_sizes: whether it acts only where the model's table meets
            another grid than its own (a writer need not hold it).
        requires: ``requires(value, values)`` -> None where the row's
            ``value`` builds beside the other rows' ``values``, else what
            it needs and the values received. Asked only where the row is
            set (its value is not its default, falsy or not).
        score_maps: ``score_maps(value)`` -> the attention maps (N x N)
            each head keeps at that value, for the memory bound; None: one.
        block_copies: ``block_copies(value)`` -> how many copies of a
            block's activations training keeps at that value (side-by-side
            branches), for the memory bound; None: one.
        at_block: ``at_block(value, values, i)`` -> the value block ``i``
            takes; None: ``value``.
        fixed_grid: whether, at a value other than its default, it reads
            the patches as a map of the grid the model was built for (no
            dynamic image size).
    """

    name: str
    default: object
    check: Callable
    parameters: bool
    timm: Field | None
    about: str
    transformers: Field | None = None
    keras_hub: Field | None = None
    params: Callable | None = None
    tokens: Callable | None = None
    weights: tuple = ()
    block: bool = False
    at_other_sizes: bool = False
    requires: Callable | None = None
    score_maps: Callable | None = None
    block_copies: Callable | None = None
    at_block: Callable | None = None
    fixed_grid: bool = False


# timm's no_embed_class is the negation of posemb_includes_prefix.
_NEGATED = {True: False, False: True}
# DINOv2's SwiGLU MLP in transformers' and keras-hub's configs (DINOv3's:
# use_gated_mlp).
_GATED = Field("use_swiglu_ffn", {True: "swiglu", False: "gelu"},
               also=("use_gated_mlp",))

def _query_width(shape):
    """The width the q/k norms see: a head's, or half of it where
    differential attention splits each head's queries and keys in two."""
    split = (shape.values or {}).get("differential") is not None
    return shape.head_width // (2 if split else 1)


def _parallel_params(value, shape):
    """What parallel blocks change per block: no second norm, one layer
    scale, the MLP's first bias always, one output bias with ``"fused"``."""
    if not value:
        return 0, 0
    values = shape.values
    return (-shape.norm(shape.width)
            - shape.width * (values["layer_scale"] is not None)
            + shape.mlp_first * (not values["proj_bias"])
            - shape.width * (value == "fused" and values["proj_bias"])), 0


def _conv_stem_params(value, shape):
    """The three convolutions and two BatchNorms of the conv stem, less
    the one patch convolution's kernel they replace."""
    if not value:
        return 0, 0
    (rows, cols), quarter = shape.patch, shape.width // 4
    stem = (rows // 4 * cols // 4 * shape.channels * quarter
            + 4 * quarter * quarter + 4 * quarter * shape.width
            + 2 * 4 * quarter)
    return 0, stem - rows * cols * shape.channels * shape.width


def block_indices(name, value):
    """None, or block indices from 0: a sorted list of distinct
    non-negative integers."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None
    if not isinstance(value, (list, tuple)) or any(
            not isinstance(i, int) or isinstance(i, bool) or i < 0
            for i in value):
        raise ValueError(f"{name} must be None or block indices from 0 "
                         f"(non-negative integers); received {name}="
                         f"{value!r}")
    return sorted(set(value))


def _patches_alone(value, values):
    """A ``requires`` of a row that reads the patch grid as a map: no
    prefix token, no NaFlex batch."""
    if values["naflex"]:
        return ("images, naflex=False (it reads the patches as a map of "
                "the model's grid); received naflex=True")
    prefix = {k: values[k] for k in ("class_token", "num_registers",
                                     "distilled") if values[k]}
    return ("the patches alone, no class, register or distillation token "
            "(it reads them as a map of the grid); received "
            + ", ".join(f"{k}={v!r}" for k, v in prefix.items())
            if prefix else None)


def _windowed(value, values, index):
    """A block's window: none where ``global_blocks`` names it."""
    return 0 if index in (values["global_blocks"] or ()) else value


def _decomposed_params(value, shape):
    """Each block's two decomposed tables, of offsets over its window or,
    in a global block, the grid."""
    if not value:
        return 0, 0
    total = 0
    for i in range(shape.depth):
        window = _windowed(shape.values["window_size"], shape.values, i)
        rows, cols = (window, window) if window else shape.grid
        total += (2 * rows - 1 + 2 * cols - 1) * shape.head_width
    return 0, total


def _neck_params(value, shape):
    """SAM's neck: a 1 x 1 and a 3 x 3 convolution without biases, each
    followed by a LayerNorm."""
    return 0, value and (value * shape.width + 9 * value * value
                         + 4 * value)


def _without(names, why):
    """A ``requires`` of a row that, set, needs the rows ``names`` at
    their defaults (``why`` says what for)."""
    def requires(value, values):
        return next((f"{k}={DEFAULTS[k]!r} ({why}); received {k}="
                     f"{values[k]!r}" for k in names
                     if values[k] != DEFAULTS[k]), None)
    return requires


# What a block of several branches leaves out (each branch holds a plain
# pre-norm attention and MLP).
_NOT_BRANCHED = ("parallel", "post_norm", "sandwich_norm", "qk_norm",
                 "mlp_norm", "attention_norm", "differential",
                 "clip_linears", "window_size", "decomposed_bias",
                 "relative_bias", "relative_mlp")


def _branches_params(value, shape):
    """Each branch after the first: two norms, the q/k/v/out kernels and
    the MLP's, their biases and its two layer scales."""
    v, d = shape.values, shape.width
    mlp_bias = v["proj_bias"] if v["mlp_bias"] is None else v["mlp_bias"]
    one = (2 * shape.norm(d) + 4 * d * d + d * shape.mlp_first
           + shape.mlp * d + 3 * d * v["qkv_bias"] + d * v["proj_bias"]
           + (shape.mlp_first + d) * mlp_bias
           + 2 * d * (v["layer_scale"] is not None))
    return (value - 1) * one, 0


def _branch_weights():
    """Branch b's weights (b from 1; the first branch's are the block's
    own); timm's packed qkv read as q, k and v (zoo/timm/layout.py)."""
    def weight(path, kind, timm, official):
        return Weight(f"{_BLOCK}branch_{{b}}_{path}", kind,
                      f"{_TIMM}{timm}", f"{_OFFICIAL}Branch_{{b}}/{official}")
    attention = "MultiHeadDotProductAttention_1"
    return (weight("norm_1", "norm", "attns.{b}.norm", "LayerNorm_0"),
            *(weight(f"attention/{p}", "dense_out" if p == "out" else
                     "dense", f"attns.{{b}}.attn.{q}", f"{attention}/{p}")
              for p, q in (("query", "q"), ("key", "k"), ("value", "v"),
                           ("out", "proj"))),
            weight("layer_scale_1", "vector", "attns.{b}.ls.gamma",
                   "LayerScale_1"),
            weight("norm_2", "norm", "ffns.{b}.norm", "LayerNorm_2"),
            weight("mlp/dense_0", "dense", "ffns.{b}.mlp.fc1",
                   "MlpBlock_3/Dense_0"),
            weight("mlp/dense_1", "dense", "ffns.{b}.mlp.fc2",
                   "MlpBlock_3/Dense_1"),
            weight("layer_scale_2", "vector", "ffns.{b}.ls.gamma",
                   "LayerScale_2"))


def _relative_mlp_params(shape):
    """One relative position MLP: Dense(2 -> width), Dense(width -> heads)."""
    width = shape.values["relative_mlp_width"]
    return 3 * width + shape.heads * (width + 1)


# A block's path in the model, timm's state dict and the official layout.
_BLOCK, _TIMM = "encoder_block_{i}/", "blocks.{i}."
_OFFICIAL = "Transformer/encoderblock_{i}/"


def _attention(name, kind, timm=None):
    """A weight of every block's attention (timm's name: ``timm``, else
    ``name``)."""
    return Weight(f"{_BLOCK}attention/{name}", kind,
                  f"{_TIMM}attn.{timm or name}",
                  f"{_OFFICIAL}MultiHeadDotProductAttention_1/{name}")


OPTIONS = (
    Option("class_token", None, optional_flag, True, Field("class_token"),
           "a learned class token before the patches (None: with "
           "classifier='token' only; True keeps one beside any pooling)",
           params=lambda v, s: (0, s.width * bool(v)), tokens=bool,
           weights=(Weight("class_token/cls", "vector", "cls_token",
                           "cls"),)),
    Option("num_registers", 0, count, True, Field("reg_tokens"),
           "learned register tokens after the class token (Darcet et al. "
           "2024)", Field("num_register_tokens"),
           Field("num_register_tokens"),
           params=lambda v, s: (0, s.width * v), tokens=int,
           weights=(Weight("register_tokens/registers", "vector",
                           "reg_token", "reg"),)),
    Option("posemb_includes_prefix", True, flag, True,
           Field("no_embed_class", _NEGATED),
           "False: the position table covers the patches only and the "
           "class and register tokens join after it (DeiT-III, DINOv2 with "
           "registers; timm's no_embed_class is its negation)",
           params=lambda v, s: (0, s.width * s.prefix * (v and s.table))),
    Option("fc_norm", False, flag, True, Field("fc_norm"),
           "the final norm after the pooling instead of before it",
           weights=(Weight("fc_norm", "norm", "fc_norm", "fc_norm"),)),
    Option("pooled_norm", False, flag, False, None,
           "a norm of the model's kind without a scale or bias on the "
           "pooled features, beside the final norm on the tokens "
           "(DeepSeek's classifier)",
           requires=_without(("fc_norm",), "one norm after the pooling")),
    Option("final_norm", True, flag, True, Field("final_norm"),
           "a norm after the last block (False: none)",
           params=lambda v, s: (0, s.norm(s.final) * v)),
    Option("pre_norm", False, flag, True, Field("pre_norm"),
           "a norm before the first block (CLIP's ln_pre)",
           params=lambda v, s: (0, s.norm(s.width) * v),
           weights=(Weight("pre_norm", "norm", "norm_pre",
                           "Transformer/pre_norm"),)),
    Option("layer_scale", None, optional_positive, True,
           Field("init_values"),
           "per-channel scales on each residual branch, this initial value "
           "(CaiT, DeiT III, DINOv2)",
           Field("layerscale_value"), Field("layer_scale_init_value"),
           params=lambda v, s: (2 * s.width * (v is not None), 0),
           weights=tuple(
               Weight(f"{_BLOCK}layer_scale_{n}", "vector",
                      f"{_TIMM}ls{n}.gamma",
                      f"{_OFFICIAL}LayerScale_{2 * n - 2}/scale")
               for n in (1, 2)), block=True),
    Option("qk_norm", False, flag, True, Field("qk_norm"),
           "a norm on each head's queries and keys",
           params=lambda v, s: (2 * s.norm(_query_width(s)) * v, 0),
           weights=tuple(_attention(f"{x}_norm", "norm", f"{x[0]}_norm")
                         for x in ("query", "key")), block=True),
    Option("qkv_bias", True, flag, True, Field("qkv_bias"),
           "biases on the query, key and value projections",
           Field("qkv_bias"),
           params=lambda v, s: (3 * s.width * v, 0), block=True),
    Option("proj_bias", True, flag, True, Field("proj_bias"),
           "biases on the attention's output projection and the MLP's",
           params=lambda v, s: ((2 * s.width + s.mlp_first) * v, 0),
           block=True),
    Option("mlp_bias", None, optional_flag, True, None,
           "the MLP's biases apart from the attention's output bias: "
           "False, none (DeepSeek's towers: a bias-free SwiGLU MLP beside "
           "biased attention), True, both; None: proj_bias's",
           block=True,
           params=lambda v, s: ((s.width + s.mlp_first) * (
               int(bool(v)) - int(s.values["proj_bias"]))
               * (v is not None), 0),
           requires=_without(("parallel",), "one MLP after the attention")),
    Option("patch_bias", True, flag, True, None,
           "a bias on the patch embedding",
           params=lambda v, s: (0, s.width * v)),
    Option("drop_path_rate", 0.0, rate, False, Field("drop_path_rate"),
           "stochastic depth in training, rising linearly from 0 at the "
           "first block to this rate at the last",
           keras_hub=Field("drop_path_rate")),
    Option("distilled", False, flag, True, None,
           "DeiT's distillation token after the class token and a second "
           "head, head_dist, on it; the two heads' logits averaged",
           params=lambda v, s: (0, (s.width + s.head) * v), tokens=bool,
           weights=(
               Weight("distillation_token/registers", "vector", "dist_token",
                      "dist"),
               Weight("head_dist", "dense", "head_dist", "head_dist"))),
    Option("mlp", "gelu", choice("gelu", "swiglu", "geglu"), True, None,
           "every block's MLP: 'gelu' (Dense, GELU, Dense), 'swiglu': SiLU "
           "of one half of a 2 * mlp_dim projection times the other "
           "(DINOv2-g, TIPS, AIMv2; gelu then serves the attention pool "
           "only), or 'geglu': the same gate through the GELU that gelu "
           "names (Gemma 4's, gelu='tanh')",
           _GATED, _GATED, block=True),
    Option("mlp_norm", False, flag, True, Field("scale_mlp_norm"),
           "a norm of the MLP's hidden features, after the activation (or "
           "the gate) and before the second projection (EVA-02's "
           "scale_mlp, BEiT-3's sub-LN)",
           params=lambda v, s: (s.norm(s.mlp) * v, 0),
           weights=(Weight(f"{_BLOCK}mlp/norm", "norm", f"{_TIMM}mlp.norm",
                           f"{_OFFICIAL}MlpBlock_3/norm"),), block=True),
    Option("attention_norm", False, flag, True, Field("scale_attn_norm"),
           "a norm of the attention's output, every head's features at "
           "once, before its output projection (EVA-02 CLIP's "
           "scale_attn_inner, BEiT-3's sub-LN)",
           params=lambda v, s: (s.norm(s.width) * v, 0),
           weights=(_attention("output_norm", "norm", "norm"),), block=True),
    Option("norm", "layer", choice("layer", "rms"), True, None,
           "every norm of the model (the blocks', the q/k norms, pre_norm, "
           "the final norm or fc_norm, the attention pool's, the patch norm): "
           "'layer' (LayerNorm) or 'rms': x / sqrt(mean(x ** 2) + "
           "layer_norm_epsilon) * scale, no mean subtracted, no bias (AIMv2)"),
    Option("patch_norm", False, flag, True, None,
           "a norm of that kind on each patch's embedding, before the class "
           "token and the position table join (timm's embed_norm_layer, "
           "AIMv2)",
           params=lambda v, s: (0, s.norm(s.width) * v),
           weights=(Weight("patch_embedding/norm", "norm",
                           "patch_embed.norm", "embedding_norm"),)),
    Option("conv_stem", False, flag, True, None,
           "the patch embedding as three convolutions (timm's ConvStem, "
           "MobileCLIP's ViT-B): patch_size / 4 square with that stride to "
           "width / 4 channels, BatchNorm (epsilon 1e-5), exact GELU; 2 x 2 "
           "stride 2, width / 4, BatchNorm, GELU; 2 x 2 stride 2 to the "
           "width, its bias patch_bias's; a square patch of a multiple of 4 "
           "pixels and a width of 4",
           params=_conv_stem_params,
           requires=lambda v, values: (
               "images, naflex=False (its patches come flattened); received "
               "naflex=True" if v and values["naflex"] else None),
           weights=(*(Weight(f"patch_embedding/stem_conv_{n}", "conv",
                             f"patch_embed.backbone.{n}.conv",
                             f"embedding_stem/conv_{n}") for n in (0, 1)),
                    *(Weight(f"patch_embedding/stem_norm_{n}", "batch_norm",
                             f"patch_embed.backbone.{n}.bn",
                             f"embedding_stem/norm_{n}") for n in (0, 1)))),
    Option("rope", None, choice(None, "dinov3", "eva02", "mixed"), True,
           None,
           "rotary position embeddings of each head's queries and keys, "
           "the patches' (the class and register tokens are not turned), "
           "beside any additive table: 'dinov3', DINOv3's (each patch's row "
           "and column centred in [-1, 1] at any image size, periods "
           "rope_temperature ** (2k / (head_dim / 2)), halves rotated); "
           "'eva02', EVA-02's (the patch's row and column indices, scaled "
           "to rope_grid, periods rope_temperature ** (k / (head_dim / 4)), "
           "adjacent pairs rotated); 'mixed', RoPE-ViT's (Heo et al. "
           "2024: learned frequencies per block and head, each angle a "
           "mix of the column and row indices, adjacent pairs rotated; "
           "rope_temperature sets their start); None: none", block=True,
           params=lambda v, s: ((v == "mixed") * s.width, 0),
           weights=(Weight("rotary_embedding/freqs", "vector", "rope.freqs",
                           "Transformer/rope_freqs"),)),
    Option("rope_halves", None, optional_flag, False, None,
           "the pairs of features the rotary embeddings turn: True, the "
           "two halves of each head's features (DINOv3's; timm's "
           "rope_rotate_half, Qwen's vision towers with EVA-02's "
           "coordinates), False, adjacent pairs (EVA-02's); None: the "
           "form's own", block=True),
    Option("rope_temperature", 100.0, positive, False, None,
           "the rotary embeddings' base period (DINOv3's 100)",
           Field("rope_theta"), Field("rope_theta")),
    Option("rope_grid", None, optional_grid, False, None,
           "rope='eva02': the grid (rows, columns) whose patch indices are "
           "the coordinates; another grid's are scaled to it (timm's "
           "ref_feat_shape: the pretraining grid); None: the indices as "
           "they are",
           requires=lambda v, values: (
               "rope='eva02' (it scales EVA-02's rotary coordinates); "
               f"received rope={values['rope']!r}"
               if v is not None and values["rope"] != "eva02" else None)),
    Option("rope_offset", 0.0, number, False, None,
           "added to each patch's row and column index before the rotary "
           "form maps them (timm's rope_grid_offset; Perception Encoder's "
           "1)"),
    Option("rope_indexing", "ij", choice("ij", "xy"), False, None,
           "the order of the rotary angles: 'ij', the rows' then the "
           "columns'; 'xy', the columns' then the rows' (timm's "
           "rope_grid_indexing; RoPE-ViT, Perception Encoder)"),
    Option("pool_heads", None, optional_positive_int, True, None,
           "the attention-pool head's heads (classifier='map'; None: the "
           "blocks' num_heads; Perception Encoder's 8)"),
    Option("pool_prefix", False, flag, False, Field("pool_include_prefix"),
           "the pooling ('gap', 'max', 'avgmax', 'map') over the class and "
           "register tokens too, not the patches only (timm's "
           "pool_include_prefix; Perception Encoder's attention pool)"),
    Option("pool_form", "map", choice("map", "aimv2"), True, None,
           "the attention-pool head's form (classifier='map'): 'map', "
           "big_vision's MAPHead (SigLIP's, timm's): the probe through a "
           "query projection, key, value and output projections with "
           "biases, then y + MLP(norm(y)); 'aimv2', AIMv2's: the probe "
           "itself the query, key and value projections with biases where "
           "qkv_bias says, the output projection with a bias, nothing "
           "after it"),
    Option("sandwich_norm", False, flag, True, None,
           "two more norms in each block, on its branches' outputs: x + "
           "post_norm_1(attention(norm_1(x))), then x + post_norm_2(mlp("
           "norm_2(x))) (Gemma 4's four norms a block)",
           block=True, params=lambda v, s: (2 * s.norm(s.width) * v, 0),
           requires=_without(("post_norm", "parallel"), "pre-norm blocks, "
                             "one branch after the other"),
           weights=tuple(Weight(f"{_BLOCK}post_norm_{n}", "norm",
                                f"{_TIMM}post_norm{n}",
                                f"{_OFFICIAL}PostNorm_{n}") for n in (1, 2))),
    Option("clip_linears", False, flag, True, None,
           "every projection of the blocks clamps its input and its output "
           "to bounds it holds (non-trainable weights, infinite at first: "
           "attention/clip, a row [input min, input max, output min, "
           "output max] for the query, key, value and output projections; "
           "mlp/clip, one for the first Dense, or each half of a gated "
           "one, and one for the second); a gated MLP's first Dense runs "
           "once per half's input bounds (Gemma 4's E2B/E4B tower)",
           block=True,
           params=lambda v, s: ((16 + 4 * (2 + (s.values["mlp"] != "gelu")))
                                * v, 0),
           weights=(_attention("clip", "vector"),
                    Weight(f"{_BLOCK}mlp/clip", "vector", f"{_TIMM}mlp.clip",
                           f"{_OFFICIAL}MlpBlock_3/clip"))),
    Option("value_norm", False, flag, False, None,
           "each head's values normalised, the norm's kind and epsilon "
           "without a scale or bias (Gemma 4's v_norm)", block=True),
    Option("post_norm", False, flag, False, None,
           "each block's norms on its branches' outputs, x + norm(f(x)), "
           "not their inputs (timm's ResPostBlock and EVA's use_post_norm)",
           block=True),
    Option("relative_bias", None, choice(None, "block", "shared"), True,
           None,
           "BEiT's relative position bias: a learned bias per head for "
           "each 2D offset between two patches and three for the class "
           "token's pairs, added to the attention logits; 'block', a table "
           "in every block (BEiT, BEiT v2), 'shared', one for all; None: "
           "none",
           params=lambda v, s: (
               (v == "block") * s.bias_rows * s.heads,
               (v == "shared") * s.bias_rows * s.heads),
           weights=(Weight("relative_bias_{i}/table", "vector",
                           "blocks.{i}.attn.relative_position_bias_table",
                           "Transformer/encoderblock_{i}/relative_bias"),
                    Weight("relative_bias/table", "vector",
                           "rel_pos_bias.relative_position_bias_table",
                           "Transformer/relative_bias"))),
    Option("relative_mlp", None, choice(None, "block", "shared"), True,
           None,
           "timm's relative position MLP (vision_transformer_relpos, Swin "
           "v2's log-spaced coordinates): each 2D offset (dr, dc) between "
           "two patches as sign(d) log(1 + |d|) through Dense("
           "relative_mlp_width) -> ReLU -> Dense(heads) gives a bias per "
           "head added to the attention logits, none for a pair with a "
           "class or register token; 'block', an MLP in every block, "
           "'shared', one for all; None: none",
           fixed_grid=True, params=lambda v, s: (
               (v == "block") * _relative_mlp_params(s),
               (v == "shared") * _relative_mlp_params(s)),
           requires=_without(("relative_bias", "decomposed_bias", "naflex"),
                             "one relative scheme"),
           weights=(*(Weight(f"relative_mlp_{{i}}/{fc}", "dense",
                             f"blocks.{{i}}.attn.rel_pos.mlp.{fc}",
                             f"Transformer/encoderblock_{{i}}/relative_mlp/"
                             f"{fc}") for fc in ("fc1", "fc2")),
                    *(Weight(f"relative_mlp/{fc}", "dense",
                             f"shared_rel_pos.mlp.{fc}",
                             f"Transformer/relative_mlp/{fc}")
                      for fc in ("fc1", "fc2")))),
    Option("relative_mlp_width", 128, positive_count, True, None,
           "the relative position MLP's hidden width (timm's rel_pos_dim)",
           requires=lambda v, values: (
               "a relative position MLP, relative_mlp='block' or 'shared' "
               "(it is its width); received relative_mlp=None"
               if v != DEFAULTS["relative_mlp_width"]
               and values["relative_mlp"] is None else None)),
    Option("differential", None, choice(None, "vectors", "dual"), True,
           Field("attn_layer", {"diff": "vectors", "": None,
                                "attn": None}),
           "differential attention (Ye et al. 2025, timm's DiffAttention): "
           "each head's queries and keys split in two halves, softmax(q1 "
           "k1) - lambda softmax(q2 k2) over the values, then an RMS norm "
           "of each head (sub_norm, epsilon 1e-5) times 1 - lambda_init, "
           "lambda_init = 0.8 - 0.6 exp(-0.3 i) at block i; lambda = "
           "exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + "
           "lambda_init with 'vectors' (the paper's four vectors of half a "
           "head), exp(lambda_a) - exp(lambda_b) + lambda_init with 'dual' "
           "(two scalars); the q/k norms over the halves; None: none",
           block=True,
           params=lambda v, s: ((v is not None) * (s.head_width + (
               2 * s.head_width if v == "vectors" else 2)), 0),
           requires=lambda v, values: (
               "rope=None (no rotary form turns half heads); received "
               f"rope={values['rope']!r}" if v and values["rope"] else None),
           score_maps=lambda v: 2 if v else 1,
           weights=(*(_attention(f"lambda_{x}", "vector")
                      for x in ("q1", "k1", "q2", "k2", "a", "b")),
                    _attention("sub_norm", "norm"))),
    Option("parallel", None, choice(None, "split", "fused"), True, None,
           "the attention and the MLP side by side on one norm of the "
           "tokens, x + attention(norm_1(x)) + mlp(norm_1(x)), one layer "
           "scale over their sum (ViT-22B's parallel layers): 'split', each "
           "branch's output projection with its own bias (timm's "
           "ParallelScalingBlock), 'fused', one bias for both, the MLP's "
           "second Dense without (timm's DiffParallelScalingBlock); the "
           "MLP's first Dense has a bias whatever proj_bias says; None: "
           "one branch after the other",
           block=True, params=_parallel_params,
           requires=lambda v, values: (
               "pre-norm blocks, post_norm=False (its two branches read one "
               "norm of the tokens); received post_norm=True"
               if v and values["post_norm"] else None)),
    Option("branches", 1, positive_count, True, None,
           "n > 1: each block holds n attentions and n MLPs, each with its "
           "own norm and layer scale, summed: x + sum(attention_b(norm_1_b"
           "(x))), then x + sum(mlp_b(norm_2_b(x))) (timm's "
           "ParallelThingsBlock, Touvron et al. 2022's parallel ViTs); the "
           "first branch's weights are the block's own, branch b's under "
           "branch_{b}_",
           block=True, params=_branches_params, block_copies=int,
           requires=_without(_NOT_BRANCHED, "branches of their own norms, "
                             "an attention and an MLP each"),
           weights=_branch_weights()),
    Option("window_size", 0, count, True, None,
           "w > 0: each block's attention within non-overlapping w x w "
           "windows of the patch grid, the normed tokens padded with zeros "
           "to a multiple of w (the padding attended to, as ViTDet's and "
           "SAM's image encoders), but in the blocks global_blocks names; "
           "0: every block attends over the whole grid",
           block=True, at_block=_windowed, fixed_grid=True,
           requires=lambda v, values: _patches_alone(v, values) or (
               f"rope=None (no rotary form of windows); received rope="
               f"{values['rope']!r}" if v and values["rope"] else None) or (
               "sequential blocks, parallel=None; received parallel="
               f"{values['parallel']!r}" if v and values["parallel"]
               else None)),
    Option("global_blocks", None, block_indices, True, None,
           "with window_size: the blocks (from 0) that attend over the "
           "whole grid (SAM's global_attn_indexes); None: none",
           requires=lambda v, values: (
               "windows to leave, window_size of 1 or more; received "
               "window_size=0" if v and not values["window_size"] else None)),
    Option("decomposed_bias", False, flag, True, None,
           "MViTv2's and SAM's decomposed relative positions: each block's "
           "attention holds two tables of head-wide vectors, rel_pos_h per "
           "row offset and rel_pos_w per column offset over its window (the "
           "grid in a global block), and adds q . rel_pos_h[dr] + q . "
           "rel_pos_w[dc] of each head's unscaled query to its logits",
           block=True, params=_decomposed_params, fixed_grid=True,
           requires=lambda v, values: _patches_alone(v, values) or _without(
               ("rope", "relative_bias", "differential"),
               "one relative scheme")(v, values),
           weights=tuple(_attention(f"rel_pos_{x}", "vector")
                         for x in ("h", "w"))),
    Option("neck", 0, count, True, None,
           "c > 0: SAM's neck after the blocks: the patch map through a 1 x "
           "1 convolution to c channels, a LayerNorm (epsilon 1e-6), a 3 x "
           "3 convolution (zero padding) and a LayerNorm, no biases in the "
           "convolutions; the pooling and head read its c features; 0: none",
           params=_neck_params, fixed_grid=True,
           requires=lambda v, values: _patches_alone(v, values) or (
               "no patch merger, merge_size=0; received merge_size="
               f"{values['merge_size']}" if v and values["merge_size"]
               else None),
           weights=(*(Weight(f"neck/conv_{n}", "conv", f"neck.{2 * n}",
                             f"neck/conv_{n}") for n in (0, 1)),
                    *(Weight(f"neck/norm_{n}", "norm", f"neck.{2 * n + 1}",
                             f"neck/norm_{n}") for n in (0, 1)))),
    Option("soft_pool", 0, count, False, None,
           "k > 1: Gemma 4's soft-token pool after the blocks: each k x k "
           "cell of the patch map averaged (the cells row by row), times "
           "sqrt(width); the pooling and head read those tokens, "
           "include_top=False returns them; 0: none",
           fixed_grid=True,
           requires=lambda v, values: _patches_alone(v, values) or _without(
               ("neck", "merge_size"), "it pools the patch map")(v, values)),
    Option("soft_pool_standardize", False, flag, True, None,
           "with soft_pool: its tokens then standardised, (x - std_bias) * "
           "std_scale (Gemma 4's 31B tower)",
           params=lambda v, s: (0, 2 * s.width * v),
           requires=lambda v, values: (
               "a soft-token pool, soft_pool of 1 or more; received "
               "soft_pool=0" if v and not values["soft_pool"] else None),
           weights=tuple(Weight(f"soft_pool/std_{x}", "vector", f"std_{x}",
                                f"soft_pool/std_{x}")
                         for x in ("bias", "scale"))),
    Option("merge_size", 0, count, True, None,
           "k > 1: the patch merger after the blocks (the projector of "
           "Qwen's vision towers): each k x k block of patch tokens, "
           "normed and concatenated, through Dense(k * k * width) -> exact "
           "GELU (-> Dense(merge_width)); the pooling and head read the "
           "merged tokens, include_top=False returns them; 0: none",
           params=lambda v, s: (0, v and (s.norm(s.width) + s.merged ** 2
                                          + s.merged)),
           weights=(Weight("merger/norm", "norm", "merger.norm",
                           "merger/norm"),
                    Weight("merger/dense_0", "dense", "merger.fc1",
                           "merger/dense_0"))),
    Option("merge_width", None, optional_positive_int, True, None,
           "the patch merger's second Dense, to this width (Qwen's: its "
           "language model's); None: none",
           requires=lambda v, values: (
               "a patch merger, merge_size of 2 or more (it is the merger's "
               "output width); received merge_size=0"
               if v is not None and not values["merge_size"] else None),
           params=lambda v, s: (0, (v or 0) * (s.merged + 1)),
           weights=(Weight("merger/dense_1", "dense", "merger.fc2",
                           "merger/dense_1"),)),
    Option("naflex", False, flag, False, None,
           "any aspect ratio and resolution from one model (SigLIP2's "
           "NaFlex): the model takes a dict of 'patches' (B, N, P * P * C, "
           "each patch's pixels row by row), 'patch_coords' (B, N, 2: each "
           "patch's row and column) and 'patch_mask' (B, N: 1 a patch, 0 "
           "padding) instead of images (keras_vit.data.naflex makes them); "
           "the learned table is resized to each image's grid (bilinear "
           "with antialiasing, as SigLIP2) and padding is left out of "
           "attention and pooling"),
    Option("position_axes", 0, count, True, None,
           "n > 0: Gemma 4's position table beside any other: two learned "
           "tables of n rows, the first per column index, the second per "
           "row index, a patch at row r and column c getting the first's "
           "row c plus the second's row r; any grid of up to n x n patches "
           "reads its own rows, no resize; 0: none",
           params=lambda v, s: (0, 2 * v * s.width),
           requires=lambda v, values: (
               "images, naflex=False (it adds rows per grid index); "
               "received naflex=True" if v and values["naflex"] else None),
           weights=(Weight("position_axes/table", "vector",
                           "patch_embed.position_embedding_table",
                           "Transformer/posembed_axes"),)),
    Option("position_resize", None, choice(
        None, "bilinear_corners", "bilinear_aa", "bicubic_aa", "bicubic",
        "bilinear"),
           False, None,
           "how the learned table is resized to another patch grid (weights "
           "loaded at another image_size, a dynamic-size model's input, "
           "each image of a NaFlex batch), as the weights' source computes "
           "it: 'bilinear_corners', the official code's (the paper's "
           "section 3.2: bilinear, aligned corners); 'bicubic_aa' and "
           "'bilinear_aa', torch's interpolate(mode, antialias=True, "
           "align_corners=False), timm's and SigLIP2 NaFlex's; 'bicubic', "
           "torch's interpolate(mode='bicubic', align_corners=False), "
           "transformers' interpolate_pos_encoding; 'bilinear', torch's "
           "interpolate(mode='bilinear', align_corners=False) (C-RADIOv4's); "
           "None: the model's own, "
           "'bilinear_aa' with naflex, else 'bilinear_corners'; the readers "
           "set their source's", at_other_sizes=True),
    Option("position_aspect", False, flag, False, None,
           "naflex=True: each image's table resized to a square of its "
           "grid's longer side and cropped to the grid from the top-left "
           "corner, the aspect ratio kept (timm's pos_embed_ar_preserving: "
           "RADIO, NaFlexVit's _par_ models); False: resized to the grid",
           requires=lambda v, values: (
               "a NaFlex model, naflex=True (it acts on each image's table); "
               "received naflex=False" if v and not values["naflex"]
               else None)),
    Option("head_type", "classifier", choice("classifier", "projection"),
           False, None,
           "what the head's outputs are: 'classifier', class scores, or "
           "'projection', an embedding (the image-text projection of CLIP's "
           "towers, as timm holds it): predict, the exports' default outputs "
           "and the serving signature treat the model as a feature "
           "extractor"),
)

def position_resize(values):
    """The kernel that resizes the learned table of a model of the
    options ``values``.

    >>> position_resize({"position_resize": None, "naflex": True})
    'bilinear_aa'
    """
    return values.get("position_resize") or (
        "bilinear_aa" if values.get("naflex") else "bilinear_corners")


def unwritten(values):
    """The rows a writer need not hold for a model of the options
    ``values``: ``drop_path_rate`` (training only) and, but for a NaFlex
    model, the rows :attr:`Option.at_other_sizes`.

    >>> sorted(unwritten({"naflex": False}))
    ['drop_path_rate', 'position_resize']
    """
    return {"drop_path_rate"} | (set() if values.get("naflex") else {
        row.name for row in OPTIONS if row.at_other_sizes})


def as_written(values):
    """``values`` less the rows a writer need not hold (:func:`unwritten`),
    ``position_resize`` as it resolves: what a writer compares with what
    its files read back as.

    >>> as_written({"naflex": True, "position_resize": None,
    ...             "drop_path_rate": 0.1})
    {'naflex': True, 'position_resize': 'bilinear_aa'}
    """
    out = {k: v for k, v in values.items() if k not in unwritten(values)}
    if "position_resize" in out:
        out["position_resize"] = position_resize(values)
    return out


# The poolings with which class_token=None builds a class token.
CLASS_TOKEN_POOLINGS = ("token", "token_gap")

# Whether each rotary form turns the two halves, unless rope_halves says.
ROPE_HALVES = {"dinov3": True, "eva02": False, "mixed": False}

ROWS = {option.name: option for option in OPTIONS}
DEFAULTS = {option.name: option.default for option in OPTIONS}


def described(indent=12, width=72):
    """The rows as docstring text (the builder's): each option, its
    default and what it selects, wrapped and indented.

    >>> described(0, 60).splitlines()[0]
    '``class_token`` (default None): a learned class token before'
    """
    import textwrap

    text = "; ".join(f"``{o.name}`` (default {o.default!r}): {o.about}"
                     for o in OPTIONS) + "."
    return textwrap.fill(text, width, initial_indent=" " * indent,
                         subsequent_indent=" " * indent)


def signature(function):
    """``function``'s signature with one keyword-only argument per row, at
    its default, before its ``**kwargs`` (as if written out).

    >>> def build(width, **kwargs): ...
    >>> str(signature(build)).startswith("(width, *, class_token=None, ")
    True
    """
    import inspect

    own = inspect.signature(function)
    params = list(own.parameters.values())
    rest = [p for p in params if p.kind is p.VAR_KEYWORD]
    params = [p for p in params if p.kind is not p.VAR_KEYWORD]
    rows = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY,
                              default=o.default) for o in OPTIONS]
    return own.replace(parameters=params + rows + rest)


def weight_rules(source, kinds):
    """The rules of every row's weights in ``source`` (``"timm"`` or
    ``"official"``): ``kinds[kind](path, key)`` -> the source's rules of a
    layer of that :attr:`Weight.kind`.

    >>> rules = weight_rules("timm", dict.fromkeys(
    ...     ("norm", "dense", "dense_out", "conv", "batch_norm",
    ...      "vector"),
    ...     lambda path, key: [(path, key)]))
    >>> rules[0]
    ('class_token/cls', 'cls_token')
    """
    return [rule for option in OPTIONS for weight in option.weights
            for rule in kinds[weight.kind](weight.path,
                                           getattr(weight, source))]


def choices(name):
    """The values option ``name`` accepts (for a choice).

    >>> choices("norm")
    ('layer', 'rms')
    """
    return ROWS[name].check.choices


def block_options(values, index=0):
    """The options encoder block ``index`` takes (the rows marked
    ``block``, at that block's value), from ``values`` (every row's).

    >>> values = dict(DEFAULTS, window_size=7, global_blocks=[1])
    >>> [block_options(values, i)["window_size"] for i in range(3)]
    [7, 0, 7]
    """
    return {row.name: values[row.name] if row.at_block is None
            else row.at_block(values[row.name], values, index)
            for row in OPTIONS if row.block}


def prefix_tokens(values):
    """The tokens the rows put before the patches, for ``values``."""
    return sum(int(row.tokens(values[row.name])) for row in OPTIONS
               if row.tokens is not None)


def checked(options):
    """``options`` with each row's value passed through its check."""
    return {name: ROWS[name].check(name, value) if name in ROWS else value
            for name, value in options.items()}


def read_fields(library, config, fields):
    """``{option: our value}`` of every row with a field in ``library``
    (``"timm"``, ``"transformers"`` or ``"keras_hub"``): read from
    ``config`` where the field is one of ``fields`` (those the config's
    class has), the row's default otherwise.

    >>> out = read_fields("transformers", {"use_swiglu_ffn": True,
    ...                   "layerscale_value": 1e-5, "mlp_ratio": 4},
    ...                   ("use_swiglu_ffn", "layerscale_value", "mlp_ratio"))
    >>> out["mlp"], out["layer_scale"], out["num_registers"]
    ('swiglu', 1e-05, 0)
    >>> read_fields("transformers", {"use_gated_mlp": True, "rope_theta": 1e4},
    ...             ("use_gated_mlp", "rope_theta"))["rope_temperature"]
    10000.0
    """
    out = {}
    for option in OPTIONS:
        field = getattr(option, library)
        if field is not None:
            name = field.named(fields)
            out[option.name] = (option.default if name is None
                                else field.read(config[name]))
    return out


def write_fields(library, options, fields):
    """The fields of ``library``'s config that hold ``options`` (missing
    ones at their defaults), for a class whose config has ``fields``: the
    inverse of :func:`read_fields`.

    >>> write_fields("transformers", {"mlp": "swiglu", "layer_scale": 1.0},
    ...              ("use_swiglu_ffn", "layerscale_value", "qkv_bias"))
    {'layerscale_value': 1.0, 'qkv_bias': True, 'use_swiglu_ffn': True}
    """
    out = {}
    for option in OPTIONS:
        field = getattr(option, library)
        name = None if field is None else field.named(fields)
        if name is not None:
            value = option.check(option.name,
                                 options.get(option.name, option.default))
            out[name] = field.write(value, option.name)
    return out
