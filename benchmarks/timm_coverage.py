"""How much of timm's ViT family keras_vit loads: every architecture of
timm's three ViT modules (``vision_transformer``, ``deit``,
``vision_transformer_hybrid``), built by timm at depth 1 with random
weights, written by timm's own ``save_for_hf`` (``config.json`` +
``model.safetensors``), read by ``keras_vit.zoo.load`` and run on one
random batch beside timm. Prints a markdown table of what loads and what
is refused, feature by feature, counting timm's pretrained tags.

    python benchmarks/timm_coverage.py --out docs/coverage-timm.md
    python benchmarks/timm_coverage.py --only 'deit*' --limit 3   # seconds
    python benchmarks/timm_coverage.py --from rows.json   # re-render
    python benchmarks/timm_coverage.py --write-table zoo/timm/architectures.json

Each architecture ends in one class:

- loaded-exact: keras_vit's logits equal timm's within 1e-5 of their
  scale (1e-4 for the ResNet hybrids, whose backbone sums more terms);
- loaded-but-differs: it loads and its logits are wrong (a bug: silently
  wrong), or it loads and cannot run;
- refused: ``zoo.load`` raises; the message is kept;
- too large for the walk: over 500M parameters at depth 1 (counted on
  PyTorch's ``meta`` device, nothing allocated; float32 copies of that in
  timm, the file and keras_vit would crowd the machine), skipped: none of
  timm 1.0.31's, whose largest at depth 1 (aimv2_3b) has 118M;
- timm cannot build it at depth 1: the walk's limit, not keras_vit's.

keras_vit reads an architecture's sizes and options from its table of
timm's architectures (``zoo/timm/architectures.json``, which
``--write-table`` writes from timm's builder arguments, read as this
script reads them), and refuses an argument it cannot honour by name. To
learn every feature a refused ViT lacks, it is probed: the same weights
under a name keras_vit knows (``vit_base_patch16_224``) with the
arguments timm's architecture function passes (its sizes and options,
read by wrapping timm's builder) spelled out as ``model_args``, as
``timm.create_model("vit_base_patch16_224", **args)`` would record them.
keras_vit refuses a ``model_args`` setting it cannot honour by name; the
probe drops it and tries again, so it lists every argument keras_vit
lacks, and then loads what is left. The refused arguments are the
architecture's feature group; none refused and the probe loading with
timm's logits means only the name is missing from keras_vit's table. A
probe that loads with other logits is a bug in how keras_vit reads those
arguments (a user's ``model_args`` take the same path).

Depth 1 keeps the real layout (timm's ``model_args`` record ``depth: 1``
and keras_vit honours it) at a fraction of the cost; the image is two
tokens wide where timm builds that size, else the native one; timm's
NaFlexVit (``naflexvit``) runs on a NaFlex batch instead, two images of
other grids and aspect ratios than its table cut into patches with
padding (:func:`naflex_batch`), the dict both libraries take. ``--jobs``
(at most 2) runs architectures in child processes, one thread each; the
full walk takes 10 to 15 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import fnmatch
import functools
import importlib
import contextlib
import dataclasses
import json
import multiprocessing
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from unittest import mock

MODULES = ("vision_transformer", "deit", "vision_transformer_hybrid", "eva",
           "qwen3_vit", "beit", "naflexvit", "vision_transformer_relpos",
           "deepseek_vit", "gemma4_vit", "vision_transformer_sam")
# The modules whose architectures are tabled with their class's defaults
# (the ViT modules' with VisionTransformer's sizes).
OWN_CLASSES = MODULES[3:]
# The function of each module its architecture functions build through.
BUILDERS = {"vision_transformer": "_create_vision_transformer",
            "deit": "_create_deit",
            "vision_transformer_hybrid": "_create_vision_transformer_hybrid",
            "eva": "_create_eva",
            "qwen3_vit": ("_create_qwen3_vit_classifier",
                          "_create_qwen3_vit_encoder"),
            "beit": "_create_beit",
            "naflexvit": ("_create_naflexvit", "_create_naflexvit_from_classic",
                          "_create_naflexvit_from_eva"),
            "vision_transformer_relpos": "_create_vision_transformer_relpos",
            "deepseek_vit": ("_create_deepseek_vit_classifier",
                             "_create_deepseek_vit_encoder"),
            "gemma4_vit": ("_create_gemma4_vit_encoder",
                           "_create_gemma4_vit_classifier"),
            "vision_transformer_sam": "_create_vision_transformer"}
# EVA's arguments a table row leaves out (the rest are completed with
# Eva's defaults, which differ from VisionTransformer's; Qwen's towers
# with their classes').
EVA_UNSTATED = frozenset({"in_chans", "num_classes", "device", "dtype",
                          "head_init_scale", "cfg"})
# The most parameters an architecture may have at the walked depth (1).
MAX_PARAMETERS = 500_000_000
# The architectures the family's coverage is counted over: up to this many
# parameters at full depth.
GOAL_PARAMETERS = 700_000_000
CLASSES = 5
TOLERANCE = 1e-5
HYBRID_TOLERANCE = 1e-4
MAX_JOBS = 2
# The architecture name the probe describes a refused ViT under: a plain
# member of its module, whose own arguments are its builder's defaults.
STAND_IN = "vit_base_patch16_224"
STAND_INS = {"eva": "eva_giant_patch14_224"}
# The modules whose refusals the probe refines (the others' group comes
# from the refusal's message).
PROBED = ("vision_transformer", "deit", "vision_transformer_hybrid", "eva")
# An architecture function's arguments that are sizes or bookkeeping, not
# features.
SIZES = frozenset({"patch_size", "embed_dim", "depth", "num_heads",
                   "mlp_ratio", "img_size"})
BOOKKEEPING = frozenset({"pretrained", "pretrained_cfg",
                         "pretrained_cfg_overlay", "cache_dir"})
EXACT, DIFFERS, REFUSED = "loaded-exact", "loaded-but-differs", "refused"
TOO_LARGE, NO_BUILD = "too large for the walk", "timm cannot build it"
STATUSES = (EXACT, DIFFERS, REFUSED, TOO_LARGE, NO_BUILD)
NAME_ONLY = "name only: not in keras_vit's table (every option it sets reads)"
WRONG_TABLE = ("keras_vit's table gives the name other options (the "
               "weights do not fit)")

# A refusal's message -> the feature it names (first match wins), for
# refusals the probe cannot refine (hybrids, distilled DeiT).
MESSAGES = (
    # NaFlexVit's settings keras_vit does not compute (naflexvit.py).
    ("NaFlex: aspect-preserving table resize (pos_embed_ar_preserving)",
     r"pos_embed_ar_preserving="),
    ("NaFlex: factorized position table (pos_embed='factorized')",
     r"pos_embed='factorized'"),
    ("NaFlex: another setting (naflexvit)", r"NaFlexVit setting"),
    # The modules keras_vit does not read, refused by module.
    ("relative-position ViT: another setting (vision_transformer_relpos)",
     r"timm relative-position ViT setting"),
    ("DeepSeek: the aligner (global_pool='align', encoder_pool)",
     r"global_pool='align'|encoder_pool="),
    ("DeepSeek: another setting (deepseek_vit)",
     r"timm DeepSeek tower setting"),
    # Gemma 4's settings keras_vit does not compute (gemma4_vit).
    ("Gemma 4: another setting (gemma4_vit)", r"timm Gemma 4 tower setting"),
    # SAM's settings keras_vit does not compute (vision_transformer_sam).
    ("SAM without its neck (neck_chans=None)", r"neck_chans="),
    ("SAM: another setting (vision_transformer_sam)", r"timm SAM setting"),
    ("hybrid backbone (other)", r"HybridEmbed|ConvStem|backbone"),
    ("attention pool variant", r"attn_pool|latent_len"),
    ("pooling", r"global_pool"),
)
# timm's argument -> the feature it asks for, whatever its value (the
# others are read with their value: argument_feature).
ARGUMENTS = {
    "mlp_layer": "SwiGLU / GLU MLP",
    "embed_norm_layer": "norm after the patch embedding",
    "scale_attn_norm": "norms inside attention and MLP (BEiT-3 sub-LN)",
    "scale_mlp_norm": "norms inside attention and MLP (BEiT-3 sub-LN)",
    "mlp_ratio": "MLP width (mlp_ratio)",
    "dynamic_img_size": "dynamic image size",
    "pool_include_prefix": "attention pool over the prefix tokens",
    # EVA's (eva.py).
    "scale_mlp": "norms inside attention and MLP (BEiT-3 sub-LN)",
    "scale_attn_inner": "norms inside attention and MLP (BEiT-3 sub-LN)",
    "use_post_norm": "post-norm blocks (ResPostBlock)",
    "qkv_fused": "separate q, k, v projections (EVA-02)",
    "ref_feat_shape": "EVA-02's rotary grid (ref_feat_shape)",
    "attn_type": "RoPE-ViT and PE attention (attn_type)",
    "rope_grid_indexing": "RoPE-ViT and PE attention (attn_type)",
    "rope_grid_offset": "RoPE-ViT and PE attention (attn_type)",
    "attn_pool_num_heads": "attention pool of PE (attn_pool_*)",
    "attn_pool_mlp_ratio": "attention pool of PE (attn_pool_*)",
    "num_kv_heads": "grouped-query attention (num_kv_heads)",
}
# The order a group names its features in: the larger parts first.
_ORDER = {key: i for i, key in enumerate((
    "backbone", "block_fn", "attn_layer", "mlp_layer", "act_layer",
    "norm_layer", "embed_norm_layer", "scale_attn_norm", "scale_mlp_norm"))}
BLOCKS = {"ParallelScalingBlock": "parallel blocks (ViT-22B style)",
          "ParallelThingsBlock": "parallel blocks (several branches)",
          "ResPostBlock": "post-norm blocks (ResPostBlock)",
          "DiffParallelScalingBlock": "differential attention"}


# -- timm's list ------------------------------------------------------------

def architectures(only=None, limit=None):
    """``{architecture: (module, [pretrained tags])}`` of timm's ViT
    modules, in timm's order; ``only`` an fnmatch pattern on the name,
    ``limit`` the first that many.

    >>> arch = architectures(only="deit_tiny_patch16_224")
    >>> arch["deit_tiny_patch16_224"][0]
    'deit'
    """
    import timm

    out = {}
    for module in MODULES:
        tags = collections.defaultdict(list)
        for tagged in timm.list_models(module=module, pretrained=True):
            tags[tagged.partition(".")[0]].append(tagged)
        for name in timm.list_models(module=module):
            if only is None or fnmatch.fnmatchcase(name, only):
                out.setdefault(name, (module, sorted(tags.get(name, []))))
    names = list(out)[:limit] if limit is not None else list(out)
    return {name: out[name] for name in names}


def meta_model(name, **kwargs):
    """timm's ``name`` built on PyTorch's ``meta`` device: its layout and
    sizes without memory or time for the weights."""
    import timm
    import torch

    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, **kwargs)


def parameter_count(model):
    """The number of parameters of a torch model (a ``meta`` one too)."""
    return sum(p.numel() for p in model.parameters())


class _ArgumentsError(Exception):
    """Carries the arguments an architecture function passed on (raised
    to stop the build there)."""


# timm's arguments that name a norm layer: described by what an instance
# is (its class and epsilon), since torch's LayerNorm and timm's differ
# only in their default epsilon.
NORMS = ("norm_layer", "embed_norm_layer")


def describe(value, key=None):
    """A JSON-ready description of one of timm's argument values: numbers,
    strings and lists as they are; a norm layer (``key`` one of
    :data:`NORMS`) as ``{"layer": its class, "eps": its epsilon}``; a
    ``partial`` as ``{"layer": its function, **its keywords}``; any other
    class, function or object by its name.

    >>> import functools
    >>> describe(functools.partial(dict, eps=1e-05))
    {'layer': 'dict', 'eps': 1e-05}
    >>> describe("layernorm", "norm_layer")
    {'layer': 'LayerNorm', 'eps': 1e-06}
    """
    if key in NORMS and value is not None:
        import torch
        from timm.layers import get_norm_layer

        with torch.device("meta"):
            layer = get_norm_layer(value)(8)
        out = {"layer": type(layer).__name__}
        if isinstance(getattr(layer, "eps", None), float):
            out["eps"] = layer.eps
        return out
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, functools.partial):
        return {"layer": describe(value.func),
                **{k: describe(v) for k, v in value.keywords.items()}}
    return getattr(value, "__name__", type(value).__name__)


def architecture_args(name, module):
    """The arguments timm's architecture function ``name`` passes to its
    module's builder (sizes and options, each value as :func:`describe` gives it), read
    by standing in for the builder; nothing is built but a hybrid's
    backbone, on the ``meta`` device.

    >>> architecture_args("deit3_small_patch16_224", "deit")["init_values"]
    1e-06
    """
    import timm
    import torch

    def capture(*args, **kwargs):
        raise _ArgumentsError(kwargs)

    builder = importlib.import_module(f"timm.models.{module}")
    names = BUILDERS[module]
    with contextlib.ExitStack() as stack:
        for function in (names,) if isinstance(names, str) else names:
            stack.enter_context(mock.patch.object(builder, function, capture))
        stack.enter_context(torch.device("meta"))
        try:
            timm.create_model(name, pretrained=False)
        except _ArgumentsError as e:
            args = dict(e.args[0])
            config = args.pop("cfg", None)
            if dataclasses.is_dataclass(config):
                # NaFlexVit's configuration: its every field, the
                # function's own arguments over them (as its builder
                # overlays them).
                args = {**{f.name: getattr(config, f.name)
                           for f in dataclasses.fields(config)}, **args}
            elif config is not None:
                args["cfg"] = config
            return {k: describe(v, k) for k, v in args.items()
                    if k not in BOOKKEEPING}
    raise LookupError(f"timm's {name} did not build through "
                      f"{module}.{BUILDERS[module]}")


def options(args):
    """The arguments that are features, not sizes."""
    return {k: v for k, v in args.items() if k not in SIZES}


# The sizes every table row states, with timm VisionTransformer's defaults
# for those an architecture function leaves to them.
TABLE_SIZES = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")


def table_entry(name, module):
    """One row of keras_vit's table of timm's architectures
    (``zoo/timm/architectures.json``): ``{"module": ..., "args": ...}``,
    the arguments :func:`architecture_args` reads, a ViT's sizes completed
    with VisionTransformer's defaults, and ``img_size`` as timm builds the
    architecture (its own argument, else its default pretrained
    configuration's input size); a hybrid's sizes as its function passes
    them (its backbone decides the rest).

    >>> table_entry("vit_base_patch14_dinov2", "vision_transformer")["args"]["img_size"]
    518
    """
    import inspect

    from timm.models.vision_transformer import VisionTransformer

    args = architecture_args(name, module)
    model = meta_model(name)
    if module in OWN_CLASSES:
        # Every argument of the class the builder makes (Eva, Beit, Qwen's
        # classifier or encoder), at its default where the function
        # passes none.
        for key, parameter in inspect.signature(
                type(model)).parameters.items():
            if key not in EVA_UNSTATED and parameter.kind not in (
                    parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                args.setdefault(key, describe(parameter.default, key))
    elif "backbone" not in args:
        defaults = inspect.signature(VisionTransformer).parameters
        for key in TABLE_SIZES:
            args.setdefault(key, defaults[key].default)
        if (model.embed_dim, len(model.blocks)) != (args["embed_dim"],
                                                    args["depth"]):
            raise LookupError(f"timm's {name} builds other sizes than its "
                              f"arguments say: {args}")
    embed = _patch_embed(model)
    size = getattr(embed, "img_size", None) or model.pretrained_cfg[
        "input_size"][1:]
    height, width = (size, size) if isinstance(size, int) else size
    args.setdefault("img_size", height if height == width else [height,
                                                                width])
    # The pooling timm's builder fills in from the default pretrained
    # configuration, where it names one.
    if model.global_pool != args.get("global_pool", "token"):
        args["global_pool"] = model.global_pool
    return {"module": module, "args": args}


def write_table(path, arches=None):
    """Writes keras_vit's table of timm's architectures to ``path``: every
    architecture of :data:`MODULES` (or of ``arches``), one JSON line each
    (:func:`table_entry`), under the timm version it was read from."""
    import timm

    arches = architectures() if arches is None else arches
    rows = [f"  {json.dumps(name)}: {json.dumps(table_entry(name, module))}"
            for name, (module, _) in arches.items()]
    head = {
        "about": "timm's ViT-family architectures: the arguments each "
                 "architecture function passes to its module's builder "
                 "(sizes completed with VisionTransformer's defaults, "
                 "EVA's every argument with Eva's; "
                 "norm layers as their class and epsilon, other layers by "
                 "name), read from timm itself by benchmarks/timm_coverage.py "
                 "--write-table",
        "timm": timm.__version__, "modules": list(MODULES)}
    text = ("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n"
                            for k, v in head.items())
            + '  "architectures": {\n' + ",\n".join(
                "  " + row for row in rows) + "\n  }\n}\n")
    json.loads(text)  # the file is JSON
    with open(path, "w") as f:
        f.write(text)
    return len(rows)


def features(module, args):
    """The option values an architecture of ``module`` with timm's
    arguments ``args`` carries, as the walk tells them apart: each
    option's feature (:func:`argument_feature`), or for a module keras_vit
    does not read (refused whole), the module.

    >>> features("gemma4_vit", {"embed_dim": 768})
    {('module', 'gemma4_vit')}
    """
    from keras_vit.zoo.timm.arguments import READ_MODULES

    if module not in READ_MODULES:
        return {("module", module)}
    return {(k, argument_feature(k, v)) for k, v in options(args).items()}


def representatives(arches):
    """A few architectures that together carry every option value timm's
    ViT family uses (``{name: (module, tags)}`` in, names out): the
    smallest-width architecture with an uncovered option value, again and
    again (a greedy cover, reading each option's value as
    :func:`argument_feature` names it), plus the smallest plain ViT; then
    each chosen one whose values the others carry is dropped, tried from
    the last chosen (the widest) back to the second (the greedy order
    leaves some that later choices cover).

    >>> representatives({"deit_tiny_patch16_224": ("deit", [])})
    ['deit_tiny_patch16_224']
    """
    carried = {}
    for name, (module, _) in arches.items():
        args = architecture_args(name, module)
        carried[name] = ((args.get("embed_dim", 0), name),
                         features(module, args))
    chosen = [min(carried, key=lambda n: (bool(carried[n][1]),
                                          carried[n][0]))]
    covered = set(carried[chosen[0]][1])
    while True:
        left = [n for n in carried if carried[n][1] - covered]
        if not left:
            break
        name = min(left, key=lambda n: carried[n][0])
        chosen.append(name)
        covered |= carried[name][1]
    for name in reversed(chosen[1:]):
        others = set().union(*(carried[n][1] for n in chosen if n != name))
        if carried[name][1] <= others:
            chosen.remove(name)
    return chosen


# -- one architecture -------------------------------------------------------

def _patch_embed(model):
    """The patch embedding of timm's ``model`` (Qwen's classifiers hold
    it in their encoder), or None."""
    return getattr(model, "patch_embed", None) or getattr(
        getattr(model, "encoder", None), "patch_embed", None)


def _stride(model):
    """Pixels per token side: the native size over the patch grid."""
    native = model.pretrained_cfg["input_size"][-1]
    grid = getattr(_patch_embed(model), "grid_size", None)
    return native // grid[-1] if grid else None


def build(name, depth=1, seed=0):
    """``(timm model, image size)``: ``name`` at ``depth`` blocks with
    every parameter random (norms and layer scales too: a unit or zero one
    would hide a swap), two tokens wide where timm builds that size, else
    at its native size."""
    import timm
    import torch

    probe = meta_model(name, depth=depth)
    native = probe.pretrained_cfg["input_size"][-1]
    stride = _stride(probe)
    sizes = ([2 * stride] if stride and 2 * stride < native else []) + [None]
    failure = None
    for size in sizes:
        kwargs = {} if size is None else dict(img_size=size)
        try:
            torch.manual_seed(seed)
            model = timm.create_model(name, pretrained=False, depth=depth,
                                      num_classes=CLASSES, **kwargs).eval()
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn_like(p) * 0.2)
                size = size or native
                model(torch.zeros(1, 3, size, size))
            return model, size
        except Exception as e:  # timm refuses this size: try the next
            failure = e
    raise failure


def naflex_batch(model):
    """``(keras_vit's NaFlex batch, timm's)``: two random images of other
    grids and aspect ratios than timm's NaFlexVit ``model``'s table (one
    side larger, the other smaller; a table over 16 x 16 only shrunk, the
    grids kept small), cut into its patches with padding after each:
    keras_vit's dict (``patches``, ``patch_coords``, ``patch_mask``) and
    timm's (``patches``, ``patch_coord``, ``patch_valid``) of the same
    arrays."""
    import numpy as np
    import torch

    from keras_vit.data import naflex

    patch = model.embeds.patch_size[0]
    rows, cols = (min(side, 16) for side in
                  model.embeds.pos_embed_grid_size or (16, 16))
    grids = ((max(1, rows * 3 // 4), cols + cols // 4),
             (rows + rows // 8 + 1, max(1, cols // 2)))
    rng = np.random.default_rng(1)
    images = [rng.uniform(-1, 1, (r * patch, c * patch, 3)).astype(
        "float32") for r, c in grids]
    ours = naflex.patchify(images, patch, resize=False, max_patches=max(
        r * c for r, c in grids) + 3)
    return ours, {
        "patches": torch.from_numpy(ours["patches"]),
        "patch_coord": torch.from_numpy(ours["patch_coords"]).long(),
        "patch_valid": torch.from_numpy(ours["patch_mask"]).bool()}


def _one_line(e):
    return f"{type(e).__name__}: {e}".replace("\n", " | ")


def message_feature(message):
    """The feature a refusal's message names (:data:`MESSAGES`), or
    ``"other"``.

    >>> message_feature("... neck_chans=None is a timm SAM setting ...")
    'SAM without its neck (neck_chans=None)'
    """
    for group, pattern in MESSAGES:
        if re.search(pattern, message):
            return group
    return "other"


def argument_feature(key, value):
    """The feature timm's argument ``key=value`` asks for.

    >>> argument_feature("norm_layer", {"layer": "RmsNorm", "eps": 1e-05})
    'RMSNorm'
    >>> argument_feature("norm_layer", {"layer": "LayerNorm", "eps": 1e-05})
    'LayerNorm eps 1e-05 (norm_layer)'
    >>> argument_feature("block_fn", "ResPostBlock")
    'post-norm blocks (ResPostBlock)'
    """
    text = str(value)
    if key in ARGUMENTS:
        return ARGUMENTS[key]
    if key == "norm_layer":
        if "rms" in text.lower():
            return "RMSNorm"
        eps = value.get("eps") if isinstance(value, dict) else None
        return f"LayerNorm eps {eps!r} (norm_layer)" if eps else (
            f"norm_layer={text}")
    if key == "act_layer":
        return f"{text.lower()} activation (act_layer)"
    if key == "block_fn":
        return BLOCKS.get(text, f"block_fn={text}")
    if key == "attn_layer":
        return ("differential attention" if "diff" in text.lower()
                else f"attn_layer={text}")
    if key == "backbone":
        return f"hybrid backbone {text}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return key  # a count or a rate: one feature, whatever the number
    return f"{key}={text}"


def _read(folder, x):
    """keras_vit's model from ``folder`` and its outputs for ``x``, or the
    exception and where it came from."""
    import keras
    import numpy as np

    from keras_vit import zoo

    try:
        model = zoo.load(folder)
    except Exception as e:
        return None, e, "load"
    try:
        return np.asarray(model(x, training=False)), None, ""
    except Exception as e:
        return None, e, "run"
    finally:
        keras.backend.clear_session()


def _compare(got, want, tolerance):
    """``(status, max |diff|, scale, message)``."""
    import numpy as np

    if got.shape != want.shape:
        return (DIFFERS, None, None,
                f"logits of shape {got.shape}, timm's {want.shape}")
    diff = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    if diff <= tolerance * scale + 1e-6:
        return EXACT, diff, scale, ""
    return (DIFFERS, diff, scale,
            f"max |diff| {diff:.3g} on logits of scale {scale:.3g}")


def probe(folder, theirs, args, size, x, want, module=None):
    """The refused ViT in ``folder`` described by its arguments under
    :data:`STAND_IN` (see the module docstring): ``dict(missing=[the
    arguments keras_vit refused, "key=value"], status=..., message=...,
    max_diff=...)``."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    # The sizes in full: keras_vit keeps the stand-in's MLP width unless
    # told the ratio (timm's default is 4).
    model_args = dict(options(args), patch_size=theirs.patch_embed.patch_size[
        0], embed_dim=theirs.embed_dim, num_heads=args["num_heads"],
        mlp_ratio=args.get("mlp_ratio", 4.0), depth=1, img_size=size,
        num_classes=CLASSES)
    config.update(architecture=STAND_INS.get(module, STAND_IN),
                  model_args=model_args)
    missing = []
    while True:
        with open(path, "w") as f:
            json.dump(config, f)
        got, error, where = _read(folder, x)
        key = getattr(error, "field", None) or ""
        key = key.partition("model_args.")[2]
        if error is not None and key in model_args:
            missing.append(f"{key}={json.dumps(model_args.pop(key))}")
            continue
        if error is not None:
            return dict(missing=missing, status=REFUSED if where == "load"
                        else DIFFERS, message=_one_line(error),
                        max_diff=None)
        status, diff, _, message = _compare(got, want, TOLERANCE)
        return dict(missing=missing, status=status, message=message,
                    max_diff=diff)


def group_of(row):
    """A refused architecture's feature group: the features of the
    arguments its probe found keras_vit refusing, else what its probe
    found, else the feature its message names."""
    missing = row.get("probe_missing") or []
    if missing:
        features = []
        for item in sorted(missing, key=lambda item: _ORDER.get(
                item.partition("=")[0], len(_ORDER))):
            key, _, value = item.partition("=")
            feature = argument_feature(key, json.loads(value))
            if feature not in features:
                features.append(feature)
        return " + ".join(features)
    status = row.get("probe_status")
    if status == EXACT:
        return NAME_ONLY if row["error_type"] == "UnknownModelError" else (
            WRONG_TABLE)
    if status == DIFFERS:
        return "options read, logits differ (a bug in the probe's reading)"
    if row.get("backbone"):
        return f"hybrid backbone {row['backbone']}"
    if status == REFUSED:
        return message_feature(row["probe_message"])
    return message_feature(row["message"])


def walk_one(name, module="vision_transformer", tags=(), workdir=None,
             max_parameters=MAX_PARAMETERS):
    """One architecture through timm and keras_vit: a dict with its
    ``name``, ``module``, ``tags``, ``parameters`` (full depth),
    ``status`` (one of :data:`STATUSES`), ``message`` (the refusal or
    failure, one line: newlines shown as `` | ``), ``error_type``,
    ``one_line`` (whether keras_vit's refusal was one line),
    ``max_diff`` and ``scale`` (the logits'), ``image_size``, the probe's
    findings for a refused ViT (``probe_missing``, ``probe_status``,
    ``probe_message``), ``group`` (a refusal's feature) and ``seconds``.
    """
    import numpy as np
    import torch
    from timm.models import save_for_hf

    started = time.perf_counter()
    row = dict(name=name, module=module, tags=list(tags), parameters=None,
               status=None, message="", error_type="", max_diff=None,
               scale=None, image_size=None, backbone=None, one_line=None,
               probe_missing=None, probe_status=None, probe_message="",
               group="", seconds=0.0)

    def done(status, **fields):
        row.update(status=status, seconds=round(
            time.perf_counter() - started, 2), **fields)
        if status == REFUSED:
            row["group"] = group_of(row)
        return row

    try:
        args = architecture_args(name, module)
        row["backbone"] = args.get("backbone")
        row["parameters"] = parameter_count(meta_model(name))
        walked = parameter_count(meta_model(name, depth=1))
    except Exception as e:
        return done(NO_BUILD, message=_one_line(e))
    if walked > max_parameters:
        return done(TOO_LARGE, message=f"{walked / 1e6:.0f}M parameters at "
                    f"depth 1 > {max_parameters / 1e6:.0f}M")
    try:
        theirs, size = build(name)
    except Exception as e:
        return done(NO_BUILD, message=_one_line(e))
    row["image_size"] = size
    x = np.random.default_rng(1).uniform(
        -1, 1, (2, size, size, 3)).astype("float32")
    with torch.no_grad():
        if module == "naflexvit":  # patches of mixed grids, padded
            x, timms = naflex_batch(theirs)
            want = theirs(timms).numpy()
        else:
            want = theirs(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
    with tempfile.TemporaryDirectory(prefix="timm-walk-",
                                     dir=workdir) as folder:
        save_for_hf(theirs, folder, safe_serialization=True)
        got, error, where = _read(folder, x)
        if error is not None and where == "load":
            message = str(error).replace(folder, "$REPO")
            row.update(message=message.replace("\n", " | "),
                       error_type=type(error).__name__,
                       one_line="\n" not in message)
            if (not row["backbone"] and not args.get("distilled")
                    and module in PROBED):
                found = probe(folder, theirs, args, size, x, want, module)
                row.update(probe_missing=found["missing"],
                           probe_status=found["status"],
                           probe_message=found["message"].replace(
                               folder, "$REPO"))
            return done(REFUSED)
    if error is not None:
        return done(DIFFERS, message="loads but cannot run: "
                    + _one_line(error), error_type=type(error).__name__)
    tolerance = HYBRID_TOLERANCE if row["backbone"] else TOLERANCE
    status, diff, scale, message = _compare(got, want, tolerance)
    return done(status, max_diff=diff, scale=scale, message=message)


# -- the walk ---------------------------------------------------------------

def _child_setup():
    # One thread per child: --jobs children share the machine's cores.
    # timm is imported before TensorFlow: the other order crashes the
    # process (a segmentation fault in torch's bundled Triton).
    import timm  # noqa: F401
    import torch

    torch.set_num_threads(1)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _walk_in_child(item):
    return walk_one(*item)


def walk(arches, jobs=1, log=None):
    """:func:`walk_one` over ``{name: (module, tags)}``, ``jobs`` child
    processes at a time (1: in this process), printing progress to
    ``log``; the rows in the order of ``arches``."""
    log = log or sys.stderr
    items = [(name, module, tags) for name, (module, tags) in arches.items()]
    rows, started = {}, time.perf_counter()

    def report(row):
        rows[row["name"]] = row
        what = row["status"] + (f" [{row['group']}]" if row["group"] else "")
        print(f"[{len(rows)}/{len(items)} {time.perf_counter() - started:.0f}"
              f" s] {row['name']}: {what} {row['message'][:140]}",
              file=log, flush=True)

    if jobs <= 1:
        for item in items:
            report(walk_one(*item))
    else:
        # No max_tasks_per_child: Python 3.11's executor hangs when it
        # replaces a retired child.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_child_setup) as pool:
            futures = [pool.submit(_walk_in_child, item) for item in items]
            for future in concurrent.futures.as_completed(futures):
                report(future.result())
    return [rows[name] for name, _, _ in items]


# -- the report -------------------------------------------------------------

def _tags(rows):
    return sum(len(r["tags"]) for r in rows)


def _cell(text, width):
    text = str(text).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 3] + "..."


def summary(rows):
    """``(markdown lines, tags loaded, tags in all)``: the classes, the
    refusals by feature group and by single feature, and the bugs."""
    by_status = collections.defaultdict(list)
    for row in rows:
        by_status[row["status"]].append(row)
    lines = ["| class | architectures | pretrained tags |", "|---|---|---|"]
    for status in STATUSES:
        lines.append(f"| {status} | {len(by_status[status])} | "
                     f"{_tags(by_status[status])} |")
    lines.append(f"| all | {len(rows)} | {_tags(rows)} |")
    lines += ["", "### By timm module", "",
              "| module | architectures | pretrained tags | tags loaded "
              "exactly | share |", "|---|---|---|---|---|"]
    for module in MODULES:
        members = [r for r in rows if r["module"] == module]
        loaded = _tags([r for r in members if r["status"] == EXACT])
        total = _tags(members)
        share = f"{100 * loaded / total:.1f}%" if total else "-"
        lines.append(f"| {module} | {len(members)} | {total} | {loaded} | "
                     f"{share} |")
    refused = collections.defaultdict(list)
    for row in by_status[REFUSED]:
        refused[row["group"]].append(row)
    lines += ["", "### Refused, by feature group", "",
              "What an architecture lacks, all of it (most tags first); "
              "the example is the group's smallest architecture.", "",
              "| feature group | architectures | pretrained tags | example "
              "| its refusal |", "|---|---|---|---|---|"]
    for group, members in sorted(refused.items(), key=lambda kv: (
            -_tags(kv[1]), -len(kv[1]), kv[0])):
        example = min(members, key=lambda r: (r["parameters"], r["name"]))
        lines.append(f"| {group} | {len(members)} | {_tags(members)} | "
                     f"{example['name']} | {_cell(_refusal(example), 240)} |")
    single = collections.defaultdict(lambda: ([], []))
    for group, members in refused.items():
        features = group.split(" + ")
        for feature in features:
            single[feature][0].extend(members)
            if len(features) == 1:
                single[feature][1].extend(members)
    lines += ["", "### Refused, by single feature", "",
              "An architecture lacking several features counts under each; "
              "'alone' counts those that lack this one only (what "
              "implementing it would load).", "",
              "| feature | architectures | pretrained tags | alone: "
              "architectures | alone: tags |", "|---|---|---|---|---|"]
    for feature, (anyhow, alone) in sorted(single.items(), key=lambda kv: (
            -_tags(kv[1][0]), -len(kv[1][0]), kv[0])):
        lines.append(f"| {feature} | {len(anyhow)} | {_tags(anyhow)} | "
                     f"{len(alone)} | {_tags(alone)} |")
    # A probe that dropped refused arguments differs as it should.
    wrong = by_status[DIFFERS] + [r for r in by_status[REFUSED]
                                  if r["probe_status"] == DIFFERS
                                  and not r["probe_missing"]]
    if wrong:
        lines += ["", "### Loaded but wrong (bugs)", "",
                  "| architecture | how | image | what |", "|---|---|---|---|"]
        for row in wrong:
            how = ("zoo.load of timm's folder" if row["status"] == DIFFERS
                   else "the probe (its module's stand-in with its "
                   "arguments)")
            what = (row["message"] if row["status"] == DIFFERS
                    else row["probe_message"])
            lines.append(f"| {row['name']} | {how} | {row['image_size']} | "
                         f"{_cell(what, 240)} |")
    return lines, _tags(by_status[EXACT]), _tags(rows)


def _refusal(row):
    text = row["message"]
    if row.get("probe_missing"):
        text += "; the probe: " + ", ".join(row["probe_missing"]) + (
            " refused")
    return text


def details(rows):
    """One markdown row per architecture."""
    lines = ["| architecture | module | params (full depth) | tags | image | "
             "class | feature group | message |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        params = ("-" if row["parameters"] is None
                  else f"{row['parameters'] / 1e6:.1f}M")
        lines.append(
            f"| {row['name']} | {row['module']} | {params} | "
            f"{len(row['tags'])} | {row['image_size'] or '-'} | "
            f"{row['status']} | {row['group'] or '-'} | "
            f"{_cell(row['message'], 160) or '-'} |")
    return lines


def _share_up_to(rows, parameters):
    """``"S% (loaded of tags)"``: the pretrained tags that load exactly
    among those of the architectures of at most ``parameters`` parameters
    at full depth."""
    small = [r for r in rows if r["parameters"] is not None
             and r["parameters"] <= parameters]
    tags = _tags(small)
    loaded = _tags([r for r in small if r["status"] == EXACT])
    return (f"{100.0 * loaded / tags if tags else 0.0:.1f}% ({loaded} of "
            f"{tags})")


def report(rows, command, seconds=None):
    """The markdown page: how it was made, the summary tables, one row
    per architecture."""
    import timm

    import keras_vit

    table, loaded, tags = summary(rows)
    share = 100.0 * loaded / tags if tags else 0.0
    archs = sum(r["status"] == EXACT for r in rows)
    walked = _tags([r for r in rows if r["status"] != TOO_LARGE])
    head = [
        "# timm's ViT family: what keras_vit loads",
        "",
        f"- command: `{command}`",
        "- date: " + datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"),
        f"- timm {timm.__version__}, keras-vit {keras_vit.__version__}, "
        f"python {platform.python_version()}",
        "- modules: " + ", ".join(f"`{m}`" for m in MODULES)
        + "; each architecture built by timm at depth 1 with random weights, "
        "written by `timm.models.save_for_hf`, read by `keras_vit.zoo.load`, "
        f"logits compared on one random batch (within {TOLERANCE:g} of their "
        f"scale, {HYBRID_TOLERANCE:g} for the hybrids). A refused ViT's "
        f"feature group comes from a probe: its weights under `{STAND_IN}` "
        f"(EVA's under `{STAND_INS['eva']}`) "
        "with timm's arguments as `model_args`, the arguments keras_vit "
        "refuses listed (see `benchmarks/timm_coverage.py`)",
        f"- **{share:.1f}% of the pretrained tags load with timm's logits** "
        f"({loaded} of {tags}; {archs} of {len(rows)} architectures); "
        f"{100.0 * loaded / walked if walked else 0.0:.1f}% of the "
        f"{walked} tags walked (the architectures under "
        f"{MAX_PARAMETERS / 1e6:.0f}M parameters at depth 1)",
        f"- **{_share_up_to(rows, GOAL_PARAMETERS)}** of the tags of the "
        f"architectures up to {GOAL_PARAMETERS / 1e6:.0f}M parameters at "
        "full depth",
    ]
    if seconds is not None:
        head.append(f"- walk time: {seconds / 60:.1f} min")
    return "\n".join([*head, "", *table, "", "## Each architecture", "",
                      *details(rows)]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="fnmatch pattern on the architecture "
                        "name, e.g. 'deit*'")
    parser.add_argument("--limit", type=int,
                        help="walk the first N architectures only")
    parser.add_argument("--jobs", type=int, default=MAX_JOBS,
                        help=f"child processes (1 to {MAX_JOBS}; 1 runs in "
                        "this process)")
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--from", dest="source", help="render the rows a "
                        "--json run wrote instead of walking")
    parser.add_argument("--write-table", metavar="PATH", help="write keras_vit's"
                        " table of timm's architectures (zoo/timm/architectures"
                        ".json) instead of walking")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= MAX_JOBS:
        parser.error(f"--jobs must be 1 to {MAX_JOBS}; received "
                     f"--jobs={args.jobs}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be positive; received "
                     f"--limit={args.limit}")
    argv = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/timm_coverage.py " + " ".join(
        shlex.quote(a) for a in argv)
    started = time.perf_counter()
    if args.write_table:
        count = write_table(args.write_table,
                            architectures(args.only, args.limit))
        print(f"wrote {count} architectures to {args.write_table}",
              file=sys.stderr)
        return 0
    if args.source:
        with open(args.source) as f:
            saved = json.load(f)
        rows, command, seconds = (saved["rows"], saved["command"],
                                  saved["seconds"])
        for row in rows:  # grouped as this version of the script groups
            if row["status"] == REFUSED:
                row["group"] = group_of(row)
    else:
        arches = architectures(args.only, args.limit)
        if not arches:
            raise SystemExit(f"no timm architecture matches --only="
                             f"{args.only!r}")
        print(f"walking {len(arches)} architectures, {args.jobs} at a time",
              file=sys.stderr, flush=True)
        rows = walk(arches, args.jobs)
        seconds = time.perf_counter() - started
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(command=command, seconds=seconds, rows=rows),
                          f, indent=1)
    text = report(rows, command, seconds)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
