"""Fine-tuning and training with the paper's recipes, resumable
checkpoints and few-shot linear evaluation, on every Keras backend:
``tf.distribute`` under TensorFlow, ``keras.distribution`` (DataParallel,
ModelParallel layouts) under JAX, one device under torch. In a few lines:

    import keras_vit.train as kt

    run = kt.fine_tune("ViT-B/16", "tfds:oxford_iiit_pet",
                       recipe="finetune-pets-flowers", out_dir="runs/pets")
    print(run.metrics["eval"]["accuracy"])

or ``keras-vit fine-tune ViT-B/16 --data tfds:oxford_iiit_pet --recipe
finetune-pets-flowers --out runs/pets``. Running the same again resumes.

>>> import keras_vit.train as kt
>>> [n for n in kt.recipes.names() if n.startswith("finetune")][:2]
['finetune', 'finetune-cifar']
>>> [n for n in kt.recipes.names() if n in ("augreg", "deit", "deit3")]
['augreg', 'deit', 'deit3']
"""

# Light modules (recipes, the strategy helpers) load with the package; the
# rest on first use, so that `keras-vit fine-tune --help` needs no Keras.
from keras_vit.base import lazy
from keras_vit.train import recipes
from keras_vit.train.recipes import Recipe
# The module is ``distribute``; ``strategy`` is its function, the public
# name ``keras_vit.train.strategy``.
from keras_vit.train import distribute
from keras_vit.train.distribute import (StrategyError, configure_cpu_devices,
                                        describe, strategy)

__getattr__, __dir__ = lazy.attach(__name__, lazy.names_of({
    ".data.sources": ("ArraySource", "DataError", "ImageSource", "digits"),
    ".data.folders": ("FolderSource",),
    ".data.tfds_source": ("TfdsSource",),
    ".data.load": ("load_data",),
    ".data.pipeline": ("dataset",),
    # The training API, each name from the module that defines it.
    ".build": ("build_model",),
    ".evaluation": ("evaluate",),
    ".fit": ("compile_for_finetune",),
    ".loop": ("Trainer", "TrainResult", "fine_tune", "pretrain"),
    ".few_shot": ("fewshot", "fit_least_squares"),
    ".layouts": ("distribution", "layout_map", "layout_rules",
                 "variable_shapes"),
    ".mpp": ("MaskedPatchPrediction", "MppTrainer", "mpp_to_classifier",
             "pretrain_mpp"),
}), modules=("callbacks", "data", "few_shot", "layouts", "mpp",
            "placement", "schedules", "vtab"))

__all__ = [
    "ArraySource", "callbacks", "placement", "DataError", "FolderSource", "ImageSource", "Recipe",
    "StrategyError", "TfdsSource", "TrainResult", "Trainer", "build_model",
    "compile_for_finetune", "configure_cpu_devices", "data", "dataset",
    "describe", "digits", "distribute", "evaluate", "few_shot", "fewshot",
    "fine_tune", "fit_least_squares", "load_data", "pretrain", "recipes",
    "strategy", "vtab",
    # keras.distribution on JAX (DataParallel, ModelParallel layouts)
    "distribution", "layout_map", "layout_rules", "layouts",
    "variable_shapes",
    # masked patch prediction (Appendix B.1.2)
    "MaskedPatchPrediction", "MppTrainer", "mpp", "mpp_to_classifier",
    "pretrain_mpp",
]
