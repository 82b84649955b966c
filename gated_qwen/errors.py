"""Errors the package reports to its users; the CLI prints them as one line, without a traceback."""


class GatedQwenError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""


class CheckpointError(GatedQwenError, ValueError):
    """A checkpoint (config or weights) that does not match what it claims or what was asked for."""
