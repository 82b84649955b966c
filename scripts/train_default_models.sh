#!/usr/bin/env bash
# Train the two shipped arms one after the other: same seed, data, order, token budget and architecture;
# they differ only in --gate (and the baseline reuses the headwise run's tokenizer, so both see the same tokens).
# Then `python scripts/export_default_models.py --force` measures them and writes gated_qwen/default_models/*/.
#   bash scripts/train_default_models.sh            # about 20 minutes per arm on 2 CPU threads
set -euo pipefail
PY=${PY:-python}
[ -f data/stdlib_docstrings/train.jsonl ] || "$PY" scripts/prepare_corpus.py
COMMON=(--train-file data/stdlib_docstrings/train.jsonl --heldout-file data/stdlib_docstrings/heldout.jsonl
        --config configs/small_4M.json --seq-len 256 --batch-size 16 --max-tokens 2000000 --lr 2e-3
        --warmup-steps 50 --eval-every 50 --eval-rows 64 --save-every 200 --seed 0 --threads 2 --no-progress)
"$PY" -m gated_qwen train "${COMMON[@]}" --gate headwise --vocab-size 4096 --out runs/headwise
"$PY" -m gated_qwen train "${COMMON[@]}" --gate none --tokenizer runs/headwise/tokenizer --out runs/baseline
