"""Training recipes as data: the paper's fine-tuning (Table 4, Appendix
B.1.1) and pre-training (Table 3) settings, each overridable.

>>> from keras_vit.train import recipes
>>> r = recipes.get("finetune", total_steps=500, learning_rate=0.003)
>>> r.optimizer, r.momentum, r.batch_size, r.grad_clip_norm, r.image_size
('sgd', 0.9, 512, 1.0, 384)
>>> recipes.get("pretrain").weight_decay
0.03

The later recipes ``"augreg"``, ``"deit"`` and ``"deit3"`` add MixUp /
CutMix, RandAugment, random erasing, stochastic depth, layer decay and a
loss choice (all off in the paper's). Their pieces work with
``model.fit``::

    import keras_vit.train as kt
    from keras_vit.train import recipes

    r = recipes.get("deit", total_steps=1000, layer_decay=0.65)
    model = kt.build_model("ViT-S/16", num_classes=10,
                           image_size=r.image_size,
                           model_options=recipes.model_options(r))
    train = kt.dataset("digits", r.image_size, r.batch_size,
                       **recipes.pipeline_options(r, num_classes=10))
    model.compile(optimizer=recipes.make_optimizer(
                      r, 1000, clip_in_optimizer=True, model=model),
                  loss=recipes.make_loss(r), metrics=["accuracy"])
    model.fit(train, epochs=1, steps_per_epoch=1000)
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from keras_vit.base import limits
from keras_vit.base.checks import (check_choice, check_int, check_number, closest,
                              did_you_mean)
from keras_vit.train.data.augment import check_augment
from keras_vit.train.distribute import check_precision_name

# Masked patch prediction's objectives and targets.
MPP_OBJECTIVES = ("mpp",)
MPP_TARGETS = ("mean_color", "color_4x4", "l2")

OPTIMIZERS = ("sgd", "adam", "lamb")
SCHEDULES = ("cosine", "linear", "constant")
# "bce": DeiT III's binary cross-entropy, one sigmoid per class.
LOSSES = ("softmax", "bce")


# The weight average's horizon, 1 / (1 - ema_decay) steps, may span at most
# this share of the run: the starting weights then keep e**-2 = 14% of the
# average (the paper's 0.9999 over 20k steps). DeiT's average over a
# 120-step fine-tune kept 99.5% of them (evaluation at chance).
EMA_HORIZON_SHARE = 0.5


def ema_fits(ema_decay, total_steps):
    """Whether a weight average of ``ema_decay`` (None: none) fits a run
    of ``total_steps``.

    >>> ema_fits(0.9999, 20_000), ema_fits(0.99996, 120)
    (True, False)
    """
    if ema_decay is None:
        return True
    # A relative slack: 0.9999 over 20k steps sits on the bound itself.
    return (1.0 - ema_decay) * total_steps * EMA_HORIZON_SHARE >= 1 - 1e-9


def largest_ema(total_steps):
    """The largest ``ema_decay`` that fits a run of ``total_steps``, or
    None when none does.

    >>> largest_ema(120)
    0.9833333333333333
    """
    span = EMA_HORIZON_SHARE * total_steps
    return None if span <= 1 else 1.0 - 1.0 / span


def _ema_text(ema_decay, total_steps):
    return (f"ema_decay={ema_decay} averages the weights over "
            f"~{1 / (1 - ema_decay):.0f} steps, more than "
            f"{EMA_HORIZON_SHARE:.0%} of a run of total_steps={total_steps} "
            f"(the saved weights would keep "
            f"{ema_decay ** total_steps:.1%} of the starting ones)")


def check_ema(ema_decay, total_steps):
    """Refuses an ``ema_decay`` whose average does not fit a run of
    ``total_steps``, naming the largest that does.

    >>> check_ema(0.99996, 120)
    Traceback (most recent call last):
    ValueError: ema_decay=0.99996 averages the weights over ~25000 steps, \
more than 50% of a run of total_steps=120 (the saved weights would keep \
99.5% of the starting ones); set ema_decay (--ema) to at most 0.983333, \
none, or train longer
    """
    if ema_fits(ema_decay, total_steps):
        return
    largest = largest_ema(total_steps)
    room = (f"at most {largest:.6g}, " if largest is not None else "")
    raise ValueError(f"{_ema_text(ema_decay, total_steps)}; set ema_decay "
                     f"(--ema) to {room}none, or train longer")


# Every integer field's cap; the step counts and seed may be 0.
_INT_CAPS = {"total_steps": limits.MAX_STEPS,
             "warmup_steps": limits.MAX_STEPS,
             "checkpoint_every": limits.MAX_STEPS,
             "log_every": limits.MAX_STEPS, "eval_every": limits.MAX_STEPS,
             "batch_size": limits.MAX_BATCH_SIZE,
             "micro_batch_size": limits.MAX_BATCH_SIZE,
             "image_size": limits.MAX_IMAGE_SIDE, "seed": limits.MAX_SEED}
_OPTIONAL = ("total_steps", "micro_batch_size", "eval_every")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every setting of a training run. Use :func:`get` to start from a
    named recipe and override fields; ``recipe.replace(**fields)`` too.

    Attributes:
        name: the recipe it started from.
        optimizer: ``"sgd"`` (with ``momentum``), ``"adam"`` (with
            ``beta_1``, ``beta_2``; decoupled ``weight_decay`` makes AdamW)
            or ``"lamb"`` (Keras' LAMB, same betas; its weight decay is
            decoupled, outside the trust ratio).
        learning_rate: peak learning rate (after warmup), at most 10.
        scale_lr_with_batch: the named recipe's ``learning_rate`` is for
            its own ``batch_size``; :func:`get` with another
            ``batch_size`` (and no ``learning_rate``) scales the rate
            linearly with it, DeiT's ``5e-4 * batch_size / 512``
            (:func:`scaled_learning_rate`).
        lr_sweep: the values the paper swept for this setting (information).
        schedule: decay after warmup, to zero: ``"cosine"``, ``"linear"``,
            ``"constant"``.
        warmup_steps: linear warmup from zero, in optimizer steps.
        total_steps: optimizer steps; None: from ``epochs``.
        epochs: passes over the data when ``total_steps`` is None.
        batch_size: global batch per optimizer step (all replicas, all
            accumulation steps).
        micro_batch_size: images per replica per forward pass; smaller than
            the per-replica batch means gradient accumulation (for memory).
            None: no accumulation.
        grad_clip_norm: clip the (all-reduced) gradient at this global norm;
            None: no clipping.
        weight_decay: decoupled weight decay (times the learning rate, as in
            the official code); 0 for none.
        label_smoothing: 0 for none.
        dropout_rate: dropout of the model (after dense layers and the
            embedding, not on attention weights).
        image_size: training resolution; for a fine-tune above the
            pre-training resolution, position embeddings are resized.
        ema_decay: Polyak averaging of the weights per optimizer step
            (0.9999 in the paper's Table 2), Keras' ``use_ema`` with
            ``ema_momentum``; the average replaces the raw weights at the
            end of the run; None: off. Its horizon ``1 / (1 - ema_decay)``
            steps must fit in half the run (:func:`fit_ema`).
        precision: ``"auto"`` (bfloat16 on TPU, float32 elsewhere),
            ``"float32"`` or ``"mixed_bfloat16"``.
        jit_compile: XLA for the forward and backward pass of the train
            step: True, False, or ``"auto"`` (on for mixed_bfloat16 with one
            replica, where it measured faster on CPU; a TPU compiles the
            whole step anyway; see :func:`keras_vit.train.distribute.step_uses_xla`).
        crop_area: inception-crop area range for training, or None for a
            plain resize.
        flip: random horizontal flips in training.
        eval_crop: central-crop fraction before the evaluation resize.
        checkpoint_every: steps between checkpoints (and at the end).
        log_every: steps between TensorBoard / progress updates.
        eval_every: steps between evaluations on the eval data; None: at
            the end only.
        seed: seeds the data order, the augmentation and new weights.
        mixup_alpha: MixUp's Beta(alpha, alpha) per batch; 0: off
            (:mod:`keras_vit.train.mixing`).
        cutmix_alpha: CutMix's, the same way; 0: off.
        mix_switch_prob: with both on, the chance a batch is CutMix.
        randaugment: ``(num_ops, magnitude[, magnitude_std])`` of timm's
            RandAugment (:mod:`keras_vit.train.data.randaugment`),
            magnitude on its 0-10 level scale; None: off.
        random_erasing: the chance an image gets a box of noise; 0: off.
        three_augment: DeiT III's 3-Augment (grayscale, solarisation or
            blur per image).
        color_jitter: brightness/contrast/saturation jitter strength; 0:
            off.
        drop_path_rate: stochastic depth of the last block (growing
            linearly from 0 at the first), a model option
            (:func:`model_options`).
        layer_decay: layer-wise learning-rate decay in (0, 1]
            (:mod:`keras_vit.train.layer_decay`); None: off.
        loss: ``"softmax"`` cross-entropy or DeiT III's ``"bce"`` (every
            class present in a mixed target a positive; no label
            smoothing with it).
    """

    name: str = "custom"
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    scale_lr_with_batch: bool = False
    lr_sweep: tuple = ()
    momentum: float = 0.9
    beta_1: float = 0.9
    beta_2: float = 0.999
    schedule: str = "cosine"
    warmup_steps: int = 0
    total_steps: int | None = None
    epochs: float | None = None
    batch_size: int = 512
    micro_batch_size: int | None = None
    grad_clip_norm: float | None = 1.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    dropout_rate: float = 0.0
    image_size: int = 384
    ema_decay: float | None = None
    precision: str = "auto"
    jit_compile: bool | str = "auto"
    crop_area: tuple | None = (0.05, 1.0)
    flip: bool = True
    eval_crop: float = 1.0
    checkpoint_every: int = 500
    log_every: int = 10
    eval_every: int | None = None
    seed: int = 0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_switch_prob: float = 0.5
    randaugment: tuple | None = None
    random_erasing: float = 0.0
    three_augment: bool = False
    color_jitter: float = 0.0
    drop_path_rate: float = 0.0
    layer_decay: float | None = None
    loss: str = "softmax"

    def __post_init__(self):
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_precision_name(self.precision)
        if self.jit_compile not in ("auto", True, False):
            raise ValueError("jit_compile must be True, False or 'auto'; "
                             f"received jit_compile={self.jit_compile!r}")
        check_number("learning_rate", self.learning_rate, low=0.0,
                     high=limits.MAX_LEARNING_RATE, low_open=True)
        if not isinstance(self.lr_sweep, (tuple, list)):
            raise ValueError("lr_sweep must be a tuple of learning rates; "
                             f"received lr_sweep={self.lr_sweep!r}")
        for value in self.lr_sweep:
            check_number("lr_sweep", value, low=0.0,
                         high=limits.MAX_LEARNING_RATE, low_open=True)
        for field in ("flip", "scale_lr_with_batch"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"{field} must be True or False; received "
                                 f"{field}={getattr(self, field)!r}")
        for field in ("momentum", "beta_1", "beta_2"):
            check_number(field, getattr(self, field), low=0.0, high=1.0,
                          high_open=True)
        check_number("weight_decay", self.weight_decay, low=0.0,
                     high=limits.MAX_WEIGHT_DECAY)
        for field in ("label_smoothing", "dropout_rate"):
            check_number(field, getattr(self, field), low=0.0, high=1.0,
                          high_open=True)
        check_number("eval_crop", self.eval_crop, low=0.0, high=1.0,
                      low_open=True)
        for field, high in _INT_CAPS.items():
            if getattr(self, field) is not None or field not in _OPTIONAL:
                check_int(field, getattr(self, field),
                          low=0 if field in ("warmup_steps", "seed") else 1,
                          high=high)
        if self.epochs is not None:
            check_number("epochs", self.epochs, low=0.0,
                         high=limits.MAX_EPOCHS, low_open=True)
        if self.total_steps is None and self.epochs is None:
            raise ValueError(
                "a recipe needs total_steps or epochs; received "
                "total_steps=None and epochs=None")
        if self.grad_clip_norm is not None:
            check_number("grad_clip_norm", self.grad_clip_norm, low=0.0,
                          low_open=True)
        if self.ema_decay is not None:
            check_number("ema_decay", self.ema_decay, low=0.0, high=1.0,
                          low_open=True, high_open=True)
        if self.crop_area is not None:
            area = tuple(self.crop_area)
            if (len(area) != 2 or not all(isinstance(a, (int, float))
                                          for a in area)
                    or not 0.0 < area[0] <= area[1] <= 1.0):
                raise ValueError(
                    "crop_area must be None or (low, high) with 0 < low <= "
                    f"high <= 1; received crop_area={self.crop_area!r}")
            object.__setattr__(self, "crop_area",
                               tuple(float(a) for a in area))
        if (self.total_steps is not None
                and self.warmup_steps >= self.total_steps):
            raise ValueError(
                f"warmup_steps={self.warmup_steps} (--warmup-steps) must be "
                f"smaller than total_steps={self.total_steps} (--steps)")
        if self.total_steps is not None:
            check_ema(self.ema_decay, self.total_steps)
        object.__setattr__(self, "lr_sweep", tuple(self.lr_sweep))
        check_choice("loss", self.loss, LOSSES)
        for field in ("mixup_alpha", "cutmix_alpha"):
            check_number(field, getattr(self, field), low=0.0,
                         high=limits.MAX_MIX_ALPHA)
        check_number("mix_switch_prob", self.mix_switch_prob, low=0.0,
                     high=1.0)
        check_number("drop_path_rate", self.drop_path_rate, low=0.0,
                     high=1.0, high_open=True)
        randaugment = check_augment(self.randaugment, self.random_erasing,
                                    self.three_augment, self.color_jitter)[0]
        object.__setattr__(self, "randaugment", randaugment)
        if self.layer_decay is not None:
            check_number("layer_decay", self.layer_decay, low=0.0, high=1.0,
                         low_open=True)
        if self.loss == "bce" and self.label_smoothing:
            raise ValueError(
                "loss='bce' makes every class present in a target a "
                "positive, and label smoothing puts every class in every "
                "target; received loss='bce' with label_smoothing="
                f"{self.label_smoothing!r}")

    @property
    def mixes(self):
        """Whether training batches are mixed (MixUp or CutMix on)."""
        return bool(self.mixup_alpha or self.cutmix_alpha)

    @property
    def dense_targets(self):
        """Whether the training targets are ``(batch, num_classes)`` rows
        (mixed, or for the BCE loss) rather than integer labels."""
        return self.mixes or self.loss == "bce"

    def replace(self, **fields):
        """A copy with ``fields`` changed (unknown names raise)."""
        _check_fields(fields)
        return dataclasses.replace(self, **fields)

    def steps_for(self, num_examples):
        """Optimizer steps of this recipe on ``num_examples`` images."""
        if self.total_steps is not None:
            return self.total_steps
        return max(1, math.ceil(self.epochs * num_examples / self.batch_size))

    def to_dict(self):
        d = dataclasses.asdict(self)
        for field in ("lr_sweep", "crop_area", "randaugment"):
            if d[field] is not None:
                d[field] = list(d[field])
        return d


FIELDS = tuple(f.name for f in dataclasses.fields(Recipe))


def _check_fields(fields):
    unknown = [k for k in fields if k not in FIELDS]
    if unknown:
        hint = "; ".join(f"{k!r}: did you mean {closest(k, FIELDS)[0]!r}?"
                         for k in unknown if closest(k, FIELDS))
        hint = f" ({hint})" if hint else ""
        raise ValueError(f"unknown recipe field(s) {unknown}{hint}; fields: "
                         f"{', '.join(FIELDS)}")


# Table 4 and Appendix B.1.1. The warmup is the official code's 500 steps
# (10% for shorter runs), not in the paper's tables.
_FINETUNE = dict(optimizer="sgd", momentum=0.9, schedule="cosine",
                 batch_size=512, grad_clip_norm=1.0, weight_decay=0.0,
                 image_size=384, dropout_rate=0.0)
# Table 3.
_PRETRAIN = dict(optimizer="adam", beta_1=0.9, beta_2=0.999, batch_size=4096,
                 warmup_steps=10_000, image_size=224, grad_clip_norm=None,
                 checkpoint_every=1000, log_every=50)

# What DeiT and DeiT III share (facebookresearch/deit's main.py defaults).
_DEIT = dict(beta_1=0.9, beta_2=0.999, schedule="cosine",
             grad_clip_norm=None, weight_decay=0.05, dropout_rate=0.0,
             crop_area=(0.08, 1.0), flip=True, eval_crop=0.875,
             mixup_alpha=0.8, cutmix_alpha=1.0, mix_switch_prob=0.5,
             ema_decay=0.99996, checkpoint_every=1000, log_every=50)

# Each named recipe's fields.
_NAMED = {
    # VTAB setting: the one learning rate the paper uses for all 19 tasks.
    "finetune": dict(_FINETUNE, learning_rate=0.01, total_steps=2500,
                     warmup_steps=250, lr_sweep=(0.01,)),
    "finetune-imagenet": dict(
        _FINETUNE, learning_rate=0.03, total_steps=20_000, warmup_steps=500,
        lr_sweep=(0.003, 0.01, 0.03, 0.06), ema_decay=0.9999),
    "finetune-cifar": dict(
        _FINETUNE, learning_rate=0.03, total_steps=10_000, warmup_steps=500,
        lr_sweep=(0.001, 0.003, 0.01, 0.03)),
    "finetune-pets-flowers": dict(
        _FINETUNE, learning_rate=0.01, total_steps=500, warmup_steps=50,
        lr_sweep=(0.001, 0.003, 0.01, 0.03)),
    # ViT-B and ViT-L on ImageNet-21k (the released pre-trainings).
    "pretrain": dict(_PRETRAIN, learning_rate=1e-3, schedule="linear",
                     weight_decay=0.03, dropout_rate=0.1, epochs=90),
    # ImageNet from scratch: strong regularisation, clipping at norm 1.
    "pretrain-imagenet": dict(
        _PRETRAIN, grad_clip_norm=1.0, learning_rate=3e-3, schedule="cosine",
        weight_decay=0.3, dropout_rate=0.1, epochs=300),
    # JFT-300M, ViT-B (Table 3 lists 8e-4 for B, 6e-4 L/32, 4e-4 L/16, 3e-4 H).
    "pretrain-jft": dict(
        _PRETRAIN, learning_rate=8e-4, schedule="linear", weight_decay=0.1,
        dropout_rate=0.0, epochs=7),
    # Masked patch prediction (B.1.2): no weight decay or clipping is
    # stated. The paper ran 1M steps but saw diminishing returns after 100k
    # steps: the recipe stops there.
    "mpp": dict(_PRETRAIN, log_every=10, learning_rate=2e-4,
                schedule="cosine", weight_decay=0.0, dropout_rate=0.0,
                total_steps=100_000),
    # "How to train your ViT?" (Steiner et al. 2021), ImageNet-1k from
    # scratch: big_vision's configs/vit_i1k.py ("medium2" augmentation) with
    # the released B/32 checkpoint's regularisation (B_32-i1k-300ep-
    # lr_0.001-aug_medium2-wd_0.1-do_0.1-sd_0.1). Deviation: RandAugment is
    # timm's, whose scale ends at 10, so big_vision's magnitude 15 is 10.
    "augreg": dict(
        optimizer="adam", beta_1=0.9, beta_2=0.999, learning_rate=1e-3,
        schedule="cosine", warmup_steps=10_000, epochs=300, batch_size=4096,
        grad_clip_norm=1.0, weight_decay=0.1, dropout_rate=0.1,
        drop_path_rate=0.1, image_size=224, crop_area=(0.05, 1.0), flip=True,
        eval_crop=0.875, randaugment=(2, 10), mixup_alpha=0.5,
        checkpoint_every=1000, log_every=50),
    # DeiT-B (Touvron et al. 2021), facebookresearch/deit's main.py defaults
    # at 2 nodes x 8 GPUs x 64: lr 5e-4 * batch / 512, 5 warmup epochs
    # (6,255 steps). Deviations: the schedule starts and ends at 0 (timm's
    # at 1e-6 and 1e-5), no repeated augmentation, Keras' RandomErasing.
    "deit": dict(
        _DEIT, optimizer="adam", learning_rate=1e-3, scale_lr_with_batch=True,
        warmup_steps=6_255, epochs=300, batch_size=1024, label_smoothing=0.1,
        drop_path_rate=0.1, image_size=224, randaugment=(2, 9, 0.5),
        random_erasing=0.25),
    # DeiT III ViT-B (Touvron et al. 2022), facebookresearch/deit's
    # README_revenge.md command (8 GPUs x 256); stochastic depth 0.05 for
    # S, 0.45 for L. Deviations: no repeated augmentation; Keras' LAMB
    # decays outside its trust ratio; colour jitter in a fixed order.
    "deit3": dict(
        _DEIT, optimizer="lamb", learning_rate=3e-3, warmup_steps=3_125,
        epochs=800, batch_size=2048, label_smoothing=0.0, drop_path_rate=0.2,
        image_size=192, three_augment=True, color_jitter=0.3, loss="bce"),
}
RECIPES = {name: Recipe(name=name, **fields)
           for name, fields in _NAMED.items()}


def names():
    """The named recipes."""
    return sorted(RECIPES)


# Appendix D.3, Figure 9: a GAP head matches the class token only at a lower
# learning rate (3e-4 against 8e-4 on JFT-300M); the other pre-trainings
# take the same ratio 3/8 (an extrapolation). Fine-tuning keeps one rate for
# both heads, as big_vision's configs/transfer.py does.
HEAD_LEARNING_RATES = {
    "pretrain-jft": {"token": 8e-4, "gap": 3e-4},
    "pretrain": {"token": 1e-3, "gap": 3.75e-4},
    "pretrain-imagenet": {"token": 3e-3, "gap": 1.125e-3},
}
CLASSIFIERS = ("token", "gap")


def head_learning_rate(recipe, classifier, batch_size=None):
    """The default learning rate of the named ``recipe`` for a model with
    the ``classifier`` head (``"token"`` or ``"gap"``) at ``batch_size``
    (default: the recipe's).

    >>> head_learning_rate("pretrain-jft", "token"), \\
    ...     head_learning_rate("pretrain-jft", "gap")
    (0.0008, 0.0003)
    >>> head_learning_rate("finetune", "gap")  # one rate for both heads
    0.01
    >>> head_learning_rate("deit", "token", batch_size=256)  # DeiT's rule
    0.00025
    """
    check_choice("classifier", classifier, CLASSIFIERS)
    base = get(recipe)
    rate = HEAD_LEARNING_RATES.get(base.name, {}).get(
        classifier, base.learning_rate)
    return scaled_learning_rate(base, rate, batch_size)


def scaled_learning_rate(recipe, rate=None, batch_size=None):
    """``rate`` (default: the recipe's ``learning_rate``) for a run of
    ``batch_size`` images per optimizer step (all replicas and
    accumulation steps): scaled linearly from the recipe's own
    ``batch_size`` when ``scale_lr_with_batch``, else unchanged.

    >>> deit = get("deit")
    >>> scaled_learning_rate(deit, batch_size=64), deit.learning_rate
    (6.25e-05, 0.001)
    >>> scaled_learning_rate(get("finetune"), batch_size=64)
    0.01
    """
    rate = recipe.learning_rate if rate is None else rate
    if batch_size is None or not recipe.scale_lr_with_batch:
        return rate
    batch_size = check_int("batch_size", batch_size, low=1,
                           high=limits.MAX_BATCH_SIZE)
    return rate * batch_size / recipe.batch_size


def get(recipe="finetune", *, classifier=None, **overrides):
    """A named recipe (or a :class:`Recipe`) with ``overrides`` applied.

    Setting ``epochs`` on a recipe that counts steps (or the reverse)
    switches it: ``get("finetune", epochs=3)`` trains for 3 epochs.

    ``classifier`` (``"token"`` or ``"gap"``) picks the head's default
    learning rate for a recipe given by name (:func:`head_learning_rate`);
    an explicit ``learning_rate`` always wins.

    A recipe asked for by name fits the run (:func:`fit_to_run`): its
    learning rate follows ``batch_size`` where the recipe scales it, and a
    run too short for its warmup or weight average gets them shortened,
    with a warning. What the caller sets explicitly is never changed.

    >>> get("pretrain-jft", classifier="gap").learning_rate
    0.0003
    >>> get("pretrain-jft", classifier="gap", learning_rate=1e-3).learning_rate
    0.001
    >>> get("deit", batch_size=128).learning_rate
    0.000125
    """
    if classifier is not None:
        check_choice("classifier", classifier, CLASSIFIERS)
    if isinstance(recipe, Recipe):
        base = recipe
    elif isinstance(recipe, str) and recipe in RECIPES:
        base = RECIPES[recipe]
    else:
        hint = did_you_mean(str(recipe), RECIPES)
        raise ValueError(f"Unknown recipe={recipe!r}.{hint} Recipes: "
                         f"{', '.join(names())}")
    _check_fields(overrides)
    named = isinstance(recipe, str)
    explicit = tuple(overrides)
    if named and "learning_rate" not in overrides:
        rate = (base.learning_rate if classifier is None
                else head_learning_rate(recipe, classifier))
        if "batch_size" in overrides:
            check_int("batch_size", overrides["batch_size"], low=1,
                      high=limits.MAX_BATCH_SIZE)
        rate = scaled_learning_rate(base, rate,
                                    overrides.get("batch_size"))
        if rate != base.learning_rate:
            overrides["learning_rate"] = rate
    if "epochs" in overrides and "total_steps" not in overrides:
        overrides["total_steps"] = None
    if "total_steps" in overrides and overrides["total_steps"] is not None \
            and "epochs" not in overrides:
        overrides["epochs"] = None
    total = overrides.get("total_steps", base.total_steps)
    if named and total is not None:
        check_int("total_steps", total, low=1, high=limits.MAX_STEPS)
        for field, fit in (("warmup_steps", fit_warmup), ("ema_decay",
                                                          fit_ema)):
            if field not in explicit:
                value = fit(base, total)
                if value != getattr(base, field):
                    overrides[field] = value
    return dataclasses.replace(base, **overrides)


def fit_to_run(recipe, total_steps, *, named=True, overrides=()):
    """``recipe`` for a run of ``total_steps`` optimizer steps: a
    ``named`` recipe's warmup and weight average not among ``overrides``
    (the fields set explicitly) shortened to fit; anything else that does
    not fit raises.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     r = fit_to_run(get("deit"), 120)
    >>> r.warmup_steps, r.ema_decay
    (12, 0.9833333333333333)
    """
    total_steps = check_int("total_steps", total_steps, low=1,
                            high=limits.MAX_STEPS)
    fields = {}
    if named and "warmup_steps" not in overrides:
        fields["warmup_steps"] = fit_warmup(recipe, total_steps)
    if named and "ema_decay" not in overrides:
        fields["ema_decay"] = fit_ema(recipe, total_steps)
    if fields:
        recipe = recipe.replace(**fields)
    if recipe.warmup_steps >= total_steps:
        raise ValueError(
            f"warmup_steps={recipe.warmup_steps} (--warmup-steps) must be "
            f"smaller than the run's total_steps={total_steps} "
            "(--steps, or --epochs times the steps per epoch)")
    check_ema(recipe.ema_decay, total_steps)
    return recipe


def fit_warmup(recipe, total_steps):
    """The recipe's ``warmup_steps``, or, when a run of ``total_steps``
    is too short for it, the warmup scaled with the run (the recipe's
    fraction; 10% for one counted in epochs) and a warning saying so.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     get("finetune", total_steps=30).warmup_steps
    3
    """
    if recipe.warmup_steps < total_steps:
        return recipe.warmup_steps
    fraction = (recipe.warmup_steps / recipe.total_steps
                if recipe.total_steps else 0.1)
    warmup = min(int(round(fraction * total_steps)), total_steps - 1)
    _warn_once(
        f"the {recipe.name} recipe's warmup_steps={recipe.warmup_steps} do "
        f"not fit a run of total_steps={total_steps}; warming up for "
        f"{warmup} steps instead ({fraction:.0%}). Set warmup_steps "
        "(--warmup-steps) to choose.")
    return warmup


def fit_ema(recipe, total_steps):
    """The recipe's ``ema_decay``, or, when its average does not fit a run
    of ``total_steps``, the largest that does (:func:`largest_ema`) and a
    warning naming both.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     get("deit", total_steps=1000).ema_decay
    0.998
    """
    if ema_fits(recipe.ema_decay, total_steps):
        return recipe.ema_decay
    ema = largest_ema(total_steps)
    instead = ("no average" if ema is None else
               f"ema_decay={ema:.6g} instead (a horizon of "
               f"{1 / (1 - ema):.0f} steps)")
    _warn_once(f"the {recipe.name} recipe's "
               f"{_ema_text(recipe.ema_decay, total_steps)}; using "
               f"{instead}. Set ema_decay (--ema) to choose.")
    return ema


def _warn_once(message):
    # Once: a command checks its recipe before the Trainer builds it again
    # (and importing TensorFlow in between resets warnings' own registry).
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


_WARNED = set()


def parse_value(field, text):
    """A command-line string for ``field`` -> its Python value
    (``"none"`` -> None, ``"0.05,1"`` -> a tuple)."""
    _check_fields({field: None})
    if text.strip().lower() in ("none", "null", ""):
        return None
    if field == "randaugment":
        parts = text.split(",")
        try:
            return ((int(parts[0]),) + tuple(float(v) for v in parts[1:])
                    if len(parts) in (2, 3) else tuple(parts))
        except ValueError:
            raise ValueError(f"randaugment must be num_ops,magnitude or "
                             f"num_ops,magnitude,magnitude_std (e.g. 2,9 or "
                             f"2,9,0.5); received randaugment={text!r}"
                             ) from None
    if field in ("crop_area", "lr_sweep"):
        try:
            return tuple(float(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"{field} must be numbers separated by commas; "
                             f"received {field}={text!r}") from None
    if field == "jit_compile" and text.lower() == "auto":
        return "auto"
    if field in ("flip", "jit_compile", "three_augment",
                 "scale_lr_with_batch"):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{field} must be true or false; received "
                         f"{field}={text!r}")
    if field in ("name", "optimizer", "schedule", "precision", "loss"):
        return text
    try:
        return int(text) if field in _INT_CAPS else float(text)
    except ValueError:
        raise ValueError(f"{field} must be a number; received "
                         f"{field}={text!r}") from None


def smoothed_loss(label_smoothing):
    """Cross-entropy from logits for integer labels with label smoothing
    (:class:`keras_vit.train.schedules.SmoothedSparseCE`)."""
    from keras_vit.train.schedules import SmoothedSparseCE

    return SmoothedSparseCE(label_smoothing)


def make_loss(recipe):
    """The recipe's Keras loss, from logits: for integer labels, or, when
    the training targets are dense rows (:attr:`Recipe.dense_targets`), one
    of :mod:`keras_vit.train.mixing` that takes integer labels too.

    >>> type(make_loss(get("deit"))).__name__, \\
    ...     type(make_loss(get("deit3"))).__name__
    ('SoftTargetCrossentropy', 'BinaryMixedTargets')
    """
    if not recipe.dense_targets:
        if not recipe.label_smoothing:
            import keras

            return keras.losses.SparseCategoricalCrossentropy(
                from_logits=True)
        return smoothed_loss(recipe.label_smoothing)
    from keras_vit.train import mixing

    if recipe.loss == "bce":
        return mixing.BinaryMixedTargets()
    return mixing.SoftTargetCrossentropy(recipe.label_smoothing)


def make_metrics(recipe):
    """The metrics to compile with: top-1 accuracy, in a form that takes
    target rows too when the recipe's training targets are rows.

    >>> make_metrics(get("finetune")), type(make_metrics(get("deit"))[0]).__name__
    (['accuracy'], 'TopOneAccuracy')
    """
    if not recipe.dense_targets:
        return ["accuracy"]
    from keras_vit.train.schedules import TopOneAccuracy

    return [TopOneAccuracy()]


def batch_mixer(recipe, num_classes):
    """The :class:`~keras_vit.train.mixing.BatchMixer` of the recipe for
    ``num_classes`` classes, or None when its targets stay integer labels.

    >>> batch_mixer(get("augreg"), 10)
    BatchMixer(mixup_alpha=0.5, cutmix_alpha=0.0, switch_prob=0.5, \
label_smoothing=0.0, num_classes=10)
    >>> batch_mixer(get("finetune"), 10) is None
    True
    """
    if not recipe.dense_targets:
        return None
    from keras_vit.train.mixing import BatchMixer

    return BatchMixer(mixup_alpha=recipe.mixup_alpha,
                      cutmix_alpha=recipe.cutmix_alpha,
                      switch_prob=recipe.mix_switch_prob,
                      label_smoothing=recipe.label_smoothing,
                      num_classes=num_classes)


def pipeline_options(recipe, num_classes=None):
    """The keyword arguments of
    :func:`keras_vit.train.data.pipeline.dataset` for the recipe's training
    batches (``num_classes`` needed when its targets are rows).

    >>> opts = pipeline_options(get("deit"), num_classes=10)
    >>> opts["randaugment"], opts["random_erasing"], opts["mixing"]
    ((2, 9.0, 0.5), 0.25, BatchMixer(mixup_alpha=0.8, cutmix_alpha=1.0, \
switch_prob=0.5, label_smoothing=0.1, num_classes=10))
    """
    if recipe.dense_targets and num_classes is None:
        raise ValueError(
            f"the {recipe.name} recipe's training targets are rows of "
            "num_classes (mixed batches or the BCE loss): "
            "pipeline_options(recipe, num_classes=...) needs num_classes; "
            "received num_classes=None")
    fields = ("seed", "crop_area", "flip", "eval_crop", "randaugment",
              "random_erasing", "three_augment", "color_jitter")
    return dict(training=True, **{f: getattr(recipe, f) for f in fields},
                mixing=batch_mixer(recipe, num_classes))


def model_options(recipe):
    """The model options the recipe sets, for
    ``keras_vit.vit(..., **model_options(r))``.

    >>> model_options(get("augreg"))
    {'dropout_rate': 0.1, 'drop_path_rate': 0.1}
    """
    return {"dropout_rate": recipe.dropout_rate,
            "drop_path_rate": recipe.drop_path_rate}


def learning_rate_schedule(recipe, total_steps, per_step=1):
    """The recipe's schedule as a Keras ``LearningRateSchedule`` over
    ``total_steps`` optimizer steps (of ``per_step`` counter ticks each).

    >>> s = learning_rate_schedule(get("finetune"), 2500)
    >>> round(float(s(249)), 4), round(float(s(2500)), 6)
    (0.01, 0.0)
    """
    from keras_vit.train.schedules import WarmupDecay

    total_steps = check_int("total_steps", total_steps, low=1,
                            high=limits.MAX_STEPS)
    if recipe.warmup_steps >= total_steps:
        raise ValueError(
            f"warmup_steps={recipe.warmup_steps} must be smaller than the "
            f"run's total_steps={total_steps}")
    return WarmupDecay(recipe.learning_rate, recipe.warmup_steps,
                       total_steps, recipe.schedule, ticks_per_step=per_step)


def compile_model(model, recipe, total_steps, *, accumulation_steps=1,
                  jit_compile="auto", objective=None):
    """Compiles ``model`` for ``total_steps`` optimizer steps of
    ``recipe``: its optimizer (:func:`make_optimizer`), loss and metrics,
    unless ``objective`` gives ``(loss, metrics)`` of its own. Returns the
    optimizer.

    >>> import keras_vit
    >>> model = keras_vit.vit(16, 8, 8, 1, 1, 8, 3)
    >>> deit = get("deit", warmup_steps=10, ema_decay=None)  # a short run
    >>> opt = compile_model(model, deit, 100, accumulation_steps=2)
    >>> type(model.loss).__name__, opt.gradient_accumulation_steps
    ('SoftTargetCrossentropy', 2)
    """
    optimizer = make_optimizer(recipe, total_steps, clip_in_optimizer=True,
                               accumulation_steps=accumulation_steps,
                               model=model)
    loss, metrics = objective or (make_loss(recipe), make_metrics(recipe))
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics,
                  jit_compile=jit_compile)
    return optimizer


def make_optimizer(recipe, total_steps, *, clip_in_optimizer=True,
                   accumulation_steps=1, model=None):
    """The recipe's Keras optimizer, with ``global_clipnorm`` (of the whole
    batch, after accumulation and the cross-replica sum; False leaves it
    out), ``gradient_accumulation_steps`` and ``use_ema``. A recipe with
    ``layer_decay`` needs the ``model`` it trains.

    >>> opt = make_optimizer(get("finetune", ema_decay=0.99), 1000,
    ...                      accumulation_steps=4)
    >>> opt.global_clipnorm, opt.gradient_accumulation_steps, opt.use_ema
    (1.0, 4, True)
    """
    if recipe.layer_decay is not None and model is None:
        raise ValueError(
            f"layer_decay={recipe.layer_decay} needs the model: "
            "make_optimizer(recipe, total_steps, model=model)")
    from keras_vit.runtime.compat import (ema_once_per_step,
                                          sum_gradients_before_the_optimizer)

    optimizer = _optimizer(recipe, total_steps, clip_in_optimizer,
                           accumulation_steps)
    check_ema(recipe.ema_decay, total_steps)
    if recipe.layer_decay is not None:
        from keras_vit.train.layer_decay import with_layer_decay

        optimizer = with_layer_decay(optimizer, model, recipe.layer_decay)
    # The recipe's EMA is per optimizer step, also when Keras accumulates.
    ema_once_per_step(optimizer)
    from keras_vit.runtime.backend import is_tensorflow

    if is_tensorflow():
        # Under tf.distribute: clip and accumulate the replicas' sum.
        sum_gradients_before_the_optimizer(optimizer)
    return optimizer


def _optimizer(recipe, total_steps, clip_in_optimizer, accumulation_steps):
    import keras

    # Keras counts iterations per micro-batch when it accumulates, and its
    # schedule reads that counter: the schedule counts steps of per_step.
    lr = learning_rate_schedule(recipe, total_steps,
                                per_step=max(1, accumulation_steps))
    kwargs = {"weight_decay": recipe.weight_decay or None}
    if clip_in_optimizer and recipe.grad_clip_norm is not None:
        kwargs["global_clipnorm"] = recipe.grad_clip_norm
    if accumulation_steps > 1:
        kwargs["gradient_accumulation_steps"] = accumulation_steps
    if recipe.ema_decay is not None:
        kwargs["use_ema"] = True
        kwargs["ema_momentum"] = recipe.ema_decay
    if recipe.optimizer == "sgd":
        from keras_vit.train.schedules import SGD

        return SGD(lr, momentum=recipe.momentum, **kwargs)
    kwargs.update(beta_1=recipe.beta_1, beta_2=recipe.beta_2)
    if recipe.optimizer == "lamb":
        return keras.optimizers.Lamb(lr, **kwargs)
    if recipe.weight_decay:
        return keras.optimizers.AdamW(lr, **kwargs)
    return keras.optimizers.Adam(lr, **kwargs)
