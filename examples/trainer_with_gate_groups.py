"""Continue-pretrain a stock Qwen3 with a gate added, in your own transformers Trainer script.

What ``gated-qwen train --init-from MODEL --gate headwise --gate-lr-scale X`` does, written out with the public
pieces, for those who train with their own Trainer (or TRL's SFTTrainer, which takes the same ``optimizers``):

1. convert the model on the fly (:func:`gated_qwen.convert_qwen3_to_gated`: zero gate rows, the same outputs);
2. :func:`gated_qwen.tools.training.gate_parameter_groups` gives the gate rows of q_proj a parameter of their
   own and returns AdamW groups, the gate rows at ``--gate-lr-scale`` times the rate;
3. the text through ``datasets``, tokenized and packed into rows of ``--seq-len`` (the usual ``group_texts``);
4. Trainer with that optimizer (its own scheduler, stepped once per optimizer step under any process count);
5. :func:`gated_qwen.tools.training.merge_gate_rows` before saving: a plain Qwen3Gated checkpoint.

One process or several, the same script::

    python examples/trainer_with_gate_groups.py --model Qwen/Qwen3-0.6B --train-file my.jsonl --out runs/mine
    torchrun --nproc_per_node 8 examples/trainer_with_gate_groups.py --model Qwen/Qwen3-0.6B --train-file my.jsonl \\
        --out runs/mine --bf16

(tests/tools/test_trainer_example.py runs it on a tiny stock Qwen3, on one process and on two.)
"""

from __future__ import annotations

import argparse
from itertools import chain

import torch
from datasets import load_dataset
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from gated_qwen import Qwen3GatedForCausalLM, convert_qwen3_to_gated
from gated_qwen.tools.training import gate_parameter_groups, merge_gate_rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a stock Qwen3 (folder or hub id)")
    parser.add_argument("--train-file", required=True, help="a .jsonl file with a text field")
    parser.add_argument("--out", required=True)
    parser.add_argument("--gate", default="headwise", choices=("headwise", "elementwise"))
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8, help="rows per process")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--gate-lr-scale", type=float, default=10.0)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--use-cpu", action="store_true", help="several processes on a machine without GPUs (gloo)")
    args = parser.parse_args(argv)

    training_args = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=min(100, args.max_steps // 10),
        logging_steps=1,
        save_strategy="no",
        bf16=args.bf16,
        report_to="none",
        seed=0,
        use_cpu=args.use_cpu,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = Qwen3GatedForCausalLM.from_pretrained(args.model, dtype=torch.float32)  # any Qwen3 loads, without a gate
    model = convert_qwen3_to_gated(model, gate=args.gate)  # identity init: the same outputs as the stock model
    groups = gate_parameter_groups(model, lr=args.lr, gate_lr_scale=args.gate_lr_scale, weight_decay=0.1)
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.95))

    def pack(batch: dict) -> dict:
        ids = tokenizer(batch["text"])["input_ids"]
        stream = list(chain.from_iterable(row + [tokenizer.eos_token_id] for row in ids))
        usable = len(stream) // args.seq_len * args.seq_len
        return {"input_ids": [stream[i : i + args.seq_len] for i in range(0, usable, args.seq_len)]}

    with training_args.main_process_first():
        text = load_dataset("json", data_files=args.train_file, split="train")
        rows = text.map(pack, batched=True, remove_columns=text.column_names)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=rows,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        optimizers=(optimizer, None),  # Trainer builds its scheduler on this optimizer: every group keeps its rate
    )
    trainer.train()
    merge_gate_rows(model)  # q_proj one plain weight again, as every checkpoint holds it
    trainer.save_model(f"{args.out}/final")


if __name__ == "__main__":
    main()
