"""Few-shot linear evaluation (paper section 4 and Appendix): frozen
representations, a regularised least-squares map to ``{-1, 1}^K`` targets
solved in closed form, accuracy with k training images per class.

As in the official evaluator, features are standardised with the k-shot
training images' statistics, and the bias is not regularised (here
exactly, by centring).

>>> import numpy as np
>>> from keras_vit.train.few_shot import fit_least_squares, predict
>>> x = np.array([[0., 1.], [1., 0.], [0., 2.], [2., 0.]])
>>> y = np.array([0, 1, 0, 1])
>>> predict(fit_least_squares(x, y, 2, l2_reg=0.1), x).tolist()
[0, 1, 0, 1]
"""

from __future__ import annotations

import functools

import numpy as np

from keras_vit.base.checks import check_int
from keras_vit.base.limits import MAX_SEEDS
from keras_vit.models.memory import infer
from keras_vit.runtime.backend import is_tensorflow, to_numpy
from keras_vit.train.data.load import load_data
from keras_vit.data.normalization import record_inputs
from keras_vit.train.data.pipeline import padded_eval_dataset

SHOTS = (1, 5, 10, 25)
# The official few-shot evaluators use l2_reg = 2 ** 10.
L2_REG = 2.0 ** 10


def fit_least_squares(features, labels, num_classes, l2_reg=L2_REG, *,
                      standardize=True, fit_intercept=True):
    """Solves ``min_W ||X W + b - Y||^2 + l2_reg ||W||^2`` in closed form,
    with ``Y`` the labels as ``{-1, 1}^K`` rows (+1 for the class, -1
    elsewhere).

    Returns a dict (``w``, ``b``, ``mean``, ``std``) for :func:`predict`.
    With ``standardize=False`` this is scikit-learn's
    ``RidgeClassifier(alpha=l2_reg)``.
    """
    x = np.asarray(features, "float64")
    y = np.asarray(labels, "int64")
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(
            f"features must be (N, D) with N = len(labels) = {len(y)}; "
            f"received features.shape={x.shape}")
    if not (isinstance(l2_reg, (int, float)) and l2_reg > 0):
        raise ValueError(f"l2_reg must be a positive number; received "
                         f"l2_reg={l2_reg!r}")
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"labels must lie in [0, num_classes={num_classes}); "
                         f"received labels in [{y.min()}, {y.max()}]")
    mean = np.zeros((1, x.shape[1]))
    std = np.ones((1, x.shape[1]))
    if standardize:
        mean = x.mean(axis=0, keepdims=True)
        std = x.std(axis=0, keepdims=True) + 1e-5
        x = (x - mean) / std
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    x_mean = x.mean(axis=0, keepdims=True) if fit_intercept else 0.0
    t_mean = targets.mean(axis=0, keepdims=True) if fit_intercept else 0.0
    xc, tc = x - x_mean, targets - t_mean
    n, d = xc.shape
    # (X^T X + l I)^-1 X^T Y equals X^T (X X^T + l I)^-1 Y: the smaller one.
    if n >= d:
        w = np.linalg.solve(xc.T @ xc + l2_reg * np.eye(d), xc.T @ tc)
    else:
        w = xc.T @ np.linalg.solve(xc @ xc.T + l2_reg * np.eye(n), tc)
    b = (t_mean - x_mean @ w) if fit_intercept else np.zeros((1, num_classes))
    return {"w": w, "b": b, "mean": mean, "std": std}


def decision_function(solution, features):
    """Scores ``(N, K)`` of a :func:`fit_least_squares` solution."""
    x = (np.asarray(features, "float64") - solution["mean"]) / solution["std"]
    return x @ solution["w"] + solution["b"]


def predict(solution, features):
    """Predicted classes (argmax of the scores)."""
    return np.argmax(decision_function(solution, features), axis=-1)


def feature_function(model, feature="pre_logits"):
    """A model's frozen representation: ``feature`` of
    :func:`keras_vit.models.feature_model`."""
    from keras_vit.models import feature_model

    features = feature_model(model, feature)
    # It takes what ``model`` takes, and says so to the pipelines.
    return record_inputs(features, model)


def extract_features(feature_fn, source, image_size, batch_size=64,
                     verbose=True):
    """Features of every image of ``source`` (evaluation preprocessing),
    in source order, as ``(features, labels)`` numpy arrays."""
    import tensorflow as tf
    from tqdm.auto import tqdm

    source = load_data(source, verbose=verbose)
    steps = -(-source.num_examples // batch_size)
    # A plain function takes the official [-1, 1]; a model says.
    model = feature_fn if hasattr(feature_fn, "_flatten_layers") else None
    ds = padded_eval_dataset(source, image_size, batch_size,
                             num_batches=steps, model=model)
    call = feature_fn
    on_tf = is_tensorflow()
    if hasattr(feature_fn, "inputs") and on_tf:
        call = tf.function(lambda x: feature_fn(x, training=False))
    elif hasattr(feature_fn, "inputs"):
        # jax and torch run the model eagerly on NumPy batches.
        call = functools.partial(infer, feature_fn)
    feats, labels = [], []
    for images, y, mask in tqdm(ds, total=steps, desc="features",
                                unit="batch", leave=False,
                                disable=not verbose or steps < 10):
        keep = mask.numpy() > 0
        out = call(images if on_tf else images.numpy())
        out = np.asarray(to_numpy(out), "float32").reshape(len(keep), -1)
        feats.append(out[keep])
        labels.append(y.numpy()[keep])
    return np.concatenate(feats), np.concatenate(labels).astype("int64")


def _class_orders(labels, num_classes, seed):
    """Each class's images in a seeded random order: the first k of each
    are the k-shot set."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.flatnonzero(labels == c))
            for c in range(num_classes)]


def fewshot(model_or_feature_fn, train_data, test_data, *, shots=SHOTS,
            l2_reg=L2_REG, num_seeds=3, feature="pre_logits",
            image_size=None, batch_size=64, standardize=True,
            fit_intercept=True, verbose=True):
    """k-shot linear accuracy of frozen features, for each k in ``shots``.

    Args:
        model_or_feature_fn: a keras_vit model (its ``feature`` output is
            used) or a function mapping a batch of [-1, 1] images to
            ``(batch, D)`` features.
        train_data, test_data: sources or specs for
            :func:`~keras_vit.train.load_data`; k images per class are drawn
            from ``train_data``, every image of ``test_data`` is scored.
        shots: the k values.
        l2_reg: the ridge penalty.
        num_seeds: draws of the k-shot sets, averaged.
        image_size: input size for a feature function (a model's own by
            default).

    Returns:
        ``{"accuracy": {k: mean}, "per_seed": {k: [...]}, ...}``.

    >>> import keras_vit, keras_vit.train as kt
    >>> model = keras_vit.vit(16, 4, 32, 1, 2, 64, 10)
    >>> r = kt.fewshot(model, "digits:train", "digits:test", shots=(1, 5),
    ...                num_seeds=1, verbose=False)
    >>> sorted(r["accuracy"]), r["num_test"]
    ([1, 5], 450)
    """
    check_int("num_seeds", num_seeds, low=1, high=MAX_SEEDS)
    train = load_data(train_data, verbose=verbose)
    test = load_data(test_data, split="test", verbose=verbose)
    shots = tuple(sorted({int(k) for k in shots}))
    if not shots or shots[0] < 1:
        raise ValueError(f"shots must be positive integers; received "
                         f"shots={shots!r}")
    if test.num_classes != train.num_classes:
        raise ValueError(
            f"test_data has {test.num_classes} classes but train_data has "
            f"{train.num_classes}; received test_data={test.name!r}")
    fn = model_or_feature_fn
    if hasattr(fn, "layers"):
        if image_size is None:
            image_size = int(fn.inputs[0].shape[1])
        fn = feature_function(fn, feature)
    if image_size is None:
        raise ValueError("image_size is needed with a feature function; "
                         "received image_size=None")
    k = train.num_classes
    labels = train.labels()
    orders = [_class_orders(labels, k, seed) for seed in range(num_seeds)]
    # Features only of the images some draw uses, not of the whole set.
    needed = np.unique(np.concatenate(
        [p[:shots[-1]] for per_class in orders for p in per_class]))
    x_needed, y_needed = extract_features(fn, train.subset(needed),
                                          image_size, batch_size, verbose)
    if len(x_needed) != len(needed):
        raise ValueError(
            f"{len(needed) - len(x_needed)} of the sampled images of "
            f"{train.name!r} could not be decoded; remove them from the data")
    x_test, y_test = extract_features(fn, test, image_size, batch_size,
                                      verbose)
    per_seed = {s: [] for s in shots}
    for per_class in orders:
        for s in shots:
            idx = np.concatenate([p[:s] for p in per_class])
            rows = np.searchsorted(needed, idx)
            solution = fit_least_squares(
                x_needed[rows], y_needed[rows], k, l2_reg,
                standardize=standardize, fit_intercept=fit_intercept)
            acc = float(np.mean(predict(solution, x_test) == y_test))
            per_seed[s].append(acc)
    return {
        "accuracy": {s: float(np.mean(v)) for s, v in per_seed.items()},
        "per_seed": per_seed,
        "l2_reg": l2_reg,
        "num_seeds": num_seeds,
        "num_classes": k,
        "num_test": int(len(y_test)),
        "feature_dim": int(x_test.shape[1]),
        "train_data": train.name,
        "test_data": test.name,
    }
