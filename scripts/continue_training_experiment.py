"""A measured miniature of "add the gate to a pretrained model and keep training it".

The question (the authors' repository, qiuzh20/gated_attention issue 10): a user added gates to a
pretrained model and kept training it; zero-initialised gates barely moved and gave no gain, and a
random initialisation spiked the loss. Here the pretrained model is the shipped ``baseline`` arm
(gated_qwen/default_models/baseline: 4.2M parameters, no gate, 2.0M tokens of the standard library's
docstrings), continued for the same token budget on the same (held-in) training split as:

* ``baseline``: the model as it is, no gate;
* ``identity``: converted to a headwise gate, gate rows zero (every gate 0.5, the same outputs), all
  parameters trained;
* ``identity-gate-only``: the same conversion, only the gate rows of q_proj trained (``--trainable gate``);
* ``random``: converted with randomly drawn gate rows (``--init random``), all parameters trained;
* ``identity-gate-lr10`` (not run unless asked, ``--arms``): as ``identity`` with ``--gate-lr-scale 10``;
* ``baseline-seed2`` (not run unless asked): ``baseline`` with seed 2, so other rows in another order: how
  much the held-out loss of one run moves with the data order alone;
* ``identity-seed2``, ``random-seed2`` (not run unless asked): ``identity`` and ``random`` with seed 2, each
  paired with ``baseline-seed2`` as the seed-1 arms are with ``baseline``.

Every arm runs ``gated-qwen train`` in its own process, one after the other, with the same seed, so
step N of every arm trains on the same rows. Then each final model (and each starting model) is
measured here in float32: held-out loss over every 256-token row of the held-out split, and the gates
(sigmoid of the gate logits, ``gated_qwen.tools.analysis.record_gates``) at every held-out token, head and
layer. The loss spike is read off each run's ``log.csv`` (see ``spike_measures``).

    python scripts/prepare_corpus.py
    python scripts/continue_training_experiment.py --max-tokens 1000000 --threads 2 --out runs/continue
    python scripts/continue_training_experiment.py --out runs/continue --report-only   # re-measure finished runs

Writes ``results.json`` (every number) and ``results.md`` (the table) into ``--results-dir``; an arm whose
run folder already holds ``final/`` and ``summary.json`` is measured, not trained again (its wall time is
read from ``OUT/ARM.wall_s``, written when it was trained).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import portable  # noqa: E402

from gated_qwen.checkpoint.outputs import write_text


ROOT = Path(__file__).resolve().parents[1]
BASELINE = "gated_qwen/default_models/baseline"
DATA = "data/stdlib_docstrings"
ARMS = {
    "baseline": [],
    "identity": ["--gate", "headwise", "--init", "identity"],
    "identity-gate-only": ["--gate", "headwise", "--init", "identity", "--trainable", "gate"],
    "random": ["--gate", "headwise", "--init", "random"],
    "identity-gate-lr10": ["--gate", "headwise", "--init", "identity", "--gate-lr-scale", "10"],
    "baseline-seed2": [],  # the baseline again with another data order (SEEDS): how far one seed's result moves
    "identity-seed2": ["--gate", "headwise", "--init", "identity"],
    "random-seed2": ["--gate", "headwise", "--init", "random"],
}
SEEDS = {"baseline-seed2": 2, "identity-seed2": 2, "random-seed2": 2}  # arms with a seed of their own


def paired_baseline(arm: str) -> str:
    """The baseline arm that trained on the same rows in the same order as ``arm`` (the same seed)."""
    return "baseline-seed2" if arm in SEEDS else "baseline"


DEFAULT_ARMS = ("baseline", "identity", "identity-gate-only", "random")
SPIKE_STEPS = 50  # the spike measures look at the first SPIKE_STEPS optimizer steps


def train_command(arm: str, args) -> list[str]:
    return [
        "gated-qwen",
        "train",
        "--init-from",
        args.init_from,
        *ARMS[arm],
        "--train-file",
        f"{args.data}/train.jsonl",
        "--heldout-file",
        f"{args.data}/heldout.jsonl",
        "--seq-len",
        "256",
        "--batch-size",
        "16",
        "--max-tokens",
        str(args.max_tokens),
        "--lr",
        str(args.lr),
        "--warmup-steps",
        str(args.warmup_steps),
        "--min-lr-rate",
        "0.1",
        "--weight-decay",
        "0.1",
        "--eval-every",
        "25",
        "--eval-rows",
        "64",
        "--seed",
        str(SEEDS.get(arm, args.seed)),
        "--threads",
        str(args.threads),
        "--no-progress",
        "--out",
        str(Path(args.out) / arm),
    ]


def run_arm(arm: str, args) -> dict:
    """Train one arm in its own process (not when its run is complete, nor with ``--report-only``);
    returns the command and the wall time it took."""
    folder = Path(args.out) / arm
    command = train_command(arm, args)
    wall_file = Path(args.out) / f"{arm}.wall_s"  # beside the run: `train --overwrite` would replace it inside
    if args.report_only or ((folder / "final").is_dir() and (folder / "summary.json").is_file()):
        print(f"[{arm}] measuring the run in {folder}", flush=True)
        wall = float(wall_file.read_text()) if wall_file.is_file() else None
        return {"command": portable(shlex.join(command)), "wall_s": wall}
    if folder.exists():
        command += ["--overwrite"]  # an interrupted run of this arm: start it again
    print(f"[{arm}] {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    with (Path(args.out) / f"{arm}.stderr.log").open("w") as stderr:
        subprocess.run(
            [sys.executable, "-m", "gated_qwen", *command[1:]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=ROOT,
        )
    wall = time.perf_counter() - start
    write_text(wall_file, f"{wall:.1f}\n")
    print(f"[{arm}] done in {wall / 60:.1f} min", flush=True)
    return {"command": portable(shlex.join(command)), "wall_s": round(wall, 1)}


def spike_measures(log: list[dict], reference: list[dict] | None, steps: int = SPIKE_STEPS) -> dict:
    """How far the train loss jumps in the first ``steps`` steps, two ways.

    ``rise_over_running_min``: the largest ``loss[t] - min(loss[1..t-1])``, t <= steps (the train loss of
    step t is that of its batch before step t's update; batches differ, so this includes batch noise,
    whose size the unchanged baseline arm shows). ``excess_over_reference``: the largest
    ``loss[t] - reference_loss[t]``, t <= steps, where the reference is the paired baseline arm (the same
    seed, :func:`paired_baseline`), which trained on the very same rows at every step, so batch difficulty cancels. ``first_step``: the loss at step 1,
    i.e. of the starting model on the first batch.
    """
    losses = {int(r["step"]): float(r["train_loss"]) for r in log if r["train_loss"]}
    window = [losses[t] for t in sorted(losses) if t <= steps]
    rise = max((window[t] - min(window[:t]) for t in range(1, len(window))), default=None)
    out = {
        "steps": min(steps, len(window)),
        "first_step": window[0] if window else None,
        "rise_over_running_min": rise,
    }
    if reference is not None:
        ref = {int(r["step"]): float(r["train_loss"]) for r in reference if r["train_loss"]}
        paired = [losses[t] - ref[t] for t in sorted(losses) if t <= steps and t in ref]
        out["excess_over_reference"] = max(paired) if paired else None
        out["excess_step"] = (
            sorted(t for t in losses if t <= steps and t in ref)[paired.index(max(paired))] if paired else None
        )
        out["mean_difference_over_reference"] = sum(paired) / len(paired) if paired else None
        everywhere = {t: losses[t] - ref[t] for t in losses if t in ref}
        out["mean_difference_by_steps"] = {
            f"{first}-{last}": sum(d for t, d in everywhere.items() if first <= t <= last) / n
            for first, last in ((1, 10), (11, 50), (51, max(everywhere, default=0)))
            if (n := sum(1 for t in everywhere if first <= t <= last))
        }
    return out


@torch.no_grad()
def gate_statistics(model, rows: torch.Tensor, batch_size: int = 16) -> dict | None:
    """Gates (after the sigmoid) at every token, head and layer of ``rows``: mean, share < 0.5, mean |g - 0.5|."""
    from gated_qwen.tools.analysis.gates import record_gates

    if model.config.gate_type == "none":
        return None
    with record_gates(model) as record:
        for start in range(0, len(rows), batch_size):
            model(input_ids=rows[start : start + batch_size])
    every = torch.cat([record.gates(layer).flatten() for layer in record.layers])
    per_layer = [record.gates(layer) for layer in record.layers]  # (N, H, 1) each
    return {
        "mean": every.mean().item(),
        "below_0.5": (every < 0.5).float().mean().item(),
        "movement_from_0.5": (every - 0.5).abs().mean().item(),
        "min": every.min().item(),
        "max": every.max().item(),
        "values": every.numel(),
        "layer_means": [g.mean().item() for g in per_layer],
        "head_means": [g.mean(dim=(0, 2)).tolist() for g in per_layer],
    }


def measure(model, rows: torch.Tensor) -> dict:
    from gated_qwen.tools.training import evaluate

    model.eval()
    return {"heldout": evaluate(model, rows, batch_size=16), "gates": gate_statistics(model, rows)}


def read_log(folder: Path) -> list[dict]:
    return list(csv.DictReader((folder / "log.csv").open()))


def reference_log(arm: str, out: Path) -> list[dict] | None:
    """The log of ``arm``'s paired baseline (None for a baseline itself, or when that arm has not run)."""
    baseline = out / paired_baseline(arm)
    return read_log(baseline) if baseline.name != arm and (baseline / "log.csv").is_file() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/continue", help="folder of the arms' runs (default %(default)s)")
    parser.add_argument("--results-dir", default="results/continue_training", help="where results.json/.md go")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(DEFAULT_ARMS))
    parser.add_argument("--init-from", default=BASELINE, help="the pretrained model (default %(default)s)")
    parser.add_argument("--data", default=DATA, help="corpus folder from scripts/prepare_corpus.py")
    parser.add_argument("--max-tokens", type=int, default=1_000_000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="measure finished runs, train nothing")
    args = parser.parse_args()
    os.chdir(ROOT)
    torch.set_num_threads(args.threads)
    if not Path(args.data, "train.jsonl").is_file():
        sys.exit(f"{args.data}/train.jsonl is missing; run `python scripts/prepare_corpus.py` first")
    Path(args.out).mkdir(parents=True, exist_ok=True)

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    runs = {}
    for arm in args.arms:
        runs[arm] = run_arm(arm, args)

    from gated_qwen import Qwen3GatedForCausalLM
    from gated_qwen.tools.generation import load_tokenizer
    from gated_qwen.tools.training import (
        TrainRunArguments,
        heldout_rows,
        load_initial_model,
        pack_documents,
        read_documents,
    )

    tokenizer = load_tokenizer(args.init_from)
    rows = heldout_rows(pack_documents(read_documents(f"{args.data}/heldout.jsonl"), tokenizer), 256)
    results = {}
    for arm in args.arms:
        folder = Path(args.out) / arm
        saved = json.loads((folder / "train_args.json").read_text())
        fields = TrainRunArguments.__dataclass_fields__
        start_model = load_initial_model(TrainRunArguments(**{k: v for k, v in saved.items() if k in fields}))
        final_model = Qwen3GatedForCausalLM.from_pretrained(folder / "final", dtype=torch.float32)
        summary = json.loads((folder / "summary.json").read_text())
        log = read_log(folder)
        results[arm] = {
            **runs[arm],
            "flags": shlex.join(ARMS[arm] + (["--seed", str(SEEDS[arm])] if arm in SEEDS else [])),
            "steps": summary["steps"],
            "tokens": summary["tokens"],
            "parameters": summary["parameters"],
            "trainable_parameters": summary.get("trainable_parameters"),
            "train_elapsed_s": summary["elapsed_s"],
            "before": measure(start_model, rows),
            "after": measure(final_model, rows),
            "spike": spike_measures(log, reference_log(arm, Path(args.out))),
            "heldout_curve": [(int(r["step"]), float(r["heldout_loss"])) for r in log if r["heldout_loss"]],
        }
        print(
            f"[{arm}] held-out {results[arm]['before']['heldout']['loss']:.4f} -> "
            f"{results[arm]['after']['heldout']['loss']:.4f}",
            flush=True,
        )

    report = {
        "question": "qiuzh20/gated_attention issue 10: gates added to a pretrained model, then continued training",
        "pretrained": args.init_from,
        "corpus": f"{args.data} (scripts/prepare_corpus.py); trained on train.jsonl, measured on every "
        f"256-token row of heldout.jsonl ({len(rows)} rows)",
        "settings": {
            "max_tokens": args.max_tokens,
            "lr": args.lr,
            "warmup_steps": args.warmup_steps,
            "min_lr_rate": 0.1,
            "weight_decay": 0.1,
            "seq_len": 256,
            "batch_size": 16,
            "seed": args.seed,
            "threads": args.threads,
            "spike_steps": SPIKE_STEPS,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_before,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "started_utc": started,
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        or None,
        "arms": results,
    }
    out_dir = Path(args.results_dir)
    write_text(out_dir / "results.json", json.dumps(report, indent=2) + "\n")
    write_text(out_dir / "results.md", markdown_table(report))
    print((out_dir / "results.md").read_text())


def markdown_table(report: dict) -> str:
    def f(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    def excess(spike):
        if spike.get("excess_over_reference") is None:
            return "-"
        return " / ".join(
            [f(spike["excess_over_reference"]), *(f"{v:+.3f}" for v in spike["mean_difference_by_steps"].values())]
        )

    lines = [
        f"Continued training of `{report['pretrained']}` for {report['settings']['max_tokens']:,} tokens "
        f"(lr {report['settings']['lr']:g}, warmup {report['settings']['warmup_steps']}, seed {report['settings']['seed']}); "
        "held-out loss over every 256-token held-out row; spikes over the first "
        f"{report['settings']['spike_steps']} steps.",
        "",
        "| arm | flags | trained parameters | held-out loss before | after | change | after minus paired baseline's "
        "| step-1 train loss "
        "| largest rise over running min | train loss - baseline's on the same rows: largest (steps 1-50) "
        "/ mean 1-10 / 11-50 / 51-end | gate mean before / after "
        "| gates < 0.5 after | mean \\|gate - 0.5\\| after | wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in report["arms"].items():
        before, after, spike = r["before"], r["after"], r["spike"]
        gates_before, gates_after = before["gates"], after["gates"]
        wall = r["wall_s"] if r["wall_s"] is not None else r["train_elapsed_s"]
        paired = report["arms"].get(paired_baseline(arm))
        gap = after["heldout"]["loss"] - paired["after"]["heldout"]["loss"] if paired and paired is not r else None
        lines.append(
            f"| {arm} | `{r['flags'] or '(none)'}` | {r['trainable_parameters']:,} | {f(before['heldout']['loss'], 4)} "
            f"| {f(after['heldout']['loss'], 4)} | {after['heldout']['loss'] - before['heldout']['loss']:+.4f} "
            f"| {'-' if gap is None else f'{gap:+.4f}'} "
            f"| {f(spike['first_step'])} | {f(spike['rise_over_running_min'])} | {excess(spike)} "
            f"| {f(gates_before and gates_before['mean'])} / {f(gates_after and gates_after['mean'])} "
            f"| {f(gates_after and gates_after['below_0.5'])} | {f(gates_after and gates_after['movement_from_0.5'])} "
            f"| {wall / 60:.1f} min |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
