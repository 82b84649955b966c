"""One measured step of a benchmark, alone in a fresh Python process.

``python -m gated_qwen.tools.benchmark.child STEP SRC DST [OPTIONS]`` runs STEP once (OPTIONS: a JSON object of
the step's keyword arguments) and prints one JSON object:
``seconds`` (the step alone), ``peak_rss`` (the process's peak resident memory, imports included),
``import_peak_rss`` (the peak before the step: Python, torch and transformers) and what the step adds.
A step runs in a process of its own so that its peak memory is its own: the kernel keeps ``ru_maxrss``
across fork and exec, so the parent could not measure a child that stayed far smaller than itself.

Every step imports the same modules before its clock starts, even the plain copy, so that all steps
start the same few seconds after the previous run's files were deleted. (On a virtual machine that
hands freed memory back to its host, that delay decides whether new page-cache pages are still backed
or must be faulted in again: 0.13 s against 0.9 s for the same 433 MB copy.)

>>> sorted(STEPS)
['convert', 'copy', 'import-only', 'load', 'resave']
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM on Linux, ru_maxrss elsewhere).

    >>> peak_rss() > 0
    True
    """
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except OSError:  # not Linux: ru_maxrss, in bytes on macOS
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _copy(src: str, dst: str) -> dict:
    shutil.copytree(src, dst)
    return {}


def _convert(src: str, dst: str, **conversion) -> dict:
    from gated_qwen.transforms.conversion import convert_checkpoint

    conversion = {"gate": "headwise", **conversion}  # the gate, init and design-space keys
    return {"bytes": convert_checkpoint(src, dst, progress=False, **conversion).total_size}


def _resave(src: str, dst: str) -> dict:
    from gated_qwen.transforms.conversion import convert_checkpoint

    return {"bytes": convert_checkpoint(src, dst, gate="keep", progress=False).total_size}


def _load(src: str, dst: str) -> dict:
    # Up to a first forward of 8 tokens, which reads every weight (a tied lm_head reads the whole
    # embedding): weights that are only memory-mapped would otherwise not count as resident.
    import torch

    from gated_qwen import Qwen3GatedForCausalLM

    model = Qwen3GatedForCausalLM.from_pretrained(src, dtype="auto")
    with torch.no_grad():
        model(torch.arange(8)[None])
    return {}


STEPS = {
    "import-only": lambda src, dst: {},  # the floor of every other step
    "copy": _copy,  # shutil.copytree SRC DST
    "convert": _convert,  # convert_checkpoint(SRC, DST, gate="headwise", **OPTIONS)
    "resave": _resave,  # convert_checkpoint(SRC, DST, gate="keep")
    "load": _load,  # from_pretrained(SRC) + one forward
}


def run_step(step: str, src: str, dst: str = "", options: dict | None = None) -> dict:
    """Run ``step`` in a fresh Python process and return what it printed; ``options`` are the step's keyword
    arguments (``convert``: ``{"gate": "elementwise", "gate_position": "value"}``), passed as JSON.

    >>> run_step("import-only", ".")["seconds"] < 1.0
    True
    """
    from ...errors import GatedQwenError

    command = [sys.executable, "-m", __name__, step, src, dst, json.dumps(options or {})]
    process = subprocess.run(command, capture_output=True, text=True)
    if process.returncode:
        message = process.stderr.strip().splitlines()[-1:] or ["no message"]
        raise GatedQwenError(
            f"benchmark step {step!r} failed in its child process (exit {process.returncode}): {message[0]}"
        )
    return json.loads(process.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    step, src, dst, *options = argv
    options = json.loads(options[0]) if options else {}
    import torch  # noqa: F401  (every step pays the same imports before its clock starts)

    import gated_qwen.transforms.conversion  # noqa: F401

    import_peak_rss = peak_rss()
    start = time.perf_counter()
    extra = STEPS[step](src, dst, **options)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss": peak_rss(), "import_peak_rss": import_peak_rss, **extra}))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["STEPS", "peak_rss", "run_step"]
