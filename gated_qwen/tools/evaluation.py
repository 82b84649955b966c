"""Benchmarks with lm-evaluation-harness (the ``eval`` extra) on Qwen3Gated models, one arm or several.

The model is loaded here (``Qwen3GatedForCausalLM.from_pretrained``: released arms, converted or trained
checkpoints alike) and handed to the harness as an instance (``lm_eval.models.huggingface.HFLM``), so the
harness never has to resolve ``qwen3_gated`` itself and no code from a checkpoint runs. Tasks are the
harness's own (``mmlu``, ``hellaswag``, ``gsm8k``, ...) or YAML files in ``include_path``.

Example (not run as a test: it needs lm-eval and downloads a 1B model and the hellaswag data set from the hub):

>>> from gated_qwen.tools.generation import load_model_and_tokenizer  # doctest: +SKIP
>>> model, tokenizer = load_model_and_tokenizer(  # doctest: +SKIP
...     "QwQZh/gated_attention", subfolder="1B_gate_headwise"
... )
>>> results = evaluate(model, tokenizer, ["hellaswag"], limit=100)  # doctest: +SKIP
>>> results["results"]["hellaswag"]["acc_norm,none"]  # doctest: +SKIP
0.43
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import GatedQwenError


RESULTS_FILES = ("results.json", "results.md")


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as error:
        raise GatedQwenError(
            "evaluation needs lm-evaluation-harness: pip install 'gated-qwen[eval]' (or pip install lm-eval)"
        ) from error
    return lm_eval, HFLM, TaskManager


def _git_hash_quietly() -> str | None:
    """The harness's record of the working directory's git commit, without git's "fatal: not a git repository"."""
    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


@contextlib.contextmanager
def quiet_harness(verbose: bool = False) -> Iterator[None]:
    """The harness logs only errors inside the block (unless ``verbose``); what is changed is restored after.

    The harness also records the git commit of the working directory by running git, which prints a
    "fatal" line outside a repository; inside the block git's own stderr is dropped.
    """
    harness_logger = logging.getLogger("lm_eval")
    level = harness_logger.level
    if verbose:
        yield
        return
    import lm_eval.evaluator as harness_evaluator

    git_hash = harness_evaluator.get_git_commit_hash
    harness_logger.setLevel(logging.ERROR)
    harness_evaluator.get_git_commit_hash = _git_hash_quietly
    try:
        yield
    finally:
        harness_logger.setLevel(level)
        harness_evaluator.get_git_commit_hash = git_hash


def task_manager(include_path: str | Path | Sequence[str | Path] | None = None, tasks: Sequence[str] = ()):
    """The harness's TaskManager over its own tasks and the YAML files in ``include_path``; refuses unknown ``tasks``.

    >>> manager = task_manager("my_tasks/", ["my_task"])  # needs lm-eval and a task folder  # doctest: +SKIP
    """
    _, _, TaskManager = _import_lm_eval()
    folders = [Path(p) for p in _as_list(include_path)]
    missing = [str(folder) for folder in folders if not folder.is_dir()]
    if missing:
        raise GatedQwenError(f"--include-path {', '.join(missing)}: no such folder")
    with quiet_harness():
        # The harness's own task folders take tens of seconds to scan; tasks all found in include_path do without.
        manager = TaskManager(include_path=[str(f) for f in folders], include_defaults=False) if folders else None
        if manager is None or not tasks or any(task not in manager.all_tasks for task in tasks):
            manager = TaskManager(include_path=[str(folder) for folder in folders] or None)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        where = f" nor in {', '.join(map(str, folders))}" if folders else ""
        raise GatedQwenError(
            f"unknown task {', '.join(unknown)}: not one of lm-evaluation-harness's tasks{where} "
            "(lm-eval ls tasks lists them)"
        )
    return manager


def evaluate(
    model,
    tokenizer,
    tasks: Sequence[str],
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int = 1,
    include_path: str | Path | Sequence[str | Path] | None = None,
    log_samples: bool = False,
    bootstrap_iters: int = 100_000,
    verbose: bool = False,
    manager=None,
) -> dict:
    """lm-evaluation-harness's ``simple_evaluate`` on an already loaded model; returns the harness's result dict.

    ``tasks``: harness task or group names (or names defined by YAML files in ``include_path``);
    ``limit``: documents per task (for a quick look; the paper's numbers use every document);
    ``log_samples``: keep each document's model outputs under ``result["samples"]``; ``manager``: a
    :func:`task_manager` to reuse across models (it scans the harness's task folders when built).

    >>> evaluate(  # needs lm-eval, a model and a task folder  # doctest: +SKIP
    ...     model, tokenizer, ["my_task"], include_path="my_tasks/", log_samples=True
    ... )["samples"]
    """
    lm_eval, HFLM, _ = _import_lm_eval()
    if not tasks:
        raise GatedQwenError("no task given; name at least one, e.g. --tasks hellaswag")
    manager = manager if manager is not None else task_manager(include_path, tasks)
    with quiet_harness(verbose):
        harness_model = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        return lm_eval.simple_evaluate(
            model=harness_model,
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=manager,
            log_samples=log_samples,
            bootstrap_iters=bootstrap_iters,
        )


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, (str, Path)) else list(value)


def table_rows(results_by_arm: dict[str, dict]) -> list[dict]:
    """One row per task and metric, one value (and standard error) per arm, from harness result dicts.

    >>> table_rows({"a": {"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1}}, "n-shot": {"t": 0}}})
    [{'task': 't', 'metric': 'acc', 'filter': 'none', 'n-shot': 0, 'values': {'a': (0.5, 0.1)}}]
    """
    rows: dict[tuple, dict] = {}
    for arm, result in results_by_arm.items():
        for task, metrics in result.get("results", {}).items():
            for key, value in metrics.items():
                metric, comma, filter_name = key.partition(",")  # metric keys are "metric,filter"
                if not comma or "_stderr" in metric or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                stderr = metrics.get(f"{metric}_stderr,{filter_name}")
                row = rows.setdefault(
                    (task, metric, filter_name),
                    {
                        "task": task,
                        "metric": metric,
                        "filter": filter_name,
                        "n-shot": result.get("n-shot", {}).get(task),
                        "values": {},
                    },
                )
                row["values"][arm] = (value, stderr if isinstance(stderr, (int, float)) else None)
    return list(rows.values())


def format_table(results_by_arm: dict[str, dict]) -> str:
    """A markdown table: task, metric, n-shot, then one column per arm (value ± standard error).

    >>> print(format_table({"a": {"results": {"t": {"acc,none": 0.5, "acc_stderr,none": 0.1}}, "n-shot": {"t": 0}}}))
    | task | metric | n-shot | a |
    |---|---|---|---|
    | t | acc | 0 | 0.5000 ± 0.1000 |
    """
    arms = list(results_by_arm)
    lines = ["| task | metric | n-shot | " + " | ".join(arms) + " |", "|---" * (3 + len(arms)) + "|"]
    for row in table_rows(results_by_arm):
        cells = []
        for arm in arms:
            value, stderr = row["values"].get(arm, (None, None))
            if value is None:
                cells.append("-")
            elif stderr is None or not math.isfinite(stderr):
                cells.append(f"{value:.4f}")
            else:
                cells.append(f"{value:.4f} ± {stderr:.4f}")
        metric = row["metric"] + (f" ({row['filter']})" if row["filter"] not in ("", "none") else "")
        lines.append(
            f"| {row['task']} | {metric} | {row['n-shot'] if row['n-shot'] is not None else '-'} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def output_folder(folder: str | Path, overwrite: bool = False):
    """Where ``write_results`` puts ``results.json`` and ``results.md``: checked now, before any evaluation.

    The folder may hold other files; earlier results are replaced only with ``overwrite``
    (:class:`gated_qwen.checkpoint.outputs.OutputFolder`, the one mechanism every command writes through).

    >>> import tempfile
    >>> output = output_folder(Path(tempfile.mkdtemp()) / "eval_out")
    >>> output.destination.name
    'eval_out'
    """
    from ..checkpoint.outputs import OutputFolder

    return OutputFolder(
        folder,
        overwrite=overwrite,
        merge=True,
        names=RESULTS_FILES,
        advice="pass --overwrite or another --output-path",
    )


def write_results(output, report: dict, table: str) -> list[Path]:
    """Write ``results.json`` (every number the harness returned, per arm) and ``results.md`` into ``output``.

    ``output`` is an :func:`output_folder`: both files appear together, whole, or neither does.

    >>> write_results(output_folder("eval_out"), {"arms": {}}, "| task |")  # needs lm-eval  # doctest: +SKIP
    [PosixPath('eval_out/results.json'), PosixPath('eval_out/results.md')]
    """
    from lm_eval.utils import handle_non_serializable

    with output as staging:
        (staging / "results.json").write_text(
            json.dumps(report, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (staging / "results.md").write_text(table + "\n", encoding="utf-8")
    return [output.destination / name for name in RESULTS_FILES]


__all__ = [
    "output_folder",
    "task_manager",
    "evaluate",
    "format_table",
    "quiet_harness",
    "table_rows",
    "write_results",
]
