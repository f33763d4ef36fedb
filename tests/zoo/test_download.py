"""Tests for keras_vit.zoo.download.fetch against a local HTTP server (no internet)."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from _fake_hub import FakeHub, send_slowly
from testkit import bad_calls_test
from keras_vit import zoo
from keras_vit.zoo.download import fetch as download
from keras_vit.zoo.download import cache as download_cache
from keras_vit.zoo.download import http as http_fetch

OFFICIAL = "https://storage.googleapis.com/vit_models/test/"
def _npz_bytes(size):
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, data=np.frombuffer(os.urandom(size), "uint8"))
    return buf.getvalue()


GOOD = _npz_bytes(300 * 1024)  # a whole .npz: downloads check the archive
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()
SLOW_DELAY = 1.5  # seconds the slow path waits before answering


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves /files/vit_models/test/<name>; behaviour depends on <name>."""

    counts = Counter()
    counts_lock = threading.Lock()

    def do_GET(self):  # noqa: N802 (http.server API)
        with self.counts_lock:
            self.counts[self.path] += 1
        name = self.path.rsplit("/", 1)[-1]
        if name in ("good.npz", "bad.npz", "ViT-B_16.npz"):
            self._send(GOOD)
        elif name == "slow.npz":
            time.sleep(SLOW_DELAY)
            self._send(GOOD)
        elif name == "truncated.npz":
            # Announce more than we send, then close the connection.
            self.send_response(200)
            self.send_header("Content-Length", str(len(GOOD) + 100_000))
            self.end_headers()
            self.wfile.write(GOOD[: len(GOOD) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif name == "trickle.npz":  # a byte every 0.2 s
            self.send_response(200)
            self.send_header("Content-Length", str(len(GOOD)))
            self.end_headers()
            send_slowly(self.wfile, GOOD, 0.2)
        elif name == "error500.npz":
            self.send_error(500, "boom")
        else:
            self.send_error(404, "not found")

    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/files/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def env(server, tmp_path, monkeypatch):
    """Fresh cache dir, mirror pointing at the local server, zeroed request counts."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(cache))
    monkeypatch.setenv("KERAS_VIT_MIRROR", server)
    monkeypatch.delenv("KERAS_VIT_OFFLINE", raising=False)
    _Handler.counts.clear()
    return cache


def gets(name):
    return _Handler.counts[f"/files/vit_models/test/{name}"]


def leftovers(directory):
    """Files in ``directory`` other than lock files (which are kept on purpose)."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


# --- configuration ---------------------------------------------------------


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_VIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert download_cache.cache_dir() == tmp_path / "xdg" / "keras_vit"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "explicit"))
    assert download_cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("KERAS_VIT_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert download_cache.cache_dir() == Path.home() / ".cache" / "keras_vit"
    assert not (tmp_path / "xdg").exists()  # not created on demand


@pytest.mark.parametrize(
    "value, expected",
    [("1", True), ("TRUE", True), ("Yes", True), ("on", True), ("0", False),
     ("", False), ("no", False)],
)
def test_is_offline(monkeypatch, value, expected):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", value)
    assert download.is_offline() is expected


@pytest.mark.parametrize("mirror", ["http://127.0.0.1:8000/files/", "http://127.0.0.1:8000/files"])
def test_resolve_url_mirror_and_gs(monkeypatch, mirror):
    monkeypatch.setenv("KERAS_VIT_MIRROR", mirror)
    expected = "http://127.0.0.1:8000/files/vit_models/imagenet21k/ViT-B_16.npz"
    assert download.resolve_url(OFFICIAL.replace("test/", "imagenet21k/ViT-B_16.npz")) == expected
    assert download.resolve_url("gs://vit_models/imagenet21k/ViT-B_16.npz") == expected
    # URLs outside the official bucket host are never rewritten.
    assert download.resolve_url("https://example.com/x.npz") == "https://example.com/x.npz"


def test_resolve_url_without_mirror(monkeypatch):
    monkeypatch.delenv("KERAS_VIT_MIRROR", raising=False)
    assert (download.resolve_url("gs://vit_models/a/b.npz")
            == download_cache.OFFICIAL_BASE + "vit_models/a/b.npz")
    assert download.resolve_url(OFFICIAL + "x.npz") == OFFICIAL + "x.npz"


def test_cache_paths_distinct_and_mirror_independent(tmp_path, monkeypatch):
    a = download_cache.cache_path_for(
        download_cache.OFFICIAL_BASE + "vit_models/imagenet21k/ViT-B_16.npz", tmp_path)
    b = download_cache.cache_path_for(
        download_cache.OFFICIAL_BASE
        + "vit_models/imagenet21k%2Bimagenet2012/ViT-B_16.npz", tmp_path
    )
    assert a != b
    assert a.name == b.name == "ViT-B_16.npz"
    assert b.parent.name == "imagenet21k+imagenet2012"  # url-unquoted
    assert a == tmp_path / "storage.googleapis.com" / "vit_models" / "imagenet21k" / "ViT-B_16.npz"
    # gs:// and https:// spellings share a cache entry; the mirror does not matter.
    monkeypatch.setenv("KERAS_VIT_MIRROR", "http://127.0.0.1:1/m/")
    assert download_cache.cache_path_for("gs://vit_models/imagenet21k/ViT-B_16.npz", tmp_path) == a


def test_cache_path_cannot_escape_cache(tmp_path):
    p = download_cache.cache_path_for(
        "https://storage.googleapis.com/a/../../etc/pass wd", tmp_path)
    assert tmp_path in p.parents
    assert ".." not in p.parts
    assert p.name == "pass_wd"


@pytest.mark.parametrize("bad", ["file:///tmp/x.npz", "/tmp/x.npz", "ftp://host/x.npz"])
def test_bad_scheme_raises_value_error(bad, tmp_path):
    with pytest.raises(ValueError, match="url") as info:
        download.fetch(bad, cache_dir=tmp_path)
    assert repr(bad) in str(info.value)


def test_malformed_sha256_raises_value_error(env):
    with pytest.raises(ValueError, match="sha256"):
        download.fetch(OFFICIAL + "good.npz", sha256="abc")
    assert gets("good.npz") == 0


# --- downloading -----------------------------------------------------------


def test_good_file_downloaded_once_then_cached(env):
    url = OFFICIAL + "good.npz"
    path = download.fetch(url, sha256=GOOD_SHA, progress=False)
    assert path == download_cache.cache_path_for(url, env)
    assert path.read_bytes() == GOOD
    assert download_cache.sha256_file(path) == GOOD_SHA
    assert json.loads((path.parent / "good.npz.sha256").read_text())["sha256"] == GOOD_SHA
    assert download.fetch(url, sha256=GOOD_SHA.upper()) == path
    assert download.fetch(url) == path
    assert gets("good.npz") == 1
    assert leftovers(path.parent) == ["good.npz", "good.npz.sha256"]


def test_gs_url_downloads_through_mirror_without_trailing_slash(env, server, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.rstrip("/"))
    path = download.fetch("gs://vit_models/test/good.npz", progress=False)
    assert path.read_bytes() == GOOD
    assert gets("good.npz") == 1


def test_sidecar_skips_rehash_until_file_changes(env, monkeypatch):
    url = OFFICIAL + "good.npz"
    path = download.fetch(url, sha256=GOOD_SHA, progress=False)

    def no_hashing(_):
        raise AssertionError("cached file was re-hashed despite a valid sidecar")

    with monkeypatch.context() as m:
        m.setattr(download_cache, "sha256_file", no_hashing)
        assert download.fetch(url, sha256=GOOD_SHA) == path

    # Same size, different content and mtime: the sidecar no longer applies.
    path.write_bytes(bytes(len(GOOD)))
    with pytest.raises(download_cache.ChecksumError, match=GOOD_SHA):
        download.fetch(url, sha256=GOOD_SHA)
    assert gets("good.npz") == 1


def test_checksum_mismatch_leaves_nothing(env):
    url = OFFICIAL + "bad.npz"
    wrong = "0" * 64
    with pytest.raises(download_cache.ChecksumError) as info:
        download.fetch(url, sha256=wrong, progress=False)
    msg = str(info.value)
    assert wrong in msg and GOOD_SHA in msg and "bad.npz" in msg
    final = download_cache.cache_path_for(url, env)
    assert not final.exists()
    assert leftovers(final.parent) == []


def test_truncated_transfer_raises_and_leaves_nothing(env):
    url = OFFICIAL + "truncated.npz"
    with pytest.raises(download_cache.DownloadError, match="truncated") as info:
        download.fetch(url, progress=False)
    assert not isinstance(info.value, download_cache.ChecksumError)
    assert f"of {len(GOOD) + 100_000} bytes" in str(info.value)
    final = download_cache.cache_path_for(url, env)
    assert not final.exists()
    assert leftovers(final.parent) == []


@pytest.mark.parametrize("name, code", [("error500.npz", 500), ("missing.npz", 404)])
def test_http_errors(env, server, name, code):
    url = OFFICIAL + name
    with pytest.raises(download_cache.DownloadError) as info:
        download.fetch(url, progress=False)
    msg = str(info.value)
    assert str(code) in msg
    assert server + "vit_models/test/" + name in msg
    assert gets(name) == 1
    final = download_cache.cache_path_for(url, env)
    assert not final.exists()
    assert leftovers(final.parent) == []


def test_unreachable_server_mentions_mirror(env, monkeypatch):
    # Port 1 on localhost is essentially never listening: connection refused.
    monkeypatch.setenv("KERAS_VIT_MIRROR", "http://127.0.0.1:1/")
    with pytest.raises(download_cache.DownloadError) as info:
        download.fetch(OFFICIAL + "good.npz", progress=False, timeout=5)
    msg = str(info.value)
    assert "http://127.0.0.1:1/vit_models/test/good.npz" in msg
    assert "KERAS_VIT_MIRROR" in msg


def test_stale_partials_are_removed_fresh_ones_kept(env):
    url = OFFICIAL + "good.npz"
    folder = download_cache.cache_path_for(url, env).parent
    folder.mkdir(parents=True)
    stale = folder / "other.npz.123.abc_xyz1.partial"
    fresh = folder / "other.npz.456.qwertyui.partial"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"new")
    old = time.time() - 2 * 24 * 3600
    os.utime(stale, (old, old))
    download.fetch(url, progress=False)
    assert not stale.exists()
    assert fresh.exists()


# --- offline mode ----------------------------------------------------------


def test_offline_missing_file_explains_where_to_put_it(env, server, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    url = OFFICIAL + "good.npz"
    with pytest.raises(download_cache.OfflineError) as info:
        download.fetch(url)
    msg = str(info.value)
    final = download_cache.cache_path_for(url, env)
    assert "good.npz" in msg
    assert server + "vit_models/test/good.npz" in msg
    assert str(final) in msg
    assert "KERAS_VIT_OFFLINE" in msg and "KERAS_VIT_MIRROR" in msg
    assert isinstance(info.value, download_cache.DownloadError)
    assert sum(_Handler.counts.values()) == 0
    assert not final.parent.exists()


def test_offline_uses_cached_or_hand_placed_file(env, monkeypatch):
    url = OFFICIAL + "good.npz"
    final = download_cache.cache_path_for(url, env)
    final.parent.mkdir(parents=True)
    final.write_bytes(GOOD)  # placed by hand, as the OfflineError suggests
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "yes")
    assert download.fetch(url, sha256=GOOD_SHA) == final
    with pytest.raises(download_cache.ChecksumError):
        download.fetch(url, sha256="f" * 64)
    assert sum(_Handler.counts.values()) == 0


# --- concurrency -----------------------------------------------------------

_CHILD = r"""
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("kv_download", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
start = time.time()
path = mod.fetch(sys.argv[2], sha256=sys.argv[3], progress=False)
print(json.dumps({"path": str(path), "start": start, "end": time.time()}))
"""


def test_two_processes_share_one_download(env):
    url = OFFICIAL + "slow.npz"
    cmd = [sys.executable, "-c", _CHILD, download.__file__, url, GOOD_SHA]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        results.append(json.loads(out))

    # Both were inside fetch at the same time (the slow path guarantees overlap).
    assert max(r["start"] for r in results) < min(r["end"] for r in results)
    paths = {r["path"] for r in results}
    assert len(paths) == 1
    data = [Path(r["path"]).read_bytes() for r in results]
    assert data[0] == data[1] == GOOD
    assert gets("slow.npz") == 1
    assert leftovers(download_cache.cache_path_for(url, env).parent) == [
        "slow.npz", "slow.npz.sha256"]


def test_a_trickling_download_stops_at_the_throughput_rule(env, monkeypatch):
    """A hostile server: one sending a byte every 0.2 s held a download until
    the 3 h deadline; under the minimum-throughput rule (fewer than
    STALL_BYTES in KERAS_VIT_DOWNLOAD_STALL_S, 1 s here) it stops in
    seconds, naming the URL, the bytes so far and the knob."""
    monkeypatch.setenv(http_fetch.ENV_STALL, "1")
    url = OFFICIAL + "trickle.npz"
    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError) as info:
        download.fetch(url, progress=False, timeout=30)
    assert time.monotonic() - start < 5.0
    message = str(info.value)
    assert "trickle.npz" in message and "stalled" in message, message
    assert f"of {len(GOOD)} bytes so far" in message, message
    assert http_fetch.ENV_STALL in message, message
    assert leftovers(download_cache.cache_path_for(url, env).parent) == []


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_bad_stall_window_is_named(monkeypatch, value):
    monkeypatch.setenv(http_fetch.ENV_STALL, value)
    with pytest.raises(ValueError, match=f"KERAS_VIT_DOWNLOAD_STALL_S={value!r}"):
        http_fetch.stall_seconds()


def _hub_env(monkeypatch, hub, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)


def test_a_trickling_hub_download_stops_at_the_throughput_rule(
        tmp_path, monkeypatch):
    """A hostile server: an hf-hub: download from a server sending a byte every
    0.2 s ran to the 3 h deadline; the bucket's minimum-throughput rule
    (KERAS_VIT_DOWNLOAD_STALL_S, 1 s here) stops it in seconds with an
    error naming the repository, its URL and the bytes so far."""
    from keras_vit.zoo import hub_files
    from keras_vit.zoo.download import cache as download_cache
    from keras_vit.zoo.download import http as http_fetch

    files = {"config.json": b"{}", "model.safetensors": bytes(1000)}
    with FakeHub("timm/vit_slow", files, trickle=0.2) as hub:
        _hub_env(monkeypatch, hub, tmp_path)
        monkeypatch.setenv(http_fetch.ENV_STALL, "1")
        start = time.monotonic()
        with pytest.raises(download_cache.DownloadError) as info:
            hub_files.hub_download("timm/vit_slow", files=("model.safetensors",),
                                   progress=False, timeout=30, deadline=600)
        elapsed = time.monotonic() - start
    message = str(info.value)
    assert elapsed < 8.0, elapsed
    assert "hf-hub:timm/vit_slow" in message and "stalled" in message, message
    assert f"{hub.url}/timm/vit_slow" in message, message
    assert "bytes so far" in message and http_fetch.ENV_STALL in message


def test_an_oversized_hub_config_is_refused_before_it_is_written(
        tmp_path, monkeypatch):
    """A hostile server: a 400 MB config.json was downloaded to disk before its
    size was refused; now its HEAD's size refuses it and nothing of it
    reaches the cache."""
    from keras_vit.zoo import hub_files
    from keras_vit.zoo.download import cache as download_cache

    big = b" " * (hub_files.MAX_CONFIG_BYTES + 1)
    files = {"config.json": big, "model.safetensors": bytes(8)}
    with FakeHub("timm/vit_big", files) as hub:
        _hub_env(monkeypatch, hub, tmp_path)
        with pytest.raises(download_cache.DownloadError) as info:
            hub_files.hub_download("timm/vit_big", progress=False, timeout=30,
                                   deadline=60)
        assert hub.gets == []  # HEAD only
    message = str(info.value)
    assert "hf-hub:timm/vit_big" in message, message
    assert f"config.json is {len(big)} bytes" in message, message
    written = [p for p in (tmp_path / "hf").rglob("*") if p.is_file()
               and p.stat().st_size > 1 << 20]
    assert written == []


# ---------------------------------------------------------------------------
# Downloads: an overall deadline, a stall timeout, a bounded lock wait that
# names the holder; a body that is not a whole checkpoint is never cached.
# Servers on 127.0.0.1 only, in a thread, shut down after the module.
# ---------------------------------------------------------------------------


def _small_npz_bytes():
    import io

    buf = io.BytesIO()
    np.savez(buf, a=np.arange(5000, dtype="float32"))
    return buf.getvalue()


NPZ = _small_npz_bytes()


class _BadServer:
    """Each path misbehaves in its own way (see ``do_GET``)."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                name = self.path.rsplit("/", 1)[-1]
                if name == "slow_headers.npz":  # a header byte every 0.2 s
                    head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(NPZ)}"
                            "\r\n" + "X-Pad: " + "x" * 200 + "\r\n\r\n")
                    for byte in head.encode():
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.2)
                    self.wfile.write(NPZ)
                    self.close_connection = True
                elif name == "trickle.npz":  # a byte every 0.2 s, 40 s worth
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(NPZ)))
                    self.end_headers()
                    for i in range(200):
                        try:
                            self.wfile.write(NPZ[i:i + 1])
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.2)
                elif name == "short.npz":  # no Content-Length, half a file
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(NPZ[:len(NPZ) // 2])
                    self.close_connection = True
                elif name == "lying.npz":  # Content-Length below the body
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(NPZ) - 500))
                    self.end_headers()
                    self.wfile.write(NPZ)
                elif name == "html.npz":  # a login page served with 200
                    self._send(b"<html><body>Please sign in</body></html>",
                               {"Content-Type": "text/html"})
                elif name == "html_octet.npz":  # HTML that claims bytes
                    self._send(b"<!doctype html><p>moved</p>")
                else:
                    self._send(NPZ)

            def _send(self, body, headers=()):
                """A well-formed 200: ``headers``, the right
                Content-Length, then ``body``."""
                self.send_response(200)
                for key, value in dict(headers).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def bad_server():
    server = _BadServer()
    yield server.base
    server.stop()


def _cached_files(cache):
    return sorted(p.name for p in cache.rglob("*") if p.is_file()
                  and not p.name.endswith(".lock"))


def test_trickling_server_hits_the_overall_deadline(bad_server, tmp_path):
    from keras_vit.zoo.download import fetch as download
    from keras_vit.zoo.download import cache as download_cache

    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError,
                       match=r"did not finish within 1 s"):
        download.fetch(bad_server + "trickle.npz", cache_dir=tmp_path,
                       timeout=2.0, deadline=1.0, progress=False)
    assert time.monotonic() - start < 5.0
    assert _cached_files(tmp_path) == []


def test_trickled_headers_hit_the_overall_deadline(bad_server, tmp_path):
    # Each header byte comes well within the 2 s stall timeout, so only an
    # overall deadline that covers connect + headers stops it.
    from keras_vit.zoo.download import fetch as download
    from keras_vit.zoo.download import cache as download_cache

    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError,
                       match=r"did not finish within 1 s \(before its "
                             r"response headers"):
        download.fetch(bad_server + "slow_headers.npz", cache_dir=tmp_path,
                       timeout=2.0, deadline=1.0, progress=False)
    assert time.monotonic() - start < 3.0
    assert _cached_files(tmp_path) == []


@pytest.mark.parametrize("name, match", [
    ("short.npz", "not send a complete .npz"),
    ("lying.npz", "not send a complete .npz"),
    ("html.npz", "HTML page"),
    ("html_octet.npz", "not send a complete .npz"),
])
def test_a_body_that_is_not_a_checkpoint_is_never_cached(
        bad_server, tmp_path, name, match):
    from keras_vit.zoo.download import fetch as download
    from keras_vit.zoo.download import cache as download_cache

    with pytest.raises(download_cache.DownloadError, match=match):
        download.fetch(bad_server + name, cache_dir=tmp_path, timeout=5.0,
                       progress=False)
    assert _cached_files(tmp_path) == []
    good = download.fetch(bad_server + "good.npz", cache_dir=tmp_path,
                          timeout=5.0, progress=False)
    assert good.read_bytes() == NPZ


def test_lock_wait_has_a_deadline_and_names_the_holder(bad_server, tmp_path):
    import os

    from keras_vit.zoo.download import fetch as download
    from keras_vit.zoo.download import cache as download_cache

    url = bad_server + "good.npz"
    final = download_cache.cache_path_for(url, tmp_path)
    final.parent.mkdir(parents=True)
    lock = final.with_name(final.name + ".lock")
    start = time.monotonic()
    with download_cache.exclusive_lock(lock):  # another download in progress
        with pytest.raises(download_cache.DownloadError,
                           match=rf"held by pid {os.getpid()} since"):
            download.fetch(url, cache_dir=tmp_path, timeout=0.5,
                           deadline=0.5, progress=False)
    assert time.monotonic() - start < 5.0
    assert download.fetch(url, cache_dir=tmp_path, progress=False).is_file()


@pytest.mark.parametrize("arg", ["timeout", "deadline"])
def test_download_bounds_must_be_positive(tmp_path, arg):
    from keras_vit.zoo.download import fetch as download

    with pytest.raises(ValueError, match=rf"{arg}=0"):
        download.fetch("http://127.0.0.1:9/x.npz", cache_dir=tmp_path,
                       **{arg: 0})


# Bad arguments to fetch, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("download timeout", lambda: zoo.download.fetch.fetch(
        "http://127.0.0.1:9/x.npz", timeout=-1), "timeout", "-1", "(0, inf)"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
