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

from keras_vit.train.mpp.model import (MaskedPatchPrediction,
                                       PatchCorruption, mpp_to_classifier)
from keras_vit.train.mpp.objective import (
    COLOR_BITS, DOWNSIZED, KEEP, LEVELS, MASK, OBJECTIVES, RANDOM, TARGETS,
    UNCHANGED, check_fraction, check_fractions, check_objective,
    check_target, color_class, corruption_plan, masked_loss, patch_targets)
from keras_vit.train.mpp.pretrain import (MppTrainer, UnlabelledFolder,
                                          load_unlabelled, pretrain_mpp)

__all__ = [
    "COLOR_BITS", "DOWNSIZED", "KEEP", "LEVELS", "MASK", "MaskedPatchPrediction",
    "MppTrainer", "OBJECTIVES", "PatchCorruption", "RANDOM", "TARGETS",
    "UNCHANGED", "UnlabelledFolder", "check_fraction", "check_fractions",
    "check_objective", "check_target", "color_class", "corruption_plan",
    "load_unlabelled", "masked_loss", "mpp_to_classifier", "patch_targets",
    "pretrain_mpp",
]
