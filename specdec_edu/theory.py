"""Expected speedup of speculative decoding (Leviathan et al. 2023, Theorem 3.8 and Corollary 3.9).

Model: each draft token is accepted independently with probability α. A round
drafts γ tokens (cost γ·c, in units of one target forward) and verifies them in one
target forward (cost 1, if verifying γ+1 tokens costs the same as decoding one:
true while decoding is memory-bound). A round yields 1 + (number of accepted
drafts) tokens, whose expectation is the geometric sum 1 + α + … + α^γ.

``verify_cost`` replaces that 1 by a measurement, taken one of two ways:

* bare forwards, t(γ+1) / t(1): one forward appending γ+1 tokens over a one-token forward, both timed alone
  (``course.measure.measured_verify_cost``: ``bench``, ``gpu-report``, notebook 07's curve);
* whole rounds: a run's verify forward, accept rule and read per round, over a target-only run's step, which counts
  its own sampling and read (``demo``, notebook 08's dial). It also charges the rule's per-round work, which the
  bare ratio leaves out.

The last part of the module is the other half of the theory, what one verification
step emits: :func:`output_distribution` computes it in closed form (it is p, for the
correct rule), and :func:`total_variation` measures how far two distributions are apart.
"""

from __future__ import annotations

import numpy as np
import torch

from .verify import acceptance_probability, residual_distribution


def _check(alpha, gamma, c=0.0, verify_cost=1.0):
    """Refuse impossible inputs. A NaN α or c passes: a run that judged no draft has α = NaN (``stats.alpha``), and
    its predicted speedup is then NaN too, printed as such, rather than an error that stops a benchmark."""
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1] (it is a probability), got {alpha}")
    if np.any(np.asarray(gamma) < 0):
        raise ValueError(f"gamma must be >= 0 draft tokens, got {gamma}")
    if np.any(np.asarray(c, dtype=float) < 0):
        raise ValueError(f"c (draft cost / target cost) must be >= 0, got {c}")
    if not np.all(np.asarray(verify_cost, dtype=float) > 0):  # 0 made the speedup infinite, −1 made it negative
        raise ValueError(f"verify_cost (a verify pass / a target step) must be > 0, got {verify_cost}")
    return a


def _scalar_or_array(x):
    return float(x) if np.ndim(x) == 0 else x


def expected_tokens_per_round(alpha, gamma):
    """E[tokens per target forward] = (1 − α^(γ+1)) / (1 − α); γ + 1 when α = 1.

    Works elementwise on numpy arrays too.
    """
    a, g = _check(alpha, gamma), np.asarray(gamma)
    near = (a > 0.999) & (a < 1)  # the plain form loses digits to cancellation here: expm1 over expm1 does not
    safe = np.where((a == 1) | near, 0.5, a)  # no 0/0 at α = 1 (those entries are replaced below)
    plain = (1 - safe ** (g + 1)) / (1 - safe)
    log_a = np.log(np.where(near, a, 0.5))  # the log only where it is used: no log of 0 at α = 0
    exact_near_one = np.expm1((g + 1) * log_a) / np.expm1(log_a)  # smooth up to 1, so alpha_from_tau can reach it
    return _scalar_or_array(np.where(a == 1, g + 1.0, np.where(near, exact_near_one, plain)))


def expected_speedup(alpha, gamma, c, verify_cost=1.0):
    """Expected walltime speedup over target-only decoding.

    ``(1 − α^(γ+1)) / ((1 − α)(γc + verify_cost))``. With ``verify_cost=1`` (the
    default) this is Leviathan et al.'s formula. On devices where a (γ+1)-token
    forward costs more than a one-token forward (a small model on a CPU), pass the
    measured ratio ``t_verify(γ+1) / t_target(1)`` as ``verify_cost``.
    """
    _check(alpha, gamma, c, verify_cost)
    return _scalar_or_array(
        np.asarray(expected_tokens_per_round(alpha, gamma)) / (np.asarray(gamma) * np.asarray(c, float) + verify_cost)
    )


def optimal_gamma(alpha: float, c: float, max_gamma: int = 16, verify_cost=1.0) -> int:
    """The γ in 0..max_gamma with the largest expected speedup; 0 means: do not speculate.

    γ = 0 is target-only decoding, a speedup of exactly 1. It wins where no γ ≥ 1 beats the target
    alone: a draft that costs about as much as a target step (c ≈ 1, as a compiled 30-layer draft
    does beside a compiled 1.7B target on an H200), or a drafter that is rarely right. So an answer
    γ ≥ 1 is never a recommendation to slow down. Ties go to the smaller γ.
    ``verify_cost`` may be a float or a function of γ returning t_verify(γ+1)/t_target(1).
    """
    if not isinstance(max_gamma, (int, np.integer)) or max_gamma < 0:
        raise ValueError(f"max_gamma must be a whole number of draft tokens >= 0 (0: no drafting), got {max_gamma!r}")
    cost = verify_cost if callable(verify_cost) else (lambda g: verify_cost)
    _check(alpha, max_gamma, c, cost(1))
    if np.isnan(alpha) or np.isnan(c):  # every γ's speedup is NaN, and max() would return γ = 0 as if it had won
        raise ValueError(f"alpha = {alpha}, c = {c}: no γ can be chosen from NaN (a run that judged no draft has "
                         "α = NaN): measure α and c on a run whose drafter proposed something.")
    speedup = {0: 1.0} | {g: expected_speedup(alpha, g, c, cost(g)) for g in range(1, max_gamma + 1)}
    return max(speedup, key=speedup.get)  # the first of equal maxima: γ = 0 when nothing beats the target alone


def drafts_short_of_gamma(drafts_per_round: float, gamma: int) -> bool:
    """Did a run draft under 0.9 γ per round on average? The formula assumes γ drafts in every round; a drafter that
    drafts only what it finds (prompt lookup, suffix) falls short of that, and its prediction is then a rough guide.
    (0.9 leaves room for a model drafter's last round, cut to fit ``max_new_tokens``.) False for NaN (no round)."""
    return drafts_per_round < 0.9 * gamma


def alpha_from_tau(tau: float, gamma: int, tol: float = 1e-10) -> float:
    """Invert tokens-per-round: the α for which ``expected_tokens_per_round(α, γ) == tau``."""
    if not 1 <= tau <= gamma + 1:
        raise ValueError(f"tau must lie in [1, gamma + 1] = [1, {gamma + 1}], got {tau}")
    if tau in (1, gamma + 1):  # the ends exactly (bisection would stop a tolerance short of 0 or 1)
        return 0.0 if tau == 1 else 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:  # the expectation grows monotonically in α: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, gamma) < tau else (lo, mid)
    return (lo + hi) / 2


def alpha_for_speedup(speedup: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """The acceptance rate a drafter needs for ``expected_speedup(α, γ, c, verify_cost) == speedup``.

    The speedup is τ / (γc + verify_cost), so the round must yield τ = speedup · (γc + verify_cost)
    tokens; :func:`alpha_from_tau` inverts τ. Even α = 1 yields at most γ + 1 tokens per round:
    beyond that no drafter at this γ, c and verify cost can reach ``speedup`` (a clear error says so).
    At or below α = 0's own speedup, 1 / (γc + verify_cost), it returns 0: every drafter reaches it.
    """
    _check(0.5, gamma, c, verify_cost)
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0 (a ratio of speeds), got {speedup}")
    tau = speedup * (gamma * c + verify_cost)
    if tau > (gamma + 1) * (1 + 1e-9):  # slack for rounding: α = 1's own speedup must map back to α = 1
        raise ValueError(f"a {speedup}x speedup is out of reach at gamma={gamma}, c={c:.3g}, verify cost "
                         f"{verify_cost:.3g}: even alpha = 1 gives {(gamma + 1) / (gamma * c + verify_cost):.2f}x. "
                         "Lower c or the verify cost, or raise gamma.")
    return alpha_from_tau(min(max(tau, 1.0), gamma + 1.0), gamma)


# ---- what one verification step emits ---------------------------------------------------------
def as_distribution(weights) -> torch.Tensor:
    """Non-negative weights ``[..., V]`` (a list, array or tensor) normalised over the last axis, in float64."""
    t = torch.as_tensor(weights, dtype=torch.float64)
    if t.dim() == 0:
        raise ValueError("need a distribution over tokens (at least one weight per token), got a single number")
    total = t.sum(-1, keepdim=True)
    if bool((t < 0).any()) or bool((total <= 0).any()):
        raise ValueError("need non-negative weights with a positive sum over the last axis, got "
                         f"min {float(t.min()):g} and smallest row sum {float(total.min()):g}")
    return t / total


def output_distribution(p, q, resample=None) -> torch.Tensor:
    """P(the first token one verification step emits = x), in closed form: ``[..., V]`` (float64).

    A draft token x ~ q is kept with probability min(1, p(x)/q(x)), so the accepted mass
    is q(x)·min(1, p(x)/q(x)) = min(p(x), q(x)); on a rejection (probability
    1 − Σ min(p, q)) the rule emits a sample from ``resample``, by default the residual
    normalize(max(0, p − q)). For the correct rule the two parts add up to p, whatever q is.
    ``p``, ``q`` (and ``resample``) are weights over the last axis (normalised here), so
    a batch of rows ``[N, V]`` works too. ``resample=p`` gives what the broken
    :func:`specdec_edu.course.controls.resample_from_target` emits: a negative control.
    """
    p, q = as_distribution(p), as_distribution(q)
    accepted = q * acceptance_probability(p, q)
    resampled = residual_distribution(p, q) if resample is None else as_distribution(resample)
    return accepted + (1 - accepted.sum(-1, keepdim=True)) * resampled


def total_variation(a, b) -> float:
    """TV(a, b) = ½ Σ |a − b| for two distributions (any array-likes of equal length, tensors on any device)."""
    a, b = (np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=float) for x in (a, b))
    if a.shape != b.shape:  # numpy would broadcast a [1] against a [V] in silence
        raise ValueError(f"total_variation needs two distributions over the same tokens, got shapes {a.shape} and {b.shape}")
    for x in (a, b):
        if (x < 0).any() or abs(x.sum() - 1) > 1e-4:  # 1e-4: float32 softmax rows over a large vocabulary
            raise ValueError(f"total_variation needs distributions (entries >= 0 summing to 1), got one summing to "
                             f"{x.sum():.6g}: normalise it first (x / x.sum())")
    return 0.5 * float(np.abs(a - b).sum())
