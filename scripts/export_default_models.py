"""Copy the two trained arms into gated_qwen/default_models/, measure them, and write their model cards.

For each arm (``runs/headwise``, ``runs/baseline`` from ``scripts/train_default_models.sh``) this writes
``gated_qwen/default_models/ARM/``: the weights in bfloat16 (half the size; the package ships both under
30 MB), config, tokenizer, generation config, ``eval.json`` and ``README.md`` (the model card). Every
number in them is measured here, on the shipped files as ``from_pretrained`` loads them (float32 compute):

* held-out loss and perplexity on every 256-token row of the held-out split, and on its first
  ``SLICE_ROWS`` rows (saved as ``heldout_slice.json``, which ``tests/test_training.py`` re-measures);
* a unigram model's perplexity on the same held-out tokens (train-split token counts, add-one smoothed);
* for a gated arm, sigmoid of the gate logits at every held-out token, head and layer: mean and the
  fraction below 0.5 (``gated_qwen.tools.analysis.record_gates``);
* the attention share on the first token of a row, over the first ``ATTENTION_ROWS`` held-out rows,
  queries after the first, all heads and layers (``gated_qwen.tools.analysis.record_attention``).

    python scripts/export_default_models.py [--runs runs] [--force]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from gated_qwen import Qwen3GatedForCausalLM
from gated_qwen.checkpoint.outputs import OutputFolder
from gated_qwen.default_models import DEFAULT_MODELS_DIR
from gated_qwen.tools.analysis.gates import record_gates, summarize_gates
from gated_qwen.tools.analysis.sinks import record_attention
from gated_qwen.tools.training import evaluate, heldout_rows, pack_documents, read_documents, unigram_perplexity


ARMS = ("headwise", "baseline")
SLICE_ROWS = 4
ATTENTION_ROWS = 16
SAMPLE_PROMPT = "def read_config(path):"


@torch.no_grad()
def gate_statistics(model, rows: torch.Tensor, batch_size: int = 16) -> dict | None:
    """Mean of sigmoid(gate logits) over held-out tokens, heads and layers, and the fraction below 0.5."""
    if model.config.gate_type == "none":
        return None
    with record_gates(model) as record:
        for start in range(0, len(rows), batch_size):
            model(input_ids=rows[start : start + batch_size])
    overall = summarize_gates(record)["overall"]
    return {"mean_gate": overall["mean"], "fraction_below_half": overall["below_0.5"], "values": overall["count"]}


@torch.no_grad()
def first_token_mass(model, rows: torch.Tensor, batch_size: int = 4) -> float:
    """Attention share on each row's first token, averaged over queries after the first, heads and layers."""
    with record_attention(model, skip_first=1) as record:
        for start in range(0, len(rows), batch_size):
            model(input_ids=rows[start : start + batch_size])
    return record.first_token().mean().item()


def export_arm(run: Path, target: Path) -> dict:
    # The shipped folder is replaced whole or not at all (gated_qwen.checkpoint.outputs, as every command writes).
    with OutputFolder(target, overwrite=True) as partial:
        return _write_arm(run, target, partial)


def _write_arm(run: Path, target: Path, partial: Path) -> dict:
    from transformers import AutoTokenizer

    model = Qwen3GatedForCausalLM.from_pretrained(run / "final", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    model.to(torch.bfloat16).save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.copy(run / "final" / "generation_config.json", partial / "generation_config.json")

    # Measure what ships: reload the written folder as a user would.
    shipped = Qwen3GatedForCausalLM.from_pretrained(partial, dtype=torch.float32).eval()
    args = json.loads((run / "train_args.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    train_stream = pack_documents(read_documents(args["train_file"]), tokenizer)
    heldout_stream = pack_documents(read_documents(args["heldout_file"]), tokenizer)
    rows = heldout_rows(heldout_stream, args["seq_len"])
    torch.manual_seed(0)
    sample_ids = tokenizer(SAMPLE_PROMPT, return_tensors="pt").input_ids
    sample = shipped.generate(sample_ids, do_sample=False, max_new_tokens=48)
    result = {
        "arm": target.name,
        "gate": shipped.config.gate_type,
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "training": {
            "steps": summary["steps"],
            "tokens": summary["tokens"],
            "wall_time_s": summary["elapsed_s"],
            "seed": args["seed"],
            "seq_len": args["seq_len"],
            "batch_size": args["batch_size"],
            "learning_rate": args["learning_rate"],
            "train_tokens_in_corpus": len(train_stream),
        },
        "heldout": {**evaluate(shipped, rows), "rows": len(rows)},
        "heldout_slice": {**evaluate(shipped, rows[:SLICE_ROWS]), "rows": SLICE_ROWS},
        "unigram": unigram_perplexity(train_stream, rows, len(tokenizer)),
        "gates": gate_statistics(shipped, rows),
        "first_token_attention": {"mass": first_token_mass(shipped, rows[:ATTENTION_ROWS]), "rows": ATTENTION_ROWS},
        "greedy_sample": {
            "prompt": SAMPLE_PROMPT,
            "completion": tokenizer.decode(sample[0, sample_ids.shape[1] :], skip_special_tokens=True),
        },
        "corpus": "scripts/prepare_corpus.py (CPython 3.11 standard library docstrings, PSF license)",
    }
    (partial / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    # the slice itself, so tests re-measure it without rebuilding the corpus
    (partial / "heldout_slice.json").write_text(json.dumps({"input_ids": rows[:SLICE_ROWS].tolist()}) + "\n")
    (partial / "README.md").write_text(model_card(result))
    return result


def model_card(r: dict) -> str:
    t, h, s, u, g = r["training"], r["heldout"], r["heldout_slice"], r["unigram"], r["gates"]
    gate_line = (
        f"| mean gate / fraction of gates < 0.5 (held-out, all layers and heads) | {g['mean_gate']:.3f} / {g['fraction_below_half']:.3f} |\n"
        if g
        else ""
    )
    return f"""# gated-qwen small {r["arm"]} ({r["gate"]} gate)

A {r["parameters"] / 1e6:.1f}M-parameter Qwen3Gated model trained from scratch with `gated-qwen train`, shipped
inside the package as {"the default of `gated-qwen generate`" if r["gate"] != "none" else "the matched no-gate arm of the default model"}.
It is a toy: it writes docstring-like Python text, nothing more.

- **Data**: the docstrings (with their `def`/`class` lines) of the CPython 3.11 standard library, built by
  `scripts/prepare_corpus.py` (PSF License; see `corpus/README.md`); {t["train_tokens_in_corpus"]:,} training tokens,
  one source file in 20 held out.
- **Architecture**: `configs/small_4M.json` (4 layers, hidden 256, 4 query / 2 kv heads, head_dim 64, vocabulary 4096,
  tied embeddings, QK-norm), gate `{r["gate"]}`.
- **Budget**: {t["tokens"]:,} tokens ({t["steps"]} steps of {t["batch_size"]} x {t["seq_len"]}), seed {t["seed"]},
  peak lr {t["learning_rate"]}, {t["wall_time_s"] / 60:.1f} min on 2 shared CPU threads. Its matched arm has the same
  data, order, seed, budget and size and differs only in the gate.
- **Weights**: stored in bfloat16; the numbers below are float32 compute on these weights.

| held-out (measured by `scripts/export_default_models.py`) | value |
|---|---|
| loss / perplexity, all {h["rows"]} rows ({h["tokens"]:,} predicted tokens) | {h["loss"]:.4f} / {h["ppl"]:.2f} |
| unigram model perplexity, same tokens | {u["ppl"]:.2f} |
| loss on the first {s["rows"]} rows (re-measured by tests/test_training.py) | {s["loss"]:.4f} |
{gate_line}| attention mass on the first token (first {r["first_token_attention"]["rows"]} rows, queries after the first) | {r["first_token_attention"]["mass"]:.3f} |

Greedy continuation of `{r["greedy_sample"]["prompt"]}`:

```
{r["greedy_sample"]["prompt"]}{r["greedy_sample"]["completion"]}
```

All numbers are in `eval.json`. Reproduce: `bash scripts/train_default_models.sh`, then
`python scripts/export_default_models.py --force`.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="folder holding headwise/ and baseline/")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--force", action="store_true", help="replace shipped models")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    for arm in args.arms:
        if not (args.runs / arm / "final" / "config.json").is_file():
            parser.error(f"{args.runs / arm}/final is missing; run scripts/train_default_models.sh first")
        if (DEFAULT_MODELS_DIR / arm).exists() and not args.force:
            parser.error(f"{DEFAULT_MODELS_DIR / arm} exists; pass --force to replace it")
    for arm in args.arms:
        result = export_arm(args.runs / arm, DEFAULT_MODELS_DIR / arm)
        print(json.dumps({k: v for k, v in result.items() if k != "greedy_sample"}, indent=2))
        print(SAMPLE_PROMPT + result["greedy_sample"]["completion"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
