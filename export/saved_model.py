"""Export to a TensorFlow SavedModel for TF Serving."""

from __future__ import annotations

import os
import sys

import numpy as np

from keras_vit.base.checks import check_choice
from keras_vit.export import common, pipeline, serving
from keras_vit.export import verify as checks
from keras_vit.export.graph import ServingGraph

INPUTS = ("images", serving.INPUT_NAME)
RUNTIME_NEEDS_TENSORFLOW = True


def open_artifact(path):
    """Loads a SavedModel and returns ``images -> {name: array}`` calling
    its ``serving_default`` signature (the loaded object stays referenced:
    a signature outlives its object only by accident)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["serving_default"]
    names = list(signature.structured_input_signature[1])

    def run(images, _keep=loaded):
        feeds = images if isinstance(images, dict) else {names[0]: images}
        out = signature(**{k: tf.constant(v) for k, v in feeds.items()})
        return {k: np.asarray(v) for k, v in out.items()}

    return run


def to_saved_model(model, path, *, input="images", uint8_input=False,
                   outputs=None, top_k=5, labels=None, verify=True,
                   batch_sizes=(4, 1), tolerance=None, verify_data=None,
                   cast_to_float32=True, overwrite=True):
    """Exports ``model`` as a SavedModel directory for TF Serving.

    With ``input="images"`` the ``serving_default`` signature takes
    ``images`` of shape (batch, H, W, C) with a dynamic batch (float32 in
    the model's range, or uint8 pixels with ``uint8_input=True``) and
    returns the named ``outputs`` (see
    :class:`~keras_vit.export.graph.ServingGraph`).

    With ``input="image_bytes"`` it takes ``image_bytes``, a 1-D string
    batch of encoded image files of any size, and returns ``labels``,
    ``scores`` (probabilities), ``classes`` (the top ``top_k``, best
    first) and ``logits`` (see :mod:`keras_vit.export.serving`).

    Only if the artifact matches Keras is it moved to ``path``, with
    ``export_report.json`` inside; else
    :class:`~keras_vit.export.ExportError`.

    Args:
        model: a Keras model (bf16 models are exported as a float32 copy
            unless ``cast_to_float32=False``).
        path: the SavedModel directory to create (no file extension).
        input: ``"images"`` (pixel arrays) or ``"image_bytes"`` (encoded
            files).
        uint8_input: take uint8 pixels and scale them inside
            (``input="images"`` only).
        outputs: output names, e.g. ``("logits", "probabilities",
            "pre_logits", "attention_maps")`` (``input="images"`` only).
        top_k: how many classes ``input="image_bytes"`` returns (clipped
            to the model's class count).
        labels: the class names ``input="image_bytes"`` returns: None (the
            names the model's weights carry, else the class indices as
            strings), a label list name (``"imagenet2012"``) or a list.
        verify: run and compare the artifact.
        batch_sizes: batch sizes to run the artifact at.
        tolerance: overrides of the format's tolerance, e.g.
            ``{"max_abs_diff": 1e-3}``.
        verify_data: ``"noise"``, ``"photos"`` or an array of images
            (default ``"noise"``; ``"photos"`` for ``input="image_bytes"``,
            which takes only these two).
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
    common.check_arguments(model, uint8_input=uint8_input, verify=verify,
                           cast_to_float32=cast_to_float32,
                           overwrite=overwrite)
    check_choice("input", input, INPUTS)
    if input == serving.INPUT_NAME:
        return _image_bytes_export(
            model, path, uint8_input=uint8_input, outputs=outputs,
            top_k=top_k, labels=labels, verify=verify,
            batch_sizes=batch_sizes, tolerance=tolerance,
            verify_data=verify_data, cast_to_float32=cast_to_float32,
            overwrite=overwrite)
    if top_k != serving.DEFAULT_TOP_K or labels is not None:
        raise ValueError(
            "top_k and labels are options of input='image_bytes'; received "
            f"input={input!r} with top_k={top_k!r}, labels={labels!r}"[:300])
    if verify_data is None:
        verify_data = "noise"
    dest = common.check_path(path, "saved_model")
    tol = common.tolerance_for(common.saved_model_tolerance(model), tolerance)
    checks.check_options(batch_sizes, verify_data)
    graph = ServingGraph(model, outputs, uint8_input, cast_to_float32,
                         allow_low_precision=True)
    options = {"uint8_input": bool(uint8_input),
               "outputs": list(graph.outputs)}
    return _run(dest, graph, tol, options, cast_to_float32, verify=verify,
                batch_sizes=batch_sizes, verify_data=verify_data,
                overwrite=overwrite)


def _run(dest, graph, tol, options, cast_to_float32, **job):
    options.update(signature="serving_default",
                   cast_to_float32=bool(cast_to_float32))
    return pipeline.run(pipeline.ExportJob(
        "saved_model", "the SavedModel", dest, graph, tol, options, **job),
        sys.modules[__name__])


def _image_bytes_export(model, path, *, uint8_input, outputs, top_k,
                        labels, verify, batch_sizes, tolerance, verify_data,
                        cast_to_float32, overwrite):
    """``to_saved_model(..., input="image_bytes")``."""
    if getattr(model, "naflex", False):
        raise ValueError(
            f"input='image_bytes' decodes every file to one size; model="
            f"{model.name!r} takes NaFlex patches (naflex=True): export "
            "with input='images' (the signature takes patches, "
            "patch_coords and patch_mask) and cut the images with "
            "keras_vit.data.naflex.patchify")
    if uint8_input or outputs is not None:
        raise ValueError(
            "input='image_bytes' decodes and scales inside and returns "
            "labels, scores, classes and logits; uint8_input and outputs "
            f"do not apply; received uint8_input={uint8_input!r}, "
            f"outputs={outputs!r}")
    serving.check_top_k(top_k)
    if verify_data is None:
        verify_data = "photos"
    if not (isinstance(verify_data, str)
            and verify_data in ("noise", "photos")):
        raise ValueError(
            "input='image_bytes' is verified on encoded sample files: "
            "verify_data must be 'photos' or 'noise'; received "
            f"verify_data={verify_data!r}"[:300])
    dest = common.check_path(path, "saved_model")
    tol = common.tolerance_for(common.saved_model_tolerance(model), tolerance)
    checks.check_options(batch_sizes, verify_data)
    graph = serving.ImageBytesGraph(model, top_k, labels, cast_to_float32)
    options = {"input": serving.INPUT_NAME, "top_k": graph.top_k,
               "labels": graph.label_source,
               "outputs": list(graph.outputs)}
    return _run(dest, graph, tol, options, cast_to_float32, verify=verify,
                batch_sizes=batch_sizes, verify_data=verify_data,
                samples=serving.SAMPLES, overwrite=overwrite)


def convert(graph, staged, workdir, params, arrays, rss):
    """Writes the SavedModel directory ``staged`` (TensorFlow)."""
    graph.save(staged)
    return {"files": [os.path.basename(staged)]}


def finish(staged, workdir, params, arrays, result):
    """Nothing to do after conversion: ``result`` as it is."""
    return result
