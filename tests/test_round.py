"""One round, two loops: the single-prompt loop and the batched loop run the same round
(``round.speculative_round``) and record it the same way (``result.RoundRecorder``), so a
prompt's statistics do not depend on which loop ran it. Also: the timers, α per position
after an EOS, and a drafter's token ids."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import perturbed_copy
from test_greedy import PROMPTS

from specdec_edu import GenerationStats, ModelDrafter, speculative_generate
from specdec_edu import result as result_module

PER_ROUND = ("drafted_per_round", "accepted_per_round", "rejected_per_round", "tokens_per_round")
COUNTERS = ("new_tokens", "rounds", "drafted", "accepted", "rejected_rounds", "stopped_by")


def same_floats(a, b):
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def near_draft(target):
    """A copy of the target with a little noise: greedy α ≈ 0.5 on PROMPTS[4], so every draft position gets judged."""
    return perturbed_copy(target, noise=0.05, seed=3)


@pytest.mark.parametrize("gamma", [2, 4])
def test_batched_row_stats_equal_the_prompt_alone(target, near_draft, gamma):
    """A prompt batched with a copy of itself (so that the batch's shared γ is the prompt's own): each row's
    counters, per-round lists and α per position equal the prompt's single-prompt run (greedy, 24 tokens).
    Before: the batched loop bypassed record_round, so the per-round lists were empty and α per position NaN."""
    prompt = PROMPTS[4]
    alone = speculative_generate(target, near_draft, prompt[None], max_new_tokens=24, gamma=gamma).stats
    out = speculative_generate(target, near_draft, prompt.expand(2, -1), max_new_tokens=24, gamma=gamma)
    assert 0 < alone.rejected_rounds < alone.rounds and all(alone.judged_per_position(gamma))  # a case with everything
    for row in out.row_stats:
        for name in COUNTERS + PER_ROUND:
            assert getattr(row, name) == getattr(alone, name), name
        assert row.alpha_per_position(gamma) == alone.alpha_per_position(gamma)  # no NaN: every position was judged
        assert row.seconds > 0 and len(row.draft_seconds_per_round) == row.rounds
    # The batch's own stats: both rows' rounds pooled, with the batch's rounds (target forwards).
    batch = out.stats
    assert batch.rounds == alone.rounds and batch.new_tokens == 2 * alone.new_tokens
    assert batch.tokens_per_round == alone.tokens_per_round * 2 and sum(batch.tokens_per_round) == sum(out.lengths)
    assert same_floats(batch.alpha_per_position(gamma), alone.alpha_per_position(gamma))


def test_batched_draft_q_is_each_rows_own_draft_model(target, near_draft, monkeypatch):
    """Four DIFFERENT prompts (lengths 3, 5, 8, 13, left-padded), sampled at T = 1, γ = 3, 24 tokens (seed 0): in
    every round, each generating row's q equals the draft model recomputed from scratch on that row's own context
    (its prompt, what it emitted in the earlier rounds, then its drafts), to 1e-4. The rows accept different
    numbers of drafts (0 to γ) in the same round, so the draft cache's mask and unread tokens (``Batch.roll_back``)
    must be rolled back per row. A prompt batched with copies of itself cannot show this (every row has the same
    n), and the tokens cannot either: the output stays the target's whatever q the draft conditioned on."""
    from test_batched import left_pad

    from specdec_edu import logits_to_probs
    from specdec_edu.batched import Batch

    rounds = []  # per round: drafts [B, γ'] and q [B, γ', V]
    draft = Batch.draft

    def recording(self, gamma_round):
        drafts, q = draft(self, gamma_round)
        rounds.append((drafts.clone(), q.clone()))
        return drafts, q

    monkeypatch.setattr(Batch, "draft", recording)
    prompts = PROMPTS[2:6]
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, near_draft, ids, attention_mask=mask, max_new_tokens=24, gamma=3, do_sample=True,
                               generator=torch.Generator().manual_seed(0))
    assert len(rounds) == out.stats.rounds
    accepted = [s.accepted_per_round for s in out.row_stats]
    assert any(len({row[k] for row in accepted if k < len(row)}) > 1 for k in range(len(rounds)))  # rows differ in n
    assert {0, 3} <= {n for row in accepted for n in row}  # rejections at the first draft, and full acceptances
    checked = 0
    for i, prompt in enumerate(prompts):
        emitted = 0
        for k, ((drafts, q), new) in enumerate(zip(rounds, out.row_stats[i].tokens_per_round)):  # row i's rounds
            context = torch.cat([prompt, out.row(i)[:emitted]])
            emitted += new
            if drafts.shape[1] == 0:
                continue
            with torch.no_grad():  # one pass over context + drafts[:-1]: the draft's distribution at every draft
                logits = near_draft(torch.cat([context, drafts[i, :-1]])[None]).logits[0, len(context) - 1:]
            torch.testing.assert_close(q[i], logits_to_probs(logits, temperature=1.0), rtol=1e-4, atol=1e-6,
                                       msg=lambda m, i=i, k=k: f"row {i}, round {k}: {m}")
            checked += 1
    assert checked >= 20


def test_batched_row_stats_add_up(target, close_draft):
    """Prompts of lengths 1–13 in one batch, sampling: every row's per-round lists add up to its counters."""
    from test_batched import left_pad

    ids, mask = left_pad(PROMPTS[:6])
    out = speculative_generate(target, close_draft, ids, attention_mask=mask, max_new_tokens=16, gamma=3, do_sample=True,
                               generator=torch.Generator().manual_seed(0))
    for i, s in enumerate(out.row_stats):
        assert s.rounds == len(s.tokens_per_round) == len(s.drafted_per_round) == len(s.rejected_per_round) > 0
        assert sum(s.tokens_per_round) == s.new_tokens == out.lengths[i]
        assert sum(s.drafted_per_round) == s.drafted and sum(s.accepted_per_round) == s.accepted
        assert sum(s.rejected_per_round) == s.rejected_rounds == out.token_sources[i].count("corrected")
        assert s.judged_per_position(3)[0] > 0 and not math.isnan(s.alpha_per_position(3)[0])


# ---- timers: a fake clock that moves only when something is done ---------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(result_module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


def costs(clock, module, seconds):
    """Make every forward of ``module`` advance the fake clock by ``seconds``; returns the hook handle."""
    return module.register_forward_hook(lambda *_: setattr(clock, "now", clock.now + seconds))


def test_timers_mean_what_their_names_say(target, close_draft, fake_clock, monkeypatch):
    """One prompt, fake costs: a target forward 10 s, a draft forward 1 s, recording a round 100 s (host
    bookkeeping). Then prefill = 10, verify = 10 per round (the verify forward; the rule and the read are
    free here), draft = the draft forwards, and seconds = the wall time = all of it, bookkeeping included.
    Before: the recording of round k was counted as round k+1's draft time, and seconds left it out."""
    record = GenerationStats.record_round

    def slow_record(self, **kwargs):
        fake_clock.now += 100
        record(self, **kwargs)

    monkeypatch.setattr(GenerationStats, "record_round", slow_record)
    draft_forwards = []
    hooks = [costs(fake_clock, target.model, 10), costs(fake_clock, close_draft.model, 1),
             close_draft.model.register_forward_hook(lambda *_: draft_forwards.append(1))]
    try:
        s = speculative_generate(target, close_draft, PROMPTS[4][None], max_new_tokens=20, gamma=4).stats
        single_draft_forwards = len(draft_forwards)
        draft_forwards.clear()
        batch = speculative_generate(target, close_draft, PROMPTS[4].expand(2, -1), max_new_tokens=20, gamma=4)
    finally:
        for hook in hooks:
            hook.remove()
    assert s.prefill_seconds == 10 and s.verify_seconds == 10 * s.rounds and s.draft_seconds == single_draft_forwards
    assert s.seconds == s.prefill_seconds + s.draft_seconds + s.verify_seconds + 100 * s.rounds
    assert s.bookkeeping_seconds == 100 * s.rounds and s.draft_seconds == sum(s.draft_seconds_per_round)
    # The batched loop: the same meanings (its draft forwards all count as drafting; two rows are recorded per round).
    b = batch.stats
    assert b.prefill_seconds == 10 and b.verify_seconds == 10 * b.rounds and b.draft_seconds == len(draft_forwards)
    assert b.seconds == b.prefill_seconds + b.draft_seconds + b.verify_seconds + 200 * b.rounds
    for row in batch.row_stats:
        assert row.draft_seconds == b.draft_seconds and row.verify_seconds == b.verify_seconds
        assert b.seconds - 200 < row.seconds <= b.seconds  # the wall time until the row stopped


# ---- α per position agrees with α (issue 19, bug 6) --------------------------------------------------------


def test_alpha_per_position_after_an_eos_cut(target):
    """The target drafting for itself (greedy: every draft accepted), γ = 3, EOS = the 2nd new token: the first
    round's third draft is cut off by the EOS, never judged. α = 1 and α per position must not say 0 anywhere.
    Before: [1.0, 1.0, 0.0] (the cut draft counted as a rejection)."""
    first = speculative_generate(target, target, PROMPTS[4][None], max_new_tokens=8, gamma=3)
    eos = first.row(0)[1].item()
    s = speculative_generate(target, target, PROMPTS[4][None], max_new_tokens=8, gamma=3, eos_token_id=eos).stats
    assert s.new_tokens == 2 and s.drafted_per_round == [3] and s.alpha == 1.0
    assert same_floats(s.alpha_per_position(3), [1.0, 1.0, float("nan")])
    assert s.judged_per_position(3) == [1, 1, 0] and s.accepted_per_position(3) == [1, 1, 0]


# ---- a drafter's token ids must be integers (issue 19, bug 5) -----------------------------------------------


class FloatIdsDrafter:
    """Returns its (correct) drafts as float32 ids: a common slip when building tokens with torch.tensor([...])."""

    def __init__(self, model):
        self.inner = ModelDrafter(model)

    def reset(self):
        self.inner.reset()

    def propose(self, context, gamma, to_probs, generator=None):
        tokens, q = self.inner.propose(context, gamma, to_probs, generator)
        return tokens.float(), q


def test_float_token_ids_name_the_fix(target, close_draft):
    """Before: a raw ``gather(): Expected dtype int64 for index`` RuntimeError from deep inside the check."""
    with pytest.raises(ValueError, match=r"FloatIdsDrafter.propose returned token ids of dtype torch.float32.*LongTensor"):
        speculative_generate(target, FloatIdsDrafter(close_draft), PROMPTS[4][None], max_new_tokens=8, gamma=3)


# ---- names: what a round asks of a loop, and where the model helpers live (issue 25) --------------------------


def test_both_loops_provide_what_a_round_calls():
    """``round.Loop`` names the four steps a round asks of a loop, for what they do (``read_and_check`` also raises,
    ``roll_back`` rolls the caches back); the single-prompt and the batched loop both provide all four."""
    from specdec_edu.batched import Batch
    from specdec_edu.generate import OnePrompt
    from specdec_edu.round import Loop

    steps = [name for name in vars(Loop) if not name.startswith("_")]
    assert steps == ["draft", "verify", "read_and_check", "roll_back"]
    for loop in (OnePrompt, Batch):
        assert all(callable(getattr(loop, name, None)) for name in steps), loop.__name__


def test_model_shapes_live_with_the_models(target):
    """``head_rows`` and ``max_positions`` read a model's shapes: they live in ``models/shapes.py``."""
    from specdec_edu.models.shapes import head_rows, max_positions

    assert (head_rows(target), max_positions(target)) == (64, 256)  # conftest's tiny_llama
    gpt2_like = SimpleNamespace(config=SimpleNamespace(n_positions=16))  # GPT-2 names its limit n_positions
    assert max_positions(gpt2_like) == 16


def test_head_rows_counts_the_output_head_not_the_embedding():
    """A reduced head (the embedded draft's kind: fewer output rows than input ids) produces only its own rows:
    ``head_rows`` reads the output head, which the loops pad q to and ``check_draft_head`` compares."""
    from conftest import tiny_llama

    from specdec_edu.models.shapes import head_rows

    model = tiny_llama(seed=0)
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(64, 40, bias=False)
    assert (model.get_input_embeddings().weight.shape[0], head_rows(model)) == (64, 40)


# Pinned where a hand mutation of result.py went unseen by the suite.
def test_an_eos_among_the_accepted_drafts_of_a_rejected_round_is_no_rejection():
    """Drafts 5 and 7 accepted, 9 rejected (3 would replace it), and 7 is the EOS: the answer ends at 7, so the
    rejection was never emitted and never judged: α = 2 / 2, not 2 / 3."""
    clock = result_module.PhaseClock(torch.device("cpu"), profile=False)
    recorder = result_module.RoundRecorder(5, max_new_tokens=10, eos=frozenset({7}), max_pos=None, clock=clock)
    phases = {"draft": 0.0, "verify_forward": 0.0, "accept_resample": 0.0, "cache_crop": 0.0}
    assert recorder.add([5, 7, 9], 2, 3, phases) == [5, 7]
    assert recorder.sources == ["accepted", "accepted"] and recorder.stats.stopped_by == "eos"
    assert (recorder.stats.rejected_rounds, recorder.stats.alpha) == (0, 1.0)


def test_verify_seconds_hold_the_forward_and_the_rule():
    """c and the target's seconds per forward read verify_seconds: the verify forward plus the accept/resample
    step, without the draft or the cache crop."""
    stats = GenerationStats()
    stats.record_times({"draft": 1.0, "verify_forward": 2.0, "accept_resample": 3.0, "cache_crop": 4.0}, profile=False)
    assert (stats.draft_seconds, stats.verify_seconds, stats.verify_seconds_per_round) == (1.0, 5.0, [5.0])


def test_pooled_stats_of_generations_that_stopped_differently_say_mixed():
    eos, limit = GenerationStats(stopped_by="eos"), GenerationStats(stopped_by="max_new_tokens")
    assert GenerationStats.pooled([eos, limit]).stopped_by == "mixed"
    assert GenerationStats.pooled([eos, GenerationStats(stopped_by="eos")]).stopped_by == "eos"
