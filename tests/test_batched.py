"""Batched speculative decoding: every row must equal its batch-1 result (greedy) and the
target's distribution (sampling)."""

import copy
import itertools
import sys

import pytest
import torch
from conftest import tiny_llama
from test_greedy import PROMPTS, reference
from test_kv_safety import gpt2
from test_sequence_exactness import PROMPT, SETTINGS, THRESHOLD, exact_distribution, pvalue

from specdec_edu import autoregressive_generate, batched, speculative_generate
from specdec_edu.course.controls import bonus_from_previous_position


def left_pad(prompts, pad=0):
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):], mask[i, n - len(p):] = p, 1
    return ids, mask


@pytest.mark.parametrize("which", ["close_draft", "agreeing_draft"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_batched_greedy_equals_per_row_generate(request, target, which, gamma):
    """8 prompts of lengths 1–13 in one left-padded batch; each row == target.generate on that row alone. With
    ``agreeing_draft`` the rows of one round keep different numbers of drafts (checked), so each row's caches roll
    back by its own amount."""
    prompts = PROMPTS[:8]
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, request.getfixturevalue(which), ids, attention_mask=mask, max_new_tokens=20,
                               gamma=gamma)
    if which == "agreeing_draft" and gamma > 1:
        first_round = {row.accepted_per_round[0] for row in out.row_stats}
        assert len(first_round) >= 2, first_round
    for i, p in enumerate(prompts):
        assert out.row(i).tolist() == reference(target, p, 20)[len(p):].tolist(), (i, gamma)
    base = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=20)
    assert base.new_tokens.tolist() == out.new_tokens.tolist() and base.lengths == out.lengths


def test_a_batched_target_only_row_counts_rounds_as_one_prompt_does(target):
    """Rounds are the target's passes after the prefill; the prefill's token is no round, in a batch as alone
    (the batch counted it: 5 rounds and τ = 1.0 for a row that, alone, had 4 and τ = 1.25)."""
    prompts = PROMPTS[:3]
    ids, mask = left_pad(prompts)
    batch = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=5)
    for i, p in enumerate(prompts):
        alone = autoregressive_generate(target, p[None], max_new_tokens=5).stats
        row = batch.row_stats[i]
        assert (row.new_tokens, row.rounds, row.tokens_per_round) == (alone.new_tokens, alone.rounds, alone.tokens_per_round)


def test_a_batched_target_only_prefill_is_timed_to_its_first_read(target, monkeypatch):
    """The batched baseline stopped the prefill's clock right after launching it, before any read: on a GPU that is
    the launch alone, and the prefill's work landed in round 1. The single-prompt loop stops it once the first token
    is read; so does the batch now (the order of the clock's laps and the host reads, recorded)."""
    from specdec_edu import result

    events, real_lap, real_tolist = [], result.PhaseClock.lap, torch.Tensor.tolist
    monkeypatch.setattr(result.PhaseClock, "lap", lambda self: events.append("lap") or real_lap(self))
    def tolist(self):  # the loop's reads (batched.py's), not validate_prompts' check of the ids before it
        if sys._getframe(1).f_code.co_filename.endswith("batched.py"):
            events.append("read")
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    real_forward = batched._masked_forward
    monkeypatch.setattr(batched, "_masked_forward", lambda *a, **k: events.append("forward") or real_forward(*a, **k))
    ids, mask = left_pad(PROMPTS[:2])
    out = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=3)
    prefill = events.index("forward")
    first_read = events.index("read", prefill)
    assert prefill < first_read < events.index("lap"), events
    assert out.stats.prefill_seconds > 0


def test_batched_per_row_eos_and_limits(target, close_draft):
    prompts = PROMPTS[8:14]
    eos = int(reference(target, prompts[0], 20)[len(prompts[0]) + 3])  # row 0 stops within 4 tokens
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, close_draft, ids, attention_mask=mask, max_new_tokens=20, gamma=4, eos_token_id=eos)
    for i, p in enumerate(prompts):
        assert out.row(i).tolist() == reference(target, p, 20, eos=eos)[len(p):].tolist(), i
    assert out.lengths[0] <= 4 and out.row(0)[-1] == eos and out.row_stats[0].stopped_by == "eos"
    assert out.stats.new_tokens == sum(out.lengths)
    assert [len(s) for s in out.token_sources] == out.lengths
    for sources, stats in zip(out.token_sources, out.row_stats):
        assert sources.count("accepted") == stats.accepted


@pytest.mark.parametrize("gamma", [2, 4])
def test_batched_greedy_with_learned_positions_equals_each_row_alone(gamma):
    """A GPT-2 pair (learned positions) over four left-padded prompts of 3-12 tokens. The Llama pairs above use rotary
    positions, which a shift of every position leaves unchanged: with the position ids one too high, every test
    above passed, while here 3 of the 4 rows differ from the target's."""
    target, draft = gpt2(seed=0, n_positions=128), gpt2(seed=1, n_positions=128)
    prompts = [[5, 9, 3], [4, 8, 2, 6, 1, 7, 3], [9, 1, 12, 33, 5, 7, 2, 8, 40, 3, 6, 11], [2, 4, 6, 8, 10]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=12, gamma=gamma)
    assert out.stats.accepted > 0  # the drafts took part
    assert [out.row(i).tolist() for i in range(4)] == alone(target, prompts, max_new_tokens=12)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_a_bool_or_float_attention_mask_works_as_an_integer_one(dtype):
    """Position ids are counted from the mask: a float mask made float positions, and GPT-2's position embedding
    raised a raw "Expected tensor for argument #1 'indices' … Long" (a review found it). Every mask is 0/1 now."""
    target, draft = gpt2(seed=0, n_positions=64), gpt2(seed=1, n_positions=64)
    prompts = [[5, 9, 3], [4, 8, 2, 6, 1]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    out = speculative_generate(target, draft, ids, attention_mask=mask.to(dtype), max_new_tokens=6, gamma=3)
    base = autoregressive_generate(target, ids, attention_mask=mask.to(dtype), max_new_tokens=6)
    rows = alone(target, prompts, max_new_tokens=6)
    assert [out.row(i).tolist() for i in range(2)] == [base.row(i).tolist() for i in range(2)] == rows


def alone(target, prompts, **kwargs):
    """Each prompt's greedy continuation, target-only, decoded alone: what every row of a batch must equal."""
    return [autoregressive_generate(target, torch.tensor(p)[None], **kwargs).row(0).tolist() for p in prompts]


def test_a_row_that_stops_past_the_draft_models_positions_does_not_end_the_batch():
    """Row A (12 tokens) stops on EOS at its 5th new token, 17 positions, past a 16-position GPT-2 draft; row B
    goes on. The finished row's last tokens must not be fed to the draft. Before: they were (the batch's flags
    dated from before the round), and the draft's position lookup raised IndexError, losing both rows."""
    target, draft = tiny_llama(seed=0), gpt2(seed=0, n_positions=16)
    prompts = [[50, 60, 19, 60, 53, 56, 57, 6, 36, 46, 12, 49], [5, 9, 3, 7]]
    eos = alone(target, prompts[:1], max_new_tokens=8)[0][4]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=12, gamma=4, eos_token_id=eos)
    assert out.lengths[0] == 5 and out.row_stats[0].stopped_by == "eos" and out.lengths[1] == 12  # the case meant
    assert [out.row(i).tolist() for i in range(2)] == alone(target, prompts, max_new_tokens=12, eos_token_id=eos)


def test_a_row_that_stops_on_an_id_the_draft_lacks_does_not_end_the_batch():
    """A draft with 48 token ids under a 64-id target (allowed: q = 0 on the rest). Row A's first token is 63, the
    EOS: A is done, and its 63 is never read. Before: the batch checked A's last token for the draft anyway and
    raised "the context holds token id 63, which the draft model cannot read", which A alone never does."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, vocab_size=48)
    prompts = [[45, 27, 40, 16, 24], [45, 21, 46, 41, 16]]
    ids = torch.tensor(prompts)
    out = speculative_generate(target, draft, ids, max_new_tokens=12, gamma=4, eos_token_id=63)
    assert out.row(0).tolist() == [63] and out.lengths[1] == 12  # the case meant
    assert [out.row(i).tolist() for i in range(2)] == alone(target, prompts, max_new_tokens=12, eos_token_id=63)


def test_padding_with_an_id_the_draft_lacks_is_never_read_by_the_draft():
    """The pad id (60) is checked against the target's embedding; a 48-id draft lacks it. Masked padding must not
    be looked up. Before: the draft embedded it, IndexError (a device assert on CUDA)."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, vocab_size=48)
    prompts = [[5, 9, 3], [4, 8, 2, 6, 1]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts], pad=60)
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=4, gamma=3, pad_token_id=60)
    assert [out.row(i).tolist() for i in range(2)] == alone(target, prompts, max_new_tokens=4)


def test_a_single_left_padded_prompt_drops_its_padding(target, close_draft):
    """A batch of ONE left-padded prompt (``[1, n]`` with a mask, as a tokenizer gives with padding to a fixed length)
    takes the one-prompt path, which must drop the padding as the batch does: its tokens are those of the unpadded
    prompt, both generators. Reading the pad ids as prompt tokens changes every continuation in silence."""
    prompt = PROMPTS[3]
    ids, mask = left_pad([prompt, torch.zeros(len(prompt) + 4, dtype=torch.long)])  # 4 columns of padding on row 0
    ids, mask = ids[:1], mask[:1]
    assert mask[0, :4].tolist() == [0] * 4  # the case meant
    expected = reference(target, prompt, 12)[len(prompt):].tolist()
    for out in (speculative_generate(target, close_draft, ids, attention_mask=mask, max_new_tokens=12, gamma=3),
                autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=12)):
        assert out.row(0).tolist() == expected
        assert out.sequences[0, : ids.shape[1]].tolist() == ids[0].tolist()  # the prompt as given, padding kept


def test_a_row_that_stops_at_the_targets_positions_rides_along_masked():
    """A GPT-2 target (24 learned positions): row A (18 tokens) stops at the position limit after 6 new tokens while
    row B goes on for 12. The finished row rides along in every later forward, masked: its position ids must stop
    growing, or they pass position 23 and the position embedding raises IndexError (a device-side assert on a GPU),
    losing both rows. Rotary targets (the Llama pairs) never notice. Speculative and target-only batches."""
    target, draft = gpt2(seed=0, n_positions=24), gpt2(seed=1, n_positions=24)
    prompts = [list(range(1, 19)), [5, 9, 3, 7]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    for generate in (lambda **kw: speculative_generate(target, draft, gamma=3, **kw),
                     lambda **kw: autoregressive_generate(target, **kw)):
        out = generate(input_ids=ids, attention_mask=mask, max_new_tokens=12)
        assert [s.stopped_by for s in out.row_stats] == ["max_positions", "max_new_tokens"] and out.lengths == [6, 12]
        assert [out.row(i).tolist() for i in range(2)] == alone(target, prompts, max_new_tokens=12)


def capped_greedy(gamma, agreed):
    """A greedy rule that accepts at most ``cap`` drafts, the cap cycling 0, 1, …, γ over its calls (rows in order,
    round after round): rollbacks of every size, while every emitted token stays the target's argmax (exact output).
    Appends to ``agreed``, per call, whether all of the round's drafts were the target's argmax."""
    caps = itertools.cycle(range(gamma + 1))

    def rule(p, q, drafts, generator):
        agree = int((drafts == p[:-1].argmax(-1)).long().cumprod(0).sum())
        agreed.append(agree == len(drafts))
        n = min(agree, next(caps))
        return n, p[n].argmax()

    return rule


def drafted_the_argmax(target, draft, prompts, gamma):
    """For each round of each row still generating (finished rows ride along; their drafts mean nothing): did the
    draft propose the target's argmax? One batched greedy run under ``capped_greedy``, output checked exact."""
    ids, mask = left_pad(prompts)
    agreed = []
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=20, gamma=gamma,
                               accept_fn=capped_greedy(gamma, agreed))
    for i, p in enumerate(prompts):
        assert out.row(i).tolist() == reference(target, p, 20)[len(p):].tolist()
    B = len(prompts)  # the rule is called row by row, every round: call k is row k % B in round k // B
    return [a for k, a in enumerate(agreed) if k // B < out.row_stats[k % B].rounds]


def test_a_batch_drafting_with_the_target_itself_drafts_the_targets_argmax(target):
    """The draft's cache after a round must hold exactly each row's tokens: the kept drafts (x_γ too, which was never
    fed while drafting, when all γ are kept), then the target's token, with every rejected slot masked. With the
    target as its own draft (greedy) each draft is then the target's argmax, in every round and row, whatever the
    rule kept (``capped_greedy``: 0 … γ drafts; 3 rows against a cycle of 4 caps, so each row meets every cap). A
    draft that missed a token, or attended to a rejected one, drafts from the wrong context: the output stays exact,
    only α falls, so no other test sees it. Control: with an unrelated draft the same check fails."""
    agreed = drafted_the_argmax(target, target, PROMPTS[:3], gamma=3)
    assert len(agreed) >= 20 and all(agreed)  # 27 row-rounds
    assert not all(drafted_the_argmax(target, tiny_llama(seed=1), PROMPTS[:3], gamma=3))


def batched_samples(target, draft, settings, **kwargs):
    """1,500 three-token continuations drawn as 30 batches of 50 rows (seed 5)."""
    gen = torch.Generator().manual_seed(5)
    samples = []
    for _ in range(30):
        out = speculative_generate(
            target, draft, PROMPT.expand(50, -1), max_new_tokens=3, gamma=2, do_sample=True, generator=gen, **settings, **kwargs
        )
        samples += [tuple(row) for row in out.new_tokens.tolist()]
    return samples


def test_batched_sampling_follows_target(small_vocab_pair):
    """The sequence-level χ² test (1,500 samples, level 1e-3), drawn in batches."""
    target, draft = small_vocab_pair
    settings = SETTINGS[0]
    assert pvalue(batched_samples(target, draft, settings), exact_distribution(target, **settings)) > THRESHOLD


def test_batched_bonus_tokens_follow_target(small_vocab_pair):
    """With the draft the target itself (q = p) every draft is accepted, so each 3-token continuation at γ = 2 ends in
    a bonus token, which the shared-γ batches above rarely reach: a bonus drawn from the previous position's p passed
    that test (p = 0.05). The same χ² (1,500 samples, seed 5, level 1e-3); that broken bonus is its control."""
    target, _ = small_vocab_pair
    draft, settings = copy.deepcopy(target), SETTINGS[0]
    one = speculative_generate(target, draft, PROMPT.expand(4, -1), max_new_tokens=3, gamma=2, do_sample=True,
                               generator=torch.Generator().manual_seed(0), **settings)
    assert one.token_sources == [["accepted", "accepted", "bonus"]] * 4  # the case meant
    exact = exact_distribution(target, **settings)
    assert pvalue(batched_samples(target, draft, settings), exact) > THRESHOLD
    assert pvalue(batched_samples(target, draft, settings, accept_fn=bonus_from_previous_position), exact) < THRESHOLD


@pytest.mark.parametrize("batch", [1, 2])
def test_sampling_is_reproducible_from_its_generator_alone(small_vocab_pair, batch):
    """The same generator seed gives the same sample whatever the global RNG holds; with no generator the global RNG
    decides (the control: it must differ). Before the test, a batched accept step that dropped the generator
    passed every test, and each batched statistical test's "fixed seed" was no longer fixed."""
    target, draft = small_vocab_pair

    def sample(global_seed, generator):
        torch.manual_seed(global_seed)
        return speculative_generate(target, draft, PROMPT.expand(batch, -1), max_new_tokens=16, gamma=3,
                                    do_sample=True, generator=generator).sequences.tolist()

    assert sample(1, torch.Generator().manual_seed(0)) == sample(2, torch.Generator().manual_seed(0))
    assert sample(1, None) != sample(2, None)


# The batched baseline's samplers: the right one, and two that forget a warper (controls the same test must reject).
BASELINE_SAMPLERS = {"warped": SETTINGS[1], "temperature_ignored": {**SETTINGS[1], "temperature": 1.0},
                     "top_k_ignored": {**SETTINGS[1], "top_k": 0}}


@pytest.mark.parametrize("sampler", BASELINE_SAMPLERS)
def test_batched_target_only_sampling_follows_target(small_vocab_pair, sampler):
    """The batched baseline (``autoregressive_generate`` on a batch) at T = 0.8 with top-3, as
    test_target_only_sampling_passes_too checks the single-prompt one: 1,500 continuations of PROMPT drawn as 30
    batches of 50 copies (seed 1), χ² against the enumerated distribution at level 1e-3. The same test must reject
    a sampler that ignores the temperature (draws at T = 1, top-3) or top-k (T = 0.8, no top-k). Measured once over
    seeds 0..4: the warped sampler's smallest p-value 0.27; temperature ignored, the largest 4e-18; top-k ignored, 0
    (an outcome of probability 0 on every seed)."""
    target, _ = small_vocab_pair
    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(30):
        out = autoregressive_generate(target, PROMPT.expand(50, -1), max_new_tokens=3, do_sample=True, generator=gen,
                                      **BASELINE_SAMPLERS[sampler])
        samples += [tuple(row) for row in out.new_tokens.tolist()]
    p_value = pvalue(samples, exact_distribution(target, **SETTINGS[1]))
    assert p_value > THRESHOLD if sampler == "warped" else p_value < THRESHOLD, p_value


LONG_PROMPT = torch.tensor([[3, 6, 4, 1, 5, 2]])  # 6 tokens: PROMPT's rows (4 tokens) are left-padded by 2


@pytest.mark.parametrize("mask", ["padding_masked", "padding_read"])
def test_left_padded_rows_of_different_prompts_follow_their_targets(small_vocab_pair, mask):
    """Rows of two prompts in one batch, the shorter left-padded: each row's continuations must follow the target's
    distribution after its own prompt (the tests above batch copies of one prompt, which need no padding). 30 batches
    of 100 rows (50 per prompt, seed 7): 1,500 continuations per prompt, the sequence χ² at level 1e-3, T = 0.6.
    Control: the same batches with the padding read as tokens (an all-ones mask): the padded rows must fail.
    Measured at seeds 7, 0 and 1: with the mask, the smallest p-value 0.033 (seed 7: 0.046 and 0.72); with the pads
    read, the padded rows' p-value 0.0 at each seed (the χ² statistic past float range)."""
    target, draft = small_vocab_pair
    settings = SETTINGS[0]
    ids, attention = left_pad([PROMPT[0], LONG_PROMPT[0]] * 50)  # even rows PROMPT (padded), odd rows LONG_PROMPT
    if mask == "padding_read":
        attention = torch.ones_like(attention)
    gen, samples = torch.Generator().manual_seed(7), {0: [], 1: []}
    for _ in range(30):
        out = speculative_generate(target, draft, ids, attention_mask=attention, max_new_tokens=3, gamma=2,
                                   do_sample=True, generator=gen, **settings)
        for i, row in enumerate(out.new_tokens.tolist()):
            samples[i % 2].append(tuple(row))
    short = pvalue(samples[0], exact_distribution(target, **settings, prompt=PROMPT))
    long = pvalue(samples[1], exact_distribution(target, **settings, prompt=LONG_PROMPT))
    assert long > THRESHOLD, long  # the unpadded rows: right either way
    assert short > THRESHOLD if mask == "padding_masked" else short < THRESHOLD, short


def test_batched_negative_control_is_rejected(small_vocab_pair):
    """Same batched test with the always-accept rule: must fail."""
    from specdec_edu.course.controls import accept_always

    target, draft = small_vocab_pair
    settings = SETTINGS[0]
    samples = batched_samples(target, draft, settings, accept_fn=accept_always)
    assert pvalue(samples, exact_distribution(target, **settings)) < THRESHOLD
