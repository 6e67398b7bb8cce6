"""Sliding-window attention (Mistral-style) and hybrid full/sliding models: rollbacks past the window.

A sliding layer attends to the last W positions only, and transformers' default cache
keeps only those, so rolling the cache back after the window has rolled over needs the
care described in ``specdec_edu.kv``. Prompts here are longer than the window (W = 8), so
every rollback happens past it.
"""

import pytest
import torch
from test_batched import left_pad
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec_edu import ModelDrafter, autoregressive_generate, kv, speculative_generate
from specdec_edu.models.shapes import sliding_window

WINDOW = 8
SHAPE = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False)


def tiny(config_cls, model_cls, seed, **extra):
    torch.manual_seed(seed)
    return model_cls(config_cls(**SHAPE, **extra)).eval().requires_grad_(False)


def mistral(seed):
    return tiny(MistralConfig, MistralForCausalLM, seed, sliding_window=WINDOW)


def hybrid_qwen2(seed):
    """Layer 0 full attention, layer 1 sliding (``config.layer_types`` mixes both)."""
    return tiny(Qwen2Config, Qwen2ForCausalLM, seed, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)


def noisy_copy(model, seed, noise=0.3):
    """Same weights plus noise: a draft accepted often but not always (rollbacks of every size)."""
    copy = type(model)(model.config).eval().requires_grad_(False)
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    for w in copy.parameters():
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return copy


@pytest.fixture(scope="module", params=["mistral", "hybrid_qwen2"])
def pair(request):
    build = {"mistral": mistral, "hybrid_qwen2": hybrid_qwen2}[request.param]
    target = build(0)
    return target, noisy_copy(target, seed=2), build(1)  # target, close draft, unrelated draft


def test_configs_are_what_the_tests_claim(pair):
    target, _, _ = pair
    assert target.config.sliding_window == WINDOW
    if isinstance(target, Qwen2ForCausalLM):
        assert target.config.layer_types == ["full_attention", "sliding_attention"]


@pytest.mark.parametrize("make_cache", [kv.new_cache, lambda m: kv.new_static_cache(m, 64)], ids=["dynamic", "static"])
def test_rollback_past_the_window_matches_recompute(pair, make_cache):
    """Feed 16 tokens (2 windows), 4 drafts, crop 3, feed 2 more: the logits equal a from-scratch pass."""
    target, _, _ = pair
    ids = torch.arange(1, 17)
    cache = make_cache(target)
    with torch.no_grad():
        kv.forward_cached(target, ids[None], cache)
        kv.forward_cached(target, torch.tensor([[40, 41, 42, 43]]), cache)
        kv.crop(cache, 3)
        assert kv.cache_length(cache) == 17
        logits = kv.forward_cached(target, torch.tensor([[44, 45]]), cache).logits[0]
        kv.crop(cache, 0)  # on transformers 5.x this trims sliding layers back to the window: still the same state
        again = kv.forward_cached(target, torch.tensor([[46]]), cache).logits[0, -1]
        context = torch.cat([ids, torch.tensor([40, 44, 45])])
        expected = target(context[None]).logits[0, -2:]
        expected_again = target(torch.cat([context, torch.tensor([46])])[None]).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, expected_again, rtol=1e-5, atol=1e-5)


def test_fully_accepted_rounds_keep_sliding_layers_within_the_window(pair):
    """kv.crop(cache, 0), the rollback after a round that kept every draft, trims a recording sliding layer back
    to its window: without it the layer keeps every position it was fed (78 rows after a 60-token run)."""
    if not kv._RECORDS_PAST or kv._full_sliding_layers():
        pytest.skip("transformers 4.x, and 5.17, keep sliding layers in full (see the version notes in kv.py)")
    target, _, _ = pair
    cache = kv.new_cache(target)
    with torch.no_grad():
        kv.forward_cached(target, torch.arange(1, 17)[None], cache)
        for start in (20, 30, 40):  # three rounds whose 4 tokens are all kept
            kv.forward_cached(target, torch.arange(start, start + 4)[None], cache)
            kv.crop(cache, 0)
    sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
    assert sliding and all(layer.keys.shape[-2] <= WINDOW - 1 for layer in sliding), [layer.keys.shape for layer in sliding]
    assert kv.cache_length(cache) == 28  # the positions still count


def test_the_sliding_layer_probe_answers_as_the_version_notes_say():
    """``_full_sliding_layers`` decides whether sliding layers are kept in full, and the test above skips itself on its
    answer: so its answer is checked here against the version notes, not against itself. 5.17's recording sliding
    layer returns everything it recorded (keep them in full); 5.20+ only what the mask covers (keep the window).
    Before (a mutation audit: the probe answering "in full" on 5.25) nothing failed, only memory grew."""
    import transformers

    release = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if not kv._RECORDS_PAST or not (release == (5, 17) or release >= (5, 20)):
        pytest.skip(f"transformers {transformers.__version__}: the version notes say nothing of its probe")
    assert kv._full_sliding_layers() == (release == (5, 17))


@pytest.mark.parametrize("gamma", range(1, 7))
def test_greedy_speculative_equals_generate(pair, gamma):
    target, close_draft, unrelated_draft = pair
    prompt = torch.arange(3, 3 + 20)[None] % 64  # 20 tokens: longer than the window
    ref = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False, pad_token_id=0)
    ref = ref[0, prompt.shape[1]:].tolist()
    for draft in (close_draft, ModelDrafter(unrelated_draft, max_cache_len=96, compile=True,
                                            compile_options={"backend": "aot_eager"})):
        out = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=gamma)
        assert out.sequences[0, out.prompt_length:].tolist() == ref


def test_compiled_path_past_the_window_equals_generate(pair):
    """Both models compiled (static caches that keep every position; the mask applies the window), the aot_eager
    backend as in test_compiled.py: greedy output past the window, γ = 2 and 5, token for token ``generate``'s."""
    target, close_draft, _ = pair
    prompt = torch.arange(3, 3 + 20)[None] % 64
    ref = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False, pad_token_id=0)
    for gamma in (2, 5):
        out = speculative_generate(target, close_draft, prompt, max_new_tokens=30, gamma=gamma, compile=True,
                                   compile_options={"backend": "aot_eager"})
        assert out.stats.compiled and out.stats.accepted < out.stats.drafted  # rejections: the caches rolled back
        assert out.row(0).tolist() == ref[0, prompt.shape[1]:].tolist(), gamma


# ---- the batched loop: masked slots inside the window ---------------------------------------------------------------


def test_a_model_drafter_with_a_window_starts_over_on_a_context_that_is_not_an_extension():
    """A draft with a sliding window, asked about a new context that shares only a prefix with the last one (a new
    prompt): transformers >= 5.20 keeps a dynamic sliding layer's last W − 1 rows at each crop, so the crop back to the
    shared prefix raised inside attention ("size of tensor a (3) must match … b (10)"; a review found it). The drafter
    now starts over for such a context; its q equals a recomputation from scratch, on every version."""
    draft = mistral(0)
    drafter = ModelDrafter(draft)
    to_probs, gen = lambda logits: torch.softmax(logits.float(), -1), torch.Generator().manual_seed(0)
    first = torch.arange(1, 21)
    tokens, _ = drafter.propose(first, 3, to_probs, gen)
    drafter.propose(torch.cat([first, torch.tensor([(int(tokens[0]) + 1) % 64])]), 3, to_probs, gen)  # 0 accepted
    new = torch.cat([first[:12], torch.tensor([50, 51, 52])])  # a new prompt: 12 tokens shared, not an extension
    _, q = drafter.propose(new, 3, to_probs, gen)
    with torch.no_grad():
        assert torch.allclose(q[0], to_probs(draft(new[None]).logits[0, -1]), atol=1e-5)


def test_sliding_window_is_read_from_the_config():
    assert sliding_window(mistral(0)) == WINDOW and sliding_window(hybrid_qwen2(0)) == WINDOW
    assert sliding_window(tiny(MistralConfig, MistralForCausalLM, 0, sliding_window=None)) is None
    assert sliding_window(tiny(Qwen2Config, Qwen2ForCausalLM, 0, sliding_window=WINDOW)) is None  # use_sliding_window off
    assert sliding_window(tiny(Qwen2Config, Qwen2ForCausalLM, 0, use_sliding_window=True, sliding_window=WINDOW,
                               max_window_layers=2)) is None  # every layer below max_window_layers: full attention


def test_batched_refuses_a_window_its_cache_could_outgrow(pair):
    """A batch keeps rejected drafts as masked slots, and the window counts slots: with W = 8, a row would see fewer
    than 8 real tokens (the first version gave another output than the target's from the second new token)."""
    target, _, unrelated = pair
    ids, mask = left_pad([torch.arange(1, 13), torch.arange(20, 26)])
    with pytest.raises(ValueError, match=r"sliding window of 8 positions.*one at a time"):
        speculative_generate(target, unrelated, ids, attention_mask=mask, max_new_tokens=30, gamma=4)


def test_batched_within_the_window_is_each_rows_own_output():
    """Where every slot fits in the window (6 + 10 × 5 = 56 ≤ 64), the batch is exact: row by row, greedy, fp32."""
    target, draft = (tiny(MistralConfig, MistralForCausalLM, seed, sliding_window=64) for seed in (0, 1))
    prompts = [[1, 2, 3, 4, 5, 6], [20, 21, 22]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=10, gamma=4)
    for i, p in enumerate(prompts):
        alone = autoregressive_generate(target, torch.tensor([p]), max_new_tokens=10)
        assert out.row(i).tolist() == alone.row(0).tolist()


def test_the_batched_window_check_is_exactly_its_bound():
    """The refusal above at its boundary: prompt width 6 + 10 × (γ + 1 = 5) = 56 slots. A window of 56 holds every slot
    and runs (exact, row by row); one of 55 is refused. The bound counts the prompt's whole width where the prefill
    writes one slot less, so it is conservative by one: 55 would still hold every slot the last query reads, and 54
    would not. The test pins the bound where the code puts it; a bound looser by two would let a window through that
    loses a real token."""
    prompts = [[1, 2, 3, 4, 5, 6], [20, 21, 22]]
    ids, mask = left_pad([torch.tensor(p) for p in prompts])
    target, draft = (tiny(MistralConfig, MistralForCausalLM, seed, sliding_window=56) for seed in (0, 1))
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=10, gamma=4)
    for i, p in enumerate(prompts):
        assert out.row(i).tolist() == autoregressive_generate(target, torch.tensor([p]), max_new_tokens=10).row(0).tolist()
    target = tiny(MistralConfig, MistralForCausalLM, 0, sliding_window=55)
    with pytest.raises(ValueError, match=r"sliding window of 55 positions.*up to 56 slots"):
        speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=10, gamma=4)


# Pinned where a hand mutation of models/shapes.py went unseen by the suite.
def test_a_multimodal_models_window_is_read_from_its_text_config():
    """Gemma 3 (image and text) keeps ``sliding_window`` and ``layer_types`` in its text config, not at the top: read
    at the top, the window is missed and the batched loop would take a model it cannot run exactly. (Config only.)"""
    from types import SimpleNamespace

    from transformers import Gemma3Config

    config = Gemma3Config()
    assert not hasattr(config, "sliding_window")
    assert sliding_window(SimpleNamespace(config=config)) == config.get_text_config().sliding_window == 4096
