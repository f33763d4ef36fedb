"""Every bound keras_vit puts on what it reads, in one place.

A few bytes of a file the user did not write (a ``config.json`` saying
``num_layers=2000``, a header declaring a billion-element tensor, a PNG
declaring 12000x12000 pixels) must not start an allocation this machine
cannot hold, nor minutes of work before an error. Each reader, the image
decoder, the memory check and the exporters take their caps from here, so
that a change is made once and a file refused by one reader is refused by
all of them.

The caps on model sizes are far past any released ViT (ViT-22B: width
6144, 48 layers; the largest inputs seen are ~1k pixels a side); within
them :mod:`keras_vit.models.memory` decides from the sizes whether a model fits
this machine, before anything is built.

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

# -- files ---------------------------------------------------------------------

#: A config.json (timm's, transformers', keras-hub's, a preprocessor's, a
#: ``.keras`` archive's) is a few KB; ImageNet-21k label names ~0.5 MB.
MAX_CONFIG_BYTES = 16 << 20
#: ``export --labels FILE``, a list of class names: 21843 names fit in 1 MiB.
MAX_LABEL_FILE_BYTES = 16 << 20
#: safetensors' own limit on its JSON header.
MAX_SAFETENSORS_HEADER = 100 << 20
#: A ViT's Keras ``.h5`` weights hold 16 datasets a layer; a file with far
#: more entries is not one.
MAX_H5_ENTRIES = 100_000
#: Keras writes a ``.keras`` archive's members uncompressed and reads
#: ``model.weights.h5`` whole into memory; its own bomb check starts at
#: 4 GiB, so a 1.5 MB ``.keras`` could still hold a 3.9 GB weights file. A
#: member past the floor that inflates more than the expansion is refused:
#: weights deflate by a few percent, and 10 MB of file stays under 200 MB.
KERAS_BOMB_FLOOR = 64 << 20
KERAS_MAX_EXPANSION = 20
#: A JSON document nested deeper than this is no config (Python's parser
#: would recurse until RecursionError).
MAX_JSON_DEPTH = 64
#: Axes of a weight in an official ``.npz``: real ones have at most 4 (a
#: conv kernel; a stacked attention kernel: blocks, width, heads, head
#: width), so a rank past this is no weight.
NPZ_MAX_NDIM = 5
#: Bytes one array of an ``.npz`` (a checkpoint, a data set, adapters) may
#: declare in its header. Far past any released weight (ViT-e's stacked
#: MLP kernel, 56 blocks of 1792x15360 float32, is 6.2 GB); a header is
#: also checked against the bytes the archive holds for it, so this bounds
#: what a well-formed but enormous file asks for in one allocation.
MAX_ARRAY_BYTES = 16 << 30
#: How much a deflated archive member can inflate: deflate codes a 258-byte
#: match in about two bits, 1032 to 1 at most. A member whose directory
#: entry claims more from its compressed bytes is lying about its size.
DEFLATE_MAX_EXPANSION = 1032

# -- images ----------------------------------------------------------------------

#: Pixels an image may have as decoded: a JPEG after its reduced-scale
#: decode (1/2, 1/4, 1/8), any other format as it is (else refused, on every
#: path). 4000x4000; the models take 224 to 518 pixels a side, so nothing the
#: budget removes reaches them. Decoded to uint8 RGB and cast to float32 for
#: the resize, an image at the budget takes about 240 MB.
PIXEL_BUDGET = 16_000_000
#: Segments (JPEG markers, PNG/WebP chunks, GIF extension blocks) the image
#: decoder reads before the pixels to find the EXIF orientation or the first
#: frame; real files have a few dozen. A file with more is refused rather
#: than read without its orientation.
MAX_IMAGE_SEGMENTS = 1000

# -- jobs ------------------------------------------------------------------------

#: Logical CPU devices (``configure_cpu_devices``) are for trying replicas
#: without GPUs; each replica holds a copy of the model and its own threads,
#: so 100000 of them never got past start-up (no output, no end).
MAX_CPU_DEVICES = 64
#: Few-shot seeds (draws of the k-shot sets; the default averages 3): each
#: keeps a permutation of the training set, made before any output.
MAX_SEEDS = 1000
#: Timed runs of one export benchmark measurement, which prints one line
#: after its runs: a million would sit silent for hours.
MAX_RUNS = 1000

# -- memory ----------------------------------------------------------------------

#: A model is refused when an estimate of what it needs passes this multiple
#: of the memory available: the estimates are rough upper bounds, so only
#: what clearly cannot fit is refused.
MEMORY_SLACK = 1.5
#: The share of the available memory a command that picks its own batch
#: size (``keras-vit predict``, the exporters' checks) lets a batch take.
BATCH_MEMORY_SHARE = 0.5

# -- network ---------------------------------------------------------------------

#: Seconds a download waits for its server (or the proxy in front of it) to
#: accept a connection before it counts as unreachable. With no network the
#: hf-hub: route then leaves huggingface_hub's cache alone to answer (its
#: own retries, five over ~23 s with a warning line each, never start), and
#: the tfds route stops with one line; a reachable server answers a
#: connection in well under a second. huggingface_hub's own default wait
#: for bytes (``HF_HUB_ETAG_TIMEOUT``) is 10 s as well.
MAX_CONNECT_WAIT_SECONDS = 10.0

# -- training recipes --------------------------------------------------------------

#: Optimizer steps of a run, and every step count a recipe holds (warmup,
#: checkpoint, log and evaluation intervals): the paper's longest run is
#: 1M steps (masked patch prediction); a billion would run for years.
MAX_STEPS = 1_000_000_000
#: Epochs of a run counted in epochs (DeiT III: 800).
MAX_EPOCHS = 100_000
#: Images per optimizer step (the paper: 4096; the largest published ViT
#: batches, 32k-64k). A batch is held in memory as one tensor.
MAX_BATCH_SIZE = 1 << 20
#: A peak learning rate (the paper's largest is 0.06, SGD fine-tuning);
#: past this every optimizer here diverges in its first steps.
MAX_LEARNING_RATE = 10.0
#: Decoupled weight decay (the paper's largest is 0.3).
MAX_WEIGHT_DECAY = 10.0
#: RandAugment's operations per image (timm's recipes use 2-4, drawn from
#: 15 operations): each is a pass over every image, so 1e9 of them sat
#: silent until killed.
MAX_RANDAUGMENT_OPS = 64
#: MixUp's and CutMix's Beta(alpha, alpha): at 100 lambda is 0.5 within
#: 0.035 (one standard deviation), so a larger alpha mixes no differently.
MAX_MIX_ALPHA = 100.0
#: A seed: NumPy's (``keras.utils.set_random_seed``) is at most 2**32 - 1.
MAX_SEED = 2**32 - 1
#: Examples of a data set, or asked of one (JFT-300M holds 3e8).
MAX_EXAMPLES = 1_000_000_000
