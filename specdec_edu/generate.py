"""Speculative decoding end to end, and the target-only baseline it is compared with.

One round of ``speculative_generate`` (``round.speculative_round``, which this loop and the
batched loop share)::

    OnePrompt.draft            context ──drafter.propose──> x_1 … x_γ, q_1 … q_γ   (propose_checked)
    OnePrompt.verify           target([newest, x_1 … x_γ]) → logits for p_1 … p_{γ+1}  (ONE target forward)
    the accept rule            verify_drafts(p, q, x) (greedy_verify when greedy) → n, next token
    OnePrompt.read_and_check   the round's one device→host read; raises on an error flag
    OnePrompt.roll_back        crop the target's cache to [newest, x_1 … x_n]; next token = new `newest`

Bookkeeping that keeps it to one target forward per round: the target's KV cache
holds every token except the last one emitted, so the verify pass feeds
``[newest] + drafts`` and reads γ + 1 next-token distributions. After the decision
the cache is cropped back to "everything except the new last token".

The round reads ONE thing back from the device: ``[n_accepted, next_token, drafts…,
error flags (``RoundErrors``)]``, in a single copy. Everything else (drafting, verifying, the rule,
the NaN check) is queued on the device without waiting, so a GPU never idles on a
Python ``if``. The context lives on the host, where drafters and stop checks read it.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import weakref
from typing import NamedTuple

import torch

from . import kv
from .batched import batched_autoregressive_generate, batched_speculative_generate
from .drafters import (
    Drafter,
    ModelDrafter,
    check_draft_head,
    check_drafter_target,
    is_token_dtype,
    reset_drafter,
    to_device,
    wants_features,
)
from .models.shapes import head_rows, max_positions
from .result import GenerationResult, GenerationStats, PhaseClock, RoundRecorder, stop_reason, warn_caller
from .round import round_gamma, speculative_round
from .sampling import GenerationConfig, check_generator, logits_broken, nonfinite_logits_error, sample

__all__ = ["speculative_generate", "autoregressive_generate", "compiles_by_default"]


def validate_prompts(target, input_ids, attention_mask, generator):
    """Check the prompts (and the generator) against the target; return ids ``[B, n]`` and mask ``[B, n]`` on its device."""
    for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} is a {type(value).__name__}, not a torch tensor: pass torch.tensor([...]) or a "
                             "tokenizer's output with return_tensors='pt'.")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
        attention_mask = attention_mask[None] if attention_mask is not None and attention_mask.dim() == 1 else attention_mask
    if input_ids.dim() != 2 or input_ids.shape[-1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, n] LongTensor of token ids, got shape {tuple(input_ids.shape)}")
    if not is_token_dtype(input_ids.dtype):
        raise ValueError(f"input_ids of dtype {input_ids.dtype}: token ids are integers (a tokenizer's return_tensors='pt' "
                         "gives them as int64).")
    input_ids = input_ids.long()  # int32 ids (numpy, some tokenizers) would reach drafters that index with them
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}")
    elif not bool(attention_mask[:, -1].all()):
        raise ValueError("the prompts must be LEFT-padded (the last column real for every row): "
                         "use tokenizer(..., padding_side='left').")
    attention_mask = (attention_mask != 0).long()  # a bool or float mask too: positions are counted from it
    max_pos = max_positions(target)
    longest_prompt = int(attention_mask.sum(-1).max())
    if max_pos is not None and longest_prompt >= max_pos:
        raise ValueError(
            f"the prompt has {longest_prompt} tokens but the target handles at most {max_pos} positions "
            "(config.max_position_embeddings), and a new token needs one more: shorten the prompt."
        )
    embeddings = getattr(target, "get_input_embeddings", None)  # a wrapper may lack it: then the config's vocabulary
    rows = embeddings().num_embeddings if embeddings is not None else getattr(target.config, "vocab_size", None)
    low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()  # one read per call; padding too: it is embedded
    if rows is not None and (low < 0 or high >= rows):
        raise ValueError(
            f"input_ids hold token id {low if low < 0 else high}, but the target's embedding has rows 0..{rows - 1} "
            "only (on a GPU the lookup would stop the process): pad with tokenizer.pad_token_id, not a negative id, "
            "and after adding tokens to the tokenizer call model.resize_token_embeddings(len(tokenizer))."
        )
    check_generator(generator, target.device)
    return input_ids.to(target.device), attention_mask.to(target.device)


def as_drafter(draft, target, compile: bool = False, compile_options: dict | None = None, positions: int = 0) -> Drafter:
    """An HF model becomes a ModelDrafter, after checking that it can only propose token ids the target has.

    With ``compile`` the ModelDrafter is compiled too, on the draft model's shared static cache with room
    for ``positions`` (so the next call with this model reuses its compiled code)."""
    if not isinstance(draft, torch.nn.Module):
        if not hasattr(draft, "propose"):
            raise TypeError(f"draft must be a Hugging Face causal LM or a drafter with .propose(), got {type(draft).__name__}")
        return draft  # its check_target runs next (a ModelDrafter's checks its head, also as another's fallback)
    check_draft_head(head_rows(draft), target)  # before compiling: a draft that cannot serve the target costs nothing
    return model_drafter(draft, compile, compile_options, positions)


def model_drafter(draft, compile: bool = False, compile_options: dict | None = None, positions: int = 0) -> ModelDrafter:
    """A ModelDrafter of the model ``draft``; with ``compile``, compiled on its shared static cache with room for
    ``positions`` (eager where compiling fails: :func:`compiled_or_eager`). What a generation drafts with, and what
    ``course.measure`` times as the draft's step."""
    if compile:
        return compiled_or_eager(lambda: ModelDrafter(draft, max_cache_len=positions, compile=True,
                                                      compile_options=compile_options), lambda: ModelDrafter(draft), "draft")
    return ModelDrafter(draft)


# The oldest torch that compiles transformers 5.25's models: 2.6's dynamo stops at their output wrapper
# ("Unsupported: call_method GetAttrVariable(GetSetDescriptorVariable(), co_varnames) __contains__"), so every
# compiled cache fell back to eager there; 2.7.1 passes the whole test suite. pyproject.toml's floor.
OLDEST_TORCH = "2.7"


def old_torch_hint(version: str | None = None) -> str:
    """``"; torch X is older than OLDEST_TORCH, …: pip install -U torch"`` if the installed torch (or ``version``)
    is, else ``""``. Only an install that skipped pyproject.toml's floor (``--no-deps``, a pinned environment)
    meets it. A version string packaging cannot read gets no hint: the warning it joins must still be raised."""
    from packaging.version import InvalidVersion, Version

    version = str(torch.__version__) if version is None else version
    try:
        if Version(version).release >= Version(OLDEST_TORCH).release:
            return ""
    except InvalidVersion:
        return ""
    return (f"; torch {version} is older than {OLDEST_TORCH}, the oldest that compiles these models: "
            "pip install -U torch")


def compiled_or_eager(make_compiled, make_eager, role: str):
    """``make_compiled()``; if compiling fails there (dynamo, inductor or Triton raise when a compiled cache
    compiles its widths, e.g. Triton's bf16 below sm_80), ``make_eager()`` instead, with a one-line warning
    naming the cause (and the fix, where it is a torch older than ``OLDEST_TORCH``). The generation then runs
    that model eager: slower, same output."""
    try:
        return make_compiled()
    except Exception as exc:  # noqa: BLE001 (any compiler failure: the eager path needs no compiler)
        root, cause = kv.root_cause(exc)  # dynamo wraps the compiler's own error: name that one
        via = f"{type(exc).__name__} from " if root is not exc else ""
        del root  # it holds frames, and they the half-built cache: let it go before the eager path runs
        warn_caller(f"compiling the {role} failed ({via}{cause}), so the {role} runs eager{old_torch_hint()}.")
    return make_eager()  # outside the handler: the exception, and the half-built cache its frames hold, are gone


def propose_checked(drafter, context, gamma, to_probs, generator, device, vocab_size):
    """Ask the drafter for up to γ tokens and check what comes back.

    Shapes are checked here, on the host. Values (is q a distribution? did the drafter
    propose a token it gave q = 0?) are checked on the device and returned as flags
    ``[2]`` (``RoundErrors``' last two) that the round reads together with its decision,
    so checking costs no sync.
    Returns drafts ``[γ']``, q ``[γ', V]`` (zero-padded to the target's V) and those flags ``[2]``, on ``device``.
    """
    drafts, q = drafter.propose(context, gamma, to_probs, generator)
    name = type(drafter).__name__
    if not is_token_dtype(drafts.dtype):
        raise ValueError(f"{name}.propose returned token ids of dtype {drafts.dtype}: token ids are integers, "
                         "return a LongTensor (e.g. tokens.long(), or sample with torch.multinomial).")
    drafts = drafts.long()
    if drafts.dim() != 1 or q.dim() != 2 or len(drafts) != q.shape[0]:
        raise ValueError(f"{name}.propose must return tokens [γ'] and q [γ', V'] with one q row per token; "
                         f"got tokens {tuple(drafts.shape)} and q {tuple(q.shape)}.")
    if len(drafts) > gamma:
        raise ValueError(f"{name}.propose returned {len(drafts)} tokens but was asked for at most γ = {gamma}: "
                         "return tokens[:gamma] (the round's γ may be smaller than the one you set, near the limits).")
    if q.shape[-1] > vocab_size:
        raise ValueError(f"{name}.propose returned q over {q.shape[-1]} token ids but the target has only {vocab_size}: "
                         f"return q with at most {vocab_size} columns, one per target token id (q = 0 is implied for "
                         "the ids after its last column).")
    drafts, q = to_device(drafts, device), torch.nn.functional.pad(to_device(q, device), (0, vocab_size - q.shape[-1]))
    in_range = (drafts >= 0) & (drafts < vocab_size)
    q_x = q.gather(1, drafts.clamp(0, vocab_size - 1)[:, None])[:, 0]
    not_a_distribution = ~torch.isfinite(q).all() | (q < 0).any() | ((q.sum(-1) - 1).abs() > 1e-3).any()
    unsupported = ~in_range.all() | (q_x <= 0).any()
    # Tokens drawn from q come from q / Σq (sampling normalises): the rule must divide by that too, or a q that sums
    # to 1 ± 1e-3, which the check lets through, would move the output off p by as much (2.6e-4 in total variation).
    total = q.sum(-1, keepdim=True)
    q = q / torch.where(total > 0, total, torch.ones_like(total))  # a row of zeros stays one (and is flagged above)
    # An id outside the vocabulary would crash the verify forward before the flag is read (on a GPU,
    # fatally): feed a clamped id instead; the round then raises on the flag.
    return drafts.clamp(0, vocab_size - 1), q, torch.stack([not_a_distribution, unsupported])


class RoundErrors(NamedTuple):
    """The round's error flags (0 or 1), computed on the device and read with its decision, in this order."""

    logits_not_finite: int  # the target's verify logits hold NaN or +inf, or a row of only −inf (sampling.logits_broken)
    q_not_a_distribution: int  # the drafter's q: NaN/inf, negative, or rows that do not sum to 1
    token_outside_q: int  # a draft the drafter gave q = 0, or an id outside the vocabulary


def raise_for_errors(errors: RoundErrors, drafter) -> None:
    """Turn the round's error flags into errors that name the fix."""
    if errors.logits_not_finite:
        raise nonfinite_logits_error("target")
    if errors.q_not_a_distribution:
        if isinstance(drafter, ModelDrafter):  # its q is to_probs(the draft model's logits): only NaN/inf logits break it
            raise nonfinite_logits_error("draft model")
        raise ValueError(f"{type(drafter).__name__}.propose returned a q that is not a probability distribution "
                         "(NaN/inf, negative, or rows that do not sum to 1): return the probabilities the tokens were "
                         "sampled from, e.g. to_probs(logits); if it drafts with a model, that model's logits may have "
                         "overflowed (NaN/inf: run it in float32).")
    if errors.token_outside_q:
        raise ValueError(f"{type(drafter).__name__}.propose returned a token outside its q's support (q(x) = 0 or an id "
                         "outside the vocabulary): q must be the distribution each token was actually drawn from.")


def target_logits_and_features(target, ids, cache, with_features: bool, logits_to_keep: int = 0):
    """Run the target on ``ids [1, n]`` after what ``cache`` holds: logits ``[k, V]`` for the last k =
    ``logits_to_keep`` positions (0: all n) and, for drafters that draft from the target's own features
    (EAGLE, Medusa), its last hidden states ``[n, d]`` (the input of ``lm_head``). For those we run the
    decoder and the head separately."""
    if not with_features:
        keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}  # verify: the model's own default (all)
        return kv.forward_cached(target, ids, cache, **keep).logits[0], None
    hidden = kv.forward_cached(target.get_decoder(), ids, cache).last_hidden_state[0]
    return target.get_output_embeddings()(hidden[-logits_to_keep:]), hidden


_HEAD_GIVES_LOGITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # models already checked (a memo)


@torch.no_grad()
def check_head_gives_the_logits(target) -> None:
    """Raise ``ValueError`` unless ``lm_head(last hidden state)`` is the target's own logits.

    A drafter that reads the target's features makes the loop run the decoder and ``lm_head`` apart
    (``target_logits_and_features``), so p is computed from the head's output. Some models transform their logits
    after the head (Gemma 2 and 3 soft-cap them, Granite and Cohere scale them): there that p is not the target's,
    and sampled output would not follow the target (greedy would, as those transforms keep the argmax). One short
    forward per model compares the two, whatever the model family.
    """
    if target in _HEAD_GIVES_LOGITS:
        return
    ids = torch.arange(1, 5, device=target.device)[None] % head_rows(target)  # [1, 4]: any tokens will do
    own = target(input_ids=ids).logits[0, -1].float()
    via_head = target.get_output_embeddings()(target.get_decoder()(input_ids=ids).last_hidden_state[0, -1]).float()
    if not torch.allclose(own, via_head, rtol=1e-2, atol=1e-2 * float(own.abs().max())):
        raise ValueError(f"{type(target).__name__} changes its logits after lm_head (e.g. soft-capping or scaling), so a "
                         "drafter that reads its features would get the wrong p and sampled output would not follow the "
                         "target: use a draft model or PromptLookupDrafter with this target.")
    _HEAD_GIVES_LOGITS[target] = True


def target_cache(target, compile: bool, compile_options: dict | None, positions: int):
    """An empty KV cache for the target, with room for ``positions``: a ``DynamicCache`` (eager), or the
    target's shared compiled static cache (``kv.shared_static_cache``: every compiled generation reuses
    it, so each input width compiles once, not once per prompt). If compiling fails, a ``DynamicCache``
    and a warning (``compiled_or_eager``)."""
    if not compile:
        return kv.new_cache(target)
    return compiled_or_eager(lambda: kv.shared_static_cache(target, positions, compile_options),
                             lambda: kv.new_cache(target), "target")


def compiles_by_default(device) -> bool:
    """What ``compile=None`` (the default) means on ``device``: compile, or run eager?

    ``$SPECDEC_EDU_COMPILE`` decides when set (``1``: compile, ``0``: eager, ``inductor``: on CUDA, compile with
    inductor and CUDA graphs instead of the default, see ``kv.full_compile_options``; eager elsewhere). Otherwise:
    compile on CUDA, where CUDA graphs took the SmolLM2-1.7B-shaped step from 14.1 ms to 2.43 ms with inductor
    (H200, run 4 in ``assets/results/gpu_h200_2026-11-30``) and to 3.56 ms recorded without a compiler (the
    default there, ``kv.CAPTURE``: first token in 14 s, not 176 s, under two CPUs); run eager elsewhere. On this
    course's 2-core CPU the compiled path ran speculative decoding 1.09× as fast as eager
    (``assets/results/bench_cpu_compiled.json``), but compiling the embedded pair took 2–3 minutes from a
    cold cache, in every new process (``compile_cost_cpu.json``), and needs a C++ compiler; MPS is untested.
    """
    chosen = os.environ.get("SPECDEC_EDU_COMPILE", "").strip()
    if chosen not in ("", "0", "1", "inductor"):
        raise ValueError(f"SPECDEC_EDU_COMPILE={chosen!r}: set it to 1 (compile), 0 (eager) or inductor (on CUDA, "
                         "inductor's code with CUDA graphs), or unset it.")
    if chosen in ("0", "1"):
        return chosen == "1"
    return torch.device(device).type == "cuda"  # unset, or inductor (a CUDA choice): compile on CUDA only


#: Why a drafter that reads the target's hidden states runs eager (``resolve_compile``'s ``eager_reason``).
FEATURES_EAGER = "the target's features (for this drafter) are not compiled"


def resolve_compile(compile: bool | None, device, eager_reason: str | None) -> bool:
    """Whether this call compiles. ``None``: as ``compiles_by_default`` says, wherever it can (a batch, or
    a drafter that reads the target's features, quietly runs eager). ``True``: compile, unless
    ``eager_reason`` says why this call cannot; then it runs eager and says so, in one line: never an error."""
    if compile is None:
        return compiles_by_default(device) and not eager_reason
    if compile and eager_reason:
        warn_caller(f"compile=True: {eager_reason}, so this call runs eager.")
    return bool(compile) and not eager_reason


class OnePrompt:
    """The single-prompt side of a round (see ``round.Loop``): a drafter, the target's KV cache,
    and the context on the host.

    Invariant between rounds: the target's cache holds ``context`` except its newest token,
    ``newest`` (on the device), which the next verify pass feeds first.
    """

    def __init__(self, target, drafter, prompt: torch.Tensor, config: GenerationConfig, generator, cache):
        self.target, self.drafter, self.config, self.generator = target, drafter, config, generator
        self.device, self.vocab_size = prompt.device, head_rows(target)
        # A drafter with observe(features) is shown the target's hidden state at every position the
        # target's cache keeps: the prompt (prefill), then [newest] + accepted drafts after each round.
        self.with_features = wants_features(drafter)
        if self.with_features:
            check_head_gives_the_logits(target)
        self.cache = cache  # empty: from target_cache
        self.prompt, self.context, self.newest = prompt, prompt.cpu(), prompt[-1:]  # context: on the host

    def prefill(self) -> None:
        """The target reads the prompt but its last token (which the first verify pass feeds)."""
        if len(self.prompt) > 1:
            # No round reads the prefill's logits: keep one row (not one per prompt token: 2k × a 152k vocabulary is 1 GB)
            _, features = target_logits_and_features(self.target, self.prompt[None, :-1], self.cache, self.with_features,
                                                         logits_to_keep=1)
            if self.with_features:
                self.drafter.observe(features)

    def draft(self, gamma_round: int):
        """Up to γ drafts ``[γ']`` and q ``[γ', V]`` from the drafter (none when γ = 0), checked."""
        if gamma_round == 0:
            self.q_flags = torch.zeros(2, dtype=torch.bool, device=self.device)
            return self.newest[:0], torch.zeros(0, self.vocab_size, device=self.device)
        drafts, q, self.q_flags = propose_checked(self.drafter, self.context, gamma_round, self.config.to_probs,
                                                  self.generator, self.device, self.vocab_size)
        return drafts, q

    def verify(self, drafts: torch.Tensor) -> torch.Tensor:
        """Logits ``[γ'+1, V]`` from one target forward over ``[newest] + drafts``."""
        logits, self.features = target_logits_and_features(self.target, torch.cat([self.newest, drafts])[None], self.cache,
                                                           self.with_features)
        return logits

    def read_and_check(self, decision: torch.Tensor, drafts: torch.Tensor, logits: torch.Tensor):
        """One copy to the host: the decision, the drafts and the error flags; raises on a flag."""
        flags = torch.cat([logits_broken(logits).view(1), self.q_flags]).long()  # [3], in RoundErrors' order
        n, next_token, *drafts_and_flags = torch.cat([decision, drafts, flags]).tolist()
        raise_for_errors(RoundErrors(*drafts_and_flags[len(drafts):]), self.drafter)
        self.n_drafted, self.n_accepted = len(drafts), n  # host ints, for roll_back's crop
        return drafts_and_flags[: len(drafts)], n, next_token

    def roll_back(self, decision: torch.Tensor) -> None:
        """Crop the target's cache to ``[newest, x_1..x_n]``: all but the new last token."""
        n = self.n_accepted
        kv.crop(self.cache, self.n_drafted - n)
        if self.with_features:
            self.drafter.observe(self.features[: n + 1])  # [n+1, d]: the positions the cache kept
        self.newest = decision[1:]

    def emit(self, new: list[int]) -> None:
        """Append the round's emitted tokens to the host context."""
        self.context = torch.cat([self.context, torch.tensor(new, dtype=torch.long)])


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
    compile=None,
    compile_options=None,
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
        generator: ``torch.Generator`` on the target's device, for reproducible sampling. Greedy runs use it too,
            for the drafter's draws (a drafter may sample from a q that is not one-hot, as the dial does); a greedy
            run without one draws from torch's global RNG and then puts it back where it was.
        eos_token_id: int or list of ints; generation stops right after it, as ``generate`` does. Default ``None``:
            no stop but ``max_new_tokens`` (unlike ``generate``, the model's own EOS is not read: pass
            ``tok.eos_token_id`` for a chat answer that ends where the model ends it).
        accept_fn: the verification rule, ``(p, q, drafts, generator) -> (n, next_token)``;
            swap in a broken one from ``specdec_edu.course.controls`` to watch the exactness tests fail.
            Default: the rule itself (``verify_drafts``; ``greedy_verify`` when greedy).
        profile: wait for the device at every phase of a round, so that ``stats.phase_seconds``
            and the draft/verify times are exact on a GPU (slower there; free on a CPU).
        compile: run every forward through fixed-shape code on static caches (``kv.forward_compiled``;
            on CUDA, CUDA graphs recorded from the eager forward, ``kv.CAPTURE``): the target's (prefill,
            verify of every width γ' + 1) and, when ``draft`` is a model, the draft's (a compiled ``ModelDrafter``); same output.
            ``None`` (default): compiled on CUDA, eager elsewhere, or as ``$SPECDEC_EDU_COMPILE``
            says (``compiles_by_default``). The first compiled call with a model compiles all its
            input widths (seconds to minutes) before the clock starts, so ``stats`` never include
            it; later calls reuse them. A batch, or a drafter that reads the target's features,
            runs eager (with a warning if you passed ``compile=True``).
        compile_options: keyword arguments for ``torch.compile`` (default on CUDA:
            ``{"backend": "capture"}``, CUDA graphs without a compiler; ``{"mode": "reduce-overhead"}``:
            inductor with CUDA graphs); see ``kv.full_compile_options``.

    Generation stops at EOS, at ``max_new_tokens``, or when the sequence fills the target's
    ``max_position_embeddings``; ``result.stats.stopped_by`` says which. What each timer in
    ``result.stats`` measures is in ``GenerationStats``'s docstring.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 1:
        raise ValueError(f"gamma={gamma!r}: draft a whole number of tokens per round, at least 1 (typical values: 3–8).")
    gamma = int(gamma)  # a numpy integer (a sweep's np.arange) works too
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                              top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    ids, mask = validate_prompts(target, input_ids, attention_mask, generator)
    # greedy without a generator: the output needs no draw, but a drafter may draw (from torch's global RNG, then):
    # put the global RNG back afterwards, so the caller's stream is where it was
    with global_rng_put_back(ids.device, generator is None and not do_sample):
        return _speculative(target, draft, ids, mask, config, gamma, generator, accept_fn, profile, compile,
                            compile_options)


@contextlib.contextmanager
def global_rng_put_back(device: torch.device, put_back: bool):
    """Inside, draws from torch's global RNG (the CPU's, and ``device``'s on CUDA) are as usual; after, the RNG is where
    it was before (``torch.random.fork_rng``), when ``put_back``."""
    if not put_back:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield


def _speculative(target, draft, ids, mask, config: GenerationConfig, gamma: int, generator, accept_fn, profile, compile,
                 compile_options) -> GenerationResult:
    """``speculative_generate`` after its checks: ``ids`` ``[B, n]`` and ``mask`` validated, ``config`` built."""
    max_new_tokens = config.max_new_tokens
    positions = ids.shape[1] + max_new_tokens + gamma  # what a cache must hold: prompt, output, the last round's drafts
    compile = resolve_compile(compile, ids.device, "only single prompts are compiled, not batches" if ids.shape[0] > 1 else
                              FEATURES_EAGER if wants_features(draft) else None)
    drafter = as_drafter(draft, target, compile, compile_options, positions)
    check_drafter_target(drafter, target)
    if ids.shape[0] > 1:
        return batched_speculative_generate(target, drafter, ids, mask, config, gamma=gamma, generator=generator,
                                            accept_fn=accept_fn, profile=profile)
    reset_drafter(drafter)  # a new generation: no draft cache or γ schedule carried over from the last one
    prompt = ids[0][mask[0].bool()]  # one row: just drop its padding
    cache = target_cache(target, compile, compile_options, positions)  # compiling (once per model) happens before the clock
    max_pos, clock = max_positions(target), PhaseClock(prompt.device, profile)
    loop = OnePrompt(target, drafter, prompt, config, generator, cache)
    row = RoundRecorder(len(prompt), max_new_tokens=max_new_tokens, eos=config.eos, max_pos=max_pos, clock=clock)
    row.stats.compiled = isinstance(cache, kv.StaticKV)  # False if compiling failed and the target runs eager
    row.stats.draft_compiled = isinstance(drafter, ModelDrafter) and drafter.static is not None  # its compile can fail alone
    loop.prefill()
    row.stats.prefill_seconds = clock.lap()
    while not row.stats.stopped_by:
        drafts, n, next_token, phases = speculative_round(loop, round_gamma(gamma, [row]), config, accept_fn, generator, clock)
        loop.emit(row.add(drafts, n, next_token, phases))
    return GenerationResult(ids, [row.tokens], pad_token_id=config.pad_token_id, stats=row.stats, row_stats=[row.stats],
                            token_sources=[row.sources])  # the prompt as given: left padding kept, as for a batch


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
    compile=None,
    compile_options=None,
) -> GenerationResult:
    """The baseline: one target forward per token, same sampling code as ``speculative_generate``.

    ``compile``/``compile_options``: as in ``speculative_generate`` (compiled prefill and one-token
    steps on a static cache; by default on CUDA only), so that the baseline is as fast as the
    speculative run it is compared with."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                              top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    ids, mask = validate_prompts(target, input_ids, attention_mask, generator)
    compile = resolve_compile(compile, ids.device, "only single prompts are compiled, not batches" if ids.shape[0] > 1 else None)
    if ids.shape[0] > 1:
        return batched_autoregressive_generate(target, ids, mask, config, generator=generator)
    prompt = ids[0][mask[0].bool()]
    cache = target_cache(target, compile, compile_options, len(prompt) + max_new_tokens)  # compiles before the clock
    stats = GenerationStats(compiled=isinstance(cache, kv.StaticKV))  # False if compiling failed
    max_pos, clock, eos = max_positions(target), PhaseClock(prompt.device, False), config.eos
    new: list[int] = []
    logits = kv.forward_cached(target, prompt[None], cache, logits_to_keep=1).logits[0, -1]  # prefill → first next-token logits
    while True:
        token = logits.argmax() if not do_sample else sample(config.to_probs(logits), generator)
        token_id, broken = torch.stack([token, logits_broken(logits).long()]).tolist()  # one sync per token
        if broken:
            raise nonfinite_logits_error("target")
        new.append(token_id)
        if not stats.rounds:  # the prefill's forward made the first token
            stats.prefill_seconds = clock.lap()
        stats.stopped_by = stop_reason(len(new), len(prompt) + len(new), token_id in eos, max_new_tokens, max_pos)
        if stats.stopped_by:
            break
        logits = kv.forward_cached(target, token.view(1, 1), cache).logits[0, -1]  # one forward, one new token
        stats.rounds += 1
        stats.tokens_per_round.append(1)
        stats.verify_seconds += clock.lap()
    stats.verify_seconds += clock.lap()  # the last token's sampling and read
    stats.new_tokens = len(new)
    stats.seconds = clock.elapsed()
    return GenerationResult(ids, [new], pad_token_id=pad_token_id, stats=stats, row_stats=[stats],
                            token_sources=[["target"] * len(new)])  # the prompt as given, as above
