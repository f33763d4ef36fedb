"""Getting a model from what a user names, and copying it with changes.

Every command and API that takes "a zoo name, a ``.keras`` file, a run
directory or a model" goes through :func:`resolve_model`; every copy with
another resolution, head, dtype or outputs goes through :func:`rebuild`.

>>> import keras_vit
>>> m = resolve_model("ViT-Ti/16", weights=None, image_size=32,
...                   num_classes=10)
>>> bigger = rebuild(m, image_size=48, num_classes=5)
>>> bigger.grid_size, bigger.num_classes
((3, 3), 5)
"""

from __future__ import annotations

import os

from keras_vit.base.archives import check_archive
from keras_vit.base.checks import check_pair, did_you_mean
from keras_vit.base.errors import UnexpectedKeywordError
from keras_vit.runtime.policy import dtype_policy_scope
from keras_vit.zoo import hub_files, settle, sources
from keras_vit.zoo.build import Checkpoint, copy_weights, is_keras_vit_model
from keras_vit.zoo.keras_archive import RUN_MODEL_FILE


def model_path(spec, argument="model", *, error=ValueError):
    """The ``.keras`` file ``spec`` names (itself, or a run directory's
    ``model.keras``), or None when ``spec`` names something else the zoo
    reads; a folder two sources claim is refused (ValueError)."""
    path = os.fspath(spec)
    if os.path.isdir(path):
        claims = [s.name for s in sources.claims(path)]
        if len(claims) > 1:
            sources.find(path, "auto")  # the ambiguity error, worded once
        if claims == ["keras"]:
            return os.path.join(path, RUN_MODEL_FILE)
        if claims:
            return None  # a timm, transformers or keras-hub folder
        raise FileNotFoundError(
            f"{argument}={path!r} is a folder without {RUN_MODEL_FILE} (a "
            "fine-tune run writes it when it finishes), "
            f"{hub_files.WEIGHTS_FILE} (a timm or transformers repository) "
            "or a keras-hub preset's config.json"
            + hub_files.pickle_hint(path))
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
        spec: a ``keras.Model``; a ``.keras`` file; a training run directory;
            or a zoo name, built by :func:`keras_vit.zoo.load` with
            ``weights`` and ``**options``.
        weights: for a zoo name, as in :func:`keras_vit.zoo.load` (``"none"``
            is None).
        image_size, num_classes, dtype: None keeps the model's. Otherwise a
            model or file is copied by :func:`rebuild`.
        argument: the name errors give ``spec``.
        error: the exception class of a bad ``spec``; a missing file is
            always ``FileNotFoundError``.
        **options: more :func:`keras_vit.zoo.load` keywords (zoo names only).

    >>> resolve_model(3)
    Traceback (most recent call last):
    ValueError: model must be a keras.Model, a zoo name, a .keras file or a run directory; received model=3
    """
    import keras

    if isinstance(weights, str) and weights.lower() == "none":
        weights = None
    if isinstance(spec, keras.Model):
        if weights not in (None, "auto"):
            raise error(f"weights applies to zoo names only; received "
                        f"weights={weights!r} with a model instance")
        if options:
            raise error(f"{', '.join(sorted(options))} applies to zoo names "
                        f"only; received {argument}={spec.name!r}")
        return rebuild(spec, image_size=image_size, num_classes=num_classes,
                       dtype=dtype, copy=False)
    if not isinstance(spec, (str, os.PathLike)):
        raise error(f"{argument} must be a keras.Model, a zoo name, a .keras "
                    f"file or a run directory; received {argument}={spec!r}")
    path = model_path(spec, argument, error=error)
    if path is not None:
        check_archive(argument, path, "a .keras model", error=error)
    if dtype is not None:
        options["dtype"] = dtype
    progress = options.pop("progress", None)
    return sources.load(os.fspath(spec), weights, settle.request(
        image_size=image_size, num_classes=num_classes, **options),
        progress=progress, argument=argument)


def rebuild(model, *, image_size=None, num_classes=None, dtype=None,
            outputs=None, keep_pre_logits=False, copy=True, **changes):
    """``model`` built again from its config with changes, same weights.

    Args:
        model: a keras_vit model. Other functional models are only copied
            (no change but ``dtype``).
        image_size: a new resolution: position embeddings are resized.
        num_classes: a new head size: the head is zero-initialised and
            ``pre_logits`` dropped unless ``keep_pre_logits``.
        dtype: a dtype policy name the copy is built under (in its config,
            so that a save keeps it). None: the model's own policy.
        outputs: a feature name or list of them the copy returns (see
            :func:`keras_vit.models.feature_model`).
        copy: False returns ``model`` itself when nothing changes.
        **changes: other constructor arguments.

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

    if not isinstance(model, keras.Model):
        raise TypeError(f"rebuild takes a keras.Model; received "
                        f"model={model!r}")
    names = None
    if outputs is not None:
        names = [outputs] if isinstance(outputs, str) else list(outputs)
        if "attention_scores" in names:
            changes.setdefault("return_attention_scores", True)
    ours = is_keras_vit_model(model)
    config = model.get_config() if ours else {}
    if not ours:
        asked = {k: v for k, v in (("image_size", image_size),
                                   ("num_classes", num_classes),
                                   ("outputs", outputs)) if v is not None}
        asked.update(changes)
        if asked:
            key = next(iter(asked))
            raise ValueError(
                f"{key}={asked[key]!r} cannot be applied to model="
                f"{model.name!r}: only a keras_vit model (VisionTransformer, "
                "AxialVisionTransformer, ResNetV2) is rebuilt with changes; "
                f"it is a {type(model).__name__}")
    topped = bool(changes.get("include_top", config.get("include_top")))
    if ours and num_classes is not None and not topped:
        raise ValueError(
            f"num_classes={num_classes!r} cannot be applied to model="
            f"{model.name!r}: it was built with include_top=False (no head); "
            "pass include_top=True as well to add one")
    if ours and (image_size is not None or num_classes is not None):
        # The head, size and label rules of every load, with the model as
        # the checkpoint.
        head = config["num_classes"] if topped else None
        settled = settle.settle(
            Checkpoint(dict(config), source_name=f"<model {model.name!r}>",
                       head=head, label_names=config.get("label_names"),
                       include_top=bool(config.get("include_top"))),
            settle.request(image_size,
                           num_classes if head is not None else None,
                           keep_pre_logits=keep_pre_logits,
                           label_names=changes.pop("label_names",
                                                   settle.UNSET)))
        target = dict(settled.config)
        if check_pair("image_size", target["image_size"]) == check_pair(
                "image_size", config["image_size"]):
            target["image_size"] = config["image_size"]
        changes = {**{k: v for k, v in target.items() if config.get(k) != v},
                   **changes}
    changes = {k: v for k, v in changes.items()
               if k not in config or config[k] != v}
    unknown = sorted(set(changes) - set(config))
    if unknown:
        raise UnexpectedKeywordError(
            f"rebuild got an unexpected keyword argument {unknown[0]!r}."
            f"{did_you_mean(unknown[0], sorted(config))}")
    if dtype is not None and keras.dtype_policies.get(
            dtype).name != model.dtype_policy.name:
        changes["dtype"] = dtype
    if not changes and not copy:
        rebuilt = model
    else:
        with dtype_policy_scope(dtype or model.dtype_policy):
            if ours:
                rebuilt = type(model).from_config(dict(config, **changes))
            else:
                try:
                    rebuilt = type(model).from_config(model.get_config())
                except Exception:  # noqa: BLE001 - not every model rebuilds
                    rebuilt = keras.models.clone_model(model)
        copy_weights(model, rebuilt, keep_pre_logits)
    if names is not None:
        rebuilt = feature_model(rebuilt, outputs)
    return rebuilt
