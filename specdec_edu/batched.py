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
from .result import GenerationResult, GenerationStats, cut_at_eos, stop_reason, sync
from .sampling import nonfinite_logits_error
from .verify import accept_and_resample


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


def _finish(input_ids, outputs, pad_token_id, stats, row_stats, sources, start) -> GenerationResult:
    stats.seconds = time.perf_counter() - start
    stats.stopped_by = GenerationStats.pooled(row_stats).stopped_by
    return GenerationResult(input_ids, outputs, pad_token_id=pad_token_id, stats=stats, row_stats=row_stats,
                            token_sources=sources)


@torch.no_grad()
def batched_speculative_generate(target, draft, input_ids, attention_mask, *, max_new_tokens, gamma, to_probs, generator, eos,
                                 accept_fn=None, pad_token_id=0, max_pos=None):
    """See ``speculative_generate``; ``input_ids [B, n]`` left-padded, ``attention_mask [B, n]``."""
    accept_fn = accept_fn or accept_and_resample
    B, device = input_ids.shape[0], input_ids.device
    vocab_size = target.get_output_embeddings().weight.shape[0]
    outputs, sources = [[] for _ in range(B)], [[] for _ in range(B)]
    stats, row_stats = GenerationStats(), [GenerationStats() for _ in range(B)]
    lengths = attention_mask.sum(-1).tolist()  # each row's real tokens so far (prompt + output)
    start = time.perf_counter()

    # Prefill. Target: everything but the last prompt token (left padding: the last column is real).
    t_cache, d_cache = kv.new_cache(target), kv.new_cache(draft)
    t_mask = attention_mask[:, :0]
    if input_ids.shape[1] > 1:
        _, t_mask = _forward(target, t_cache, t_mask, input_ids[:, :-1], attention_mask[:, :-1])
    d_logits, d_mask = _forward(draft, d_cache, attention_mask[:, :0], input_ids, attention_mask)
    d_logits = d_logits[:, -1]  # [B, V]: the draft's next-token logits per row
    last = input_ids[:, -1]  # [B]: each row's newest token, not yet in the target's cache
    sync(device)
    stats.prefill_seconds = time.perf_counter() - start

    while not all(s.stopped_by for s in row_stats):
        active = [i for i in range(B) if not row_stats[i].stopped_by]
        # One γ for the batch: no active row may pass max_new_tokens or the position limit.
        room = min(max_new_tokens - len(outputs[i]) for i in active)
        if max_pos is not None:
            room = min(room, min(max_pos - lengths[i] for i in active))
        g = max(0, min(gamma, room - 1))
        # Finished rows ride along (the batch is rectangular) but everything they are fed is masked
        # out, so their positions stop growing and never pass the position limit.
        alive = torch.tensor([not s.stopped_by for s in row_stats], device=device).long()  # [B]

        # 1. Draft γ tokens for every row at once (γ draft forwards of batch B).
        t0 = time.perf_counter()
        drafts, qs = [], []
        for j in range(g):
            q_j = to_probs(d_logits)  # [B, V']
            x_j = torch.multinomial(q_j, 1, generator=generator)  # [B, 1]
            drafts.append(x_j)
            qs.append(torch.nn.functional.pad(q_j, (0, vocab_size - q_j.shape[-1])))  # q = 0 on ids the draft lacks
            if j < g - 1:
                d_logits, d_mask = _forward(draft, d_cache, d_mask, x_j, alive[:, None])
                d_logits = d_logits[:, -1]
        drafts = torch.cat(drafts, 1) if g else input_ids[:, :0]  # [B, γ]
        q = torch.stack(qs, 1) if g else None  # [B, γ, V]
        sync(device)
        t1 = time.perf_counter()

        # 2. One target forward over [last, drafts] for every row.
        logits, _ = _forward(target, t_cache, t_mask, torch.cat([last[:, None], drafts], 1), alive[:, None].expand(B, g + 1))
        if not torch.isfinite(logits).all():
            raise nonfinite_logits_error("target")
        p = to_probs(logits)  # [B, γ+1, V]

        # 3. The batch-1 rule, row by row.
        accepted, nexts = [], []
        for i in range(B):
            n, nxt = accept_fn(p[i], q[i] if g else p[i, :0], drafts[i], generator)
            accepted.append(int(n))
            nexts.append(int(nxt))
        n_acc = torch.tensor(accepted, device=device)
        # 4. Masks instead of crops: block column k of [last, x_1..x_γ] stays valid iff k <= n_i.
        cols = torch.arange(g + 1, device=device)
        t_mask = torch.cat([t_mask, (cols[None] <= n_acc[:, None]).long() * alive[:, None]], 1)
        # The draft cached x_1..x_{γ-1}; keep those accepted, then feed what it has not seen:
        # [x_γ, next] when everything was accepted, else [next] (left-padded with a masked slot).
        if g > 1:
            d_mask[:, -(g - 1):] = (cols[None, : g - 1] < n_acc[:, None]).long() * alive[:, None]
        nxt_t = torch.tensor(nexts, device=device)
        all_in = n_acc == g
        feed = torch.stack([drafts[:, -1] if g else nxt_t, nxt_t], 1)
        feed_mask = torch.stack([all_in.long() if g else torch.zeros_like(nxt_t), torch.ones_like(nxt_t)], 1) * alive[:, None]
        d_logits, d_mask = _forward(draft, d_cache, d_mask, feed, feed_mask)
        d_logits = d_logits[:, -1]
        last = nxt_t
        sync(device)
        t2 = time.perf_counter()

        stats.rounds += 1
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        drafts_host = drafts.tolist()
        for i in active:
            n = accepted[i]
            new, hit_eos = cut_at_eos(drafts_host[i][:n] + [nexts[i]], eos)
            outputs[i] += new
            lengths[i] += len(new)
            emitted_accepted = min(n, len(new))  # drafts cut off after an EOS were never emitted
            ended = "target" if g == 0 else "bonus" if n == g else "corrected"
            sources[i] += ["accepted"] * emitted_accepted + [ended] * (len(new) - emitted_accepted)
            for s in (stats, row_stats[i]):
                s.drafted += g
                s.accepted += emitted_accepted
                s.rejected_rounds += ended == "corrected" and len(new) > n
                s.new_tokens += len(new)
            row_stats[i].rounds += 1
            row_stats[i].accepted_per_round.append(emitted_accepted)
            row_stats[i].tokens_per_round.append(len(new))
            row_stats[i].stopped_by = stop_reason(len(outputs[i]), lengths[i], hit_eos, max_new_tokens, max_pos)

    return _finish(input_ids, outputs, pad_token_id, stats, row_stats, sources, start)


@torch.no_grad()
def batched_autoregressive_generate(target, input_ids, attention_mask, *, max_new_tokens, to_probs, generator, eos,
                                    pad_token_id=0, max_pos=None):
    """The batched baseline: one target forward of batch B per token."""
    B, device = input_ids.shape[0], input_ids.device
    outputs, row_stats = [[] for _ in range(B)], [GenerationStats() for _ in range(B)]
    lengths = attention_mask.sum(-1).tolist()
    stats = GenerationStats()
    start = time.perf_counter()
    cache = kv.new_cache(target)
    logits, mask = _forward(target, cache, attention_mask[:, :0], input_ids, attention_mask)
    stats.prefill_seconds = time.perf_counter() - start
    while True:
        if not torch.isfinite(logits[:, -1]).all():
            raise nonfinite_logits_error("target")
        tokens = torch.multinomial(to_probs(logits[:, -1]), 1, generator=generator)  # [B, 1]
        for i, t in enumerate(tokens[:, 0].tolist()):
            if not row_stats[i].stopped_by:
                outputs[i].append(t)
                lengths[i] += 1
                stats.new_tokens += 1
                row_stats[i].new_tokens += 1
                row_stats[i].stopped_by = stop_reason(len(outputs[i]), lengths[i], t in eos, max_new_tokens, max_pos)
        if all(s.stopped_by for s in row_stats):
            break
        t0 = time.perf_counter()
        alive = torch.tensor([not s.stopped_by for s in row_stats], device=device).long()[:, None]
        logits, mask = _forward(target, cache, mask, tokens, alive)  # finished rows: masked, positions frozen
        sync(device)
        stats.rounds += 1
        stats.verify_seconds += time.perf_counter() - t0
    return _finish(input_ids, outputs, pad_token_id, stats, row_stats, [["target"] * len(o) for o in outputs], start)
