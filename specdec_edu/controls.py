"""Deliberately WRONG verification rules: negative controls.

A statistical test that cannot fail proves nothing. These variants have the same
signature as ``accept_and_resample`` and each breaks one piece of it; the exactness
tests (and notebook 05) run them through the same checks and must reject them.
"""

from __future__ import annotations

import torch

from .sampling import sample
from .verify import acceptance_probability


def accept_always(p, q, draft_tokens, generator=None):
    """Keep every draft token: the output follows the draft's q, not the target's p."""
    gamma = draft_tokens.shape[0]
    return gamma, int(sample(p[gamma], generator))


def resample_from_target(p, q, draft_tokens, generator=None):
    """Correct rule for accepting, but on rejection sample from p instead of the residual.

    Tokens the draft over-proposes get extra mass twice: by acceptance and again
    by the resample, so the output is skewed towards q.
    """
    gamma = draft_tokens.shape[0]
    positions = torch.arange(gamma, device=p.device)
    u = torch.rand(gamma, generator=generator, device=p.device, dtype=p.dtype)
    accepted = u < acceptance_probability(p[positions, draft_tokens], q[positions, draft_tokens])
    n = int(accepted.cumprod(0).sum())
    return n, int(sample(p[n], generator))
