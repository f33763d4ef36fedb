"""VTAB-1k: the 19 transfer tasks of the paper's Table 9 with its protocol.

The Visual Task Adaptation Benchmark (Zhai et al. 2019) in its 1000-example
form, as the paper runs it (section 4.1, Appendix B.1.1, Table 9):

- every task trains on 1000 examples: the first 800 of the task's training
  part and the first 200 of its validation part (``train800val200``), and
  is scored (top-1) on the task's whole test part;
- the hyper-parameter sweep trains on the 800 (``train800``) and scores on
  the 200 (``val200``): ``sweep=True`` / ``--sweep``;
- one setting for all tasks: the ``finetune`` recipe, i.e. SGD momentum
  0.9, lr 0.01, 2500 steps, batch 512, cosine decay, clipping at norm 1,
  resolution 384, zero-initialised head;
- pre-processing of Kolesnikov et al. (2020) (BiT) at one resolution: a
  random crop and a horizontal flip for training, except where they would
  change the label (the Structured tasks: counts, positions, distances and
  angles); a plain resize for evaluation;
- scores per group (Natural, Specialized, Structured) and their mean.

The tasks are read with tensorflow-datasets under the names, splits and
derived labels of google-research/task_adaptation (the VTAB code), written
here from its definitions: e.g. CLEVR count is the number of objects minus
3, KITTI distance buckets the depth of the closest vehicle. Nothing is
downloaded unless asked: missing data fails at once, before any training,
with the ``tfds build`` command (and manual-download steps) it needs.

>>> from keras_vit.train import vtab
>>> len(vtab.TASKS), [len(vtab.tasks_in(g)) for g in vtab.GROUPS]
(19, [7, 4, 8])
>>> t = vtab.TASKS["clevr_count"]
>>> t.tfds_name, t.num_classes, t.group
('clevr', 8, 'Structured')
>>> vtab.split_instructions("caltech101", {"train": 3060, "test": 6084})
{'train': 'train[0:800]+train[2754:2954]', 'eval': 'test'}
>>> vtab.split_instructions("caltech101", {"train": 3060, "test": 6084},
...                         sweep=True)
{'train': 'train[0:800]', 'eval': 'train[2754:2954]'}

Running it (the command ``keras-vit vtab`` does the same)::

    scores = vtab.run("ViT-B/16", tasks=["dtd", "structured"],
                      data_dir="~/tensorflow_datasets", out_dir="runs/vtab")
    print(scores["mean"], scores["groups"]["Structured"]["mean"])
"""

from keras_vit.train.vtab.data import (TaskSource, how_to_prepare, load_task,
                                       load_tasks)
from keras_vit.train.vtab.runner import markdown, run, summarize
from keras_vit.train.vtab.tasks import (CROP_AREA, DERIVED_LABELS, GROUPS,
                                        TASKS, TRAIN_EXAMPLES, VAL_EXAMPLES,
                                        Task, label_fn, resolve_tasks,
                                        split_instructions, tasks_in)

__all__ = ["CROP_AREA", "DERIVED_LABELS", "GROUPS", "TASKS", "TRAIN_EXAMPLES",
           "Task", "TaskSource", "VAL_EXAMPLES", "how_to_prepare", "label_fn",
           "load_task", "load_tasks", "markdown", "resolve_tasks", "run",
           "split_instructions", "summarize", "tasks_in"]
