"""Greedy speculative decoding must reproduce target.generate(do_sample=False) token for token (fp32)."""

import pytest
import torch
from conftest import tiny_llama

from specdec_edu import ModelDrafter, PromptLookupDrafter, autoregressive_generate, speculative_generate

LENGTHS = [1, 2, 3, 5, 8, 13] * 4
PROMPTS = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(s)) for s, n in zip(range(24), LENGTHS)]


def reference(target, prompt, max_new_tokens, eos=None):
    """HF's greedy output. The explicit all-ones mask stops generate() from masking prompt
    tokens that happen to equal pad_token_id."""
    ids = prompt[None]
    return target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0
    )[0]


@pytest.mark.parametrize("which", ["close_draft", "draft", "agreeing_draft"])
def test_greedy_equals_generate_for_24_prompts_and_gamma_1_to_8(request, target, which):
    """24 prompts (lengths 1–13) × γ = 1..8 (cycled): identical tokens, with and without EOS."""
    drafter = request.getfixturevalue(which)
    for i, prompt in enumerate(PROMPTS):
        gamma = 1 + i % 8
        expected = reference(target, prompt, 24)
        out = speculative_generate(target, drafter, prompt[None], max_new_tokens=24, gamma=gamma)
        assert out.sequences[0].tolist() == expected.tolist(), (i, gamma)
        # EOS: make the token the target emits at step 6 the EOS; both must stop right after it.
        eos = int(expected[len(prompt) + 6])
        expected = reference(target, prompt, 24, eos=eos)
        out = speculative_generate(target, drafter, prompt[None], max_new_tokens=24, gamma=gamma, eos_token_id=eos)
        assert out.sequences[0].tolist() == expected.tolist(), (i, gamma, "eos")
        assert out.sequences[0, -1] == eos and out.stats.new_tokens <= 7


@pytest.mark.parametrize("which", ["close_draft", "agreeing_draft"])
def test_all_gammas_on_one_prompt(request, target, which):
    drafter = request.getfixturevalue(which)
    expected = reference(target, PROMPTS[4], 40)
    for gamma in range(1, 9):
        out = speculative_generate(target, drafter, PROMPTS[4][None], max_new_tokens=40, gamma=gamma)
        assert out.sequences[0].tolist() == expected.tolist(), gamma
        assert out.stats.new_tokens == 40 and sum(out.stats.tokens_per_round) == 40


def test_agreeing_draft_keeps_every_number_of_drafts(target, agreeing_draft, close_draft):
    """The greedy tests above can only catch a bug in the rounds their drafts produce. With ``agreeing_draft``, over
    the 24 prompts at γ = 4, rounds keep 0, 1, 2, 3 and all 4 drafts (each at least twice): every rollback size and
    the bonus token are exercised. The control: ``close_draft`` (α ≈ 0.09 greedy) never keeps all 4."""
    def kept_counts(drafter):
        counts = [0] * 5
        for prompt in PROMPTS:
            for kept in speculative_generate(target, drafter, prompt[None], max_new_tokens=24, gamma=4).stats.accepted_per_round:
                counts[kept] += 1
        return counts

    assert min(kept_counts(agreeing_draft)) >= 2
    assert kept_counts(close_draft)[4] == 0


def test_identical_draft_accepts_everything(target):
    out = speculative_generate(target, target, PROMPTS[5][None], max_new_tokens=30, gamma=4)
    assert out.stats.alpha == 1.0 and out.stats.rejected_rounds == 0
    assert out.stats.tokens_per_round[:5] == [5] * 5  # γ accepted + 1 bonus per round
    assert out.token_sources[0][:5] == ["accepted"] * 4 + ["bonus"]
    assert out.sequences[0].tolist() == reference(target, PROMPTS[5], 30).tolist()


def test_prompt_lookup_and_baseline(target):
    prompt = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6])  # repetitive: lookup proposes a lot
    expected = reference(target, prompt, 30)
    out = speculative_generate(target, PromptLookupDrafter(), prompt[None], max_new_tokens=30, gamma=5)
    assert out.sequences[0].tolist() == expected.tolist()
    assert out.stats.drafted > 0
    base = autoregressive_generate(target, prompt[None], max_new_tokens=30)
    assert base.sequences[0].tolist() == expected.tolist()


def test_prompt_lookup_drafts_that_the_target_accepts_are_its_own_tokens():
    """The test above hardly exercises acceptance: its random target does not repeat the prompt (2 of 33 drafts
    accepted), so a greedy rule comparing each draft with the *next* position's argmax passed it. Here the target's
    attention and MLP outputs are zeroed, so its next token depends on the last one only, and from [5, 6, 7] its
    greedy output falls into a 7-token cycle; a prompt holding that cycle twice lets lookup draft whole rounds that
    the target accepts. Token for token in fp32, with many drafts accepted and bonus tokens."""
    target = tiny_llama(seed=2)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    start = torch.tensor([5, 6, 7])
    prompt = reference(target, start, 16)  # [5, 6, 7] and 16 tokens: the 7-token cycle twice
    expected = reference(target, prompt, 30)
    out = speculative_generate(target, PromptLookupDrafter(), prompt[None], max_new_tokens=30, gamma=5)
    assert out.sequences[0].tolist() == expected.tolist()
    assert out.stats.accepted >= 20 and out.token_sources[0].count("bonus") >= 3, (out.stats, out.token_sources[0])


def test_never_exceeds_max_new_tokens(target, close_draft):
    """With the target as its own draft every round keeps all γ = 5 drafts and its bonus, so a round that did not
    cut γ to the tokens left would overshoot every limit here (close_draft, which keeps few, overshot only one)."""
    for drafter in (target, close_draft):
        for max_new in [1, 2, 3, 7]:
            out = speculative_generate(target, drafter, PROMPTS[3][None], max_new_tokens=max_new, gamma=5)
            assert out.stats.new_tokens == max_new == out.sequences.shape[1] - len(PROMPTS[3]) == len(out.token_sources[0])


def test_explicit_model_drafter_and_reuse(target, close_draft):
    """A ModelDrafter object can be reused across calls: its cache resyncs with each new context. Sampled, so that
    every draft's q counts: a reused drafter whose cache kept the last call's keys and values would draft from other
    q, and the same seed would then accept other drafts than a fresh drafter does."""
    drafter = ModelDrafter(close_draft)
    for prompt in PROMPTS[:4]:
        reused, fresh = (speculative_generate(target, d, prompt[None], max_new_tokens=15, gamma=3, do_sample=True,
                                              generator=torch.Generator().manual_seed(0))
                         for d in (drafter, ModelDrafter(close_draft)))
        assert reused.sequences.tolist() == fresh.sequences.tolist()
        assert reused.stats.accepted_per_round == fresh.stats.accepted_per_round and reused.stats.accepted > 0



@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_speculative_decoding_without_a_generator_leaves_the_global_rng_alone(target, close_draft, batch):
    """Greedy speculative decoding needs no draw for its output, but the draft loop draws each token from q (one-hot
    here): with no generator those draws came from torch's global RNG, 16,384 exponentials per drafted token for the
    embedded draft, so ``torch.manual_seed``'s stream moved under later code (a review found it). A greedy run
    without a generator now drafts with a private one. Control: a sampled run without one still draws from the
    global RNG, as documented."""
    ids = torch.stack([PROMPTS[4], PROMPTS[10]])[:batch]
    mask = torch.ones_like(ids)

    def moves_global_rng(**kw):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        speculative_generate(target, close_draft, ids, attention_mask=mask, max_new_tokens=8, gamma=3, **kw)
        return not torch.equal(before, torch.get_rng_state())

    assert not moves_global_rng()
    assert moves_global_rng(do_sample=True)  # the control


def test_greedy_target_only_decoding_leaves_the_random_numbers_alone(target):
    """Greedy target-only decoding is an argmax: one prompt's loop takes it, and a batch's drew a token from the
    one-hot p instead (the same token), which moved the caller's generator, or torch's global one with
    ``generator=None``, so a later sampled call with it drew other tokens. (A drafter's draws use the generator in
    greedy runs too, on purpose: a drafter may sample from a q that is not one-hot, as the dial does; with no
    generator, a private one.) Control: a
    sampled call moves both."""
    ids, mask = torch.stack([PROMPTS[4], PROMPTS[10]]), torch.ones(2, 8, dtype=torch.long)  # two 8-token prompts
    calls = {
        "one prompt": lambda **kw: autoregressive_generate(target, PROMPTS[4][None], max_new_tokens=8, **kw),
        "a batch": lambda **kw: autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=8, **kw),
    }
    for name, call in calls.items():
        torch.manual_seed(0)
        untouched = torch.rand(1).item()
        torch.manual_seed(0)
        call()
        assert torch.rand(1).item() == untouched, name
        g = torch.Generator().manual_seed(1)
        state = g.get_state()
        call(generator=g)
        assert torch.equal(g.get_state(), state), name
        call(generator=g, do_sample=True)
        assert not torch.equal(g.get_state(), state), name  # the control: sampling draws from it
