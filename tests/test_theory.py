import numpy as np
import pytest
import torch

from specdec_edu import alpha_for_speedup, alpha_from_tau, expected_speedup, expected_tokens_per_round, optimal_gamma
from specdec_edu.theory import total_variation


def test_limits():
    assert expected_tokens_per_round(0.0, 4) == 1.0  # every first draft rejected: only the target's token
    assert expected_tokens_per_round(1.0, 4) == 5.0  # all accepted + bonus
    assert expected_tokens_per_round(0.999999999, 4) == pytest.approx(5.0, rel=1e-6)


def test_geometric_sum():
    for alpha in [0.1, 0.5, 0.8]:
        for gamma in [1, 3, 7]:
            assert expected_tokens_per_round(alpha, gamma) == pytest.approx(sum(alpha**i for i in range(gamma + 1)))


def test_source_numbers():
    """The source's example: target 50 ms, draft 5 ms (c = 0.1), γ = 4 → a 70 ms round."""
    c, gamma = 5 / 50, 4
    assert expected_speedup(1.0, gamma, c) == pytest.approx(250 / 70)  # all accepted: 5 tokens in 70 ms vs 250 ms
    assert expected_speedup(0.0, gamma, c) == pytest.approx(50 / 70)  # 0.71x: slower than the target alone


def test_vectorised_and_simulated():
    alphas = np.linspace(0, 1, 11)
    out = expected_speedup(alphas, 4, 0.05)
    assert out.shape == (11,) and np.all(np.diff(out) > 0)
    # Monte-Carlo: 200,000 rounds with i.i.d. acceptance, seed 0. Tokens per round have SD ≈ 1.5,
    # so the mean's standard error is ≈ 0.0034 and the tolerance 0.01 is ≈ 3 standard errors
    # (a correct formula fails ~0.3 % of seeds).
    def simulated_tokens(alpha):
        accepted = np.random.default_rng(0).random((200_000, 4)) < alpha
        return (np.cumprod(accepted, axis=1).sum(1) + 1).mean()

    assert simulated_tokens(0.7) == pytest.approx(expected_tokens_per_round(0.7, 4), abs=0.01)
    # the control: rounds simulated at α = 0.72 miss the formula's α = 0.7 by ≈ 0.1, and the same check rejects them
    assert simulated_tokens(0.72) != pytest.approx(expected_tokens_per_round(0.7, 4), abs=0.01)


def brute_force_speedup(alpha, gamma, c):
    """Leviathan's speedup written out independently: E[tokens] / (γc + 1), E[tokens] = Σ_{i<=γ} α^i."""
    return sum(alpha**i for i in range(gamma + 1)) / (gamma * c + 1)


@pytest.mark.parametrize("alpha, c", [(0.9, 0.02), (0.5, 0.02), (0.8, 0.1), (0.6, 0.3), (0.8, 1.05), (0.0, 0.05)])
def test_optimal_gamma_is_the_best_gamma(alpha, c):
    best = max(range(0, 17), key=lambda g: brute_force_speedup(alpha, g, c))  # γ = 0: the target alone, 1x
    assert optimal_gamma(alpha, c) == best
    assert expected_speedup(alpha, best, c) == pytest.approx(brute_force_speedup(alpha, best, c))  # γ = 0 too: 1x


def test_optimal_gamma_is_0_where_no_gamma_beats_the_target_alone():
    # a draft as costly as a target step (the compiled course pair on an H200 measured c = 1.05): every γ loses
    assert max(expected_speedup(0.8, g, 1.05) for g in range(1, 17)) < 1
    assert optimal_gamma(0.8, 1.05) == 0
    assert optimal_gamma(0.0, 0.01) == 0  # a drafter that is never right
    assert optimal_gamma(0.6, 0.05, verify_cost=lambda g: 1 + g) == 0  # a verify pass that costs a step per token
    # the control: where one γ pays by a hair, it is chosen
    assert expected_speedup(0.5, 1, 0.45) > 1 and optimal_gamma(0.5, 0.45) == 1


def test_optimal_gamma_and_inverse():
    assert optimal_gamma(0.9, 0.02) > optimal_gamma(0.5, 0.02) >= 1
    for alpha in [0.2, 0.6, 0.95]:
        assert alpha_from_tau(expected_tokens_per_round(alpha, 5), 5) == pytest.approx(alpha, abs=1e-8)


@pytest.mark.parametrize("args, names", [((-0.1, 4, 0.1), "alpha must lie in"), ((1.1, 4, 0.1), "alpha must lie in"),
                                         ((0.5, -1, 0.1), "gamma must be >= 0"), ((0.5, 4, -0.1), "c .* must be >= 0")])
def test_bad_arguments(args, names):
    with pytest.raises(ValueError, match=names):
        expected_speedup(*args)


def test_alpha_for_speedup_inverts_expected_speedup():
    for alpha, gamma, c, v in [(0.2, 3, 0.1, 1.6), (0.75, 4, 0.11, 1.39), (0.9, 6, 0.05, 1.0)]:
        s = expected_speedup(alpha, gamma, c, v)
        assert alpha_for_speedup(s, gamma, c, v) == pytest.approx(alpha, abs=1e-8)
    assert alpha_for_speedup(0.5, 3, 0.1, 1.3) == pytest.approx(0.0, abs=1e-8)  # any drafter is that fast
    with pytest.raises(ValueError, match="out of reach.*even alpha = 1 gives 2.00x"):
        alpha_for_speedup(2.5, 3, 0.0, 2.0)  # 4 tokens per round at best, for a round costing 2 steps


class OnTheGPU(torch.Tensor):
    """A tensor that, like a CUDA one, refuses numpy until moved to the host with ``.cpu()``."""

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_total_variation_takes_tensors_on_a_device():
    """Notebook 05 passes the target's distributions, which live on the GPU there."""
    a, b = torch.tensor([0.5, 0.5, 0.0]).as_subclass(OnTheGPU), torch.tensor([0.25, 0.25, 0.5]).as_subclass(OnTheGPU)
    with pytest.raises(TypeError, match="cuda"):
        np.asarray(a)  # the stand-in refuses, as CUDA does
    assert total_variation(a, b) == pytest.approx(0.5)


def test_alpha_one_maps_back_to_one_at_every_gamma_c_and_verify_cost():
    """α = 1's own speedup, fed back, was "out of reach" in 129 of 3,264 settings (e.g. γ 16, c 0.46, verify 1.1):
    τ = speedup · (γc + verify) came out a rounding step above γ + 1."""
    for gamma in (1, 4, 16):
        for c in np.linspace(0, 1, 21):
            for verify in (1.0, 1.1, 1.37, 2.0):
                top = expected_speedup(1.0, gamma, c, verify)
                assert alpha_for_speedup(top, gamma, c, verify) == pytest.approx(1.0, abs=1e-6), (gamma, c, verify)
    with pytest.raises(ValueError, match="out of reach"):
        alpha_for_speedup(1.01 * expected_speedup(1.0, 4, 0.2), 4, 0.2)  # beyond α = 1: still refused


@pytest.mark.parametrize("call, says", [
    (lambda: expected_speedup(0.8, 4, 0.1, verify_cost=0), "verify_cost .* must be > 0"),  # was inf
    (lambda: expected_speedup(0.8, 4, 0.1, verify_cost=-1), "verify_cost .* must be > 0"),  # was −1.94
    (lambda: alpha_for_speedup(-2, 4, 0.1), "speedup must be > 0"),  # was 2.9e-11
    (lambda: alpha_for_speedup(1.5, 4, 0.1, verify_cost=-1), "verify_cost .* must be > 0"),
    (lambda: total_variation([0.5, 0.5], [1.0]), "same tokens, got shapes"),  # broadcast: 0.5
    (lambda: total_variation([3, 1], [0.5, 0.5]), "summing to 4"),  # was 1.5, above TV's bound of 1
])
def test_inputs_outside_the_formulas_are_refused(call, says):
    with pytest.raises(ValueError, match=says):
        call()


# The edges of the formulas, each pinned where a mutation of the guard went unseen (a hand mutation audit).
def test_tokens_per_round_just_below_alpha_1_still_grows():
    """α = 1 − 1e-9 gives γ + 1 − 1e-8 tokens (to first order γ(γ+1)/2 · (1 − α)), not exactly γ + 1: the plain form
    loses those digits to cancellation, the expm1 form keeps them."""
    assert expected_tokens_per_round(1 - 1e-9, 4) == pytest.approx(5 - 1e-8, rel=0, abs=1e-12)


def test_optimal_gamma_breaks_ties_towards_not_speculating():
    assert optimal_gamma(0.0, 0.0) == 0  # every γ gives exactly 1x: no reason to draft


def test_optimal_gamma_refuses_a_negative_ceiling():
    with pytest.raises(ValueError, match="max_gamma must be"):
        optimal_gamma(0.8, 0.1, max_gamma=-1)
    with pytest.raises(ValueError, match="max_gamma must be"):
        optimal_gamma(0.8, 0.1, max_gamma=2.5)


def test_alpha_from_tau_exact_ends_and_an_impossible_tau():
    assert alpha_from_tau(5, 4) == 1.0 and alpha_from_tau(1, 4) == 0.0  # exactly, not a tolerance short
    with pytest.raises(ValueError, match="tau must lie in"):
        alpha_from_tau(5.5, 4)  # more than γ + 1 tokens per round: a mismeasured τ, not α ≈ 1


def test_alpha_for_speedup_refuses_zero_and_what_alpha_1_cannot_reach():
    with pytest.raises(ValueError, match="speedup must be > 0"):
        alpha_for_speedup(0, 4, 0.1)
    with pytest.raises(ValueError, match="out of reach"):  # 0.01 % above α = 1's own speedup
        alpha_for_speedup(1.0001 * expected_speedup(1.0, 4, 0.2), 4, 0.2)


def test_total_variation_refuses_a_row_that_sums_to_1_03():
    with pytest.raises(ValueError, match="summing to 1.03"):
        total_variation([0.5, 0.53], [0.5, 0.5])


def test_drafts_short_of_gamma_marks_rounds_the_formula_does_not_describe():
    """Under 0.9 γ drafts per round: prompt lookup's 3.4 and the suffix drafter's 1.1 at γ = 4 (the demo, 2026-12-07);
    not a model drafter whose last round was cut (3.9 at γ = 4), nor a run with no round (NaN)."""
    from specdec_edu.result import GenerationStats
    from specdec_edu.theory import drafts_short_of_gamma

    assert drafts_short_of_gamma(3.4, 4) and drafts_short_of_gamma(1.1, 4)
    assert not drafts_short_of_gamma(3.9, 4) and not drafts_short_of_gamma(4.0, 4)
    assert not drafts_short_of_gamma(GenerationStats().drafts_per_round, 4)  # NaN: nothing to judge
    assert GenerationStats(rounds=5, drafted=17).drafts_per_round == 3.4
