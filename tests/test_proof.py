"""The χ² harness of notebook 05 (specdec_edu.course.proof): it passes the real rule and rejects every broken one.

All checks use the harness's stated defaults: toy p, q with γ = 2 over 4 tokens, 1,000 rounds, seed 0,
level 10⁻³. Seeded, so the p-values are the same on every run.
"""

import pytest
import torch

from specdec_edu.course.controls import BROKEN_RULES
from specdec_edu.course.proof import LEVEL, TOY_P, TOY_Q, chi2_check, emitted_distribution, token_chi2, token_chi2_power
from specdec_edu.sampling import sample
from specdec_edu.theory import output_distribution
from specdec_edu.verify import accept_and_resample, acceptance_probability, residual_distribution


def test_emitted_distribution_is_a_distribution_whose_first_token_is_p():
    exact = emitted_distribution(TOY_P, TOY_Q)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    first = torch.zeros(TOY_P.shape[1], dtype=torch.float64)
    for outcome, prob in exact.items():
        first[outcome[0]] += prob
    torch.testing.assert_close(first, output_distribution(TOY_P[0], TOY_Q[0]), rtol=0, atol=1e-12)
    torch.testing.assert_close(first, TOY_P[0], rtol=0, atol=1e-12)
    # P(all γ drafts kept) = Π Σ min(p_i, q_i) = 0.7²
    assert sum(prob for outcome, prob in exact.items() if len(outcome) == 3) == pytest.approx(0.49)


def test_the_real_rule_passes():
    result = chi2_check(accept_and_resample)
    assert result.passed and result.impossible == 0, str(result)
    assert result.p_value > LEVEL and result.n == 1_000
    assert str(result).startswith("PASS")


@pytest.mark.parametrize("name", sorted(BROKEN_RULES))
def test_every_broken_rule_is_rejected(name):
    result = chi2_check(BROKEN_RULES[name])
    assert not result.passed and result.p_value < LEVEL, f"{name}: {result}"
    assert str(result).startswith("FAIL")


def accept_without_min(p, q, draft_tokens, generator=None):
    """Accept with p/q instead of min(1, p/q), and no normalisation of the residual: both harmless
    (a uniform in [0, 1) is always below a ratio ≥ 1; torch.multinomial normalises its weights)."""
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator, dtype=p.dtype) >= p[i, x] / q[i, x]:
            return i, int(sample((p[i] - q[i]).clamp(min=0), generator))
    return len(draft_tokens), int(sample(p[len(draft_tokens)], generator))


def accept_with_inverted_ratio(p, q, draft_tokens, generator=None):
    """A plausible slip: min(1, q/p) instead of min(1, p/q)."""
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator, dtype=p.dtype) >= acceptance_probability(q[i, x], p[i, x]):
            return i, int(sample(residual_distribution(p[i], q[i]), generator))
    return len(draft_tokens), int(sample(p[len(draft_tokens)], generator))


def test_a_hand_written_rule_passes_and_a_plausible_slip_fails():
    assert chi2_check(accept_without_min).passed
    assert not chi2_check(accept_with_inverted_ratio).passed


def test_a_rule_that_writes_into_p_cannot_change_what_it_is_judged_against():
    """A learner's residual built in place on a row of p (``r = p[i]; r.sub_(q[i]).clamp_(min=0)``) rewrote the
    harness's p, and TOY_P itself for the rest of the notebook: after one such run the control
    ``resample_from_target`` passed (p = 0.198; a review found it). The harness now hands each round copies and
    computes the exact distribution first. Here the rule's answers are right and only its writes are wrong: TOY_P and
    TOY_Q stay as they were, and the control is still rejected after it."""
    saved_p, saved_q = TOY_P.clone(), TOY_Q.clone()

    def in_place(p, q, drafts, generator):
        n, next_token = accept_and_resample(p, q, drafts, generator)
        if n < len(drafts):  # the slip: the residual written into p's own row
            row = p[n]
            row.sub_(q[n]).clamp_(min=0)
            row.div_(row.sum())
        return n, next_token

    judged = chi2_check(in_place)
    assert torch.equal(TOY_P, saved_p) and torch.equal(TOY_Q, saved_q)
    assert judged.passed and not chi2_check(BROKEN_RULES["resample_from_target"]).passed


def test_the_harness_refuses_what_is_not_a_rule():
    with pytest.raises(TypeError, match="n_accepted, next_token"):
        chi2_check(lambda p, q, d, g: NotImplemented, n=5)
    with pytest.raises(ValueError, match="0..γ"):
        chi2_check(lambda p, q, d, g: (3, 0), n=5)


# ---- token_chi2: sampled tokens of a real model against its exact p ----------------------------------------

P_REAL = torch.tensor([0.0, 0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.02, 0.0], dtype=torch.float64)  # two impossible ids


def test_token_chi2_passes_samples_from_p_and_rejects_a_shifted_distribution():
    """n = 600, seed 0, level 1e-3. Negative control: samples from a distribution 0.1 away in total variation."""
    gen = torch.Generator().manual_seed(0)
    good = torch.multinomial(P_REAL, 600, replacement=True, generator=gen)
    result = token_chi2(good, P_REAL)
    assert result.passed and result.impossible == 0, result
    assert result.df == 6  # all 7 possible ids are expected ≥ 5 times at n = 600 (0.02 · 600 = 12): 7 cells
    assert token_chi2(good[:100], P_REAL).df == 5  # at n = 100, ids 6 and 7 (3 and 2 expected) share a cell
    shifted = P_REAL.clone()
    shifted[1], shifted[4] = 0.30, 0.20
    assert token_chi2_power(shifted, P_REAL, 600) > 0.99
    bad = torch.multinomial(shifted, 600, replacement=True, generator=gen)
    assert not token_chi2(bad, P_REAL).passed


def test_token_chi2_impossible_token_and_power_at_the_null():
    assert token_chi2([1, 2, 0], P_REAL).p_value == 0.0  # id 0 has p = 0
    assert token_chi2_power(P_REAL, P_REAL, 600) == pytest.approx(LEVEL, rel=1e-6)  # only false alarms
    leaky = P_REAL.clone()
    leaky[1], leaky[8] = 0.39, 0.01  # 1 % of the mass on an impossible id
    assert token_chi2_power(leaky, P_REAL, 600) > 1 - 0.99 ** 600 - 1e-9


def test_a_rare_pooled_cell_joins_another_so_the_test_keeps_its_level():
    """p = (0.5, 0.3, 0.2 − 1e-5, 1e-5), n = 1,000: the pooled cell expects 0.01, and one sample there made χ² ≈ 98
    (p-value 4e-21). Now that cell joins the least expected own cell. The level holds: 5,000 draws of n = 1,000
    from p itself (seed 0) are rejected 5 times at level 1e-3 expected; the threshold 15 is about 4 standard
    deviations above that (this seed: 6), and the old pooling gave about 53. The control: the same test still rejects
    a distribution 0.1 away in total variation (power > 0.99 by token_chi2_power)."""
    p = torch.tensor([0.5, 0.3, 0.2 - 1e-5, 1e-5], dtype=torch.float64)
    one_rare = torch.tensor([0] * 500 + [1] * 300 + [2] * 199 + [3])
    assert token_chi2(one_rare, p).passed and token_chi2(one_rare, p).df == 2
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(p, 5_000 * 1_000, replacement=True, generator=gen).view(5_000, 1_000)
    assert sum(not token_chi2(row, p).passed for row in draws) <= 15
    shifted = torch.tensor([0.4, 0.4, 0.2 - 1e-5, 1e-5], dtype=torch.float64)
    assert token_chi2_power(shifted, p, 1_000) > 0.99
    assert not token_chi2(torch.multinomial(shifted, 1_000, replacement=True, generator=gen), p).passed


def test_one_cell_is_an_empty_test_and_says_so():
    """A one-hot p (greedy, top_k = 1) puts every sample in one cell: df 0. It was "FAIL: p-value = nan"."""
    onehot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    result = token_chi2([1] * 50, onehot)
    assert result.passed and result.df == 0 and "nothing to test" in str(result)
    assert token_chi2_power(onehot, onehot, 50) == 0.0  # nothing can reject samples of p itself
    assert not token_chi2([1] * 49 + [0], onehot).passed  # an impossible token still fails at once


def test_inputs_that_are_not_distributions_are_refused():
    """A bonus row summing to 1.3 made the exact probabilities sum to 1.15 and the pooled cell expect −84.6, and the
    test printed PASS; p summing to 0.9 passed after rescaling; a token id past p's length was an IndexError."""
    bad_p = TOY_P.clone()
    bad_p[2, 0] += 0.3
    with pytest.raises(ValueError, match="p must hold distributions.*1.3"):
        chi2_check(accept_and_resample, p=bad_p)
    with pytest.raises(ValueError, match="q must hold distributions"):
        chi2_check(accept_and_resample, q=2 * TOY_Q)
    with pytest.raises(ValueError, match="p must hold distributions"):
        token_chi2([1, 2], 0.9 * P_REAL)
    with pytest.raises(ValueError, match="token id 9 is outside p's 9 ids"):
        token_chi2([1, 9], P_REAL)


def test_the_sum_tolerance_is_the_one_stated():
    """Rows must sum to 1 within 1e-4, as check_distribution says. The docstring said 1e-6 while allclose's default
    relative tolerance made it 1.1e-5, and a float32 softmax over the embedded target's 49,152 ids is off by up to
    5e-5 (measured at T = 0.3–1.5): such a p, passed as it comes, was refused. 1 + 5e-5 passes, 1 + 1.05e-4 not."""
    p = P_REAL.double() / P_REAL.double().sum()
    assert token_chi2([1, 2], p * (1 + 5e-5)).p_value >= 0  # accepted
    with pytest.raises(ValueError, match="p must hold distributions"):
        token_chi2([1, 2], p * (1 + 1.05e-4))


def accept_with_one_uniform_per_round(p, q, draft_tokens, generator=None):
    """A plausible slip: one uniform for the whole round, compared with every draft's ratio, so that the decisions
    of a round are correlated (a draft is kept only if all earlier ones were kept at the same u)."""
    gamma = draft_tokens.shape[0]
    positions = torch.arange(gamma)
    u = torch.rand((), generator=generator, dtype=p.dtype)
    n = int((u < acceptance_probability(p[positions, draft_tokens], q[positions, draft_tokens])).long().cumprod(0).sum())
    return n, int(sample(p[gamma] if n == gamma else residual_distribution(p[n], q[n]), generator))


def test_one_uniform_per_round_is_rejected_at_3000_rounds():
    """Each position alone still follows p, and the sequence-level tests (1,500 three-token continuations) pass it.
    The joint distribution of a round does not: at the default 1,000 rounds it is rejected on most seeds (39 of 40
    in a review, largest p 2e-3); at 3,000, measured on 15 seeds, on all of them with p ≤ 2e-22. The real rule
    passes at 3,000 too (the control of the control)."""
    assert not chi2_check(accept_with_one_uniform_per_round, n=3_000).passed
    assert chi2_check(accept_and_resample, n=3_000).passed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_token_chi2_and_its_power_take_distributions_from_a_gpu():
    """Notebook 11 computes p and q with a model on the learner's GPU. On the H200 (2026-12-04) its cell 18 failed
    in token_chi2_power: the χ² cells were built on the host and filled from a CUDA tensor."""
    shifted = P_REAL.clone()
    shifted[1], shifted[4] = 0.30, 0.20
    on_gpu = token_chi2_power(shifted.cuda(), P_REAL.cuda(), 600)
    assert on_gpu == pytest.approx(token_chi2_power(shifted, P_REAL, 600))
    tokens = torch.multinomial(P_REAL, 600, replacement=True, generator=torch.Generator().manual_seed(0))
    assert token_chi2(tokens.cuda(), P_REAL.cuda()).p_value == pytest.approx(token_chi2(tokens, P_REAL).p_value)


def test_the_chi2_tests_take_float64_on_the_host():
    """``token_chi2`` and ``token_chi2_power`` made float64 before moving p to the host, which raises on Apple's MPS
    (no float64 there). The simulated MPS rule (``Float64OnlyOnTheHost``) refuses that order; its control is in
    test_feature_drafters."""
    from test_feature_drafters import Float64OnlyOnTheHost

    p = torch.tensor([0.5, 0.3, 0.2])
    with Float64OnlyOnTheHost():
        assert token_chi2([0, 1, 0, 2], p).n == 4
        assert 0 <= token_chi2_power(torch.tensor([0.2, 0.3, 0.5]), p, n=50) <= 1


def test_a_p_off_by_less_than_the_tolerance_is_tested_not_refused_by_scipy():
    """check_distribution lets a row sum to 1 ± 1e-4 (a float32 softmax); the expected counts are then rescaled to
    the observed total, which scipy's chisquare requires (without it: "sum of the observed frequencies must agree")."""
    result = token_chi2(torch.arange(4).repeat(50), torch.tensor([0.25, 0.25, 0.25, 0.25005], dtype=torch.float64))
    assert result.n == 200 and result.p_value > 0.99  # 50 of each: the counts match p


def test_a_negative_entry_is_no_distribution_even_if_the_row_sums_to_1():
    with pytest.raises(ValueError, match="p must hold distributions"):
        token_chi2([0, 1], torch.tensor([0.6, 0.6, -0.2], dtype=torch.float64))
