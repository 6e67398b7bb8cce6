"""Cache states that used to be silently wrong, made loud or impossible (issue 25), one test per failure mode.

Compiled caches run with ``backend="aot_eager"`` as in ``test_compiled.py``. Where a test needs only the compiled
path's bookkeeping (chunks, padding, copies), an eager ``StaticKV`` poses as a compiled one: its ``compiled_step``
returns the eager ``forward_at_positions``, the code that would be compiled, so nothing compiles.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import tiny_llama
from test_kv_and_drafters import assert_q_is_the_draft_model
from torch.overrides import TorchFunctionMode

from specdec_edu import ModelDrafter, PromptLookupDrafter, autoregressive_generate, kv, logits_to_probs, speculative_generate

COMPILE = {"backend": "aot_eager"}
ROOT = Path(__file__).resolve().parent.parent


def posing_as_compiled(static: kv.StaticKV, monkeypatch, step=None) -> kv.StaticKV:
    """``static`` (eager) runs ``forward_compiled``'s chunks and padding, with ``step`` (default: the eager
    ``forward_at_positions``) in place of each width's compiled code."""
    static.widths = kv.WIDTHS
    monkeypatch.setattr(static, "compiled_step", lambda model, width: step or kv.forward_at_positions)
    return static


# ---- 1. a write after a rollback lands where the host says, or the cache refuses to exist -------------------------


def test_a_cache_whose_writes_follow_the_layers_own_counter_is_refused(monkeypatch):
    """Simulate a release (or a wrapped ``forward(**kwargs)``) that defeats both write-position probes: the forward
    takes no ``cache_position`` and no layer counter can be set. Writes then follow the layers' own count, so after a
    rollback the marker token's K/V land in slot 2, not 1: making the cache raises, naming the transformers version.
    Before: the cache was made, and rejected drafts stayed visible."""
    model = tiny_llama(seed=3)
    kv.new_static_cache(model, 16)  # the real probes: the check passes
    monkeypatch.setattr(kv, "_takes_cache_position", lambda forward_fn: False)
    monkeypatch.setattr(kv.StaticKV, "counters", lambda self: [])
    with pytest.raises(RuntimeError, match=rf"transformers {re.escape(transformers.__version__)}.*slot\(s\) \[2\]"):
        kv.new_static_cache(model, 16)


# ---- 2. the length follows completed forwards only; no silent clamping ------------------------------------------


def test_rolling_back_past_the_start_raises(target):
    static = kv.new_static_cache(target, 16)
    with torch.no_grad():
        kv.forward_cached(target, torch.tensor([[1, 2, 3]]), static)
    with pytest.raises(ValueError, match="cannot roll back 4 positions: the static cache holds 3"):
        kv.crop(static, 4)
    assert kv.cache_length(static) == 3
    kv.crop(static, 3)
    assert kv.cache_length(static) == 0
    dynamic = kv.new_cache(target)  # the same count for a dynamic cache, which crop(-4) would have emptied silently
    with torch.no_grad():
        kv.forward_cached(target, torch.tensor([[1, 2, 3]]), dynamic)
    with pytest.raises(ValueError, match="cannot roll back 4 positions: the cache holds 3"):
        kv.crop(dynamic, 4)
    assert kv.cache_length(dynamic) == 3


def test_a_static_cache_refuses_a_negative_rollback_and_no_room(target):
    """``StaticKV.rollback(-n)`` would move the write position forward, over slots no completed forward counted (a
    rejected draft's K/V, or zeros): the next token would attend to them, with no error. It raises instead, as
    ``kv.crop`` does, and the length stays."""
    static = kv.new_static_cache(target, 16)
    with torch.no_grad():
        kv.forward_cached(target, torch.tensor([[1, 2, 3, 4]]), static)
    kv.crop(static, 2)
    with pytest.raises(ValueError, match="cannot roll back -2 positions"):
        static.rollback(-2)
    assert kv.cache_length(static) == 2
    with pytest.raises(ValueError, match="max_len=0: a static cache needs room for at least one position"):
        kv.new_static_cache(target, 0)


class Interrupted(Exception):
    pass


def interrupted(*args, **kwargs):
    raise Interrupted("the forward did not complete")


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_a_forward_that_raises_leaves_the_length_unchanged(monkeypatch, path):
    """A forward interrupted mid-way (here: it raises) counts no slot, eager or through the compiled path's chunks.
    Before: the positions were reserved (counted) before the forward ran."""
    model = tiny_llama(seed=3)
    static = kv.new_static_cache(model, 64)
    with torch.no_grad():
        kv.forward_cached(model, torch.tensor([[1, 2, 3]]), static)
        if path == "compiled":
            posing_as_compiled(static, monkeypatch, step=interrupted)
        else:
            monkeypatch.setattr(model, "forward", interrupted)
        with pytest.raises(Interrupted):
            kv.forward_cached(model, torch.arange(4, 24)[None], static)
    assert kv.cache_length(static) == 3


def test_a_compiled_forward_cut_in_a_later_chunk_uncounts_the_earlier_chunks(monkeypatch):
    """A 20-token input runs as chunks of 16 and 4 tokens: the second one raises (an error, or Ctrl-C in a long
    prefill). The first chunk's 16 slots must not stay counted, or the drafter's count of what it fed (which the
    exception skipped) disagrees with the cache and every later write lands after stale slots.
    Before: the cache said 19 positions, not 3."""
    model = tiny_llama(seed=3)
    static = kv.new_static_cache(model, 64)
    calls = []

    def second_chunk_interrupted(*args, **kwargs):
        calls.append(1)
        return kv.forward_at_positions(*args, **kwargs) if len(calls) == 1 else interrupted()

    with torch.no_grad():
        kv.forward_cached(model, torch.tensor([[1, 2, 3]]), static)
        posing_as_compiled(static, monkeypatch, step=second_chunk_interrupted)
        with pytest.raises(Interrupted):
            kv.forward_cached(model, torch.arange(4, 24)[None], static)
    assert len(calls) == 2 and kv.cache_length(static) == 3


# ---- 3. padding never asks for a position the model lacks ------------------------------------------------------


def gpt2(seed: int, n_positions: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=64, n_positions=n_positions, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval().requires_grad_(False)


def test_a_compiled_gpt2_pair_generates_up_to_its_position_limit():
    """GPT-2 target and draft (learned positions, 48 of them), both compiled: generation runs until the sequence fills
    all 48 positions, and the tokens are the eager target-only ones. Near the limit a verify pass (γ' + 1 tokens) and
    the draft's catch-up feed are padded to width 8, whose tail lies past position 47. Before: an IndexError from the
    position embedding (on CUDA, a device-side assert)."""
    target, draft = gpt2(0, 48), gpt2(1, 48)
    prompt = torch.arange(1, 21)[None]
    out = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=4, compile=True, compile_options=COMPILE)
    base = autoregressive_generate(target, prompt, max_new_tokens=40)
    assert out.stats.compiled and out.stats.stopped_by == "max_positions" and len(out.row(0)) == 28
    assert out.row(0).tolist() == base.row(0).tolist()


def test_a_static_cache_refuses_a_real_token_past_the_position_limit():
    """``forward_at_positions`` keeps positions below the model's limit for a padded tail's sake, so a *real* token
    past it would be read at the last position: its logits wrong, with no error (a dynamic cache gives this RoPE
    model the full forward's logits there). The static cache refuses that write and keeps its length; up to the limit
    it equals the full forward. A compiled cache for a limit below its widest width (8 < 16) still builds."""
    model, ids = tiny_llama(seed=0, max_positions=8), torch.arange(1, 13)[None]
    with torch.no_grad():
        full = model(ids).logits
        dynamic = kv.forward_cached(model, ids, kv.new_cache(model)).logits
        torch.testing.assert_close(dynamic, full, rtol=1e-5, atol=1e-5)  # what a clamped row would differ from
        for compile in (False, True):
            static = kv.new_static_cache(model, 16, compile=compile, compile_options=COMPILE)
            out = kv.forward_cached(model, ids[:, :8], static)  # exactly up to the limit: fine
            torch.testing.assert_close(out.logits, full[:, :8], rtol=1e-5, atol=1e-5)
            with pytest.raises(ValueError, match=r"positions up to 9, past the model's 8 \(max_position_embeddings\)"):
                kv.forward_cached(model, ids[:, 8:9], static)
            assert kv.cache_length(static) == 8


# ---- 4. two drafters of one model share its compiled cache without losing their K/V --------------------------


def test_two_compiled_drafters_of_one_model_take_turns_on_its_cache(draft, generator):
    """Two compiled ModelDrafters of one model (one shared draft cache), proposing in turns on different contexts that
    grow as the loop grows them: every q equals the draft model's, recomputed from scratch. Before: each drafter
    reused slots that the other had overwritten (q conditioned on the other's tokens, α silently lower)."""
    first = ModelDrafter(draft, compile=True, compile_options=COMPILE)
    second = ModelDrafter(draft, compile=True, compile_options=COMPILE)  # the same cache, taken over
    assert first.static is second.static
    to_probs = lambda logits: logits_to_probs(logits, temperature=1.0)
    contexts = {first: torch.tensor([3, 1, 4, 1, 5]), second: torch.tensor([2, 7, 1, 8, 2, 8, 1, 8])}
    for _ in range(3):
        for drafter in (first, second):
            context = contexts[drafter]
            tokens, q = drafter.propose(context, 3, to_probs, generator)
            assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)
            contexts[drafter] = torch.cat([context, tokens.cpu()[:2], torch.tensor([9])])  # 2 accepted, then the target's


# ---- 4b. the shared compiled cache: one per model, role, options and dtype -------------------------------------


def fake_compiled_caches(monkeypatch, fail_for=()):
    """``kv.new_static_cache`` without compiling: an eager ``StaticKV`` that carries the options it was asked for;
    it raises as a failing compiler would for a backend named in ``fail_for``. Returns the ``max_len`` of each made."""
    made = []

    def new_static_cache(model, max_len, compile=False, compile_options=None):
        if (compile_options or {}).get("backend") in fail_for:
            raise RuntimeError("Feature '.bf16' requires .target sm_80 or higher")
        static = kv.StaticKV(model, max_len)
        static.compile_options = kv.full_compile_options(model.device, compile_options)
        made.append(max_len)
        return static

    monkeypatch.setattr(kv, "new_static_cache", new_static_cache)
    return made


def first_round_on_a_shared_cache(monkeypatch, generator):
    """A compiled ``ModelDrafter`` of a tiny draft (its shared cache made eager) after one round of 3 drafts: the drafter,
    the draft model, its ``to_probs``, the round's context and its drafts."""
    fake_compiled_caches(monkeypatch)
    draft = tiny_llama(seed=3)
    drafter = ModelDrafter(draft, compile=True, compile_options=COMPILE)
    to_probs = lambda logits: logits_to_probs(logits, temperature=1.0)
    context = torch.tensor([3, 1, 4, 1, 5])
    tokens, _ = drafter.propose(context, 3, to_probs, generator)
    return drafter, draft, to_probs, context, tokens


def test_a_drafter_starts_over_once_the_shared_cache_was_handed_out_again(monkeypatch, generator):
    """``shared_static_cache`` hands the draft model's cache to another user (``forward_seconds`` times it so), who
    writes over it: the drafter that held it must not reuse its K/V. Before (a mutation audit: the holder's mark
    not cleared there) the drafter kept its mark, fed its next token at the rewound cache's end, and q was
    conditioned on the other user's tokens, with no error. The shared cache is made eager here: nothing compiles."""
    drafter, draft, to_probs, context, tokens = first_round_on_a_shared_cache(monkeypatch, generator)
    other = kv.shared_static_cache(draft, 8, COMPILE, role="draft")
    assert other is drafter.static and other.holder is None
    kv.forward_cached(draft, torch.tensor([[7, 7, 7, 7]]), other)
    context = torch.cat([context, tokens.cpu()[:2], torch.tensor([9])])  # 2 accepted, then the target's
    tokens, q = drafter.propose(context, 3, to_probs, generator)
    assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)


def test_a_compiled_drafter_feeds_only_what_its_cache_lacks_and_starts_over_at_reset(monkeypatch, generator):
    """On the shared cache, a drafter that still holds it feeds only the tokens after its cached prefix and drafts
    (the target's token, then γ − 1 drafts); ``reset`` rewinds the cache for the next prompt. Before (a mutation
    audit): without its holder mark the drafter refed its whole context every round (same q, many more tokens), and
    a reset that did not rewind wrote the next prompt after the last one's K/V (q wrong, with no error). The shared
    cache is made eager here: nothing compiles."""
    drafter, draft, to_probs, context, tokens = first_round_on_a_shared_cache(monkeypatch, generator)
    fed, forward_cached = [], kv.forward_cached
    monkeypatch.setattr(kv, "forward_cached", lambda model, ids, cache, **kwargs: fed.append(ids.shape[1])
                        or forward_cached(model, ids, cache, **kwargs))
    context = torch.cat([context, tokens.cpu()[:2], torch.tensor([9])])  # 2 accepted, then the target's
    tokens, q = drafter.propose(context, 3, to_probs, generator)
    assert fed == [1, 1, 1] and kv.cache_length(drafter.static) == len(context) + 2
    assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)
    drafter.reset()
    assert kv.cache_length(drafter.static) == 0
    context = torch.tensor([2, 7, 1, 8])
    tokens, q = drafter.propose(context, 3, to_probs, generator)
    assert_q_is_the_draft_model(drafter, draft, context, tokens, q, to_probs)


def test_a_long_input_runs_in_chunks_of_the_widest_width(monkeypatch):
    """A prefill goes in chunks of ``max(WIDTHS)``, each padded to the next width: 20 tokens run as 16 + 8 (pad 4).
    Before (a mutation audit: chunks of 8) the same logits came out of twice the forwards, unnoticed."""
    model, widths = tiny_llama(seed=3), []

    def step(model, ids, static, positions, **kwargs):
        widths.append(ids.shape[1])
        return kv.forward_at_positions(model, ids, static, positions, **kwargs)

    static = posing_as_compiled(kv.new_static_cache(model, 64), monkeypatch, step)
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    out = kv.forward_cached(model, ids, static)
    assert widths == [16, 8] and kv.cache_length(static) == 20
    torch.testing.assert_close(out.logits, model(ids).logits, rtol=1e-4, atol=1e-5)


def test_a_one_position_compiled_cache_has_room_for_its_widest_padded_write(monkeypatch):
    """Making a compiled cache runs every width once, even a width longer than the cache: a 1-position cache writes
    16 positions (1 real, 15 padded), so its K/V need ``max(WIDTHS) - 1`` spare slots. Before (a mutation audit: one
    spare slot fewer) making it raised an IndexError. Each width runs the eager code here (nothing compiles)."""
    monkeypatch.setattr(kv.StaticKV, "compiled_step", lambda self, model, width: kv.forward_at_positions)
    model = tiny_llama(seed=3)
    static = kv.new_static_cache(model, 1, compile=True)
    ids = torch.tensor([[5]])
    with torch.no_grad():
        torch.testing.assert_close(kv.forward_cached(model, ids, static).logits, model(ids).logits, rtol=1e-4, atol=1e-5)


def test_the_shared_cache_length_is_a_power_of_two_of_at_least_256(monkeypatch):
    """``min_len`` rounds up to a power of two, at least 256: a cache made again only when a longer one is asked for,
    and always long enough. Before (a mutation audit: rounding one off) 257 positions got a 256-position cache."""
    made, model = fake_compiled_caches(monkeypatch), tiny_llama(seed=3, max_positions=4096)  # far from the limit
    for min_len in (1, 200, 256, 257, 300, 512, 513):
        assert kv.shared_static_cache(model, min_len).max_len >= min_len
    assert made == [256, 512, 1024]


def test_the_shared_cache_is_made_again_for_other_compile_options(monkeypatch):
    """Another backend or mode gets a cache compiled with it. Before (a mutation audit: options not compared) the
    first options' code ran for the second, so a notebook timing two backends timed one of them twice."""
    fake_compiled_caches(monkeypatch)
    model = tiny_llama(seed=3)
    first = kv.shared_static_cache(model, 8, {"backend": "aot_eager"})
    second = kv.shared_static_cache(model, 8, {"backend": "eager"})
    assert second is not first and second.compile_options["backend"] == "eager"
    assert kv.shared_static_cache(model, 8, {"backend": "eager"}) is second


def test_a_remembered_compile_failure_holds_only_for_its_options_and_dtype(monkeypatch):
    """A compile failure fails fast at the next call with the same options and dtype, and only then: other options, or
    the model in another dtype, are tried. Before (a mutation audit: the failure's options ignored) one failure made
    every later compiled cache of the model fail at once, and every generation ran eager."""
    fake_compiled_caches(monkeypatch, fail_for={"bad"})
    model = tiny_llama(seed=3)
    with pytest.raises(RuntimeError, match="sm_80"):
        kv.shared_static_cache(model, 8, {"backend": "bad"})
    with pytest.raises(RuntimeError, match="failed before with these options, not retried: RuntimeError: .*sm_80"):
        kv.shared_static_cache(model, 8, {"backend": "bad"})
    assert kv.shared_static_cache(model, 8, {"backend": "aot_eager"}).compile_options["backend"] == "aot_eager"
    model.to(torch.float64)
    with pytest.raises(RuntimeError, match="sm_80") as error:
        kv.shared_static_cache(model, 8, {"backend": "bad"})
    assert "failed before" not in str(error.value)


def test_the_shared_cache_never_asks_for_more_than_the_position_limit(monkeypatch):
    """A generation never writes past the model's position limit, so its cache need not hold more: a 100,000-token
    request on a 512-position model gets 512 slots. Before, 100,008 positions rounded up to 131,072 slots, for the
    target and again for the draft, all of them never written (an out-of-memory error on a GPU)."""
    made = fake_compiled_caches(monkeypatch)
    model = tiny_llama(seed=3, max_positions=512)
    assert kv.shared_static_cache(model, 100_008).max_len == 512
    target, draft = tiny_llama(seed=4, max_positions=512), tiny_llama(seed=5, max_positions=512)
    out = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), max_new_tokens=100_000, gamma=4, compile=True,
                               compile_options=COMPILE)
    assert out.stats.stopped_by == "max_positions" and out.sequences.shape[1] == 512
    assert made == [512, 512, 512]  # the first model's, then this target's and its draft's


def test_an_out_of_memory_error_is_not_remembered_as_a_compile_failure(monkeypatch):
    """An out-of-memory error says the size was too large, not that the options fail: the next, shorter cache is made.
    Before, the failure was remembered for the options, and every later generation ran eager, without a word."""
    made = fake_compiled_caches(monkeypatch)
    real = kv.new_static_cache

    def out_of_memory_above_1024(model, max_len, **kwargs):
        if max_len > 1024:
            raise torch.OutOfMemoryError(f"simulated: {max_len} slots")
        return real(model, max_len, **kwargs)

    monkeypatch.setattr(kv, "new_static_cache", out_of_memory_above_1024)
    model = tiny_llama(seed=3, max_positions=4096)
    with pytest.raises(torch.OutOfMemoryError):
        kv.shared_static_cache(model, 4000)
    assert kv.shared_static_cache(model, 300).max_len == 512 and made == [512]


# ---- 5. a prefill keeps only the logits a round reads ----------------------------------------------------------


def test_the_prefill_computes_one_row_of_logits_not_one_per_prompt_token():
    """A 40-token prompt: the target's head runs on one row in the prefill (no round reads it), not on 39.
    Before: 39 rows of full-vocabulary logits (≈ 1 GB for 2k tokens and a 152k vocabulary)."""
    target = tiny_llama(seed=0)  # a fresh copy: the hook stays on this one
    rows = []
    target.lm_head.register_forward_hook(lambda module, inputs, output: rows.append(output.shape[-2]))
    speculative_generate(target, PromptLookupDrafter(), torch.arange(1, 41)[None], max_new_tokens=2, gamma=2)
    assert rows[0] == 1, rows


class CopiesOfLogits(TorchFunctionMode):
    """Records the rows of every copy (``clone``) of a ``[..., rows, vocab]`` tensor made while it is active."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.clone and out.dim() == 3 and out.shape[-1] == self.vocab:
            self.rows.append(out.shape[1])
        return out


def test_the_compiled_path_copies_only_the_rows_it_keeps(monkeypatch):
    """A 40-token prefill through the compiled path (chunks of 16, 16 and 8) keeping one row: one row is copied out.
    Before: every chunk's full logits were copied (16 + 16 + 8 rows), then sliced."""
    model = tiny_llama(seed=3, vocab_size=96)  # 96: no other tensor of the forward ends in the vocabulary's size
    static = posing_as_compiled(kv.new_static_cache(model, 64), monkeypatch)
    with torch.no_grad(), CopiesOfLogits(96) as copies:
        out = kv.forward_cached(model, torch.arange(1, 41)[None], static, logits_to_keep=1)
        expected = model(torch.arange(1, 41)[None]).logits[:, -1:]
    assert copies.rows == [1]
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep", [4, 6, 20])
def test_the_compiled_path_keeps_the_last_rows_across_chunks(monkeypatch, keep):
    """``logits_to_keep=k`` keeps the last k real rows even where they start in an earlier chunk (20 tokens: chunks of
    16 and 4; k = 6 starts 2 rows before the last chunk). Without the clamp to 0, a negative offset into the later chunk
    would drop rows without an error."""
    model = tiny_llama(seed=3)
    static = posing_as_compiled(kv.new_static_cache(model, 64), monkeypatch)
    with torch.no_grad():
        out = kv.forward_cached(model, torch.arange(1, 21)[None], static, logits_to_keep=keep)
        expected = model(torch.arange(1, 21)[None]).logits[:, -keep:]
    assert out.logits.shape == expected.shape and kv.cache_length(static) == 20
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)


# ---- 6. no private transformers class is needed to import the package ----------------------------------------


PROBE_WITHOUT_PRIVATE_CLASSES = """
import torch, transformers, transformers.cache_utils as cache_utils
sliding = cache_utils.DynamicSlidingWindowLayer
del cache_utils.DynamicSlidingWindowLayer, cache_utils.StaticLayer  # as if a release had renamed them
import specdec_edu
from specdec_edu import kv
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
shape = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1)
llama = LlamaForCausalLM(LlamaConfig(**shape)).eval()
cache = kv.new_cache(llama)  # a model without sliding layers never needs them
kv.forward_cached(llama, torch.tensor([[1, 2, 3]]), cache)
assert kv.cache_length(cache) == 3
try:
    kv._full_sliding_layers()
    raise SystemExit("no error")
except RuntimeError as error:
    print("MISSING:", error)
if kv._RECORDS_PAST:  # 5.x: the class is back, but its API changed: a sliding-window model's cache says so
    cache_utils.DynamicSlidingWindowLayer = sliding
    def changed(self):
        raise TypeError("activate_past_recording() takes a new argument")
    sliding.activate_past_recording = changed
    try:
        kv.new_cache(MistralForCausalLM(MistralConfig(**shape, sliding_window=4)))
        raise SystemExit("no error")
    except RuntimeError as error:
        print("CHANGED:", error)
"""


def test_the_package_imports_without_the_private_cache_classes():
    """In a fresh process, ``DynamicSlidingWindowLayer`` and ``StaticLayer`` removed from ``transformers.cache_utils``:
    ``import specdec_edu`` works, a full-attention model's cache works, and the sliding-window probe raises an error
    that names the transformers version and the tested ones (on 5.x also when the class exists but its API changed).
    Before: ``import specdec_edu`` raised ImportError, for everyone."""
    done = subprocess.run([sys.executable, "-c", PROBE_WITHOUT_PRIVATE_CLASSES], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    version, tested = re.escape(transformers.__version__), re.escape(", ".join(kv.TESTED_TRANSFORMERS))
    assert re.search(rf"MISSING: transformers {version}: .*DynamicSlidingWindowLayer.*{tested}", done.stdout)
    if kv._RECORDS_PAST:
        assert re.search(rf"CHANGED: transformers {version}: .*sliding-window.*{tested}", done.stdout)


# ---- 6b. models whose state a rollback cannot reach are refused, on every version ---------------------------

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256)
RECURRENT = {  # name: (config class, config fields); tiny and random: the refusal comes before any forward
    "Mamba": ("MambaConfig", dict(vocab_size=64, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2)),
    "Jamba": ("JambaConfig", dict(TINY, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                  expert_layer_offset=1, num_experts=2, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2)),
    "Lfm2": ("Lfm2Config", dict(TINY, layer_types=["conv", "full_attention"])),
    "Qwen3Next": ("Qwen3NextConfig", dict(TINY, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
                                          linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2,
                                          num_experts_per_tok=1, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=32,
                                          layer_types=["linear_attention", "full_attention"])),
}


def recurrent_model(name: str) -> torch.nn.Module:
    config_class = getattr(transformers, RECURRENT[name][0], None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    torch.manual_seed(0)
    return getattr(transformers, f"{name}ForCausalLM")(config_class(**RECURRENT[name][1])).eval()


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_a_model_with_recurrent_state_is_refused_with_the_fix(name):
    """State-space and hybrid models keep state that rolling back K/V cannot put back: refused as a target, as a
    draft, for target-only decoding and for a static cache, by ``kv.check_rollback_possible`` with an error that
    names the fix. Before, by version: Mamba ran on 4.56–5.10 with its cache ignored, so every forward saw only its
    new tokens (target-only output too, without an error); on 5.25 every one of these raised a TypeError from inside
    transformers, on 5.2–5.17 most an AttributeError or ValueError about ``has_previous_state`` or
    ``get_seq_length``."""
    model, llama, ids = recurrent_model(name), tiny_llama(seed=3, vocab_size=64), torch.tensor([[1, 5, 9, 3]])
    refused = rf"{name}ForCausalLM: .*recurrent state|{name}ForCausalLM: its forward takes no `cache`"
    for run in (lambda: speculative_generate(model, model, ids, max_new_tokens=8, compile=False),
                lambda: speculative_generate(llama, model, ids, max_new_tokens=8, compile=False),
                lambda: autoregressive_generate(model, ids, max_new_tokens=8, compile=False),
                lambda: kv.new_static_cache(model, 16)):
        with pytest.raises(ValueError, match=rf"({refused}).*attention-only models"):
            run()
    speculative_generate(llama, llama, ids, max_new_tokens=8, compile=False)  # the control: attention-only runs


def test_a_linear_attention_cache_layer_is_refused_whatever_the_config_calls_it():
    """5.10+: a layer that a cache built from the config makes a ``LinearAttention`` layer is refused even where the
    config's own names for its layers are not ones the check knows."""
    import transformers.cache_utils

    if not hasattr(transformers.cache_utils, "LinearAttentionCacheLayerMixin"):
        pytest.skip(f"transformers {transformers.__version__} has no linear-attention cache layers")
    llama = tiny_llama(seed=3)
    kv.check_rollback_possible(llama, [])  # the control: attention only
    with pytest.raises(ValueError, match=r"LlamaForCausalLM: it has layers with a recurrent state \(LinearAttentionLayer\)"):
        kv.check_rollback_possible(llama, [transformers.cache_utils.LinearAttentionLayer()])


def test_a_config_that_declares_recurrent_layers_is_refused_without_any_cache_layer():
    """The config alone (``layer_types`` or ``layers_block_type``) refuses a hybrid: on 4.x there are no cache layers to
    inspect, so the config's layer names are the only sign of a recurrent state that a rollback cannot put back."""
    from types import SimpleNamespace

    llama = tiny_llama(seed=3)
    llama.config = SimpleNamespace(**llama.config.to_dict())  # the same model, with layer names to declare
    for field, names, kind in (("layer_types", ["linear_attention", "full_attention"], "linear_attention"),
                               ("layers_block_type", ["mamba", "attention"], "mamba")):
        setattr(llama.config, field, names)
        with pytest.raises(ValueError, match=rf"it has layers with a recurrent state \({kind}\)"):
            kv.check_rollback_possible(llama, [])
        delattr(llama.config, field)
    llama.config.layer_types = ["full_attention", "sliding_attention"]  # the control: attention only
    kv.check_rollback_possible(llama, [])


def test_a_forward_that_drops_its_cache_is_refused_at_the_prefill():
    """A model (e.g. a wrapper whose ``forward(**kwargs)`` loses the cache) that keeps nothing in the cache it was
    given: its next forward would see only its own tokens. The first forward on an empty cache checks that the cache
    grew by its input. Before: generation ran, every step blind to the context, without an error."""

    class Forgetful(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.config, self.device = model, model.config, model.device

        def forward(self, input_ids, past_key_values=None, **kwargs):
            return self.model(input_ids=input_ids, **kwargs)  # the cache never reaches the model

    llama = tiny_llama(seed=3)
    with pytest.raises(ValueError, match=r"Forgetful did not keep its input in the cache .*\(4 tokens in, 0 kept\)"):
        autoregressive_generate(Forgetful(llama), torch.tensor([[1, 5, 9, 3]]), max_new_tokens=4, compile=False)
    with torch.no_grad():  # the control: the model itself keeps them
        kv.forward_cached(llama, torch.tensor([[1, 5, 9, 3]]), cache := kv.new_cache(llama))
    assert kv.cache_length(cache) == 4


# ---- 7. one list of tested transformers versions, and CI tests exactly those --------------------------------


def test_ci_tests_exactly_the_listed_transformers_versions():
    """``kv.TESTED_TRANSFORMERS`` is what ``.ci/run`` tests: the version its constraints file pins for the main
    environment (step 1), the oldest one (step 2) and its version matrix (step 2b). Step 1 installs with the
    constraints, and ``pyproject.toml`` pins no exact transformers."""
    run = (ROOT / ".ci" / "run").read_text()
    constraints = (ROOT / "constraints" / "ci.txt").read_text()
    pinned = re.findall(r"^transformers==(\S+)$", constraints, re.M)
    oldest = re.findall(r'"transformers==([\d.]+)"', run)
    matrix = re.search(r"^for v in ([\d. ]+); do$", run, re.M).group(1).split()
    assert sorted(pinned + oldest + matrix) == sorted(kv.TESTED_TRANSFORMERS)
    assert pinned == [kv.TESTED_TRANSFORMERS[-1]] and oldest == [kv.TESTED_TRANSFORMERS[0]]
    assert re.search(r"^python3 -m venv \.venv && \.venv/bin/pip install -q -c constraints/ci\.txt ", run, re.M)
    assert "transformers==" not in (ROOT / "pyproject.toml").read_text()


# ---- γ is cut in one place --------------------------------------------------------------------------------


def test_gamma_is_cut_in_one_place():
    """``round.gamma_within`` is the one rule: γ + 1 emitted tokens fit in max_new_tokens and the target's positions,
    and the draft reads ``length + γ − 1`` positions; the round (``round_gamma``), a ModelDrafter and the batched
    loop all ask it. Before: three rules (``RoundRecorder.room``, ``round_gamma``, ``gamma_within_positions``)."""
    from specdec_edu import drafters, result
    from specdec_edu.round import gamma_within

    assert gamma_within(4, 10) == 4
    assert gamma_within(4, 10, new_tokens_left=3) == 2  # 2 drafts + 1 target token = the 3 left
    assert gamma_within(4, 10, target_limit=13) == 2  # 10 + 3 tokens fill 13 positions
    assert gamma_within(4, 10, draft_limit=12) == 3  # reads 10 + 2 fed drafts = 12 positions
    assert gamma_within(4, 10, new_tokens_left=1, target_limit=100) == 0  # one token left: the target's
    assert gamma_within(4, 10, draft_limit=9) == 0  # a context the draft cannot read: a target-only step
    assert gamma_within(4, 20, draft_limit=9) == 0  # far past it: still 0 drafts, never a negative γ
    assert not hasattr(result.RoundRecorder, "room") and not hasattr(drafters, "gamma_within_positions")


def test_every_loop_asks_gamma_within(monkeypatch):
    """The callers of the rule above: one prompt and a batch (through ``round_gamma``, which passes the draft's
    position limit for a batch) and, for one prompt, a ModelDrafter's own cut (``drafters.gamma_within``) each call it
    in a generation. A loop that cut γ by its own arithmetic would leave its count at 0."""
    from specdec_edu import drafters, round

    calls = {"round": 0, "drafters": 0}

    def counting(where, rule):
        def wrapped(*args, **kwargs):
            calls[where] += 1
            return rule(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(round, "gamma_within", counting("round", round.gamma_within))
    monkeypatch.setattr(drafters, "gamma_within", counting("drafters", drafters.gamma_within))
    target, draft = tiny_llama(seed=3), tiny_llama(seed=4)
    for ids in (torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2, 3], [4, 5, 6]])):
        calls.update(round=0, drafters=0)
        speculative_generate(target, draft, ids, max_new_tokens=6, gamma=3)
        assert calls["round"] > 0 and (calls["drafters"] > 0 or len(ids) > 1), (ids.shape, calls)  # a batch drafts
        # through its own Batch, not ModelDrafter.propose
