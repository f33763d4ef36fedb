"""SavedModel -> ONNX in a separate process with a low memory peak.

Why a child process, measured on ViT-B/16 with tf2onnx 1.17 / TF 2.21 /
protobuf 7 (upb): a plain ``from_function`` peaks at 15.3 GiB.

1. tf2onnx's optimizer passes re-add every node's attributes, and the upb
   protobuf backend keeps cleared fields until the message dies: each pass
   leaks one copy of all weights (+11.5 GiB in all). The pure-Python
   backend frees them; it must be chosen before protobuf is imported,
   hence a fresh process (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python).
2. The default freezing copies the weights about 20 times (7.7 GiB peak);
   tf2onnx's large-model route does not (1.7 GiB).

With both, B/16 converts at a 2.9 GiB peak in 36 s (was 15.3 GiB, 100 s).
"""

from __future__ import annotations

import os
import sys

# A protobuf holds 2 GiB at most: beyond this, weights go to a data file.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26
_ALIGN = 4096  # page-aligned offsets let onnxruntime map the data file
_MIN_EXTERNAL_BYTES = 1024


def _tensors(graph):
    """Every TensorProto of ``graph``: initializers and tensor attributes,
    subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _payload(tensor, storage):
    """The raw bytes of ``tensor`` (from tf2onnx's external ``storage``),
    or None if the data is in a typed field."""
    import onnx

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        return storage[info["location"]]
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return None


def write_model(proto, storage, path, external_data=None):
    """Writes ``proto`` to ``path`` with its tensors inline, or in
    ``path + ".data"`` when ``external_data`` is True (None: when they
    exceed EXTERNAL_DATA_THRESHOLD). Returns the result's ``files``
    (names), ``tensor_bytes`` and ``external_data``."""
    import onnx

    storage = storage or {}
    tensors = list(_tensors(proto.graph))
    total = 0
    for t in tensors:
        data = _payload(t, storage)
        total += len(data) if data is not None else t.ByteSize()
    external = (total > EXTERNAL_DATA_THRESHOLD if external_data is None
                else bool(external_data))
    data_path = path + ".data"
    files = [path]
    if external:
        files.insert(0, data_path)
        offset = 0
        with open(data_path, "wb") as f:
            for t in tensors:
                data = _payload(t, storage)
                if data is None or len(data) < _MIN_EXTERNAL_BYTES:
                    if data is not None and t.data_location == \
                            onnx.TensorProto.EXTERNAL:
                        _inline(t, data)
                    continue
                pad = (-offset) % _ALIGN
                f.write(b"\0" * pad)
                offset += pad
                f.write(data)
                t.ClearField("raw_data")
                del t.external_data[:]
                t.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", os.path.basename(data_path)),
                                   ("offset", str(offset)),
                                   ("length", str(len(data)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
                offset += len(data)
    else:
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                _inline(t, _payload(t, storage))
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return {"files": [os.path.basename(f) for f in files],
            "tensor_bytes": total, "external_data": external}


def _inline(tensor, data):
    import onnx

    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = data


def name_batch_dimension(proto, name="batch"):
    """Names the dynamic first dimension of every graph input and output
    (tf2onnx leaves ``unk__123``), and a NaFlex model's patch count
    ``num_patches``."""
    for value in list(proto.graph.input) + list(proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_param = name
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        if (value.name in ("patches", "patch_coords", "patch_mask")
                and len(dims) > 1 and not dims[1].HasField("dim_value")):
            dims[1].dim_param = "num_patches"


def guard_zero_pad_before_max_pool(proto):
    """Keeps onnxruntime from folding a zero ``Pad`` into a ``MaxPool``.

    onnxruntime's Pad_Fusion (1.31) moves a constant-zero Pad into the
    MaxPool's ``pads``, which MaxPool treats as -inf (BiT's root pool came
    out 5.0 off, the logits 0.03). The rule only fires for a constant pad
    value, so this computes the 0 as ``float(batch * 0)``. Returns the
    number of Pads guarded.
    """
    import onnx
    from onnx import helper

    consumers = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inits = {t.name: t for t in proto.graph.initializer}

    def feeds_max_pool(node):
        users = consumers.get(node.output[0], [])
        if len(users) == 1 and users[0].op_type == "Cast":
            users = consumers.get(users[0].output[0], [])
        return any(u.op_type == "MaxPool" for u in users)

    guards = {}  # by prefix: the nodes that compute each guarded Pad's 0
    for node in proto.graph.node:
        mode = next((a.s for a in node.attribute if a.name == "mode"),
                    b"constant")
        if node.op_type != "Pad" or mode != b"constant" or not \
                feeds_max_pool(node):
            continue
        value = node.input[2] if len(node.input) > 2 else ""
        elem = onnx.TensorProto.FLOAT
        if value in inits:
            elem = inits[value].data_type
            if any(onnx.numpy_helper.to_array(inits[value]).ravel() != 0):
                continue  # a non-zero pad value is left alone
        prefix = f"keras_vit_pad_guard_{len(guards)}"
        zero_i = helper.make_tensor(f"{prefix}/zero", onnx.TensorProto.INT64,
                                    [], [0])
        proto.graph.initializer.append(zero_i)
        guards[prefix] = [
            helper.make_node("Shape", [node.input[0]], [f"{prefix}/shape"],
                             name=f"{prefix}/Shape"),
            helper.make_node("Gather", [f"{prefix}/shape", zero_i.name],
                             [f"{prefix}/batch"], name=f"{prefix}/Gather",
                             axis=0),
            helper.make_node("Mul", [f"{prefix}/batch", zero_i.name],
                             [f"{prefix}/zero_int"], name=f"{prefix}/Mul"),
            helper.make_node("Cast", [f"{prefix}/zero_int"],
                             [f"{prefix}/value"], name=f"{prefix}/Cast",
                             to=elem),
        ]
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = f"{prefix}/value"
    if guards:
        # Each guard goes just before its Pad: still topologically sorted.
        order = list(proto.graph.node)
        del proto.graph.node[:]
        for node in order:
            if node.op_type == "Pad" and len(node.input) > 2:
                proto.graph.node.extend(
                    guards.get(node.input[2].rsplit("/", 1)[0], []))
            proto.graph.node.append(node)
    return len(guards)


def convert_saved_model(saved_model_dir, path, opset, external_data=None):
    """Converts the ``serving_default`` signature of a SavedModel with
    tf2onnx's large-model route and writes ``path``."""
    from keras_vit.runtime import compat

    compat.patch_numpy_product()  # in this throwaway process only
    import tensorflow as tf
    import tf2onnx

    loaded = tf.saved_model.load(saved_model_dir)
    signature = loaded.signatures["serving_default"]
    inputs = signature.structured_input_signature[1]
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name)
             for name, spec in inputs.items()]
    if len(specs) == 1:
        function = tf.function(signature)
    else:  # a NaFlex model's inputs: the signature takes them by name
        by_name = signature
        function = tf.function(
            lambda *args: by_name(**dict(zip(inputs, args))))
    proto, storage = tf2onnx.convert.from_function(
        function, input_signature=specs, opset=opset, large_model=True)
    del loaded, signature, function
    name_batch_dimension(proto)
    guard_zero_pad_before_max_pool(proto)
    return dict(write_model(proto, compat.tf2onnx_tensor_data(storage), path,
                            external_data),
                inputs=[i.name for i in proto.graph.input],
                outputs=[o.name for o in proto.graph.output])


def main(job_path):
    from keras_vit.export import pipeline

    def work(job):
        result = convert_saved_model(job["saved_model"], job["output"],
                                     job["opset"], job.get("external_data"))
        from google.protobuf.internal import api_implementation

        result["protobuf"] = api_implementation.Type()
        return result

    return pipeline.child_main(job_path, work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
