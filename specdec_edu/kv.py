"""The one place that talks to transformers' KV cache (kept small so that version drift stays here).

Speculative decoding needs three things from a cache: make one, run a forward pass
that appends to it, and *roll it back* when draft tokens are rejected.

Two kinds of cache:

- ``new_cache(model)``: a ``DynamicCache`` that grows by concatenation (the default).
- ``new_static_cache(model, max_len)``: a ``StaticKV``, i.e. transformers' ``StaticCache``
  (K/V preallocated for ``max_len`` positions, written in place) plus the write position,
  which we keep on the host. Fixed shapes are what ``torch.compile`` needs to compile a
  one-token decode step once; rollback just moves the write position back, and the slots
  beyond it (stale drafts) are hidden by the causal mask until they are overwritten.

Version notes (tested with transformers 5.24 and 4.56.2):

- the forward keyword is ``cache=`` in transformers 5.x (``past_key_values=`` is
  deprecated there) and ``past_key_values=`` before; we look at the signature.
- ``DynamicCache.crop(-n)`` removes the last n positions in every version; a
  positive argument means "keep this many" in 4.x but raises in 5.x, so we only
  call ``crop(-n)``; ``crop(0)`` means "keep 0" in 4.x, so we call it only on 5.x
  caches, where it trims a sliding-window layer back to its window.
- Sliding-window layers (Mistral; and hybrid models whose ``config.layer_types`` mixes
  "full_attention" with "sliding_attention", e.g. Qwen2 with ``use_sliding_window``,
  Gemma 2/3). A cache built from the config keeps only a sliding layer's last W − 1
  positions, so once the window has rolled over, a rollback would need K/V that are
  gone (transformers raises). Transformers' own assisted decoding, which we mirror:
  5.x calls ``cache.activate_past_recording()``: a sliding layer then keeps every new
  position until the next ``crop``, which rolls back and trims to the window; 4.56
  builds its ``DynamicCache()`` *without* the config, so every layer keeps the full
  sequence and the model's attention mask alone applies the window. Static caches:
  a static sliding layer is a ring buffer that cannot be rolled back past the window
  in any version, so ``new_static_cache`` stores every layer in full (more memory,
  same attention: the mask still applies the window).
- Static caches: 4.x writes K/V at the forward's ``cache_position`` argument (and
  counts a layer's length as its non-zero slots, which is wrong after a rollback: we
  never ask it); 5.x has no ``cache_position`` and writes at each layer's own counter
  (a device tensor), which ``crop(-n)`` moves back without a sync. ``StaticKV`` passes
  explicit positions in both and keeps the 5.x counters in step.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

# transformers 5.x: caches can record past states so that sliding layers can be rolled back.
_RECORDS_PAST = hasattr(DynamicCache, "activate_past_recording")
# transformers 5.x: a static layer tracks its own length and rolls it back with crop(-n);
# 4.x static layers have no crop and write wherever cache_position says.
_STATIC_LAYERS_COUNT = hasattr(StaticLayer, "crop")


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty KV cache for ``model`` that can be rolled back to any earlier length."""
    if _RECORDS_PAST:  # 5.x: layers as the config says (sliding, linear, …), recording until cropped
        cache = DynamicCache(config=model.config)
        cache.activate_past_recording()
        return cache
    return DynamicCache()  # 4.x: full layers everywhere (what 4.x assisted decoding does)


@functools.cache
def _cache_keyword(forward_fn) -> str:
    return "cache" if "cache" in inspect.signature(forward_fn).parameters else "past_key_values"


@functools.cache
def _takes_cache_position(forward_fn) -> bool:
    return "cache_position" in inspect.signature(forward_fn).parameters


def forward(model: torch.nn.Module, input_ids: torch.Tensor, cache, **kwargs):
    """Run ``model`` on ``input_ids`` ``[1, n]``, appending their keys/values to ``cache``.

    Positions continue from the cache length, so the caller only passes new tokens.
    ``cache`` is a ``DynamicCache`` (``new_cache``) or a ``StaticKV`` (``new_static_cache``).
    Returns the model's output object (``.logits`` for a causal LM,
    ``.last_hidden_state`` for a bare decoder).
    """
    if isinstance(cache, StaticKV):
        return forward_at(model, input_ids, cache, cache.reserve(input_ids.shape[-1]), **kwargs)
    keyword = _cache_keyword(type(model).forward)
    return model(input_ids=input_ids, use_cache=True, **{keyword: cache}, **kwargs)


def crop(cache, n_remove: int) -> None:
    """Forget the last ``n_remove`` positions (the rejected draft tokens)."""
    if n_remove < 0:
        raise ValueError(f"n_remove={n_remove}: pass how many positions to remove (>= 0).")
    if isinstance(cache, StaticKV):
        cache.rollback(n_remove)
        return
    if n_remove > 0 and not getattr(cache, "is_croppable", True):  # 5.x: e.g. a recurrent (linear-attention) state
        raise ValueError(
            "this model's cache cannot be rolled back (it has layers, such as linear attention, whose state "
            "cannot be cropped), so speculative decoding cannot reject drafts with it: use a draft/target "
            "pair of attention-only models."
        )
    if n_remove > 0:
        cache.crop(-n_remove)
    elif _RECORDS_PAST and cache.is_initialized:  # 5.x: crop(0) trims sliding layers back to their window
        cache.crop(0)


def cache_length(cache) -> int:
    """How many positions the cache holds."""
    if isinstance(cache, StaticKV):
        return cache.length
    return int(cache.get_seq_length())


# ---- static caches --------------------------------------------------------------------------------


class StaticKV:
    """A ``StaticCache`` of ``max_len`` positions and its write position ``length`` (a host int).

    Keeping the length on the host means that rolling back, and building the next
    positions, never waits for the device. ``reserve(n)`` hands out the next n positions
    (a device tensor) and refuses, naming the fix, once ``max_len`` would be exceeded.
    """

    def __init__(self, model: torch.nn.Module, max_len: int):
        if max_len < 1:
            raise ValueError(f"max_len={max_len}: a static cache needs room for at least one position.")
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        # Every layer stores all positions (see the module docstring: a sliding layer's
        # ring buffer could not be rolled back); the model's mask still applies the window.
        self.cache.layers = [StaticLayer(max_cache_len=max_len) if getattr(layer, "is_sliding", False) else layer
                             for layer in self.cache.layers]
        unsupported = {type(layer).__name__ for layer in self.cache.layers if not isinstance(layer, StaticLayer)}
        if unsupported:
            raise ValueError(f"a static cache supports attention layers only, this model also has {sorted(unsupported)}: "
                             "use static_cache=False.")
        self.max_len, self.length, self.device = max_len, 0, model.device
        # Looked up once, here: inside a compiled step, plain attributes are free to read.
        self.keyword = _cache_keyword(type(model).forward)
        self.takes_cache_position = _takes_cache_position(type(model).forward)  # 4.x writes static K/V there

    def reserve(self, n: int) -> torch.Tensor:
        """The next ``n`` positions ``[n]`` on the model's device; the cache now counts them."""
        if self.length + n > self.max_len:
            raise ValueError(
                f"the static cache holds {self.max_len} positions but needs {self.length + n}: pass a larger "
                "max_cache_len (at least prompt length + max_new_tokens + gamma), or use static_cache=False."
            )
        positions = torch.arange(self.length, self.length + n, device=self.device)
        self.length += n
        return positions

    def rollback(self, n_remove: int) -> None:
        """Forget the last ``n_remove`` positions: later writes go over them."""
        n_remove = min(n_remove, self.length)
        if n_remove and _STATIC_LAYERS_COUNT:
            self.cache.crop(-n_remove)  # 5.x: each layer's own (device) counter moves back, no sync
        self.length -= n_remove


def new_static_cache(model: torch.nn.Module, max_len: int) -> StaticKV:
    """An empty static KV cache for ``model`` with room for ``max_len`` positions."""
    return StaticKV(model, max_len)


def forward_at(model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, positions: torch.Tensor, **kwargs):
    """Run ``model`` (the one ``static`` was made for) on ``input_ids`` ``[1, n]`` at ``positions`` ``[n]``
    (from ``static.reserve(n)``).

    Only tensor work happens here (the bookkeeping is in ``reserve``), so this is the
    part a caller can wrap in ``torch.compile``: with one token it always sees the same
    shapes, and the positions are a tensor argument, so it compiles once.
    """
    if static.takes_cache_position:
        kwargs["cache_position"] = positions
    return model(input_ids=input_ids, position_ids=positions[None], use_cache=True, **{static.keyword: static.cache}, **kwargs)
