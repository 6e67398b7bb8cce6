"""Drafters: anything that can guess the next γ tokens.

**The protocol** (:class:`Drafter`) is one required method::

    propose(context, gamma, to_probs, generator) -> (tokens [γ'], q [γ', V'])

``context`` is the 1-D LongTensor of every token so far (prompt + accepted output);
``to_probs`` turns logits into probabilities with the run's sampling settings (the
same ones the target uses); ``q`` holds the distributions the tokens were drawn
from. A drafter may return fewer than γ tokens (even none) and may cover only the
first V' <= V token ids: tokens outside get q = 0, meaning "never proposed", which
leaves speculative sampling exact.

Four optional hooks, for drafters that keep state or depend on the target:

* ``reset()``: forget everything (called before each generation: a new prompt).
* ``observe(features [n, d])``: having it means "show me the target's last hidden
  states": the loop then passes them for every position the target's cache keeps
  (feature drafters: EAGLE, Medusa, in ``specdec_edu.models.feature_drafters``).
* ``check_target(target)``: raise ``ValueError`` (naming the fix) if this drafter
  cannot serve ``target`` (e.g. it was trained on another model).
* ``drafted_elsewhere()``: for a drafter that takes turns with another one
  (:class:`LookupThenDrafter`): "the last round was not yours", so the tokens the
  context grew by were not its drafts (see :class:`ModelDrafter`).

Nothing looks for these by hand: the loop calls :func:`reset_drafter`,
:func:`wants_features` and :func:`check_drafter_target`, and ``LookupThenDrafter``
:func:`tell_drafted_elsewhere`, the one place where the optional hooks are looked up.
A drafter that drafts through another one (``LookupThenDrafter``, and in ``course.experiments``
``DynamicGammaDrafter``, ``MixtureDrafter``) passes them on with :func:`pass_hooks_through`.

A drafter never needs to be told about rejections: it sees the new context on the
next call and can compare it with the context of its last call. ``speculative_generate``
passes ``context`` as a host (CPU) tensor, so that comparison costs no device sync.

**One drafting loop.** Every autoregressive drafter (a draft model, EAGLE, the batched
path) drafts the same way, with :func:`draft_loop`: sample x_i from q_i, feed x_i back
to get q_{i+1}, except after the last draft.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F

from . import kv
from .models.shapes import head_rows, max_positions, sliding_window
from .round import gamma_within, past_draft_limit, refuse_unreadable_prompt
from .sampling import sample

ToProbs = Callable[[torch.Tensor], torch.Tensor]


class Drafter(Protocol):
    """What ``speculative_generate`` needs from a drafter (see the module docstring for the optional hooks)."""

    def propose(
        self, context: torch.Tensor, gamma: int, to_probs: ToProbs, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``gamma`` tokens ``[γ']`` after ``context`` ``[n]`` (host), and the q ``[γ', V']`` they were drawn from."""
        ...


# ---- the optional hooks: looked up here, and only here ------------------------------------------


def reset_drafter(drafter) -> None:
    """Before a new generation: ``drafter.reset()`` if it keeps state (a KV cache, observed features)."""
    reset = getattr(drafter, "reset", None)
    if reset is not None:
        reset()


def wants_features(drafter) -> bool:
    """Does ``drafter`` draft from the target's hidden states (has ``observe(features [n, d])``)?"""
    return callable(getattr(drafter, "observe", None))


def check_drafter_target(drafter, target) -> None:
    """``drafter.check_target(target)`` if it has one: raises ``ValueError`` when it cannot serve ``target``."""
    check = getattr(drafter, "check_target", None)
    if check is not None:
        check(target)


def tell_drafted_elsewhere(drafter) -> None:
    """``drafter.drafted_elsewhere()`` if it has one: the last round's drafts came from another drafter."""
    told = getattr(drafter, "drafted_elsewhere", None)
    if told is not None:
        told()


def pass_hooks_through(wrapper, inner) -> None:
    """Give ``wrapper``, a drafter that drafts through ``inner``, the inner one's ``check_target`` and, only if
    ``inner`` has it, its ``observe`` (having it is what asks the loop for features: :func:`wants_features`).
    ``reset`` and ``drafted_elsewhere`` the wrapper defines itself (it may have state of its own to forget), ending
    with :func:`reset_drafter` and :func:`tell_drafted_elsewhere` of ``inner``."""
    wrapper.check_target = partial(check_drafter_target, inner)
    if wants_features(inner):
        wrapper.observe = inner.observe


def check_propose_args(context: torch.Tensor, gamma: int) -> None:
    """Refuse what no drafter can draft from: ``context`` must be a non-empty 1-D tensor of token ids ``[n]``,
    ``gamma`` a whole number ≥ 0. (``speculative_generate`` always passes such; a learner calling ``propose`` by hand
    may not, and a ``[1, n]`` context or a negative γ would otherwise draft nothing, or the wrong tokens, in silence.)"""
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 0:
        raise ValueError(f"gamma={gamma!r}: propose drafts up to gamma tokens, a whole number >= 0.")
    if not isinstance(context, torch.Tensor) or context.dim() != 1 or not is_token_dtype(context.dtype):
        shape = tuple(context.shape) if isinstance(context, torch.Tensor) else type(context).__name__
        raise ValueError(f"context must be a 1-D tensor of token ids [n], got {shape} "
                         f"{getattr(context, 'dtype', '')}: for a batch of one pass ids[0], and ids as integers "
                         "(torch.long).")
    if len(context) == 0:
        raise ValueError("context is empty: a drafter drafts after at least one token (the prompt's).")


def is_token_dtype(dtype: torch.dtype) -> bool:
    """Can a tensor of ``dtype`` hold token ids? (integers; not bool, float or complex)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_draft_head(rows: int, target) -> None:
    """Refuse a draft model whose head produces more token ids (``rows``) than the target's head.

    Compare what the heads can produce, not config.vocab_size: a draft whose head is padded to fewer rows
    than the target's is fine (q = 0 on the target's extra ids)."""
    if rows > head_rows(target):
        raise ValueError(
            f"vocabulary mismatch: the draft's head produces {rows} token ids but the target's only "
            f"{head_rows(target)}. Draft and target must share a tokenizer: pick a draft from the target's model "
            "family (e.g. SmolLM2-135M for SmolLM2-1.7B), or use PromptLookupDrafter(). If the extra rows are only "
            f"padding, cap the draft's head: ModelDrafter(draft, head_size={head_rows(target)})."
        )


# ---- the one drafting loop ----------------------------------------------------------------------


def no_drafts(width: int, device: torch.device, batch: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty proposal: tokens ``[..., 0]`` and q ``[..., 0, V']`` (V' = ``width``); the round is then a
    target-only step."""
    return torch.empty(*batch, 0, dtype=torch.long, device=device), torch.zeros(*batch, 0, width, device=device)


def draft_loop(logits: torch.Tensor, gamma: int, to_probs: ToProbs, generator: torch.Generator | None,
               feed: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft γ tokens autoregressively: x_i ~ q_i = to_probs(logits_i), then logits_{i+1} = feed(x_i).

    Args:
        logits: ``[..., V']``, the drafter's logits for the first draft position: ``[V']`` for
            one prompt, ``[B, V']`` for a batch.
        gamma: γ, the number of drafts.
        to_probs: the run's sampling settings, logits → probabilities (the same as the target's).
        generator: for the draws (on the logits' device).
        feed: ``feed(x_i [...]) -> logits [..., V']``: runs the drafter one step on its own draft.

    Returns:
        tokens ``[..., γ]`` and q ``[..., γ, V']`` (everything stays on the device: no sync).
    """
    if gamma < 1:
        return no_drafts(logits.shape[-1], logits.device, logits.shape[:-1])
    tokens, qs = [], []
    for i in range(gamma):
        q_i = to_probs(logits)  # [..., V']
        x_i = sample(q_i, generator)  # [...]: one independent draw per row
        tokens.append(x_i)
        qs.append(q_i)
        if i < gamma - 1:  # the last draft is never fed: nobody needs what comes after it yet
            logits = feed(x_i)
    return torch.stack(tokens, -1), torch.stack(qs, -2)


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of leading positions where the 1-D tensors ``a`` and ``b`` agree."""
    n = min(len(a), len(b))
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


class ModelDrafter:
    """A small causal LM drafting autoregressively, with its own KV cache.

    Args:
        model: a Hugging Face causal LM sharing the target's tokenizer.
        head_size: if set (or if ``model.config.draft_vocab_size`` is), only the
            first ``head_size`` token ids get logits: a cheaper head whose other
            tokens have q = 0 (``speculative_generate`` pads q with zeros).
        max_cache_len: with ``compile``, the positions the cache must hold (default: the model's
            ``max_position_embeddings``); a generation that needs more raises, naming the fix.
        compile: keep K/V in a preallocated static cache (see ``kv.StaticKV``) and run every
            forward (one-token steps, the catch-up feed, the prefill) through fixed-shape code of
            a few input widths (on CUDA: CUDA graphs; see ``kv.forward_compiled``); same output. The cache
            is the draft model's shared compiled cache (``kv.shared_static_cache``: ``max_cache_len``
            rounded up to a power of two, at least 256). Off by default here: compiling takes
            seconds to minutes and pays off only over many steps, on a GPU.
            ``speculative_generate(draft_model, compile=…)`` builds a compiled ModelDrafter for you
            (on CUDA by default).
        static_cache: ``True`` only together with ``compile=True`` (which implies it; kept so that
            ``static_cache=True, compile=True`` still reads as it did). A static cache without
            compiling is not offered here: no lesson used it (``kv.new_static_cache`` makes one for tests).
        compile_options: keyword arguments for ``torch.compile``, over the defaults
            ``dynamic=False, fullgraph=True`` and, on CUDA, ``backend="capture"`` (CUDA graphs recorded
            without a compiler; see ``kv.full_compile_options``; tests pass ``{"backend": "aot_eager"}``).
            ``dynamic=False`` because each width always has the same shapes (ids ``[1, w]``,
            positions ``[w]``, a cache of ``max_cache_len`` slots) and the positions are a
            tensor argument, not Python ints: one compilation per width serves every step.

    **Cache bookkeeping without a device sync.** The cache holds the K/V of the last
    context plus the drafts fed after it (γ − 1: the last draft is never fed). To reuse
    them, the drafter must know how much of the new context it has already seen.
    Comparing the new context with the drafted tokens would need those tokens on the
    host: a device→host sync every round. Instead the drafter remembers the last
    context (a host tensor, as the loop passes it) and relies on the loop's contract:
    a round emits the accepted drafts, then ONE token of the target's. So if the new
    context extends the last one by k tokens, the first k − 1 are accepted drafts,
    whose K/V are already cached, except the last draft, which was never fed (when all
    γ were accepted, k − 1 = γ and only γ − 1 are cached); only the rest is fed. A context that does not extend
    the last one (a new prompt) falls back to the common prefix of the two host
    contexts. A round this drafter did not draft breaks the contract (the context grows by
    another drafter's tokens): whoever skips it, like ``LookupThenDrafter``, calls
    ``drafted_elsewhere()``, and only the last context's K/V are reused. (By hand: call
    ``drafted_elsewhere()`` before a ``propose`` whose context extends the last one by
    tokens that were not its drafts, or ``reset()`` before an unrelated one.)

    Exactness never depends on this cache: q is the distribution the drafter sampled
    from, whatever it conditioned on. The acceptance rate α does, which is why the
    tests compare q with a from-scratch recomputation after rollbacks.

    Two compiled ModelDrafters of one model share its cache. Each marks the cache as its own
    (``kv.StaticKV.holder``) when it resets; one that finds another's mark in ``propose`` has lost
    its K/V to the other and starts over from its context (same q, one longer feed).

    Tokens and q come back on the model's device; nothing in ``propose`` waits for it.
    """

    def __init__(self, model: torch.nn.Module, head_size: int | None = None, *, static_cache: bool = False,
                 max_cache_len: int | None = None, compile: bool = False, compile_options: dict | None = None):
        if static_cache and not compile:
            raise ValueError("static_cache=True needs compile=True: the static cache is what a compiled step needs "
                             "(fixed shapes). Pass compile=True (static and compiled), or neither (a dynamic cache).")
        self.model = model
        self.head_size = head_size or getattr(model.config, "draft_vocab_size", None)
        self.vocab_size = model.config.vocab_size
        # A reduced head runs the bare decoder, then multiplies by the first head_size rows only.
        self._net = model if self.head_size is None else model.get_decoder()
        self._net_kwargs = {"logits_to_keep": 1} if self.head_size is None else {}
        self.static, self._mark = None, object()  # _mark: this drafter's token in a shared cache's holder
        if compile:
            max_cache_len = max_cache_len or getattr(model.config, "max_position_embeddings", None)
            if max_cache_len is None:
                raise ValueError("compile=True needs max_cache_len (the model's config has no max_position_embeddings).")
            # Compiled code is specialised to its cache, so a compiled drafter takes the draft model's shared
            # one: every ModelDrafter of this model (one per call when speculative_generate wraps a bare
            # model) reuses it, and each width compiles once.
            self.static = kv.shared_static_cache(self._net, max_cache_len, compile_options, role="draft")
        self.reset()

    def reset(self) -> None:
        """Forget the cache (e.g. before a new prompt)."""
        if self.static is not None:
            kv.crop(self.static, kv.cache_length(self.static))  # rewinding is enough: stale slots are masked, then overwritten
            self.static.holder = self._mark  # ours now (another ModelDrafter of this model may have held it)
            self.cache = self.static
        else:
            self.cache = kv.new_cache(self.model)
        self.n_cached = 0  # positions in the cache (host int: never read back from the device)
        self.last_context = torch.empty(0, dtype=torch.long)  # the context of the last propose, on the host
        self.n_draft_cached = 0  # drafts fed after last_context: γ − 1 after a propose
        self.past_limit = False  # has this generation's context outgrown the draft model (said once)?
        self.started = False  # has this generation had a round (ours, or another drafter's before us)?

    def check_target(self, target) -> None:
        """Refuse a ``target`` whose head has fewer token ids than this drafter proposes (``check_draft_head``), or that
        lives on another kind of device: the round compares p and q on one device, and one generator draws for both."""
        draft_device, target_device = self.model.device, target.device  # as validate_prompts reads it
        if draft_device.type != target_device.type:
            raise ValueError(f"the draft model is on {draft_device} but the target on {target_device}: put both on one "
                             f"device, draft.to({str(target_device)!r}) (load_pair does).")
        check_draft_head(self.head_size or head_rows(self.model), target)

    def drafted_elsewhere(self) -> None:
        """The last round was drafted by someone else: the tokens after ``last_context`` are not (all) the
        drafts this drafter fed, so none of those may be reused; the K/V of ``last_context`` itself still may."""
        self.n_draft_cached = 0
        self.started = True  # a later first call of ours is not the prompt's round

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` ``[1, n]`` through the draft (compiled if asked, whatever n); logits ``[V']`` for the token after them."""
        out = kv.forward_cached(self._net, ids, self.cache, **self._net_kwargs)
        if self.head_size is None:
            return out.logits[0, -1]
        return reduced_head(self.model, out.last_hidden_state[0, -1], self.head_size)

    def next_logits(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Append ``new_tokens`` ``[n]`` (host or device) to the cache; logits ``[V']`` for the token after them."""
        ids = to_device(new_tokens, self.model.device).view(1, -1)
        logits = self._logits(ids)
        self.n_cached += ids.shape[1]
        return logits

    def reusable_prefix(self, context: torch.Tensor) -> int:
        """How many leading positions of the cache are still valid for ``context`` ``[n]`` (host).

        Leaves at least one token to feed, so that the next call yields fresh logits.
        """
        last, n = self.last_context, len(context)
        if n > len(last) and torch.equal(context[: len(last)], last):
            accepted = n - len(last) - 1  # the round emitted accepted drafts, then one target token
            keep = len(last) + min(accepted, self.n_draft_cached)
        elif self.static is None and sliding_window(self.model) is not None:
            # Not an extension, and a sliding window in a dynamic cache: transformers >= 5.20 keeps only its last W − 1
            # rows at each crop, so a crop back past what was fed since the last one cannot be done. Start over.
            keep = 0
        else:  # not an extension (a new prompt, or the same context again): what the contexts share
            keep = common_prefix_length(last, context)
        return min(keep, n - 1)

    @torch.no_grad()
    def propose(self, context, gamma, to_probs, generator=None):
        """Draft γ' tokens after ``context`` ``[n]`` (host); returns tokens ``[γ']`` and q ``[γ', V']``.

        γ' = γ, or fewer where the draft model's own position limit leaves no room for γ: none once the context
        has outgrown it (with a warning, once per generation); a first context it cannot read at all is refused."""
        check_propose_args(context, gamma)
        context = context.cpu()  # the loop passes a host tensor already (a device one would cost a sync here)
        if self.static is not None and self.static.holder is not self._mark:
            said = self.started, self.past_limit  # the same generation goes on: only the cache starts over
            self.reset()  # another ModelDrafter of this model used the shared cache since: none of its K/V are ours
            self.started, self.past_limit = said
        limit = max_positions(self.model)
        if limit is not None and len(context) > limit:  # the context outgrew the draft (or the prompt is too long)
            if not self.started:  # the generation's first round: the context is the prompt itself
                refuse_unreadable_prompt(len(context), limit)
            if not self.past_limit:
                past_draft_limit(len(context), limit)
                self.past_limit = True
        self.started = True
        gamma = gamma_within(gamma, len(context), draft_limit=limit)
        if gamma < 1:
            # no drafts fed this time: a later call must not take the tokens the context grew by for cached
            # drafts (the K/V of last_context itself stay valid)
            self.n_draft_cached = 0
            return no_drafts(self.head_size or self.vocab_size, self.model.device)
        # 1. Roll the cache back to what still matches the context (rejected drafts go).
        keep = self.reusable_prefix(context)
        check_draft_can_read(self.model, context[keep:])
        if keep == 0 and self.static is None:
            self.cache = kv.new_cache(self.model)  # nothing kept: a fresh cache (no layer is asked to crop that far back)
        else:
            kv.crop(self.cache, self.n_cached - keep)
        self.n_cached = keep
        logits = self.next_logits(context[keep:])

        # 2. Draft autoregressively: sample from q, feed the sample back in (all on the device).
        tokens, q = draft_loop(logits, gamma, to_probs, generator, self.next_logits)
        self.last_context, self.n_draft_cached = context, gamma - 1
        return tokens, q


def reduced_head(model: torch.nn.Module, hidden: torch.Tensor, head_size: int) -> torch.Tensor:
    """Logits ``[..., head_size]`` from hidden states ``[..., d]``: the first ``head_size`` rows of ``model``'s
    output head, its bias included. (A transform after the head, such as Gemma 2's soft-capping, is not applied:
    exactness does not mind, since q is what was sampled, but α may fall.)"""
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return F.linear(hidden, head.weight[:head_size], None if bias is None else bias[:head_size])


def check_draft_can_read(model: torch.nn.Module, tokens: torch.Tensor) -> None:
    """Refuse host ``tokens`` ``[n]`` the draft ``model``'s embedding has no row for (host tensors: no sync)."""
    rows = model.get_input_embeddings().num_embeddings
    unreadable = tokens >= rows
    if unreadable.any():
        raise ValueError(
            f"the context holds token id {int(tokens[unreadable][0])}, which the draft model cannot read "
            f"(its embedding has {rows} rows): the target produced an id outside the draft's vocabulary. "
            "Use a draft with the target's tokenizer, or PromptLookupDrafter()."
        )


def to_device(tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tokens → ``device`` without waiting: a plain copy from pageable memory would
    synchronize the CUDA stream, a copy from pinned memory is queued like a kernel."""
    if tokens.device == device:
        return tokens
    if device.type == "cuda" and tokens.device.type == "cpu":
        return tokens.pin_memory().to(device, non_blocking=True)
    return tokens.to(device)


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting: no model, no weights.

    Find the most recent earlier place where the context's last n tokens occurred
    (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed
    it there. Great when the output copies from the input (summaries, edits, code).
    The draft is deterministic, so q is one-hot.

    What follows the latest match stops at the end of the context: inside a stretch that repeats with period k,
    the draft has at most k tokens (HF's prompt lookup takes the earliest match instead). Taking the latest match
    with γ tokens after it drafted a few more tokens per round on the bench's prompts, but accepted no more of them
    (the same τ on all five, 2026-12-07), so the simpler rule stays.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def lookup(self, context: torch.Tensor, gamma: int) -> torch.Tensor:
        """The up-to-γ tokens that followed the latest earlier match of the context's suffix."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-n:]
            windows = context[:-1].unfold(0, n, 1)  # [len-n, n]: every earlier n-gram (not the suffix itself)
            starts = (windows == suffix).all(-1).nonzero().flatten()
            if len(starts):
                follow = int(starts[-1]) + n  # the token right after the latest match
                return context[follow : follow + gamma]
        return context[:0]

    def propose(self, context, gamma, to_probs=None, generator=None):
        """Tokens ``[γ']`` (γ' <= γ, maybe 0) and their one-hot q ``[γ', V']``."""
        check_propose_args(context, gamma)
        tokens = self.lookup(context, gamma).long()  # F.one_hot takes int64 only (a context may be int32, uint8)
        width = int(tokens.max()) + 1 if len(tokens) else 1  # speculative_generate pads q to the full vocabulary
        return tokens, F.one_hot(tokens, width).float()


class LookupThenDrafter:
    """Prompt lookup where the context repeats itself, another drafter everywhere else.

    Each round first tries n-gram lookup (by default only matches of 3+ tokens: a single
    repeated word is a poor reason to copy). If it finds nothing, ``fallback`` drafts.
    Either way q is what the tokens were drawn from, so the output stays exact.

    The fallback's optional hooks (module docstring) reach it: ``check_target`` always and ``observe`` only if the
    fallback has it (:func:`pass_hooks_through`; a feature drafter must
    see every position the target keeps, also in rounds that lookup drafted, or its cache
    falls out of step), and its own ``reset`` and ``drafted_elsewhere`` forward to the fallback's.
    ``rounds`` counts who drafted: ``{"lookup": n, "fallback": m}`` for
    the last generation.
    """

    def __init__(self, fallback, lookup: PromptLookupDrafter | None = None):
        self.fallback = fallback
        self.lookup = lookup if lookup is not None else PromptLookupDrafter(max_ngram=4, min_ngram=3)
        pass_hooks_through(self, fallback)
        self.rounds = {"lookup": 0, "fallback": 0}

    def reset(self) -> None:
        self.rounds = {"lookup": 0, "fallback": 0}
        reset_drafter(self.fallback)

    def drafted_elsewhere(self) -> None:  # this one, nested as another's fallback: the fallback did not draft either
        tell_drafted_elsewhere(self.fallback)

    def propose(self, context, gamma, to_probs, generator=None):
        """Tokens ``[γ']`` and q ``[γ', V']`` from lookup if the context's suffix occurred before, else from ``fallback``."""
        tokens, q = self.lookup.propose(context, gamma)
        if len(tokens):
            self.rounds["lookup"] += 1
            tell_drafted_elsewhere(self.fallback)  # the context will grow by lookup's tokens, not the fallback's drafts
            return tokens, q
        self.rounds["fallback"] += 1
        return self.fallback.propose(context, gamma, to_probs, generator)
