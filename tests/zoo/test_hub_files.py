"""keras_vit.zoo.hub_files, the Hub downloads and the safetensors reader:
bounded, never stuck, always clear. A Hub endpoint that trickles or never
answers stops at the overall deadline; a failure names the repository; a
hostile safetensors header is refused naming the file and the tensor."""

import time

import numpy as np
import pytest

from testkit import TENSOR as _TENSOR
from testkit import safetensors as _safetensors


class _HubServer:
    """A Hub endpoint on 127.0.0.1 that trickles a byte every 2 s (HEAD
    and GET alike), and a listener that accepts and never answers."""

    def __init__(self):
        import http.server
        import socket
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if "/missing/" in self.path or "/resolve/" not in self.path:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.send_header("X-Repo-Commit", "a" * 40)
                self.send_header("ETag", '"abc"')
                self.end_headers()
                for _ in range(100):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(2)

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.silent = socket.socket()
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(16)  # the kernel accepts; nobody answers
        self.trickle = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.mute = f"http://127.0.0.1:{self.silent.getsockname()[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.silent.close()


@pytest.fixture(scope="module")
def hub_server():
    server = _HubServer()
    yield server
    server.stop()


@pytest.mark.parametrize("endpoint", ["trickle", "mute"])
def test_hub_download_has_an_overall_deadline(hub_server, tmp_path,
                                              monkeypatch, endpoint):
    from keras_vit.zoo.download import cache as download_cache
    from keras_vit.zoo.timm import hub as timm_hub

    monkeypatch.setenv("HF_ENDPOINT", getattr(hub_server, endpoint))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError,
                       match=r"hf-hub:timm/vit_x did not finish within 2 s"):
        timm_hub.fetch("hf-hub:timm/vit_x", progress=False, timeout=60,
                       deadline=2)
    assert time.monotonic() - start < 5.0


def test_hub_failure_is_a_download_error_naming_the_repo(
        hub_server, tmp_path, monkeypatch):
    from keras_vit.zoo.download import cache as download_cache
    from keras_vit.zoo.timm import hub as timm_hub

    monkeypatch.setenv("HF_ENDPOINT", hub_server.trickle)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(download_cache.DownloadError,
                       match=r"could not download hf-hub:timm/missing@v1: "):
        timm_hub.fetch("hf-hub:timm/missing@v1", progress=False, timeout=5,
                       deadline=60)
    with pytest.raises(ValueError, match="deadline=0"):
        timm_hub.fetch("hf-hub:timm/vit_x", deadline=0)


@pytest.mark.parametrize("header, length, data, needle", [
    (_TENSOR, 2 ** 63 - 1, b"\0" * 24, "declares a 9223372036854775807-byte "
                                       "header in a"),
    (b"not json!!", None, b"", "is not valid JSON"),
    ([1, 2], None, b"", "is a JSON list, not an object"),
    ({"w": dict(_TENSOR, data_offsets=[0, 10 ** 12])}, None, b"\0" * 24,
     "field w: data_offsets=[0, 1000000000000] is not a byte range"),
    ({"w": dict(_TENSOR, dtype="Q99")}, None, b"\0" * 24,
     "field w.dtype: expected one of"),
    ({"w": dict(_TENSOR, shape="abc")}, None, b"\0" * 24,
     "field w.shape: expected a list"),
    ({"w": _TENSOR}, None, b"\0" * 10, "inside the file's 10 bytes of data "
                                       "(truncated?)"),
    ({"w": dict(_TENSOR, shape=[5, 5])}, None, b"\0" * 24,
     "hold 24 bytes; dtype F32 and shape [5, 5] need 100"),
    ({"w": 7}, None, b"", "field w: expected a tensor entry"),
], ids=["length_2^63-1", "not_json", "a_list", "offsets_out_of_range",
        "unknown_dtype", "shape_a_string", "short_data", "size_mismatch",
        "entry_a_number"])
def test_hostile_safetensors_headers_name_the_file_and_tensor(
        tmp_path, header, length, data, needle):
    from keras_vit import zoo
    from keras_vit.zoo.timm import hub as timm_hub

    path = _safetensors(tmp_path / "model.safetensors",
                        {"w": header} if header is _TENSOR else header,
                        data, length)
    with pytest.raises(zoo.CheckpointError) as info:
        timm_hub.read_safetensors(path)
    assert str(info.value).startswith(f"{path} ")
    assert needle in str(info.value)


def test_a_valid_safetensors_file_still_reads(tmp_path):
    import safetensors.numpy as st
    from keras_vit.zoo.timm import hub as timm_hub

    path = tmp_path / "ok.safetensors"
    st.save_file({"w": np.arange(6, dtype="float32").reshape(2, 3),
                  "e": np.zeros((0, 4), "float16")}, str(path))
    got = timm_hub.read_safetensors(path)
    np.testing.assert_array_equal(got["w"], np.arange(6).reshape(2, 3))
    assert got["e"].shape == (0, 4)
