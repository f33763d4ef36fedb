"""The one place a load decides the model's head, size, labels and weights.

:func:`settle` puts a reader's :class:`~keras_vit.zoo.build.Checkpoint`
and the caller's :class:`Request` together the same way for every source:

* ``include_top``: the caller's, else a head when the weights hold one or
  ``num_classes`` is asked;
* ``num_classes``: the caller's, else the weights' head, else the
  reader's default; the head is *kept* when it is of the weights' size,
  else new and zero-initialised (only when asked: weights that lack the
  head their file declares are refused);
* ``representation_size``: dropped with a new head unless
  ``keep_pre_logits``;
* ``label_names``: the caller's, else the weights' while their head is
  kept;
* ``image_size``: the caller's, else the checkpoint's;
* every other keyword goes to the builder over the checkpoint's.

>>> from keras_vit.zoo.build import Checkpoint
>>> ckpt = Checkpoint(dict(image_size=32, patch_size=16,
...     hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64,
...     num_classes=3), head=3, label_names=["cat", "dog", "bird"])
>>> settle(ckpt, Request()).config["label_names"]
['cat', 'dog', 'bird']
>>> new = settle(ckpt, Request(num_classes=5)).config
>>> new["num_classes"], new["label_names"]
(5, None)
"""

from __future__ import annotations

import dataclasses

from keras_vit.base.checks import check_int, check_pair


class _Unset:
    def __repr__(self):
        return "<unset>"


#: ``label_names`` not given: the settle step decides.
UNSET = _Unset()


@dataclasses.dataclass(frozen=True)
class Request:
    """What the caller of a load asks for (see :func:`settle`).

    Attributes:
        image_size: the input size; None keeps the checkpoint's.
        num_classes: the head's size; None keeps the weights'.
        keep_pre_logits: keep ``pre_logits`` under a new head.
        label_names: the head's class names; :data:`UNSET` lets the
            checkpoint's stay while its head does.
        random: build without the checkpoint's weights.
        options: more builder keywords; they win over the checkpoint's.
    """

    image_size: object = None
    num_classes: int | None = None
    keep_pre_logits: bool = False
    label_names: object = UNSET
    random: bool = False
    options: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.image_size is not None:
            from keras_vit.layers.image_sizes import check_image_size

            check_image_size(self.image_size)
        if self.num_classes is not None:
            from keras_vit.base.limits import MAX_CLASSES

            # 0: no head, the model returns its pooled embedding.
            if check_int("num_classes", self.num_classes,
                         low=0) > MAX_CLASSES:
                raise ValueError(f"num_classes must be at most {MAX_CLASSES}"
                                 f"; received num_classes={self.num_classes}")
        if not isinstance(self.keep_pre_logits, bool):
            raise ValueError("keep_pre_logits must be True or False; "
                             f"received keep_pre_logits="
                             f"{self.keep_pre_logits!r}")
        if not isinstance(self.options, dict):
            raise TypeError(f"options must be a dict; received "
                            f"{self.options!r}")


@dataclasses.dataclass
class Settled:
    """What :func:`settle` decides."""

    config: dict
    arrays: object
    keep_pre_logits: bool
    tags: dict


def settle(checkpoint, request):
    """The model ``checkpoint`` and ``request`` together describe (see the
    module's rules): a :class:`Settled`."""
    config = dict(checkpoint.config)
    options = dict(request.options)
    head = checkpoint.head
    include_top = options.pop("include_top", None)
    if include_top is None:
        include_top = checkpoint.include_top
    if include_top is None:
        include_top = head is not None or request.num_classes is not None
    num_classes = request.num_classes
    if num_classes is None:
        num_classes = head if head is not None else config.get("num_classes")
    lacking = _missing_head(checkpoint, request)
    if include_top and (num_classes is None or (
            head is None and lacking and request.num_classes is None
            and num_classes != 0)):
        # A zero head would answer one class for every image.
        raise ValueError(
            f"The checkpoint {checkpoint.source_name} has no head; pass "
            "num_classes=... for a new zero-initialised head, num_classes=0 "
            "for the pooled embedding or include_top=False for features "
            f"(its weights lack {', '.join(lacking or _head_keys(checkpoint))})")
    head_kept = bool(include_top and head is not None
                     and num_classes == head and not request.random)
    if head_kept and lacking:
        raise ValueError(
            f"The checkpoint {checkpoint.source_name} says it has a head of "
            f"{head} classes, but its weights lack {', '.join(lacking)}; "
            "pass num_classes=... for a new zero-initialised head or "
            "include_top=False for features")
    if (config.get("representation_size") and include_top and not head_kept
            and not request.keep_pre_logits):
        config["representation_size"] = None  # a new head on the encoder
    if include_top and head is not None and num_classes == head:
        # What the head is goes with its shape.
        config.update(checkpoint.head_config)
    labels = request.label_names
    if labels is UNSET:
        labels = checkpoint.label_names if head_kept else None
    if labels is not None and not include_top:
        labels = None if request.label_names is UNSET else labels
    config.update(include_top=bool(include_top),
                  num_classes=num_classes if num_classes is not None else 1000,
                  label_names=list(labels) if labels is not None else None)
    if request.image_size is not None:
        size = check_pair("image_size", request.image_size)
        config["image_size"] = size[0] if size[0] == size[1] else list(size)
    config.update(options)
    tags = dict(checkpoint.tags)
    if request.random:
        tags["zoo_weights"] = None
    return Settled(config, None if request.random else checkpoint.arrays,
                   request.keep_pre_logits, tags)


def _head_keys(checkpoint):
    """The head's arrays in the layout of ``checkpoint.arrays``."""
    keys = ["head/kernel", "head/bias"]
    if checkpoint.config.get("distilled"):
        keys += ["head_dist/kernel", "head_dist/bias"]
    if checkpoint.layout is not None:
        return [checkpoint.layout.key_of(key) for key in keys]
    if checkpoint.family == "bit":
        from keras_vit.zoo.official.bit import HEAD_BIAS, HEAD_KERNEL

        return [HEAD_KERNEL, HEAD_BIAS]
    return keys


def _missing_head(checkpoint, request):
    """The head arrays ``checkpoint``'s weights lack (none when there are
    no weights to load).

    >>> from keras_vit.zoo.build import Checkpoint
    >>> _missing_head(Checkpoint({}, {"head/kernel": 0}), Request())
    ['head/bias']
    """
    arrays = checkpoint.arrays
    if arrays is None or request.random or checkpoint.model is not None:
        return []
    return [checkpoint.head_names.get(key, key)
            for key in _head_keys(checkpoint) if key not in arrays]


def request(image_size=None, num_classes=None, *, keep_pre_logits=False,
            label_names=UNSET, **options):
    """A :class:`Request` from the keywords of ``zoo.load`` and the
    readers' ``load`` functions (the rest are builder keywords)."""
    return Request(image_size, num_classes, keep_pre_logits, label_names,
                   options=options)
