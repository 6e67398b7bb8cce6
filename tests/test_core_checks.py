"""Checks at the core's edges: what a hand-written accept rule or drafter may return, which logits count as an
overflow, settings that greedy decoding ignores, malformed token ids, per-row stats of a batch, and α as an
estimator of the acceptance probability (a Monte-Carlo test with a negative control)."""

import math
import warnings

import numpy as np
import pytest
import torch

from specdec_edu import autoregressive_generate, speculative_generate
from specdec_edu.theory import expected_speedup, optimal_gamma
from specdec_edu.verify import verify_drafts

PROMPT = torch.tensor([[3, 17, 5, 42, 8, 11]])


@pytest.mark.parametrize("bad", [64, -1], ids=["one past the vocabulary", "negative"])
def test_an_accept_rule_returning_a_token_outside_the_vocabulary_is_named(target, close_draft, bad):
    """``check_accepted`` checked n but not next_token: 64 (the vocabulary is 64) was blamed on the draft's
    tokenizer, and −1 reached the target's embedding as a raw IndexError (on a GPU, a device-side assert)."""
    with pytest.raises(ValueError, match=f"next_token = {bad}, outside the target's 64 token ids.*accept_fn"):
        speculative_generate(target, close_draft, PROMPT, max_new_tokens=8, gamma=3,
                             accept_fn=lambda p, q, x, g: (0, bad))


def _set_logit(model, token, value):
    """A forward hook that sets every logit of ``token`` to ``value`` (−inf: a masked token, as a logits mask would)."""
    def hook(module, args, output):
        output.logits[..., token] = value
        return output
    return model.register_forward_hook(hook)


def test_a_masked_token_is_not_an_overflow(target, close_draft):
    """A −inf logit among finite ones is a masked token (probability 0): every loop refused it as an overflow, naming
    float32 as the fix. The control: NaN, +inf, and a row with nothing finite still raise."""
    greedy = autoregressive_generate(target, PROMPT, max_new_tokens=12).sequences[0, -12:].tolist()
    masked = greedy[0]  # a token the unmasked model chooses: the masked runs must avoid it
    handle = _set_logit(target, masked, float("-inf"))
    try:
        runs = {
            "target alone": autoregressive_generate(target, PROMPT, max_new_tokens=12),
            "greedy speculative": speculative_generate(target, close_draft, PROMPT, max_new_tokens=12, gamma=3),
            "sampled speculative": speculative_generate(target, close_draft, PROMPT, max_new_tokens=12, gamma=3,
                                                        do_sample=True, generator=torch.Generator().manual_seed(0)),
            "a batch": speculative_generate(target, close_draft, PROMPT.repeat(2, 1), max_new_tokens=12, gamma=3),
        }
    finally:
        handle.remove()
    for name, out in runs.items():
        assert masked not in out.sequences[:, PROMPT.shape[1]:].flatten().tolist(), name
    for value in (float("nan"), float("inf")):
        handle = _set_logit(target, 5, value)
        try:
            with pytest.raises(ValueError, match=r"produced NaN or \+inf logits"):
                speculative_generate(target, close_draft, PROMPT, max_new_tokens=8, gamma=3)
            with pytest.raises(ValueError, match=r"produced NaN or \+inf logits"):
                autoregressive_generate(target, PROMPT, max_new_tokens=8)
        finally:
            handle.remove()
    def nothing_finite(module, args, output):
        output.logits.fill_(float("-inf"))  # in place: the hook returns None, so the output stays the model's

    handle = target.register_forward_hook(nothing_finite)
    try:
        with pytest.raises(ValueError, match=r"a row of only −inf"):
            autoregressive_generate(target, PROMPT, max_new_tokens=8)
    finally:
        handle.remove()


@pytest.mark.parametrize("setting", [dict(temperature=0.7), dict(top_k=5), dict(top_p=0.9)])
def test_sampling_settings_without_do_sample_warn(target, close_draft, setting):
    """``temperature=0.7`` without ``do_sample=True`` decoded greedily without a word, as Hugging Face's generate
    warns. The control: with do_sample=True, or with the defaults, nothing is said."""
    for generate in (lambda **kw: speculative_generate(target, close_draft, PROMPT, max_new_tokens=4, gamma=2, **kw),
                     lambda **kw: autoregressive_generate(target, PROMPT, max_new_tokens=4, **kw)):
        with pytest.warns(UserWarning, match="ignored: do_sample=False decodes greedily. Pass do_sample=True") as said:
            generate(**setting)
        assert said[0].filename == __file__  # the caller's line, not the package's or torch's no_grad wrapper
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the control
            generate(**setting, do_sample=True, generator=torch.Generator().manual_seed(0))
            generate()
            generate(temperature=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(eos_token_id=[]), "is empty: give at least one id, or None"),
    (dict(eos_token_id=()), "is empty: give at least one id, or None"),
    (dict(eos_token_id="2"), "token ids are integers"),
    (dict(pad_token_id=1.5), "give an int token id"),
    (dict(pad_token_id=True), "give an int token id"),
])
def test_malformed_token_ids_name_the_fix(target, close_draft, kwargs, message):
    """An empty eos list was called "not integers" (the empty tensor's dtype is float), a string raised torch's raw
    TypeError, and pad_token_id=1.5 passed and was truncated."""
    with pytest.raises(ValueError, match=message):
        speculative_generate(target, close_draft, PROMPT, max_new_tokens=4, gamma=2, **kwargs)


def test_integer_token_ids_of_every_kind_are_accepted(target, close_draft):
    for eos, pad in [(2, 0), ([2, 3], np.int64(0)), (torch.tensor([2]), torch.tensor(0))]:
        speculative_generate(target, close_draft, PROMPT, max_new_tokens=4, gamma=2, eos_token_id=eos, pad_token_id=pad)


def test_no_gamma_is_chosen_from_a_nan_alpha():
    """A run that judged no draft has α = NaN; ``optimal_gamma`` returned 0 ("do not speculate") as if it had
    compared the speedups. The prediction itself stays NaN, so that a benchmark prints it instead of stopping."""
    with pytest.raises(ValueError, match="no γ can be chosen from NaN"):
        optimal_gamma(float("nan"), 0.1)
    with pytest.raises(ValueError, match="no γ can be chosen from NaN"):
        optimal_gamma(0.8, float("nan"))
    assert math.isnan(expected_speedup(float("nan"), 4, 0.1))
    assert optimal_gamma(0.8, 0.1) > 0  # the control


def test_a_drafter_whose_q_is_too_wide_is_told_what_to_return(target):
    class Wide:
        def propose(self, context, gamma, to_probs, generator):
            q = torch.full((1, 80), 1 / 80)
            return torch.tensor([1]), q

    with pytest.raises(ValueError, match="q over 80 token ids but the target has only 64: return q with at most 64"):
        speculative_generate(target, Wide(), PROMPT, max_new_tokens=4, gamma=2)


def test_the_rule_divides_by_the_q_the_drafts_were_drawn_from():
    """A drafter's q rows may sum to 1 ± 1e-3 (the check's slack); the drafts then come from q / Σq, since sampling
    normalises, but the rule divided by the raw q: 2.6e-4 in total variation from p (a review's closed form). The
    round now gets q / Σq. With 1.0009·q, the q it gets sums to 1 (old: 1.0009); a row of zeros stays zeros."""
    from specdec_edu.generate import propose_checked

    class Loose:
        def __init__(self, scale):
            self.scale = scale

        def propose(self, context, gamma, to_probs, generator):
            q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]]) * self.scale
            return torch.tensor([0, 3]), q

    _, q, flags = propose_checked(Loose(1.0009), [1, 2], 2, None, None, torch.device("cpu"), 6)
    assert q.sum(-1).tolist() == pytest.approx([1.0, 1.0], abs=1e-6) and flags.tolist() == [False, False]
    assert q[0, :3].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=1e-6) and q[:, 4:].eq(0).all()
    _, q, flags = propose_checked(Loose(0.0), [1, 2], 2, None, None, torch.device("cpu"), 6)
    assert q.eq(0).all() and flags.tolist() == [True, True]  # not a distribution, and the draft has q(x) = 0


def test_a_batchs_tau_is_a_rows_not_b_times_it(target):
    """Batch stats add up their rows' tokens but count the batched forwards as rounds: τ of three copies of one
    prompt came out 3× the prompt's own, and so did drafts per round. Both are per row now, for either loop."""
    batch = PROMPT.repeat(3, 1)
    one, three = (speculative_generate(target, target, x, max_new_tokens=12, gamma=4) for x in (PROMPT, batch))
    assert three.stats.tau == pytest.approx(one.stats.tau) and one.stats.tau > 2
    assert three.stats.drafts_per_round == pytest.approx(one.stats.drafts_per_round)
    assert three.stats.rounds == one.stats.rounds  # rounds still count the batch's target forwards
    alone, together = (autoregressive_generate(target, x, max_new_tokens=12) for x in (PROMPT, batch))
    assert together.stats.tau == pytest.approx(alone.stats.tau) == pytest.approx(12 / 11)


# ---- α estimates the acceptance probability of the positions it judged -----------------------------------------
N_RUNS, N_NEW, GAMMA = 30, 40, 4  # about 1,150 judged drafts with close_draft (sampled α ≈ 0.37)
Z_MAX = 4.0  # |z| above 4 has probability 6e-5 under the null


def _alpha_test(target, draft, seed=0):
    """Sampled runs whose accept rule records Σ min(p, q) at every position it judges. Given the history, a judged
    draft is accepted with probability β = Σ_x min(p(x), q(x)), so Σ (accepted − β) over judged positions has mean 0
    and variance Σ β(1 − β). Returns the pooled stats and the β of every judged position."""
    betas = []

    def recording_rule(p, q, drafts, generator):
        decision = verify_drafts(p, q, drafts, generator)
        n = int(decision[0])
        beta = torch.minimum(p[: len(drafts)], q).sum(-1)
        betas.extend(beta[: min(n + 1, len(drafts))].tolist())  # judged: the accepted ones and the rejected one
        return decision

    g = torch.Generator().manual_seed(seed)
    runs = [speculative_generate(target, draft, PROMPT, max_new_tokens=N_NEW, gamma=GAMMA, do_sample=True,
                                 generator=g, accept_fn=recording_rule) for _ in range(N_RUNS)]
    return runs, np.array(betas)


def _z(estimate, betas):
    """(estimate − mean β) in standard errors of the judged positions' accept count."""
    return (estimate - betas.mean()) / (math.sqrt((betas * (1 - betas)).sum()) / len(betas))


def test_alpha_estimates_the_acceptance_probability(target, close_draft):
    """``stats.alpha`` (accepted / judged) against the mean of Σ min(p, q) over the judged positions, seed 0,
    30 sampled runs of 40 tokens (~1,150 judged drafts), |z| < 4 (it was 0.3). Negative control: accepted / drafted,
    which counts the drafts after a rejection as if they had been judged, fails the same test (|z| was 16)."""
    from specdec_edu.result import GenerationStats

    runs, betas = _alpha_test(target, close_draft)
    pooled = GenerationStats.pooled([r.stats for r in runs])
    assert pooled.accepted + pooled.rejected_rounds == len(betas)  # the stats judged exactly what the rule judged
    assert len(betas) > 500 and 0.3 < betas.mean() < 0.9
    assert abs(_z(pooled.alpha, betas)) < Z_MAX
    assert abs(_z(pooled.accepted_per_drafted, betas)) > Z_MAX  # the control


def test_the_packages_warnings_point_at_the_callers_line(target, close_draft):
    """A fixed stacklevel inside a generator wrapped by torch.no_grad named torch's _contextlib.py (the batch's
    'compile=True ... runs eager' did); warn_caller names the line that called the package."""
    with pytest.warns(UserWarning, match="compile=True: only single prompts are compiled") as said:
        speculative_generate(target, close_draft, PROMPT.repeat(2, 1), max_new_tokens=3, compile=True)
    assert said[0].filename == __file__
    from specdec_edu.result import warn_caller

    with pytest.warns(UserWarning, match="straight from here") as said:
        warn_caller("straight from here")
    assert said[0].filename == __file__
