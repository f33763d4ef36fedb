"""The scan of candidate image files: which ones the decoder reads, the
reason each other one is skipped, and what each header says (so that
training decodes without reading headers again).
"""

from __future__ import annotations

import os

import numpy as np

from keras_vit.data import images as image_decoder
from keras_vit.base.archives import special_file

# The file names a folder scan reads; what is inside decides the format.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
# A folder scan keeps, per file, keras_vit.data.images.FACTS and the file's size.
FACT_COLUMNS = len(image_decoder.FACTS) + 1


def check_images(candidates, verbose, *, with_facts=False):
    """Splits ``[(path, label)]`` into the images every path decodes and
    the skipped files, each with the reason: ``(files, labels, skipped)``,
    and with ``with_facts`` the (files, :data:`FACT_COLUMNS`) int64 array
    of what :func:`keras_vit.data.images.inspect` read from each header and the
    file's size. Each file is decoded once here, so that training never
    meets a refused one (a pipeline dropping every image would spin).
    """
    import tensorflow as tf
    from tqdm.auto import tqdm

    files, labels, skipped, facts = [], [], [], []
    readable = []
    for path, label in candidates:
        ext = os.path.splitext(path)[1].lower()
        if ext not in IMAGE_EXTENSIONS:
            skipped.append((path, f"not an image extension {ext or '(none)'}"))
            continue
        # Opening a FIFO blocks: only regular files are read.
        kind = special_file(path)
        if kind is not None:
            skipped.append((path, f"{kind}, not a regular file"))
            continue
        readable.append((path, label))
    def result():
        return (files, labels, skipped) + ((facts,) if with_facts else ())

    if not readable:
        return result()

    def check(i, path):
        data = tf.io.read_file(path)
        pixels, header, reason = image_decoder.decode_or_refuse(data)
        size = tf.cast(tf.strings.length(data), tf.int64)[None]
        return i, reason, tf.concat([header, size], 0), tf.shape(pixels)[0]

    paths = [p for p, _ in readable]
    ds = tf.data.Dataset.from_tensor_slices(np.asarray(paths, dtype=str))
    ds = ds.enumerate().map(check, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.ignore_errors().prefetch(tf.data.AUTOTUNE)
    reasons, found = {}, {}
    bar = tqdm(ds.as_numpy_iterator(), desc="checking images", unit="file",
               total=len(paths), leave=False,
               disable=not verbose or len(paths) < 2000)
    for i, reason, row, _ in bar:
        reasons[int(i)] = reason.decode()
        found[int(i)] = row
    failed = 0
    for i, (path, label) in enumerate(readable):
        reason = reasons.get(i)
        if reason is None:  # TensorFlow failed: read it again for why
            failed += 1
            reason = _damaged(path)
            if failed <= 20:
                try:
                    image_decoder.read(path, name="it")
                except (image_decoder.ImageError, OSError) as e:
                    reason = str(e).removeprefix("it ")
        if reason:
            skipped.append((path, reason))
        else:
            files.append(path)
            labels.append(label)
            facts.append(found[i])
    return result()


def _damaged(path):
    """The reason of a file TensorFlow's decoder failed on, past the first
    few: its size and format, as the decoder names a damaged file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            fmt = image_decoder.sniff_bytes(f.read(12))
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    name = (image_decoder.FORMATS[fmt] if fmt < len(image_decoder.FORMATS)
            else "file")
    return (f"({size} bytes) is a damaged {name} that TensorFlow's decoder "
            "cannot read")
