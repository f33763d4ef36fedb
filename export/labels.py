"""The class names of an exported model, recorded in the artifact where a
deployer's own tools read them back.

Every format holds the same ``labels.txt`` text: one name per line (line i
names class i), UTF-8, each line ending with a newline. Where it goes:

- SavedModel: the file ``assets/labels.txt`` of the directory;
- ONNX: the model's ``metadata_props`` entry ``label_names``
  (onnxruntime: ``session.get_modelmeta().custom_metadata_map``);
- TFLite: the model's metadata entry ``label_names``, a buffer of the
  flatbuffer (``ai_edge_litert.tools.flatbuffer_utils.read_model(path)
  .metadata``);
- OpenVINO IR: the model's ``rt_info`` entry ``label_names``
  (``core.read_model(path).get_rt_info("label_names").astype(str)``).

:func:`read_label_names` reads any of the four. A name holding a line
break cannot be written: then nothing is recorded, and a warning says why.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings

import numpy as np

from keras_vit.base.checks import check_path, require
from keras_vit.export.common import weights_file
from keras_vit.export.openvino_core import core

#: The ONNX ``metadata_props`` key and the TFLite metadata name.
KEY = "label_names"
#: Where a SavedModel directory holds them.
SAVED_MODEL_FILE = os.path.join("assets", "labels.txt")
#: The key of the image sizes the model takes, and its SavedModel file.
SIZES_KEY = "image_sizes"
SAVED_MODEL_SIZES_FILE = os.path.join("assets", "image_sizes.json")


def unwritable(names):
    """The first name that one line cannot hold (a line break of any kind
    inside it), or None.

    >>> unwritable(["cat", "dog"]), unwritable(["cat", "d\\u2028og"])
    (None, 'd\\u2028og')
    """
    return next((name for name in names if name.splitlines() != [name]),
                None)


def to_text(names):
    """``names`` as the recorded text.

    >>> to_text(["cat", "dog"])
    'cat\\ndog\\n'
    """
    return "".join(f"{name}\n" for name in names)


def from_text(text, where):
    """The names of a recorded ``text``; ValueError naming ``where``
    when it is not one name per line.

    >>> from_text("cat\\ndog\\n", "labels.txt")
    ('cat', 'dog')
    """
    if not text.endswith("\n") or "\n\n" in text or text.startswith("\n"):
        raise ValueError(f"{where} is not one class name per line ending "
                         f"with a newline; it holds {text[:200]!r}")
    return tuple(text[:-1].split("\n"))


def record(fmt, staged, graph, notes):
    """Writes the class names of ``graph`` into the ``fmt`` artifact
    ``staged``; returns what the report's options say of it (None when
    nothing is written)."""
    source, names = graph.class_names()
    if names is None:
        return None
    bad = unwritable(names)
    if bad is not None:
        message = (f"the class names were not recorded in the artifact: "
                   f"{bad[:100]!r} holds a line break, and the artifact "
                   "holds one name per line")
        notes.append(message)
        warnings.warn(message, UserWarning, stacklevel=3)
        return None
    text = to_text(names)
    where = _WRITERS[fmt](staged, text)
    return {"source": source, "count": len(names), "where": where}


def record_image_sizes(fmt, staged, sizes):
    """Writes the image sizes the model takes (``sizes``) into the ``fmt``
    artifact ``staged``, for a deployer whose runtime does not check them
    (onnxruntime); returns where they went."""
    return _WRITERS[fmt](staged, sizes.to_text(), key=SIZES_KEY)


def read_image_sizes(path):
    """The :class:`~keras_vit.layers.ImageSizes` recorded in an exported
    artifact (any of the four formats), or None when it records none.

    >>> import os, tempfile, keras_vit
    >>> from keras_vit.export import read_image_sizes, to_onnx
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 2,
    ...                       dynamic_image_size=True)
    >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> _ = to_onnx(model, path, verify=False)
    >>> read_image_sizes(path).describe()
    'height and width positive multiples of 8'
    """
    from keras_vit.layers.image_sizes import ImageSizes

    text = _read_entry(path, SIZES_KEY, SAVED_MODEL_SIZES_FILE)
    return None if text is None else ImageSizes.from_json(json.loads(text))


def _read_entry(path, key, saved_model_file):
    """The text recorded under ``key`` in the artifact at ``path`` (a
    SavedModel's ``saved_model_file``), or None."""
    check_path("path", path)
    path = os.fspath(path)
    if os.path.isdir(path):
        file = os.path.join(path, saved_model_file)
        if not os.path.isfile(file):
            return None
        with open(file, encoding="utf-8", newline="") as f:
            return f.read()
    if path.lower().endswith(".onnx"):
        import onnx

        proto = onnx.load(path, load_external_data=False)
        return next((p.value for p in proto.metadata_props if p.key == key),
                    None)
    if path.lower().endswith(".tflite"):
        return _read_tflite(path, key)
    if path.endswith(".xml"):
        return _read_openvino(path, key)
    raise ValueError(f"path={path!r} is not a SavedModel directory, an "
                     ".onnx, a .tflite or an OpenVINO .xml file")


def _write_saved_model(directory, text, key=KEY):
    name = SAVED_MODEL_FILE if key == KEY else SAVED_MODEL_SIZES_FILE
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return name


def _write_onnx(path, text, key=KEY):
    import onnx

    proto = onnx.load(path, load_external_data=False)
    kept = [p for p in proto.metadata_props if p.key != key]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    proto.metadata_props.add(key=key, value=text)
    onnx.save(proto, path)
    return f"metadata_props[{key!r}]"


def _write_tflite(path, text, key=KEY):
    needs = {"package": "ai-edge-litert",
             "purpose": "recording class names in TFLite files"}
    flatbuffer_utils = require("ai_edge_litert.tools.flatbuffer_utils",
                               **needs)
    schema = require("ai_edge_litert.schema_py_generated", **needs)
    model = flatbuffer_utils.read_model(path)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = key
    entry.buffer = len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or [])
                      if _text(m.name) != key] + [entry]
    flatbuffer_utils.write_model(model, path)
    return f"metadata[{key!r}]"


def _write_openvino(path, text, key=KEY):
    """Adds the entry to the IR's ``rt_info`` and writes the IR back in
    place, through a new folder: the model read maps the ``.bin`` file
    that the new one replaces."""
    ov = require("openvino", purpose="recording class names in OpenVINO "
                                     "files")
    model = core().read_model(path)
    model.set_rt_info(text, key)
    scratch = tempfile.mkdtemp(dir=os.path.dirname(path))
    try:
        edited = os.path.join(scratch, "model.xml")
        ov.save_model(model, edited, compress_to_fp16=False)
        del model
        os.replace(weights_file(edited), weights_file(path))
        os.replace(edited, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return f"rt_info[{key!r}]"


_WRITERS = {"saved_model": _write_saved_model, "onnx": _write_onnx,
            "tflite": _write_tflite, "openvino": _write_openvino}


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def read_label_names(path):
    """The class names recorded in an exported artifact (a SavedModel
    directory, an ``.onnx``, a ``.tflite`` or an OpenVINO ``.xml`` file),
    as a tuple in the order of its outputs, or None when it records
    none.

    >>> import os, tempfile, keras_vit
    >>> from keras_vit.export import read_label_names, to_onnx
    >>> model = keras_vit.vit(32, 8, 16, 1, 2, 32, 2,
    ...                       label_names=["cat", "dog"])
    >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> _ = to_onnx(model, path, verify=False)
    >>> read_label_names(path)
    ('cat', 'dog')
    """
    text = _read_entry(path, KEY, SAVED_MODEL_FILE)
    if text is None:
        return None
    where = (os.path.join(os.fspath(path), SAVED_MODEL_FILE)
             if os.path.isdir(path) else f"{os.fspath(path)!r} {KEY!r}")
    return from_text(text, where)


def _read_openvino(path, key):
    """The ``key`` rt_info entry of an OpenVINO IR (text)."""
    require("openvino", purpose="reading class names from OpenVINO files")
    model = core().read_model(path)
    if not model.has_rt_info(key):
        return None
    return model.get_rt_info(key).astype(str)


def _read_tflite(path, key):
    """The ``key`` metadata of a ``.tflite`` file (text), read in place."""
    schema = require("ai_edge_litert.schema_py_generated",
                     package="ai-edge-litert",
                     purpose="reading class names from TFLite files")
    with open(path, "rb") as f:
        data = f.read()
    model = schema.Model.GetRootAs(data, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if _text(entry.Name()) != key:
            continue
        buffer = model.Buffers(entry.Buffer())
        if buffer.Offset():  # stored after the flatbuffer
            raw = data[buffer.Offset():buffer.Offset() + buffer.Size()]
        else:
            array = buffer.DataAsNumpy()
            raw = b"" if isinstance(array, int) else array.tobytes()
        return raw.decode("utf-8")
    return None
