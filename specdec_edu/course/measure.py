"""Timing helpers: how long does one forward pass take on *this* device?

A forward that appends n tokens to the KV cache walks over every weight once, whatever n
is, so for small n its time grows slowly. For a large model on a GPU that is because the
step is memory-bound (reading the weights dominates); for a small model on a CPU the
weight reads and a fixed per-forward overhead (thousands of small calls) share the step
(notebook 01 compares it with its memory floor, ``read_bandwidth``).
These helpers measure the curve, and the draft/target cost ratio c, with medians over
repeats (machines are noisy; one measurement is an anecdote).
"""

from __future__ import annotations

import statistics
import time

import torch

from .. import kv
from ..result import sync


@torch.no_grad()
def forward_seconds(model, n_new: int, context_length: int = 64, repeats: int = 5, warmup: int = 1,
                    compile: bool = False, compile_options: dict | None = None) -> float:
    """Median wall time of one forward that appends ``n_new`` tokens to a cache of ``context_length``.

    The cache is built once; after each timed forward it is cropped back, so every
    repeat sees the same context length. ``compile=True`` times the compiled path that
    ``speculative_generate(..., compile=True)`` runs (the model's shared compiled static cache,
    ``n_new`` padded to a compiled width; the warm-up compiles): pass a generation's
    ``stats.compiled`` to time the forwards on the path that generation took.
    """
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (1, context_length), generator=gen).to(model.device)
    new = torch.randint(0, vocab, (1, n_new), generator=gen).to(model.device)
    cache = kv.shared_static_cache(model, context_length + n_new, compile_options) if compile else kv.new_cache(model)
    kv.forward_cached(model, context, cache, logits_to_keep=1)
    times = []
    for i in range(warmup + repeats):
        sync(model.device)
        start = time.perf_counter()
        kv.forward_cached(model, new, cache)  # all n_new positions' logits, as a verify pass needs
        sync(model.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        kv.crop(cache, n_new)
    return statistics.median(times)


def latency_curve(model, ns=(1, 2, 4, 8, 16, 32, 64), context_length: int = 64, repeats: int = 5,
                  progress: bool = True) -> dict[int, float]:
    """``{n: median seconds}`` for forwards appending n tokens: the latency curve."""
    from tqdm.auto import tqdm

    ns = list(ns)
    iterator = tqdm(ns, desc="forward latency", leave=False) if progress else ns
    return {n: forward_seconds(model, n, context_length, repeats) for n in iterator}


def cost_ratio(draft, target, context_length: int = 64, repeats: int = 7) -> float:
    """c = (draft seconds per decode step) / (target seconds per decode step), measured here."""
    return forward_seconds(draft, 1, context_length, repeats) / forward_seconds(target, 1, context_length, repeats)


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
    times = []
    for i in range(1 + repeats):
        sync(device)
        start = time.perf_counter()
        x.sum()
        sync(device)
        elapsed = time.perf_counter() - start
        if i > 0:  # the first pass warms caches and allocators
            times.append(elapsed)
    return x.numel() * x.element_size() / statistics.median(times)


def parameter_bytes(model) -> int:
    """Bytes of weights a forward pass must read (each parameter once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
