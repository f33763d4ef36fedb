"""The command line (argparse, the demo): each command imports the heavy modules it runs.

``keras-vit``: list, info, convert, predict, demo, and the commands of the
other components (inspect, export, fine-tune, ...), whose parsers live in
this folder too, one module a component (:mod:`keras_vit.cli.train`,
:mod:`keras_vit.cli.analysis`, :mod:`keras_vit.cli.export`).

Run ``keras-vit --help`` (or ``python -m keras_vit.cli --help``). Mistakes in
the command line or its files print one line, ``keras-vit: error: ...``, and
exit with status 2; ``--traceback`` shows the full Python traceback instead.
"""

from __future__ import annotations

import json
import os
import sys

from keras_vit.cli import options
from keras_vit.cli.options import PROG, UserError, positive_int


def _squash(name):
    return "".join(c for c in name.lower() if c.isalnum())


# --------------------------------------------------------------------------
# list / info


def _cmd_list(args):
    from keras_vit import zoo

    pattern = args.pattern
    try:
        names = zoo.list_models(family=args.family)
    except ValueError as e:
        raise UserError(f"--family {args.family}: {e}") from None
    if pattern and not any(c in pattern for c in "*?["):
        # A bare word matches anywhere, ignoring case and separators, the way
        # model names are parsed: "b16" finds ViT-B/16 and R50+ViT-B/16.
        word = _squash(pattern)
        names = [n for n in names if word in _squash(n)]
    elif pattern:
        names = [n for n in names if n in zoo.list_models(pattern)]
    if not names:
        asked = " ".join(([repr(args.pattern)] if args.pattern else [])
                         + ([f"--family {args.family}"] if args.family
                            else []))
        raise UserError(f"no registered model matches {asked}; "
                        f"`{PROG} list` shows them all")
    rows = []
    for name in names:
        meta = zoo.info(name)
        cells = []
        for tag, files in meta["weights"].items():
            sizes = ", ".join(str(f["image_size"]) for f in files)
            star = "*" if tag == meta["default_weights"] else ""
            cells.append(f"{tag}{star} ({sizes})")
        rows.append((name, meta["family"], ", ".join(cells) or "-"))
    width = max(len(r[0]) for r in rows)
    family_width = max(len("FAMILY"), *(len(r[1]) for r in rows))
    print(f"{'NAME':<{width}}  {'FAMILY':<{family_width}}  "
          "WEIGHTS TAG (resolution)")
    for name, family, cells in rows:
        print(f"{name:<{width}}  {family:<{family_width}}  {cells}")
    print(f"* default (weights='auto'). Details: {PROG} info NAME; one "
          f"family: {PROG} list --family FAMILY")
    return 0


def _cmd_info(args):
    from keras_vit import zoo

    meta = zoo.info(args.name)
    if args.json:
        print(json.dumps(meta, indent=2))
        return 0
    status = "registered" if meta["registered"] else "not registered"
    print(f"{meta['name']}  (family {meta['family']}, {status})")
    for note in meta["notes"]:
        print(f"  {note}")
    config = " ".join(f"{k}={v}" for k, v in meta["config"].items())
    print(f"  architecture:   {config}")
    count = meta.get("parameters")
    if count:
        print(f"  parameters:     {count['count']:,} (at "
              f"{count['image_size']} px, {count['num_classes']} classes"
              + (f", pre_logits {count['representation_size']}"
                 if count["representation_size"] else "") + ")")
    norm = meta["input_normalization"]
    print(f"  source:         {meta['source'] or 'none (weights=None)'}")
    print(f"  image size:     {meta['image_size']}")
    print(f"  normalisation:  {norm['name']} (mean {tuple(norm['mean'])}, "
          f"std {tuple(norm['std'])} of [0, 1] pixels)")
    print(f"  labels:         {_labels_text(meta)}")
    print(f"  preprocessing:  {meta['preprocessing']}")
    print(f"  default weights: {meta['default_weights'] or 'none'}")
    if not meta["weights"]:
        print("  weights: none released (use weights=None or a checkpoint)")
    for tag, files in meta["weights"].items():
        for f in files:
            extra = (f", pre_logits {f['representation_size']}"
                     if f["representation_size"] else "")
            head = (f"{f['num_classes']} classes (labels {f['labels']})"
                    if f["labels"] else
                    f"{f['num_classes']} outputs, no labels"
                    if f["num_classes"] else "no head (pooled embedding)")
            print(f"  [{tag}] {f['image_size']}px, {head}{extra}")
            if f["description"]:
                print(f"      {f['description']}")
            print(f"      {f['url']}")
            if f["sha256"]:
                print(f"      sha256 {f['sha256']}")
            print(f"      license {f['license']}")
    return 0


def _labels_text(meta):
    """The default head's labels, for ``info``: the list's name and size,
    or what the head is when it has none."""
    default = meta["default_weights"]
    if default is None:
        return "none (no released weights)"
    classes = meta["weights"][default][0]["num_classes"]
    if meta["labels"]:
        return f"{meta['labels']} ({classes} classes)"
    if not classes:
        return "none: no head, the model returns the pooled embedding"
    return f"none: a {classes}-wide head without class names"


# --------------------------------------------------------------------------
# convert


def _npz_shapes(path):
    """``{key: shape}`` of an ``.npz`` from the array headers alone (a large
    checkpoint is not read twice); ``{}`` if the file cannot be parsed, in
    which case the loader reports the problem."""
    import zipfile

    import numpy as np

    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if not member.filename.endswith(".npy"):
                    continue
                with archive.open(member) as f:
                    reader = readers.get(np.lib.format.read_magic(f))
                    if reader is None:
                        continue
                    shapes[member.filename[:-4]] = tuple(reader(f)[0])
    except Exception:  # noqa: BLE001 - the loader gives the real error
        return {}
    return {k[len("params/"):] if k.startswith("params/") else k: v
            for k, v in shapes.items()}


def _grid_text(tokens):
    side = int(round(tokens ** 0.5))
    return f"{side}x{side}" if side * side == tokens else f"{tokens} patches"


def _cmd_convert(args):
    """Builds MODEL, loads the checkpoint (resizing position embeddings to
    --image-size, replacing the head for another --num-classes) and saves a
    .keras file."""
    from keras_vit import zoo
    from keras_vit.base import variants

    out = os.path.abspath(args.output)
    if not out.endswith(".keras"):
        raise UserError(f"the output must end with .keras; received "
                        f"-o {args.output!r}")
    if os.path.isdir(out):
        raise UserError(f"-o {args.output!r} is a directory; pass a file "
                        "name ending in .keras")
    # Missing folders are created when the file is written.
    options.check_output_folder(os.path.dirname(out), "-o", args.output)
    arch = variants.parse(args.model)  # a bad name fails before any download
    resolved = zoo.resolve_weights(arch.name, args.checkpoint,
                                   args.image_size)
    shapes = _npz_shapes(resolved.path)
    from keras_vit.zoo import resolve_model

    try:
        model = resolve_model(args.model, weights=resolved.path,
                              image_size=args.image_size,
                              num_classes=args.num_classes, argument="-m",
                              error=UserError)
    except zoo.CheckpointError as e:
        raise UserError(f"{args.checkpoint}: {e}") from e

    # The class token is the one prefix token of the position table.
    prefix = int(model.classifier == "token")
    grid = model.grid_size
    ckpt_posemb = (shapes.get("Transformer/posembed_input/pos_embedding")
                   or shapes.get("pos_embedding"))
    if ckpt_posemb is None:
        posemb = "unknown in the checkpoint"
    elif ckpt_posemb[1] - prefix == grid[0] * grid[1]:
        posemb = f"as in the checkpoint ({grid[0]}x{grid[1]})"
    else:
        posemb = (f"resized from {_grid_text(ckpt_posemb[1] - prefix)} to "
                  f"{grid[0]}x{grid[1]} (bilinear)")
    ckpt_head = shapes.get("head/kernel")
    if ckpt_head is None:
        head = (f"{model.num_classes} classes, zero-initialised (the "
                "checkpoint has no head)")
    elif ckpt_head[-1] != model.num_classes:
        head = (f"{model.num_classes} classes, zero-initialised (the "
                f"checkpoint's head has {ckpt_head[-1]})")
    else:
        head = f"{model.num_classes} classes, from the checkpoint"

    # Save under a temporary name in the same directory and rename: an
    # interrupted or failed save never leaves a file that looks finished.
    from keras_vit.base import atomic

    with atomic.atomic_path(out) as tmp:
        model.save(tmp)

    size = model.image_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    print(f"Converted {args.checkpoint} -> {out} "
          f"({os.path.getsize(out) / 2**20:.1f} MiB)")
    print(f"  model:       {arch.name}, classifier {model.classifier}"
          + (f", pre_logits {model.representation_size}"
             if model.representation_size else ""))
    print(f"  resolution:  {size[0]}x{size[1]} "
          f"(patch grid {grid[0]}x{grid[1]})")
    print(f"  posemb:      {posemb}")
    print(f"  head:        {head}")
    print(f"  parameters:  {model.count_params():,}")
    print(f"Load it with: import keras, keras_vit.models; "
          f"keras.saving.load_model({out!r})")
    return 0


# --------------------------------------------------------------------------
# predict


def _looks_like_file(value):
    return value.endswith(".keras") or (
        os.path.isfile(value) and not value.endswith(".safetensors"))


def _check_model_name(value):
    """A zoo name, else one error: "does not exist" for what looks like a
    path (``runs/x``, ``./x``, ``/x``), the zoo's unknown-name error for
    the rest (zoo names hold a slash too: ``ViT-B/16``)."""
    from keras_vit.base import variants

    try:
        variants.parse(value)
    except ValueError:
        parent = os.path.dirname(value.rstrip("/" + os.sep))
        if (os.path.isabs(value) or value.startswith(("./", "../", "~"))
                or value.endswith(("/", os.sep))
                or (parent and os.path.isdir(parent))):
            raise UserError(
                f"MODEL={value!r} does not exist (expected a zoo name, a "
                f".keras file or a run directory; `{PROG} list` shows the "
                "names)") from None
        raise


def _load_for_predict(args):
    """Returns ``(model, description)`` for NAME, a ``.keras`` file, a run
    directory or a Hub folder: one resolution (the zoo's pipeline), with
    --weights and --image-size applied or refused by name whatever MODEL
    is."""
    from keras_vit.zoo import resolve_model

    if (_looks_like_file(args.model) and not args.model.endswith(".keras")
            and not os.path.isdir(args.model)):
        raise UserError(
            f"{args.model!r} is a file but not a .keras model; for an "
            f".npz checkpoint pass the architecture and the file: "
            f"{PROG} predict ViT-B/16 IMAGE --weights {args.model}")
    model = resolve_model(args.model, weights=args.weights or "auto",
                          image_size=args.image_size, argument="MODEL",
                          error=UserError)
    if _looks_like_file(args.model) or os.path.isdir(args.model):
        return model, os.path.basename(os.path.normpath(args.model))
    record = getattr(model, "zoo_weights", None)
    if record is not None:
        return model, f"{model.zoo_name} {record.tag}"
    # timm/transformers weights (an hf-hub: handle, a .safetensors file),
    # or --weights FILE: named by what was given.
    source = args.weights or args.model
    name = getattr(model, "zoo_name", None)
    return model, (f"{name} ({source})" if name and name != source
                   else source)


def load_keras_file(path, argument="MODEL"):
    """A ``.keras`` file's model (``compile=False``: inference and
    fine-tuning need no saved optimizer), or one clear error naming the
    argument (see :func:`keras_vit.zoo.keras_archive.load_keras_file`)."""
    from keras_vit.zoo.keras_archive import load_keras_file as load

    return load(path, argument, error=UserError)


def _model_geometry(model):
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or shape[1] is None or shape[2] is None:
        raise UserError(f"the model takes inputs of shape {shape}; predict "
                        "needs fixed-size images (batch, height, width, 3)")
    if shape[3] != 3:
        raise UserError(f"the model takes {shape[3]}-channel inputs; "
                        "predict feeds RGB images")
    return int(shape[1]), int(shape[2])


def _image_paths(arguments):
    """The image files the IMAGE arguments name, in order: a file as it
    is, a folder's image files (by extension, recursively, sorted), a glob
    pattern's matches (``**`` spans folders). An argument that names
    nothing stops the command with one line naming it: before the model
    loads."""
    import glob

    from keras_vit.base.archives import special_file
    from keras_vit.train.data.image_checks import IMAGE_EXTENSIONS

    paths = []
    for arg in arguments:
        if os.path.isdir(arg):
            found = sorted(
                os.path.join(root, name)
                for root, dirs, names in os.walk(arg)
                for name in names if not name.startswith(".")
                and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS)
            if not found:
                raise UserError(
                    f"IMAGE={arg!r} is a folder with no image files "
                    f"({', '.join(IMAGE_EXTENSIONS)})")
            paths += found
        elif os.path.lexists(arg):
            kind = special_file(arg)
            if kind is not None:  # opening a FIFO would block
                raise UserError(f"IMAGE={arg!r} is {kind}, not a regular "
                                "file; pass image files")
            paths.append(arg)
        elif glob.has_magic(arg):
            found = sorted(p for p in glob.glob(arg, recursive=True)
                           if os.path.isfile(p))
            if not found:
                raise UserError(f"IMAGE={arg!r} matches no file")
            paths += found
        else:
            raise UserError(f"IMAGE={arg!r} does not exist")
    return paths


def _read_image(path):
    """One image as (height, width, 3) float32 RGB pixels in [0, 255],
    decoded by :mod:`keras_vit.data.images` (the rules the training pipeline
    and the ``image_bytes`` serving signature share: EXIF orientation,
    palettes, alpha, 16-bit, the first GIF frame, the pixel budget); an
    image those rules refuse raises a one-line UserError naming the file.
    """
    from keras_vit.data import images

    try:
        pixels = images.read(path, name=f"IMAGE={path!r}")
    except images.ImageError as e:
        raise UserError(str(e)) from None
    return pixels.astype("float32")


def _cmd_predict(args):
    """Top-K classes of each image. Images are resized (bilinear, no crop)
    and scaled to [-1, 1], as in the official evaluation."""
    import numpy as np

    from keras_vit import zoo
    from keras_vit.models.memory import infer
    from keras_vit.zoo import timm_hub
    from keras_vit.zoo.preprocessing import model_labels, probabilities

    if not (_looks_like_file(args.model) or os.path.isdir(args.model)
            or timm_hub.is_timm_source(args.model)):
        _check_model_name(args.model)  # before the images are read
    paths = _image_paths(args.images)
    model, description = _load_for_predict(args)
    if getattr(model, "include_top", True) is False:
        raise UserError("the model has no classification head "
                        "(include_top=False)")
    size = _model_geometry(model)
    from keras_vit.data.normalization import of_model, takes_raw_pixels

    # Models built with include_preprocessing=True take raw [0, 255] pixels.
    scale = not takes_raw_pixels(model)

    # The official evaluation transform (zoo.preprocess_input): resize,
    # bilinear with no crop, then the model's input normalisation.
    from keras_vit.models.memory import forward_batch

    # Before the images are read: --image-size 4000 asks ~350 GiB of
    # attention maps per image of ViT-B/16.
    batch = forward_batch(model, 16, option=(
        "--image-size" if args.image_size else "the model's image size"))
    # Each image that cannot be read is reported and the others predicted;
    # the command then exits non-zero.
    good, failed, images = [], [], []
    for path in paths:
        try:
            pixels = _read_image(path)
        except UserError as e:
            failed.append({"image": path, "error": str(e)})
            continue
        good.append(path)
        images.append(zoo.preprocess_input(
            pixels, size, scale=scale, input_normalization=of_model(model)))
    if not images and len(failed) == 1:
        raise UserError(failed[0]["error"])
    for failure in failed:
        print(f"{PROG}: error: {failure['error']}", file=sys.stderr)
    if not images:
        raise UserError(f"none of the {len(paths)} images could be read")
    images = np.stack(images)
    outputs = []
    for start in range(0, len(images), batch):
        out = infer(model, images[start:start + batch])
        if isinstance(out, dict):
            out = out["output"]
        outputs.append(np.asarray(out))
    outputs = np.concatenate(outputs)
    bad = ~np.isfinite(outputs).all(axis=-1)
    if bad.any():  # NaN weights: a ranking of "nan" scores means nothing
        first = [p for p, b in zip(good, bad) if b][0]
        raise UserError(
            f"the model {description} gives non-finite outputs (NaN or inf) "
            f"for {int(bad.sum())} of {len(bad)} image(s), e.g. {first!r}: "
            "its weights hold NaN or inf values (a diverged run or a "
            "corrupt file?)")
    num_classes = outputs.shape[-1]
    # The scores decode_predictions gives: probabilities. A model that
    # says what its head ends with is believed; another (a plain Keras
    # model in a .keras file) is judged by its outputs' values.
    activation = getattr(model, "classifier_activation", "unknown")
    from_logits = {"softmax": False, None: True, "linear": True}.get(
        activation)
    probs = probabilities(outputs, from_logits)
    label_name, labels = model_labels(model, num_classes)
    k = min(args.top, num_classes)

    results = []
    for path, p in zip(good, probs):
        top = []
        for rank, idx in enumerate(np.argsort(-p, kind="stable")[:k], 1):
            wnid, label = labels[idx] if labels else (None, f"class {idx}")
            top.append({"rank": rank, "index": int(idx),
                        "probability": float(p[idx]), "label": label,
                        "wordnet_id": wnid})
        results.append({"image": path, "top": top})

    if args.json:
        print(json.dumps({"model": description,
                          "image_size": list(size),
                          "labels": label_name,
                          "predictions": results, "failed": failed},
                         indent=2))
        return 1 if failed else 0
    from keras_vit.base.checks import printable

    # Label names may come from a downloaded config.json: a newline would
    # split the line, an escape sequence would reach the terminal.
    for i, result in enumerate(results):
        if i:
            print()
        print(f"{result['image']}: {description}, {size[0]}x{size[1]}, "
              f"labels {label_name or 'class indices'}")
        for t in result["top"]:
            ident = f"{t['index']} {t['wordnet_id']}" if t["wordnet_id"] else (
                str(t["index"]))
            print(f"  {t['rank']:>2}  {t['probability']:.4f}  "
                  f"{printable(t['label'])}  [{ident}]")
    if failed:
        print(f"{PROG}: error: {len(failed)} of {len(paths)} image(s) could "
              "not be read (above)", file=sys.stderr)
    return 1 if failed else 0


# --------------------------------------------------------------------------
# demo


def _cmd_demo(args):
    """Trains, saves, reloads, exports the official layout and fine-tunes at
    another resolution; all offline."""
    from keras_vit.cli import demo

    result = demo.run(out_dir=args.out, epochs=args.epochs, quick=args.quick,
                      verbose=True)
    # The stages that fail without stopping the demo (the exporters) still
    # fail the command: a summary line is easy to miss, an exit status not.
    status = result["export"]["status"]
    if status.startswith("failed"):  # "ok", or "skipped" with --quick
        print(f"{PROG}: error: demo stage export {status}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------


def build_parser():
    """The argparse parser of ``keras-vit``."""
    from keras_vit.base.version import __version__
    from keras_vit.cli import demo

    parser, sub = options.commands_parser(
        PROG, "Vision Transformers for Keras 3: the model zoo, checkpoint "
              "conversion, inference and an offline demo.",
        traceback=("--debug", "--traceback"),
        traceback_help="show the Python traceback of errors (also accepted "
                       "after the command)", version=__version__)

    p = sub.add_parser("list", help="registered models and their weights")
    p.add_argument("pattern", nargs="?", metavar="PATTERN",
                   help="glob (ViT-B*) or substring (B/16) of the names")
    p.add_argument("--family", metavar="FAMILY",
                   help="one family only: vit, hybrid, axial, bit, deit, "
                        "deit3, dinov2, clip")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("info", help="architecture and released weights of "
                                    "a model")
    p.add_argument("name", metavar="NAME", help="e.g. ViT-B/16, vit-b16")
    options.add(p, json=None)
    p.set_defaults(func=_cmd_info)

    p = options.command(sub, "convert", _cmd_convert,
                        help="official .npz checkpoint -> .keras model")
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a local .npz, or a weights tag / URL of MODEL "
                        "(downloaded to the cache)")
    p.add_argument("--model", "-m", required=True, metavar="NAME",
                   help="architecture of the checkpoint, e.g. ViT-B/16")
    options.add(p, image_size="input resolution (default: the checkpoint's)",
                num_classes="head size (default: the checkpoint's)")
    options.add(p, output={"metavar": "OUT.keras"})

    p = options.command(sub, "predict", _cmd_predict,
                        help="classify images")
    options.add(p, model={
        "metavar": "NAME", "help": "a model name (e.g. ViT-B/16), a .keras "
        "file, or timm weights: hf-hub:<repo>, a repository folder, a "
        ".safetensors file"})
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files, folders (their images, recursively) "
                   "or glob patterns ('photos/**/*.jpg'); an image that "
                   "cannot be read is reported and the others predicted")
    options.add(p, weights="weights tag, .npz path or URL (default: the "
                           "model's default weights)",
                image_size="input resolution (default: the weights')")
    p.add_argument("--top", "-k", type=positive_int, default=5, metavar="K",
                   help="classes to show per image (default: 5)")
    options.add(p, json=None)

    p = options.command(sub, "demo", _cmd_demo,
                        help="train a tiny ViT on scikit-learn digits (offline)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: ./keras_vit_demo)")
    p.add_argument("--epochs", type=positive_int,
                   default=demo.DEFAULT_EPOCHS, metavar="N",
                   help=f"training epochs (default: {demo.DEFAULT_EPOCHS})")
    p.add_argument("--quick", action="store_true",
                   help="a small subset and 2 epochs (a smoke test)")

    # The other components add their own commands (inspect, export,
    # benchmark, fine-tune, ...), each through a ``register(subparsers)``
    # of a light module that imports the commands' code only when a command
    # runs. Imported here, not with this package: ``python -m
    # keras_vit.cli.analysis`` runs a module this package has not loaded.
    from keras_vit.cli import analysis, export, train

    for commands in (analysis, export, train):
        commands.register(sub)
    return parser


def main(argv=None) -> int:
    """Runs ``keras-vit`` with ``argv`` (default: ``sys.argv[1:]``) and
    returns the exit status. Each command imports what it needs (Keras,
    the model classes) once its arguments have parsed: ``--help``,
    ``list`` and ``info`` load no framework."""
    return options.main(build_parser(), argv)


def console_main() -> int:
    """The ``keras-vit`` process: :func:`main` as
    :func:`keras_vit.cli.options.start` runs it (TensorFlow's C++ start-up
    lines kept off stderr, a bad ``KERAS_BACKEND`` named in one line)."""
    return options.start(main)
