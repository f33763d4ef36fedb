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

from keras_vit.layers import PACKAGE
from keras_vit.models.vit import VisionTransformer
from keras_vit.train import data as data_lib
from keras_vit.train import engine

OBJECTIVES = ("mpp",)
TARGETS = ("mean_color", "color_4x4", "l2")
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
# the corruption and the targets (plain TensorFlow, used in the train step)


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

    >>> mode, source = corruption_plan(2, 3, (0, 1))
    >>> tuple(mode.shape), int(mode.numpy().max()) <= UNCHANGED
    ((2, 3), True)
    >>> bool((source.numpy() != np.arange(6).reshape(2, 3)).all())
    True
    """
    import tensorflow as tf

    rate, mask_fraction, random_fraction = _fractions(
        rate, mask_fraction, random_fraction)
    total = batch_size * num_patches
    if isinstance(total, int) and total < 2:
        raise ValueError(
            "the corruption needs at least two patches per batch; received "
            f"batch_size={batch_size}, num_patches={num_patches}")
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    pick_seed, kind_seed, source_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3))
    shape = tf.stack([batch_size, num_patches])
    chosen = tf.random.stateless_uniform(shape, pick_seed) < rate
    kind = tf.random.stateless_uniform(shape, kind_seed)
    how = tf.where(kind < mask_fraction, MASK,
                   tf.where(kind < mask_fraction + random_fraction, RANDOM,
                            UNCHANGED))
    mode = tf.where(chosen, how, KEEP)
    # Another patch: uniform over the other total - 1 positions.
    own = tf.reshape(tf.range(total, dtype=tf.int32), shape)
    other = tf.random.stateless_uniform(shape, source_seed, minval=0,
                                        maxval=total - 1, dtype=tf.int32)
    source = other + tf.cast(other >= own, tf.int32)
    return tf.cast(mode, tf.int32), source


def _patches(images, grid):
    """(B, H, W, C) -> (B, rows * cols, H / rows, W / cols, C)."""
    import tensorflow as tf

    rows, cols = grid
    shape = tf.shape(images)
    b = shape[0]
    h, w, c = images.shape[1], images.shape[2], images.shape[3]
    ph, pw = h // rows, w // cols
    x = tf.reshape(images, (b, rows, ph, cols, pw, c))
    x = tf.transpose(x, (0, 1, 3, 2, 4, 5))
    return tf.reshape(x, (b, rows * cols, ph, pw, c))


def _downsize(images, grid, size):
    """Each patch reduced to ``size`` x ``size`` by area averaging:
    (B, N, size, size, C)."""
    import tensorflow as tf

    rows, cols = grid
    ph, pw = images.shape[1] // rows, images.shape[2] // cols
    if ph % size == 0 and pw % size == 0:
        x = _patches(images, grid)
        b, n, c = tf.shape(x)[0], rows * cols, images.shape[3]
        x = tf.reshape(x, (b, n, size, ph // size, size, pw // size, c))
        return tf.reduce_mean(x, axis=(3, 5))
    # A patch side that is not a multiple (ViT-H/14): area resize the image.
    small = tf.image.resize(images, (rows * size, cols * size), "area")
    return _patches(small, grid)


def color_class(pixels):
    """Pixels in [-1, 1], channels last -> their 3-bit colour class:
    ``r * 64 + g * 8 + b`` with each channel in 8 equal bins (512 classes
    for RGB).

    >>> color_class(np.array([[-1.0, 0.0, 1.0]], "float32")).numpy()
    array([39], dtype=int32)
    """
    import tensorflow as tf

    pixels = tf.convert_to_tensor(pixels, tf.float32)
    levels = tf.clip_by_value(tf.floor((pixels + 1.0) * (LEVELS / 2.0)),
                              0.0, LEVELS - 1.0)
    channels = pixels.shape[-1]
    weights = tf.constant([LEVELS ** (channels - 1 - i)
                           for i in range(channels)], tf.float32)
    return tf.cast(tf.reduce_sum(levels * weights, axis=-1), tf.int32)


def patch_targets(images, grid, target="mean_color"):
    """What each patch of ``images`` (B, H, W, C) in [-1, 1] is to be
    predicted as, on a ``grid`` of (rows, cols) patches:

    - ``"mean_color"``: int32 (B, N), the class of the patch's mean colour;
    - ``"color_4x4"``: int32 (B, N, 16), classes of the 4x4 downsized patch
      (row-major);
    - ``"l2"``: float32 (B, N, P * P * C), the patch's pixels (row-major,
      channels last).

    >>> x = np.full((1, 8, 8, 3), -1.0, "float32"); x[:, :4, :4] = 1.0
    >>> patch_targets(x, (2, 2)).numpy().tolist()
    [[511, 0, 0, 0]]
    """
    import tensorflow as tf

    target = check_target(target)
    images = tf.cast(tf.convert_to_tensor(images), tf.float32)
    if target == "mean_color":
        return color_class(tf.reduce_mean(_patches(images, grid), (2, 3)))
    if target == "color_4x4":
        small = _downsize(images, grid, DOWNSIZED)
        b, n = tf.shape(small)[0], small.shape[1]
        return tf.reshape(color_class(small), (b, n, DOWNSIZED ** 2))
    x = _patches(images, grid)
    return tf.reshape(x, (tf.shape(x)[0], x.shape[1], -1))


def masked_loss(predictions, targets, mode, target, channels=3):
    """Per image: the loss averaged over its corrupted patches, and the
    fraction of them predicted right (for ``"l2"``: whose predicted mean
    colour has the target's 3-bit class). Both float32 (B,).

    ``predictions`` are the model's (B, N, K) outputs, ``targets`` those of
    :func:`patch_targets`, ``mode`` the corruption plan (``KEEP`` patches
    do not count).
    """
    import tensorflow as tf

    target = check_target(target)
    predictions = tf.cast(predictions, tf.float32)
    if target == "l2":
        per_patch = tf.reduce_mean(tf.square(predictions - targets), -1)
        shape = tf.concat([tf.shape(targets)[:2], [-1, channels]], 0)
        right = tf.equal(
            color_class(tf.reduce_mean(tf.reshape(predictions, shape), 2)),
            color_class(tf.reduce_mean(tf.reshape(targets, shape), 2)))
        right = tf.cast(right, tf.float32)
    else:
        if target == "color_4x4":
            shape = tf.concat([tf.shape(targets), [-1]], 0)
            predictions = tf.reshape(predictions, shape)
        per_patch = tf.nn.sparse_softmax_cross_entropy_with_logits(
            targets, predictions)
        right = tf.cast(tf.equal(tf.argmax(predictions, -1, tf.int32),
                                 targets), tf.float32)
        if target == "color_4x4":
            per_patch = tf.reduce_mean(per_patch, -1)
            right = tf.reduce_mean(right, -1)
    weight = tf.cast(tf.not_equal(mode, KEEP), tf.float32)
    count = tf.maximum(tf.reduce_sum(weight, -1), 1.0)
    return (tf.reduce_sum(per_patch * weight, -1) / count,
            tf.reduce_sum(right * weight, -1) / count)


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
    >>> tuple(mpp([images, mode.numpy(), source.numpy()]).shape)
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

        encoder._run_through_graph(images, operation_fn=lambda op: op,
                                   call_fn=call)
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
        import tensorflow as tf

        images = tf.convert_to_tensor(images, tf.float32)
        batch = tf.shape(images)[0]
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
        path = os.fspath(spec)
        if os.path.isdir(path):
            path = os.path.join(path, "model.keras")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"No masked patch prediction model at {os.fspath(spec)!r} "
                "(expected a .keras file or a pretrain run directory with "
                "model.keras)")
        model = keras.saving.load_model(path, compile=False)
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
        files, labels, skipped = data_lib._check_images(candidates, verbose)
        if not files:
            raise data_lib.DataError(
                f"Image folder data={path!r} has no readable images "
                f"({len(skipped)} files skipped, e.g. {skipped[:3]})")
        data_lib.ImageSource.__init__(self, len(files), 1)
        self.name = path
        self.path = path
        self._files = np.asarray(files, dtype=object)
        self._labels = np.zeros(len(files), "int64")
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
            model = keras.saving.load_model(model, compile=False)
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
        import tensorflow as tf

        loss, right = self.model.loss_terms(images, seed, training=True)
        return tf.reduce_sum(loss), tf.reduce_sum(right)

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
