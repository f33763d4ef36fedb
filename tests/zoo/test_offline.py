"""A download that cannot happen fails in one line, soon, on every route.

The network is simulated: the bucket's mirror and the Hub's endpoint point at
``http://127.0.0.1:9/`` (nothing listens on port 9: refused at once), or a
local server stands in for the Hub. Each failure must be one line naming the
URL, the exact path to place the file at and the variable to set, whether or
not ``KERAS_VIT_OFFLINE`` is set, and the command line must print it without
a traceback.
"""

import os
import time

import pytest

from _fake_hub import FakeHub
from keras_vit.zoo.download import fetch as download
from keras_vit.zoo.download import cache as download_cache

UNREACHABLE = "http://127.0.0.1:9"
OFFICIAL = "https://storage.googleapis.com/vit_models/test/"
B16 = ("https://storage.googleapis.com/vit_models/imagenet21k%2B"
       "imagenet2012/ViT-B_16.npz")
SOON = 20.0  # seconds: generous; huggingface_hub's retries alone took ~23


@pytest.fixture
def unreachable(tmp_path, monkeypatch):
    """Both servers unreachable, fresh caches; returns the keras-vit cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(cache))
    monkeypatch.setenv("KERAS_VIT_MIRROR", UNREACHABLE + "/")
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE", "HF_HUB_CACHE",
                 "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return cache


def _one_line_naming(message, url, path):
    assert "\n" not in message, message
    assert url in message, message
    # A name of the repository's files, or one file's path.
    assert str(path) in message or f"{path.parent}/" in message, message
    assert "KERAS_VIT_OFFLINE=1" in message or "unset KERAS_VIT_OFFLINE" in (
        message), message
    assert "KERAS_VIT_CACHE" in message, message


@pytest.mark.parametrize("offline", [None, "1"])
def test_a_bucket_file_that_cannot_come_names_url_path_and_variable(
        unreachable, monkeypatch, offline):
    if offline:
        monkeypatch.setenv("KERAS_VIT_OFFLINE", offline)
    url = OFFICIAL + "good.npz"
    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError) as info:
        download.fetch(url, progress=False, timeout=5)
    assert time.monotonic() - start < SOON
    _one_line_naming(str(info.value), UNREACHABLE + "/vit_models/test/good.npz",
                     download_cache.cache_path_for(url))
    assert "KERAS_VIT_MIRROR" in str(info.value)
    # The line is the whole story: no chained traceback under it.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.parametrize("offline", [None, "1"])
def test_the_readme_first_line_offline_is_one_line(unreachable, monkeypatch,
                                                   offline):
    from keras_vit import zoo

    if offline:
        monkeypatch.setenv("KERAS_VIT_OFFLINE", offline)
    with pytest.raises(download_cache.DownloadError) as info:
        zoo.load("ViT-B/16", progress=False)
    _one_line_naming(str(info.value), UNREACHABLE + "/vit_models/",
                     download_cache.cache_path_for(B16))


def test_the_command_line_prints_the_one_line_without_a_traceback(
        unreachable, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from keras_vit import cli

    image = tmp_path / "img.png"
    Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(image)
    assert cli.main(["predict", "ViT-B/16", str(image)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("keras-vit: error:"), err
    _one_line_naming(lines[0], UNREACHABLE + "/vit_models/",
                     download_cache.cache_path_for(B16))


def _hub_url(repo, name, endpoint=UNREACHABLE):
    return f"{endpoint}/{repo}/resolve/main/{name}"


@pytest.mark.parametrize("offline", [None, "KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE"])
def test_an_unreachable_hub_fails_soon_quietly_in_one_line(
        unreachable, monkeypatch, capfd, offline):
    """huggingface_hub retried five times over ~23 s, a warning line each;
    now one line, in a few seconds, naming where to put the file."""
    from keras_vit import zoo

    if offline:
        monkeypatch.setenv(offline, "1")
    repo = "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"  # a real one's
    start = time.monotonic()
    with pytest.raises(download_cache.DownloadError) as info:
        zoo.load(f"hf-hub:{repo}", progress=False)
    assert time.monotonic() - start < SOON
    # The config and the weights: every hf-hub: load needs both.
    base = _hub_url(repo, "")
    _one_line_naming(str(info.value), base,
                     download_cache.cache_path_for(base + "config.json"))
    assert "config.json and model.safetensors from" in str(info.value)
    assert f"hf-hub:{repo}" in str(info.value)
    # Whole on the command line, which cuts an error's line at 600.
    assert len(str(info.value)) <= 600, len(str(info.value))
    err = capfd.readouterr().err
    assert "Retry" not in err and "thrown while requesting" not in err, err


def test_a_hub_file_placed_where_the_message_says_is_used(
        unreachable, monkeypatch, tmp_path):
    """The path the message names works: files placed there load with
    KERAS_VIT_OFFLINE=1, and nothing asks the server."""
    from keras_vit.zoo import hub_files

    repo = "timm/vit_placed"
    with pytest.raises(download_cache.DownloadError) as info:
        hub_files.hub_download(repo, progress=False)
    message = str(info.value)
    folder = download_cache.cache_path_for(_hub_url(repo, "config.json")).parent
    assert (f"config.json and model.safetensors from {UNREACHABLE}/{repo}/"
            f"resolve/main/ elsewhere and place them in {folder}/") in message
    for name in hub_files.HUB_FILES:
        path = download_cache.cache_path_for(_hub_url(repo, name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"{}")
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    assert hub_files.hub_download(repo, progress=False) == [
        os.fspath(download_cache.cache_path_for(_hub_url(repo, name)))
        for name in hub_files.HUB_FILES]


def test_keras_vit_offline_keeps_the_hub_route_offline(tmp_path, monkeypatch):
    """KERAS_VIT_OFFLINE=1 means never download, on the Hub route too."""
    from keras_vit.zoo import hub_files

    files = {"config.json": b"{}", "model.safetensors": bytes(8)}
    with FakeHub("timm/vit_here", files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        with pytest.raises(download_cache.OfflineError) as info:
            hub_files.hub_download("timm/vit_here", progress=False)
        assert hub.asked == []
    assert "\n" not in str(info.value)
    assert "unset KERAS_VIT_OFFLINE" in str(info.value)


def test_a_cached_repository_with_only_the_pickle_names_both_files(
        unreachable, monkeypatch, tmp_path):
    """A Hub cache holding config.json and pytorch_model.bin, no
    model.safetensors: the message names the file looked for and the one
    found."""
    from keras_vit import zoo

    repo = "timm/vit_pickled"
    commit = "c" * 40
    folder = tmp_path / "hf" / "hub" / "models--timm--vit_pickled"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text(
        '{"architecture": "vit_tiny_patch16_224", "num_classes": 3}')
    (snapshot / "pytorch_model.bin").write_bytes(b"\x80\x02 never read")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(download_cache.DownloadError) as info:
        zoo.load(f"hf-hub:{repo}", progress=False)
    message = str(info.value)
    assert "\n" not in message, message
    assert "model.safetensors" in message and "pytorch_model.bin" in message
    url = _hub_url(repo, "model.safetensors")
    assert url in message and str(download_cache.cache_path_for(url)) in message


def test_an_unreachable_hub_leaves_its_cache_to_answer(tmp_path, monkeypatch):
    """Files huggingface_hub cached earlier still load when the server is
    gone, without HF_HUB_OFFLINE and without the retries."""
    from keras_vit.zoo import hub_files

    files = {"config.json": b"{}", "model.safetensors": bytes(8)}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    for name in ("KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE", "HF_HUB_CACHE",
                 "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    with FakeHub("timm/vit_cached", files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        online = hub_files.hub_download("timm/vit_cached", progress=False)
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    start = time.monotonic()
    assert hub_files.hub_download("timm/vit_cached", progress=False) == online
    assert time.monotonic() - start < SOON
