"""Batched speculative decoding: B prompts at once, exact per row.

Rows accept different numbers of drafts, so after a round the sequences have
different lengths. Cropping a rectangular KV cache per row is impossible, so we
keep every verified position in the cache and *mask out* the rejected ones:
``mask [B, L]`` marks which cached positions a row may attend to, and each row's
position ids count only its valid tokens. A row therefore sees exactly the tokens
it would see alone (left padding for the prompts works the same way), and each
row's accept/resample step is the batch-1 rule, ``accept_and_resample``.

The price: rejected drafts keep occupying cache slots (memory and attention work
grow with γ per round), and the whole batch pays for the slowest row's drafts.
This is why speculative decoding gains less at large batch sizes.
"""

from __future__ import annotations

import time

import torch

from . import kv
from .generate import GenerationStats, _stop_at_eos, _sync


def _positions(mask: torch.Tensor, n_new: int) -> torch.Tensor:
    """Position ids ``[B, n_new]`` for tokens appended after the valid tokens of each row."""
    return mask.sum(-1, keepdim=True) + torch.arange(n_new, device=mask.device)


def _forward(model, cache, mask, ids, new_mask=None):
    """Append ``ids [B, n]`` to ``cache`` (valid where ``new_mask``); returns logits ``[B, n, V]`` and the grown mask."""
    new_mask = torch.ones_like(ids) if new_mask is None else new_mask
    full = torch.cat([mask, new_mask], 1)
    # positions count valid tokens only; a masked slot gets any position (nobody attends to it)
    pos = (mask.sum(-1, keepdim=True) + new_mask.cumsum(-1) - 1).clamp(min=0)
    logits = kv.forward(model, ids, cache, attention_mask=full, position_ids=pos).logits
    return logits, full


class BatchResult:
    """``sequences [B, prompt + longest output]`` (prompts left-padded as given, outputs right-padded
    with ``pad_token_id``), ``new_tokens`` (a list of per-row LongTensors), aggregate ``stats``
    and ``row_stats``."""

    def __init__(self, input_ids, outputs, pad_token_id, stats, row_stats, sources):
        longest = max(len(o) for o in outputs)
        pad = torch.full((len(outputs), longest), pad_token_id, dtype=torch.long, device=input_ids.device)
        for i, o in enumerate(outputs):
            pad[i, : len(o)] = torch.tensor(o, dtype=torch.long)
        self.sequences = torch.cat([input_ids, pad], 1)
        self.new_tokens = [torch.tensor(o, dtype=torch.long) for o in outputs]
        self.stats, self.row_stats, self.token_sources = stats, row_stats, sources
        self.prompt_length = input_ids.shape[1]


@torch.no_grad()
def batched_speculative_generate(target, draft, input_ids, attention_mask, *, max_new_tokens, gamma, to_probs, generator, eos, accept_fn, pad_token_id=0):
    """See ``speculative_generate``; ``input_ids [B, n]`` left-padded, ``attention_mask [B, n]``."""
    B, device = input_ids.shape[0], input_ids.device
    outputs, sources = [[] for _ in range(B)], [[] for _ in range(B)]
    done = [False] * B
    stats, row_stats = GenerationStats(), [GenerationStats() for _ in range(B)]
    start = time.perf_counter()

    # Prefill. Target: everything but the last prompt token (left padding: the last column is real).
    t_cache, d_cache = kv.new_cache(target), kv.new_cache(draft)
    t_mask = attention_mask[:, :0]
    if input_ids.shape[1] > 1:
        _, t_mask = _forward(target, t_cache, t_mask, input_ids[:, :-1], attention_mask[:, :-1])
    d_logits, d_mask = _forward(draft, d_cache, attention_mask[:, :0], input_ids, attention_mask)
    d_logits = d_logits[:, -1]  # [B, V]: the draft's next-token logits per row
    last = input_ids[:, -1]  # [B]: each row's newest token, not yet in the target's cache
    _sync(device)
    stats.prefill_seconds = time.perf_counter() - start

    while not all(done):
        most = max(len(o) for o, d in zip(outputs, done) if not d)
        g = max(0, min(gamma, max_new_tokens - most - 1))

        # 1. Draft γ tokens for every row at once (γ draft forwards of batch B).
        t0 = time.perf_counter()
        drafts, qs = [], []
        for j in range(g):
            q_j = to_probs(d_logits)  # [B, V]
            x_j = torch.multinomial(q_j, 1, generator=generator)  # [B, 1]
            drafts.append(x_j)
            qs.append(q_j)
            if j < g - 1:
                d_logits, d_mask = _forward(draft, d_cache, d_mask, x_j)
                d_logits = d_logits[:, -1]
        drafts = torch.cat(drafts, 1) if g else input_ids[:, :0]  # [B, γ]
        q = torch.stack(qs, 1) if g else None  # [B, γ, V]
        _sync(device)
        t1 = time.perf_counter()

        # 2. One target forward over [last, drafts] for every row.
        logits, _ = _forward(target, t_cache, t_mask, torch.cat([last[:, None], drafts], 1))
        p = to_probs(logits)  # [B, γ+1, V]

        # 3. The batch-1 rule, row by row.
        accepted, nexts = [], []
        for i in range(B):
            n, nxt = accept_fn(p[i], q[i] if g else p[i, :0], drafts[i], generator)
            accepted.append(n)
            nexts.append(nxt)
        n_acc = torch.tensor(accepted, device=device)

        # 4. Masks instead of crops: block column k of [last, x_1..x_γ] stays valid iff k <= n_i.
        cols = torch.arange(g + 1, device=device)
        t_mask = torch.cat([t_mask, (cols[None] <= n_acc[:, None]).long()], 1)
        # The draft cached x_1..x_{γ-1}; keep those accepted, then feed what it has not seen:
        # [x_γ, next] when everything was accepted, else [next] (left-padded with a masked slot).
        if g > 1:
            d_mask[:, -(g - 1):] = (cols[None, : g - 1] < n_acc[:, None]).long()
        nxt_t = torch.tensor(nexts, device=device)
        all_in = n_acc == g
        feed = torch.stack([drafts[:, -1] if g else nxt_t, nxt_t], 1)
        feed_mask = torch.stack([all_in.long() if g else torch.zeros_like(nxt_t), torch.ones_like(nxt_t)], 1)
        d_logits, d_mask = _forward(draft, d_cache, d_mask, feed, feed_mask)
        d_logits = d_logits[:, -1]
        last = nxt_t
        _sync(device)
        t2 = time.perf_counter()

        stats.rounds += 1
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        for i in range(B):
            if done[i]:
                continue
            n = accepted[i]
            new = torch.cat([drafts[i, :n], nxt_t[i : i + 1]])[: max_new_tokens - len(outputs[i])]
            new, hit_eos = _stop_at_eos(new, eos)
            outputs[i] += new.tolist()
            label = "target" if g == 0 else ("bonus" if n == g else "corrected")
            sources[i] += (["accepted"] * n + [label])[: len(new)]
            done[i] = hit_eos or len(outputs[i]) >= max_new_tokens
            for s in (stats, row_stats[i]):
                s.drafted += g
                s.accepted += n
                s.rejected_rounds += n < g
                s.new_tokens += len(new)
            row_stats[i].rounds += 1
            row_stats[i].accepted_per_round.append(n)
            row_stats[i].tokens_per_round.append(len(new))

    stats.seconds = time.perf_counter() - start
    return BatchResult(input_ids, outputs, pad_token_id, stats, row_stats, sources)


@torch.no_grad()
def batched_autoregressive_generate(target, input_ids, attention_mask, *, max_new_tokens, to_probs, generator, eos, pad_token_id=0):
    """The batched baseline: one target forward of batch B per token."""
    B, device = input_ids.shape[0], input_ids.device
    outputs, done = [[] for _ in range(B)], [False] * B
    stats = GenerationStats()
    start = time.perf_counter()
    cache = kv.new_cache(target)
    logits, mask = _forward(target, cache, attention_mask[:, :0], input_ids, attention_mask)
    stats.prefill_seconds = time.perf_counter() - start
    while True:
        tokens = torch.multinomial(to_probs(logits[:, -1]), 1, generator=generator)  # [B, 1]
        for i, t in enumerate(tokens[:, 0].tolist()):
            if not done[i]:
                outputs[i].append(t)
                stats.new_tokens += 1
                done[i] = t in eos or len(outputs[i]) >= max_new_tokens
        if all(done):
            break
        t0 = time.perf_counter()
        logits, mask = _forward(target, cache, mask, tokens)
        _sync(device)
        stats.rounds += 1
        stats.verify_seconds += time.perf_counter() - t0
    stats.seconds = time.perf_counter() - start
    return BatchResult(input_ids, outputs, pad_token_id, stats, [], [["target"] * len(o) for o in outputs])
