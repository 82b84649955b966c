"""What only a GPU can show: the gated attention on CUDA under every attention backend the machine offers, in
bfloat16 and float32, for the dense and the MoE gated model, and generation with a static (compiled) cache.

float32 here is the model's float32 (no TF32).

Each model is random (seeded), a few layers at a realistic width (head_dim 128, 4 query heads per kv head).
For each backend the logits are compared with the float32 eager forward of the same weights, on a batch
with left padding; a backend that is not installed (flash_attention_2 without the flash-attn package) is
recorded as such, not skipped silently. Greedy generation with the static cache (which transformers
compiles) must give the tokens of the dynamic cache. Writes ``results/gpu/results.{json,md}``.

    python scripts/check_gpu.py                    # on a machine with CUDA
    python scripts/check_gpu.py --device cpu --small   # the same checks, small, to try the script
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, describe, new_report, write_results  # noqa: E402


BACKENDS = ("eager", "sdpa", "flex_attention", "flash_attention_2")


def build(kind: str, gate: str, small: bool, device: str):
    import torch

    from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM, Qwen3MoeGatedConfig, Qwen3MoeGatedForCausalLM

    sizes = {
        "vocab_size": 4096,
        "hidden_size": 256 if small else 2048,
        "num_hidden_layers": 2 if small else 4,
        "num_attention_heads": 8 if small else 16,
        "num_key_value_heads": 2 if small else 4,
        "head_dim": 32 if small else 128,
        "max_position_embeddings": 4096,
    }
    gate_keys = {
        "headwise_attn_output_gate": gate == "headwise",
        "elementwise_attn_output_gate": gate == "elementwise",
    }
    torch.manual_seed(0)
    if kind == "moe":
        config = Qwen3MoeGatedConfig(
            **sizes,
            **gate_keys,
            intermediate_size=4 * sizes["hidden_size"],
            moe_intermediate_size=sizes["hidden_size"] // 2,
            num_experts=8,
            num_experts_per_tok=2,
        )
        model = Qwen3MoeGatedForCausalLM(config)
    else:
        config = Qwen3GatedConfig(**sizes, **gate_keys, intermediate_size=3 * sizes["hidden_size"])
        model = Qwen3GatedForCausalLM(config)
    return model.to(device=device, dtype=torch.float32).eval()


def check_backends(model, device: str) -> dict:
    """Max |logit difference| of each backend (bf16 and fp32) against fp32 eager, on a left-padded batch."""
    import copy

    import torch

    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(10, model.config.vocab_size, (2, 96), generator=generator).to(device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :17] = 0  # left padding on the second row
    keep = attention_mask.bool()
    model.set_attn_implementation("eager")
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()[keep]
    scale = reference.abs().max().item()
    found = {"reference_max_abs_logit": scale}
    for dtype in (torch.float32, torch.bfloat16):
        candidate = copy.deepcopy(model).to(dtype)
        for backend in BACKENDS:
            name = f"{backend} {str(dtype).removeprefix('torch.')}"
            try:
                candidate.set_attn_implementation(backend)
                with torch.no_grad():
                    logits = candidate(input_ids=input_ids, attention_mask=attention_mask).logits.float()[keep]
                found[name] = {
                    "max_abs_diff": (logits - reference).abs().max().item(),
                    "argmax_agreement": (logits.argmax(-1) == reference.argmax(-1)).float().mean().item(),
                }
            except Exception as error:  # recorded: not installed, not supported on this device
                found[name] = {"unavailable": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
        del candidate
    return found


def check_static_cache(model, device: str) -> dict:
    """Greedy tokens with the dynamic cache against the static cache (compiled by transformers), in float32: a
    random model's logits are too flat for bf16 rounding to leave greedy paths alike (seen on the CPU)."""
    import torch

    model = model.to(torch.float32)
    model.set_attn_implementation("sdpa")
    prompt = torch.randint(10, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(2)).to(device)
    runs = {}
    for cache in ("dynamic", "static"):
        kwargs = {"cache_implementation": "static"} if cache == "static" else {}
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0, **kwargs
            )
        runs[cache] = {"tokens": out[0, 32:].tolist(), "seconds_first_call": round(time.perf_counter() - start, 2)}
    equal = runs["dynamic"]["tokens"] == runs["static"]["tokens"]
    first_difference = next(
        (i for i, (a, b) in enumerate(zip(runs["dynamic"]["tokens"], runs["static"]["tokens"])) if a != b), None
    )
    return {
        "equal_tokens": equal,
        "first_difference": first_difference,
        **{f"{cache}_seconds_first_call": run["seconds_first_call"] for cache, run in runs.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="small models (to try the script on a CPU)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "results" / "gpu")
    args = parser.parse_args(argv)

    import torch

    report = new_report(
        "gpu",
        device=args.device,
        device_name=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        torch_cuda=torch.version.cuda,
        checks={},
    )
    try:
        import flash_attn  # noqa: F401

        report["flash_attn"] = flash_attn.__version__
    except ImportError:
        report["flash_attn"] = None
    for kind, gate in (("dense", "headwise"), ("dense", "elementwise"), ("moe", "headwise")):
        name = f"{kind} {gate}"
        try:
            model = build(kind, gate, args.small, args.device)
            report["checks"][name] = {
                "backends": check_backends(model, args.device),
                "static_cache": check_static_cache(model, args.device),
            }
        except Exception:
            report["checks"][name] = {"error": traceback.format_exc()[-2000:]}
        print(name, report["checks"][name], flush=True)

    lines = [
        describe(report),
        "",
        f"Device: {report['device_name']} (CUDA {report['torch_cuda']}); flash-attn: "
        f"{report['flash_attn'] or 'not installed'}.",
        "",
        "| model | backend, dtype | max abs logit diff vs fp32 eager | argmax agreement |",
        "|---|---|---|---|",
    ]
    for name, found in report["checks"].items():
        if "error" in found:
            lines.append(f"| {name} | error | {found['error'].splitlines()[-1]} | |")
            continue
        for backend, value in found["backends"].items():
            if not isinstance(value, dict):
                continue
            if "unavailable" in value:
                lines.append(f"| {name} | {backend} | unavailable: {value['unavailable']} | |")
            else:
                lines.append(f"| {name} | {backend} | {value['max_abs_diff']:.3g} | {value['argmax_agreement']:.3f} |")
    lines += [
        "",
        "| model | static cache (compiled) greedy tokens = dynamic cache | first call, dynamic / static (s) |",
        "|---|---|---|",
    ]
    for name, found in report["checks"].items():
        if "static_cache" in found:
            cache = found["static_cache"]
            lines.append(
                f"| {name} | {cache['equal_tokens']} (first difference: {cache['first_difference']}) | "
                f"{cache['dynamic_seconds_first_call']} / {cache['static_seconds_first_call']} |"
            )
    markdown = "\n".join(lines) + "\n"
    write_results(args.output_dir, report, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
