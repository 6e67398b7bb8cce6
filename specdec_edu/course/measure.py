"""Timing helpers: how long does one forward pass take on *this* device?

A forward that appends n tokens to the KV cache walks over every weight once, whatever n
is, so for small n its time grows slowly. For a large model on a GPU that is because the
step is memory-bound (reading the weights dominates); for a small model on a CPU the
weight reads and a fixed per-forward overhead (thousands of small calls) share the step
(notebook 01 compares it with its memory floor, ``read_bandwidth``).
These helpers measure the curve with medians over repeats (machines are noisy; one
measurement is an anecdote); the draft/target cost ratio c is :func:`step_seconds`'s (the draft's one-token step
as its drafter takes it, ``role="draft"``, see :func:`_drafter_forward`, over the target's, timed in turns), or, from
runs, a speculative run's ``stats.draft_seconds_per_token`` divided by a
target-only run's ``stats.target_seconds_per_forward`` (a speculative run's is its verify pass, not one step).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial

import torch

from .. import kv
from ..result import sync


@torch.no_grad()
def forward_seconds(model, n_new: int, context_length: int = 64, repeats: int = 5, warmup: int = 1,
                    compile: bool = False, compile_options: dict | None = None, role: str = "target",
                    batch: int = 1) -> float:
    """Median wall time of one forward that appends ``n_new`` tokens to a cache of ``context_length``.

    The cache is built once; after each timed forward it is cropped back, so every
    repeat sees the same context length. ``compile=True`` times the compiled path that
    ``speculative_generate(..., compile=True)`` runs (the model's shared compiled static cache,
    ``n_new`` padded to a compiled width; the warm-up compiles): pass a generation's
    ``stats.compiled`` to time the forwards on the path that generation took. ``role``: whose
    compiled cache to time, ``"target"`` or ``"draft"`` (``kv.shared_static_cache``): time a draft
    model with ``role="draft"``: the step its ``ModelDrafter`` takes (its reduced head, if it has one), on the cache
    its generations compiled, not a second one compiled anew. ``batch`` rows append ``n_new`` tokens each, eager, as
    batched generation runs (for a draft: each row's logits for its next token, as batched drafting computes them).
    """
    if batch > 1 and compile:
        raise ValueError(f"batch={batch} with compile=True: batched generation runs eager, and so does its timing. "
                         "Pass compile=False.")
    forward = _appending_forward(model, context_length, n_new, compile, compile_options, role, batch)
    for _ in range(warmup):  # a shape's first forward allocates (and on the compiled path, compiles or records)
        forward(n_new)
    return statistics.median(_seconds(partial(forward, n_new), partial(sync, model.device)) for _ in range(repeats))


@torch.no_grad()
def step_seconds(target, draft, repeats: int = 5, context_length: int = 64, compile: bool = False,
                 compile_options: dict | None = None) -> tuple[float, float, float]:
    """(target step, draft step, c): one-token forwards of the target and of the draft (the step its drafter takes,
    ``role="draft"``), timed in interleaved sweeps, target, draft, target. c is the median over the sweeps of the draft
    time over the mean of that sweep's two target times; the steps are medians. Two medians timed one after the other
    (``forward_seconds`` twice) divide by a target step of another moment: on a shared machine the speed drifts."""
    target_forward = _appending_forward(target, context_length, 1, compile, compile_options)
    draft_forward = _appending_forward(draft, context_length, 1, compile, compile_options, role="draft")
    target_forward(1), draft_forward(1)  # warm-up: a shape's first forward allocates (compiled: compiles or records)
    wait = partial(sync, target.device)
    targets, drafts, ratios = [], [], []
    for _ in range(repeats):
        before = _seconds(partial(target_forward, 1), wait)
        drafts.append(_seconds(partial(draft_forward, 1), wait))
        after = _seconds(partial(target_forward, 1), wait)
        targets += [before, after]
        ratios.append(drafts[-1] / ((before + after) / 2))
    return statistics.median(targets), statistics.median(drafts), statistics.median(ratios)


def _seconds(work: Callable[[], object], wait: Callable[[], None], timer: Callable[[], float] | None = None) -> float:
    """Wall time of ``work()``: the one clock of this module's timers. ``wait`` waits for the device on both sides: a
    GPU runs queued work later, so the clock starts when earlier work is done and stops when this work is, not when
    it was launched. ``timer``: ``time.perf_counter``, looked up at the call (the tests replace it)."""
    timer = timer or time.perf_counter
    wait()
    start = timer()
    work()
    wait()
    return timer() - start


class VerifyCost:
    """t(n) / t(1), the cost of a forward appending n tokens in one-token steps, measured between the runs it serves.

    A curve timed once, before the runs, divides by a t(1) taken at another moment than its t(n), and of another
    moment than the runs: on a shared machine the speed drifts in between (notebook 07 once timed t(1) = 31 ms before
    its runs against 45 ms per step inside them, and every ratio came out inflated). So the forwards are timed in
    *sweeps*: one forward per n, t(1) first and again last, and each sweep's t(n) is divided by the mean of that
    sweep's two t(1). Call :meth:`sweep` between the runs (before each prompt, say); :meth:`ratios` is the median of
    the sweeps' ratios, so one sweep hit by a stall does not move it. At least 3 sweeps are required.

    ``compile=True`` times the compiled path, as :func:`forward_seconds` does. The first forward of each n runs
    once untimed when the object is made (caches, allocator, compilation).
    """

    MIN_SWEEPS = 3

    def __init__(self, model, ns: Iterable[int], context_length: int = 64, compile: bool = False,
                 compile_options: dict | None = None):
        self.ns = sorted(set(ns) | {1})
        device = model.device
        forward = _appending_forward(model, context_length, max(self.ns), compile, compile_options)
        self._init(forward, lambda: sync(device))

    @classmethod
    def from_forward(cls, forward: Callable[[int], None], ns: Iterable[int],
                     timer: Callable[[], float] = time.perf_counter) -> VerifyCost:
        """A calibration around any ``forward(n)``: for tests (a fake forward and clock) and for other models."""
        self = cls.__new__(cls)
        self.ns = sorted(set(ns) | {1})
        self._init(forward, lambda: None, timer)
        return self

    def _init(self, forward, wait, timer=None):
        self._forward, self._wait, self._timer = forward, wait, timer or time.perf_counter  # looked up when made
        self._restore = getattr(forward, "restore", lambda: None)  # the context back, if a generation moved it
        self.sweeps: list[dict[int, float]] = []  # one {n: t(n) / t(1)} per sweep
        for n in self.ns:  # warm-up, untimed
            forward(n)

    def _seconds(self, n: int) -> float:
        return _seconds(partial(self._forward, n), self._wait, self._timer)

    def sweep(self) -> dict[int, float]:
        """Time one forward per n (t(1) first and last) and keep this sweep's ratios; return them."""
        self._restore()  # untimed
        first = self._seconds(1)
        seconds = {n: self._seconds(n) for n in self.ns if n != 1}
        one = (first + self._seconds(1)) / 2
        ratios = {1: 1.0, **{n: t / one for n, t in seconds.items()}}
        self.sweeps.append(ratios)
        return ratios

    def ratios(self) -> dict[int, float]:
        """``{n: median over the sweeps of t(n) / t(1)}``; needs at least ``MIN_SWEEPS`` sweeps."""
        if len(self.sweeps) < self.MIN_SWEEPS:
            raise RuntimeError(f"{len(self.sweeps)} sweep(s) so far; call sweep() at least {self.MIN_SWEEPS} times, "
                               "between the runs it calibrates")
        return {n: statistics.median(s[n] for s in self.sweeps) for n in self.ns}


@torch.no_grad()
def _appending_forward(model, context_length: int, max_new: int, compile: bool, compile_options: dict | None,
                       role: str = "target", batch: int = 1):
    """``forward(n)``: one forward appending n tokens to each of ``batch`` rows of a ``context_length`` cache
    (``role``'s compiled one with ``compile``), cropped back after it."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (batch, context_length), generator=gen).to(model.device)
    new = torch.randint(0, vocab, (batch, max_new), generator=gen).to(model.device)
    if role == "draft" and batch > 1:
        return _batched_drafter_forward(model, context, new)
    if role == "draft":
        return _drafter_forward(model, context[0], new[0], compile, compile_options)
    if compile:  # where compiling fails (e.g. Triton on an old GPU), time the eager path, as the generation does
        from ..generate import compiled_or_eager

        cache = compiled_or_eager(lambda: kv.shared_static_cache(model, context_length + max_new, compile_options, role),
                                  lambda: kv.new_cache(model), role)
    else:
        cache = kv.new_cache(model)
    kv.forward_cached(model, context, cache, logits_to_keep=1)

    @torch.no_grad()
    def forward(n: int) -> None:
        kv.forward_cached(model, new[:, :n], cache)  # all n positions' logits, as a verify pass needs
        kv.crop(cache, n)

    @torch.no_grad()
    def restore() -> None:
        """The compiled cache is the one every compiled generation of this model rewinds and fills: after one, it
        holds that generation's tokens, not ``context_length`` of ours (a longer context makes every forward slower,
        and near ``max_len`` the next one would not fit). Rewind and put a context back. (Eager: a private cache.)"""
        if kv.cache_length(cache) != context_length:
            kv.crop(cache, kv.cache_length(cache))
            kv.forward_cached(model, context, cache, logits_to_keep=1)

    forward.restore = restore
    return forward


def _batched_drafter_forward(model, context: torch.Tensor, new: torch.Tensor):
    """``forward(n)`` for a draft model at batch B: the step batched drafting takes (``batched.draft_logits``: each
    row's logits for its next token, through the reduced head if the draft has one). ``context`` ``[B, L]``, ``new``
    ``[B, max_new]``."""
    from ..batched import draft_logits
    from ..generate import model_drafter

    drafter, cache = model_drafter(model), kv.new_cache(model)
    _, mask = draft_logits(drafter, cache, context[:, :0], context, torch.ones_like(context))

    @torch.no_grad()
    def forward(n: int) -> None:
        draft_logits(drafter, cache, mask, new[:, :n], torch.ones_like(new[:, :n]))
        kv.crop(cache, n)

    return forward


def _drafter_forward(model, context: torch.Tensor, new: torch.Tensor, compile: bool, compile_options: dict | None):
    """``forward(n)`` for a draft model: the step its ``ModelDrafter`` takes in a generation, not the model's own
    forward. The two differ: a draft with a reduced head (``config.draft_vocab_size``, as the embedded draft has) runs
    its bare decoder and the head's first rows only, on a compiled cache of its own, and the full forward timed
    instead read 2.4× the head weights (c came out about twice the run's on a 2-core CPU). ``context`` ``[n]``, ``new``
    ``[max_new]``."""
    from ..generate import model_drafter

    drafter = model_drafter(model, compile, compile_options, positions=len(context) + len(new))
    drafter.next_logits(context)

    @torch.no_grad()
    def forward(n: int) -> None:
        drafter.next_logits(new[:n])  # feeds n tokens, logits for the next one: what drafting one token costs (n = 1)
        kv.crop(drafter.cache, n)
        drafter.n_cached -= n

    return forward


def measured_verify_cost(model, n_new: int, sweeps: int = VerifyCost.MIN_SWEEPS, context_length: int = 64,
                         compile: bool = False, compile_options: dict | None = None) -> float:
    """t(n_new) / t(1) here, in one-token steps: the median of ``sweeps`` :class:`VerifyCost` sweeps, each dividing by
    its own t(1) timed just before and after. Two medians timed one after the other (``forward_seconds(model, n) /
    forward_seconds(model, 1)``) divide by a t(1) of another moment, and a machine whose speed drifts in between
    inflates or deflates the ratio."""
    cost = VerifyCost(model, [n_new], context_length, compile, compile_options)
    for _ in range(sweeps):
        cost.sweep()
    return cost.ratios()[n_new]


def latency_curve(model, ns=(1, 2, 4, 8, 16, 32, 64), context_length: int = 64, repeats: int = 5,
                  progress: bool = True) -> dict[int, float]:
    """``{n: median seconds}`` for eager forwards appending n tokens to a ``context_length`` cache: the latency curve.

    The widths take turns: each repeat times every n once, in order, instead of all of one n's repeats before the
    next n. A slow spell of a shared machine (another process, a clock change) then lands on every n alike, rather
    than lifting a few neighbouring points, and the curve's shape is what the lesson reads. Timed one width after
    another on a 2-core VM, a spell once put the 1-token point 20 ms above the step measured beside it, and 5
    tokens came out cheaper than 1.
    """
    from tqdm.auto import tqdm

    ns = list(ns)
    forward = _appending_forward(model, context_length, max(ns), compile=False, compile_options=None)
    for n in ns:  # warm-up: a shape's first forward allocates, and a CPU's matrix library picks its kernels
        forward(n)
    times, wait = {n: [] for n in ns}, partial(sync, model.device)
    rounds = tqdm(range(repeats), desc="forward latency", leave=False) if progress else range(repeats)
    for _ in rounds:
        for n in ns:
            times[n].append(_seconds(partial(forward, n), wait))
    return {n: statistics.median(t) for n, t in times.items()}


@torch.no_grad()
def read_bandwidth(device="cpu", n_bytes: int = 2**28, repeats: int = 5) -> float:
    """Bytes per second that a read-only reduction streams from memory: the rate behind a memory floor.

    A decoding step *reads* its weights and writes almost nothing, so its memory floor is weight bytes ÷
    this rate. ``torch.sum`` over ``n_bytes`` of float32 reads every byte once and writes one number. A copy
    is the wrong yardstick: it moves every byte twice (read, then write) over the same memory bus. Median of
    ``repeats`` after one warm-up; on a GPU pass ≥ 1 GiB, so that the reduction outlasts its launch.
    """
    device = torch.device(device)
    x = torch.ones(n_bytes // 4, device=device)  # [n_bytes / 4] float32
    times = [_seconds(x.sum, partial(sync, device)) for _ in range(1 + repeats)]
    return x.numel() * x.element_size() / statistics.median(times[1:])  # the first pass warms caches and allocators


def parameter_bytes(model) -> int:
    """Bytes of weights a forward pass must read (each parameter once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
