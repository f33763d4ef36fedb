"""The model zoo: named variants, their released weights, checkpoint I/O.

>>> import keras_vit
>>> keras_vit.zoo.list_models("ViT-S*")
['ViT-S/16', 'ViT-S/32']

Environment variables: ``KERAS_VIT_CACHE`` (download cache directory),
``KERAS_VIT_MIRROR`` (base URL replacing ``https://storage.googleapis.com/``),
``KERAS_VIT_OFFLINE=1`` (never download; errors say where to put the file).
"""

from keras_vit.zoo.api import (augreg_index, find_augreg, info, labels,
                               list_models, load, load_weights,
                               resolve_weights)
from keras_vit.zoo.convert import (CheckpointError, export_arrays,
                                   normalize_keys, read_npz, resize_posemb,
                                   save_npz)
from keras_vit.zoo.download import (ChecksumError, DownloadError,
                                    OfflineError, cache_dir)
from keras_vit.zoo.preprocessing import (decode_predictions,
                                         preprocess_input,
                                         preprocessing_layer)
from keras_vit.zoo.timm_hub import save_pretrained
from keras_vit.models.variants import UnknownModelError

__all__ = [
    "CheckpointError", "ChecksumError", "DownloadError", "OfflineError",
    "UnknownModelError", "augreg_index", "cache_dir", "decode_predictions",
    "export_arrays", "preprocess_input", "preprocessing_layer",
    "find_augreg", "info", "labels", "list_models", "load", "load_weights",
    "normalize_keys", "read_npz", "resize_posemb", "resolve_weights",
    "save_npz", "save_pretrained",
]
