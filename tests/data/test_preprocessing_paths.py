"""Every path that turns pixels into model inputs asks the model how.

The same JPEG files (of several sizes, so every path resizes) go through
each path that feeds a model: ``keras-vit predict``'s
(``zoo.preprocess_input`` with the model's normalisation, the reference),
``train.dataset`` given the model, the Trainer as VTAB starts it (its
training batches and its evaluation), masked patch pretraining's batches,
the few-shot features and the analysis report. For every input
normalisation a model can carry (the official [-1, 1], ImageNet's, CLIP's,
timm's mean 0 / std 1, and the model's own preprocessing layer) the
outputs must agree with predict's: a path that assumes [-1, 1] feeds an
ImageNet model inputs off by a factor of two and fails here.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import zoo
from keras_vit.data import images as image_lib
from keras_vit.data.normalization import of_model, takes_raw_pixels

SIZE = 32
TINY = dict(image_size=SIZE, patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32, num_classes=2)
# (width, height) of each class's files: every one is resized.
SHAPES = {"ants": [(40, 30), (57, 64), (32, 20)],
          "bees": [(33, 48), (70, 41), (25, 25)]}
# name -> (input_normalization, include_preprocessing)
NORMALISATIONS = {
    "official": (None, False),
    "imagenet": ("imagenet", False),
    "clip": ("clip", False),
    "unit": ({"mean": [0.0] * 3, "std": [1.0] * 3}, False),
    "inside": ("imagenet", True),
}
# Float32 through one block: the paths differ only in the order of the
# same float32 operations.
ATOL = 2e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A class-per-folder dataset of JPEGs; ``(root, [(path, label)])``."""
    from PIL import Image

    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    files = []
    for label, (name, shapes) in enumerate(sorted(SHAPES.items())):
        (root / name).mkdir()
        for i, (w, h) in enumerate(shapes):
            # Smooth gradients plus noise: JPEG keeps them close, and
            # each image has its own colours.
            y, x = np.mgrid[0:h, 0:w]
            base = rng.uniform(0, 255, 3)
            pixels = (base + 100 * np.stack(
                [np.sin(x / (3 + i)), np.cos(y / (4 + label)),
                 np.sin((x + y) / 5)], -1) + rng.normal(0, 20, (h, w, 3)))
            path = root / name / f"{i}.jpg"
            Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(
                path, quality=90)
            files.append((str(path), label))
    return str(root), files


def _model(normalisation):
    value, inside = NORMALISATIONS[normalisation]
    keras.utils.set_random_seed(3)
    model = keras_vit.vit(**TINY, input_normalization=value,
                          include_preprocessing=inside)
    # The head (and class token) start at zero: every input would give the
    # same logits and no path could be told apart.
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32")
                       if not np.any(w) else w
                       for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def source(folder):
    """The folder read once (the scan traces the decoder: seconds)."""
    from keras_vit import train

    return train.load_data(folder[0], verbose=False)


@pytest.fixture(scope="module", params=sorted(NORMALISATIONS))
def case(request, folder, source):
    """A model of one normalisation and predict's inputs and outputs."""
    model = _model(request.param)
    root, files = folder
    inputs = np.stack([zoo.preprocess_input(
        image_lib.read(path).astype("float32"), SIZE,
        scale=not takes_raw_pixels(model),
        input_normalization=of_model(model)) for path, _ in files])
    return dict(name=request.param, model=model, source=source, files=files,
                labels=np.array([label for _, label in files]),
                inputs=inputs, outputs=_np(model(inputs)))


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), "float64")


def _match(got, want, what):
    """Each row of ``got`` equals a distinct row of ``want`` (paths that
    shuffle give the same images in another order)."""
    got, want = np.asarray(got, "float64"), np.asarray(want, "float64")
    assert got.shape[1:] == want.shape[1:], what
    distance = np.abs(got[:, None] - want[None]).reshape(
        len(got), len(want), -1).max(-1)
    nearest = distance.argmin(1)
    worst = float(distance[np.arange(len(got)), nearest].max())
    assert worst < ATOL, f"{what}: off by {worst:.3g}"
    assert len(set(nearest.tolist())) == len(got), (what, distance)


def _cross_entropy(logits, labels):
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def _first_batch(trainer, model):
    """``model``'s outputs on the first training batch ``trainer`` feeds."""
    batch, _ = next(iter(trainer._batches(0, 1)))
    images = batch[0] if isinstance(batch, tuple) else batch  # mpp: seeds
    return _np(model(images))


def _dataset(case):
    from keras_vit import train

    model = case["model"]
    ds = train.dataset(case["source"], model, 6, training=False)
    return [(np.concatenate([_np(model(x)) for x, _ in ds]),
             case["outputs"])]


def _trainer(case):
    """The Trainer as the VTAB runner starts it for a task without
    augmentation (a fresh copy of the model, resize only): its training
    batches and its evaluation (whose loss is predict's cross-entropy)."""
    from keras_vit.train import loop
    from keras_vit.train.vtab.runner import _fresh_model, _task_overrides
    from keras_vit.train.vtab.tasks import TASKS

    task = next(t for t in TASKS.values() if not t.augment)
    trainer = loop.Trainer(
        _fresh_model(case["model"]), case["source"], recipe="finetune",
        weights=None, batch_size=6, total_steps=1, warmup_steps=0,
        verbose=False, strategy="default", **_task_overrides(task, {}))
    model = trainer.trained_model()
    want = _np(model(case["inputs"]))
    loss = trainer.evaluate(case["source"], batch_size=6)["loss"]
    return [(_first_batch(trainer, model), want),
            (np.float64([[loss]]),
             np.float64([[_cross_entropy(want, case["labels"])]]))]


def _mpp(case):
    from keras_vit import train

    trainer = train.MppTrainer(
        case["model"], case["source"], weights=None, batch_size=6,
        total_steps=1, warmup_steps=0, crop_area=None, flip=False,
        verbose=False, strategy="default")
    # The encoder's own outputs on the batch the objective trains on.
    return [(_first_batch(trainer, case["model"]), case["outputs"])]


def _few_shot(case):
    from keras_vit.models import feature_model
    from keras_vit.train import few_shot

    got, _ = few_shot.extract_features(
        few_shot.feature_function(case["model"]), case["source"], SIZE,
        batch_size=6, verbose=False)
    return [(got, _np(feature_model(case["model"])(case["inputs"])))]


def _analysis(case, tmp_path, monkeypatch):
    from keras_vit.analysis import plots
    from keras_vit.analysis.report import inspect

    # The figures are not what is compared here, and drawing them costs
    # more than the rest of the report.
    for name in ("plot_attention_distance", "plot_position_similarity",
                 "plot_filters", "plot_rollout"):
        monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    result = inspect(case["model"], [path for path, _ in case["files"]],
                     tmp_path / "figures", batch_size=6)
    logits = case["outputs"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    got = [[entry["prediction"]["index"], entry["prediction"]["probability"]]
           for entry in result["images"]]
    want = [[k, probs[i, k]] for i, k in enumerate(probs.argmax(-1))]
    return [(np.float64(got), np.float64(want))]


PATHS = {"dataset": _dataset, "trainer+vtab": _trainer, "mpp": _mpp,
         "few_shot": _few_shot, "analysis": _analysis}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_feeds_the_model_what_predict_feeds_it(
        case, path, tmp_path, monkeypatch):
    fn = PATHS[path]
    pairs = (fn(case, tmp_path, monkeypatch) if path == "analysis"
             else fn(case))
    for got, want in pairs:
        _match(got, want, f"{path} with {case['name']}")


def test_mpp_targets_are_the_pixels_colours_whatever_the_model_takes(case):
    """Masked patch prediction scores 3-bit colours of the pixels: the
    targets must not move with the encoder's normalisation."""
    from keras_vit.data.normalization import OFFICIAL, model_input
    from keras_vit.train.mpp.model import MaskedPatchPrediction
    from keras_vit.train.mpp.objective import patch_targets

    mpp = MaskedPatchPrediction(case["model"])
    pixels = np.random.default_rng(2).uniform(0, 255, (2, SIZE, SIZE, 3))
    fed = model_input(case["model"], pixels.astype("float32"))
    np.testing.assert_allclose(_np(mpp.target_images(fed)),
                               OFFICIAL(pixels), atol=1e-4)
    smooth = np.full((1, SIZE, SIZE, 3), 200.0, "float32")  # far from a bin
    want = _np(patch_targets(OFFICIAL(smooth), mpp.grid_size))
    got = _np(patch_targets(mpp.target_images(model_input(
        case["model"], smooth)), mpp.grid_size))
    np.testing.assert_array_equal(got, want)


def test_a_pipeline_argument_that_contradicts_the_model_stops(case):
    from keras_vit import train

    model = case["model"]
    other = "clip" if case["name"] != "clip" else "imagenet"
    with pytest.raises(ValueError, match=r"^input_normalization='\w+' "
                       "contradicts model=.* leave input_normalization out"):
        train.dataset(case["source"], model, 2, input_normalization=other)
    raw = not takes_raw_pixels(model)
    with pytest.raises(ValueError, match=rf"^raw_pixels={raw} contradicts "):
        train.dataset(case["source"], SIZE, 2, model=model, raw_pixels=raw)
    # Saying what the model says is no contradiction.
    train.dataset(case["source"], model, 2,
                  input_normalization=of_model(model),
                  raw_pixels=not raw)
