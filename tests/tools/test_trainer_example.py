"""examples/trainer_with_gate_groups.py, the documented own-Trainer recipe, on a tiny stock Qwen3: on one process
and on two (torchrun, gloo), the gate rows train at their own rate and the saved model is a plain Qwen3Gated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_TEXT
from test_training import write_stock_checkpoint
from test_training_distributed import free_port

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.models.layout import split_query_and_gate


pytestmark = pytest.mark.slow


ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("processes", [1, 2])
def test_the_own_trainer_example_trains_the_gate_rows(tmp_path, processes):
    stock = write_stock_checkpoint(tmp_path / "stock")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{i}: {t}"}) + "\n" for i in range(20) for t in TOKENIZER_TEXT))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    launcher = (
        [sys.executable]
        if processes == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            f"--master_port={free_port()}",
        ]
    )
    command = [
        str(ROOT / "examples" / "trainer_with_gate_groups.py"),
        "--model",
        str(stock),
        "--train-file",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--max-steps",
        "3",
        "--lr",
        "1e-3",
    ]
    done = subprocess.run(
        launcher + command + (["--use-cpu"] if processes > 1 else []),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trained = Qwen3GatedForCausalLM.from_pretrained(tmp_path / "run" / "final", dtype=torch.float32)
    assert trained.config.gate_type == "headwise"
    config = trained.config
    gate = split_query_and_gate(
        trained.model.layers[0].self_attn.q_proj.weight.detach(), config.num_key_value_heads, config.head_dim, 1, dim=0
    )[1]
    assert gate.abs().max() > 0  # the identity init's zero gate rows have trained
