"""Evaluate a notebook's prose claims against the numbers its cells recorded (test-side half of
``specdec_edu.course.claims``, whose ``record`` stores the numbers; see its docstring for the syntax)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from specdec_edu.course.claims import MIME

CHECK = re.compile(r"<!--\s*check:\s*(.+?)\s*-->", re.DOTALL)
_FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": round}
_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Div: lambda a, b: a / b}
_COMPARISONS = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
                ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}


def recorded_values(notebook: Mapping) -> dict[str, float]:
    """Every value ``record`` stored in a notebook (a dict loaded from the .ipynb JSON), by name.

    A name recorded twice keeps its last value, as a re-run cell would.
    """
    values: dict[str, float] = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if MIME in data:
                values.update(data[MIME])
    return values


def claims(notebook: Mapping) -> list[tuple[int, str]]:
    """Every ``<!-- check: expr -->`` in a notebook's markdown cells, as (cell index, expression)."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            found += [(index, match.strip()) for match in CHECK.findall(source)]
    return found


def evaluate(expression: str, values: Mapping[str, float]) -> bool:
    """Evaluate one claim over the recorded values; unknown names, unsupported syntax, a claim that is no Python
    expression and a division by zero raise ``ValueError`` (so ``failed_checks`` counts each as a failed check and a
    runner goes on to the next notebook instead of stopping at a traceback)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:  # IndentationError too: a check spread over lines without parentheses
        raise ValueError(f"claim {expression!r} is not an expression ({exc.msg}); a check over several lines needs "
                         "parentheses") from exc
    return bool(_eval(tree.body, values, expression))


def failed_checks(notebook: Mapping) -> tuple[int, list[str]]:
    """The number of prose checks in ``notebook`` and those its own recorded values contradict, as
    ``"cell i: expr"`` (an unknown name counts as contradicted, with the evaluator's message: it names the fix)."""
    values, found = recorded_values(notebook), claims(notebook)
    wrong = []
    for index, expression in found:
        try:
            holds = evaluate(expression, values)
        except ValueError as exc:
            holds, expression = False, f"{expression} ({exc})"
        if not holds:
            wrong.append(f"cell {index}: {expression}")
    return len(found), wrong


def _eval(node, values, expression):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ValueError(f"claim {expression!r} uses {node.id!r}, which no cell recorded; known: {sorted(values)}")
        return values[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        operand = _eval(node.operand, values, expression)
        return -operand if isinstance(node.op, ast.USub) else not operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _eval(node.left, values, expression), _eval(node.right, values, expression)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError(f"claim {expression!r} divides by zero")
        return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        results = [_eval(v, values, expression) for v in node.values]
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values, expression)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values, expression)
            if type(op) not in _COMPARISONS:
                raise ValueError(f"claim {expression!r}: unsupported comparison {type(op).__name__}")
            if not _COMPARISONS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        return _FUNCTIONS[node.func.id](*(_eval(a, values, expression) for a in node.args))
    raise ValueError(f"claim {expression!r}: unsupported syntax {ast.dump(node)[:60]}")

