"""An offline end-to-end run: train a tiny ViT on scikit-learn's digits.

Everything it needs ships with the installed packages (no download), so it
is the quickest way to see the whole package work on a machine:

    keras-vit demo            # or: python -c "import keras_vit.demo as d; d.run()"

Stages: train at 32x32 -> save ``.keras`` and reload (predictions must be
identical) -> export the official ``.npz`` layout -> load that checkpoint
into the same architecture at 48x48 (position embeddings resized from an
8x8 to a 12x12 grid) -> evaluate, then fine-tune one epoch at 48.
"""

from __future__ import annotations

import os
import time

import numpy as np

SEED = 0
IMAGE_SIZE = 32
FINETUNE_SIZE = 48
ARCH = dict(patch_size=4, hidden_size=64, num_layers=4, num_heads=4,
            mlp_dim=128, num_classes=10)
DEFAULT_EPOCHS = 15
BATCH_SIZE = 32
LEARNING_RATE = 1e-3
FINETUNE_LEARNING_RATE = 1e-3


def load_digits_images(size, seed=SEED, test_size=0.25, subset=None):
    """Digits as (size, size, 3) float32 images in [-1, 1], split stratified.

    Returns ``(x_train, y_train, x_test, y_test)``; the split depends only
    on ``seed``, so the same images are test images at every ``size``.
    """
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # Pixels are 0..16; the official ViT input range is [-1, 1].
    x = digits.images.astype("float32") / 8.0 - 1.0
    y = digits.target.astype("int32")
    # Bilinear, not pixel repetition (np.kron): with repeated pixels every
    # 4x4 patch at 32x32 is one flat value and training stalls for many
    # epochs near chance; interpolated patches carry local gradients.
    x = np.asarray(keras.ops.image.resize(x[..., None], (size, size),
                                          interpolation="bilinear"))
    x = np.repeat(x, 3, axis=-1)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=seed)
    if subset:
        n_tr, n_te = subset
        x_tr, y_tr = x_tr[:n_tr], y_tr[:n_tr]
        x_te, y_te = x_te[:n_te], y_te[:n_te]
    return x_tr, y_tr, x_te, y_te


def build_model(image_size):
    """The demo architecture at ``image_size``."""
    from keras_vit.models import vit

    return vit(image_size=image_size, **ARCH, name="digits_vit")


def _compile(model, lr, steps, warmup):
    import keras

    if steps > warmup > 0:
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=steps - warmup, warmup_target=lr,
            warmup_steps=warmup)
    else:
        schedule = lr
    # Gradient clipping at global norm 1, as in the official training code.
    optimizer = keras.optimizers.Adam(schedule, global_clipnorm=1.0)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])


def _train_batches(x, y, seed=SEED):
    """Shuffled batches of BATCH_SIZE, dropping the ragged remainder.

    A last batch of another size would make Keras trace the train step a
    second time, which costs seconds per model on CPU; reshuffling each
    epoch means the dropped images differ from epoch to epoch.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(BATCH_SIZE, drop_remainder=True).prefetch(2)


def _predict(model, x, batch_size=128):
    """Logits in fixed-size batches (padding the last one), so each model
    is traced once instead of once more for the ragged final batch."""
    n = len(x)
    pad = -n % batch_size
    if pad:
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
    return np.asarray(model.predict(x, batch_size=batch_size, verbose=0))[:n]


def _accuracy(model, x, y):
    logits = _predict(model, x)
    return float(np.mean(np.argmax(logits, axis=-1) == y)), logits


def _epoch_logger(say, total):
    import keras

    class _Log(keras.callbacks.Callback):
        # One short line per epoch instead of Keras' progress bars.
        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            say(f"  epoch {epoch + 1:>3}/{total}  loss {logs.get('loss', 0):.4f}"
                f"  train acc {logs.get('accuracy', 0):.4f}"
                f"  ({time.perf_counter() - self._t:.1f}s)")

    return _Log()


def run(out_dir=None, epochs=DEFAULT_EPOCHS, quick=False, verbose=True):
    """Runs the demo and returns its figures as a dict.

    Args:
        out_dir: where to write ``digits_vit.keras`` and ``digits_vit.npz``
            (created); default ``./keras_vit_demo``.
        epochs: training epochs at 32x32.
        quick: a few hundred images and at most 2 epochs (for tests).
        verbose: print progress and the summary table.

    Raises:
        RuntimeError: if the reloaded ``.keras`` model predicts differently.
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer; received "
                         f"epochs={epochs!r}")
    say = print if verbose else (lambda *a, **k: None)
    out_dir = os.path.abspath(out_dir or "keras_vit_demo")
    os.makedirs(out_dir, exist_ok=True)
    keras_path = os.path.join(out_dir, "digits_vit.keras")
    npz_path = os.path.join(out_dir, "digits_vit.npz")

    t_start = time.perf_counter()
    times = {}

    def stage(name, t0):
        times[name] = time.perf_counter() - t0

    import keras

    from keras_vit import zoo

    subset = (12 * BATCH_SIZE, 192) if quick else None
    if quick:
        epochs = min(epochs, 2)

    t0 = time.perf_counter()
    keras.utils.set_random_seed(SEED)
    x_tr, y_tr, x_te, y_te = load_digits_images(IMAGE_SIZE, subset=subset)
    stage("data", t0)
    say(f"digits: {len(x_tr)} train / {len(x_te)} test images, upsampled "
        f"8x8 -> {IMAGE_SIZE}x{IMAGE_SIZE} RGB, scaled to [-1, 1]")

    # -- train at 32 --------------------------------------------------------
    t0 = time.perf_counter()
    model = build_model(IMAGE_SIZE)
    params = int(model.count_params())
    steps_per_epoch = len(x_tr) // BATCH_SIZE
    total_steps = epochs * steps_per_epoch
    _compile(model, LEARNING_RATE, total_steps,
             warmup=min(steps_per_epoch, total_steps // 5))
    say(f"ViT {IMAGE_SIZE}x{IMAGE_SIZE}, patch {ARCH['patch_size']} "
        f"(grid {model.grid_size[0]}x{model.grid_size[1]}), {params:,} "
        f"parameters; training {epochs} epochs")
    callbacks = [_epoch_logger(say, epochs)] if verbose else []
    history = model.fit(_train_batches(x_tr, y_tr), epochs=epochs,
                        shuffle=False, verbose=0, callbacks=callbacks)
    stage("train", t0)

    t0 = time.perf_counter()
    accuracy, logits = _accuracy(model, x_te, y_te)
    stage("evaluate", t0)
    say(f"test accuracy at {IMAGE_SIZE}: {accuracy:.4f}")

    # -- .keras round trip --------------------------------------------------
    t0 = time.perf_counter()
    model.save(keras_path)
    reloaded = keras.saving.load_model(keras_path)
    reload_logits = _predict(reloaded, x_te)
    reload_diff = float(np.max(np.abs(reload_logits - logits)))
    stage("save+reload", t0)
    if not reload_diff < 1e-6:
        raise RuntimeError(
            f"The reloaded {keras_path} predicts differently from the trained "
            f"model: max abs logit difference {reload_diff:.3g}")
    say(f"saved {keras_path}; reloaded, max abs logit difference "
        f"{reload_diff:.3g}")

    # -- official .npz layout, loaded at another resolution -----------------
    t0 = time.perf_counter()
    zoo.convert.save_npz(model, npz_path)
    model48 = build_model(FINETUNE_SIZE)
    report = zoo.load_weights(model48, npz_path)
    x48_tr, y48_tr, x48_te, y48_te = load_digits_images(FINETUNE_SIZE,
                                                        subset=subset)
    accuracy48, _ = _accuracy(model48, x48_te, y48_te)
    stage("npz->48", t0)
    resized = report.get("resized_posemb")
    say(f"wrote {npz_path}; loaded at {FINETUNE_SIZE}x{FINETUNE_SIZE}: "
        f"position embeddings resized {resized[0]} -> {resized[1]} patches; "
        f"test accuracy without retraining: {accuracy48:.4f}")

    t0 = time.perf_counter()
    steps48 = len(x48_tr) // BATCH_SIZE
    _compile(model48, FINETUNE_LEARNING_RATE, steps48,
             warmup=max(1, steps48 // 5))
    model48.fit(_train_batches(x48_tr, y48_tr), epochs=1, shuffle=False,
                verbose=0)
    accuracy48_ft, _ = _accuracy(model48, x48_te, y48_te)
    stage("finetune48", t0)
    say(f"after 1 epoch of fine-tuning at {FINETUNE_SIZE}: "
        f"{accuracy48_ft:.4f}")

    total = time.perf_counter() - t_start
    result = {
        "accuracy": accuracy,
        "accuracy_48": accuracy48,
        "accuracy_48_finetuned": accuracy48_ft,
        "chance": 0.1,
        "final_train_loss": float(history.history["loss"][-1]),
        "params": params,
        "params_48": int(model48.count_params()),
        "posemb_resized": tuple(resized) if resized else None,
        "reload_max_abs_diff": reload_diff,
        "epochs": epochs,
        "num_train": int(len(x_tr)),
        "num_test": int(len(x_te)),
        "keras_path": keras_path,
        "npz_path": npz_path,
        "times": times,
        "total_time": total,
        "quick": bool(quick),
    }
    if verbose:
        print(summary(result))
    return result


def summary(result):
    """The figures of :func:`run` as a small text table."""
    t = result["times"]
    rows = [
        ("images (train / test)",
         f"{result['num_train']} / {result['num_test']}", ""),
        (f"train {IMAGE_SIZE}x{IMAGE_SIZE}, {result['epochs']} epochs",
         f"{result['params']:,} params", f"{t['train']:.1f}s"),
        (f"test accuracy @{IMAGE_SIZE}", f"{result['accuracy']:.4f}",
         f"{t['evaluate']:.1f}s"),
        (".keras reload, max |diff|", f"{result['reload_max_abs_diff']:.3g}",
         f"{t['save+reload']:.1f}s"),
        (f"npz -> {FINETUNE_SIZE}x{FINETUNE_SIZE}, posemb "
         f"{result['posemb_resized'][0]}->{result['posemb_resized'][1]}",
         f"{result['params_48']:,} params", ""),
        (f"test accuracy @{FINETUNE_SIZE}, no retraining",
         f"{result['accuracy_48']:.4f}", f"{t['npz->48']:.1f}s"),
        (f"test accuracy @{FINETUNE_SIZE}, +1 epoch",
         f"{result['accuracy_48_finetuned']:.4f}", f"{t['finetune48']:.1f}s"),
        ("total", "", f"{result['total_time']:.1f}s"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = ["", "keras-vit demo summary (chance accuracy: 0.10)"]
    lines += [f"  {a:<{w0}}  {b:>{w1}}  {c:>7}" for a, b, c in rows]
    lines += [f"  model: {result['keras_path']}",
              f"  npz:   {result['npz_path']}"]
    return "\n".join(lines)
