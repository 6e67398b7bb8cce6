"""Exactness of the accept/resample rule, analytically and by Monte-Carlo, with negative controls."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_edu import accept_and_resample, acceptance_probability, residual_distribution
from specdec_edu.course.controls import BROKEN_RULES

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
# Every χ² test below: N_MC = 20,000 trials, the problem drawn with seed 42, the rule's generator
# seeded 0, rejection at p < CHI2_THRESHOLD = 1e-3. Power, measured once over 5 (problem, rule)
# seeds (42/0 and 1001..1004/1..4): every control rejected on every seed (5/5) at every token it breaks,
# the largest such p-value 5e-27 at the first token (misreported q), 4e-14 at the second (misreported q;
# resample_from_target 2e-74, accept_always 0); the correct rule's smallest p-value 0.014 (15 tests).

N_MC = 20_000
GAMMA = 2
TEMPERATURE = 0.7  # the run's warper: p, q = softmax(logits / T); the misreported-q control reports T = 1


@pytest.fixture(scope="module")
def mc_problem():
    """Fixed p [γ+1, 6] and q [γ, 6] from p's logits plus noise (they disagree, but not so much
    that the bonus position is rarely reached), q_raw = the untempered q, and N_MC draft
    sequences sampled from q."""
    gen = torch.Generator().manual_seed(42)
    logits = 2 * torch.randn(GAMMA + 1, 6, generator=gen)
    draft_logits = logits[:GAMMA] + 1.2 * torch.randn(GAMMA, 6, generator=gen)
    p, q = torch.softmax(logits / TEMPERATURE, -1), torch.softmax(draft_logits / TEMPERATURE, -1)
    q_raw = torch.softmax(draft_logits, -1)
    drafts = torch.stack([torch.multinomial(q[i], N_MC, replacement=True, generator=gen) for i in range(GAMMA)], 1)
    return SimpleNamespace(p=p, q=q, q_raw=q_raw, drafts=drafts)


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


# Which emitted tokens each control gets wrong (γ = 2): (column of run_rule's output, position of p) each.
FIRST, SECOND, BONUS = (0, 0), (1, 1), (2, GAMMA)
TOKEN_NAMES = {FIRST: "first", SECOND: "second", BONUS: "bonus"}
BREAKS = {
    "accept_always": (FIRST, SECOND),  # the first two tokens follow q_0 and q_1
    "resample_from_target": (FIRST, SECOND),  # rejections resample p_i: the token leans to q_i
    "bonus_from_previous_position": (BONUS,),  # only the bonus is wrong (from p_1)
    "residual_one_position_late": (FIRST,),  # a rejection of draft 0 emits a sample of position 1's residual
    "misreported_q": (FIRST, SECOND),  # accepted with min(1, p/q_raw) though drawn from q
}
BROKEN_TOKENS = [(control, token) for control in sorted(BREAKS) for token in BREAKS[control]]


@pytest.fixture(scope="module")
def mc_runs(mc_problem):
    m = mc_problem
    # The misreporting drafter at the rule level: drafts drawn from q, the rule told q_raw.
    misreported = lambda p, q, x, g: accept_and_resample(p, m.q_raw, x, g)
    rules = {"correct": accept_and_resample, **BROKEN_RULES, "misreported_q": misreported}
    assert set(rules) == {"correct", *BREAKS}
    return {name: run_rule(rule, m.p, m.q, m.drafts) for name, rule in rules.items()}


@pytest.mark.parametrize("column, position", [FIRST, SECOND, BONUS], ids=["first", "second", "bonus"])
def test_correct_rule_emits_p(mc_problem, mc_runs, column, position):
    """The first token follows p_0; the second (when draft 0 was accepted) p_1; the bonus (when all
    γ were accepted) p_γ."""
    tokens = mc_runs["correct"][:, column]
    assert (tokens >= 0).sum() > 2000  # enough trials reach this position for the test to have power
    assert chi2_pvalue(tokens, mc_problem.p[position]) > CHI2_THRESHOLD


@pytest.mark.parametrize("control, token", BROKEN_TOKENS, ids=[f"{c}-{TOKEN_NAMES[t]}" for c, t in BROKEN_TOKENS])
def test_negative_controls_are_rejected(mc_problem, mc_runs, control, token):
    """The same χ² test, same trials and threshold, rejects every broken rule at every token it breaks: the
    first, second and bonus columns of test_correct_rule_emits_p each have a control that must fail there."""
    column, position = token
    assert chi2_pvalue(mc_runs[control][:, column], mc_problem.p[position]) < CHI2_THRESHOLD


def test_deterministic_cases():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert accept_and_resample(p, torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([1])) == (1, 2)  # accept, then bonus
    assert accept_and_resample(p, torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0])) == (0, 1)  # reject → target's token
    # q == p: acceptance is certain, every time
    gen = torch.Generator().manual_seed(0)
    pp = torch.softmax(torch.randn(5, 100, generator=gen), -1)
    x = torch.stack([torch.multinomial(pp[i], 1, generator=gen)[0] for i in range(4)])
    assert all(accept_and_resample(pp, pp[:4], x, gen)[0] == 4 for _ in range(50))


def test_a_draft_the_target_never_emits_is_rejected_even_at_u_0(monkeypatch):
    """Accept iff u < min(1, p/q), strictly: u = 0 is one of torch.rand's values (probability 2^-24 per draft), and
    with `<=` it accepted a draft of p(x) = 0 (a token top-k/top-p or greedy removed from the target), emitting a
    token the target never emits. Pinned by fixing every uniform at 0; the control: a draft with p(x) > 0 is kept."""
    monkeypatch.setattr(torch, "rand", lambda n, generator=None, device=None, dtype=None: torch.zeros(n, dtype=dtype))
    p = torch.tensor([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.5, 0.5, 0.0]])
    assert accept_and_resample(p, q, torch.tensor([0])) == (0, 2)  # rejected; the residual max(0, p − q) is token 2
    assert accept_and_resample(p, q, torch.tensor([1]))[0] == 1  # control: p(1) = q(1), accepted


def test_the_residual_of_identical_distributions_falls_back_to_p():
    """q ≥ p everywhere (here q is p plus rounding: 1e-12 more on two tokens) leaves no residual mass; a rejection there
    can come only from rounding, and must still sample from p (the target), not q. Returning q passed every other
    test (with real pairs the branch is almost never reached)."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]], dtype=torch.float64)
    assert torch.equal(residual_distribution(p, p.clone()), p)
    rounded_up = p + torch.tensor([[1e-12, 0, 1e-12, 0]], dtype=torch.float64)
    assert torch.equal(residual_distribution(p, rounded_up), p)
    q = torch.tensor([[0.2, 0.3, 0.5, 0.0]], dtype=torch.float64)  # control: a residual exists, and it is not p
    assert torch.allclose(residual_distribution(p, q), torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64))


def test_shape_errors():
    with pytest.raises(ValueError, match="γ"):
        accept_and_resample(torch.ones(3, 4) / 4, torch.ones(3, 4) / 4, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("draft_vocab", [1, 5])
def test_p_and_q_over_different_vocabularies_are_refused(draft_vocab):
    """p and q must cover the same V. A q of width 1 with drafts of id 0 broadcast silently in max(0, p − q) (a
    wrong residual, no error); a wider q raised torch's bare size error. Both must name the shapes."""
    p, q = torch.ones(3, 4) / 4, torch.ones(2, draft_vocab) / draft_vocab
    with pytest.raises(ValueError, match="shapes do not fit"):
        accept_and_resample(p, q, torch.tensor([0, 0]))


def test_acceptance_probability_is_one_where_q_is_zero():
    """The documented value where q(x) = 0 (the draft never proposes x): 1, finite, not 0/0. verify_drafts never reads
    it (a token with q = 0 is never drafted), so only a direct call, as the course's widgets make, pins it."""
    p, q = torch.tensor([0.5, 0.0, 0.5, 0.0]), torch.tensor([0.25, 0.75, 0.0, 0.0])
    assert acceptance_probability(p, q).tolist() == [1.0, 0.0, 1.0, 1.0]


def test_mc_problem_is_a_hard_one(mc_problem):
    """Guard on the fixture: p and q (and q and q_raw) must differ, else the controls could pass by luck."""
    m = mc_problem
    tv = 0.5 * (m.p[:GAMMA] - m.q).abs().sum(-1)
    assert (tv > 0.15).all(), tv
    assert (0.5 * (m.q - m.q_raw).abs().sum(-1) > 0.04).all()
