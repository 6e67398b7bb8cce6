"""The verification rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

For each draft token x_i (drawn from the draft's q_i), in order:

* accept it with probability ``min(1, p_i(x_i) / q_i(x_i))``;
* at the first rejection, emit instead a sample from the *residual*
  ``normalize(max(0, p_i - q_i))`` and stop;
* if all γ drafts are accepted, the target's distribution at the next position,
  p_γ, gives one more ("bonus") token for free.

Why the output is distributed exactly as p: token x is emitted either by
acceptance, probability ``q(x) * min(1, p(x)/q(x)) = min(p(x), q(x))``, or by
rejection followed by the residual, probability
``(1 - Σ_y min(p(y), q(y))) * max(0, p(x) - q(x)) / Σ_y max(0, p(y) - q(y))``.
The two sums are equal (both are 1 - Σ min(p, q)), so the second term is
``max(0, p(x) - q(x))``, and ``min(p, q) + max(0, p - q) = p``.
"""

from __future__ import annotations

import torch

from .sampling import check_generator, sample


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """``min(1, p(x) / q(x))`` elementwise.

    Where ``q(x) = 0`` the draft can never propose x, so the value is irrelevant;
    we return 1 there (and avoid dividing by zero).
    """
    ratio = p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    return torch.where(q_x > 0, ratio.clamp(max=1.0), torch.ones_like(p_x))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The corrected distribution ``normalize(max(0, p - q))`` over the last axis (``[..., V]``).

    It puts mass exactly where the target wants more than the draft offered. If
    ``p <= q`` everywhere (that is, p == q) nothing is ever rejected, so the
    residual is never used; we return p there so that the result is always a
    distribution, even when rounding made a rejection happen.
    """
    residual = (p - q).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def accept_and_resample(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Verify γ draft tokens against the target in one go.

    Args:
        p: ``[γ+1, V]`` target probabilities at the γ draft positions plus the bonus position.
        q: ``[γ, V]`` draft probabilities the drafts were sampled from (one-hot for a
            deterministic drafter such as prompt lookup).
        draft_tokens: ``[γ]`` the draft tokens.
        generator: the source of randomness (``torch.Generator`` on p's device).

    Returns:
        ``(n_accepted, next_token)``: how many drafts are kept (0..γ), and the token the
        target adds after them: a residual sample if draft ``n_accepted`` was
        rejected, the bonus token from ``p[γ]`` if all were accepted.
    """
    gamma = draft_tokens.shape[0]
    if p.shape[0] != gamma + 1 or q.shape[0] != gamma or p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"shapes do not fit: p {tuple(p.shape)} must be [γ+1, V], q {tuple(q.shape)} must be [γ, V], "
            f"draft_tokens {tuple(draft_tokens.shape)} must be [γ]."
        )
    check_generator(generator, p.device)
    positions = torch.arange(gamma, device=p.device)
    p_x, q_x = p[positions, draft_tokens], q[positions, draft_tokens]  # [γ] each

    # One uniform per draft: draft i survives if u_i < min(1, p/q). We draw all γ at
    # once (one host sync instead of γ); uniforms after the first rejection are unused.
    u = torch.rand(gamma, generator=generator, device=p.device, dtype=p.dtype)
    accepted = u < acceptance_probability(p_x, q_x)
    n_accepted = int(accepted.cumprod(0).sum())  # length of the all-accepted prefix

    if n_accepted < gamma:  # first rejection at position n: resample from the residual there
        next_probs = residual_distribution(p[n_accepted], q[n_accepted])
    else:  # every draft accepted: the verify pass already computed p at the next position
        next_probs = p[gamma]
    return n_accepted, int(sample(next_probs, generator))
