"""``keras-vit fine-tune``, ``evaluate``, ``fewshot``, ``vtab`` and
``pretrain``: the commands of :mod:`keras_vit.train`; ``python -m
keras_vit.train`` runs them on their own (:func:`main`).
"""

from __future__ import annotations

import json
import os
import re

from keras_vit.cli import options
from keras_vit.cli.options import positive_int

PRECISION_HELP = "auto, float32 or mixed_bfloat16"
WEIGHTS_HELP = "for a zoo name: weights tag, path or URL"
MODEL_HELP = "a .keras file, a run directory, or a zoo name"


def _add_run_directory(p, name, restart, weights):
    """The options of a resumable run."""
    options.add(p, weights=weights,
                out=f"run directory (default: runs/<model>-<data>-<{name}>)",
                restart=restart)
    p.add_argument("--resume-anyway", action="store_true",
                   help="resume a run even if its settings (learning rate, "
                        "seed, data...) differ from the original ones")
    p.add_argument("--no-memory-check", action="store_true",
                   help="start even if the step's estimated activation "
                        "memory exceeds this machine's available memory")


def check_fits_memory(trainer, available=None):
    """Refuses (``ValueError``) a CPU run whose step clearly cannot fit
    the available memory, saying what to change
    (:func:`keras_vit.models.memory.check_step`); accelerators are not
    checked."""
    from keras_vit.runtime import hardware
    from keras_vit.models import memory

    if hardware.detect().accelerator != "cpu":
        return
    available = memory.available_memory() if available is None else available
    if available is None:
        return
    memory.check_step(trainer.trained_model(), trainer.micro,
                      per_replica=trainer.per_replica,
                      batch_size=trainer.recipe.batch_size,
                      available=available,
                      names={"micro_batch_size": "--micro-batch-size ",
                             "batch_size": "--batch-size",
                             "image_size": "--image-size",
                             "skip": "--no-memory-check", "remat": "--remat"})


def _add_data_options(p, what="training data"):
    p.add_argument("--data", required=True, metavar="SPEC",
                   help=f"{what}: 'digits' (built in, offline), "
                        "'tfds:NAME[:SPLIT]', a folder with one sub-folder "
                        "of images per class, or an .npz with arrays x, y")
    options.add(p, data_dir="where tfds datasets are prepared (default: "
                            "tfds')",
                download="let tfds download and prepare a missing dataset "
                         "(needs the network)")


def _add_runtime_options(p, quiet="no progress bar",
                         json="print the final metrics as JSON", remat=False):
    """--remat (if ``remat``), --strategy, --tpu, --cpu-devices, --quiet and
    --json (their help; False: not taken)."""
    if remat:
        p.add_argument("--remat", action="store_true",
                       help="rematerialise every block in training: the "
                            "same gradients for several times less "
                            "activation memory, at about one more forward "
                            "pass a step (the memory check counts it)")
    p.add_argument("--strategy", default="auto", metavar="NAME",
                   help="auto (default), default; on TensorFlow also "
                        "one_device, mirrored, multi_worker (TF_CONFIG), "
                        "tpu; on jax data_parallel")
    p.add_argument("--tpu", metavar="NAME",
                   help="TPU name, grpc://host:port or local (strategy "
                        "tpu/auto; default: TPU_NAME, else the TPU "
                        "attached to this machine)")
    p.add_argument("--cpu-devices", type=positive_int, metavar="N",
                   help="split the CPU into N logical devices (to run "
                        "'mirrored' on TensorFlow or 'data_parallel' on jax "
                        "without GPUs)")
    last = {"quiet": quiet, "json": json}
    options.add(p, **{k: v for k, v in last.items() if v is not False})


def register(subparsers):
    """Adds the training commands to ``subparsers``."""
    from keras_vit.train import recipes, vtab

    p = options.command(subparsers, "fine-tune", run_fine_tune,
                        help="fine-tune (or train) a model with the "
                             "paper's recipe; resumable")
    options.add(p, model="a zoo name (ViT-B/16, ViT-Ti/4, ...) or a .keras "
                         "file")
    _add_data_options(p)
    options.add(p, eval_data="held-out data (default: the test split of "
                             "digits or tfds data; for a folder or .npz, "
                             "10%% of each class, set aside from training: "
                             "the same images on every run)")
    p.add_argument("--no-eval", action="store_true",
                   help="do not evaluate at the end (a folder's images all "
                        "train)")
    p.add_argument("--recipe", default="finetune", metavar="NAME",
                   help=f"one of {', '.join(recipes.names())} (default: "
                        "finetune)")
    _add_run_directory(
        p, "recipe", weights={
            "default": "auto", "help": "for a zoo name: weights tag, .npz "
            "path, URL, or 'none' for random initialisation (default: "
            "auto)"},
        restart="delete the run's checkpoints and start again instead of "
                "resuming")
    options.add(
        p, steps="total optimizer steps (recipe field total_steps)",
        epochs="train for N epochs instead of a step count",
        batch_size="global batch per optimizer step",
        micro_batch_size="images per replica per pass (gradient "
                         "accumulation when smaller than the per-replica "
                         "batch)",
        lr="peak learning rate", warmup_steps="linear warmup steps",
        image_size="training resolution",
        ema="Polyak averaging of the weights (e.g. 0.9999), or none",
        precision=PRECISION_HELP, checkpoint_every="steps between "
                                                   "checkpoints",
        seed=None, set="any recipe field, e.g. --set label_smoothing=0.1 "
                       "--set crop_area=none (repeatable)",
        model_option="a zoo.load keyword for a zoo name, e.g. num_layers=4 "
                     "(repeatable)")
    _add_runtime_options(p, remat=True)

    p = options.command(subparsers, "evaluate", run_evaluate,
                        help="top-1 accuracy of a model on labelled data")
    options.add(p, model=MODEL_HELP)
    _add_data_options(p, "evaluation data (a tfds spec without a split "
                         "reads 'test')")
    options.add(p, weights={"default": "auto", "help": WEIGHTS_HELP},
                image_size=None, batch_size={"default": 64})
    _add_runtime_options(p, quiet=False, json="print JSON")

    p = options.command(subparsers, "fewshot", run_fewshot,
                        help="k-shot linear evaluation of frozen features")
    options.add(p, model=MODEL_HELP)
    _add_data_options(p, "data the k-shot sets are drawn from")
    options.add(p, eval_data="test data (default: the test split of digits "
                             "or tfds data)")
    options.add(p, weights={"default": "auto"}, image_size=None)
    p.add_argument("--shots", type=options.int_list("1,5,10,25"),
                   default=(1, 5, 10, 25),
                   metavar="K,K,...", help="default: 1,5,10,25")
    p.add_argument("--l2-reg", type=options.positive_float, default=2.0 ** 10,
                   metavar="X", help="ridge penalty (default: 1024)")
    p.add_argument("--seeds", type=positive_int, default=3, metavar="N",
                   help="k-shot draws averaged (default: 3)")
    p.add_argument("--feature", default="pre_logits", metavar="NAME",
                   help="the representation (default: pre_logits)")
    options.add(p, batch_size={"default": 64}, json=None)

    p = options.command(subparsers, "vtab", run_vtab,
                        help="fine-tune and score a model on the 19 "
                             "VTAB-1k tasks")
    options.add(p, model="a zoo name (ViT-B/16, ...) or a .keras file")
    p.add_argument("--tasks", metavar="T,T,...",
                   help="tasks or groups, comma-separated (default: all "
                        f"19): {', '.join(vtab.TASKS)}, natural, "
                        "specialized, structured")
    options.add(p, data_dir="where the tfds datasets are prepared "
                            "(default: tfds')",
                download="let tfds download and prepare missing datasets "
                         "(needs the network; two need a manual download)",
                out="results and one run directory per task (default: "
                    "runs/vtab-<model>)")
    p.add_argument("--sweep", action="store_true",
                   help="train on train800, score on val200 (the paper's "
                        "hyper-parameter selection)")
    options.add(p, steps="optimizer steps per task (default: 2500; the "
                         "warmup follows at 10%%)")
    p.add_argument("--train-examples", type=positive_int,
                   default=vtab.TRAIN_EXAMPLES, metavar="N",
                   help="examples of the training part (default: 800)")
    p.add_argument("--val-examples", type=positive_int,
                   default=vtab.VAL_EXAMPLES, metavar="N",
                   help="examples of the validation part (default: 200)")
    p.add_argument("--test-examples", type=positive_int, metavar="N",
                   help="score on the first N test examples only (default: "
                        "all, as the protocol does)")
    options.add(
        p, batch_size="global batch per optimizer step (default: 512)",
        micro_batch_size="images per replica per pass (gradient "
                         "accumulation)",
        lr="peak learning rate (default: 0.01)", warmup_steps=None,
        image_size="resolution (default: 384)", precision=PRECISION_HELP,
        seed=None, weights={"default": "auto", "help": WEIGHTS_HELP},
        model_option="a zoo.load keyword (repeatable)")
    p.add_argument("--keep-models", action="store_true",
                   help="keep each task's checkpoints and model.keras")
    _add_runtime_options(p, quiet="no progress output",
                         json="print the scores as JSON instead of a table")
    p.set_defaults(set=[], epochs=None, ema=None, checkpoint_every=None)

    p = options.command(subparsers, "pretrain", run_pretrain,
                        help="self-supervised pre-training on unlabelled "
                             "images (masked patch prediction); resumable")
    options.add(p, model="a ViT zoo name (ViT-B/16, R50+ViT-B/16, ...) or a "
                         ".keras file (a ViT, or a pretrain result to "
                         "continue)")
    p.add_argument("--objective", default="mpp", metavar="NAME",
                   help=f"one of {', '.join(recipes.MPP_OBJECTIVES)} "
                        "(default: mpp)")
    p.add_argument("--data", required=True, metavar="SPEC",
                   help="a folder of images (jpg, png, ...; any nested "
                        "layout, sub-folders are not classes), or 'digits', "
                        "'tfds:NAME[:SPLIT]', an .npz (labels ignored)")
    options.add(p, data_dir="where tfds datasets are prepared (default: "
                            "tfds')")
    p.add_argument("--target", default="mean_color", metavar="NAME",
                   help=f"one of {', '.join(recipes.MPP_TARGETS)} (default: "
                        "mean_color, 512 classes)")
    p.add_argument("--corruption-rate", type=float, default=0.5,
                   metavar="X", help="fraction of patches corrupted "
                                     "(default: 0.5)")
    p.add_argument("--recipe", default="mpp", metavar="NAME",
                   help="a recipe name (default: mpp: Adam 2e-4, 10k "
                        "warmup, cosine)")
    _add_run_directory(
        p, "objective", weights={
            "default": "none", "help": "for a zoo name: 'none' (default, "
            "random initialisation) or a weights tag, path or URL"},
        restart="delete the run's checkpoints and start again")
    options.add(
        p, steps="total optimizer steps (recipe mpp: 100000; scale "
                 "--warmup-steps with it)",
        batch_size="global batch per optimizer step (recipe mpp: 4096)",
        micro_batch_size="images per replica per pass (gradient "
                         "accumulation)",
        lr="peak learning rate (recipe mpp: 2e-4)",
        warmup_steps="linear warmup steps (recipe mpp: 10000)",
        image_size="training resolution (recipe: 224)",
        precision={"type": str, "help": PRECISION_HELP},
        checkpoint_every="steps between checkpoints",
        seed="seeds the data order, the corruption and new weights",
        set="any recipe field, e.g. --set crop_area=none (repeatable)",
        model_option="a zoo.load keyword, e.g. num_layers=4 (repeatable)")
    _add_runtime_options(p, remat=True)
    p.set_defaults(epochs=None, ema=None, download=False)


# --------------------------------------------------------------------------


def _configure_devices(args):
    # Before anything creates a tensor: logical devices are fixed then.
    if getattr(args, "cpu_devices", None):
        from keras_vit.train.distribute import configure_cpu_devices

        configure_cpu_devices(args.cpu_devices)


def _slug(text):
    return re.sub(r"[^A-Za-z0-9.]+", "-", os.path.basename(
        os.path.normpath(text)) if os.sep in text else text).strip("-")


def _recipe_overrides(args):
    from keras_vit.train import recipes

    fields = {key: recipes.parse_value(key, value) for key, value in args.set}
    renamed = {"steps": "total_steps", "lr": "learning_rate",
               "ema": "ema_decay"}
    for arg in ("steps", "epochs", "batch_size", "micro_batch_size", "lr",
                "warmup_steps", "image_size", "ema", "precision",
                "checkpoint_every", "seed"):
        value = getattr(args, arg)
        if value is not None:
            fields[renamed.get(arg, arg)] = (
                None if value == options.NO_EMA else value)
    return fields


def _out_folder(out, holds):
    """The --out folder ``out``, refused if it is a file (``holds``: what
    needs a folder) or cannot be created."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} is a file; {holds}")
    options.check_output_folder(out, "--out", out)
    return out


def _check_settings(args):
    """The --strategy built and the recipe checked before any data is read
    or model built, so that a mistake is refused in seconds. Returns what
    the Trainer takes as ``strategy``."""
    from keras_vit.train import recipes
    from keras_vit.train.distribute import check_backend, for_backend

    check_backend(args.strategy)  # a known name this backend can run
    _configure_devices(args)
    strategy_ = for_backend(args.strategy, tpu=args.tpu)
    recipes.get(args.recipe, **_recipe_overrides(args))
    return strategy_


def run_fine_tune(args):
    """Fine-tunes MODEL on --data with a recipe (SGD momentum, cosine decay,
    clipping, zero-initialised head, position embeddings resized to the
    recipe's resolution) under a tf.distribute strategy. Checkpoints go to
    --out; the same command resumes a killed run."""
    strategy_ = _check_settings(args)
    from keras_vit.train.data.load import default_eval_spec, load_data
    from keras_vit.train.data.sources import DataError
    from keras_vit.train.loop import Trainer

    eval_spec = (None if args.no_eval
                 else args.eval_data or default_eval_spec(args.data))
    train = load_data(args.data, data_dir=args.data_dir,
                      download=args.download,
                      verbose=not args.quiet)
    evaluation = None
    if eval_spec is not None:
        try:
            evaluation = load_data(
                eval_spec, split="test", data_dir=args.data_dir,
                download=args.download, verbose=not args.quiet)
        except DataError:
            if args.eval_data:  # asked for explicitly: report it
                raise
            print(f"note: no held-out split {eval_spec!r}; not evaluating "
                  "(pass --eval-data)")
    elif not args.no_eval:
        # A folder or .npz has no test split: evaluate on a part of it.
        train, evaluation = hold_out(train)
        if evaluation is not None:
            print(f"note: holding out {HOLD_OUT:.0%} of {train.source_name} "
                  f"for evaluation ({evaluation.num_examples} images, the "
                  "same ones on every run; --eval-data SPEC chooses, "
                  "--no-eval trains on all)")
    trainer = Trainer(args.model, train, evaluation,
                      **_trainer_options(args, args.recipe, strategy_))
    return 130 if _fit(trainer, args) is None else 0


# The share of a folder or .npz fine-tune evaluates on without --eval-data.
HOLD_OUT = 0.1


def hold_out(source, fraction=HOLD_OUT, seed=0):
    """``(train, held_out)``: ``fraction`` of each class of ``source``
    (at least one image of a class with two or more) set aside, the same
    images for the same data; ``(source, None)`` if no class can spare
    one."""
    import numpy as np

    labels = np.asarray(source.labels())
    rng = np.random.default_rng(seed)
    held = []
    for c in range(source.num_classes):
        idx = np.flatnonzero(labels == c)
        if len(idx) >= 2:
            k = max(1, int(fraction * len(idx) + 0.5))
            held.extend(rng.choice(idx, k, replace=False).tolist())
    if not held:
        return source, None
    keep = np.setdiff1d(np.arange(source.num_examples), held)
    train, evaluation = source.subset(keep), source.subset(sorted(held))
    name = source.name
    train.name = f"{name}[train {1 - fraction:.0%}]"
    evaluation.name = f"{name}[held out {fraction:.0%}]"
    train.source_name = evaluation.source_name = name
    return train, evaluation


def _trainer_options(args, what, strategy_):
    """The trainer's keywords that fine-tune and pretrain read alike from
    their options (--out defaults to runs/<model>-<data>-<what>)."""
    out = _out_folder(args.out or os.path.join(
        "runs", f"{_slug(args.model)}-{_slug(args.data)}-{what}"),
        "the run needs a folder (its checkpoints, metrics and model.keras)")
    if args.restart and args.resume_anyway:
        raise ValueError("--restart and --resume-anyway exclude each other")
    return dict(recipe=args.recipe, out_dir=out, strategy=strategy_,
                weights=options.weights_value(args.weights),
                resume="force" if args.resume_anyway else not args.restart,
                model_options=options.model_options(args.model_option),
                remat=True if args.remat else None, verbose=not args.quiet,
                **_recipe_overrides(args))


def _fit(trainer, args):
    """``trainer.fit()`` after :func:`check_fits_memory`, then the metrics
    as JSON with --json, or the final line with --quiet. Returns the
    result; None after Ctrl-C (the command that resumes printed)."""
    import shlex
    import sys

    from keras_vit.train.interrupt import TrainingInterrupted
    from keras_vit.train.progress import done_line

    if not args.no_memory_check:
        check_fits_memory(trainer)
    try:
        result = trainer.fit()
    except TrainingInterrupted as e:
        # The same command resumes; --restart would delete the checkpoint.
        again = [a for a in getattr(args, "command_line", ())
                 if a != "--restart"]
        print(f"{options.PROG}: interrupted at step {e.step} of "
              f"{e.total_steps}; its checkpoint is in {e.out_dir}"
              + (f". Resume with:\n  {shlex.join(again)}" if again else
                 " (the same command resumes)"),
              file=sys.stderr, flush=True)
        return None
    metrics = result.metrics
    if trainer.is_chief and args.json:
        print(json.dumps({k: v for k, v in metrics.items()
                          if k != "history"}, indent=2, default=str))
    elif trainer.is_chief and args.quiet:
        print(done_line(metrics["final_step"], metrics,
                        metrics.get("wall_time", 0.0)), flush=True)
    return result


def _load_model(args):
    """MODEL of evaluate / fewshot, resolved by the zoo's pipeline with
    --image-size and --weights."""
    from keras_vit.zoo import resolve_model

    return resolve_model(args.model,
                         weights=options.weights_value(args.weights),
                         image_size=args.image_size, argument="MODEL",
                         error=options.UserError)


def run_evaluate(args):
    """Evaluates MODEL (a .keras file, a fine-tune run directory, or a zoo
    name with --weights) on --data."""
    _configure_devices(args)
    import contextlib

    from keras_vit.base.checks import printable
    from keras_vit.train.data.load import load_data
    from keras_vit.train.distribute import for_backend
    from keras_vit.train.evaluation import evaluate, result_lines

    strategy_ = for_backend(args.strategy, tpu=args.tpu)
    source = load_data(args.data, split="test",
                       data_dir=args.data_dir,
                       download=args.download)
    # jax and torch strategies are names, without a scope.
    scope = getattr(strategy_, "scope", contextlib.nullcontext)
    with scope():
        model = _load_model(args)
    result = evaluate(model, source, image_size=args.image_size,
                      batch_size=args.batch_size, strategy=strategy_)
    result["data"] = source.name
    return _show(args, result, [
        f"{printable(args.model)} on {printable(source.name)}: top-1 accuracy "
        f"{result['accuracy']:.4f}, loss {result['loss']:.4f} "
        f"({result['num_examples']} images)"] + result_lines(result))


def _show(args, result, lines):
    """Prints ``result`` as JSON under ``--json``, else ``lines``."""
    result["model"] = args.model
    print(json.dumps(result, indent=2) if args.json else "\n".join(lines))
    return 0


def run_pretrain(args):
    """Pre-trains MODEL on unlabelled images by masked patch prediction
    (paper Appendix B.1.2): 50% of the patch embeddings corrupted (80%
    [mask], 10% another patch, 10% unchanged), each corrupted patch's 3-bit
    mean colour predicted. Checkpoints go to --out; the same command
    resumes. Fine-tune the result with `keras-vit fine-tune OUT/model.keras
    --data LABELLED`."""
    from keras_vit.train import mpp

    objective = mpp.check_objective(args.objective)
    target = mpp.check_target(args.target)
    strategy_ = _check_settings(args)
    trainer = mpp.MppTrainer(
        args.model, args.data, target=target,
        corruption_rate=args.corruption_rate, data_dir=args.data_dir,
        **_trainer_options(args, objective, strategy_))
    result = _fit(trainer, args)
    if result is None:
        return 130
    if (trainer.is_chief and not args.json
            and "model_path" in result.metrics):
        print(f"fine-tune it: keras-vit fine-tune "
              f"{result.metrics['model_path']} --data LABELLED_DATA")
    return 0


def run_fewshot(args):
    """The paper's few-shot linear evaluation: pre-logits features,
    regularised least squares to {-1,1} targets in closed form, accuracy for
    k images per class."""
    from keras_vit.train.data.load import default_eval_spec, load_data
    from keras_vit.train.few_shot import fewshot

    eval_spec = args.eval_data or default_eval_spec(args.data)
    if eval_spec is None:
        why = ("few-shot fits its classifier on --data and scores it on "
               "--eval-data, so --data cannot be the test split itself: "
               "pass the training split (e.g. digits:train) as --data"
               if str(args.data).endswith(":test") else
               "only digits and tfds data have a default test split")
        raise ValueError(
            f"--eval-data is needed with --data={args.data!r} ({why})")
    train = load_data(args.data, data_dir=args.data_dir,
                      download=args.download)
    test = load_data(eval_spec, split="test",
                     data_dir=args.data_dir, download=args.download)
    model = _load_model(args)
    result = fewshot(model, train, test, shots=args.shots,
                     l2_reg=args.l2_reg, num_seeds=args.seeds,
                     feature=args.feature, batch_size=args.batch_size)
    lines = [f"{args.model}: few-shot linear accuracy on {test.name} "
             f"({result['num_test']} images, {result['feature_dim']}-d "
             f"{args.feature} features, l2_reg {args.l2_reg:g}, "
             f"{args.seeds} draw(s))"]
    for k, acc in result["accuracy"].items():
        spread = result["per_seed"][k]
        lines.append(f"  {k:>3}-shot  {acc:.4f}  (min {min(spread):.4f}, "
                     f"max {max(spread):.4f})")
    return _show(args, result, lines)


def run_vtab(args):
    """The paper's VTAB-1k protocol (section 4.1, Appendix B.1.1, Table 9):
    per task, fine-tune on 800 training + 200 validation examples (SGD, lr
    0.01, 2500 steps, resolution 384) and score top-1 on the test part;
    scores per task, per group (Natural, Specialized, Structured) and the
    mean go to OUT/vtab.json and OUT/vtab.md. The data is read with
    tensorflow-datasets and must be prepared (`tfds build NAME`) unless
    --download is given."""
    _configure_devices(args)
    from keras_vit.train import vtab

    overrides = _recipe_overrides(args)
    steps = overrides.pop("total_steps", None)
    out = _out_folder(
        args.out or os.path.join("runs", f"vtab-{_slug(args.model)}"),
        "the sweep needs a folder (its runs, vtab.json and vtab.md)")
    weights = options.weights_value(args.weights)
    scores = vtab.run(
        args.model, args.tasks, out_dir=out, data_dir=args.data_dir,
        download=args.download, sweep=args.sweep, steps=steps,
        train_examples=args.train_examples, val_examples=args.val_examples,
        test_examples=args.test_examples, weights=weights,
        strategy=args.strategy, tpu=args.tpu,
        model_options=options.model_options(args.model_option),
        keep_models=args.keep_models, verbose=not args.quiet, **overrides)
    if args.json:
        print(json.dumps(scores, indent=2))
    else:
        print(vtab.markdown(scores), end="")
        stem = os.path.join(out, "vtab-sweep" if args.sweep else "vtab")
        print(f"wrote {stem}.json and {stem}.md")
    return 0


def build_parser():
    """A stand-alone parser with the training commands (``python -m
    keras_vit.train``)."""
    parser, sub = options.commands_parser(
        "python -m keras_vit.train",
        "Fine-tune, evaluate and few-shot-evaluate keras_vit models (the "
        "same commands as keras-vit).")
    register(sub)
    return parser


def main(argv=None):
    """Runs ``python -m keras_vit.train`` and returns the exit status."""
    return options.main(build_parser(), argv)
