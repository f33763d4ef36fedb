"""The Hugging Face Hub files both Hub layouts share: the download, bounded
like the bucket downloads, and the ``.safetensors`` reader.

Both timm's and transformers' files come from ``hf-hub:<repo>[@revision]``
handles through ``huggingface_hub``'s cache; their ``model.safetensors`` is
read without torch, its header checked first.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from keras_vit.base import environment, schema, variants
from keras_vit.base.archives import special_file
from keras_vit.base.checks import check_number, require, shown
from keras_vit.base.limits import MAX_CONFIG_BYTES, MAX_SAFETENSORS_HEADER
from keras_vit.zoo import checkpoints, formats
from keras_vit.zoo.download import fetch as download
from keras_vit.zoo.download import cache as download_cache
from keras_vit.zoo.download import http as http_fetch

HUB_PREFIX = "hf-hub:"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# huggingface_hub bounds each wait for bytes but not a whole download, and
# its HTTP client changes with each major version: it runs in a child
# process (~0.3 s to start), killed at the deadline or when the cache's blobs
# stop growing. It retries an unreachable server five times over ~23 s, so
# the parent first tries one connection (download.unreachable) and an
# unreachable server leaves the cache alone to answer (local_files_only).
# The child prints one JSON line: the paths, or the error and its file.
_HUB_CHILD = r"""
import json, sys
repo, revision, files, quiet, limits, unreachable = json.loads(sys.argv[1])

name, local = None, False
try:
    import huggingface_hub
    # constants is a lazy submodule: an attribute only once imported.
    from huggingface_hub import constants, utils
    utils.logging.set_verbosity_error()
    if quiet:
        utils.disable_progress_bars()
    local = bool(constants.HF_HUB_OFFLINE) or unreachable
    paths = []
    for name in files:
        if name in limits and not local:
            try:
                size = huggingface_hub.get_hf_file_metadata(
                    huggingface_hub.hf_hub_url(repo, name, revision=revision),
                    timeout=constants.HF_HUB_ETAG_TIMEOUT).size
            except Exception:
                size = None  # hf_hub_download says what is wrong
            if size is not None and size > limits[name]:
                raise ValueError(
                    f"{name} is {size} bytes; a config is a few KB (at "
                    f"most {limits[name]} read): refused before download")
        paths.append(huggingface_hub.hf_hub_download(
            repo, name, revision=revision, library_name="keras-vit",
            local_files_only=local))
    out = {"paths": paths}
except Exception as e:
    out = {"error": type(e).__name__, "message": str(e), "file": name,
           "local": local}
sys.stdout.write("\n" + json.dumps(out) + "\n")
"""
HUB_FILES = (CONFIG_FILE, WEIGHTS_FILE)
# What huggingface_hub raises when the server says the file does not exist
# (or is gated): placing a file by hand is then no answer.
_ANSWERED = ("EntryNotFoundError", "RepositoryNotFoundError",
             "RevisionNotFoundError", "GatedRepoError", "HFValidationError",
             "ValueError")


def _stop(child):
    """Kills ``child``'s process group and reaps it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.communicate()


def _hub_cache():
    """huggingface_hub's cache folder, as the child will find it."""
    cache = (environment.huggingface_hub("HF_HUB_CACHE")
             or environment.huggingface_hub("HUGGINGFACE_HUB_CACHE"))
    if cache:
        return os.path.expanduser(cache)
    home = environment.huggingface_hub("HF_HOME") or os.path.join(
        environment.xdg_cache_home() or os.path.join(
            os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _blob_bytes(folder):
    """Bytes in ``folder`` (a repository's blobs, partial ones included)."""
    try:
        with os.scandir(folder) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file())
    except OSError:
        return 0


def _endpoint():
    """The Hub server huggingface_hub talks to (``HF_ENDPOINT``)."""
    return (environment.huggingface_hub("HF_ENDPOINT")
            or "https://huggingface.co").rstrip("/")


def file_url(repo, name, revision=None):
    """The URL of the file ``name`` of the Hub repository ``repo`` at
    ``revision`` (default ``main``) on :func:`_endpoint`'s server."""
    return f"{_endpoint()}/{repo}/resolve/{revision or 'main'}/{name}"


def _cached_elsewhere(repo):
    """The files huggingface_hub's cache holds for ``repo`` (any
    revision), by name."""
    folder = os.path.join(_hub_cache(), "models--" + repo.replace("/", "--"),
                          "snapshots")
    try:
        return sorted({name for _, _, names in os.walk(folder)
                       for name in names})
    except OSError:
        return []


def _not_fetched(where, repo, revision, pending, result):
    """The :class:`download_cache.DownloadError` of files ``pending`` (names)
    that neither the network nor huggingface_hub's cache gave, from the
    child's ``result``: :func:`download.unavailable`'s line naming each
    file's URL and the keras-vit cache path to place it at."""
    name = result.get("file") or pending[0]
    if result.get("reason"):
        reason = result["reason"]
    elif result.get("unreachable"):
        reason = (f"{where}: {result['unreachable']} and huggingface_hub's "
                  f"cache holds no {name}")
    elif result.get("local"):
        if download.is_offline():
            off, value = "KERAS_VIT_OFFLINE", environment.raw(
                "KERAS_VIT_OFFLINE")
        else:
            off, value = "HF_HUB_OFFLINE", environment.huggingface_hub(
                "HF_HUB_OFFLINE")
        reason = (f"{where}: {name} is in neither huggingface_hub's cache "
                  f"nor keras-vit's, and downloads are off "
                  f"({off}={value or ''!r})")
    else:
        reason = (f"could not download {where}: {result['error']}: "
                  f"{result['message']}")
    cached = [n for n in _cached_elsewhere(repo) if n != name]
    if name == WEIGHTS_FILE and PICKLE_FILE in cached:
        reason += (f"; the cache holds {PICKLE_FILE} for it instead, a "
                   "pickle keras_vit never unpickles")
    # Name the weights with a missing config: one trip brings both.
    names = pending[pending.index(name):]
    if WEIGHTS_FILE not in names and not download_cache.cache_path_for(
            file_url(repo, WEIGHTS_FILE, revision)).is_file():
        names.append(WEIGHTS_FILE)
    files = [(file_url(repo, n, revision),
              download_cache.cache_path_for(file_url(repo, n, revision)))
             for n in names]
    return download.unavailable(
        reason, files, mirror="HF_ENDPOINT names another Hub server")


def hub_download(repo, revision=None, files=HUB_FILES, *, progress=None,
                 timeout=60.0, deadline=http_fetch.DEFAULT_DEADLINE):
    """Local paths of ``files`` of the Hub repository ``repo``: a file
    placed by hand at its keras-vit cache path
    (:func:`download_cache.cache_path_for` of its :func:`file_url`) is taken
    as it is; the others come through ``huggingface_hub``'s cache, with
    the bucket downloads' bounds: ``timeout`` for each wait for bytes,
    ``deadline`` for the whole, and :class:`http_fetch.Throughput` on the
    bytes reaching the cache. An endpoint that does not accept a
    connection within ``timeout`` leaves huggingface_hub's cache alone to
    answer. A ``config.json`` larger than :data:`MAX_CONFIG_BYTES` is
    refused before it is written. Any failure is one line, a
    :class:`download_cache.DownloadError` naming the repository."""
    check_number("timeout", timeout, low=0, low_open=True)
    check_number("deadline", deadline, low=0, low_open=True)
    where = f"hf-hub:{repo}" + (f"@{revision}" if revision else "")
    placed = {name: download_cache.cache_path_for(file_url(repo, name, revision))
              for name in files}
    pending = [name for name in files if not placed[name].is_file()]
    if not pending:
        return [os.fspath(placed[name]) for name in files]
    require("huggingface_hub", purpose="hf-hub: weights")
    give_up = time.monotonic() + deadline
    env = environment.for_child()
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        env.setdefault(name, str(max(1, math.ceil(timeout))))
    why = None  # why the endpoint cannot be reached
    if download.is_offline():
        env["HF_HUB_OFFLINE"] = "1"
    elif (environment.huggingface_hub("HF_HUB_OFFLINE") or "").lower() not in (
            environment.TRUE):  # the values huggingface_hub takes as true
        why = download.unreachable(_endpoint(), min(timeout, deadline))
    rate = http_fetch.Throughput(http_fetch.stall_seconds())
    blobs = os.path.join(_hub_cache(), "models--" + repo.replace("/", "--"),
                         "blobs")
    start = _blob_bytes(blobs)
    job = json.dumps([repo, revision or None, pending, progress is False,
                      {CONFIG_FILE: MAX_CONFIG_BYTES}, why is not None])
    # stderr stays the caller's, for huggingface_hub's progress bars.
    child = subprocess.Popen(
        [sys.executable, "-c", _HUB_CHILD, job], env=env,
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True)
    failure = None
    try:
        while failure is None:
            left = give_up - time.monotonic()
            try:
                out, _ = child.communicate(timeout=max(0.01, min(0.5, left)))
                break
            except subprocess.TimeoutExpired:
                received = _blob_bytes(blobs) - start
                if time.monotonic() >= give_up:
                    failure = {"reason": (
                        f"download of {where} did not finish within "
                        f"{deadline:g} s and was stopped; pass a larger "
                        "deadline")}
                elif rate.stalled(received):
                    failure = {"reason": str(rate.error(
                        f"{where} ({_endpoint()}/{repo})", received))}
    except BaseException:
        _stop(child)
        raise
    if failure is not None:
        _stop(child)
        raise _not_fetched(where, repo, revision, pending, failure)
    lines = [line for line in (out or "").splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise download_cache.DownloadError(
            f"download of {where} failed: its process ended with status "
            f"{child.returncode} and no result") from None
    if "error" not in result:
        got = iter(result["paths"])
        return [os.fspath(placed[name]) if name not in pending else next(got)
                for name in files]
    result["unreachable"] = why
    if result["error"] in _ANSWERED and not result.get("local"):
        raise download_cache.DownloadError(
            f"could not download {where}: {result['error']}: "
            f"{' '.join(str(result['message']).split())}")
    raise _not_fetched(where, repo, revision, pending, result)


def check_safetensors(path):
    """Checks a ``.safetensors`` file's header against the file before
    anything is read into memory (its length, every entry as
    :data:`~keras_vit.zoo.formats.SAFETENSORS_HEADER` describes it, every
    byte range inside the file, sized by its shape, no two overlapping).
    A :class:`~keras_vit.zoo.formats.FormatError` names the file and the
    tensor otherwise. Returns the header."""
    path = os.fspath(path)

    def bad(problem, field=None):
        return formats.fail(path, field, problem)

    kind = special_file(path)
    if kind is not None:
        raise bad(f"is {kind}, not a regular file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"is {size} bytes, shorter than the 8-byte header "
                      "length of a .safetensors file")
        length = int.from_bytes(head, "little")
        if length > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise bad(f"declares a {length}-byte header in a {size}-byte "
                      "file (truncated, or not a .safetensors file)")
        raw = f.read(length)
    header = formats.check(formats.SAFETENSORS_HEADER, schema.parse_json(
        raw, path, ".safetensors header", error=formats.FormatError), path)
    data = size - 8 - length
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape, (start, end) = entry["shape"], entry["data_offsets"]
        if not start <= end <= data:
            raise bad(f"data_offsets={[start, end]} is not a byte range "
                      f"inside the file's {data} bytes of data (truncated?)",
                      name)
        width = formats.SAFETENSORS_DTYPES[entry["dtype"]]
        if entry["dtype"] == "I64" and shape:
            raise bad(f"dtype I64 of shape {shape}: keras_vit's weights are "
                      "floats (an int64 scalar, a count the readers pass "
                      "over, is the one integer a file may hold)",
                      f"{name}.dtype")
        need = int(np.prod(shape, dtype=object)) * width
        if end - start != need:
            raise bad(f"data_offsets={[start, end]} hold {end - start} "
                      f"bytes; dtype {entry['dtype']} and shape {shape} "
                      f"need {need}", name)
        ranges.append((start, end, name))
    ranges.sort()
    for (_, end, first), (start, _, second) in zip(ranges, ranges[1:]):
        if start < end:
            raise bad(f"its data overlaps tensor {shown(first)}'s: two "
                      "names for one array", second)
    return header


def read_safetensors(path):
    """``{name: numpy array}`` of a ``.safetensors`` file (no torch),
    checked by :func:`check_safetensors` first."""
    st = require("safetensors.numpy", package="safetensors",
                 purpose="timm / Hub weights")
    path = os.fspath(path)
    check_safetensors(path)
    try:
        return st.load_file(path)
    except Exception as e:  # noqa: BLE001 - SafetensorError and kin
        raise checkpoints.CheckpointError(
            f"{path}: cannot read it as a .safetensors file: "
            f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e


def vit_checkpoint(arch, arrays, *, head, label_names=None, source_name=None,
                   tags=None, head_config=None, head_names=None, layout=None,
                   **defaults):
    """The :class:`~keras_vit.zoo.build.Checkpoint` of the keras_vit ViT
    that ``arch`` (what a Hugging Face reader found) describes, holding
    ``arrays`` (of ``layout``; None: the official one) with a head of
    ``head`` classes (None: none) named ``label_names``; ``head_names``
    give the file's names of the head's arrays. ``**defaults`` are more
    builder arguments; ``tags`` more attributes for the model."""
    from keras_vit.zoo import build

    config = {key: arch[key] for key in (*SHAPE_KEYS, "representation_size")}
    config.update(num_classes=head or 1000,
                  classifier=arch.get("classifier", "token"), **defaults)
    return build.Checkpoint(
        config, arrays, source_name=source_name, head=head,
        label_names=label_names, head_config=dict(head_config or {}),
        tags={"zoo_name": zoo_name(arch), "zoo_weights": None,
              **(tags or {})}, head_names=dict(head_names or {}),
        layout=layout)


# The sizes that name a ViT, but its patch.
_SIZES = ("hidden_size", "mlp_dim", "num_heads", "num_layers")
#: The builder arguments of a ViT's shape, as a reader's ``arch`` has them.
SHAPE_KEYS = ("patch_size", "hidden_size", "num_layers", "num_heads",
              "mlp_dim", "layer_norm_epsilon", "gelu", "num_channels",
              "image_size")


def zoo_name(arch):
    """The zoo name of a ViT of ``arch``'s sizes, or a description of them
    where no zoo size has them.

    >>> zoo_name(dict(hidden_size=192, mlp_dim=768, num_heads=3,
    ...               num_layers=12, patch_size=16))
    'ViT-Ti/16'
    """
    sizes = {k: arch[k] for k in _SIZES}
    for letter, config in variants.VIT_SIZES.items():
        if config == sizes:
            return variants.vit_name(letter, arch["patch_size"])
    return (f"ViT (hidden {arch['hidden_size']}, {arch['num_layers']} "
            f"layers, patch {arch['patch_size']})")


def name_sizes(name, weights):
    """The sizes of the ViT name ``name``, for weights that only a ViT
    takes (``weights`` says whose, in the error for another family).

    >>> name_sizes("ViT-Ti/16", "transformers'")
    {'hidden_size': 192, 'mlp_dim': 768, 'num_heads': 3, 'num_layers': 12, 'patch_size': 16}
    """
    parsed = variants.parse(name)
    if parsed.family != "vit":
        raise ValueError(f"{weights} ViT weights load into ViT names only; "
                         f"received name={name!r} ({parsed.family})")
    return {k: parsed.config[k] for k in _SIZES + ("patch_size",)}


PICKLE_FILE = "pytorch_model.bin"


def pickle_hint(folder):
    """The way out for a folder holding only PyTorch's pickled
    ``pytorch_model.bin``, or "": commands that convert it once, where the
    file is trusted (checked with timm 1.0 and transformers 4)."""
    folder = os.fspath(folder)
    if not os.path.isfile(os.path.join(folder, PICKLE_FILE)):
        return ""
    pickled = os.path.join(folder, PICKLE_FILE)
    out = folder.rstrip("/" + os.sep) + "-safetensors"
    return (
        f"; it holds only {PICKLE_FILE}, a pickle, which keras_vit never "
        "unpickles (unpickling runs code). Convert it once where you trust "
        "the file: a timm folder with import json, timm; c = json.load("
        f"open({os.path.join(folder, CONFIG_FILE)!r})); "
        "timm.models.save_for_hf(timm.create_model(c['architecture'], "
        f"pretrained=True, pretrained_cfg_overlay=dict(file={pickled!r}, "
        "num_classes=c['num_classes']), **c.get('model_args', {})), "
        f"{out!r}, safe_serialization=True); a transformers folder with "
        f"transformers.AutoModelForImageClassification.from_pretrained("
        f"{folder!r}).save_pretrained({out!r}, safe_serialization=True)")


def check_names(found, expected, what, optional=()):
    """One :class:`~keras_vit.zoo.checkpoints.CheckpointError` starting with
    ``what`` and listing every missing, unexpected and mis-shaped name
    (``found``, ``expected``: name -> shape), in natural order, a dozen of
    each at most. Names in ``optional`` may be missing."""
    def natural(name):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]

    def listed(shape):
        return list(shape) if isinstance(shape, (list, tuple)) else shape

    missing = [shown(k, 160) for k in sorted(
        set(expected) - set(found) - set(optional), key=natural)]
    extra = [shown(k, 160) for k in sorted(set(found) - set(expected),
                                            key=natural)]
    wrong = [f"{shown(k, 120)}: {shown(listed(found[k]), 40)} "
             f"(expected {list(expected[k])})"
             for k in sorted(set(expected) & set(found), key=natural)
             if listed(found[k]) != list(expected[k])]
    problems = []
    for kind, items in (("missing", missing), ("unexpected", extra),
                        ("mis-shaped", wrong)):
        if items:
            more = f", ... ({len(items)} in all)" if len(items) > 12 else ""
            problems.append(f"{len(items)} {kind}: "
                            f"{', '.join(items[:12])}{more}")
    if problems:
        raise checkpoints.CheckpointError(f"{what}; {'; '.join(problems)}")
