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
    """``{key: shape}`` of an ``.npz`` from the array headers alone; ``{}``
    if the file cannot be parsed (the loader reports it)."""
    from keras_vit.base.archives import npz_headers

    try:
        headers = npz_headers(path)
    except Exception:  # noqa: BLE001 - the loader gives the real error
        return {}
    return {name[:-len(".npy")].removeprefix("params/"): header.shape
            for name, header in headers.items() if header is not None}


def _grid_text(tokens):
    side = int(round(tokens ** 0.5))
    return f"{side}x{side}" if side * side == tokens else f"{tokens} patches"


def _cmd_convert(args):
    """Builds MODEL, loads the checkpoint (resizing position embeddings to
    --image-size, replacing the head for another --num-classes) and saves a
    .keras file."""
    from keras_vit import zoo
    from keras_vit.base import atomic, geometry, variants

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
    try:
        model = zoo.resolve_model(
            args.model, weights=resolved.path, image_size=args.image_size,
            num_classes=args.num_classes, argument="-m", error=UserError)
    except zoo.CheckpointError as e:
        raise UserError(f"{args.checkpoint}: {e}") from e

    prefix = int(geometry.class_token(model.get_config()))
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
    if ckpt_head is not None and ckpt_head[-1] == model.num_classes:
        head = f"{model.num_classes} classes, from the checkpoint"
    else:
        why = ("the checkpoint has no head" if ckpt_head is None
               else f"the checkpoint's head has {ckpt_head[-1]}")
        head = f"{model.num_classes} classes, zero-initialised ({why})"

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
    directory or a Hub folder, with --weights and --image-size."""
    from keras_vit.zoo import resolve_model

    if _looks_like_file(args.model) and not args.model.endswith(".keras"):
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
    # timm/transformers weights or --weights FILE: named by what was given.
    source = args.weights or args.model
    name = getattr(model, "zoo_name", None)
    return model, (f"{name} ({source})" if name and name != source
                   else source)


def _model_geometry(model):
    """The (height, width) images are resized to: the model's input size,
    or for a model of any input size (``dynamic_image_size``) the size it
    was built at (--image-size builds it at another); None for a NaFlex
    model, which takes each image at its own aspect ratio."""
    if getattr(model, "naflex", False):
        return None
    shape = tuple(model.inputs[0].shape)
    size = getattr(model, "image_size", None)  # as built (or --image-size)
    if len(shape) == 4 and None in shape[1:3] and size is not None:
        shape = (None, *((size, size) if isinstance(size, int) else size),
                 shape[3])
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
    pattern's matches (``**`` spans folders); UserError for an argument
    that names nothing."""
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
    decoded by :mod:`keras_vit.data.images`; UserError if it is refused."""
    from keras_vit.data import images

    try:
        pixels = images.read(path, name=f"IMAGE={path!r}")
    except images.ImageError as e:
        raise UserError(str(e)) from None
    return pixels.astype("float32")


# What --out writes, by the file's extension (see _save_outputs).
OUT_FORMATS = (".npz", ".json", ".csv")


def _check_predict(args):
    """predict's checks of --out before Keras loads: a format the
    extension names, not a folder, a folder it can be written in."""
    if args.out is None:
        return
    out = os.path.abspath(args.out)
    suffix = os.path.splitext(out)[1].lower()
    formats = ", ".join(OUT_FORMATS[:-1]) + f" or {OUT_FORMATS[-1]}"
    if suffix not in OUT_FORMATS:
        what = f"the unknown format {suffix!r}" if suffix else "no extension"
        why = ("; a .npy file holds one array, without the image names"
               if suffix == ".npy" else "")
        raise UserError(f"--out {args.out!r} has {what}; the extension "
                        f"picks the format: {formats}{why}")
    if os.path.isdir(out):
        raise UserError(f"--out {args.out!r} is a folder; pass a file name "
                        f"ending in {formats}")
    options.check_output_folder(os.path.dirname(out), "--out", args.out)


def _output_shape(model):
    """The shape of one image's output, or None if the model does not say."""
    try:
        out = model.output
    except (AttributeError, ValueError):
        return None
    if isinstance(out, dict):
        out = out.get("output")
    return None if out is None else tuple(out.shape[1:])


def _head_ignores_the_image(model):
    """Whether every head of ``model`` (``head``, ``head_dist``) has an
    all-zero kernel, so that it scores every image the same."""
    import keras
    import numpy as np

    kernels = [layer.kernel for layer in model.layers
               if layer.name in ("head", "head_dist")
               and getattr(layer, "kernel", None) is not None]
    return bool(kernels) and not any(
        np.any(keras.ops.convert_to_numpy(k)) for k in kernels)


def _no_ranking(probs, constant_head):
    """Why a row of probabilities ranks nothing, or None if it ranks."""
    if constant_head:
        return ("the head's kernel is all zeros, so it gives the same "
                "scores for every image (a checkpoint without its head, or "
                "a new head not yet trained)")
    if len(probs) > 1 and probs.max() == probs.min():
        return (f"all {len(probs)} classes score {probs[0]:.4g}: no class "
                "ranks above another")
    return None


def _forward(model, paths, size, args, description):
    """``(good, failed, outputs)``: the paths read, those that could not be
    (``{"image", "error"}``), and the model's outputs (a row per good
    image) on the official evaluation transform."""
    import numpy as np

    from keras_vit import zoo
    from keras_vit.data.normalization import of_model, takes_raw_pixels
    from keras_vit.models.memory import forward_batch, infer

    scale = not takes_raw_pixels(model)
    # Before the images are read: --image-size 4000 asks ~350 GiB of
    # attention maps per image of ViT-B/16.
    batch = forward_batch(model, 16, option=(
        "--image-size" if args.image_size else "the model's image size"))
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
    if size is not None:
        images = np.stack(images)
    outputs = []
    for start in range(0, len(images), batch):
        chunk = images[start:start + batch]
        if size is None:  # NaFlex: each image within the table's patches
            from keras_vit.data import naflex

            chunk = naflex.model_inputs(model, chunk)
        out = infer(model, chunk)
        if isinstance(out, dict):
            out = out["output"]
        outputs.append(np.asarray(out))
    outputs = np.concatenate(outputs)
    if outputs.dtype != np.float64:  # 16-bit floats fit float32 exactly
        outputs = outputs.astype("float32")
    bad = ~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=-1)
    if bad.any():  # NaN weights: a ranking of "nan" scores means nothing
        first = [p for p, b in zip(good, bad) if b][0]
        raise UserError(
            f"the model {description} gives non-finite outputs (NaN or inf) "
            f"for {int(bad.sum())} of {len(bad)} image(s), e.g. {first!r}: "
            "its weights hold NaN or inf values (a diverged run or a "
            "corrupt file?)")
    return good, failed, outputs


def _rank(model, outputs, top, good):
    """A classifier's outputs as ``(probabilities, label_name,
    class_names, results)``: per image its top classes, or why none
    (``no_ranking``); the scores as the model's head gives them
    (:func:`~keras_vit.zoo.preprocessing.head_probabilities`)."""
    import numpy as np

    from keras_vit.zoo.preprocessing import head_probabilities, model_labels

    num_classes = outputs.shape[-1]
    probs = head_probabilities(model, outputs)
    label_name, labels = model_labels(model, num_classes)
    names = [labels[i][1] if labels else f"class {i}"
             for i in range(num_classes)]
    constant = _head_ignores_the_image(model)
    k = min(top or 5, num_classes)
    results = []
    for path, p in zip(good, probs):
        reason = _no_ranking(p, constant)
        order = [] if reason else np.argsort(-p, kind="stable")[:k]
        results.append({"image": path, "no_ranking": reason, "top": [
            {"rank": rank, "index": int(idx), "probability": float(p[idx]),
             "label": names[idx],
             "wordnet_id": labels[idx][0] if labels else None}
            for rank, idx in enumerate(order, 1)]})
    return probs, label_name, names, results


def _cmd_predict(args):
    """The top-K classes of each image, or, for a feature extractor (a
    model without a classification head, such as the DINOv2 and SigLIP
    towers: num_classes=0 or include_top=False; CLIP's towers, whose head
    is the image-text projection: head_type="projection"), its embedding. Each
    image is resized to the model's input size (bilinear, no crop; for a
    model of any input size, dynamic_image_size, the size it was built at
    or --image-size; a NaFlex model takes each image at its own aspect
    ratio) and normalised with the model's own input normalisation (what
    its weights were trained with, as `keras-vit info NAME` shows it: the
    official [-1, 1] of the 2020 ViT, ImageNet or CLIP mean/std for
    others; nothing for a model that takes raw pixels). --out FILE saves every
    image's whole output; --json prints a feature extractor's whole
    embedding."""
    from keras_vit.zoo.timm import hub as timm_hub

    if not (_looks_like_file(args.model) or os.path.isdir(args.model)
            or timm_hub.is_timm_source(args.model)):
        _check_model_name(args.model)  # before the images are read
    paths = _image_paths(args.images)
    model, description = _load_for_predict(args)
    size = _model_geometry(model)
    from keras_vit.models.features import available_features, is_classifier

    # One of the package's models without a classification head; a plain
    # Keras model is taken as a classifier.
    features = not is_classifier(model) and bool(available_features(model))
    shape = _output_shape(model)
    if features and args.top is not None:
        raise UserError(
            f"--top {args.top}: the model {description} has no "
            "classification head (a feature extractor); predict gives each "
            "image's embedding, not classes")
    if (args.out and args.out.lower().endswith(".csv") and shape
            and len(shape) > 1):
        raise UserError(
            f"--out {args.out!r}: the model gives features of shape "
            f"{'x'.join(map(str, shape))} per image, not one vector a CSV "
            "row can hold; save them as .npz or .json")
    good, failed, outputs = _forward(model, paths, size, args, description)
    meta = {"model": description,
            "image_size": "any" if size is None else list(size)}
    if features:
        saved = _save_outputs(args.out, meta, "embeddings", good, outputs,
                              None, failed)
        _show_embeddings(args, meta, good, outputs, failed)
    else:
        probs, label_name, names, results = _rank(model, outputs, args.top,
                                                  good)
        saved = _save_outputs(args.out, meta, "probabilities", good, probs,
                              names, failed)
        _show_classes(args, dict(meta, labels=label_name), results, failed)
    if saved and not args.json:
        print(saved)
    if failed and not args.json:  # --json lists them under "failed"
        print(f"{PROG}: error: {len(failed)} of {len(paths)} image(s) could "
              "not be read (above)", file=sys.stderr)
    return 1 if failed else 0


def _size_text(meta):
    """The size images were resized to, ``HxW``; a NaFlex model's "any
    size" (each image at its own aspect ratio)."""
    size = meta["image_size"]
    return "any size" if size == "any" else f"{size[0]}x{size[1]}"


def _show_embeddings(args, meta, good, outputs, failed):
    import numpy as np

    if args.json:
        print(json.dumps(dict(meta, output="embedding",
                              shape=list(outputs.shape[1:]),
                              predictions=[{"image": p, "embedding": v}
                                           for p, v in zip(good,
                                                           outputs.tolist())],
                              failed=failed), indent=2))
        return
    print(f"{meta['model']}, {_size_text(meta)}: no classification head "
          "(a feature extractor); each image's embedding (--json, --out "
          "FILE: the whole vectors)")
    for path, vector in zip(good, outputs):
        flat = vector.ravel()
        what = (f"embedding of {flat.size} values" if vector.ndim == 1 else
                f"features of shape {'x'.join(map(str, vector.shape))} "
                f"({flat.size} values)")
        head = ", ".join(f"{v:.4f}" for v in flat[:4])
        more = ", ..." if flat.size > 4 else ""
        print(f"{path}: {what}, norm {float(np.linalg.norm(flat)):.4f}  "
              f"[{head}{more}]")


def _show_classes(args, meta, results, failed):
    if args.json:
        print(json.dumps(dict(meta, output="classes", predictions=results,
                              failed=failed), indent=2))
        return
    from keras_vit.base.checks import printable

    # Label names may come from a downloaded config.json.
    for i, result in enumerate(results):
        if i:
            print()
        print(f"{result['image']}: {meta['model']}, {_size_text(meta)}, "
              f"labels {meta['labels'] or 'class indices'}")
        if result["no_ranking"]:
            print(f"  no ranking: {result['no_ranking']}")
        for t in result["top"]:
            ident = f"{t['index']} {t['wordnet_id']}" if t["wordnet_id"] else (
                str(t["index"]))
            print(f"  {t['rank']:>2}  {t['probability']:.4f}  "
                  f"{printable(t['label'])}  [{ident}]")


def _save_outputs(dest, meta, kind, images, values, labels, failed):
    """Writes ``values`` (a row per image of ``images``) to ``dest`` in the
    format its extension names (``.npz``, ``.json`` or ``.csv``), under the
    key ``kind``; returns the line that says so, or None without ``dest``.
    """
    if dest is None:
        return None
    import csv

    import numpy as np

    from keras_vit.base import atomic

    out = os.path.abspath(dest)
    suffix = os.path.splitext(out)[1].lower()
    with atomic.atomic_path(out) as tmp:
        if suffix == ".npz":
            arrays = {"images": np.array(images, dtype=str), kind: values}
            if labels is not None:
                arrays["labels"] = np.array(labels, dtype=str)
            np.savez(tmp, **arrays)
        elif suffix == ".json":
            data = dict(meta, images=images, **{kind: values.tolist()})
            if labels is not None:
                data["labels"] = labels
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(dict(data, failed=failed), f)
        else:
            columns = labels if labels is not None else [
                str(i) for i in range(values.shape[-1])]
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(["image", *columns])
                for path, row in zip(images, values):
                    # str of a NumPy float reads back as the same value.
                    writer.writerow([path, *(str(v) for v in row)])
    return f"saved the {kind} of {len(images)} image(s) to {out}"


# --------------------------------------------------------------------------
# demo


def _cmd_demo(args):
    """Trains, saves, reloads, exports the official layout and fine-tunes at
    another resolution; all offline."""
    from keras_vit.cli import demo

    result = demo.run(out_dir=args.out, epochs=args.epochs, quick=args.quick,
                      verbose=True)
    # A failed export does not stop the demo but fails the command.
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
    # The registry's tables load no framework.
    from keras_vit.zoo import registry

    parser, sub = options.commands_parser(
        PROG, "Vision Transformers for Keras 3: the model zoo, checkpoint "
              "conversion, inference and an offline demo.",
        traceback=("--debug", "--traceback"),
        traceback_help="show the Python traceback of errors (also accepted "
                       "after the command)", version=__version__)

    p = options.command(sub, "list", _cmd_list,
                        help="registered models and their weights")
    p.add_argument("pattern", nargs="?", metavar="PATTERN",
                   help="glob (ViT-B*) or substring (B/16) of the names")
    p.add_argument("--family", metavar="FAMILY",
                   help="one family only: " + ", ".join(registry.families()))

    p = options.command(sub, "info", _cmd_info, help="architecture and "
                        "released weights of a model")
    p.add_argument("name", metavar="NAME", help="e.g. ViT-B/16, vit-b16")
    options.add(p, json=None)

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
                        help="classify images, or embed them with a model "
                             "that has no head", check=_check_predict)
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
    p.add_argument("--top", "-k", type=positive_int, metavar="K",
                   help="classes to show per image (default: 5); refused "
                        "for a feature extractor, which has no classes")
    options.add(p, json="print JSON: per image its top classes, or a "
                        "feature extractor's whole embedding",
                out={"metavar": "FILE", "help": "also save every image's "
                     "whole output (a classifier's probabilities of every "
                     "class, a feature extractor's embedding) in the format "
                     "FILE's extension names: .npz, .json or .csv (see "
                     "docs/guides/cli.md)"})

    p = options.command(sub, "demo", _cmd_demo,
                        help="train a tiny ViT on scikit-learn digits (offline)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: ./keras_vit_demo)")
    p.add_argument("--epochs", type=positive_int,
                   default=demo.DEFAULT_EPOCHS, metavar="N",
                   help=f"training epochs (default: {demo.DEFAULT_EPOCHS})")
    p.add_argument("--quick", action="store_true",
                   help="a small subset and 2 epochs (a smoke test)")

    # The other components' commands; imported here, not with this package:
    # ``python -m keras_vit.cli.analysis`` runs a module it has not loaded.
    from keras_vit.cli import analysis, export, train

    for commands in (analysis, export, train):
        commands.register(sub)
    return parser


def main(argv=None) -> int:
    """Runs ``keras-vit`` with ``argv`` (default: ``sys.argv[1:]``) and
    returns the exit status."""
    return options.main(build_parser(), argv)


def console_main() -> int:
    """The ``keras-vit`` process: :func:`main` as
    :func:`keras_vit.cli.options.start` runs it."""
    return options.start(main)
