"""Speculative decoding end to end, and the target-only baseline it is compared with.

One round of ``speculative_generate``::

    context ──draft──> x_1 … x_γ  (γ cheap draft forwards, q_1 … q_γ)
    target([last, x_1 … x_γ])      (ONE target forward → p_1 … p_{γ+1})
    accept_and_resample(p, q, x)   → keep x_1 … x_n, add one target token

Bookkeeping that keeps it to one target forward per round: the target's KV cache
holds every token except the last one emitted, so the verify pass feeds
``[last] + drafts`` and reads γ + 1 next-token distributions. After the decision
the cache is cropped back to "everything except the new last token".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import torch

from . import kv
from .drafters import Drafter, ModelDrafter
from .sampling import check_generator, check_sampling_args, logits_to_probs, sample
from .verify import accept_and_resample


@dataclass
class GenerationStats:
    """What happened during one generation. Times are wall-clock seconds."""

    new_tokens: int = 0
    rounds: int = 0  # target forward passes after the prefill (one per round / per token)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    rejected_rounds: int = 0  # rounds that ended with a rejection
    seconds: float = 0.0  # everything, prefill included
    prefill_seconds: float = 0.0  # the target's pass over the prompt
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target forwards after the prefill (+ accept/resample)
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    tokens_per_round: list[int] = field(default_factory=list)
    draft_seconds_per_round: list[float] = field(default_factory=list)
    verify_seconds_per_round: list[float] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        """Per-token acceptance rate α: of the drafts the target *judged*, the fraction accepted.

        Drafts after the first rejection in a round are never judged, so
        accepted / drafted (``acceptance_rate``) underestimates α; this is the
        estimate that Leviathan's formula (1 − α^(γ+1)) / (1 − α) expects.
        """
        judged = self.accepted + self.rejected_rounds
        return self.accepted / judged if judged else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the share of all proposed draft tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tau(self) -> float:
        """New tokens per target forward (after the prefill)."""
        return self.new_tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")

    @property
    def draft_seconds_per_token(self) -> float:
        return self.draft_seconds / self.drafted if self.drafted else float("nan")

    @property
    def target_seconds_per_forward(self) -> float:
        return self.verify_seconds / self.rounds if self.rounds else float("nan")


@dataclass
class GenerationResult:
    """``sequences``: ``[1, prompt + new]`` token ids; ``token_sources``: one label per new token:
    "accepted" (a draft token the target kept), "corrected" (sampled from the residual
    after a rejection), "bonus" (the free token after all drafts were accepted) or
    "target" (decoded by the target alone)."""

    sequences: torch.Tensor
    stats: GenerationStats
    token_sources: list[str]
    prompt_length: int

    @property
    def new_tokens(self) -> torch.Tensor:
        """``[new]`` the generated token ids."""
        return self.sequences[0, self.prompt_length :]


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings mean something."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _vocab_size(model: torch.nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _max_positions(model: torch.nn.Module) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p, generator, eos_token_id):
    """Validate the inputs shared by both generators; return (ids [B, n], mask [B, n], to_probs, eos set)."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[-1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, n] LongTensor of token ids, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
    elif not bool(attention_mask[:, -1].all()):
        raise ValueError("the prompts must be LEFT-padded (the last column real for every row): use tokenizer(..., padding_side='left').")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: ask for at least 1 new token.")
    max_pos = _max_positions(target)
    if max_pos is not None and input_ids.shape[-1] >= max_pos:
        raise ValueError(
            f"the prompt has {input_ids.shape[-1]} tokens but the target handles at most {max_pos} positions "
            "(config.max_position_embeddings): shorten the prompt."
        )
    check_sampling_args(temperature, top_k, top_p)
    device = target.device
    check_generator(generator, device)
    # Greedy is sampling at temperature 0 (one-hot p and q), as in HF generate(do_sample=False).
    to_probs = partial(logits_to_probs, temperature=temperature if do_sample else 0.0, top_k=top_k, top_p=top_p)
    if eos_token_id is None:
        eos = set()
    elif isinstance(eos_token_id, int):
        eos = {eos_token_id}
    else:
        eos = set(eos_token_id)
    return input_ids.to(device), attention_mask.to(device), to_probs, eos


def _stop_at_eos(new: torch.Tensor, eos: set[int]) -> tuple[torch.Tensor, bool]:
    """Cut ``new`` right after its first EOS token, if any."""
    for i, token in enumerate(new.tolist()):
        if token in eos:
            return new[: i + 1], True
    return new, False


def _as_drafter(draft, target) -> Drafter:
    """An HF model becomes a ModelDrafter, after checking that it speaks the target's vocabulary."""
    if not isinstance(draft, torch.nn.Module):
        if not hasattr(draft, "propose"):
            raise TypeError(f"draft must be a Hugging Face causal LM or a drafter with .propose(), got {type(draft).__name__}")
        return draft
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"vocabulary mismatch: draft vocab_size={draft.config.vocab_size}, target vocab_size="
            f"{target.config.vocab_size}. Draft and target must share a tokenizer: pick a draft from the "
            "target's model family (e.g. SmolLM2-135M for SmolLM2-1.7B), or use PromptLookupDrafter()."
        )
    return ModelDrafter(draft)


def _pad_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q over the first V' ids → q over all V ids, with q = 0 for tokens the drafter cannot propose."""
    if q.shape[-1] > vocab_size:
        raise ValueError(f"the drafter returned q over {q.shape[-1]} tokens but the target has only {vocab_size}.")
    return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1]))


@torch.no_grad()
def speculative_generate(
    target,
    draft,
    input_ids,
    *,
    max_new_tokens,
    gamma=4,
    do_sample=False,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    generator=None,
    eos_token_id=None,
    attention_mask=None,
    pad_token_id=0,
    accept_fn=accept_and_resample,
) -> GenerationResult:
    """Generate from ``target`` with drafts from ``draft``; the output has the target's distribution.

    Args:
        target: HF causal LM whose output distribution we reproduce.
        draft: HF causal LM with the same vocabulary, or a drafter (``ModelDrafter``,
            ``PromptLookupDrafter``, anything with ``.propose``).
        input_ids: ``[1, n]`` prompt token ids.
        max_new_tokens: upper bound on generated tokens (never exceeded).
        gamma: draft tokens per round (γ).
        do_sample, temperature, top_k, top_p: as in HF ``generate``; greedy if not do_sample.
        generator: ``torch.Generator`` on the target's device, for reproducible sampling.
        eos_token_id: int or list of ints; generation stops right after it, as ``generate`` does.
        attention_mask, pad_token_id: for a batch ``[B, n]`` of LEFT-padded prompts (see
            ``specdec_edu.batched``); the result is then a ``BatchResult``.
        accept_fn: the verification rule; swap in a broken one from ``specdec_edu.controls``
            to watch the exactness tests fail.
    """
    if gamma < 1:
        raise ValueError(f"gamma={gamma}: draft at least 1 token per round (typical values: 3–8).")
    drafter = _as_drafter(draft, target)
    ids, mask, to_probs, eos = _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p, generator, eos_token_id)
    if ids.shape[0] > 1:
        if not isinstance(drafter, ModelDrafter):
            raise ValueError("batched speculative decoding needs a draft model; run a drafter object (e.g. prompt lookup) one prompt at a time.")
        from .batched import batched_speculative_generate

        return batched_speculative_generate(
            target, drafter.model, ids, mask, max_new_tokens=max_new_tokens, gamma=gamma, to_probs=to_probs,
            generator=generator, eos=eos, accept_fn=accept_fn, pad_token_id=pad_token_id,
        )
    if hasattr(drafter, "reset"):  # a new generation: no draft cache or γ schedule carried over from the last one
        drafter.reset()
    seq = ids[0][mask[0].bool()]  # one row: just drop its padding
    device, vocab_size, max_pos = seq.device, _vocab_size(target), _max_positions(target)
    prompt_length, stats, sources = len(seq), GenerationStats(), []

    start = time.perf_counter()
    cache = kv.new_cache(target)
    if len(seq) > 1:  # prefill: the target's cache holds every token except the last one
        kv.forward(target, seq[None, :-1], cache, logits_to_keep=1)
    _sync(device)
    stats.prefill_seconds = time.perf_counter() - start

    done = False
    while not done:
        # γ for this round: never draft past max_new_tokens (the round adds one more token) or max positions.
        room = max_new_tokens - stats.new_tokens - 1
        if max_pos is not None:
            room = min(room, max_pos - len(seq))
        round_gamma = max(0, min(gamma, room))

        # 1. Draft: γ cheap forwards of the draft model (or a lookup).
        t0 = time.perf_counter()
        if round_gamma > 0:
            drafts, q = drafter.propose(seq, round_gamma, to_probs, generator)
            drafts, q = drafts.to(device), _pad_vocab(q.to(device), vocab_size)
        else:
            drafts, q = seq[:0], torch.zeros(0, vocab_size, device=device)
        _sync(device)
        t1 = time.perf_counter()

        # 2. Verify: ONE target forward over [last token] + drafts gives p at γ' + 1 positions.
        logits = kv.forward(target, torch.cat([seq[-1:], drafts])[None], cache).logits[0]
        p = to_probs(logits)  # [γ'+1, V]
        # 3. Accept a prefix of the drafts; the target adds one token (corrected or bonus).
        n, next_token = accept_fn(p, q, drafts, generator)
        # 4. Roll back: the cache keeps [last] + accepted drafts, i.e. all but the new last token.
        kv.crop(cache, len(drafts) - n)
        _sync(device)
        t2 = time.perf_counter()

        new = torch.cat([drafts[:n], torch.tensor([next_token], device=device)])
        new, done = _stop_at_eos(new, eos)
        seq = torch.cat([seq, new])
        last_source = "target" if len(drafts) == 0 else ("bonus" if n == len(drafts) else "corrected")
        sources += (["accepted"] * n + [last_source])[: len(new)]

        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += n
        stats.rejected_rounds += n < len(drafts)
        stats.new_tokens += len(new)
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        stats.drafted_per_round.append(len(drafts))
        stats.accepted_per_round.append(n)
        stats.tokens_per_round.append(len(new))
        stats.draft_seconds_per_round.append(t1 - t0)
        stats.verify_seconds_per_round.append(t2 - t1)
        done = done or stats.new_tokens >= max_new_tokens

    stats.seconds = time.perf_counter() - start
    return GenerationResult(seq[None], stats, sources, prompt_length)


@torch.no_grad()
def autoregressive_generate(
    target,
    input_ids,
    *,
    max_new_tokens,
    do_sample=False,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    generator=None,
    eos_token_id=None,
    attention_mask=None,
    pad_token_id=0,
) -> GenerationResult:
    """The baseline: one target forward per token, same sampling code as ``speculative_generate``."""
    ids, mask, to_probs, eos = _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p, generator, eos_token_id)
    if ids.shape[0] > 1:
        from .batched import batched_autoregressive_generate

        return batched_autoregressive_generate(
            target, ids, mask, max_new_tokens=max_new_tokens, to_probs=to_probs, generator=generator, eos=eos, pad_token_id=pad_token_id
        )
    seq = ids[0][mask[0].bool()]
    device, stats = seq.device, GenerationStats()

    start = time.perf_counter()
    cache = kv.new_cache(target)
    logits = kv.forward(target, seq[None], cache, logits_to_keep=1).logits[0, -1]  # prefill → first next-token logits
    _sync(device)
    stats.prefill_seconds = time.perf_counter() - start
    prompt_length = len(seq)
    while True:
        token = sample(to_probs(logits), generator)
        seq = torch.cat([seq, token[None]])
        stats.new_tokens += 1
        if stats.new_tokens >= max_new_tokens or int(token) in eos:
            break
        t0 = time.perf_counter()
        logits = kv.forward(target, token.view(1, 1), cache).logits[0, -1]  # one forward, one new token
        _sync(device)
        stats.rounds += 1
        stats.verify_seconds += time.perf_counter() - t0
        stats.tokens_per_round.append(1)
    stats.seconds = time.perf_counter() - start
    return GenerationResult(seq[None], stats, ["target"] * stats.new_tokens, prompt_length)
