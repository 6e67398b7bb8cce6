"""Speculative decoding without the bookkeeping: a reference the real loop is tested against.

``speculative_generate`` runs each round through ``round.speculative_round`` with KV caches, rollbacks, one
device→host read, drafter checks and statistics. Here is the algorithm alone, written from the papers and
sharing no code with ``specdec_edu``: no caches (every forward reads the whole sequence, so there is nothing
to roll back), Python lists, one token at a time. ``tests/test_reference_round.py`` checks that the real loop
emits the same tokens as these rounds (greedy: token for token; sampled: draw for draw from the same seed),
and ``tests/test_hf_differential.py`` checks the rule, decision for decision.

* ``greedy_round``: notebook 06's build-it-yourself round, minus the target's cache.
* ``sampled_round`` and ``leviathan_accept``: Algorithm 1 of Leviathan et al. (2023), "Fast Inference from
  Transformers via Speculative Decoding", at temperature 1. Its random numbers are drawn in the order the
  package draws them (the drafts, then γ uniforms, then the added token), so that one seed gives both the
  same draws.
"""

from __future__ import annotations

import torch


def next_token_logits(model, tokens: list[int]) -> torch.Tensor:
    """The model's logits ``[V]`` for the token after ``tokens``, from a forward over all of them (no cache)."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@torch.no_grad()
def greedy_round(target, draft, context: list[int], gamma: int) -> list[int]:
    """One greedy round: the accepted drafts, then the target's correction or bonus token."""
    drafts = []
    for _ in range(gamma):  # 1. draft: the draft's argmax, one token at a time
        drafts.append(int(next_token_logits(draft, context + drafts).argmax()))
    # 2. verify: ONE target forward over context + drafts; its last γ + 1 rows judge the drafts and add a token
    choice = target(input_ids=torch.tensor([context + drafts])).logits[0, -gamma - 1 :].argmax(-1)  # [γ+1]
    n = 0  # 3. accept the longest prefix of drafts that the target would have chosen itself
    while n < gamma and int(choice[n]) == drafts[n]:
        n += 1
    return drafts[:n] + [int(choice[n])]


def leviathan_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator):
    """Algorithm 1's decision: p ``[γ+1, V]``, q ``[γ, V]``, drafts ``[γ]`` → (n accepted, the added token).

    Draw r_1 … r_γ ~ U(0, 1); n is the number of drafts before the first i with r_i > p_i(x_i) / q_i(x_i)
    (γ if there is none); the added token is drawn from norm(max(0, p_{n+1} − q_{n+1})) after a rejection,
    from p_{γ+1} if all γ were accepted.
    """
    gamma = len(drafts)
    r = torch.rand(gamma, generator=generator, dtype=p.dtype)
    n = gamma
    for i in range(gamma):
        x = int(drafts[i])
        if r[i] > p[i, x] / q[i, x]:
            n = i
            break
    if n < gamma:
        residual = (p[n] - q[n]).clamp(min=0)
        p_next = residual / residual.sum()
    else:
        p_next = p[gamma]
    return n, int(torch.multinomial(p_next[None], 1, generator=generator)[0, 0])


@torch.no_grad()
def sampled_round(target, draft, context: list[int], gamma: int, generator: torch.Generator) -> list[int]:
    """One round of Algorithm 1 at temperature 1: the accepted drafts, then the added token."""
    drafts, q = [], []
    for _ in range(gamma):  # x_i ~ q_i = the draft's distribution after the context and x_1 … x_{i-1}
        q.append(next_token_logits(draft, context + drafts).softmax(-1))
        drafts.append(int(torch.multinomial(q[-1], 1, generator=generator)[0]))
    # p_1 … p_{γ+1}: the target's distributions after context + x_1 … x_{i-1}, from ONE forward
    p = target(input_ids=torch.tensor([context + drafts])).logits[0, -gamma - 1 :].softmax(-1)
    q = torch.stack(q) if q else p[:0]
    n, token = leviathan_accept(p, q, torch.tensor(drafts, dtype=torch.long), generator)
    return drafts[:n] + [token]


def reference_generate(round_fn, prompt: list[int], max_new_tokens: int, gamma: int, **kwargs) -> list[int]:
    """Rounds until ``max_new_tokens`` new tokens; near the end a round drafts fewer, so as never to pass it
    (a round adds up to γ + 1 tokens), as ``speculative_generate`` does. Returns the new tokens."""
    new: list[int] = []
    while len(new) < max_new_tokens:
        new += round_fn(context=prompt + new, gamma=min(gamma, max_new_tokens - len(new) - 1), **kwargs)
    return new
