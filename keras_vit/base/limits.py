"""Every bound keras_vit puts on what it reads, in one place.

A few bytes of a file the user did not write must not start an
allocation this machine cannot hold, nor minutes of work before an error;
a file refused by one reader is refused by all. The caps on model sizes
are far past any released ViT (ViT-22B: width 6144, 48 layers).

>>> from keras_vit.base import limits
>>> limits.MAX_IMAGE_SIDE, limits.MAX_LAYERS
(4096, 1024)
"""

# -- model sizes a config may ask for ------------------------------------------

#: The largest image side a command, an argument or a downloaded config may
#: ask for: ``--image-size 100000`` once resized the position embeddings to
#: 39M tokens (11 GB) before any memory check could run.
MAX_IMAGE_SIDE = 4096
#: Encoder blocks (a stacked checkpoint declares its depth as an axis).
MAX_LAYERS = 1024
#: Widths: the token width, the MLP's hidden width.
MAX_HIDDEN = 16384
MAX_MLP = 65536
#: Input channels.
MAX_CHANNELS = 16
#: Classes of a head (ImageNet-21k has 21,843).
MAX_CLASSES = 1_000_000
#: Characters of a class name: the builders refuse a longer one, as the
#: readers of every file that holds names do.
MAX_LABEL_LENGTH = 1024

# -- files ---------------------------------------------------------------------

#: A config.json is a few KB; ImageNet-21k label names ~0.5 MB.
MAX_CONFIG_BYTES = 16 << 20
#: ``export --labels FILE``, a list of class names: 21843 names fit in 1 MiB.
MAX_LABEL_FILE_BYTES = 16 << 20
#: safetensors' own limit on its JSON header.
MAX_SAFETENSORS_HEADER = 100 << 20
#: A ViT's Keras ``.h5`` weights hold 16 datasets a layer; a file with far
#: more entries is not one.
MAX_H5_ENTRIES = 100_000
#: Keras reads ``model.weights.h5`` whole into memory and its own bomb
#: check starts at 4 GiB (a 1.5 MB ``.keras`` could hold a 3.9 GB weights
#: file): a member past the floor that inflates more than the expansion is
#: refused (weights deflate by a few percent).
KERAS_BOMB_FLOOR = 64 << 20
KERAS_MAX_EXPANSION = 20
#: A JSON document nested deeper than this is no config (Python's parser
#: would recurse until RecursionError).
MAX_JSON_DEPTH = 64
#: Axes of a weight in an official ``.npz`` (real ones have at most 4).
NPZ_MAX_NDIM = 5
#: Bytes one array of an ``.npz`` may declare in its header (ViT-e's
#: stacked MLP kernel is 6.2 GB).
MAX_ARRAY_BYTES = 16 << 30
#: How much a deflated archive member can inflate: deflate codes a 258-byte
#: match in about two bits, 1032 to 1 at most.
DEFLATE_MAX_EXPANSION = 1032

# -- images ----------------------------------------------------------------------

#: Pixels an image may have as decoded (a JPEG after its reduced-scale
#: decode): 4000x4000, about 240 MB as float32 RGB.
PIXEL_BUDGET = 16_000_000
#: Segments (JPEG markers, PNG/WebP chunks, ...) the image decoder reads
#: before the pixels; real files have a few dozen.
MAX_IMAGE_SEGMENTS = 1000

# -- jobs ------------------------------------------------------------------------

#: Logical CPU devices (``configure_cpu_devices``): 100000 of them never
#: got past start-up.
MAX_CPU_DEVICES = 64
#: Few-shot seeds: each keeps a permutation of the training set.
MAX_SEEDS = 1000
#: Timed runs of one export benchmark measurement.
MAX_RUNS = 1000

# -- memory ----------------------------------------------------------------------

#: A model is refused when an estimate of what it needs (a rough upper
#: bound) passes this multiple of the memory available.
MEMORY_SLACK = 1.5
#: The share of the available memory a command that picks its own batch
#: size lets a batch take.
BATCH_MEMORY_SHARE = 0.5

# -- network ---------------------------------------------------------------------

#: Seconds a download waits for its server (or proxy) to accept a
#: connection before it counts as unreachable (huggingface_hub's own
#: retries take ~23 s; ``HF_HUB_ETAG_TIMEOUT`` is 10 s as well).
MAX_CONNECT_WAIT_SECONDS = 10.0

# -- training recipes --------------------------------------------------------------

#: Optimizer steps of a run, and every step count a recipe holds (the
#: paper's longest run is 1M steps).
MAX_STEPS = 1_000_000_000
#: Epochs of a run counted in epochs (DeiT III: 800).
MAX_EPOCHS = 100_000
#: Images per optimizer step (the largest published ViT batches: 32k-64k).
MAX_BATCH_SIZE = 1 << 20
#: A peak learning rate (the paper's largest is 0.06, SGD fine-tuning);
#: past this every optimizer here diverges in its first steps.
MAX_LEARNING_RATE = 10.0
#: Decoupled weight decay (the paper's largest is 0.3).
MAX_WEIGHT_DECAY = 10.0
#: RandAugment's operations per image (timm's recipes use 2-4).
MAX_RANDAUGMENT_OPS = 64
#: MixUp's and CutMix's Beta(alpha, alpha): at 100 lambda is 0.5 within
#: 0.035 (one standard deviation), so a larger alpha mixes no differently.
MAX_MIX_ALPHA = 100.0
#: A seed: NumPy's (``keras.utils.set_random_seed``) is at most 2**32 - 1.
MAX_SEED = 2**32 - 1
#: Examples of a data set, or asked of one (JFT-300M holds 3e8).
MAX_EXAMPLES = 1_000_000_000
