"""The Hugging Face Hub files both Hub layouts share: the download, bounded
like the bucket downloads, and the ``.safetensors`` reader.

timm's repositories (:mod:`keras_vit.zoo.timm_hub`) and transformers'
(:mod:`keras_vit.zoo.transformers_hub`) differ in their config and their
parameter names, not in how their files arrive or how their weights are
stored: both come from ``hf-hub:<repo>[@revision]`` handles through
``huggingface_hub``'s cache and hold a ``model.safetensors`` read with
``safetensors``' NumPy reader (no torch), its header checked first.
"""

from __future__ import annotations

import json
import os

import numpy as np

from keras_vit.errors import require, shown, special_file
from keras_vit.limits import MAX_CONFIG_BYTES, MAX_SAFETENSORS_HEADER
from keras_vit.zoo import convert, download

HUB_PREFIX = "hf-hub:"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# huggingface_hub bounds each wait for bytes (HF_HUB_ETAG_TIMEOUT,
# HF_HUB_DOWNLOAD_TIMEOUT) but not a whole download: a server trickling a
# byte every few seconds holds it forever, and its HTTP client changes with
# each major version (requests, httpx, ...), so no socket of it can be
# bounded from here. It runs in a child process (huggingface_hub alone,
# ~0.3 s to start) that is killed at the deadline, or when the cache's
# blobs stop growing (the minimum-throughput rule): the bucket downloads'
# bounds (zoo/download.py) for the hub route. A config.json larger than
# a config is refused from its HEAD, before a byte of it is written. The
# child prints one JSON line: the paths, or the error.
_HUB_CHILD = r"""
import json, sys
repo, revision, files, quiet, limits = json.loads(sys.argv[1])
try:
    import huggingface_hub
    # constants is a lazy submodule: an attribute only once imported.
    from huggingface_hub import constants, utils
    if quiet:
        utils.disable_progress_bars()
    paths = []
    for name in files:
        if name in limits and not constants.HF_HUB_OFFLINE:
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
            repo, name, revision=revision, library_name="keras-vit"))
    out = {"paths": paths}
except Exception as e:
    out = {"error": type(e).__name__, "message": str(e)}
sys.stdout.write("\n" + json.dumps(out) + "\n")
"""
HUB_FILES = (CONFIG_FILE, WEIGHTS_FILE)


def _stop(child):
    """Kills ``child``'s process group and reaps it."""
    import signal

    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.communicate()


def _hub_cache():
    """huggingface_hub's cache folder, as the child will find it."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get(
        "HUGGINGFACE_HUB_CACHE")
    if cache:
        return os.path.expanduser(cache)
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _blob_bytes(folder):
    """Bytes in ``folder`` (a repository's blobs, partial ones included)."""
    try:
        with os.scandir(folder) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file())
    except OSError:
        return 0


def hub_download(repo, revision=None, files=HUB_FILES, *, progress=None,
                 timeout=60.0, deadline=download.DEFAULT_DEADLINE):
    """Local paths of ``files`` of the Hub repository ``repo``, through
    ``huggingface_hub``'s cache, with the bucket downloads' bounds:
    ``timeout`` for each wait for bytes (connect included; sets
    ``HF_HUB_ETAG_TIMEOUT`` / ``HF_HUB_DOWNLOAD_TIMEOUT`` unless they are
    set; huggingface_hub still retries once with its own 60 s),
    ``deadline`` for the whole: past it the download is stopped with a
    :class:`download.DownloadError` naming it (huggingface_hub resumes
    the partial file next time); and the bucket's minimum-throughput rule
    (:class:`download.Throughput`, ``KERAS_VIT_DOWNLOAD_STALL_S``) on the
    bytes reaching the cache. A ``config.json`` larger than
    :data:`MAX_CONFIG_BYTES` is refused from its size, before it is
    written. Any failure of huggingface_hub's is a ``DownloadError``
    naming the repository."""
    import time

    import math
    import subprocess
    import sys

    from keras_vit.errors import check_number

    require("huggingface_hub", purpose="hf-hub: weights")
    check_number("timeout", timeout, low=0, low_open=True)
    check_number("deadline", deadline, low=0, low_open=True)
    where = f"hf-hub:{repo}" + (f"@{revision}" if revision else "")
    env = dict(os.environ)
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        env.setdefault(name, str(max(1, math.ceil(timeout))))
    rate = download.Throughput(download.stall_seconds())
    blobs = os.path.join(_hub_cache(), "models--" + repo.replace("/", "--"),
                         "blobs")
    start = _blob_bytes(blobs)
    job = json.dumps([repo, revision or None, list(files), progress is False,
                      {CONFIG_FILE: MAX_CONFIG_BYTES}])
    # stderr stays the caller's: huggingface_hub's progress bars and
    # warnings show as they would in this process.
    child = subprocess.Popen(
        [sys.executable, "-c", _HUB_CHILD, job], env=env,
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True)
    give_up = time.monotonic() + deadline
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
                    failure = download.DownloadError(
                        f"download of {where} did not finish within "
                        f"{deadline:g} s and was stopped; pass a larger "
                        "deadline, or check HF_ENDPOINT and the network")
                elif rate.stalled(received):
                    endpoint = os.environ.get("HF_ENDPOINT",
                                              "https://huggingface.co")
                    failure = rate.error(
                        f"{where} ({endpoint.rstrip('/')}/{repo})", received)
    except BaseException:
        _stop(child)
        raise
    if failure is not None:
        _stop(child)
        raise failure
    lines = [line for line in (out or "").splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise download.DownloadError(
            f"download of {where} failed: its process ended with status "
            f"{child.returncode} and no result") from None
    if "error" in result:
        raise download.DownloadError(
            f"could not download {where}: {result['error']}: "
            f"{' '.join(str(result['message']).split())}")
    return result["paths"]


# Bytes per element of the safetensors dtypes NumPy holds.
_ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
              "BOOL": 1}


def _is_count(value):
    """A non-negative int; JSON's true and false are not counts."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and value >= 0)


def check_safetensors(path):
    """Checks a ``.safetensors`` file's header against the file before
    anything is read into memory: its length, JSON, and every tensor's
    dtype, shape and byte range (inside the file, the size its shape
    needs). A :class:`~keras_vit.zoo.convert.CheckpointError` names the
    file and the tensor otherwise. Returns the header."""
    path = os.fspath(path)

    def bad(problem):
        return convert.CheckpointError(f"{path}: {problem}")

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
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"its header is not JSON ({type(e).__name__}: "
                  f"{' '.join(str(e).split())[:200]})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an "
                  "object of tensors")
    data = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {shown(name)}"
        if not isinstance(entry, dict):
            raise bad(f"{where}: expected an object with dtype, shape and "
                      f"data_offsets; received {shown(entry)}")
        dtype, shape = entry.get("dtype"), entry.get("shape")
        offsets = entry.get("data_offsets")
        if dtype not in _ST_DTYPES:
            raise bad(f"{where}: dtype={shown(dtype)} is not one of "
                      f"{sorted(_ST_DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= 8
                and all(_is_count(d) for d in shape)):
            raise bad(f"{where}: shape={shown(shape)} is not a list of up "
                      "to 8 non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1] <= data):
            raise bad(f"{where}: data_offsets={shown(offsets)} is not a "
                      f"byte range inside the file's {data} bytes of data "
                      "(truncated?)")
        need = int(np.prod(shape, dtype=object)) * _ST_DTYPES[dtype]
        if offsets[1] - offsets[0] != need:
            raise bad(f"{where}: data_offsets={offsets} hold "
                      f"{offsets[1] - offsets[0]} bytes; dtype {dtype} and "
                      f"shape {shape} need {need}")
    return header


def read_safetensors(path):
    """``{name: numpy array}`` of a ``.safetensors`` file (no torch),
    checked by :func:`check_safetensors` first; any failure is a
    :class:`~keras_vit.zoo.convert.CheckpointError` naming the file."""
    st = require("safetensors.numpy", package="safetensors",
                 purpose="timm / Hub weights")
    path = os.fspath(path)
    check_safetensors(path)
    try:
        return st.load_file(path)
    except Exception as e:  # noqa: BLE001 - SafetensorError and kin
        raise convert.CheckpointError(
            f"{path}: cannot read it as a .safetensors file: "
            f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
