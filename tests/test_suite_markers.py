"""The `slow` marker's list (tests/conftest.py) names tests that exist, and none of the exactness tests; the workers
that ``-n auto`` starts fit the machine's memory, and a process a worker starts takes only its share of the cores."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

from specdec_edu.models import devices
from specdec_edu.models.devices import memory_gib, thread_share, usable_cores

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


@pytest.mark.parametrize("cores, memory, workers", [(2, 23.4, 2), (64, 32.0, 10), (8, 2.0, 1), (4, None, 4), (1, 512.0, 1)])
def test_auto_gives_a_worker_per_core_as_many_as_memory_holds(cores, memory, workers):
    assert conftest.auto_workers(cores, memory) == workers


def test_a_worker_count_the_user_set_is_left_to_xdist(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(config=None) is None
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS")
    assert conftest.pytest_xdist_auto_num_workers(config=None) == conftest.auto_workers(usable_cores(), memory_gib())


@pytest.mark.parametrize("cores, workers, threads", [(2, 2, 1), (16, 4, 4), (2, 4, 1), (3, 2, 1)])
def test_a_started_process_gets_its_workers_share_of_the_cores(cores, workers, threads):
    assert thread_share(workers, cores) == threads


def test_the_share_counts_the_cores_this_process_may_use(monkeypatch):
    """Under ``taskset -c 0,1`` on a 16-CPU machine, 4 workers get 1 thread each, not 16 // 4 = 4 (which would put
    16 threads on 2 cores); without an affinity mask, all the machine's CPUs count."""
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 16)
    assert usable_cores() == 2 and thread_share(4) == 1
    monkeypatch.delattr(devices.os, "sched_getaffinity", raising=False)
    assert usable_cores() == 16 and thread_share(4) == 4


def test_a_process_started_under_xdist_runs_torch_on_its_share():
    """In this session: a fresh interpreter (as a notebook's kernel is one) runs torch on as many threads as
    ``OMP_NUM_THREADS`` says, which conftest sets under xdist."""
    if "OMP_NUM_THREADS" not in os.environ:
        assert int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) == 1, "conftest sets it under xdist"
        pytest.skip("not under xdist, and the shell did not set OMP_NUM_THREADS: a process takes torch's default")
    threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert int(threads) == int(os.environ["OMP_NUM_THREADS"])


def test_the_suite_runs_where_pytest_xdist_is_not_installed():
    """The GPU image has pytest without pytest-xdist; there conftest's ``-n auto`` hook must not stop the suite
    (pytest refuses a conftest hook that no plugin declares, unless it is marked optional)."""
    done = run_in_a_fresh_pytest("test_every_slow_test_exists_and_none_is_an_exactness_test")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def run_in_a_fresh_pytest(test: str, **env) -> subprocess.CompletedProcess:
    """One test of this file in a pytest of its own, without xdist, under this environment plus ``env``."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-q", f"{TESTS / 'test_suite_markers.py'}::{test}"],
                          capture_output=True, text=True, cwd=TESTS.parent, env=env)


def test_the_environment_is_the_courses_defaults():
    """Under the suite (tests/conftest.py): the embedded pair, no dtype, seed or random-target override, and the hub
    offline, in this process and so in every notebook kernel it starts."""
    import huggingface_hub.constants

    from specdec_edu import default_pair

    assert default_pair() == "embedded"
    for name in conftest.SHELL_SETTINGS_REMOVED:
        assert name not in os.environ, f"{name} reached the tests"
    assert huggingface_hub.constants.HF_HUB_OFFLINE, "the hub must be off for the tests"


def test_the_suite_runs_the_defaults_whatever_the_shell_exported():
    """A learner's shell with SPECDEC_EDU_PAIR=smollm2 (the README's GPU setting), a 16-bit dtype, another seed, the
    random target and Colab's marker, and the hub online: the test above still sees the defaults. Before conftest
    removed them, every notebook under pytest loaded SmolLM2-1.7B from the hub."""
    done = run_in_a_fresh_pytest("test_the_environment_is_the_courses_defaults", SPECDEC_EDU_PAIR="smollm2",
                                 SPECDEC_EDU_DTYPE="bf16", SPECDEC_EDU_SEED="3", SPECDEC_EDU_RANDOM_TARGET="1",
                                 COLAB_RELEASE_TAG="release-colab_20261201", HF_HUB_OFFLINE="0")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
