"""``gated-qwen eval``: lm-evaluation-harness benchmarks on one or more arms (see :mod:`gated_qwen.tools.evaluation`)."""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    from ._arguments import add_device_and_dtype, add_model_source, number

    parser = subparsers.add_parser(
        "eval",
        help="run lm-evaluation-harness benchmarks on one or more models",
        description="Evaluate a Qwen3 or Qwen3Gated checkpoint (released arm, converted, trained) on "
        "lm-evaluation-harness tasks, the model loaded by gated-qwen and handed to the harness. --compare "
        "puts several models in one table. Needs the eval extra: pip install 'gated-qwen[eval]'.",
    )
    parser.add_argument("model", metavar="MODEL", help="a checkpoint folder or a hub id")
    parser.add_argument("--compare", nargs="+", default=[], metavar="MODEL", help="more models for the same table")
    add_model_source(parser, several=True)
    parser.add_argument(
        "--tasks", required=True, metavar="T1,T2", help="comma-separated harness tasks, e.g. mmlu,hellaswag,gsm8k"
    )
    parser.add_argument(
        "--include-path", action="append", default=[], metavar="DIR", help="a folder of task YAML files (repeatable)"
    )
    parser.add_argument(
        "--num-fewshot", type=number(int, 0), metavar="K", help="few-shot examples (default: each task's own)"
    )
    parser.add_argument(
        "--limit",
        type=number(float, 0, low_open=True),
        metavar="N",
        help="documents per task (N >= 1), or a share of them (0 < N < 1); default: all",
    )
    parser.add_argument(
        "--batch-size", type=number(int, 1), default=1, metavar="N", help="requests per forward (default 1)"
    )
    add_device_and_dtype(parser)
    parser.add_argument(
        "--output-path", metavar="DIR", help="write results.json (every number) and results.md (the table) here"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace results already in --output-path")
    parser.add_argument(
        "--log-samples", action="store_true", help="keep each document's model outputs in results.json"
    )
    parser.add_argument("--verbose", action="store_true", help="show the harness's and transformers' log messages")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..errors import GatedQwenError
    from ..tools.evaluation import evaluate, format_table, output_folder, task_manager, write_results
    from ..tools.generation import check_tokenizer_files, load_model_and_tokenizer, local_checkpoint_folder
    from ..utils.names import model_label
    from ..utils.verbosity import quiet_transformers
    from ._arguments import subfolders_per_model

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    if not tasks:
        raise GatedQwenError("--tasks names no task; give e.g. --tasks hellaswag,mmlu")
    models = [args.model, *args.compare]
    subfolders = subfolders_per_model(args.subfolder, models)
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    output = output_folder(args.output_path, args.overwrite) if args.output_path else None
    # Everything that can be checked is checked before the first model loads: tasks, then every source.
    manager = task_manager(args.include_path, tasks)
    for model_name, subfolder in zip(models, subfolders):
        local_checkpoint_folder(model_name, subfolder, args.revision)
        check_tokenizer_files(model_name, subfolder, args.revision)

    results, taken = {}, set()
    for model_name, subfolder in zip(models, subfolders):
        label = model_label(model_name, subfolder, taken)
        print(f"gated-qwen eval: {label} ({model_name}{' / ' + subfolder if subfolder else ''})", file=sys.stderr)
        with quiet_transformers(args.verbose):
            model, tokenizer = load_model_and_tokenizer(
                model_name, subfolder=subfolder, revision=args.revision, device=args.device, dtype=args.dtype
            )
            results[label] = evaluate(
                model,
                tokenizer,
                tasks,
                num_fewshot=args.num_fewshot,
                limit=limit,
                batch_size=args.batch_size,
                log_samples=args.log_samples,
                verbose=args.verbose,
                manager=manager,
            )
        results[label]["source"] = {"model": model_name, "subfolder": subfolder, "revision": args.revision}
        del model

    table = format_table(results)
    print(table)
    if output is not None:
        arguments = {key: value for key, value in vars(args).items() if key != "run"}
        written = write_results(output, {"arguments": arguments, "arms": results}, table)
        print(f"gated-qwen eval: wrote {', '.join(str(path) for path in written)}", file=sys.stderr)
    return 0
