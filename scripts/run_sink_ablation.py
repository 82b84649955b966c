"""The paper's attention-sink rows (arXiv 2505.06708, Tables 3 and 4) on a miniature where the baseline sinks.

Each arm is a one-layer, one-head Qwen3Gated model trained from scratch on the Bigram-Backcopy task (arXiv
2410.13835; :mod:`gated_qwen.tools.sink_task`): a bigram model over 64 tokens and a BOS token, where after
each of 3 trigger tokens the next token copies the token before the trigger. Every arm trains with the project's
Trainer on the same generated rows, in the same order, with the same schedule and budget (per seed); the arms
differ only in their config keys (``ARMS``). Arms run side by side, one process per core (``--jobs``), one
thread each, so that a run's figures do not depend on what runs beside it.

Measured on 512 probe rows drawn apart from the training rows (``measure_sink``): first-token attention (mean
over the heads of the layer where it is largest, over non-trigger queries) beside uniform attention's figure for
the same queries; the share of heads that sink (first-token attention above 0.3, arXiv 2410.10781); task loss,
accuracy on copy and bigram targets; largest residual-state activation; the first token's residual-state and
value-state norms against the others'; mean gate and share of gate scores below 0.5; and the paper's Table 4
figure beside each measured one where the paper has the row. First-token attention is also recorded every
``--curve-every`` steps, and plotted over training, one line per arm.

Writes ``DIR/results.{json,md}`` and ``DIR/first_token_attention.png`` (``--out``, default ``results/sink``);
each finished run is kept under ``--runs`` and reused when the script runs again with the same settings.

    python scripts/run_sink_ablation.py                                      # every arm, seeds 0,1,2
    python scripts/run_sink_ablation.py --arms baseline,"G1 elementwise" --seeds 0 --steps 200 --out /tmp/sink
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import ROOT, describe, new_report, write_results  # noqa: E402


# The rows of the paper's Tables 3 and 4 that touch the sink, as Qwen3GatedConfig keys (docs/design-space.md).
ARMS = {
    "baseline": {"gate_type": "none"},
    "G1 elementwise": {"gate_type": "elementwise"},
    "G1 headwise": {"gate_type": "headwise"},
    "G1 head-shared": {"gate_type": "elementwise", "gate_shared_across_heads": True},
    "G2 value": {"gate_type": "elementwise", "gate_position": "value"},
    "additive identity": {"gate_type": "elementwise", "gate_activation": "identity", "gate_combination": "additive"},
    "additive SiLU": {"gate_type": "elementwise", "gate_activation": "silu", "gate_combination": "additive"},
    "NS-sigmoid": {"gate_type": "elementwise", "gate_activation": "ns_sigmoid"},
    "input-independent": {"gate_type": "elementwise", "gate_input": "none"},
    "SDPA SiLU": {"gate_type": "none", "attn_output_transform": "silu"},
    "SDPA RMSNorm": {"gate_type": "none", "attn_output_transform": "rmsnorm"},
}
# The paper's own figures for these rows: arXiv 2505.06708 Table 4 (the 15B MoE models), F-Attn (first-token
# attention) and M-Act (largest activation; the baseline's 1053 also in its Fig. 2). Cells the paper does not
# give for a row, or that are not copied here, are absent and show as "–".
PAPER_TABLE4 = {
    "baseline": {"first_token_attention": 0.467, "largest_activation": 1053},
    "G1 elementwise": {"first_token_attention": 0.048},
    "NS-sigmoid": {"first_token_attention": 0.451},
    "input-independent": {"first_token_attention": 0.364},
}
# cpu: the recorded table's setting (one layer, one head, width 64; docs/sinks.md). gpu: the reference run of
# arXiv 2410.13835 (width 256, batch 512, AdamW 3e-4, weight decay 1e-4, 10k steps) under bf16 autocast, one run
# at a time on the one GPU Trainer takes.
PRESETS = {
    "cpu": {"steps": 2000, "batch_size": 128, "lr": 5e-3, "jobs": 2, "options": {}},
    "gpu": {
        "steps": 10_000,
        "batch_size": 512,
        "lr": 3e-4,
        "jobs": 1,
        "options": {
            "weight_decay": 1e-4,
            "precision": "bf16",
            "architecture": {"hidden_size": 256, "head_dim": 256, "intermediate_size": 1024},
        },
    },
}
COLUMNS = (  # (key, heading, digits)
    ("first_token_attention", "first-token attention", 3),
    ("sinking_heads", "heads sinking", 2),
    ("loss", "loss", 3),
    ("copy_accuracy", "copy acc.", 3),
    ("bigram_accuracy", "bigram acc.", 3),
    ("largest_activation", "largest activation", 1),
    ("first_token_residual_ratio", "first-token residual norm / rest", 2),
    ("first_token_value_ratio", "first-token value norm / rest", 3),
    ("mean_gate", "mean gate", 3),
    ("gate_below_0.5", "gate < 0.5", 3),
)
PAPER_COLUMNS = {"first_token_attention": "paper F-Attn", "largest_activation": "paper M-Act"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", help="comma-separated arm names (default: every arm the installed config knows)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "sink")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "sink", help="finished runs, reused")
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu", help="cpu (default) or gpu: see PRESETS")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (cpu preset: 2000)")
    parser.add_argument("--batch-size", type=int, help="rows per step (cpu preset: 128)")
    parser.add_argument("--lr", type=float, help="peak learning rate, constant after warmup (cpu preset: 5e-3)")
    parser.add_argument("--curve-every", type=int, default=100, help="steps between first-token attention records")
    parser.add_argument("--jobs", type=int, help="runs side by side, one thread each (cpu preset: 2)")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    for name in ("steps", "batch_size", "lr", "jobs"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, not {args.seeds!r}")
    for name in ("steps", "batch_size", "curve_every", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def arm_problem(arm: str) -> str | None:
    """Why the installed Qwen3GatedConfig cannot build ``arm`` (a key or a value it does not know), else None."""
    import dataclasses

    from gated_qwen import Qwen3GatedConfig

    keys = ARMS[arm]
    known = {field.name for field in dataclasses.fields(Qwen3GatedConfig)}
    unknown = [key for key in keys if key not in known]
    if unknown:
        return f"arm {arm!r}: config key {', '.join(unknown)} is unknown to the installed Qwen3GatedConfig"
    try:
        Qwen3GatedConfig(**keys)
    except ValueError as error:
        return f"arm {arm!r}: the installed Qwen3GatedConfig refuses {keys} ({error})"
    return None


def select_arms(requested: str | None) -> tuple[list[str], list[str]]:
    """The arms to run and one line per arm left out; exits with one line for a named arm that cannot run."""
    if requested is None:
        problems = {arm: arm_problem(arm) for arm in ARMS}
        return [arm for arm in ARMS if not problems[arm]], [line for line in problems.values() if line]
    arms = [arm.strip() for arm in requested.split(",") if arm.strip()]
    for arm in arms:
        if arm not in ARMS:
            sys.exit(f"unknown arm {arm!r}; the arms are: {', '.join(ARMS)}")
        problem = arm_problem(arm)
        if problem:
            sys.exit(problem + "; leave it out of --arms, or install a gated-qwen that has it")
    return arms, []


def settings(args) -> dict:
    """The options of :func:`~gated_qwen.tools.sink_task.train_on_task` every run of this invocation takes."""
    return {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "curve_every": args.curve_every,
        **PRESETS[args.preset]["options"],
    }


def run_one(arm: str, seed: int, options: dict) -> dict:
    """One arm and seed, trained and measured in this process on one thread."""
    import torch

    from gated_qwen.tools.sink_task import BigramBackcopy, settled_step, train_on_task

    torch.set_num_threads(1)
    start = time.perf_counter()
    result = train_on_task(BigramBackcopy(), ARMS[arm], seed=seed, **options)
    curve = result["curve"]
    return {
        "arm": arm,
        "seed": seed,
        **result["final"],
        "parameters": result["parameters"],
        "settled_step": settled_step(curve["first_token_attention"], curve["steps"]),
        "curve": curve,
        "elapsed_s": round(time.perf_counter() - start, 1),
    }


def run_all(args, arms: list[str]) -> list[dict]:
    """Every (arm, seed): reused from ``--runs`` when finished with the same settings, else trained side by side."""
    options = settings(args)
    runs, pending = {}, []
    for arm in arms:
        for seed in args.seeds:
            path = args.runs / arm.replace(" ", "_") / f"seed{seed}.json"
            saved = json.loads(path.read_text()) if path.is_file() else None
            if saved and saved.get("settings") == options:
                runs[arm, seed] = saved["run"]
            else:
                pending.append((arm, seed, path))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = {pool.submit(run_one, arm, seed, options): (arm, seed, path) for arm, seed, path in pending}
        for future in concurrent.futures.as_completed(futures):
            arm, seed, path = futures[future]
            run = future.result()
            print(f"[sink] {arm} seed {seed}: first-token attention {run['first_token_attention']:.3f} "
                  f"({run['elapsed_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"settings": options, "run": run}) + "\n")
            runs[arm, seed] = run
    return [runs[arm, seed] for arm in arms for seed in args.seeds]


def mean_and_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(runs: list[dict], arms: list[str]) -> str:
    """The markdown table: per arm the mean ± sd over seeds of each column, the paper's figure beside its own."""
    headings = ["arm"]
    for key, heading, _ in COLUMNS:
        headings.append(heading)
        if key in PAPER_COLUMNS:
            headings.append(PAPER_COLUMNS[key])
    headings += ["uniform attention", "settled by step"]
    lines = ["| " + " | ".join(headings) + " |", "|---" * len(headings) + "|"]
    for arm in arms:
        rows = [run for run in runs if run["arm"] == arm]
        cells = [arm]
        for key, _, digits in COLUMNS:
            values = [run[key] for run in rows if run.get(key) is not None]
            cells.append("–" if not values else "{:.{d}f} ± {:.{d}f}".format(*mean_and_spread(values), d=digits))
            if key in PAPER_COLUMNS:
                paper = PAPER_TABLE4.get(arm, {}).get(key)
                cells.append("–" if paper is None else f"{paper:g}")
        cells.append(f"{statistics.fmean(run['uniform_attention'] for run in rows):.3f}")
        cells.append(str(max(run["settled_step"] for run in rows)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_table(runs: list[dict], arms: list[str], columns: int = 10) -> str:
    """First-token attention over training, the mean over seeds, at about ``columns`` evenly spaced records."""
    steps = runs[0]["curve"]["steps"]
    stride = max(1, (len(steps) - 1) // columns)
    picked = list(range(0, len(steps), stride))
    if picked[-1] != len(steps) - 1:
        picked.append(len(steps) - 1)
    lines = [
        "| arm | " + " | ".join(f"step {steps[i]}" for i in picked) + " |",
        "|---" * (len(picked) + 1) + "|",
    ]
    for arm in arms:
        curves = [run["curve"]["first_token_attention"] for run in runs if run["arm"] == arm]
        means = [statistics.fmean(curve[i] for curve in curves) for i in picked]
        lines.append(f"| {arm} | " + " | ".join(f"{value:.2f}" for value in means) + " |")
    return "\n".join(lines)


def plot_curves(runs: list[dict], arms: list[str], path: Path) -> None:
    """First-token attention over training, the mean over seeds, one line per arm; uniform attention dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for arm in arms:
        curves = [run["curve"] for run in runs if run["arm"] == arm]
        means = [statistics.fmean(values) for values in zip(*(c["first_token_attention"] for c in curves))]
        # 11 arms and 10 colours in matplotlib's cycle: the eleventh black; dotted: a transform without a gate
        color = plt.cm.tab10(arms.index(arm)) if arms.index(arm) < 10 else "black"
        style = ":" if ARMS[arm].get("gate_type") == "none" and arm != "baseline" else "-"
        axis.plot(curves[0]["steps"], means, label=arm, color=color, ls=style)
    axis.axhline(statistics.fmean(run["uniform_attention"] for run in runs), color="grey", ls="--", label="uniform")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("first-token attention (non-trigger queries)")
    axis.set_ylim(0, 1)
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None):
    args = parse_args(argv)
    arms, left_out = select_arms(args.arms)
    for line in left_out:
        print(f"[sink] skipping {line}", file=sys.stderr)
    if not arms:
        sys.exit("no arm to run")
    start = time.perf_counter()
    runs = run_all(args, arms)
    report = new_report(
        "sink",
        task={"vocab_size": 64, "num_triggers": 3, "seq_len": 16, "concentration": 0.1, "task_seed": 0},
        preset=args.preset,
        settings={"warmup_steps": 100, "weight_decay": 0.1, "schedule": "constant after warmup", **settings(args)},
        seeds=args.seeds,
        arms={arm: ARMS[arm] for arm in arms},
        left_out=left_out,
        paper_table4=PAPER_TABLE4,
        elapsed_s=round(time.perf_counter() - start, 1),
        run_time_s=round(sum(run["elapsed_s"] for run in runs), 1),
        runs=runs,
    )
    markdown = (
        table(runs, arms) + "\n\nFirst-token attention over training (mean over seeds):\n\n" + curve_table(runs, arms)
    )
    notes = [
        f"Each cell: mean ± sd over seeds {', '.join(map(str, args.seeds))}; {args.steps} steps of {args.batch_size} "
        f"rows of 16 tokens per run ({runs[0]['parameters']:,} parameters in {arms[0]}), AdamW at {args.lr} "
        f"(constant after 100 warmup steps), weight decay {report['settings']['weight_decay']:g}. First-token attention: the mean over the heads of the "
        "layer where it is largest of the attention that non-trigger queries put on BOS, on 512 probe rows; uniform "
        "attention gives the figure in the uniform column. Heads sinking: share of heads above 0.3. Settled by: the "
        "step from which each seed's curve stays within 0.05 of its last value (the latest seed). Paper columns: "
        "arXiv 2505.06708 Table 4 (15B MoE), where it has the row.",
    ]
    if left_out:
        notes.append("Left out (the installed Qwen3GatedConfig lacks them): " + "; ".join(left_out) + ".")
    notes.append(
        f"Time: {report['run_time_s'] / 60:.1f} min of training and measuring in all ({len(runs)} runs, each on one "
        f"thread, {args.jobs} side by side); this invocation took {report['elapsed_s'] / 60:.1f} min "
        "(runs finished before are reused from --runs)."
    )
    write_results(args.out, report, markdown + "\n\n" + "\n\n".join(notes) + "\n\n" + describe(report) + "\n")
    plot_curves(runs, arms, args.out / "first_token_attention.png")
    print(markdown)


if __name__ == "__main__":
    main()
