"""Tests for ``python -m specdec_edu demo``.

The demo logic (:func:`specdec_edu.commands.demo.run_demo`) takes models as arguments, so most tests
run it on tiny random models with a character-level tokenizer: seconds, no downloads.
"""

from __future__ import annotations

import copy
import io
import re
import types

import pytest
import torch

from specdec_edu.__main__ import build_parser, main
from specdec_edu.commands import demo
from specdec_edu.models.devices import device_name
from specdec_edu.result import GenerationStats

SUMMARY_ROWS = ["target-only tokens/s", "speculative tokens/s", "measured speedup",
                "α  acceptance rate", "τ  tokens per target forward", "c  draft token / target step",
                "predicted speedup", "identical to target-only"]


def run_tiny(tiny_pair, tokenizer, **overrides):
    target, draft = tiny_pair
    settings = demo.DemoSettings(**(dict(max_new_tokens=12, repeats=1) | overrides))
    out = io.StringIO()
    reports = demo.run_demo(target, draft, tokenizer, settings, out)
    return reports, out.getvalue()


def test_demo_on_tiny_models_prints_marked_text_and_summary(tiny_pair, char_tokenizer):
    reports, text = run_tiny(tiny_pair, char_tokenizer, prompt="abcabcabc")
    assert [r.drafter for r in reports] == ["model", "prompt-lookup", "suffix"]
    for row in SUMMARY_ROWS:
        assert row in text
    assert "legend:" in text and "[draft token accepted]" in text
    assert "\033[" not in text  # not a tty: plain markers, no colour codes
    for r in reports:
        assert r.identical is True  # greedy speculative == target-only, token for token
        assert len(r.speculative.token_sources[0]) == len(r.new_tokens) == r.speculative.stats.new_tokens
    assert "yes" in text.split("identical to target-only")[1]
    # accepted / drafted sits above α = accepted / judged: the line says which count α divides by
    stats = reports[0].speculative.stats
    assert (f"{stats.accepted} of {stats.drafted} drafts accepted, of {stats.accepted + stats.rejected_rounds} judged: "
            "α counts the judged") in text


def test_analyse_derives_the_summary_from_hand_made_runs():
    """Target-only: 10 tokens in 5 s (2 tok/s), 9 steps in 4.5 s (0.5 s a step). Speculative: 10 tokens in
    2.5 s (4 tok/s), 8 drafts in 0.4 s, 4 verify passes in 2.4 s, 6 accepted, 2 rejections. So speedup 2,
    c = 0.05 s / 0.5 s = 0.1, verify cost 0.6 s / 0.5 s = 1.2, α = 6 / 8 = 0.75, and at γ = 4 Leviathan gives
    (1 − 0.75⁵) / (0.25 · (4 · 0.1 + 1)) = 0.7626953125 / 0.35, and with the verify cost / (0.25 · 1.6)."""
    prompt, new = [1, 2, 3], list(range(10, 20))
    run = lambda tokens, **stats: types.SimpleNamespace(sequences=torch.tensor([prompt + tokens]),  # noqa: E731
                                                        stats=GenerationStats(**stats))
    baseline = run(new, new_tokens=10, seconds=5.0, rounds=9, verify_seconds=4.5)
    speculative = run(new, new_tokens=10, seconds=2.5, rounds=4, drafted=8, accepted=6, rejected_rounds=2,
                      draft_seconds=0.4, verify_seconds=2.4)
    r = demo.analyse("model", "p", torch.tensor([prompt]), baseline, speculative, demo.DemoSettings(gamma=4))
    assert r.speedup == 2.0
    assert (r.c, r.verify_cost) == (pytest.approx(0.1), pytest.approx(1.2))
    assert r.predicted == pytest.approx(0.7626953125 / 0.35)
    assert r.predicted_with_verify_cost == pytest.approx(0.7626953125 / 0.4)
    assert r.new_tokens == new and r.identical is True and r.first_difference is None
    late = run(new[:7] + [0, 0, 0], new_tokens=10, seconds=2.5)
    assert demo.analyse("model", "p", torch.tensor([prompt]), baseline, late, demo.DemoSettings()).first_difference == 10


def _parted_report(target, prompt, gamma=4):
    """A greedy report whose speculative output parts from the target-only one at new token 3."""
    from specdec_edu import autoregressive_generate

    baseline = autoregressive_generate(target, prompt, max_new_tokens=8)
    changed = baseline.sequences.clone()
    n = prompt.shape[-1]
    changed[0, n + 3] = (changed[0, n + 3] + 1) % target.config.vocab_size  # a token the target did not pick
    speculative = types.SimpleNamespace(sequences=changed, stats=baseline.stats,
                                        row=lambda i=0: changed[i, n:])
    report = demo.analyse("model", "p", prompt, baseline, speculative, demo.DemoSettings(gamma=gamma))
    demo.explain_difference(report, target, prompt, gamma)
    return report


def test_a_float32_difference_is_called_a_bug(tiny_pair):
    target, _ = tiny_pair
    report = _parted_report(target, torch.tensor([[3, 4, 5, 6, 7]]))
    assert (report.identical, report.first_difference, report.near_tie) == (False, 5 + 3, False)  # counts the prompt
    assert "this is a bug" in report.difference_note
    assert demo.identical_text(report) == "NO, from token 8"


def test_a_16_bit_difference_within_the_rounding_is_called_a_near_tie(tiny_pair, monkeypatch):
    """bf16: a token within twice the measured 1-token vs (γ + 1)-token logit spread of the top one may flip.
    The spread is faked (huge) here so that the changed token counts as a near-tie; with the real, small spread
    the same change is a bug (the negative control)."""
    from specdec_edu.course import diagnostics

    target = copy.deepcopy(tiny_pair[0]).to(torch.bfloat16)  # .to() is in place: the fixture stays fp32
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    real = _parted_report(target, prompt)
    assert real.near_tie is False and "a bug, not numerics" in real.difference_note
    monkeypatch.setattr(diagnostics, "logit_spread", lambda *args, **kwargs: 1e3)
    report = _parted_report(target, prompt)
    assert report.near_tie is True and "bfloat16 rounding can flip" in report.difference_note
    assert demo.identical_text(report) == "no, from token 8: a 16-bit near-tie"
    out = io.StringIO()
    demo.print_summary([report], demo.DemoSettings(), out)
    assert "bfloat16 rounding can flip" in out.getvalue()


def test_demo_with_sampling_reports_no_identity_claim(tiny_pair, char_tokenizer):
    reports, text = run_tiny(tiny_pair, char_tokenizer, sample=True, seed=3,
                             drafters=("model",))
    assert reports[0].identical is None
    assert "n/a (sampling)" in text and "sampling, T=1.0, seed 3" in text


def test_prompt_lookup_needs_no_draft_model(tiny_pair, char_tokenizer):
    target, _ = tiny_pair
    settings = demo.DemoSettings(max_new_tokens=8, repeats=1, drafters=("prompt-lookup",))
    reports = demo.run_demo(target, None, char_tokenizer, settings, io.StringIO())
    assert reports[0].prompt == demo.DEFAULT_REWRITE_PROMPT


def test_mark_tokens_groups_runs_and_colours():
    pieces = ["The", " cat", " sat", "."]
    sources = ["accepted", "accepted", "corrected", "bonus"]
    assert demo.mark_tokens(pieces, sources, color=False) == "[The cat]{ sat}<.>"
    coloured = demo.mark_tokens(pieces, sources, color=True)
    assert coloured.startswith(demo.ANSI["accepted"] + "The cat" + demo.ANSI_RESET)
    assert demo.mark_tokens(["a"], ["target"], color=False) == "a"


def test_token_pieces_rebuild_the_text(char_tokenizer):
    ids = char_tokenizer("héllo wörld")["input_ids"]
    pieces = demo.token_pieces(char_tokenizer, ids)
    assert "".join(pieces) == char_tokenizer.decode(ids, skip_special_tokens=True)


def test_first_difference():
    a = torch.tensor([1, 2, 3])
    assert demo.first_difference(a, torch.tensor([1, 2, 3])) is None
    assert demo.first_difference(a, torch.tensor([1, 5, 3])) == 1
    assert demo.first_difference(a, torch.tensor([1, 2])) == 2


def test_cli_parses_demo_flags():
    args = build_parser().parse_args(
        ["demo", "--gamma", "3", "--max-new-tokens", "5", "--sample", "--temperature", "0.7",
         "--seed", "1", "--drafter", "prompt-lookup", "--no-color", "--device", "cpu"])
    settings = demo.settings_from_args(args, io.StringIO())
    assert settings.gamma == 3 and settings.max_new_tokens == 5 and settings.sample
    assert settings.temperature == 0.7 and settings.drafters == ("prompt-lookup",)
    assert not settings.color
    assert demo.settings_from_args(build_parser().parse_args(["demo"]), io.StringIO()).drafters == (
        "model", "prompt-lookup", "suffix")
    assert demo.settings_from_args(build_parser().parse_args(["demo", "--drafter", "both"]), io.StringIO()).drafters == (
        "model", "prompt-lookup")
    assert demo.settings_from_args(build_parser().parse_args(["demo", "--drafter", "all"]), io.StringIO()).drafters == (
        "model", "eagle", "prompt-lookup", "suffix")


@pytest.mark.parametrize("argv, says", [
    (["demo", "--gamma", "0"], "argument --gamma: 0 is not a whole number >= 1"),
    (["demo", "--max-new-tokens", "-3"], "argument --max-new-tokens: -3 is not a whole number >= 1"),
    (["demo", "--sample", "--temperature", "0"], r"--temperature: 0.0 is not a finite number > 0 \(greedy decoding: leave"),
    (["demo", "--sample", "--temperature", "nan"], "--temperature: nan is not a finite number > 0"),
    (["bench", "--limit", "0"], "argument --limit: 0 is not a whole number >= 1"),
    (["bench", "--threads", "-1"], "argument --threads: -1 is not a whole number >= 1"),
    (["demo", "--threads", "0"], "argument --threads: 0 is not a whole number >= 1"),
    (["demo", "--gamma", "2.5"], "argument --gamma: '2.5' is not a whole number"),
    (["demo", "--sample", "--temperature", "inf"], "--temperature: inf is not a finite number > 0"),
    (["bench", "--batch-new-tokens", "0"], "argument --batch-new-tokens: 0 is not"),
    (["bench", "--pair", "foo"], "argument --pair: invalid choice: 'foo'"),
    (["gpu-report", "--pair", "foo"], "argument --pair: invalid choice: 'foo'"),
    (["demo", "--sample", "--seed", str(2**64)], "argument --seed: 18446744073709551616 is not a seed"),
    (["demo", "--sample", "--seed", "-1"], "argument --seed: -1 is not a seed, a whole number from 0 to 2"),
])
def test_bad_flags_are_refused_in_one_line_before_any_model_loads(argv, says, capsys):
    """Before: --gamma 0 and --max-new-tokens 0 raised a traceback after loading and part of the warm-up; --sample
    --temperature 0 decoded greedily under a "sampling, T=0.0" label with the identity check skipped; --limit 0, -1
    and --threads 0 failed late or were dropped in silence; an unknown pair was a traceback; --seed 2**64 failed
    after the models loaded, with "Overflow when unpacking long long" and no flag named."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert re.search(says, capsys.readouterr().err)


@pytest.mark.parametrize("name", ["xpu", "meta", "cuda:7", "cuda:1"])  # cuda:1: one past the last, on a one-GPU machine
def test_a_device_the_course_cannot_run_on_is_named(name, monkeypatch):
    """xpu and meta passed the check and failed deep inside the first load (an AssertionError from torch); cuda:7 on
    a one-GPU machine likewise, and cuda:1 there too. (CUDA is faked present: this machine may have none.)"""
    from specdec_edu.models.devices import requested_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=f"--device {name}: (the course runs on cuda, mps or cpu|this machine has 1 CUDA)"):
        requested_device(name)
    assert requested_device("cpu") == torch.device("cpu") and requested_device("cuda:0") == torch.device("cuda:0")


def test_demo_refuses_sampling_settings_without_sample():
    """--temperature or --seed without --sample used to be ignored in silence (greedy decoding ran)."""
    for flag, value in (("--temperature", "0.7"), ("--seed", "3")):
        with pytest.raises(SystemExit, match="add --sample, or leave them out"):
            demo.settings_from_args(build_parser().parse_args(["demo", flag, value]), io.StringIO())
    settings = demo.settings_from_args(build_parser().parse_args(["demo", "--sample"]), io.StringIO())
    assert (settings.temperature, settings.seed) == (1.0, 0)  # the defaults --help names


def test_a_bad_setting_met_while_running_is_one_line_unless_traceback_is_asked(monkeypatch, capsys):
    """A SPECDEC_EDU_* variable the code refuses (or a Hub that cannot be reached) gives one ``error:`` line naming
    the fix, exit 2; ``--traceback`` shows where. Before: a traceback whose last line held the fix."""
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "float16")
    assert main(["gpu-report", "--pair", "embedded", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SPECDEC_EDU_DTYPE='float16' is not a dtype") and "Traceback" not in err
    with pytest.raises(ValueError, match="SPECDEC_EDU_DTYPE='float16'"):
        main(["--traceback", "gpu-report", "--pair", "embedded", "--quick"])


def test_cli_requires_a_command(capsys):
    with pytest.raises(SystemExit):
        main([])


def test_a_feature_drafters_baseline_runs_eager_as_the_drafter_does(monkeypatch):
    """EAGLE and Medusa always run eager; on CUDA their target-only baseline ran compiled (the default there), so the
    demo's speedup, c and verify cost compared two paths. The baseline now follows the drafter; a model drafter's
    baseline keeps the default (None: compiled wherever the speculative run compiles)."""
    import specdec_edu

    seen = []
    result = types.SimpleNamespace(stats=types.SimpleNamespace(seconds=1.0))
    monkeypatch.setattr(specdec_edu, "autoregressive_generate", lambda *a, **k: seen.append(k["compile"]) or result)
    monkeypatch.setattr(specdec_edu, "speculative_generate", lambda *a, **k: result)
    features = types.SimpleNamespace(observe=lambda features: None)
    monkeypatch.setattr(demo, "make_drafter", lambda kind, draft, target: features if kind == "eagle" else draft)
    target = types.SimpleNamespace(device=torch.device("cpu"))
    settings = demo.DemoSettings(gamma=4, repeats=1)
    demo.run_both(target, "draft model", "eagle", None, settings, None)
    demo.run_both(target, "draft model", "model", None, settings, None)
    assert seen == [False, None]


@pytest.mark.embedded
def test_real_demo_on_the_embedded_pair(capsys):
    assert main(["demo", "--max-new-tokens", "12", "--repeats", "1", "--no-color",
                 "--device", "cpu"]) == 0
    text, err = capsys.readouterr()
    # the dtype too: SPECDEC_EDU_DTYPE=fp16 used to run unannounced
    assert re.search(r"running on cpu \(.+, \d+ cores?\) with \d+ threads?, float32, eager", err)
    for row in SUMMARY_ROWS:
        assert row in text
    assert "NO, from token" not in text
    assert "prompt lookup" in text and "suffix (no model)" in text


def test_on_an_asynchronous_device_c_and_the_verify_cost_come_from_a_profiled_run(monkeypatch, tiny_pair):
    """The demo's timed runs read the GPU once per round, so their draft seconds are only queuing time. There
    ``cost_stats`` makes one more run with profile=True, and ``analyse`` takes c and the verify cost from it
    (here: the hand-made runs of the test above, with profiled draft 0.8 s → c 0.2, verify 2.0 s → 1.0). On a
    CPU no extra run is made. And the model drafter is the draft model itself, so that it compiles wherever the
    target does (a ModelDrafter made by the demo stayed eager beside a compiled target)."""
    import specdec_edu

    calls = []
    monkeypatch.setattr(specdec_edu, "speculative_generate",
                        lambda *args, **kwargs: calls.append(kwargs) or types.SimpleNamespace(stats="profiled"))
    settings = demo.DemoSettings(gamma=4)
    cpu, cuda = (types.SimpleNamespace(device=torch.device(d)) for d in ("cpu", "cuda"))
    assert demo.cost_stats(cpu, None, "prompt-lookup", None, settings, None) is None and not calls
    assert demo.cost_stats(cuda, None, "prompt-lookup", None, settings, None) == "profiled"
    assert calls[0]["profile"] is True

    prompt, new = [1, 2, 3], list(range(10, 20))
    run = lambda **stats: types.SimpleNamespace(sequences=torch.tensor([prompt + new]),  # noqa: E731
                                                stats=GenerationStats(new_tokens=10, **stats))
    baseline = run(seconds=5.0, rounds=9, verify_seconds=4.5)
    speculative = run(seconds=2.5, rounds=4, drafted=8, accepted=6, rejected_rounds=2, draft_seconds=0.004,
                      verify_seconds=2.8)
    profiled = GenerationStats(new_tokens=10, rounds=4, drafted=8, accepted=6, draft_seconds=0.8, verify_seconds=2.0)
    r = demo.analyse("model", "p", torch.tensor([prompt]), baseline, speculative, settings, profiled)
    assert (r.c, r.verify_cost) == (pytest.approx(0.2), pytest.approx(1.0))
    target, draft = tiny_pair
    assert demo.make_drafter("model", draft, target) is draft


@pytest.mark.embedded
def test_a_missing_draft_model_names_the_drafters_that_still_run(monkeypatch, capsys):
    """With the draft model missing, the demo carries on and names what runs (it said "prompt lookup only" while
    the suffix drafter ran too); a device torch cannot use here is refused with the fix."""
    from specdec_edu.models import embedded
    from specdec_edu.models.weights import EmbeddedModelError

    def missing(device):
        raise EmbeddedModelError("the embedded draft model is missing")

    monkeypatch.setattr(embedded, "load_embedded_draft", missing)
    settings = demo.DemoSettings(drafters=("model", "prompt-lookup", "suffix"))
    target, draft, _ = demo.load_models(settings, "cpu")
    assert draft is None and settings.drafters == ("prompt-lookup", "suffix")
    assert "continuing without the draft model: prompt-lookup, suffix." in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: .*sees no CUDA device"):
            demo.load_models(settings, "cuda")


def test_one_new_token_reports_no_verify_cost(tiny_pair, char_tokenizer):
    """With one new token the target-only run takes no decoding step (the prefill emits it). Before, the step's time
    fell back to the prefill's, and the summary printed a verify cost (0.26) beside n/a for α and c, with a footer
    saying that checking γ+1 tokens costs more than one step. Control: 12 tokens measure a cost, and the footer
    then states the measured range."""
    reports, text = run_tiny(tiny_pair, char_tokenizer, max_new_tokens=1, drafters=("model",))
    assert reports[0].verify_cost != reports[0].verify_cost  # NaN
    assert "verify cost / target step" in text and re.search(r"verify cost / target step\s+n/a", text)
    assert "not measured here" in text
    reports, text = run_tiny(tiny_pair, char_tokenizer, drafters=("model",))
    assert reports[0].verify_cost > 0 and re.search(r"here checking γ\+1 tokens cost [\d.–]+ target steps", text)


def test_the_demo_prints_each_drafters_output_as_it_is_measured(tiny_pair, char_tokenizer, monkeypatch, capsys):
    """A progress line per drafter, and its output before the next drafter runs (before: all at the end, after
    minutes of silence on a CPU)."""
    order = []
    real_compare, real_print = demo.compare_drafter, demo.print_report
    monkeypatch.setattr(demo, "compare_drafter", lambda *a: order.append("run") or real_compare(*a))
    monkeypatch.setattr(demo, "print_report", lambda *a: order.append("print") or real_print(*a))
    run_tiny(tiny_pair, char_tokenizer, drafters=("model", "prompt-lookup"))
    assert order == ["run", "print", "run", "print"]
    err = capsys.readouterr().err
    assert "[1/2] model draft: target-only and speculative, 1 run each" in err and "[2/2] prompt lookup" in err


@pytest.mark.parametrize("argv,says", [
    (["demo", "--prompt", "  "], "error: --prompt is empty: give the text to answer"),
    (["demo", "--temperature", "0.5"], "error: --temperature and --seed set how --sample draws"),
    (["bench", "--batch-sizes", "4", "--drafter", "prompt-lookup"],
     "error: --batch-sizes runs batched drafting, which uses a draft model: add --drafter model"),
])
def test_a_commands_own_refusal_is_one_error_line_with_exit_status_2(argv, says, capsys, monkeypatch):
    """Refusals raised inside a command (SystemExit with a message) printed a bare line with exit status 1, where
    argparse's and the settings' refusals print ``error:`` and exit 2, as the README promises. An empty --prompt ran
    the default prompt in silence; --batch-sizes 4 with prompt lookup said the sizes were bad."""
    from specdec_edu.models import embedded

    monkeypatch.setattr(embedded, "load_pair", lambda *a, **k: pytest.fail("loaded models before checking the flags"))
    monkeypatch.setattr(demo, "load_models", lambda *a, **k: pytest.fail("loaded models before checking the flags"))
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(says)


def test_demo_threads_sets_torchs_threads_and_says_so(tiny_pair, char_tokenizer, monkeypatch, capsys):
    """The CPU's speed, and so every ratio the demo prints, depends on the thread count: bench had --threads, demo
    neither had it nor said how many threads it ran on."""
    target, draft = tiny_pair
    seen = []
    monkeypatch.setattr(demo, "load_models", lambda settings, device: (target, draft, char_tokenizer))
    monkeypatch.setattr(demo, "run_demo", lambda *a: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        assert main(["demo", "--threads", "1", "--device", "cpu"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
    assert f"running on cpu ({device_name('cpu')}) with 1 thread, float32, eager" in capsys.readouterr().err


def _hand_made_report(**fields):
    """A DrafterReport from hand-made numbers (no model): 2 tok/s target-only, 4 tok/s speculative."""
    run = lambda **stats: types.SimpleNamespace(stats=GenerationStats(**stats))  # noqa: E731
    return demo.DrafterReport("model", "p", run(new_tokens=10, seconds=5.0), run(new_tokens=10, seconds=2.5, drafted=8,
                              accepted=6, rejected_rounds=2), **(dict(identical=True, speedup=2.0, c=0.1, verify_cost=1.2,
                              predicted=2.18, predicted_with_verify_cost=1.91) | fields))


def test_the_summary_rows_show_each_reports_own_fields_aligned():
    """Each row holds its own field (c beside c, the verify-cost prediction beside that label), and every line of the
    table is as wide as the header (the drafter's label, wider than its cells, sets the column)."""
    rows = dict(demo.summary_rows([_hand_made_report()], gamma=4))
    assert rows["c  draft token / target step"] == ["0.100"] and rows["verify cost / target step"] == ["1.20"]
    assert rows["predicted speedup (γ=4)"] == ["2.18x"] and rows["predicted, with that cost"] == ["1.91x"]
    assert rows["measured speedup"] == ["2.00x"] and rows["identical to target-only"] == ["yes"]
    lines = demo.format_table([_hand_made_report(), _hand_made_report(c=float("nan"))], gamma=4).splitlines()
    assert len({len(line) for line in lines}) == 1 and lines[0].endswith("model draft  model draft")
    assert re.search(r"c  draft token / target step\s+0.100\s+n/a$", "\n".join(lines), re.M)


@pytest.mark.parametrize("costs, says", [
    ([1.2, 1.5], "cost 1.20–1.50 target steps: more than one"),
    ([0.9, 1.5], "cost 0.90–1.50 target steps: one or more"),
    ([1.0, 1.002, float("nan")], "cost 1.00 target steps: about one"),
])
def test_the_verify_cost_note_states_the_range_measured(costs, says):
    """The footer's range is min–max of the measured costs (one number when they agree to the cent), and its word
    ("more than one", "about one", "one or more") follows both ends: a range across 1.1 is "one or more"."""
    assert says in demo.verify_cost_note([_hand_made_report(verify_cost=c) for c in costs])


def test_the_summary_header_counts_the_runs_and_keeps_the_seed(tiny_pair):
    """repeats=2 is "best of 2 runs each", not "one run each"; --seed 5 reaches the settings as 5."""
    for repeats, says in ((1, "one run each"), (2, "best of 2 runs each")):
        out = io.StringIO()
        demo.print_summary([_hand_made_report()], demo.DemoSettings(repeats=repeats), out)
        assert f"=== summary (greedy, {says}) ===" in out.getvalue()
    args = build_parser().parse_args(["demo", "--sample", "--seed", "5"])
    assert demo.settings_from_args(args, io.StringIO()).seed == 5


def test_main_returns_the_commands_exit_status_and_lets_a_numeric_exit_through(monkeypatch, capsys):
    """``main`` returns what the command's ``main`` returned (not a blanket 0); a SystemExit with a number (not a
    message) goes through untouched rather than becoming an ``error: 3`` line with status 2."""
    monkeypatch.setattr(demo, "main", lambda args: 3)
    assert main(["demo"]) == 3

    def exits(args):
        raise SystemExit(4)

    monkeypatch.setattr(demo, "main", exits)
    with pytest.raises(SystemExit) as info:
        main(["demo"])
    assert info.value.code == 4 and capsys.readouterr().err == ""


def test_python_m_specdec_edu_exits_with_mains_status(monkeypatch):
    """``python -m specdec_edu`` passes main's return value to sys.exit: a refusal must reach the shell as status 2,
    not 0 (run in-process with runpy; the command is stubbed)."""
    import runpy
    import sys
    import warnings

    monkeypatch.setattr(demo, "main", lambda args: 2)
    monkeypatch.setattr(sys, "argv", ["specdec_edu", "demo"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # specdec_edu.__main__ is already imported by this file
        with pytest.raises(SystemExit) as info:
            runpy.run_module("specdec_edu", run_name="__main__")
    assert info.value.code == 2


def test_the_package_exports_the_names_it_imports():
    """``from specdec_edu import *`` (and the README's API) gives every public name the package imports, each the
    object of its home module; ``__version__`` is pyproject's version."""
    from pathlib import Path

    import specdec_edu
    from specdec_edu import theory, verify

    public = {n for n, v in vars(specdec_edu).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert set(specdec_edu.__all__) == public and len(specdec_edu.__all__) == len(public)
    for name in ("accept_and_resample", "acceptance_probability", "residual_distribution"):
        assert getattr(specdec_edu, name) is getattr(verify, name)
    assert specdec_edu.output_distribution is theory.output_distribution
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^version = "(.+)"$', pyproject, re.MULTILINE).group(1) == specdec_edu.__version__


def test_the_summary_names_its_machine_and_the_drafters_that_draft_less_than_gamma(tiny_pair, char_tokenizer):
    """The machine line went to stderr only, so ``demo > out.txt`` lost what every ratio depends on; and the formula's
    predictions for prompt lookup and suffix (fewer than γ drafts per round) stood beside the model's without a word.
    The summary now names the machine, and each drafter that drafted under 0.9 γ per round, with its mean."""
    # 48 tokens: the model's last round, cut to fit max_new_tokens, weighs little in its mean
    reports, text = run_tiny(tiny_pair, char_tokenizer, prompt="abcabcabc", gamma=4, max_new_tokens=48)
    summary = text.split("=== summary")[1]
    assert f"measured on {demo.describe_machine(tiny_pair[0])}" in summary and "thread" in summary
    short = {r.drafter: r.speculative.stats.drafted / r.speculative.stats.rounds for r in reports
             if r.speculative.stats.drafted < 0.9 * 4 * r.speculative.stats.rounds}
    full = [r.drafter for r in reports if r.drafter not in short]
    assert "model" in full and short, (full, short)  # the model drafts γ in every round but the last; lookup does not
    note = demo.short_drafts_note(reports, 4)
    assert note in summary and "not γ = 4" in note
    for drafter, per_round in short.items():
        assert f"{demo.DRAFTER_LABELS[drafter]} {per_round:.1f}" in note
    for drafter in full:
        assert demo.DRAFTER_LABELS[drafter] not in note
    assert demo.short_drafts_note([r for r in reports if r.drafter in full], 4) == ""  # the control: no line


def test_a_flag_the_command_lacks_is_reported_with_the_commands_usage(capsys):
    """argparse reported ``demo --pair smollm2`` under the top-level usage, which lists no command's flags; and
    ``--traceback`` after the command was just "unrecognized"."""
    with pytest.raises(SystemExit) as info:
        main(["demo", "--pair", "smollm2"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "usage: python -m specdec_edu demo" in err and "--max-new-tokens" in err
    assert "demo: error: unrecognized arguments: --pair smollm2" in err
    with pytest.raises(SystemExit):
        main(["gpu-report", "--traceback"])
    assert "--traceback goes before the command: python -m specdec_edu --traceback gpu-report" in capsys.readouterr().err


def test_a_bad_device_is_refused_before_anything_loads(monkeypatch, capsys):
    """``demo --device foo`` printed "loading the embedded pair ..." before refusing: the device is checked first."""
    def no_load(*args, **kwargs):
        raise AssertionError("the models were loaded")

    monkeypatch.setattr(demo, "load_models", no_load)
    with pytest.raises(SystemExit, match="--device 'foo'"):
        demo.main(build_parser().parse_args(["demo", "--device", "foo"]), io.StringIO())
    assert "loading" not in capsys.readouterr().err


def test_the_demo_says_it_ignores_a_hub_pair_in_the_environment(monkeypatch, capsys):
    """SPECDEC_EDU_PAIR picks the notebooks' pair; the demo always runs the embedded one, and says so (it ignored the
    variable without a word). The control: unset, or 'embedded', no note."""
    loaded = []

    def stop(settings, device):
        loaded.append(device)
        raise demo_stop

    class demo_stop(Exception):
        pass

    monkeypatch.setattr(demo, "load_models", stop)
    for value, noted in [("smollm2", True), ("embedded", False), ("", False)]:
        monkeypatch.setenv("SPECDEC_EDU_PAIR", value)
        with pytest.raises(demo_stop):
            demo.main(build_parser().parse_args(["demo", "--device", "cpu"]), io.StringIO())
        err = capsys.readouterr().err
        assert ("the demo always runs the embedded pair" in err) == noted, value
    assert loaded == [torch.device("cpu")] * 3
