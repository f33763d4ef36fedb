"""Running masked patch prediction: unlabelled images in
(:func:`load_unlabelled`), the Trainer with the objective
(:class:`MppTrainer`), and :func:`pretrain_mpp`."""

from __future__ import annotations

import os
import pathlib
import warnings

import keras
import numpy as np
from keras import ops

from keras_vit.train.data.folders import (FolderSource, existing_folder,
                                          skipped_text)
from keras_vit.train.data.image_checks import check_images
from keras_vit.train.data.load import load_data
from keras_vit.train.data.sources import DataError, ImageSource
from keras_vit.train import loop, settings
from keras_vit.train.mpp.model import MaskedPatchPrediction
from keras_vit.train.mpp.objective import check_fraction, check_target
from keras_vit.zoo.resolve import resolve_model


class UnlabelledFolder(FolderSource):
    """Every image below a folder, in any layout (sub-folders are not
    classes); all get label 0. Unreadable files are reported in one warning
    and left out, as :class:`~keras_vit.train.FolderSource` does."""

    def __init__(self, path, *, verbose=True):
        path = existing_folder(
            path, "a folder of images (jpg, png, ...) in any layout")
        top = pathlib.Path(path)
        candidates = [
            (str(f), 0) for f in sorted(top.rglob("*")) if f.is_file()
            and not any(part.startswith(".")
                        for part in f.relative_to(top).parts)]
        if not candidates:
            raise DataError(
                f"Image folder data={path!r} is empty: no files in it or its "
                "sub-folders; expected images (jpg, png, ...).")
        files, labels, skipped, facts = check_images(
            candidates, verbose, with_facts=True)
        if not files:
            raise DataError(
                f"Image folder data={path!r} has no readable images "
                f"({len(skipped)} files skipped, e.g. {skipped[:3]})")
        ImageSource.__init__(self, len(files), 1)
        self.name = path
        self._set_files(path, files, np.zeros(len(files), "int64"), facts,
                        skipped)
        if skipped:
            warnings.warn(
                f"Image folder {path!r}: skipped {len(skipped)} of "
                f"{len(candidates)} files that are not readable images: "
                f"{skipped_text(skipped, path)}", UserWarning, stacklevel=2)


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
    return load_data(spec, data_dir=data_dir, download=download,
                     verbose=verbose)


class MppObjective(keras.Model):
    """A :class:`MaskedPatchPrediction` as ``model.fit`` trains it: called
    on ``(images, seeds)`` (a stateless seed row per image; the first row
    corrupts the whole batch), it returns each image's loss over its
    corrupted patches and the fraction of them predicted right, shape
    ``(batch, 2)``; the loss and the metric read them."""

    def __init__(self, mpp, **kwargs):
        super().__init__(name="mpp_objective", **kwargs)
        self.mpp = mpp
        self.built = True

    def call(self, inputs, training=False):
        images, seeds = inputs
        loss, right = self.mpp.loss_terms(images, seeds[0],
                                          training=training)
        return ops.stack([ops.cast(loss, "float32"),
                          ops.cast(right, "float32")], axis=-1)


def _per_image_loss(labels, terms):
    return terms[..., 0]


def _per_image_right(labels, terms):
    return terms[..., 1]


class MppTrainer(loop.Trainer):
    """:class:`~keras_vit.train.Trainer` with the masked patch prediction
    objective: the same strategies, pipelines, checkpoints and resume.

    ``model`` is a ViT zoo name, a :class:`~keras_vit.VisionTransformer`,
    or a :class:`MaskedPatchPrediction` (or its ``.keras`` file) to
    continue. ``train_data`` is anything :func:`load_unlabelled` reads.
    ``target`` and the fractions are :class:`MaskedPatchPrediction`'s; the
    rest the Trainer's. "accuracy" is the fraction of corrupted patches
    predicted right.
    """

    # The data's classes (if any) are not what the head predicts.
    names_classes = False

    def __init__(self, model, train_data, *, target="mean_color",
                 corruption_rate=0.5, mask_fraction=0.8, random_fraction=0.1,
                 recipe="mpp", weights=None, verbose=True, data_dir=None,
                 download=False, **kwargs):
        self.objective_options = dict(
            target=check_target(target),
            corruption_rate=check_fraction("corruption_rate", corruption_rate,
                                      low_open=True),
            mask_fraction=mask_fraction, random_fraction=random_fraction)
        source = load_unlabelled(train_data, data_dir=data_dir,
                                 download=download, verbose=verbose)
        # A model to continue: its encoder is built like any ViT, then
        # prepare_model puts its [mask] embedding and head back.
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
        return MppObjective(wrapped)

    def objective(self):
        return (_per_image_loss, [keras.metrics.MeanMetricWrapper(
            _per_image_right, name="accuracy")])

    def training_batches(self, dataset, first_step, shard):
        # Seeded by the batch's index in the run: a resumed run corrupts
        # what the uninterrupted one would have.
        import tensorflow as tf

        pipelines, index = shard
        first = first_step * self.accum
        seed = self.recipe.seed

        def with_seed(i, batch):
            images, labels = batch
            counter = (first + i) * pipelines + index
            row = tf.stack([tf.constant(seed, tf.int64), counter])
            rows = tf.tile(row[None], [tf.shape(images)[0], 1])
            return (images, tf.cast(rows, tf.int32)), labels

        return dataset.enumerate().map(with_seed)

    def trained_model(self):
        return self.model.mpp

    def _run_config(self):
        return dict(super()._run_config(), num_classes=None,
                    objective=self.model.mpp.objective())

    def describe(self):
        o = self.model.mpp.objective()
        text = super().describe().replace(
            f", {settings.classes_text(self.train)})", ")")
        return (f"masked patch prediction ({o['target']}, "
                f"{o['corruption_rate']:.0%} of {o['num_patches']} patches "
                f"corrupted) with {text}")


def pretrain_mpp(model, train_data, *, target="mean_color", recipe="mpp",
                 **kwargs):
    """Pre-trains ``model`` by masked patch prediction and returns a
    :class:`~keras_vit.train.TrainResult` whose ``model`` is the
    :class:`MaskedPatchPrediction` (saved as ``OUT/model.keras`` with an
    ``out_dir``). See :class:`MppTrainer` for the arguments."""
    return MppTrainer(model, train_data, target=target, recipe=recipe,
                      **kwargs).fit()
