"""The Keras side of masked patch prediction: :class:`PatchCorruption`
splices a corruption plan into a ViT's patch embeddings, and
:class:`MaskedPatchPrediction` wraps the ViT's own layers with a per-patch
head. Importing this module registers both with Keras."""

from __future__ import annotations

import os

import keras
import numpy as np
from keras import ops

from keras_vit.base import geometry
from keras_vit.data.normalization import (OFFICIAL, config_value, of_model,
                                          record_inputs, takes_raw_pixels)
from keras_vit.runtime import compat
from keras_vit.layers import PACKAGE, FusedDense
from keras_vit.models.vit import VisionTransformer
from keras_vit.train.mpp.objective import (
    DOWNSIZED, LEVELS, MASK, RANDOM, check_fractions, check_target,
    corruption_plan, masked_loss, patch_targets)
from keras_vit.zoo.resolve import model_path, resolve_model


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


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedPatchPrediction(keras.Model):
    """A Vision Transformer set up for masked patch prediction.

    Takes ``[images, mode, source]`` (images as the ViT takes them; ``mode``
    and ``source`` from :func:`corruption_plan`) and returns, for every
    patch, ``(B, N, K)`` predictions of ``target``: 512 colour logits, 16 x
    512 logits for ``"color_4x4"``, or the patch's pixels for ``"l2"``.
    It reuses ``encoder``'s layers (weights shared, not copied); a linear
    ``mpp_head`` reads each patch after the final LayerNorm.

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
        rate, mask_fraction, random_fraction = check_fractions(
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
        # The ViT's own graph replayed with its own layers, the corruption
        # spliced in after the patch embedding (clone_model's replay: it
        # would build a model over `images` alone, without the plan inputs).
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
        # One prediction per patch: the prefix tokens are dropped.
        prefix = geometry.prefix_tokens(encoder.get_config())
        if prefix:
            x = keras.layers.Cropping1D((prefix, 0), dtype=dtype,
                                        name="drop_class_token")(x)
        # Zero-initialised: the first loss is exactly log(512) for colours.
        x = FusedDense(size, kernel_initializer="zeros", dtype=dtype,
                       name="mpp_head")(x)
        super().__init__(inputs=[images, mode, source], outputs=x, name=name,
                         **kwargs)
        # Without what masked patch prediction does not use (head,
        # pooling, pre-logits, attention outputs).
        self.encoder_config = dict(
            encoder.get_config(), include_top=False, pooling=None,
            representation_size=None, classifier_activation=None,
            return_attention_scores=False)
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
        record_inputs(self, encoder)

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
        targets = patch_targets(self.target_images(images), self.grid_size,
                                self.target)
        return masked_loss(predictions, targets, mode, self.target,
                           self.num_channels)

    def target_images(self, images):
        """``images`` as this model takes them -> the [-1, 1] pixels the
        targets are defined on."""
        normalization = of_model(self)
        if not takes_raw_pixels(self):
            if config_value(normalization) is None:  # already [-1, 1]
                return images
            images = normalization.pixels(images)
        return OFFICIAL(images)

    def to_classifier(self, num_classes, *, image_size=None, **options):
        """A :class:`~keras_vit.VisionTransformer` classifier with this
        model's encoder weights and a zero-initialised head (the paper's
        fine-tuning start). ``image_size`` resizes the position embeddings;
        ``options`` change other ViT settings (``dropout_rate=...``)."""
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
