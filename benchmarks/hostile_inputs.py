"""Issue 24's hostile inputs, before and after: each case builds its input
(a few bytes to a few MB: a ``.keras`` whose config asks for 100 GB, a zip
bomb, a 12000x12000 PNG, a Hub endpoint on 127.0.0.1 that serves 400 MB,
trickles or never answers, a FIFO named ``x.png``, ...), runs the command a
user would run in a child process capped at ``--cap`` seconds, and prints a
markdown table: exit status, wall seconds, the child's peak RSS, the last
line it printed, and whether it met the bound below.

    python benchmarks/hostile_inputs.py --out docs/hostile_inputs.md
    python benchmarks/hostile_inputs.py --backend jax --cases predict_png_12000
    python benchmarks/hostile_inputs.py --quick --cases cpu_devices  # seconds

The bound: the command ends by itself within
the cap, with the exit status a refusal or a success has (never 1, never a
traceback), and a hostile input of at most 10 MB raises the peak RSS by
less than 1 GiB over the baseline row, ``keras-vit predict`` of a tiny
model on a tiny image measured the same way in the same run (what
importing the backend and Keras costs). Peak RSS is ``ru_maxrss`` of the
child from ``os.wait4``: it covers the processes the child waited for
(the Hub download's own child) and does not depend on the machine's load.
On Linux that figure starts at the parent's RSS (see
``keras_vit.export.memory.own_peak_rss``); this script imports no backend,
so the few MB it holds are inside the baseline row too.

The "before" column holds the figures first measured, before the
commands were hardened (on a 2-core CPU, TensorFlow); the figures after
it are this run's. ``--quick`` shrinks the inputs (48 and 96 MB zip
bombs, 5000x5000 images, a 24 MB Hub config) to test the script in
seconds; its rows say nothing about the full sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

# The benchmarks' shared --out writer, a sibling module (this folder is
# sys.path[0] when run as a script, not when loaded by path from a test).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from speed_tables import emit  # noqa: E402

GIB = 2**30
BOUND_MIB = 1024
# The command-line Hub rows wait on huggingface_hub's own timeouts and
# retries (an endpoint that never answers: ~7.5 min measured).
LONG_CAP = 5
BACKENDS = ("tensorflow", "jax", "torch")
BEFORE_LABEL = "before (first measured)"
# The tiny model of the baseline and of every case that needs a valid one
# (a zoo.load override of ViT-Ti/16: 16 px, one block of width 32).
TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64, num_classes=10)
REPO = "timm/vit_hostile"
# Lines TensorFlow's C++ logging prints before Python can silence it; they
# are not the command's message.
_NOISE = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} "
                    r"|To enable the following instructions|rebuild "
                    r"TensorFlow with)")
# "path.py:584: UserWarning: text": where Python's warnings start.
_WARNING = re.compile(r":\d+: (\w*Warning: )")


@dataclasses.dataclass
class Case:
    name: str
    what: str
    before: str
    build: object  # (Workspace) -> (argv, extra environment)
    expect: tuple = (2,)  # exit statuses of a clear refusal or a success
    shown: str = ""  # the command as the table shows it (default: argv)
    long: bool = False  # capped at LONG_CAP times --cap
    says: str = ""  # text the last line must hold (the refusal expected)


@dataclasses.dataclass
class Result:
    case: Case
    argv: list
    exit: int
    wall: float
    rss_mib: float
    message: str
    timed_out: bool
    traceback: bool
    note: str = ""


class Workspace:
    """The temporary folder the inputs are built in, the tiny model and
    image every case shares, and the Hub servers (stopped at the end)."""

    def __init__(self, root, quick, backend):
        self.root = root
        self.quick = quick
        self.env = dict(os.environ, KERAS_BACKEND=backend,
                        TF_CPP_MIN_LOG_LEVEL="3")
        self.servers = []
        self._tiny = None

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def _child(self, code, *args):
        """Runs ``code`` in a child Python (this process never imports
        Keras); its output is shown only if it fails. The child ends
        without the interpreter's teardown (unloading TensorFlow: about 1.6
        CPU seconds), which nothing here waits for."""
        code += "\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n"
        proc = subprocess.run([sys.executable, "-c", code, *args],
                              env=self.env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"building the inputs failed:\n{proc.stderr}")

    def tiny(self):
        """``(tiny.keras, a 20x20 PNG)``, built once."""
        if self._tiny is None:
            folder = self.path("tiny")
            os.makedirs(folder)
            self._child("import json, sys\n"
                        "import keras_vit\n"
                        "keras_vit.vit(**json.loads(sys.argv[2])).save("
                        "sys.argv[1])\n", os.path.join(folder, "tiny.keras"),
                        json.dumps(TINY))
            image = write_png(os.path.join(folder, "x.png"), 20, 20)
            self._tiny = os.path.join(folder, "tiny.keras"), image
        return self._tiny

    def repo(self):
        """A timm repository folder (ViT-Ti/16 at 32 px, 3 classes),
        written by ``zoo.save_pretrained``, built once."""
        folder = self.path("repo")
        if not os.path.isdir(folder):
            self._child("import sys\n"
                        "from keras_vit import zoo\n"
                        "model = zoo.load('ViT-Ti/16', weights=None, "
                        "image_size=32, num_classes=3, gelu='exact')\n"
                        "zoo.save_pretrained(model, sys.argv[1])\n", folder)
        return folder

    def hub(self, **kwargs):
        """A :class:`HubServer` and the environment that points
        huggingface_hub at it, with a cache of its own."""
        server = HubServer(**kwargs)
        self.servers.append(server)
        home = tempfile.mkdtemp(prefix="hf-", dir=self.root)
        return server, {"HF_ENDPOINT": server.url, "HF_HOME": home,
                        "HF_HUB_DISABLE_TELEMETRY": "1",
                        "HF_HUB_OFFLINE": None}

    def close(self):
        for server in self.servers:
            server.stop()


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def write_png(path, width, height, alpha=False):
    """A black RGB (or RGBA) PNG of ``width`` x ``height``, written row by
    row (a 12000x12000 RGB one is ~420 KB on disk and 432 MB decoded)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    channels, color_type = (4, 6) if alpha else (3, 2)
    deflate = zlib.compressobj(9)
    row = b"\x00" * (1 + channels * width)  # filter byte "none", pixels
    data = b"".join(deflate.compress(row) for _ in range(height))
    data += deflate.flush()
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                           color_type, 0, 0, 0)))
        f.write(chunk(b"IDAT", data))
        f.write(chunk(b"IEND", b""))
    return path


def rewrite_keras(source, path, update=None, inflate=None):
    """A copy of the ``.keras`` file ``source`` with ``update`` merged into
    its model's config, or with the member ``inflate[0]`` padded to
    ``inflate[1]`` bytes and deflated as it is written (a zip bomb)."""
    member, total = inflate or (None, 0)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(
            path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "config.json" and update is not None:
                config = json.loads(data)
                config["config"].update(update)
                data = json.dumps(config).encode()
            if name != member:
                dst.writestr(name, data)
                continue
            with dst.open(name, "w") as f:
                for part in padded(data, total):
                    f.write(part)
    return path


def padded(head, total, step=16 << 20):
    """``head``, then spaces up to ``total`` bytes, in chunks of ``step``:
    a config.json stays valid JSON, an HDF5 file readable."""
    yield head
    left = total - len(head)
    while left > 0:
        yield b" " * min(step, left)
        left -= step


def class_folders(root, per_class=4):
    """``root/a`` and ``root/b`` with ``per_class`` tiny PNGs each."""
    for c in ("a", "b"):
        os.makedirs(os.path.join(root, c))
        for i in range(per_class):
            write_png(os.path.join(root, c, f"{i}.png"), 8, 8)
    return root


class HubServer:
    """A Hugging Face Hub endpoint on 127.0.0.1 for ``REPO``:
    ``files`` ({name: (size, chunks)}, the body made as it is sent, with
    its sha256 as the ETag), or ``trickle`` (a byte every 2 s, headers
    first), or ``mute`` (the kernel accepts; nobody answers)."""

    def __init__(self, files=None, trickle=False, mute=False):
        import http.server
        import socket
        import threading

        self.listener = None
        self.httpd = None
        if mute:
            self.listener = socket.socket()
            self.listener.bind(("127.0.0.1", 0))
            self.listener.listen(16)
            self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
            return
        files = dict(files or {})
        etags = {}
        for name, (_size, chunks) in files.items():
            digest = hashlib.sha256()
            for part in chunks():
                digest.update(part)
            etags[name] = digest.hexdigest()

        class Handler(http.server.BaseHTTPRequestHandler):
            def reply(self, status, size, **headers):
                self.send_response(status)
                headers["Content-Length"] = str(size)
                for key, value in headers.items():
                    self.send_header(key.replace("_", "-"), value)
                self.end_headers()

            def headers_for(self):
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                known = name in files or trickle
                if not (self.path.startswith(f"/{REPO}/resolve/") and known):
                    self.reply(404, 0, X_Error_Code="EntryNotFound")
                    return None
                self.reply(200, files[name][0] if name in files else 1000,
                           X_Repo_Commit="b" * 40,
                           ETag=f'"{etags.get(name, "c" * 64)}"')
                return name

            def do_HEAD(self):  # noqa: N802
                self.headers_for()

            def do_GET(self):  # noqa: N802
                name = self.headers_for()
                if name is None:
                    return
                try:
                    if trickle:
                        for _ in range(1000):
                            self.wfile.write(b"x")
                            self.wfile.flush()
                            time.sleep(2)
                    else:
                        for part in files[name][1]():
                            self.wfile.write(part)
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever,
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.listener is not None:
            self.listener.close()


# ---------------------------------------------------------------------------
# The cases: each returns (argv, extra environment)
# ---------------------------------------------------------------------------


def _predict(model, image, *extra):
    return ["keras-vit", "predict", model, image, *extra]


def _fine_tune(model, data, out, *extra):
    return ["keras-vit", "fine-tune", model, "--data", data, "--out", out,
            "--steps", "2", "--batch-size", "4", "--warmup-steps", "0",
            "--image-size", "16", "--no-eval", "--quiet", *extra]


def baseline(ws):
    tiny, image = ws.tiny()
    return _predict(tiny, image), {}


def hostile_keras(stem, update=None, member=None, quick_size=0):
    """``keras-vit predict`` of the tiny model saved as ``stem.keras`` with
    ``update`` merged into its config, or its ``member`` inflated to 1.5 GB
    (``quick_size`` bytes with --quick)."""
    def build(ws):
        tiny, image = ws.tiny()
        inflate = member and (member, quick_size if ws.quick
                              else 1_500_000_000)
        path = rewrite_keras(tiny, ws.path(f"{stem}.keras"), update, inflate)
        return _predict(path, image), {}
    return build


def timm_input_size(ws):
    _, image = ws.tiny()
    repo = ws.repo()
    folder = ws.path("timm_repo")
    shutil.copytree(repo, folder)
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.setdefault("pretrained_cfg", {})["input_size"] = [
        3, 1_000_000, 1_000_000]
    with open(config_path, "w") as f:
        json.dump(config, f)
    return _predict(folder, image), {}


def finetune_image_size(ws):
    return (["keras-vit", "fine-tune", "ViT-Ti/16", "--data", "digits",
             "--weights", "none", "--out", ws.path("run_size"),
             "--image-size", "100000"], {})


def predict_png(side, quick_side, alpha=False):
    """``keras-vit predict`` of the tiny model on one black PNG."""
    def build(ws):
        tiny, _ = ws.tiny()
        size = quick_side if ws.quick else side
        image = write_png(ws.path(f"big{size}{'a' * alpha}.png"), size, size,
                          alpha)
        return _predict(tiny, image), {}
    return build


def predict_gif_frames(ws):
    """``keras-vit predict`` of the tiny model on a GIF of 300 frames of
    3000x3000 (2.3 MB; 100 frames of 1000x1000 with --quick): giflib
    reads every frame into memory unless only the first is handed to it."""
    tiny, _ = ws.tiny()
    side, count = (1000, 100) if ws.quick else (3000, 300)
    image = ws.path(f"frames{side}.gif")
    # In a child: Pillow holds every frame (2.7 GB), and the children
    # forked from this process would start with that resident size.
    ws._child("import sys\n"
              "from PIL import Image\n"
              "side, count = int(sys.argv[2]), int(sys.argv[3])\n"
              "frames = (Image.new('P', (side, side), i % 7 + 1)\n"
              "          for i in range(count - 1))\n"
              "Image.new('P', (side, side)).save(sys.argv[1], save_all=True,\n"
              "                                  append_images=frames)\n",
              image, str(side), str(count))
    return _predict(tiny, image), {}


def train_folder_png(side, quick_side):
    """``keras-vit fine-tune`` of the tiny model on a folder of 8 small
    PNGs and 6 black ones of ``side`` x ``side``."""
    def build(ws):
        tiny, _ = ws.tiny()
        size = quick_side if ws.quick else side
        root = class_folders(ws.path(f"data{size}"))
        big = write_png(ws.path(f"train{size}.png"), size, size)
        for i in range(6):
            shutil.copy(big, os.path.join(root, "ab"[i % 2], f"big{i}.png"))
        return _fine_tune(tiny, root, ws.path(f"run{size}")), {}
    return build


def hub_config(ws):
    _, image = ws.tiny()
    repo = ws.repo()
    size = (24 << 20) if ws.quick else 400_000_000
    with open(os.path.join(repo, "config.json"), "rb") as f:
        head = f.read()
    with open(os.path.join(repo, "model.safetensors"), "rb") as f:
        weights = f.read()

    server, env = ws.hub(files={
        "config.json": (size, lambda: padded(head, size, 1 << 20)),
        "model.safetensors": (len(weights), lambda: iter([weights]))})
    return _predict(f"hf-hub:{REPO}", image), env


def hub_fetch(**server):
    """``timm_hub.fetch`` of the endpoint with a 15 s deadline (through
    ``zoo.load`` and the command line: the bucket downloads' 3 h deadline
    and the minimum-throughput window, ``KERAS_VIT_DOWNLOAD_STALL_S``)."""
    def build(ws):
        _, env = ws.hub(**server)
        code = ("import sys\n"
                "from keras_vit.zoo.download import cache as download_cache\n"
                "from keras_vit.zoo.timm import hub as timm_hub\n"
                "try:\n"
                f"    timm_hub.fetch('hf-hub:{REPO}', "
                f"deadline={HUB_DEADLINE})\n"
                "except download_cache.DownloadError as e:\n"
                "    sys.exit(f'DownloadError: {e}')\n")
        return [sys.executable, "-c", code], env
    return build


def hub_predict(**server):
    """``keras-vit predict hf-hub:...`` of the endpoint, with the
    command's own bounds (huggingface_hub's defaults)."""
    def build(ws):
        _, image = ws.tiny()
        _, env = ws.hub(**server)
        return _predict(f"hf-hub:{REPO}", image), env
    return build


def fifo_in_folder(ws):
    tiny, _ = ws.tiny()
    root = class_folders(ws.path("fifo_data"))
    os.mkfifo(os.path.join(root, "a", "x.png"))
    return _fine_tune(tiny, root, ws.path("run_fifo")), {}


def cpu_devices(ws):
    tiny, _ = ws.tiny()
    return (["keras-vit", "fine-tune", tiny, "--data", "digits", "--out",
             ws.path("run_cpu"), "--cpu-devices", "100000"], {})


def predict_image_size(ws):
    _, image = ws.tiny()
    return _predict("ViT-B/16", image, "--weights", "none", "--image-size",
                    "4000"), {}


HUB_DEADLINE = 15
HUB_SHOWN = (f"python -c \"timm_hub.fetch('hf-hub:{REPO}', "
             f"deadline={HUB_DEADLINE})\"")
FOUND_HERE = "not in the issue (found by this script)"
HUB_HANG = "hangs zoo.load forever (the hub route has no deadline)"
BASELINE = Case("baseline", "predict: a tiny .keras model on a 20x20 PNG",
                "-", baseline, expect=(0,))
CASES = [
    Case("keras_4096x200", ".keras (~40 KB) whose config says width 4096 x "
         "200 layers", "6.5 GB before the cap (it would need ~160 GB)",
         hostile_keras("wide", dict(hidden_size=4096, num_layers=200,
                                    num_heads=16, mlp_dim=16384))),
    Case("keras_hidden_1e6", ".keras (~40 KB) whose config says "
         "hidden_size 1e6", "3.2 GB, 49 s, then an \"out of memory, lower "
         "--batch-size\" hint for a command that has no batch",
         hostile_keras("hidden", dict(hidden_size=1_000_000, num_heads=1))),
    Case("keras_zip_bomb", ".keras (~1.5 MB) holding a 1.5 GB config.json",
         "1.6 MB .keras: loads, 3.9 GB",
         hostile_keras("bomb", member="config.json", quick_size=48 << 20)),
    Case("keras_weights_bomb", ".keras (~1.5 MB) whose model.weights.h5 "
         "inflates to 1.5 GB (not in the issue: found by this script)",
         "not in the issue; before the fix (zoo/resolve.py): loads, exit 0, "
         "18.6 s, 3.6 GB peak", hostile_keras(
             "weights_bomb", member="model.weights.h5", quick_size=96 << 20)),
    Case("timm_input_size", "timm repository folder, config.json "
         "input_size 1e6", "the model is built and the allocation tried",
         timm_input_size),
    Case("finetune_image_size", "fine-tune ViT-Ti/16 --image-size 100000",
         "11 GB and 58 s before failing, with the memory check on",
         finetune_image_size),
    Case("predict_image_size", "predict ViT-B/16 (weights none) "
         "--image-size 4000", "31 s, 3.9 GB, then TensorFlow's OOM and a "
         "--batch-size hint (commit 9211170, not in the issue's list)",
         predict_image_size),
    Case("predict_png_12000", "predict a 12000x12000 RGB PNG (~420 KB)",
         "5.9 GB peak", predict_png(12000, 5000), expect=(0, 2)),
    Case("train_folder_png_12000", "fine-tune on a folder with six "
         "12000x12000 PNGs among 8 small ones", "5.2 GB",
         train_folder_png(12000, 9500), expect=(0,)),
    Case("predict_png_rgba_13300", "predict a 13300x13300 RGBA PNG (~690 "
         "KB; not in the issue: found by this script)", FOUND_HERE,
         predict_png(13300, 5000, alpha=True), expect=(0, 2)),
    Case("train_folder_png_9450", "fine-tune on a folder with six "
         "9450x9450 PNGs (~330 KB each; not in the issue: found by this "
         "script)", FOUND_HERE, train_folder_png(9450, 3000), expect=(0,)),
    Case("predict_gif_frames", "predict a GIF of 300 frames of 3000x3000 "
         "(2.3 MB; not in the issue: found with the one decoder)",
         FOUND_HERE, predict_gif_frames, expect=(0,)),
    Case("hub_config_400mb", "predict hf-hub: whose config.json is 400 MB",
         "421 MB on disk and 1.6 GB of memory before it is rejected",
         hub_config, says="refused before download"),
    Case("hub_trickle", "zoo.load's hub download from an endpoint that "
         "trickles a byte every 2 s (the body; headers at once)", HUB_HANG,
         hub_fetch(trickle=True), expect=(1,), shown=HUB_SHOWN,
         says="did not finish within"),
    Case("hub_mute", "zoo.load's hub download from an endpoint that "
         "accepts and never answers", HUB_HANG, hub_fetch(mute=True),
         expect=(1,), shown=HUB_SHOWN, says="did not finish within"),
    Case("hub_trickle_cli", "hub_trickle through the command line (its "
         "bound: under 64 KiB in the 300 s KERAS_VIT_DOWNLOAD_STALL_S "
         "window stops it)", HUB_HANG,
         hub_predict(trickle=True), long=True, says="stalled"),
    Case("hub_mute_cli", "hub_mute through the command line (its bounds: "
         "huggingface_hub's timeouts and retries)", HUB_HANG,
         hub_predict(mute=True), long=True),
    Case("fifo_in_folder", "fine-tune on a folder holding a FIFO named "
         "x.png", "hangs fine-tune with no output (PIL blocks opening it)",
         fifo_in_folder, expect=(0,)),
    Case("cpu_devices", "fine-tune --cpu-devices 100000",
         "hangs with no output", cpu_devices),
]


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def _kill_tree(pid):
    """Kills ``pid``'s process group and every descendant of it (the Hub
    download runs in a session of its own), read from /proc where there
    is one."""
    children = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
    os.killpg(pid, signal.SIGKILL)


def run_child(argv, env, cap, cwd):
    """``(exit status, wall s, peak RSS MiB, stdout, stderr, timed out)``
    of ``argv``, killed (its process group) after ``cap`` seconds."""
    with tempfile.TemporaryFile("w+") as out, \
            tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - start > cap:
                    timed_out = True
                    _kill_tree(proc.pid)
                    _, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
        except BaseException:  # Ctrl-C: the child has a session of its own
            _kill_tree(proc.pid)
            proc.wait()
            raise
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        # ru_maxrss is in KiB on Linux.
        return (proc.returncode, wall, usage.ru_maxrss / 1024, out.read(),
                err.read(), timed_out)


def message_of(stdout, stderr):
    """The command's last word: its last stderr line that is not
    TensorFlow's start-up logging nor the source line Python's warnings
    echo (a warning is shown from its category on), else its last stdout
    line."""
    for text in (stderr, stdout):
        lines = []
        for line in text.splitlines():
            if not line.strip() or _NOISE.match(line):
                continue
            if line[:1].isspace() and lines and _WARNING.search(lines[-1]):
                continue  # the warning's source line
            lines.append(line.strip())
        if lines:
            found = _WARNING.search(lines[-1])
            return lines[-1][found.start(1):] if found else lines[-1]
    return ""


def measure(case, ws, cap):
    argv, extra = case.build(ws)
    env = dict(ws.env)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    code, wall, rss, out, err, timed_out = run_child(
        argv, env, cap * (LONG_CAP if case.long else 1), ws.root)
    note = ""
    if "HF_HOME" in extra:
        written = sum(os.path.getsize(os.path.join(d, f))
                      for d, _, fs in os.walk(extra["HF_HOME"]) for f in fs
                      if not os.path.islink(os.path.join(d, f)))
        note = f"{written / 1e6:.0f} MB written to the Hub cache"
    return Result(case, argv, code, wall, rss, message_of(out, err),
                  timed_out, "Traceback (most recent call last)" in err,
                  note)


# Exceptions that say the code broke, not what was wrong with the input:
# a message naming one fails its case.
INTERNAL_ERRORS = ("AttributeError", "TypeError", "RecursionError",
                   "KeyError", "IndexError", "NameError",
                   "unexpected failure")


def verdict(result, base_mib, cap):
    if result.timed_out:
        cap *= LONG_CAP if result.case.long else 1
        return f"NOT met: still running at the {cap:g} s cap"
    if result.traceback:
        return "NOT met: a traceback"
    if result.exit not in result.case.expect:
        return f"NOT met: exit {result.exit}"
    internal = [name for name in INTERNAL_ERRORS if name in result.message]
    if internal:  # a refusal must say what is wrong, not how it broke
        return f"NOT met: the message names {internal[0]}"
    if result.case.says and result.case.says not in result.message:
        return f"NOT met: the message lacks {result.case.says!r}"
    over = result.rss_mib - base_mib
    if over >= BOUND_MIB:
        return f"NOT met: +{over / 1024:.1f} GiB"
    return "met"


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def _shown(text, root, width=600):
    text = text.replace(root, "$TMP").replace(sys.executable, "python")
    text = " ".join(text.split())
    if len(text) > width:
        text = text[:width - 3] + "..."
    return text.replace("|", "\\|")


def command_of(argv, root):
    return _shown(shlex.join(argv), root, 160)


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu():
    """The CPU's model name, core count and the flags its speed and bf16
    paths hinge on, as keras_vit.runtime.hardware reads them
    (/proc/cpuinfo)."""
    from keras_vit.runtime import hardware

    flags = hardware.cpu_flags()
    name = hardware.cpu_model() or platform.machine()
    return (f"{name}, {os.cpu_count()} logical cores; flags: "
            + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}"
                        for flag in ("avx2", "avx512_bf16", "amx_bf16")))


def header(args, argv):
    from keras_vit.runtime import hardware

    total, available = hardware.memory_total(), hardware.available_memory()
    packages = ["keras-vit", "keras", args.backend, "numpy", "pillow",
                "huggingface_hub"]
    lines = [
        "# Hostile inputs, before and after",
        "",
        "- command: `python benchmarks/hostile_inputs.py "
        + " ".join(shlex.quote(a) for a in argv) + "`",
        "- date: " + datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"),
        f"- CPU: {cpu()}",
        f"- memory: {total / GIB:.1f} GiB, "
        f"{available / GIB:.1f} GiB available at the start",
        f"- KERAS_BACKEND={args.backend}; python "
        f"{platform.python_version()}, "
        + ", ".join(f"{p} {_version(p)}" for p in packages),
        f"- bound: the command ends by itself within {args.cap:g} s "
        f"({args.cap * LONG_CAP:g} s for the command-line Hub rows) with "
        "the exit status of a clear refusal or success (never a "
        f"traceback), its peak RSS less than {BOUND_MIB} MiB over the "
        "baseline row's",
    ]
    if args.quick:
        lines.append("- Smoke run (--quick): smaller inputs, the rows say "
                     "nothing about the full sizes")
    return lines


def table(results, base_mib, cap, root):
    head = ["case", "command", BEFORE_LABEL, "exit", "wall s",
            "peak RSS MiB", "over baseline MiB", "message", "verdict"]
    rows = ["| " + " | ".join(head) + " |",
            "|" + "---|" * len(head)]
    for r in results:
        over = ("-" if r.case is BASELINE
                else f"{r.rss_mib - base_mib:+.0f}")
        cells = [r.case.name,
                 f"`{r.case.shown or command_of(r.argv, root)}`",
                 r.case.before, str(r.exit), f"{r.wall:.1f}",
                 f"{r.rss_mib:.0f}", over,
                 _shown(r.message, root) or "(no output)",
                 "-" if r.case is BASELINE else verdict(r, base_mib, cap)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def pick(names):
    known = {case.name: case for case in CASES}
    if names is None:
        return CASES
    chosen = []
    for name in names.split(","):
        name = name.strip()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            raise SystemExit(
                f"unknown case {name!r}"
                + (f"; did you mean {', '.join(close)}?" if close else "")
                + f" (cases: {', '.join(known)})")
        chosen.append(known[name])
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller inputs: tests the script in seconds")
    parser.add_argument("--backend", choices=BACKENDS, default="tensorflow",
                        help="KERAS_BACKEND of the children")
    parser.add_argument("--cases", help="comma list of case names "
                        "(default: all)")
    parser.add_argument("--cap", type=float, default=120.0,
                        help="seconds each command may run (default 120)")
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args(argv)
    if args.cap <= 0:
        parser.error(f"--cap must be positive; received --cap={args.cap}")
    if not hasattr(os, "mkfifo") or not hasattr(os, "wait4"):
        raise SystemExit("this script measures with os.wait4 and makes "
                         "FIFOs: Linux or macOS only")
    cases = pick(args.cases)
    # A kill(1) ends the running child and the Hub servers too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    argv = sys.argv[1:] if argv is None else argv
    results = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as root:
        ws = Workspace(root, args.quick, args.backend)
        try:
            for case in [BASELINE, *cases]:
                print(f"[{case.name}] ...", file=sys.stderr, flush=True)
                results.append(measure(case, ws, args.cap))
                r = results[-1]
                print(f"[{case.name}] exit {r.exit}, {r.wall:.1f} s, "
                      f"{r.rss_mib:.0f} MiB: {r.message[:160]}",
                      file=sys.stderr, flush=True)
        finally:
            ws.close()
        base_mib = results[0].rss_mib
        lines = [*header(args, argv), "", f"## {args.backend}", "",
                 *table(results, base_mib, args.cap, root)]
    notes = [f"- {r.case.name}: {r.case.what}"
             + (f"; {r.note}" if r.note else "") for r in results]
    lines += ["", "Cases:", "", *notes]
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
