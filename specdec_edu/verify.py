"""The verification rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

For each draft token x_i (drawn from the draft's q_i), in order:

* accept it with probability ``min(1, p_i(x_i) / q_i(x_i))``;
* at the first rejection, emit instead a sample from the *residual*
  ``normalize(max(0, p_i - q_i))`` and stop;
* if all γ drafts are accepted, the target's distribution at the next position,
  p_{γ+1}, gives one more ("bonus") token for free.

(Here positions count from 1, as in the papers; in the code, tensors count from 0, so p_i is row ``p[i-1]`` and
the bonus distribution is ``p[γ]``.)

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


def verify_drafts(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The rule on the device, without a single host sync: ``[2]`` = (n_accepted, next_token).

    The same decisions, from the same random numbers, as :func:`accept_and_resample`
    (which calls this and reads the two numbers). ``speculative_generate`` calls this
    directly, so that reading the decision is its only device→host sync of the round.
    Shapes: p ``[γ+1, V]``, q ``[γ, V]``, draft_tokens ``[γ]``.
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
    # once; uniforms after the first rejection are unused.
    u = torch.rand(gamma, generator=generator, device=p.device, dtype=p.dtype)
    accepted = u < acceptance_probability(p_x, q_x)
    n_accepted = accepted.long().cumprod(0).sum()  # 0-d: length of the all-accepted prefix

    # Where the next token comes from, for every possible n: after a rejection at
    # row i, the residual normalize(max(0, p[i] − q[i])); after γ acceptances, the
    # bonus distribution p[γ] (p_{γ+1}) that the verify pass computed for free. Pick row n.
    # (Selecting with index_select keeps n on the device: no `if n < γ` on the host.)
    candidates = torch.cat([residual_distribution(p[:gamma], q), p[gamma:]])  # [γ+1, V]
    next_probs = candidates.index_select(0, n_accepted.view(1))  # [1, V]
    next_token = sample(next_probs[0], generator)  # 0-d, on the device (no read: see sampling.sample)
    return torch.stack([n_accepted, next_token])


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """The rule at temperature 0, on the device: ``[..., 2]`` = (n_accepted, next_token).

    Greedy p is one-hot at the target's argmax, so min(1, p/q) is 1 for the argmax and
    0 for anything else, and the residual max(0, p − q) is one-hot at the argmax too
    wherever a rejection is possible (q(argmax) < 1), *whatever else q is*. The rule
    therefore reduces to: keep drafts while they equal the target's argmax, then emit the
    argmax. No softmax, no random numbers.
    Shapes: target_logits ``[..., γ+1, V]``, draft_tokens ``[..., γ]`` (``...``: one prompt, or B rows).
    """
    choice = target_logits.argmax(-1)  # [..., γ+1] the target's greedy token at every position
    matches = (draft_tokens == choice[..., :-1]).long()
    n_accepted = matches.cumprod(-1).sum(-1)  # [...]
    return torch.stack([n_accepted, choice.gather(-1, n_accepted[..., None])[..., 0]], -1)


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
    n_accepted, next_token = verify_drafts(p, q, draft_tokens, generator).tolist()
    return n_accepted, next_token
