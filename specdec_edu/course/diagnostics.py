"""Why did two greedy outputs differ? Numerics or a bug.

Greedy speculative decoding is exact in exact arithmetic: its output is the
target's own greedy output. In bf16 it can still differ, because the target
scores a token inside a (γ + 1)-token verify forward while the reference scored
it in a 1-token forward; the two sum in a different order and round differently.
That can only flip the argmax where the target's top two logits are (nearly)
tied. So a divergence is explained by looking at the target's top-2 margin at
the first position where the outputs differ: tiny (the size of a bf16 rounding
step) means numerics, large means a bug. (The margin comes from a third forward, over
the whole reference at once; ``logit_spread`` measures how far it, too, can sit from the other two.)

``check_same_output`` is the one comparison the notebooks use: identity in fp32, and in bf16/fp16 a
divergence only where the target's margin is within what rounding can move (measured on this run by
``logit_spread``, and never less than one rounding step of the logit: ``rounding_step``).
"""

from __future__ import annotations

import math

import torch

from .. import kv

__all__ = ["OutputMismatch", "check_same_output", "first_divergence", "logit_spread"]


class OutputMismatch(AssertionError):
    """Two outputs that had to be the same are not, and numerics cannot explain it."""


def _as_1d(ids: torch.Tensor, name: str) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}; pass one sequence, [n] or [1, n] "
                         "(for a batch, call first_divergence once per row)")
    return ids.long().cpu()


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first position where two 1-D token sequences differ (``None``: identical). When one is a
    prefix of the other, they part where the shorter one stops."""
    n = min(len(a), len(b))
    differs = (a[:n] != b[:n]).nonzero()
    if len(differs):
        return int(differs[0])
    return None if len(a) == len(b) else n


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
    - ``top_logit``: logit[top-1] there (its size sets the rounding step of a 16-bit logit: ``rounding_step``);
    - ``candidate_margin``: logit[top-1] − logit[candidate_token] there (``None`` if it ended);
      equal to ``top2_margin`` when the candidate is the runner-up. A small ``top2_margin`` with a
      large ``candidate_margin`` is still a bug: the candidate was not the near-tie.

    Margins are in the target's own logit units, computed in float32 from its logits.
    """
    prompt = _as_1d(prompt_ids, "prompt_ids")
    ref = _as_1d(reference_new, "reference_new")
    cand = _as_1d(candidate_new, "candidate_new")
    position = first_difference(ref, cand)
    if position is None:
        return None
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
        "top_logit": float(top2[0]),
        "candidate_margin": None if candidate_token is None else float(top2[0] - logits[candidate_token]),
    }


def rounding_step(value: float, dtype: torch.dtype) -> float:
    """The gap between ``dtype``'s neighbouring numbers at ``|value|`` (for bf16 at a logit of 3: 2⁻⁶ = 0.0156).

    A 16-bit logit is rounded to this grid, so two logits whose exact values are closer than one step can still come
    out one step apart, in either order: no rounding-level difference between two forwards is ever smaller."""
    finfo = torch.finfo(dtype)
    if value == 0:
        return float(finfo.tiny)
    _, exponent = math.frexp(abs(value))  # |value| = m · 2^exponent, 0.5 ≤ m < 1
    return float(finfo.eps) * 2.0 ** (exponent - 1)


@torch.no_grad()
def logit_spread(target, context_ids, gamma: int = 4) -> float:
    """How far rounding moves the target's logits between its ways of scoring the same tokens.

    The last γ + 1 tokens of ``context_ids`` (``[n]`` or ``[1, n]``, n > γ + 1) are scored after the same
    cached prefix one token per forward (as target-only decoding does) and all γ + 1 in one forward (as a
    verify pass does): eager, and also on the target's compiled cache where a compiled generation made one (on
    a GPU, by default), since the outputs being compared came from those kernels; and once more in one
    cache-free forward over the whole context, the one ``first_divergence`` takes its margin from. Returns the
    largest absolute difference between any two of these ``[γ + 1, V]`` logit tables, in float32: about 0 in
    fp32, a rounding step or more in bf16/fp16. (Any two: a margin read eager must allow for the compiled
    kernels' own rounding, as well as for the difference between widths.)
    """
    ids = _as_1d(context_ids, "context_ids").to(target.device)
    if len(ids) <= gamma + 1:
        raise ValueError(f"logit_spread needs more than γ + 1 = {gamma + 1} tokens of context, got {len(ids)}")
    caches = [kv.new_cache(target), kv.existing_static_cache(target, len(ids))]
    tables = [table for cache in caches if cache is not None for table in _tables_on(target, cache, ids, gamma)]
    tables.append(target(input_ids=ids[None], use_cache=False, logits_to_keep=gamma + 1).logits[0])
    stacked = torch.stack([table.float() for table in tables])  # [tables, γ + 1, V]
    return float((stacked.amax(0) - stacked.amin(0)).max())


def _tables_on(target, cache, ids, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail's logits ``[γ + 1, V]`` on one cache: one token at a time, then rolled back and in one forward."""
    prefix, tail = ids[None, : -(gamma + 1)], ids[None, -(gamma + 1):]
    kv.forward_cached(target, prefix, cache)
    single = torch.cat([kv.forward_cached(target, tail[:, i : i + 1], cache).logits[0] for i in range(gamma + 1)])
    kv.crop(cache, gamma + 1)
    verify = kv.forward_cached(target, tail, cache).logits[0]  # [γ + 1, V]
    return single, verify


def check_same_output(target, prompt_ids, reference_new, candidate_new, gamma: int = 4,
                      spread: float | None = None) -> dict:
    """The notebooks' check that a speculative output is the target's own (greedy decoding).

    ``reference_new`` ``[n]``: the target-only output's new tokens; ``candidate_new`` ``[m]``: the speculative
    run's, same prompt ``prompt_ids`` ``[P]`` or ``[1, P]``; ``gamma``: the run's γ.

    * Identical: returns ``{"identical": True, ...}``.
    * float32 target: any difference is a bug, because fp32 rounding is far below any real margin:
      raises :class:`OutputMismatch` naming the first divergence.
    * bf16/fp16 target: a verify pass scores a token in a (γ + 1)-token forward and the reference in a 1-token
      forward; they round differently, so a near-tie can flip. The difference is accepted when the target's
      margin between its top token and the candidate's token at the first divergence is at most twice the
      rounding reach, and raises otherwise. The reach is the ``spread`` (default: measured now with
      ``logit_spread`` on the reference's context, across every path that scored it), but never less than one
      ``rounding_step`` of the top logit there: the spread is measured at γ + 1 positions and can come out 0 (a
      CPU's bf16 kernels accumulate in fp32), while the logits themselves are rounded to that step everywhere.
      Each of the two logits can move by up to the reach, hence twice it.

    The returned dict: ``identical``, ``dtype``, ``divergence`` (``first_divergence``'s report or ``None``),
    ``spread``, ``step`` and ``tolerance`` (``None`` when not needed) and ``message``, one line to print.
    """
    dtype = next(target.parameters()).dtype
    report = {"identical": True, "dtype": dtype, "divergence": None, "spread": None, "step": None, "tolerance": None,
              "message": "identical to the target alone, token for token"}
    divergence = first_divergence(target, prompt_ids, reference_new, candidate_new)
    if divergence is None:
        return report
    report.update(identical=False, divergence=divergence)
    where = (f"first divergence at new token {divergence['position']} ({divergence['reference_token']} → "
             f"{divergence['candidate_token']}), where the target's top-2 margin is {divergence['top2_margin']:.3g}")
    if dtype == torch.float32:
        raise OutputMismatch(f"not the target's output in float32: {where}. In fp32 greedy speculative decoding "
                             "must be identical token for token: this is a bug (in the rule, the cache or the drafter).")
    if None in (divergence["reference_token"], divergence["candidate_token"]):  # one is a prefix of the other
        raise OutputMismatch(f"not the target's output in {str(dtype).removeprefix('torch.')}: {where}; one run "
                             f"stopped while the other went on ({len(reference_new)} vs {len(candidate_new)} new "
                             "tokens). Rounding can flip a token, EOS included, but cannot end a run without one: "
                             "a bug, or the two ran with different max_new_tokens / eos_token_id.")
    if spread is None:
        context = torch.cat([_as_1d(prompt_ids, "prompt_ids"), _as_1d(reference_new, "reference_new")])
        spread = logit_spread(target, context, min(gamma, len(context) - 2))
    margin = divergence["candidate_margin"]
    step = rounding_step(divergence["top_logit"], dtype)
    reach = max(spread, step)
    report.update(spread=spread, step=step, tolerance=2 * reach)
    name = str(dtype).removeprefix("torch.")
    reach_text = (f"the target's logits from 1-token, {gamma + 1}-token and whole-context forwards differ by up to "
                  f"{spread:.3g} here, and "
                  f"{name} rounds a logit of this size to steps of {step:.3g}")
    if margin > 2 * reach:
        raise OutputMismatch(f"not the target's output in {name}: {where}, and the candidate's token is "
                             f"{margin:.3g} below the top one, more than twice what rounding can move a logit "
                             f"({reach_text}): a bug, not numerics.")
    report["message"] = (f"{where}: a near-tie that {name} rounding can flip ({reach_text}), not a bug; "
                         "identical before it")
    return report
