"""The `slow` marker's list (tests/conftest.py) names tests that exist, and none of the exactness tests."""

import ast
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).resolve().parent
# The exactness tests and their negative controls: the development loop (`pytest tests -m "not slow"`) keeps them all.
EXACTNESS = {"test_verify.py", "test_proof.py", "test_sequence_exactness.py", "test_greedy.py", "test_hf_differential.py",
             "test_reference_round.py", "test_batched.py", "test_feature_drafters.py"}


def test_every_slow_test_exists_and_none_is_an_exactness_test():
    for name in SLOW:
        file, function = name.split("::")
        tree = ast.parse((TESTS / file).read_text())
        assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, name
        assert file not in EXACTNESS, name
