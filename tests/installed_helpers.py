"""Helpers of the tests that run clients in fresh processes of an environment where gated-qwen is installed (its
startup hook, gated_qwen_startup.pth, registering the gated families): tiny saved checkpoints with Qwen's
tokenizer and chat template, and the check that the running environment has the hook."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from conftest import RELEASED_VOCAB_SIZE, tiny_config_dict, tiny_moe_config_dict, write_qwen_tokenizer


STARTUP_PTH = "gated_qwen_startup.pth"
FAMILIES = {"dense": "Qwen3GatedForCausalLM", "moe": "Qwen3MoeGatedForCausalLM"}


def write_gated_checkpoint(folder: Path, family: str) -> Path:
    """A tiny gated checkpoint saved with ``save_pretrained`` (dense ``qwen3_gated`` or MoE ``qwen3_moe_gated``,
    headwise), with Qwen's tokenizer files (its vocabulary, so the embedding has the released arms' 152064 rows)
    and their chat template."""
    import gated_qwen

    torch.manual_seed(0)
    if family == "dense":
        config = gated_qwen.Qwen3GatedConfig.from_dict(tiny_config_dict(vocab_size=RELEASED_VOCAB_SIZE))
        model = gated_qwen.Qwen3GatedForCausalLM(config)
    else:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        stock = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(tiny_moe_config_dict(vocab_size=RELEASED_VOCAB_SIZE)))
        model = gated_qwen.convert_qwen3_to_gated(stock, gate="headwise")
    model.save_pretrained(folder)
    write_qwen_tokenizer(folder)
    return Path(folder)


def installed_startup_hook() -> Path:
    """The startup hook's .pth in the running environment's site-packages. Where it is missing (an environment that
    installed gated-qwen before the hook existed), the test skips naming the fix, except under CI (``CI=true``),
    which installs the project afresh and so fails."""
    pth = Path(sysconfig.get_path("purelib")) / STARTUP_PTH
    if not pth.is_file():
        message = f"{pth} is missing: install gated-qwen again (pip install -e .) to get its startup hook"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return pth


def run_fresh(code: str, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python of the running environment (no ``import gated_qwen`` of its own)."""
    assert not re.search(r"\b(import|from)\s+gated_qwen\b", code), code
    return run_command(sys.executable, "-c", code, *args, env=env, timeout=timeout)


def run_command(*command: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a command (a console script of the environment, as users start it), offline, output captured."""
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})},
    )


def console_script(name: str) -> str:
    """A console script of the running environment (beside its Python), skipping where it is not installed."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        pytest.skip(f"{name} is not installed in this environment")
    return str(path)
