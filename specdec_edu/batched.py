"""Batched speculative decoding: B prompts at once, exact per row.

The round is the single-prompt one (``round.speculative_round``); what changes is how
the caches are rolled back. Rows accept different numbers of drafts, so after a round
the sequences have different lengths. Cropping a rectangular KV cache per row is
impossible, so we keep every verified position in the cache and *mask out* the
rejected ones: ``mask [B, L]`` marks which cached positions a row may attend to, and
each row's position ids count only its valid tokens. A row therefore sees exactly the
tokens it would see alone (left padding for the prompts works the same way), and each
row's accept/resample step is the batch-1 rule.

What masking costs: rejected drafts keep occupying cache slots (memory and attention
work grow with γ per round), and every row rides along for γ draft steps even where it
rejected an early draft. These costs are secondary. Speculative decoding gains less at
large batch sizes mainly because the verify pass stops being nearly free: where a step
is memory-bound (a large model on a GPU, at batch 1), a forward of γ + 1 tokens costs
about one step (the weights are read once either way), but at batch B it processes
B·(γ + 1) tokens, and once that is compute-bound it costs about γ + 1 steps
(``theory.expected_speedup``'s ``verify_cost``; notebook 09 measures it on your device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kv
from .drafters import ModelDrafter, check_draft_can_read, draft_loop, no_drafts, reduced_head
from .models.shapes import head_rows, max_positions, sliding_window
from .result import GenerationResult, GenerationStats, PhaseClock, RoundRecorder, warn_caller
from .round import past_draft_limit, refuse_unreadable_prompt, round_gamma, speculative_round
from .sampling import GenerationConfig, logits_broken, nonfinite_logits_error, sample


def _masked_forward(model, cache, mask, ids, new_mask, **kwargs):
    """Append ``ids [B, n]`` to ``cache`` (valid where ``new_mask [B, n]``): a forward whose attention mask and
    position ids skip every masked slot. Returns the model's output and the grown mask ``[B, L + n]``."""
    full = torch.cat([mask, new_mask], 1)
    # positions count valid tokens only; a masked slot gets any position (nobody attends to it)
    positions = (mask.sum(-1, keepdim=True) + new_mask.cumsum(-1) - 1).clamp(min=0)
    return kv.forward_cached(model, ids, cache, attention_mask=full, position_ids=positions, **kwargs), full


def draft_logits(drafter: ModelDrafter, cache, mask, ids, new_mask):
    """Feed ``ids [B, n]`` to ``drafter``'s model on ``cache``: its logits ``[B, V']`` for the token after them, and
    the grown mask. A ``ModelDrafter`` with ``head_size`` gets logits for its first ``head_size`` token ids only.
    The step batched drafting takes, and what ``course.measure`` times for a draft at batch B."""
    model, head_size = drafter.model, drafter.head_size
    if head_size is None:
        out, mask = _masked_forward(model, cache, mask, ids, new_mask, logits_to_keep=1)
        return out.logits[:, -1], mask
    out, mask = _masked_forward(model.get_decoder(), cache, mask, ids, new_mask)
    return reduced_head(model, out.last_hidden_state[:, -1], head_size), mask


class Batch:
    """The batched side of a round (see ``round.Loop``): a draft model and the target, each with
    a KV cache and a mask ``[B, L]`` of the cached positions each row may attend to.

    Invariants between rounds: the target's cache holds each row's tokens except its newest,
    ``newest [B]``; the draft's cache lacks what the last round emitted, ``unread`` (fed at the
    start of the next round's drafting, so that all draft work is counted as drafting).
    """

    def __init__(self, target, drafter: ModelDrafter, ids: torch.Tensor, mask: torch.Tensor, config: GenerationConfig,
                 generator):
        if drafter.static is not None:
            warn_caller("batched mode runs the draft model eagerly with a dynamic cache: static_cache and compile are "
                        "single-prompt options of ModelDrafter, ignored here.")
        self.target, self.drafter, self.config, self.generator = target, drafter, config, generator
        self.vocab_size = head_rows(target)
        self.target_cache = kv.new_cache(target)
        self.draft_cache = kv.new_cache(drafter.model)
        self.target_mask, self.draft_mask = mask[:, :0], mask[:, :0]
        # the draft has read nothing yet: the whole prompts. Padding is fed as id 0, which every vocabulary has (the
        # pad id was checked against the target's embedding only; a smaller draft may lack it)
        self.unread = ids.masked_fill(mask == 0, 0), mask
        self.newest = ids[:, -1]  # left padding: the last column is real for every row
        self.prompts, self.prompt_mask = ids, mask
        self.generating = torch.ones_like(self.newest)  # [B] 1 for rows still generating, 0 for finished ones
        self.outgrown = False  # has a row outgrown the draft model's positions? Then it reads and drafts no more

    def prefill(self) -> None:
        """The target reads every prompt but its last token (which the first verify pass feeds)."""
        if self.prompts.shape[1] > 1:
            _, self.target_mask = _masked_forward(self.target, self.target_cache, self.target_mask, self.prompts[:, :-1],
                                           self.prompt_mask[:, :-1], logits_to_keep=1)

    def draft_logits(self, ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        """Feed ``ids [B, n]`` to the draft model; its logits ``[B, V']`` for the token after them."""
        logits, self.draft_mask = draft_logits(self.drafter, self.draft_cache, self.draft_mask, ids, new_mask)
        return logits

    def draft_step(self, x: torch.Tensor) -> torch.Tensor:
        """Feed each row its draft ``x [B]`` (finished rows: masked); logits ``[B, V']`` for the next draft."""
        return self.draft_logits(x[:, None], self.generating[:, None])

    def draft(self, gamma_round: int):
        """Drafts ``[B, γ]`` and q ``[B, γ, V]``: the draft reads what it has not, then drafts γ tokens per row."""
        # Outgrown: it could not read what it has not, so target-only rounds to the end (no drafts, even where γ is
        # above 0 again once the outgrown row has stopped)
        if self.outgrown:
            self.q_not_finite = torch.zeros((), dtype=torch.bool, device=self.newest.device)
            return no_drafts(self.vocab_size, self.newest.device, self.newest.shape)
        # Masked with the rows still generating now, the one place that masks it: a row that has stopped is fed id 0,
        # masked (its last tokens may lie past the draft's positions, or be ids the draft cannot read)
        ids, new_mask = self.unread
        live = self.generating[:, None]
        logits = self.draft_logits(ids * live, new_mask * live)
        drafts, q = draft_loop(logits, gamma_round, self.config.to_probs, self.generator, self.draft_step)
        # NaN in q means NaN/inf draft logits (greedy to_probs puts a NaN there too): read with the round's decision
        self.q_not_finite = ~torch.isfinite(q).all()
        return drafts, F.pad(q, (0, self.vocab_size - q.shape[-1]))  # q = 0 on ids the draft's head lacks

    def verify(self, drafts: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, γ+1, V]``: one target forward over ``[newest, drafts]`` for every row.
        Finished rows ride along (the batch is rectangular), masked out: their positions stop growing."""
        self.drafts = drafts  # [B, γ], for roll_back
        new_mask = self.generating[:, None].expand(-1, drafts.shape[1] + 1)
        out, _ = _masked_forward(self.target, self.target_cache, self.target_mask, torch.cat([self.newest[:, None], drafts], 1),
                          new_mask)
        return out.logits

    def read_and_check(self, decision: torch.Tensor, drafts: torch.Tensor, logits: torch.Tensor):
        """One copy to the host: every row's decision and drafts, and the NaN flags (target, draft); raises on a flag."""
        nonfinite = torch.stack([logits_broken(logits), self.q_not_finite]).long()
        host = torch.cat([decision.flatten(), drafts.flatten(), nonfinite]).tolist()
        if host[-2]:
            raise nonfinite_logits_error("target")
        if host[-1]:
            raise nonfinite_logits_error("draft model")
        B, gamma_round = drafts.shape
        n, next_token = host[0 : 2 * B : 2], host[1 : 2 * B : 2]
        drafts_host = [host[2 * B + i * gamma_round : 2 * B + (i + 1) * gamma_round] for i in range(B)]
        return drafts_host, n, next_token

    def roll_back(self, decision: torch.Tensor) -> None:
        """Masks instead of crops: of ``[newest, x_1..x_γ]`` each row keeps ``newest`` and its n accepted drafts."""
        n, next_token = decision[:, 0], decision[:, 1]  # [B] each, on the device
        gamma_round = self.drafts.shape[1]
        block = torch.arange(gamma_round + 1, device=n.device)
        generating = self.generating[:, None]
        self.target_mask = torch.cat([self.target_mask, (block[None] <= n[:, None]).long() * generating], 1)
        # The draft cached x_1..x_{γ-1} while drafting: keep the accepted ones.
        if gamma_round > 1:
            self.draft_mask[:, -(gamma_round - 1):] = (block[None, : gamma_round - 1] < n[:, None]).long() * generating
        # Not read by the draft yet: x_γ (if accepted; never fed while drafting) and next_token. Rows that
        # rejected x_γ get a masked slot in its place (the batch is rectangular).
        x_gamma = self.drafts[:, -1] if gamma_round else next_token
        x_gamma_kept = (n == gamma_round) & (gamma_round > 0)
        # Rows that have stopped are masked (fed id 0) where this is read: in ``draft``, with the flags of that round.
        self.unread = torch.stack([x_gamma, next_token], 1), torch.stack([x_gamma_kept.long(), torch.ones_like(n)], 1)
        self.newest = next_token


def _result(prompts, rows: list[RoundRecorder], batch: GenerationStats, pad_token_id: int) -> GenerationResult:
    return GenerationResult(prompts, [row.tokens for row in rows], pad_token_id=pad_token_id,
                            stats=GenerationStats.of_batch([row.stats for row in rows], batch),
                            row_stats=[row.stats for row in rows], token_sources=[row.sources for row in rows])


def _recorders(target, attention_mask, config: GenerationConfig, clock: PhaseClock) -> list[RoundRecorder]:
    """One recorder per row, knowing its prompt length (its real tokens)."""
    return [RoundRecorder(n, max_new_tokens=config.max_new_tokens, eos=config.eos, max_pos=max_positions(target), clock=clock)
            for n in attention_mask.sum(-1).tolist()]


def check_window(target, prompt_width: int, max_new_tokens: int, gamma: int) -> None:
    """Refuse a sliding-window target whose window a batch's cache could outgrow.

    transformers counts the window in cache *slots*, and this loop keeps rejected drafts in the cache as masked
    slots: a row whose window holds masked slots sees fewer than W real tokens, and its output is no longer the
    target's. Each round adds at most γ + 1 slots and emits at least one token, so a cache of prompt width +
    max_new_tokens · (γ + 1) slots bounds the run; a window at least that long holds every slot, and stays exact.
    (The draft's window matters only for α: q is what it sampled from, whatever it saw.)"""
    window, slots = sliding_window(target), prompt_width + max_new_tokens * (gamma + 1)
    if window is not None and window < slots:
        raise ValueError(
            f"the target attends within a sliding window of {window} positions, and batched speculative decoding keeps "
            f"rejected drafts in its cache as masked slots, which the window counts: up to {slots} slots here (prompt "
            f"width {prompt_width} + max_new_tokens {max_new_tokens} × (γ + 1 = {gamma + 1})), so a row would see fewer "
            f"than {window} real tokens and its output would not be the target's. Decode the prompts one at a time "
            "(speculative_generate with one prompt), batch them without a draft (autoregressive_generate), or lower "
            f"max_new_tokens or γ until the slots fit in the window.")


@torch.no_grad()
def batched_speculative_generate(target, drafter: ModelDrafter, input_ids, attention_mask, config: GenerationConfig, *,
                                 gamma: int, generator=None, accept_fn=None, profile=False) -> GenerationResult:
    """See ``speculative_generate``; ``input_ids [B, n]`` left-padded, ``attention_mask [B, n]``."""
    if not isinstance(drafter, ModelDrafter):
        raise ValueError("batched speculative decoding needs a draft model; run a drafter object "
                         "(e.g. prompt lookup, EAGLE, Medusa) one prompt at a time.")
    check_window(target, input_ids.shape[1], config.max_new_tokens, gamma)
    clock = PhaseClock(input_ids.device, profile)
    rows, batch = _recorders(target, attention_mask, config, clock), GenerationStats()  # batch: its rounds and times
    draft_limit = max_positions(drafter.model)
    refuse_unreadable_prompt(max(row.length for row in rows), draft_limit)
    check_draft_can_read(drafter.model, input_ids[attention_mask.bool()].cpu())  # one read, before the first round
    loop = Batch(target, drafter, input_ids, attention_mask, config, generator)
    loop.prefill()
    batch.prefill_seconds = clock.lap()
    for row in rows:
        row.stats.prefill_seconds = batch.prefill_seconds
    while generating := [row for row in rows if not row.stats.stopped_by]:
        loop.generating = torch.tensor([not row.stats.stopped_by for row in rows], device=input_ids.device).long()
        # One γ for the batch: no row still generating may pass its limits, nor the draft its positions.
        gamma_round = round_gamma(gamma, generating, draft_limit)
        longest = max(row.length for row in generating)
        if draft_limit is not None and not loop.outgrown and longest > draft_limit:
            past_draft_limit(longest, draft_limit)  # no drafting from here: said once
            loop.outgrown = True
        drafts, n, next_token, phases = speculative_round(loop, gamma_round, config, accept_fn, generator, clock)
        batch.rounds += 1
        batch.record_times(phases, profile)
        for row, row_drafts, row_n, row_next in zip(rows, drafts, n, next_token):
            if not row.stats.stopped_by:
                row.add(row_drafts, row_n, row_next, phases)
        # The draft reads the next token of each row still generating in the next round: one it has no embedding row
        # for (a target with a padded head) is refused here, on the host, as one prompt's loop does (on a GPU the
        # lookup would stop the process). A row that has just stopped is not read, so its last token may be any id.
        check_draft_can_read(drafter.model, torch.tensor([t for row, t in zip(rows, next_token) if not row.stats.stopped_by]))
    batch.seconds = clock.elapsed()
    return _result(input_ids, rows, batch, config.pad_token_id)


@torch.no_grad()
def batched_autoregressive_generate(target, input_ids, attention_mask, config: GenerationConfig, *,
                                    generator=None) -> GenerationResult:
    """The batched baseline: one target forward of batch B per token."""
    clock = PhaseClock(input_ids.device, False)
    rows, batch = _recorders(target, attention_mask, config, clock), GenerationStats()
    cache = kv.new_cache(target)
    out, mask = _masked_forward(target, cache, attention_mask[:, :0], input_ids, attention_mask, logits_to_keep=1)
    logits = out.logits[:, -1]  # [B, V]
    while True:
        tokens = (sample(config.to_probs(logits), generator) if config.do_sample else logits.argmax(-1))[:, None]  # [B, 1]
        broken = logits_broken(logits).long().view(1)
        *host_tokens, any_broken = torch.cat([tokens[:, 0], broken]).tolist()  # one read per token
        if not batch.rounds:  # the prefill's clock stops once its token is read (a GPU may still be running it before)
            batch.prefill_seconds = clock.lap()
        if any_broken:
            raise nonfinite_logits_error("target")
        for row, token in zip(rows, host_tokens):
            if not row.stats.stopped_by:  # the first token comes from the prefill: not a round (as for one prompt)
                row.add([], 0, token, dict(draft=0.0, verify_forward=0.0, accept_resample=0.0, cache_crop=0.0),
                        from_prefill=not batch.rounds)
        if all(row.stats.stopped_by for row in rows):
            break
        generating = torch.tensor([not row.stats.stopped_by for row in rows], device=input_ids.device).long()[:, None]
        out, mask = _masked_forward(target, cache, mask, tokens, generating)  # finished rows: masked, positions frozen
        logits = out.logits[:, -1]
        batch.rounds += 1
        batch.verify_seconds += clock.lap()
    batch.seconds = clock.elapsed()
    return _result(input_ids, rows, batch, config.pad_token_id)
