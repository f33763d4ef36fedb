"""The released weights of each named variant: data, not code.

Per canonical name and weights tag: where the official file is and what it
contains (the family rows of :mod:`keras_vit.base.family_rows` hold an
``hf-hub:`` source as ``url``), for ``zoo.info`` and choosing defaults.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import functools
import urllib.parse
from pathlib import Path

from keras_vit.base import family_rows, geometry, variants
from keras_vit.base.checks import did_you_mean

BUCKET = "https://storage.googleapis.com/vit_models/"
BIT_BUCKET = "https://storage.googleapis.com/bit_models/"
LICENSE = "Apache-2.0 (google-research/vision_transformer)"

IMAGENET21K_CLASSES = 21843
IMAGENET1K_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class Weights:
    """One released checkpoint.

    Attributes:
        tag: the weights tag (``"imagenet21k"``, ...).
        url: official HTTPS URL (the mirror variable rewrites it).
        image_size: resolution it was trained or fine-tuned at.
        num_classes: size of its head (0: none, the pooled embedding).
        labels: name of the label list for its head, shipped with the
            package, or None.
        representation_size: width of its ``pre_logits`` layer, or None.
        sha256: the file's hash where known.
        description: one line for ``zoo.info``.
        head_type: what the head is (``"projection"``: CLIP's image-text
            projection).
    """

    tag: str
    url: str
    image_size: int
    num_classes: int
    labels: str | None
    representation_size: int | None = None
    sha256: str | None = None
    description: str = ""
    license: str = LICENSE
    head_type: str = "classifier"


def _i21k(file, hidden):
    return Weights(
        "imagenet21k", f"{BUCKET}imagenet21k/{urllib.parse.quote(file)}.npz", 224,
        IMAGENET21K_CLASSES, "imagenet21k", representation_size=hidden,
        description="pre-trained on ImageNet-21k (paper, 'original' release)")


def _ft(file, res):
    return Weights(
        "imagenet21k+imagenet2012",
        f"{BUCKET}imagenet21k%2Bimagenet2012/{urllib.parse.quote(file)}.npz", res,
        IMAGENET1K_CLASSES, "imagenet2012",
        description=f"ImageNet-21k pre-training, fine-tuned on ImageNet at {res}"
                    " (paper, Table 2)")


# The AugReg checkpoints the vit_jax README recommends and their ImageNet
# fine-tunes at 384. Other AugReg files: weights="augreg:<filename>".
_AUGREG = {
    "ViT-Ti/16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
                  "lr_0.03"),
    "ViT-S/16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
                 "lr_0.03"),
    "ViT-S/32": ("S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
                 "lr_0.01"),
    "ViT-B/16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
                 "lr_0.03"),
    "ViT-B/32": ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
                 "lr_0.01"),
    "ViT-L/16": ("L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
                 "lr_0.01"),
    "R50+ViT-L/32": (
        "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
        "lr_0.01"),
    "R26+ViT-S/32": (
        "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
        "lr_0.01"),
    "R+ViT-Ti/16": (
        "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
        "lr_0.03"),
}


def augreg_url(filename):
    """URL of a file in the AugReg bucket (``.npz`` added if missing)."""
    if not filename.endswith(".npz"):
        filename += ".npz"
    return f"{BUCKET}augreg/{filename}"


AUGREG_INDEX_URL = f"{BUCKET}augreg/index.csv"


def _augreg(name):
    upstream, lr = _AUGREG[name]
    return [
        Weights("augreg", augreg_url(
            f"{upstream}--imagenet2012-steps_20k-{lr}-res_384"), 384,
            IMAGENET1K_CLASSES, "imagenet2012",
            description="AugReg ImageNet-21k pre-training (recommended "
                        "checkpoint), fine-tuned on ImageNet at 384"),
        Weights("augreg-i21k", augreg_url(upstream), 224, IMAGENET21K_CLASSES,
                "imagenet21k",
                description="AugReg pre-training on ImageNet-21k, 300 epochs "
                            "(recommended checkpoint)"),
    ]


def _sam(file):
    return Weights(
        "sam", f"{BUCKET}sam/{file}.npz", 224, IMAGENET1K_CLASSES,
        "imagenet2012",
        description="trained on ImageNet with SAM (Chen et al. 2021)")


def _bit(name):
    """BiT-S, BiT-M and BiT-M fine-tuned on ILSVRC-2012 at 448."""
    short = name[len("BiT-"):]
    lic = "Apache-2.0 (google-research/big_transfer)"
    return [
        Weights("BiT-M-ILSVRC2012", f"{BIT_BUCKET}BiT-M-{short}-ILSVRC2012.npz",
                448, IMAGENET1K_CLASSES, "imagenet2012",
                description="BiT-M (ImageNet-21k) fine-tuned on ImageNet at 448",
                license=lic),
        Weights("BiT-M", f"{BIT_BUCKET}BiT-M-{short}.npz", 224,
                IMAGENET21K_CLASSES, "imagenet21k",
                description="BiT-M: pre-trained on ImageNet-21k", license=lic),
        Weights("BiT-S", f"{BIT_BUCKET}BiT-S-{short}.npz", 224,
                IMAGENET1K_CLASSES, "imagenet2012",
                description="BiT-S: trained on ImageNet-1k", license=lic),
    ]


# What each timm tag of the family's weights is, for zoo.info.
_FAMILY_TAGS = {
    "fb_in1k": "trained on ImageNet-1k (Meta's release)",
    "fb_in22k_ft_in1k": "pre-trained on ImageNet-21k, fine-tuned on "
                        "ImageNet-1k (Meta's release)",
    "lvd142m": "self-supervised on LVD-142M; no head: the class token's "
               "embedding",
    "openai": "OpenAI's CLIP, contrastive on 400M image-text pairs; the "
              "head is the image-text projection",
    "webli": "SigLIP, sigmoid-loss image-text pre-training on WebLI "
             "(English); no classifier: the attention-pool embedding",
    "webli_i18n": "SigLIP, sigmoid-loss image-text pre-training on "
                  "multilingual WebLI; no classifier: the attention-pool "
                  "embedding",
    "webli_ft_in1k": "SigLIP's WebLI pre-training, fine-tuned on "
                     "ImageNet-1k (a classifier on the attention-pool "
                     "embedding)",
    "v2_webli": "SigLIP 2, sigmoid loss with captioning, self-distillation "
                "and masked prediction on multilingual WebLI; no "
                "classifier: the attention-pool embedding",
    "fb": "Meta's release of Perception Encoder: contrastive image-text "
          "pre-training (PE core: the head is the image-text projection), "
          "then aligned for dense tasks (PE spatial: no head)",
    "lvd1689m": "DINOv3, self-supervised on LVD-1689M (web images); no "
                "head: the pooled embedding",
    "sat493m": "DINOv3, self-supervised on SAT-493M (satellite images, "
               "their own mean/std); no head: the pooled embedding",
    **{f"qwen3_5_{size.replace('.', '_').lower()}": f"the vision tower of "
       f"Qwen3.5-{size}; no head: the pooled embedding"
       for size in ("0.8B", "2B", "4B", "9B", "27B")},
    "mim_in22k": "EVA-02's masked image modelling on ImageNet-21k; no "
                 "head: the pooled embedding",
    "mim_m38m": "EVA-02's masked image modelling on Merged-38M; no head: "
                "the pooled embedding",
    "mim_in22k_ft_in1k": "EVA-02's ImageNet-21k pre-training, fine-tuned on "
                         "ImageNet-1k",
    "mim_in22k_ft_in22k_in1k": "EVA-02's ImageNet-21k pre-training, "
                               "fine-tuned on ImageNet-21k then ImageNet-1k",
    "mim_m38m_ft_in1k": "EVA-02's Merged-38M pre-training, fine-tuned on "
                        "ImageNet-1k",
    "mim_m38m_ft_in22k_in1k": "EVA-02's Merged-38M pre-training, fine-tuned "
                              "on ImageNet-21k then ImageNet-1k",
}


def _family(name):
    """The :class:`Weights` of a row of :mod:`keras_vit.base.family_rows`,
    its default first."""
    member = family_rows.MEMBERS[name]
    return [Weights(w.tag, w.source, member.image_size, w.num_classes,
                    w.labels, description=_FAMILY_TAGS[w.tag],
                    license=family_rows.FAMILIES[member.family].license,
                    head_type=w.head_type)
            for w in member.weights]


def _build_table():
    table = {name: [] for name in variants.REGISTERED}
    for size, patch in (("B", 16), ("B", 32), ("L", 16), ("L", 32),
                        ("H", 14)):
        name = variants.vit_name(size, patch)
        hidden = variants.VIT_SIZES[size]["hidden_size"]
        table[name].append(_i21k(f"ViT-{size}_{patch}", hidden))
    table["R50+ViT-B/16"].append(_i21k("R50+ViT-B_16", 768))
    for name in ("R50+ViT-B/16", "R26+ViT-B/32", "R50+ViT-L/32"):
        table[name].append(_ft(name.replace("/", "_"), 384))
    for size, patch in (("B", 16), ("B", 32), ("B", 8), ("L", 16), ("L", 32)):
        name = variants.vit_name(size, patch)
        res = 224 if patch == 8 else 384
        table[name].append(_ft(f"ViT-{size}_{patch}", res))
    # Fine-tunes at 224, same tag: the loader picks by image_size.
    for size in ("B", "L"):
        table[variants.vit_name(size, 16)].append(_ft(f"ViT-{size}_16-224", 224))
    for name in _AUGREG:
        table[name].extend(_augreg(name))
    for size, patch in (("B", 16), ("B", 32), ("L", 16), ("L", 32)):
        table[variants.vit_name(size, patch)].append(
            _sam(f"ViT-{size}_{patch}"))
    for name in variants.REGISTERED:
        if name.startswith("BiT-"):
            table[name].extend(_bit(name))
    for name in variants.FAMILY_NAMES:
        table[name] = _family(name)
    return table


WEIGHTS = _build_table()

# Preferred default tag: the paper's own fine-tuned release, else AugReg.
DEFAULT_TAGS = ("imagenet21k+imagenet2012", "augreg", "imagenet21k",
                "BiT-M-ILSVRC2012")


def family_of(name):
    """The family a canonical name belongs to (``"vit"``, ``"deit"``, ...)."""
    member = family_rows.MEMBERS.get(name)
    return member.family if member else variants.parse(name).family


def families():
    """Every family ``list_models(family=...)`` takes, in table order."""
    return list(dict.fromkeys(
        family_of(n) for n in variants.REGISTERED + variants.FAMILY_NAMES))


def list_models(pattern=None, *, family=None):
    """Registered model names, optionally filtered by a glob pattern and
    by family (one of :func:`families`).

    >>> list_models("ViT-B*")
    ['ViT-B/16', 'ViT-B/32', 'ViT-B/8']
    >>> list_models(family="dinov2")[:2]
    ['DINOv2-S/14', 'DINOv2-B/14']
    """
    if pattern is not None and not isinstance(pattern, str):
        raise TypeError(f"pattern must be a glob string or None; received "
                        f"pattern={pattern!r}")
    names = list(variants.REGISTERED + variants.FAMILY_NAMES)
    if family is not None:
        known = families()
        if family not in known:
            raise ValueError(f"family must be one of {known} or None; "
                             f"received family={family!r}."
                             f"{did_you_mean(str(family), known)}")
        names = [n for n in names if family_of(n) == family]
    if pattern:
        pat = pattern.lower()
        names = [n for n in names if fnmatch.fnmatch(n.lower(), pat)
                 or fnmatch.fnmatch(n.lower().replace("/", "_"), pat)]
    return names


def weights_for(name):
    """All released :class:`Weights` of a canonical name (maybe empty)."""
    return list(WEIGHTS.get(name, []))


def tags_for(name):
    """The distinct weights tags of a canonical name, in table order."""
    return list(dict.fromkeys(w.tag for w in weights_for(name)))


def default_tag(name):
    """The tag ``weights="auto"`` loads: a family member's first, else the
    first of :data:`DEFAULT_TAGS` released; None when none is."""
    tags = tags_for(name)
    if name in family_rows.MEMBERS:
        return tags[0]
    for tag in DEFAULT_TAGS:
        if tag in tags:
            return tag
    return None


def hub_weights(name, weights):
    """The :class:`Weights` ``zoo.load(name, weights)`` reads from the Hub
    for a family member and ``weights`` ``"auto"`` or one of its tags;
    None for anything else.

    >>> hub_weights("DeiT3-B/16", "fb_in1k").url
    'hf-hub:timm/deit3_base_patch16_224.fb_in1k'
    >>> hub_weights("ViT-B/16", "auto") is None
    True
    """
    if not isinstance(name, str) or not isinstance(weights, str):
        return None
    try:
        arch = variants.parse(name)
    except ValueError:
        return None  # the official reader gives the error
    if arch.name not in family_rows.MEMBERS:
        return None
    tag = (arch.tag or default_tag(arch.name)) if weights == "auto" else weights
    found = [w for w in weights_for(arch.name) if w.tag == tag]
    return found[0] if found else None


def select(name, tag, image_size=None):
    """The :class:`Weights` of ``name`` with ``tag``; prefers a file trained
    at ``image_size`` when several resolutions were released."""
    candidates = [w for w in weights_for(name) if w.tag == tag]
    if not candidates:
        tags = tags_for(name)
        raise ValueError(
            f"No weights={tag!r} for model {name!r}.{did_you_mean(tag, tags)} "
            f"Released tags: {tags or 'none'}; also accepted: a local .npz path, "
            "an https URL, 'augreg:<filename>' or None for random initialisation.")
    return next((w for w in candidates if image_size is not None
                 and w.image_size == image_size), candidates[0])


effective_stride = geometry.effective_stride
parameter_count = geometry.parameter_count


def info(name):
    """What the zoo knows of a model: architecture, weights, URLs, licence.

    >>> info("ViT-B/16")["config"]["hidden_size"]
    768
    """
    arch = variants.parse(name)
    weights = {}
    for w in weights_for(arch.name):
        weights.setdefault(w.tag, []).append({k: getattr(w, k) for k in (
            "url", "image_size", "num_classes", "labels",
            "representation_size", "sha256", "license", "description")})
    config = dict(arch.config)
    stride = effective_stride(config)
    notes = []
    member = family_rows.MEMBERS.get(arch.name)
    if member is not None:
        notes.append(family_rows.FAMILIES[member.family].about + ".")
    if arch.name.startswith("R+"):
        notes.append(
            "Root-only ResNet stem (stride 4) with 8x8 patches: the effective "
            "stride is 32, not the 16 of its name (7x7 grid at 224), as in the "
            "official config.")
    # Counted as zoo.load builds it by default.
    default = default_tag(arch.name)
    shape = {"image_size": arch.image_size or 224,
             "num_classes": IMAGENET1K_CLASSES, "representation_size": None}
    record = None
    if default:
        record = select(arch.name, default, arch.image_size)
        shape = {"image_size": arch.image_size or record.image_size,
                 "num_classes": record.num_classes,
                 "representation_size": record.representation_size}
    geometry.check_grid(config, shape["image_size"], arch.name)
    count = parameter_count(config, **shape)
    return {
        "name": arch.name,
        "family": family_of(arch.name),
        "parameters": None if count is None else dict(count=count, **shape),
        "effective_stride": stride,
        "notes": notes,
        "registered": arch.name in list_models(),
        "config": config,
        "default_weights": default,
        "source": record.url if record else None,
        "image_size": shape["image_size"],
        "labels": record.labels if record else None,
        "input_normalization": _normalization(
            config.get("input_normalization")),
        "weights": weights,
        "preprocessing": _preprocessing(config.get("input_normalization")),
    }


def _normalization(name):
    """``{"name", "mean", "std"}`` of a named input normalisation."""
    from keras_vit.data.normalization import NAMED

    name = name or "official"
    return {"name": name, "mean": list(NAMED[name].mean),
            "std": list(NAMED[name].std)}


def _preprocessing(name):
    if name is None:
        return ("RGB pixels scaled to [-1, 1]: (x - 127.5) / 127.5 "
                "(include_preprocessing=True does it in the model)")
    return (f"RGB pixels x in [0, 255] normalised with {name}'s mean "
            "and std: (x / 255 - mean) / std (include_preprocessing=True "
            "does it in the model)")


#: The label lists that ship with the package (``zoo/labels/*.txt``).
LABELS_DIR = Path(__file__).resolve().parent / "labels"


def labels(name):
    """A label list that ships with the package (``"imagenet2012"`` or
    ``"imagenet21k"``), as ``[(wordnet_id, names)]``; a name is no path."""
    known = sorted(p.stem for p in LABELS_DIR.glob("*.txt"))
    if not isinstance(name, str):
        raise TypeError(f"name must be the name of a label list, one of "
                        f"{known}; received name={name!r}")
    path = LABELS_DIR / f"{name}.txt"
    if name not in known or not path.is_file():
        raise ValueError(f"Unknown label list name={name!r}; known: {known}."
                         f"{did_you_mean(str(name), known)}")
    return _read_labels(name)


@functools.lru_cache(maxsize=None)
def _read_labels(name):
    with open(LABELS_DIR / f"{name}.txt", encoding="utf-8") as f:
        return tuple(tuple(line.rstrip("\n").split("\t", 1)) for line in f)


def label_names(name):
    """The class names of the label list ``name``, made distinct: a name
    two classes share is followed by its WordNet id.

    >>> label_names("imagenet2012")[:2]
    ['tench, Tinca tinca', 'goldfish, Carassius auratus']
    """
    rows = labels(name)
    counts = collections.Counter(names for _, names in rows)
    return [names if counts[names] == 1 else f"{names} ({wnid})"
            for wnid, names in rows]
