"""Bad input raises ValueError/TypeError whose message names the fix."""

import pytest
import torch
from conftest import tiny_llama

from specdec_edu import autoregressive_generate, speculative_generate

IDS = torch.tensor([[1, 2, 3]])


def spec(target, draft, ids=IDS, **kw):
    kw.setdefault("max_new_tokens", 4)
    return speculative_generate(target, draft, ids, **kw)


def test_vocabulary_mismatch(target):
    other = tiny_llama(seed=3, vocab_size=100)
    with pytest.raises(ValueError, match="share a tokenizer"):
        spec(target, other)
    # The same draft wrapped in a ModelDrafter, one prompt and a batch: the batch padded q by a negative width
    # (cropping it) and fed ids past the target's vocabulary to the target (a raw IndexError here; on CUDA a
    # device-side assert that poisons the process).
    from specdec_edu import ModelDrafter

    batch, mask = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.ones(2, 3, dtype=torch.long)
    for ids, kw in ((IDS, {}), (batch, {"attention_mask": mask})):
        with pytest.raises(ValueError, match="vocabulary mismatch.*share a tokenizer"):
            spec(target, ModelDrafter(other), ids, **kw)
    spec(target, ModelDrafter(other, head_size=64), batch, attention_mask=mask)  # a head capped to the target's: fine


def test_a_draft_head_one_row_wider_is_a_vocabulary_mismatch_too(target):
    """The boundary of the check above: 65 head rows against the target's 64. An off-by-one let this draft through
    the up-front check, so the error came only mid-generation, from its q ("returned q over 65 token ids"), and not
    the one naming the fix (head_size=64)."""
    with pytest.raises(ValueError, match="vocabulary mismatch.*head_size=64"):
        spec(target, tiny_llama(seed=3, vocab_size=65))


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(gamma=0), "whole number of tokens per round, at least 1"),
        (dict(gamma=2.5), "whole number of tokens per round"),  # was a bare TypeError from range() in the first round
        (dict(max_new_tokens=0), "at least 1 new token"),
        (dict(max_new_tokens=10.0), "whole number of new tokens"),  # was refused mid-run, as a γ = 3.0 no one set
        (dict(max_new_tokens=True), "whole number of new tokens"),  # a bool is an Integral: it ran as 1 token
        (dict(do_sample=True, top_p=0.0), "top_p=1.0"),
        (dict(do_sample=True, top_p=1.2), "top_p=1.0"),
        (dict(do_sample=True, temperature=-0.5), "temperature=0"),
        (dict(do_sample=True, top_k=-3), "top_k=0"),
        (dict(do_sample=True, temperature=float("nan")), "finite temperature"),
        # Hugging Face's "off" (None) and a float k: were bare TypeErrors from a comparison or from torch.topk
        (dict(do_sample=True, top_k=None), r"top_k=None is not a number: use top_k=0"),
        (dict(do_sample=True, top_p=None), r"top_p=None is not a number: use top_p=1.0"),
        (dict(do_sample=True, temperature=None), r"temperature=None is not a number: use temperature=0"),
        (dict(do_sample=True, top_k=2.0), r"top_k=2.0 is not an int"),
        (dict(pad_token_id=None), "pad_token_id=tokenizer.eos_token_id"),  # was a TypeError after the whole generation
    ],
)
def test_bad_arguments(target, draft, kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        spec(target, draft, **kwargs)


def test_prompts_that_are_not_tensors_are_named(target, draft):
    """A list or a numpy array of ids (before: AttributeError "'list' object has no attribute 'dim'")."""
    import numpy as np

    for ids in ([[1, 5, 9]], np.array([[1, 5, 9]])):
        with pytest.raises(ValueError, match=r"input_ids is a (list|ndarray), not a torch tensor: pass torch.tensor"):
            spec(target, draft, ids)
        with pytest.raises(ValueError, match=r"input_ids is a (list|ndarray), not a torch tensor"):
            autoregressive_generate(target, ids, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"attention_mask is a list, not a torch tensor"):
        spec(target, draft, torch.tensor([[1, 5, 9]]), attention_mask=[[1, 1, 1]])


def test_a_numpy_integer_gamma_is_a_gamma(target, draft):
    """A sweep's ``np.arange`` gives numpy integers: they draft as Python ints do."""
    import numpy as np

    assert spec(target, draft, gamma=np.int64(3)).sequences.tolist() == spec(target, draft, gamma=3).sequences.tolist()


@pytest.mark.parametrize("kind", ["model", "lookup", "suffix"])
def test_propose_called_by_hand_refuses_what_it_cannot_draft_from(draft, kind):
    """Every drafter's ``propose`` refuses a negative or fractional γ, a ``[1, n]`` context, float ids and an empty
    context, naming the fix. Before: prompt lookup drafted 7 tokens for γ = −3 (a negative slice end) and none from a
    ``[1, n]`` context; the suffix drafter truncated float ids in its index; the draft model said "cannot roll back
    1 positions" for an empty context."""
    from specdec_edu import ModelDrafter, PromptLookupDrafter
    from specdec_edu.suffix import SuffixDrafter

    drafter = {"model": lambda: ModelDrafter(draft), "lookup": PromptLookupDrafter, "suffix": SuffixDrafter}[kind]()
    context, softmax = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]), lambda x: x.softmax(-1)
    for gamma in (-3, -1, 2.5):  # -1: the boundary (γ = 0 is allowed: no drafts)
        with pytest.raises(ValueError, match="whole number >= 0"):
            drafter.propose(context, gamma, softmax)
    for bad in (context[None], context.float() + 0.9):
        with pytest.raises(ValueError, match=r"1-D tensor of token ids.*pass ids\[0\]"):
            drafter.propose(bad, 3, softmax)
    with pytest.raises(ValueError, match="context is empty"):
        drafter.propose(context[:0], 3, softmax)
    tokens, q = drafter.propose(context, 3, softmax)  # the same drafter, asked properly
    assert len(tokens) == 3 and q.shape[0] == 3


def test_a_draft_models_head_is_checked_also_as_a_fallback(target):
    """A ModelDrafter with more head rows than the target, inside LookupThenDrafter: refused before generating, by the
    same message as the bare one. Before: only at the first fallback round, as "LookupThenDrafter.propose returned q
    over 72 token ids"."""
    from specdec_edu import LookupThenDrafter, ModelDrafter

    wide = tiny_llama(seed=3, vocab_size=72)
    for drafter in (ModelDrafter(wide), LookupThenDrafter(ModelDrafter(wide))):
        with pytest.raises(ValueError, match="vocabulary mismatch: the draft's head produces 72 token ids"):
            spec(target, drafter)


def test_empty_prompt(target, draft):
    with pytest.raises(ValueError, match="non-empty"):
        spec(target, draft, ids=torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty"):
        autoregressive_generate(target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=3)


@pytest.mark.parametrize("bad_id", [64, -1])  # the tiny models' vocabulary is 0..63
def test_prompt_ids_outside_the_embedding(target, draft, bad_id):
    """An id the target has no embedding row for (a tokenizer with added tokens and no resize; padding with -1), in a
    prompt and in a batch's padding, speculative and target-only. Before: a bare IndexError here (on a GPU, a
    device-side assert that stops the process), or, with the id last, an error blaming the target's output."""
    prompt, batch = torch.tensor([[1, 2, bad_id]]), torch.tensor([[bad_id, 2, 3], [4, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    for run in (lambda ids, **kw: spec(target, draft, ids, **kw),
                lambda ids, **kw: autoregressive_generate(target, ids, max_new_tokens=3, **kw)):
        for ids, kw in ((prompt, {}), (batch, {"attention_mask": mask})):
            with pytest.raises(ValueError, match=f"token id {bad_id}.*resize_token_embeddings"):
                run(ids, **kw)


def test_batch_needs_a_draft_model_and_left_padding(target, draft):
    from specdec_edu import PromptLookupDrafter

    with pytest.raises(ValueError, match="one prompt at a time"):
        spec(target, PromptLookupDrafter(), ids=torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="padding_side='left'"):
        spec(target, draft, ids=torch.tensor([[1, 2], [3, 4]]), attention_mask=torch.tensor([[1, 1], [1, 0]]))


def test_prompt_longer_than_max_positions(target, draft):
    with pytest.raises(ValueError, match="shorten the prompt"):
        spec(target, draft, ids=torch.ones(1, 256, dtype=torch.long))


def test_nan_logits(draft):
    """Greedy and sampled, one prompt and a batch, speculative and target-only: the message names float32. (Sampled,
    torch.multinomial used to raise its own RuntimeError first, before the round's check could.)"""
    broken = tiny_llama(seed=0)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    for ids in (IDS, IDS.repeat(2, 1)):
        for sampled in (False, True):
            with pytest.raises(ValueError, match="the target produced.*float32"):
                spec(broken, draft, ids, do_sample=sampled)
            with pytest.raises(ValueError, match="float32"):
                autoregressive_generate(broken, ids, max_new_tokens=4, do_sample=sampled)


def test_nan_draft_logits_name_the_draft_model(target):
    """A draft model whose forward overflows (an fp16 draft on a GPU), greedy and sampled, one prompt and a batch:
    the error names the draft model and float32. Before: sampled, it blamed ModelDrafter.propose for returning a q
    that is not a distribution; greedy, argmax made a valid one-hot of the NaN row, and α fell to 0 in silence."""
    broken = tiny_llama(seed=1)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    for ids in (IDS, IDS.repeat(2, 1)):
        for sampled in (False, True):
            with pytest.raises(ValueError, match="the draft model produced NaN or \\+inf logits.*float32"):
                spec(target, broken, ids, do_sample=sampled)


class FakeCudaGenerator(torch.Generator):
    """A generator that says it lives on CUDA (this machine has no GPU to make a real one)."""

    device = property(lambda self: torch.device("cuda"))


def test_generator_on_wrong_device(target, draft):
    """A CUDA generator with CPU models."""
    with pytest.raises(ValueError, match="the torch.Generator is on cuda.*torch.Generator\\(device='cpu'\\)"):
        spec(target, draft, do_sample=True, generator=FakeCudaGenerator())


@pytest.mark.parametrize("path", ["speculative", "target only"])
def test_a_seed_is_not_a_generator(target, draft, path):
    """``generator=0`` (a seed, not a generator) names the fix. Before: AttributeError: 'int' object has no attribute
    'device'."""
    run = (lambda: spec(target, draft, do_sample=True, generator=0)) if path == "speculative" else (
        lambda: autoregressive_generate(target, IDS, max_new_tokens=4, do_sample=True, generator=0))
    with pytest.raises(ValueError, match=r"generator=0 is not a torch.Generator.*manual_seed\(seed\)"):
        run()


def test_a_draft_model_on_another_kind_of_device_is_refused(target):
    """The round compares p and q on one device and one generator draws for both, so a draft left on another kind of
    device is refused up front, naming the fix (the draft here sits on the meta device: this machine has one kind of
    real device). Before, the run failed later: with a generator, on the check of one device or the other."""
    other = tiny_llama(seed=3).to("meta")
    with pytest.raises(ValueError, match=r"the draft model is on meta but the target on cpu.*draft.to\('cpu'\)"):
        spec(target, other)
    spec(target, tiny_llama(seed=3))  # the control: the same draft on the target's device runs


def test_draft_without_propose(target):
    with pytest.raises(TypeError, match="propose"):
        spec(target, object())


def test_one_dimensional_prompt_is_accepted(target, draft):
    assert spec(target, draft, ids=IDS[0]).sequences.shape == (1, 7)


# ---- input given in other forms than the tokenizer's (found by a review): each once silently wrong or a crash ------


def test_an_eos_id_given_as_a_tensor_or_numpy_integer_stops_as_an_int_does(target, draft):
    import numpy as np

    free = autoregressive_generate(target, IDS, max_new_tokens=12).row(0).tolist()
    eos = free[3]  # a token this prompt reaches: generation must stop right after its first occurrence
    expected = free[: free.index(eos) + 1]
    for given in (eos, [eos], torch.tensor([eos]), torch.tensor(eos), np.int64(eos), np.array([eos])):
        for out in (autoregressive_generate(target, IDS, max_new_tokens=12, eos_token_id=given),
                    spec(target, draft, max_new_tokens=12, eos_token_id=given)):
            assert out.row(0).tolist() == expected and out.stats.stopped_by == "eos", given  # a tensor in a set never matched
    with pytest.raises(ValueError, match="token ids are integers"):
        spec(target, draft, eos_token_id=2.0)


def test_token_id_0_is_an_eos_id_like_any_other():
    """eos_token_id=0 (a real id: <unk>, <pad> or <s> in many vocabularies) must end a sequence: "no eos" is None
    only. A falsy test (``if not eos_token_id``) took 0, [0] and tensor(0) for "no eos" and generated past them."""
    import numpy as np

    from specdec_edu.sampling import GenerationConfig

    for given in (0, [0], (0, 5), torch.tensor(0), torch.tensor([0]), np.int64(0)):
        assert 0 in GenerationConfig(max_new_tokens=4, eos_token_id=given).eos, given
    assert GenerationConfig(max_new_tokens=4, eos_token_id=None).eos == frozenset()  # control: None is "no eos"


def test_int32_prompt_ids_are_token_ids_and_float_ones_are_refused(target):
    from specdec_edu import PromptLookupDrafter

    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    expected = spec(target, PromptLookupDrafter(), ids).row(0).tolist()
    assert spec(target, PromptLookupDrafter(), ids.int()).row(0).tolist() == expected  # one_hot refused int32 ids
    with pytest.raises(ValueError, match="token ids are integers"):
        spec(target, PromptLookupDrafter(), ids.float())


def test_a_one_dimensional_prompt_takes_a_one_dimensional_mask(target, draft):
    ids = torch.tensor([1, 2, 3])
    assert spec(target, draft, ids, attention_mask=torch.ones(3, dtype=torch.long)).row(0).tolist() == \
        spec(target, draft, ids).row(0).tolist()


def test_one_left_padded_prompt_keeps_its_padding_in_sequences_as_a_batch_does(target, draft):
    ids, mask = torch.tensor([[0, 0, 1, 5, 9]]), torch.tensor([[0, 0, 1, 1, 1]])
    for out in (spec(target, draft, ids, attention_mask=mask), autoregressive_generate(target, ids, attention_mask=mask,
                                                                                       max_new_tokens=4)):
        assert out.prompt_length == 5 and torch.equal(out.sequences[:, :5], ids)
        assert out.sequences[0, 5:].tolist() == out.row(0).tolist() == spec(target, draft, ids[:, 2:]).row(0).tolist()


@pytest.mark.parametrize("values", [3, 1])
def test_an_accept_fn_that_returns_other_than_two_numbers_is_named(target, draft, values):
    """A learner's rule returning (n, next_token, extra) or (n,). Before: one prompt raised a TypeError about
    RoundErrors, and a batch ran on, reading each row's decision from the wrong slots (garbage, no error)."""
    def broken(p, q, drafts, generator=None):
        return (0, 5, 1)[:values]

    for ids in (IDS, IDS.repeat(2, 1)):
        with pytest.raises(ValueError, match=rf"accept_fn must return \(n, next_token\), two integers.*'broken' "
                                             rf"returned {values} value"):
            spec(target, draft, ids, accept_fn=broken, do_sample=True)


@pytest.mark.parametrize("n", [-1, "gamma + 1"])
def test_an_accept_fn_that_accepts_more_drafts_than_it_was_given_is_named(target, draft, n):
    def broken(p, q, drafts, generator=None):
        wrong = len(drafts) + 1 if n == "gamma + 1" else n
        return torch.tensor([wrong, 0], device=p.device)

    for ids in (IDS, IDS.repeat(2, 1)):
        with pytest.raises(ValueError, match=r"accept_fn must return \(n, next_token\) with 0 <= n"):
            spec(target, draft, ids, accept_fn=broken, do_sample=True)


def test_an_accept_fn_wrong_only_on_a_later_row_of_a_batch_is_named(target, draft):
    """The check covers every row of a batch, not only the first: here row 0 is always valid (n = 0) and row 1
    returns γ + 1 (the rule is called per row, in order). A check of row 0 alone let row 1's n reach the cache
    rollback."""
    calls = []

    def wrong_on_row_1(p, q, drafts, generator=None):
        calls.append(len(drafts))
        return (len(drafts) + 1 if len(calls) % 2 == 0 else 0), 0

    with pytest.raises(ValueError, match=r"accept_fn must return \(n, next_token\) with 0 <= n"):
        spec(target, draft, IDS.repeat(2, 1), accept_fn=wrong_on_row_1, do_sample=True)


def test_the_ambiguous_acceptance_rate_name_is_refused_naming_alpha_and_accepted_per_drafted():
    """The course calls α the acceptance rate; ``stats.acceptance_rate`` used to be accepted / drafted, a
    lower number. Reading it now fails and names both, so no code takes one for the other in silence."""
    from specdec_edu import GenerationStats

    s = GenerationStats(drafted=8, accepted=3, rejected_rounds=2)
    assert (s.alpha, s.accepted_per_drafted) == (3 / 5, 3 / 8)
    with pytest.raises(AttributeError, match=r"stats\.alpha.*stats\.accepted_per_drafted"):
        s.acceptance_rate  # noqa: B018 (the read is the test)
