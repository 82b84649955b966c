"""Learning-rate tolerance (the paper's stability claim) in miniature: matched arms at increasing learning rates.

The baseline and the released gates (G1 headwise, G1 elementwise) of ``scripts/run_ablation.py`` (same
architecture, corpus, tokenizer, data order and schedule), each trained once (seed 0) at every learning rate of
``--lrs``. Per run: loss spikes (``train``'s summary: a logged loss above 1.5x the median of the previous 50),
the final training loss and the held-out loss (``train``'s own held-out evaluation). Writes
``results/lr_tolerance/results.{json,md}``; the runs stay under ``--runs`` and are reused when run again.

    python scripts/prepare_corpus.py && python scripts/run_lr_tolerance.py      # about 10 minutes on 2 CPU threads
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import ROOT, describe, new_report, write_results  # noqa: E402
from run_ablation import ARMS, CONFIG, CORPUS, run_folder, train  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=["baseline", "G1 headwise", "G1 elementwise"], choices=list(ARMS))
    parser.add_argument("--lrs", nargs="+", type=float, default=[3e-3, 1e-2, 3e-2, 1e-1])
    parser.add_argument("--max-tokens", type=int, default=1_000_000, help="training tokens per run")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "lr_tolerance")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "lr_tolerance")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def main():
    args = parse_args()
    if not (CORPUS / "train.jsonl").exists():
        sys.exit("no corpus: run `python scripts/prepare_corpus.py` first (it writes data/stdlib_docstrings/)")
    arms = ["baseline", *[arm for arm in args.arms if arm != "baseline"]]  # the baseline first: its tokenizer
    tokenizer = run_folder(args.runs, "baseline", f"lr{args.lrs[0]:g}") / "tokenizer"
    runs = {}
    for arm in arms:
        for lr in args.lrs:
            summary = train(args, arm, f"lr{lr:g}", 0, lr, args.max_tokens, tokenizer if tokenizer.is_dir() else None)
            runs.setdefault(arm, {})[f"{lr:g}"] = {
                "loss_spikes": summary["loss_spikes"],
                "loss_spike_steps": summary["loss_spike_steps"],
                "final_train_loss": summary["final_train_loss"],
                "heldout_loss": summary["heldout"]["loss"],
            }
    header = "| arm | " + " | ".join(f"lr {lr:g}: spikes, held-out loss" for lr in args.lrs) + " |"
    lines = [header, "|---" * (len(args.lrs) + 1) + "|"]
    for arm, by_lr in runs.items():
        cells = [f"{run['loss_spikes']}, {run['heldout_loss']:.3f}" for run in by_lr.values()]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    report = new_report(
        "lr_tolerance", config=json.loads(CONFIG.read_text()), max_tokens=args.max_tokens, seed=0, runs=runs
    )
    scale = (
        f"One run per arm and learning rate (seed 0), {args.max_tokens:,} training tokens each, the architecture of "
        "configs/ablation_tiny.json; held-out loss from `train`'s own evaluation (64 held-out rows)."
    )
    write_results(args.results, report, "\n".join(lines) + "\n\n" + scale + "\n\n" + describe(report) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
