"""What the bad-input and fault tests of several modules share: the tiny
ViT they build (and tests/conftest.py's ``tiny_keras`` saves), the hostile
files they write (odd images, FIFOs, image folders, JPEGs, a safetensors
file with any header), and the two checks of a refusal: one error line and
no traceback (:func:`one_error_line`), and an error that names the
argument, echoes the value and, where a valid value is near, suggests it
(:func:`check_error`; :func:`bad_calls_test` for the tables of bad calls
each module's test file keeps); for the tests that kill a child process,
:func:`killed_when_ready` and :func:`wait_until`."""

import contextlib
import json
import os
import signal
import struct
import time

import keras
import pytest

import keras_vit

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
# The ViT family's options at once, on top of any tiny ViT: registers
# without a class token, the attention-pool (MAP) head, pre-norm, q/k
# norms, layer scale, no biases, the gated MLP, a norm after the patch
# embedding, RMSNorm for every norm, norms inside the MLP and the
# attention, EVA-02's
# rotary embeddings (adjacent pairs turned, coordinates scaled to another
# grid) beside the position table. The contract tests that hold for the
# 2020 ViT (Keras' features, every export, remat, mixed precision, any
# input size) run on this model too.
FAMILY_OPTIONS = dict(
    classifier="map", class_token=False, num_registers=2,
    posemb_includes_prefix=False, pre_norm=True, patch_bias=False,
    layer_scale=0.5, qk_norm=True, qkv_bias=False, proj_bias=False,
    mlp="swiglu", gelu="exact", layer_norm_epsilon=1e-5, patch_norm=True,
    norm="rms", rope="eva02", rope_grid=[3, 5], mlp_norm=True,
    attention_norm=True)
# Each option row: a value other than its default, with what else it
# needs to build (the checks between options); tests/models/
# test_option_rows.py proves each row with its example.
OPTION_EXAMPLES = {
    "class_token": (True, dict(classifier="gap")),
    "num_registers": (2, {}),
    "posemb_includes_prefix": (False, {}),
    "fc_norm": (True, dict(classifier="gap")),
    "final_norm": (False, {}),
    "pre_norm": (True, {}),
    "layer_scale": (0.1, {}),
    "qk_norm": (True, {}),
    "qkv_bias": (False, {}),
    "proj_bias": (False, {}),
    "patch_bias": (False, {}),
    "drop_path_rate": (0.1, {}),
    "distilled": (True, {}),
    "mlp": ("swiglu", {}),
    "norm": ("rms", {}),
    "patch_norm": (True, {}),
    "head_type": ("projection", {}),
    "rope": ("mixed", {}),
    "rope_temperature": (10000.0, dict(rope="dinov3")),
    "rope_grid": ([3, 5], dict(rope="eva02")),
    "mlp_norm": (True, {}),
    "attention_norm": (True, {}),
    "rope_offset": (1.0, dict(rope="eva02")),
    "rope_indexing": ("xy", dict(rope="eva02")),
    "rope_halves": (True, dict(rope="eva02")),
    "post_norm": (True, {}),
    "relative_bias": ("block", dict(class_token=True)),
    "merge_size": (2, dict(classifier="gap", class_token=False)),
    "merge_width": (8, dict(merge_size=2, classifier="gap",
                            class_token=False)),
    "pool_heads": (4, dict(classifier="map", class_token=False)),
    "pool_prefix": (True, dict(classifier="gap", num_registers=1)),
    "pool_form": ("aimv2", dict(classifier="map", class_token=False)),
    "naflex": (True, dict(classifier="map", class_token=True)),
    "position_resize": ("bicubic_aa", dict(naflex=True, classifier="gap",
                                           class_token=False)),
    "differential": ("vectors", dict(qk_norm=True)),
    "parallel": ("fused", dict(layer_scale=0.5)),
    "conv_stem": (True, {}),
    "position_aspect": (True, dict(naflex=True, classifier="gap",
                                   class_token=False)),
    # SAM's: windows of 3 over a grid they do not divide (padded), a
    # global block, the decomposed tables of both, the neck.
    "window_size": (3, dict(classifier="gap", class_token=False,
                            decomposed_bias=True)),
    "global_blocks": ([0], dict(window_size=3, decomposed_bias=True,
                                classifier="gap", class_token=False)),
    "decomposed_bias": (True, dict(classifier="gap", class_token=False)),
    "neck": (8, dict(classifier="gap", class_token=False, window_size=3)),
    "relative_mlp": ("block", dict(num_registers=1)),
    "relative_mlp_width": (16, dict(relative_mlp="shared")),
    # Gemma 4's.
    "sandwich_norm": (True, {}),
    "value_norm": (True, {}),
    "position_axes": (8, {}),
    "clip_linears": (True, dict(mlp="geglu")),
    "soft_pool": (2, dict(classifier="gap", class_token=False)),
    "soft_pool_standardize": (True, dict(soft_pool=2, classifier="gap",
                                         class_token=False)),
    # DeepSeek's.
    "mlp_bias": (False, {}),
    # timm's ParallelThingsBlock.
    "branches": (2, dict(layer_scale=0.5)),
    "pooled_norm": (True, dict(classifier="gap")),
}


def option_groups(image_size=32, patch_size=8, hidden_size=32,
                  num_layers=2, num_heads=2, mlp_dim=64, num_classes=5):
    """Every row's example (OPTION_EXAMPLES) in a few models: the rows in
    name order, each joining the first group whose arguments it agrees
    with and whose model, with it, the builder's checks accept, else
    starting one. A list of ``(rows, builder arguments)``; a row added
    to the table joins a group without a line changed.

    >>> groups = option_groups()
    >>> sorted(r for rows, _ in groups for r in rows) == sorted(OPTION_EXAMPLES)
    True
    """
    from keras_vit.base import options
    from keras_vit.models.encoder import check_vit_args
    from keras_vit.models.positions import check_dynamic_image_size

    def builds(kwargs):
        family = {o.name: kwargs.get(o.name, o.default)
                  for o in options.OPTIONS}
        try:
            check_vit_args(image_size, patch_size, hidden_size, num_layers,
                           num_heads, mlp_dim, num_classes,
                           kwargs.get("classifier", "token"), None, 0.0, 0.0,
                           True, None, 3, None, "learned_1d", "stem", family)
            check_dynamic_image_size(False, "learned_1d", family)
        except ValueError:
            return False
        return True

    groups = []
    for name in sorted(OPTION_EXAMPLES):
        want = option_row(name)
        for rows, kwargs in groups:
            if all(kwargs.get(k, v) == v for k, v in want.items()) and (
                    builds(dict(kwargs, **want))):
                rows.append(name)
                kwargs.update(want)
                break
        else:
            groups.append(([name], dict(want)))
    return groups


def option_row(name):
    """The builder arguments that set option row ``name`` to its example
    (OPTION_EXAMPLES): the value and what else it needs to build."""
    value, needs = OPTION_EXAMPLES[name]
    return dict(needs, **{name: value})


def randomise_keras(model, seed=0):
    """Random weights of a sensible scale for a Keras ``model``: norms'
    scales near one, biases and vectors small, kernels over the square
    root of their fan-in (a zero head, as built, would hide every error)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for var in model.weights:
        shape = tuple(var.shape)
        name = var.path.split("/")[-1]
        if name in ("gamma", "scale"):
            value = 1 + 0.1 * rng.standard_normal(shape)
        elif name == "moving_variance":  # a BatchNorm's: positive
            value = 1 + 0.1 * np.abs(rng.standard_normal(shape))
        elif name == "clip":  # clamp bounds: [min, max, min, max] rows
            value = (1 + np.abs(rng.standard_normal(shape))) * np.array(
                [-1, 1, -1, 1])
        elif name in ("beta", "bias") or len(shape) < 2:
            value = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[:-1])) or 1
            if name == "kernel" and len(shape) == 3 and "out" in var.path:
                fan_in = shape[0] * shape[1]
            elif name == "kernel" and len(shape) == 3:
                fan_in = shape[0]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        var.assign(value.astype(var.dtype))
    return model


class _StaysFrozen:
    """The ``gc`` module as keras_vit.models.quantization sees it under
    :func:`frozen_heap`: ``unfreeze`` leaves the frozen objects frozen."""

    def __getattr__(self, name):
        import gc

        return getattr(gc, name)

    @staticmethod
    def unfreeze():
        pass


@contextlib.contextmanager
def frozen_heap():
    """Each ``quantize`` (and each quantized model loaded) freezes the heap,
    quantizes, unfreezes it and runs one full garbage collection
    (keras_vit.models.quantization): ~0.6 s in a test process holding the
    backend's modules and the suite's. Inside this block what is frozen
    stays frozen until the block ends, so that each collection scans only
    what was made since the last quantize; the numbers are the same. For a
    module-scoped fixture of a module that quantizes many models."""
    import gc

    from keras_vit.models import quantization

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantization, "gc", _StaysFrozen())
        yield
    gc.unfreeze()


QUICK = dict(batch_size=8, crop_area=None, flip=False, log_every=1,
             verbose=False, strategy="default")


def tiny(seed=1, **kwargs):
    """A tiny ViT (TINY, with ``kwargs``) drawn from ``seed``."""
    keras.utils.set_random_seed(seed)
    return keras_vit.vit(**dict(TINY, **kwargs))


def tiny_vit(**kwargs):
    """A tiny ViT (TINY, with ``kwargs``) from the current random state."""
    return keras_vit.vit(**dict(TINY, **kwargs))


def cached_tiny_vit():
    """One tiny ViT per process, for the calls refused before using it."""
    if not hasattr(cached_tiny_vit, "model"):
        cached_tiny_vit.model = tiny_vit()
    return cached_tiny_vit.model


def model_input(model, x):
    """``x`` (a batch of images) as ``model`` takes it: a NaFlex model
    (the ``naflex`` row) takes each image cut into patches as it is, with
    four patches of padding after them (so that every path meets the
    padding mask); other models the images."""
    config = model.get_config()
    if not config.get("naflex") or isinstance(x, dict):
        return x
    from keras_vit.data import naflex

    patch = config["patch_size"]
    count = (x.shape[1] // patch) * (x.shape[2] // patch)
    return naflex.patchify(x, patch, max_patches=count + 4, resize=False)


def forward(model, x):
    """``model(x, training=False)`` as NumPy, on JAX as one jitted program
    of the model as it is now. An eager first call on JAX compiles every
    op of the model as a program of its own (about 100 small XLA programs
    for a tiny model of tests/models: 1-6 s of CPU); one program is
    0.3-1.2 s, and an identical one (a copy of a model, a
    reloaded file, a remat twin in inference) comes from the run's JAX
    compilation cache (tests/conftest.py). A new ``jax.jit`` each call:
    nothing traced before a quantize, LoRA or dtype policy change can
    answer for the model after it. Elsewhere the model is called."""
    import numpy as np

    x = model_input(model, x)
    if keras.backend.backend() != "jax":
        return keras.ops.convert_to_numpy(model(x, training=False))
    import jax

    def call(trainable, non_trainable, images):
        return model.stateless_call(trainable, non_trainable, images,
                                    training=False)[0]

    return np.asarray(jax.jit(call)(
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables], x))


def check_error(message, name, echoed, hint):
    """``message`` names the argument ``name``, echoes the value ``echoed``
    and gives ``hint``: checked as "Did you mean '<hint>'" for a bare
    value, verbatim for other text (a range, a sentence); None for none."""
    assert name in message, message
    assert echoed in message, message
    if hint is None:
        return
    if hint.startswith(("Did you", "did you")) or any(
            c in hint for c in " ([.") or hint == "positive":
        assert hint in message, message
    else:
        assert f"Did you mean {hint!r}" in message, message


def bad_calls_test(rows):
    """The test of a table of bad calls, one test per row named by its
    label: rows of (label, call, argument named, value echoed, hint), each
    ``call()`` raising a ValueError, TypeError or OSError whose message
    passes :func:`check_error`. A test file keeps its own table and binds
    the test to a ``test_`` name of its module, where pytest collects it."""

    @pytest.mark.parametrize("label, call, name, echoed, hint", rows,
                             ids=[row[0] for row in rows])
    def test(label, call, name, echoed, hint):
        with pytest.raises((ValueError, TypeError, OSError)) as info:
            call()
        check_error(str(info.value), name, echoed, hint)

    return test


def one_error_line(capsys):
    """The command's stderr: one line and no traceback; returns the line."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@contextlib.contextmanager
def killed_when_ready(proc, ready, timeout=30):
    """Waits for the child ``proc`` (started with ``stdout=PIPE`` and
    ``text=True``) to print the line ``ready``, runs the block (checks of
    the state the child leaves while it lives), then kills it with SIGKILL,
    so that no Python cleanup runs in it, and reaps it within ``timeout``
    seconds. A child still running when anything fails is killed too."""
    try:
        assert proc.stdout.readline().strip() == ready
        yield
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def wait_until(done, seconds=20, poll=0.05):
    """Polls ``done()`` every ``poll`` seconds until it is true or
    ``seconds`` have passed (what a killed child leaves is cleaned up by
    another process, a little later)."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(poll)


def odd_image(path, kind):
    """Writes an odd image of ``kind`` at ``path``: not an image ("text"),
    "empty", a "folder", or a valid one of an odd mode or size."""
    from PIL import Image

    if kind == "text":
        path.write_text("not an image")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder":
        path.mkdir()
    else:
        mode, size = {"gray16": ("I;16", 20), "rgba": ("RGBA", 20),
                      "cmyk": ("CMYK", 20), "palette": ("P", 20),
                      "one_pixel": ("RGB", 1)}[kind]
        Image.new(mode, (size, size)).save(
            path, "JPEG" if kind == "cmyk" else "PNG")


def fifo(path):
    """A FIFO (named pipe) at ``path``: opening it blocks until something
    writes to it. Skips the test where the platform has none."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(path)
    return path


def class_folders(root, per_class):
    """``root/a`` and ``root/b`` with ``per_class`` tiny PNGs each."""
    from PIL import Image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(root / c / f"{i}.png")
    return root


def jpeg(path, size, color=(200, 30, 30)):
    """A one-colour JPEG of ``size`` (width, height) at ``path``."""
    from PIL import Image

    Image.new("RGB", size, color).save(path, quality=90)


def safetensors(path, header, data=b"\0" * 24, length=None):
    """A .safetensors file: ``header`` (JSON-encoded unless bytes), its
    length (or ``length``, which may lie) before it, ``data`` after it."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length)
                     + raw + data)
    return path


# One valid tensor entry of a safetensors header: 2x3 float32, 24 bytes.
TENSOR = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}


# -- timm's models as the reference (the family's loaders and writers) ------

def random_timm_model(arch, size, num_classes, depth=1, **kwargs):
    """timm's ``arch`` at ``depth`` blocks and ``size`` pixels (timm's
    own ``model_args``: the real layout, any depth), every parameter random,
    norms and layer scales too (a zero or unit one would hide a swap)."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, depth=depth,
                              img_size=size, num_classes=num_classes,
                              **kwargs)
    return randomise_torch(model, seed=None)


def timm_from_file(arch, folder, num_classes, **kwargs):
    """timm's ``arch`` loading ``folder``'s ``model.safetensors`` through
    its own checkpoint filter (which resizes what another size needs), as
    ``timm.create_model(pretrained=True)`` does; in eval mode. The head's
    size is given twice: timm drops a head whose size differs from its
    pretrained_cfg's."""
    import timm

    return timm.create_model(
        arch, pretrained=True, num_classes=num_classes,
        pretrained_cfg_overlay=dict(file=str(folder / "model.safetensors"),
                                    num_classes=num_classes),
        **kwargs).eval()


def randomise_torch(model, seed=0, scale=0.2):
    """Every parameter of the torch ``model`` drawn from N(0, scale), norms
    and layer scales too (a zero or unit one would hide a swap), from
    ``seed`` (None: torch's current state); in eval mode."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return model.eval()


def random_images(size, n=2, width=None):
    """``n`` (size, ``width`` or size, 3) float32 images in [-1, 1]."""
    import numpy as np

    return np.random.default_rng(1).uniform(
        -1, 1, (n, size, width or size, 3)).astype("float32")


def timm_forward(model, x):
    """A torch model's outputs for NHWC NumPy images."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()


def assert_relative(ours, theirs, rtol=1e-5, atol=0.0):
    """Equal to the source library's outputs ``theirs`` within ``rtol`` of
    their largest magnitude (plus ``atol``), same shape."""
    import numpy as np

    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= rtol * scale + atol, (
        np.abs(ours - theirs).max(), scale)


def assert_close_to_timm(ours, theirs):
    """Equal to timm's logits within 1e-5 of their scale."""
    assert_relative(ours, theirs, 1e-5, 1e-6)


def load_script(path, name=None):
    """The module of the script at ``path`` (a benchmark), loaded by path
    as the tests use it, its folder on ``sys.path`` for its siblings."""
    import importlib.util
    import os
    import sys

    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = name or os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def randomise_weights(layer, seed=1, scale=0.5):
    """Every weight of ``layer`` drawn anew from N(0, scale): biases start
    at zero and norm scales at one, so a term a layer left out of its
    math would not show against a reference until they are redrawn."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for var in layer.weights:
        var.assign(rng.normal(size=tuple(var.shape)).astype("float32")
                   * scale)


def weights_below(layer):
    """``layer``'s weights by their path below the layer, in float64."""
    import numpy as np

    prefix = layer.path + "/"
    return {v.path[len(prefix):]:
            np.asarray(keras.ops.convert_to_numpy(v.value), "float64")
            for v in layer.weights}


def assert_features_are_timms(ours, theirs, images, prefix_tokens=True):
    """``ours.intermediate_model`` of the first and last of two blocks
    equal to timm's ``forward_intermediates`` of ``theirs`` (its NCHW
    maps transposed), the prefix tokens too with ``prefix_tokens``."""
    import keras
    import numpy as np
    import torch

    features = ours.intermediate_model([0, -1], prefix_tokens=prefix_tokens)(
        images)
    with torch.no_grad():
        timms = theirs.forward_intermediates(
            torch.from_numpy(images).permute(0, 3, 1, 2), indices=[0, 1],
            intermediates_only=True,
            **({"return_prefix_tokens": True} if prefix_tokens else {}))
    for i, found in enumerate(timms):
        maps, prefix = found if prefix_tokens else (found, None)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(features[f"block_{i}"]),
            maps.numpy().transpose(0, 2, 3, 1), atol=1e-4, rtol=0)
        if prefix_tokens:
            np.testing.assert_allclose(
                keras.ops.convert_to_numpy(features[f"block_{i}_prefix"]),
                prefix.numpy(), atol=1e-4, rtol=0)


def assert_refused_naming(repo, named, model_args=(), **fields):
    """``zoo.load`` of the timm folder ``repo`` with its ``config.json``'s
    ``model_args`` updated by ``model_args`` and its fields by ``fields``
    refused in one line (a FormatError) that names ``named``."""
    import json

    import pytest

    from keras_vit import zoo
    from keras_vit.zoo.formats import FormatError

    config = json.loads((repo / "config.json").read_text())
    config.setdefault("model_args", {}).update(model_args)
    config.update(fields)
    (repo / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError) as e:
        zoo.load(str(repo))
    message = str(e.value)
    assert named in message and "\n" not in message, message


def transformers_forward(model, x):
    """A transformers image model's output on NHWC NumPy images."""
    import numpy as np
    import torch

    pixels = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    with torch.no_grad():
        return model(pixel_values=pixels)


def transformers_folders(tmp_path_factory, config_class, model_class, sizes,
                         cases):
    """Each of ``cases`` (id -> (config fields, ...)) built as
    ``model_class(config_class(**sizes, **fields))`` with random
    parameters and saved by transformers: id -> (folder, torch model)."""
    out = {}
    for seed, (key, (fields, *_)) in enumerate(cases.items()):
        model = randomise_torch(model_class(config_class(**sizes, **fields)),
                                seed)
        path = tmp_path_factory.mktemp("hf") / key
        model.save_pretrained(path, safe_serialization=True)
        out[key] = path, model
    return out


def transformers_folder_with(folder, tmp_path, **fields):
    """A copy of the transformers folder ``folder`` (its weights and
    config.json) with ``fields`` set in its config, under ``tmp_path``."""
    import shutil
    from pathlib import Path

    folder = Path(folder)
    copy = Path(tmp_path) / f"{folder.name}_{'_'.join(fields)}"
    copy.mkdir(parents=True)
    shutil.copy(folder / "model.safetensors", copy / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(config, **fields)))
    return copy


def assert_config_refused(folder, error, match):
    """Loading the transformers ``folder`` stops with ``error`` matching
    ``match``, in one line that names its config.json."""
    from pathlib import Path

    with pytest.raises(error, match=match) as info:
        keras_vit.zoo.load(str(folder))
    assert str(Path(folder) / "config.json") in str(info.value)
    assert "\n" not in str(info.value)
