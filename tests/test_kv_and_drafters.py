"""KV-cache rollbacks, drafters, and the generation statistics."""

import pytest
import torch

from specdec_edu import ModelDrafter, PromptLookupDrafter, kv, logits_to_probs, speculative_generate
from specdec_edu.drafters import common_prefix_length


def full_logits(model, ids):
    with torch.no_grad():
        return model(ids[None]).logits[0, -1]


def test_target_cache_after_rollback_matches_recompute(target):
    """Feed 6 tokens, crop 4 (rejected drafts), feed 2 others: the logits equal a from-scratch pass."""
    ids = torch.arange(10, 20)
    cache = kv.new_cache(target)
    with torch.no_grad():
        kv.forward_cached(target, ids[None, :6], cache)
        kv.forward_cached(target, torch.tensor([[40, 41, 42, 43]]), cache)  # 4 "draft" tokens
        kv.crop(cache, 3)  # three rejected
        assert kv.cache_length(cache) == 7
        logits = kv.forward_cached(target, torch.tensor([[44, 45]]), cache).logits[0, -1]
    expected = full_logits(target, torch.cat([ids[:6], torch.tensor([40, 44, 45])]))
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_crop_zero_is_a_no_op(target):
    cache = kv.new_cache(target)
    with torch.no_grad():
        kv.forward_cached(target, torch.tensor([[1, 2, 3]]), cache)
    kv.crop(cache, 0)
    assert kv.cache_length(cache) == 3


def test_crop_refuses_a_cache_that_cannot_roll_back():
    """E.g. a recurrent (linear-attention) layer's state: rejecting drafts would leave it wrong."""

    class RecurrentCache:
        is_croppable = False

    with pytest.raises(ValueError, match="attention-only"):
        kv.crop(RecurrentCache(), 1)
    with pytest.raises(ValueError, match="n_remove"):
        kv.crop(RecurrentCache(), -1)


def assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs):
    """Row i of q is the draft model's distribution after context + tokens[:i], recomputed from scratch."""
    for i in range(len(tokens)):
        expected = to_probs(full_logits(draft, torch.cat([context, tokens[:i]])))
        torch.testing.assert_close(q[i], expected, rtol=1e-4, atol=1e-6)


DRAFTERS = {
    "dynamic": lambda model: ModelDrafter(model),
    # the static cache, compiled (aot_eager: graph capture without code generation, as in test_compiled.py)
    "compiled": lambda model: ModelDrafter(model, compile=True, compile_options={"backend": "aot_eager"}),
}


@pytest.mark.parametrize("kind", DRAFTERS)
def test_model_drafter_q_matches_recompute_after_rollbacks(draft, generator, kind):
    """Across rounds with rejections (contexts that diverge from what was drafted), the
    drafter's q equals the draft model's distribution recomputed from scratch. The contexts
    are built as the loop builds them: on the host, accepted drafts then one target token."""
    drafter = DRAFTERS[kind](draft)
    to_probs = lambda logits: logits_to_probs(logits, temperature=1.0)
    context = torch.tensor([3, 1, 4, 1, 5])
    for round_ in range(6):
        tokens, q = drafter.propose(context, 4, to_probs, generator)
        assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)
        keep = round_ % 5  # accept `keep` drafts (4 = all: then a bonus token), then a token the drafter did not propose
        tokens = tokens.cpu()
        context = torch.cat([context, tokens[:keep], torch.tensor([(int(tokens[min(keep, 3)]) + 1) % 64])])


@pytest.mark.parametrize("kind", DRAFTERS)
def test_model_drafter_new_prompt_and_repeated_context(draft, generator, kind):
    """Contexts that do not extend the last one fall back to the common prefix; the same
    context twice re-drafts from the same place; reset() forgets everything."""
    drafter = DRAFTERS[kind](draft)
    to_probs = lambda logits: logits_to_probs(logits, temperature=1.0)
    first = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    contexts = [
        first,
        torch.tensor([3, 1, 4, 7, 7, 7, 7, 7, 7, 7, 7]),  # a new, LONGER prompt sharing 3 tokens: not an extension
        torch.tensor([3, 1, 4, 7, 7, 7, 7, 7, 7, 7, 7]),  # the same context again
        torch.tensor([8, 8]),  # a new, shorter prompt sharing nothing
        torch.tensor([8]),  # a prefix of the last context
    ]
    for context in contexts:
        tokens, q = drafter.propose(context, 3, to_probs, generator)
        assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)
    # An extension by tokens that were not the drafts breaks the loop's contract: reset() first.
    drafter.reset()
    context = torch.cat([torch.tensor([8]), (tokens.cpu() + 1) % 64])
    tokens, q = drafter.propose(context, 3, to_probs, generator)
    assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)


def test_model_drafter_keeps_accepted_drafts_cached(draft, generator):
    """After a round that accepts drafts, only the new tokens are fed (the cache is reused)."""
    drafter = ModelDrafter(draft)
    fed = []
    next_logits = drafter.next_logits
    drafter.next_logits = lambda new: fed.append(new.numel()) or next_logits(new)
    to_probs = lambda logits: logits_to_probs(logits, temperature=1.0)
    context = torch.tensor([3, 1, 4, 1, 5])
    tokens, _ = drafter.propose(context, 4, to_probs, generator)  # feeds the prompt, then 3 drafts
    context = torch.cat([context, tokens[:2], torch.tensor([63])])  # 2 accepted, then the target's token
    drafter.propose(context, 4, to_probs, generator)
    assert fed == [5, 1, 1, 1, 1, 1, 1, 1]  # round 2 feeds only the target's token (drafts 1-2 are cached)
    assert drafter.n_cached == len(context) + 3


def test_reduced_head_drafter(target, close_draft, generator):
    """A head over the first 32 of 64 ids: q is zero beyond, and greedy output is still exact."""
    drafter = ModelDrafter(close_draft, head_size=32)
    tokens, q = drafter.propose(torch.tensor([1, 2, 3]), 3, lambda logits: logits_to_probs(logits), generator)
    assert q.shape == (3, 32) and (tokens < 32).all()
    prompt = torch.tensor([[7, 8, 9]])
    out = speculative_generate(target, drafter, prompt, max_new_tokens=20, gamma=3)
    ref = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert out.sequences.tolist() == ref.tolist()


def test_reduced_head_keeps_the_heads_bias(close_draft, generator):
    """A draft whose lm_head has a bias, with a reduced head as wide as the vocabulary: q is the model's own softmax,
    one prompt and a batch. Before: the reduced head multiplied by the weight rows only (TV to the model's q 0.79)."""
    import copy

    from specdec_edu.batched import Batch
    from specdec_edu.sampling import GenerationConfig

    biased = copy.deepcopy(close_draft)
    head = biased.lm_head
    biased.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.lm_head.weight.copy_(head.weight)
        biased.lm_head.bias.copy_(torch.randn(head.out_features, generator=torch.Generator().manual_seed(0)))
    to_probs = lambda logits: logits_to_probs(logits)
    context = torch.tensor([1, 2, 3])
    tokens, q = ModelDrafter(biased, head_size=64).propose(context, 2, to_probs, generator)
    assert_q_is_the_draft_model(None, biased, context, tokens, q, to_probs)
    config = GenerationConfig(max_new_tokens=4, do_sample=True)
    batch = Batch(biased, ModelDrafter(biased, head_size=64), context.expand(2, -1), torch.ones(2, 3, dtype=torch.long),
                  config, generator)
    with torch.no_grad():
        logits = batch.draft_logits(*batch.unread)  # [2, 64]: the first draft position of each row
    torch.testing.assert_close(logits[0], full_logits(biased, context), rtol=1e-4, atol=1e-5)


def test_prompt_lookup_finds_latest_match():
    drafter = PromptLookupDrafter(max_ngram=2)
    context = torch.tensor([1, 2, 3, 9, 9, 1, 2, 4, 5, 6, 1, 2])
    tokens, q = drafter.propose(context, 3)
    assert tokens.tolist() == [4, 5, 6]  # "1 2" last seen before "4 5 6"
    assert torch.equal(q.argmax(-1), tokens) and torch.equal(q.sum(-1), torch.ones(3))
    assert drafter.propose(torch.tensor([1, 2, 3]), 3)[0].numel() == 0  # no earlier match: no draft
    assert drafter.propose(torch.tensor([7]), 3)[0].numel() == 0
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_common_prefix_length():
    assert common_prefix_length(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4, 5])) == 2
    assert common_prefix_length(torch.tensor([1, 2]), torch.tensor([1, 2, 3])) == 2
    assert common_prefix_length(torch.tensor([], dtype=torch.long), torch.tensor([1])) == 0


def test_stats_are_consistent(target, close_draft, generator):
    prompt = torch.tensor([[1, 2, 3]])
    out = speculative_generate(target, close_draft, prompt, max_new_tokens=40, gamma=4, do_sample=True, generator=generator)
    s = out.stats
    sources = out.token_sources[0]  # one list of labels per row
    assert s.new_tokens == 40 == sum(s.tokens_per_round) == len(sources)
    assert s.rounds == len(s.accepted_per_round) and s.accepted == sum(s.accepted_per_round)
    assert s.drafted == sum(s.drafted_per_round) and 0 <= s.accepted <= s.drafted
    assert 0 < s.alpha <= 1 and s.accepted_per_drafted <= s.alpha
    assert s.tau == pytest.approx(40 / s.rounds)
    # One time per round, adding up to the totals (what the timers measure: test_round.py's fake clock).
    assert len(s.draft_seconds_per_round) == len(s.verify_seconds_per_round) == s.rounds == len(s.rejected_per_round)
    assert s.draft_seconds == pytest.approx(sum(s.draft_seconds_per_round))
    assert s.verify_seconds == pytest.approx(sum(s.verify_seconds_per_round))
    assert sources.count("accepted") == s.accepted
    assert sources.count("corrected") == s.rejected_rounds


def test_every_generation_starts_with_a_reset_drafter(target):
    """Drafters with state (a cache, a γ schedule) get ``reset()`` before each generation."""

    class CountingLookup(PromptLookupDrafter):
        resets = 0

        def reset(self):
            self.resets += 1

    drafter = CountingLookup()
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    for expected in (1, 2):
        speculative_generate(target, drafter, ids, max_new_tokens=4, gamma=2)
        assert drafter.resets == expected
