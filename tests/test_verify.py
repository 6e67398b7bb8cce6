"""Exactness of the accept/resample rule, analytically and by Monte-Carlo, with negative controls."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_edu import accept_and_resample, acceptance_probability, residual_distribution
from specdec_edu.controls import accept_always, resample_from_target

CHI2_THRESHOLD = 1e-3  # a correct rule fails at this level 0.1 % of the time per test; seeds are fixed


def output_distribution(p, q, rule="correct"):
    """P(emitted token = x) for one position, in closed form from the algorithm's own pieces.

    accepted mass q(x)·a(x), plus rejected mass (1 − Σ q·a) times the distribution resampled from.
    """
    a = acceptance_probability(p, q)
    if rule == "always accept":
        return q.clone()
    resampled = residual_distribution(p, q) if rule == "correct" else p
    return q * a + (1 - (q * a).sum(-1, keepdim=True)) * resampled


def random_pairs(n, vocab_size, seed):
    """n (p, q) pairs in float64: Dirichlet draws of varied concentration, some sparse."""
    gen = torch.Generator().manual_seed(seed)
    conc = torch.exp(torch.empty(n, 1, dtype=torch.float64).uniform_(-3, 2, generator=gen))
    def dirichlet():
        g = torch._standard_gamma(conc.expand(n, vocab_size).contiguous(), generator=gen)
        return g / g.sum(-1, keepdim=True)
    p, q = dirichlet(), dirichlet()
    p[::5][:, : vocab_size // 2] = 0  # every 5th: disjoint-ish supports
    q[::5][:, vocab_size // 2 :] = 0
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def edge_cases(vocab_size):
    gen = torch.Generator().manual_seed(7)
    p = torch.rand(vocab_size, generator=gen, dtype=torch.float64)
    p /= p.sum()
    one_hot = torch.zeros(vocab_size, dtype=torch.float64)
    one_hot[3] = 1
    half = torch.zeros(vocab_size, dtype=torch.float64)
    half[: vocab_size // 2] = 2 / vocab_size
    other_half = half.flip(0)
    return [
        (p, p.clone()),  # p == q: nothing is ever rejected
        (p, one_hot),  # deterministic drafter (prompt lookup)
        (one_hot, p),  # greedy target
        (one_hot, one_hot),
        (half, other_half),  # disjoint supports: every draft rejected
    ]


def test_analytic_identity_random_pairs():
    """1,000 random pairs over 50 tokens + 200 over 49,152: output distribution == p to 1e-12."""
    for n, vocab_size, seed in [(1000, 50, 0), (200, 49_152, 1)]:
        p, q = random_pairs(n, vocab_size, seed)
        assert (output_distribution(p, q) - p).abs().max() < 1e-12


@pytest.mark.parametrize("vocab_size", [8, 49_152])
def test_analytic_identity_edge_cases(vocab_size):
    for p, q in edge_cases(vocab_size):
        assert (output_distribution(p, q) - p).abs().max() < 1e-12


@pytest.mark.parametrize("rule", ["always accept", "resample from p"])
def test_analytic_identity_rejects_broken_rules(rule):
    """Negative control: the same check finds the broken rules far from p."""
    p, q = random_pairs(1000, 50, 0)
    assert (output_distribution(p, q, rule) - p).abs().max() > 0.1


# ---- Monte-Carlo: run the real function many times --------------------------------------------

N_MC = 20_000
GAMMA = 2


@pytest.fixture(scope="module")
def mc_problem():
    """Fixed p [γ+1, 6] and q [γ, 6] = p's logits plus noise (they disagree, but not so much
    that the bonus position is rarely reached), and N_MC draft sequences sampled from q."""
    gen = torch.Generator().manual_seed(42)
    logits = 2 * torch.randn(GAMMA + 1, 6, generator=gen)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:GAMMA] + 1.2 * torch.randn(GAMMA, 6, generator=gen), -1)
    drafts = torch.stack([torch.multinomial(q[i], N_MC, replacement=True, generator=gen) for i in range(GAMMA)], 1)
    return p, q, drafts


def run_rule(rule, p, q, drafts, seed=0):
    """Emitted tokens per trial: (first, second or -1, bonus or -1)."""
    gen = torch.Generator().manual_seed(seed)
    out = np.full((len(drafts), 3), -1)
    for t, x in enumerate(drafts):
        n, nxt = rule(p, q, x, gen)
        emitted = x[:n].tolist() + [nxt]
        out[t, : min(2, len(emitted))] = emitted[:2]
        if n == GAMMA:
            out[t, 2] = nxt
    return out


def chi2_pvalue(samples, probs):
    samples = samples[samples >= 0]
    counts = np.bincount(samples, minlength=len(probs))
    expected = probs.double().numpy()
    return chisquare(counts, len(samples) * expected / expected.sum()).pvalue


RULES = {"correct": accept_and_resample, "always accept": accept_always, "resample from p": resample_from_target}


@pytest.fixture(scope="module")
def mc_runs(mc_problem):
    return {name: run_rule(rule, *mc_problem) for name, rule in RULES.items()}


def test_first_token_is_p0(mc_problem, mc_runs):
    """20,000 trials; χ² against p_0 at level 1e-3. Both negative controls must fail the same test."""
    p = mc_problem[0]
    assert chi2_pvalue(mc_runs["correct"][:, 0], p[0]) > CHI2_THRESHOLD
    assert chi2_pvalue(mc_runs["always accept"][:, 0], p[0]) < CHI2_THRESHOLD
    assert chi2_pvalue(mc_runs["resample from p"][:, 0], p[0]) < CHI2_THRESHOLD


def test_second_token_is_p1(mc_problem, mc_runs):
    """Trials that emitted a second token (first draft accepted) follow p_1."""
    p = mc_problem[0]
    assert chi2_pvalue(mc_runs["correct"][:, 1], p[1]) > CHI2_THRESHOLD
    assert chi2_pvalue(mc_runs["always accept"][:, 1], p[1]) < CHI2_THRESHOLD
    assert chi2_pvalue(mc_runs["resample from p"][:, 1], p[1]) < CHI2_THRESHOLD


def test_bonus_token_is_p_gamma(mc_problem, mc_runs):
    """When all γ drafts are accepted, the bonus token follows p_γ."""
    p = mc_problem[0]
    bonus = mc_runs["correct"][:, 2]
    assert (bonus >= 0).sum() > 2000
    assert chi2_pvalue(bonus, p[GAMMA]) > CHI2_THRESHOLD
    # Negative control for this test: the bonus drawn from the wrong position must fail.
    assert chi2_pvalue(bonus, p[0]) < CHI2_THRESHOLD


def test_deterministic_cases():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert accept_and_resample(p, torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([1])) == (1, 2)  # accept, then bonus
    assert accept_and_resample(p, torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0])) == (0, 1)  # reject → target's token
    # q == p: acceptance is certain, every time
    gen = torch.Generator().manual_seed(0)
    pp = torch.softmax(torch.randn(5, 100, generator=gen), -1)
    x = torch.stack([torch.multinomial(pp[i], 1, generator=gen)[0] for i in range(4)])
    assert all(accept_and_resample(pp, pp[:4], x, gen)[0] == 4 for _ in range(50))


def test_shape_errors():
    with pytest.raises(ValueError, match="γ"):
        accept_and_resample(torch.ones(3, 4) / 4, torch.ones(3, 4) / 4, torch.tensor([0, 1, 2]))


def test_mc_problem_is_a_hard_one(mc_problem, mc_runs):
    """Guard on the fixture: p and q must differ (else the controls could pass by luck)."""
    p, q, _ = mc_problem
    tv = 0.5 * (p[:GAMMA] - q).abs().sum(-1)
    assert (tv > 0.15).all(), tv
    print("TV per position", tv.tolist(), "bonus trials", (mc_runs["correct"][:, 2] >= 0).sum())
