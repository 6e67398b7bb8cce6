"""The one place that talks to transformers' KV cache (kept small so that version drift stays here).

Speculative decoding needs three things from a cache: make one, run a forward pass
that appends to it, and *roll it back* when draft tokens are rejected.

Version notes (tested with transformers 5.24; the API below also exists in 4.56+):
- the forward keyword is ``cache=`` in transformers 5.x (``past_key_values=`` is
  deprecated there) and ``past_key_values=`` before; we look at the signature.
- ``DynamicCache.crop(-n)`` removes the last n positions in every version; a
  positive argument means "keep this many" in 4.x but raises in 5.x, and
  ``crop(0)`` is not a no-op for every layer type: so we only ever call ``crop(-n)``
  with n > 0.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty KV cache for ``model``."""
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers < 4.56 took no config
        return DynamicCache()


@lru_cache(maxsize=None)
def _cache_keyword(forward_fn) -> str:
    return "cache" if "cache" in inspect.signature(forward_fn).parameters else "past_key_values"


def forward(model: torch.nn.Module, input_ids: torch.Tensor, cache: DynamicCache, **kwargs):
    """Run ``model`` on ``input_ids`` ``[1, n]``, appending their keys/values to ``cache``.

    Positions continue from the cache length, so the caller only passes new tokens.
    Returns the model's output object (``.logits`` for a causal LM,
    ``.last_hidden_state`` for a bare decoder).
    """
    keyword = _cache_keyword(type(model).forward)
    return model(input_ids=input_ids, use_cache=True, **{keyword: cache}, **kwargs)


def crop(cache: DynamicCache, n_remove: int) -> None:
    """Forget the last ``n_remove`` positions (the rejected draft tokens)."""
    if n_remove > 0:
        cache.crop(-n_remove)


def cache_length(cache: DynamicCache) -> int:
    """How many positions the cache holds."""
    return cache.get_seq_length()
