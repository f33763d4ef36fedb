"""The table of docs/images.md: each odd file of tests/image_corpus.py
(cases) through each path that decodes an image (columns), and what came
out: the same pixels as the independent reader, the same probabilities as
predict, or the refusal.

    python benchmarks/decode_paths.py --out docs/images.md

Columns: ``keras_vit.data.images`` (the decoder, against Pillow's
``exif_transpose`` + ``convert("RGB")`` or NumPy for what Pillow reads
differently), ``predict`` (``keras-vit predict``'s reader, the Python API),
``training`` (a folder scanned by ``keras_vit.train.load_data`` and decoded
in ``tf.data``), ``serving`` (the ``image_bytes`` signature's graph on the
file's bytes, probabilities of a tiny random ViT against predict's), and
``Pillow only`` (what decoding with Pillow alone, the old predict path,
gives against the reference). With ``--out`` the table replaces the one
between the markers of that file.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import sys
import tempfile
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- table: benchmarks/decode_paths.py -->"
END = "<!-- end of table -->"
EXTENSIONS = {b"\xff\xd8": ".jpg", b"\x89P": ".png", b"GI": ".gif",
              b"BM": ".bmp", b"RI": ".webp"}


def corpus_module():
    path = os.path.join(ROOT, "tests", "image_corpus.py")
    spec = importlib.util.spec_from_file_location("image_corpus", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_corpus"] = module  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _compare(got, want):
    if got.shape != want.shape:
        return f"differs: {got.shape[1]}x{got.shape[0]}, not " \
               f"{want.shape[1]}x{want.shape[0]}"
    diff = int(np.abs(got.astype(int) - want.astype(int)).max())
    return "same pixels" if diff == 0 else f"differs by up to {diff}"


def _short(reason):
    reason = reason.split(" (keras_vit reads")[0].split(": downscale")[0]
    reason = re.sub(r"over the ([\d,]+)-pixel budget.*", r"over the budget",
                    reason)
    return "refused: " + reason.split("; keras_vit")[0]


def run(folder):
    """``(cases, rows)``: each row the cells of one case."""
    import tensorflow as tf

    import keras_vit
    from keras_vit import cli, zoo
    from keras_vit.data import images
    from keras_vit import train as kt
    from keras_vit.cli.options import UserError
    from keras_vit.export.serving import ImageBytesGraph

    corpus = corpus_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = corpus.build()
    os.makedirs(os.path.join(folder, "a"), exist_ok=True)
    for i, case in enumerate(cases):
        ext = EXTENSIONS.get(case.data[:2], ".png")
        case.path = os.path.join(folder, "a", f"{i:02d}{ext}")
        with open(case.path, "wb") as f:
            f.write(case.data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = kt.load_data(folder, verbose=False)
    skipped = dict(source.skipped)
    rows_of = {str(f): i for i, f in enumerate(source._files)}
    decode = tf.function(source.decode)
    model = keras_vit.models.vit(image_size=32, patch_size=8, hidden_size=32,
                                 num_layers=1, num_heads=2, mlp_dim=32,
                                 num_classes=5)
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    graph = ImageBytesGraph(model, top_k=5)
    serve = tf.function(graph.serve, input_signature=[graph.input_spec()])
    rows = []
    for case in cases:
        try:
            pixels = images.decode_bytes(case.data, "it")
            reference = ("refused, but " + case.refusal if case.want is None
                         else _compare(pixels, case.want))
        except images.ImageError as e:
            reason = str(e).removeprefix("it ")
            reference = _short(reason)
        try:
            predicted = cli._read_image(case.path)
            predict = ("same pixels" if case.want is None
                       else _compare(predicted.astype(np.uint8), case.want))
        except UserError as e:
            predicted = None
            predict = _short(str(e).removeprefix(f"IMAGE={case.path!r} "))
        if case.path in skipped:
            training = _short(skipped[case.path])
        else:
            got = decode(rows_of[case.path]).numpy().astype(np.uint8)
            training = ("same pixels" if predicted is None else _compare(
                got, predicted.astype(np.uint8)))
        try:
            logits = serve(tf.constant([case.data]))["logits"]
            probs = tf.nn.softmax(logits).numpy()[0]
            if predicted is None:
                serving = "answers (predict refused)"
            else:
                want = tf.nn.softmax(model(zoo.preprocess_input(
                    predicted, 32)[None], training=False)).numpy()[0]
                diff = float(np.abs(probs - want).max())
                serving = ("same probabilities" if diff <= 1e-3
                           else f"probabilities differ by {diff:.3f}")
        except tf.errors.InvalidArgumentError as e:
            text = " ".join(e.message.split())
            found = re.search(r"image_bytes\[0\] (.*?)\]", text)
            serving = _short(found.group(1) if found else text[:80])
        rows.append((case.name, reference, predict, training, serving,
                     _pillow(case)))
    return rows


def _pillow(case):
    """What Pillow alone gives: ``convert("RGB")`` of the first frame,
    without the EXIF rotation (the old serving reference) and with it (the
    old predict)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(case.data)) as im:
            pixels = np.asarray(im.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - any failure is the cell
        return f"fails: {type(e).__name__}"
    if case.want is None:
        return "decodes it"
    return _compare(pixels, case.want)


def table(rows):
    head = ("case", "keras_vit.data.images vs reference", "predict", "training",
            "serving", "Pillow's convert('RGB') alone")
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row)
                     + " |")
    return "\n".join(lines)


def cpu():
    from keras_vit.runtime import hardware

    if not hardware.cpu_fields():
        return platform.processor() or "unknown CPU"
    flags = sorted(hardware.cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return (hardware.cpu_model() or "unknown CPU") + (
        f" ({', '.join(flags)})" if flags else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file whose table to replace")
    args = parser.parse_args(argv)
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as folder:
        rows = run(folder)
    text = "\n".join([
        BEGIN,
        f"Generated by `python benchmarks/decode_paths.py --out "
        f"docs/images.md` (TensorFlow {tf.__version__}, {cpu()}).",
        "",
        table(rows),
        END])
    print(text)
    if args.out:
        with open(args.out) as f:
            page = f.read()
        if BEGIN not in page or END not in page:
            sys.exit(f"--out {args.out!r} has no table markers ({BEGIN} ... "
                     f"{END})")
        start, stop = page.index(BEGIN), page.index(END) + len(END)
        with open(args.out, "w") as f:
            f.write(page[:start] + text + page[stop:])


if __name__ == "__main__":
    main()
