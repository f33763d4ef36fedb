"""The model zoo: named variants, their released weights, checkpoint I/O.

>>> import keras_vit
>>> keras_vit.zoo.list_models("ViT-S*")
['ViT-S/16', 'ViT-S/32']

Environment variables: ``KERAS_VIT_CACHE`` (download cache directory),
``KERAS_VIT_MIRROR`` (base URL replacing ``https://storage.googleapis.com/``),
``KERAS_VIT_OFFLINE=1`` (never download; errors say where to put the file),
``KERAS_VIT_DOWNLOAD_STALL_S`` (fewer than 64 KiB arriving in this many
seconds, 300 by default, stops a download).
"""

from keras_vit.base import lazy
# The registry answers `keras-vit list` and `info` without Keras.
from keras_vit.zoo.registry import info, labels, list_models
from keras_vit.base.variants import UnknownModelError

# Loaded with the package, except in the ``keras-vit`` command, where each
# loads on first use.
__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    ".api": ("augreg_index", "find_augreg", "load", "load_weights"),
    ".checkpoints": ("CheckpointError",),
    ".convert": ("export_arrays", "normalize_keys", "read_npz", "save_npz"),
    ".download.cache": ("ChecksumError", "DownloadError", "OfflineError",
                        "cache_dir"),
    ".keras_hub.io": ("from_keras_hub",),
    ".keras_hub.writer": ("to_keras_hub",),
    ".official.release": ("resolve_weights",),
    ".position_tables": ("resize_posemb",),
    ".preprocessing": ("decode_predictions", "preprocess_input",
                       "preprocessing_layer"),
    ".resolve": ("rebuild", "resolve_model"),
    ".save": ("save_pretrained",),
}))

__all__ = [
    "CheckpointError", "ChecksumError", "DownloadError", "OfflineError",
    "UnknownModelError", "augreg_index", "cache_dir", "decode_predictions",
    "export_arrays", "preprocess_input", "preprocessing_layer",
    "find_augreg", "from_keras_hub", "info", "labels", "list_models", "load",
    "load_weights", "normalize_keys", "read_npz", "rebuild", "resize_posemb",
    "resolve_model", "resolve_weights", "save_npz", "save_pretrained",
    "to_keras_hub",
]
