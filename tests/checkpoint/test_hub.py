"""gated_qwen.checkpoint.sources, the hub: one clear message, at once, for every way a model source can be wrong."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from conftest import write_released_checkpoint

from gated_qwen.checkpoint.sources import _repository_files, resolve_source
from gated_qwen.cli import main
from gated_qwen.errors import GatedQwenError


@pytest.fixture(autouse=True)
def fresh_probe_cache():
    _repository_files.cache_clear()
    yield
    _repository_files.cache_clear()


def test_local_sources(tmp_path):
    write_released_checkpoint(tmp_path / "arms" / "1B_gate_headwise")
    (tmp_path / "weights.safetensors").write_bytes(b"")
    assert resolve_source(str(tmp_path / "arms"), "1B_gate_headwise") == tmp_path / "arms" / "1B_gate_headwise"
    with pytest.raises(GatedQwenError, match=r"^\./missing_dir does not exist: there is no such folder$"):
        resolve_source("./missing_dir")
    with pytest.raises(GatedQwenError, match="weights.safetensors is a file, not a folder"):
        resolve_source(str(tmp_path / "weights.safetensors"))
    with pytest.raises(
        GatedQwenError, match=r"has no subfolder '1B_baseline'; it holds 1B_gate_headwise: pass one with --subfolder"
    ):
        resolve_source(str(tmp_path / "arms"), "1B_baseline")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    return tmp_path / "hub_cache"


def test_offline_without_a_cached_copy_says_so(offline):
    with pytest.raises(
        GatedQwenError,
        match=r"QwQZh/gated_attention \(subfolder 1B_gate_headwise\) is not in the local hub cache.*HF_HUB_OFFLINE=1",
    ):
        resolve_source("QwQZh/gated_attention", "1B_gate_headwise")
    # a single name could have been meant as a local folder: both readings are named
    with pytest.raises(
        GatedQwenError,
        match="^there is no local folder missing_dir, and as a hub id: missing_dir is not in the local hub cache",
    ):
        resolve_source("missing_dir")
    # with the repository in the cache, offline is fine
    snapshot = offline / "models--QwQZh--gated_attention" / "snapshots" / "abc123" / "1B_gate_headwise"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (offline / "models--QwQZh--gated_attention" / "refs").mkdir()
    (offline / "models--QwQZh--gated_attention" / "refs" / "main").write_text("abc123")
    assert resolve_source("QwQZh/gated_attention", "1B_gate_headwise") is None


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers /api/models/<repo>[/revision/<rev>] as the hub does, for a few fixed repositories."""

    def do_GET(self):  # noqa: N802 - http.server's name
        if "/api/models/QwQZh/gated_attention" in self.path and "/revision/nope" in self.path:
            self.answer(404, {"X-Error-Code": "RevisionNotFound"}, {"error": "Invalid rev id: nope"})
        elif "/api/models/QwQZh/gated_attention" in self.path:
            files = [
                f"{arm}/{name}"
                for arm in ("1B_baseline", "1B_gate_headwise")
                for name in ("config.json", "pytorch_model.bin")
            ]
            self.answer(200, {}, {"id": "QwQZh/gated_attention", "siblings": [{"rfilename": name} for name in files]})
        elif "/api/models/meta/gated" in self.path:
            self.answer(401, {"X-Error-Code": "GatedRepo"}, {"error": "Access to model meta/gated is restricted."})
        else:
            self.answer(404, {"X-Error-Code": "RepoNotFound"}, {"error": "Repository not found"})

    def answer(self, status, headers, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_at(monkeypatch):
    """Point huggingface_hub at ``url`` (online mode), for the duration of a test."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def point(url):
        monkeypatch.setattr(constants, "ENDPOINT", url)

    return point


@pytest.fixture
def fake_hub(hub_at):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub_at(f"http://127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()
    server.server_close()


def test_hub_answers_become_one_line_each(fake_hub):
    assert resolve_source("QwQZh/gated_attention", "1B_gate_headwise") is None
    cases = [
        (
            ("QwQZh/gated_attention", "1B_gate_elementwise"),
            r"has no subfolder '1B_gate_elementwise' with a config.json; it holds 1B_baseline, 1B_gate_headwise",
        ),
        (("QwQZh/no_such_repo", ""), r"QwQZh/no_such_repo is neither a local folder nor a repository on the hub"),
        (("meta/gated", ""), r"meta/gated is a gated repository: accept its terms"),
        (("QwQZh/gated_attention", "1B_baseline", "nope"), r"QwQZh/gated_attention has no revision 'nope' on the hub"),
    ]
    for args, message in cases:
        with pytest.raises(GatedQwenError, match=message):
            resolve_source(*args)


def test_an_unreachable_hub_is_reported_at_once(hub_at):
    import socket

    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hub_at(f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(
        GatedQwenError,
        match=r"QwQZh/gated_attention \(subfolder 1B_baseline\) cannot be read: the hub .* cannot be reached",
    ):
        resolve_source("QwQZh/gated_attention", "1B_baseline")
    assert time.perf_counter() - start < 5  # no retries (huggingface_hub's downloads retry for about 25 s)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "QwQZh/gated_attention", "--subfolder", "1B_gate_headwise"],
        ["generate", "--model", "QwQZh/gated_attention", "--subfolder", "1B_gate_headwise", "Hello"],
        ["analyze", "QwQZh/gated_attention", "--subfolder", "1B_gate_headwise", "--prompt", "Hi", "--no-plots"],
        ["convert", "QwQZh/gated_attention", "OUT", "--subfolder", "1B_gate_headwise"],
    ],
)
def test_every_command_says_the_hub_is_offline(offline, tmp_path, capsys, argv):
    argv = [str(tmp_path / "out") if word == "OUT" else word for word in argv]
    if argv[0] == "analyze":
        argv += ["--out", str(tmp_path / "analysis")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not in the local hub cache, and the hub is switched off (HF_HUB_OFFLINE=1)" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
