"""Wall time and peak memory of ``gated-qwen convert`` on a Qwen3-30B-A3B-shaped MoE, with this checkout's converter
and, with ``--before``, another checkout's, side by side.

    python scripts/bench_conversion.py --before /path/to/older/checkout          # 3 layers, 3 rounds
    python scripts/bench_conversion.py --layers 2 --repeats 1 --print-only

The source is a random Qwen3-MoE checkpoint with Qwen3-30B-A3B's layer shapes (hidden 2048, 32 query and 4 kv heads
of 128, 128 experts of 768, 8 a token, vocabulary 151936, untied lm_head, bfloat16) but only ``--layers`` of its
48 layers, in its published layout: safetensors shards of at most ``--source-shard-size`` (Qwen's are about 4 GB)
with an index, every expert's gate_proj, up_proj and down_proj a tensor of its own. It is written tensor by tensor
into a temporary folder (``--scratch``), never held whole. Each run is the command a user types, ``python -m
gated_qwen convert SRC DST --gate GATE --quiet``, in a fresh process whose own peak resident memory (``ru_maxrss``
of that child; the pages of the memory-mapped source it touched count) and the peak of its
anonymous part (``RssAnon``, polled every 20 ms: the memory it holds itself) are recorded with its wall time and
the size of what it wrote; DST is removed after each run. A plain ``cp -r`` of the source, run the same way each
round, is the floor. Rounds run every (gate, checkout) pair in an order shuffled per round, so that the load of a
shared machine falls on both checkouts alike; peak memory does not depend on that load, time does. Medians are
over the rounds.

Writes ``results.json`` (every run, the machine, the versions, the commits) and ``results.md`` into
``--results-dir`` (default ``results/conversion``); ``--print-only`` writes nothing, ``--table-only`` measures
nothing and writes ``results.md`` again from the runs in ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _results import ROOT, describe, git_commit, new_report, portable, run_measuring_memory, write_results


# Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B), with num_hidden_layers set by --layers; "tiny" for tests.
SHAPES = {
    "30b-a3b": {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    },
    "tiny": {
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
        "num_experts_per_tok": 2, "max_position_embeddings": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    },
}  # fmt: skip
GATES = ("headwise", "elementwise")


def source_tensors(shape: dict, layers: int) -> dict[str, tuple[int, ...]]:
    """The tensors of a Qwen3-MoE checkpoint as Qwen published them: names and shapes."""
    hidden, heads, kv_heads, head_dim = (shape[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))  # fmt: skip
    experts, expert_size, vocab = shape["num_experts"], shape["moe_intermediate_size"], shape["vocab_size"]
    tensors = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        tensors.update({
            prefix + "input_layernorm.weight": (hidden,), prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            prefix + "self_attn.q_norm.weight": (head_dim,), prefix + "self_attn.k_norm.weight": (head_dim,),
            prefix + "mlp.gate.weight": (experts, hidden),
        })  # fmt: skip
        for expert in range(experts):
            for name, size in (("gate_proj", (expert_size, hidden)), ("up_proj", (expert_size, hidden)), ("down_proj", (hidden, expert_size))):  # fmt: skip
                tensors[f"{prefix}mlp.experts.{expert}.{name}.weight"] = size
    tensors.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return tensors


def write_source(folder: Path, shape: dict, layers: int, max_shard_size: str) -> int:
    """Write the random source checkpoint into ``folder`` (a tensor in memory at a time); returns its weights' bytes."""
    import torch
    from transformers import Qwen3MoeConfig

    from gated_qwen.checkpoint import TensorInfo, write_safetensors_checkpoint

    config = Qwen3MoeConfig(**shape, num_hidden_layers=layers, tie_word_embeddings=False, dtype="bfloat16")
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.save_pretrained(folder)
    plan = {name: TensorInfo(size, "BF16") for name, size in source_tensors(shape, layers).items()}
    generator = torch.Generator().manual_seed(0)

    def random_tensor(name: str) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(plan[name].shape, dtype=torch.bfloat16)
        return (torch.randn(plan[name].shape, generator=generator) * 0.02).to(torch.bfloat16)

    write_safetensors_checkpoint(folder, plan, random_tensor, max_shard_size, progress=False)
    return sum(info.nbytes for info in plan.values())


def measure(command: list[str], env: dict) -> dict:
    """Run ``command`` in a fresh process (:func:`_results.run_measuring_memory`): its wall seconds, its peak RSS
    and the peak of its ``RssAnon``, in MiB."""
    result = run_measuring_memory(command, env)
    if result["status"]:
        raise RuntimeError(f"{portable(' '.join(command))} failed ({result['status']}):\n{result['err']}")
    return {
        "seconds": round(result["seconds"], 3),
        "peak_rss_mib": round(result["peak_mib"], 1),
        "anon_mib": round(result["anon_mib"], 1),
    }


def folder_bytes(folder: Path) -> int:
    return sum(file.stat().st_size for file in folder.rglob("*") if file.is_file())


def run_rounds(source: Path, scratch: Path, checkouts: dict[str, Path], repeats: int) -> list[dict]:
    """Every (gate, checkout) conversion and a ``cp -r`` once a round, in an order shuffled per round."""
    jobs = [("copy", None)] + [(gate, name) for gate in GATES for name in checkouts]
    runs = []
    for round_index in range(repeats):
        order = list(jobs)
        random.Random(round_index).shuffle(order)
        for gate, name in order:
            destination = scratch / "out"
            if gate == "copy":
                command, env = ["cp", "-r", str(source), str(destination)], dict(os.environ)
            else:
                command = [sys.executable, "-m", "gated_qwen", "convert", str(source), str(destination)]
                command += ["--gate", gate, "--quiet"]
                env = {**os.environ, "PYTHONPATH": str(checkouts[name]), "HF_HUB_OFFLINE": "1"}
            result = measure(command, env)
            result.update(round=round_index, gate=gate, checkout=name, output_bytes=folder_bytes(destination))
            if gate != "copy":
                result["output_check"] = check_output(destination, gate)
            runs.append(result)
            print(json.dumps(result), file=sys.stderr, flush=True)
            shutil.rmtree(destination)
    return runs


def check_output(folder: Path, gate: str) -> str:
    """That a converted checkpoint is whole: its config says the gate, and its headers pass strict validation."""
    from gated_qwen import Qwen3MoeGatedConfig
    from gated_qwen.checkpoint import check_weights_match_config, read_checkpoint_header

    header = read_checkpoint_header(folder)
    config = Qwen3MoeGatedConfig.from_dict(header.config)
    if config.gate_type != gate:
        raise RuntimeError(f"{folder}: gate_type {config.gate_type!r}, not {gate!r}")
    check_weights_match_config(config, header.tensors, str(folder))
    return f"{len(header.tensors)} tensors in {len(header.files)} files, as the config says"


FIELDS = (("seconds", 1), ("peak_rss_mib", 0), ("anon_mib", 0))


def summary(runs: list[dict]) -> list[dict]:
    """Per (gate, checkout): the median, least and largest seconds, peak RSS and RssAnon; the output's size."""
    rows = []
    for key in dict.fromkeys((run["gate"], run["checkout"]) for run in runs):
        mine = [run for run in runs if (run["gate"], run["checkout"]) == key]
        row = {"gate": key[0], "checkout": key[1], "runs": len(mine), "output_bytes": mine[0]["output_bytes"]}
        for field, _ in FIELDS:
            values = [run[field] for run in mine]
            row.update({field: statistics.median(values), f"{field}_range": [min(values), max(values)]})
        rows.append(row)
    return rows


def markdown_table(report: dict) -> str:
    rows = {(row["gate"], row["checkout"]): row for row in report["summary"]}
    commits = {name: f"`{(commit or '?')[:7]}`" for name, commit in report["checkouts"].items()}
    lines = [
        "| gate | converter | seconds | peak RSS MiB | RssAnon MiB | output GB |",
        "|---|---|---|---|---|---|",
    ]

    def cells(row: dict) -> list[str]:
        low_high = [(f"{row[f]:.{d}f}", *(f"{v:.{d}f}" for v in row[f"{f}_range"])) for f, d in FIELDS]
        return [f"{median} ({low}-{high})" for median, low, high in low_high] + [f"{row['output_bytes'] / 1e9:.2f}"]

    for gate in GATES:
        for name in commits:
            lines.append("| " + " | ".join([gate, f"{name} {commits[name]}", *cells(rows[(gate, name)])]) + " |")
        if "before" in commits:
            before, after = rows[(gate, "before")], rows[(gate, "after")]
            ratios = [f"**{after[field] / before[field]:.2f}**" for field, _ in FIELDS]
            ratios[0] += f" (least times: {after['seconds_range'][0] / before['seconds_range'][0]:.2f})"
            lines.append("| " + " | ".join([gate, "after / before", *ratios, ""]) + " |")
    lines.append("| | plain `cp -r` of the source | " + " | ".join(cells(rows[("copy", None)])) + " |")
    source = report["source"]
    return (
        "\n".join(lines)
        + f"\n\nSource: a random Qwen3-30B-A3B-shaped MoE with {source['layers']} of its 48 layers "
        + f"({source['tensors']} tensors, {source['bytes'] / 1e9:.2f} GB of bfloat16 in {source['files']} safetensors "
        + f"files). Each cell: the median of {report['repeats']} rounds (the least and the largest in brackets); each "
        + "run `python -m gated_qwen convert SRC DST --gate GATE --quiet` in a fresh process, rounds in a shuffled "
        + "order. Peak RSS: the process's ru_maxrss, the touched pages of the memory-mapped source included; RssAnon: "
        + "the peak of what it holds itself. Time follows the load of the shared machine (below): the least times "
        + "are the least disturbed by it. Memory varies between runs of the same converter by the spread shown. "
        + describe(report)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=3, help="decoder layers of the 48 (default 3: about 4.9 GB)")
    parser.add_argument("--shape", choices=SHAPES, default="30b-a3b", help="layer shapes (tiny: for tests)")
    parser.add_argument("--source-shard-size", default="4GB", help="the source's largest shard (default 4GB)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--before", type=Path, help="another checkout whose converter to measure beside this one")
    parser.add_argument("--scratch", type=Path, help="where the source and outputs go (default: the system's temp)")
    parser.add_argument("--results-dir", default="results/conversion", help="where results.json/.md go")
    parser.add_argument("--print-only", action="store_true", help="print the table, write no results")
    parser.add_argument("--table-only", action="store_true", help="write results.md again from results.json's runs")
    args = parser.parse_args(argv)
    if args.table_only:
        report = json.loads(Path(args.results_dir, "results.json").read_text())
        report["summary"] = summary(report["runs"])
        print(f"wrote {write_results(args.results_dir, report, markdown_table(report))}/results.md", file=sys.stderr)
        return 0
    checkouts = {"after": ROOT}
    if args.before is not None:
        if not (args.before / "gated_qwen" / "__init__.py").is_file():
            parser.error(f"--before {args.before}: not a gated-qwen checkout (no gated_qwen/__init__.py)")
        checkouts = {"before": args.before.resolve(), "after": ROOT}
    if args.scratch is not None and not args.scratch.is_dir():
        parser.error(f"--scratch {args.scratch}: no such folder (make it first, or leave --scratch out)")
    report = new_report("conversion", shape=args.shape, repeats=args.repeats)  # the load before the runs
    with tempfile.TemporaryDirectory(dir=args.scratch, prefix="bench-conversion-") as scratch:
        source = Path(scratch, "source")
        weight_bytes = write_source(source, SHAPES[args.shape], args.layers, args.source_shard_size)
        files = sorted(p.name for p in source.glob("*.safetensors"))
        runs = run_rounds(source, Path(scratch), checkouts, args.repeats)
    report.update(
        source={"layers": args.layers, "bytes": weight_bytes, "files": len(files), "shard_size": args.source_shard_size,
                "tensors": len(source_tensors(SHAPES[args.shape], args.layers))},
        checkouts={name: git_commit(path) for name, path in checkouts.items()},
        runs=runs,
        summary=summary(runs),
    )  # fmt: skip
    table = markdown_table(report)
    print(table)
    if not args.print_only:
        print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
