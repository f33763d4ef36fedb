"""Self-supervised pre-training by masked patch prediction (paper section
4.6 and Appendix B.1.2), then fine-tuning with the usual recipes.

The objective, as the paper describes it: 50% of the patch embeddings are
corrupted, and of those 80% are replaced by a learnable [mask] embedding,
10% by the embedding of another random patch (here: any other patch of the
batch) and 10% are left as they are. The encoder's output at every
corrupted patch predicts one of three targets:

- ``"mean_color"`` (the paper's choice, the default): the patch's mean
  colour in 3 bits per channel, one of 512 classes;
- ``"color_4x4"``: the patch downsized to 4x4 in 3-bit colours (16
  predictions of 512 classes);
- ``"l2"``: the full patch (pixels in [-1, 1]), regressed with a squared
  error.

The loss counts corrupted patches only. Corruption happens after the
patch-embedding projection and before the class token and position
embeddings, so :class:`MaskedPatchPrediction` wraps a ViT by calling the
ViT's own layers (hybrids included: their ResNet stem runs first). Every
draw is a stateless function of the run's seed and step, so a resumed run
corrupts exactly what the killed one would have.

Pre-train, then fine-tune (a few steps on the built-in digits; a real run
uses ``recipe="mpp"`` as it stands):

>>> import keras_vit, keras_vit.train as kt
>>> encoder = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
>>> run = kt.pretrain_mpp(encoder, "digits", total_steps=4, warmup_steps=1,
...                       batch_size=16, crop_area=None, strategy="default",
...                       verbose=False)
>>> run.metrics["objective"]["target"], run.metrics["final_step"]
('mean_color', 4)
>>> classifier = kt.mpp_to_classifier(run.model, num_classes=10)
>>> tuned = kt.fine_tune(classifier, "digits", "digits:test", total_steps=3,
...                      warmup_steps=1, batch_size=16, crop_area=None,
...                      strategy="default", verbose=False)
>>> 0.0 <= tuned.metrics["eval"]["accuracy"] <= 1.0
True

From the command line: ``keras-vit pretrain ViT-B/16 --objective mpp --data
DIR`` (``DIR``: a folder of images in any layout), then ``keras-vit
fine-tune runs/<name>/model.keras --data LABELLED`` (a saved masked patch
prediction model becomes a classifier with a zero-initialised head).
"""

from __future__ import annotations

import os
import pathlib
import warnings

import keras
import numpy as np
from keras import ops

from keras_vit import compat
from keras_vit.layers import PACKAGE
from keras_vit.zoo.resolve import model_path, resolve_model
from keras_vit.models.vit import VisionTransformer
from keras_vit.train import data as data_lib
from keras_vit.train import engine
from keras_vit.train import recipes

# Defined beside the recipes, which the command line reads without Keras.
OBJECTIVES, TARGETS = recipes.MPP_OBJECTIVES, recipes.MPP_TARGETS
# Codes of the corruption plan, one per patch.
KEEP, MASK, RANDOM, UNCHANGED = 0, 1, 2, 3
COLOR_BITS = 3
LEVELS = 2 ** COLOR_BITS  # 8 levels per channel: 512 colours for RGB
DOWNSIZED = 4  # the 4x4 target


def _choice(field, value, choices):
    """``value`` with '-' read as '_', or a ValueError naming ``field``."""
    from keras_vit.errors import check_choice

    text = str(value).replace("-", "_") if isinstance(value, str) else value
    if text in choices:
        return text
    return check_choice(field, value, choices)


def check_target(target):
    """The canonical name of a target (``"color-4x4"`` is accepted)."""
    return _choice("target", target, TARGETS)


def check_objective(objective):
    """The canonical name of a self-supervised objective."""
    return _choice("objective", objective, OBJECTIVES)


def _fraction(field, value, low_open=False):
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (0.0 < value if low_open else 0.0 <= value) and value <= 1.0)
    if not ok:
        rng = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{field} must be a number in {rng}; received "
                         f"{field}={value!r}")
    return float(value)


def _fractions(rate, mask_fraction, random_fraction):
    """The corruption's three fractions, checked."""
    rate = _fraction("corruption_rate", rate, low_open=True)
    mask_fraction = _fraction("mask_fraction", mask_fraction)
    random_fraction = _fraction("random_fraction", random_fraction)
    if mask_fraction + random_fraction > 1.0 + 1e-9:
        raise ValueError(
            "mask_fraction + random_fraction must be at most 1; received "
            f"mask_fraction={mask_fraction}, random_fraction="
            f"{random_fraction}")
    return rate, mask_fraction, random_fraction


# --------------------------------------------------------------------------
# the corruption and the targets (keras.ops, used in every backend's step)


def _draws(batch_size, num_patches, seed):
    """Three stateless draws of shape ``(batch_size, num_patches)`` from
    ``seed`` (two integers): which patches, how, and another patch's flat
    index in ``[0, total - 1)``. Keras' own random ops take no seed tensor
    (only ints and SeedGenerators), and the step needs a seed that is a
    function of the run's step, so each backend's stateless generator is
    called: TensorFlow's ``stateless_uniform``, ``jax.random`` on a key made
    of the seed, a torch ``Generator`` seeded with it (the torch step is
    eager, so the seed is concrete)."""
    backend = keras.backend.backend()
    total = batch_size * num_patches
    if backend == "tensorflow":
        import tensorflow as tf

        seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
        shape = tf.stack([batch_size, num_patches])
        return (tf.random.stateless_uniform(shape, seeds[0]),
                tf.random.stateless_uniform(shape, seeds[1]),
                tf.random.stateless_uniform(shape, seeds[2], minval=0,
                                            maxval=total - 1,
                                            dtype=tf.int32))
    shape = (batch_size, num_patches)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        key = jax.random.wrap_key_data(
            jnp.asarray(seed).astype(jnp.uint32), impl="threefry2x32")
        pick, kind, other = jax.random.split(key, 3)
        return (jax.random.uniform(pick, shape),
                jax.random.uniform(kind, shape),
                jax.random.randint(other, shape, 0, total - 1, jnp.int32))
    import torch

    first, second = (int(v) for v in ops.convert_to_numpy(seed))
    generator = torch.Generator().manual_seed(
        (first * 1_000_003 + second) & 0x7FFFFFFFFFFFFFFF)
    return tuple(ops.convert_to_tensor(x) for x in (
        torch.rand(shape, generator=generator),
        torch.rand(shape, generator=generator),
        torch.randint(0, total - 1, shape, generator=generator,
                      dtype=torch.int32)))


def corruption_plan(batch_size, num_patches, seed, *, rate=0.5,
                    mask_fraction=0.8, random_fraction=0.1):
    """Which patches to corrupt and how: ``(mode, source)``, both int32
    ``(batch_size, num_patches)``.

    Every patch is chosen independently with probability ``rate``; a chosen
    patch is replaced by the [mask] embedding (``mode == MASK``) with
    probability ``mask_fraction``, by another patch's embedding
    (``RANDOM``) with ``random_fraction``, else left as it is
    (``UNCHANGED``); ``KEEP`` marks the patches that are not chosen.
    ``source`` is, for every patch, a flat index (``b * num_patches + n``)
    of another patch of the batch, drawn uniformly; only ``RANDOM`` patches
    use it. ``seed`` is a stateless seed (two integers).

    >>> mode, source = (ops.convert_to_numpy(x)
    ...                 for x in corruption_plan(2, 3, (0, 1)))
    >>> tuple(mode.shape), int(mode.max()) <= UNCHANGED
    ((2, 3), True)
    >>> bool((source != np.arange(6).reshape(2, 3)).all())
    True
    """
    rate, mask_fraction, random_fraction = _fractions(
        rate, mask_fraction, random_fraction)
    total = batch_size * num_patches
    if isinstance(total, int) and total < 2:
        raise ValueError(
            "the corruption needs at least two patches per batch; received "
            f"batch_size={batch_size}, num_patches={num_patches}")
    pick, kind, other = _draws(batch_size, num_patches, seed)
    how = ops.where(kind < mask_fraction, MASK,
                    ops.where(kind < mask_fraction + random_fraction, RANDOM,
                              UNCHANGED))
    mode = ops.where(pick < rate, how, KEEP)
    # Another patch: uniform over the other total - 1 positions.
    own = ops.reshape(ops.arange(total, dtype="int32"), (-1, num_patches))
    source = other + ops.cast(other >= own, "int32")
    return ops.cast(mode, "int32"), source


def _patches(images, grid):
    """(B, H, W, C) -> (B, rows * cols, H / rows, W / cols, C)."""
    rows, cols = grid
    h, w, c = images.shape[1], images.shape[2], images.shape[3]
    ph, pw = h // rows, w // cols
    x = ops.reshape(images, (-1, rows, ph, cols, pw, c))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return ops.reshape(x, (-1, rows * cols, ph, pw, c))


def _area_weights(size_in, size_out):
    """(size_out, size_in) weights of an area resize: each output pixel
    averages the input pixels it covers, in proportion to the overlap."""
    scale = size_in / size_out
    weights = np.zeros((size_out, size_in), "float32")
    for i in range(size_out):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), min(size_in, int(np.ceil(hi)))):
            weights[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
    return weights


def _downsize(images, grid, size):
    """Each patch reduced to ``size`` x ``size`` by area averaging:
    (B, N, size, size, C)."""
    rows, cols = grid
    ph, pw = images.shape[1] // rows, images.shape[2] // cols
    if ph % size == 0 and pw % size == 0:
        x = _patches(images, grid)
        c = images.shape[3]
        x = ops.reshape(x, (-1, rows * cols, size, ph // size, size,
                            pw // size, c))
        return ops.mean(x, axis=(3, 5))
    # A patch side that is not a multiple (ViT-H/14): area resize the image.
    along_h = _area_weights(images.shape[1], rows * size)
    along_w = _area_weights(images.shape[2], cols * size)
    small = ops.einsum("ih,bhwc,jw->bijc", along_h, images, along_w)
    return _patches(small, grid)


def color_class(pixels):
    """Pixels in [-1, 1], channels last -> their 3-bit colour class:
    ``r * 64 + g * 8 + b`` with each channel in 8 equal bins (512 classes
    for RGB).

    >>> ops.convert_to_numpy(color_class(np.array([[-1.0, 0.0, 1.0]])))
    array([39], dtype=int32)
    """
    pixels = ops.cast(ops.convert_to_tensor(pixels), "float32")
    levels = ops.clip(ops.floor((pixels + 1.0) * (LEVELS / 2.0)),
                      0.0, LEVELS - 1.0)
    channels = pixels.shape[-1]
    weights = ops.convert_to_tensor(
        [float(LEVELS ** (channels - 1 - i)) for i in range(channels)],
        "float32")
    return ops.cast(ops.sum(levels * weights, axis=-1), "int32")


def patch_targets(images, grid, target="mean_color"):
    """What each patch of ``images`` (B, H, W, C) in [-1, 1] is to be
    predicted as, on a ``grid`` of (rows, cols) patches:

    - ``"mean_color"``: int32 (B, N), the class of the patch's mean colour;
    - ``"color_4x4"``: int32 (B, N, 16), classes of the 4x4 downsized patch
      (row-major);
    - ``"l2"``: float32 (B, N, P * P * C), the patch's pixels (row-major,
      channels last).

    >>> x = np.full((1, 8, 8, 3), -1.0, "float32"); x[:, :4, :4] = 1.0
    >>> ops.convert_to_numpy(patch_targets(x, (2, 2))).tolist()
    [[511, 0, 0, 0]]
    """
    target = check_target(target)
    images = ops.cast(ops.convert_to_tensor(images), "float32")
    if target == "mean_color":
        return color_class(ops.mean(_patches(images, grid), (2, 3)))
    if target == "color_4x4":
        small = _downsize(images, grid, DOWNSIZED)
        return ops.reshape(color_class(small),
                           (-1, small.shape[1], DOWNSIZED ** 2))
    x = _patches(images, grid)
    return ops.reshape(x, (-1, x.shape[1], x.shape[2] * x.shape[3]
                           * x.shape[4]))


def masked_loss(predictions, targets, mode, target, channels=3):
    """Per image: the loss averaged over its corrupted patches, and the
    fraction of them predicted right (for ``"l2"``: whose predicted mean
    colour has the target's 3-bit class). Both float32 (B,).

    ``predictions`` are the model's (B, N, K) outputs, ``targets`` those of
    :func:`patch_targets`, ``mode`` the corruption plan (``KEEP`` patches
    do not count).
    """
    target = check_target(target)
    predictions = ops.cast(ops.convert_to_tensor(predictions), "float32")
    targets = ops.convert_to_tensor(targets)
    n = predictions.shape[1]
    if target == "l2":
        per_patch = ops.mean(ops.square(predictions - targets), -1)

        def mean_colour(x):
            return ops.mean(ops.reshape(x, (-1, n, x.shape[-1] // channels,
                                            channels)), 2)

        right = ops.cast(ops.equal(color_class(mean_colour(predictions)),
                                   color_class(mean_colour(targets))),
                         "float32")
    else:
        if target == "color_4x4":
            predictions = ops.reshape(predictions,
                                      (-1, n, targets.shape[-1],
                                       predictions.shape[-1]
                                       // targets.shape[-1]))
        targets = ops.cast(targets, "int32")
        log_probs = ops.log_softmax(predictions, axis=-1)
        per_patch = -ops.squeeze(ops.take_along_axis(
            log_probs, ops.expand_dims(targets, -1), axis=-1), -1)
        right = ops.cast(ops.equal(
            ops.cast(ops.argmax(predictions, axis=-1), "int32"), targets),
            "float32")
        if target == "color_4x4":
            per_patch = ops.mean(per_patch, -1)
            right = ops.mean(right, -1)
    weight = ops.cast(ops.not_equal(ops.convert_to_tensor(mode), KEEP),
                      "float32")
    count = ops.maximum(ops.sum(weight, -1), 1.0)
    return (ops.sum(per_patch * weight, -1) / count,
            ops.sum(right * weight, -1) / count)


# --------------------------------------------------------------------------
# the model


@keras.saving.register_keras_serializable(package=PACKAGE)
class PatchCorruption(keras.layers.Layer):
    """Applies a corruption plan to patch embeddings: ``[tokens (B, N, D),
    mode (B, N), source (B, N)] -> tokens``. ``MASK`` patches become the
    learnable [mask] embedding, ``RANDOM`` ones the embedding of the patch
    at flat index ``source`` of the batch; the others pass unchanged."""

    def build(self, input_shape):
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(input_shape[0][-1],),
            initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.built = True

    def call(self, inputs):
        tokens, mode, source = inputs
        shape = ops.shape(tokens)
        flat = ops.reshape(tokens, (-1, shape[-1]))
        swapped = ops.reshape(
            ops.take(flat, ops.reshape(source, (-1,)), axis=0), shape)
        mode = ops.expand_dims(mode, -1)
        mask = ops.cast(self.mask_embedding, tokens.dtype)
        out = ops.where(ops.equal(mode, RANDOM), swapped, tokens)
        return ops.where(ops.equal(mode, MASK), mask, out)

    def compute_output_shape(self, input_shape):
        return input_shape[0]


# What a classifier made from the encoder may set differently.
_CLASSIFIER_OPTIONS = {"dropout_rate", "attention_dropout_rate",
                       "classifier_activation", "return_attention_scores",
                       "include_preprocessing", "head_bias_init", "dtype"}


def _encoder_config(encoder):
    """The ViT's config without what masked patch prediction does not use
    (head, pooling, pre-logits, attention outputs)."""
    return dict(encoder.get_config(), include_top=False, pooling=None,
                representation_size=None, classifier_activation=None,
                return_attention_scores=False)


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedPatchPrediction(keras.Model):
    """A Vision Transformer set up for masked patch prediction.

    Takes ``[images, mode, source]`` (images as the ViT takes them; ``mode``
    and ``source`` from :func:`corruption_plan`) and returns, for every
    patch, ``(B, N, K)`` predictions of ``target``: 512 colour logits, 16 x
    512 logits for ``"color_4x4"``, or the patch's pixels for ``"l2"``.
    It reuses ``encoder``'s layers (their weights are shared, not copied);
    a linear ``mpp_head`` reads each patch's representation after the final
    LayerNorm.

    Args:
        encoder: a :class:`~keras_vit.VisionTransformer` (its head, pooling
            and pre-logits are not used), or its config.
        target: ``"mean_color"``, ``"color_4x4"`` or ``"l2"``.
        corruption_rate: the fraction of patches corrupted (paper: 0.5).
        mask_fraction, random_fraction: of the corrupted patches, the
            fractions replaced by [mask] and by another patch (0.8, 0.1;
            the rest stay unchanged).

    >>> import numpy as np, keras_vit
    >>> mpp = MaskedPatchPrediction(keras_vit.vit(16, 4, 32, 1, 2, 64, 10))
    >>> mode, source = corruption_plan(2, mpp.num_patches, (0, 0))
    >>> images = np.zeros((2, 16, 16, 3), "float32")
    >>> plan = [ops.convert_to_numpy(mode), ops.convert_to_numpy(source)]
    >>> tuple(mpp([images] + plan).shape)
    (2, 16, 512)
    """

    def __init__(self, encoder, target="mean_color", corruption_rate=0.5,
                 mask_fraction=0.8, random_fraction=0.1,
                 name="masked_patch_prediction", **kwargs):
        if isinstance(encoder, dict):
            encoder = VisionTransformer.from_config(encoder)
        if not isinstance(encoder, VisionTransformer):
            raise ValueError(
                "masked patch prediction needs a VisionTransformer (a ViT "
                "or hybrid of the zoo); received encoder="
                f"{getattr(encoder, 'name', encoder)!r} of type "
                f"{type(encoder).__name__}")
        target = check_target(target)
        rate, mask_fraction, random_fraction = _fractions(
            corruption_rate, mask_fraction, random_fraction)
        rows, cols = encoder.grid_size
        height, width, channels = encoder.inputs[0].shape[1:]
        pixel_patch = (height // rows, width // cols)
        size = {"mean_color": LEVELS ** channels,
                "color_4x4": DOWNSIZED ** 2 * LEVELS ** channels,
                "l2": pixel_patch[0] * pixel_patch[1] * channels}[target]
        dtype = encoder.get_layer("patch_embedding").dtype_policy
        kwargs.pop("dtype", None)

        images = keras.Input(shape=(height, width, channels), name="images")
        mode = keras.Input(shape=(rows * cols,), dtype="int32",
                           name="corruption")
        source = keras.Input(shape=(rows * cols,), dtype="int32",
                             name="source")
        # The ViT's own graph replayed on the new input with its own layers
        # (shared, not copied), the corruption spliced in after the patch
        # embedding. Replaying, not re-listing the layers, follows every
        # stem, position-embedding kind and placement the ViT may have. This
        # is the replay keras.models.clone_model runs (with call_function);
        # clone_model itself would then build a model over `images` alone,
        # which the plan inputs make impossible, so the replay is called
        # directly.
        corruption = PatchCorruption(dtype=dtype, name="patch_corruption")
        found = {}

        def call(layer, *args, **kw):
            out = layer(*args, **kw)
            if layer.name == "patch_embedding":
                out = corruption([out, mode, source])
            elif layer.name == "encoder_norm":
                found["tokens"] = out
            return out

        compat.run_through_graph(encoder, images, call)
        if "tokens" not in found or not corruption.built:
            raise ValueError(
                "masked patch prediction needs a ViT with layers named "
                "patch_embedding and encoder_norm; received encoder="
                f"{encoder.name!r}")
        x = found["tokens"]
        has_token = encoder.classifier == "token"
        if has_token:
            x = keras.layers.Cropping1D((1, 0), dtype=dtype,
                                        name="drop_class_token")(x)
        # Zero-initialised like the paper's classification heads: the first
        # loss is exactly log(512) for the colour targets.
        x = keras.layers.Dense(size, kernel_initializer="zeros", dtype=dtype,
                               name="mpp_head")(x)
        super().__init__(inputs=[images, mode, source], outputs=x, name=name,
                         **kwargs)
        self.encoder_config = _encoder_config(encoder)
        self.target = target
        self.corruption_rate = rate
        self.mask_fraction = mask_fraction
        self.random_fraction = random_fraction
        self.grid_size = (rows, cols)
        self.num_patches = rows * cols
        self.pixel_patch = pixel_patch
        self.num_channels = channels
        self.dropout_rate = encoder.dropout_rate
        zoo_name = getattr(encoder, "zoo_name", None)
        if zoo_name:
            self.zoo_name = zoo_name

    def get_config(self):
        return {"encoder": self.encoder_config, "target": self.target,
                "corruption_rate": self.corruption_rate,
                "mask_fraction": self.mask_fraction,
                "random_fraction": self.random_fraction, "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)

    def objective(self):
        """The settings of the objective, as a dict (for run records)."""
        return {"name": "mpp", "target": self.target,
                "corruption_rate": self.corruption_rate,
                "mask_fraction": self.mask_fraction,
                "random_fraction": self.random_fraction,
                "num_patches": self.num_patches,
                "pixel_patch": list(self.pixel_patch)}

    def plan(self, batch_size, seed):
        """This model's :func:`corruption_plan` for ``batch_size`` images."""
        return corruption_plan(batch_size, self.num_patches, seed,
                               rate=self.corruption_rate,
                               mask_fraction=self.mask_fraction,
                               random_fraction=self.random_fraction)

    def loss_terms(self, images, seed, training=True):
        """Corrupts, predicts and scores a batch: per-image loss and
        fraction right over the corrupted patches, float32 (B,) each."""
        images = ops.cast(ops.convert_to_tensor(images), "float32")
        batch = ops.shape(images)[0]  # a tensor when not known statically
        mode, source = self.plan(batch, seed)
        predictions = self([images, mode, source], training=training)
        if self.encoder_config.get("include_preprocessing"):
            images = images / 127.5 - 1.0  # targets see what the ViT sees
        targets = patch_targets(images, self.grid_size, self.target)
        return masked_loss(predictions, targets, mode, self.target,
                           self.num_channels)

    def to_classifier(self, num_classes, *, image_size=None, **options):
        """A :class:`~keras_vit.VisionTransformer` classifier with this
        model's encoder weights and a zero-initialised head (the paper's
        fine-tuning start, Appendix B.1.1). ``image_size`` resizes the
        position embeddings; ``options`` change other ViT settings
        (``dropout_rate=...``)."""
        from keras_vit.zoo import convert

        other = sorted(set(options) - _CLASSIFIER_OPTIONS)
        if other:
            raise ValueError(
                f"to_classifier cannot change the encoder's architecture; "
                f"received {', '.join(f'{k}={options[k]!r}' for k in other)}"
                f" (it takes {', '.join(sorted(_CLASSIFIER_OPTIONS))})")
        config = dict(self.encoder_config, include_top=True, pooling=None,
                      num_classes=num_classes, **options)
        if image_size is not None:
            config["image_size"] = image_size
        config["name"] = "vision_transformer"
        classifier = VisionTransformer.from_config(config)
        arrays = {}
        for variable in self.weights:
            key = convert.checkpoint_key(variable.path)
            if key is not None:
                arrays[key] = np.asarray(variable.numpy())
        # Strict: anything of the encoder that does not arrive is an error.
        convert.load_weights(classifier, arrays, source_name="<mpp encoder>")
        zoo_name = getattr(self, "zoo_name", None)
        if zoo_name:
            classifier.zoo_name = zoo_name
        return classifier


def _load_mpp(spec):
    """A MaskedPatchPrediction from itself, a ``.keras`` file or a run
    directory holding ``model.keras``."""
    if isinstance(spec, MaskedPatchPrediction):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        try:
            path = model_path(spec, "mpp_model")
        except FileNotFoundError:
            path = None
        if path is None or not os.path.isfile(path):
            raise FileNotFoundError(
                f"No masked patch prediction model at {os.fspath(spec)!r} "
                "(expected a .keras file or a pretrain run directory with "
                "model.keras)")
        model = resolve_model(path, argument="mpp_model")
        if isinstance(model, MaskedPatchPrediction):
            return model
        spec = model
    raise ValueError(
        "expected a MaskedPatchPrediction model, its .keras file or its run "
        f"directory; received {getattr(spec, 'name', spec)!r}")


def mpp_to_classifier(mpp_model, num_classes, *, image_size=None,
                      **options):
    """The encoder of a masked-patch-prediction model (the model, its
    ``.keras`` file or its run directory) as a classifier with a
    zero-initialised head of ``num_classes``; ready for
    :func:`~keras_vit.train.fine_tune`. See the module docstring."""
    return _load_mpp(mpp_model).to_classifier(
        num_classes, image_size=image_size, **options)


# --------------------------------------------------------------------------
# unlabelled images


class UnlabelledFolder(data_lib.FolderSource):
    """Every image below a folder, in any layout (sub-folders are not
    classes); all get label 0. Unreadable files are reported in one warning
    and left out, as :class:`~keras_vit.train.FolderSource` does."""

    def __init__(self, path, *, verbose=True):
        path = data_lib.existing_folder(
            path, "a folder of images (jpg, png, ...) in any layout")
        top = pathlib.Path(path)
        candidates = [
            (str(f), 0) for f in sorted(top.rglob("*")) if f.is_file()
            and not any(part.startswith(".")
                        for part in f.relative_to(top).parts)]
        if not candidates:
            raise data_lib.DataError(
                f"Image folder data={path!r} is empty: no files in it or its "
                "sub-folders; expected images (jpg, png, ...).")
        files, labels, skipped, facts = data_lib.check_images(
            candidates, verbose, with_facts=True)
        if not files:
            raise data_lib.DataError(
                f"Image folder data={path!r} has no readable images "
                f"({len(skipped)} files skipped, e.g. {skipped[:3]})")
        data_lib.ImageSource.__init__(self, len(files), 1)
        self.name = path
        self.path = path
        self._set_files(files, np.zeros(len(files), "int64"), facts)
        self.skipped = skipped
        self.empty_classes = ()
        if skipped:
            shown = "; ".join(f"{os.path.relpath(p, path)} ({why})"
                              for p, why in skipped[:10])
            warnings.warn(
                f"Image folder {path!r}: skipped {len(skipped)} of "
                f"{len(candidates)} files that are not readable images: "
                f"{shown}", UserWarning, stacklevel=2)


def load_unlabelled(spec, *, data_dir=None, download=False, verbose=True):
    """Images for self-supervision: a folder in any layout
    (:class:`UnlabelledFolder`), or any :func:`~keras_vit.train.load_data`
    spec (``"digits"``, ``"tfds:NAME"``, an ``.npz``), whose labels are
    then ignored.

    >>> load_unlabelled("digits").num_examples
    1347
    """
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        named = (text == "digits" or text.startswith(("digits:", "tfds:"))
                 or text.lower().endswith(".npz"))
        if not named:
            return UnlabelledFolder(text, verbose=verbose)
    return data_lib.load_data(spec, data_dir=data_dir, download=download,
                              verbose=verbose)


# --------------------------------------------------------------------------
# training


class MppTrainer(engine.Trainer):
    """:class:`~keras_vit.train.Trainer` with the masked patch prediction
    objective: the same strategies, pipelines, checkpoints and resume.

    ``model`` is a ViT zoo name (random weights unless ``weights`` says
    otherwise), a :class:`~keras_vit.VisionTransformer`, or a
    :class:`MaskedPatchPrediction` (or its ``.keras`` file) to continue.
    ``train_data`` is anything :func:`load_unlabelled` reads. ``target``
    and the corruption fractions are those of
    :class:`MaskedPatchPrediction`; the other arguments are the Trainer's
    (``recipe`` defaults to ``"mpp"``). The reported "accuracy" is the
    fraction of corrupted patches predicted right.
    """

    def __init__(self, model, train_data, *, target="mean_color",
                 corruption_rate=0.5, mask_fraction=0.8, random_fraction=0.1,
                 recipe="mpp", weights=None, verbose=True, data_dir=None,
                 download=False, **kwargs):
        self.objective_options = dict(
            target=check_target(target),
            corruption_rate=_fraction("corruption_rate", corruption_rate,
                                      low_open=True),
            mask_fraction=mask_fraction, random_fraction=random_fraction)
        source = load_unlabelled(train_data, data_dir=data_dir,
                                 download=download, verbose=verbose)
        # A model to continue: its encoder goes through build_model like any
        # ViT (resolution, dropout, dtype, strategy scope); prepare_model
        # puts its [mask] embedding and head back.
        self._continued = None
        if isinstance(model, (str, os.PathLike)) and os.fspath(
                model).endswith(".keras") and os.path.isfile(model):
            model = resolve_model(model)
        if isinstance(model, MaskedPatchPrediction):
            self._check_same_objective(model)
            self._continued = model
            model = model.to_classifier(source.num_classes)
        super().__init__(model, source, None, recipe=recipe, weights=weights,
                         verbose=verbose, **kwargs)

    def _check_same_objective(self, model):
        given = model.objective()
        differ = {k: (given[k], v) for k, v in self.objective_options.items()
                  if given[k] != v}
        if differ:
            raise ValueError(
                "the masked patch prediction model was set up with "
                + ", ".join(f"{k}={g!r}" for k, (g, _) in differ.items())
                + "; received "
                + ", ".join(f"{k}={a!r}" for k, (_, a) in differ.items()))

    def prepare_model(self, model):
        wrapped = MaskedPatchPrediction(model, **self.objective_options)
        if self._continued is not None:
            for name in ("patch_corruption", "mpp_head"):
                wrapped.get_layer(name).set_weights(
                    self._continued.get_layer(name).get_weights())
        return wrapped

    def compute_loss(self, images, labels, seed):
        loss, right = self.model.loss_terms(images, seed, training=True)
        return ops.sum(loss), ops.sum(right)

    def _run_config(self):
        return dict(super()._run_config(), num_classes=None,
                    objective=self.model.objective())

    def describe(self):
        o = self.model.objective()
        # The data's classes mean nothing here.
        text = super().describe().replace(
            f", {self.train.num_classes} classes)", ")")
        return (f"masked patch prediction ({o['target']}, "
                f"{o['corruption_rate']:.0%} of {o['num_patches']} patches "
                f"corrupted) with {text}")


def pretrain_mpp(model, train_data, *, target="mean_color", recipe="mpp",
                 **kwargs):
    """Pre-trains ``model`` by masked patch prediction and returns a
    :class:`~keras_vit.train.TrainResult` whose ``model`` is the
    :class:`MaskedPatchPrediction` (saved as ``OUT/model.keras`` with an
    ``out_dir``). See :class:`MppTrainer` for the arguments and the module
    docstring for an example."""
    return MppTrainer(model, train_data, target=target, recipe=recipe,
                      **kwargs).fit()
