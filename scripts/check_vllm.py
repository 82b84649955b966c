"""Check that vLLM generates what gated-qwen generates, through gated-qwen's vLLM plugin.

For each model folder and each tensor-parallel size, the greedy tokens of vLLM (the same prompt ids,
float32 by default) are compared with gated-qwen's own ``generate`` on the same checkpoint, token for
token. A folder that gated-qwen cannot load itself (an export to another architecture) is compared with
the gated-qwen checkpoint it came from: ``--export EXPORTED SOURCE``.

    python scripts/check_vllm.py path/to/1B_gate_headwise --tensor-parallel-size 1 2
    python scripts/check_vllm.py saved_arm --export qwen3_5_export saved_arm --json
    python scripts/check_vllm.py --refused arm_with_a_wrong_config --json

A folder given with ``--refused`` is one vLLM must refuse: only vLLM is run on it (gated-qwen refuses it
too, so there is nothing to compare with), and the caller's exception is recorded as its ``error``.

Needs vLLM installed beside gated-qwen (docs/serving.md). On a CPU, each tensor-parallel rank takes
its own cores: ``VLLM_CPU_OMP_THREADS_BIND="0|1"`` for two ranks on a 2-core machine. Exits 1 when
any case differs or vLLM fails on it (its error is printed and recorded), 0 when all agree.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path


PROMPTS = ["The gate scales each head", "def add(a, b):", "Hello world. Hello gated attention."]


def gated_qwen_greedy(folder: str, prompt_ids: list[list[int]], max_new_tokens: int, dtype: str) -> list[list[int]]:
    """gated-qwen's own greedy continuation of each prompt, one prompt at a time (no padding)."""
    import torch

    from gated_qwen import Qwen3GatedForCausalLM, Qwen3MoeGatedForCausalLM

    moe = json.loads((Path(folder) / "config.json").read_text()).get("model_type") in ("qwen3_moe", "qwen3_moe_gated")
    model_class = Qwen3MoeGatedForCausalLM if moe else Qwen3GatedForCausalLM
    model = model_class.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    continuations = []
    for ids in prompt_ids:
        inputs = torch.tensor([ids])
        output = model.generate(
            inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        continuations.append(output[0, len(ids) :].tolist())
    return continuations


def model_class_name(model) -> str:
    """Run inside each vLLM worker: which class vLLM built."""
    return type(model).__name__


def vllm_greedy(
    folder: str,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    tensor_parallel_size: int,
    dtype: str,
    kv_cache_mib: int,
) -> tuple[list[list[int]], str]:
    """vLLM's greedy continuations and the model class it built, one engine for this folder and size."""
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = LLM(
        folder,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        seed=0,
        enforce_eager=True,
        max_model_len=max(len(ids) for ids in prompt_ids) + max_new_tokens,
        kv_cache_memory_bytes=kv_cache_mib << 20,
    )
    try:
        outputs = llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids],
            SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True),
            use_tqdm=False,
        )
        built = llm.apply_model(model_class_name)[0]
        return [list(output.outputs[0].token_ids) for output in outputs], built
    finally:
        # vLLM 0.32's LLM has no close(): end the engine (and its tensor-parallel workers) now, not at exit.
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


def check(
    cases: list[tuple[str, str]],
    tensor_parallel_sizes: list[int],
    max_new_tokens: int = 16,
    dtype: str = "float32",
    kv_cache_mib: int = 256,
) -> list[dict]:
    """One result per (model, reference) case and size: the tokens of both sides, what vLLM built, seconds.

    >>> check([("path/to/arm", "path/to/arm")], [1, 2])  # doctest: +SKIP
    """
    from transformers import AutoTokenizer

    # Every reference first: once vLLM has built a model in this process, it has decorated the model's
    # decoder class in place for its compiler, and gated-qwen's own classes no longer build outside vLLM.
    planned = []
    for model, reference in cases:
        if reference is None:  # to be refused: a few token ids, no reference
            planned.append((model, None, [[1, 2, 3]], None))
            continue
        tokenizer = AutoTokenizer.from_pretrained(model)
        prompt_ids = [tokenizer(prompt).input_ids for prompt in PROMPTS]
        planned.append((model, reference, prompt_ids, gated_qwen_greedy(reference, prompt_ids, max_new_tokens, dtype)))

    results = []
    for model, reference, prompt_ids, expected in planned:
        for size in tensor_parallel_sizes:
            result = {"model": model, "reference": reference, "tensor_parallel_size": size, "expected": expected}
            start = time.perf_counter()
            try:
                result["tokens"], result["built"] = vllm_greedy(
                    model, prompt_ids, max_new_tokens, size, dtype, kv_cache_mib
                )
            except Exception as error:  # recorded, and the remaining cases still run
                result["error"] = f"{type(error).__name__}: {error}"
            result["seconds"] = round(time.perf_counter() - start, 1)
            # a --refused case is "equal" when vLLM refused it
            result["equal"] = "error" in result if reference is None else result.get("tokens") == expected
            results.append(result)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="checkpoint folders gated-qwen loads (each is its own reference)")
    parser.add_argument(
        "--export",
        nargs=2,
        action="append",
        default=[],
        metavar=("EXPORTED", "SOURCE"),
        help="a folder vLLM serves without gated-qwen, checked against the checkpoint it came from",
    )
    parser.add_argument(
        "--refused",
        action="append",
        default=[],
        metavar="FOLDER",
        help="a folder vLLM must refuse (its error is recorded; nothing is compared)",
    )
    parser.add_argument("--tensor-parallel-size", type=int, nargs="+", default=[1])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache size for each engine (default 256)")
    parser.add_argument("--json", action="store_true", help="one JSON object per case on stdout")
    args = parser.parse_intermixed_args(argv)  # folders and --export pairs in any order
    cases = [(model, model) for model in args.models] + [tuple(pair) for pair in args.export]
    cases += [(model, None) for model in args.refused]
    if not cases:
        parser.error("give at least one model folder, --export EXPORTED SOURCE or --refused FOLDER")
    # One vLLM import for every engine: each engine in this process, not in a process of its own.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for the results

    start = time.perf_counter()
    results = check(cases, args.tensor_parallel_size, args.max_new_tokens, args.dtype, args.kv_cache_mib)
    for result in results:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            if result["reference"] is None:
                verdict = f"refused: {result['error']}" if result["equal"] else "NOT REFUSED"
            else:
                verdict = (
                    "equal"
                    if result["equal"]
                    else result.get("error")
                    or f"DIFFERENT: vLLM {result['tokens']} vs gated-qwen {result['expected']}"
                )
            print(
                f"{result['model']}  tp={result['tensor_parallel_size']}  {result.get('built', '-')}  {result['seconds']} s  {verdict}"
            )
    print(
        f"{sum(r['equal'] for r in results)}/{len(results)} cases equal in {time.perf_counter() - start:.0f} s",
        file=sys.stderr,
    )
    return 0 if all(result["equal"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
