"""Training under several processes (torchrun, gloo on CPU): with the default options, the same losses and learning
rates as one process with the same global batch, distinct rows per process, one final/, exact resume, and a resume
that would change the global batch refused."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_TEXT, write_training_corpus

from gated_qwen.cli import main
from gated_qwen.tools.training import PackedRows, load_documents, train_tokenizer
from gated_qwen.tools.training.arguments import TrainRunArguments


pytestmark = pytest.mark.slow


ROOT = Path(__file__).parents[2]
TINY_CONFIG = str(ROOT / "configs" / "tiny_headwise.json")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_training_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", repeats=40)


def command(corpus: Path, out: Path, batch_size: int, *extra: str) -> list[str]:
    return [
        "train",
        "--train-file",
        str(corpus),
        "--heldout-file",
        str(corpus),
        "--out",
        str(out),
        "--config",
        TINY_CONFIG,
        "--vocab-size",
        "300",
        "--seq-len",
        "32",
        "--batch-size",
        str(batch_size),
        "--max-steps",
        "6",
        "--save-every",
        "3",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--eval-every",
        "3",
        "--eval-rows",
        "4",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(argv: list[str], processes: int = 2) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        f"--master_port={free_port()}",
        "-m",
        "gated_qwen",
    ]
    return subprocess.run(launcher + argv, env=env, capture_output=True, text=True, timeout=600)


def history(run: Path, step: int) -> list[dict]:
    """Trainer's log of every step (full precision) in checkpoint-STEP."""
    state = json.loads((run / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """One process x 8 rows, two processes x 4 rows (6 steps), and the two-process run resumed at step 3 under two;
    the first two runs' stderr in one.stderr and two.stderr."""
    root = tmp_path_factory.mktemp("runs")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(command(corpus, root / "one", 8)) == 0
    (root / "one.stderr").write_text(err.getvalue())
    two = torchrun(command(corpus, root / "two", 4))
    assert two.returncode == 0, two.stderr[-3000:]
    (root / "two.stderr").write_text(two.stderr)
    resumed = torchrun(command(corpus, root / "resumed", 4, "--resume", str(root / "two" / "checkpoint-3")))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return root


def test_two_processes_match_one_with_the_same_global_batch(runs):
    one, two = history(runs / "one", 6), history(runs / "two", 6)
    assert [e["step"] for e in one] == [e["step"] for e in two] == [1, 2, 3, 4, 5, 6]
    losses = [(a["loss"], b["loss"]) for a, b in zip(one, two)]
    assert max(abs(a - b) for a, b in losses) < 1e-5, losses
    assert [e["learning_rate"] for e in one] == pytest.approx([e["learning_rate"] for e in two], abs=1e-12)
    assert losses[-1][1] < losses[0][1] - 0.5  # it learns
    summaries = [json.loads((runs / run / "summary.json").read_text()) for run in ("one", "two")]
    assert summaries[0]["tokens"] == summaries[1]["tokens"] == 6 * 8 * 32
    assert summaries[1]["num_processes"] == 2 and summaries[1]["rows_per_step"] == 8
    assert summaries[0]["heldout"]["loss"] == pytest.approx(summaries[1]["heldout"]["loss"], abs=1e-5)


def test_the_run_states_its_process_count_and_global_batch(runs):
    one, two = ((runs / name).read_text() for name in ("one.stderr", "two.stderr"))
    line = "training on {}, global batch 8 rows (per process {} x accumulation 1 x {}), 1 data shard\n"
    assert line.format("1 process", 8, "1 process") in one, one[-2000:]
    assert two.count(line.format("2 processes", 4, "2 processes")) == 1, two[-2000:]  # the main process only


def test_the_schedule_steps_once_per_optimizer_step_under_two_processes(runs):
    """Warm-up over 2 steps, then cosine down to 10% at step 6, as for one process (not N times as fast)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
    schedule = get_cosine_with_min_lr_schedule_with_warmup(optimizer, 2, 6, min_lr_rate=0.1)
    used, after = [], []  # the rate each step used (Trainer's log), the rate after it (log.csv, as before)
    for _ in range(6):
        used.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
        after.append(schedule.get_last_lr()[0])
    assert [e["learning_rate"] for e in history(runs / "two", 6)] == pytest.approx(used, abs=1e-12)
    logged = [float(row.split(",")[2]) for row in (runs / "two" / "log.csv").read_text().splitlines()[2:]]
    assert logged == pytest.approx(after, rel=1e-5)
    assert logged[-1] == pytest.approx(3e-4) and min(logged[:-1]) > 3e-4  # the minimum at the last step, not before


def test_two_processes_write_one_final_folder_and_nothing_else(runs):
    pytest.importorskip("matplotlib", reason="the run's folder listing includes loss.png (the plot extra)")
    assert sorted(p.name for p in (runs / "two").iterdir()) == [
        "checkpoint-3",
        "checkpoint-6",
        "final",
        "log.csv",
        "loss.png",
        "summary.json",
        "tokenizer",
        "train_args.json",
    ]
    assert sorted(p.name for p in (runs / "two" / "checkpoint-6").glob("rng_state*")) == [
        "rng_state_0.pth",
        "rng_state_1.pth",
    ]
    rows = (runs / "two" / "log.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
    ]  # one writer, no doubled rows


def test_resume_under_two_processes_is_exact(runs):
    whole, resumed = history(runs / "two", 6), history(runs / "resumed", 6)
    assert [e["loss"] for e in resumed[-3:]] == [e["loss"] for e in whole[-3:]]
    from safetensors.torch import load_file

    a, b = (load_file(runs / run / "final" / "model.safetensors") for run in ("two", "resumed"))
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_resume_with_another_global_batch_is_refused(runs, corpus, tmp_path, capsys):
    out = tmp_path / "other"
    assert main(command(corpus, out, 4, "--resume", str(runs / "two" / "checkpoint-3"))) == 2  # 1 process x 4 rows
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "global batch of 8 rows per step (2 processes x --batch-size 4" in err and "pass --batch-size 8" in err, err
    assert not out.exists()


def test_resume_with_one_process_at_the_same_global_batch_continues_the_same_rows(runs, corpus, tmp_path):
    assert main(command(corpus, tmp_path / "one", 8, "--resume", str(runs / "two" / "checkpoint-3"))) == 0
    whole, continued = history(runs / "two", 6), history(tmp_path / "one", 6)
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(whole[-3:], continued[-3:])) < 1e-5


def test_each_process_reads_distinct_rows_that_make_up_the_one_process_batch(corpus):
    args = TrainRunArguments(train_file=str(corpus), output_dir="unused", max_steps=1, seq_len=32)
    documents = load_documents(args)
    tokenizer = train_tokenizer(TOKENIZER_TEXT * 4, vocab_size=300)

    def first_rows(rank: int, world: int, count: int) -> list[tuple]:
        rows = iter(PackedRows(documents, tokenizer, 32, num_shards=2, rank=rank, world_size=world, seed=0))
        return [tuple(next(rows)["input_ids"].tolist()) for _ in range(count)]

    one = first_rows(0, 1, 16)
    rank0, rank1 = first_rows(0, 2, 8), first_rows(1, 2, 8)
    assert not set(rank0) & set(rank1)
    for step in range(2):  # a global batch of 8: 4 rows from each process
        assert sorted(rank0[4 * step : 4 * step + 4] + rank1[4 * step : 4 * step + 4]) == sorted(
            one[8 * step : 8 * step + 8]
        )


def test_gradient_accumulation_and_checkpointing_give_the_same_steps(runs, corpus, tmp_path):
    """1 process x 2 rows x 4 accumulated batches, activations recomputed: the steps of 1 x 8 rows."""
    out = tmp_path / "accumulated"
    assert main(command(corpus, out, 2, "--gradient-accumulation-steps", "4", "--gradient-checkpointing")) == 0
    one, accumulated = history(runs / "one", 6), history(out, 6)
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(one, accumulated)) < 1e-5
    assert [e["learning_rate"] for e in one] == [e["learning_rate"] for e in accumulated]
    assert json.loads((out / "summary.json").read_text())["rows_per_step"] == 8
