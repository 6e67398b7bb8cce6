"""Experiment helpers for notebooks 06–10: drafters built for controlled experiments, a
dynamic-γ wrapper and an interleaved benchmark.

Every drafter here speaks the protocol of :mod:`specdec_edu.drafters`::

    propose(context, gamma, to_probs, generator) -> (tokens [γ'], q [γ', V'])

so ``speculative_generate`` stays exact with any of them: whatever q a drafter
reports, the accept/resample rule turns it into the target's distribution. The
drafters only change *how often* drafts are accepted and how much drafting costs.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Callable

import torch

from ..drafters import ModelDrafter, common_prefix_length, pass_hooks_through, reset_drafter, tell_drafted_elsewhere
from ..generate import speculative_generate
from ..result import sync, warn_caller
from ..sampling import logits_to_probs, sample

__all__ = [
    "course_seed",
    "quick_run",
    "MixtureDrafter",
    "ReplayDrafter",
    "settled_reference",
    "DynamicGammaDrafter",
    "early_exit_model",
    "interleaved_benchmark",
    "timed",
]


SEED_VARIABLE = "SPECDEC_EDU_SEED"


def course_seed(default: int = 0) -> int:
    """The seed a notebook uses: ``$SPECDEC_EDU_SEED`` when set, else ``default``.

    A notebook's committed outputs come from its default seed. Re-running it with another seed
    (``SPECDEC_EDU_SEED=1 python scripts/execute_notebooks.py ...``) tells a claim that holds from one that held by
    the luck of one draw: every check in the prose should survive both.
    """
    value = os.environ.get(SEED_VARIABLE, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE}={value!r} is not an integer; set it to a whole number or unset it") from None


QUICK_VARIABLE = "SPECDEC_EDU_QUICK"


def quick_run() -> bool:
    """Whether a notebook runs its quick settings: ``$SPECDEC_EDU_QUICK=1``, which ``tests/conftest.py`` sets.

    Quick settings are the same cells on fewer samples, repeats or tokens, so that the test suite executes every
    notebook in minutes; the committed outputs come from the full settings (unset, or ``0``). Any other value is
    refused rather than guessed.
    """
    value = os.environ.get(QUICK_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{QUICK_VARIABLE}={value!r}: set it to 1 (quick settings) or 0 / unset (full settings)")
    return value == "1"


def _mix(probs: torch.Tensor, noise: float) -> torch.Tensor:
    """``(1 − noise)·probs + noise·uniform`` over the last axis."""
    return (1 - noise) * probs + noise / probs.shape[-1]


class MixtureDrafter:
    """A drafter whose agreement with the target is a dial: q = (1 − noise)·p_model + noise·uniform.

    ``model`` is usually the *target itself*, so ``noise = 0`` drafts exactly p
    (α = 1) and ``noise = 1`` drafts uniformly random tokens (α = 1 − TV(p, uniform): near 0
    where p is peaked, as in greedy decoding, not for a flat p). In between,
    the expected acceptance at each position is Σ min(p, q) = 1 − noise·TV(p, uniform);
    for greedy decoding (p one-hot) that is 1 − noise + noise/V ≈ 1 − noise.

    Drafting costs one forward of ``model`` per token (with a KV cache), so with the
    target as ``model`` the draft is as expensive as the target: use it to study α,
    and :class:`ReplayDrafter` to study wall-clock time.
    """

    def __init__(self, model: torch.nn.Module, noise: float):
        if not 0 <= noise <= 1:
            raise ValueError(f"noise={noise} must lie in [0, 1]")
        self.noise = noise
        self._inner = ModelDrafter(model)
        pass_hooks_through(self, self._inner)  # check_target: a draft model with more token ids than the target

    def reset(self) -> None:
        self._inner.reset()

    def drafted_elsewhere(self) -> None:
        tell_drafted_elsewhere(self._inner)

    def propose(self, context, gamma, to_probs, generator=None):
        # The model drafter samples from whatever ``to_probs`` returns: hand it the mixture.
        mixed = lambda logits: _mix(to_probs(logits), self.noise)
        return self._inner.propose(context, gamma, mixed, generator)


def dial_q(truth: torch.Tensor, noise: float, vocab_size: int) -> torch.Tensor:
    """q ``[γ', V]`` = (1 − noise)·one_hot(truth) + noise·uniform, built on ``truth``'s device (``truth``: ids ``[γ']``)."""
    q = torch.full((len(truth), vocab_size), noise / vocab_size, device=truth.device)
    return q.scatter_(1, truth[:, None], 1 - noise + noise / vocab_size)


class ReplayDrafter:
    """A nearly free dial-α drafter for *greedy* decoding, with an optional simulated cost.

    ``reference`` is the target's own greedy output for the prompt (``[n]`` ids, the
    prompt included), computed once. Under greedy decoding every accepted context is a
    prefix of it, so the target's next-token distribution p is one-hot at the next
    reference token; the drafter samples from q = (1 − noise)·p + noise·uniform,
    which is accepted with probability α = 1 − noise + noise/V per position.

    q and the draws stay on ``device`` (default: the reference's; give it the target's):
    the reference is kept there once, so a round builds q ``[γ, V]`` and samples from it
    without copying anything from the host. A host copy of the reference is what the
    loop's host context is compared with, so the check costs no device sync either.

    ``seconds_per_token`` sleeps that long per drafted token, to emulate a draft model
    of cost c = seconds_per_token / t_target. ``cost_model`` instead pays a *real* draft
    model's cost: a drafter (e.g. a compiled ``ModelDrafter``), or a model, wrapped in the
    :class:`ModelDrafter` that ``speculative_generate`` would give it: compiled where the
    run compiles (``compile=None``: as ``compiles_by_default`` says for the model's device,
    so on a GPU the dial pays a compiled draft's cost, like the real run; eager on a CPU).
    It drafts as it would (same forwards, same cache rollbacks) and its tokens
    are thrown away, so c is that drafter's measured cost while α stays the dial's (how
    ``scripts/gpu_check.py`` gets a known α from random-weight models).
    If the context ever leaves the reference (possible only through floating-point ties: in bf16/fp16 the
    verify pass can flip a near-tie that the reference's one-token steps did not), the drafter proposes nothing
    from then on and the target decodes alone: still exact, but τ and the speedup then understate the dial's α.
    It says so once per generation (a warning naming the token), and ``left_at`` keeps that token's index among
    the context (``None`` while the context follows the reference). :func:`settled_reference` gives a reference
    that a given run keeps to the end.
    """

    def __init__(self, reference: torch.Tensor, noise: float, vocab_size: int, seconds_per_token: float = 0.0,
                 cost_model=None, device: torch.device | str | None = None, compile: bool | None = None,
                 compile_options: dict | None = None):
        if not 0 <= noise <= 1:
            raise ValueError(f"noise={noise} must lie in [0, 1]")
        self.device = torch.device(device) if device is not None else reference.device
        self.reference = reference.flatten().to(self.device)  # [n]: q is built from it, on the device
        self._reference_host = reference.flatten().cpu()  # [n]: compared with the loop's host context
        self.noise, self.vocab_size, self.seconds_per_token = noise, vocab_size, seconds_per_token
        self._cost, self.left_at = cost_model, None
        # The cost model's draws are thrown away, but they still need random numbers: from a generator of its own,
        # never from (and moving) the global RNG, nor from the run's (which would change the run's own draws).
        cost_device = cost_model.device if isinstance(cost_model, torch.nn.Module) else getattr(
            getattr(cost_model, "model", None), "device", self.device)
        self._cost_generator = torch.Generator(device=cost_device).manual_seed(0) if cost_model is not None else None
        if isinstance(cost_model, torch.nn.Module):  # a bare model: the drafter the real run would make of it
            from ..generate import as_drafter, resolve_compile

            compiled = resolve_compile(compile, cost_model.device, None)
            # the cost model is its own "target" here: as_drafter only checks that its head fits
            self._cost = as_drafter(cost_model, cost_model, compiled, compile_options, positions=len(self._reference_host) + 16)

    def reset(self) -> None:
        self.left_at = None
        if self._cost is not None:
            self._cost.reset()

    @property
    def alpha(self) -> float:
        """The acceptance probability per position this drafter is built to have."""
        return 1 - self.noise + self.noise / self.vocab_size

    def propose(self, context, gamma, to_probs=None, generator=None):
        """Up to γ tokens ``[γ']`` after ``context`` ``[n]`` (host) and their q ``[γ', V]``, both on ``self.device``."""
        n = len(context)
        if n < len(self._reference_host) and not torch.equal(self._reference_host[:n], context):
            self._left_the_reference(context)
        if n >= len(self._reference_host) or self.left_at is not None:
            return torch.empty(0, dtype=torch.long, device=self.device), torch.zeros(0, self.vocab_size, device=self.device)
        q = dial_q(self.reference[n : n + gamma], self.noise, self.vocab_size)  # a slice of a device tensor: no copy
        tokens = sample(q, generator)  # [γ']: one draw per row, where q is
        if self.seconds_per_token > 0:
            time.sleep(self.seconds_per_token * len(tokens))
        if self._cost is not None:  # the real draft model's forwards; its own guesses are discarded
            # no finiteness check: it reads the device once per draft, which the real drafting loop does not
            greedy = lambda logits: logits_to_probs(logits, temperature=0, check_finite=False)  # noqa: E731
            self._cost.propose(context, len(tokens), greedy, self._cost_generator)
        return tokens, q

    def _left_the_reference(self, context: torch.Tensor) -> None:
        """Note (and say, once per generation) where ``context`` [n] (host) first differs from the reference."""
        if self.left_at is None:
            self.left_at = int((context != self._reference_host[: len(context)]).nonzero()[0])
            warn_caller(f"ReplayDrafter: the context left the reference at token {self.left_at} (in 16 bit, a "
                        "near-tie that the verify pass flipped; or a prompt that is not the reference's): the target "
                        "decodes the rest of this generation alone, so its τ and speedup understate the dial's α. "
                        "Settle the reference first (settled_reference), shorten the answer or run in float32.")


def settled_reference(target, reference: torch.Tensor, prompt_length: int, gamma: int, *, noise: float = 0.0,
                      seed: int = 0, wrap: Callable | None = None, max_replays: int = 8,
                      **generate_kwargs) -> tuple[torch.Tensor, int]:
    """The reference a dial run keeps to the end: ``(reference [n], replays)``.

    ``reference`` ``[n]`` is the target's greedy output (prompt included, its first ``prompt_length`` ids), made with
    one-token steps. Speculative decoding judges each token in a (γ+1)-token verify forward instead, and in bf16 or
    fp16 that forward can round a near-tie otherwise: the context then leaves the reference, and a
    :class:`ReplayDrafter` proposes nothing for the rest of the generation (the run measures target-only decoding, as
    on the H200 in ``assets/results/gpu_h200_2026-12-04_lease2``). Which way such a tie goes also depends on where the
    token sits in its forward and how its context's K/V were computed, so it is settled by the run itself:

    run the dial (``noise``, γ, its draws from a generator seeded ``seed``); where it leaves its reference, make the
    run's output the reference and run again. The second run is the first one up to that token (same draws, same
    forwards), and now keeps it; a later token may part, and the next replay moves past it too, until a run keeps its
    reference to the end. In float32 the first run does (``replays == 1``). The measured runs must then draw from a
    generator seeded ``seed`` on the target's device, at the same ``noise`` and γ, on the same path
    (``generate_kwargs``, for ``speculative_generate``: ``compile``, ``compile_options``, ``eos_token_id``), with the
    same drafter around the dial, if any (``wrap``: e.g. ``lambda dial: DynamicGammaDrafter(dial, start=4)``). After
    ``max_replays`` runs that all left it, it warns and returns the last output.
    """
    device = next(target.parameters()).device
    reference = reference.flatten().to(device)
    prompt = reference[:prompt_length][None]
    for replays in range(1, max_replays + 1):
        dial = ReplayDrafter(reference, noise, target.config.vocab_size)
        with warnings.catch_warnings():  # leaving the reference is what a replay is for: said below, if it lasts
            warnings.filterwarnings("ignore", message="ReplayDrafter: the context left the reference")
            out = speculative_generate(target, wrap(dial) if wrap else dial, prompt,
                                       max_new_tokens=len(reference) - prompt_length,
                                       gamma=gamma, generator=torch.Generator(device).manual_seed(seed), **generate_kwargs)
        if dial.left_at is None:
            return reference, replays
        reference = out.sequences[0]
    warn_caller(f"settled_reference: all {max_replays} runs left their reference; the dial replays the last output "
                "and may still leave it (its warning says where).")
    return reference, max_replays


class DynamicGammaDrafter:
    """Adapt γ from round to round, like Hugging Face's ``num_assistant_tokens_schedule="heuristic"``.

    After a round where every draft was accepted, γ grows by ``grow``; after a
    rejection it shrinks by ``shrink`` (never below ``min_gamma``). The ``gamma``
    passed to ``speculative_generate`` is the ceiling: γ never grows past it. The wrapper learns each
    round's outcome from the next context: the drafts it proposed are all there
    exactly when the round accepted all of them.

    ``history`` lists the γ asked of the wrapped drafter in each round of the current
    generation: the rule's state. A drafter may return fewer tokens (prompt lookup
    without a match returns none); what was drafted is in ``stats.drafted_per_round``.
    The wrapped drafter's optional hooks pass through (``drafters.pass_hooks_through``).
    """

    def __init__(self, drafter, start: int = 5, grow: int = 2, shrink: int = 1, min_gamma: int = 1):
        if start < 1 or min_gamma < 1:
            raise ValueError("start and min_gamma must be >= 1")
        self.drafter, self.start, self.grow, self.shrink, self.min_gamma = drafter, start, grow, shrink, min_gamma
        pass_hooks_through(self, drafter)
        self.reset()

    def reset(self) -> None:
        """Start a new generation (also done automatically when the context does not extend the last one)."""
        self.gamma = self.start
        self.history: list[int] = []
        self._last_context: torch.Tensor | None = None
        self._last_drafts: torch.Tensor | None = None
        reset_drafter(self.drafter)

    def drafted_elsewhere(self) -> None:
        """The last round was another drafter's: the tokens the context grew by say nothing about our drafts."""
        self._last_drafts = None
        tell_drafted_elsewhere(self.drafter)

    def _update(self, context: torch.Tensor) -> None:
        last, drafts = self._last_context, self._last_drafts
        if last is None or len(context) <= len(last) or common_prefix_length(last, context[: len(last)]) < len(last):
            self.gamma, self.history = self.start, []  # a new prompt
            return
        if drafts is None or len(drafts) == 0:
            return
        kept = common_prefix_length(drafts.to(context.device), context[len(last) :])
        if kept == len(drafts):
            self.gamma += self.grow
        else:
            self.gamma = max(self.min_gamma, self.gamma - self.shrink)

    def propose(self, context, gamma, to_probs, generator=None):
        self._update(context)
        # the state never passes the ceiling: grown past it, the rounds would still ask for the ceiling while
        # rejections only walked the state back down towards it, so they changed nothing
        self.gamma = max(self.min_gamma, min(self.gamma, gamma))
        g = min(self.gamma, gamma)  # never more than this round allows (near the end γ may be cut below min_gamma)
        tokens, q = self.drafter.propose(context, g, to_probs, generator)
        self.history.append(g)  # the γ the rule chose, whatever the drafter could find
        self._last_context, self._last_drafts = context.clone(), tokens.clone()
        return tokens, q


def early_exit_model(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """A causal LM made of the first ``n_layers`` decoder layers of ``model`` plus its final norm and head.

    No weights are copied: the shallow model shares every module with ``model``. This is
    self-speculation by early exit, untrained: the head was only ever trained to read the
    *last* layer, so early layers' guesses are poor unless the model was trained for it
    (LayerSkip, Elhoushi et al. 2024). Works for Llama-style models (SmolLM2, Qwen2).
    """
    decoder = model.get_decoder()
    total = len(decoder.layers)
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers={n_layers} must lie in 1..{total}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[:n_layers])
    with torch.device("meta"):
        shallow = type(model)(config)
    inner = shallow.get_decoder()
    for name, child in decoder.named_children():
        setattr(inner, name, torch.nn.ModuleList(list(child)[:n_layers]) if name == "layers" else child)
    shallow.lm_head = model.get_output_embeddings()
    meta = [n for n, t in list(shallow.named_parameters()) + list(shallow.named_buffers()) if t.is_meta]
    if meta:
        raise RuntimeError(f"early_exit_model could not share these tensors: {meta}")
    return shallow.eval().requires_grad_(False)


def timed(fn: Callable[[], object], device: torch.device | str) -> tuple[object, float]:
    """``(fn(), seconds)``: wall time with ``device`` synced before and after, so that queued GPU work counts.
    ``device`` has no default: one that defaulted to the CPU timed a GPU's work by when it was queued."""
    device = torch.device(device)
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def interleaved_benchmark(fns: dict[str, Callable[[], object]], repeats: int = 3, warmup: int = 1, progress: bool = True):
    """Run the functions A, B, … in turn ``warmup + repeats`` times; return ``{name: [results]}``.

    Interleaving makes A and B share whatever the machine is doing at the moment,
    so their *ratio* is trustworthy even when absolute times drift. Warm-up rounds
    (caches, allocator, lazy initialisation) are dropped. Take medians of the results.
    The one benchmark loop of the package: ``python -m specdec_edu bench``, ``scripts/gpu_check.py``
    and the notebooks all run through it (wrap a function in :func:`timed` to get its seconds).
    """
    from tqdm.auto import tqdm

    if repeats < 1 or warmup < 0:  # no repeat would leave every list empty, and a median of nothing fails later
        raise ValueError(f"repeats={repeats}, warmup={warmup}: time each function at least once (repeats >= 1), "
                         "after warmup >= 0 untimed runs")
    results: dict[str, list] = {name: [] for name in fns}
    rounds = range(warmup + repeats)
    for i in tqdm(rounds, desc="benchmark", leave=False) if progress else rounds:
        for name, fn in fns.items():
            out = fn()
            if i >= warmup:
                results[name].append(out)
    return results
