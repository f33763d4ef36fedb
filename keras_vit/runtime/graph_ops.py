"""What TensorFlow's CPU graph made of a model: op counts after grappler.

:func:`op_counts` runs a model once and counts the ops of the graph that
actually ran; :func:`fusion_summary` names the few counts that matter for a
ViT. The GELU fusion is oneDNN's: one fused matmul per encoder block, none
where TensorFlow runs its CPU graphs through Eigen:

>>> import keras_vit
>>> from keras_vit.runtime import compat
>>> from keras_vit.runtime import graph_ops
>>> model = keras_vit.vit(32, 8, 32, 2, 2, 64, 3)
>>> s = graph_ops.fusion_summary(graph_ops.op_counts(model))
>>> s["matmul_bias_gelu"] == (2 if compat.onednn_enabled() else 0)
True
>>> s["matmul_unfused"]   # every dense adds its bias inside the matmul
0
"""

from __future__ import annotations

import collections

import numpy as np

#: Summary keys of :func:`fusion_summary`, in table order.
SUMMARY_KEYS = ("matmul_bias_gelu", "matmul_bias", "matmul_unfused",
                "bias_add_grad", "softmax", "layer_norm", "tanh", "cast",
                "mul", "sum", "xla_programs", "total")

#: The label of a call that XLA compiles inside a graph that is otherwise
#: TensorFlow's (:func:`keras_vit.runtime.fused_ops.xla_gelu` and its kin).
XLA_PROGRAM = "XlaProgram"
# The summary keys counting one op type each.
_EXACT_OPS = {"Tanh": "tanh", "Cast": "cast", "Mul": "mul", "Sum": "sum",
              XLA_PROGRAM: "xla_programs"}


def node_label(node):
    """``node``'s op type, with its fused ops as ``Op[BiasAdd,...]``; a
    function call that XLA must compile is :data:`XLA_PROGRAM`."""
    # ``in`` first: indexing a NodeDef's attr map would add the key.
    if ("Call" in node.op and "_XlaMustCompile" in node.attr
            and node.attr["_XlaMustCompile"].b):
        return XLA_PROGRAM
    label = node.op
    if "fused_ops" in node.attr:
        fused = ",".join(s.decode() for s in node.attr["fused_ops"].list.s)
        label += f"[{fused}]"
    return label


def _inputs_for(model, batch_size):
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, (batch_size,) + shape).astype("float32")


def op_counts(model, batch_size=2, training=False):
    """Op types (fused ones as ``Op[fused,ops]``) of the graph TensorFlow
    ran for one call of ``model``, after grappler's rewrites (a
    ``collections.Counter``). Arguments as :func:`executed_nodes`."""
    return collections.Counter(
        node_label(node)
        for node in executed_nodes(model, batch_size, training))


def executed_nodes(model, batch_size=2, training=False):
    """The ``NodeDef`` s of the graph TensorFlow ran for one call of
    ``model``, after grappler's rewrites.

    ``training=True``: one training step as Keras' ``train_step`` runs it;
    the model must be compiled, and the step changes its weights.
    TensorFlow backend only.
    """
    import keras
    import tensorflow as tf

    from keras_vit.runtime import compat
    from keras_vit.base.checks import check_int

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "op_counts reads TensorFlow's optimised graphs; it needs "
            "KERAS_BACKEND=tensorflow (received backend="
            f"{keras.backend.backend()!r})")
    batch_size = check_int("batch_size", batch_size, low=1, high=4096)
    x = tf.constant(_inputs_for(model, batch_size))
    # The argument's name marks our function among any others.
    arg = "keras_vit_graph_ops_images"
    if training:
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                "op_counts(training=True) counts the model's own training "
                "step: compile the model first (for instance with "
                "keras_vit.train.compile_for_finetune(model, ...))")
        classes = int(model.outputs[0].shape[-1])
        y = tf.constant(np.arange(batch_size) % classes)
        jit = getattr(model, "jit_compile", False) is True

        def step(keras_vit_graph_ops_images, labels):
            images = keras_vit_graph_ops_images
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = model.compute_loss(x=images, y=labels,
                                          y_pred=logits)
            variables = model.trainable_variables
            grads = tape.gradient(loss, variables)
            model.optimizer.apply(grads, variables)
            return loss

        fn = tf.function(step, jit_compile=jit)
        args = (x, y)
    else:
        fn = tf.function(lambda keras_vit_graph_ops_images: model(
            keras_vit_graph_ops_images, training=False))
        args = (x,)
    graphs = compat.tf_executed_graphs(lambda: fn(*args), arg_name=arg)
    return [node for graph in graphs for node in graph.node]


def cast_round_trips(nodes):
    """The ``Cast`` nodes among ``nodes`` (from :func:`executed_nodes`)
    that undo the ``Cast`` feeding them (bf16 -> float32 -> bf16), as
    ``(inner, outer)`` node-name pairs.

    >>> import keras_vit
    >>> from keras_vit.runtime import graph_ops
    >>> model = keras_vit.vit(32, 8, 32, 2, 2, 64, 3, dtype="bfloat16")
    >>> graph_ops.cast_round_trips(graph_ops.executed_nodes(model))
    []
    """
    by_name = {node.name: node for node in nodes}
    pairs = []
    for node in nodes:
        if node.op != "Cast" or not node.input:
            continue
        inner = by_name.get(node.input[0].split(":")[0].lstrip("^"))
        if (inner is not None and inner.op == "Cast"
                and inner.attr["SrcT"].type == node.attr["DstT"].type):
            pairs.append((inner.name, node.name))
    return pairs


def fusion_summary(counts):
    """The counts of :func:`op_counts` that tell how well a ViT fused
    (keys: :data:`SUMMARY_KEYS`)."""
    out = dict.fromkeys(SUMMARY_KEYS, 0)
    for label, n in counts.items():
        op, _, fused = label.partition("[")
        if "MatMul" in op and "Batch" not in op:
            if "Gelu" in fused:
                out["matmul_bias_gelu"] += n
            elif "BiasAdd" in fused:
                out["matmul_bias"] += n
            else:
                out["matmul_unfused"] += n
        elif op.endswith("BiasAddGrad"):
            out["bias_add_grad"] += n
        elif "Softmax" in op and "Grad" not in op:
            out["softmax"] += n
        elif "LayerNorm" in op or "FusedBatchNorm" in op:
            out["layer_norm"] += n
        elif op in _EXACT_OPS:
            out[_EXACT_OPS[op]] += n
        out["total"] += n
    return out


def format_counts(counts, top=None):
    """``counts`` as lines ``count  op``, most frequent first."""
    return "\n".join(f"{n:6d}  {label}"
                     for label, n in counts.most_common(top))
