"""The TensorFlow side of an export started from a JAX or PyTorch process.

Loads the serving model from its ``.keras`` file, rebuilds the same
:class:`~keras_vit.export.graph.ServingGraph`, runs the format's
``convert`` and, for a SavedModel, the verification batches.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def _load_model(path):
    import keras

    # Importing the model classes registers them with Keras.
    from keras_vit.models import (  # noqa: F401
        AxialVisionTransformer, ResNetV2, VisionTransformer)

    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as e:  # noqa: BLE001 - reported with the reason
        raise RuntimeError(
            "the model could not be rebuilt under TensorFlow from its "
            f".keras file ({e}); custom layers must be registered with "
            "keras.saving.register_keras_serializable in a module that "
            "the converter process imports") from e


def run_job(job):
    """Converts (and runs) what ``job`` describes; returns the result."""
    from keras_vit.runtime.backend import is_tensorflow, name as backend_name

    if not is_tensorflow():
        raise RuntimeError("the converter process needs "
                           "KERAS_BACKEND=tensorflow; it runs on "
                           f"{backend_name()!r}")
    from keras_vit.base import atomic
    from keras_vit.export import formats, memory, pipeline, serving
    from keras_vit.export.graph import ServingGraph

    model = _load_model(job["model"])
    graph_args = dict(job["graph"])
    if graph_args.pop("input", None) == serving.INPUT_NAME:
        graph = serving.ImageBytesGraph(model, **graph_args)
    else:
        graph = ServingGraph(model, **graph_args)
    arrays = {}
    if job.get("arrays"):
        with np.load(job["arrays"], allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    module = formats.format_module(job["format"])
    with memory.PeakRSS() as rss:
        result = module.convert(
            graph, job["staged"], job["workdir"], job["params"],
            {k: v for k, v in arrays.items() if not k.startswith("run/")},
            rss)
    result.update(memory.worker_peaks(rss))
    if job.get("run"):
        run = module.open_artifact(job["staged"])
        outputs = {}
        for key in job["run"]:
            batch = pipeline.unpack_batch(arrays, f"run/{key}")
            for name, value in run(batch).items():
                value = np.asarray(value)
                if value.dtype == object:  # strings (labels): no pickle
                    value = value.astype(bytes)
                outputs[f"{key}/{name}"] = value
        result["outputs"] = "outputs.npz"
        with atomic.atomic_path(os.path.join(job["workdir"],
                                             "outputs.npz")) as tmp:
            np.savez(tmp, **outputs)
    return result


def main(job_path):
    from keras_vit.export import pipeline

    return pipeline.child_main(job_path, run_job, stamp=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
