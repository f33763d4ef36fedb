"""Named architectures as rows of one table, and one parser for their names.

``parse("ViT-B/16")`` turns any accepted spelling of a name into an
:class:`Arch`: the canonical name and the builder keyword arguments.
``"ViT-B/16"``, ``"ViT-B_16"``, ``"vit-b16"``, ``"B/16"`` and timm's
``"vit_base_patch16_224"`` all parse, with any patch size, and so do the
rows of :mod:`keras_vit.base.family_rows` (also by timm's names).
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from keras_vit.base import checks, family_rows
from keras_vit.base.errors import KerasVitError
from keras_vit.base.limits import MAX_IMAGE_SIDE, MAX_MLP

# Paper Table 1, plus Ti and S of the follow-up work (the official configs).
VIT_SIZES = {
    "Ti": dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    "S": dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    "B": dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    "L": dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    "H": dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
}

# Size letters, and timm's words for them.
_SIZES = {"ti": "Ti", "s": "S", "b": "B", "l": "L", "h": "H", "tiny": "Ti",
          "small": "S", "base": "B", "large": "L", "huge": "H"}

# ResNet depths of the hybrids' stems (stages of bottleneck units).
RESNET_DEPTHS = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
                 152: (3, 8, 36, 3)}

# The variants the zoo registers by name (any other patch size still parses).
REGISTERED = (
    "ViT-Ti/16", "ViT-S/16", "ViT-S/32", "ViT-B/16", "ViT-B/32", "ViT-B/8",
    "ViT-L/16", "ViT-L/32", "ViT-H/14",
    "R50+ViT-B/16", "R50+ViT-L/32", "R26+ViT-B/32", "R26+ViT-S/32",
    "R+ViT-Ti/16",
    "Axial-ViT-B/16", "Axial-ViT-B/32",
    "BiT-R50x1", "BiT-R50x3", "BiT-R101x1", "BiT-R101x3", "BiT-R152x2",
    "BiT-R152x4",
)

# The family's later members the zoo names (keras_vit.base.family_rows).
FAMILY_NAMES = tuple(family_rows.MEMBERS)


class UnknownModelError(KerasVitError, ValueError):
    """Raised for a model name that does not parse."""


@dataclasses.dataclass(frozen=True)
class Arch:
    """A parsed model name.

    Attributes:
        name: canonical name, e.g. ``"ViT-B/16"``.
        family: ``"vit"``, ``"hybrid"``, ``"axial"`` or ``"bit"``.
        config: keyword arguments for :func:`keras_vit.models.vit` (or
            :func:`keras_vit.models.resnet_v2` for BiT), without
            ``image_size`` and ``num_classes``.
        image_size: resolution named in the name (timm's ``_384``), or None.
        tag: a weights tag named in the name (timm's ``.augreg_in21k``), or
            None.
    """

    name: str
    family: str
    config: dict
    image_size: int | None = None
    tag: str | None = None


# timm's pretrained tags -> this zoo's weights tags.
TIMM_TAGS = {
    "orig_in21k": "imagenet21k",
    "orig_in21k_ft_in1k": "imagenet21k+imagenet2012",
    "augreg_in21k": "augreg-i21k",
    "augreg2_in21k_ft_in1k": "augreg",
    "augreg_in21k_ft_in1k": "augreg",
    "sam_in1k": "sam",
    "goog_in21k": "BiT-M",
    "goog_in21k_ft_in1k": "BiT-M-ILSVRC2012",
}

# BiT: a name like "BiT-M-R50x1" also selects a weights tag.
_BIT_RE = re.compile(
    r"^(?:bit[-_ ]?(?:(s|m)[-_ ]?)?)?r(\d+)x(\d+)(?:[-_ ](ilsvrc2012))?$",
    re.IGNORECASE)
_TIMM_BIT_RE = re.compile(r"^resnetv2_(\d+)x(\d+)_bit(m|s)?(?:_(\d+))?$")

_VIT_RE = re.compile(
    r"^(?:vit[-_ ]?)?(ti|s|b|l|h)[-_/ ]?(\d+)(?:[-_ @](\d+))?$", re.IGNORECASE)
_HYBRID_RE = re.compile(
    r"^r(?P<depth>\d*)[+_ ]\s*(?:vit[-_ ]?)?(?P<size>ti|s|b|l|h)[-_/ ]?"
    r"(?P<stride>\d+)(?:[-_ @](?P<res>\d+))?$", re.IGNORECASE)
_TIMM_HYBRID_RE = re.compile(
    r"^vit_(?P<size>tiny|small|base|large|huge)_r(?P<depth>\d*)_s"
    r"(?P<stride>\d+)(?:_p\d+)?(?:_(?P<res>\d+))?$")
# Axial-ViT (paper Appendix D.6): "Axial-ViT-B/16", "axial_vit_b16".
_AXIAL_RE = re.compile(
    r"^axial[-_ ]?(?:vit[-_ ]?)?(ti|s|b|l|h)[-_/ ]?(\d+)(?:[-_ @](\d+))?$",
    re.IGNORECASE)
_TIMM_RE = re.compile(
    r"^vit_(tiny|small|base|large|huge)_patch(\d+)(?:_(\d+))?(?:_in21k)?$")


def _squash(name):
    """Lower-cases and drops separators: 'ViT-B/16' -> 'vitb16'. A '+'
    is read 'plus' (timm's 'small_plus')."""
    return re.sub(r"[\s/_\-.]", "", name.lower().replace("+", "plus"))


def _number(text, what, original, high=MAX_IMAGE_SIDE):
    """The number ``text`` (digits of a name; None stays None) if it is in
    [1, ``high``], else an :class:`UnknownModelError` naming ``what`` and
    the name (a 4,301-digit number is refused without converting it)."""
    if text is None:
        return None
    value = int(text) if len(text) <= len(str(high)) else None
    if value is None or not 1 <= value <= high:
        shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text)} digits)"
        raise UnknownModelError(
            f"{what} must be an integer in [1, {high}]; received {shown} in "
            f"name={checks.shown(original)}")
    return value


def vit_name(size, patch):
    return f"ViT-{size}/{patch}"


def parse(name) -> Arch:
    """Parses a model name into an :class:`Arch`.

    >>> parse("vit_base_patch16_384").name, parse("ViT-B_16").image_size
    ('ViT-B/16', None)
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownModelError(
            f"name must be a non-empty string; received name={name!r}")
    raw = name.strip()
    member = _family_member(raw, name)
    if member is not None:
        return member
    tag = None
    if "." in raw:  # timm's "arch.tag"
        raw, _, timm_tag = raw.partition(".")
        tag = TIMM_TAGS.get(timm_tag)
        if tag is None:
            raise UnknownModelError(
                f"Unknown weights tag {timm_tag!r} in name={name!r}; known "
                f"timm tags: {sorted(TIMM_TAGS)}")
    patch, res = "the patch size", "the image size"
    m = _TIMM_BIT_RE.match(raw.lower())
    if m:
        if m.group(3) and tag is None:
            tag = f"BiT-{m.group(3).upper()}"
        return _bit_arch(m.group(1), m.group(2),
                         _number(m.group(4), res, name), tag, name)
    m = _BIT_RE.match(raw)
    if m:
        if m.group(1):
            tag = f"BiT-{m.group(1).upper()}" + (
                "-ILSVRC2012" if m.group(4) else "")
        return _bit_arch(m.group(2), m.group(3), None, tag, name)
    m = _TIMM_HYBRID_RE.match(raw.lower()) or _HYBRID_RE.match(raw)
    if m:
        return _hybrid_arch(m["depth"], _SIZES[m["size"].lower()],
                            _number(m["stride"], "the stride", name),
                            _number(m["res"], res, name), tag, name)
    m = _AXIAL_RE.match(raw)
    if m:
        return _axial_arch(_SIZES[m.group(1).lower()],
                           _number(m.group(2), patch, name),
                           _number(m.group(3), res, name), tag, name)
    m = _TIMM_RE.match(raw.lower()) or _VIT_RE.match(raw)
    if m:
        return _vit_arch(_SIZES[m.group(1).lower()],
                         _number(m.group(2), patch, name),
                         _number(m.group(3), res, name), tag, name)
    raise UnknownModelError(_unknown_message(name))


# A family member's spellings, squashed -> the rows so spelled, in order.
def _family_keys():
    keys = {}
    for name, member in family_rows.MEMBERS.items():
        for spelling in (name, member.timm):
            rows = keys.setdefault(_squash(spelling), [])
            if name not in rows:
                rows.append(name)
    return keys


_FAMILY_KEYS = _family_keys()


def _family_member(raw, original):
    """The :class:`Arch` of a row of :mod:`keras_vit.base.family_rows`,
    None for any other name. Where timm's architecture is several rows',
    a timm tag after a dot picks the row, else the newest release is meant
    (``"vit_base_patch16_siglip_224"`` is ``SigLIP2-B/16``, as in timm)."""
    # The last dot is timm's tag, unless the whole name is a row's.
    spelled, tag = raw, ""
    names = _FAMILY_KEYS.get(_squash(raw))
    if names is None:
        spelled, _, tag = raw.rpartition(".")
        names = _FAMILY_KEYS.get(_squash(spelled))
    if names is None:
        return None
    name = names[-1]
    if tag:
        having = [n for n in names
                  if tag in (w.tag for w in family_rows.MEMBERS[n].weights)]
        if not having:
            known = "; ".join(
                f"{n} has {[w.tag for w in family_rows.MEMBERS[n].weights]}"
                for n in names)
            raise UnknownModelError(
                f"Unknown weights tag {tag!r} in name={original!r}; {known}")
        name = having[0]
    member = family_rows.MEMBERS[name]
    return Arch(name, "vit", family_rows.config(name), member.image_size,
                tag or None)


def _vit_arch(size, patch, res, tag, original):
    config = dict(VIT_SIZES[size], patch_size=patch)
    return Arch(vit_name(size, patch), "vit", config, res, tag)


def _axial_arch(size, patch, res, tag, original):
    """Axial-ViT-{size}/{patch}: ViT-{size} with axial attention,
    mean-pooled."""
    vit = _vit_arch(size, patch, res, tag, original)
    config = dict(vit.config, classifier="gap", attention="axial")
    return Arch(f"Axial-{vit.name}", "axial", config, res, tag)


def _bit_arch(depth, width, res, tag, original):
    depth = _number(depth, "the ResNet depth", original, high=999)
    if depth not in RESNET_DEPTHS or depth == 26:
        raise UnknownModelError(
            f"Unknown BiT depth {depth} in name={original!r}; BiT depths: "
            "50, 101, 152 (e.g. 'BiT-M-R50x1')")
    # Its last stage's output, 2048 channels a width factor, is its widest.
    width = _number(width, "the BiT width factor", original,
                    high=MAX_MLP // 2048)
    config = dict(block_units=list(RESNET_DEPTHS[depth]), width_factor=width)
    return Arch(f"BiT-R{depth}x{width}", "bit", config, res, tag)


def _hybrid_arch(depth, size, stride, res, tag, original):
    """R{depth}+ViT-{size}/{stride}: a ViT on a ResNet feature map.

    The number after the slash is the effective stride, as in the official
    names (/16 folds the last stage into the third). The root-only
    "R+ViT-Ti/16" follows the official config: 8x8 patches on the stride-4
    root, an effective stride of 32 in spite of its name.
    """
    config = dict(VIT_SIZES[size])
    if depth == "":
        if stride % 2:
            raise UnknownModelError(
                f"root-only hybrids take an even number; received "
                f"name={original!r}")
        config.update(patch_size=stride // 2,
                      resnet=dict(num_layers=[], width_factor=1))
        return Arch(f"R+ViT-{size}/{stride}", "hybrid", config, res, tag)
    depth = _number(depth, "the ResNet depth", original, high=999)
    if depth not in RESNET_DEPTHS:
        raise UnknownModelError(
            f"Unknown ResNet depth {depth} in name={original!r}; known depths: "
            f"{sorted(RESNET_DEPTHS)}")
    stages = list(RESNET_DEPTHS[depth])
    if stride % 32 == 0:
        patch = stride // 32
    elif stride % 16 == 0:
        stages = stages[:2] + [stages[2] + stages[3]]
        patch = stride // 16
    else:
        raise UnknownModelError(
            f"A R{depth} hybrid's stride must be a multiple of 16 or 32; "
            f"received name={original!r}")
    config.update(patch_size=patch,
                  resnet=dict(num_layers=stages, width_factor=1))
    return Arch(f"R{depth}+ViT-{size}/{stride}", "hybrid", config, res, tag)


def _unknown_message(name):
    candidates = {_squash(n): n for n in REGISTERED + FAMILY_NAMES}
    close = difflib.get_close_matches(_squash(str(name)), list(candidates),
                                      n=3, cutoff=0.5)
    hint = (" Did you mean " + ", ".join(repr(candidates[c]) for c in close)
            + "?" if close else "")
    return (f"Unknown model name={name!r}.{hint} "
            "keras_vit.zoo.list_models() (or `keras-vit list`) lists them all.")
