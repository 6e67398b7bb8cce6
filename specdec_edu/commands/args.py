"""Flag types the commands share: a bad value is refused by argparse, before any model loads, in one line that names
the flag (``error: argument --gamma: 0 is not a whole number >= 1``), not by a traceback after the warm-up."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A whole number >= 1 (γ, new tokens, repeats, prompts, threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number >= 1")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a sampling temperature: 0 would be greedy decoding, which is what leaving out --sample
    gives)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number > 0 (greedy decoding: leave out --sample)")
    return value
