"""The draft model with a static KV cache and its forwards compiled (see also test_compiled.py), and the
static cache's own rollback, run eagerly (``kv.new_static_cache``: the code that gets compiled).

``torch.compile`` runs here with ``backend="aot_eager"`` (graph capture by dynamo and
AOTAutograd, no code generation): inductor's C++ compilation would take minutes on a CPU,
and what these tests check (the output, one graph, no recompilation) does not depend on
the backend.
"""

import pytest
import torch

from specdec_edu import ModelDrafter, kv, speculative_generate

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])
COMPILE = {"backend": "aot_eager"}


def reference(target, prompt, max_new_tokens):
    mask = torch.ones_like(prompt)
    out = target.generate(prompt, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def new_tokens(out):
    return out.sequences[0, out.prompt_length:].tolist()


def test_static_cache_rollback_matches_recompute(target):
    """Feed 6, feed 4 drafts, roll back 3, feed 2: the logits equal a from-scratch pass (stale slots are masked)."""
    cache = kv.new_static_cache(target, 32)
    with torch.no_grad():
        kv.forward_cached(target, torch.arange(10, 16)[None], cache)
        kv.forward_cached(target, torch.tensor([[40, 41, 42, 43]]), cache)
        kv.crop(cache, 3)
        assert kv.cache_length(cache) == 7
        logits = kv.forward_cached(target, torch.tensor([[44, 45]]), cache).logits[0, -1]
        expected = target(torch.tensor([[10, 11, 12, 13, 14, 15, 40, 44, 45]])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_is_the_targets_with_every_cache(target, agreeing_draft, gamma):
    """Greedy output is the target's with every draft cache, and so are the drafts: a wrong draft cache keeps the
    output exact and only changes which drafts are kept, so each cache must keep the dynamic cache's number of
    drafts in every round. The agreeing draft's rounds keep anything from none to all γ drafts (checked), so the
    static caches are rewound by every amount."""
    ref = reference(target, PROMPT, 30)
    drafters = {  # name: (drafter, the dynamic-cache drafter with the same head, whose drafts it must make)
        "dynamic": (ModelDrafter(agreeing_draft), None),
        "compiled": (ModelDrafter(agreeing_draft, max_cache_len=64, compile=True, compile_options=COMPILE), "dynamic"),
        "dynamic, reduced head": (ModelDrafter(agreeing_draft, head_size=32), None),
        "compiled, reduced head": (ModelDrafter(agreeing_draft, head_size=32, max_cache_len=64, compile=True,
                                                compile_options=COMPILE), "dynamic, reduced head"),
    }
    kept = {}
    for name, (drafter, same_as) in drafters.items():
        for _ in range(2):  # a second generation reuses the (rewound) static cache
            out = speculative_generate(target, drafter, PROMPT, max_new_tokens=30, gamma=gamma)
            assert new_tokens(out) == ref, name
            kept.setdefault(name, out.stats.accepted_per_round)
            assert out.stats.accepted_per_round == kept[same_as or name], name
    assert {0, gamma} <= set(kept["dynamic"]), kept["dynamic"]


def test_static_cache_samples_what_the_dynamic_cache_samples(target, draft):
    """Sampling with the same seed: the same q (up to float rounding) gives the same tokens."""
    outs = []
    for drafter in (ModelDrafter(draft), ModelDrafter(draft, max_cache_len=96, compile=True, compile_options=COMPILE)):
        gen = torch.Generator().manual_seed(7)
        out = speculative_generate(target, drafter, PROMPT, max_new_tokens=40, gamma=4, do_sample=True, generator=gen)
        outs.append(new_tokens(out))
    assert outs[0] == outs[1]


def test_compiled_step_is_exact_and_compiles_once(target, close_draft):
    """Each input width compiled once, then every forward of two generations (other prompt, other γ)
    reuses it: ``error_on_recompile`` turns any second compilation into an error."""
    torch.compiler.reset()
    drafter = ModelDrafter(close_draft, static_cache=True, max_cache_len=64, compile=True, compile_options=COMPILE)
    other = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch._dynamo.config.patch(error_on_recompile=True):
        first = speculative_generate(target, drafter, PROMPT, max_new_tokens=30, gamma=4)
        second = speculative_generate(target, drafter, other, max_new_tokens=20, gamma=2)
    assert new_tokens(first) == reference(target, PROMPT, 30)
    assert new_tokens(second) == reference(target, other, 20)


def test_static_cache_errors_name_the_fix(close_draft):
    """A full static cache refuses a write, naming max_cache_len, and counts nothing; a static cache without
    compiling is not a ModelDrafter option (no lesson used it), and says what to pass instead."""
    cache = kv.new_static_cache(close_draft, 8)
    with torch.no_grad():
        kv.forward_cached(close_draft, torch.arange(5)[None], cache)
        kv.forward_cached(close_draft, torch.arange(3)[None], cache)  # 8 positions: fits
        kv.crop(cache, 1)
        with pytest.raises(ValueError, match="max_cache_len"):
            kv.forward_cached(close_draft, torch.arange(2)[None], cache)  # 9 > 8
    assert kv.cache_length(cache) == 7
    with pytest.raises(ValueError, match="static_cache=True needs compile=True"):
        ModelDrafter(close_draft, static_cache=True)


def test_a_drafter_whose_shared_cache_was_taken_keeps_its_generation_past_the_draft_limit():
    """Two compiled ModelDrafters of one 16-position draft share its static cache. A (context 17: past the limit,
    warned once), then B takes the cache, then A again at 18. A's reset after losing the cache forgot that its
    generation had begun, so the 18 tokens were refused as an unreadable prompt. Now only the cache starts over:
    A drafts nothing there, silently (said once), and a fresh generation still refuses a long prompt."""
    import warnings

    from conftest import tiny_llama

    draft = tiny_llama(seed=1, max_positions=16)
    a, b = (ModelDrafter(draft, max_cache_len=16, compile=True, compile_options=COMPILE) for _ in range(2))
    softmax = lambda x: x.softmax(-1)  # noqa: E731
    a.propose(torch.arange(12), 2, softmax)  # the generation's first round: a readable prompt
    with pytest.warns(UserWarning, match="at most 16 positions"):
        assert len(a.propose(torch.arange(17), 2, softmax)[0]) == 0
    b.propose(torch.arange(10), 2, softmax)  # B takes the shared cache
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither refused nor said twice
        assert len(a.propose(torch.arange(18), 2, softmax)[0]) == 0
    a.reset()
    with pytest.raises(ValueError, match="the prompt has 18 tokens"):
        a.propose(torch.arange(18), 2, softmax)
