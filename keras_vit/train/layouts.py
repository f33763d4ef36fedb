"""Training beyond one device on JAX with Keras' own distribution API.

A :class:`keras.distribution.LayoutMap` maps variable paths to the mesh
axes each variable is split on; XLA (GSPMD) inserts the communication.
TensorFlow keeps ``tf.distribute``; torch runs on one device.

The layout is Megatron-LM's for a Transformer: in each block the
query/key/value projections and the first MLP layer are split on their
output, the attention output and the second MLP layer on their input, so
a block needs one reduction after attention and one after the MLP. The
patch embedding and ``pre_logits`` are split on their output width, the
head on its input width; the rest is replicated. ResNet convolutions are
split on their output channels.

>>> import keras_vit
>>> model = keras_vit.vit(32, 8, 64, 2, 4, 128, 10)
>>> rules = layout_rules(model, model_parallel=2)
>>> rules["(.*/)?attention/(query|key|value)/kernel"]
(None, 'model', None)
>>> rules["(.*/)?mlp/dense_1/kernel"]
('model', None)
>>> layout_rules(model, model_parallel=3)
Traceback (most recent call last):
...
ValueError: model_parallel=3 does not divide num_heads=4 (encoder_block_0/attention/query/kernel has shape (64, 4, 16) and is split on axis 1); model_parallel must divide 4, the nearest that does is 2 (any of [1, 2, 4])

On JAX, ``distribution(devices=8, model_parallel=2, model="ViT-L/16")``
trains ViT-L/16 on 4 data-parallel replicas of 2 shards each.
"""

from __future__ import annotations

import contextlib
import math
import re

from keras_vit.runtime import compat
from keras_vit.base.checks import check_int
from keras_vit.train.distribute import StrategyError

MODEL_AXIS = "model"
BATCH_AXIS = "batch"

# (role, regular expression on ``variable.path``, axes). "model" in the axes
# is replaced by the mesh's model-axis name; ``(.*/)?`` allows a nested
# model. The role names the hyperparameter a model axis must divide.
_RULES = (
    # Transformer blocks. The attention kernels are stored (D, heads,
    # D/heads) and (heads, D/heads, D): splitting the heads axis is the
    # column (resp. row) split.
    ("num_heads", r"(.*/)?attention/(query|key|value)/kernel",
     (None, "model", None)),
    ("num_heads", r"(.*/)?attention/(query|key|value)/bias", ("model", None)),
    ("num_heads", r"(.*/)?attention/out/kernel", ("model", None, None)),
    ("mlp_dim", r"(.*/)?mlp/dense_0/kernel", (None, "model")),
    ("mlp_dim", r"(.*/)?mlp/dense_0/bias", ("model",)),
    ("mlp_dim", r"(.*/)?mlp/dense_1/kernel", ("model", None)),
    # The relative position table goes with the queries: whole heads.
    ("num_heads", r"(.*/)?rel_embedding", (None, "model", None)),
    # Embedding and head.
    ("hidden_size", r"(.*/)?patch_embedding/conv/kernel",
     (None, None, None, "model")),
    ("hidden_size", r"(.*/)?patch_embedding/conv/bias", ("model",)),
    ("representation_size", r"(.*/)?pre_logits/kernel", (None, "model")),
    ("representation_size", r"(.*/)?pre_logits/bias", ("model",)),
    ("hidden_size", r"(.*/)?head/kernel", ("model", None)),
    # ResNet convolutions, (kh, kw, in, out): the hybrids' stem and BiT.
    ("channels", r"(.*/)?(resnet_root_conv|resnet_block\d+_unit\d+/"
                 r"conv(1|2|3|_proj))/kernel", (None, None, None, "model")),
    ("channels", r"(.*/)?(root_conv|stage_\d+_unit_\d+/(conv_a|conv_b|conv_c"
                 r"|proj))/kernel", (None, None, None, "model")),
)


def _check_axis_name(value, name):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string; received "
                         f"{name}={value!r}")
    return value


def variable_shapes(model, **model_kwargs):
    """``{variable.path: shape}`` of ``model``: a keras_vit model, or a zoo
    name built with ``model_kwargs`` (those of :func:`keras_vit.zoo.load`)
    without allocating its weights.

    >>> shapes = variable_shapes("ViT-B/16", image_size=224, num_layers=1)
    >>> shapes["encoder_block_0/attention/query/kernel"]
    (768, 12, 64)
    """
    if not isinstance(model, str):
        if model_kwargs:
            raise ValueError(
                "model_kwargs are for building a model from its zoo name; "
                f"received model={type(model).__name__} and model_kwargs="
                f"{sorted(model_kwargs)}")
        if not hasattr(model, "weights"):
            raise ValueError("model must be a keras_vit model or a zoo name "
                             f"such as 'ViT-B/16'; received model={model!r}")
        return {v.path: tuple(v.shape) for v in model.weights}
    import keras

    from keras_vit import zoo

    # Built in a stateless scope, variables get a path and a shape but no
    # value. Keras would give them values at the next stateless scope's
    # exit, so they are taken off its list of variables waiting for one.
    with keras.StatelessScope(initialize_variables=False):
        built = zoo.load(model, weights=None, **model_kwargs)
        variables = list(built.weights)
    # Keras internals; if they move, the cost is memory, not results.
    with contextlib.suppress(compat.PrivateAPIError):
        compat.forget_deferred_variables(variables)
    return {v.path: tuple(v.shape) for v in variables}


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_rules(model, model_parallel=None, *, model_axis=MODEL_AXIS,
                 **model_kwargs):
    """The sharding rules of ``model``, backend-neutral:
    ``{regex on variable.path: axes}``, only rules that match a variable of
    this model. Variables no rule matches are replicated.

    Args:
        model: a keras_vit model, or a zoo name built with ``model_kwargs``
            (those of :func:`keras_vit.zoo.load`) without allocating weights.
        model_parallel: the size of the model axis, to check that it divides
            every split dimension.
        model_axis: the mesh axis name variables are split on.

    >>> import keras_vit
    >>> rules = layout_rules(keras_vit.vit(32, 8, 64, 1, 4, 128, 10))
    >>> rules["(.*/)?head/kernel"]
    ('model', None)
    """
    _check_axis_name(model_axis, "model_axis")
    if model_parallel is not None:
        check_int("model_parallel", model_parallel, low=1)
    shapes = variable_shapes(model, **model_kwargs)
    rules = {}
    splits = []  # (role, path, shape, axis) of every split variable
    for role, pattern, axes in _RULES:
        matched = [p for p in shapes if re.fullmatch(pattern, p)]
        if not matched:
            continue
        rules[pattern] = tuple(model_axis if a == "model" else a
                               for a in axes)
        axis = axes.index("model")
        splits += [(role, p, shapes[p], axis) for p in matched]
    if model_parallel is not None:
        _check_divides(model_parallel, splits)
    return rules


def _check_divides(n, splits):
    bad = [s for s in splits if s[2][s[3]] % n]
    if not bad:
        return
    role, path, shape, axis = bad[0]
    common = 0
    for _, _, s, a in splits:
        common = math.gcd(common, s[a])
    valid = _divisors(common)
    nearest = min(valid, key=lambda d: (abs(d - n), d))
    raise ValueError(
        f"model_parallel={n} does not divide {role}={shape[axis]} ({path} "
        f"has shape {shape} and is split on axis {axis}); model_parallel "
        f"must divide {common}, the nearest that does is {nearest} (any of "
        f"{valid})")


def _require_jax(what):
    from keras_vit.runtime.backend import name as backend_name

    backend = backend_name()
    if backend == "jax":
        return
    other = {"tensorflow": "use keras_vit.train.strategy(...) "
                           "(tf.distribute: mirrored, multi_worker, tpu)",
             "torch": "torch runs keras_vit on one device"}.get(
                 backend, "set KERAS_BACKEND=jax")
    raise StrategyError(
        f"{what} uses keras.distribution, which runs on the JAX backend "
        f"only; the backend is {backend!r}: set KERAS_BACKEND=jax before "
        f"Python starts, or {other}")


def _mesh_axis_size(device_mesh, axis, argument):
    import keras

    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            f"{argument} must be a keras.distribution.DeviceMesh; received "
            f"{argument}={device_mesh!r}")
    names = list(device_mesh.axis_names)
    if axis not in names:
        raise ValueError(
            f"{argument} has no axis named {axis!r} (its axes are {names}); "
            f"received {argument}={device_mesh!r}")
    return int(device_mesh.shape[names.index(axis)])


def layout_map(model, device_mesh, *, model_axis=MODEL_AXIS,
               **model_kwargs):
    """A :class:`keras.distribution.LayoutMap` that shards ``model``'s big
    weights over ``device_mesh``'s ``model_axis`` (JAX backend only).

    ``model`` is a keras_vit model or a zoo name with ``model_kwargs``
    (see :func:`layout_rules`). A model axis that does not divide a split
    dimension raises, naming the nearest size that does.

    >>> import keras, keras_vit
    >>> if keras.backend.backend() == "jax":
    ...     mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"))
    ...     lm = layout_map(keras_vit.vit(32, 8, 64, 1, 4, 128, 10), mesh)
    ...     assert lm["encoder_block_0/mlp/dense_0/kernel"].axes == (
    ...         None, "model")
    """
    import keras

    _require_jax("layout_map")
    n = _mesh_axis_size(device_mesh, model_axis, "device_mesh")
    rules = layout_rules(model, n, model_axis=model_axis, **model_kwargs)
    result = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in rules.items():
        result[pattern] = axes
    return result


def distribution(devices=None, *, model_parallel=1, model=None,
                 device_mesh=None, batch_axis=BATCH_AXIS,
                 model_axis=MODEL_AXIS, **model_kwargs):
    """A ``keras.distribution`` for training a keras_vit model (JAX only).

    ``model_parallel=1`` gives :class:`keras.distribution.DataParallel`
    over ``devices`` (a count of the first devices; default all).
    ``model_parallel=k`` gives :class:`keras.distribution.ModelParallel`
    on a (devices / k, k) mesh and :func:`layout_map` of ``model``.
    ``device_mesh`` gives the mesh instead of ``devices`` and
    ``model_parallel``.

    Set it before building the model: Keras places each variable when it
    is created.

    >>> import keras
    >>> if keras.backend.backend() == "jax":
    ...     d = distribution(1)
    ...     assert type(d).__name__ == "DataParallel"
    """
    import keras
    import numpy as np

    _require_jax("distribution")
    _check_axis_name(batch_axis, "batch_axis")
    _check_axis_name(model_axis, "model_axis")
    if device_mesh is not None:
        if devices is not None or model_parallel != 1:
            raise ValueError(
                "device_mesh replaces devices and model_parallel; received "
                f"device_mesh={device_mesh!r} with devices={devices!r}, "
                f"model_parallel={model_parallel!r}")
        _mesh_axis_size(device_mesh, batch_axis, "device_mesh")
        names = list(device_mesh.axis_names)
        model_parallel = (int(device_mesh.shape[names.index(model_axis)])
                          if model_axis in names else 1)
        mesh = device_mesh
    else:
        available = keras.distribution.list_devices()
        count = len(available) if devices is None else check_int(
            "devices", devices, low=1)
        if count > len(available):
            raise ValueError(
                f"devices={count} is more than the {len(available)} devices "
                f"JAX sees ({available}); received devices={devices!r}")
        check_int("model_parallel", model_parallel, low=1)
        if count % model_parallel:
            near = min(_divisors(count),
                       key=lambda d: (abs(d - model_parallel), d))
            raise ValueError(
                f"model_parallel={model_parallel} does not divide devices="
                f"{count}; the nearest that does is {near}")
        shape = (count // model_parallel, model_parallel)
        mesh = keras.distribution.DeviceMesh(
            shape, [batch_axis, model_axis],
            devices=np.array(available[:count]).reshape(shape))
    if model_parallel == 1:
        devs = np.asarray(mesh.devices).reshape(-1)
        return keras.distribution.DataParallel(
            device_mesh=keras.distribution.DeviceMesh(
                (devs.size,), [batch_axis], devices=devs))
    if model is None:
        raise ValueError(
            f"model_parallel={model_parallel} needs model= (a keras_vit model "
            "or a zoo name such as 'ViT-L/16') to know which weights to "
            "split; received model=None")
    return keras.distribution.ModelParallel(
        layout_map=layout_map(model, mesh, model_axis=model_axis,
                              **model_kwargs),
        batch_dim_name=batch_axis)
