"""The exercise checker used at the end of every notebook.

``check_answer(name, answer, expected)`` says clearly whether an answer is right, and
treats an exercise left as ``...`` as "not attempted yet" rather than an error, so that
running a whole notebook never stops at an untouched exercise cell.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["check_answer"]


def _matches(answer: Any, expected: Any, tol: float) -> bool:
    """Numbers within ``tol``, strings without case or surrounding spaces, sequences element by element."""
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().lower() == expected.strip().lower()
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected or answer == expected
    if isinstance(expected, (int, float, np.integer, np.floating)):
        try:
            return math.isclose(float(answer), float(expected), rel_tol=tol, abs_tol=tol)
        except (TypeError, ValueError):
            return False
    # Tensors and arrays are compared as (nested) lists, so [0.75, 0, 0.25] matches a tensor.
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        expected = expected.tolist()
    if isinstance(answer, (torch.Tensor, np.ndarray)):
        answer = answer.tolist()
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(answer, (list, tuple))
            and len(answer) == len(expected)
            and all(_matches(a, e, tol) for a, e in zip(answer, expected))
        )
    return answer == expected


def check_answer(name: str, answer: Any, expected: Any, *, tol: float = 1e-6, hint: str = "") -> bool:
    """Check an exercise answer and say so clearly.

    ``answer`` left as ``...`` or ``None`` means "not attempted yet": a note is printed and
    ``False`` returned (so an untouched exercise cell never stops the notebook). A wrong
    answer raises ``AssertionError`` with ``hint``; a right one prints a confirmation.
    Numbers are compared with absolute/relative tolerance ``tol``, strings without case or
    surrounding spaces, sequences element by element.
    """
    if answer is None or answer is Ellipsis:
        print(f"{name}: not answered yet. Replace the ... with your answer and run the cell again.")
        return False
    if not _matches(answer, expected, tol):
        message = f"{name}: {answer!r} is not right."
        raise AssertionError(message + (f" Hint: {hint}" if hint else ""))
    print(f"{name}: correct!")
    return True
