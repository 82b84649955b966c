"""Time and peak memory of loading a full-size released arm, and of re-saving it once as safetensors.

Writes a random checkpoint exactly in the released layout (configs/1B_gate_headwise.json: model_type
"qwen2", 1.72B parameters in bfloat16, one pytorch_model.bin of about 3.4 GB, written with torch.save
as transformers 4.x wrote it), then, each in a fresh Python that reports its own peak resident memory
(VmHWM, imports included):

  load-bin         Qwen3GatedForCausalLM.from_pretrained(arm, dtype="auto"), then one forward of 8 tokens
  resave           convert_checkpoint(arm, clean, gate="keep")   (gated-qwen convert ARM CLEAN --gate keep)
  load-safetensors Qwen3GatedForCausalLM.from_pretrained(clean, dtype="auto"), then one forward of 8 tokens

and prints each one's seconds and peak RSS, also as a multiple of the bf16 weights' size. Writes
``results.json`` (every run, the machine and package versions) and ``results.md`` (the table) into
``--results-dir`` (default ``results/released_arm``).

    python scripts/measure_released_arm.py [--repeats 3] [--scratch DIR] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from _results import describe, new_report, write_results


REPO = Path(__file__).resolve().parents[1]

STEPS = {
    "import-only": "`import torch` and gated-qwen, nothing else (the floor of every row)",
    "load-bin": '`from_pretrained(arm, dtype="auto")` + one forward of 8 tokens',
    "resave": "`gated-qwen convert ARM CLEAN --gate keep` (the re-save, in process)",
    "load-safetensors": '`from_pretrained(CLEAN, dtype="auto")` + one forward of 8 tokens',
}
# step -> (benchmark.child step, which folder it reads): each runs alone in a fresh process
CHILDREN = {
    "import-only": ("import-only", "arm"),
    "load-bin": ("load", "arm"),
    "resave": ("resave", "arm"),
    "load-safetensors": ("load", "clean"),
}


def write_released_arm(folder: Path) -> int:
    """A random headwise arm of the released size in the released layout; returns the weights' bytes."""
    import torch

    from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM

    config_dict = json.loads((REPO / "configs" / "1B_gate_headwise.json").read_text())
    config_dict.pop("head_dim")  # absent in the released files: hidden_size / num_attention_heads
    config = Qwen3GatedConfig.from_dict(config_dict)
    torch.manual_seed(0)
    with torch.device("meta"):
        skeleton = Qwen3GatedForCausalLM(config)
    state = {}
    for name, parameter in skeleton.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied, as in the release
        tensor = torch.empty(parameter.shape, dtype=torch.bfloat16)
        tensor.normal_(std=0.02) if tensor.ndim > 1 else tensor.fill_(1.0)
        state[name] = tensor
    folder.mkdir(parents=True)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(
        json.dumps(
            {
                **config_dict,
                "auto_map": {
                    "AutoConfig": "configuration_qwen3.Qwen3Config",
                    "AutoModelForCausalLM": "modeling_qwen3.Qwen3ForCausalLM",
                },
            },
            indent=2,
        )
    )
    return sum(t.numel() * t.element_size() for t in state.values())


def main() -> int:
    from gated_qwen.checkpoint.outputs import scratch_folder
    from gated_qwen.tools.benchmark.child import run_step

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each child (default 3); the median is shown")
    parser.add_argument(
        "--scratch", help="where to write the 3.4 GB arm and its re-saved copy (default: a temporary folder)"
    )
    parser.add_argument("--results-dir", default="results/released_arm", help="where results.json/.md go")
    args = parser.parse_args()
    report = new_report("released_arm", repeats=args.repeats)

    # A 3.4 GB folder: one that a killed run left behind is removed by the next run (gated_qwen.checkpoint.outputs).
    with scratch_folder(args.scratch, name="released-arm") as scratch:
        arm, clean = scratch / "1B_gate_headwise", scratch / "clean"
        weight_bytes = write_released_arm(arm)
        print(f"wrote {arm}: {weight_bytes / 1e6:,.1f} MB of bf16 weights in pytorch_model.bin", file=sys.stderr)
        results = {}
        for _ in range(args.repeats):
            for name, (step, reads) in CHILDREN.items():
                if name == "resave":
                    shutil.rmtree(clean, ignore_errors=True)
                source = arm if reads == "arm" else clean
                results.setdefault(name, []).append(run_step(step, str(source), str(clean)))
    report["weight_bytes"] = weight_bytes
    report["steps"] = {
        name: {
            "what": STEPS[name],
            "median_seconds": statistics.median(run["seconds"] for run in runs),
            "peak_rss_bytes": max(run["peak_rss"] for run in runs),
            "runs": runs,
        }
        for name, runs in results.items()
    }
    table = markdown_table(report)
    print(table)
    print(f"wrote {write_results(args.results_dir, report, table)}/results.json and results.md", file=sys.stderr)
    return 0


def markdown_table(report: dict) -> str:
    weight_bytes = report["weight_bytes"]
    lines = [
        f"A random headwise arm of the released size in the released layout ({weight_bytes / 1e6:,.0f} MB of bf16 "
        "weights in one `pytorch_model.bin` written by `torch.save`), each step in a fresh Python reporting its own "
        f"peak resident memory (VmHWM, imports included); median seconds and largest peak of {report['repeats']} runs.",
        "",
        "| step | what | seconds | peak RSS (MB) | peak RSS / bf16 weights |",
        "|---|---|---|---|---|",
    ]
    for name, step in report["steps"].items():
        peak = step["peak_rss_bytes"]
        lines.append(
            f"| {name} | {step['what']} | {step['median_seconds']:.2f} | {peak / 1e6:,.0f} | {peak / weight_bytes:.3f} |"
        )
    return "\n".join(lines) + "\n\n" + describe(report) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
