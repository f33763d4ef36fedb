"""The training API in one place: :class:`Trainer` and the functions
around it, defined in rooms of their own:

- :mod:`~keras_vit.train.loop`: :class:`Trainer`, :class:`TrainResult`,
  :func:`fine_tune`, :func:`pretrain`;
- :mod:`~keras_vit.train.build`: :func:`make_engine` (the backend's
  engine), :func:`build_model`;
- :mod:`~keras_vit.train.settings`: the recipe fitted to the data, the
  devices and the model, and the record a run keeps of it;
- :mod:`~keras_vit.train.run_dir`: the run directory (checkpoints, logs,
  history, the lock, the resume checks);
- :mod:`~keras_vit.train.progress`: the progress bar, history lines and
  TensorBoard scalars of a run, and its final figures;
- :mod:`~keras_vit.train.evaluation`: :func:`evaluate`, and the
  classifier's loss the Trainer trains;
- :mod:`~keras_vit.train.fit`: :func:`compile_for_finetune` for Keras' own
  ``model.fit``;
- :mod:`~keras_vit.train.engine_tf` and :mod:`~keras_vit.train.engine_keras`:
  the backends' engines (the TensorFlow engine's step and its XLA decision,
  :func:`step_uses_xla`, in :mod:`~keras_vit.train.engine_tf_step`).

Every name importable from here before the split still is.
"""

from keras_vit.train import data as data_lib  # noqa: F401
from keras_vit.train import distribute as strategy_lib  # noqa: F401
from keras_vit.train import recipes as recipes_lib  # noqa: F401
from keras_vit.train.build import build_model, make_engine
from keras_vit.train.engine_tf_step import step_uses_xla
from keras_vit.train.evaluation import evaluate
from keras_vit.train.fit import (compile_for_finetune,
                                 smoothed_sparse_crossentropy)
from keras_vit.train.loop import Trainer, TrainResult, fine_tune, pretrain
from keras_vit.train.run_dir import (RUN_LOCK, append_jsonl, lock_run_dir,
                                     run_config_changes, write_scalar)

__all__ = [
    "RUN_LOCK", "TrainResult", "Trainer", "append_jsonl", "build_model",
    "compile_for_finetune", "evaluate", "fine_tune", "lock_run_dir",
    "make_engine", "pretrain", "run_config_changes",
    "smoothed_sparse_crossentropy", "step_uses_xla", "write_scalar",
]
