"""The one place that talks to transformers' KV cache (kept small so that version drift stays here).

Speculative decoding needs three things from a cache: make one, run a forward pass
that appends to it, and *roll it back* when draft tokens are rejected.

Two kinds of cache:

- ``new_cache(model)``: a ``DynamicCache`` that grows by concatenation (the default).
- ``new_static_cache(model, max_len)``: a ``StaticKV``, i.e. transformers' ``StaticCache``
  (K/V preallocated for ``max_len`` positions, written in place) plus the write position,
  which we keep on the host. Rollback just moves the write position back, and the slots
  beyond it (stale drafts) are hidden by the causal mask until they are overwritten.
  Fixed shapes are what ``torch.compile`` needs: with ``compile=True`` every forward runs
  through compiled code of a few fixed input widths (``WIDTHS``: 1, 8, 16), padding the input up
  to the next width (``forward_padded`` says why that cannot change the result).

Version notes (tested with transformers 5.24 and 4.56.2; static caches also with 5.2.0, 5.10.4, 5.17.0):

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
  sequence and the model's attention mask alone applies the window; so does 5.x where a
  recording sliding layer returns more K/V than its mask covers (5.17, see
  ``_recording_shows_the_window``): there ``new_cache`` keeps sliding layers in full. Static caches:
  a static sliding layer is a ring buffer that cannot be rolled back past the window
  in any version, so ``new_static_cache`` stores every layer in full (more memory,
  same attention: the mask still applies the window).
- Static caches, three generations (tested with 4.56.2, 5.2.0, 5.10.4, 5.17.0, 5.20.2
  and 5.24.0):

  * 4.x and 5.0–5.9 write K/V at the forward's ``cache_position`` argument (and count a
    layer's length as its non-zero slots, which is wrong after a rollback: we never ask);
  * 5.10–5.23 dropped ``cache_position``: each layer writes at its own counter
    ``cumulative_length`` (a device tensor) and has no ``crop`` to move it back, so after a
    few rollbacks writes marched past the end (``index_copy_(): index 96 is out of bounds``);
  * 5.24+ keep the counter and give the layer ``crop(-n)``.

  ``forward_at`` makes all three write where the host says: it passes the positions as
  ``cache_position`` where the forward takes them, and otherwise first sets every layer's
  counter to the first position (in place, inside the same compiled program). A rollback
  then touches nothing on the device, and none of it waits for the device.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Callable

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer

# transformers 5.x: caches can record past states so that sliding layers can be rolled back.
_RECORDS_PAST = hasattr(DynamicCache, "activate_past_recording")


def _recording_shows_the_window() -> bool:
    """Does a recording sliding layer return only the K/V that the mask covers (W − 1 + new)?

    5.20+ do. 5.17 returns everything it recorded, so two forwards without a crop between them
    (a prefill, then a verify) meet a mask narrower than the keys: ``The size of tensor a (20)
    must match the size of tensor b (11)``. Asked of a 2-slot layer, not of a version number.
    """
    layer = DynamicSlidingWindowLayer(sliding_window=2)
    layer.activate_past_recording()
    states = torch.zeros(1, 1, 3, 1)
    layer.update(states, states)
    return layer.update(states[:, :, :1], states[:, :, :1])[0].shape[-2] == 2


_FULL_SLIDING_LAYERS = _RECORDS_PAST and not _recording_shows_the_window()


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty KV cache for ``model`` that can be rolled back to any earlier length."""
    if _RECORDS_PAST:  # 5.x: layers as the config says (sliding, linear, …), recording until cropped
        cache = DynamicCache(config=model.config)
        if _FULL_SLIDING_LAYERS:  # 5.17: sliding layers keep everything instead (the mask still applies the window)
            cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
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
    ``cache`` is a ``DynamicCache`` (``new_cache``) or a ``StaticKV`` (``new_static_cache``);
    a compiled ``StaticKV`` runs the compiled code (``forward_padded``), whatever n.
    Returns the model's output object (``.logits`` for a causal LM,
    ``.last_hidden_state`` for a bare decoder).
    """
    if isinstance(cache, StaticKV) and cache.widths is not None:
        return forward_padded(model, input_ids, cache, **kwargs)
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

# The input widths a compiled static cache runs: n new tokens are padded up to the smallest width >= n, and
# longer inputs (a prefill) go in chunks of the largest. Decoding needs 1 (a one-token step), 2 (a draft's
# catch-up after a fully accepted round, padded to 8), γ' + 1 (a verify pass: 8 up to γ = 7) and 16 (prefill
# chunks, or γ up to 15). Few widths, because each one is a compilation, and all of them are compiled when the
# cache is made (on the H200 of assets/results, compiling a model's widths took about a minute); a padded slot
# costs little on a GPU, where a forward's time hardly grows with its tokens (notebook 01).
WIDTHS = (1, 8, 16)


class StaticKV:
    """A ``StaticCache`` of ``max_len`` positions and its write position ``length`` (a host int).

    Keeping the length on the host means that rolling back, and building the next
    positions, never waits for the device: ``rollback`` only moves the int, and every
    forward tells the layers where to write (see ``forward_at``). ``reserve(n)`` hands out
    the next n positions (a device tensor) and refuses, naming the fix, once ``max_len``
    would be exceeded.

    With ``compile=True`` every forward goes through ``torch.compile``'d code of fixed
    shape (see ``forward_padded``): the K/V tensors get ``max(WIDTHS) − 1`` spare slots
    after ``max_len`` for a padded tail, and each input width is compiled once, when the
    cache is made.
    """

    def __init__(self, model: torch.nn.Module, max_len: int, *, compile: bool = False,
                 compile_options: dict | None = None, widths: tuple[int, ...] = WIDTHS):
        if max_len < 1:
            raise ValueError(f"max_len={max_len}: a static cache needs room for at least one position.")
        self.widths = tuple(sorted(widths)) if compile else None
        slots = max_len + (self.widths[-1] - 1 if compile else 0)  # a padded tail may run past max_len
        self.cache = StaticCache(config=model.config, max_cache_len=slots)
        # Every layer stores all positions (see the module docstring: a sliding layer's
        # ring buffer could not be rolled back); the model's mask still applies the window.
        self.cache.layers = [StaticLayer(max_cache_len=slots) if getattr(layer, "is_sliding", False) else layer
                             for layer in self.cache.layers]
        unsupported = {type(layer).__name__ for layer in self.cache.layers if not isinstance(layer, StaticLayer)}
        if unsupported:
            raise ValueError(f"a static cache supports attention layers only, this model also has {sorted(unsupported)}: "
                             "use static_cache=False.")
        self.max_len, self.length, self.device = max_len, 0, model.device
        # Looked up once, here: inside a compiled step, plain attributes are free to read.
        self.keyword = _cache_keyword(type(model).forward)
        self.takes_cache_position = _takes_cache_position(type(model).forward)  # 4.x writes static K/V there
        self.compile_options = full_compile_options(model.device, compile_options)
        self._steps: dict[tuple, Callable] = {}  # (id(model), width) -> its compiled forward_at
        self._allocate(model)
        if compile:
            self._compile_every_width(model)

    @torch.no_grad()
    def _allocate(self, model: torch.nn.Module) -> None:
        """Allocate every layer's K/V now, with one eager forward, and forget it.

        Transformers allocates a static layer at its first write and only then marks the
        tensors as static addresses (their pointers never change, which CUDA graphs need);
        it skips the marking while compiling. So the first write must not be compiled code.
        """
        forward_at(model, torch.zeros(1, 1, dtype=torch.long, device=self.device), self, self.reserve(1))
        self.rollback(1)

    @torch.no_grad()
    def _compile_every_width(self, model: torch.nn.Module) -> None:
        """Compile every width now, with one forward of zeros each, and forget them: no generation's timing
        then includes compiling (``speculative_generate`` makes its caches before it starts the clock)."""
        for width in self.widths:
            n = min(width, self.max_len)  # a cache shorter than a width still runs it: the padded tail has spare slots
            self.compiled_step(model, width)(model, torch.zeros(1, width, dtype=torch.long, device=self.device), self,
                                             self.reserve(n, width))
            self.rollback(n)

    def reserve(self, n: int, width: int | None = None) -> torch.Tensor:
        """The next ``width`` (default ``n``) positions ``[width]`` on the model's device; the cache now
        counts only the first ``n`` (a padded tail's slots stay free: the next write goes over them)."""
        if self.length + n > self.max_len:
            raise ValueError(
                f"the static cache holds {self.max_len} positions but needs {self.length + n}: pass a larger "
                "max_cache_len (at least prompt length + max_new_tokens + gamma), or use static_cache=False."
            )
        positions = torch.arange(self.length, self.length + (width or n), device=self.device)
        self.length += n
        return positions

    def rollback(self, n_remove: int) -> None:
        """Forget the last ``n_remove`` positions: later writes go over them (no device work: the next
        forward tells the layers where to write)."""
        self.length -= min(n_remove, self.length)

    def counters(self) -> list[torch.Tensor]:
        """The layers' own write counters (transformers 5.10+; none before): 0-d device tensors."""
        return [layer.cumulative_length for layer in self.cache.layers
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def compiled_step(self, model: torch.nn.Module, width: int) -> Callable:
        """``forward_at`` compiled for ``model`` and inputs ``[1, width]`` (at its first call, then reused).

        Each width gets its own copy of ``forward_at``'s code: dynamo keeps compilations per
        code object and would count a second width of the same code as a *re*compilation (and
        stop after ``recompile_limit`` of them). One copy per width compiles each exactly once.
        """
        key = (id(model), width)
        if key not in self._steps:
            code = forward_at.__code__.replace()  # the same code, a new object
            self._steps[key] = torch.compile(types.FunctionType(code, forward_at.__globals__), **self.compile_options)
        return self._steps[key]


def full_compile_options(device: torch.device, compile_options: dict | None) -> dict:
    """The ``torch.compile`` keywords a compiled static cache uses: ``compile_options`` over the defaults.

    ``dynamic=False``: every width is its own fixed-shape program. ``fullgraph=True``: one graph per
    width, so no part of the forward runs eagerly between compiled pieces (a graph break would be an
    error). On CUDA, unless the options name a mode, a backend or inductor options, also
    ``mode="reduce-overhead"``: CUDA graphs, which replay a whole step with one launch. Measured on an
    H200 (``assets/results/gpu_h200_2026-11-30``, run 4): the SmolLM2-1.7B-shaped step went from
    14.1 ms eager to 2.43 ms.
    """
    options = dict(compile_options or {})
    if torch.device(device).type == "cuda" and not options.keys() & {"mode", "backend", "options"}:
        options["mode"] = "reduce-overhead"
    return {"dynamic": False, "fullgraph": True, **options}


def new_static_cache(model: torch.nn.Module, max_len: int, compile: bool = False,
                     compile_options: dict | None = None) -> StaticKV:
    """An empty static KV cache for ``model`` with room for ``max_len`` positions.

    ``compile=True``: ``forward`` then runs every input through ``torch.compile``'d code of a
    few fixed widths (see ``forward_padded``). ``compile_options`` go to ``torch.compile``
    over the defaults of ``full_compile_options`` (on CUDA: CUDA graphs), e.g. ``{"mode": "default"}``
    (no CUDA graphs) or, in tests, ``{"backend": "aot_eager"}``. Compiled code is specialised to this cache
    (its ``max_len`` is a shape): keep the cache and reuse it for the next prompt, or use
    ``shared_static_cache``.
    """
    return StaticKV(model, max_len, compile=compile, compile_options=compile_options)


def forward_at(model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, positions: torch.Tensor, **kwargs):
    """Run ``model`` (the one ``static`` was made for) on ``input_ids`` ``[1, n]`` at ``positions`` ``[n]``
    (from ``static.reserve``). Only tensor work: this is the code that ``compiled_step`` compiles.

    Where K/V are written follows ``positions``, whatever the transformers version: 4.x and
    5.0–5.9 take them as ``cache_position``; 5.10+ write at each layer's own counter, which
    we first point at ``positions[0]`` (in place: its address is static for CUDA graphs).
    So the counters never need to be moved back on a rollback.
    """
    for counter in static.counters():
        counter.copy_(positions[0])
    if static.takes_cache_position:
        kwargs["cache_position"] = positions
    return model(input_ids=input_ids, position_ids=positions[None], use_cache=True, **{static.keyword: static.cache}, **kwargs)


@torch.no_grad()
def forward_padded(model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, logits_to_keep: int = 0):
    """``forward`` for a compiled cache: ``input_ids`` ``[1, n]``, any n, through fixed-shape compiled code.

    Each chunk of at most ``max(WIDTHS)`` tokens is padded (with id 0) up to the next width
    and run at the positions after the cache's end, real tokens first. The padding cannot
    change the real rows: causal attention never looks ahead, and the padded K/V are
    written *after* the real ones, where the cache does not count them (``reserve``): the
    mask hides them and the next write goes over them. The caller gets the real rows only,
    copied: a CUDA-graph replay overwrites its outputs at the next call.

    The head runs on every row of the width (one compiled program per width, not two);
    ``logits_to_keep=k`` then keeps the last k real rows (0: all), as in transformers.
    """
    pieces = []
    for chunk in input_ids.split(static.widths[-1], dim=1):
        n = chunk.shape[1]
        width = next(w for w in static.widths if w >= n)
        padded = torch.cat([chunk, chunk.new_zeros(1, width - n)], dim=1)  # a fresh [1, width]: same strides every call
        out = static.compiled_step(model, width)(model, padded, static, static.reserve(n, width))
        name = "logits" if "logits" in out else "last_hidden_state"
        pieces.append(out[name][:, :n].clone())  # copied now: the next chunk's replay of this width overwrites out
    out[name] = torch.cat(pieces, dim=1)[:, -logits_to_keep:]
    return out


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {role: its compiled StaticKV}


def shared_static_cache(model: torch.nn.Module, min_len: int, compile_options: dict | None = None,
                        role: str = "target") -> StaticKV:
    """An empty compiled static cache for ``model`` with room for ``min_len`` positions: the same
    object at every call for this model, role (and these options), rewound.

    Why one shared cache per model: compiled code is specialised to its cache (``max_len`` is
    a shape, the cache an input), so a fresh cache per generation would compile every width
    again. The generation loops use this for the target (``role="target"``) and for a draft
    model they wrap themselves (``role="draft"``, see ``ModelDrafter``): one model can be both in
    one generation, with two caches. The length is ``min_len`` rounded up to a power of two, at
    least 256, so that generations of similar length share one cache; a longer one replaces it
    (and compiles again, once). The store holds models weakly: it never keeps a model alive.
    """
    caches = _shared.setdefault(model, {})
    static, options = caches.get(role), full_compile_options(model.device, compile_options)
    if static is None or static.max_len < min_len or static.compile_options != options:
        static = new_static_cache(model, max(256, 1 << (min_len - 1).bit_length()), compile=True,
                                  compile_options=compile_options)
        caches[role] = static
    static.rollback(static.length)
    return static
