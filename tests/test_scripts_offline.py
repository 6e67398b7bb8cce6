"""The offline measurement scripts (scripts/suffix_eval.py, suffix_budget.py, compile_cost.py, feature_data.py and
scripts/draft_build's pure parts), run at toy size with the tiny random models and fake clocks: their outputs are
committed under assets/results/ and quoted in the README, and nothing else checks that the scripts still run or
that they derive those numbers (speedup ratios, per-part splits, corpus sizes, budgets, the chosen K) correctly.
Every figure is checked against an independent computation from the fake clock's table, never against the
script's own output."""

import importlib.util
import json
import os
import re
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
