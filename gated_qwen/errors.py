"""Errors the package reports to its users; the CLI prints them as one line, without a traceback."""


class GatedQwenError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""


class CheckpointError(GatedQwenError, ValueError):
    """A checkpoint (config or weights) that does not match what it claims or what was asked for."""


class WeightShapeMismatchError(CheckpointError, RuntimeError):
    """Weights whose shapes the config does not describe.

    Also a :class:`RuntimeError`, the error transformers' ``from_pretrained`` raises for mismatched sizes, so
    code written against transformers catches it the same way.

    >>> isinstance(WeightShapeMismatchError("vocab_size"), (CheckpointError, RuntimeError))
    True
    """
