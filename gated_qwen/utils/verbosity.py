"""A clean terminal: transformers' warnings and its "Loading weights" bar only when asked (``--verbose``).

The commands print their own results and one-line errors; transformers' log messages (generation-flag
notes in the middle of streamed text, load reports of weights that loaded as intended) and its progress
bars are kept out unless ``--verbose``. Download bars of huggingface_hub are left as they are: a download
of gigabytes should show its progress. Whatever is changed is restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers(verbose: bool = False) -> Iterator[None]:
    """Inside the block transformers logs errors only and draws no progress bar, unless ``verbose``.

    >>> from pathlib import Path
    >>> import gated_qwen
    >>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
    >>> with quiet_transformers():
    ...     model = gated_qwen.Qwen3GatedForCausalLM.from_pretrained(arm)
    >>> model.config.gate_type
    'headwise'
    """
    if verbose:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging

    level, bars, hub_bars_off = (
        logging.get_verbosity(),
        logging.is_progress_bar_enabled(),
        are_progress_bars_disabled(),
    )
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # also switches huggingface_hub's bars off: switched back on below
    if not hub_bars_off:
        enable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()
        (disable_progress_bars if hub_bars_off else enable_progress_bars)()


__all__ = ["quiet_transformers"]
