"""Training input pipelines on one CPU core, side by side in one run:
images per second of an inception crop + flip to 224 px, batches of 32,
from a folder of JPEGs of about 500x400 that the script writes itself.

    python benchmarks/input_pipeline.py            # 400 JPEGs, 3 rounds
    python benchmarks/input_pipeline.py --quick    # 64 JPEGs, 1 round

Rows, measured in turns within each round (so that the machine's load
falls on all of them alike), the median round reported:

- ``keras_vit train.dataset``: the package's pipeline; a JPEG decodes only
  its crop window (``tf.io.decode_and_crop_jpeg``, libjpeg's fast DCT as
  big_vision's), the box drawn from the size the folder scan read from
  its header, no branch in the graph for a folder of JPEGs;
- ``keras_vit decoding whole, then cropping``: the same pipeline with each
  image decoded whole (accurate DCT) before the crop, the order it had
  before;
- ``big_vision style``: a bare tf.data pipeline as big_vision writes its
  inception crop (``extract_jpeg_shape``, the box, ``decode_and_crop_jpeg``,
  resize, flip), without the package's header checks;
- ``torchvision ImageFolder``: ``RandomResizedCrop(224)`` +
  ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize``, a DataLoader
  with no workers, ``torch.set_num_threads(1)``;
- the augmented rows: the package's pipeline with DeiT's RandAugment
  (timm's ``rand-m9-mstd0.5-inc1``: 2 operations, magnitude 9 with spread
  0.5, the package's batched TensorFlow version of timm's operations) and
  MixUp 0.8 / CutMix 1.0 with label smoothing 0.1 on the batch, compared
  with timm's training transform with that RandAugment on an ImageFolder
  plus ``timm.data.Mixup`` with the same settings on each batch; and the
  package's pipeline with each of the two alone, to show where the time
  goes.

Each pipeline runs in its own process (a pipeline's background threads
would otherwise take CPU from the others' turns), pinned to one CPU
(``os.sched_setaffinity``) before anything is imported; tf.data runs with
a private thread pool of one thread and TensorFlow with one intra- and
one inter-op thread. On a shared machine the rounds vary: the best round
is the one least disturbed, the median the typical one; images per CPU
second of the pipeline's process (its threads included) vary less, since
another program's load takes wall time from it, not CPU time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 224
BATCH = 32


def pin_one_core():
    """Pins this process to one CPU it may run on; returns that CPU."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def cpu_name():
    from keras_vit.runtime import hardware

    if not hardware.cpu_fields():
        return platform.processor() or "unknown CPU", ""
    flags = sorted(hardware.cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return (hardware.cpu_model() or "unknown CPU",
            " ".join(flags) or "no amx_bf16/avx512_bf16")


def write_jpegs(root, n, seed=0):
    """``n`` JPEGs (quality 90) of 450-550 x 350-450 pixels cut from the
    sample photos, in two class folders."""
    import numpy as np
    from PIL import Image

    from keras_vit.export import samples

    rng = np.random.default_rng(seed)
    for c in ("a", "b"):
        os.makedirs(os.path.join(root, c), exist_ok=True)
    sizes = []
    for i in range(n):
        width = int(rng.integers(450, 551))
        height = int(rng.integers(350, 451))
        pixels = samples.photo_images((height, width, 3), 1,
                                      seed=seed + i)[0][0]
        Image.fromarray(pixels).save(
            os.path.join(root, "ab"[i % 2], f"{i:04d}.jpg"), quality=90)
        sizes.append(width * height)
    return sum(sizes) / len(sizes)


def _one_thread(ds):
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


# The augmentations of the augmented rows, the same on both sides: DeiT's
# RandAugment (2 ops, magnitude 9, spread 0.5) and MixUp 0.8 / CutMix 1.0
# (switching at 0.5) with label smoothing 0.1, on the batch.
RANDAUGMENT = (2, 9.0, 0.5)
MIXING = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)


def keras_vit_pipeline(root, whole=False, randaugment=False, mixing=False):
    from keras_vit import train as kt
    from keras_vit.train.data.folders import FolderSource
    from keras_vit.train.data.sources import ImageSource

    source = kt.load_data(root, verbose=False)
    if whole:
        class WholeDecode(FolderSource):
            decode_crop = ImageSource.decode_crop

        source.__class__ = WholeDecode
    extra = {}
    if randaugment:
        extra["randaugment"] = RANDAUGMENT
    if mixing:
        from keras_vit.train.mixing import BatchMixer

        extra["mixing"] = BatchMixer(
            switch_prob=0.5, num_classes=source.num_classes, **MIXING)
    ds = kt.dataset(source, SIZE, BATCH, training=True, seed=0, **extra)
    return iter(_one_thread(ds.repeat()))


def big_vision_pipeline(root):
    """The inception crop as big_vision's preprocessing writes it, on a
    plain list of files (its ops, not its code)."""
    import tensorflow as tf

    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root)
                   for f in names if f.endswith(".jpg"))

    def crop(path, seed):
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4], tf.float32), seed=seed,
            area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
            min_object_covered=0, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.io.decode_and_crop_jpeg(data, window, channels=3)
        image = tf.image.resize(image, (SIZE, SIZE), method="bilinear")
        image = tf.image.stateless_random_flip_left_right(image, seed)
        return image / 127.5 - 1.0, 0

    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), 0)
    seeds = tf.data.Dataset.random(seed=1).batch(2)
    ds = tf.data.Dataset.zip(ds, seeds).map(
        crop, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return iter(_one_thread(ds.repeat()))


def torchvision_pipeline(root):
    import torch
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    folder = datasets.ImageFolder(root, transform=transform)
    loader = torch.utils.data.DataLoader(folder, batch_size=BATCH,
                                         shuffle=True, num_workers=0,
                                         drop_last=True)
    def forever():
        while True:
            yield from loader

    return forever()


def timm_pipeline(root):
    """timm's training transform (its RandAugment, DeiT's
    rand-m9-mstd0.5-inc1) on an ImageFolder, and timm's Mixup on each
    batch, as timm's train.py does with ``--aa rand-m9-mstd0.5-inc1
    --mixup 0.8 --cutmix 1.0 --smoothing 0.1`` (no workers, one
    thread)."""
    import torch
    import timm.data
    import timm.data.auto_augment as timm_augment
    from PIL import Image
    from torchvision import datasets

    torch.set_num_threads(1)
    # A magnitude drawn at 10 keeps 0 bits in timm's posterize, which
    # Pillow 10 and later refuses (timm's loader then stops): black, as
    # the definition and older Pillows make it.
    posterize = timm_augment.posterize

    def posterize_to_black(img, bits_to_keep, **kwargs):
        if bits_to_keep < 1:
            return Image.new(img.mode, img.size)
        return posterize(img, bits_to_keep, **kwargs)

    for name, op in list(timm_augment.NAME_TO_OP.items()):
        if op is posterize:
            timm_augment.NAME_TO_OP[name] = posterize_to_black
    n, m, spread = RANDAUGMENT
    transform = timm.data.create_transform(
        SIZE, is_training=True,
        auto_augment=f"rand-m{m:g}-n{n}-mstd{spread:g}-inc1",
        interpolation="bilinear", mean=(0.5,) * 3, std=(0.5,) * 3,
        re_prob=0.0)
    folder = datasets.ImageFolder(root, transform=transform)
    loader = torch.utils.data.DataLoader(folder, batch_size=BATCH,
                                         shuffle=True, num_workers=0,
                                         drop_last=True)
    mixup = timm.data.Mixup(num_classes=len(folder.classes),
                            switch_prob=0.5, **MIXING)

    def forever():
        while True:
            for x, y in loader:
                yield mixup(x, y)

    return forever()


def take(batches, n):
    """Images per second of wall time and per CPU second of this process
    (its threads included) over the next ``n`` batches of an iterator
    (the pipeline's steady state: its iterator and functions already
    made). On a machine others share, the CPU figure is the steadier."""
    start, cpu_start = time.perf_counter(), time.process_time()
    images = 0
    for _ in range(n):
        x, _ = next(batches)
        images += int(x.shape[0])
    return (images / (time.perf_counter() - start),
            images / (time.process_time() - cpu_start))


PIPELINES = {
    "keras_vit train.dataset (decodes the crop)": "keras_vit",
    "keras_vit decoding whole, then cropping (the old order)":
        "keras_vit_whole",
    "big_vision style tf.data (decode_and_crop_jpeg)": "big_vision",
    "torchvision ImageFolder + RandomResizedCrop": "torchvision",
    "keras_vit train.dataset + RandAugment": "keras_vit_randaugment",
    "keras_vit train.dataset + MixUp/CutMix": "keras_vit_mixing",
    "keras_vit train.dataset + RandAugment + MixUp/CutMix":
        "keras_vit_augmented",
    "timm transform (RandAugment) + Mixup/CutMix": "timm",
}


def child(kind, root, steps):
    """One pipeline in this process, pinned to one core: prints img/s."""
    pin_one_core()
    # torch and torchvision before TensorFlow: torchvision imported after
    # it crashed the process here (triton's import).
    import torch
    import torchvision  # noqa: F401

    torch.set_num_threads(1)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    batches = {"keras_vit": lambda: keras_vit_pipeline(root),
               "keras_vit_whole": lambda: keras_vit_pipeline(root, True),
               "big_vision": lambda: big_vision_pipeline(root),
               "torchvision": lambda: torchvision_pipeline(root),
               "keras_vit_randaugment": lambda: keras_vit_pipeline(
                   root, randaugment=True),
               "keras_vit_mixing": lambda: keras_vit_pipeline(
                   root, mixing=True),
               "keras_vit_augmented": lambda: keras_vit_pipeline(
                   root, randaugment=True, mixing=True),
               "timm": lambda: timm_pipeline(root)}[kind]()
    take(batches, 3)  # warm-up: tracing, function instantiation, buffers
    print(*take(batches, steps))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="64 images, 1 round: checks the script")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "ROOT", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, root, steps = args.child
        return child(kind, root, int(steps))
    if args.quick:
        args.images, args.rounds = 64, 1
    cpu = pin_one_core()
    import tensorflow as tf
    import torch

    name, flags = cpu_name()
    steps = max(4, 2 * args.images // BATCH)  # two epochs a measurement
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(
                   [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    with tempfile.TemporaryDirectory() as root:
        pixels = write_jpegs(root, args.images)
        rates = {label: [] for label in PIPELINES}
        per_cpu = {label: [] for label in PIPELINES}
        for _ in range(args.rounds):
            for label, kind in PIPELINES.items():
                proc = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child",
                     kind, root, str(steps)], capture_output=True,
                    text=True, env=env, check=False)
                if proc.returncode:
                    sys.exit(f"{label} failed:\n{proc.stderr[-3000:]}")
                wall, per_cpu_second = proc.stdout.split()[-2:]
                rates[label].append(float(wall))
                per_cpu[label].append(float(per_cpu_second))
    print(f"# Input pipelines on one core\n\nCPU: {name} ({flags}); each "
          f"pipeline in its own process pinned to CPU {cpu}; Python "
          f"{sys.version.split()[0]}, TensorFlow {tf.__version__}, torch "
          f"{torch.__version__}.\n{args.images} JPEGs of "
          f"{pixels / 1e3:.0f}k pixels on average (quality 90), inception "
          f"crop + flip to {SIZE} px, batch {BATCH}; {steps} batches timed "
          "after 3 of warm-up (the steady state), median of "
          f"{args.rounds} round(s), the pipelines in turns within each.\n")
    print("| pipeline | img/s median | best | vs big_vision (median, "
          "best) | img per CPU-s median | vs big_vision | rounds (img/s) |")
    print("|---|---|---|---|---|---|---|")
    reference = rates[list(PIPELINES)[2]]
    reference_cpu = statistics.median(per_cpu[list(PIPELINES)[2]])
    for label, values in rates.items():
        median, best = statistics.median(values), max(values)
        cpu_rate = statistics.median(per_cpu[label])
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {label} | {median:,.0f} | {best:,.0f} | "
              f"{median / statistics.median(reference):.2f}x, "
              f"{best / max(reference):.2f}x | {cpu_rate:,.0f} | "
              f"{cpu_rate / reference_cpu:.2f}x | {shown} |")


if __name__ == "__main__":
    main()
