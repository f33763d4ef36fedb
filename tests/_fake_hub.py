"""A local stand-in for the Hugging Face Hub, for the tests that load
``hf-hub:`` names (timm's and transformers' layouts) without the network."""

import json
import os
import subprocess
import sys
import time


def send_slowly(wfile, body, pause):
    """Writes ``body`` a byte every ``pause`` seconds, until the client
    hangs up."""
    for i in range(len(body)):
        try:
            wfile.write(body[i:i + 1])
            wfile.flush()
        except OSError:
            return
        time.sleep(pause)


class FakeHub:
    """The two routes hf_hub_download uses (HEAD then GET of
    /<repo>/resolve/<revision>/<file>), served on 127.0.0.1 from a folder
    or a ``{name: bytes}`` dict; a missing file is a 404 with the Hub's
    ``X-Error-Code: EntryNotFound``. Records the GETs (``gets``) and every
    path asked for (``asked``). ``trickle``: seconds between the bytes of
    a GET's body (a slow server; headers come at once). Several
    repositories at one endpoint: ``FakeHub({repo_id: folder, ...})``."""

    def __init__(self, repo_id, folder=None, trickle=None):
        import hashlib
        import http.server
        import threading

        def read(folder):
            return (dict(folder) if isinstance(folder, dict) else
                    {p.name: p.read_bytes() for p in folder.iterdir()})

        repos = ({rid: read(f) for rid, f in repo_id.items()}
                 if isinstance(repo_id, dict) else {repo_id: read(folder)})
        self.gets = []
        self.asked = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _head(self):
                hub.asked.append(self.path)
                files = next((f for rid, f in repos.items()
                              if self.path.startswith(f"/{rid}/resolve/")),
                             {})
                name = self.path.split("?")[0].rsplit("/", 1)[-1]
                if name not in files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                body = files[name]
                self.send_response(200)
                self.send_header("X-Repo-Commit", "a" * 40)
                self.send_header(
                    "ETag", f'"{hashlib.sha256(body).hexdigest()}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                return body

            def do_HEAD(self):  # noqa: N802
                self._head()

            def do_GET(self):  # noqa: N802
                body = self._head()
                if body is not None:
                    hub.gets.append(self.path)
                    if trickle is None:
                        self.wfile.write(body)
                    else:
                        send_slowly(self.wfile, body, trickle)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True  # a trickle ends with the test
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_against_hub(code, hf_home, endpoint, offline=False):
    """Runs ``code`` in a fresh Python whose huggingface_hub talks to
    ``endpoint`` and caches in ``hf_home`` (``offline``: HF_HUB_OFFLINE=1,
    the cache alone); asserts it succeeds and returns the JSON of the last
    line it prints."""
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(hf_home),
               TF_CPP_MIN_LOG_LEVEL="3", HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
