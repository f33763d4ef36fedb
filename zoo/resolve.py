"""Getting a model from what a user names, and copying it with changes.

Every command and API that takes "a zoo name, a ``.keras`` file, a run
directory or a model" goes through :func:`resolve_model`; every "rebuild the
model with another resolution, head, dtype or outputs and copy its weights"
goes through :func:`rebuild`. Neither needs to know the models' layer names:
the outputs are asked for by feature name (see
:func:`keras_vit.models.feature_model`).

Both live in the zoo, not beside the models: a name is built by
:func:`keras_vit.zoo.load`, and a copy of another size gets its weights by
checkpoint key (:mod:`keras_vit.zoo.convert`). Users reach them as
``keras_vit.resolve_model`` and ``keras_vit.rebuild`` (or from
``keras_vit.zoo``).

>>> import keras_vit
>>> m = resolve_model("ViT-Ti/16", weights=None, image_size=32,
...                   num_classes=10)
>>> bigger = rebuild(m, image_size=48, num_classes=5)
>>> bigger.grid_size, bigger.num_classes
((3, 3), 5)
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np

from keras_vit.errors import (UnexpectedKeywordError, check_archive,
                              check_pair, did_you_mean)
from keras_vit.zoo import bit_layout, convert

#: The file a training run directory holds its final model in.
RUN_MODEL_FILE = "model.keras"


def _keras_vit_model(model):
    from keras_vit.models.axial import AxialVisionTransformer
    from keras_vit.models.resnet_v2 import ResNetV2
    from keras_vit.models.vit import VisionTransformer

    return isinstance(model, (VisionTransformer, AxialVisionTransformer,
                              ResNetV2))


def load_keras_file(path, argument="model", *, error=ValueError):
    """The model in a ``.keras`` file (``compile=False``), or one error
    naming ``argument``: Keras says "File not found" for a file that is there
    but is no ``.keras`` archive."""
    import keras

    # Importing the model classes registers them (and their layers) with
    # Keras, which the file names.
    from keras_vit.models import (  # noqa: F401
        AxialVisionTransformer, ResNetV2, VisionTransformer)

    check_archive(argument, path, "a .keras model", error=error)
    _check_keras_members(path, argument, error)
    shapes = _keras_weights(path, argument, error)
    try:
        model = keras.saving.load_model(path, compile=False)
    except (ValueError, OSError, KeyError, TypeError, AttributeError,
            zipfile.BadZipFile) as e:
        raise error(f"cannot load {argument}={path!r} as a Keras model: "
                    f"{type(e).__name__}: {e}") from e
    except RecursionError:  # a config.json nested thousands deep
        raise error(f"cannot load {argument}={path!r} as a Keras model: its "
                    "config.json is nested too deeply to be a model's "
                    "config") from None
    if (shapes is not None and _keras_vit_model(model)
            and len(shapes) != len(model.weights)):
        raise error(_unread_weights(model, shapes, path, argument))
    return model


# A model's config.json is a few KB; Keras reads it whole into memory (a
# 1.6 MB .keras can hold a 1.5 GB one).
MAX_KERAS_CONFIG_BYTES = 16 << 20
# Keras writes its members uncompressed and reads model.weights.h5 whole
# into memory; its own bomb check starts at 4 GiB, so a 1.5 MB .keras could
# still hold a 3.9 GB weights file (a 1.5 GB one peaked at 3.6 GB of RSS).
# A member past the floor that inflates more than this is refused: weights
# deflate by a few percent, and 10 MB of file stays under 200 MB.
KERAS_BOMB_FLOOR = 64 << 20
KERAS_MAX_EXPANSION = 20


def _check_keras_members(path, argument, error):
    """Refuses a ``.keras`` archive whose members would inflate past what
    its bytes can hold, before Keras reads them into memory."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return  # Keras' own error names what is wrong
    where = f"cannot load {argument}={path!r} as a Keras model: its"
    for info in members:
        size = info.file_size
        if info.filename == "config.json" and size > MAX_KERAS_CONFIG_BYTES:
            raise error(f"{where} config.json is {size} bytes uncompressed "
                        "(a model's is a few KB; at most "
                        f"{MAX_KERAS_CONFIG_BYTES} read)")
        if (size > KERAS_BOMB_FLOOR
                and size > KERAS_MAX_EXPANSION * info.compress_size):
            raise error(f"{where} {info.filename} is {size} bytes "
                        f"uncompressed from {info.compress_size} in the "
                        "file, more than a model's weights deflate (a zip "
                        "bomb?); the .keras files Keras writes store their "
                        "members uncompressed")


KERAS_WEIGHTS_FILE = "model.weights.h5"


def _keras_weights(path, argument, error):
    """``{name: shape}`` of the arrays in a ``.keras`` file's weights (not
    its optimizer's), each checked stored as Keras writes it: in the file,
    contiguous (no external or virtual dataset reading another file, no
    compressed chunks inflating past the file); None when the archive has
    no such member (Keras' own error names what is wrong)."""
    import h5py

    from keras_vit.zoo import keras_hub_io

    where = (f"cannot load {argument}={path!r} as a Keras model: its "
             f"{KERAS_WEIGHTS_FILE}")
    try:
        with zipfile.ZipFile(path) as archive:
            if KERAS_WEIGHTS_FILE not in archive.namelist():
                return None
            # Bounded by _check_keras_members; Keras reads it whole too.
            data = archive.read(KERAS_WEIGHTS_FILE)
    except (OSError, zipfile.BadZipFile):
        return None
    try:
        f = h5py.File(io.BytesIO(data), "r")
    except OSError as e:
        raise error(f"{where} is not an HDF5 file "
                    f"({' '.join(str(e).split())[:200]})") from None
    with f:
        try:
            found = keras_hub_io.h5_datasets(f, where)
        except convert.CheckpointError as e:
            raise error(str(e)) from None
        problems = [f"{name}: {problem}" for name, ds in found.items()
                    if (problem := _h5_problem(ds, len(data)))]
        if problems:
            raise error(f"{where} has arrays Keras never writes: "
                        f"{'; '.join(problems[:12])}")
        return {name: tuple(ds.shape) for name, ds in found.items()}


def _h5_problem(ds, file_size):
    """What is wrong with the dataset ``ds`` of a Keras weights file, or
    None: Keras writes numbers (bfloat16 as 2-byte opaque values)."""
    from keras_vit.zoo import keras_hub_io

    if ds.dtype.kind not in "biufV":
        return f"of dtype {ds.dtype} (Keras writes numbers)"
    where = keras_hub_io.h5_storage_problem(ds, file_size)
    return None if where is None else f"stored {where}"


def _unread_weights(model, shapes, path, argument):
    """The error for a ``.keras`` file whose weights hold arrays Keras did
    not read into ``model`` (it ignores them): each named, with what the
    model's own save holds."""
    import tempfile

    import h5py

    from keras_vit.zoo import keras_hub_io

    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, KERAS_WEIGHTS_FILE)
        model.save_weights(saved)
        with h5py.File(saved, "r") as f:
            expected = set(keras_hub_io.h5_datasets(f, saved))
    unexpected = sorted(set(shapes) - expected)
    missing = sorted(expected - set(shapes))
    listed = [f"{what} ({len(names)}): {', '.join(names[:20])}"
              + (" ..." if len(names) > 20 else "")
              for what, names in (("unexpected", unexpected),
                                  ("missing", missing)) if names]
    return (f"cannot load {argument}={path!r} as a Keras model: its "
            f"{KERAS_WEIGHTS_FILE} holds {len(shapes)} arrays where "
            f"model={model.name!r} has {len(model.weights)} weights; "
            + "; ".join(listed))


def model_path(spec, argument="model", *, error=ValueError):
    """The ``.keras`` file ``spec`` names (itself, or a run directory's
    ``model.keras``), or None when ``spec`` names no file (a zoo name)."""
    path = os.fspath(spec)
    if os.path.isdir(path):
        inside = os.path.join(path, RUN_MODEL_FILE)
        if os.path.isfile(inside):
            return inside
        # Here, not at the top: the zoo's loaders import Keras, and the
        # command line asks for a model file before it loads Keras.
        from keras_vit.zoo.timm_hub import WEIGHTS_FILE

        if os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
            # A local timm or transformers repository: the zoo loads it.
            return None
        pickled = os.path.isfile(os.path.join(path, "pytorch_model.bin"))
        raise FileNotFoundError(
            f"{argument}={path!r} is a folder without {RUN_MODEL_FILE} (a "
            "fine-tune run writes it when it finishes) or "
            f"{WEIGHTS_FILE} (a timm or transformers repository)"
            + ("; it has only pytorch_model.bin, which keras_vit never "
               "unpickles: re-save it with transformers' save_pretrained("
               "dir, safe_serialization=True)" if pickled else ""))
    if path.endswith(".keras"):
        return path
    if os.path.isfile(path):
        if path.endswith(".safetensors"):
            return None  # a timm checkpoint: the zoo loads it by name
        raise error(f"{argument}={path!r} is a file but not a .keras model")
    return None


def resolve_model(spec, *, weights="auto", image_size=None, num_classes=None,
                  dtype=None, argument="model", error=ValueError, **options):
    """The model ``spec`` names, with the resolution, head and dtype asked.

    Args:
        spec: a ``keras.Model``; a ``.keras`` file; a training run directory
            (its ``model.keras``); or a zoo name (see
            :func:`keras_vit.zoo.list_models`), built by
            :func:`keras_vit.zoo.load` with ``weights`` and ``**options``.
        weights: for a zoo name, as in :func:`keras_vit.zoo.load` (``"none"``
            is None). Any other value with a file or a model is an error.
        image_size, num_classes, dtype: None keeps the model's. Otherwise a
            model or file is copied by :func:`rebuild` (position embeddings
            resized, a new zero-initialised head); a zoo name is built so.
        argument: the name errors give ``spec`` (``"MODEL"`` for a command
            line argument).
        error: the exception class of a bad ``spec`` (a command line passes
            its own); a missing file is always ``FileNotFoundError``.
        **options: more :func:`keras_vit.zoo.load` keywords (zoo names only).

    >>> resolve_model(3)
    Traceback (most recent call last):
    ValueError: model must be a keras.Model, a zoo name, a .keras file or a run directory; received model=3
    """
    import keras

    if isinstance(weights, str) and weights.lower() == "none":
        weights = None
    if isinstance(spec, keras.Model):
        model = spec
    elif isinstance(spec, (str, os.PathLike)):
        path = model_path(spec, argument, error=error)
        if path is None:
            from keras_vit.zoo import api

            if dtype is not None:
                options["dtype"] = dtype
            return api.load(os.fspath(spec), weights=weights,
                            image_size=image_size, num_classes=num_classes,
                            **options)
        model = load_keras_file(path, argument, error=error)
    else:
        raise error(f"{argument} must be a keras.Model, a zoo name, a .keras "
                    f"file or a run directory; received {argument}={spec!r}")
    if weights not in (None, "auto"):
        given = ("a model instance" if isinstance(spec, keras.Model)
                 else f"the .keras model {argument}={_label(spec)!r}")
        raise error(f"weights applies to zoo names only; received "
                    f"weights={weights!r} with {given}")
    if options:
        raise error(f"{', '.join(sorted(options))} applies to zoo names only;"
                    f" received {argument}={_label(spec)!r}")
    return rebuild(model, image_size=image_size, num_classes=num_classes,
                   dtype=dtype, copy=False)


def _label(spec):
    return getattr(spec, "name", spec) if not isinstance(
        spec, (str, os.PathLike)) else os.fspath(spec)


def _copy_weights(source, target, keep_pre_logits):
    """``source``'s weights into ``target``: one to one where the weight
    lists line up, else by checkpoint key (position embeddings resized, a
    head of another size zero-initialised)."""
    shapes = [tuple(w.shape) for w in source.weights]
    # The same shapes are not the same model: a position table of another
    # grid with as many patches (4x4 and 8x2) must be resized, not copied.
    same_grid = (getattr(source, "grid_size", None)
                 == getattr(target, "grid_size", None))
    if same_grid and shapes == [tuple(w.shape) for w in target.weights]:
        import keras

        for variable, value in zip(target.weights, source.weights):
            # Cast to the copy's dtype (a float32 copy of a bf16 model).
            variable.assign(keras.ops.cast(value.value, variable.dtype))
        return
    from keras_vit.models.axial import AxialVisionTransformer
    from keras_vit.models.resnet_v2 import ResNetV2

    if isinstance(source, ResNetV2):
        bit_layout.load_weights(target, bit_layout.export_arrays(source))
    elif isinstance(source, AxialVisionTransformer):
        _copy_by_path(source, target)
    else:
        convert.load_weights(target, convert.export_arrays(source),
                             keep_pre_logits=keep_pre_logits or None,
                             source_name=f"<model {source.name!r}>",
                             source_grid=getattr(source, "grid_size", None))


def _copy_by_path(source, target):
    """For a model with no checkpoint layout (Axial-ViT): weights by their
    Keras path; a learned position table of another grid resized, a head of
    another size left at its zero initialisation."""
    given = {w.path: w for w in source.weights}
    owners = {w.path: layer for layer in target.layers for w in layer.weights}
    problems = []
    for variable in target.weights:
        value = given.get(variable.path)
        want = tuple(variable.shape)
        if value is not None:
            value = np.asarray(value.numpy())
        if value is not None and value.shape == want:
            variable.assign(value)
            continue
        layer = owners.get(variable.path)
        if variable.path.startswith("head/"):
            continue  # zero-initialised, as a new head is
        if (value is not None and getattr(layer, "kind", None) == "learned_1d"
                and value.ndim == 3):
            variable.assign(convert.resize_posemb(
                value, layer.grid_size, layer.num_prefix_tokens))
            continue
        have = None if value is None else value.shape
        problems.append(f"{variable.path}: {have} vs {want}")
    if problems:
        raise ValueError(f"cannot copy the weights of model={source.name!r} "
                         f"into its rebuilt copy: {'; '.join(problems[:10])}")


def rebuild(model, *, image_size=None, num_classes=None, dtype=None,
            outputs=None, keep_pre_logits=False, copy=True, **changes):
    """``model`` built again from its config with changes, same weights.

    Args:
        model: a keras_vit model (VisionTransformer, AxialVisionTransformer,
            ResNetV2). Other functional models are only copied (no change
            but ``dtype``).
        image_size: a new resolution: position embeddings are resized as
            when loading a checkpoint (paper section 3.2).
        num_classes: a new head size: the head is zero-initialised, as the
            paper fine-tunes, and ``pre_logits`` dropped unless
            ``keep_pre_logits``.
        dtype: a dtype policy name (``"float32"``, ``"mixed_bfloat16"``)
            the copy is built under; its config keeps ``dtype=None``, so a
            saved copy follows the global policy when loaded, like the
            original. None: the model's own policy, whatever the global
            one is now.
        outputs: a feature name or list of them (see
            :func:`keras_vit.models.feature_model`; ``"attention_scores"``
            turns ``return_attention_scores`` on): the copy returns those.
        copy: False returns ``model`` itself when nothing changes.
        **changes: other constructor arguments (``dropout_rate``,
            ``return_attention_scores``, ...).

    >>> import numpy as np, keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 1, 2, 32, 3)
    >>> x = np.ones((1, 32, 32, 3), "float32")
    >>> np.allclose(rebuild(m)(x), m(x))
    True
    >>> sorted(rebuild(m, outputs=["pre_logits", "attention_scores"]).output)
    ['attention_scores', 'pre_logits']
    """
    import keras

    from keras_vit.models.features import feature_model

    names = None
    if outputs is not None:
        names = [outputs] if isinstance(outputs, str) else list(outputs)
        if "attention_scores" in names:
            changes.setdefault("return_attention_scores", True)
    ours = _keras_vit_model(model)
    config = model.get_config() if ours else {}
    if image_size is not None:
        size = check_pair("image_size", image_size)
        if size != check_pair("image_size", config.get("image_size", size)):
            changes["image_size"] = list(size)
    if (num_classes is not None and config.get("include_top")
            and config.get("num_classes") != num_classes):
        changes["num_classes"] = num_classes
        if config.get("representation_size") and not keep_pre_logits:
            changes["representation_size"] = None
        # A new head's classes are not the old ones: their names go too,
        # unless the caller names the new ones.
        changes.setdefault("label_names", None)
    changes = {k: v for k, v in changes.items()
               if not ours or k not in config or config[k] != v}
    if changes and not ours:
        raise ValueError(
            f"{changes} differ from model={model.name!r}'s, and only a "
            "keras_vit model (VisionTransformer, AxialVisionTransformer, "
            f"ResNetV2) is rebuilt with changes; it is a "
            f"{type(model).__name__}")
    unknown = sorted(set(changes) - set(config))
    if unknown:
        raise UnexpectedKeywordError(
            f"rebuild got an unexpected keyword argument {unknown[0]!r}."
            f"{did_you_mean(unknown[0], sorted(config))}")
    if dtype is not None and keras.dtype_policies.get(
            dtype).name != model.dtype_policy.name:
        changes["dtype"] = None
    if not changes and not copy:
        rebuilt = model
    else:
        policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(dtype or model.dtype_policy)
        try:
            if ours:
                rebuilt = type(model).from_config(dict(config, **changes))
            else:
                try:
                    rebuilt = type(model).from_config(model.get_config())
                except Exception:  # noqa: BLE001 - not every model rebuilds
                    rebuilt = keras.models.clone_model(model)
        finally:
            keras.config.set_dtype_policy(policy)
        _copy_weights(model, rebuilt, keep_pre_logits)
    if names is not None:
        rebuilt = feature_model(rebuilt, outputs)
    return rebuilt
