"""With no network, the downloads that go through another library (the
``hf-hub:`` names through huggingface_hub, ``--data tfds:NAME --download``
through tfds) give up within the package's own wait,
``limits.MAX_CONNECT_WAIT_SECONDS``, quietly, in one line.

Without it huggingface_hub retried five times over ~23 s, a warning line
each, and waited up to the caller's 60 s timeout for a server that drops
connection attempts (64 s measured); tfds retried for minutes. Two
servers stand in for a network that is not there: a closed port on
127.0.0.1 (refused at once, as with no route or no DNS) and a port whose
accept queue is full (the kernel drops the attempt: silence, as behind a
firewall). The silent case shrinks the wait to 1 s so that the tests take
seconds; it fails in 60 s without the bound.
"""

import socket
import time

import pytest

from keras_vit.base import environment, limits
from keras_vit.zoo.download import fetch as download
from keras_vit.zoo.download import cache as download_cache

REPO = "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"  # a real one's name
# Seconds past the wait a failure may take: a child process that imports
# huggingface_hub (~1 s), tfds' own set-up, on 2 busy cores.
MARGIN = 10.0


def _closed_port():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 that never answers a connection attempt: it
    listens with a backlog of 0 and its queue is already full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        held.append(client)
    time.sleep(0.1)
    yield port
    for client in held:
        client.close()
    server.close()


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """Fresh caches, no proxy, downloads allowed, the wait cut to 1 s."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                 "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT",
                 "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                 "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(limits, "MAX_CONNECT_WAIT_SECONDS", 1.0)
    return tmp_path


def test_the_wait_is_the_package_own_and_short():
    assert 0 < limits.MAX_CONNECT_WAIT_SECONDS <= 10


@pytest.mark.parametrize("server", ["refused", "silent"])
def test_an_unreachable_hub_fails_within_the_wait_in_one_line(
        no_network, monkeypatch, capfd, request, server):
    import keras  # noqa: F401 - imported before the clock starts

    from keras_vit import zoo

    port = (_closed_port() if server == "refused"
            else request.getfixturevalue("silent_port"))
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    capfd.readouterr()
    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError) as info:
        zoo.load(f"hf-hub:{REPO}", progress=False)
    took = time.monotonic() - start
    assert took < limits.MAX_CONNECT_WAIT_SECONDS + MARGIN, took
    message = str(info.value)
    assert "\n" not in message, message
    assert f"hf-hub:{REPO}: cannot reach 127.0.0.1:{port} (" in message
    if server == "silent":
        assert "(no answer in 1 s)" in message, message
    base = f"{endpoint}/{REPO}/resolve/main/"
    folder = download_cache.cache_path_for(base + "config.json").parent
    assert (f"config.json and model.safetensors from {base} elsewhere and "
            f"place them in {folder}/") in message, message
    assert "then set KERAS_VIT_OFFLINE=1" in message, message
    # Quiet: none of huggingface_hub's retry warnings, at most one line.
    err = [line for line in capfd.readouterr().err.splitlines()
           if line.strip()]
    assert len(err) <= 1 and not any("Retr" in line for line in err), err


def test_a_proxy_that_does_not_answer_is_named_as_the_proxy(
        no_network, monkeypatch, silent_port):
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{silent_port}")
    start = time.monotonic()
    why = download.unreachable("https://huggingface.co/", 60)
    assert time.monotonic() - start < 1.0 + MARGIN
    assert why == (f"cannot reach the proxy 127.0.0.1:{silent_port} "
                   "(no answer in 1 s)")
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    monkeypatch.setenv("no_proxy", "huggingface.co")
    assert environment.proxy_for("https://huggingface.co/") is None
    assert download.unreachable("http://127.0.0.1:9/", 60) == (
        "cannot reach 127.0.0.1:9 (Connection refused)")


def test_a_tfds_download_with_no_network_fails_within_the_wait(
        no_network, monkeypatch, silent_port):
    """``fine-tune --data tfds:cifar10 --download`` behind a proxy that
    never answers: one line within the wait, naming the URL and the
    folder where a prepared copy goes; no community index fetched from
    GCS on the way (TensorFlow's GCS client retried that for minutes)."""
    from tensorflow_datasets.core.community import register_package

    from keras_vit.train.data.sources import DataError
    from keras_vit.train.data.tfds_source import TfdsSource

    def online(self):
        raise AssertionError("the community index went online")

    monkeypatch.setattr(register_package.PackageRegister, "list_builders",
                        online)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{silent_port}")
    data_dir = no_network / "tfds"
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        TfdsSource("cifar10", data_dir=str(data_dir), download=True)
    took = time.monotonic() - start
    assert took < limits.MAX_CONNECT_WAIT_SECONDS + MARGIN, took
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(
        "tfds dataset 'cifar10' could not be downloaded (ConnectionError: "
        "https://www.cs.toronto.edu/"), message
    assert (f"cannot reach the proxy 127.0.0.1:{silent_port} (no answer in "
            "1 s)") in message, message
    assert "`tfds build cifar10`) and place the cifar10/" in message
    assert f" folder it writes in {data_dir}/" in message, message
    assert "TFDS_DATA_DIR" in message, message
