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


def random_seed(text: str) -> int:
    """A whole number from 0 to 2**64 - 1 (what ``torch.Generator.manual_seed`` takes; larger overflows there, after the
    models have loaded)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{value} is not a seed, a whole number from 0 to 2**64 - 1")
    return value


def _finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0 (a scale: the suffix drafter's draft budget per matched token)."""
    value = _finite_number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not a number > 0")
    return value


def probability(text: str) -> float:
    """A finite number in [0, 1] (a probability threshold: the suffix drafter's min_prob)."""
    value = _finite_number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not a probability, a number in [0, 1]")
    return value
