"""The "build it yourself" checker of notebook 06: a correct greedy round passes, a round that forgets to roll
back the target's KV cache fails visibly, and an unwritten one is reported as such."""

import re

import pytest
import torch

from specdec_edu import kv
from specdec_edu.course.exercises import check_speculative_round

PROMPT = torch.tensor([3, 17, 5, 42, 8, 11])


def greedy_round(target, draft, cache, context, gamma, crop=True):
    """Notebook 06's solution: draft γ tokens, verify in one target forward, keep the agreeing prefix, crop."""
    drafts = []
    for _ in range(gamma):  # the draft re-reads the whole context (no draft cache: simple, and it is small)
        ids = torch.cat([context, torch.tensor(drafts, dtype=torch.long)])[None]
        drafts.append(int(draft(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax()))
    drafts = torch.tensor(drafts)
    choice = kv.forward_cached(target, torch.cat([context[-1:], drafts])[None], cache).logits[0].argmax(-1)  # [γ+1]
    n = 0
    while n < gamma and int(choice[n]) == int(drafts[n]):
        n += 1
    if crop:
        kv.crop(cache, gamma - n)
    return drafts[:n].tolist() + [int(choice[n])]


def test_a_correct_round_reproduces_the_target(target, agreeing_draft, close_draft, draft, capsys):
    for d in (agreeing_draft, close_draft, draft):  # rounds keep 0 to all drafts / few kept / almost none kept
        assert check_speculative_round(greedy_round, target, d, PROMPT, gamma=4, max_new_tokens=20) is True
        assert "PASS" in capsys.readouterr().out


def test_a_round_that_does_not_crop_fails_with_a_position(target, draft, capsys):
    no_crop = lambda *args: greedy_round(*args, crop=False)
    assert check_speculative_round(no_crop, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    out = capsys.readouterr().out
    assert "FAIL: first divergent position" in out and "crop the rejected drafts" in out


def test_the_failure_names_the_targets_token_and_the_first_round_that_left_the_cache_wrong(target, draft, capsys):
    """The FAIL lines a learner debugs from: at the first divergent position, the target's greedy token (the
    reference's, not the rounds'), and the *first* round after which the cache had the wrong length (here round 1:
    the unrelated draft's first drafts are rejected, and nothing is cropped)."""
    from specdec_edu import autoregressive_generate

    no_crop = lambda *args: greedy_round(*args, crop=False)  # noqa: E731
    assert check_speculative_round(no_crop, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    out = capsys.readouterr().out
    reference = autoregressive_generate(target, PROMPT, max_new_tokens=20, compile=False).row(0).tolist()
    position, said_target, said_rounds = map(int, re.search(
        r"first divergent position (\d+): the target's greedy token is (\d+), your rounds gave (\d+)", out).groups())
    assert said_target == reference[position] != said_rounds
    assert "after round 1 the target's cache held" in out


def test_a_correct_round_passes_whatever_the_last_round_overshoots(target, capsys):
    """The last round may emit past ``max_new_tokens``: with the target as its own draft every round keeps all γ = 4
    drafts and emits 5 tokens, so 21 to 24 new tokens end inside a round. Only the first ``max_new_tokens`` are
    compared, and the PASS line counts those. (``close_draft`` has its drafts rejected on this prompt, one token a
    round: it never overshoots.)"""
    for n in (21, 22, 23, 24):
        assert check_speculative_round(greedy_round, target, target, PROMPT, gamma=4, max_new_tokens=n) is True
        assert f"PASS: {n} tokens identical" in capsys.readouterr().out


def test_a_round_that_scribbles_on_its_context_leaves_the_learners_prompt_alone(target, close_draft):
    """``context`` is the round's to use: a round that overwrites it in place after its work (a scratch buffer) is
    still judged on the tokens it returns, and the prompt the learner passed in (the first round's context is that
    very tensor, unless the checker copies it) keeps its ids for the cells after the check."""
    def scribbles(target, draft, cache, context, gamma):
        emitted = greedy_round(target, draft, cache, context, gamma)
        context.zero_()
        return emitted

    prompt = PROMPT.clone()
    assert check_speculative_round(scribbles, target, close_draft, prompt, gamma=4, max_new_tokens=20) is True
    assert torch.equal(prompt, PROMPT)


def scripted_round(script):
    """A round that emits ``script``'s tokens one per round, keeping the cache as a round must (all but the newest).
    Its target forward reads two tokens, the last one and the one it emits, as a verify of one draft would."""
    def round_fn(target, draft, cache, context, gamma):
        token = int(script[len(context) - len(PROMPT)])
        kv.forward_cached(target, torch.tensor([[int(context[-1]), token]], device=context.device), cache)
        kv.crop(cache, 1)  # the emitted token's K/V go: the cache holds all but the newest
        return [token]
    return round_fn


def keeping_the_newest(round_fn):
    """``round_fn``, but the cache also keeps the K/V of the newest token, which the next round feeds again."""
    def round_keeping_the_newest(target, draft, cache, context, gamma):
        emitted = round_fn(target, draft, cache, context, gamma)
        kv.forward_cached(target, torch.tensor([emitted], device=context.device), cache)
        return emitted
    return round_keeping_the_newest


def test_a_round_that_only_decodes_fails_though_its_tokens_are_right(target, draft, capsys):
    """One target forward per token, the draft never asked: the target's own greedy tokens, with the cache kept
    right. That is plain decoding, and it printed PASS. The control: the same round's tokens, verified two at a
    time (``scripted_round``), pass."""
    def decode_only(target, draft, cache, context, gamma):
        return [int(kv.forward_cached(target, context[None, -1:], cache).logits[0, -1].argmax())]

    assert check_speculative_round(decode_only, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    assert "never read more than one token" in capsys.readouterr().out
    assert check_speculative_round(greedy_round, target, draft, PROMPT, gamma=4, max_new_tokens=20) is True  # control


def greedy_round_with(accept_at_most=None, bonus_offset=0, bonus=True):
    """``greedy_round`` with one of a learner's slips: keep at most ``accept_at_most`` agreed drafts, take the bonus
    from the wrong row (``bonus_offset`` −1), or emit no bonus after γ accepted drafts (the cache cropped to match)."""
    def round_fn(target, draft, cache, context, gamma):
        drafts = []
        for _ in range(gamma):
            ids = torch.cat([context, torch.tensor(drafts, dtype=torch.long)])[None]
            drafts.append(int(draft(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax()))
        drafts = torch.tensor(drafts)
        choice = kv.forward_cached(target, torch.cat([context[-1:], drafts])[None], cache).logits[0].argmax(-1)
        n = 0
        while n < min(gamma, accept_at_most or gamma) and int(choice[n]) == int(drafts[n]):
            n += 1
        if n == gamma and not bonus:
            kv.crop(cache, 1)  # the last draft is the newest token: its K/V go
            return drafts.tolist()
        kv.crop(cache, gamma - n)
        return drafts[:n].tolist() + [int(choice[n + bonus_offset if n == gamma else n])]
    return round_fn


@pytest.mark.parametrize("slip", ["accepts at most one draft", "the bonus from the row before", "no bonus token"])
def test_rounds_that_waste_agreed_drafts_or_the_bonus_fail_though_a_weak_draft_hides_it(target, draft, slip, capsys):
    """With the course's weak draft no round accepts more than a draft or two, so these slips gave the target's
    tokens and passed (a review wrote them as a learner would). With the target as its own draft every draft is
    accepted and each round must emit γ + 1 tokens: each slip fails there, and the right round passes (above)."""
    round_fn = {"accepts at most one draft": greedy_round_with(accept_at_most=1),
                "the bonus from the row before": greedy_round_with(bonus_offset=-1),
                "no bonus token": greedy_round_with(bonus=False)}[slip]
    assert check_speculative_round(round_fn, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    out = capsys.readouterr().out
    assert "with a draft that agrees with the target" in out or "FAIL: first divergent" in out, out


def test_the_pass_line_claims_agreeing_rounds_only_when_some_ran(target, draft, capsys):
    """Four new tokens at γ = 4 leave no room for a round of γ + 1: the PASS line must not claim one was checked."""
    assert check_speculative_round(greedy_round, target, draft, PROMPT, gamma=4, max_new_tokens=4) is True
    assert "where every draft agrees" not in capsys.readouterr().out
    assert check_speculative_round(greedy_round, target, draft, PROMPT, gamma=4, max_new_tokens=20) is True
    assert "where every draft agrees (3 rounds)" in capsys.readouterr().out


def test_a_round_that_forgets_its_return_is_told_so(target, draft, capsys):
    def no_return(target, draft, cache, context, gamma):
        greedy_round(target, draft, cache, context, gamma)

    assert check_speculative_round(no_return, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    assert "returned None" in capsys.readouterr().out


def test_a_cache_that_lost_positions_is_not_told_to_crop_more(target, draft, capsys):
    """A round that cropped one position too many left the cache short, and the message said "crop the rejected
    drafts", the wrong way; it now says positions were lost."""
    def crops_too_much(target, draft, cache, context, gamma):
        emitted = greedy_round(target, draft, cache, context, gamma)
        kv.crop(cache, 1)
        return emitted

    assert check_speculative_round(crops_too_much, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    out = capsys.readouterr().out
    assert "it lost some" in out and "crop the rejected drafts" not in out, out


def test_a_16_bit_near_tie_passes_and_a_large_margin_fails(capsys):
    """bf16 (a GPU's dtype): rounds that flip the target's token where its top-2 margin is one rounding step pass,
    saying so; a flip at the largest margin fails. The reference is eager, like the rounds. Before: any flip
    printed FAIL, and on a GPU a correct solution could (a compiled reference, eager rounds, bf16)."""
    from conftest import tiny_llama

    from specdec_edu import autoregressive_generate
    from specdec_edu.course.diagnostics import rounding_step

    model = tiny_llama(seed=0).to(torch.bfloat16)
    reference = autoregressive_generate(model, PROMPT, max_new_tokens=20, compile=False).row(0)
    with torch.no_grad():
        top2 = model(torch.cat([PROMPT, reference])[None]).logits[0, len(PROMPT) - 1 : -1].float().topk(2)
    margins = top2.values[:, 0] - top2.values[:, 1]
    steps = [rounding_step(float(top), torch.bfloat16) for top in top2.values[:, 0]]
    one = next(i for i, (m, st) in enumerate(zip(margins, steps)) if float(m) == st)  # a one-step margin
    for position, passes in ((one, True), (int(margins.argmax()), False)):
        script = reference.clone()
        first, second = top2.indices[position].tolist()
        script[position] = second if first == int(reference[position]) else first  # the other of the top two
        assert check_speculative_round(scripted_round(script), model, None, PROMPT, max_new_tokens=20) is passes
        out = capsys.readouterr().out
        assert ("PASS (up to rounding)" in out and "near-tie" in out) if passes else "FAIL: first divergent" in out
        if passes:  # the same near-tie from rounds that also keep the newest token's K/V: the cache still fails them
            leaky = keeping_the_newest(scripted_round(script))
            assert check_speculative_round(leaky, model, None, PROMPT, max_new_tokens=20) is False
            assert "crop the rejected drafts" in capsys.readouterr().out


def test_unwritten_and_malformed_rounds(target, draft, capsys):
    assert check_speculative_round(lambda *args: NotImplemented, target, draft, PROMPT) is None
    assert "not written yet" in capsys.readouterr().out
    too_many = lambda target, draft, cache, context, gamma: [1] * (gamma + 2)
    assert check_speculative_round(too_many, target, draft, PROMPT, gamma=3) is False
    assert "emits 1 to γ + 1 = 4" in capsys.readouterr().out


# ---- notebook 08's "which α gives 1.5×?" ------------------------------------------------------------


def test_alpha_for_speedup_checker_takes_the_right_answer_at_every_verify_cost():
    """The solutions' answers (notebook 08: 1.5x; notebook 06: break-even) pass whatever verify cost the learner's
    device measured: a root (vc 1.44, about the committed run), nan (vc 3.0: even α = 1 gives 5/3.4 = 1.47x), and 0
    (vc 0.2, a busy CPU: even α = 0 gives 1/(0.4 + 0.2) = 1.67x; notebook 08's old checker demanded
    speedup(α) = 1.5 ± 0.02 there and so rejected every answer). Answers off by more than ±0.005 in α fail
    (the old break-even check, speedup 1 ± 0.02, took α 0.012 below the root)."""
    import numpy as np
    import pytest

    from specdec_edu import alpha_for_speedup, expected_speedup
    from specdec_edu.course.exercises import check_alpha_for_speedup

    grid = np.linspace(0, 0.99999, 100001)
    for vc, right in [(1.44, 0.6975), (3.0, "nan"), (0.2, 0.0)]:
        s = expected_speedup(grid, 4, 0.1, verify_cost=vc)
        answer = float(grid[np.argmax(s >= 1.5)]) if s.max() >= 1.5 else float("nan")  # notebook 08's solution
        got = check_alpha_for_speedup(answer, 4, 0.1, vc, speedup=1.5)
        assert (got != got) if right == "nan" else abs(got - right) < 0.001, (vc, got)
    for vc, wrong in [(1.44, 0.5), (1.44, None), (1.44, float("nan")), (3.0, 0.9), (0.2, 0.5), (0.2, float("nan")),
                      (0.2, -0.004)]:  # a negative α passed, within the tolerance of the answer 0
        with pytest.raises(AssertionError):
            check_alpha_for_speedup(wrong, 4, 0.1, vc, speedup=1.5)
    # Notebook 06's break-even at its committed costs: the root ± 0.004 passes, ± 0.012 fails on both sides.
    c_run, vc_run = 0.0846, 1.3
    root = alpha_for_speedup(1.0, 4, c_run, vc_run)
    for off, ok in [(0.004, True), (-0.004, True), (0.012, False), (-0.012, False)]:
        if ok:
            check_alpha_for_speedup(root + off, 4, c_run, vc_run, speedup=1.0)
        else:
            with pytest.raises(AssertionError):
                check_alpha_for_speedup(root + off, 4, c_run, vc_run, speedup=1.0)


def test_notebook_05_exercise_1_takes_any_answer_its_question_allows():
    """"About what will the TV be after 100,000 samples?", asked after a TV "about 0.02–0.03" at 1,000: a tenth of
    it. The checker took only 0.0023–0.0029, so it rejected both ends of the question's own range (and a run's own
    TV / 10 on most seeds). It must take 0.002–0.003, and still reject the usual slips: no division, ÷ 100, ÷ √10."""
    import json
    import re
    from pathlib import Path

    import pytest

    from specdec_edu.course.exercises import check_answer

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "05_empirical_proof.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"] if 'check_answer("exercise 1", answer_1' in "".join(c["source"]))
    expected, tol = map(float, re.search(r'check_answer\("exercise 1", answer_1, ([\d.e-]+), tol=([\d.e-]+)', source).groups())
    for right in (0.002, 0.0025, 0.0026, 0.003, 0.035 / 10, 0.017 / 10):
        assert check_answer("ex1", right, expected, tol=tol)
    for slip in (0.026, 0.00026, 0.026 / 10**0.5):
        with pytest.raises(AssertionError):
            check_answer("ex1", slip, expected, tol=tol)


def test_check_answer_compares_each_kind_of_answer_as_documented(capsys):
    """Strings without case or surrounding spaces; a bool only with a bool (False is not the answer 0); a number only
    with a number ("0.4" is not 0.4: a wrong answer, not a crash); sequences element by element and of equal length;
    tensors and arrays, 0-d included, as their values; absolute tolerance near 0."""
    import numpy as np
    import pytest

    from specdec_edu.course.exercises import check_answer

    rights = [(" Memory-Bound ", "memory-bound"), (True, True), (np.bool_(False), False), (torch.tensor(0.5), 0.5),
              (np.float32(0.25), 0.25), (torch.tensor([0.75, 0.0, 0.25]), [0.75, 0, 0.25]),
              ([1, 2], np.array([1, 2])), ((3, "a"), [3, " A"]), (1e-7, 0.0)]
    for answer, expected in rights:
        assert check_answer("ex", answer, expected) is True, (answer, expected)
    wrongs = [("memory bound", "memory-bound"), (False, 0), (0, False), (1, True), ("0.4", 0.4), (0.4, "0.4"),
              ([1, 2], [1, 2, 3]), ([1, 2, 3], [1, 2]), (torch.tensor([1.0, 2.0]), [1.0, 2.5]), (3e-6, 0.0)]
    for answer, expected in wrongs:
        with pytest.raises(AssertionError, match="is not right"):
            check_answer("ex", answer, expected)
    with pytest.raises(AssertionError, match="Hint: divide by ten"):
        check_answer("ex", 0.5, 0.05, hint="divide by ten")
    # a one-element tensor is its number; a list in the wrong shape is told its shape, not a hint about the values
    assert check_answer("ex", torch.tensor([0.5]), 0.5) is True and check_answer("ex", np.array([[0.5]]), 0.5) is True
    with pytest.raises(AssertionError, match=r"expected 3 values \(shape \(3,\)\), got shape \(1, 3\)"):
        check_answer("ex", torch.tensor([[0.0, 0.0, 1.0]]), [0, 0, 1], hint="only one token has p > q")
    with pytest.raises(AssertionError, match="is not right"):  # a 0-d expected value: no shape message, no TypeError
        check_answer("ex", torch.tensor([0.3, 0.2]), np.array(0.5))
    capsys.readouterr()
    for unanswered in (None, ...):
        assert check_answer("ex 3", unanswered, 0.5) is False
        assert "ex 3: not answered yet" in capsys.readouterr().out


def test_alpha_for_speedup_checker_says_a_string_is_not_a_number():
    """``"0.49"`` raised a raw TypeError from a comparison, which the notebooks (catching AssertionError) showed as a
    traceback; a one-element tensor is its number."""
    import pytest

    from specdec_edu.course.exercises import check_alpha_for_speedup

    with pytest.raises(AssertionError, match="is not a number"):
        check_alpha_for_speedup("0.49", 4, 0.086, 1.58, 1.0)
    right = check_alpha_for_speedup(0.4958, 4, 0.086, 1.58, 1.0)
    assert check_alpha_for_speedup(torch.tensor([right]), 4, 0.086, 1.58, 1.0) == right


def test_alpha_for_speedup_checker_holds_its_tolerance_on_both_sides():
    """±0.005 in α is the stated tolerance: 0.0049 off passes, 0.007 off fails (the existing cases stop at 0.012)."""
    import pytest

    from specdec_edu import alpha_for_speedup
    from specdec_edu.course.exercises import check_alpha_for_speedup

    root = alpha_for_speedup(1.5, 4, 0.1, 1.44)
    for off in (0.0049, -0.0049):
        assert check_alpha_for_speedup(root + off, 4, 0.1, 1.44, speedup=1.5) == root
    for off in (0.007, -0.007):
        with pytest.raises(AssertionError, match="predicted speedup"):
            check_alpha_for_speedup(root + off, 4, 0.1, 1.44, speedup=1.5)
    with pytest.raises(AssertionError, match="the answer is 0"):  # vc 0.2: even α = 0 gives 1.67x
        check_alpha_for_speedup(0.007, 4, 0.1, 0.2, speedup=1.5)


def test_a_float16_near_tie_passes_too(capsys):
    """fp16 (a T4's dtype) is 16-bit as much as bf16: a flip between the top two tokens one rounding step apart
    passes, saying so. The tie is made: a hook sets the runner-up's logit one fp16 step below the top one in the
    row that predicts new token 5, in every forward (tiny fp16 models have no margin that close by chance)."""
    from conftest import tiny_llama

    from specdec_edu import autoregressive_generate
    from specdec_edu.course.diagnostics import rounding_step

    model = tiny_llama(seed=0).to(torch.float16)
    tied = len(PROMPT) + 5 - 1  # the absolute position whose row predicts new token 5

    def one_step_tie(module, args, kwargs, out):
        width = kwargs.get("input_ids", args[0] if args else None).shape[1]
        caches = [v for v in kwargs.values() if hasattr(v, "get_seq_length")]
        first = int(caches[0].get_seq_length()) - width if caches else 0  # no cache: the rows start at 0
        row = tied - first - (width - out.logits.shape[1])  # logits_to_keep may keep only the last rows
        if 0 <= row < out.logits.shape[1]:
            logits = out.logits[0, row]
            top, runner_up = logits.float().topk(2).indices.tolist()
            logits[runner_up] = float(logits[top]) - rounding_step(float(logits[top]), torch.float16)

    handle = model.register_forward_hook(one_step_tie, with_kwargs=True)
    try:
        reference = autoregressive_generate(model, PROMPT, max_new_tokens=20, compile=False).row(0)
        with torch.no_grad():
            runner_up = int(model(torch.cat([PROMPT, reference])[None]).logits[0, tied].float().topk(2).indices[1])
        script = reference.clone()
        script[5] = runner_up
        assert check_speculative_round(scripted_round(script), model, None, PROMPT, max_new_tokens=20) is True
        out = capsys.readouterr().out
        assert "PASS (up to rounding)" in out and "near-tie" in out and "float16" in out
    finally:
        handle.remove()


def test_with_a_tokenizer_the_failure_shows_each_tokens_text(target, draft, capsys):
    """Notebook 06 passes its tokenizer: a learner reads "1 (' the')", not a bare id."""
    class Letters:  # a stand-in tokenizer: id i is the letter chr(97 + i % 26)
        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)

    no_crop = lambda *args: greedy_round(*args, crop=False)  # noqa: E731
    assert check_speculative_round(no_crop, target, draft, PROMPT, gamma=4, max_new_tokens=20, tokenizer=Letters()) is False
    out = capsys.readouterr().out
    said_target, text, said_rounds, text_rounds = re.search(
        r"the target's greedy token is (\d+) \('(.)'\), your rounds gave (\d+) \('(.)'\)", out).groups()
    assert text == chr(97 + int(said_target) % 26) and text_rounds == chr(97 + int(said_rounds) % 26)
