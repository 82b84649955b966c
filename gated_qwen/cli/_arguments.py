"""Bounds on the commands' numeric options, checked in one place.

Not a subcommand (its name starts with ``_``, so the CLI does not register it); torch-free like every
``add_parser``.
"""

from __future__ import annotations

import argparse


def number(kind, low, high=None, low_open=False):
    """An argparse type: ``kind`` (int/float) within [low, high] (``low_open``: above low).

    >>> number(int, 1)("3")
    3
    >>> number(float, 0, 1, low_open=True)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 0 is out of range: it must be above 0 and at most 1
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < low or (low_open and value == low) or (high is not None and value > high):
            bound = f"{'above' if low_open else 'at least'} {low}" + (f" and at most {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {bound}")
        return value

    return parse


def check_at_least(args: argparse.Namespace, least: dict[str, int]) -> None:
    """Refuse an option below its least value (options left unset, None, pass), in one line.

    >>> check_at_least(argparse.Namespace(batch_size=0, stride=None), {"batch_size": 1, "stride": 1})
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: --batch-size must be at least 1, not 0
    """
    from ..errors import GatedQwenError

    for option, bound in least.items():
        value = getattr(args, option)
        if value is not None and value < bound:
            raise GatedQwenError(f"--{option.replace('_', '-')} must be at least {bound}, not {value}")
