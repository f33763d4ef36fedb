"""keras-hub's ViT configs read as keras_vit's builder arguments
(:func:`backbone_architecture`, :func:`task_architecture`); its variable
names both ways (:data:`VIT`); and where a preset's ``.h5`` files keep
each weight of every class of the family (:func:`family_rows`). Shared by
the readers and the writers of :mod:`keras_vit.zoo.keras_hub`.
"""

from __future__ import annotations

from keras_vit.base.checks import shown
from keras_vit.base.errors import ConfigError
from keras_vit.base.limits import MAX_CHANNELS
from keras_vit.base.schema import Object
from keras_vit.data.normalization import check_normalization, config_value
from keras_vit.zoo import formats, layouts
from keras_vit.zoo.layouts import Layout, Rule

# Where a preset keeps its metadata, and keras_vit its class names.
METADATA_FILE = "metadata.json"
# keras-hub's head activations -> keras_vit's classifier_activation.
ACTIVATIONS = {None: None, "linear": None, "softmax": "softmax",
                "sigmoid": "sigmoid"}


def image_grid(config, path, where="config"):
    """``(height, width, channels, patch)`` of a keras-hub config's
    ``image_shape`` and ``patch_size``, checked as keras_vit builds them;
    else a FormatError naming ``path`` and the field below ``where``."""
    shape = list(config["image_shape"])
    if config.get("data_format") == "channels_first":  # (c, h, w)
        shape = shape[1:] + shape[:1]
    if None in shape or shape[2] > MAX_CHANNELS:
        raise formats.fail(path, f"{where}.image_shape", "expected [height, "
                           "width, channels] of a fixed size, at most "
                           f"{MAX_CHANNELS} channels; received image_shape="
                           f"{shown(config['image_shape'])}")
    height, width, channels = shape
    patch = config["patch_size"]
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    hidden, heads = config["hidden_dim"], config["num_heads"]
    for field, bad, problem in (
            ("patch_size", patch[0] != patch[1], "keras_vit cuts square "
             f"patches only; received patch_size={list(patch)}"),
            ("patch_size", height % patch[0] or width % patch[0],
             f"expected a divisor of the image sides {[height, width]}; "
             f"received patch_size={patch[0]}"),
            ("num_heads", hidden % heads, "expected an integer that divides "
             f"hidden_dim={hidden}; received num_heads={heads}")):
        if bad:
            raise formats.fail(path, f"{where}.{field}", problem)
    return height, width, channels, patch[0]


def backbone_architecture(config, path):
    """A keras-hub ``ViTBackbone`` config (``get_config()``, or the
    ``config`` object of a preset's ``config.json``) checked
    (:data:`~keras_vit.zoo.formats.KERAS_HUB_BACKBONE`) and read as
    keras_vit's facts of the backbone alone (no head, every token out),
    ``config`` the checked config; ``path`` names the source in errors."""
    config = formats.check(formats.KERAS_HUB_BACKBONE, config, path, "config")
    height, width, channels, patch = image_grid(config, path)
    token = config.get("use_class_token", True)
    return {"kind": "backbone", "hidden_size": config["hidden_dim"],
            "num_layers": config["num_layers"],
            "num_heads": config["num_heads"], "mlp_dim": config["mlp_dim"],
            "image_size": height if height == width else (height, width),
            "patch_size": patch, "num_channels": channels,
            "layer_norm_epsilon": float(config.get("layer_norm_epsilon",
                                                   1e-6)),
            "gelu": "exact",
            "dropout_rate": float(config.get("dropout_rate", 0.0)),
            "attention_dropout_rate": float(config.get("attention_dropout",
                                                       0.0)),
            "class_token": token, "classifier": "token" if token else "gap",
            "num_classes": None, "representation_size": None,
            "classifier_activation": None, "config": config}


# A family member's task (DeiTImageClassifier's config): the ViT's, less
# the representation layer.
FAMILY_TASK = Object({k: v for k, v in formats.KERAS_HUB_TASK.fields.items()
                      if k != "intermediate_dim"}, required=("num_classes",),
                     extra="refuse", what="a DeiTImageClassifier config")


def task_architecture(config, arch, path):
    """``arch`` of a backbone completed by its task's config (checked):
    ``kind``, ``classifier``, ``num_classes``, ``representation_size``,
    ``classifier_activation``. What keras_vit pools differently is refused
    by name."""
    spec = FAMILY_TASK if arch.get("family") else formats.KERAS_HUB_TASK
    config = formats.check(spec, config, path, "config")
    pooling = config.get("pooling", "token")
    class_token = arch["classifier"] == "token"
    if pooling == "token" and not class_token:
        raise ConfigError(path, "pooling", "pooling='token' without a class "
                          "token (use_class_token=false) pools the first "
                          "patch, which keras_vit does not do")
    if pooling == "gap" and class_token:
        raise ConfigError(path, "pooling", "pooling='gap' with a class token "
                          "averages it with the patches; keras_vit's 'gap' "
                          "models have no class token")
    return dict(arch, kind="classifier", num_classes=config["num_classes"],
                classifier=pooling,
                representation_size=config.get("intermediate_dim"),
                classifier_activation=ACTIVATIONS[config.get("activation")])


def check_image_converter(config, path):
    """The input normalisation an image converter applies to [0, 255]
    pixels (``x * scale + offset``): None for the official [-1, 1], else
    ``{"mean": [...], "std": [...]}`` of [0, 1] pixels. Refuses, naming
    the file and field, a converter without a positive scale and an
    offset."""
    config = formats.check(formats.KERAS_HUB_IMAGE_CONVERTER, config, path,
                           "config")
    channels = []
    for key in ("scale", "offset"):
        value = config.get(key)
        values = value if isinstance(value, (list, tuple)) else [value]
        if value is None or (key == "scale" and not all(  # numbers: checked
                v > 0 for v in values)) or len(values) not in (1, 3):
            raise ConfigError(
                path, "config", f"the model expects inputs prepared with "
                f"{key}={shown(value)}; keras_vit reads a positive scale "
                "and an offset, one or one per channel")
        values = [float(v) for v in values]
        channels.append(values * 3 if len(values) == 1 else values)
    # x * scale + offset == (x / 255 - mean) / std.
    std = [1 / (255 * s) for s in channels[0]]
    mean = [-o * s for o, s in zip(channels[1], std)]
    try:
        normalization = check_normalization("image converter scale/offset",
                                            {"mean": mean, "std": std})
    except ValueError as e:
        raise ConfigError(path, "config", str(e)) from None
    return config_value(normalization)


_EMB = "vit_patching_and_embedding/"


def _keras(path, key, norm=False):
    """A Keras layer's two variables under both names."""
    names = ("gamma", "beta") if norm else ("kernel", "bias")
    return [Rule(f"{path}/{n}", f"{key}/{n}") for n in names]


_B, _HB = "encoder_block_{i}/", "vit_encoder/transformer_block_{i+1}/"
#: keras-hub's ``ViTBackbone`` / ``ViTImageClassifier`` variables (as a
#: live model names them) on the model's.
VIT = Layout("keras-hub", [
    Rule("class_token/cls", _EMB + "class_token"),
    *_keras("patch_embedding/conv", _EMB + "patch_embedding"),
    Rule("position_embedding/pos_embedding",
         _EMB + "position_embedding/embeddings", "table"),
    *_keras(_B + "norm_1", _HB + "ln_1", norm=True),
    *[r for part in ("query", "key", "value") for r in _keras(
        f"{_B}attention/{part}", f"{_HB}mha/{part}")],
    *_keras(_B + "attention/out", _HB + "mha/attention_output"),
    *_keras(_B + "norm_2", _HB + "ln_2", norm=True),
    *_keras(_B + "mlp/dense_0", _HB + "mlp/dense_1"),
    *_keras(_B + "mlp/dense_1", _HB + "mlp/dense_2"),
    *_keras("encoder_norm", "vit_encoder/ln", norm=True),
    *_keras("pre_logits", "pre_logits"),
    *_keras("head", "predictions"),
])


def _vit_rows(arch, task=False):
    """:func:`family_rows` of keras-hub's ViT ``arch`` (its class token
    read as a member's option)."""
    return family_rows("ViTBackbone", dict(
        arch, options={"class_token": arch["class_token"]}), task)


def expected_shapes(arch):
    """keras-hub's variable paths and shapes for ``arch``."""
    rows = list(_vit_rows(arch).values())
    if arch["kind"] == "classifier":
        rows += _vit_rows(arch, task=True).values()
    return {VIT.key_of(key): shape for key, _, shape in rows}


def with_zero_biases(state, arch):
    """keras-hub's ViT weights (``{variable path: array}``) with the
    biases keras-hub was built without as zeros."""
    built = expected_shapes(arch)
    biased = expected_shapes(dict(arch, config=dict(
        arch["config"], use_patch_bias=True, use_mha_bias=True,
        use_mlp_bias=True)))
    return layouts.with_zeros(state, {k: shape for k, shape in biased.items()
                                      if k not in built})


def h5_names(arch, task):
    """keras-hub variable path -> the dataset path in a preset's
    ``model.weights.h5`` (``task``: False) or ``task.weights.h5`` (True)."""
    return {VIT.key_of(key): "layers/" + name
            for name, (key, _, _) in _vit_rows(arch, task).items()}


# -- where each class's preset keeps its weights ---------------------------
# Keras' .weights.h5 names a variable "<layer path>/vars/<i>". Rows: h5
# path below "layers/" -> (the model's variable path, None for a weight
# keras_vit does not read; how the array changes: None as it is, "table"
# (N, D) -> (1, N, D), "token" (D,) -> (1, 1, D), "dino" DINOv2's table,
# "ids" the table's rows by token, "fit:<code>" reshaped, "gate" / "up"
# the halves of the packed SwiGLU Dense; a shape code of family_shapes).

def _vars(group, *rows):
    return {f"{group}/vars/{i}": row for i, row in enumerate(rows)}


def _norm(group, path):
    return _vars(group, (f"{path}/gamma", None, "d"),
                 (f"{path}/beta", None, "d"))


def _dense(group, key, kernel, bias):
    return _vars(group, (f"{key}/kernel", None, kernel),
                 (f"{key}/bias", None, bias))


def _attention(group, key="attention/"):
    rows = {}
    for part in ("query", "key", "value"):
        rows.update(_dense(f"{group}/{part}_dense", key + part, "qkv", "hd"))
    return {**rows, **_dense(f"{group}/output_dense", key + "out", "out", "d")}


def _flat_attention(group, key="attention/"):
    """:func:`_attention` of plain Dense layers (DINOv3's), split into the
    model's heads."""
    rows = {}
    for part, name, heads in (("query", "query", "fit:hd"),
                              ("key", "key", "fit:hd"),
                              ("value", "value", "fit:hd"),
                              ("output", "out", None)):
        rows.update(_vars(
            f"{group}/{part}_dense",
            (f"{key}{name}/kernel", "fit:" + ("out" if heads is None
                                              else "qkv"), "dd"),
            (f"{key}{name}/bias", heads, "d")))
    return rows


def _mlp(fc1, fc2, key="mlp/"):
    return {**_dense(fc1, key + "dense_0", "dm", "m"),
            **_dense(fc2, key + "dense_1", "md", "d")}


def _patches(group, bias=True):
    rows = [("patch_embedding/conv/kernel", None, "conv")]
    if bias:
        rows.append(("patch_embedding/conv/bias", None, "d"))
    return _vars(group, *rows)


_POSEMB, _MAP = "position_embedding/pos_embedding", "pooling/"
_CLS, _REG = "class_token/cls", "register_tokens/registers"
_NORM, _VIT = "encoder_norm", "vi_t_patching_and_embedding"
_POOL = "sig_lip_multi_head_attention_pooling"
# The rows of the table each token adds (integers, stored with weights).
_IDS = ("position_ids", "ids", "ids")
#: keras-hub class -> the rows of its weights outside the blocks.
FAMILY_TOP = {
    "ViTBackbone": {
        **_patches(_VIT + "/patch_embedding"),
        **_vars(_VIT, (_CLS, None, "cls")),
        **_vars(_VIT + "/position_embedding", (_POSEMB, "table", "table")),
        **_norm("vi_t_encoder/layer_norm", _NORM)},
    "DeiTBackbone": {
        **_patches("dei_t_embeddings/patch_embedding"),
        # The distillation token rides as a register (keras_hub_family).
        **_vars("dei_t_embeddings", (_CLS, None, "cls"),
                (_REG, None, "cls"), (_POSEMB, None, "posemb")),
        **_norm("dei_t_encoder/layer_norm", _NORM)},
    "DINOV2Backbone": {  # and its tokens: _dino_tokens
        **_patches("dinov2_embedding/patch_embeddings/projection"),
        **_norm("layer_normalization", _NORM)},
    "DINOV3Backbone": {  # and its tokens: _dino_tokens
        **_patches("dinov3_embedding/patch_embeddings/projection"),
        **_norm("layer_normalization", _NORM)},
    "SigLIPVisionEncoder": {
        **_patches("sig_lip_vision_embedding/patch_embedding"),
        **_vars("sig_lip_vision_embedding/position_embedding",
                (_POSEMB, "table", "table")),
        **_vars("sig_lip_vision_embedding", _IDS),
        **_norm("layer_normalization", _NORM),
        **_vars(_POOL, (_MAP + "probe", None, "cls")),
        **_attention(f"{_POOL}/attention", _MAP),
        **_norm(f"{_POOL}/layer_norm", _MAP + "norm"),
        **_mlp(f"{_POOL}/mlp/fc1", f"{_POOL}/mlp/fc2", _MAP + "mlp/")},
    "CLIPVisionEncoder": {
        **_patches("clip_vision_embedding/patch_embedding", bias=False),
        **_vars("clip_vision_embedding/position_embedding",
                (_POSEMB, "table", "table")),
        **_vars("clip_vision_embedding", (_CLS, "token", "d"), _IDS),
        **_norm("layer_normalization", "pre_norm"),
        **_norm("layer_normalization_1", _NORM)},
}
#: keras-hub class -> (the h5 group of block i, "_i" added from the
#: second; the rows of a block).
FAMILY_BLOCKS = {
    "ViTBackbone": ("vi_t_encoder/encoder_layers/vi_t_encoder_block", {
        **_norm("layer_norm_1", "norm_1"), **_attention("mha"),
        **_norm("layer_norm_2", "norm_2"),
        **_mlp("mlp/dense_1", "mlp/dense_2")}),
    "DeiTBackbone": ("dei_t_encoder/encoder_layers/dei_t_encoder_block", {
        **_norm("layer_norm_1", "norm_1"), **_attention("mha"),
        **_norm("layer_norm_2", "norm_2"),
        **_mlp("mlp/dense", "output_layer/dense")}),
    "DINOV2Backbone": ("dinov2_encoder/layers/dinov2_layer", {
        **_norm("norm1", "norm_1"), **_attention("attention/attention"),
        **_norm("norm2", "norm_2"), **_mlp("mlp/fc1", "mlp/fc2"),
        **_vars("layer_scale1", ("layer_scale_1", None, "d")),
        **_vars("layer_scale2", ("layer_scale_2", None, "d"))}),
    "DINOV3Backbone": ("dinov3_encoder/layers/dinov3_layer", {
        **_norm("norm1", "norm_1"), **_flat_attention("attention"),
        **_norm("norm2", "norm_2"), **_mlp("mlp/up_proj", "mlp/down_proj"),
        **_vars("layer_scale1", ("layer_scale_1", None, "d")),
        **_vars("layer_scale2", ("layer_scale_2", None, "d"))}),
    "SigLIPVisionEncoder": ("sig_lip_encoder_layer", {
        **_norm("layer_norm1", "norm_1"), **_attention("self_attn"),
        **_norm("layer_norm2", "norm_2"), **_mlp("mlp/fc1", "mlp/fc2")}),
    "CLIPVisionEncoder": ("clip_encoder_layer", {
        **_norm("layer_norm_1", "norm_1"), **_attention("attention"),
        **_norm("layer_norm_2", "norm_2"), **_mlp("dense_1", "dense_2")}),
}
#: A DINOV2Backbone's MLP under ``use_swiglu_ffn``: one packed Dense.
DINO_SWIGLU = {**_dense("mlp/weights_in", "mlp/dense_0", "dg", "g"),
               **_dense("mlp/weights_out", "mlp/dense_1", "md", "d")}
#: A DINOV3Backbone's under ``use_gated_mlp``: ``gate_proj`` and
#: ``up_proj``, the halves of keras_vit's packed Dense; then ``down_proj``.
DINO3_GATED = {
    **_vars("mlp/gate_proj", ("mlp/dense_0/kernel", "gate", "dm"),
            ("mlp/dense_0/bias", "gate", "m")),
    **_vars("mlp/up_proj", ("mlp/dense_0/kernel", "up", "dm"),
            ("mlp/dense_0/bias", "up", "m")),
    **_dense("mlp/down_proj", "mlp/dense_1", "md", "d")}
#: keras-hub class -> (its config's field of the gated MLP, the rows that
#: then replace the block's ``mlp/`` ones).
GATED_MLP = {"DINOV2Backbone": ("use_swiglu_ffn", DINO_SWIGLU),
             "DINOV3Backbone": ("use_gated_mlp", DINO3_GATED)}
#: A classifier's task.weights.h5: its head, after ``pre_logits`` where
#: it has one.
FAMILY_HEAD = _dense("dense", "head", "dn", "n")
PRE_LOGITS_HEAD = {**_dense("dense", "pre_logits", "dr", "r"),
                   **_dense("dense_1", "head", "rn", "n")}
# The weights a config's flags (default True) leave out: flag -> how the
# variable paths it drops start and end.
_FLAGS = {"use_class_token": ("class_token/", ""),
          "use_patch_bias": ("patch_embedding/", "/bias"),
          "use_mha_bias": ("attention/", "/bias"),
          "use_mlp_bias": ("mlp/", "/bias"),
          **{f"use_{part}_bias": (f"attention/{key}/", "/bias") for part, key
             in (("query", "query"), ("key", "key"), ("value", "value"),
                 ("proj", "out"))}}


def _built(rows, config):
    """``rows`` but those of the weights ``config``'s flags turn off."""
    off = [ends for flag, ends in _FLAGS.items() if not config.get(flag, True)]
    return {k: row for k, row in rows.items() if not any(
        row[0] and row[0].startswith(start) and row[0].endswith(end)
        for start, end in off)}


#: DINOv2's and DINOv3's embedding layers: (its h5 group, the shape code
#: of its mask token, the rows of the tables after its tokens).
_DINO_EMBEDDINGS = {
    "DINOV2Backbone": ("dinov2_embedding", "mask", (
        (None, None, "grid_table"),  # keras-hub recomputes it at load
        (_POSEMB, "dino", "pe_table"))),
    "DINOV3Backbone": ("dinov3_embedding", "cls", ()),  # rotary: no table
}


def _dino_tokens(class_name, config):
    """A DINOv2's or DINOv3's embedding variables in Keras' order, as its
    config builds them."""
    group, mask, tables = _DINO_EMBEDDINGS[class_name]
    rows = [(_CLS, None, "cls")]
    if config["use_mask_token"]:
        rows.append((None, None, mask))  # masked pretraining only
    if config["num_register_tokens"]:
        rows.append((_REG, None, "reg"))
    return _vars(group, *rows, *tables)


def family_shapes(arch):
    """The shape of each code of the family's rows, for ``arch``."""
    d, m, h = arch["hidden_size"], arch["mlp_dim"], arch["num_heads"]
    p, c, size = arch["patch_size"], arch["num_channels"], arch["image_size"]
    rows, cols = (size, size) if isinstance(size, int) else size
    grid = (rows // p) * (cols // p)
    options = arch["options"]
    registers = options.get("num_registers", 0)
    prefix = (int(options.get("class_token", True)) + registers
              if options.get("posemb_includes_prefix", True) else 0)
    pe = arch.get("table_shape", (rows, cols))
    n, r = arch["num_classes"] or 0, arch["representation_size"] or 0
    return {"d": (d,), "m": (m,), "dm": (d, m), "md": (m, d), "dd": (d, d),
            "g": (2 * m,), "dg": (d, 2 * m),
            "qkv": (d, h, d // h), "hd": (h, d // h), "out": (h, d // h, d),
            "conv": (p, p, c, d), "cls": (1, 1, d), "reg": (1, registers, d),
            "posemb": (1, grid + prefix, d), "table": (grid + prefix, d),
            "ids": (1, grid + prefix), "mask": (1, d),
            "grid_table": (1, grid + 1, d),
            "pe_table": (1, (pe[0] // p) * (pe[1] // p) + 1, d),
            "dn": (d, n), "n": (n,), "dr": (d, r), "r": (r,), "rn": (r, n)}


def family_rows(class_name, arch, task=False):
    """h5 path below ``layers/`` -> (variable path or None, how, shape) of
    every weight in the ``model.weights.h5`` (``task``: the
    ``task.weights.h5``) of a preset of ``class_name`` and ``arch``, less
    those its config's flags turn off.

    >>> from keras_vit.zoo.keras_hub.family import architecture
    >>> name, arch, _ = architecture("CLIPVisionEncoder", dict(
    ...     patch_size=16, num_layers=1, num_heads=2, hidden_dim=32,
    ...     intermediate_dim=64), "config.json")
    >>> family_rows(name, arch)["clip_vision_embedding/vars/0"]
    ('class_token/cls', 'token', (32,))
    """
    shapes, config = family_shapes(arch), arch["config"]
    if task:
        rows = PRE_LOGITS_HEAD if arch["representation_size"] else FAMILY_HEAD
    else:
        rows = _built(FAMILY_TOP[class_name], config)
        if class_name in _DINO_EMBEDDINGS:
            rows.update(_dino_tokens(class_name, config))
        group, block = FAMILY_BLOCKS[class_name]
        gated, gated_rows = GATED_MLP.get(class_name, (None, None))
        if config.get(gated):
            block = {k: v for k, v in block.items()
                     if not k.startswith("mlp/")}
            block.update(gated_rows)
        block = _built(block, config)
        for i in range(arch["num_layers"]):
            name = group + (f"_{i}" if i else "")
            rows.update({f"{name}/{k}": (f"encoder_block_{i}/{key}", how,
                                         code)
                         for k, (key, how, code) in block.items()})
    return {k: (key, how, shapes[code]) for k, (key, how, code)
            in rows.items()}
