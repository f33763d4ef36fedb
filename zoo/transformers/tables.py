"""The tensor names and config defaults of transformers' other ViT-family
towers, as data (read by :mod:`keras_vit.zoo.transformers.family`, written
by :mod:`keras_vit.zoo.transformers.writer`): per model type
(:data:`FAMILIES`), per class (:data:`ARCHITECTURES`), and the tensors one
folder holds (:func:`rows_of`, :func:`expected_shapes`, :func:`layout`).
"""

from __future__ import annotations

from keras_vit.zoo.layouts import Layout, Rule

#: How transformers resizes a learned position table (torch's bicubic,
#: a=-0.75, without antialiasing; a family's ``resize`` where it differs).
TABLE_RESIZE = "bicubic"

# -- tensor names -------------------------------------------------------------
# transformers' name -> (the model's variable path, the form of
# keras_vit.zoo.layouts.FORMS or "table", the shape code of shape_codes).
# A tuple of names: tensors joined along their first axis into one
# variable.


def _attention(query, key, value, out):
    """The attention's rows, given the four Linear layers' names."""
    table = {}
    for part, name in (("query", query), ("key", key), ("value", value),
                       ("out", out)):
        table[f"{name}.weight"] = (
            f"attention/{part}/kernel",
            "linear_out" if part == "out" else "linear", "dd")
        table[f"{name}.bias"] = (f"attention/{part}/bias", "flat", "d")
    return table


def _norm(name, path):
    return {f"{name}.weight": (f"{path}/gamma", "same", "d"),
            f"{name}.bias": (f"{path}/beta", "same", "d")}


def _mlp(fc1, fc2, first="m"):
    return {f"{fc1}.weight": ("mlp/dense_0/kernel", "linear", first + "d"),
            f"{fc1}.bias": ("mlp/dense_0/bias", "same", first),
            f"{fc2}.weight": ("mlp/dense_1/kernel", "linear", "dm"),
            f"{fc2}.bias": ("mlp/dense_1/bias", "same", "d")}


_VIT_ATTENTION = _attention(*(f"attention.attention.{part}" for part in (
    "query", "key", "value")), "attention.output.dense")
_VIT_LAYER = {**_VIT_ATTENTION, **_norm("layernorm_before", "norm_1"),
              **_norm("layernorm_after", "norm_2"),
              **_mlp("intermediate.dense", "output.dense")}  # DeiT's: ViT's
_DINO_LAYER = {**_VIT_ATTENTION, **_norm("norm1", "norm_1"),
               **_norm("norm2", "norm_2"), **_mlp("mlp.fc1", "mlp.fc2"),
               "layer_scale1.lambda1": ("layer_scale_1", "same", "d"),
               "layer_scale2.lambda1": ("layer_scale_2", "same", "d")}
# DINOv2's SwiGLU MLP (use_swiglu_ffn): one packed Linear, gate first.
_DINO_SWIGLU = _mlp("mlp.weights_in", "mlp.weights_out", first="g")
_DINO3_LAYER = {**_attention(*(f"attention.{p}_proj" for p in "qkvo")),
                **{k: v for k, v in _DINO_LAYER.items()
                   if not k.startswith(("attention.", "mlp."))},
                **_mlp("mlp.up_proj", "mlp.down_proj")}


def _gated(module):
    """A gated MLP's rows (``module``: its name); keras_vit's
    mlp="swiglu" packs gate_proj and up_proj into one Dense, gate first."""
    return {
        **{tuple(f"{module}.{n}_proj.{kind}" for n in ("gate", "up")): (
            f"mlp/dense_0/{path}", form, shape)
           for kind, path, form, shape in (
               ("weight", "kernel", "linear", "md"),
               ("bias", "bias", "same", "m"))},
        **{k: v for k, v in _mlp(f"{module}.up_proj",
                                 f"{module}.down_proj").items()
           if k.startswith(f"{module}.down")}}


_DINO3_GATED = _gated("mlp")
_CLIP_LAYER = {**_attention(*(f"self_attn.{p}_proj" for p in (
    "q", "k", "v", "out"))), **_norm("layer_norm1", "norm_1"),
               **_norm("layer_norm2", "norm_2"),
               **_mlp("mlp.fc1", "mlp.fc2")}  # SigLIP's names
# AIMv2's: RMSNorms (a weight, no bias), its MLP the gated one.
_AIMV2_LAYER = {**_attention(*(f"attention.{p}_proj" for p in (
    "q", "k", "v", "out"))), "rms_norm1.weight": ("norm_1/gamma", "same", "d"),
                "rms_norm2.weight": ("norm_2/gamma", "same", "d")}
_ENCODER_NORM = "encoder_norm"
_VIT_TOP = {"embeddings.cls_token": ("class_token/cls", "same", "cls"),
            "embeddings.position_embeddings": (
                "position_embedding/pos_embedding", "same", "posemb"),
            "embeddings.patch_embeddings.projection.weight": (
                "patch_embedding/conv/kernel", "conv", "conv"),
            "embeddings.patch_embeddings.projection.bias": (
                "patch_embedding/conv/bias", "same", "d"),
            **_norm("layernorm", _ENCODER_NORM)}
_DINO_TOP = {**_VIT_TOP, "embeddings.register_tokens": (
    "register_tokens/registers", "same", "reg"),
             "embeddings.mask_token": (None, None, "mask")}
# DINOv3's: no position table (rotary embeddings), a mask token (1, 1, D).
_DINO3_TOP = {**{k: v for k, v in _DINO_TOP.items() if k.startswith((
    "embeddings.cls", "embeddings.reg"))},
              "embeddings.mask_token": (None, None, "cls"),
              "embeddings.patch_embeddings.weight": (
                  "patch_embedding/conv/kernel", "conv", "conv"),
              "embeddings.patch_embeddings.bias": (
                  "patch_embedding/conv/bias", "same", "d"),
              **_norm("norm", _ENCODER_NORM)}
# AIMv2's: the patch norm, a table of the patches alone and, with
# use_head, its attention-pooling head (the cls_token is the probe).
_AIMV2_TOP = {
    "embeddings.patch_embed.weight": ("patch_embedding/conv/kernel", "conv",
                                      "conv"),
    "embeddings.patch_embed.bias": ("patch_embedding/conv/bias", "same",
                                    "d"),
    "embeddings.rms_norm.weight": ("patch_embedding/norm/gamma", "same", "d"),
    "embeddings.position_embedding.weight": (
        "position_embedding/pos_embedding", "table", "patches"),
    "rms_norm.weight": (f"{_ENCODER_NORM}/gamma", "same", "d"),
    "head.cls_token": ("pooling/probe", "same", "cls"),
    **{f"head.{p[0]}_proj.{kind}": (f"pooling/{p}/{path}", form, shape)
       for p in ("key", "value") for kind, path, form, shape in (
           ("weight", "kernel", "linear", "dd"),
           ("bias", "bias", "flat", "d"))},
    "head.output_proj.weight": ("pooling/out/kernel", "linear_out", "dd"),
    "head.output_proj.bias": ("pooling/out/bias", "same", "d")}
_CLIP_TOP = {"embeddings.class_embedding": ("class_token/cls", "flat", "d"),
             "embeddings.patch_embedding.weight": (
                 "patch_embedding/conv/kernel", "conv", "conv"),
             "embeddings.position_embedding.weight": (
                 "position_embedding/pos_embedding", "table", "table"),
             **_norm("pre_layrnorm", "pre_norm"),
             **_norm("post_layernorm", _ENCODER_NORM)}


def _linear(name, path, rows="labels", columns="d"):
    return {f"{name}.weight": (f"{path}/kernel", "linear", rows + columns),
            f"{name}.bias": (f"{path}/bias", "same", rows)}


_POOLER = _linear("pooler.dense", "pre_logits", "r")
#: transformers' ``ViTModel`` / ``ViTForImageClassification`` tensors, as
#: the rows of :data:`FAMILIES` (DeiT's are the same, less the head).
VIT = dict(layers="encoder.layer.", layer=_VIT_LAYER,
           top={**_VIT_TOP, **_POOLER}, head=_linear("classifier", "head"))


def rules(layer, top, head, prefix, layers):
    """The :class:`~keras_vit.zoo.layouts.Rule` of each row: the block
    rows ``layer`` under ``prefix + layers + "{i}."``, the rows ``top``
    under ``prefix``, the head's as named."""
    blocks = prefix + layers + "{i}."
    return [*[Rule("encoder_block_{i}/" + path,
                   [blocks + n for n in names(name)], form)
              for name, (path, form, _) in layer.items()],
            *[Rule(path, prefix + name, form)
              for name, (path, form, _) in top.items() if path is not None],
            *[Rule(path, name, form) for name, (path, form, _) in head.items()]]


def names(row):
    """The tensor names of a table's row key (one name or a tuple)."""
    return (row,) if isinstance(row, str) else row


_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, image_size=224, patch_size=16,
                 num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12,
                 qkv_bias=True, head_dim=None)
_DINO_DEFAULTS = dict(_DEFAULTS, patch_size=14, layer_norm_eps=1e-6,
                      mlp_ratio=4, layerscale_value=1.0, use_swiglu_ffn=False)
# DINOv3ViTConfig's (no qkv_bias: a field per projection's bias).
_DINO3_DEFAULTS = dict(
    {k: v for k, v in _DEFAULTS.items() if k != "qkv_bias"},
    hidden_size=384, intermediate_size=1536, num_attention_heads=6,
    layer_norm_eps=1e-5, rope_theta=100.0, query_bias=True, key_bias=False,
    value_bias=True, proj_bias=True, mlp_bias=True, layerscale_value=1.0,
    use_gated_mlp=False, num_register_tokens=0)
# Per option row of biases: its config fields, each with the tensors it
# keeps. The row is on where any field is (a bias left out is zeros).
_VIT_BIASES = {"qkv_bias": {"qkv_bias": tuple(
    f"attention.attention.{p}.bias" for p in ("query", "key", "value"))}}
_DINO3_BIASES = {
    "qkv_bias": {f"{p}_bias": (f"attention.{p[0]}_proj.bias",)
                 for p in ("query", "key", "value")},
    "proj_bias": {"proj_bias": ("attention.o_proj.bias",),
                  "mlp_bias": tuple(f"mlp.{n}_proj.bias"
                                    for n in ("gate", "up", "down"))}}
# AIMv2VisionConfig's (its norms' epsilon is rms_norm_eps).
_AIMV2_DEFAULTS = dict(
    {k: v for k, v in _DEFAULTS.items() if k != "layer_norm_eps"},
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
    num_attention_heads=8, patch_size=14, hidden_act="silu",
    rms_norm_eps=1e-5, qkv_bias=False, mlp_bias=False, use_head=True,
    is_native=False)
# AIMv2's two bias fields each bias layers of both of keras_vit's rows.
_AIMV2_BIASES = {
    "qkv_bias": {"qkv_bias": (*(f"attention.{p}_proj.bias" for p in "qkv"),
                              "head.k_proj.bias", "head.v_proj.bias"),
                 "mlp_bias": ()},
    "proj_bias": {"qkv_bias": ("attention.out_proj.bias",),
                  "mlp_bias": tuple(f"ffn.{n}_proj.bias"
                                    for n in ("gate", "up", "down"))}}
#: Per model type: the config's defaults, where the blocks are
#: (``layers``), the names of their tensors (``swiglu``: the gated MLP's)
#: and of the others; ``biases``: the bias rows' fields and tensors;
#: ``gate``: the ``hidden_act`` values its gated MLP computes (none: SiLU
#: whatever it says); ``square``: one image side (DINOv2's embeddings
#: interpolate their table as a square grid at every call, which a
#: non-square one is not); ``epsilon``: the norms'
#: epsilon field; ``fixed``: fields keras_vit computes at one value only.
FAMILIES = {
    "deit": dict(defaults=_DEFAULTS, layers="encoder.layer.",
                 layer=_VIT_LAYER, biases=_VIT_BIASES, top={
                     **_VIT_TOP, **_POOLER, "embeddings.distillation_token": (
                         "distillation_token/registers", "same", "cls")}),
    "dinov2": dict(defaults=_DINO_DEFAULTS, layers="encoder.layer.",
                   layer=_DINO_LAYER, top=_DINO_TOP, swiglu=_DINO_SWIGLU,
                   biases=_VIT_BIASES, square=True),
    # Its interpolate_pos_encoding antialiases (DINOv2's does not).
    "dinov2_with_registers": dict(
        defaults=dict(_DINO_DEFAULTS, patch_size=16, num_register_tokens=4),
        layers="encoder.layer.", layer=_DINO_LAYER, top=_DINO_TOP,
        swiglu=_DINO_SWIGLU, biases=_VIT_BIASES, resize="bicubic_aa",
        square=True),
    "dinov3_vit": dict(defaults=_DINO3_DEFAULTS, layers="layer.",
                       layer=_DINO3_LAYER, top=_DINO3_TOP,
                       swiglu=_DINO3_GATED, biases=_DINO3_BIASES,
                       gate=("silu", "swish")),
    "clip_vision_model": dict(
        defaults={**{k: v for k, v in _DEFAULTS.items() if k != "qkv_bias"},
                  "patch_size": 32, "hidden_act": "quick_gelu",
                  "layer_norm_eps": 1e-5},
        layers="encoder.layers.", layer=_CLIP_LAYER, top=_CLIP_TOP,
        square=True),
}
FAMILIES["clip"] = FAMILIES["clip_vision_model"]
# AIMv2's image tower; a whole Aimv2Model's vision_config is the same.
FAMILIES["aimv2_vision_model"] = FAMILIES["aimv2"] = dict(
    defaults=_AIMV2_DEFAULTS, layers="encoder.layers.", layer=_AIMV2_LAYER,
    top=_AIMV2_TOP, swiglu=_gated("ffn"), biases=_AIMV2_BIASES,
    gate=("silu", "swish"), square=True, epsilon="rms_norm_eps",
    fixed={"is_native": (False, (
        "AIMv2's native-resolution towers add a sin-cos table of "
        "frequencies 10000 ** (-k / (D / 4)), which keras_vit's sincos_2d, "
        "10000 ** (-k / (D / 4 - 1)), does not compute"))})
# MetaCLIP 2's towers are CLIP's, tensor for tensor and field for field.
FAMILIES["metaclip_2_vision_model"] = FAMILIES["metaclip_2"] = FAMILIES[
    "clip_vision_model"]
#: The model types of a whole image-text model, whose image tower is read.
WHOLE_MODELS = ("clip", "metaclip_2", "aimv2")

# The classes read, with their model type, the tensors' prefix (None:
# "vision_model." or none), their head's tensors and builder options.
_CLIP_OPTIONS = dict(pre_norm=True, patch_bias=False, num_classes=0)
_AIMV2_OPTIONS = dict(class_token=False, norm="rms", patch_norm=True,
                      mlp="swiglu", pool_form="aimv2")
ARCHITECTURES = {
    "DeiTForImageClassificationWithTeacher": dict(
        type="deit", prefix="deit.", options=dict(distilled=True),
        head={**_linear("cls_classifier", "head"),
              **_linear("distillation_classifier", "head_dist")}),
    "DeiTForImageClassification": dict(
        type="deit", prefix="deit.", options=dict(num_registers=1),
        head=_linear("classifier", "head")),
    "DeiTModel": dict(type="deit", prefix="", options=dict(num_registers=1),
                      pooler=True),
    "Dinov2Model": dict(type="dinov2", prefix="",
                        options=dict(num_classes=0)),
    "Dinov2WithRegistersModel": dict(
        type="dinov2_with_registers", prefix="",
        options=dict(num_classes=0, posemb_includes_prefix=False)),
    # Positions by DINOv3's rotary coordinates alone, at any size.
    "DINOv3ViTModel": dict(
        type="dinov3_vit", prefix="", options=dict(
            num_classes=0, rope="dinov3", position_embedding="none",
            dynamic_image_size=True)),
    "DINOv3ViTBackbone": dict(
        type="dinov3_vit", refused=(
            "it returns each stage's feature maps; load the encoder: "
            "DINOv3ViTModel.from_pretrained(src).save_pretrained(dir), "
            "then zoo.load(dir)")),
    "CLIPVisionModel": dict(type="clip_vision_model", prefix=None,
                            options=_CLIP_OPTIONS),
    "CLIPModel": dict(type="clip", prefix="vision_model.",
                      options=_CLIP_OPTIONS),
    "MetaClip2VisionModel": dict(type="metaclip_2_vision_model", prefix=None,
                                 options=_CLIP_OPTIONS),
    "MetaClip2Model": dict(type="metaclip_2", prefix="vision_model.",
                           options=_CLIP_OPTIONS),
    # attention_pool: the config field of the head and its rows' prefix.
    "Aimv2VisionModel": dict(type="aimv2_vision_model", prefix="",
                             options=_AIMV2_OPTIONS,
                             attention_pool=("use_head", "head.")),
    "Aimv2Model": dict(type="aimv2", prefix="vision_model.",
                       options=_AIMV2_OPTIONS,
                       attention_pool=("use_head", "head.")),
}
# DINOv2's classifiers read the class token beside the patches' mean
# (classifier="token_gap"): a head twice the width.
for _base in ("Dinov2Model", "Dinov2WithRegistersModel"):
    _spec = ARCHITECTURES[_base]
    ARCHITECTURES[_base.replace("Model", "ForImageClassification")] = dict(
        type=_spec["type"], prefix=_spec["type"] + ".",
        options=dict({k: v for k, v in _spec["options"].items()
                      if k != "num_classes"}, classifier="token_gap"),
        head=_linear("classifier", "head", columns="2d"))


def swiglu_width(width):
    """The features DINOv2's SwiGLU MLP gates, given the width ``width``
    of the MLP it replaces: two thirds of it, rounded up to a multiple of
    8.

    >>> swiglu_width(6144), swiglu_width(128), swiglu_width(64)
    (4096, 88, 48)
    """
    return -(-int(width * 2 / 3) // 8) * 8


def dinov2_mlp_dim(hidden_size, mlp_ratio, swiglu=False):
    """The ``mlp_dim`` of a transformers DINOv2 config:
    ``int(hidden_size * mlp_ratio)``, or :func:`swiglu_width` of it under
    ``use_swiglu_ffn`` (``swiglu``).

    >>> dinov2_mlp_dim(384, 4), dinov2_mlp_dim(1536, 4, swiglu=True)
    (1536, 4096)
    """
    width = int(hidden_size * mlp_ratio)
    return swiglu_width(width) if swiglu else width


# -- the tensors of one folder -------------------------------------------------

def rows_of(arch):
    """``(block, other, head)`` rows of the tensors ``arch`` holds, as in
    :data:`FAMILIES`."""
    family = FAMILIES[arch["type"]]
    spec = ARCHITECTURES[arch["class"]]
    layer = dict(family["layer"])
    options = with_class_options(arch["options"], spec)
    if options["mlp"] == "swiglu":  # in place of the MLP's first Linear
        layer = {k: v for k, v in layer.items() if not k.startswith("mlp.")}
        layer.update(family["swiglu"])
    dropped = {n for row, fields in family.get("biases", {}).items()
               if not options[row] for ns in fields.values() for n in ns}
    layer = {k: v for k, v in layer.items() if not dropped & set(names(k))}
    top = {k: v for k, v in family["top"].items()
           if not dropped & set(names(k))}
    if not spec.get("pooler"):
        top = {k: v for k, v in top.items() if not k.startswith("pooler.")}
    pool = spec.get("attention_pool")
    if pool and not arch.get("attention_pool"):  # no head: its rows out
        top = {k: v for k, v in top.items() if not k.startswith(pool[1])}
    if not options["num_registers"] and "embeddings.register_tokens" in top:
        # An empty (1, 0, D) tensor where the config has the field.
        top.pop("embeddings.register_tokens")
        if "num_register_tokens" in family["defaults"]:
            top["embeddings.register_tokens"] = (None, None, "reg")
    if ("embeddings.distillation_token" in top
            and not spec["options"].get("distilled")):
        top["embeddings.distillation_token"] = (
            "register_tokens/registers", "same", "cls")
    head = spec.get("head", {})
    return layer, top, head


def shape_codes(arch, num_labels=0):
    """The shapes of the tables' shape codes for ``arch``."""
    d, m, c, p = (arch["hidden_size"], arch["mlp_dim"],
                  arch["num_channels"], arch["patch_size"])
    size = arch["image_size"]
    h, w = (size, size) if isinstance(size, int) else size
    patches = (h // p) * (w // p)
    table = patches + 1 + (arch["type"] == "deit")
    return {"d": (d,), "m": (m,), "dd": (d, d), "md": (m, d), "dm": (d, m),
            "g": (2 * m,), "gd": (2 * m, d),
            "cls": (1, 1, d), "posemb": (1, table, d), "table": (table, d),
            "patches": (patches, d),
            "conv": (d, c, p, p), "reg": (1, arch["options"]["num_registers"], d),
            "mask": (1, d), "r": (arch.get("pooler"),),
            "rd": (arch.get("pooler"), d), "labels": (num_labels,),
            "labelsd": (num_labels, d), "labels2d": (num_labels, 2 * d)}


def block_shapes(arch):
    """``(held, left out)``: each block's tensors in the file, by name
    without the block's prefix, and those of the fields ``arch["off"]``
    (the reader gives them zeros)."""
    dims = shape_codes(arch)
    shapes = {n: dims[shape] for key, (_, _, shape) in rows_of(arch)[0].items()
              for n in names(key)}
    out = _left_out(arch)
    return ({n: v for n, v in shapes.items() if n not in out},
            {n: v for n, v in shapes.items() if n in out})


def _left_out(arch):
    """The tensor names (a block's without its prefix, the others'
    without the tensors' prefix) of the fields ``arch["off"]``."""
    biases = FAMILIES[arch["type"]].get("biases", {})
    return {n for fields in biases.values() for f in arch.get("off", ())
            for n in fields.get(f, ())}


def top_zeros(arch):
    """The tensors outside the blocks (prefix included) that
    ``arch["off"]`` leaves out of the file, with their shapes: the reader
    gives them zeros."""
    dims, out = shape_codes(arch), _left_out(arch)
    return {arch["prefix"] + name: dims[shape]
            for name, (_, _, shape) in rows_of(arch)[1].items()
            if name in out}


def with_class_options(options, spec):
    """``options`` with the option rows the class ``spec`` sets."""
    return dict(options, **{k: v for k, v in spec["options"].items()
                            if k in options})


def bias_fields(biases, rows):
    """Each bias field of ``biases`` (a family's table) on where a row of
    ``rows`` (option -> on) that holds it is."""
    return {field: any(rows[row] for row, fields in biases.items()
                       if field in fields)
            for parts in biases.values() for field in parts}


def bias_rows(biases, fields):
    """Each bias row of ``biases`` on where any of its fields is on in
    ``fields`` (field -> on)."""
    return {row: any(fields[f] for f in parts)
            for row, parts in biases.items()}


def expected_shapes(arch, header, num_labels):
    """transformers' tensor names (prefix included) and shapes for
    ``arch``; optional tensors (DINOv2's mask token, DeiTModel's pooler)
    are expected when ``header`` holds them."""
    _, top, head = rows_of(arch)
    dims = shape_codes(arch, num_labels)
    prefix = arch["prefix"]
    shapes = {}
    for name, (path, _, shape) in top.items():
        optional = path is None or name.startswith("pooler.")
        if name in _left_out(arch):  # zeros, not in the file
            continue
        if not optional or prefix + name in header:
            shapes[prefix + name] = dims[shape]
    layers = FAMILIES[arch["type"]]["layers"]
    for i in range(arch["num_layers"]):
        shapes.update({f"{prefix}{layers}{i}.{name}": shape
                       for name, shape in block_shapes(arch)[0].items()})
    shapes.update({name: dims[shape] for name, (_, _, shape) in head.items()})
    return shapes


def layout(arch):
    """The :class:`~keras_vit.zoo.layouts.Layout` of the tensors ``arch``
    holds (:func:`rows_of`) on the model's variables."""
    return Layout("transformers", rules(
        *rows_of(arch), arch["prefix"], FAMILIES[arch["type"]]["layers"]))
