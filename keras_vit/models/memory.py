"""How much host memory a model's forward pass or training step needs, and
the refusals that keep a few bytes of input (``--image-size 4000``) from
starting an allocation this machine cannot hold. The estimates are rough
upper bounds from the architecture; they decide only the cases that
clearly cannot fit.

>>> import keras_vit
>>> from keras_vit.models import memory
>>> vit = keras_vit.vit(32, 4, 64, 2, 2, 128, 10)
>>> round(memory.forward_estimate(vit, 8) / 2**20, 2)  # MiB
1.28
>>> memory.check_forward(vit, 8, available=2**30)  # fits: returns nothing
"""

from __future__ import annotations

import math

from keras_vit.base import geometry, options
from keras_vit.base.checks import check_pair
from keras_vit.base.limits import BATCH_MEMORY_SHARE, MEMORY_SLACK
from keras_vit.runtime import hardware
from keras_vit.runtime.hardware import available_memory


def check_weights_fit(num_params, settings, *, available=None):
    """Refuses a model whose weights alone (``num_params``, at 2 bytes
    each) exceed this machine's available memory, before anything is
    allocated. ``settings`` names the sizes that decide it, for the message.

    >>> check_weights_fit(86_000_000, "hidden_size=768", available=2**34)
    >>> check_weights_fit(10**12, "hidden_size=1000000", available=2**34)
    Traceback (most recent call last):
    ...
    ValueError: a model of hidden_size=1000000 has at least 1.00e+12 parameters, 1862.6 GiB of weights, more than the 16.0 GiB of memory available here; check the sizes (a config from a file is read as it is)
    """
    available = available_memory() if available is None else available
    need = 2 * int(num_params)
    if available is not None and need > available:
        raise ValueError(
            f"a model of {settings} has at least {num_params:.2e} "
            f"parameters, {need / 2**30:.1f} GiB of weights, more than the "
            f"{available / 2**30:.1f} GiB of memory available here; check "
            "the sizes (a config from a file is read as it is)")

# Bytes per value: float32 (a bf16 model keeps its softmax in float32).
_BYTES = 4


def _pixels(size):
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return h * w


def _resnet_values(image_size, stages, width_factor, remat=False):
    """Values per image a (BiT or hybrid) ResNet keeps for the backward
    pass: the root at 1/2 resolution, then about 5 values for each of a
    bottleneck unit's 6c channels. Measured on CPU (batch 8): BiT-R50x1 at
    128 px 578 MiB, this 444; R26+ViT-S/32 at 224 px 1025 MiB, this 1029.
    """
    width = 64 * width_factor
    pixels = _pixels(image_size) / 4
    values = 4 * width * pixels
    pixels /= 4  # after the stride-2 max-pool
    unit_values = []
    for s, units in enumerate(stages):
        if s:
            pixels /= 4
        unit_values += [(30 * width * 2 ** s * pixels,
                         4 * width * 2 ** s * pixels)] * units
    if remat:  # each unit's input, and one unit's activations again
        return (values + sum(kept for _, kept in unit_values)
                + max((full for full, _ in unit_values), default=0))
    return values + sum(full for full, _ in unit_values)


def _resnet_forward_values(image_size, width_factor):
    """Values per image live at once in a ResNet's forward pass: three of
    its largest maps (16w per pixel)."""
    return 3 * 16 * width_factor * _pixels(image_size)


def _encoder(model):
    """(config, tokens) of a ViT-style encoder, or (None, None)."""
    config = getattr(model, "encoder_config", None)  # masked patch prediction
    if config is None:
        config = model.get_config() if hasattr(model, "get_config") else {}
    names = ("num_layers", "hidden_size", "num_heads", "mlp_dim")
    grid = getattr(model, "grid_size", None)
    if grid is None or not all(n in config for n in names):
        return None, None
    tokens = grid[0] * grid[1] + geometry.prefix_tokens(config)
    # The MLP as wide as its first projection; extra maps per head as heads.
    maps = math.prod(row.score_maps(config.get(row.name, row.default))
                     for row in options.OPTIONS if row.score_maps)
    config = dict(config, mlp_dim=geometry.mlp_first_width(
        config["mlp_dim"], config.get("mlp", "gelu")),
        num_heads=config["num_heads"] * maps)
    return config, tokens


def _copies(config):
    """How many copies of a block the rows keep (side-by-side branches)."""
    return math.prod(row.block_copies(config.get(row.name, row.default))
                     for row in options.OPTIONS if row.block_copies)


def step_memory_estimate(model, images):
    """A rough upper estimate in bytes of the activations one training step
    keeps for the backward pass on ``images`` images (float32).

    A ViT block keeps about 12 N*D + 5 N*mlp + 3 heads*N^2 values per image
    (N tokens); a hybrid adds its ResNet (:func:`_resnet_values`). With
    ``remat=True`` each block keeps only its input, and one block's
    activations are live again. None for models it does not know.

    >>> import keras_vit
    >>> vit = keras_vit.vit(32, 4, 64, 2, 2, 128, 10)
    >>> round(step_memory_estimate(vit, 8) / 2**20, 2)  # MiB
    7.13
    """
    from keras_vit.models.common import remat_of

    remat = remat_of(model) if hasattr(model, "layers") else False
    if hasattr(model, "block_units"):  # BiT ResNetV2
        values = _resnet_values(model.image_size, model.block_units,
                                model.width_factor, remat)
        return _BYTES * images * values
    config, n = _encoder(model)
    if config is None:
        return None
    head = 0
    if getattr(model, "encoder_config", None) is not None:
        head = 3 * model.num_patches * int(model.outputs[0].shape[-1])
    per_block = _copies(config) * (
        12 * n * config["hidden_size"] + 5 * n * config["mlp_dim"]
        + 3 * config["num_heads"] * n * n)
    if remat:
        values = (config["num_layers"] * n * config["hidden_size"]
                  + per_block + head)
    else:
        values = config["num_layers"] * per_block + head
    resnet = config.get("resnet")
    if resnet:
        values += _resnet_values(config["image_size"],
                                 geometry.hybrid_stages(resnet),
                                 resnet.get("width_factor", 1), remat)
    return _BYTES * images * values


# How check_step names the settings it suggests (the command line passes
# its flags).
API_NAMES = {"micro_batch_size": "micro_batch_size=",
             "batch_size": "batch_size", "image_size": "the image size",
             "skip": "check_memory=False", "remat": "remat=True"}


def check_step(model, images, *, per_replica=None, batch_size=None,
               image_size=None, available=None, names=None):
    """Refuses (``ValueError``) a CPU training step of ``images`` images
    (per device) whose activations (:func:`step_memory_estimate`) clearly
    cannot fit the available memory (over 1.5x of it), saying what to
    change. ``names`` spells those settings (default :data:`API_NAMES`).
    Accelerator runs are checked only if ``available`` is given.

    >>> import keras_vit
    >>> vit = keras_vit.vit(32, 4, 64, 2, 2, 128, 10)
    >>> check_step(vit, 8, available=2**30)  # fits: returns nothing
    >>> check_step(vit, 64, batch_size=64, available=2**22)
    Traceback (most recent call last):
    ...
    ValueError: a training step of 64 images of vision_transformer at ...; \
set micro_batch_size=... or lower batch_size (now 64) or the image size, \
or pass check_memory=False to try anyway
    """
    names = dict(API_NAMES, **(names or {}))
    if available is None and not _on_cpu():
        return
    available = available_memory() if available is None else available
    need = step_memory_estimate(model, images)
    if available is None or need is None or need <= 1.5 * available:
        return
    per_image = need / images
    per_replica = images if per_replica is None else per_replica
    fits = [m for m in range(1, per_replica + 1)
            if per_replica % m == 0 and m * per_image <= available / 2]
    hint = (f"set {names['micro_batch_size']}{fits[-1]} (gradient "
            "accumulation: the same updates, less memory), or "
            if fits else "")
    from keras_vit.models.common import remat_of, set_remat

    if (hasattr(model, "layers") and not remat_of(model)
            and any(hasattr(layer, "_forward") for layer in model.layers)):
        set_remat(model, True)
        try:
            with_remat = step_memory_estimate(model, images)
        finally:
            set_remat(model, False)
        if with_remat is not None and with_remat <= available:
            hint = (f"{hint}set {names['remat']} (rematerialised blocks: "
                    f"about {with_remat / 2**30:.1f} GiB, the same "
                    "gradients, about one more forward pass a step), or ")
    now = f" (now {batch_size})" if batch_size is not None else ""
    raise ValueError(
        f"a training step of {images} images of {_describe(model)} needs "
        f"about {need / 2**30:.1f} GiB of activations (an estimate) but "
        f"this machine has {available / 2**30:.1f} GiB available; {hint}"
        f"lower {names['batch_size']}{now} or {names['image_size']}, or "
        f"pass {names['skip']} to try anyway")


def _output_values(model):
    """Values per image in the model's outputs."""
    total = 0
    for out in getattr(model, "outputs", None) or ():
        shape = tuple(getattr(out, "shape", ()) or ())[1:]
        if shape and all(isinstance(d, int) for d in shape):
            total += math.prod(shape)
    return total


def forward_estimate(model, images, patches=None):
    """A rough upper estimate in bytes of what one inference forward pass
    of ``images`` images (of ``patches`` patches each: a NaFlex batch's;
    None: the model's grid) holds at its peak: one block's activations
    (or a ResNet's largest maps) plus the model's outputs.

    >>> import keras_vit
    >>> big = keras_vit.vit(4000, 16, 768, 12, 12, 3072, 1000)
    >>> round(forward_estimate(big, 1) / 2**30, 1)  # GiB: 62,501 tokens
    350.3
    """
    values = _output_values(model)
    if hasattr(model, "block_units"):  # BiT ResNetV2
        values += _resnet_forward_values(model.image_size, model.width_factor)
        return _BYTES * images * values
    config, n = _encoder(model)
    if config is None:
        return _BYTES * images * values if values else None
    if patches is not None:  # the batch's patches, not the table's grid
        n += int(patches) - model.grid_size[0] * model.grid_size[1]
    d, mlp, heads = (config["hidden_size"], config["mlp_dim"],
                     config["num_heads"])
    values += _copies(config) * max(2 * heads * n * n + 6 * n * d,
                                    2 * n * mlp + 3 * n * d)
    resnet = config.get("resnet")
    if resnet:
        values = max(values, _resnet_forward_values(
            config["image_size"], resnet.get("width_factor", 1)))
    return _BYTES * images * values


def _on_cpu():
    return hardware.detect().accelerator == "cpu"


def _describe(model):
    name = getattr(model, "zoo_name", None) or getattr(model, "name", "model")
    shape = tuple(getattr(model, "inputs", [None])[0].shape or ())
    size = f" at {shape[1]}x{shape[2]}" if len(shape) == 4 else ""
    _, tokens = _encoder(model)
    return f"{name}{size}" + (f" ({tokens:,} tokens)" if tokens else "")


def forward_batch(model, wanted, *, option="--image-size", available=None):
    """The largest batch, at most ``wanted``, whose forward pass fits in
    half of this machine's available memory (at least 1). A model that
    clearly cannot run even one image is refused (``ValueError``) naming
    ``option``.

    >>> import keras_vit
    >>> big = keras_vit.vit(4000, 16, 768, 12, 12, 3072, 1000)
    >>> forward_batch(big, 16, available=2**34)
    Traceback (most recent call last):
    ...
    ValueError: one image through vision_transformer at 4000x4000 (62,501 tokens) needs about ...
    """
    wanted = int(wanted)
    per_image = forward_estimate(model, 1)
    if per_image is None or (available is None and not _on_cpu()):
        return wanted
    available = available_memory() if available is None else available
    if available is None:
        return wanted
    if per_image > MEMORY_SLACK * available:
        raise ValueError(
            f"one image through {_describe(model)} needs about "
            f"{per_image / 2**30:.1f} GiB in its forward pass (an estimate: "
            "the attention maps grow with the square of the tokens), more "
            f"than the {available / 2**30:.1f} GiB of memory available "
            f"here; lower {option}")
    return max(1, min(wanted, int(available * BATCH_MEMORY_SHARE
                                   // per_image)))


def check_input_batch(count, shape, *, hint, bytes_per_value=4,
                      available=None):
    """Refuses (``ValueError``) ``count`` input images of ``shape`` that
    alone would take more than half of this machine's available memory;
    ``hint`` says what to lower.

    >>> check_input_batch(8, (224, 224, 3), hint="lower the batch",
    ...                   available=2**30)
    >>> check_input_batch(10**4, (224, 224, 3), hint="lower the batch",
    ...                   available=2**30)
    Traceback (most recent call last):
    ...
    ValueError: a batch of 10000 images of shape (224, 224, 3) needs 5.6 GiB, more than half of the 1.0 GiB of memory available here; lower the batch
    """
    shape = tuple(int(d) for d in shape)
    need = int(count) * math.prod(shape) * int(bytes_per_value)
    available = available_memory() if available is None else available
    if available is not None and need > available * BATCH_MEMORY_SHARE:
        raise ValueError(
            f"a batch of {count} images of shape {shape} "
            f"needs {need / 2**30:.1f} GiB, more than half of the "
            f"{available / 2**30:.1f} GiB of memory available here; {hint}")


def check_forward(model, images, *, available=None, patches=None):
    """Refuses (``ValueError``) a forward pass of ``images`` images that
    clearly cannot fit this machine's available memory, on CPU, before it
    is allocated. ``patches``: a NaFlex batch's patches per image."""
    if available is None and not _on_cpu():
        return
    need = forward_estimate(model, int(images), patches)
    if need is None:
        return
    available = available_memory() if available is None else available
    if available is None or need <= MEMORY_SLACK * available:
        return
    per_image = need / int(images)
    fits = int(available * BATCH_MEMORY_SHARE // per_image)
    hint = (f"a batch of at most {fits} image(s) fits"
            if fits >= 1 else "lower the image size")
    raise ValueError(
        f"a forward pass of {int(images)} image(s) through "
        f"{_describe(model)} needs about {need / 2**30:.1f} GiB (an "
        f"estimate), more than the {available / 2**30:.1f} GiB of memory "
        f"available here; {hint}")


def config_estimate(config):
    """A rough upper estimate in bytes of what a model of ``config`` (the
    builder's arguments) needs to run one image: ``{"weights", "position
    table", "activations", "tokens"}``, before anything is built. None for
    a config it does not know.

    >>> est = config_estimate(dict(image_size=224, patch_size=16,
    ...     hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072,
    ...     num_classes=1000))
    >>> round(est["weights"] / 2**20), est["tokens"]
    (330, 197)
    """
    try:
        h, w = check_pair("image_size", config.get("image_size", 224))
        patch = check_pair("patch_size", config.get("patch_size", 16))
    except ValueError:  # not a size: the builder refuses it, naming it
        return None
    classes = int(config.get("num_classes") or 0) * bool(
        config.get("include_top", True))
    channels = int(config.get("num_channels", 3))
    if "block_units" in config:  # BiT ResNetV2
        width = float(config.get("width_factor", 1))
        params = geometry.parameter_count(config)
        if params is None:  # bottleneck units of ~17 c^2 weights each
            params = sum(units * 17 * (64 * width * 2 ** s) ** 2
                         for s, units in enumerate(config["block_units"]))
            params += 4 * 64 * width * 2 ** 3 * classes
        return {"weights": _BYTES * params, "position table": 0,
                "activations": _BYTES * _resnet_forward_values((h, w), width),
                "tokens": 0}
    names = ("hidden_size", "num_layers", "num_heads", "mlp_dim")
    if not all(isinstance(config.get(n), int) for n in names):
        return None
    d, layers, heads, mlp = (config[n] for n in names)
    resnet = config.get("resnet")
    stride = geometry.hybrid_stride(resnet)
    params = 0
    if resnet:
        stages = geometry.hybrid_stages(resnet)
        width = float(resnet.get("width_factor", 1))
        params = sum(units * 17 * (64 * width * 2 ** s) ** 2
                     for s, units in enumerate(stages))
        channels = int(64 * width * 2 ** max(0, len(stages) - 1)) * (
            4 if stages else 1)
    grid = (h // (stride * patch[0])) * (w // (stride * patch[1]))
    tokens = grid + geometry.prefix_tokens(config)
    table = tokens * d if config.get(
        "position_embedding", "learned_1d") == "learned_1d" else 0
    rep = config.get("representation_size") or 0
    params += (patch[0] * patch[1] * channels * d + layers * (
        4 * d * d + 2 * d * mlp) + rep * d + classes * (rep or d))
    values = max(2 * heads * tokens * tokens + 6 * tokens * d,
                 2 * tokens * mlp + 3 * tokens * d)
    if config.get("naflex"):  # its own patches decide its activations
        values = 0
    if resnet:
        values = max(values, _resnet_forward_values((h, w), width))
    exact = geometry.parameter_count(config)
    return {"weights": _BYTES * (params + table if exact is None else exact),
            "position table": _BYTES * table,
            "activations": _BYTES * values, "tokens": tokens}


def check_config(config, where, *, name=None, available=None):
    """Refuses (``ValueError`` naming ``where``) a model of ``config``
    whose weights and one image's forward pass clearly cannot fit this
    machine's available memory, before anything is built. The activations
    count on CPU only. ``name`` describes the model in the message.

    >>> check_config(dict(image_size=4000, patch_size=16, hidden_size=768,
    ...     num_layers=12, num_heads=12, mlp_dim=3072), "config.json",
    ...     name="ViT-B/16", available=2**34)
    Traceback (most recent call last):
    ...
    ValueError: config.json: ViT-B/16 at 4000x4000 (62,501 tokens) needs about ...
    """
    est = config_estimate(config)
    if est is None:
        return
    available = available_memory() if available is None else available
    if available is None:
        return
    need = est["weights"] + est["activations"]
    if need <= MEMORY_SLACK * available:
        return
    if est["activations"] > est["weights"] and not _on_cpu():
        need = est["weights"]
        if need <= MEMORY_SLACK * available:
            return
    h, w = check_pair("image_size", config.get("image_size", 224))
    what = (f"{name or config.get('name') or 'the model'} at {h}x{w}"
            + (f" ({est['tokens']:,} tokens)" if est["tokens"] else ""))
    if est["activations"] + est["position table"] >= est["weights"] - (
            est["position table"]):
        hint = "lower --image-size (image_size= in Python)"
    else:
        names = [n for n in ("num_layers", "hidden_size", "mlp_dim",
                             "num_classes", "block_units", "width_factor")
                 if n in config]
        what += " with " + ", ".join(f"{n}={config[n]!r}" for n in names)
        hint = "check the sizes (a config from a file is read as it is)"
    raise ValueError(
        f"{where}: {what} needs about {need / 2**30:.1f} GiB (an estimate: "
        f"{est['weights'] / 2**30:.2f} GiB of weights, of them "
        f"{est['position table'] / 2**30:.2f} the position table; "
        f"{est['activations'] / 2**30:.2f} GiB of one image's "
        f"activations), more than the {available / 2**30:.1f} GiB of memory "
        f"available here; {hint}")


def infer(model, inputs):
    """``model(inputs, training=False)`` without gradients, as NumPy,
    after :func:`check_forward`.

    >>> import numpy as np, keras_vit
    >>> m = keras_vit.vit(32, 8, 16, 2, 2, 32, 3)
    >>> infer(m, np.zeros((1, 32, 32, 3), "float32")).shape
    (1, 3)
    """
    from keras_vit.runtime.backend import no_grad, to_numpy

    if isinstance(inputs, dict):  # a NaFlex batch: its patches decide
        count, patches = inputs["patches"].shape[:2]
        check_forward(model, count, patches=patches)
    else:
        check_forward(model, len(inputs))
    with no_grad():
        return to_numpy(model(inputs, training=False))
