"""Every notebook with quick settings gets them one way and says so (JSON only, no kernel).

Under pytest the notebooks run with ``SPECDEC_EDU_QUICK=1`` (``tests/conftest.py``): the same cells on fewer samples,
repeats or tokens. Two things keep that honest. A notebook reads the setting through
``specdec_edu.course.experiments.quick_run`` (one parser, which refuses a value it would have to guess), never from
``os.environ`` itself. And its markdown tells the reader that the test suite runs it on quick settings, so that
nobody takes a quick run's numbers for the committed ones.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def sources(nb: dict, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def quick_problems(nb: dict) -> list[str]:
    """What is wrong with how ``nb`` (a loaded .ipynb) gets and explains its quick settings; empty if nothing."""
    code, prose = "\n".join(sources(nb, "code")), "\n".join(sources(nb, "markdown"))
    problems = []
    if "SPECDEC_EDU_QUICK" in code:
        problems.append("reads SPECDEC_EDU_QUICK itself: use QUICK = quick_run() (specdec_edu.course.experiments)")
    uses = re.search(r"\bQUICK\b", code) is not None
    if uses and not re.search(r"^QUICK = quick_run\(\)", code, re.MULTILINE):
        problems.append("uses QUICK without QUICK = quick_run() in its setup cell")
    if uses and "SPECDEC_EDU_QUICK=1" not in prose:
        problems.append("has quick settings but no markdown says that the test suite runs it with SPECDEC_EDU_QUICK=1")
    return problems


def fake(code: str, prose: str = "") -> dict:
    return {"cells": [{"cell_type": "markdown", "source": [prose]}, {"cell_type": "code", "source": [code]}]}


def test_the_checker_can_fail():
    """Negative controls: the patterns the course used before quick_run, and settings nobody is told about."""
    told = "The test suite runs this notebook with `SPECDEC_EDU_QUICK=1`."
    assert quick_problems(fake('QUICK = os.environ.get("SPECDEC_EDU_QUICK") == "1"\nN = 8 if QUICK else 32', told))
    assert quick_problems(fake("N = 8 if QUICK else 32", told)) == [
        "uses QUICK without QUICK = quick_run() in its setup cell"]
    assert quick_problems(fake("QUICK = quick_run()\nN = 8 if QUICK else 32")) == [
        "has quick settings but no markdown says that the test suite runs it with SPECDEC_EDU_QUICK=1"]
    assert quick_problems(fake("QUICK = quick_run()\nN = 8 if QUICK else 32", told)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_quick_settings_come_from_quick_run_and_are_explained(path):
    assert quick_problems(json.loads(path.read_text())) == []
