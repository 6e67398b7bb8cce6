"""Seeded fixtures: tiny random Llama models built in memory (no download).

Tiny models are dominated by per-call overhead, so the suite runs torch on one
thread (two threads on two cores only add contention).
"""

import os
import string

# The suite runs the course's defaults whatever the shell that started it exported (the notebooks' kernels inherit
# this environment): the embedded pair in float32, the default seed, real weights, never Colab's pair. A learner who
# set SPECDEC_EDU_PAIR=smollm2 for a GPU, or a Colab runtime (COLAB_RELEASE_TAG), would otherwise send every notebook
# to the hub for SmolLM2-1.7B. scripts/execute_notebooks.py honours these variables for a deliberate run.
SHELL_SETTINGS_REMOVED = ("SPECDEC_EDU_PAIR", "SPECDEC_EDU_DTYPE", "SPECDEC_EDU_SEED", "SPECDEC_EDU_RANDOM_TARGET",
                          "COLAB_RELEASE_TAG")
for _name in SHELL_SETTINGS_REMOVED:
    os.environ.pop(_name, None)
# Nothing in the tests may come from the Hugging Face hub: a call that tries fails at once instead of downloading
# (whatever the shell set, 0 included). Set before transformers is imported, which reads it once.
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402 (after the environment above)
import torch  # noqa: E402 (after the environment above)
from notebook_tags import skipped as skipped_tags  # noqa: E402 (after the environment above)
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402 (after the environment above)

from specdec_edu.models.devices import memory_gib, thread_share, usable_cores  # noqa: E402 (after the environment above)

torch.set_num_threads(int(os.environ.get("SPECDEC_TEST_THREADS", "1")))

# Notebooks executed by nbval read this (the kernels inherit the environment; specdec_edu.course.experiments.quick_run
# reads it): notebooks 00 and 05–11 then run the same code on fewer samples, repeats, tokens or training steps (each
# one's setup cell says which), so that the suite fits its time budget. The committed outputs come from
# scripts/execute_notebooks.py with the full settings (07 and 11 record quick == 0, and tests/test_notebook_claims.py
# checks it).
# SPECDEC_EDU_QUICK=0 runs the full settings under pytest too. This file is loaded when pytest collects tests/
# (plain `pytest` does); `pytest notebooks/NN_x.ipynb` alone does not load it: set the variable yourself there.
os.environ.setdefault("SPECDEC_EDU_QUICK", "1")
# compile=None means "as $SPECDEC_EDU_COMPILE says, else compiled on CUDA only": the tests (and the notebooks they
# execute) run the CPU default, whatever the shell that started them had set.
os.environ.pop("SPECDEC_EDU_COMPILE", None)


# ---- pytest-xdist (`-n auto`, the README's commands): workers share the machine ---------------------------------------
GIB_PER_WORKER = 3  # torch and transformers (~1.1 GB per worker) plus, while it runs a notebook, its kernel (~1.2 GB)


def auto_workers(cores: int, memory: float | None) -> int:
    """``-n auto``: a worker per core, as many as the memory holds (64 cores and 32 GiB get 10 workers, not 64)."""
    return max(1, cores if memory is None else min(cores, int(memory // GIB_PER_WORKER)))


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist (the GPU image's) does not know the hook
def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # the user's number: pytest-xdist reads it
    return auto_workers(usable_cores(), memory_gib())


# A notebook's kernel (and a script a test runs) is a process of its own: it inherits this environment, not the
# torch.set_num_threads above, and would start a thread per core. Beside a second worker that oversubscribes the
# cores, and OpenMP threads that wait by spinning then slow everything down: with two kernels of two threads each on
# two cores, the README's command was at 78 % after 20 min and was stopped (2026-12-06); with one thread each it took
# 11 min, against 21 min 44 s without xdist on the same machine. A thread count the shell set stays.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(thread_share(_workers)))


def tiny_llama(seed: int, vocab_size: int = 64, hidden: int = 64, layers: int = 2, init: float = 0.2, max_positions: int = 256):
    """A random LlamaForCausalLM. ``init`` (the weights' std) sets how peaked its next-token
    distributions are: 0.2 gives a top token with ~40 % mass and draft/target pairs whose
    total-variation distance is ~0.5, which is what the statistical tests need."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval().requires_grad_(False)


def flip_wide_forwards(model, positions):
    """Make ``model``'s forwards of more than one token pick the runner-up in the rows at ``positions`` (absolute
    positions; the row at position i predicts token i + 1): what bf16 does when a verify pass rounds a near-tie
    otherwise than the one-token steps did, made certain. One-token forwards are untouched. Returns the hook's handle
    (``.remove()`` undoes it)."""
    def swap_top_two(module, args, kwargs, out):
        width = kwargs["input_ids"].shape[1]
        caches = [v for v in kwargs.values() if hasattr(v, "get_seq_length")]  # DynamicCache (under any keyword)
        if width == 1 or not caches:
            return
        first = int(caches[0].get_seq_length()) - width  # the position of the forward's first row
        kept = out.logits.shape[1]  # logits_to_keep may keep only the last rows
        for position in positions:
            row = position - first - (width - kept)
            if 0 <= row < kept:
                top2 = out.logits[0, row].topk(2).indices
                out.logits[0, row, top2] = out.logits[0, row, top2.flip(0)]

    return model.register_forward_hook(swap_top_two, with_kwargs=True)


def perturbed_copy(model, noise: float, seed: int):
    """The same architecture and weights plus Gaussian noise: a draft that mostly agrees."""
    copy = tiny_llama(seed=0, **_shape(model))
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    for w in copy.parameters():
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return copy


def _shape(model):
    c = model.config
    return dict(vocab_size=c.vocab_size, hidden=c.hidden_size, layers=c.num_hidden_layers,
                max_positions=c.max_position_embeddings)


@pytest.fixture(scope="session")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def draft():
    """Unrelated random weights: low acceptance, many rejections and rollbacks."""
    return tiny_llama(seed=1)


@pytest.fixture(scope="session")
def close_draft(target):
    """A noisy copy of the target (noise 0.3): α ≈ 0.37 when sampling but only ≈ 0.09 greedy (test_greedy's 24
    prompts, pooled): a tiny random model's argmax is fragile, so most greedy rounds keep no draft. For greedy
    rounds that keep several drafts, use ``agreeing_draft``."""
    return perturbed_copy(target, noise=0.3, seed=2)


@pytest.fixture(scope="session")
def agreeing_draft(target):
    """A closer copy (noise 0.05): greedy α ≈ 0.63 on test_greedy's 24 prompts, so greedy rounds keep anything from
    none to all of their drafts, and a batch's rows roll back by different amounts in one round
    (``test_greedy.test_agreeing_draft_keeps_every_number_of_drafts`` checks that it still does)."""
    return agreeing_copy(target)


def agreeing_copy(model):
    """``agreeing_draft``'s weights as a fresh object (for tests that need models of their own)."""
    return perturbed_copy(model, noise=0.05, seed=2)


@pytest.fixture(scope="session")
def small_vocab_pair():
    """(target, draft) over 8 tokens, 1 layer: small enough to enumerate every 3-token continuation."""
    return tiny_llama(seed=10, vocab_size=8, hidden=32, layers=1), tiny_llama(seed=11, vocab_size=8, hidden=32, layers=1)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


# ---- notebooks (nbval) ---------------------------------------------------------------------------
# Cells tagged "gpu" (need CUDA), "hub" (download from the Hugging Face hub) or "colab" (install
# cells that only run on Colab) are skipped when nbval executes the notebooks in CI, exactly as
# scripts/execute_notebooks.py skips them for the committed outputs (one list: tests/notebook_tags.py).


def pytest_collection_modifyitems(config, items):
    for item in items:
        cell = getattr(item, "cell", None)  # nbval's cell items carry the notebook cell
        tags = set(getattr(cell, "metadata", {}).get("tags", [])) if cell is not None else set()
        if skipped_tags(tags):
            item.add_marker(pytest.mark.skip(reason=f"notebook cell tagged {sorted(skipped_tags(tags))}"))
        if is_slow(item):
            item.add_marker(pytest.mark.slow)


# ---- the `slow` marker: `pytest tests -m "not slow"` is the loop while developing ------------------------------
# What is slow: seconds per test (tests/DURATIONS.txt) spent on something other than the algorithm's units and its
# exactness. Every exactness test (greedy = target-only, sampled = the target's distribution) stays fast, with its
# negative controls. The whole list is here, so that the README can say what `slow` holds.
SLOW = {  # "file::test function" (every parametrization): why it is slow
    "test_gpu_check.py::test_gpu_check_runs_at_tiny_size_on_every_path": "scripts/gpu_check.py end to end, compiled",
    "test_bench.py::test_bench_compiled_runs_the_eager_twins_beside": "the bench, compiled, with eager twins beside",
    "test_embedded.py::test_loading_from_the_cache_needs_neither_gguf_nor_accelerate": "a fresh Python interpreter",
    "test_suite_markers.py::test_the_suite_runs_where_pytest_xdist_is_not_installed": "a fresh pytest process",
    "test_compiled.py::test_a_compiled_cache_compiles_every_width_when_it_is_made": "compiles every width of a cache",
    "test_gpu_check.py::test_goals_runs_only_the_compiled_rows_and_the_peers": "scripts/gpu_check.py end to end, compiled",
    "test_gpu_check.py::test_the_dial_replays_the_measured_paths_own_target_output": "scripts/gpu_check.py end to end",
    "test_cold_start.py::test_the_tiny_smoke_reports_every_part_cold_and_warm": "fresh Python processes, cold and warm",
    "test_assets.py::test_a_regular_install_outside_sys_prefix_loads_the_draft": "pip installs the package",
    "test_execute_notebooks.py::test_jobs_run_notebooks_side_by_side_and_a_deadline_still_prints_the_table":
        "Jupyter kernels, waiting for a deadline",
    "test_execute_notebooks.py::test_a_kernel_that_stops_answering_costs_a_rerun_not_the_deadline":
        "Jupyter kernels, waiting for a cell timeout",
    "test_gpu_course_checks.py::test_a_step_cut_by_its_own_limit_exits_3_and_says_which": "waits for a step's time limit",
    "test_gpu_course_checks.py::test_a_stage_writes_its_provenance_and_skips_what_its_budget_cannot_hold":
        "the GPU stage script end to end, on the CPU",
}
SLOW_MARKERS = {  # every test with one of these markers is slow too
    "embedded": "loads the embedded model pair (a 93 MB download on first use)",
    "browser": "drives JupyterLab in a real browser",
}


def is_slow(item) -> bool:
    name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"  # without its parameters
    return name in SLOW or any(marker in item.keywords for marker in SLOW_MARKERS)


# A character-level tokenizer with a chat template: the demo and the batch sweep need one, no download.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def char_tokenizer():
    """One token per printable character, plus ChatML-style special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                        bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _chat_tiny(vocab_size, seed, layers):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tiny_pair(char_tokenizer):
    """(target, draft): tiny random Llamas over ``char_tokenizer``'s vocabulary."""
    vocab = len(char_tokenizer)
    return _chat_tiny(vocab, seed=0, layers=2), _chat_tiny(vocab, seed=1, layers=1)
