"""FSDP: where it runs on CPU (torch's FSDP2 ``fully_shard`` over gloo, tests/tools/fsdp_on_cpu.py) the gate rows of
q_proj, a parameter of their own, shard across the processes and train as they do in one plain process; ``gated-qwen
train --fsdp``, which needs accelerate's FSDP (GPUs only), is refused on a CPU machine in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_training_distributed import free_port

from gated_qwen.cli import main


pytestmark = pytest.mark.slow


HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def launch(out: Path, processes: int) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    prefix = [sys.executable]
    if processes > 1:
        prefix += ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}"]
    done = subprocess.run(
        prefix + [str(HERE / "fsdp_on_cpu.py"), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_gate_rows_shard_and_train_under_fsdp2_on_cpu(tmp_path):
    sharded, plain = launch(tmp_path / "fsdp.json", 2), launch(tmp_path / "plain.json", 1)
    assert sharded["gate_is_sharded"] and not plain["gate_is_sharded"]
    # 4 heads' gate rows (headwise) split between the 2 processes
    assert (sharded["gate_rows_full"], sharded["gate_rows_local"], plain["gate_rows_local"]) == (4, 2, 4)
    assert sharded["losses"] == pytest.approx(plain["losses"], abs=1e-5)
    assert all(sharded["changed"].values()), [name for name, changed in sharded["changed"].items() if not changed]
    torch.testing.assert_close(torch.tensor(sharded["q_proj_0"]), torch.tensor(plain["q_proj_0"]), rtol=0, atol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine --fsdp runs")
def test_cli_refuses_fsdp_without_gpus(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text('{"text": "hello"}\n')
    status = main(
        [
            "train",
            "--train-file",
            str(tmp_path / "t.jsonl"),
            "--out",
            str(tmp_path / "o"),
            "--max-steps",
            "1",
            "--fsdp",
            "full_shard auto_wrap",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "--fsdp needs GPUs" in err and "DDP over gloo" in err
    assert not (tmp_path / "o").exists()
