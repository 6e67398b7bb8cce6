"""The committed notebooks say nothing their own outputs contradict, and share one shape.

A notebook records the numbers its prose relies on (``specdec_edu.course.claims.record``) and states each comparison
as ``<!-- check: expr -->`` in the markdown cell that makes it. Here every claim is evaluated against the values
stored in the committed outputs. These tests read JSON only (no kernel), so they take well under a second.
"""

import json
import re
from pathlib import Path

import pytest
from claims_eval import MIME, claims, evaluate, failed_checks, recorded_values

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def load(path):
    return json.loads(path.read_text())


def markdown(nb) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


# --- the checker itself can fail -------------------------------------------------------------------------------

def fake_notebook(values: dict, *checks: str) -> dict:
    """A two-cell notebook: one code cell that recorded ``values``, one markdown cell with ``checks``."""
    return {"cells": [
        {"cell_type": "code", "source": [], "outputs": [{"output_type": "display_data", "data": {MIME: values}}]},
        {"cell_type": "markdown", "source": [" ".join(f"Some prose. <!-- check: {c} -->" for c in checks)]},
    ]}


def test_claims_are_read_and_evaluated():
    nb = fake_notebook({"speedup": 0.62, "step_ms": 56.1}, "speedup < 1", "50 < step_ms < 60 and speedup > 0.5")
    values = recorded_values(nb)
    assert values == {"speedup": 0.62, "step_ms": 56.1}
    assert [expr for _, expr in claims(nb)] == ["speedup < 1", "50 < step_ms < 60 and speedup > 0.5"]
    assert all(evaluate(expr, values) for _, expr in claims(nb))


def test_a_contradicted_claim_is_caught():
    """Negative control: prose that says "faster" next to a 0.62× output must fail."""
    values = recorded_values(fake_notebook({"speedup": 0.62}))
    assert not evaluate("speedup > 1", values)
    assert not evaluate("0.7 < speedup < 2", values)  # a chain fails if any link fails
    assert evaluate("not speedup > 1", values)


def test_unknown_names_and_unsafe_syntax_are_errors():
    with pytest.raises(ValueError, match="which no cell recorded"):
        evaluate("speedup_typo < 1", {"speedup": 0.62})
    with pytest.raises(ValueError, match="unsupported"):
        evaluate("__import__('os').system('true')", {})
    with pytest.raises(ValueError, match="unsupported"):
        evaluate("speedup in (1, 2)", {"speedup": 1})


def test_record_refuses_non_finite_values():
    pytest.importorskip("IPython")
    from specdec_edu.course.claims import record

    with pytest.raises(ValueError, match="finite"):
        record(alpha=float("nan"))
    with pytest.raises(ValueError, match="got None"):
        record(n_needed=None)


def test_a_random_target_run_leaves_non_finite_values_out(monkeypatch, capsys):
    """SPECDEC_EDU_RANDOM_TARGET=1 (a GPU check with random target weights): a 0 / 0 rate is left out, not an error."""
    pytest.importorskip("IPython")
    from specdec_edu.course.claims import record

    monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", "1")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw: shown.append(data))
    record(alpha=float("nan"), n_needed=None, speedup=1.5)
    assert shown == [{MIME: {"speedup": 1.5}}]


# Each pair is (claim, values); the evaluator must agree with Python on every one. The values sit on the boundaries
# of the comparisons and make every operand of and/or and every link of a chain decide the result once, so that
# a comparison evaluated as its non-strict twin, a dropped link, "and" read as "or", a lost minus sign or a function
# swapped for another gives a different truth value somewhere. (A mutation audit found each of these passing.)
AGREES_WITH_PYTHON = [
    *[(f"x {op} 1", {"x": x}) for op in ("<", "<=", ">", ">=", "==", "!=") for x in (0.5, 1.0, 1.5)],
    ("0 < x < 1", {"x": 1.5}), ("0 < x < 1", {"x": 0.5}), ("2 > x > 1 > 0", {"x": 0.5}), ("0 < x < 1 < 2", {"x": 0.5}),
    ("x > 1 and x < 2", {"x": 0.5}), ("x > 0 and x > 1", {"x": 0.5}), ("x > 0 and x < 1 and x > 0.7", {"x": 0.5}),
    ("x > 1 or x < 0", {"x": 0.5}), ("x > 1 or x > 0", {"x": 0.5}), ("x > 0 or x > 1", {"x": 0.5}),
    ("x > 1 and x < 2 or x < 0.7", {"x": 0.5}), ("x > 1 and (x < 2 or x < 0.7)", {"x": 0.5}),
    ("not x < 1", {"x": 0.62}), ("not x > 1", {"x": 0.62}), ("not (x > 0 and x > 1)", {"x": 0.62}),
    ("-x < 0", {"x": 0.62}), ("-x > -1", {"x": 0.62}), ("-(x - 1) > 0", {"x": 0.62}),
    ("abs(x - 1) > 0.3", {"x": 0.62}), ("abs(1 - x) < 0.3", {"x": 0.62}),
    ("min(x, y) == x", {"x": 0.62, "y": 2.0}), ("max(x, y) == x", {"x": 0.62, "y": 2.0}),
    ("min(x, y, 0.1) < x", {"x": 0.62, "y": 2.0}),
    ("round(x, 1) == 0.6", {"x": 0.62}), ("round(x) == 1", {"x": 0.62}), ("round(x) == 0", {"x": 0.62}),
    ("x + y > 2.5", {"x": 0.62, "y": 2.0}), ("y - x > 1.3", {"x": 0.62, "y": 2.0}), ("x - y > 0", {"x": 0.62, "y": 2.0}),
    ("x * y > 1.2", {"x": 0.62, "y": 2.0}), ("y / x > 3", {"x": 0.62, "y": 2.0}), ("x / y > 0.3", {"x": 0.62, "y": 2.0}),
]


@pytest.mark.parametrize("claim, values", AGREES_WITH_PYTHON, ids=[f"{c} {v}" for c, v in AGREES_WITH_PYTHON])
def test_the_evaluator_agrees_with_python_on_every_supported_operator(claim, values):
    """The checker is only as good as its evaluator: a claim it evaluates otherwise than Python would can pass next
    to an output that contradicts it (``0 < speedup < 1`` true for 1.5 once a chain link is dropped)."""
    python = bool(eval(claim, {"__builtins__": {}, "abs": abs, "min": min, "max": max, "round": round}, dict(values)))
    assert evaluate(claim, values) is python


def test_unsupported_operators_are_errors_not_silently_true():
    """An operator the evaluator does not know must raise, not be skipped (``x is 2`` read as true) or read as
    another (``+x`` as ``not x``); a string constant is no number (``x > 1 or 'todo'`` would hold); a function
    called with keywords is refused rather than called without them."""
    values = {"x": 0.62}
    for claim in ("x is 2", "x is not 0.62", "x in 1", "+x > 0", "~x < 0", "'todo'", "x > 1 or 'todo'", "x ** 2 < 1",
                  "x % 1 > 0.5", "round(x, ndigits=0) == 1", "x if x else 1", "speed.up > 1", "[x][0] > 1"):
        with pytest.raises(ValueError, match="unsupported"):
            evaluate(claim, values)


def test_a_check_that_is_no_expression_or_divides_by_zero_is_a_failed_check():
    """A typo in a check (``x >``), a check over lines without parentheses (an IndentationError) and a division by a
    recorded 0 raised out of ``failed_checks``: ``--check-only`` stopped at a traceback with no table for the other
    notebooks. Each is now a failed check whose message names the fix; the checks beside it are still evaluated."""
    nb = fake_notebook({"x": 0.62, "zero": 0.0}, "x >", "x / zero > 1", "x < 1")
    nb["cells"][1]["source"].append(" <!-- check: x < 1\n  and x > 0 -->")
    count, wrong = failed_checks(nb)
    assert count == 4 and len(wrong) == 3, wrong
    assert "is not an expression" in wrong[0] and "divides by zero" in wrong[1], wrong
    assert "needs parentheses" in wrong[2], wrong


def test_every_way_of_writing_a_check_is_read():
    """The prose lint (``tests/prose_lint.py``) counts ``<!--check:...-->`` without spaces, and a check spread over
    lines, as checks that cover their clause: the evaluator must read the same ones, or a claim the lint takes as
    checked is never evaluated. Two checks in one cell are two claims."""
    cell = ("Faster here <!--check: x < 1-->, slower there <!--   check:   x > 0   -->; one more <!-- check: (x < 2\n"
            "   and x > 0.5) --> and the last.")
    nb = fake_notebook({"x": 0.62})
    nb["cells"][1]["source"] = cell.splitlines(keepends=True)
    assert [expr for _, expr in claims(nb)] == ["x < 1", "x > 0", "(x < 2\n   and x > 0.5)"]
    assert failed_checks(nb) == (3, [])  # a check spread over lines parses (inside parentheses)
    from prose_lint import CHECK as LINT_CHECK

    assert len(LINT_CHECK.findall(cell)) == 3


def test_a_value_recorded_twice_keeps_the_last_one():
    """As a re-run cell would: a later ``record`` of the same name replaces the earlier one (a notebook that
    measures, changes a setting and measures again, checks its prose against the second number)."""
    nb = {"cells": [
        {"cell_type": "code", "source": [], "outputs": [{"output_type": "display_data", "data": {MIME: {"x": 0.5}}}]},
        {"cell_type": "markdown", "source": ["Faster. <!-- check: x > 1 -->"]},
        {"cell_type": "code", "source": [], "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "x\n"},
            {"output_type": "display_data", "data": {MIME: {"x": 1.5, "y": 2.0}}}]},
    ]}
    assert recorded_values(nb) == {"x": 1.5, "y": 2.0}
    assert failed_checks(nb) == (1, [])
    nb["cells"][2]["outputs"][1]["data"][MIME]["x"] = 0.9
    assert failed_checks(nb) == (1, ["cell 1: x > 1"])


def test_a_cell_with_any_skipped_tag_is_skipped():
    """``skipped`` looks at every tag of a cell, not its first: a GPU cell that is also a hidden solution does not
    run on the CPU (in CI or for the committed outputs); tags that only change how a cell is shown skip nothing."""
    from notebook_tags import NOT_RUN_ON_CPU, RUN_EVERYWHERE, skipped

    assert skipped(["solution", "gpu"]) == {"gpu"} and skipped(("raises-exception", "hub", "colab")) == {"hub", "colab"}
    assert skipped(sorted(RUN_EVERYWHERE)) == set() and skipped([]) == set()
    assert NOT_RUN_ON_CPU == {"colab", "gpu", "hub"} and not NOT_RUN_ON_CPU & RUN_EVERYWHERE


# --- every committed notebook ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_claims_hold_for_the_committed_outputs(path):
    nb = load(path)
    values = recorded_values(nb)
    found = claims(nb)
    assert found, f"{path.name} states no checked claim; add <!-- check: ... --> next to its comparisons"
    _, wrong = failed_checks(nb)
    assert not wrong, f"{path.name}: prose contradicted by its own outputs:\n" + "\n".join(
        f"{w}  (values: { {k: values[k] for k in values if k in w} })" for w in wrong)
    unused = [name for name in values if not any(re.search(rf"\b{name}\b", expr) for _, expr in found)]
    assert not unused, f"{path.name} records values no claim uses: {unused}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_objectives_summary_and_next(path):
    cells = markdown(load(path))
    assert "## Objectives" in cells[0], f"{path.name}: the first cell needs an '## Objectives' list"
    assert any(c.lstrip().startswith("## What you learned") for c in cells), f"{path.name}: no '## What you learned'"
    nexts = [m for c in cells for m in re.findall(r"\*\*Next:\*\* \[[^\]]+\]\(([^)]+)\)", c)]
    assert nexts, f"{path.name}: no '**Next:** [title](link)'"
    for link in nexts:
        target = link.split("#")[0]
        assert target.startswith("http") or (path.parent / target).exists(), f"{path.name}: Next link {link} is broken"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stalled_progress_bars(path):
    """A committed tqdm widget shows "0%|" on GitHub forever; scripts/execute_notebooks.py removes them."""
    for i, cell in enumerate(load(path)["cells"]):
        for output in cell.get("outputs", []):
            text = json.dumps(output.get("data", {}).get("text/plain", "")) + json.dumps(output.get("text", ""))
            assert not re.search(r"\b0%\||\b0it \[", text), f"{path.name} cell {i}: a progress bar committed at 0%"


def execute_script():
    """scripts/execute_notebooks.py, loaded as a module."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "execute_notebooks.py"
    spec = importlib.util.spec_from_file_location("execute_notebooks", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_execute_script_drops_progress_bars_and_keeps_sliders():
    """scripts/execute_notebooks.py removes tqdm widgets (and their state) but keeps a real widget (a slider)."""
    import nbformat

    module = execute_script()
    view = module.WIDGET_VIEW
    bar = nbformat.v4.new_output("display_data", data={view: {"model_id": "bar"}, "text/plain": "χ²:  40%|████  | 2/5"})
    slider = nbformat.v4.new_output("display_data", data={view: {"model_id": "slider"}, "text/plain": "FloatSlider(value=0.5)"})
    no_total = nbformat.v4.new_output("display_data", data={view: {"model_id": "bar2"}, "text/plain": "head: 0it [00:00, ?it/s]"})
    printed = nbformat.v4.new_output("stream", text="done: 5 runs\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[bar, slider, no_total, printed])])
    # A bar's view is an HBox whose children have children (a layout, a style); the slider has a layout too, and the
    # output widget shows a view of its own (the plot a callback redraws).
    state = {"bar": {"state": {"children": ["IPY_MODEL_bar-n", "IPY_MODEL_bar-text"]}},
             "bar-n": {"state": {"layout": "IPY_MODEL_bar-n-layout"}}, "bar-n-layout": {}, "bar-text": {},
             "slider": {"state": {"layout": "IPY_MODEL_slider-layout", "out": "IPY_MODEL_out"}}, "slider-layout": {},
             "out": {"state": {"outputs": [{"data": {view: {"model_id": "shown-in-out"}}}]}}, "shown-in-out": {},
             "bar2": {}, "never-shown": {}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    assert module.drop_progress_bars(nb) == 2
    assert [o.get("data", {}).get("text/plain", o.get("text")) for o in nb.cells[0].outputs] == \
        ["FloatSlider(value=0.5)", "done: 5 runs\n"]
    assert sorted(nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]) == \
        ["out", "shown-in-out", "slider", "slider-layout"]
    del nb.cells[0].outputs[0]  # without the slider no widget is left: no widget block either
    module.drop_progress_bars(nb)
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_widget_state_holds_only_what_a_view_shows(path):
    """A model that no committed view reaches (a removed progress bar's children) renders nowhere: it is weight."""
    nb = load(path)
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    shown = execute_script().reachable_widgets(nb, state)  # the walk the executor drops the rest by
    assert sorted(set(state) - shown) == [], f"{path.name}: widget models that no view shows"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_checks_do_not_split_paragraphs(path):
    """A line that *starts* with "<!--" opens an HTML block in CommonMark: it ends the paragraph above it and the
    rest of its line is shown as raw HTML. A check belongs at the end of the sentence it checks, on that line."""
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        lines = "".join(cell["source"]).split("\n")
        for j, line in enumerate(lines):
            if line.lstrip().startswith("<!--") and j > 0 and lines[j - 1].strip():
                pytest.fail(f"{path.name} cell {i} line {j}: move {line.strip()[:50]!r} to the end of the line above")


def test_every_cell_tag_says_where_the_cell_runs():
    """CI and scripts/execute_notebooks.py skip the same tags (tests/notebook_tags.py); a new tag must be
    placed there, so that it cannot be skipped by one and run by the other."""
    from notebook_tags import NOT_RUN_ON_CPU, RUN_EVERYWHERE

    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            unknown = set(cell.get("metadata", {}).get("tags", [])) - NOT_RUN_ON_CPU - RUN_EVERYWHERE
            assert not unknown, f"{path.name} cell {i}: tag(s) {sorted(unknown)} not in tests/notebook_tags.py"


def test_record_refuses_infinities_too():
    """'Finite' means no inf either: a rate divided by a zero count is ±inf, and a claim like ``speedup > 1``
    would hold for it."""
    pytest.importorskip("IPython")
    from specdec_edu.course.claims import record

    for bad in (float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="finite"):
            record(speedup=bad)


def test_record_stores_plain_floats_as_raw_data(monkeypatch):
    """A 0-d tensor, a numpy scalar and a bool are stored as Python floats, unrounded (the notebook's JSON holds
    nothing else), and the dict is displayed raw, i.e. as a MIME bundle with the claims key: displayed otherwise it
    becomes a visible text repr, and the checker finds no values."""
    pytest.importorskip("IPython")
    import numpy as np
    import torch

    from specdec_edu.course.claims import record

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, **kwargs: shown.append((data, kwargs)))
    record(alpha=torch.tensor(0.125), step_ms=np.float32(56.5), faster=True)
    assert shown == [({MIME: {"alpha": 0.125, "step_ms": 56.5, "faster": 1.0}}, {"raw": True})]
    assert all(type(v) is float for v in shown[0][0][MIME].values())
    json.dumps(shown[0][0])  # what nbformat will write
