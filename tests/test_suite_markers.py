"""The `slow` marker's list (tests/conftest.py) names tests that exist, and none of the exactness tests."""

import ast
import re
from pathlib import Path

import conftest
import pytest

TESTS = Path(__file__).resolve().parent
# The exactness tests and their negative controls: the development loop (`pytest tests -m "not slow"`) keeps them all.
# Whole files of them:
EXACTNESS = {"test_verify.py", "test_proof.py", "test_sequence_exactness.py", "test_greedy.py", "test_hf_differential.py",
             "test_reference_round.py", "test_batched.py", "test_feature_drafters.py"}
# and, in any file, a test whose name says what it checks: the output follows the target, greedy equals target-only,
# a broken rule is rejected, a negative control. (A file list alone let test_compiled.py's and test_suffix.py's
# exactness tests into `slow` unnoticed.)
EXACTNESS_NAME = re.compile(r"follow|greedy|equal|exact|control|reject|distribution|identical|chi2|same_tokens|target_only")


def exactness_slow(slow) -> list[str]:
    """The names in ``slow`` ("file::function") that are exactness tests; each must be a test that exists."""
    found = []
    for name in slow:
        file, function = name.split("::")
        tree = ast.parse((TESTS / file).read_text())
        assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, name
        if file in EXACTNESS or EXACTNESS_NAME.search(function):
            found.append(name)
    return found


def test_every_slow_test_exists_and_none_is_an_exactness_test():
    assert exactness_slow(conftest.SLOW) == []


@pytest.mark.parametrize("name", ["test_compiled.py::test_compiled_sampling_follows_the_target",
                                  "test_suffix.py::test_the_same_test_rejects_a_broken_rule",
                                  "test_sliding_window.py::test_greedy_speculative_equals_generate",
                                  "test_verify.py::test_analytic_identity_random_pairs"])
def test_the_guard_finds_an_exactness_test_put_on_the_slow_list(name):
    """The control: each of these, added to the list, is found (by its name, or for test_verify.py by its file)."""
    assert exactness_slow({*conftest.SLOW, name}) == [name]
