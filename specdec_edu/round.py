"""One round of speculative decoding: the piece that the single-prompt loop (``generate.py``)
and the batched loop (``batched.py``) share.

A round, for one prompt or for B prompts at once (``...`` below is ``[]`` or ``[B]``)::

    draft    x_1 … x_γ ~ q_1 … q_γ                      γ cheap guesses, with the q they were drawn from
    verify   p_1 … p_{γ+1} from target([newest, x_1 … x_γ])   ONE target forward (`newest`: the newest
                                                          token, which the target's cache lacks)
    accept   keep x_i while u_i < min(1, p_i(x_i) / q_i(x_i))   the rule, ``verify_drafts``
             then, after a rejection at x_i, one token from normalize(max(0, p_i − q_i)),
             or from p_{γ+1} if all were kept
    rollback the caches keep [newest, kept drafts]; the new token becomes `newest`

What differs between one prompt and a batch (how to draft, how to roll a cache back) lives
in a *loop* object with four methods, ``draft``, ``verify``, ``read_and_check`` and ``roll_back``
(``generate.OnePrompt``, ``batched.Batch``); what a round emits is counted by
``result.RoundRecorder``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from .result import PhaseClock, RoundRecorder, warn_caller
from .sampling import GenerationConfig
from .verify import greedy_verify, verify_drafts

# (p [γ+1, V], q [γ, V], drafts [γ], generator) -> (n_accepted, next_token), e.g. verify.accept_and_resample
AcceptRule = Callable[..., tuple]


class Loop(Protocol):
    def draft(self, gamma_round: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts ``[..., γ]`` and their q ``[..., γ, V]`` (the target's V), on the device."""
        ...

    def verify(self, drafts: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., γ+1, V]``: one target forward over ``[newest, drafts]``."""
        ...

    def read_and_check(self, decision: torch.Tensor, drafts: torch.Tensor, logits: torch.Tensor) -> tuple:
        """The round's one device→host read: (drafts, n, next_token) as Python lists/ints; raises on bad values
        (the target's logits not finite, a drafter's q not a distribution), read in the same copy."""
        ...

    def roll_back(self, decision: torch.Tensor) -> None:
        """Roll the caches back to the accepted drafts; ``decision[..., 1]`` becomes the next ``newest``."""
        ...


def speculative_round(loop: Loop, gamma_round: int, config: GenerationConfig, accept_rule: AcceptRule | None,
                      generator: torch.Generator | None, clock: PhaseClock):
    """Draft ``gamma_round`` tokens, verify them in one target forward, keep the accepted ones.

    Returns (drafts, n_accepted, next_token) on the host (per row for a batch) and the round's
    seconds per phase (``draft``, ``verify_forward``, ``accept_resample``, ``cache_crop``).
    """
    clock.lap()  # not this round's: the previous round's bookkeeping (recording, stop checks)
    drafts, q = loop.draft(gamma_round)  # x_1..x_γ ~ q: [..., γ], [..., γ, V]
    draft_time = clock.lap()
    logits = loop.verify(drafts)  # [..., γ+1, V]: ONE target forward over [newest, x_1..x_γ]
    forward_time = clock.lap()
    if accept_rule is None and not config.do_sample:  # temperature 0: p is one-hot, the rule compares argmaxes
        decision = greedy_verify(logits, drafts)
    else:
        p = config.to_probs(logits)  # the target's p_1..p_{γ+1}, warped like q
        decision = accept(accept_rule or verify_drafts, p, q, drafts, generator)  # [..., 2] = (n, next_token)
    drafts, n, next_token = loop.read_and_check(decision, drafts, logits)  # the round's ONE device→host read
    check_accepted(n, next_token, drafts, loop.vocab_size)  # before the caches are rolled back by n
    decide_time = clock.lap()
    loop.roll_back(decision)  # the caches keep [newest, x_1..x_n]; next_token is the new `newest`
    phases = dict(draft=draft_time, verify_forward=forward_time, accept_resample=decide_time, cache_crop=clock.lap())
    return drafts, n, next_token, phases


def check_accepted(n, next_token, drafts, vocab_size: int) -> None:
    """0 ≤ n ≤ γ' and 0 ≤ next_token < V for every row (host ints: ``n``, ``next_token`` and ``drafts`` of one
    prompt, or lists of them for a batch). The package's rules always hold it; a hand-written ``accept_fn`` that
    does not would corrupt the cache rollback, or feed the target an id it has no embedding for (on a GPU, a
    device-side assert that ends the process)."""
    rows = [(n, next_token, drafts)] if isinstance(n, int) else zip(n, next_token, drafts)
    for n_row, next_row, drafts_row in rows:
        if not 0 <= n_row <= len(drafts_row):
            raise ValueError(f"the accept rule returned n = {n_row} accepted drafts for a round of {len(drafts_row)}: an "
                             "accept_fn must return (n, next_token) with 0 <= n <= the number of drafts it was given.")
        if not 0 <= next_row < vocab_size:
            raise ValueError(f"the accept rule returned next_token = {next_row}, outside the target's {vocab_size} token "
                             "ids: an accept_fn must return (n, next_token) with next_token drawn from p or the "
                             "residual, an id in 0 .. V − 1.")


def round_gamma(gamma: int, rows: list[RoundRecorder], draft_limit: int | None = None) -> int:
    """The round's γ: ``gamma_within`` every row still generating (``rows``) allows, and the draft model's
    position limit ``draft_limit`` (where the loop knows its draft model)."""
    return min(gamma_within(gamma, row.length, new_tokens_left=row.max_new_tokens - len(row.tokens),
                            target_limit=row.max_pos, draft_limit=draft_limit) for row in rows)


def gamma_within(gamma: int, length: int, *, new_tokens_left: int | None = None, target_limit: int | None = None,
                 draft_limit: int | None = None) -> int:
    """γ cut to the limits of a sequence of ``length`` tokens: the one place where γ is cut (0: no drafts,
    a target-only step).

    - ``new_tokens_left`` (max_new_tokens minus what was emitted): a round emits up to γ + 1 tokens.
    - ``target_limit``, the target's positions: the γ + 1 new tokens must fit after ``length``.
    - ``draft_limit``, the draft model's positions: drafting reads the context, then the first γ − 1
      drafts (the last one is never fed): ``length + γ − 1`` positions. Past its limit a model with
      learned positions (GPT-2) fails with an IndexError, one with rotary positions runs where it was
      never trained. A context it cannot read at all gets γ = 0: from there the target decodes alone
      (``past_draft_limit`` says so; a prompt it cannot read is refused up front, ``refuse_unreadable_prompt``).
    """
    caps = [gamma]
    if new_tokens_left is not None:
        caps.append(new_tokens_left - 1)
    if target_limit is not None:
        caps.append(target_limit - length - 1)
    if draft_limit is not None:
        caps.append(draft_limit - length + 1)
    return max(0, min(caps))


def refuse_unreadable_prompt(length: int, draft_limit: int | None) -> None:
    """Before a generation: a prompt of ``length`` tokens that the draft model cannot read raises, naming the fix
    (the draft would never draft: speculative decoding would be target-only decoding, slower)."""
    if draft_limit is not None and length > draft_limit:
        raise ValueError(
            f"the draft model reads at most {draft_limit} positions (config.max_position_embeddings / n_positions), "
            f"but the prompt has {length} tokens: shorten the prompt, or use a draft model with a longer context."
        )


def past_draft_limit(length: int, draft_limit: int) -> None:
    """During a generation, once per generation: the context (``length`` tokens) has outgrown the draft model, so
    the rounds from here are target-only steps. The tokens stay the target's; only the drafting stops (it used to
    raise, losing what was generated)."""
    warn_caller(f"the draft model reads at most {draft_limit} positions (config.max_position_embeddings / "
                f"n_positions) and the context now has {length} tokens: from here the target decodes alone, one "
                "token per round. A draft model with a longer context would keep drafting.")


def accept(rule: AcceptRule, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
           generator: torch.Generator | None) -> torch.Tensor:
    """Apply the batch-1 accept rule to one prompt (p ``[γ+1, V]``) or to each row of a batch
    (p ``[B, γ+1, V]``, rows in order, so a batch draws the random numbers B single rounds would).
    Returns ``[..., 2]`` = (n_accepted, next_token), on the device."""
    if drafts.dim() == 2:
        return torch.stack([accept(rule, p[i], q[i], drafts[i], generator) for i in range(len(drafts))])
    # verify_drafts returns a device tensor; a rule under test (course.controls) may return Python ints
    values = [torch.as_tensor(v, device=p.device).long() for v in rule(p, q, drafts, generator)]
    if len(values) != 2 or any(v.numel() != 1 for v in values):  # shapes only: no read from the device
        raise ValueError(f"accept_fn must return (n, next_token), two integers (ints or one-element tensors); "
                         f"{getattr(rule, '__name__', rule)!r} returned {len(values)} value(s) of shapes "
                         f"{[tuple(v.shape) for v in values]}. See verify.verify_drafts for the signature.")
    return torch.stack([v.reshape(()) for v in values])
