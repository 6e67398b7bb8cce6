"""Deliberately WRONG verification rules and drafters: negative controls.

A statistical test that cannot fail proves nothing. The rules here have the same
signature as ``accept_and_resample``, ``(p [γ+1, V], q [γ, V], drafts [γ], generator)
-> (n_accepted, next_token)``, and :class:`MisreportedQDrafter` speaks the drafter
protocol; each breaks exactly one piece of speculative sampling. The exactness tests
(and notebook 05) run them through the same checks as the real thing and must reject
every one of them.

Every control also works for a round with no drafts (γ = 0: p is ``[1, V]``), which
``speculative_generate`` runs when only one token of room is left.
"""

from __future__ import annotations

import torch

from ..drafters import ModelDrafter
from ..sampling import sample
from ..verify import accept_and_resample, acceptance_probability, residual_distribution

__all__ = [
    "accept_always",
    "resample_from_target",
    "bonus_from_previous_position",
    "residual_one_position_late",
    "MisreportedQDrafter",
    "BROKEN_RULES",
]


def n_accepted(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator=None) -> int:
    """The *correct* acceptance step alone: the length of the accepted prefix (0..γ).

    Draws γ uniforms, like ``verify_drafts``, so a control that reuses it differs from
    the real rule only in the piece it breaks.
    """
    gamma = draft_tokens.shape[0]
    positions = torch.arange(gamma, device=p.device)
    u = torch.rand(gamma, generator=generator, device=p.device, dtype=p.dtype)
    accepted = u < acceptance_probability(p[positions, draft_tokens], q[positions, draft_tokens])
    return int(accepted.long().cumprod(0).sum())


def accept_always(p, q, draft_tokens, generator=None):
    """Keep every draft token: the output follows the draft's q, not the target's p."""
    gamma = draft_tokens.shape[0]
    return gamma, int(sample(p[gamma], generator))


def resample_from_target(p, q, draft_tokens, generator=None):
    """Correct rule for accepting, but on rejection sample from p instead of the residual.

    A token the draft over-proposes (q(x) > p(x)) is already kept with its full p(x) by acceptance; the resample
    adds (1 − β)·p(x) on top, β = Σ min(p, q), so the output is skewed towards q.
    """
    n = n_accepted(p, q, draft_tokens, generator)
    return n, int(sample(p[n], generator))


def bonus_from_previous_position(p, q, draft_tokens, generator=None):
    """Correct rule, except that the bonus token comes from row ``p[γ-1]`` instead of ``p[γ]`` (an off-by-one).

    Row ``p[γ-1]`` is the target's distribution for the *last draft's* position, not for the
    position after it, so after a fully accepted round the extra token follows the
    wrong distribution (often repeating what the last draft was likely to be).
    Accepted and corrected tokens stay right: only rounds that accept everything go wrong.
    """
    if draft_tokens.shape[0] == 0:  # no drafts: nothing to shift, the target's own token
        return accept_and_resample(p, q, draft_tokens, generator)
    shifted = torch.cat([p[:-1], p[-2:-1]])  # row γ (the bonus) replaced by row γ−1 (the last draft's)
    return accept_and_resample(shifted, q, draft_tokens, generator)


def residual_one_position_late(p, q, draft_tokens, generator=None):
    """Correct acceptance, but after n accepted drafts the residual of the row after the rejected one.

    Rows count from 0 here, as the tensors do: the rejected draft is row n, whose distributions
    are ``p[n]`` and ``q[n]``, and its correction is normalize(max(0, p[n] − q[n])). This control
    takes ``p[n+1]`` and ``q[n+1]`` instead, the rows of a draft the round never reaches. When
    n + 1 is past the last draft (n = γ−1) there is no later draft, so row γ−1 (the right one)
    is used: the error is in rejections before the last draft.
    """
    gamma = draft_tokens.shape[0]
    n = n_accepted(p, q, draft_tokens, generator)
    if n == gamma:  # everything accepted: the bonus from row p[γ], as in the real rule
        return n, int(sample(p[gamma], generator))
    late = min(n + 1, gamma - 1)
    return n, int(sample(residual_distribution(p[late], q[late]), generator))


# The broken rules by name, for tests that run every control through the same check.
BROKEN_RULES = {
    "accept_always": accept_always,
    "resample_from_target": resample_from_target,
    "bonus_from_previous_position": bonus_from_previous_position,
    "residual_one_position_late": residual_one_position_late,
}


class MisreportedQDrafter:
    """A drafter that samples from one q and reports another.

    Each token is drawn from the run's q = ``to_probs(logits)`` (temperature, top-k,
    top-p applied), but the q it returns is the *raw* ``softmax(logits)``, as if the
    warpers had been forgotten when reporting. The rule then accepts x with probability
    min(1, p(x)/q_raw(x)) although x was drawn with q_warped(x): a token the warpers
    made likelier (the top ones, at temperature < 1) is accepted more often than
    min(p, q) allows, and the residual max(0, p − q_raw) no longer fills the gap, so the
    output leans towards the draft. (Correct whenever the warpers are the identity:
    temperature 1, no top-k, no top-p.)

    ``drafter`` is a draft model (wrapped in a :class:`ModelDrafter`) or any drafter whose
    ``propose`` turns logits into q through ``to_probs`` (Medusa, EAGLE); everything else
    (``observe``, ``reset``, counters) is the wrapped drafter's.

    The reverse bug (sampling raw, reporting warped) would also break exactness, but with
    top-k/top-p it proposes tokens of reported q = 0, which ``speculative_generate``
    refuses with an error before any statistics are needed.
    """

    def __init__(self, drafter):
        self.inner = ModelDrafter(drafter) if isinstance(drafter, torch.nn.Module) else drafter

    def __getattr__(self, name):  # only called for what this class lacks: observe, rounds, check_target, ...
        return getattr(self.__dict__["inner"], name)

    def propose(self, context, gamma, to_probs, generator=None):
        reported = []

        def sample_warped_report_raw(logits):  # logits [..., V']: one draft position, or Medusa's [γ', V'] at once
            reported.append(torch.softmax(logits.float(), -1))
            return to_probs(logits)

        tokens, q = self.inner.propose(context, gamma, sample_warped_report_raw, generator)
        if not reported:  # nothing drafted (γ = 0, or no feature yet)
            return tokens, q
        # One call per position gives [..., V'] each (stack them); one call for all gives q's shape already.
        raw = torch.stack(reported, -2) if reported[0].dim() < q.dim() else torch.cat(reported, -2)
        return tokens, raw.to(q.dtype)
