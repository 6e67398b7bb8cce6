import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_edu import PromptLookupDrafter, autoregressive_generate, logits_to_probs, speculative_generate


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.8, 10, 0.8), (2.0, 1, 0.5), (1.0, 500, 0.999),
     (0.6, 0, 0.9), (1.5, 0, 0.7)],  # the last two: temperature before top-p (top-k off), the order HF warps in
)
def test_matches_transformers_warpers(temperature, top_k, top_p):
    """Same semantics and order as HF generate(): temperature -> top-k -> top-p."""
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0)) * 3
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k > 0:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)
    torch.testing.assert_close(logits_to_probs(logits, temperature, top_k, top_p), warped.softmax(-1), rtol=0, atol=1e-7)


def test_top_p_keeps_a_token_whose_mass_ends_exactly_at_the_boundary_as_transformers_does():
    """Four equal logits, top_p = 0.75: the cumulative mass reaches 1 − top_p = 0.25 exactly at the first sorted token,
    which transformers removes (<=), keeping three. No random logits hit such a tie, so with `<` instead of `<=`
    every other test passed, while this one gives four tokens of 1/4."""
    logits = torch.zeros(1, 4)
    expected = TopPLogitsWarper(0.75)(None, logits.clone()).softmax(-1)
    assert sorted(expected[0].tolist()) == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3])  # the reference case meant
    torch.testing.assert_close(logits_to_probs(logits, 1.0, 0, 0.75), expected, rtol=0, atol=1e-7)


def test_a_tiny_top_p_keeps_the_most_likely_token_as_transformers_does():
    """top_p = 1e-9 keeps only the argmax (transformers keeps min_tokens_to_keep = 1). In float32 the whole row's
    cumulative mass (≈ 1.0) is <= 1 − 1e-9 (which rounds to 1.0), so without the guard that always keeps the most
    likely token every token was dropped and p came back NaN. The random logits of the other tests never get there."""
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0)) * 3
    probs = logits_to_probs(logits, 1.0, 0, 1e-9)
    torch.testing.assert_close(probs, TopPLogitsWarper(1e-9)(None, logits.clone()).softmax(-1), rtol=0, atol=0)
    assert torch.equal(probs, torch.eye(100)[logits.argmax(-1)])


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, temperature=0)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4)) and set(probs.unique().tolist()) == {0.0, 1.0}


def test_greedy_marks_an_overflowed_row_nan_without_a_sync():
    """Unchecked (as the loops call it), greedy: a row with NaN or +inf logits comes back with NaN, so the round's
    device-side check sees a draft model's overflow; argmax alone made it a valid one-hot (α fell to 0 silently).
    -inf is a masked token, not an overflow: that row stays one-hot."""
    logits = torch.zeros(4, 5)
    logits[0, 2], logits[1, 3], logits[2, 1] = float("nan"), float("inf"), float("-inf")
    probs = logits_to_probs(logits, temperature=0, check_finite=False)
    assert probs[:2].isnan().any(-1).all() and torch.equal(probs[2:], torch.eye(5)[[0, 0]])


@pytest.mark.parametrize("path", ["speculative", "target only"])
def test_a_tiny_temperature_samples_the_argmax_not_token_0(target, path):
    """T = 1e-39 is greedy in all but name: every logit but the largest, divided by T, goes to -inf. Divided before
    the shift by the max, the largest overflowed to +inf as well, every p was NaN, and both loops returned token 0
    at every step without an error (prompt lookup's one-hot q has no NaN to catch). The control: greedy's tokens."""
    assert logits_to_probs(torch.tensor([1.0, 2.0, 3.0]), temperature=1e-39).tolist() == [0, 0, 1]
    ids, kw = torch.tensor([[1, 2, 3, 1, 2]]), dict(max_new_tokens=6)
    run = ((lambda **s: speculative_generate(target, PromptLookupDrafter(), ids, gamma=3, **kw, **s))
           if path == "speculative" else (lambda **s: autoregressive_generate(target, ids, **kw, **s)))
    tiny_t = run(do_sample=True, temperature=1e-39, generator=torch.Generator().manual_seed(0))
    assert tiny_t.row(0).tolist() == run().row(0).tolist()


def test_float64_is_kept():
    assert logits_to_probs(torch.zeros(3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(temperature=-1.0), "temperature=0"),
        (dict(temperature=float("nan")), "finite temperature"),  # NaN passed `< 0`: every token was id 0
        (dict(temperature=float("inf")), "finite temperature"),
        (dict(top_k=-1), "top_k=0"),
        (dict(top_p=0.0), "top_p=1.0"),
        (dict(top_p=1.5), "top_p=1.0"),
    ],
)
def test_bad_sampling_args_name_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        logits_to_probs(torch.zeros(5), **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_refused(bad):
    logits = torch.zeros(5)
    logits[2] = bad
    with pytest.raises(ValueError, match="float32"):
        logits_to_probs(logits)


def test_a_masked_logit_is_probability_zero_but_a_row_of_them_is_refused():
    """−inf among finite logits is a masked token (probability 0), not an overflow; a row with nothing finite has
    nothing to sample."""
    logits = torch.zeros(5)
    logits[2] = float("-inf")
    assert logits_to_probs(logits).tolist() == [0.25, 0.25, 0.0, 0.25, 0.25]
    with pytest.raises(ValueError, match="a row of only −inf"):
        logits_to_probs(torch.full((2, 5), float("-inf")))


# ---- the sampler: torch.multinomial's draw, without its reads from the device ------------------------------------


def device_reads(fn) -> tuple[int, set[str]]:
    """How many tensor → host reads (aten::_local_scalar_dense: a copy and a wait on a GPU) ``fn()`` makes, and
    every op it ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    return names.count("aten::_local_scalar_dense"), set(names)


def test_sample_draws_what_multinomial_draws_and_reads_nothing_back():
    """The exponential race is multinomial's own one-sample draw: the same token from the same generator state
    (so seeded runs, the committed notebooks among them, are unchanged), without multinomial's input checks, which
    read the device twice per call (the control: counted here the same way)."""
    from specdec_edu.sampling import sample

    probs = torch.softmax(3 * torch.randn(32, 1000, generator=torch.Generator().manual_seed(0)), -1)
    probs[:, ::7] = 0  # zeros are never drawn
    for rows in (probs, probs[0]):  # [B, V] and [V]
        ours = sample(rows, torch.Generator().manual_seed(1))
        theirs = torch.multinomial(rows, 1, generator=torch.Generator().manual_seed(1))[..., 0]
        assert torch.equal(ours, theirs) and ours.shape == rows.shape[:-1]
    assert (sample(probs, torch.Generator().manual_seed(2)) % 7 != 0).all()
    reads, ops = device_reads(lambda: sample(probs, torch.Generator().manual_seed(1)))
    assert reads == 0 and "aten::multinomial" not in ops
    control, _ = device_reads(lambda: torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(1)))
    assert control >= 2


@pytest.mark.parametrize("generator", ["seeded", None])
def test_no_sampling_path_calls_multinomial(target, draft, generator):
    """Every sampling path (speculative one prompt and batched, target-only), with a generator and without, draws
    through ``sample``'s exponential race (``aten::exponential_``), never ``torch.multinomial``, whose input checks
    read the device back. The profiler sees multinomial when it runs (the control, counted the same way)."""
    from specdec_edu import autoregressive_generate, speculative_generate

    ids = torch.tensor([[1, 2, 3]])
    gen = torch.Generator().manual_seed(0) if generator else None
    runs = [lambda: speculative_generate(target, draft, ids, max_new_tokens=8, do_sample=True, generator=gen),
            lambda: speculative_generate(target, draft, ids.repeat(2, 1), max_new_tokens=8, do_sample=True, generator=gen),
            lambda: autoregressive_generate(target, ids, max_new_tokens=8, do_sample=True, generator=gen),
            lambda: autoregressive_generate(target, ids.repeat(2, 1), max_new_tokens=8, do_sample=True, generator=gen)]
    for run in runs:
        ops = device_reads(run)[1]
        assert "aten::multinomial" not in ops and "aten::exponential_" in ops
    assert "aten::multinomial" in device_reads(lambda: torch.multinomial(torch.ones(4), 1))[1]
