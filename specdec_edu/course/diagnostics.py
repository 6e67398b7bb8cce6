"""Why did two greedy outputs differ? Numerics or a bug.

Greedy speculative decoding is exact in exact arithmetic: its output is the
target's own greedy output. In bf16 it can still differ, because the target
scores a token inside a (γ + 1)-token verify forward while the reference scored
it in a 1-token forward; the two sum in a different order and round differently.
That can only flip the argmax where the target's top two logits are (nearly)
tied. So a divergence is explained by looking at the target's top-2 margin at
the first position where the outputs differ: tiny (the size of a bf16 rounding
step) means numerics, large means a bug. (The margin comes from a third forward, over
the whole reference at once; near a tie all three agree that it is small.)
"""

from __future__ import annotations

import torch


def _as_1d(ids: torch.Tensor, name: str) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}; pass one sequence, [n] or [1, n] "
                         "(for a batch, call first_divergence once per row)")
    return ids.long().cpu()


@torch.no_grad()
def first_divergence(target, prompt_ids, reference_new, candidate_new) -> dict | None:
    """The first position where ``candidate_new`` leaves ``reference_new``, and the target's margin there.

    ``prompt_ids``: ``[P]`` or ``[1, P]``; ``reference_new``: ``[n]`` the target-only output's new
    tokens; ``candidate_new``: ``[m]`` another method's new tokens for the same prompt.

    Returns ``None`` when the two are identical, else a dict:

    - ``position``: index among the new tokens (0 = the first generated token);
    - ``reference_token`` / ``candidate_token``: the ids there (``None`` for the one that ended);
    - ``top2_margin``: logit[top-1] − logit[top-2] of the target at that position, from ONE
      teacher-forced forward over ``prompt + reference_new[:position]`` (the reference's context);
    - ``candidate_margin``: logit[top-1] − logit[candidate_token] there (``None`` if it ended);
      equal to ``top2_margin`` when the candidate is the runner-up. A small ``top2_margin`` with a
      large ``candidate_margin`` is still a bug: the candidate was not the near-tie.

    Margins are in the target's own logit units, computed in float32 from its logits.
    """
    prompt = _as_1d(prompt_ids, "prompt_ids")
    ref = _as_1d(reference_new, "reference_new")
    cand = _as_1d(candidate_new, "candidate_new")
    n = min(len(ref), len(cand))
    differs = (ref[:n] != cand[:n]).nonzero()
    if len(differs):
        position = int(differs[0])
    elif len(ref) == len(cand):
        return None
    else:  # one is a prefix of the other: they part where the shorter one stops
        position = n
    context = torch.cat([prompt, ref[:position]])[None].to(target.device)
    # logits_to_keep=1: only the last position's logits, the ones that predict new token `position`
    logits = target(input_ids=context, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    top2 = logits.topk(2).values
    reference_token = int(ref[position]) if position < len(ref) else None
    candidate_token = int(cand[position]) if position < len(cand) else None
    return {
        "position": position,
        "reference_token": reference_token,
        "candidate_token": candidate_token,
        "top2_margin": float(top2[0] - top2[1]),
        "candidate_margin": None if candidate_token is None else float(top2[0] - logits[candidate_token]),
    }
