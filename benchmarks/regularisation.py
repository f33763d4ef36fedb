"""Does regularisation pay on small data? A tiny ViT trained from scratch on a
small data set that a package ships, with the plain recipe and with the
regularised recipes of keras_vit.train.recipes (``augreg``, ``deit``), at
the same budget: the same steps, batch, model and resolution, the same
optimiser (Adam, the same learning rate, warmup and cosine decay), over
several seeds. Prints a markdown table of each recipe's test accuracy
(mean, standard deviation, min and max over the seeds) and its gap to the
plain recipe, seed by seed (the same seed gives every recipe the same
initial weights and data order).

    python benchmarks/regularisation.py                  # ~10 min, 2 cores
    python benchmarks/regularisation.py --seeds 0 1 2 3 4 --steps 800
    python benchmarks/regularisation.py --recipes plain augreg \\
        "augreg+crop_area=0.5,1" --out /tmp/reg.md
    python benchmarks/regularisation.py --data lfw       # scikit-image's faces

What AugReg (Steiner et al. 2021) found on ImageNet-scale data, that
augmentation and regularisation pay when the data is small, is what this
checks at a far smaller scale; docs/regularisation.md has a measured table
and what it does and does not show.

The recipes are the library's, trained with ``model.fit`` and their pieces
(``recipes.model_options``: dropout, stochastic depth;
``recipes.pipeline_options``: crop, RandAugment, random erasing, MixUp /
CutMix in tf.data; ``recipes.make_loss``; ``recipes.make_optimizer``),
with what a run of a few hundred steps on another batch must change:

- ``total_steps``, ``batch_size``, ``image_size``, ``seed`` of the run,
  and a warmup of ``--warmup`` (10%) of the steps for every recipe (the
  recipes' 10k and 6k warmup steps are longer than the run);
- EMA off (``--keep-ema`` keeps it): DeiT's decay of 0.99996 averages over
  ~25k steps; after 500 steps Keras' average still gives the weights of
  the first step (nearly the random initial ones) a share of
  0.99996**499 = 98%, so its score would say nothing about
  regularisation (the recipe refuses such a decay for a run shorter than
  twice its horizon, ``recipes.check_ema``).

``plain`` is AugReg's optimiser (Adam, clipping at global norm 1) with
every regularisation off: no weight decay, dropout, stochastic depth,
label smoothing, crop (a plain resize), RandAugment, MixUp or evaluation
crop. A recipe argument may override fields of a recipe after ``+``
(``augreg+crop_area=0.5,1+randaugment=none``), parsed as
``keras-vit fine-tune --set`` parses them (``recipes.parse_value``).

Train accuracy is measured after training on the training images as the
test images are seen (no augmentation, the recipe's evaluation crop), so
that "train >> test" (overfitting) can be read off the table.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import os
import shlex
import statistics
import sys
import time

# The sibling modules (speed.py's CPU report), wherever this runs from.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

DEFAULT_RECIPES = ("plain", "augreg", "deit")
DATA_SETS = ("digits", "lfw")
# What "plain" turns off in AugReg's recipe: every regularisation and
# augmentation the recipes have, so that only the optimiser is left.
PLAIN_OFF = dict(weight_decay=0.0, dropout_rate=0.0, drop_path_rate=0.0,
                 label_smoothing=0.0, crop_area=None, eval_crop=1.0,
                 randaugment=None, random_erasing=0.0, mixup_alpha=0.0,
                 cutmix_alpha=0.0, three_augment=False, color_jitter=0.0,
                 ema_decay=None)


def say(*args):
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# recipes


def parse_recipe_spec(spec):
    """``"NAME[+field=value...]"`` -> ``(name, {field: value})``, the
    values parsed as the command line's ``--set`` parses them.

    >>> parse_recipe_spec("augreg+crop_area=0.5,1+randaugment=none")
    ('augreg', {'crop_area': (0.5, 1.0), 'randaugment': None})
    >>> parse_recipe_spec("plain")
    ('plain', {})
    """
    from keras_vit.train import recipes

    name, *pairs = spec.split("+")
    if name != "plain" and name not in recipes.names():
        known = ["plain", *recipes.names()]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown recipe {name!r} in {spec!r}{hint}; choose one of "
            f"{', '.join(known)}")
    overrides = {}
    for pair in pairs:
        field, eq, text = pair.partition("=")
        if not eq:
            raise ValueError(f"expected field=value after '+' in {spec!r}; "
                             f"received {pair!r}")
        overrides[field] = recipes.parse_value(field, text)
    return name, overrides


def build_recipe(spec, *, steps, batch_size, image_size, seed,
                 warmup_fraction=0.1, learning_rate=None, keep_ema=False):
    """The :class:`~keras_vit.train.recipes.Recipe` of ``spec`` for one run
    of the benchmark: its own regularisation, the run's budget and seed.

    >>> r = build_recipe("plain", steps=100, batch_size=32, image_size=16,
    ...                  seed=1)
    >>> r.name, r.optimizer, r.weight_decay, r.warmup_steps, r.mixes
    ('plain', 'adam', 0.0, 10, False)
    >>> build_recipe("deit", steps=100, batch_size=32, image_size=16,
    ...              seed=1).ema_decay is None
    True
    """
    from keras_vit.train import recipes

    name, overrides = parse_recipe_spec(spec)
    base = recipes.get("augreg" if name == "plain" else name)
    if name == "plain":
        base = base.replace(name="plain", **PLAIN_OFF)
    run = dict(total_steps=steps, epochs=None, batch_size=batch_size,
               image_size=image_size, seed=seed,
               warmup_steps=min(int(round(warmup_fraction * steps)),
                                steps - 1))
    if learning_rate is not None:
        run["learning_rate"] = learning_rate
    if not keep_ema:
        run["ema_decay"] = None
    return base.replace(**dict(run, **overrides))


def describe_recipe(r):
    """One line of the settings that differ between the recipes."""
    parts = [f"{r.optimizer} lr {r.learning_rate:g}",
             f"clip {r.grad_clip_norm}", f"wd {r.weight_decay:g}",
             f"dropout {r.dropout_rate:g}", f"stoch. depth {r.drop_path_rate:g}",
             f"crop {r.crop_area}", f"eval crop {r.eval_crop:g}",
             f"RandAugment {r.randaugment}", f"erasing {r.random_erasing:g}",
             f"MixUp {r.mixup_alpha:g}", f"CutMix {r.cutmix_alpha:g}",
             f"smoothing {r.label_smoothing:g}", f"EMA {r.ema_decay}"]
    if r.three_augment or r.color_jitter:
        parts.append(f"3-Augment {r.three_augment}, jitter {r.color_jitter:g}")
    if r.layer_decay is not None or r.loss != "softmax":
        parts.append(f"layer decay {r.layer_decay}, loss {r.loss}")
    return ", ".join(parts)


# --------------------------------------------------------------------------
# data and training


def load_sources(data):
    """``(train, test)`` image sources of ``data`` (``"digits"``: the
    built-in split of scikit-learn's digits; ``"lfw"``: scikit-image's
    ``lfw_subset``, 100 faces and 100 non-faces, split 3:1 stratified with
    seed 0)."""
    import keras_vit.train as kt

    if data == "digits":
        return kt.digits("train"), kt.digits("test")
    import numpy as np
    from sklearn.model_selection import train_test_split

    try:
        from skimage.data import lfw_subset
    except ImportError:
        raise ValueError("--data lfw needs scikit-image (pip install "
                         "scikit-image); received --data lfw") from None
    images = lfw_subset()  # (200, 25, 25) in [0, 1]; faces first
    labels = np.repeat(np.arange(2), 100)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=0.25, stratify=labels, random_state=0)
    names = ["face", "non-face"]
    return (kt.ArraySource(x_tr, y_tr, 2, value_range=(0, 1), name="lfw:train",
                           class_names=names),
            kt.ArraySource(x_te, y_te, 2, value_range=(0, 1), name="lfw:test",
                           class_names=names))


def train_one(recipe, arch, train, test):
    """Trains a new ViT of ``arch`` with ``recipe`` for its total_steps
    with ``model.fit``; returns test and train accuracy and seconds."""
    import keras

    import keras_vit
    import keras_vit.train as kt
    from keras_vit.train import recipes

    num_classes = train.num_classes
    # The same seed gives every recipe the same initial weights (dropout
    # and stochastic depth add no weights) and the same data order.
    keras.utils.set_random_seed(recipe.seed)
    model = keras_vit.vit(num_classes=num_classes, **arch,
                          image_size=recipe.image_size,
                          **recipes.model_options(recipe))
    batches = kt.dataset(train, recipe.image_size, recipe.batch_size,
                         **recipes.pipeline_options(recipe, num_classes))
    steps = recipe.total_steps
    model.compile(optimizer=recipes.make_optimizer(recipe, steps,
                                                   model=model),
                  loss=recipes.make_loss(recipe))
    start = time.perf_counter()
    # One pass of `steps` steps over the reshuffled, re-augmented epochs.
    model.fit(batches.repeat(), epochs=1, steps_per_epoch=steps, verbose=0,
              shuffle=False)  # the pipeline shuffles
    seconds = time.perf_counter() - start
    scores = {split: kt.evaluate(model, source, eval_crop=recipe.eval_crop,
                                 batch_size=128, verbose=False)["accuracy"]
              for split, source in (("test", test), ("train", train))}
    return dict(scores, seconds=seconds)


# --------------------------------------------------------------------------
# the report


def spread(values):
    """``(mean, std, min, max)``; std is the sample standard deviation
    (0 for one value).

    >>> spread([0.5, 0.7])
    (0.6, 0.1414, 0.5, 0.7)
    """
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return (round(statistics.fmean(values), 4), round(std, 4), min(values),
            max(values))


def summary_rows(results, specs, seeds, baseline="plain"):
    """One row per recipe: test and train accuracy over the seeds, and
    the test accuracy minus the baseline's, paired by seed (None when
    the baseline did not run)."""
    rows = []
    for spec in specs:
        test = [results[spec, s]["test"] for s in seeds]
        train = [results[spec, s]["train"] for s in seeds]
        gap = None
        if baseline in specs and spec != baseline:
            gap = spread([results[spec, s]["test"]
                          - results[baseline, s]["test"] for s in seeds])
        rows.append(dict(recipe=spec, test=spread(test), train=spread(train),
                         gap=gap, seconds=statistics.fmean(
                             results[spec, s]["seconds"] for s in seeds)))
    return rows


def _acc(s):
    mean, std, low, high = s
    return f"{mean:.3f} ± {std:.3f} [{low:.3f}, {high:.3f}]"


def _gap(s):
    if s is None:
        return "-"
    mean, std, low, high = s
    return f"{mean:+.3f} ± {std:.3f} [{low:+.3f}, {high:+.3f}]"


def markdown_table(rows, num_seeds):
    lines = [
        f"| recipe | test accuracy, mean ± std [min, max] of {num_seeds} "
        f"seed{'' if num_seeds == 1 else 's'} | train accuracy, mean "
        "[min, max] | test − plain, paired by seed: mean ± std [min, max] "
        "| train s/run |",
        "|---|---|---|---|---|"]
    for r in rows:
        mean, _, low, high = r["train"]
        lines.append(f"| {r['recipe']} | {_acc(r['test'])} | {mean:.3f} "
                     f"[{low:.3f}, {high:.3f}] | {_gap(r['gap'])} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def seeds_table(results, specs, seeds):
    lines = ["| recipe | " + " | ".join(f"seed {s}: test / train"
                                        for s in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    for spec in specs:
        cells = [f"{results[spec, s]['test']:.3f} / "
                 f"{results[spec, s]['train']:.3f}" for s in seeds]
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_line():
    """The CPU, its cores and the matrix features, as speed.py reports
    them."""
    from speed import cpu_model, matrix_units

    return (f"{cpu_model()}, {os.cpu_count()} cores "
            f"({len(os.sched_getaffinity(0))} usable); CPU features: "
            f"{matrix_units()}")


# --------------------------------------------------------------------------
# command line


SIZES = (("--steps", 500, "optimizer steps per run"),
         ("--batch-size", 64, "images per step"),
         ("--image-size", 16, "resolution"),
         ("--patch-size", 4, "patch side"),
         ("--width", 64, "hidden size"),
         ("--depth", 3, "encoder blocks"),
         ("--heads", 4, "attention heads"))
# Other numbers, each optional: (flag, type, default, help).
SETTINGS = (("--mlp-dim", int, None, "default: 2 x width"),
            ("--learning-rate", float, None, "for every recipe (default: "
             "each recipe's; 1e-3 for plain, augreg and deit)"),
            ("--warmup", float, 0.1, "warmup as a fraction of --steps "
             "(default: %(default)s)"))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES),
                        metavar="RECIPE",
                        help="plain or a recipe name, optionally with "
                        "+field=value overrides (default: %(default)s)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                        help="one run per recipe and seed (default: "
                        "%(default)s)")
    parser.add_argument("--data", choices=DATA_SETS, default="digits")
    # The budget and the model, every recipe the same: positive integers.
    for flag, default, meaning in SIZES:
        parser.add_argument(flag, type=int, default=default,
                            help=f"{meaning} (default: %(default)s)")
    for flag, kind, default, meaning in SETTINGS:
        parser.add_argument(flag, type=kind, default=default, help=meaning)
    parser.add_argument("--keep-ema", action="store_true",
                        help="keep the recipes' EMA decay (off by default; "
                        "see the module docstring)")
    parser.add_argument("--out", default=None,
                        help="also write the report to this markdown file")
    args = parser.parse_args(argv)
    for flag, _, _ in SIZES:
        name = flag[2:].replace("-", "_")
        if getattr(args, name) < 1:
            parser.error(f"{flag} must be >= 1; "
                         f"received {getattr(args, name)}")
    if not 0.0 <= args.warmup < 1.0:
        parser.error(f"--warmup must be in [0, 1); received {args.warmup}")
    if min(args.seeds) < 0:
        parser.error(f"--seeds must be >= 0; received {args.seeds}")
    if len(set(args.recipes)) != len(args.recipes):
        parser.error(f"--recipes names a recipe twice; received "
                     f"{args.recipes}")
    if args.mlp_dim is None:
        args.mlp_dim = 2 * args.width
    # Every recipe built once here, so that a bad override is refused
    # before the first run rather than after the others have trained.
    try:
        for spec in args.recipes:
            build_recipe(spec, steps=args.steps, batch_size=args.batch_size,
                         image_size=args.image_size, seed=args.seeds[0],
                         warmup_fraction=args.warmup,
                         learning_rate=args.learning_rate,
                         keep_ema=args.keep_ema)
    except ValueError as e:
        parser.error(f"--recipes {spec}: {e}")
    return args


def report(args, command, started, duration, loads, specs_lines, rows,
           results, train, test):
    import keras

    images = args.steps * args.batch_size
    lines = [
        "# Regularisation on small data: plain vs. regularised recipes",
        "",
        f"- command: `{command}`",
        f"- date: {started.strftime('%Y-%m-%d %H:%M %Z')}; the run took "
        f"{duration / 60:.1f} min",
        f"- CPU: {cpu_line()}",
        f"- load average (1 min) at start and end: {loads[0]:.2f}, "
        f"{loads[1]:.2f}; Keras {keras.__version__} on "
        f"{keras.backend.backend()}",
        f"- data: {train.name} ({train.num_examples} images, "
        f"{train.num_classes} classes), tested on {test.name} "
        f"({test.num_examples} images), at {args.image_size}x"
        f"{args.image_size}",
        f"- model: keras_vit.vit(image_size={args.image_size}, "
        f"patch_size={args.patch_size}, hidden_size={args.width}, "
        f"num_layers={args.depth}, num_heads={args.heads}, "
        f"mlp_dim={args.mlp_dim}), from scratch",
        f"- budget, every run: {args.steps} steps of {args.batch_size} "
        f"({images:,} images seen, {images / train.num_examples:.1f} "
        f"epochs), warmup {int(round(args.warmup * args.steps))} steps, "
        f"cosine to 0; seeds {', '.join(map(str, args.seeds))}",
        "- recipes:"] + [f"  - {line}" for line in specs_lines] + [
        "",
        markdown_table(rows, len(args.seeds)),
        "",
        "Per seed (test / train accuracy):",
        "",
        seeds_table(results, args.recipes, args.seeds),
        ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    command = "python benchmarks/regularisation.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = datetime.datetime.now().astimezone()
    load_start = os.getloadavg()[0]
    say(cpu_line())
    try:
        train, test = load_sources(args.data)
    except ValueError as e:
        say(f"error: {e}")
        return 2
    arch = dict(patch_size=args.patch_size, hidden_size=args.width,
                num_layers=args.depth, num_heads=args.heads,
                mlp_dim=args.mlp_dim)
    recipe_of = {}
    for spec in args.recipes:
        recipe_of[spec] = build_recipe(
            spec, steps=args.steps, batch_size=args.batch_size,
            image_size=args.image_size, seed=args.seeds[0],
            warmup_fraction=args.warmup, learning_rate=args.learning_rate,
            keep_ema=args.keep_ema)
    specs_lines = [f"{spec}: {describe_recipe(r)}"
                   for spec, r in recipe_of.items()]
    for line in specs_lines:
        say(line)
    results = {}
    total = time.perf_counter()
    # Seed by seed, every recipe in turn: a change in the machine's load
    # during the run falls on all recipes alike.
    for seed in args.seeds:
        for spec in args.recipes:
            recipe = recipe_of[spec].replace(seed=seed)
            results[spec, seed] = train_one(recipe, arch, train, test)
            r = results[spec, seed]
            say(f"seed {seed} {spec:>12}: test {r['test']:.3f}, train "
                f"{r['train']:.3f}, {r['seconds']:.0f} s")
    duration = time.perf_counter() - total
    rows = summary_rows(results, args.recipes, args.seeds)
    text = report(args, command, started, duration,
                  (load_start, os.getloadavg()[0]), specs_lines, rows,
                  results, train, test)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
