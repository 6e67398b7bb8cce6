"""The offline measurement scripts (scripts/suffix_eval.py, suffix_budget.py, compile_cost.py, feature_data.py and
scripts/draft_build's pure parts), run at toy size with the tiny random models and fake clocks: their outputs are
committed under assets/results/ and quoted in the README, and nothing else checks that the scripts still run or
that they derive those numbers (speedup ratios, per-part splits, corpus sizes, budgets, the chosen K) correctly.
Every figure is checked against an independent computation from the fake clock's table, never against the
script's own output."""

import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import agreeing_copy, tiny_llama

from specdec_edu import autoregressive_generate, speculative_generate
from specdec_edu.kv import forward_cached
from specdec_edu.suffix import CorpusIndex, SuffixDrafter
from specdec_edu.theory import expected_speedup

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
VOCAB = 64  # the tiny models' vocabulary (conftest.tiny_llama)


def load_script(name: str):
    """``scripts/NAME.py`` as a fresh module (its ``main`` not run); the folders a script puts on ``sys.path`` for its
    own imports are taken off again, so that no later test imports from scripts/ by chance."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


@pytest.fixture
def draft_build(monkeypatch):
    """``scripts/draft_build`` importable as ``draft_build`` (as scripts/build_draft.py imports it)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import draft_build.card
    import draft_build.evaluate
    import draft_build.prompts

    return draft_build


# ---- every script imports, and answers --help, without doing any work --------------------------------------

HELP_CHECK = r"""
import contextlib, importlib, io, os, runpy, sys
from pathlib import Path
scripts = Path(sys.argv[1])
sys.path.insert(0, str(scripts))
failures = []
for path in sorted(scripts.glob("*.py")):
    sys.argv = [str(path)]  # imported, not run: no arguments to parse, and no work to do
    try:
        runpy.run_path(str(path), run_name=f"imported_{path.stem}")
    except BaseException as e:
        failures.append(f"import {path.name}: {type(e).__name__}: {e}")
    sys.argv = [str(path), "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__")
        failures.append(f"{path.name} --help: returned without exiting")
    except SystemExit as e:
        if e.code not in (0, None) or "usage:" not in out.getvalue():
            failures.append(f"{path.name} --help: exit {e.code!r}")
    except Exception as e:
        failures.append(f"{path.name} --help: {type(e).__name__}: {e}")
for path in sorted((scripts / "draft_build").glob("*.py")):
    name = "draft_build" if path.stem == "__init__" else f"draft_build.{path.stem}"
    try:
        importlib.import_module(name)
    except Exception as e:
        failures.append(f"import {name}: {type(e).__name__}: {e}")
print("\n".join(failures) if failures else "OK")
"""


def test_every_script_imports_and_answers_help_without_doing_work(tmp_path):
    """One subprocess (torch imported once): each scripts/*.py imports without running (compile_cost.py measured at
    import, and left a folder in TMPDIR), run as ``__main__`` with ``--help`` exits 0 with a usage line, and each
    scripts/draft_build module imports. The model cache points at an empty folder and the hub is
    offline, so a script that loaded, downloaded or wrote anything before parsing its arguments fails here (the
    cache, or the working folder, would no longer be empty). suffix_eval.py is run by no other test: a rename of the
    private bench helpers it imports (``_hf_generate``, ``_versions``, ``eval_prompts``) shows up here first."""
    cache, work, tmp = tmp_path / "cache", tmp_path / "work", tmp_path / "tmp"
    for folder in (cache, work, tmp):
        folder.mkdir()
    env = {**os.environ, "SPECDEC_EDU_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp),
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", HELP_CHECK, str(SCRIPTS)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "OK", proc.stdout[-3000:]
    assert not list(cache.iterdir()) and not list(work.iterdir()) and not list(tmp.iterdir())


# ---- scripts/suffix_eval.py --------------------------------------------------------------------------------


def fake_ids(text: str) -> torch.Tensor:
    """A stand-in for chat_prompt: the text's first characters as tiny-vocabulary ids, ``[1, n]``."""
    return torch.tensor([[1 + ord(c) % (VOCAB - 2) for c in text[:12]]])


def base_seconds(ids) -> float:
    """The fake clock's seconds for target-only on a prompt: differ between prompts."""
    return 1.0 + (sum(ids) % 7) * 0.25


class SuffixEvalRig:
    """suffix_eval with the tiny target, fake prompts, a toy corpus and a clock that reads seconds from a table keyed
    by (method, prompt), so that every figure the script derives can be recomputed here independently."""

    DOCS = [[0, 5, 9, 0, 5], [7, 8, 9, 10, 11, 12], [5, 9, 0], [3, 3, 4, 5]]  # 0 is a token id, not a separator

    def __init__(self, monkeypatch, target):
        self.mod = load_script("suffix_eval")
        self.target, self.state, self.asked, self.docs = target, {}, [], self.DOCS
        self.corpora = {}  # id(corpus) -> fraction
        mod, real_prompts = self.mod, self.mod.eval_prompts

        def eval_prompts(name):
            self.asked.append(name)
            return real_prompts(name)[:3]

        def embedded_corpus(fraction=None):  # curve names a fraction; tune takes the whole corpus
            index = CorpusIndex()
            index.add_many(self.docs[: round((1.0 if fraction is None else fraction) * len(self.docs))])
            if fraction is not None:
                self.corpora[id(index)] = fraction
            return index

        def spy_ar(target, ids, **kw):
            self.state.update(label="target_only", ids=tuple(ids[0].tolist()))
            return autoregressive_generate(target, ids, **kw)

        def spy_spec(target, drafter, ids, **kw):
            self.state.update(label=self.label_of(drafter, kw["gamma"]), ids=tuple(ids[0].tolist()))
            return speculative_generate(target, drafter, ids, **kw)

        def timed(fn, device):
            out = fn()
            return out, self.seconds(self.state["label"], self.state["ids"])

        monkeypatch.setattr(mod, "eval_prompts", eval_prompts)
        monkeypatch.setattr(mod, "embedded_corpus", embedded_corpus)
        monkeypatch.setattr(mod, "chat_prompt", lambda tokenizer, text: fake_ids(text))
        monkeypatch.setattr(mod, "autoregressive_generate", spy_ar)
        monkeypatch.setattr(mod, "speculative_generate", spy_spec)
        monkeypatch.setattr(mod, "timed", timed)
        tokenizer = SimpleNamespace(eos_token_id=VOCAB - 1)
        monkeypatch.setattr(mod, "load_embedded_pair", lambda device=None: (target, None, tokenizer))

    def label_of(self, drafter, gamma):
        if id(drafter.corpus) in self.corpora:  # curve: one drafter per corpus fraction
            return ("fraction", self.corpora[id(drafter.corpus)])
        return ("setting", gamma, drafter.min_prob, drafter.spec_factor)

    @staticmethod
    def seconds(label, ids) -> float:
        base = base_seconds(ids)
        if label == "target_only":
            return base
        if label[0] == "fraction":
            return 0.5 + (1.5 - label[1]) * base
        _, gamma, min_prob, spec = label
        return 0.1 * gamma + min_prob + spec * base / 2

    def run(self, monkeypatch, tmp_path, argv):
        out = tmp_path / "out.json"
        argv = [*argv, "--out", str(out)]
        monkeypatch.setattr(sys, "argv", ["pytest", "-q"])  # a call from code: the command is main's arguments
        self.mod.main(argv)
        return json.loads(out.read_text()), " ".join(argv)


def check_provenance(result, command):
    assert result["command"] == f"python scripts/suffix_eval.py {command}"
    assert set(result["versions"]) >= {"specdec_edu", "torch", "transformers", "python"}
    assert result["date"] and result["machine"] and result["threads"] == torch.get_num_threads()


def test_suffix_eval_curve_figures(monkeypatch, tmp_path, target):
    """``curve``: per corpus fraction, the corpus size (token ids, 0 included, separators not), the speedup as
    target-only seconds / the fraction's seconds (pooled, and the median per prompt), α and τ pooled over the prompts
    of the named set. Pins the ratio's direction, the fraction-to-corpus mapping and the prompt set."""
    rig = SuffixEvalRig(monkeypatch, target)
    fractions, n_new, gamma = [0.0, 0.5, 1.0], 6, 3  # not the default γ
    from specdec_edu.commands.bench import eval_prompts

    prompts = [fake_ids(p) for p in eval_prompts("input-grounded")[:3]]
    answers = [autoregressive_generate(target, p, max_new_tokens=n_new, eos_token_id=VOCAB - 1).sequences[0].tolist()
               for p in prompts]  # the corpus holds the target's answers to prompts 1 and 3: α differs by fraction
    rig.docs = [[0, 5, 9, 0, 5], answers[0], [7, 8, 9, 10], answers[2]]
    result, command = rig.run(monkeypatch, tmp_path, ["curve", "--prompt-set", "input-grounded", "--prompts", "3",
                                                      "--fractions", "0,0.5,1", "--max-new-tokens", str(n_new),
                                                      "--gamma", str(gamma)])
    assert "input-grounded" in rig.asked and not any(name.startswith("tuning") for name in rig.asked)
    assert result["prompts"] == 3 and result["prompt_set"] == "input-grounded" and result["gamma"] == gamma
    assert result["max_new_tokens"] == n_new
    assert [row["fraction"] for row in result["rows"]] == fractions
    for row, f in zip(result["rows"], fractions):
        docs = rig.docs[: round(f * len(rig.docs))]
        assert row["corpus_tokens"] == sum(map(len, docs))
        base = [base_seconds(p[0].tolist()) for p in prompts]
        mine = [SuffixEvalRig.seconds(("fraction", f), p[0].tolist()) for p in prompts]
        assert row["speedup"] == pytest.approx(sum(base) / sum(mine))
        assert row["speedup_median_per_prompt"] == pytest.approx(statistics.median(b / m for b, m in zip(base, mine)))
        index = CorpusIndex()
        index.add_many(docs)
        runs = [speculative_generate(target, SuffixDrafter(index), p, max_new_tokens=n_new, gamma=gamma,
                                     eos_token_id=VOCAB - 1).stats for p in prompts]
        accepted, judged = sum(s.accepted for s in runs), sum(s.accepted + s.rejected_rounds for s in runs)
        assert row["alpha"] == pytest.approx(accepted / judged) if judged else row["alpha"] != row["alpha"]
        assert row["tau"] == pytest.approx(sum(s.new_tokens for s in runs) / sum(s.rounds for s in runs))
    assert len({row["alpha"] for row in result["rows"][1:]}) == 2  # the toy corpus makes a difference
    check_provenance(result, command)


def test_suffix_eval_tune_splits_the_tuning_prompts(monkeypatch, tmp_path, target):
    """``tune``: the settings "γ/min_prob/spec_factor" reach the drafter as given, only tuning prompts are run, and
    each part's speedup is target-only seconds / the setting's seconds over that part's prompts only (input-grounded
    first, then open chat)."""
    rig = SuffixEvalRig(monkeypatch, target)
    result, command = rig.run(monkeypatch, tmp_path, ["tune", "--settings", "4/0.1/1,2/0.5/2", "--max-new-tokens", "5"])
    assert rig.asked and all(name.startswith("tuning-") for name in rig.asked)
    from specdec_edu.commands.bench import eval_prompts

    parts = {part: [fake_ids(p)[0].tolist() for p in eval_prompts(f"tuning-{part.replace('_', '-')}")[:3]]
             for part in ("input_grounded", "open_chat")}
    assert [row["setting"] for row in result["rows"]] == ["4/0.1/1", "2/0.5/2"]
    for row, (gamma, min_prob, spec) in zip(result["rows"], [(4, 0.1, 1.0), (2, 0.5, 2.0)]):
        assert (row["gamma"], row["min_prob"], row["spec_factor"]) == (gamma, min_prob, spec)
        for part, prompts in parts.items():
            base = sum(base_seconds(p) for p in prompts)
            mine = sum(SuffixEvalRig.seconds(("setting", gamma, min_prob, spec), p) for p in prompts)
            assert row[f"speedup_{part}"] == pytest.approx(base / mine)
    check_provenance(result, command)


def test_suffix_eval_sweep_rows_and_best(monkeypatch, tmp_path, target):
    """``sweep``: one row per (prompt_lookup_num_tokens, max_matching_ngram_size), tok/s = new tokens / seconds over
    the tuning input-grounded prompts, HF's output compared with ours, and "best" the fastest row."""
    rig = SuffixEvalRig(monkeypatch, target)
    clock = iter([2.0, 1.0, 4.0, 0.5, 3.0, 1.5, 2.5, 1.0, 3.5, 0.25, 2.0, 1.0] * 4)
    monkeypatch.setattr(rig.mod, "timed", lambda fn, device: (fn(), next(clock)))
    hf_calls, real_hf = [], rig.mod._hf_generate

    def spy_hf(target, ids, n, eos, **kw):
        hf_calls.append((n, kw))
        return real_hf(target, ids, n, eos, **kw)

    monkeypatch.setattr(rig.mod, "_hf_generate", spy_hf)
    result, command = rig.run(monkeypatch, tmp_path, ["sweep", "--tokens", "2,5", "--ngrams", "1,3",
                                                      "--max-new-tokens", "6"])
    assert set(rig.asked) == {"tuning-input-grounded"}
    from specdec_edu.commands.bench import _hf_generate, eval_prompts

    prompts = [fake_ids(p) for p in eval_prompts("tuning-input-grounded")[:3]]
    seconds = iter([2.0, 1.0, 4.0, 0.5, 3.0, 1.5, 2.5, 1.0, 3.5, 0.25, 2.0, 1.0] * 4)
    rows = []
    for t in (2, 5):
        for g in (1, 3):
            outs = [_hf_generate(target, p, 6, VOCAB - 1, prompt_lookup_num_tokens=t, max_matching_ngram_size=g)
                    for p in prompts]
            secs = [next(seconds) for _ in prompts]
            rows.append((t, g, sum(map(len, outs)) / sum(secs)))
    assert [(r["prompt_lookup_num_tokens"], r["max_matching_ngram_size"]) for r in result["rows"]] == [r[:2] for r in rows]
    assert [r["tok_s"] for r in result["rows"]] == pytest.approx([r[2] for r in rows])
    timed_calls = [kw for n, kw in hf_calls if kw]  # the warm-up passes no setting
    assert timed_calls == [{"prompt_lookup_num_tokens": t, "max_matching_ngram_size": g}
                           for t in (2, 5) for g in (1, 3) for _ in prompts]
    assert all(n == 6 for n, kw in hf_calls if kw)
    assert all(r["identical"] for r in result["rows"])  # greedy: HF's prompt lookup reproduces the target's answer
    best = max(rows, key=lambda r: r[2])
    assert result["best"] == {"prompt_lookup_num_tokens": best[0], "max_matching_ngram_size": best[1]}
    check_provenance(result, command)


def parsed(main, argv, monkeypatch):
    """The arguments ``main(argv)`` parses (it is stopped right after parsing)."""
    import argparse

    seen, real = {}, argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        seen["args"] = real(self, args, namespace)
        raise SystemExit(0)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(SystemExit):
            main(argv)
    return seen["args"]


def test_suffix_eval_defaults_match_the_docstring(monkeypatch):
    """The defaults the module docstrings and the committed command lines rely on (suffix_budget: 1M tokens, one
    torch thread)."""
    args = parsed(load_script("suffix_budget").main, ["--out", "x.json"], monkeypatch)
    assert args.tokens == 1_000_000 and args.threads == 1
    args = parsed(load_script("suffix_eval").main, ["curve", "--out", "x.json"], monkeypatch)
    assert args.prompt_set == "open-chat" and args.prompts == 8 and args.gamma == 8 and args.max_new_tokens == 64
    assert args.fractions[0] == 0.0 and args.fractions[-1] == 1.0  # 0: the request alone; 1: the whole corpus


@pytest.mark.parametrize("script, argv, says", [
    ("suffix_budget", ["--out", "x.json", "--threads", "0"], "argument --threads: 0 is not a whole number >= 1"),
    ("suffix_budget", ["--out", "x.json", "--tokens", "0"], "argument --tokens: 0 is not a whole number >= 1"),
    ("suffix_eval", ["sweep", "--out", "x.json", "--gamma", "0"], "argument --gamma: 0 is not a whole number >= 1"),
    ("suffix_eval", ["sweep", "--out", "x.json", "--prompts", "-1"], "argument --prompts: -1 is not a whole number"),
    ("compile_cost", ["--pair", "foo"], "argument --pair: invalid choice: 'foo'"),
])
def test_the_scripts_refuse_a_bad_count_or_pair_as_they_parse(script, argv, says, capsys):
    """Before: --threads 0 was a raw set_num_threads error, --tokens 0 measured an empty corpus in silence, γ 0 failed
    after the models loaded, and an unknown pair was a ValueError traceback."""
    with pytest.raises(SystemExit) as exit_:
        load_script(script).main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


# ---- scripts/suffix_budget.py ------------------------------------------------------------------------------


def test_million_tokens_copies_with_shifted_ids():
    """Copy k of every answer, ids shifted by k · 7919 mod the vocabulary, until just ``total`` tokens or more."""
    mod = load_script("suffix_budget")
    answers = [np.array([1, 2, 3], dtype=np.int32), np.array([49151, 0], dtype=np.int32)]
    docs = mod.million_tokens(answers, total=12)
    expected = [[1, 2, 3], [49151, 0]]
    for k in (1, 2):
        expected += [[(t + k * 7919) % 49152 for t in a] for a in ([1, 2, 3], [49151, 0])]
    assert [d.tolist() for d in docs] == expected[:5]  # 3 + 2 + 3 + 2 + 3 = 13 >= 12: stops there
    assert all(d.dtype == np.int32 for d in docs)
    three = [*answers, np.array([7], dtype=np.int32)]
    assert [d.tolist() for d in mod.million_tokens(three, total=5)] == [[1, 2, 3], [49151, 0]]  # 5 reached: stop


def test_time_propose_times_the_second_half_of_each_context():
    mod = load_script("suffix_budget")
    lengths = []

    class Drafter:
        def reset(self):
            lengths.append("reset")

        def propose(self, context, gamma):
            lengths.append((len(context), gamma))

    times = mod.time_propose(Drafter(), [list(range(7)), list(range(4))], gamma=3)
    assert lengths == ["reset", (3, 3), (4, 3), (5, 3), (6, 3), "reset", (2, 3), (3, 3)]
    assert len(times) == 6 and all(t >= 0 for t in times)


def test_suffix_budget_figures(monkeypatch, tmp_path):
    """main(): with a fake clock (every interval 1 ms) and a fake target step (50 ms), every derived figure has a
    known value: build 1 ms, add 1 ms / 200 answers, propose medians 1000 µs, c = 1 ms / 50 ms = 0.02 (over the
    0.01 budget); tokens and documents are those of million_tokens; provenance and main's command are recorded.
    Loaded without scripts/ on the path: it imported suffix_eval only after measuring, and from scripts/ alone."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != SCRIPTS])
    monkeypatch.delitem(sys.modules, "suffix_eval", raising=False)
    mod = load_script("suffix_budget")
    rng = np.random.default_rng(0)
    answers = [rng.integers(0, 200, size=n).astype(np.int32) for n in rng.integers(20, 120, size=220)]
    ticks = iter(range(10**7))
    monkeypatch.setattr(mod, "tracemalloc", SimpleNamespace(start=lambda: None, stop=lambda: None,
                                                            get_traced_memory=lambda: (1_000_000, 3_000_000)))
    monkeypatch.setattr(mod, "corpus_answers", lambda folder: answers)
    monkeypatch.setattr(mod, "time", SimpleNamespace(perf_counter=lambda: next(ticks) / 1000))
    import specdec_edu.course.measure as measure
    import specdec_edu.models.embedded as embedded

    steps = []
    monkeypatch.setattr(measure, "forward_seconds", lambda model, n, **kw: steps.append((n, kw)) or 0.05)
    monkeypatch.setattr(embedded, "load_embedded_target", lambda device=None: "target")
    monkeypatch.setattr(embedded, "load_embedded_tokenizer",
                        lambda: lambda text, add_special_tokens=True: SimpleNamespace(input_ids=[1000 + ord(c) for c in text]))
    seen_ctx = [a.tolist()[:96] for a in answers[:6]]

    def time_propose(drafter, contexts, gamma=8):  # seen contexts: 2, 4, 3 ms; novel ones (text): 0.5 ms each
        assert isinstance(drafter, mod.SuffixDrafter) and drafter.corpus.size > 0
        if contexts == seen_ctx:
            return [0.002, 0.004, 0.003] * 2
        assert contexts != seen_ctx[:1] and all(t >= 1000 for c in contexts for t in c), "novel: the fake tokenizer's ids"
        return [0.0005] * 5

    monkeypatch.setattr(mod, "time_propose", lambda d, c, gamma=8: [9.0] if c == seen_ctx[:1] else time_propose(d, c, gamma))
    out = tmp_path / "budget.json"
    argv = ["--out", str(out), "--tokens", "20000", "--threads", "2"]
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])  # a call from code: the command is main's arguments
    threads = torch.get_num_threads()
    try:
        mod.main(argv)
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    docs = mod.million_tokens(answers, 20000)
    assert result["tokens"] == sum(map(len, docs)) and result["documents"] == len(docs)
    assert result["build_peak_traced_mb"] == 3.0  # the peak, not the memory still held
    assert result["build_s"] == pytest.approx(0.001) and result["build_tokens_per_s"] == pytest.approx(result["tokens"] / 0.001)
    assert result["add_one_answer_ms"] == pytest.approx(1 / 200)
    assert result["save_s"] == pytest.approx(0.001) and result["load_s"] == pytest.approx(0.001)
    assert result["target_step_ms"] == pytest.approx(50) and steps[0][0] == 1  # one token appended: a decode step
    both = [0.002, 0.004, 0.003] * 2 + [0.0005] * 5  # the warm-up's 9 s counts nowhere
    assert result["propose_us_median_seen"] == pytest.approx(3000) and result["propose_us_median_novel"] == pytest.approx(500)
    assert result["propose_us_p90_all"] == pytest.approx(1e6 * float(np.percentile(both, 90)))
    assert result["c_propose_median"] == pytest.approx(statistics.median(both) / 0.05)  # 2 ms / 50 ms = 0.04
    assert result["budgets"] == {"index_mb <= 100": True, "build_s <= 10": True, "c <= 0.01": False}
    index = CorpusIndex()
    index.add_many(docs)
    for a in answers[:200]:
        index.add(a)
    assert result["index_mb"] == pytest.approx(index.nbytes / 1e6) and result["chunks"] == len(index.chunks)
    assert result["command"] == "python scripts/suffix_budget.py " + " ".join(argv)
    assert result["threads"] == 2 and set(result["versions"]) >= {"torch", "transformers"} and result["date"]


# ---- scripts/compile_cost.py -------------------------------------------------------------------------------


def test_compile_cost_records_the_target_and_the_draft(monkeypatch, tmp_path):
    """The target's figure is the target's static-cache compile, the draft's the draft's; the JSON names the pair,
    device, widths, date, versions and the whole command; torch.compile's cache is an empty folder while it compiles,
    removed afterwards, and the variable is set back (it was a folder left in /tmp by every run, set at import)."""
    import runpy

    import specdec_edu
    import specdec_edu.course.experiments as experiments
    from specdec_edu import kv

    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    made = []
    monkeypatch.setattr(specdec_edu, "load_pair", lambda pair, device=None: (target, draft, None))
    caches = []

    def shared_static_cache(model, n):
        cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        caches.append((cache, cache.is_dir() and not list(cache.iterdir())))
        made.append(("target", model, n))

    monkeypatch.setattr(kv, "shared_static_cache", shared_static_cache)
    monkeypatch.setattr(specdec_edu, "ModelDrafter",
                        lambda model, max_cache_len, compile: made.append(("draft", model, max_cache_len, compile)))
    monkeypatch.setattr(experiments, "timed", lambda fn, device: (fn(), {"target": 7.0, "draft": 3.0}[made[-1][0]]))
    out = tmp_path / "cost.json"
    monkeypatch.setattr(sys, "argv", ["compile_cost.py", "--json", str(out)])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(ROOT))  # a warm cache the script must not use
    runpy.run_path(str(SCRIPTS / "compile_cost.py"), run_name="__main__")
    (cache, empty), = caches
    assert cache != ROOT and empty and not cache.exists() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(ROOT)
    result = json.loads(out.read_text())
    assert made[0][1] is target and made[1][1] is draft and made[1][3] is True and made[0][2] == made[1][2] == 256
    assert result["target_seconds"] == 7.0 and result["draft_seconds"] == 3.0
    assert result["pair"] == "embedded" and result["device"] == "cpu" and result["widths"] == list(kv.WIDTHS)
    assert result["command"] == f"python scripts/compile_cost.py --json {out}"
    assert set(result["versions"]) == {"specdec_edu", "torch", "transformers", "python"} and result["date"]


# ---- scripts/draft_build -------------------------------------------------------------------------------------


def test_build_prompts_is_seeded_exact_and_held_out(draft_build):
    """n distinct prompts, the same for a seed and different for another, none a course or evaluation prompt, and
    every kind of prompt represented (shares of 58 % topics, 12 % code, ...)."""
    p = draft_build.prompts
    a, b, c = p.build_prompts(300, 7), p.build_prompts(300, 7), p.build_prompts(300, 8)
    assert a == b and a != c and len(a) == 300 and len(set(a)) == 300
    assert not set(a) & (set(p.COURSE_PROMPTS) | set(p.EVAL_PROMPTS))
    short = sum(x in p.SHORT_PROMPTS for x in a)
    code = sum(any(x == t.format(c=c) for t in p.CODE_TEMPLATES for c in p.CODE_TASKS) for x in a)
    assert short == round(0.02 * 300) and code >= round(0.06 * 300)
    assert len(p.build_prompts(5000, 1)) == 5000  # more than the small pools hold: topped up, still distinct
    assert len(set(p.build_prompts(5000, 1))) == 5000


def test_eval_prompts_are_not_course_prompts_tuned_on(draft_build):
    """The evaluation set holds new prompts beside the course's: at least a third of it is in no course prompt."""
    p = draft_build.prompts
    assert len(set(p.EVAL_PROMPTS)) == len(p.EVAL_PROMPTS)
    assert len(set(p.EVAL_PROMPTS) - set(p.COURSE_PROMPTS)) >= len(p.EVAL_PROMPTS) // 3


def test_predicted_speedups_use_verify_of_gamma_plus_one(draft_build):
    ev = draft_build.evaluate
    verify = {n: 10.0 + n for n in range(1, 9)}
    pred = ev.predicted_speedups(0.6, 0.1, verify)
    assert list(pred) == ["3", "4", "5", "6"]
    for g in (3, 4, 5, 6):
        assert pred[str(g)][0] == round(expected_speedup(0.6, g, 0.1), 3)
        assert pred[str(g)][1] == round(expected_speedup(0.6, g, 0.1, (10.0 + g + 1) / 11.0), 3)


def test_teacher_forced_alpha_matches_the_drafter_step_by_step(draft_build, target):
    """Greedy α per head size K, teacher-forced along the target's answers, equals what ``ModelDrafter(draft,
    head_size=K)`` proposes token by token: the hidden state at each answer position, argmax over the first K ids."""
    from specdec_edu import ModelDrafter

    draft = agreeing_copy(target)
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (6,), generator=gen)
        seqs.append((ids, autoregressive_generate(target, ids[None], max_new_tokens=7).row(0).tolist()))
    alpha, judged = draft_build.evaluate.teacher_forced_alpha(draft, seqs, [16, 40, VOCAB])
    assert judged == sum(len(a) for _, a in seqs)
    for k in (16, 40, VOCAB):
        drafter, hits = ModelDrafter(draft, head_size=k), 0
        for ids, answer in seqs:
            drafter.reset()
            logits = drafter.next_logits(ids)
            for token in answer:
                hits += int(logits[..., :k].argmax(-1).item() == token)
                logits = drafter.next_logits(torch.tensor([token]))
        assert alpha[k] == pytest.approx(hits / judged)
    assert alpha[VOCAB] > alpha[16]


def test_stage_eval_chooses_k_and_threads_from_the_measurements(draft_build, monkeypatch, target):
    """stage_eval: coverage = the share of answer tokens below K, the thread setting with the fastest target is the
    one whose predictions choose K and γ, and K and γ maximise the prediction with the measured verify cost."""
    ev = draft_build.evaluate
    draft = agreeing_copy(target)
    answers = [(ids, autoregressive_generate(target, ids[None], max_new_tokens=8).row(0).tolist())
               for ids in (torch.tensor([1, 2, 3]), torch.tensor([4, 5]))]  # the target's answers: α well above 0
    tokens = [t for _, a in answers for t in a]
    k_a, k_b = min(t for t in tokens if t > 1), max(t for t in tokens if t < VOCAB)  # K equal to an answer token
    assert 1 < k_a < k_b < VOCAB
    monkeypatch.setattr(ev, "load_target", lambda path: (target, None))
    monkeypatch.setattr(ev, "load_causal_lm", lambda path, dtype: draft)
    monkeypatch.setattr(ev, "greedy_answers", lambda target, tok, prompts, n_new: answers)
    timings = {1: 12.0, 2: 20.0}  # 1 thread: the faster target (not the last setting measured)

    def time_models(target, draft, seqs, head_sizes, repeats):
        t = timings[torch.get_num_threads()]
        return {"target_ms": t, "verify_ms": {n: t * (1 + 0.5 * (n - 1)) for n in range(1, 9)},
                "draft_ms": {k: t * k / 1000 for k in head_sizes}, "draft_full_hf_ms": 1.0}

    e2e = []
    monkeypatch.setattr(ev, "time_models", time_models)
    monkeypatch.setattr(ev, "end_to_end", lambda *a: e2e.append((*a, torch.get_num_threads())) or {})
    args = SimpleNamespace(target="t", out="d", eval_prompts=2, eval_tokens=5, timing_threads="1,2",
                           k_candidates=[k_a, k_b, 64, 100], timing_prompts=1, verify_reps=1, e2e_prompts=2, e2e_gammas=[4])
    threads = torch.get_num_threads()
    try:
        res = ev.stage_eval(args, lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    assert res["coverage"] == {str(k): round(sum(t < k for t in tokens) / len(tokens), 4) for k in (k_a, k_b, 64)}
    assert set(res["alpha"]) == {str(k_a), str(k_b), "64"}  # candidates above the vocabulary are dropped; the full head is 64
    assert res["choice_threads"] == 1 and res["e2e_threads"] == 1
    alpha, _ = ev.teacher_forced_alpha(draft, answers, [k_a, k_b, 64])
    verify = {n: 12.0 * (1 + 0.5 * (n - 1)) for n in range(1, 9)}
    best = max(((k, g) for k in (k_a, k_b, 64) for g in range(3, 7)),
               key=lambda kg: round(expected_speedup(alpha[kg[0]], kg[1], kg[0] / 1000, verify[kg[1] + 1] / verify[1]), 3))
    leviathan = max(((k, g) for k in (k_a, k_b, 64) for g in range(3, 7)),
                    key=lambda kg: round(expected_speedup(alpha[kg[0]], kg[1], kg[0] / 1000), 3))
    assert leviathan != best  # the measured verify cost changes the choice here
    assert (res["k_final"], res["gamma_best"]) == best
    assert e2e and e2e[0][3] == best[0] and e2e[0][4] == [4] and e2e[0][-1] == 1  # run on the chosen threads
    assert res["timing"]["1"]["c"][str(k_b)] == pytest.approx(k_b / 1000)


def test_write_card_marks_the_chosen_k(draft_build, tmp_path):
    """The card's table marks the K the evaluation chose (not the training K), and predicts with that K's α and c."""
    args = SimpleNamespace(k_train=8, timing_threads="1,2", quick=False, width=64, layers=2, heads=4, kv_heads=2,
                           ffn=128, n_prompts=10, seed=0, max_new=8, greedy_frac=0.5, temperature=0.8, topk=4,
                           w_soft=1.0, w_hard=0.5, lr=1e-3, batch_tokens=100, epochs=1, k_candidates=[8, 16],
                           e2e_prompts=2)
    ev = {"k_final": 16, "prompts": ["a", "b"], "n_new": 8, "alpha": {"8": 0.4, "16": 0.55}, "coverage": {"8": 0.7, "16": 0.8},
          "timing": {"1": {"target_ms": 20.0, "verify_ms": {"1": 20.0}, "draft_ms": {"8": 1.0, "16": 2.0},
                           "draft_full_hf_ms": 3.0, "c": {"8": 0.05, "16": 0.1},
                           "pred": {"16": {"3": [1.5, 1.4]}, "8": {"3": [1.2, 1.1]}}}}}
    draft_build.card.write_card(args, tmp_path, {"eval": ev, "train": {}})
    card = (tmp_path / "DRAFT_CARD.md").read_text()
    assert "| 16 (chosen) | 0.550 | 0.800 | 2.00 | 0.1000 |" in card and "| 8 | 0.400 |" in card
    assert "with K = 16 (α = 0.550, c = 0.1000)" in card and "| 3 | 1.50× | 1.40× |" in card
    assert "torch.set_num_threads(1)" in card
    assert "a PCA of the target's 576-d embeddings" not in card and "regression" not in card  # args without init, w_mse
    args.init, args.w_mse = "hidden-pca", 1.0  # build_draft's defaults: the card names the recipe that ran
    draft_build.card.write_card(args, tmp_path, {"eval": ev, "train": {}})
    card = (tmp_path / "DRAFT_CARD.md").read_text()
    assert "principal directions of the target's final hidden states" in card
    assert "+ 1.0 x a regression of the draft's final hidden state on the target's" in card


# ---- scripts/feature_data.py ---------------------------------------------------------------------------------


def test_batches_of_groups_by_length_and_covers_every_prompt():
    mod = load_script("feature_data")
    prompts = [[0] * n for n in (5, 1, 3, 1, 4, 2, 5)]
    batches = mod.batches_of(prompts, 3)
    assert batches == [[1, 3, 5], [2, 4, 0], [6]]
    assert sorted(i for b in batches for i in b) == list(range(len(prompts)))


def test_answer_batch_left_pads_and_cuts_at_eos(target):
    """Each row's answer is what the target answers to that prompt alone (left padding, masked), cut just after EOS."""
    mod = load_script("feature_data")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (4, 7, 2)]
    alone = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=6).row(0).tolist() for p in prompts]
    eos = alone[1][2]  # a token the second answer makes: that answer stops there, EOS included
    answers = mod.answer_batch(target, prompts, pad_id=0, eos_id=eos, max_new=6, sample=False, temperature=0.7, seed=0)
    for got, full in zip(answers, alone):
        end = full.index(eos) + 1 if eos in full else len(full)
        assert got == full[:end]


def test_end_to_end_speedup_is_target_time_over_speculative_time(draft_build, monkeypatch, target):
    """end_to_end: speed-up = pooled target-alone seconds / pooled speculative seconds (a fake clock sets both),
    "identical" counts rows equal to the target's, α and τ pooled over the prompts, c and the verify cost in units
    of the target-alone forward."""
    ev = draft_build.evaluate
    draft = agreeing_copy(target)
    gen = torch.Generator().manual_seed(1)
    seqs = [(torch.randint(3, VOCAB, (n,), generator=gen), []) for n in (5, 8)]
    runs = {"base": [], "spec": []}

    def fake_clock(kind, fn):
        def wrapped(*a, **kw):
            out = fn(*a, **kw)
            i = len(runs[kind])
            out.stats.seconds = (2.0 + i) if kind == "base" else (0.5 + 0.25 * i)
            out.stats.draft_seconds, out.stats.verify_seconds = 0.01 * out.stats.drafted, 0.3 * out.stats.rounds
            if kind == "base":
                out.stats.verify_seconds = 0.2 * out.stats.rounds
            elif i == 1:  # the second speculative answer made wrong in its last token: counted as not identical
                out.sequences[0, -1] = (out.sequences[0, -1] + 1) % VOCAB
            runs[kind].append(out)
            return out
        return wrapped

    monkeypatch.setattr(ev, "autoregressive_generate", fake_clock("base", autoregressive_generate))
    monkeypatch.setattr(ev, "speculative_generate", fake_clock("spec", speculative_generate))
    res = ev.end_to_end(target, draft, seqs, 48, [3], n_new=6)["3"]
    spec = runs["spec"]
    assert res["speedup"] == round((2.0 + 3.0) / (0.5 + 0.75), 3)
    assert res["identical"] == "1/2"
    accepted = sum(s.stats.accepted for s in spec)
    judged = accepted + sum(s.stats.rejected_rounds for s in spec)
    assert res["alpha"] == round(accepted / judged, 4)
    assert res["tokens_per_round"] == round(sum(s.stats.new_tokens for s in spec) / sum(s.stats.rounds for s in spec), 3)
    assert res["c"] == round(0.01 / 0.2, 4) and res["verify_cost"] == round(0.3 / 0.2, 3)


@pytest.mark.embedded
def test_build_prompts_still_makes_the_committed_corpus_prompts():
    """assets/feature_data was answered for ``build_prompts(meta's n_prompts, seed)``, batched by ``batches_of``: every
    shard's prompts are still those (chat-formatted, embedded tokenizer). If build_prompts changed, the held-out
    checks (tests/test_suffix.py) would be checking a list that is not the corpus's."""
    from specdec_edu.models.embedded import load_embedded_tokenizer

    sys.path.insert(0, str(SCRIPTS))
    try:
        from draft_build.prompts import build_prompts
    finally:
        sys.path.remove(str(SCRIPTS))
    mod = load_script("feature_data")
    meta = json.loads((ROOT / "assets" / "feature_data" / "meta.json").read_text())
    tokenizer = load_embedded_tokenizer()
    prompts = [mod.chat_ids(tokenizer, t) for t in build_prompts(meta["n_prompts"], meta["seed"])]
    batches = mod.batches_of(prompts, meta["batch_size"])
    for shard in sorted((ROOT / "assets" / "feature_data").glob("answers_*.npz"))[::7]:
        b = int(shard.stem.split("_")[1])
        with np.load(shard) as f:
            tokens, lengths, prompt_lengths, index = f["tokens"], f["lengths"], f["prompt_lengths"], f["prompt_index"]
            assert bool(f["sampled"]) == (b % 3 == 2)  # two batches in three greedy, the third sampled
        assert index.tolist() == batches[b]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for s, p, i in zip(starts, prompt_lengths, index):
            assert tokens[s: s + p].tolist() == prompts[i]


def test_text_shards_hold_prompt_then_cut_answer_then_eos(monkeypatch, tmp_path, char_tokenizer):
    """--text: each docstring is the answer to "Explain what `name` does.", cut at max_answer tokens, then EOS;
    per_shard sequences a shard, indices continuing across shards, and a shard that exists is kept as it is."""
    mod = load_script("feature_data")
    pairs = [(f"mod.f{i}", "word " * (3 + i)) for i in range(5)]
    monkeypatch.setattr(mod, "stdlib_docstrings", lambda n, seed: pairs[:n])
    (tmp_path / "text_0002.npz").write_bytes(b"kept")
    mod.text_shards(char_tokenizer, tmp_path, 5, seed=0, max_answer=12, per_shard=2)
    assert (tmp_path / "text_0002.npz").read_bytes() == b"kept" and not list(tmp_path.glob("*.tmp.npz"))
    eos = char_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for s in (0, 1):
        with np.load(tmp_path / f"text_{s:04d}.npz") as f:
            starts = np.concatenate([[0], np.cumsum(f["lengths"])[:-1]])
            assert f["prompt_index"].tolist() == [2 * s, 2 * s + 1] and not bool(f["sampled"])
            for start, n, p, i in zip(starts, f["lengths"], f["prompt_lengths"], f["prompt_index"]):
                name, doc = pairs[i]
                prompt = mod.chat_ids(char_tokenizer, f"Explain what `{name}` does.")
                answer = char_tokenizer(" ".join(doc.split()), add_special_tokens=False).input_ids[:12] + [eos]
                assert p == len(prompt) and f["tokens"][start: start + n].tolist() == prompt + answer


def test_tuning_prompts_are_not_evaluation_prompts():
    """assets/eval/prompts.json: settings are chosen on the tuning prompts (suffix_eval.py sweep and tune) and judged on
    the others, so no tuning prompt is, or shares a 5-word run with, an evaluation prompt (the 8-gram test of
    tests/test_suffix.py compares both with the corpus, not with each other)."""
    from specdec_edu.commands.bench import eval_prompts, reworded_originals

    tuning = eval_prompts("tuning-input-grounded") + eval_prompts("tuning-open-chat")
    judged = eval_prompts("open-chat") + eval_prompts("input-grounded") + eval_prompts("reworded")
    judged += reworded_originals()

    def runs(text, n=5):
        words = text.lower().split()
        return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}

    assert tuning and not set(tuning) & set(judged)
    assert not [t[:40] for t in tuning for e in judged if runs(t) & runs(e)]


def test_the_docstrings_give_the_commands_that_made_the_committed_files():
    """Each ``python scripts/...`` line of suffix_eval's and suffix_budget's docstrings that writes a committed file
    is the command that file records: the docstring is how a reader makes the file again (suffix_eval's gave sweep
    and curve without the options they ran with, and no tune)."""
    for name in ("suffix_eval", "suffix_budget"):
        doc = load_script(name).__doc__.replace("\\\n", " ")
        commands = [" ".join(line.split()) for line in doc.splitlines() if line.strip().startswith("python scripts/")]
        assert commands, name
        for command in commands:
            out = re.search(r"--out (assets/results/\S+)", command).group(1)
            assert json.loads((ROOT / out).read_text())["command"] == command, (name, command)


# ---- scripts/draft_build: stage 1 (data.py), stage 2 and 3 (train.py), and scripts/build_draft.py ------------------
# No test runs them at full size (hours); these run each stage at toy size: synthetic teacher data or a tiny random
# Llama with the draft's hard-coded 49,152-token vocabulary, written to tmp_path, never to the model cache or assets/.

DRAFT_VOCAB = 49152  # make_draft's vocabulary (SmolLM2's); the toy target matches it so its embeddings can seed the draft


@pytest.fixture
def stages(draft_build):
    """``draft_build.data`` and ``draft_build.train`` (stage 1; stages 2 and 3)."""
    import draft_build.data
    import draft_build.train

    return draft_build


@pytest.fixture(scope="module")
def toy_target(tmp_path_factory, char_tokenizer):
    """A plain HF directory like the embedded target's: a tiny random Llama with the full 49,152-token vocabulary
    (hidden size 16), the character tokenizer with its chat template, and a generation_config.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("toy_target")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=DRAFT_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, bos_token_id=1,
                         eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    assert (path / "generation_config.json").exists()
    return path


def teacher_examples(n, seed, vocab=64, topk=6, hid_dim=None, prompt_len=(3, 8), gen_len=(2, 7)):
    """n synthetic answers in the shape stage 1 records (``gen``, top-k ``tk_ids`` / ``tk_val`` fp16 logits and the
    log-normaliser ``lse``, optionally ``hid``) plus the ``prompt`` that load_data adds. The top-k hold only part of
    the mass (lse > logsumexp of the top-k), so that a log-probability is ``tk_val - lse``, not a renormalised one;
    ``len`` as stage_train sets it."""
    rng = np.random.default_rng(seed)
    exs = []
    for i in range(n):
        n_p, n_g = int(rng.integers(*prompt_len)), int(rng.integers(*gen_len))
        val = np.ascontiguousarray(np.sort(2 * rng.normal(size=(n_g, topk)), axis=1)[:, ::-1]).astype(np.float16)
        ids = np.stack([rng.choice(vocab, topk, replace=False) for _ in range(n_g)]).astype(np.uint16)
        lse = (np.log(np.exp(val.astype(np.float64)).sum(1)) + rng.uniform(0.1, 1.0, n_g)).astype(np.float32)
        e = {"prompt": rng.integers(3, vocab, n_p).astype(np.int32), "gen": ids[:, 0].astype(np.int32),
             "tk_ids": ids, "tk_val": val, "lse": lse, "greedy": i % 3 != 2, "prompt_idx": i, "len": n_p + n_g - 1}
        if hid_dim:
            e["hid"] = rng.normal(size=(n_g, hid_dim)).astype(np.float16)
        exs.append(e)
    return exs


def test_collate_shifts_the_answer_and_takes_log_probabilities(stages):
    """collate: row j's input is prompt + answer[:-1] (EOS-padded), and the scored positions are n_p-1 ... n_p-1+n_g-1,
    so that position n_p-1+t (whose input is the token before answer token t) predicts answer token t; the rows of
    tk_ids / tk_lp follow x[lm] in row-major order, cut to top-k, with log-probabilities tk_val - lse; ``hid`` only
    when every example has one. An off-by-one here trains the draft to predict the token it reads."""
    train, eos = stages.train, stages.data.EOS_ID
    exs = teacher_examples(3, seed=0, hid_dim=4)
    idx = [2, 0]
    batch = train.collate(exs, idx, 4)
    T = max(len(exs[i]["prompt"]) + len(exs[i]["gen"]) - 1 for i in idx)
    assert batch["x"].shape == batch["lm"].shape == (2, T)
    for j, i in enumerate(idx):
        e = exs[i]
        n_p, n_g = len(e["prompt"]), len(e["gen"])
        seq = e["prompt"].tolist() + e["gen"][:-1].tolist()
        assert batch["x"][j, : len(seq)].tolist() == seq and (batch["x"][j, len(seq):] == eos).all()
        scored = batch["lm"][j].nonzero().squeeze(1).tolist()
        assert scored == list(range(n_p - 1, n_p - 1 + n_g))
        assert [seq[p] for p in scored] == [e["prompt"][-1]] + e["gen"][:-1].tolist()
    ids = np.concatenate([exs[i]["tk_ids"][:, :4] for i in idx]).astype(np.int64)
    lp = np.concatenate([exs[i]["tk_val"][:, :4].astype(np.float64) - exs[i]["lse"][:, None] for i in idx])
    assert batch["tk_ids"].tolist() == ids.tolist() and len(ids) == batch["lm"].sum()
    assert np.allclose(batch["tk_lp"].numpy(), lp, atol=1e-5)
    assert (batch["tk_lp"].exp().sum(1) < 1).all()  # true log-probabilities: the top-4 hold part of the mass
    assert torch.equal(batch["hid"], torch.from_numpy(np.concatenate([exs[i]["hid"] for i in idx])).float())
    del exs[0]["hid"]
    assert "hid" not in train.collate(exs, idx, 4)


def test_make_batches_packs_the_token_budget_and_covers_every_example_once(stages):
    """make_batches: every example exactly once; each batch's padded size (longest x count) is at most the budget
    and as large as it can be in length order (eight of length 4 under a budget of 16 make two batches of four);
    batches hold neighbouring lengths; their order is shuffled by the seeded rng."""
    train = stages.train
    assert sorted(map(len, train.make_batches([{"len": 4}] * 8, 16, random.Random(0)))) == [4, 4]
    lens = [int(v) for v in np.random.default_rng(0).integers(1, 12, 60)]
    exs = [{"len": v} for v in lens]
    batches = train.make_batches(exs, 24, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(len(exs)))
    assert all(max(lens[i] for i in b) * len(b) <= 24 for b in batches)
    by_length = sorted(batches, key=lambda b: (min(lens[i] for i in b), max(lens[i] for i in b), -len(b)))
    for a, b in zip(by_length, by_length[1:]):
        assert max(lens[i] for i in a) <= min(lens[i] for i in b)  # neighbouring lengths
        assert max(lens[i] for i in a + b[:1]) * (len(a) + 1) > 24  # the next one would not have fitted
    assert batches == train.make_batches(exs, 24, random.Random(0))
    assert batches != by_length and batches != train.make_batches(exs, 24, random.Random(1))


def hand_distill(model, batch, K, cand=None):
    """distill_loss's soft / hard / agreement, one position at a time in float64, over the scored ids ``cand``
    (default: all of 0 ... K-1). soft and hard are averaged over every answer position, 0 where the teacher has
    nothing below K (soft) or its argmax is not below K (hard)."""
    cand = list(range(K)) if cand is None else cand
    col = {t: c for c, t in enumerate(cand)}
    with torch.no_grad():
        hs = model.get_decoder()(input_ids=batch["x"]).last_hidden_state[batch["lm"]].double()
        logq = (hs @ model.get_output_embeddings().weight[cand].double().T).log_softmax(-1)
    soft, hard, agree = [], [], []
    for r in range(len(hs)):
        ids, p = batch["tk_ids"][r].tolist(), batch["tk_lp"][r].double().exp()
        keep = [c for c, t in enumerate(ids) if t < K]
        w = p[keep] / p[keep].sum() if keep else p[:0]
        soft.append(-(w * logq[r, [col[ids[c]] for c in keep]]).sum().item())
        hard.append(-logq[r, col[ids[0]]].item() if ids[0] < K else 0.0)
        agree.append(float(ids[0] < K and logq[r].argmax().item() == col[ids[0]]))
    return float(np.mean(soft)), float(np.mean(hard)), agree


def test_distill_loss_matches_a_position_by_position_computation(stages):
    """distill_loss without sampling: soft = cross-entropy to the teacher's top-k renormalised over the ids below K,
    hard = cross-entropy on the teacher's argmax where it is below K, weighted w_soft / w_hard, averaged over every
    answer position; the agreement is the draft's argmax over the first K ids = the teacher's argmax, and is 0 where
    the teacher's argmax is not below K even when the draft picks id K-1 (the id such an argmax is clamped to)."""
    train = stages.train
    model = tiny_llama(seed=3, hidden=32)
    exs = teacher_examples(4, seed=1, topk=6)
    batch = train.collate(exs, [0, 1, 2, 3], 6)
    K = 40
    soft, hard, agree = hand_distill(model, batch, K)
    ok = batch["tk_ids"][:, 0] < K
    assert 0 < ok.sum() < len(ok)  # both kinds of position are present
    for ws, wh in ((1.0, 0.0), (0.0, 1.0), (2.0, 3.0)):
        loss, got = train.distill_loss(model, batch, K, ws, wh)
        assert loss.item() == pytest.approx(ws * soft + wh * hard, rel=1e-4)
    assert got.tolist() == agree
    # the clamp trap: row 0's teacher argmax is out of K, and the draft's argmax over the first K ids is K - 1
    with torch.no_grad():
        h0 = model.get_decoder()(input_ids=batch["x"]).last_hidden_state[batch["lm"]][0]
        k = int(model.get_output_embeddings()(h0)[:K].argmax()) + 1
    batch["tk_ids"][0, 0] = VOCAB - 1
    _, got = train.distill_loss(model, batch, k, 1.0, 1.0)
    assert got[0] == 0 and got.tolist() == hand_distill(model, batch, k)[2]


def test_distill_loss_head_sample_scores_the_teacher_ids_plus_random_ones(stages):
    """head_sample > 0: the softmax runs over the sorted, de-duplicated set {teacher ids below K} + head_sample ids
    drawn from ``gen``; with so many draws that every id below K is drawn, it equals the full loss."""
    train = stages.train
    model = tiny_llama(seed=3, hidden=32)
    batch = train.collate(teacher_examples(4, seed=1, topk=6), [0, 1, 2, 3], 6)
    K = 40
    loss, agree = train.distill_loss(model, batch, K, 1.0, 1.0, head_sample=7, gen=torch.Generator().manual_seed(5))
    tk = batch["tk_ids"]
    drawn = torch.randint(0, K, (7,), generator=torch.Generator().manual_seed(5))
    cand = sorted(set(tk[tk < K].tolist()) | set(drawn.tolist()))
    assert len(cand) < K
    soft, hard, want = hand_distill(model, batch, K, cand)
    assert loss.item() == pytest.approx(soft + hard, rel=1e-4) and agree.tolist() == want
    full, full_agree = train.distill_loss(model, batch, K, 1.0, 1.0)
    every, every_agree = train.distill_loss(model, batch, K, 1.0, 1.0, head_sample=3000,
                                            gen=torch.Generator().manual_seed(0))
    assert every.item() == pytest.approx(full.item(), rel=1e-5) and torch.equal(every_agree, full_agree)


def test_hidden_basis_and_the_mse_term_cost_1_for_predicting_zeros(stages):
    """hidden_basis: the top-``width`` eigenvectors (uncentred) of the target's hidden states, largest first, with
    their eigenvalues; examples without ``hid`` are skipped, none at all gives None. distill_loss's mse term is
    mean((h - hid @ V)^2) / mean(ev): a draft whose states are all 0 would pay exactly 1 on the basis' own rows."""
    train = stages.train
    exs = teacher_examples(6, seed=2, hid_dim=40, gen_len=(20, 30))
    exs[1] = {k: v for k, v in exs[1].items() if k != "hid"}
    assert train.hidden_basis([exs[1]], 8, seed=0) is None
    V, ev = train.hidden_basis(exs, 32, seed=0)
    H = np.concatenate([e["hid"] for e in exs if "hid" in e]).astype(np.float64)
    lam, vec = np.linalg.eigh(H.T @ H / len(H))
    assert V.shape == (40, 32) and ev.shape == (32,)
    assert np.allclose(ev.numpy(), lam[::-1][:32], rtol=1e-4)
    assert np.allclose(V.T.double() @ V.double(), np.eye(32), atol=1e-4)
    top = vec[:, ::-1][:, :32]
    assert np.allclose(V.double().numpy() @ V.double().numpy().T, top @ top.T, atol=1e-3)  # the same subspace
    z = torch.from_numpy(H).float() @ V
    assert ((z ** 2).mean() / ev.mean()).item() == pytest.approx(1.0, rel=1e-4)  # predicting zeros costs 1
    model = tiny_llama(seed=3, hidden=32)
    batch = train.collate(exs, [0, 2, 3], 6)
    loss, _ = train.distill_loss(model, batch, 40, 0.0, 0.0, w_mse=2.0, basis=(V, ev))
    with torch.no_grad():
        hs = model.get_decoder()(input_ids=batch["x"]).last_hidden_state[batch["lm"]]
    assert loss.item() == pytest.approx(2 * (((hs - batch["hid"] @ V) ** 2).mean() / ev.mean()).item(), rel=1e-5)
    assert train.distill_loss(model, batch, 40, 0.0, 0.0, w_mse=2.0, basis=None)[0].item() == 0


def test_make_draft_ties_the_embeddings_and_initialises_them_from_the_target(stages):
    """make_draft: a 49,152-token Llama with tied embeddings and heads of width / heads, seeded; hidden-pca:
    embeddings = E @ V exactly and the final norm's gains = sqrt(ev) x norm_init_scale; embed-pca (also hidden-pca
    without a basis): the centred embeddings' top principal directions (P^T P = their eigenvalues), rescaled to std
    embed_std; random: untouched."""
    train = stages.train
    args = SimpleNamespace(seed=0, width=8, ffn=16, layers=1, heads=2, kv_heads=1, init="hidden-pca",
                           norm_init_scale=0.5, embed_std=0.03)
    E = torch.randn(DRAFT_VOCAB, 12, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.2, 2.0, 12)
    E += 0.3
    V = torch.linalg.qr(torch.randn(12, 8, generator=torch.Generator().manual_seed(1)))[0]
    ev = torch.linspace(4.0, 1.0, 8)
    model = train.make_draft(args, E, (V, ev))
    emb = model.get_input_embeddings().weight
    assert model.config.vocab_size == DRAFT_VOCAB and model.get_output_embeddings().weight is emb
    attn = model.get_decoder().layers[0].self_attn  # 2 query heads of width / 2, 1 key-value head
    assert attn.q_proj.weight.shape == (8, 8) and attn.k_proj.weight.shape == attn.v_proj.weight.shape == (4, 8)
    assert torch.allclose(emb, E @ V, atol=1e-6)
    assert torch.allclose(model.get_decoder().norm.weight, ev.sqrt() * 0.5)
    for init, basis in (("embed-pca", None), ("hidden-pca", None)):
        emb = train.make_draft(SimpleNamespace(**{**vars(args), "init": init}), E, basis).get_input_embeddings().weight
        assert emb.std().item() == pytest.approx(0.03, rel=1e-3)
        Ec = (E - E.mean(0)).double()
        lam = torch.linalg.eigvalsh(Ec.T @ Ec).flip(0)[:8]
        P = emb.double() * (Ec @ torch.linalg.eigh(Ec.T @ Ec)[1][:, -8:]).std() / 0.03
        assert torch.allclose((P.T @ P).diag().sort(descending=True).values, lam, rtol=1e-3)
        assert (P.T @ P - torch.diag((P.T @ P).diag())).abs().max() < 1e-3 * lam[0]
    rand = train.make_draft(SimpleNamespace(**{**vars(args), "init": "random"}), E, (V, ev))
    same = train.make_draft(SimpleNamespace(**{**vars(args), "init": "random"}), None)
    other = train.make_draft(SimpleNamespace(**{**vars(args), "init": "random", "seed": 1}), None)
    assert all(torch.equal(a, b) for a, b in zip(rand.state_dict().values(), same.state_dict().values()))
    assert not torch.equal(rand.get_input_embeddings().weight, other.get_input_embeddings().weight)
    assert rand.get_output_embeddings().weight is rand.get_input_embeddings().weight


def write_teacher_data(workdir, tokenizer, n, seed, hid_dim=16):
    """WORKDIR/data as stage 1 leaves it (meta.json + batch shards without "prompt"): synthetic answers to n short
    chat prompts, teacher ids partly beyond K_train (64)."""
    data = Path(workdir) / "data"
    data.mkdir(parents=True)
    prompts = [f"question {i}: {'why ' * (i % 5)}?" for i in range(n)]
    prefix = [1] + tokenizer("user\n", add_special_tokens=False).input_ids
    exs = teacher_examples(n, seed, vocab=90, topk=6, hid_dim=hid_dim, gen_len=(3, 9))
    for e in exs:
        del e["prompt"], e["len"]
    for b in range(0, n, 4):
        torch.save(exs[b: b + 4], data / f"batch_{b // 4:05d}.pt")
    (data / "meta.json").write_text(json.dumps({"meta": {}, "prompts": prompts, "greedy": [e["greedy"] for e in exs],
                                                "prefix": prefix}))
    return exs


def train_args(toy_target, workdir, *extra):
    """build_draft.py's own arguments at toy size (so that the names stage_train reads are the parser's)."""
    return load_script("build_draft").parse_args([
        "--target", str(toy_target), "--workdir", str(workdir), "--out", str(Path(workdir) / "out"), "--width", "8",
        "--ffn", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--k-train", "64", "--topk", "4",
        "--epochs", "2", "--batch-tokens", "64", "--head-sample", "8", "--ckpt-every", "2", "--train-threads", "1",
        "--seed", "5", "--k-candidates", "32", "48", *extra])


def draft_state(workdir):
    return torch.load(Path(workdir) / "draft_fp32.pt", weights_only=False)["state"]


def test_stage_train_resumed_at_a_checkpoint_ends_with_the_same_weights(stages, toy_target, char_tokenizer, tmp_path,
                                                                        monkeypatch):
    """A training run killed mid-epoch 2 and run again (with a larger --train-minutes, which the checkpoint's
    signature ignores) resumes at its last checkpoint and ends with exactly the weights, step count and validation
    history of an uninterrupted run with the same seed (model, optimizer, sampled-softmax generator and step all
    restored; the batch order is the seed's). Changed hyper-parameters start afresh instead."""
    train = stages.train
    for w in ("full", "cut", "changed"):
        write_teacher_data(tmp_path / w, char_tokenizer, 20, seed=3)
    full = train.stage_train(train_args(toy_target, tmp_path / "full"), lambda m: None)
    per_epoch = full["steps"] // 2
    assert not full["capped"] and full["steps"] == 2 * per_epoch >= 8
    assert [h["epoch"] for h in full["history"]] == [1, 2] and full["history"][1]["step"] == full["steps"]
    assert full["n_answers"] == 20 and full["n_greedy_answers"] == 14

    class Killed(Exception):
        pass

    real, calls = train.distill_loss, []

    def dies_at_step(model, *a, **kw):
        calls.append(model.training)
        if sum(calls) == per_epoch + 4:  # mid epoch 2, one step after the checkpoint at per_epoch + 2
            raise Killed
        return real(model, *a, **kw)

    monkeypatch.setattr(train, "distill_loss", dies_at_step)
    with pytest.raises(Killed):
        train.stage_train(train_args(toy_target, tmp_path / "cut"), lambda m: None)
    monkeypatch.setattr(train, "distill_loss", real)
    ck = torch.load(tmp_path / "cut" / "train_ckpt.pt", weights_only=False)
    assert ck["step"] == per_epoch + 2 and len(ck["hist"]) == 1
    logs = []
    resumed = train.stage_train(train_args(toy_target, tmp_path / "cut", "--train-minutes", "30"), logs.append)
    assert f"train: resuming from step {per_epoch + 2}" in " ".join(logs)
    assert resumed["steps"] == full["steps"] and not resumed["capped"]
    drop = lambda hist: [{k: v for k, v in h.items() if k != "minutes"} for h in hist]  # noqa: E731
    assert drop(resumed["history"]) == drop(full["history"])
    a, b = draft_state(tmp_path / "full"), draft_state(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # control: a checkpoint of other hyper-parameters is not resumed
    (tmp_path / "changed" / "train_ckpt.pt").write_bytes((tmp_path / "cut" / "train_ckpt.pt").read_bytes())
    logs = []
    changed = train.stage_train(train_args(toy_target, tmp_path / "changed", "--lr", "0.002"), logs.append)
    assert changed["steps"] == full["steps"] and not any("resuming" in m for m in logs)
    assert not torch.equal(draft_state(tmp_path / "changed")["model.norm.weight"], a["model.norm.weight"])


def test_stage_train_validates_on_held_out_greedy_answers_per_position(stages, toy_target, char_tokenizer, tmp_path,
                                                                       monkeypatch):
    """stage_train's split: the validation answers are never trained on, are all greedy ones, and the validation
    top-1 (at K_train) is the share of their *positions* (not answers) where the draft agrees; the log's counts are
    these. With
    --lr-embed ~0 the (tied) embeddings keep their initial values while the other weights train."""
    train = stages.train
    exs = write_teacher_data(tmp_path, char_tokenizer, 30, seed=6)
    prefix = [1] + char_tokenizer("user\n", add_special_tokens=False).input_ids
    prompts = json.loads((tmp_path / "data" / "meta.json").read_text())["prompts"]
    by_row = {}
    for e, text in zip(exs, prompts):
        seq = prefix + stages.data.chat_ids(char_tokenizer, text)[len(prefix):] + e["gen"][:-1].tolist()
        by_row[tuple(seq)] = e
    seen = {True: [], False: []}
    real = train.distill_loss

    def spy(model, batch, *a, **kw):
        loss, agree = real(model, batch, *a, **kw)
        ends = [int(m.nonzero().max()) + 1 for m in batch["lm"]]
        seen[model.training] += [by_row[tuple(r[:n].tolist())] for r, n in zip(batch["x"], ends)]
        if not model.training:  # a known agreement: every third position of each validation batch
            seen.setdefault("K", set()).add(a[0])
            agree = (torch.arange(len(agree)) % 3 == 0).float()
            seen.setdefault("expected", []).append((agree.sum().item(), len(agree)))
        return loss, agree

    monkeypatch.setattr(train, "distill_loss", spy)
    logs = []
    args = train_args(toy_target, tmp_path, "--epochs", "1", "--lr-embed", "1e-30", "--seed", "3")
    res = train.stage_train(args, logs.append)
    trained, validated = {id(e) for e in seen[True]}, {id(e) for e in seen[False]}
    assert validated and not trained & validated and all(e["greedy"] for e in seen[False])
    held_out = [e for e in exs if id(e) not in trained]
    assert len(held_out) == 2 and validated == {id(e) for e in held_out if e["greedy"]}
    assert not all(e["greedy"] for e in held_out)  # (seed 3 holds out a sampled answer too)
    assert seen["K"] == {64}  # validated with the head it trains, K_train (not a --k-candidates value)
    hits, n = map(sum, zip(*seen["expected"]))
    assert res["history"][0]["val_top1"] == round(hits / n, 4)
    n_train, n_val = sum(len(e["gen"]) for e in seen[True]), sum(len(e["gen"]) for e in seen[False])
    assert f"({n_train} for training, {n_val} greedy positions for validation)" in " ".join(logs)
    V = train.hidden_basis([e for e in exs if id(e) in trained], args.width, args.seed)
    from safetensors.torch import load_file

    init = train.make_draft(args, load_file(str(toy_target / "model.safetensors"))["model.embed_tokens.weight"], V)
    state = draft_state(tmp_path)
    assert torch.allclose(state["model.embed_tokens.weight"], init.get_input_embeddings().weight, atol=1e-6)
    assert not torch.allclose(state["model.norm.weight"], init.get_decoder().norm.weight, atol=1e-4)


def test_stage_train_optimizer_groups_schedule_and_clipping(stages, toy_target, char_tokenizer, tmp_path,
                                                           monkeypatch):
    """stage_train's AdamW: weight decay 0.01 on the matrices only (not the norms' gains, not the embeddings), the
    embeddings at --lr-embed; a cosine from --lr down to 0.1 x --lr (never lower); every step's gradient
    clipped to norm 1 (here the loss is scaled up so that the raw gradients are larger)."""
    train = stages.train
    write_teacher_data(tmp_path, char_tokenizer, 20, seed=3)
    record = {"groups": None, "lr": [], "norm": []}

    class Recording(torch.optim.AdamW):
        def __init__(self, groups, **kw):
            record["groups"] = groups
            super().__init__(groups, **kw)

        def step(self, closure=None):
            record["lr"].append([g["lr"] for g in self.param_groups])
            grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
            record["norm"].append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads])))
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    raw, clip = [], torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: raw.append(clip(params, max_norm)))
    res = train.stage_train(train_args(toy_target, tmp_path, "--lr-embed", "0.001", "--w-soft", "1000", "--w-hard",
                                       "1000"), lambda m: None)
    decay, no_decay, embed = record["groups"]
    assert decay["weight_decay"] == 0.01 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0 and no_decay["params"] and all(p.dim() == 1 for p in no_decay["params"])
    assert embed["weight_decay"] == 0 and [tuple(p.shape) for p in embed["params"]] == [(DRAFT_VOCAB, 8)]
    lr = np.array(record["lr"])
    assert len(lr) == res["steps"] and np.allclose(lr[:, 2], lr[:, 0] / 3)  # --lr-embed 0.001 = lr / 3
    main = lr[:, 0]
    assert main[0] == main.max() == pytest.approx(3e-3)  # (the warm-up is one step at this size)
    assert (np.diff(main) <= 0).all() and 0.1 * 3e-3 <= main[-1] < 0.15 * 3e-3
    assert len(raw) == res["steps"] and max(raw) > 10  # the raw gradients are large ...
    assert max(record["norm"]) <= 1 + 1e-4  # ... and the optimizer steps with clipped ones


def test_stage_train_stops_at_the_train_minutes_cap(stages, toy_target, char_tokenizer, tmp_path, monkeypatch):
    """--train-minutes: with a clock that advances one minute per training step, a 2.5-minute cap stops after the
    third step (capped, 3 steps, 3.0 minutes), and still writes draft_fp32.pt; a 0.5-minute cap's single step
    changes the weights from make_draft's; a run resumed from a checkpoint counts the minutes spent before it."""
    train = stages.train
    write_teacher_data(tmp_path, char_tokenizer, 20, seed=3)
    clock = [1000.0]
    monkeypatch.setattr(train, "time", SimpleNamespace(time=lambda: clock[0]))
    real = train.distill_loss

    def one_minute(model, *a, **kw):
        clock[0] += 60.0 * model.training
        return real(model, *a, **kw)

    monkeypatch.setattr(train, "distill_loss", one_minute)
    res = train.stage_train(train_args(toy_target, tmp_path, "--train-minutes", "2.5", "--ckpt-every", "0"),
                            lambda m: None)
    assert res["capped"] and res["steps"] == 3 and res["minutes"] == 3.0 and res["history"] == []
    assert (tmp_path / "draft_fp32.pt").exists()
    # the first step already moves the weights (the warm-up starts at lr / warm, not 0)
    args = train_args(toy_target, tmp_path, "--train-minutes", "0.5", "--ckpt-every", "0", "--init", "embed-pca",
                      "--w-mse", "0")
    res = train.stage_train(args, lambda m: None)
    from safetensors.torch import load_file

    init = train.make_draft(args, load_file(str(toy_target / "model.safetensors"))["model.embed_tokens.weight"])
    assert res["steps"] == 1 and not torch.equal(draft_state(tmp_path)["model.norm.weight"], init.model.norm.weight)
    # a resumed run counts the minutes spent before its checkpoint: 3 minutes spent + 2 more under a 4.5 cap
    train.stage_train(train_args(toy_target, tmp_path, "--train-minutes", "2.5", "--ckpt-every", "1"), lambda m: None)
    res = train.stage_train(train_args(toy_target, tmp_path, "--train-minutes", "4.5", "--ckpt-every", "1"),
                            lambda m: None)
    assert res["capped"] and res["steps"] == 5 and res["minutes"] == 5.0


def test_stage_save_writes_fp16_that_loads_as_float32_with_the_reduced_head(stages, toy_target, char_tokenizer,
                                                                            tmp_path):
    """stage_save: config.json has "draft_vocab_size": K and "dtype": "float32", model.safetensors holds fp16, a
    default from_pretrained loads float32 weights equal to the checkpoint's rounded to fp16 (embeddings still tied),
    so its logits match the fp32 draft's to fp16 precision; ModelDrafter takes K as its head; stale files in --out are
    removed, the target's tokenizer and generation_config are copied. set_k rewrites K alone."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from specdec_edu import ModelDrafter

    train = stages.train
    target = tmp_path / "target"  # the toy target with a generation_config.json of its own (not the default one)
    shutil.copytree(toy_target, target)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "max_new_tokens": 9}))
    write_teacher_data(tmp_path, char_tokenizer, 12, seed=4)
    args = train_args(target, tmp_path, "--epochs", "1")
    train.stage_train(args, lambda m: None)
    out = Path(args.out)
    out.mkdir()
    (out / "stale.bin").write_text("left from an earlier build")
    size = train.stage_save(args, lambda m: None, 48)
    assert size == (out / "model.safetensors").stat().st_size and not (out / "stale.bin").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 48 and config["dtype"] == "float32"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert (out / "generation_config.json").read_bytes() == (target / "generation_config.json").read_bytes()
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "GPT2Tokenizer"
    assert (out / "tokenizer.json").exists()
    ck = torch.load(tmp_path / "draft_fp32.pt", weights_only=False)
    fp32 = LlamaForCausalLM(LlamaConfig.from_dict(ck["config"]))
    fp32.load_state_dict(ck["state"])
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.float32 and loaded.config.draft_vocab_size == 48
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, ck["state"][k].half().float()), k
    x = torch.tensor([[1, 5, 9, 20, 33]])
    with torch.no_grad():
        a, b = loaded(x).logits, fp32(x).logits
    assert (a - b).abs().max() <= 2e-3 * b.abs().max()
    assert ModelDrafter(loaded).head_size == 48
    train.set_k(out, 32)
    assert json.loads((out / "config.json").read_text()) == {**config, "draft_vocab_size": 32}


def test_shared_prefix_is_the_longest_common_start_of_chat_prompts(stages, char_tokenizer):
    """shared_prefix: the token ids every chat prompt starts with (here "<|im_start|>user\\n"), and chat_ids is
    the chat template with the generation prompt, tokenized without extra special tokens."""
    data = stages.data
    prefix = data.shared_prefix(char_tokenizer)
    text = char_tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}], tokenize=False,
                                              add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert data.chat_ids(char_tokenizer, "Hi!") == char_tokenizer(text, add_special_tokens=False).input_ids
    assert prefix == char_tokenizer("<|im_start|>user\n", add_special_tokens=False).input_ids
    for question in ("How are you?", "What is 2 + 2?", "Hello there."):
        assert data.chat_ids(char_tokenizer, question)[: len(prefix)] == prefix


def test_generate_batch_rows_are_what_the_target_says_to_each_prompt_alone(stages):
    """generate_batch (shared prefix cache, middle padding, finished rows dropped): every row's recorded top-k ids,
    logits, log-normaliser and final hidden state are the target's on that row's own unpadded sequence (one full
    forward, no cache), greedy rows take the argmax, a row stops at its EOS or at max_new; the prefix cache is left
    as it was (a second call with the rows in another order gives the same greedy rows)."""
    from transformers import DynamicCache

    data = stages.data
    model = tiny_llama(seed=0)
    with torch.no_grad():  # the model often says 37: make that EOS (2), so rows finish at different steps
        w = model.lm_head.weight
        w[[2, 37]] = w[[37, 2]]
    hidden = {}
    model.model.norm.register_forward_hook(lambda mod, inp, out: hidden.__setitem__("h", out))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, VOCAB, (5,), generator=gen).tolist()
    suffixes = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (3, 6, 1, 4, 2)]
    greedy = [True, False, True, True, True]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        forward_cached(model, torch.tensor([prefix]), cache)
    recs = data.generate_batch(model, cache, len(prefix), suffixes, greedy, 8, 0.8, 5, 0, hidden)
    lengths = [len(r["gen"]) for r in recs]
    assert min(lengths) < 8 and max(lengths) == 8  # some rows finish early, some run to max_new
    for r, s, g in zip(recs, suffixes, greedy):
        out = r["gen"].tolist()
        assert data.EOS_ID not in out[:-1] and (out[-1] == data.EOS_ID or len(out) == 8)
        seq = prefix + s + out[:-1]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, len(prefix) + len(s) - 1:]
        tv, ti = logits.topk(5, -1)
        assert r["tk_ids"].tolist() == ti.tolist()
        assert np.allclose(r["tk_val"], tv.numpy(), atol=1e-2)
        assert np.allclose(r["lse"], torch.logsumexp(logits, -1).numpy(), atol=1e-4)
        assert np.allclose(r["hid"], hidden["h"][0, len(prefix) + len(s) - 1:].numpy(), atol=2e-2)
        assert r["hid"].dtype == np.float16 and r["tk_ids"].dtype == np.uint16 and r["tk_val"].dtype == np.float16
        if g:
            assert out == ti[:, 0].tolist()
    again = data.generate_batch(model, cache, len(prefix), suffixes[::-1], greedy[::-1], 8, 0.8, 5, 0, hidden)
    for r, a, g in zip(recs, again[::-1], greedy):
        if g:
            assert r["gen"].tolist() == a["gen"].tolist()


def test_generate_batch_samples_at_the_temperature_from_its_seeded_generator(stages):
    """A sampled row draws each token from softmax(logits / temperature) with the batch's generator (seeded by
    ``seed``): the same draws as a plain loop over full forwards with that generator, and other draws at T = 1."""
    from transformers import DynamicCache

    data = stages.data
    model = tiny_llama(seed=0)
    prefix, suffix = [5, 9, 13], [20, 31, 7]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        forward_cached(model, torch.tensor([prefix]), cache)
    got = [data.generate_batch(model, cache, 3, [suffix], [False], 10, t, 4, 11)[0]["gen"].tolist() for t in (0.5, 1.0)]
    g, seq = torch.Generator().manual_seed(11), prefix + suffix
    for _ in range(10):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        seq.append(int(torch.multinomial(torch.softmax(logits / 0.5, -1)[None], 1, generator=g)))
        if seq[-1] == data.EOS_ID:
            break
    assert got[0] == seq[6:] and got[1] != got[0]


def data_args(toy_target, workdir, *extra):
    return load_script("build_draft").parse_args(["--target", str(toy_target), "--workdir", str(workdir), "--n-prompts",
                                                  "5", "--gen-batch", "2", "--gen-workers", "1", "--max-new", "3",
                                                  "--topk", "4", *extra])


def test_stage_data_writes_resumable_shards_that_load_data_reads(stages, toy_target, tmp_path, monkeypatch):
    """stage_data at toy size: one shard per batch of --gen-batch prompts; load_data gives one answer per prompt, in
    prompt order, with prompt = the chat template's ids and the recorded greedy flag. Run again it keeps finished
    shards and redoes only a missing one (identically); other settings start afresh; --gen-minutes 0 writes none;
    --greedy-frac 1 makes every answer greedy."""
    data = stages.data
    seeds, real = [], data.generate_batch
    monkeypatch.setattr(data, "generate_batch", lambda *a: seeds.append(a[8]) or real(*a))
    assert data.stage_data(data_args(toy_target, tmp_path), lambda m: None) == {"capped": False, "batches_done": 3,
                                                                              "batches": 3}
    assert len(set(seeds)) == 3  # one generator per batch, each seeded differently
    shards = sorted((tmp_path / "data").glob("batch_*.pt"))
    exs, meta = data.load_data(data_args(toy_target, tmp_path))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(toy_target)
    assert [e["prompt_idx"] for e in exs] == list(range(5))
    for e, p, g in zip(exs, meta["prompts"], meta["greedy"]):
        assert e["prompt"].tolist() == data.chat_ids(tok, p) and e["greedy"] == g
        assert e["tk_ids"].shape == e["tk_val"].shape == (len(e["gen"]), 4) and e["hid"].shape == (len(e["gen"]), 16)
        assert 1 <= len(e["gen"]) <= 3
    kept = shards[0].stat().st_mtime_ns
    before = torch.load(shards[1], weights_only=False)
    shards[1].unlink()
    data.stage_data(data_args(toy_target, tmp_path), lambda m: None)
    assert shards[0].stat().st_mtime_ns == kept
    for a, b in zip(before, torch.load(shards[1], weights_only=False)):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    data.stage_data(data_args(toy_target, tmp_path, "--max-new", "2"), lambda m: None)
    assert all(len(e["gen"]) <= 2 for e in data.load_data(data_args(toy_target, tmp_path))[0])
    capped = data.stage_data(data_args(toy_target, tmp_path / "capped", "--gen-minutes", "0", "--greedy-frac", "1"),
                             lambda m: None)
    assert capped == {"capped": True, "batches_done": 0, "batches": 3}
    assert json.loads((tmp_path / "capped" / "data" / "meta.json").read_text())["greedy"] == [True] * 5


def test_build_draft_arguments_match_the_docstring(draft_build, tmp_path):
    """parse_args: the defaults the module docstring names (seed 1234, workdir /tmp/draftwork, width 256, 2 layers,
    GQA 4/2, 2/3 greedy at T = 0.8, assets/draft), --quick shrinks the run and writes under the workdir, never into
    assets/; the K candidates above --k-train are dropped and the rest sorted."""
    build = load_script("build_draft")
    a = build.parse_args([])
    assert (a.seed, a.workdir, a.width, a.layers, a.heads, a.kv_heads) == (1234, "/tmp/draftwork", 256, 2, 4, 2)
    assert (a.greedy_frac, a.temperature, a.stages) == (2 / 3, 0.8, "data,train,save,eval")
    assert a.out == str(ROOT / "assets" / "draft") and a.k_candidates == [8192, 12288, 16384]
    q = build.parse_args(["--quick", "--workdir", str(tmp_path)])
    assert q.workdir == str(tmp_path / "quick") and Path(q.out).parent == Path(q.workdir)
    assert (q.n_prompts, q.epochs) == (48, 1)
    assert build.parse_args(["--quick", "--out", str(tmp_path / "o")]).out == str(tmp_path / "o")
    assert build.parse_args(["--k-train", "10000", "--k-candidates", "12288", "4096", "8192"]).k_candidates == [4096,
                                                                                                               8192]


def test_build_draft_main_runs_data_train_save_at_toy_size(toy_target, tmp_path):
    """``python scripts/build_draft.py --stages data,train,save`` on the toy target (one fresh interpreter; training in
    the spawned one the script starts): the training result comes back into build_info.json and
    draft_metrics.json, the saved draft's head is the largest K candidate up to --k-train (eval picks the final one
    later), and the card is written. The cache points at an empty folder: nothing is read from it."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "SPECDEC_EDU_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "build_draft.py"), "--target", str(toy_target), "--workdir", str(work), "--out",
         str(out), "--stages", "data,train,save", "--n-prompts", "6", "--gen-batch", "3", "--gen-workers", "1",
         "--max-new", "4", "--topk", "4", "--width", "8", "--ffn", "16", "--layers", "1", "--heads", "2", "--kv-heads",
         "1", "--k-train", "64", "--epochs", "1", "--batch-tokens", "512", "--train-threads", "1", "--k-candidates",
         "48", "32", "100"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((work / "build_info.json").read_text())
    assert info["data"] == {"capped": False, "batches_done": 2, "batches": 2}
    assert info["train"]["n_answers"] == 6 and info["train"]["steps"] >= 1 and not info["train"]["capped"]
    assert info["size_bytes"] == (out / "model.safetensors").stat().st_size
    assert json.loads((out / "draft_metrics.json").read_text())["train"] == info["train"]
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 48
    assert (out / "DRAFT_CARD.md").exists() and not (tmp_path / "cache").exists()
