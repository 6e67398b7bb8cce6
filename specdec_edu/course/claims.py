"""Keep a notebook's prose honest: record the numbers it talks about, check its claims against them.

A notebook's prose says things like "speculation is *slower* here" or "a step takes about 56 ms". Those words
sit next to an output that a re-run can change. So a code cell records the values the prose leans on::

    record(speedup=0.62, step_ms=56.1)        # invisible: stored in the cell's output, shown nowhere

and the markdown cell that makes the claim carries it as an HTML comment (invisible on GitHub and in Jupyter)::

    Speculation is *slower* here. <!-- check: speedup < 1 -->

``tests/claims_eval.py`` (used by ``tests/test_notebook_claims.py``) reads every committed notebook, collects
the recorded values and evaluates every ``check:`` expression against them. If a re-run flips a comparison, the
prose is flagged before it lands.
Expressions are tiny: names, numbers, arithmetic, comparisons (chains allowed), ``and``/``or``/``not``, and the
functions ``abs``, ``min``, ``max``, ``round``.
"""

from __future__ import annotations

import math

MIME = "application/vnd.specdec-edu.claims+json"


def record(**values: float) -> None:
    """Store named numbers in this cell's output for the prose checker; nothing is displayed.

    Values must be plain numbers (or bools); tensors and numpy scalars are converted with ``float``. A value that is
    not finite (or is ``None``) is an error, except with ``$SPECDEC_EDU_RANDOM_TARGET=1``: a target with random
    weights (a GPU check) can leave a rate with nothing to count (0 / 0), the prose's claims are about the real
    target and are not checked on such a run, and the notebook should go on to run the rest of its code. There such a
    value is left out.
    """
    from IPython.display import display  # imported here: the package works without IPython

    from ..models.embedded import random_target

    clean = {}
    for name, value in values.items():
        number = math.nan if value is None else float(value)  # None: e.g. "no n up to n_max has that power"
        if not math.isfinite(number):
            if random_target():
                continue
            raise ValueError(f"record({name}=...) got {value!r}; record only finite numbers")
        clean[name] = number
    display({MIME: clean}, raw=True)
