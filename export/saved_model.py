"""Export to a TensorFlow SavedModel for TF Serving."""

from __future__ import annotations

import os

from keras_vit.export import common, pipeline
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph


# Its runtime is TensorFlow: exported from JAX or PyTorch, the converter
# process runs the verification batches too.
RUNTIME_NEEDS_TENSORFLOW = True


def open_artifact(path):
    """Loads a SavedModel and returns ``images -> {name: array}`` calling
    its ``serving_default`` signature (the loaded object stays referenced:
    a signature outlives its object only by accident)."""
    import numpy as np
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]

    def run(images, _keep=loaded):
        out = signature(**{name: tf.constant(images)})
        return {k: np.asarray(v) for k, v in out.items()}

    return run


def to_saved_model(model, path, *, uint8_input=False,
                   outputs=("logits", "probabilities"), verify=True,
                   batch_sizes=(4, 1), tolerance=None, verify_data="noise",
                   cast_to_float32=True, overwrite=True):
    """Exports ``model`` as a SavedModel directory for TF Serving.

    The ``serving_default`` signature takes ``images`` of shape (batch, H,
    W, C) with a dynamic batch (float32 in the model's range, or uint8
    pixels with ``uint8_input=True``) and returns the named ``outputs``
    (see :class:`~keras_vit.export.graph.ServingGraph`). Variables are
    stored once (Keras' ``model.export`` stores them twice).

    The directory is built next to ``path``, loaded with
    ``tf.saved_model.load`` and run at each of ``batch_sizes``; only if it
    matches Keras is it moved to ``path``, with ``export_report.json``
    inside. Raises :class:`~keras_vit.export.ExportError` otherwise.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy
            unless ``cast_to_float32=False``).
        path: the SavedModel directory to create (no file extension).
        uint8_input: take uint8 pixels and scale them inside.
        outputs: output names, e.g. ``("logits", "probabilities",
            "pre_logits", "attention_maps")``.
        verify: run and compare the artifact (False writes an unverified
            artifact, and the report says so).
        batch_sizes: batch sizes to run the artifact at.
        tolerance: overrides of the format's tolerance, e.g.
            ``{"max_abs_diff": 1e-3}``.
        verify_data: ``"noise"``, ``"photos"`` or an array of images.
        cast_to_float32: export bf16/fp16 models as a float32 copy.
        overwrite: replace an existing artifact at ``path``.

    Returns:
        The report (a dict, also written to ``path/export_report.json``).

    Example:

    >>> import tempfile, os, keras_vit
    >>> from keras_vit.export import to_saved_model
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> out = os.path.join(tempfile.mkdtemp(), "vit")
    >>> report = to_saved_model(model, out, uint8_input=True)
    >>> report["top1_agreement"], report["batch_sizes"]
    (1.0, [4, 1])
    >>> sorted(os.listdir(out))  # doctest: +NORMALIZE_WHITESPACE
    ['assets', 'export_report.json', 'fingerprint.pb', 'saved_model.pb',
     'variables']
    """
    dest = common.check_path(path, "saved_model")
    tol = common.tolerance_for("saved_model", tolerance)
    checks.check_options(batch_sizes, verify_data)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32,
                         allow_low_precision=True)
    options = {"uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs),
               "signature": "serving_default",
               "cast_to_float32": bool(cast_to_float32)}
    return pipeline.run(pipeline.ExportJob(
        "saved_model", "the SavedModel", dest, graph, tol, options,
        verify=verify, batch_sizes=batch_sizes, verify_data=verify_data,
        overwrite=overwrite))


def convert(graph, staged, workdir, params, arrays, rss):
    """Writes the SavedModel directory ``staged`` (TensorFlow)."""
    graph.save(staged)
    return {"files": [os.path.basename(staged)]}
