"""Progress bars: downloads (the bucket's, through zoo.download.fetch) and the
loading of big checkpoints show one; small loads and progress=False none."""

import http.server
import io
import threading

import numpy as np
import pytest

from keras_vit import zoo
from keras_vit.zoo import checkpoints, convert
from keras_vit.zoo.download import fetch as download


def _npz_body():
    # A real (stored) .npz of 1 MiB of data: downloads keep only complete
    # archives.
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros(1 << 18, "float32"))
    return buffer.getvalue()


BODY = _npz_body()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


def test_download_shows_a_progress_bar(server, capsys):
    path = download.fetch(server + "vit_models/x/bar.npz", progress=True)
    assert path.read_bytes() == BODY
    err = capsys.readouterr().err
    assert "bar.npz" in err and "100%" in err and "1.00M" in err
    download.fetch(server + "vit_models/x/quiet.npz", progress=False)
    assert capsys.readouterr().err == ""


def test_checkpoint_loading_shows_a_progress_bar(capsys, monkeypatch):
    model = zoo.load("ViT-Ti/16", weights=None, image_size=32, num_classes=3)
    arrays = zoo.export_arrays(model)
    capsys.readouterr()
    zoo.load_weights(model, arrays)  # small: no bar by default
    assert "loading" not in capsys.readouterr().err
    # The same load counted as big (the threshold is 256 MiB) on a
    # terminal-less stderr: progress=True forces the bar.
    pairs = list(convert.model_variables(model).items())
    checkpoints.assign_all([(v, arrays[k]) for k, v in pairs], "'ckpt.npz'",
                       progress=True)
    err = capsys.readouterr().err
    assert "loading 'ckpt.npz'" in err and "100%" in err
    nbytes = sum(int(np.prod(v.shape)) * 4 for _, v in pairs)
    assert f"{nbytes / 2**20:.1f}M/{nbytes / 2**20:.1f}M" in err
