"""``gated-qwen train``: train a Qwen3Gated (or Qwen3MoeGated) model on plain text, from scratch or continuing a
checkpoint (see :mod:`gated_qwen.tools.training`)."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    import argparse

    from ..tools.training_args import DEFAULT_VOCAB_SIZE, TRAINABLE, TrainingArguments
    from ..utils.names import CONVERSION_INITS, GATE_TYPES

    defaults = TrainingArguments(train_file="", output_dir="")
    parser = subparsers.add_parser(
        "train",
        help="train a gated (or baseline) model from scratch, or continue a Qwen3 / Qwen3Gated checkpoint, dense or MoE",
        description="Train a Qwen3Gated model from scratch (byte-level BPE tokenizer trained on the text; a --config "
        "whose model_type is qwen3_moe or qwen3_moe_gated gives a Qwen3MoeGated one), or continue a dense or "
        "Qwen3-MoE checkpoint with --init-from, converting a model without a gate with --gate. AdamW with warmup and cosine "
        "decay on transformers' Trainer, held-out loss every --eval-every steps, log.csv, loss.png, resumable checkpoints, "
        "the model in OUT/final. Data through Hugging Face datasets (Arrow cache, or --streaming), sharded across "
        "processes and packed into rows. Runs on CPU, one GPU, or several processes under `torchrun` (DDP; FSDP, DeepSpeed "
        "and `accelerate launch` on GPUs).",
    )
    data = parser.add_argument_group("data")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--train-file",
        help="training text: local .jsonl/.json/.parquet/.csv file(s) (comma-separated) "
        "with a text field, or .txt (one document per file)",
    )
    source.add_argument(
        "--dataset", help="training text: a Hugging Face data set (hub id or local folder) read with datasets"
    )
    data.add_argument("--dataset-config", help="the --dataset configuration (its name on the hub)")
    data.add_argument("--split", default=defaults.split, help="the --dataset split to train on (default %(default)s)")
    data.add_argument("--heldout-split", help="a --dataset split to evaluate on, instead of --heldout-file")
    data.add_argument(
        "--text-field", default=defaults.text_field, help="the field holding the text (default %(default)s)"
    )
    data.add_argument(
        "--streaming",
        action=argparse.BooleanOptionalAction,
        default=defaults.streaming,
        help="stream the data as it trains, its documents shuffled in a buffer (--shuffle-buffer): for data "
        "larger than the disk, or a hub data set not to download first. Default --no-streaming: datasets' Arrow "
        "cache (memory-mapped), each shard packed once into rows that every epoch permutes",
    )
    data.add_argument(
        "--data-shards",
        type=int,
        metavar="N",
        help="read the data as N shards, the global stream taking one row of each in turn and process r of W its rows "
        "r, r+W, ... (default: 1; streamed, one per process, N a multiple of W); runs with the same N see the same "
        "rows per step whatever their process count",
    )
    data.add_argument(
        "--shuffle-buffer",
        type=int,
        default=defaults.shuffle_buffer,
        help="--streaming: documents in each shard's shuffle buffer (default %(default)s)",
    )
    data.add_argument("--heldout-file", help="held-out text, same formats; evaluated every --eval-every steps")
    data.add_argument("--tokenizer", help="from scratch: a tokenizer folder to use instead of training one")
    data.add_argument(
        "--vocab-size", type=int, help=f"from scratch: BPE vocabulary to train (default {DEFAULT_VOCAB_SIZE})"
    )
    data.add_argument("--seq-len", type=int, default=defaults.seq_len, help="tokens per row (default %(default)s)")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--config",
        help="from scratch: a config.json for the architecture, e.g. configs/small_4M.json "
        "(model_type qwen3_moe or qwen3_moe_gated: a mixture of experts)",
    )
    model.add_argument(
        "--gate",
        choices=GATE_TYPES,
        help="from scratch: the gate (overrides the config); with --init-from: convert a checkpoint "
        "without a gate to this one",
    )
    model.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="continue this Qwen3, Qwen3Gated, Qwen3-MoE or Qwen3MoeGated checkpoint (folder or hub id) "
        "with its tokenizer, "
        "instead of training from scratch",
    )
    model.add_argument("--subfolder", default="", help="the --init-from checkpoint's subfolder (e.g. 1B_baseline)")
    model.add_argument("--revision", help="the --init-from checkpoint's hub revision")
    model.add_argument(
        "--init",
        choices=CONVERSION_INITS,
        help="how --gate converts the --init-from checkpoint: identity (zero gate rows, the same "
        "outputs; the default) or random",
    )
    model.add_argument(
        "--trainable",
        choices=TRAINABLE,
        default=defaults.trainable,
        help="all parameters, or only the gate rows of q_proj and their bias (default %(default)s)",
    )
    model.add_argument(
        "--gate-lr-scale",
        type=float,
        default=defaults.gate_lr_scale,
        metavar="X",
        help="learning rate of the gate rows: --lr times X (default %(default)s)",
    )
    optim = parser.add_argument_group("optimisation")
    optim.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        help="rows per step per process and accumulation step (default %(default)s)",
    )
    optim.add_argument(
        "--gradient-accumulation-steps",
        type=int,
        default=defaults.gradient_accumulation_steps,
        metavar="N",
        help="batches accumulated into one optimizer step (default %(default)s)",
    )
    budget = optim.add_mutually_exclusive_group(required=True)
    budget.add_argument("--max-steps", type=int, help="optimizer steps")
    budget.add_argument("--max-tokens", type=int, help="token budget (sets the steps)")
    optim.add_argument(
        "--lr", type=float, default=defaults.learning_rate, help="peak learning rate (default %(default)s)"
    )
    optim.add_argument(
        "--min-lr-rate", type=float, default=defaults.min_lr_rate, help="final lr / peak lr (default %(default)s)"
    )
    optim.add_argument(
        "--warmup-steps", type=int, default=defaults.warmup_steps, help="linear warmup (default %(default)s)"
    )
    optim.add_argument(
        "--weight-decay", type=float, default=defaults.weight_decay, help="AdamW weight decay (default %(default)s)"
    )
    optim.add_argument(
        "--max-grad-norm", type=float, default=defaults.max_grad_norm, help="gradient clipping (default %(default)s)"
    )
    optim.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default=defaults.precision,
        help="auto: bf16 autocast on a GPU that supports it, else fp32 (default %(default)s)",
    )
    optim.add_argument("--bf16", action="store_true", help="bf16 autocast (the same as --precision bf16)")
    optim.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in the backward pass"
    )
    optim.add_argument("--seed", type=int, default=defaults.seed, help="weights and data order (default %(default)s)")
    run = parser.add_argument_group("run")
    run.add_argument("--out", required=True, help="output folder")
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue from a checkpoint folder, or the latest one of an output folder, writing to --out (may be the same folder)",
    )
    run.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    run.add_argument(
        "--eval-every", type=int, default=defaults.eval_every, help="steps between evaluations (default %(default)s)"
    )
    run.add_argument(
        "--eval-rows", type=int, default=defaults.eval_rows, help="held-out rows per evaluation (default %(default)s)"
    )
    run.add_argument(
        "--save-every", type=int, default=defaults.save_every, help="steps between checkpoints; 0: at the end only"
    )
    run.add_argument("--threads", type=int, help="torch CPU threads")
    run.add_argument(
        "--fsdp",
        metavar="OPTIONS",
        help='transformers\' --fsdp, e.g. "full_shard auto_wrap" (needs GPUs: accelerate enables FSDP only there)',
    )
    run.add_argument("--fsdp-config", metavar="JSON", help="transformers' --fsdp_config: a JSON file or string")
    run.add_argument("--deepspeed", metavar="JSON", help="a DeepSpeed JSON config, as transformers' --deepspeed")
    run.add_argument(
        "--report-to",
        default=defaults.report_to,
        help="where Trainer also logs: none, all, tensorboard, wandb, ... (default %(default)s)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run_train)


def run_train(args) -> int:
    from ..tools.training import train
    from ..tools.training_args import TrainingArguments
    from ._arguments import check_at_least

    check_at_least(
        args,
        dict.fromkeys(
            (
                "vocab_size",
                "seq_len",
                "batch_size",
                "max_steps",
                "max_tokens",
                "eval_every",
                "eval_rows",
                "gradient_accumulation_steps",
                "data_shards",
                "shuffle_buffer",
            ),
            1,
        ),
    )
    training_args = TrainingArguments(
        train_file=args.train_file,
        output_dir=args.out,
        heldout_file=args.heldout_file,
        dataset=args.dataset,
        dataset_config=args.dataset_config,
        split=args.split,
        heldout_split=args.heldout_split,
        text_field=args.text_field,
        streaming=args.streaming,
        data_shards=args.data_shards,
        shuffle_buffer=args.shuffle_buffer,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        gradient_checkpointing=args.gradient_checkpointing,
        fsdp=args.fsdp,
        fsdp_config=args.fsdp_config,
        deepspeed=args.deepspeed,
        report_to=args.report_to,
        config=args.config,
        gate=args.gate,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        max_tokens=args.max_tokens,
        learning_rate=args.lr,
        min_lr_rate=args.min_lr_rate,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        precision="bf16" if args.bf16 else args.precision,
        eval_every=args.eval_every,
        eval_rows=args.eval_rows,
        save_every=args.save_every,
        seed=args.seed,
        threads=args.threads,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        init_from=args.init_from,
        init_from_subfolder=args.subfolder,
        init_from_revision=args.revision,
        gate_init=args.init,
        trainable=args.trainable,
        gate_lr_scale=args.gate_lr_scale,
    )
    summary = train(training_args, resume=args.resume)
    print(json.dumps(summary, indent=2))
    return 0
