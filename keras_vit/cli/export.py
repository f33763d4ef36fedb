"""``keras-vit export`` and ``keras-vit benchmark``.

A failed export exits with status 1, not 2: a failure of the command, not
of its arguments.
"""

from __future__ import annotations

import os

from keras_vit.export import common, staging
from keras_vit.export.verify import verification_table
from keras_vit.cli import options
from keras_vit.base.checks import printable
from keras_vit.base.limits import MAX_LABEL_FILE_BYTES, MAX_RUNS
from keras_vit.cli.options import name_list, positive_int

# Mirrors of saved_model.INPUTS and serving.DEFAULT_TOP_K, whose modules
# import Keras; tests/cli/test_cli_startup.py holds them equal.
INPUTS = ("images", "image_bytes")
OUTPUTS = common.OUTPUTS
DEFAULT_TOP_K = 5


def register(subparsers):
    """Adds ``export`` and ``benchmark`` to ``subparsers``."""
    p = options.command(subparsers, "export", run_export,
                        help="SavedModel / TFLite / ONNX / OpenVINO, "
                             "verified against Keras", check=check_export)
    options.add(p, model="a model name (e.g. ViT-B/16) or a .keras file")
    p.add_argument("--format", "-f", required=True,
                   choices=common.FORMATS)
    options.add(p, output="a .tflite or .onnx file, an OpenVINO .xml file "
                          "(its weights go to the .bin beside it), or a "
                          "SavedModel directory")
    p.add_argument("--quantization", "-q", choices=common.QUANTIZATIONS,
                   default="float32",
                   help="TFLite and ONNX (default: float32)")
    p.add_argument("--precision", choices=common.OPENVINO_PRECISIONS,
                   help="OpenVINO: float32 (the default), bfloat16 (float16 "
                        "weights, computed in bf16) or int8 (int8 weights "
                        "from NNCF's weight compression, activations in "
                        "f32)")
    options.add(p, weights="weights tag, .npz or URL, or 'none' for random "
                           "initialisation (default: the model's default)",
                image_size=None, num_classes=None)
    p.add_argument("--uint8-input", action="store_true",
                   help="take uint8 pixels; the scaling runs inside")
    p.add_argument("--outputs", type=name_list, metavar="A,B",
                   help="logits, probabilities, pre_logits, attention_maps, "
                        "features, block_<i> (encoder block i's patch map, "
                        "e.g. block_11 or block_-1; ViT only) (default: "
                        "logits,probabilities for a classifier, pre_logits "
                        "(the embedding) for a model without a head)")
    p.add_argument("--input", choices=INPUTS, default=INPUTS[0],
                   help="saved_model: what serving_default takes: pixel "
                        "arrays (images, the default) or encoded "
                        "JPEG/PNG/BMP/GIF files of any size (image_bytes: "
                        "decoded and scaled inside, returns the top-k "
                        "labels and scores)")
    p.add_argument("--top-k", type=positive_int, metavar="K",
                   help="--input image_bytes: classes returned per image "
                        f"(default: {DEFAULT_TOP_K})")
    p.add_argument("--labels", metavar="NAME|FILE",
                   help="--input image_bytes: class names, a label list "
                        "(imagenet2012, imagenet21k) or a UTF-8 text file "
                        "with one name per line (default: the names the "
                        "weights carry, else the class indices)")
    p.add_argument("--calibration-data", metavar="SPEC",
                   help="--quantization int8: images to calibrate the "
                        "activations on, like the ones the model will see: "
                        "a folder with one sub-folder of images per class, "
                        "'digits:train', 'tfds:NAME[:SPLIT]' or an .npz "
                        "(what fine-tune's --data takes); "
                        f"{common.DEFAULT_REPRESENTATIVE_SAMPLES} images "
                        "drawn at random calibrate, "
                        f"{common.DEFAULT_AGREEMENT_SAMPLES} more check the "
                        "file (default: crops of sample photos)")
    p.add_argument("--opset", type=positive_int, metavar="N",
                   help="ONNX opset (default: 17)")
    p.add_argument("--external-data", action="store_true",
                   help="ONNX: weights in PATH.data (automatic above 2 GiB)")
    p.add_argument("--batch-sizes", type=options.int_list(kind=list),
                   default=[4, 1],
                   metavar="B,B", help="verification batch sizes "
                                       "(default: 4,1)")

    p = options.command(subparsers, "benchmark", run_benchmark,
                        help="images/s in keras, xla, onnx, tflite and "
                             "openvino")
    options.add(p, model="a model name (e.g. ViT-B/16) or a .keras file")
    p.add_argument("--runtimes", type=name_list,
                   default=["keras", "xla", "onnx", "tflite", "openvino"],
                   metavar="R,R",
                   help="default: keras,xla,onnx,tflite,openvino (a runtime "
                        "that is not installed is skipped)")
    p.add_argument("--batch", type=options.int_list(kind=list),
                   default=[1, 8], metavar="B,B",
                   help="batch sizes (default: 1,8)")
    options.add(p, image_size=None)
    p.add_argument("--runs", type=positive_int, default=5, metavar="N",
                   help="timed runs per measurement (default: 5)")
    options.add(p, weights={"default": "none", "help": "weights (default: "
                            "none; speed does not depend on their values)"})
    p.add_argument("--no-bf16", action="store_true",
                   help="skip the bf16 rows")


def _load_model(args, default_weights="auto"):
    """A zoo model (by name), a ``.keras`` file or a run directory, as
    ``(model, label)``."""
    from keras_vit.zoo.resolve import model_path, resolve_model

    value = args.model
    if model_path(value, "MODEL") is not None:
        for flag in ("weights", "image_size", "num_classes"):
            if getattr(args, flag, None) not in (None, "none"):
                raise ValueError(f"--{flag.replace('_', '-')} does not apply "
                                 "to a .keras file")
        return (resolve_model(value, argument="MODEL"),
                os.path.basename(os.path.normpath(value)))
    weights = options.weights_value(args.weights, default_weights)
    model = resolve_model(value, weights=weights, image_size=args.image_size,
                          num_classes=getattr(args, "num_classes", None),
                          argument="MODEL")
    return model, (f"{getattr(model, 'zoo_name', value)} "
                   f"({'random weights' if weights is None else weights})")


def check_export(args):
    """The export options argparse cannot check, before anything heavy is
    imported; returns the keyword arguments for
    :func:`keras_vit.export.export`."""
    if args.format in ("saved_model", "openvino") and (
            args.quantization != "float32"):
        raise ValueError(
            "--quantization applies to --format tflite and onnx only; "
            f"received --format {args.format}"
            + ("; OpenVINO takes --precision" if args.format == "openvino"
               else ""))
    if args.precision is not None and args.format != "openvino":
        raise ValueError("--precision applies to --format openvino only; "
                         f"received --format {args.format}")
    if args.calibration_data is not None and args.quantization != "int8":
        raise ValueError("--calibration-data applies to --quantization int8 "
                         f"only; received --quantization {args.quantization}"
                         + (" (OpenVINO's int8 weights need no calibration)"
                            if args.format == "openvino" else ""))
    if args.format != "onnx" and (args.opset or args.external_data):
        raise ValueError("--opset and --external-data apply to --format onnx "
                         "only")
    # Bad paths and names fail here, before a model is built or downloaded.
    out = common.check_path(args.output, args.format)
    try:  # missing folders are created; a file in the way is refused
        staging.missing_folders(os.path.dirname(out))
    except common.ExportError as e:
        raise ValueError(f"-o {printable(args.output)}: {e}") from None
    kwargs = _input_options(args)
    if args.input == "images":
        # Without --outputs the model decides.
        if args.outputs:
            kwargs["outputs"] = common.check_outputs(args.outputs,
                                                     "--outputs")
        kwargs["uint8_input"] = args.uint8_input
    kwargs["batch_sizes"] = tuple(args.batch_sizes)
    if args.format in ("tflite", "onnx"):
        kwargs["quantization"] = args.quantization
    if args.format == "openvino":
        kwargs["precision"] = args.precision or "float32"
    if args.format == "onnx":
        kwargs["opset"] = args.opset
        kwargs["external_data"] = True if args.external_data else None
    return kwargs


def run_export(args):
    """Exports MODEL, runs the artifact in its runtime at two batch sizes,
    compares it with Keras and writes it with a JSON report only if it
    matches."""
    from keras_vit import export

    kwargs = check_export(args)
    source = None
    if args.calibration_data is not None:  # a bad spec fails before a model
        from keras_vit.train.data.load import load_data

        source = load_data(args.calibration_data, verbose=False)
    model, label = _load_model(args)
    check_head(model, args)
    if source is not None:
        kwargs["representative_data"] = calibration_data(source, model)
    print(f"Exporting {label} to {args.format} ...", flush=True)
    try:
        report = export.export(model, args.output, format=args.format,
                               **kwargs)
    except export.ExportError as e:
        return options.failed(args, e)
    print(verification_table([report]))
    for note in report["notes"]:
        print(f"note: {note}")
    where = (os.path.join(report["path"], common.SAVED_MODEL_REPORT)
             if args.format == "saved_model"
             else report["path"] + common.REPORT_SUFFIX)
    print(f"Wrote {report['path']} ({report['file_size_mb']:.1f} MiB); "
          f"report: {where}")
    return 0


def check_head(model, args):
    """Refuses what needs a classification head from a feature extractor,
    naming the outputs it has."""
    from keras_vit.export.graph import default_outputs
    from keras_vit.models.features import is_classifier, why_features

    if is_classifier(model):
        return
    embedding = ",".join(default_outputs(model))
    what = (f"MODEL {printable(args.model)!r} is a feature extractor "
            f"({why_features(model)})")
    if args.input == "image_bytes":
        given = _class_flags(args)
        if given:
            raise ValueError(
                f"{given[0]} ranks classes; {what}, whose --input "
                f"image_bytes signature returns its embedding ({embedding})")
        return
    scores = [o for o in args.outputs or ()
              if o in ("logits", "probabilities")]
    if scores:
        raise ValueError(
            f"--outputs {','.join(scores)} needs a classification head; "
            f"{what}, whose embedding is --outputs {embedding} (the "
            "default)")


class _Calibration:
    """Calibration images (one array) and the name the report records."""

    def __init__(self, images, name):
        self.images, self.name = images, name

    def __iter__(self):
        yield self.images


def calibration_data(source, model,
                     samples=common.DEFAULT_REPRESENTATIVE_SAMPLES
                     + common.DEFAULT_AGREEMENT_SAMPLES, seed=0):
    """``samples`` images drawn at random from ``source`` (an
    :class:`~keras_vit.train.data.sources.ImageSource`), resized to the
    model's input as uint8 pixels (the first
    ``DEFAULT_REPRESENTATIVE_SAMPLES`` calibrate, the others check)."""
    import numpy as np

    from keras_vit.train.data.pipeline import dataset

    if getattr(model, "naflex", False):
        raise ValueError(
            "--calibration-data calibrates int8 on images of one size; the "
            "model takes NaFlex patches (naflex=True): export it with "
            "--quantization dynamic_int8 (int8 weights, no calibration)")
    height, width = tuple(model.inputs[0].shape[1:3])
    if height != width:
        raise ValueError(
            f"--calibration-data resizes to square images; the model takes "
            f"{height}x{width}")
    count = min(samples, source.num_examples)
    picked = np.random.default_rng(seed).choice(
        source.num_examples, count, replace=False)
    batches = dataset(
        source.subset(picked), int(height), 32, training=False,
        prefetch=False, raw_pixels=True)
    images = np.concatenate([x for x, _ in batches.as_numpy_iterator()])
    return _Calibration(np.clip(np.round(images), 0, 255).astype("uint8"),
                        source.name)


def _class_flags(args):
    """The options given that rank classes (``--top-k``, ``--labels``)."""
    return [flag for flag, value in (("--top-k", args.top_k),
                                     ("--labels", args.labels))
            if value is not None]


def _input_options(args):
    """The ``--input`` / ``--top-k`` / ``--labels`` options as keyword
    arguments of :func:`keras_vit.export.to_saved_model`."""
    if args.input == "images":
        given = _class_flags(args)
        if given:
            raise ValueError(f"{' and '.join(given)} apply to --input "
                             "image_bytes only; received --input images")
        return {}
    if args.format != "saved_model":
        raise ValueError("--input image_bytes applies to --format "
                         f"saved_model only; received --format {args.format}")
    if args.uint8_input or args.outputs:
        raise ValueError("--input image_bytes decodes and scales inside and "
                         "returns labels, scores, classes and logits: "
                         "--uint8-input and --outputs do not apply")
    return {"input": "image_bytes",
            "top_k": DEFAULT_TOP_K if args.top_k is None else args.top_k,
            "labels": _label_option(args.labels)}


def _label_option(value):
    """``--labels``: None, a shipped label list's name, or the names read
    from a text file (one per line, blank lines at the end ignored)."""
    if value is None:
        return None
    if not os.path.exists(value):
        # The label lists that ship with keras_vit.zoo (a light module).
        from keras_vit.zoo.registry import LABELS_DIR

        known = sorted(path.stem for path in LABELS_DIR.glob("*.txt"))
        if value in known:
            return value
        raise ValueError(f"--labels takes a label list ({', '.join(known)}) "
                         "or a text file with one class name per line; "
                         f"received --labels {printable(value)!r}, which is "
                         "neither")
    if not os.path.isfile(value):
        raise ValueError(f"--labels must be a regular file; received "
                         f"--labels {printable(value)!r}")
    size = os.path.getsize(value)
    if size > MAX_LABEL_FILE_BYTES:
        raise ValueError(f"--labels {printable(value)!r} is {size} bytes; a "
                         f"label file holds at most {MAX_LABEL_FILE_BYTES} "
                         "bytes")
    with open(value, "rb") as f:
        data = f.read(MAX_LABEL_FILE_BYTES + 1)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"--labels {printable(value)!r} is not UTF-8 text "
                         f"(byte {e.start})") from None
    names = text.splitlines()
    while names and not names[-1].strip():
        names.pop()
    empty = [i + 1 for i, name in enumerate(names) if not name.strip()]
    if not names or empty:
        where = f"line {empty[0]} is empty" if empty else "it has no names"
        raise ValueError(f"--labels {printable(value)!r}: {where}; give "
                         "one class name per line")
    return [name.strip() for name in names]


def run_benchmark(args):
    """Times MODEL in each runtime (median of --runs after a warm-up run)
    and prints a markdown table with the peak memory; adds bf16 rows when
    the CPU has bf16 instructions."""
    from keras_vit import export
    from keras_vit.base.checks import check_int
    from keras_vit.export import benchmark

    runtimes = benchmark.check_runtimes(args.runtimes)
    check_int("--runs", args.runs, low=1, high=MAX_RUNS)
    model, label = _load_model(args, default_weights="none")
    print(f"Benchmarking {label}, batch sizes "
          f"{','.join(map(str, args.batch))}, median of {args.runs} runs "
          f"after 1 warm-up run", flush=True)
    try:
        result = benchmark.run(model, runtimes=runtimes,
                               batch_sizes=args.batch, runs=args.runs,
                               bf16=False if args.no_bf16 else "auto",
                               say=lambda m: print(m, flush=True))
    except export.ExportError as e:
        return options.failed(args, e)
    print()
    print(benchmark.markdown_table(result, args.batch))
    for note in result["notes"]:
        print(f"note: {note}")
    for skipped in result["skipped"]:
        print(f"skipped: {skipped}")
    print("Peak RSS is this process's resident memory while the runtime ran "
          "(the Keras model stays loaded throughout).")
    return 0
