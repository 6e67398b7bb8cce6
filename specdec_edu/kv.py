"""The one place that talks to transformers' KV cache (kept small so that version drift stays here).

**What speculative decoding needs from a cache.** A round feeds the target the newest token and γ
drafts in one forward, so the cache must take n new tokens at once and append their keys and
values (K/V). Then the rule rejects some drafts, and their K/V must go: the cache must *roll back*
by any number of positions, cheaply, every round. And after a rollback the next forward must write
right after what was kept, over the rejected drafts' slots: if it wrote anywhere else, the rejected
drafts would stay visible to attention and the output would be wrong, with no error. The draft
model's own cache needs the same three things. Everything else here (preallocated K/V, compiled
forwards, padding) is a speed-up that must not change a single logit. Only attention K/V can be rolled
back so: a model with a recurrent state (Mamba, linear attention) gets no cache (``check_rollback_possible``).

Two kinds of cache:

- ``new_cache(model)``: a ``DynamicCache`` that grows by concatenation (the default).
- ``new_static_cache(model, max_len)``: a ``StaticKV``, i.e. transformers' ``StaticCache``
  (K/V preallocated for ``max_len`` positions, written in place) plus the write position,
  which we keep on the host. Rollback just moves the write position back, and the slots
  beyond it (stale drafts) are hidden by the causal mask until they are overwritten.
  Fixed shapes are what CUDA graphs and ``torch.compile`` need: with ``compile=True`` every forward
  runs through fixed-shape code of a few input widths (``WIDTHS``: 1, 8, 16; on CUDA by default each
  width's forward recorded as a CUDA graph, ``CapturedStep``; elsewhere ``torch.compile``'d), padding
  the input up to the next width (``forward_compiled`` says why that cannot change the result). When
  it is made, a ``StaticKV`` checks that a write after a rollback lands where the host says.

Three ways to run a forward, named for how they differ:

- ``forward_cached(model, ids, cache)``: any cache; appends the new tokens. The loops call this one.
- ``forward_at_positions(model, ids, static, positions)``: one eager write into a ``StaticKV`` at
  positions the host gives. This is the code that gets compiled.
- ``forward_compiled(model, ids, static)``: ``forward_cached`` for a compiled ``StaticKV``: the ids
  padded to a compiled width, in chunks.

Tested with the transformers versions in ``TESTED_TRANSFORMERS`` (``.ci/run`` tests each one); how
their caches differ, and what we do about it, is in the "Version notes" at the end of this module.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import sys
import time
import types
import warnings
import weakref
from collections.abc import Callable

import torch
import transformers
from transformers import DynamicCache, StaticCache

from .models.shapes import max_positions

# The transformers versions CI tests (``.ci/run``: its main environment pins the last one in
# ``constraints/ci.txt``; its steps 2 and 2b install the others). The one list: docs point here.
TESTED_TRANSFORMERS = ("4.56.2", "5.2.0", "5.10.4", "5.17.0", "5.25.0")

# transformers 5.x: caches can record past states so that sliding layers can be rolled back.
_RECORDS_PAST = hasattr(DynamicCache, "activate_past_recording")


def _unsupported(what: str, alternative: str = "") -> RuntimeError:
    """The error for a transformers whose cache internals we cannot use: what failed, and the fix."""
    return RuntimeError(
        f"transformers {transformers.__version__}: {what}. specdec_edu is tested with transformers "
        f"{', '.join(TESTED_TRANSFORMERS)}: install one of them (e.g. pip install "
        f"transformers=={TESTED_TRANSFORMERS[-1]}){alternative}."
    )


@functools.cache
def _cache_class(name: str) -> type:
    """``transformers.cache_utils.<name>``, looked up when first needed, not at import: these classes are
    private, and a release that renames one must not break ``import specdec_edu`` for everyone."""
    import transformers.cache_utils

    cls = getattr(transformers.cache_utils, name, None)
    if cls is None:
        raise _unsupported(f"transformers.cache_utils has no {name}, which this cache needs",
                           ", or run without a static cache (compile=False)" if name == "StaticLayer" else "")
    return cls


@functools.cache
def _full_sliding_layers() -> bool:
    """Must ``new_cache`` keep sliding layers in full? Yes where a recording sliding layer returns more
    K/V than the mask covers (W − 1 + new), as 5.17 does; 5.20+ return only those (see the version notes).

    Asked of a 2-slot layer, not of a version number, and only for a model that has sliding layers.
    """
    layer_class = _cache_class("DynamicSlidingWindowLayer")
    try:
        layer = layer_class(sliding_window=2)
        layer.activate_past_recording()
        states = torch.zeros(1, 1, 3, 1)
        layer.update(states, states)
        return layer.update(states[:, :, :1], states[:, :, :1])[0].shape[-2] != 2
    except Exception as error:  # an API change in a private class: say what, and what to do
        raise _unsupported(f"probing how a sliding-window cache layer records past states failed ({error!r})") from error


def check_rollback_possible(model: torch.nn.Module, layers=()) -> None:
    """Raise ``ValueError`` for a model whose context lives where a rollback cannot reach.

    Speculative decoding rolls a model's cache back after every rejected draft, and this module rolls
    back attention keys/values only. Two kinds of model keep other state:
    - a state-space model (Mamba in transformers 4.x–5.17) takes its state as ``cache_params``: a cache
      passed under another name would be ignored, and every forward would see only its new tokens (the
      output would be wrong, target-only runs included, without an error);
    - a hybrid with linear-attention, Mamba or convolution layers (Qwen3-Next, Jamba, LFM2; Mamba itself in
      5.24+): its config names them (``layer_types`` or ``layers_block_type``), and on 5.10+ a cache built
      from the config (``layers``: such a cache's ``.layers``) has ``LinearAttention`` layers for them. A crop
      cannot put their recurrent state back (5.25 can record one per token for its own assisted decoding,
      with a count of drafts fixed beforehand; this module does not use that).
    Before this check such a model raised an unclear error from inside transformers, or, for Mamba on
    4.56–5.10, ran without one, every forward blind to its context.
    """
    forward = inspect.signature(type(model).forward).parameters
    if "cache" not in forward and "past_key_values" not in forward:
        why = "its forward takes no `cache` or `past_key_values`" + (
            " (a state-space model: it keeps its state in `cache_params`)" if "cache_params" in forward else "")
    elif kinds := _recurrent_layer_kinds(getattr(model, "config", None), layers):
        why = f"it has layers with a recurrent state ({', '.join(kinds)})"
    else:
        return
    raise ValueError(
        f"{type(model).__name__}: {why}, which a rollback after a rejected draft cannot put back, so speculative "
        "decoding cannot run on it here: use a draft/target pair of attention-only models (Llama, Qwen2, Mistral, "
        "Gemma, …)."
    )


def _recurrent_layer_kinds(config, layers) -> list[str]:
    """The kinds of non-attention layer in ``config`` (its ``layer_types`` or ``layers_block_type``, e.g.
    "linear_attention", "mamba", "conv") or among ``layers`` (5.10+: ``LinearAttention`` cache layers)."""
    import transformers.cache_utils

    declared = [*(getattr(config, "layer_types", None) or ()), *(getattr(config, "layers_block_type", None) or ())]
    kinds = {kind for kind in map(str, declared) if any(word in kind for word in _RECURRENT_WORDS)}
    linear = getattr(transformers.cache_utils, "LinearAttentionCacheLayerMixin", None)
    return sorted(kinds) or sorted({type(layer).__name__ for layer in layers if linear and isinstance(layer, linear)})


_RECURRENT_WORDS = ("linear", "mamba", "conv", "recurrent", "ssm", "hybrid", "rwkv")


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty KV cache for ``model`` that can be rolled back to any earlier length."""
    if not _RECORDS_PAST:
        check_rollback_possible(model)
        return DynamicCache()  # 4.x: full layers everywhere (what 4.x assisted decoding does)
    cache = DynamicCache(config=model.config)  # 5.x: layers as the config says (sliding, linear, …)
    check_rollback_possible(model, cache.layers)
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers) and _full_sliding_layers():
        # 5.17: sliding layers keep everything instead (the mask still applies the window)
        cache.layers = [_cache_class("DynamicLayer")() if getattr(layer, "is_sliding", False) else layer
                        for layer in cache.layers]
    cache.activate_past_recording()  # recording until cropped
    return cache


@functools.cache
def _cache_keyword(forward_fn) -> str:
    return "cache" if "cache" in inspect.signature(forward_fn).parameters else "past_key_values"


@functools.cache
def _takes_cache_position(forward_fn) -> bool:
    return "cache_position" in inspect.signature(forward_fn).parameters


def forward_cached(model: torch.nn.Module, input_ids: torch.Tensor, cache, **kwargs):
    """Run ``model`` on ``input_ids`` ``[B, n]`` (``[1, n]`` for a ``StaticKV``), appending their keys/values to ``cache``.

    Positions continue from the cache length unless ``position_ids`` is passed, so the caller only passes new tokens.
    ``cache`` is a ``DynamicCache`` (``new_cache``) or a ``StaticKV`` (``new_static_cache``);
    a compiled ``StaticKV`` runs the compiled code (``forward_compiled``), whatever n.
    Returns the model's output object (``.logits`` for a causal LM,
    ``.last_hidden_state`` for a bare decoder).
    """
    if isinstance(cache, StaticKV) and cache.widths is not None:
        return forward_compiled(model, input_ids, cache, **kwargs)
    if isinstance(cache, StaticKV):
        return cache.write(forward_at_positions, model, input_ids, input_ids.shape[-1], **kwargs)
    keyword, first = _cache_keyword(type(model).forward), cache_length(cache) == 0
    out = model(input_ids=input_ids, use_cache=True, **{keyword: cache}, **kwargs)
    if first:  # e.g. a wrapper whose forward(**kwargs) drops the cache: checked once, at a cache's first forward
        fed = (input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[1]  # ids [B, n] or embeds [B, n, d]
        if (kept := cache_length(cache)) != fed:
            raise ValueError(f"{type(model).__name__} did not keep its input in the cache it was given ({fed} tokens "
                             f"in, {kept} kept), so the next forward would not see them: pass the cache on as "
                             f"`{keyword}`, or use a model whose forward takes it.")
    return out


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
    if n_remove > (length := cache_length(cache)):  # crop(-n) would empty the cache without a word (as rollback raises)
        raise ValueError(f"cannot roll back {n_remove} positions: the cache holds {length} (the caller's count of what it "
                         "fed is off).")
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
    forward tells the layers where to write (see ``forward_at_positions``). ``write`` runs
    one forward at the next positions and counts them only once it has returned, so a
    forward that raises (or is interrupted) leaves ``length`` as it was; it refuses, naming
    the fix, once ``max_len`` or the model's position limit would be exceeded.

    With ``compile=True`` every forward goes through fixed-shape code (see ``forward_compiled``:
    CUDA graphs recorded from the eager forward by default on CUDA, ``torch.compile``'d code
    elsewhere or when the options ask): the K/V tensors get ``max(WIDTHS) − 1`` spare slots
    after ``max_len`` for a padded tail, and each input width is compiled (or recorded) once,
    when the cache is made.

    ``holder``: whoever last took this cache for its own use (an opaque token). A shared
    compiled cache (``shared_static_cache``) serves every ``ModelDrafter`` of its model; a
    drafter that finds another's token there knows its K/V were overwritten.
    """

    def __init__(self, model: torch.nn.Module, max_len: int, *, compile: bool = False,
                 compile_options: dict | None = None, widths: tuple[int, ...] = WIDTHS):
        if max_len < 1:
            raise ValueError(f"max_len={max_len}: a static cache needs room for at least one position.")
        self.widths = tuple(sorted(widths)) if compile else None
        # A padded tail may run past max_len; and at least 3 slots, where the self-check can see a misplaced write.
        slots = max(max_len + (self.widths[-1] - 1 if compile else 0), 3)
        check_rollback_possible(model)  # before a StaticCache, which some such configs cannot build
        self.cache = StaticCache(config=model.config, max_cache_len=slots)
        check_rollback_possible(model, self.cache.layers)
        # Every layer stores all positions (see the version notes: a sliding layer's
        # ring buffer could not be rolled back); the model's mask still applies the window.
        static_layer = _cache_class("StaticLayer")
        self.cache.layers = [static_layer(max_cache_len=slots) if getattr(layer, "is_sliding", False) else layer
                             for layer in self.cache.layers]
        unsupported = {type(layer).__name__ for layer in self.cache.layers if not isinstance(layer, static_layer)}
        if unsupported:
            raise ValueError(f"a static cache supports attention layers only, this model also has {sorted(unsupported)}: "
                             "use compile=False.")
        self.max_len, self.length, self.device, self.holder = max_len, 0, model.device, None
        self.dtype = next(model.parameters()).dtype  # K/V are allocated in it: a model moved since needs a new cache
        self.weights = weight_addresses(model)  # a recorded CUDA graph reads them there: moved weights need new graphs
        # Looked up once, here: inside a compiled step, plain attributes are free to read.
        self.keyword = _cache_keyword(type(model).forward)
        self.takes_cache_position = _takes_cache_position(type(model).forward)  # 4.x writes static K/V there
        self.position_limit = max_positions(model)  # padded slots must not ask for positions past it
        self.compile_options = full_compile_options(model.device, compile_options)
        self._steps: dict[tuple, Callable] = {}  # (id(model), width) -> its compiled forward_at_positions
        self._allocate_and_check(model)
        if compile:
            self._compile_every_width(model)

    @torch.no_grad()
    def _allocate_and_check(self, model: torch.nn.Module) -> None:
        """Allocate every layer's K/V with eager forwards, and check that a write after a rollback lands
        where the host says; then forget both.

        Allocate: transformers allocates a static layer at its first write and only then marks the
        tensors as static addresses (their pointers never change, which CUDA graphs need); it skips
        the marking while compiling. So the first write must not be compiled code.

        Check: write two tokens, roll back one (a rejected draft), write a marker token. Its K/V must
        land in slot 1, where ``length`` says. A release whose static layers write at their own counter,
        which neither ``cache_position`` nor a counter we can set moves (or a wrapped model whose
        ``forward(**kwargs)`` hides both from our probes), puts it in slot 2: the rejected token
        would stay visible and tokens would come out wrong, with no error. So we compare K/V slots
        (not logits, which bf16 and CUDA graphs perturb) and raise instead.
        """
        ids, slots = torch.zeros(1, 2, dtype=torch.long, device=self.device), torch.arange(3, device=self.device)
        forward_at_positions(model, ids, self, slots[:2])  # two tokens, at 0 and 1
        before = [layer.keys[:, :, :3].clone() for layer in self.cache.layers]  # [batch, heads, 3 slots, head_dim]
        forward_at_positions(model, ids[:, :1] + 1, self, slots[1:2])  # one rolled back: the marker goes to 1
        changed = [slot for slot in range(3)
                   if any(bool((layer.keys[:, :, slot] != old[:, :, slot]).any())
                          for layer, old in zip(self.cache.layers, before))]
        if changed != [1]:
            raise _unsupported(
                f"after a rollback, {type(model).__name__}'s static cache wrote a token's K/V into slot(s) {changed} "
                "instead of slot 1, where the cache's length says (the forward takes no cache_position, and the "
                "layers have no write counter we can set), so rejected drafts would stay visible and the output "
                "would be wrong", ", or run without a static cache (compile=False)"
            )

    @torch.no_grad()
    def _compile_every_width(self, model: torch.nn.Module) -> None:
        """Compile every width now, with forwards of zeros, and forget them: no generation's timing then includes
        compiling (``speculative_generate`` makes its caches before it starts the clock). With CUDA graphs
        (``mode="reduce-overhead"``, or ``CAPTURE``) each width runs twice: the first call only warms it up
        (eagerly: in inductor's cudagraph trees, or ``CapturedStep``'s), and the graph is recorded at the second."""
        captured = self.compile_options.get("backend") == CAPTURE
        calls = 2 if captured or self.compile_options.get("mode") in ("reduce-overhead", "max-autotune") else 1
        started, say = time.perf_counter(), announces_compiling(self.device)
        if say:  # minutes of silence on Colab's two CPUs would look like a hang
            millions = sum(p.numel() for p in model.parameters()) / 1e6
            what = ("recording CUDA graphs of" if captured else "compiling") + f" {type(model).__name__}"
            cost = "seconds" if captured else "minutes on two CPUs"
            print(f"{what} ({millions:,.0f} M parameters) for input widths {', '.join(map(str, self.widths))}: once per "
                  f"model, {cost} ...", file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            # In float32 on CUDA, inductor advises turning on TF32 (10-bit mantissas in the matrix products). The
            # course runs float32 to be exact, so that advice is noise here (it showed in 7 of the 12 notebooks on an H200).
            warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
            for width in self.widths:
                # a cache (or a model's position limit) shorter than a width still runs it: the padded tail has spare slots
                n = min(width, self.max_len, self.position_limit or width)
                for _ in range(calls):
                    self.write(self.compiled_step(model, width), model, torch.zeros(1, width, dtype=torch.long,
                                                                                    device=self.device), n)
                    self.rollback(n)
        if say:
            print(f"... {'recorded' if captured else 'compiled'} in {time.perf_counter() - started:.0f} s", file=sys.stderr,
                  flush=True)

    def write(self, step: Callable, model: torch.nn.Module, input_ids: torch.Tensor, n: int, **kwargs):
        """``step(model, input_ids [1, w], self, positions [w], **kwargs)`` at the next w positions (w = the input's
        width; ``step`` is ``forward_at_positions`` or its compiled copy), then count the first ``n`` of them.

        Counted only once the forward has returned: one that raised leaves ``length`` as it was. A padded
        tail (w > n) is not counted: the next write goes over its slots.
        """
        if self.length + n > self.max_len:
            raise ValueError(
                f"the static cache holds {self.max_len} positions but needs {self.length + n}: pass a larger "
                "max_cache_len (at least prompt length + max_new_tokens + gamma), or use compile=False."
            )
        if self.position_limit is not None and self.length + n > self.position_limit:
            # forward_at_positions clamps positions to the limit for the padded tail's sake: a real token past it
            # would be read at the last position, and its logits would be wrong without an error.
            raise ValueError(
                f"this write needs positions up to {self.length + n}, past the model's {self.position_limit} "
                "(max_position_embeddings): stop the sequence at the model's limit, as speculative_generate does."
            )
        positions = torch.arange(self.length, self.length + input_ids.shape[-1], device=self.device)
        out = step(model, input_ids, self, positions, **kwargs)
        self.length += n
        return out

    def rollback(self, n_remove: int) -> None:
        """Forget the last ``n_remove`` positions: later writes go over them (no device work: the next
        forward tells the layers where to write)."""
        if not 0 <= n_remove <= self.length:
            raise ValueError(f"cannot roll back {n_remove} positions: the static cache holds {self.length}. Remove "
                             "between 0 and kv.cache_length(cache) positions (the caller's count of what it fed is off).")
        self.length -= n_remove

    def counters(self) -> list[torch.Tensor]:
        """The layers' own write counters (transformers 5.10+; none before): 0-d device tensors."""
        return [layer.cumulative_length for layer in self.cache.layers
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def compiled_step(self, model: torch.nn.Module, width: int) -> Callable:
        """``forward_at_positions`` compiled for ``model`` and inputs ``[1, width]`` (at its first call, then reused);
        with ``compile_options={"backend": "capture"}``, recorded as a CUDA graph instead (``CapturedStep``).

        Each width gets its own copy of ``forward_at_positions``'s code: dynamo keeps compilations per
        code object and would count a second width of the same code as a *re*compilation (and
        stop after ``recompile_limit`` of them). One copy per width compiles each exactly once.
        """
        key = (id(model), width)
        if key not in self._steps:
            if self.compile_options.get("backend") == CAPTURE:
                self._steps[key] = CapturedStep()
            else:
                code = forward_at_positions.__code__.replace()  # the same code, a new object
                self._steps[key] = torch.compile(types.FunctionType(code, forward_at_positions.__globals__),
                                                 **self.compile_options)
        return self._steps[key]


# compile_options={"backend": CAPTURE}, the default on CUDA: no compiler at all. Each width's eager forward is recorded
# as one CUDA graph (``CapturedStep``). What a compiled width costs to make is dynamo's tracing and inductor's code
# generation, CPU work. Measured on an H200 under two CPUs (a proxy for Colab's; SmolLM2-1.7B and -135M shapes, bf16,
# assets/results/gpu_h200_2026-12-04_lease2): a fresh process reached its first token in 13.6 s with CAPTURE (14.2 s
# with warm disk caches) and 175.5 s with inductor (49.9 s warm), whose target step was faster: 2.50 ms against 3.56.
# Capturing also needs no Triton, which has failed to compile bf16 below sm_80 (a T4). Inductor stays one option away.
CAPTURE = "capture"


def record_cuda_graph(forward: Callable, device: torch.device):
    """``forward()`` recorded into a new ``torch.cuda.CUDAGraph`` (its kernels are not run): returns the graph and
    ``forward``'s outputs, tensors that every ``graph.replay()`` overwrites. Tests replace this with a fake."""
    if device.type != "cuda":
        raise ValueError(f'compile_options={{"backend": "{CAPTURE}"}} records CUDA graphs, and this model is on '
                         f'{device.type}: use it on a CUDA device, or leave compile_options unset.')
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), torch.cuda.graph(graph):  # the model's GPU, which need not be the current one
        out = forward()
    return graph, out


class CapturedStep:
    """``forward_at_positions`` for inputs ``[1, width]``, replayed from a CUDA graph: one launch for a whole forward,
    as inductor's CUDA graphs give, with no tracing and no generated code (``CAPTURE``).

    - 1st call: the eager forward, on a side stream (its first call lets cuBLAS and the allocator set up the
      workspaces that a recording must not allocate).
    - 2nd call: the forward is recorded (``record_cuda_graph``), reading ``input_ids`` and ``positions`` from
      buffers of its own, then replayed.
    - Later calls: copy ``input_ids`` ``[1, width]`` and ``positions`` ``[width]`` into the buffers and replay.

    A replay reads and writes the same addresses as the recording did: the K/V are fixed tensors (allocated eagerly
    in ``StaticKV._allocate_and_check``), and where a token's K/V go, and which slots its attention reads, follow
    the *values* in the positions buffer (``forward_at_positions``), so rollbacks need no new graph. Every call
    returns the same logits tensor, which the next replay overwrites: ``forward_compiled`` copies the rows it keeps.
    Only device work may run in the recorded forward: a host read of a device value (``.item()``) is an error
    while recording, and the cache is then not made (the generation runs eager and says why: ``compiled_or_eager``).
    Every version in ``TESTED_TRANSFORMERS`` builds the attention mask with device work alone while a stream records
    (``tests/test_compiled.py`` fakes the recording on the CPU and watches for host reads).
    """

    def __init__(self):
        self.calls, self.graph = 0, None

    def __call__(self, model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, positions: torch.Tensor):
        if self.graph is None:
            self.calls += 1
            if self.calls == 1:
                return self._warm_up(model, input_ids, static, positions)
            self.input_ids, self.positions = input_ids.clone(), positions.clone()  # the addresses the graph reads
            self.graph, self.out = record_cuda_graph(
                lambda: forward_at_positions(model, self.input_ids, static, self.positions), static.device)
        self.input_ids.copy_(input_ids)
        self.positions.copy_(positions)
        self.graph.replay()
        return type(self.out)(**self.out)  # a new output object over the same tensors (callers may replace its fields)

    @staticmethod
    def _warm_up(model, input_ids, static, positions):
        if static.device.type != "cuda":
            return forward_at_positions(model, input_ids, static, positions)
        side, main = torch.cuda.Stream(static.device), torch.cuda.current_stream(static.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = forward_at_positions(model, input_ids, static, positions)
        main.wait_stream(side)
        return out


def full_compile_options(device: torch.device, compile_options: dict | None) -> dict:
    """The ``torch.compile`` keywords a compiled static cache uses: ``compile_options`` over the defaults.

    ``dynamic=False``: every width is its own fixed-shape program. ``fullgraph=True``: one graph per
    width, so no part of the forward runs eagerly between compiled pieces (a graph break would be an
    error). On CUDA, unless the options name a mode, a backend or inductor options, also
    ``backend=CAPTURE``: CUDA graphs recorded from the eager forward, which replay a whole step with one
    launch and need no compiler (why this default: ``CAPTURE``). ``$SPECDEC_EDU_COMPILE=inductor`` makes
    that default ``mode="reduce-overhead"`` instead: inductor's code, with CUDA graphs (a faster step,
    minutes to compile).
    """
    options = dict(compile_options or {})
    if torch.device(device).type == "cuda" and not options.keys() & {"mode", "backend", "options"}:
        if os.environ.get("SPECDEC_EDU_COMPILE", "").strip() == "inductor":
            options["mode"] = "reduce-overhead"
        else:
            options["backend"] = CAPTURE
    return {"dynamic": False, "fullgraph": True, **options}


def new_static_cache(model: torch.nn.Module, max_len: int, compile: bool = False,
                     compile_options: dict | None = None) -> StaticKV:
    """An empty static KV cache for ``model`` with room for ``max_len`` positions.

    ``compile=True``: ``forward_cached`` then runs every input through fixed-shape code of a few
    widths (see ``forward_compiled``); without it, the same code runs eagerly (what tests of
    where K/V are written use: no compiling). ``compile_options`` go to ``torch.compile``
    over the defaults of ``full_compile_options`` (on CUDA: CUDA graphs recorded without a compiler,
    ``CAPTURE``), e.g. ``{"mode": "reduce-overhead"}`` (inductor with CUDA graphs), ``{"mode": "default"}``
    (inductor, no CUDA graphs) or, in tests, ``{"backend": "aot_eager"}``. Compiled code is specialised to this cache
    (its ``max_len`` is a shape): keep the cache and reuse it for the next prompt, or use
    ``shared_static_cache``.
    """
    return StaticKV(model, max_len, compile=compile, compile_options=compile_options)


def forward_at_positions(model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, positions: torch.Tensor,
                         **kwargs):
    """Run ``model`` (the one ``static`` was made for) on ``input_ids`` ``[1, w]``, writing their K/V into
    ``static``'s slots ``positions`` ``[w]`` (from ``static.write``). Only tensor work: this is the code
    that ``compiled_step`` compiles.

    Where K/V are written follows ``positions``, whatever the transformers version: 4.x and
    5.0–5.9 take them as ``cache_position``; 5.10+ write at each layer's own counter, which
    we first point at ``positions[0]`` (in place: its address is static for CUDA graphs).
    So the counters never need to be moved back on a rollback.

    The model reads each token's position from ``position_ids``, kept below the model's position
    limit: a padded tail (``forward_compiled``) near the limit would otherwise ask a GPT-2-style
    model for a position embedding it lacks (an IndexError on the CPU, a device-side assert that
    kills the process on CUDA). Only padded slots are ever clamped (``StaticKV.write`` refuses a real token
    past the limit), and they still get their own slots past the real ones, so the padding's K/V (computed
    at the clamped position) land where the cache does not count them, never over a real token's.
    """
    for counter in static.counters():
        counter.copy_(positions[0])
    if static.takes_cache_position:
        kwargs["cache_position"] = positions
    position_ids = positions if static.position_limit is None else positions.clamp(max=static.position_limit - 1)
    return model(input_ids=input_ids, position_ids=position_ids[None], use_cache=True, **{static.keyword: static.cache},
                 **kwargs)


@torch.no_grad()
def forward_compiled(model: torch.nn.Module, input_ids: torch.Tensor, static: StaticKV, logits_to_keep: int = 0):
    """``forward_cached`` for a compiled cache: ``input_ids`` ``[1, n]``, any n, through fixed-shape compiled code.

    Each chunk of at most ``max(WIDTHS)`` tokens is padded (with id 0) up to the next width
    and run at the positions after the cache's end, real tokens first. The padding cannot
    change the real rows: causal attention never looks ahead, and the padded K/V are
    written *after* the real ones, where the cache does not count them (``StaticKV.write``):
    the mask hides them and the next write goes over them.

    The head runs on every row of the width (one compiled program per width, not two), but
    only the rows the caller keeps are copied out (a CUDA-graph replay overwrites its outputs
    at the next call): ``logits_to_keep=k`` keeps the last k real rows (0: all), as in
    transformers. A prefill that keeps 1 row so holds one row of logits, not one per prompt token.
    """
    first_kept = 0 if logits_to_keep == 0 else input_ids.shape[1] - logits_to_keep  # rows before it: not copied
    pieces, start, length_before = [], 0, static.length
    try:
        for chunk in input_ids.split(static.widths[-1], dim=1):
            n = chunk.shape[1]
            width = next(w for w in static.widths if w >= n)
            padded = torch.cat([chunk, chunk.new_zeros(1, width - n)], dim=1)  # a fresh [1, width]: same strides
            out = static.write(static.compiled_step(model, width), model, padded, n)
            name = "logits" if "logits" in out else "last_hidden_state"
            if start + n > first_kept:
                pieces.append(out[name][:, max(first_kept - start, 0):n].clone())  # copied now: a replay overwrites out
            start += n
    except BaseException:  # a later chunk raised (or Ctrl-C): uncount the earlier ones, as one write that raised would
        static.rollback(static.length - length_before)
        raise
    out[name] = torch.cat(pieces, dim=1)
    return out


def announces_compiling(device: torch.device) -> bool:
    """Does compiling a cache on ``device`` print a line when it starts and when it ends? Off the CPU (a GPU: the
    course's compiled path, where recording CUDA graphs takes seconds and compiling with inductor minutes); on the
    CPU only tests compile, in seconds."""
    return device.type != "cpu"


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {role: its compiled StaticKV}


def shared_static_cache(model: torch.nn.Module, min_len: int, compile_options: dict | None = None,
                        role: str = "target") -> StaticKV:
    """An empty compiled static cache for ``model`` with room for ``min_len`` positions: the same
    object at every call for this model, role (and these options), rewound, with no holder.

    Why one shared cache per model: compiled code is specialised to its cache (``max_len`` is
    a shape, the cache an input), so a fresh cache per generation would compile every width
    again. The generation loops use this for the target (``role="target"``) and for a draft
    model they wrap themselves (``role="draft"``, see ``ModelDrafter``): one model can be both in
    one generation, with two caches. The length is ``min_len`` rounded up to a power of two, at
    least 256, so that generations of similar length share one cache; a longer one replaces it
    (and compiles again, once). It never asks for more than the model's position limit: no generation
    writes past it, so ``max_new_tokens=100_000`` on an 8,192-position model gets 8,192 positions, not 131,072
    (the padding's spare slots come on top, in ``StaticKV``). The store holds models weakly: it never keeps a model alive.
    Two ``ModelDrafter``s of one model share its draft cache: each marks it as its own
    (``StaticKV.holder``) and starts over when it finds the other's mark. If compiling fails, the
    failure is remembered: a later call with the same options raises at once (its message quotes the
    first error's) instead of spending the compile time again before the caller falls back to eager. An
    out-of-memory error is not remembered: it says the size, not the options, and a shorter cache may fit.
    """
    limit = max_positions(model)
    min_len = min(min_len, limit) if limit else min_len  # slots past the limit would never be written
    caches = _shared.setdefault(model, {})
    static, options = caches.get(role), full_compile_options(model.device, compile_options)
    failed, dtype = caches.get((role, "failed")), next(model.parameters()).dtype
    if failed is not None and failed[0] == (options, dtype):  # failed once as it is: fail fast, not minutes later
        raise RuntimeError(f"failed before with these options, not retried: {failed[1]}")
    if static is None or static.max_len < min_len or static.compile_options != options or not made_for(static, model):
        try:
            static = new_static_cache(model, max(256, 1 << (min_len - 1).bit_length()), compile=True,
                                      compile_options=compile_options)
        except Exception as exc:  # noqa: BLE001 (a compiler failure; the caller decides to run eager)
            if isinstance(exc, torch.OutOfMemoryError):
                raise  # not the options' fault: the next, shorter generation may fit
            # Remembered as its message only: the exception holds frames (dynamo's keeps the frame it compiled), and
            # they the half-built cache, whose K/V would stay on the GPU for as long as the model lives.
            caches[(role, "failed")] = ((options, dtype), root_cause(exc)[1])
            raise
        caches[role] = static
    static.rollback(static.length)
    static.holder = None
    return static


def weight_addresses(model: torch.nn.Module) -> tuple[int, ...]:
    """Where each parameter and buffer of ``model`` lives in memory now."""
    return tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))


def made_for(static: StaticKV, model: torch.nn.Module) -> bool:
    """Was ``static`` made for ``model`` as it is now: its device, dtype and weights' addresses? (``model.to(torch.float64)``
    or to another GPU after a compiled call: the old cache would feed float32 K/V, or K/V on the old device, to the
    moved model. ``model.cpu().cuda()`` or ``model.half().float()`` keeps both but moves every weight: a CUDA graph
    recorded without a compiler replays with the old addresses built in, and would read freed memory, silently.)
    Checked where a cache is looked up, at every generation's start; a ``ModelDrafter`` or ``VerifyCost`` made before
    the weights moved keeps the cache it took: make it anew after moving a model."""
    return (static.device == model.device and static.dtype == next(model.parameters()).dtype
            and static.weights == weight_addresses(model))


def root_cause(exc: BaseException) -> tuple[BaseException, str]:
    """The error at the bottom of ``exc``'s short chain (dynamo wraps the compiler's own error: BackendCompilerFailed,
    InductorError) and ``"Type: its first line"`` (200 characters at most)."""
    root = exc
    for _ in range(8):  # a short chain; never loop on a cycle
        root = root.__cause__ or getattr(root, "inner_exception", None) or root
    first_line = (str(root).strip().splitlines() or [""])[0][:200]
    return root, f"{type(root).__name__}: {first_line}"


def existing_static_cache(model: torch.nn.Module, min_len: int, role: str = "target") -> StaticKV | None:
    """The compiled cache that :func:`shared_static_cache` made for ``model`` earlier, rewound, if it has room for
    ``min_len`` positions; else None. It never compiles: for a measurement that wants the compiled path only
    where a generation already paid for it."""
    static = _shared.get(model, {}).get(role)
    if static is None or static.max_len < min_len or not made_for(static, model):
        return None
    static.rollback(static.length)
    static.holder = None
    return static


# ---- Version notes ----------------------------------------------------------------------------------
# How transformers' cache internals changed across TESTED_TRANSFORMERS, and what this module does about each.
#
# - The forward keyword is ``cache=`` in transformers 5.x (``past_key_values=`` is deprecated there) and
#   ``past_key_values=`` before; we look at the signature (``_cache_keyword``).
# - ``DynamicCache.crop(-n)`` removes the last n positions in every version; a positive argument means "keep
#   this many" in 4.x but raises in 5.x, so we only call ``crop(-n)``; ``crop(0)`` means "keep 0" in 4.x, so we
#   call it only on 5.x caches, where it trims a sliding-window layer back to its window.
# - Sliding-window layers (Mistral; and hybrid models whose ``config.layer_types`` mixes "full_attention" with
#   "sliding_attention", e.g. Qwen2 with ``use_sliding_window``, Gemma 2/3). A cache built from the config keeps
#   only a sliding layer's last W − 1 positions, so once the window has rolled over, a rollback would need K/V
#   that are gone (transformers raises). Transformers' own assisted decoding, which we mirror: 5.x calls
#   ``cache.activate_past_recording()``: a sliding layer then keeps every new position until the next ``crop``,
#   which rolls back and trims to the window; 4.56 builds its ``DynamicCache()`` *without* the config, so every
#   layer keeps the full sequence and the model's attention mask alone applies the window. 5.17's recording
#   sliding layer returns everything it recorded (5.20+ only what the mask covers), so two forwards without a
#   crop between them (a prefill, then a verify) met a mask narrower than the keys ("The size of tensor a (20)
#   must match the size of tensor b (11)"): where ``_full_sliding_layers`` finds that, ``new_cache`` keeps
#   sliding layers in full, as 4.56 does. A static sliding layer is a ring buffer that cannot be rolled back past
#   the window in any version, so ``StaticKV`` stores every layer in full (more memory, same attention).
# - Static caches, three generations:
#   * 4.x and 5.0–5.9 write K/V at the forward's ``cache_position`` argument (and count a layer's length as its
#     non-zero slots, which is wrong after a rollback: we never ask);
#   * 5.10–5.23 dropped ``cache_position``: each layer writes at its own counter ``cumulative_length`` (a device
#     tensor) and has no ``crop`` to move it back, so after a few rollbacks writes marched past the end
#     (``index_copy_(): index 96 is out of bounds``) after tokens had already come out wrong;
#   * 5.24+ keep the counter and give the layer ``crop(-n)``.
#   ``forward_at_positions`` makes all three write where the host says: it passes the positions as
#   ``cache_position`` where the forward takes them, and otherwise first sets every layer's counter to the first
#   position (in place, inside the same compiled program). A rollback then touches nothing on the device, and
#   none of it waits for the device. A release (or a wrapped model) that defeats both is caught when a
#   ``StaticKV`` is made (``_allocate_and_check``).
# - The private classes ``DynamicSlidingWindowLayer``, ``DynamicLayer`` and ``StaticLayer`` are looked up when a
#   cache first needs them (``_cache_class``), never at import.
# - Layers with a recurrent state (Mamba, linear attention, short convolutions): 4.x–5.17 Mamba takes its state as
#   ``cache_params``; 5.10+ caches built from a hybrid's config hold ``LinearAttention`` layers, which 5.17 and 5.24
#   call not croppable and 5.25 can crop only when recording was asked with a count of states to keep (its own
#   assisted decoding). ``check_rollback_possible`` refuses all of them, in every version, before a forward.
# - 5.25 changed the cache only for those layers (and turned on hub kernels when loading: ``models.weights``); CI's
#   main pin moved from 5.24.0 to 5.25.0 on 2026-12-03, after the whole suite passed on both.
