"""``transformers serve PATH`` serves gated checkpoints, dense and MoE (issue 36): started as users start it, in an
environment where gated-qwen is installed, on 127.0.0.1, it answers ``/v1/completions`` and
``/v1/chat/completions`` (Qwen's chat template). The server is always stopped, every wait is bounded.

Needs transformers' serving extra (``pip install "transformers[serving]"``); skips without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest
from installed_helpers import FAMILIES, console_script, installed_startup_hook, write_gated_checkpoint


pytestmark = pytest.mark.slow

STARTUP_SECONDS = 240  # loading transformers, torch and the model in the server's spawned process, on a busy CPU


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextmanager
def serving(path, log_path):
    """``transformers serve PATH`` on a free port of 127.0.0.1, once it answers; stopped (killed if need be) after."""
    command = console_script("transformers")
    port = free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [command, "serve", str(path), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
            start_new_session=True,  # its spawned model process goes with it
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert server.poll() is None, (
                f"transformers serve exited ({server.returncode}):\n{log_path.read_text()[-3000:]}"
            )
            try:
                urllib.request.urlopen(f"{base}/v1/models", timeout=5).close()
                break
            except urllib.error.HTTPError:  # it answers (5.19's model list fails without a hub cache folder)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, (
                    f"no answer in {STARTUP_SECONDS} s:\n{log_path.read_text()[-3000:]}"
                )
                time.sleep(1)
        yield base
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 20 s."""
    for stop_signal, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(server.pid, stop_signal)
        except ProcessLookupError:
            pass
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_serve_answers_completions_and_chat(family, tmp_path):
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip('transformers serve needs its serving extra (pip install "transformers[serving]")')
    installed_startup_hook()
    path = write_gated_checkpoint(tmp_path / family, family)
    with serving(path, tmp_path / "serve.log") as base:
        completion = post(f"{base}/v1/completions", {"model": str(path), "prompt": "The gate", "max_tokens": 4})
        chat = post(
            f"{base}/v1/chat/completions",
            {"model": str(path), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 4 and completion["choices"][0]["text"]
    assert chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] == 4 and chat["choices"][0]["message"]["role"] == "assistant"
    # Qwen's chat template wrapped the message: more prompt tokens than "Hi" alone
    assert chat["usage"]["prompt_tokens"] > 3
    assert "Loading" in (tmp_path / "serve.log").read_text()
