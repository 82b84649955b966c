"""Peak memory of `gated-qwen train` against corpus size: a corpus and one FACTOR times larger must give the same peak.

Builds a corpus of about --base-mb MB of JSON lines (the standard-library docstrings of
``scripts/prepare_corpus.py``, repeated with a copy number in front of each document) and one --factor
times larger, a BPE tokenizer once (so both runs tokenize alike), then measures in fresh processes the peak
resident memory (``ru_maxrss``) and its anonymous part (``RssAnon``, see :func:`measured`) of:

* ``gated-qwen train`` (the default, ``--no-streaming``: datasets' Arrow cache, built first, and the rows packed once
  into an Arrow data set of their own, both memory-mapped) for --steps steps on each corpus;
* ``gated-qwen train --streaming`` likewise;
* one whole pass of the data pipeline over each corpus, and over one --middle times the base (streamed,
  tokenized and packed into rows: what training reads, to the last row), without a model;
* for scale, the in-memory helpers this package used before (``read_documents`` + ``pack_documents``) on the
  base corpus only.

    python scripts/measure_training_memory.py                 # writes results/training_memory/results.{json,md}
    python scripts/measure_training_memory.py --base-mb 5 --print-only
    python scripts/measure_training_memory.py --beyond-memory 2.5 --memory-limit 1.5   # results/training_memory/beyond_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import ROOT, describe, new_report, portable, run_measuring_memory, write_results


DATA_PASS = """
import sys
from gated_qwen.tools.training.data import _pack, load_documents
from gated_qwen.tools.training.arguments import TrainRunArguments
from transformers import AutoTokenizer
args = TrainRunArguments(train_file=sys.argv[1], output_dir="unused", max_steps=1, seq_len=256, streaming=True)
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
documents = load_documents(args)
print(sum(1 for _ in _pack(documents, tokenizer, 256)))
"""

IN_MEMORY = """
import sys
from gated_qwen.tools.training.data import pack_documents, read_documents
from transformers import AutoTokenizer
print(len(pack_documents(read_documents(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[2]))) // 256)
"""


def measured(command: list[str], env: dict, cgroup: Path | None = None, may_fail: bool = False) -> dict:
    """Peak memory of ``command``, through a small Python wrapper: the peak resident set (ru_maxrss) and
    the peak of its anonymous part (``RssAnon`` of /proc/PID/status, read every 20 ms): the memory the process holds
    itself, without the file pages it maps (a memory-mapped Arrow cache, shared libraries), which the kernel can
    drop and read again. stdout kept.

    With ``cgroup`` (a memory cgroup folder, :func:`memory_cgroup`) the command runs in it, under its memory limit
    as on a machine with that much memory: file pages are dropped when the limit is reached, and the command is
    killed if what it holds itself exceeds it. With ``may_fail`` a command that fails gives ``{"failed": why}``
    instead of an exception."""
    result = run_measuring_memory(command, env, cgroup)
    if result["status"]:
        if may_fail:
            why = (
                "killed: out of memory"
                if result["status"] == -9
                else (result["err"].strip().splitlines() or ["?"])[-1][:200]
            )
            return {"failed": why, "seconds": round(result["seconds"], 1)}
        raise RuntimeError(f"{command} failed:\n{result['err']}")
    return {
        "peak_mib": round(result["peak_mib"], 1),
        "anon_mib": round(result["anon_mib"], 1),
        "seconds": round(result["seconds"], 1),
        "out": portable(result["out"].strip()),
    }


def build_corpus(source: Path, path: Path, megabytes: float) -> dict:
    """``source``'s documents repeated (a copy number in front of each) until ``megabytes`` MB are written."""
    documents = [json.loads(line)["text"] for line in source.read_text().splitlines() if line.strip()]
    written, copy, count = 0, 0, 0
    with path.open("w") as f:
        while written < megabytes * 1e6:
            for text in documents:
                line = json.dumps({"text": f"[{copy}] {text}"}) + "\n"
                f.write(line)
                written += len(line.encode())
                count += 1
            copy += 1
    return {"path": str(path), "megabytes": round(written / 1e6, 1), "documents": count}


def train_command(corpus: str, tokenizer: Path, out: Path, steps: int, streaming: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gated_qwen",
        "train",
        "--train-file",
        corpus,
        "--tokenizer",
        str(tokenizer),
        "--config",
        str(ROOT / "configs" / "small_4M.json"),
        "--seq-len",
        "256",
        "--batch-size",
        "8",
        "--max-steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--eval-every",
        str(steps),
        "--out",
        str(out),
        "--overwrite",
        "--no-progress",
        "--threads",
        "2",
        "--streaming" if streaming else "--no-streaming",
    ]


def memory_cgroup(limit_gib: float) -> Path:
    """A new memory cgroup (cgroup v1's memory controller, as root) limited to ``limit_gib`` GiB; remove it with rmdir."""
    root = Path("/sys/fs/cgroup/memory")
    group = root / f"gated-qwen-measure-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(int(limit_gib * 2**30)))
    except OSError as error:
        sys.exit(
            f"--beyond-memory needs a memory cgroup it can create ({group}: {error.strerror}); run it as root on a "
            "machine with cgroup v1's memory controller mounted at /sys/fs/cgroup/memory"
        )
    return group


def beyond_memory(args, work: Path, docstrings: Path, tokenizer: Path, env: dict) -> None:
    """Train on a corpus larger than the memory the process may use (``--beyond-memory`` GB of text in a memory cgroup
    of ``--memory-limit`` GiB): streamed, and from the Arrow cache (unless ``--skip-arrow``), with the in-memory
    reader used before as the control that the limit binds. Writes ``beyond_memory.{json,md}``."""
    corpus = build_corpus(docstrings / "train.jsonl", work / "beyond.jsonl", args.beyond_memory * 1000)
    runs = [("train --streaming", "beyond-stream", True)]
    if not args.skip_arrow:
        runs.append(("train (default: Arrow cache)", "beyond-arrow", False))
    rows = []
    group = memory_cgroup(args.memory_limit)
    try:
        for what, folder, streaming in runs:
            result = measured(
                train_command(corpus["path"], tokenizer, work / folder, args.steps, streaming),
                env,
                group,
                may_fail=True,
            )
            if "failed" not in result:
                summary = json.loads((work / folder / "summary.json").read_text())
                result["outcome"] = f"trained {summary['steps']} steps, train loss {summary['final_train_loss']:.3f}"
            rows.append({"what": what, **result})
            print(rows[-1], file=sys.stderr)
        result = measured([sys.executable, "-c", IN_MEMORY, corpus["path"], str(tokenizer)], env, group, may_fail=True)
        rows.append(
            {"what": "before: read_documents + pack_documents (in memory)", **result, "outcome": "read it all"}
        )
        print(rows[-1], file=sys.stderr)
    finally:
        group.rmdir()
    report = new_report(
        "training_memory_beyond",
        steps=args.steps,
        memory_limit_gib=args.memory_limit,
        corpus={k: v for k, v in corpus.items() if k != "path"},
        rows=rows,
    )
    lines = [
        f"| what | outcome in {args.memory_limit:g} GiB of memory | peak RSS (MiB) | peak anonymous RSS (MiB) | seconds |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        outcome = f"failed: {row['failed']}" if "failed" in row else row["outcome"]
        lines.append(
            f"| {row['what']} | {outcome} | {row.get('peak_mib', '-')} | {row.get('anon_mib', '-')} | {row['seconds']} |"
        )
    table = "\n".join(lines) + (
        f"\n\nA corpus of {corpus['megabytes']:,} MB ({corpus['documents']:,} documents of JSON lines) and each command run in a "
        f"memory cgroup limited to {args.memory_limit:g} GiB, as on a machine with less memory than the text: file pages "
        "(the corpus read, memory-mapped Arrow files) are dropped when the limit is reached, and a process whose own memory "
        f"exceeds it is killed. `configs/small_4M.json`, seq-len 256, batch 8, {args.steps} steps, one process. "
        + describe(report)
        + "\n"
    )
    print(table)
    if not args.print_only:
        print(
            f"wrote {write_results(args.results_dir, report, table, name='beyond_memory')}/beyond_memory.json and .md",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-mb", type=float, default=23.0, help="size of the base corpus (default 23, the issue's)"
    )
    parser.add_argument(
        "--factor", type=int, default=10, help="the large corpus is this many times the base (default 10)"
    )
    parser.add_argument(
        "--middle", type=int, default=3, help="a data pass also over this many times the base (default 3)"
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--work", type=Path, help="folder for the corpora and runs (default: a temporary folder)")
    parser.add_argument("--results-dir", default="results/training_memory", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the table, write no results")
    parser.add_argument(
        "--beyond-memory",
        type=float,
        metavar="GB",
        help="instead: train on GB of text in a memory cgroup of --memory-limit (writes beyond_memory.md)",
    )
    parser.add_argument(
        "--memory-limit", type=float, default=1.5, metavar="GIB", help="the memory for --beyond-memory (default 1.5)"
    )
    parser.add_argument(
        "--skip-arrow",
        action="store_true",
        help="--beyond-memory: only the streamed run (the Arrow one packs it all first)",
    )
    args = parser.parse_args(argv)
    if args.beyond_memory is not None and args.beyond_memory * 1e9 <= args.memory_limit * 2**30:
        parser.error(
            f"--beyond-memory {args.beyond_memory} GB is not more than --memory-limit {args.memory_limit} GiB"
        )

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "2",
        "HF_DATASETS_CACHE": "",
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        env["HF_DATASETS_CACHE"] = str(work / "datasets_cache")
        docstrings = work / "stdlib"
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "prepare_corpus.py"), "--out", str(docstrings), "--force"],
            env=env,
            check=True,
            capture_output=True,
        )
        tokenizer = work / "tokenizer"
        subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import json, sys\nfrom gated_qwen.tools.training import train_tokenizer\n"
                    "docs = [json.loads(l)['text'] for l in open(sys.argv[1])]\n"
                    "train_tokenizer(docs, 4096).save_pretrained(sys.argv[2])\n"
                ),
                str(docstrings / "train.jsonl"),
                str(tokenizer),
            ],
            env=env,
            check=True,
        )
        if args.beyond_memory is not None:
            beyond_memory(args, work, docstrings, tokenizer, env)
            return 0
        corpora = {
            "base": build_corpus(docstrings / "train.jsonl", work / "base.jsonl", args.base_mb),
            f"{args.middle}x": build_corpus(
                docstrings / "train.jsonl", work / "middle.jsonl", args.base_mb * args.middle
            ),
            f"{args.factor}x": build_corpus(
                docstrings / "train.jsonl", work / "large.jsonl", args.base_mb * args.factor
            ),
        }
        rows = []
        for name, corpus in corpora.items():
            for streaming in (False, True) if name != f"{args.middle}x" else ():
                out = work / f"run-{name}-{'stream' if streaming else 'arrow'}"
                result = measured(train_command(corpus["path"], tokenizer, out, args.steps, streaming), env)
                rows.append(
                    {
                        "what": f"train {args.steps} steps"
                        + (" --streaming" if streaming else " (default: Arrow cache)"),
                        "corpus": name,
                        **corpus,
                        "peak_mib": result["peak_mib"],
                        "anon_mib": result["anon_mib"],
                        "seconds": result["seconds"],
                    }
                )
                print(rows[-1], file=sys.stderr)
            result = measured([sys.executable, "-c", DATA_PASS, corpus["path"], str(tokenizer)], env)
            rows.append(
                {
                    "what": "one whole pass of the data (streamed, tokenized, packed)",
                    "corpus": name,
                    **corpus,
                    "peak_mib": result["peak_mib"],
                    "anon_mib": result["anon_mib"],
                    "seconds": result["seconds"],
                    "rows": int(result["out"]),
                }
            )
            print(rows[-1], file=sys.stderr)
        result = measured([sys.executable, "-c", IN_MEMORY, corpora["base"]["path"], str(tokenizer)], env)
        rows.append(
            {
                "what": "before: read_documents + pack_documents (in memory)",
                "corpus": "base",
                **corpora["base"],
                "peak_mib": result["peak_mib"],
                "anon_mib": result["anon_mib"],
                "seconds": result["seconds"],
            }
        )
    for row in rows:
        row.pop("path")
    report = new_report("training_memory", steps=args.steps, rows=rows)
    lines = [
        "| what | corpus | MB | documents | peak RSS (MiB) | peak anonymous RSS (MiB) | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['what']} | {row['corpus']} | {row['megabytes']} | {row['documents']:,} | {row['peak_mib']} | {row['anon_mib']} | {row['seconds']} |"
        )
    table = "\n".join(lines) + (
        "\n\nPeak resident memory of a fresh process (ru_maxrss) and the peak of its anonymous part (RssAnon: without "
        "file pages such as the memory-mapped Arrow files, which the kernel can drop), `configs/small_4M.json`, seq-len 256, batch 8, "
        "one process, a BPE of 4096 trained once. " + describe(report) + "\n"
    )
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
