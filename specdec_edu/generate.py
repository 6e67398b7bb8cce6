"""Speculative decoding end to end, and the target-only baseline it is compared with.

One round of ``speculative_generate``::

    context ──draft──> x_1 … x_γ  (γ cheap draft forwards, q_1 … q_γ)
    target([last, x_1 … x_γ])      (ONE target forward → p_1 … p_{γ+1})
    accept_and_resample(p, q, x)   → keep x_1 … x_n, add one target token

Bookkeeping that keeps it to one target forward per round: the target's KV cache
holds every token except the last one emitted, so the verify pass feeds
``[last] + drafts`` and reads γ + 1 next-token distributions. After the decision
the cache is cropped back to "everything except the new last token".

The round reads ONE thing back from the device: ``[n_accepted, next_token, drafts…,
error flags]``, in a single copy. Everything else (drafting, verifying, the rule,
the NaN check) is queued on the device without waiting, so a GPU never idles on a
Python ``if``. The context lives on the host, where drafters and stop checks read it.
"""

from __future__ import annotations

from functools import partial

import torch

from . import kv
from .batched import batched_autoregressive_generate, batched_speculative_generate
from .drafters import Drafter, ModelDrafter, to_device
from .result import GenerationResult, GenerationStats, PhaseClock, cut_at_eos, stop_reason
from .sampling import check_generator, check_sampling_args, logits_to_probs, nonfinite_logits_error, sample
from .verify import greedy_verify, verify_drafts


def head_rows(model: torch.nn.Module) -> int:
    """How many token ids the model's output head can produce (may exceed the tokenizer's
    vocabulary: Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, for one tokenizer)."""
    return model.get_output_embeddings().weight.shape[0]


def max_positions(model: torch.nn.Module) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p, generator,
             eos_token_id):
    """Validate the inputs shared by both generators; return (ids [B, n], mask [B, n], to_probs, eos set)."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[-1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, n] LongTensor of token ids, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}")
    elif not bool(attention_mask[:, -1].all()):
        raise ValueError("the prompts must be LEFT-padded (the last column real for every row): "
                         "use tokenizer(..., padding_side='left').")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: ask for at least 1 new token.")
    max_pos = max_positions(target)
    longest_prompt = int(attention_mask.sum(-1).max())
    if max_pos is not None and longest_prompt >= max_pos:
        raise ValueError(
            f"the prompt has {longest_prompt} tokens but the target handles at most {max_pos} positions "
            "(config.max_position_embeddings), and a new token needs one more: shorten the prompt."
        )
    check_sampling_args(temperature, top_k, top_p)
    device = target.device
    check_generator(generator, device)
    # Greedy is sampling at temperature 0 (one-hot p and q), as in HF generate(do_sample=False).
    # No NaN check inside: the loops check the target's logits once per round instead.
    to_probs = partial(logits_to_probs, temperature=temperature if do_sample else 0.0, top_k=top_k, top_p=top_p,
                       check_finite=False)
    eos = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    return input_ids.to(device), attention_mask.to(device), to_probs, eos


def as_drafter(draft, target) -> Drafter:
    """An HF model becomes a ModelDrafter, after checking that it can only propose token ids the target has."""
    if not isinstance(draft, torch.nn.Module):
        if not hasattr(draft, "propose"):
            raise TypeError(f"draft must be a Hugging Face causal LM or a drafter with .propose(), got {type(draft).__name__}")
        return draft
    # Compare what the heads can produce, not config.vocab_size: a draft whose head is
    # padded to fewer rows than the target's is fine (q = 0 on the target's extra ids).
    if head_rows(draft) > head_rows(target):
        raise ValueError(
            f"vocabulary mismatch: the draft's head produces {head_rows(draft)} token ids but the target's only "
            f"{head_rows(target)}. Draft and target must share a tokenizer: pick a draft from the target's model "
            "family (e.g. SmolLM2-135M for SmolLM2-1.7B), or use PromptLookupDrafter(). If the extra rows are only "
            f"padding, cap the draft's head: ModelDrafter(draft, head_size={head_rows(target)})."
        )
    return ModelDrafter(draft)


def propose_checked(drafter, context, gamma, to_probs, generator, device, vocab_size):
    """Ask the drafter for up to γ tokens and check what comes back.

    Shapes are checked here, on the host. Values (is q a distribution? did the drafter
    propose a token it gave q = 0?) are checked on the device and returned as a flag
    ``[2]`` that the round reads together with its decision, so checking costs no sync.
    Returns drafts ``[γ']`` and q ``[γ', V]`` (zero-padded to the target's V), on ``device``.
    """
    drafts, q = drafter.propose(context, gamma, to_probs, generator)
    name = type(drafter).__name__
    if drafts.dim() != 1 or q.dim() != 2 or len(drafts) != q.shape[0]:
        raise ValueError(f"{name}.propose must return tokens [γ'] and q [γ', V'] with one q row per token; "
                         f"got tokens {tuple(drafts.shape)} and q {tuple(q.shape)}.")
    if len(drafts) > gamma:
        raise ValueError(f"{name}.propose returned {len(drafts)} tokens but was asked for at most γ = {gamma}: "
                         "return tokens[:gamma] (the round's γ may be smaller than the one you set, near the limits).")
    if q.shape[-1] > vocab_size:
        raise ValueError(f"{name}.propose returned q over {q.shape[-1]} token ids but the target has only {vocab_size}.")
    drafts, q = to_device(drafts, device), torch.nn.functional.pad(to_device(q, device), (0, vocab_size - q.shape[-1]))
    in_range = (drafts >= 0) & (drafts < vocab_size)
    q_x = q.gather(1, drafts.clamp(0, vocab_size - 1)[:, None])[:, 0]
    not_a_distribution = ~torch.isfinite(q).all() | (q < 0).any() | ((q.sum(-1) - 1).abs() > 1e-3).any()
    unsupported = ~in_range.all() | (q_x <= 0).any()
    # An id outside the vocabulary would crash the verify forward before the flag is read (on a GPU,
    # fatally): feed a clamped id instead; the round then raises on the flag.
    return drafts.clamp(0, vocab_size - 1), q, torch.stack([not_a_distribution, unsupported])


def raise_for_flags(flags: list[int], drafter) -> None:
    """Turn the round's error flags ``[verify logits not finite, q not a distribution, token outside q]`` into errors."""
    if flags[0]:
        raise nonfinite_logits_error("target")
    if flags[1]:
        raise ValueError(f"{type(drafter).__name__}.propose returned a q that is not a probability distribution "
                         "(NaN/inf, negative, or rows that do not sum to 1): return the probabilities the tokens were "
                         "sampled from, e.g. to_probs(logits).")
    if flags[2]:
        raise ValueError(f"{type(drafter).__name__}.propose returned a token outside its q's support (q(x) = 0 or an id "
                         "outside the vocabulary): q must be the distribution each token was actually drawn from.")


def target_forward(target, ids, cache, with_features: bool):
    """Run the target on ``ids [1, n]`` after what ``cache`` holds: logits ``[n, V]`` and, for drafters
    that draft from the target's own features (EAGLE, Medusa), its last hidden states ``[n, d]``
    (the input of ``lm_head``). For those we run the decoder and the head separately."""
    if not with_features:
        return kv.forward(target, ids, cache).logits[0], None
    hidden = kv.forward(target.get_decoder(), ids, cache).last_hidden_state[0]
    return target.get_output_embeddings()(hidden), hidden


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
    accept_fn=None,
    profile=False,
) -> GenerationResult:
    """Generate from ``target`` with drafts from ``draft``; the output has the target's distribution.

    Args:
        target: HF causal LM whose output distribution we reproduce.
        draft: HF causal LM with the same tokenizer, or a drafter (``ModelDrafter``,
            ``PromptLookupDrafter``, anything with ``.propose``).
        input_ids: ``[1, n]`` (or ``[n]``) prompt token ids; ``[B, n]`` with an
            ``attention_mask`` for a batch of LEFT-padded prompts (see ``specdec_edu.batched``).
        max_new_tokens: upper bound on generated tokens (never exceeded).
        gamma: draft tokens per round (γ).
        do_sample, temperature, top_k, top_p: as in HF ``generate``; greedy if not do_sample.
        generator: ``torch.Generator`` on the target's device, for reproducible sampling.
        eos_token_id: int or list of ints; generation stops right after it, as ``generate`` does.
        accept_fn: the verification rule, ``(p, q, drafts, generator) -> (n, next_token)``;
            swap in a broken one from ``specdec_edu.controls`` to watch the exactness tests fail.
            Default: the rule itself (``verify_drafts``; ``greedy_verify`` when greedy).
        profile: wait for the device at every phase of a round, so that ``stats.phase_seconds``
            and the draft/verify times are exact on a GPU (slower there; free on a CPU).

    Generation stops at EOS, at ``max_new_tokens``, or when the sequence fills the target's
    ``max_position_embeddings``; ``result.stats.stopped_by`` says which.
    """
    if gamma < 1:
        raise ValueError(f"gamma={gamma}: draft at least 1 token per round (typical values: 3–8).")
    drafter = as_drafter(draft, target)
    ids, mask, to_probs, eos = _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p,
                                        generator, eos_token_id)
    if ids.shape[0] > 1:
        if not isinstance(drafter, ModelDrafter):
            raise ValueError("batched speculative decoding needs a draft model; run a drafter object "
                             "(e.g. prompt lookup, EAGLE, Medusa) one prompt at a time.")
        return batched_speculative_generate(
            target, drafter.model, ids, mask, max_new_tokens=max_new_tokens, gamma=gamma, to_probs=to_probs,
            generator=generator, eos=eos, accept_fn=accept_fn, pad_token_id=pad_token_id, max_pos=max_positions(target),
        )
    if hasattr(drafter, "reset"):  # a new generation: no draft cache or γ schedule carried over from the last one
        drafter.reset()
    prompt = ids[0][mask[0].bool()]  # one row: just drop its padding
    device, vocab_size, max_pos = prompt.device, head_rows(target), max_positions(target)
    stats, sources, clock = GenerationStats(), [], PhaseClock(device, profile)

    def decide(logits, q, drafts) -> torch.Tensor:
        """``[2]`` = (n_accepted, next_token), left on the device."""
        if accept_fn is not None:  # a rule under test (e.g. a broken control): p from the logits, then the rule
            decision = accept_fn(to_probs(logits), q, drafts, generator)
            return torch.stack([torch.as_tensor(v, device=device) for v in decision])
        if not do_sample:  # temperature 0: the rule is a comparison of argmaxes (no softmax, no random numbers)
            return greedy_verify(logits, drafts)
        return verify_drafts(to_probs(logits), q, drafts, generator)

    # A drafter with .observe(features) is shown the target's hidden state at every position the
    # target's cache keeps: the prompt (prefill), then [last] + accepted drafts after each round.
    with_features = hasattr(drafter, "observe")
    cache = kv.new_cache(target)
    if len(prompt) > 1:  # prefill: the target's cache holds every token except the last one
        if with_features:
            drafter.observe(target_forward(target, prompt[None, :-1], cache, True)[1])
        else:
            kv.forward(target, prompt[None, :-1], cache, logits_to_keep=1)
    stats.prefill_seconds = clock.lap()
    context, last = prompt.cpu(), prompt[-1:]  # context on the host; `last` (on the device) is not cached yet
    output: list[int] = []

    while not stats.stopped_by:
        # γ for this round: the round adds up to γ + 1 tokens, within max_new_tokens and max positions.
        room = max_new_tokens - stats.new_tokens
        if max_pos is not None:
            room = min(room, max_pos - len(context))
        g = min(gamma, room - 1)

        # 1. Draft: up to γ cheap guesses (γ forwards of a draft model, or a lookup), with their q.
        if g > 0:
            drafts, q, q_flags = propose_checked(drafter, context, g, to_probs, generator, device, vocab_size)
        else:
            drafts, q = prompt[:0], torch.zeros(0, vocab_size, device=device)
            q_flags = torch.zeros(2, dtype=torch.bool, device=device)
        draft_time = clock.lap()
        # 2. Verify: ONE target forward over [last token] + drafts gives p at γ' + 1 positions.
        logits, features = target_forward(target, torch.cat([last, drafts])[None], cache, with_features)  # [γ'+1, V]
        forward_time = clock.lap()
        # 3. Decide (on the device): how many drafts survive, and the target's own next token.
        decision = decide(logits, q, drafts)  # [2] = (n_accepted, next_token)
        flags = torch.cat([~torch.isfinite(logits).all().view(1), q_flags]).long()
        # 4. The round's one device→host sync: the decision, the drafts and the error flags together.
        n, next_token, *rest = torch.cat([decision, drafts, flags]).tolist()
        raise_for_flags(rest[len(drafts):], drafter)
        decide_time = clock.lap()
        # 5. Roll back: the cache keeps [last] + accepted drafts, i.e. all but the new last token.
        kv.crop(cache, len(drafts) - n)
        if with_features:
            drafter.observe(features[: n + 1])  # [n+1, d]: the positions the cache kept
        crop_time = clock.lap()

        new, hit_eos = cut_at_eos(rest[:n] + [next_token], eos)
        output += new
        context, last = torch.cat([context, torch.tensor(new)]), decision[1:]
        emitted_accepted = min(n, len(new))  # drafts cut off after an EOS were never emitted
        ended = "target" if len(drafts) == 0 else "bonus" if n == len(drafts) else "corrected"
        sources += ["accepted"] * emitted_accepted + [ended] * (len(new) - emitted_accepted)

        stats.record_round(drafted=len(drafts), accepted=emitted_accepted, emitted=len(new),
                           rejected=ended == "corrected" and len(new) > n,
                           phases=dict(draft=draft_time, verify_forward=forward_time, accept_resample=decide_time,
                                       cache_crop=crop_time), profile=profile)
        stats.stopped_by = stop_reason(stats.new_tokens, len(context), hit_eos, max_new_tokens, max_pos)

    stats.seconds = stats.prefill_seconds + stats.draft_seconds + stats.verify_seconds
    return GenerationResult(prompt[None], [output], pad_token_id=pad_token_id,
                            stats=stats, row_stats=[stats], token_sources=[sources])


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
    ids, mask, to_probs, eos = _prepare(target, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p,
                                        generator, eos_token_id)
    if ids.shape[0] > 1:
        return batched_autoregressive_generate(
            target, ids, mask, max_new_tokens=max_new_tokens, to_probs=to_probs, generator=generator, eos=eos,
            pad_token_id=pad_token_id, max_pos=max_positions(target),
        )
    prompt = ids[0][mask[0].bool()]
    max_pos, stats, clock = max_positions(target), GenerationStats(), PhaseClock(prompt.device, False)
    new: list[int] = []
    cache = kv.new_cache(target)
    logits = kv.forward(target, prompt[None], cache, logits_to_keep=1).logits[0, -1]  # prefill → first next-token logits
    while True:
        token = logits.argmax() if not do_sample else sample(to_probs(logits), generator)
        token_id, finite = torch.stack([token, torch.isfinite(logits).all().long()]).tolist()  # one sync per token
        if not finite:
            raise nonfinite_logits_error("target")
        new.append(token_id)
        if not stats.rounds:
            stats.prefill_seconds = clock.lap()
        stats.stopped_by = stop_reason(len(new), len(prompt) + len(new), token_id in eos, max_new_tokens, max_pos)
        if stats.stopped_by:
            break
        logits = kv.forward(target, token.view(1, 1), cache).logits[0, -1]  # one forward, one new token
        stats.rounds += 1
        stats.tokens_per_round.append(1)
        stats.verify_seconds += clock.lap()
    stats.verify_seconds += clock.lap()
    stats.new_tokens = len(new)
    stats.seconds = stats.prefill_seconds + stats.verify_seconds
    return GenerationResult(prompt[None], [new], pad_token_id=pad_token_id, stats=stats, row_stats=[stats],
                            token_sources=[["target"] * len(new)])
