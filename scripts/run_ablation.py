"""The paper's comparison of gates (arXiv 2505.06708, section 3) in miniature: every row, matched in all but the gate.

Each arm is a ``gated-qwen train`` run from scratch on the standard-library docstring corpus
(``scripts/prepare_corpus.py``), with the architecture of ``configs/ablation_tiny.json``, the same tokenizer,
data order, learning-rate schedule and token budget; the arms differ only in the keys of their config: the gate
keys (``gate_type``, ``gate_position``, ``gate_shared_across_heads``, ``gate_activation``, ``gate_combination``,
``gate_input``), the ungated rows (``attn_output_transform``, ``sandwich_norm``), and the head counts or MLP width
of the parameter-matched baselines (:func:`parameter_matched_arms`). Every arm trains once per seed, and once
more at a high learning rate (seed 0) for its loss spikes. Then each model is measured on the held-out split:

- held-out loss: mean next-token loss over non-overlapping windows of the training length;
- parameters the arm adds; first-token attention (mean over layers and heads, queries after the first);
  largest activation (the largest |hidden state| of any layer's output); mean gate and share of gate scores
  below 0.5 (:mod:`gated_qwen.tools.analysis`);
- loss spikes at the high learning rate (``train``'s summary: a logged loss above 1.5x the median of the
  previous 50);
- perplexity at 2x and 4x the training length, beyond ``max_position_embeddings``, without and with YaRN
  (factor 2 and 4; :mod:`gated_qwen.tools.analysis.extrapolation`).

Writes ``results/ablation/results.{json,md}`` (every run's numbers, the table with the paper's figures beside
them, the machine, the versions and this command) and keeps the runs under ``--runs`` (a finished run is reused
when the script is run again). ``--reuse-recorded results/ablation/results.json`` takes a run's figures from an
earlier recording where everything that decides them is identical (:func:`reusable_runs`). ``--preset gpu`` runs
the same arms at about 100M parameters in bf16 under ``torchrun`` on the user's corpus (``PRESETS``;
docs/design-space.md gives its budget).

    python scripts/prepare_corpus.py && python scripts/run_ablation.py        # about an hour on 2 CPU threads
    python scripts/run_ablation.py --reuse-recorded results/ablation/results.json   # only what is not recorded
    python scripts/run_ablation.py --preset gpu --corpus DIR --nproc-per-node 8 --runs runs/ablation_gpu \\
        --results results/ablation_gpu
    python scripts/run_ablation.py --arms baseline "G1 elementwise" --seeds 0 --max-tokens 200000 \\
        --runs /tmp/ablation --results /tmp/ablation-results                     # a quick look
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import platform
import statistics
import subprocess
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import ROOT, describe, new_report, write_results  # noqa: E402


# The rows of the paper's comparison, as config keys (docs/design-space.md). G1..G5: the SDPA output, the value,
# key and query projections' outputs, o_proj's output.
GATE_ARMS = {
    "baseline": {"gate_type": "none"},
    "G1 elementwise": {"gate_type": "elementwise"},
    "G1 headwise": {"gate_type": "headwise"},
    "G2 elementwise": {"gate_type": "elementwise", "gate_position": "value"},
    "G2 headwise": {"gate_type": "headwise", "gate_position": "value"},
    "G3 elementwise": {"gate_type": "elementwise", "gate_position": "key"},
    "G4 elementwise": {"gate_type": "elementwise", "gate_position": "query"},
    "G5 elementwise": {"gate_type": "elementwise", "gate_position": "dense_output"},
    "G1 elementwise head-shared": {"gate_type": "elementwise", "gate_shared_across_heads": True},
    "G1 headwise head-shared": {"gate_type": "headwise", "gate_shared_across_heads": True},
    "G1 elementwise additive SiLU": {
        "gate_type": "elementwise",
        "gate_activation": "silu",
        "gate_combination": "additive",
    },
    "G1 elementwise multiplicative SiLU": {"gate_type": "elementwise", "gate_activation": "silu"},
    "G1 elementwise additive sigmoid": {"gate_type": "elementwise", "gate_combination": "additive"},
    # The mechanism rows of the paper's Tables 3 and 4 (the SDPA-output gate, elementwise, as there) and its Table 2
    # sandwich norm (no gate).
    "additive identity": {"gate_type": "elementwise", "gate_activation": "identity", "gate_combination": "additive"},
    "NS-sigmoid": {"gate_type": "elementwise", "gate_activation": "ns_sigmoid"},
    "input-independent": {"gate_type": "elementwise", "gate_input": "none"},
    "SDPA SiLU": {"gate_type": "none", "attn_output_transform": "silu"},
    "SDPA RMSNorm": {"gate_type": "none", "attn_output_transform": "rmsnorm"},
    "sandwich norm": {"gate_type": "none", "sandwich_norm": True},
}


def parameter_matched_arms(config: dict) -> dict[str, dict]:
    """The parameter-matched baselines for a base config (the paper's Table 1 rows 2-3 and Table 2): more kv heads,
    more query heads, each adding about the weights G1 elementwise adds, and G1 elementwise with the MLP narrowed
    to the baseline's parameter count.

    G1 elementwise adds hidden x (heads x head_dim) weights a layer; one more kv head adds k_proj and v_proj rows,
    2 x hidden x head_dim, and one more query head q_proj rows and o_proj columns, the same: about heads / 2 more
    of either, as the paper's 32 -> 48 query heads (kv heads 4 -> 8), among the counts the attention allows (the
    kv heads divide the query heads). Each unit of intermediate_size is 3 x hidden weights.

    >>> parameter_matched_arms({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...                         "head_dim": 16, "intermediate_size": 192})  # configs/ablation_tiny.json
    ... # doctest: +NORMALIZE_WHITESPACE
    {'kv heads': {'gate_type': 'none', 'num_key_value_heads': 4},
     'query heads': {'gate_type': 'none', 'num_attention_heads': 6},
     'FFN narrowed': {'gate_type': 'elementwise', 'intermediate_size': 171}}
    """
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    gate, head = hidden * heads * head_dim, 2 * hidden * head_dim
    kv_heads = min(
        (n for n in range(kv + 1, heads + 1) if heads % n == 0),
        key=lambda n: abs((n - kv) * head - gate),
        default=None,
    )
    query_heads = min(range(heads + kv, 2 * heads + kv + 1, kv), key=lambda n: abs((n - heads) * head - gate))
    arms = {} if kv_heads is None else {"kv heads": {"gate_type": "none", "num_key_value_heads": kv_heads}}
    return {
        **arms,
        "query heads": {"gate_type": "none", "num_attention_heads": query_heads},
        "FFN narrowed": {
            "gate_type": "elementwise",
            "intermediate_size": config["intermediate_size"] - round(gate / (3 * hidden)),
        },
    }


def arm_configs(config: dict) -> dict[str, dict]:
    """Every arm's config keys for a base config: the gate arms as they are, the parameter-matched ones sized to it."""
    return {**GATE_ARMS, **parameter_matched_arms(config)}


# At configs/ablation_tiny.json's shape G1 elementwise adds 64 x 64 = 4,096 weights a layer; two more kv heads
# (2 -> 4) or query heads (4 -> 6) add exactly that, and intermediate_size 192 -> 171 takes 4,032 off it.
ARMS = arm_configs(json.loads((ROOT / "configs" / "ablation_tiny.json").read_text()))
# The paper's figures (arXiv 2505.06708, the 15B MoE models) for each row, copied from its tables: the average
# perplexity of Table 1 (baseline 6.026) and Table 4, and the gain over the baseline computed from it (the
# baseline's average PPL minus the row's: positive is better). None shows as "–" and leaves the row out of the
# rank correlation: rows the paper does not have ("G1 headwise head-shared"; the additive sigmoid gate, this
# project's extra, the paper's additive gates use SiLU; "FFN narrowed", whose Table 2 is dense) and rows of its
# Tables 2 and 3 whose figures were not available to us when this was written ("additive identity", "SDPA SiLU",
# "SDPA RMSNorm" of Table 3, "sandwich norm" of Table 2): not guessed.
PAPER_BASELINE_PPL = 6.026  # Table 1, row 1 (Table 4's gains below are taken against the same baseline)
PAPER_PPL = {
    "kv heads": 5.979,  # Table 1: k = 8 (kv heads 4 -> 8)
    "query heads": 5.953,  # Table 1: q = 48 (query heads 32 -> 48)
    "G1 elementwise": 5.761,  # Table 1: SDPA, elementwise
    "G2 elementwise": 5.820,  # Table 1: v, elementwise
    "G3 elementwise": 6.016,  # Table 1: k, elementwise
    "G4 elementwise": 5.981,  # Table 1: q, elementwise
    "G5 elementwise": 6.017,  # Table 1: dense output
    "G1 headwise": 5.792,  # Table 1: SDPA, headwise
    "G2 headwise": 5.808,  # Table 1: v, headwise
    "G1 elementwise head-shared": 5.801,  # Table 1: SDPA, head-shared (elementwise)
    "G1 elementwise additive SiLU": 5.821,  # Table 1: SDPA, additive, SiLU
    "G1 elementwise multiplicative SiLU": 5.822,  # Table 1: SDPA, elementwise, SiLU
    "input-independent": 5.917,  # Table 4
    "NS-sigmoid": 5.900,  # Table 4
}
PAPER_PPL_GAIN: dict[str, float | None] = {
    arm: (round(PAPER_BASELINE_PPL - PAPER_PPL[arm], 3) if arm in PAPER_PPL else None)
    for arm in ARMS
    if arm != "baseline"
}
# Table 4's first-token attention (F-Attn) and mean gate score for its rows (the value gate is elementwise there).
PAPER_TABLE4 = {
    "baseline": {"first_token_attention": 0.467},
    "G1 elementwise": {"mean_gate": 0.116, "first_token_attention": 0.048},
    "G1 headwise": {"mean_gate": 0.172, "first_token_attention": 0.073},
    "G1 elementwise head-shared": {"mean_gate": 0.271, "first_token_attention": 0.301},
    "G2 elementwise": {"mean_gate": 0.221, "first_token_attention": 0.297},
    "input-independent": {"mean_gate": 0.335, "first_token_attention": 0.364},
    "NS-sigmoid": {"mean_gate": 0.653, "first_token_attention": 0.451},
}
CORPUS = ROOT / "data" / "stdlib_docstrings"
EXTRAPOLATION = (2, 4)  # perplexity at these multiples of the training length
SINK_ROWS = 16  # held-out windows for first-token attention, activations and gates
# cpu: the recorded table's setting (configs/ablation_tiny.json, 164k parameters, 2M tokens a run, about 40 s a run on
# 2 threads). gpu: a ~100M-parameter Qwen3-shaped model (configs/ablation_100m.json; 97.5M parameters with the
# 16,384-token vocabulary the preset's tokenizer is trained to) in bf16 autocast, rows of 1,024 tokens, 128 rows
# (131k tokens) a step, 500M tokens a run (about 3,800 steps), the high-lr run at 10x for 250M; docs/design-space.md
# gives the hours this takes. Rows are the global batch: each of --nproc-per-node processes takes
# rows / (processes x micro_batch) accumulation steps of micro_batch rows.
PRESETS = {
    "cpu": {
        "config": ROOT / "configs" / "ablation_tiny.json",
        "corpus": CORPUS,
        "seq_len": 128,  # the training length; ablation_tiny.json's max_position_embeddings
        "rows": 32,
        "micro_batch": 32,
        "max_tokens": 2_000_000,
        "lr": 3e-3,
        "high_lr": 3e-2,
        "high_lr_tokens": 1_000_000,
        "warmup_steps": 50,
        "vocab_size": 1024,
        "threads": 2,
        "precision": None,  # train's default, auto: fp32 on a CPU
    },
    "gpu": {
        "config": ROOT / "configs" / "ablation_100m.json",
        "corpus": None,  # --corpus: the standard-library docstrings (about 0.6M tokens) are far too few for 100M
        "seq_len": 1024,
        "rows": 128,
        "micro_batch": 32,
        "max_tokens": 500_000_000,
        "lr": 1e-3,
        "high_lr": 1e-2,
        "high_lr_tokens": 250_000_000,
        "warmup_steps": 500,
        "vocab_size": 16384,
        "threads": None,
        "precision": "bf16",
    },
}
PRESET_OPTIONS = {  # option: (type, help)
    "config": (Path, "the base model config the arms' keys are merged into"),
    "corpus": (Path, "a folder with train.jsonl and heldout.jsonl (as scripts/prepare_corpus.py writes them), or "
               "with train/ and heldout/ folders of .txt files (one document a file)"),
    "seq_len": (int, "training length in tokens"),
    "rows": (int, "rows per optimizer step, all processes together"),
    "micro_batch": (int, "rows per process and forward pass"),
    "max_tokens": (int, "training tokens per run"),
    "lr": (float, "peak learning rate"),
    "high_lr": (float, "the learning rate of the loss-spike runs"),
    "high_lr_tokens": (int, "training tokens of the loss-spike runs"),
    "warmup_steps": (int, "linear warmup steps"),
    "vocab_size": (int, "the byte-level BPE tokenizer's vocabulary, trained on the corpus"),
    "threads": (int, "torch CPU threads of each training process"),
}  # fmt: skip


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", metavar="ARMS", help="arm names, comma-separated (default: every arm)")
    parser.add_argument("--seeds", nargs="+", default=["0,1"], help="seeds, comma-separated (default 0,1)")
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu", help="cpu (default) or gpu: see PRESETS")
    for name, (kind, text) in PRESET_OPTIONS.items():
        defaults = ", ".join(f"{preset} {PRESETS[preset][name]}" for preset in PRESETS if PRESETS[preset][name])
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"{text} (preset: {defaults})")
    parser.add_argument(
        "--nproc-per-node", type=int, default=1, help="training processes per run, under torchrun (default 1)"
    )
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "ablation")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "ablation")
    parser.add_argument("--train-only", action="store_true", help="train the seed runs, measure nothing")
    parser.add_argument(
        "--reuse-recorded",
        type=Path,
        metavar="RESULTS_JSON",
        help="take a run's figures from this earlier results.json where everything that decides them is identical "
        "(arm config, base config, tokens, lr, batch, seed, Python, torch, transformers)",
    )
    args = parser.parse_args(argv)
    args.precision = PRESETS[args.preset]["precision"]
    for name in PRESET_OPTIONS:
        if getattr(args, name) is None:
            setattr(args, name, PRESETS[args.preset][name])
    if args.corpus is None:
        parser.error(f"--preset {args.preset} needs --corpus: a folder of training text (see --help)")
    if not args.config.is_file():
        parser.error(
            f"--config {args.config} does not exist; give a model config.json such as configs/ablation_100m.json"
        )
    args.arm_keys = arm_configs(json.loads(args.config.read_text()))
    for name in ("seq_len", "rows", "micro_batch", "max_tokens", "high_lr_tokens", "vocab_size", "nproc_per_node"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.rows % (args.micro_batch * args.nproc_per_node):
        parser.error(
            f"--rows {args.rows} is not a multiple of --micro-batch x --nproc-per-node "
            f"({args.micro_batch} x {args.nproc_per_node}); choose them so that it is"
        )
    try:
        args.arms = arm_names(args.arms)
    except ValueError as error:
        parser.error(str(error))
    try:
        args.seeds = [int(seed) for value in args.seeds for seed in value.split(",") if seed.strip()]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, not {' '.join(args.seeds)!r}")
    return args


def corpus_files(folder: Path) -> tuple[str, list[Path]]:
    """``--train-file``'s value for a corpus folder (comma-separated files) and its held-out files."""
    if (folder / "train.jsonl").is_file() and (folder / "heldout.jsonl").is_file():
        return str(folder / "train.jsonl"), [folder / "heldout.jsonl"]
    train, heldout = sorted((folder / "train").glob("*.txt")), sorted((folder / "heldout").glob("*.txt"))
    if train and heldout:
        return ",".join(map(str, train)), heldout
    sys.exit(
        f'no corpus in {folder}: give a folder with train.jsonl and heldout.jsonl (a {{"text": ...}} object a line, '
        "as scripts/prepare_corpus.py writes them), or with train/ and heldout/ folders of .txt files"
    )


def arm_names(values: list[str] | None) -> list[str]:
    """The arms named in ``--arms`` values, each a comma-separated list (as run_sink_ablation.py takes them); an
    arm's earlier name with a comma ("G1 elementwise, head-shared") names the same arm."""
    if not values:
        return list(ARMS)
    known = {arm.replace(",", "").replace(" ", ""): arm for arm in ARMS}
    pieces = [piece.strip() for piece in ",".join(values).split(",")]
    names, start = [], 0
    while start < len(pieces):  # the longest run of pieces that names an arm
        for end in range(len(pieces), start, -1):
            arm = known.get("".join(pieces[start:end]).replace(" ", ""))
            if arm:
                names.append(arm)
                start = end
                break
        else:
            raise ValueError(f"unknown arm {pieces[start]!r}; the arms are: {', '.join(ARMS)}")
    return names


def run_folder(runs: Path, arm: str, name: str) -> Path:
    return runs / arm.replace(",", "").replace(" ", "_") / name


def train(args, arm: str, name: str, seed: int, lr: float, max_tokens: int, tokenizer: Path | None) -> dict:
    """One ``gated-qwen train`` run (reused when finished), under ``torchrun`` when it has several processes; its
    summary.

    The arm's gate is its config (``--config`` plus the arm's keys), as a user writes one."""
    out = run_folder(args.runs, arm, name)
    if (out / "summary.json").exists() and (out / "final").is_dir():
        return json.loads((out / "summary.json").read_text())
    config = out.parent / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({**json.loads(args.config.read_text()), **args.arm_keys[arm]}, indent=2) + "\n")
    train_file, heldout_files = corpus_files(args.corpus)
    accumulation = args.rows // (args.micro_batch * args.nproc_per_node)
    launcher = [sys.executable, "-m", "gated_qwen"]
    if args.nproc_per_node > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={args.nproc_per_node}", "-m", "gated_qwen"]  # fmt: skip
    command = [
        *launcher, "train",
        "--train-file", train_file, "--heldout-file", ",".join(map(str, heldout_files)),
        "--config", str(config), "--gate", args.arm_keys[arm]["gate_type"],
        "--seq-len", str(args.seq_len), "--batch-size", str(args.micro_batch), "--max-tokens", str(max_tokens),
        "--lr", str(lr), "--warmup-steps", str(args.warmup_steps), "--eval-every", "1000000",
        "--save-every", "1000000", "--seed", str(seed), "--no-progress", "--overwrite", "--out", str(out),
    ]  # fmt: skip
    command += ["--threads", str(args.threads)] if args.threads else []
    command += ["--gradient-accumulation-steps", str(accumulation)] if accumulation > 1 else []
    command += ["--precision", args.precision] if args.precision else []
    command += ["--tokenizer", str(tokenizer)] if tokenizer else ["--vocab-size", str(args.vocab_size)]
    print(f"[ablation] {arm} {name}: training", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def heldout_stream(tokenizer, corpus: Path) -> torch.Tensor:  # noqa: F821
    """The held-out documents' tokens, each followed by the end-of-text token, in one stream."""
    import torch

    ids = []
    for path in corpus_files(corpus)[1]:
        text = path.read_text()
        if path.suffix == ".jsonl":
            documents = [json.loads(line)["text"] for line in text.splitlines() if line.strip()]
        else:
            documents = [text]
        for document in documents:
            ids += tokenizer(document)["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor(ids)


def measure(folder: Path, stream, seq_len: int) -> dict:
    """The columns of one trained model (its ``final/``), on the GPU where there is one (in float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gated_qwen.tools.analysis.extrapolation import apply_rope_scaling, perplexity_by_context_length
    from gated_qwen.tools.analysis.gates import gated_attention_layers, record_gates, summarize_gates
    from gated_qwen.tools.analysis.sinks import attention_sink, massive_activations

    def perplexities(model, lengths):
        return {r.length: r.perplexity for r in perplexity_by_context_length(model, stream, lengths, batch_size=8)}

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder).to(device).eval()
    plain = perplexities(model, [seq_len, *(seq_len * k for k in EXTRAPOLATION)])
    row = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_loss": math.log(plain[seq_len]),
        **{f"ppl_{k}x": plain[seq_len * k] for k in EXTRAPOLATION},
    }
    for k in EXTRAPOLATION:  # YaRN with the factor that stretches the training length to the measured one
        scaled = apply_rope_scaling(AutoModelForCausalLM.from_pretrained(folder).to(device).eval(), "yarn", float(k))
        row[f"ppl_{k}x_yarn"] = perplexities(scaled, [seq_len * k])[seq_len * k]
    windows = stream[: SINK_ROWS * seq_len].view(SINK_ROWS, seq_len).to(device)
    with torch.no_grad():
        row["first_token_attention"] = attention_sink(model, windows, skip_first=1).mean().item()
        row["largest_activation"] = max(layer["max_abs"] for layer in massive_activations(model, windows))
        if gated_attention_layers(model):
            with record_gates(model) as record:
                model(windows)
            overall = summarize_gates(record)["overall"]
            row["mean_gate"], row["gate_below_0.5"] = overall["mean"], overall["below_0.5"]
    return row


def mean_and_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(rows: dict[str, dict], seeds: list[int]) -> str:
    baseline = rows.get("baseline")
    lines = [
        f"| arm | held-out loss (mean ± sd, {len(seeds)} seeds) | vs baseline | paper PPL gain | parameters added | "
        "first-token attention | paper F-Attn | largest activation | mean gate | paper gate mean | gate < 0.5 | "
        "loss spikes at high lr | " + " | ".join(f"ppl {k}x | ppl {k}x YaRN" for k in EXTRAPOLATION) + " |",
        "|---" * (12 + 2 * len(EXTRAPOLATION)) + "|",
    ]

    def mean(arm, key):
        values = [seed_row[key] for seed_row in rows[arm]["seeds"].values() if key in seed_row]
        return statistics.fmean(values) if values else None

    def shown(value, digits=3):
        return "–" if value is None else f"{value:.{digits}f}"

    for arm, row in rows.items():
        loss, spread = mean_and_spread([seed_row["heldout_loss"] for seed_row in row["seeds"].values()])
        difference = "–" if baseline is None or arm == "baseline" else f"{loss - baseline['heldout_loss']:+.3f}"
        added = "–" if baseline is None else f"{int(mean(arm, 'parameters') - mean('baseline', 'parameters')):,}"
        row["heldout_loss"] = loss
        cells = [
            arm,
            f"{loss:.3f} ± {spread:.3f}",
            difference,
            shown(PAPER_PPL_GAIN.get(arm)),
            added,
            shown(mean(arm, "first_token_attention")),
            shown(PAPER_TABLE4.get(arm, {}).get("first_token_attention")),
            shown(mean(arm, "largest_activation"), 1),
            shown(mean(arm, "mean_gate")),
            shown(PAPER_TABLE4.get(arm, {}).get("mean_gate")),
            shown(mean(arm, "gate_below_0.5")),
            str(row.get("high_lr", {}).get("loss_spikes", "–")),
        ]
        for k in EXTRAPOLATION:
            cells += [shown(mean(arm, f"ppl_{k}x"), 1), shown(mean(arm, f"ppl_{k}x_yarn"), 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def limits_line(rows: dict[str, dict]) -> str:
    """What the table can and cannot show, from its own figures: how the arms' differences compare with the seeds'
    spread, and whether any arm develops the sink the paper's Table 4 measures."""
    arms = [arm for arm in rows if arm != "baseline"]
    losses = {arm: mean_and_spread([r["heldout_loss"] for r in row["seeds"].values()]) for arm, row in rows.items()}
    spreads = [spread for _, spread in losses.values()]
    differences = [abs(losses[arm][0] - losses["baseline"][0]) for arm in arms]
    attention = max(
        statistics.fmean(r["first_token_attention"] for r in row["seeds"].values()) for row in rows.values()
    )
    difference, spread = statistics.median(differences), statistics.median(spreads)
    settled = (
        "most rankings are not settled here" if difference < 2 * spread else "the seeds do not blur most rankings"
    )
    sink = (
        "no arm has an attention sink to remove"
        if attention < 0.3  # a sinking head's first-token attention, as arXiv 2410.10781 counts them
        else "an arm has an attention sink"
    )
    return (
        f"What this scale can and cannot show: the arms' held-out losses differ from the baseline's by a median "
        f"{difference:.3f}, against a median spread of {spread:.3f} between seeds, so {settled}; and {sink} "
        f"(first-token attention at most {attention:.3f} in any arm, where the paper's baseline has "
        f"{PAPER_TABLE4['baseline']['first_token_attention']}): the miniature in which the baseline does sink is "
        "scripts/run_sink_ablation.py (results/sink/)."
    )


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (ties share their mean rank)."""

    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
                end += 1
            for index in order[start : end + 1]:
                result[index] = (start + end) / 2
            start = end + 1
        return result

    return statistics.correlation(ranks(xs), ranks(ys))


def correlation_with_paper(rows: dict[str, dict]) -> tuple[float | None, str]:
    """The rank correlation between the miniature's gains (baseline's held-out loss minus the arm's) and the paper's
    (``PAPER_PPL_GAIN``) over the arms that have both, and the line that says it."""
    baseline = rows.get("baseline")
    arms = [arm for arm in rows if arm != "baseline" and PAPER_PPL_GAIN.get(arm) is not None]
    if baseline is None or len(arms) < 3:
        return None, (
            f"Rank correlation with the paper: not computed; it needs the baseline and the paper's figure for at least "
            f"3 arms, and {len(arms)} of these arms have one (PAPER_PPL_GAIN in scripts/run_ablation.py)."
        )
    ours = [baseline["heldout_loss"] - rows[arm]["heldout_loss"] for arm in arms]
    value = rank_correlation(ours, [PAPER_PPL_GAIN[arm] for arm in arms])
    return value, (
        f"Rank correlation (Spearman) between the miniature's gains over the baseline and the paper's, over "
        f"{len(arms)} arms: {value:+.2f}."
    )


@functools.cache  # asked for by the seed runs' and the high-lr runs' settings and by the report: a corpus is read once
def corpus_identity(corpus: Path) -> str:
    """What the corpus is, for :func:`run_settings`: the standard-library docstrings of this Python (they depend on
    nothing else: scripts/prepare_corpus.py), or the SHA-256 of the corpus files' contents."""
    if corpus.resolve() == CORPUS.resolve():
        return f"stdlib docstrings, Python {platform.python_version()}"
    train_file, heldout_files = corpus_files(corpus)
    digest = hashlib.sha256()
    for path in [*train_file.split(","), *heldout_files]:
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return "sha256 " + digest.hexdigest()


def run_settings(args, high_lr: bool = False) -> dict:
    """Everything besides the arm's keys and the seed that decides a run's figures here: the base config, the
    corpus, the schedule and batch, the processes, and the versions the arithmetic comes from. Not the threads: the
    baseline's seed 0 trained on 1 thread gave the figures of its 2-thread recording to the last digit (and every
    invocation that reuses and trains checks that again, :func:`check_reproduction`)."""
    from _results import package_versions

    versions = package_versions()
    return {
        "config": json.loads(args.config.read_text()),
        "corpus": corpus_identity(args.corpus),
        "seq_len": args.seq_len,
        "batch_size": args.rows,
        "micro_batch": args.micro_batch,
        "processes": args.nproc_per_node,
        "max_tokens": args.high_lr_tokens if high_lr else args.max_tokens,
        "lr": args.high_lr if high_lr else args.lr,
        "warmup_steps": args.warmup_steps,
        "vocab_size": args.vocab_size,
        "precision": args.precision,
        "python": platform.python_version(),
        "torch": versions["torch"],
        "transformers": versions["transformers"],
    }


def recorded_settings(recording: dict, high_lr: bool = False) -> dict:
    """:func:`run_settings` as a results.json records them; a recording from before a key existed ran with the
    cpu preset's value, the only one then (the standard-library corpus, 1 process, 50 warmup steps, ...)."""
    python = recording["machine"]["python"]
    return {
        "config": recording["config"],
        "corpus": recording.get("corpus", f"stdlib docstrings, Python {python}"),
        "seq_len": recording["seq_len"],
        "batch_size": recording["batch_size"],
        "micro_batch": recording.get("micro_batch", recording["batch_size"]),
        "processes": recording.get("processes", 1),
        "max_tokens": recording["high_lr_tokens" if high_lr else "max_tokens"],
        "lr": recording["high_lr" if high_lr else "lr"],
        "warmup_steps": recording.get("warmup_steps", 50),
        "vocab_size": recording.get("vocab_size", 1024),
        "precision": recording.get("precision"),
        "python": python,
        "torch": recording["versions"]["torch"],
        "transformers": recording["versions"]["transformers"],
    }


def reusable_runs(path: Path | None, args) -> dict:
    """The runs of an earlier results.json whose figures this invocation would measure again: ``{(arm, seed):
    seed row}`` and ``{(arm, "high_lr"): high-lr row}``, each only where the arm's config keys (matched by value,
    not by name) and :func:`run_settings` are identical to the recording's. Each row says where it comes from
    (``recorded``: the recording's date and commit, or the earlier one it was itself reused from)."""
    if path is None:
        return {}
    try:
        recording = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        sys.exit(f"--reuse-recorded {path}: cannot read it as a results.json ({error})")
    origin = {"utc": recording["machine"]["utc"], "git_commit": recording.get("git_commit")}
    reusable = {}
    for high_lr in (False, True):
        ours, theirs = run_settings(args, high_lr), recorded_settings(recording, high_lr)
        differences = [f"{key} {theirs[key]!r} there, {ours[key]!r} here" for key in ours if ours[key] != theirs[key]]
        if differences:
            kind = "high-lr runs" if high_lr else "seed runs"
            print(f"[ablation] not reusing {path}'s {kind}: {'; '.join(differences)}", file=sys.stderr, flush=True)
            continue
        for arm in args.arms_run:
            recorded = next((row for row in recording["arms"].values() if row["config"] == args.arm_keys[arm]), None)
            if recorded is None:
                continue
            if high_lr and "high_lr" in recorded:
                reusable[arm, "high_lr"] = {"recorded": origin, **recorded["high_lr"]}
            for seed in args.seeds if not high_lr else ():
                if str(seed) in recorded["seeds"]:
                    reusable[arm, seed] = {"recorded": origin, **recorded["seeds"][str(seed)]}
    return reusable


def check_reproduction(measured: dict, recorded: dict) -> dict:
    """The figures of a run measured again beside its recording's: every key they share, and whether each is equal
    to the last digit (the training time aside)."""
    keys = [key for key in measured if key in recorded and key not in ("elapsed_s", "recorded")]
    return {
        "identical": all(measured[key] == recorded[key] for key in keys),
        "figures": {key: {"recorded": recorded[key], "measured": measured[key]} for key in keys},
        "recorded": recorded["recorded"],
    }


def provenance_line(rows: dict[str, dict], seeds: list[int], check: dict | None) -> str:
    """Which rows come from which recording, and the reproduction check that allows it."""
    origins: dict[tuple, list[str]] = {}
    for arm, row in rows.items():
        for run in [*row["seeds"].values(), row["high_lr"]]:
            if "recorded" in run:
                key = (run["recorded"]["utc"], run["recorded"]["git_commit"] or "?")
                origins.setdefault(key, [])
                if arm not in origins[key]:
                    origins[key].append(arm)
    if not origins:
        return "Every run measured in this invocation."
    lines = [
        f"Reused from the recording of {utc} (commit {commit[:7]}), its figures unchanged because everything that "
        f"decides them is the same here (arm config, base config, token budget, learning rate, batch, seed, "
        f"Python, torch and transformers versions): {', '.join(arms)}."
        for (utc, commit), arms in origins.items()
    ]
    if check is not None:
        verdict = "identical in every figure" if check["identical"] else "NOT identical"
        lines.append(
            f"Check: baseline seed {seeds[0]} trained and measured again here is {verdict} to its recording of "
            f"{check['recorded']['utc']}."
        )
    return "\n\n".join(lines)


def train_all(args, arms: list[str], reusable: dict) -> tuple[dict, Path]:
    """Train every run that is not reused, and the baseline's first seed always: its tokenizer is every run's, and
    where runs are reused, its figures measured again are the check that the recording still reproduces (so a
    table regenerated from a recording alone still carries that check). The summaries, and the tokenizer
    folder."""
    first = ("baseline", args.seeds[0])
    keys = [(arm, seed) for arm in arms for seed in args.seeds] + [(arm, "high_lr") for arm in arms]
    pending = [key for key in keys if key not in reusable and not (args.train_only and key[1] == "high_lr")]
    tokenizer_folder = run_folder(args.runs, "baseline", f"seed{args.seeds[0]}") / "tokenizer"
    summaries = {}
    for arm, seed in [first, *[key for key in pending if key != first]]:
        tokenizer = tokenizer_folder if tokenizer_folder.is_dir() else None
        if seed == "high_lr":
            summaries[arm, seed] = train(args, arm, "high_lr", 0, args.high_lr, args.high_lr_tokens, tokenizer)
        else:
            summaries[arm, seed] = train(args, arm, f"seed{seed}", seed, args.lr, args.max_tokens, tokenizer)
    return summaries, tokenizer_folder


def measure_all(args, arms: list[str], reusable: dict, summaries: dict, tokenizer_folder: Path):
    """The rows of the table (reused or measured here) and the reproduction check of the baseline's first seed
    (None where it is not reused: measured here for the first time)."""
    from transformers import AutoTokenizer

    stream = heldout_stream(AutoTokenizer.from_pretrained(tokenizer_folder), args.corpus)
    rows: dict[str, dict] = {}
    check = None
    for arm in arms:
        rows[arm] = {"config": args.arm_keys[arm], "seeds": {}}
        for seed in args.seeds:
            if (arm, seed) in summaries:
                print(f"[ablation] {arm} seed {seed}: measuring", file=sys.stderr, flush=True)
                folder = run_folder(args.runs, arm, f"seed{seed}") / "final"
                measured = {
                    **measure(folder, stream, args.seq_len),
                    "elapsed_s": summaries[arm, seed].get("elapsed_s"),
                }
                if (arm, seed) in reusable:  # the baseline's first seed, trained for its tokenizer
                    check = check_reproduction(measured, reusable[arm, seed])
                    measured = reusable[arm, seed]
                rows[arm]["seeds"][seed] = measured
            else:
                rows[arm]["seeds"][seed] = reusable[arm, seed]
        if (arm, "high_lr") in reusable:
            rows[arm]["high_lr"] = reusable[arm, "high_lr"]
            continue
        high = summaries[arm, "high_lr"]
        rows[arm]["high_lr"] = {
            "lr": args.high_lr,
            "loss_spikes": high.get("loss_spikes"),
            "loss_spike_steps": high.get("loss_spike_steps"),
            "final_train_loss": high.get("final_train_loss"),
        }
    return rows, check


def main():
    args = parse_args()
    if args.corpus.resolve() == CORPUS.resolve() and not (CORPUS / "train.jsonl").exists():
        sys.exit("no corpus: run `python scripts/prepare_corpus.py` first (it writes data/stdlib_docstrings/)")
    corpus_files(args.corpus)  # a corpus it cannot read is refused before anything runs
    import gated_qwen  # noqa: F401  (the Auto classes)

    arms = ["baseline", *[arm for arm in args.arms if arm != "baseline"]]  # the baseline first: its tokenizer
    args.arms_run = arms
    reusable = reusable_runs(args.reuse_recorded, args)
    summaries, tokenizer_folder = train_all(args, arms, reusable)
    if args.train_only:
        return
    rows, check = measure_all(args, arms, reusable, summaries, tokenizer_folder)
    if check is not None and not check["identical"]:
        differing = {key: pair for key, pair in check["figures"].items() if pair["recorded"] != pair["measured"]}
        sys.exit(
            f"baseline seed {args.seeds[0]} trained again does not reproduce its recording ({differing}): its "
            "figures cannot be reused; run without --reuse-recorded"
        )
    markdown = table(rows, args.seeds)
    correlation, correlation_line = correlation_with_paper(rows)
    markdown += "\n\n" + correlation_line
    report = new_report(
        "ablation",
        preset=args.preset,
        config=json.loads(args.config.read_text()),
        corpus=corpus_identity(args.corpus),
        seq_len=args.seq_len,
        batch_size=args.rows,
        micro_batch=args.micro_batch,
        processes=args.nproc_per_node,
        warmup_steps=args.warmup_steps,
        vocab_size=args.vocab_size,
        precision=args.precision,
        max_tokens=args.max_tokens,
        lr=args.lr,
        high_lr=args.high_lr,
        high_lr_tokens=args.high_lr_tokens,
        threads=args.threads,
        seeds=args.seeds,
        arms=rows,
        paper_ppl=PAPER_PPL,
        paper_baseline_ppl=PAPER_BASELINE_PPL,
        paper_ppl_gain=PAPER_PPL_GAIN,
        paper_table4=PAPER_TABLE4,
        rank_correlation_with_paper=correlation,
        reproduction_check=check,
    )
    scale = (
        f"Scale: {rows['baseline']['seeds'][args.seeds[0]]['parameters']:,} parameters (baseline), "
        f"{args.max_tokens:,} training tokens per run, rows of {args.seq_len} tokens, {len(args.seeds)} seeds; "
        f"loss spikes from one run per arm at learning rate {args.high_lr} ({args.high_lr_tokens:,} tokens)."
    )
    provenance = provenance_line(rows, args.seeds, check)
    limits = limits_line(rows)
    write_results(args.results, report, "\n\n".join([markdown, scale, limits, provenance, describe(report)]) + "\n")
    print(markdown)


if __name__ == "__main__":
    main()
