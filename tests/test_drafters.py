"""The drafter protocol (specdec_edu.drafters): the one drafting loop, the optional hooks, the draft
model's own position limit, and the draft model's cache behind prompt lookup."""

import warnings
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama
from test_feature_drafters import forced_onto

from specdec_edu import LookupThenDrafter, ModelDrafter, PromptLookupDrafter, autoregressive_generate, speculative_generate
from specdec_edu.drafters import check_drafter_target, draft_loop, reset_drafter, wants_features
from specdec_edu.sampling import sample
from specdec_edu.verify import accept_and_resample, verify_drafts

# ---- draft_loop: sample, feed back unless last ----------------------------------------------------

V = 5


def chain_feed(fed):
    """A fake drafter step: after token x the logits put (almost) all mass on x + 1 mod V."""
    def feed(tokens):
        fed.append(tokens.clone())
        return 20.0 * torch.nn.functional.one_hot((tokens + 1) % V, V).float()
    return feed


def test_draft_loop_one_prompt_draws_like_sample_and_never_feeds_the_last_draft():
    logits, fed = torch.tensor([0.5, 1.0, -1.0, 0.0, 2.0]), []
    tokens, q = draft_loop(logits, 4, lambda x: x.softmax(-1), torch.Generator().manual_seed(3), chain_feed(fed))
    assert tokens.shape == (4,) and q.shape == (4, V)
    assert [int(t) for t in fed] == tokens[:3].tolist()  # γ − 1 feeds, of the drafts, in order
    torch.testing.assert_close(q[0], logits.softmax(-1))
    # the same draws as sampling.sample with the same generator, one distribution after the other
    generator = torch.Generator().manual_seed(3)
    assert [int(sample(q_i, generator)) for q_i in q] == tokens.tolist()


def test_draft_loop_batch_drafts_each_row_from_its_own_q():
    """Greedy on the chain x → x + 1: row b starts at its argmax and follows the chain; q is one-hot per row."""
    logits = 20.0 * torch.nn.functional.one_hot(torch.tensor([0, 3, 4]), V).float()  # [B=3, V]
    greedy = lambda x: torch.nn.functional.one_hot(x.argmax(-1), V).float()  # noqa: E731
    fed = []
    tokens, q = draft_loop(logits, 3, greedy, None, chain_feed(fed))
    assert tokens.tolist() == [[0, 1, 2], [3, 4, 0], [4, 0, 1]]
    assert q.shape == (3, 3, V) and torch.equal(q.argmax(-1), tokens)
    assert len(fed) == 2 and fed[0].shape == (3,)
    empty_tokens, empty_q = draft_loop(logits, 0, greedy, None, chain_feed([]))
    assert empty_tokens.shape == (3, 0) and empty_q.shape == (3, 0, V)


def test_draft_loop_refuses_a_generator_on_another_device():
    """A CUDA generator for CPU tensors (faked: CI has no GPU to make a real one) is refused, naming the fix."""
    cuda_generator = SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(ValueError, match=r"torch.Generator\(device='cpu'\)"):
        draft_loop(torch.zeros(V), 2, lambda x: x.softmax(-1), cuda_generator, chain_feed([]))


def test_the_rule_refuses_a_generator_on_another_device():
    """verify_drafts and accept_and_resample, called directly as the notebooks do, check the generator too."""
    p, q, drafts = torch.full((3, V), 1.0 / V), torch.full((2, V), 1.0 / V), torch.tensor([1, 2])
    cuda_generator = SimpleNamespace(device=torch.device("cuda"))
    for rule in (verify_drafts, accept_and_resample):
        with pytest.raises(ValueError, match=r"torch.Generator\(device='cpu'\)"):
            rule(p, q, drafts, cuda_generator)


# ---- the optional hooks -------------------------------------------------------------------------


class Bare:
    def propose(self, context, gamma, to_probs, generator=None):
        return context[:0], torch.zeros(0, 1)


class Hooked(Bare):
    def __init__(self):
        self.calls = []

    def reset(self):
        self.calls.append("reset")

    def observe(self, features):
        self.calls.append("observe")

    def check_target(self, target):
        raise ValueError("not my target")


def test_hooks_are_optional_and_pass_through_lookup():
    bare, hooked = Bare(), Hooked()
    reset_drafter(bare)  # no hooks: nothing to call, nothing raised
    check_drafter_target(bare, None)
    assert not wants_features(bare) and wants_features(hooked)
    reset_drafter(hooked)
    assert hooked.calls == ["reset"]
    with pytest.raises(ValueError, match="not my target"):
        check_drafter_target(hooked, None)
    # LookupThenDrafter: the fallback's hooks, and asks for features only if the fallback does
    assert not wants_features(LookupThenDrafter(bare))
    hybrid = LookupThenDrafter(hooked)
    assert wants_features(hybrid)
    reset_drafter(hybrid)
    assert hooked.calls == ["reset", "reset"]
    with pytest.raises(ValueError, match="not my target"):
        check_drafter_target(hybrid, None)


# ---- the draft model's own position limit (issue 19, bug 4) ---------------------------------------


def gpt2_draft(n_positions):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=n_positions, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval().requires_grad_(False)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_context_longer_than_the_draft_reads_is_refused_by_name(target, family):
    """GPT-2 (learned positions: a raw IndexError before) and Llama (rotary: silently past its trained range)."""
    draft = gpt2_draft(16) if family == "gpt2" else tiny_llama(seed=1, max_positions=16)
    prompt = torch.arange(20) % 64
    with pytest.raises(ValueError, match="draft model reads at most 16 positions.*20 tokens"):
        speculative_generate(target, ModelDrafter(draft), prompt[None], max_new_tokens=5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_output_that_outgrows_the_draft_is_finished_by_the_target(target, family):
    """A 10-token prompt, 20 new tokens, a draft that reads 16 positions: the draft drafts while it can, one warning
    says when it stops, and the target finishes alone: its own tokens, all 20. Before: a ValueError at token 17, and
    the generated tokens were lost."""
    draft = gpt2_draft(16) if family == "gpt2" else tiny_llama(seed=1, max_positions=16)
    prompt = (torch.arange(10) * 7 % 64)[None]
    with pytest.warns(UserWarning, match="reads at most 16 positions .* from here the target decodes alone") as said:
        out = speculative_generate(target, draft, prompt, max_new_tokens=20, gamma=4)
    assert len([w for w in said if "decodes alone" in str(w.message)]) == 1
    assert out.row(0).tolist() == autoregressive_generate(target, prompt, max_new_tokens=20).row(0).tolist()
    assert out.stats.drafted > 0 and out.stats.drafted_per_round[-1] == 0  # drafted early on, not at the end


def test_a_draft_behind_lookup_that_first_drafts_past_its_limit_lets_the_target_finish():
    """An 18-token prompt that repeats itself: prompt lookup drafts the first round, so the draft model behind it
    (16 positions) is first asked in a later round. It took that first call for the prompt's round and refused the
    generation, naming a prompt longer than the one given. Now it warns once and the generation ends with the
    target's own tokens. A prompt whose first round falls to the draft model is still refused."""
    draft = tiny_llama(seed=1, max_positions=16)
    prompt = (torch.arange(18) % 6)[None]  # ends in 3, 4, 5, as at position 3: lookup drafts the first round
    calls = []
    fallback = ModelDrafter(draft)
    propose = fallback.propose
    fallback.propose = lambda context, *args: (calls.append(len(context)), propose(context, *args))[1]
    target = tiny_llama(seed=0)
    with pytest.warns(UserWarning, match="reads at most 16 positions"):
        out = speculative_generate(target, LookupThenDrafter(fallback), prompt, max_new_tokens=24, gamma=4)
    assert calls and min(calls) > 16  # the fallback's first call came after the context outgrew its draft
    assert out.row(0).tolist() == autoregressive_generate(target, prompt, max_new_tokens=24).row(0).tolist()
    with pytest.raises(ValueError, match="the prompt has 20 tokens"):
        speculative_generate(target, LookupThenDrafter(ModelDrafter(draft)), (torch.arange(20) * 5 % 64)[None],
                             max_new_tokens=4)


def test_lookup_drafts_a_single_token_too(close_draft):
    """At γ = 1 (or where a match ends one token before the context does) lookup finds ONE token: that is a match,
    and LookupThenDrafter must draft it, not fall back to the model. Counting only longer matches sent every γ = 1
    round to the fallback, in silence: the output stays exact, only the drafts (and α) change."""
    context = torch.tensor([7, 8, 9, 1, 7, 8, 9])  # "7 8 9" occurred before, followed by 1
    hybrid = LookupThenDrafter(ModelDrafter(close_draft))
    for gamma in (1, 3):
        tokens, q = hybrid.propose(context, gamma, lambda x: x.softmax(-1))
        assert tokens.tolist() == [1, 7, 8][:gamma] and torch.equal(q.argmax(-1), tokens)
    assert hybrid.rounds == {"lookup": 2, "fallback": 0}
    # control: a 1-gram match ("9", then 1) but no earlier 3-gram: the lookup's min_ngram (3 here) turns it down and the
    # model drafts (with no match of any length, as in [7, 8, 9, 1], a lookup that ignored min_ngram fell back too)
    hybrid.propose(torch.tensor([7, 8, 9, 1, 9]), 1, lambda x: x.softmax(-1))
    assert hybrid.rounds == {"lookup": 2, "fallback": 1}
    assert PromptLookupDrafter(max_ngram=4, min_ngram=3).propose(torch.tensor([7, 8, 9, 1, 9]), 3)[0].tolist() == []
    assert PromptLookupDrafter(max_ngram=4, min_ngram=1).propose(torch.tensor([7, 8, 9, 1, 9]), 3)[0].tolist() == [1, 9]


def test_near_its_limit_the_draft_model_drafts_fewer_tokens():
    """Limit 16: after 14 tokens a round may draft 3 (the draft reads positions 0 … 15; GPT-2 raised an
    IndexError at position 16 before), after 16 tokens 1 (never fed), after 17 none fit: no drafts, said once
    per generation (it raised, and the generation was lost). A first round with 17 tokens is a prompt the draft
    cannot read: refused, naming the fix."""
    drafter, softmax = ModelDrafter(gpt2_draft(16)), lambda x: x.softmax(-1)
    for length, drafted in [(14, 3), (16, 1)]:
        drafter.reset()
        tokens, q = drafter.propose(torch.arange(length), 4, softmax, torch.Generator().manual_seed(0))
        assert tokens.shape == (drafted,) and q.shape == (drafted, 64)
    with pytest.warns(UserWarning, match="at most 16 positions .* now has 17 tokens"):
        assert len(drafter.propose(torch.arange(17), 4, softmax)[0]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the next round is silent
        assert len(drafter.propose(torch.arange(18), 4, softmax)[0]) == 0
    drafter.reset()
    with pytest.raises(ValueError, match="at most 16 positions.*the prompt has 17 tokens"):
        drafter.propose(torch.arange(17), 4, softmax)


# ---- a draft model behind prompt lookup (issue 19, bug 7) -----------------------------------------


def recording(drafter, calls):
    """Replace ``drafter.propose`` by one that records (context, tokens, the logits behind q) per call."""
    propose = drafter.propose

    def recorded(context, gamma, to_probs, generator=None):
        logits = []
        tokens, q = propose(context, gamma, lambda x: (logits.append(x), to_probs(x))[1], generator)
        calls.append((context.clone(), tokens, torch.stack(logits)))
        return tokens, q

    drafter.propose = recorded
    return drafter


@pytest.mark.parametrize("wrapped", [False, True])
def test_model_draft_behind_lookup_drafts_from_the_true_context(target, close_draft, wrapped):
    """Rounds that lookup drafted put tokens in the context that were not the model's drafts: the model
    drafter's cache must not take them for its own. After a sampled run with both halves drafting
    (lookup on every repeated token), each q the model drafter returned equals a fresh drafter's on the
    same context, fed the same drafts. Before the fix about half of them differed. ``wrapped``: the model drafter
    inside a DynamicGammaDrafter, which must pass the news on (before, it did not, and every q checked differed)."""
    from specdec_edu.course.experiments import DynamicGammaDrafter

    calls = []
    model = recording(ModelDrafter(close_draft), calls)
    hybrid = LookupThenDrafter(DynamicGammaDrafter(model, start=4) if wrapped else model,
                               PromptLookupDrafter(max_ngram=2, min_ngram=1))
    prompt = torch.tensor([3, 9, 27, 17, 51, 25, 11, 33, 35, 41])
    speculative_generate(target, hybrid, prompt[None], max_new_tokens=80, gamma=4, do_sample=True,
                         generator=torch.Generator().manual_seed(0))
    assert hybrid.rounds["lookup"] >= 5 and hybrid.rounds["fallback"] >= 5, hybrid.rounds
    for context, tokens, logits in calls:
        recomputed = []
        ModelDrafter(close_draft).propose(context, len(tokens), forced_onto(tokens, recomputed))
        torch.testing.assert_close(torch.stack(recomputed), logits, atol=1e-4, rtol=1e-4)


def test_a_model_drafter_asked_for_no_drafts_keeps_none_of_its_old_ones(close_draft):
    """A call that drafts nothing (γ = 0 here; the draft's position limit does it in a run) must still forget the
    drafts of the call before: the context grows by other tokens meanwhile. Before, the next call reused their K/V,
    and its q differed from a fresh drafter's."""
    softmax = lambda x: x.softmax(-1)  # noqa: E731
    drafter, context = ModelDrafter(close_draft), torch.tensor([3, 9, 27, 17, 51])
    drafts, _ = drafter.propose(context, 4, softmax, torch.Generator().manual_seed(0))
    context = torch.cat([context, drafts[:1], (drafts[1:2] + 1) % 64])  # one draft kept, then the target's token
    tokens, q = drafter.propose(context, 0, softmax)
    assert tokens.shape == (0,) and q.shape[0] == 0
    context = torch.cat([context, (drafts[2:4] + 1) % 64, torch.tensor([5])])  # a round drafted elsewhere, say
    logits, recomputed = [], []
    tokens, _ = drafter.propose(context, 3, lambda x: (logits.append(x), softmax(x))[1], torch.Generator())
    ModelDrafter(close_draft).propose(context, 3, forced_onto(tokens, recomputed))
    torch.testing.assert_close(torch.stack(recomputed), torch.stack(logits), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int16])
def test_prompt_lookup_drafts_from_a_context_of_any_integer_dtype(dtype):
    """check_propose_args accepts any integer context; F.one_hot takes int64 only (before: a RuntimeError)."""
    tokens, q = PromptLookupDrafter(max_ngram=2).propose(torch.tensor([1, 2, 3, 1, 2], dtype=dtype), 2)
    assert tokens.tolist() == [3, 1] and tokens.dtype == torch.long
    assert torch.equal(q, torch.nn.functional.one_hot(torch.tensor([3, 1]), 4).float())


@pytest.mark.parametrize("name", [None, 3])
def test_load_drafter_refuses_a_name_that_is_not_a_string_by_the_names(target, name):
    """Before: AttributeError ('NoneType' object has no attribute 'startswith')."""
    from specdec_edu import load_drafter

    with pytest.raises(ValueError, match=f"unknown drafter {name!r}: choose one of 'draft'"):
        load_drafter(name, target)
