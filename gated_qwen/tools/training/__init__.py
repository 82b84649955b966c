"""Train a Qwen3Gated (or Qwen3MoeGated) model on plain text, on transformers' Trainer: from scratch, or continuing
a Qwen3 / Qwen3Gated / Qwen3-MoE / Qwen3MoeGated checkpoint (converted on the fly), on one process or several.

The pieces, each usable alone:

* :mod:`.groups`: :func:`gate_parameter_groups` gives the gate rows of q_proj a parameter of their own
  and returns parameter groups any optimizer accepts (the gate rows at their own learning rate, or alone);
* :mod:`.data`: text through Hugging Face ``datasets`` (local files or any data set, streamed or not),
  sharded across processes, tokenized and packed on the fly into fixed-length rows (:class:`PackedRows`);
* :mod:`.model_init`: the model to start from, new from a config or a checkpoint converted to a gate;
* :mod:`.checkpoints`: Trainer's checkpoints, checked before a resume, and the rules of resuming
  (:func:`load_experts_as_saved`: an MoE's experts resumed from the layout they are saved in);
* :mod:`.reporting`: held-out loss, the unigram floor, ``log.csv`` and ``loss.png``;
* :mod:`.trainer`: :func:`train`, the ``gated-qwen train`` command's run.

Two runs with the same seed, data, data shards, global batch and architecture see the same rows in the
same order, with weights initialised from the same seed, so arms that differ only in ``gate`` are a matched
comparison, whatever the number of processes each ran on.

>>> import json, tempfile
>>> from pathlib import Path
>>> from gated_qwen.default_models import default_model_path
>>> from gated_qwen.tools.training import TrainRunArguments, train
>>> folder = tempfile.TemporaryDirectory()
>>> corpus = Path(folder.name) / "train.jsonl"
>>> _ = corpus.write_text("".join(json.dumps({"text": f"print({i} * {i})"}) + "\\n" for i in range(40)))
>>> args = TrainRunArguments(train_file=str(corpus), output_dir=f"{folder.name}/run", max_steps=1, seq_len=16,
...                          batch_size=2, init_from=str(default_model_path("baseline")), gate="headwise",
...                          warmup_steps=1, progress=False)  # one step, converting the baseline to a headwise gate
>>> summary = train(args)
>>> summary["steps"], summary["gate"], summary["init_from"] == args.init_from
(1, 'headwise', True)
>>> folder.cleanup()
"""

from __future__ import annotations

from importlib import import_module


# public name -> the module that defines it, imported on first access (PEP 562): the torch-free .arguments
# (``gated-qwen train --help``) imports this package without importing torch
_LAZY = {
    "EOS_TOKEN": "data",
    "GatedTrainer": "trainer",
    "LOG_FIELDS": "reporting",
    "PAD_TOKEN": "data",
    "PackedRows": "data",
    "QueryAndGateRows": "groups",
    "TrainRunArguments": "arguments",
    "TrainingError": "arguments",
    "build_config": "model_init",
    "check_arguments": "model_init",
    "check_model_options": "model_init",
    "evaluate": "reporting",
    "gate_parameter_groups": "groups",
    "heldout_rows": "data",
    "latest_checkpoint": "checkpoints",
    "load_documents": "data",
    "load_experts_as_saved": "checkpoints",
    "load_initial_model": "model_init",
    "merge_gate_rows": "groups",
    "pack_documents": "data",
    "parameter_groups": "groups",
    "plot_losses": "reporting",
    "read_checkpoint": "checkpoints",
    "read_documents": "data",
    "read_heldout_rows": "data",
    "read_init_config": "model_init",
    "separate_gate_rows": "groups",
    "train": "trainer",
    "trainer_for_rows": "trainer",
    "train_tokenizer": "data",
    "unigram_perplexity": "reporting",
}


__all__ = [
    "EOS_TOKEN",
    "LOG_FIELDS",
    "PAD_TOKEN",
    "GatedTrainer",
    "PackedRows",
    "QueryAndGateRows",
    "TrainRunArguments",
    "TrainingError",
    "build_config",
    "check_arguments",
    "check_model_options",
    "evaluate",
    "gate_parameter_groups",
    "heldout_rows",
    "latest_checkpoint",
    "load_experts_as_saved",
    "load_documents",
    "load_initial_model",
    "merge_gate_rows",
    "pack_documents",
    "parameter_groups",
    "plot_losses",
    "read_checkpoint",
    "read_documents",
    "read_heldout_rows",
    "read_init_config",
    "separate_gate_rows",
    "train",
    "train_tokenizer",
    "trainer_for_rows",
    "unigram_perplexity",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
