"""The ViT family's later members by readable name: one table of data.

``DeiT-B/16``, ``DINOv2-L/14``, ``CLIP-B/16``, ... are the one
:class:`~keras_vit.models.VisionTransformer` with the family's options.
Each row of :data:`MEMBERS` says which options, at which size, where its
weights are (timm's repositories on the Hugging Face Hub), which input
normalisation and image size they expect and which labels their head
has. The facts are timm's; ``tests/zoo/test_family_registry.py`` checks
every row against timm's own model.

>>> MEMBERS["DeiT-B/16"].weights[0].source
'hf-hub:timm/deit_base_patch16_224.fb_in1k'
>>> config("DINOv2-S/14")["layer_scale"]
1e-05
"""

from __future__ import annotations

from typing import NamedTuple

# The sizes the members come in: hidden size, layers, heads, MLP width.
SIZES = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "M": (512, 12, 8, 2048),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
    # DINOv2's giant: its SwiGLU MLP leaves 4096 features.
    "g": (1536, 40, 24, 4096),
    # So400m: timm's mlp_ratio 3.7362 of 1152, truncated.
    "So400m": (1152, 27, 16, 4304),
    "g-opt": (1536, 40, 16, 6144),
    # DINOv3's own sizes (S+ runs a SwiGLU MLP).
    "S+": (384, 12, 6, 1536),
    "H+": (1280, 32, 20, 5120),
    "7B": (4096, 40, 32, 8192),
}


class Family(NamedTuple):
    """What a family sets over the 2020 ViT, for all its members.

    Attributes:
        options: keras_vit builder arguments.
        normalization: its weights' input normalisation, a name of
            :data:`keras_vit.data.normalization.NAMED`.
        about: one line for ``keras-vit info``.
    """

    options: dict
    normalization: str
    license: str
    about: str


# timm runs the exact (erf) GELU and LayerNorm epsilon 1e-6 (CLIP: 1e-5).
FAMILIES = {
    "deit": Family(
        dict(gelu="exact"), "imagenet",
        "Apache-2.0 (facebookresearch/deit)",
        "DeiT (Touvron et al. 2021): ViT trained on ImageNet-1k alone; "
        "'-distilled' adds a distillation token and head, averaged with "
        "the class head at inference"),
    "deit3": Family(
        dict(gelu="exact", posemb_includes_prefix=False, layer_scale=1e-6),
        "imagenet", "Apache-2.0 (facebookresearch/deit)",
        "DeiT III (Touvron et al. 2022): layer scale, no position "
        "embedding on the class token"),
    "dinov2": Family(
        dict(gelu="exact", layer_scale=1e-5), "imagenet",
        "Apache-2.0 (facebookresearch/dinov2)",
        "DINOv2 (Oquab et al. 2023): self-supervised features, no head "
        "(the class token's embedding); '-reg' adds 4 register tokens "
        "(Darcet et al. 2024)"),
    "clip": Family(
        dict(gelu="quick", pre_norm=True, patch_bias=False,
             layer_norm_epsilon=1e-5), "clip", "MIT (openai/CLIP)",
        "CLIP image towers (Radford et al. 2021), OpenAI's weights: the "
        "head is the image-text projection (an embedding, no labels)"),
    # timm's architectures differ in their GELU: a row option.
    "siglip": Family(
        dict(class_token=False, classifier="map"), "official",
        "Apache-2.0 (google-research/big_vision)",
        "SigLIP image towers (Zhai et al. 2023), Google's weights: no "
        "class token; the attention-pool head's output is the image "
        "embedding (no labels)"),
    "siglip2": Family(
        dict(class_token=False, classifier="map"), "official",
        "Apache-2.0 (google-research/big_vision)",
        "SigLIP 2 image towers (Tschannen et al. 2025): SigLIP's "
        "architecture trained further (captioning, self-distillation, "
        "masked prediction; multilingual); the attention-pool head's "
        "output is the image embedding (no labels)"),
    # EVA-02's rotary embeddings on the grid of its 224 px pretraining.
    "eva02": Family(
        dict(gelu="exact", class_token=True, classifier="gap", fc_norm=True,
             mlp="swiglu", rope="eva02", rope_grid=[16, 16],
             rope_temperature=10000.0),
        "clip", "MIT (baaivision/EVA)",
        "EVA-02 (Fang et al. 2023): masked image modelling of EVA-CLIP's "
        "features, rotary position embeddings beside the table, SwiGLU "
        "MLPs (B and L: a norm inside, q/k/v apart); 224 px releases are "
        "headless, the 336/448 px ones ImageNet-1k classifiers"),
    # timm's Eva in Perception Encoder's spatial configuration.
    "pe": Family(
        dict(gelu="exact", class_token=True, classifier="gap",
             final_norm=False, pre_norm=True, patch_bias=False,
             layer_norm_epsilon=1e-5, rope="eva02", rope_grid=[32, 32],
             rope_temperature=10000.0, rope_offset=1.0,
             rope_indexing="xy"), "official",
        "Apache-2.0 (facebookresearch/perception_models)",
        "Perception Encoder (Bolya et al. 2025), its spatial towers: "
        "PE's dense-task encoders, aligned to its own intermediate "
        "features and SAM 2's; no head: the patch features "
        "(intermediate_model) or their mean"),
    # Perception Encoder's core configuration (the rotary grid a row's).
    "pe_core": Family(
        dict(gelu="exact", class_token=True, classifier="map",
             pool_prefix=True, pool_heads=8, pre_norm=True,
             patch_bias=False, layer_norm_epsilon=1e-5, rope="eva02",
             rope_temperature=10000.0, rope_offset=1.0,
             rope_indexing="xy"), "official",
        "Apache-2.0 (facebookresearch/perception_models)",
        "Perception Encoder (Bolya et al. 2025), its core towers: "
        "contrastive image-text encoders; the head is the attention "
        "pool's image-text projection (an embedding, no labels)"),
    # timm's Eva in DINOv3's configuration (any image size, as timm's).
    "dinov3": Family(
        dict(gelu="exact", class_token=True, classifier="gap",
             num_registers=4, qkv_bias=False, layer_scale=1e-5,
             layer_norm_epsilon=1e-5, position_embedding="none",
             rope="dinov3", dynamic_image_size=True),
        "imagenet", "DINOv3 License (facebookresearch/dinov3)",
        "DINOv3 (Simeoni et al. 2025): self-supervised features, rotary "
        "position embeddings, 4 registers; no head: the mean of the "
        "normalised patch tokens, as timm pools (DINOv3's own heads read "
        "the class token); '-sat' rows are its satellite-imagery "
        "weights, with their own mean/std"),
    # Qwen's vision towers in timm's classifier form, without the merger.
    "qwen3_5": Family(
        dict(gelu="tanh", class_token=False, classifier="gap", fc_norm=True,
             rope="eva02", rope_halves=True, rope_temperature=10000.0,
             dynamic_image_size=True, position_resize="bilinear_corners"),
        "official",
        "Apache-2.0 (the Qwen team's Qwen3.5 release)",
        "Qwen3.5's vision towers (the image encoders of its multimodal "
        "language models): no head, the normalised mean patch token; "
        "the patch merger that feeds the language model is not part of "
        "the row"),
}


class Weights(NamedTuple):
    """One released checkpoint of a member: its timm tag, where it is,
    its head's size (0: none), the head's label list (in ``zoo/labels``,
    or None) and ``head_type``."""

    tag: str
    source: str
    num_classes: int
    labels: str | None
    head_type: str = "classifier"


class Member(NamedTuple):
    """One row: a named member of the family.

    Attributes:
        timm: timm's architecture of the same model.
        image_size: the resolution its weights were trained at.
        options: builder arguments over the family's.
        weights: its checkpoints, the default first.
        normalization: its weights' input normalisation where it is not
            the family's, else None.
    """

    family: str
    timm: str
    size: str
    patch_size: int
    image_size: int
    options: dict
    weights: tuple
    normalization: str | None = None


def _hub(arch, tag, classes, labels=None, repo=None, head_type="classifier"):
    """A checkpoint in timm's repository ``timm/<repo or arch>.<tag>``."""
    return Weights(tag, f"hf-hub:timm/{repo or arch}.{tag}", classes, labels,
                   head_type)


def _deit(arch, size, image_size=224, **options):
    return Member("deit", arch, size, 16, image_size, options,
                  (_hub(arch, "fb_in1k", 1000, "imagenet2012"),))


def _deit3(arch, size, patch=16, image_size=224):
    # Both releases; the ImageNet-21k pre-training is the more accurate.
    return Member("deit3", arch, size, patch, image_size, {}, (
        _hub(arch, "fb_in22k_ft_in1k", 1000, "imagenet2012"),
        _hub(arch, "fb_in1k", 1000, "imagenet2012")))


def _dinov2(arch, size, **options):
    return Member("dinov2", arch, size, 14, 518, options,
                  (_hub(arch, "lvd142m", 0),))


def _clip(arch, size, patch, embedding, image_size=224):
    # timm's QuickGELU architecture reads the repository of the GELU one.
    repo = arch.replace("_clip_quickgelu_", "_clip_")
    return Member("clip", arch, size, patch, image_size, {},
                  (_hub(arch, "openai", embedding, repo=repo,
                        head_type="projection"),))


def _eva02(arch, size, image_size, *tags, **options):
    # SwiGLU of two thirds of the 4x MLP; the 224 px releases are headless.
    mlp = int(SIZES[size][0] * 4 * 2 / 3)
    return Member("eva02", arch, size, 14, image_size,
                  dict(mlp_dim=mlp, **options),
                  tuple(_hub(arch, tag, 0) if image_size == 224 else
                        _hub(arch, tag, 1000, "imagenet2012")
                        for tag in tags))


def _pe_spatial(arch, size, patch, image_size):
    return Member("pe", arch, size, patch, image_size, {},
                  (_hub(arch, "fb", 0),))


def _pe_core(arch, size, patch, image_size, embedding):
    grid = image_size // patch
    return Member("pe_core", arch, size, patch, image_size,
                  dict(rope_grid=[grid, grid]),
                  (_hub(arch, "fb", embedding, head_type="projection"),))


def _dinov3(size, *tags, normalization=None):
    timm_size = {"S": "small", "S+": "small_plus", "B": "base",
                 "L": "large", "H+": "huge_plus", "7B": "7b"}[size]
    arch = f"vit_{timm_size}_patch16_dinov3"
    options = dict(mlp="swiglu") if size in ("S+", "H+", "7B") else {}
    return Member("dinov3", arch, size, 16, 256, options,
                  tuple(_hub(arch, tag, 0) for tag in tags), normalization)


def _qwen3_5(arch, size, *tags):
    return Member("qwen3_5", arch, size, 16, 768, {},
                  tuple(_hub(arch, tag, 0) for tag in tags))


def _siglip(family, arch, size, patch, image_size, gelu, *tags):
    # No classifier, but for one ImageNet-1k fine-tune.
    return Member(family, arch, size, patch, image_size, dict(gelu=gelu),
                  tuple(_hub(arch, tag, 1000, "imagenet2012")
                        if tag == "webli_ft_in1k" else _hub(arch, tag, 0)
                        for tag in tags))


_REG = dict(num_registers=4, posemb_includes_prefix=False)

#: The named members, by canonical name, grouped by family.
MEMBERS = {
    "DeiT-Ti/16": _deit("deit_tiny_patch16_224", "Ti"),
    "DeiT-S/16": _deit("deit_small_patch16_224", "S"),
    "DeiT-B/16": _deit("deit_base_patch16_224", "B"),
    "DeiT-B/16-384": _deit("deit_base_patch16_384", "B", 384),
    "DeiT-Ti/16-distilled": _deit("deit_tiny_distilled_patch16_224", "Ti",
                                  distilled=True),
    "DeiT-S/16-distilled": _deit("deit_small_distilled_patch16_224", "S",
                                 distilled=True),
    "DeiT-B/16-distilled": _deit("deit_base_distilled_patch16_224", "B",
                                 distilled=True),
    "DeiT-B/16-distilled-384": _deit("deit_base_distilled_patch16_384", "B",
                                     384, distilled=True),
    "DeiT3-S/16": _deit3("deit3_small_patch16_224", "S"),
    "DeiT3-S/16-384": _deit3("deit3_small_patch16_384", "S", image_size=384),
    "DeiT3-M/16": _deit3("deit3_medium_patch16_224", "M"),
    "DeiT3-B/16": _deit3("deit3_base_patch16_224", "B"),
    "DeiT3-B/16-384": _deit3("deit3_base_patch16_384", "B", image_size=384),
    "DeiT3-L/16": _deit3("deit3_large_patch16_224", "L"),
    "DeiT3-L/16-384": _deit3("deit3_large_patch16_384", "L", image_size=384),
    "DeiT3-H/14": _deit3("deit3_huge_patch14_224", "H", patch=14),
    "DINOv2-S/14": _dinov2("vit_small_patch14_dinov2", "S"),
    "DINOv2-B/14": _dinov2("vit_base_patch14_dinov2", "B"),
    "DINOv2-L/14": _dinov2("vit_large_patch14_dinov2", "L"),
    "DINOv2-reg-S/14": _dinov2("vit_small_patch14_reg4_dinov2", "S", **_REG),
    "DINOv2-reg-B/14": _dinov2("vit_base_patch14_reg4_dinov2", "B", **_REG),
    "DINOv2-reg-L/14": _dinov2("vit_large_patch14_reg4_dinov2", "L", **_REG),
    "DINOv2-g/14": _dinov2("vit_giant_patch14_dinov2", "g", mlp="swiglu"),
    "DINOv2-reg-g/14": _dinov2("vit_giant_patch14_reg4_dinov2", "g",
                               mlp="swiglu", **_REG),
    "CLIP-B/32": _clip("vit_base_patch32_clip_quickgelu_224", "B", 32, 512),
    "CLIP-B/16": _clip("vit_base_patch16_clip_quickgelu_224", "B", 16, 512),
    "CLIP-L/14": _clip("vit_large_patch14_clip_quickgelu_224", "L", 14, 768),
    "CLIP-L/14-336": _clip("vit_large_patch14_clip_quickgelu_336", "L", 14,
                           768, image_size=336),
    "EVA02-Ti/14": _eva02("eva02_tiny_patch14_224", "Ti", 224, "mim_in22k"),
    "EVA02-Ti/14-336": _eva02("eva02_tiny_patch14_336", "Ti", 336,
                              "mim_in22k_ft_in1k"),
    "EVA02-S/14": _eva02("eva02_small_patch14_224", "S", 224, "mim_in22k"),
    "EVA02-S/14-336": _eva02("eva02_small_patch14_336", "S", 336,
                             "mim_in22k_ft_in1k"),
    "EVA02-B/14": _eva02("eva02_base_patch14_224", "B", 224, "mim_in22k",
                         mlp_norm=True),
    "EVA02-B/14-448": _eva02("eva02_base_patch14_448", "B", 448,
                             "mim_in22k_ft_in22k_in1k", "mim_in22k_ft_in1k",
                             mlp_norm=True),
    "EVA02-L/14": _eva02("eva02_large_patch14_224", "L", 224, "mim_m38m",
                         "mim_in22k", mlp_norm=True),
    "EVA02-L/14-448": _eva02("eva02_large_patch14_448", "L", 448,
                             "mim_m38m_ft_in22k_in1k",
                             "mim_in22k_ft_in22k_in1k", "mim_m38m_ft_in1k",
                             "mim_in22k_ft_in1k", mlp_norm=True),
    "PE-Spatial-Ti/16-512": _pe_spatial("vit_pe_spatial_tiny_patch16_512",
                                        "Ti", 16, 512),
    "PE-Spatial-S/16-512": _pe_spatial("vit_pe_spatial_small_patch16_512",
                                       "S", 16, 512),
    "PE-Spatial-B/16-512": _pe_spatial("vit_pe_spatial_base_patch16_512",
                                       "B", 16, 512),
    "PE-Spatial-L/14-448": _pe_spatial("vit_pe_spatial_large_patch14_448",
                                       "L", 14, 448),
    # Not PE core G/14: its attention pool's MLP is narrower than its blocks'.
    "PE-Core-Ti/16-384": _pe_core("vit_pe_core_tiny_patch16_384", "Ti",
                                  16, 384, 512),
    "PE-Core-S/16-384": _pe_core("vit_pe_core_small_patch16_384", "S",
                                 16, 384, 512),
    "PE-Core-B/16-224": _pe_core("vit_pe_core_base_patch16_224", "B",
                                 16, 224, 1024),
    "PE-Core-L/14-336": _pe_core("vit_pe_core_large_patch14_336", "L",
                                 14, 336, 1024),
    # timm's name alone is the last row of its architecture, its default.
    "DINOv3-S/16": _dinov3("S", "lvd1689m"),
    "DINOv3-S+/16": _dinov3("S+", "lvd1689m"),
    "DINOv3-B/16": _dinov3("B", "lvd1689m"),
    "DINOv3-L/16-sat": _dinov3("L", "sat493m", normalization="sat493m"),
    "DINOv3-L/16": _dinov3("L", "lvd1689m"),
    "DINOv3-H+/16": _dinov3("H+", "lvd1689m"),
    "DINOv3-7B/16-sat": _dinov3("7B", "sat493m", normalization="sat493m"),
    "DINOv3-7B/16": _dinov3("7B", "lvd1689m"),
    # The tags name the language model each came from.
    "Qwen3.5-B/16": _qwen3_5("qwen3_vit_88m", "B", "qwen3_5_0_8b"),
    "Qwen3.5-L/16": _qwen3_5("qwen3_vit_306m", "L", "qwen3_5_2b",
                             "qwen3_5_4b"),
    "Qwen3.5-So400m/16": _qwen3_5("qwen3_vit_416m", "So400m",
                                  "qwen3_5_27b", "qwen3_5_9b"),
}

# SigLIP's and SigLIP 2's towers: (size, patch, image size, GELU, tags).
_TIMM_SIZE = {"B": "base", "L": "large", "So400m": "so400m",
              "g-opt": "giantopt"}
_SIGLIP = (
    ("B", 16, 224, "exact", ("webli",)),
    ("B", 16, 256, "exact", ("webli", "webli_i18n")),
    ("B", 16, 384, "exact", ("webli",)),
    ("B", 16, 512, "exact", ("webli",)),
    ("L", 16, 256, "exact", ("webli",)),
    ("L", 16, 384, "exact", ("webli",)),
    ("So400m", 14, 224, "exact", ("webli",)),
    ("So400m", 14, 378, "exact", ("webli", "webli_ft_in1k")),
    ("So400m", 16, 256, "tanh", ("webli_i18n",)),
)
_SIGLIP2 = (
    ("B", 16, 224, "exact"), ("B", 16, 256, "exact"),
    ("B", 16, 384, "exact"), ("B", 16, 512, "exact"),
    ("B", 32, 256, "tanh"),
    ("L", 16, 256, "exact"), ("L", 16, 384, "exact"), ("L", 16, 512, "tanh"),
    ("So400m", 14, 224, "exact"), ("So400m", 14, 378, "exact"),
    ("So400m", 16, 256, "tanh"), ("So400m", 16, 384, "tanh"),
    ("So400m", 16, 512, "tanh"),
    ("g-opt", 16, 256, "tanh"), ("g-opt", 16, 384, "tanh"),
)


# timm's So400m/14 at 384 (not a multiple of 14) is left out for its 378.
# SigLIP 2's weights are further tags of SigLIP's timm architectures.
for _family, _rows in (("SigLIP", _SIGLIP), ("SigLIP2", (
        (*row, ("v2_webli",)) for row in _SIGLIP2))):
    for _size, _patch, _image, _gelu, _tags in _rows:
        _suffix = "" if _image == 224 else f"-{_image}"
        MEMBERS[f"{_family}-{_size}/{_patch}{_suffix}"] = _siglip(
            _family.lower(),
            f"vit_{_TIMM_SIZE[_size]}_patch{_patch}_siglip_{_image}",
            _size, _patch, _image, _gelu, *_tags)
del _family, _rows, _size, _patch, _image, _gelu, _tags, _suffix


def normalization(name):
    """The input normalisation of the member ``name``'s weights: its own,
    else its family's.

    >>> normalization("DINOv3-L/16-sat"), normalization("DINOv3-L/16")
    ('sat493m', 'imagenet')
    """
    member = MEMBERS[name]
    return member.normalization or FAMILIES[member.family].normalization


def config(name):
    """The builder arguments of the member ``name``: its sizes, its
    family's options and its own, and its input normalisation; without
    ``image_size`` and ``num_classes``, which go with its weights."""
    member = MEMBERS[name]
    family = FAMILIES[member.family]
    hidden, layers, heads, mlp = SIZES[member.size]
    # timm's resize of a table, but where a family says otherwise.
    return {**dict(patch_size=member.patch_size, hidden_size=hidden,
                   num_layers=layers, num_heads=heads, mlp_dim=mlp,
                   position_resize="bicubic_aa"),
            **family.options, **member.options,
            "input_normalization": normalization(name)}
